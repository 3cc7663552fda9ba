"""The engine of the executor: one training step's ops run in order, with the autograd plumbing between stages.

NOTE [ Executor memory semantics ]
The executor is a dumb dispatcher: it owns no policy, it does what each op says, and holds a
tensor exactly as long as the simulator (``simulator.SimState.memory``) counts it, so that the
live bytes of a step track ``simulate(chain, schedule).peak_bytes``:

* ``values[k]`` is the executor's one reference to ``x_k``; an op that releases ``x_k`` pops it.
  ``x_0`` is the caller's batch and is never popped.
* A recorded stage is fed a *non-leaf alias* of ``x_i`` made by :class:`_CatchInputGrad` (a
  ``detach`` sharing the storage, hung under a 0-element leaf that requires grad). Autograd
  keeps the storage of ``x_i`` alive only if the stage saved it (``StageCost.input_saved``):
  a leaf input would be pinned by its ``AccumulateGrad`` node whether saved or not. The
  alias's backward stores the incoming gradient ``δ_i`` in a box and stops there, so each
  stage's graph is separate and ``δ_i`` is handed to the next ``Backward`` by hand.
* A record keeps a :class:`~edgetrain.autograd.handover.HandOver` output hung on the stage output,
  never the output: ``x_{i+1}`` lives after it is released only if the stage saved it
  (``output_saved``), and then a weak reference to its storage finds it again if a later op
  needs it.
* ``Backward(i)`` puts ``δ_{i+1}`` in the hand-over's box and back-propagates from it, so the
  engine holds the only reference to ``δ_{i+1}`` and frees it once consumed, as plain backprop
  does (the loss starts its own backward); parameter gradients accumulate into ``.grad`` through the
  stage's own ``AccumulateGrad`` nodes exactly as in plain autograd.

NOTE [ A caught gradient has one holder ]
The box that catches ``δ_i`` hangs on the autograd node of the alias (its ``ctx``), and a node can
outlive its stage's backward: module hooks that hold nodes in reference cycles keep it until the
garbage collector runs (PyTorch's ``MemTracker``, through ``ModTracker``'s gradient hooks on every
module's inputs, holds the nodes it saw). So ``Backward`` takes ``δ_i`` *out* of the box rather
than reading it: the executor then holds the only reference, and ``δ_i`` dies when the next stage's
backward has consumed it whatever keeps the node. A box read and left full held 9.5 MiB of stage
input gradients to the end of a planned ResNet-18 step under ``MemTracker`` (8x3x128x128), the
whole gap between that instrument and the plan.

NOTE [ Recomputation is invisible ]
A stage forwarded more than once in a step must behave as if it ran once:

* RNG: for a stage that draws random numbers and is forwarded more than once, the generators'
  state (CPU, and every initialised CUDA device) is captured before its first forward and
  replayed on each later forward, restoring the global state afterwards, so dropout draws the
  same mask and the generator ends where a plain step leaves it (first forwards happen in stage
  order, exactly as in the plain step). The captured state is kept until the stage's recorded
  forward, its last, and the plan counts it (NOTE [ Generator states in the plan ] in
  ``schedule.py``).
* Normalisation statistics: every later forward runs the stage's BatchNorm-like modules at
  momentum 0 (:func:`~edgetrain.autograd.norm_statistics.frozen_statistics`): the update
  ``0 * batch + 1 * running`` leaves their running statistics bit for bit as they were, and
  ``num_batches_tracked`` is put back after it, so they are updated once per step, with the
  first forward's input, the one plain autograd sees. Nothing is copied, so there is no copy
  for the plan to count. A norm whose batch statistics are summed over nodes normalises a
  recomputation with the first forward's (:func:`~edgetrain.autograd.norm_statistics.recomputing`).

Stages must not modify their input in place: a checkpointed input would be corrupted for
its recomputation (``torch.utils.checkpoint`` has the same rule).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..autograd.handover import GradBox, HandOver, backward_from_box
from ..autograd.norm_statistics import frozen_statistics
from ..autograd.rng_state import RngState, replayed_rng
from ..core.schedule import Backward, Discard, Forward, Keep, Op, PageIn, PageInRecord, PageOut, PageOutRecord
from ..errors import ScheduleError
from .pager import RecordKey
from .step_pager import RecordInternals, StepPager

__all__ = ["ScheduleRun", "OpCallback"]

OpCallback = Callable[[int, Op], None]


# --- autograd plumbing -------------------------------------------------------------------------

class _CatchInputGrad(torch.autograd.Function):
    """Identity on ``value`` whose backward stores the incoming gradient (``δ_i``) in ``box`` and stops the graph there.

    ``anchor`` is a 0-element leaf that requires grad: it makes the output require grad
    without making ``value`` a leaf (whose ``AccumulateGrad`` node would pin its storage).
    The output is a ``detach`` of ``value`` (same storage, not an autograd view), so stages
    that work in place on their input behave as on a plain intermediate tensor.
    """

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, value: torch.Tensor, box: GradBox) -> torch.Tensor:
        ctx.box = box
        return value.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.box.grad = grad
        return None, None, None


class _ValueRef:
    """A weak handle on a stage output's storage: finds ``x_{i+1}`` again while a record keeps it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._storage = weakref.ref(tensor.untyped_storage())
        self._dtype = tensor.dtype
        self._size = tensor.size()
        self._stride = tensor.stride()
        self._offset = tensor.storage_offset()

    def get(self) -> torch.Tensor | None:
        storage = self._storage()
        if storage is None:
            return None
        empty = torch.empty(0, dtype=self._dtype, device=storage.device)
        return empty.set_(storage, self._offset, self._size, self._stride)


@dataclass
class _Record:
    """What a recorded stage leaves for its backward: no tensor of its own beyond autograd's."""

    handover: torch.Tensor | None      # a HandOver output on the stage output; None when it needs no grad
    output_grad: GradBox                # where Backward puts δ_{i+1} for the handover to pass on
    input_grad: GradBox | None         # None for stage 0 and non-float inputs
    output_ref: _ValueRef
    internals: RecordInternals | None = None   # when the schedule pages this record (NOTE [ Paged records ])


# --- one step in flight ----------------------------------------------------------------------

class ScheduleRun:
    """One training step in flight: runs a schedule's ops in order on the stages, holding what the simulator counts.

    It is the step's live state -- the values ``x_k`` it holds, the stages' records, the gradient
    ``δ`` handed from one ``Backward`` to the next, the generator states kept for replays -- and
    no policy (NOTE [ Executor memory semantics ]): the :class:`~edgetrain.runtime.executor.Executor`
    makes one per step, and a step split at the loss keeps it between its halves
    (:class:`~edgetrain.runtime.executor.PendingBackward`).
    """

    def __init__(self, stages: Sequence[nn.Module], rng_replayed: frozenset[int], x: torch.Tensor,
                 on_op: OpCallback | None, pager: StepPager | None = None) -> None:
        self.stages = stages
        self.pager = pager
        self.rng_replayed = rng_replayed
        # the generator states are host memory: a CPU step's, which its plan counts (NOTE [ Generator states in
        # the plan ]), so the trackers are shown them
        self.rng_counted = x.device.type == "cpu"
        self.on_op = on_op
        self.values: dict[int, torch.Tensor] = {0: x}
        self.records: dict[int, _Record] = {}
        self.delta: torch.Tensor | None = None   # δ of the last back-propagated stage's input
        self.forwarded: set[int] = set()
        self.done: set[int] = set()
        self.rng: dict[int, RngState] = {}
        self.loss: torch.Tensor | None = None
        self.anchor = torch.empty(0, device=x.device, requires_grad=True)

    def run(self, ops: Sequence[tuple[int, Op]]) -> None:
        for index, op in ops:
            if self.pager is not None:
                self.pager.before(index)
            if isinstance(op, Forward):
                self.forward(op.stage, op.keep)
            elif isinstance(op, Backward):
                self.backward(op.stage)
            elif isinstance(op, Discard):
                self.release(op.value)
            elif isinstance(op, PageOut) and self.pager is not None:
                self.page_out(index, op.value)
            elif isinstance(op, PageIn) and self.pager is not None:
                self.page_in(op.value)
            elif isinstance(op, PageOutRecord) and self.pager is not None:
                self.page_out_record(index, op.stage)
            elif isinstance(op, PageInRecord) and self.pager is not None:
                self.page_in_record(op.stage)
            else:
                raise ScheduleError(f"op {index} {op!r}: unknown op type")
            if self.on_op is not None:
                self.on_op(index, op)

    def value(self, k: int) -> torch.Tensor:
        """``x_k``: held by the executor, or kept by the record of the stage that produced it."""
        held = self.values.get(k)
        if held is not None:
            return held
        slot = self.pager.live_slot(k) if self.pager is not None else None
        if slot is not None and slot.tensor is not None:
            return slot.tensor
        record = self.records.get(k - 1)
        found = record.output_ref.get() if record is not None else None
        if found is None:
            raise ScheduleError(f"x_{k} is not in memory: it was released and stage {k - 1}'s record did not "
                                "save it (the chain's output_saved does not match this model)")
        return found

    def release(self, k: int) -> None:
        """The executor lets go of ``x_k`` (in RAM or paged out); records may still keep it."""
        self.values.pop(k, None)
        if self.pager is not None:
            self.pager.held_on_disk.discard(k)

    def page_out(self, index: int, k: int) -> None:
        """Drop every reference to ``x_k`` but the writer's (NOTE [ Paged values ])."""
        assert self.pager is not None
        tensor = self.value(k)
        if self.values.pop(k, None) is not None:
            self.pager.held_on_disk.add(k)
        slot = self.pager.live_slot(k)
        if slot is not None:
            slot.tensor = None
        del slot
        self.pager.session.write(k, tensor)
        del tensor
        self.pager.settle_write(index, k)

    def page_in(self, k: int) -> None:
        """Read ``x_k`` back and give it to whoever held it: the executor and/or the records' slot."""
        assert self.pager is not None
        tensor = self.pager.session.finish_read(k)
        slot = self.pager.live_slot(k)
        if slot is not None:
            slot.tensor = tensor
        if k in self.pager.held_on_disk:
            self.pager.held_on_disk.discard(k)
            self.values[k] = tensor

    def page_out_record(self, index: int, i: int) -> None:
        """Drop every reference to record ``i``'s internals but the writer's (NOTE [ Paged records ])."""
        assert self.pager is not None
        storages = self._internals(i).page_out()
        self.pager.session.write_storages(RecordKey(i), storages)
        del storages
        self.pager.settle_write(index, RecordKey(i))

    def page_in_record(self, i: int) -> None:
        """Read record ``i``'s internals back; each saved tensor is rebuilt over its new storage."""
        assert self.pager is not None
        self._internals(i).page_in(self.pager.session.finish_read_storages(RecordKey(i)))

    def _internals(self, i: int) -> RecordInternals:
        record = self.records.get(i)
        if record is None or record.internals is None:
            raise ScheduleError(f"the record of stage {i} is not held, so it cannot be paged")
        return record.internals

    def forward(self, i: int, keep: Keep) -> None:
        x = self.value(i)
        stage = self.stages[i]
        version = x._version
        with self._as_first_forward(i):
            if keep is Keep.ALL:
                y = self._record(i, stage, x)
            else:
                with torch.no_grad():
                    y = stage(x)
        if keep is Keep.ALL:   # a stage's last forward: nothing replays its random numbers again
            self.rng.pop(i, None)
        if x._version != version and (keep is Keep.INPUT or i == 0):
            raise RuntimeError(f"stage {i} ({type(stage).__name__}) modified its input in place, but the schedule "
                               "keeps that input to recompute from it; make the stage out-of-place "
                               "(e.g. nn.ReLU(inplace=False))")
        del x
        if keep is not Keep.INPUT and i > 0:
            self.release(i)
        if i == len(self.stages) - 1:
            self.loss = y.detach()
        if i + 1 not in self.done or i == len(self.stages) - 1:   # NOTE [ Dead outputs ] in schedule.py
            self.values[i + 1] = y

    @contextlib.contextmanager
    def _as_first_forward(self, i: int) -> Iterator[None]:
        """First forward: note the RNG if the stage will be recomputed and draws random numbers. Later: replay
        it, keep statistics."""
        if i not in self.forwarded:
            self.forwarded.add(i)
            if i in self.rng_replayed:
                self.rng[i] = RngState.capture(self.rng_counted)
            yield
            return
        replayed = replayed_rng(self.rng[i], self.rng_counted) if i in self.rng else contextlib.nullcontext()
        with replayed, frozen_statistics(self.stages[i]):
            yield

    def _record(self, i: int, stage: nn.Module, x: torch.Tensor) -> torch.Tensor:
        box: GradBox | None = None
        saving: contextlib.AbstractContextManager[list[Any]] = (
            self.pager.saving(i, x) if self.pager is not None else contextlib.nullcontext([]))
        with torch.enable_grad(), saving as pending:
            if i > 0 and (x.is_floating_point() or x.is_complex()):
                box = GradBox()
                stage_input = _CatchInputGrad.apply(self.anchor, x.detach(), box)
            else:
                stage_input = x.detach()  # the batch needs no gradient; cut any outer graph
            y = stage(stage_input)
            del stage_input
            output_grad = GradBox()
            handover = HandOver.apply(y, output_grad) if y.requires_grad else None
        internals = self.pager.sort_saved(i, stage, x, y, pending) if self.pager is not None else None
        self.records[i] = _Record(handover, output_grad, box, _ValueRef(y), internals)
        return y

    def backward(self, i: int) -> None:
        record = self.records.pop(i)
        is_loss = i == len(self.stages) - 1
        if record.handover is not None and (self.delta is not None or is_loss):
            # δ_{i+1} goes to the engine alone, freed once consumed (edgetrain.autograd.handover)
            record.output_grad.grad, self.delta = self.delta, None
            backward_from_box(record.handover)
        # else: nothing downstream depends on this stage's output; no gradient flows through it.
        self.delta = None
        self.release(i + 1)
        if i > 0:
            self.release(i)
        self.done.add(i)
        if record.input_grad is not None:
            # NOTE [ A caught gradient has one holder ]: out of the box, so only the executor holds δ_i
            self.delta, record.input_grad.grad = record.input_grad.grad, None

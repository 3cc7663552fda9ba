"""Run a checkpointing :class:`~edgetrain.core.schedule.Schedule` in a real training step, op by op.

NOTE [ Executor memory semantics ]
The executor is a dumb dispatcher: it owns no policy, it does what each op says, and holds a
tensor exactly as long as the simulator (``schedule.SimState.memory``) counts it, so that the
live bytes of a step track ``simulate(chain, schedule).peak_bytes``:

* ``values[k]`` is the executor's one reference to ``x_k``; an op that releases ``x_k`` pops it.
  ``x_0`` is the caller's batch and is never popped.
* A recorded stage is fed a *non-leaf alias* of ``x_i`` made by :class:`_CatchInputGrad` (a
  ``detach`` sharing the storage, hung under a 0-element leaf that requires grad). Autograd
  keeps the storage of ``x_i`` alive only if the stage saved it (``StageCost.input_saved``):
  a leaf input would be pinned by its ``AccumulateGrad`` node whether saved or not. The
  alias's backward stores the incoming gradient ``δ_i`` in a box and stops there, so each
  stage's graph is separate and ``δ_i`` is handed to the next ``Backward`` by hand.
* A record keeps a :class:`~edgetrain.autograd.seeded_backward.HandOver` output hung on the stage output,
  never the output: ``x_{i+1}`` lives after it is released only if the stage saved it
  (``output_saved``), and then a weak reference to its storage finds it again if a later op
  needs it.
* ``Backward(i)`` puts ``δ_{i+1}`` in the hand-over's box and back-propagates from it, so the
  engine holds the only reference to ``δ_{i+1}`` and frees it once consumed, as plain backprop
  does (the loss seeds itself); parameter gradients accumulate into ``.grad`` through the
  stage's own ``AccumulateGrad`` nodes exactly as in plain autograd.

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

NOTE [ Paged values ]
``PageOut(k)`` must leave no reference to ``x_k``'s storage in RAM, yet a record that saved
``x_k`` (its stage's input, ``input_saved``, or output, ``output_saved``) needs it back for
its backward. So while a stage whose input or output the schedule pages is recorded,
``saved_tensors_hooks`` pack every saved tensor that shares the storage of ``x_i`` or
``x_{i+1}`` as a :class:`_Saved` handle on a :class:`_Slot` -- the executor's one reference to
that value -- plus the view's dtype, size, stride and offset. The output is only known once
the forward returns: until then each saved tensor is held as it is, and handles whose storage
turns out to be the output's are bound to its slot then. Other saved tensors (the stage's
internals) stay plain references, unless the schedule pages the record (NOTE [ Paged
records ]). ``PageOut`` empties the slot (and ``values``), ``PageIn`` fills it with the tensor
read back; unpacking rebuilds each view over the slot's current storage, which the schedule
has paged in before the backward. A slot lives as long as a record
holds it, so the value dies when plain autograd would free it; a value that dies on disk has
its copy deleted. Transfers run on background threads (``runtime/pager.py``, NOTE [ How a page
travels ] and NOTE [ Overlap without a higher peak ]).

NOTE [ Paged records ]
``PageOutRecord(i)`` must free a record's *internals* -- what autograd saved while recording
stage ``i`` besides ``x_i`` and ``x_{i+1}`` (the chain's ``saved_bytes - out_bytes``) -- and
keep the record usable. So when the schedule pages record ``i``, the same hooks pack every
saved tensor as a :class:`_Saved` handle while it records. Once the output is known, the
handles are sorted: those sharing ``x_i``'s or ``x_{i+1}``'s storage are values (bound to
their slot when the schedule pages that value, plain otherwise); those sharing a storage the
stage itself holds (parameters, buffers, tensor attributes such as a loss stage's target)
stay plain, as the profiler does not count them; the rest are the record's
:class:`_Internals`. ``PageOutRecord(i)`` empties every internal handle (keeping its view's
dtype, size, stride and offset) and writes each distinct storage once, so the RAM falls by
exactly those storages; ``PageInRecord(i)`` reads them into new storages and each handle
rebuilds its view over its own. The internals object holds its handles weakly: autograd
frees each saved tensor when its node's backward is done, as without paging.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..autograd.norm_statistics import frozen_statistics
from ..autograd.rng_state import RngState, replayed_rng
from ..autograd.seeded_backward import GradBox, HandOver, seed_backward
from ..core.chain import Chain
from ..core.schedule import (
    Backward,
    Discard,
    Forward,
    Keep,
    Op,
    PageIn,
    PageInRecord,
    PageOut,
    PageOutRecord,
    Schedule,
    keep_all,
    memory_timeline,
    rng_replayed_stages,
    simulate,
    validate,
)
from ..core.stages import LossStage, parameter_holders
from ..errors import PagingError, ScheduleError
from ..profile.tracker import storage_key
from .pager import OverlapPlan, PageKey, PageSession, PageStore, PagingStats, RecordKey, page_key, plan_overlap

__all__ = ["Executor", "PendingBackward", "run_schedule"]

log = logging.getLogger(__name__)

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

    seed: torch.Tensor | None          # a HandOver output on the stage output; None when it needs no grad
    output_grad: GradBox                # where Backward puts δ_{i+1} for the seed to hand over
    input_grad: GradBox | None         # None for stage 0 and non-float inputs
    output_ref: _ValueRef
    internals: _Internals | None = None   # when the schedule pages this record (NOTE [ Paged records ])


# --- paging: value slots, saved-tensor handles, the step's pager ---------------------------------

class _Slot:
    """The executor's one reference to a pageable value ``x_k`` that records saved (NOTE [ Paged values ])."""

    __slots__ = ("__weakref__", "tensor", "value")

    def __init__(self, value: int, tensor: torch.Tensor) -> None:
        self.value = value
        self.tensor: torch.Tensor | None = tensor   # None while paged out


class _Saved:
    """What a record keeps for one saved tensor: the tensor itself, a view of a slot's value, or
    (while its record is paged out) only the view's geometry."""

    __slots__ = ("__weakref__", "dtype", "key", "offset", "size", "slot", "stride", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: torch.Tensor | None = tensor
        self.slot: _Slot | None = None
        self.key = _storage_key_or_none(tensor)

    def _let_go(self) -> torch.Tensor:
        """Keep the view's geometry and drop the tensor, which is returned."""
        tensor, self.tensor = self.tensor, None
        assert tensor is not None
        self.dtype, self.size, self.stride, self.offset = (tensor.dtype, tensor.size(), tensor.stride(),
                                                           tensor.storage_offset())
        return tensor

    def bind(self, slot: _Slot) -> None:
        """Reach the tensor through ``slot`` from now on."""
        self._let_go()
        self.slot = slot

    def page_out(self) -> torch.Tensor:
        """Let go of the tensor (returned, for the page); :meth:`page_in` gives it back."""
        return self._let_go()

    def page_in(self, storage: torch.UntypedStorage) -> None:
        self.tensor = self._view(storage)

    def _view(self, storage: torch.UntypedStorage) -> torch.Tensor:
        view = torch.empty(0, dtype=self.dtype, device=storage.device)
        return view.set_(storage, self.offset, self.size, self.stride)

    def unpack(self) -> torch.Tensor:
        if self.slot is not None:
            base = self.slot.tensor
            if base is None:
                raise ScheduleError(f"a backward needs x_{self.slot.value}, which is paged out "
                                    f"(the schedule must PageIn({self.slot.value}) before it)")
            return self._view(base.untyped_storage())
        if self.tensor is None:
            raise ScheduleError("a backward needs a saved tensor of a record that is paged out "
                                "(the schedule must PageInRecord before it)")
        return self.tensor


def _storage_key_or_none(tensor: torch.Tensor) -> int | None:
    try:
        return storage_key(tensor)
    except (RuntimeError, NotImplementedError):   # sparse and other storage-less tensors
        return None


class _Internals:
    """A paged record's saved tensors besides its stage's input and output (NOTE [ Paged records ]).

    The handles are held weakly, so each saved tensor dies when autograd is done with it.
    """

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self._handles: list[weakref.ref[_Saved]] = []
        self._parts: list[int] = []   # while paged out: the storage (page part) of each handle

    def add(self, saved: _Saved) -> None:
        self._handles.append(weakref.ref(saved))

    def page_out(self) -> list[torch.Tensor]:
        """Empty every handle; returns one tensor per distinct storage, in page-part order."""
        handles = [saved for saved in (ref() for ref in self._handles) if saved is not None]
        self._handles = [weakref.ref(saved) for saved in handles]
        parts: dict[int, int] = {}
        storages: list[torch.Tensor] = []
        self._parts = []
        for saved in handles:
            tensor = saved.page_out()
            part = parts.setdefault(storage_key(tensor), len(storages))
            if part == len(storages):
                storages.append(tensor)
            self._parts.append(part)
        return storages

    def page_in(self, storages: Sequence[torch.Tensor]) -> None:
        """Give each handle its view over the storage read back for its part."""
        for ref, part in zip(self._handles, self._parts, strict=False):   # handles added since page_out stay
            saved = ref()
            if saved is not None:
                saved.page_in(storages[part].untyped_storage())
        self._parts = []


def _own_storages(stage: nn.Module) -> set[int]:
    """Storages the stage itself holds (parameters, buffers, tensor attributes such as a loss
    stage's target): autograd may save them, but they are not the record's to page."""
    keys: set[int] = set()
    for module in stage.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False),
                   *(value for value in vars(module).values() if isinstance(value, torch.Tensor))]
        keys.update(key for key in map(_storage_key_or_none, tensors) if key is not None)
    return keys


class _Pager:
    """The paging side of one step: the page session, the overlap plan, slots and held paged values."""

    def __init__(self, session: PageSession, plan: OverlapPlan, ops: Sequence[Op]) -> None:
        self.session = session
        self.plan = plan
        self.page_ops = {j: key for j, key in enumerate(map(page_key, ops)) if key is not None}
        self.pageable = frozenset(op.value for op in ops if isinstance(op, PageOut))
        self.paged_records = frozenset(op.stage for op in ops if isinstance(op, PageOutRecord))
        self.writes_due: dict[int, list[PageKey]] = {}   # op index -> pages whose writes must be settled by then
        for j, before in plan.release_before.items():
            self.writes_due.setdefault(before, []).append(self.page_ops[j])
        self.reads_due: dict[int, list[PageKey]] = {}    # op index -> pages to prefetch before it
        for j, before in plan.issue_before.items():
            if before < j:
                self.reads_due.setdefault(before, []).append(self.page_ops[j])
        self.deferred: list[PageKey] = []   # prefetches due whose page's write was still running
        self.slots: dict[int, weakref.ref[_Slot]] = {}
        self.held_on_disk: set[int] = set()   # paged values the executor itself holds (not only records)

    def slot(self, k: int, tensor: torch.Tensor) -> _Slot:
        """The live slot of ``x_k`` over ``tensor``'s storage, or a new one (the caller's to keep)."""
        slot = self.live_slot(k)
        if slot is not None and slot.tensor is not None and storage_key(slot.tensor) == storage_key(tensor):
            return slot
        slot = _Slot(k, tensor)
        self.slots[k] = weakref.ref(slot)
        return slot

    def live_slot(self, k: int) -> _Slot | None:
        ref = self.slots.get(k)
        return ref() if ref is not None else None

    def before(self, index: int) -> None:
        """Settle what must be settled before op ``index`` and issue the reads planned there."""
        session = self.session
        session.reap()
        for key in self.writes_due.get(index, ()):
            if not session.write_done(key):
                session.wait_write(key)
        self.drop_dead_copies()
        due, self.deferred = self.deferred + self.reads_due.get(index, []), []
        for key in due:
            if session.reading(key) or key not in session.on_disk():
                continue                       # read at its PageIn already, or died
            if session.write_done(key):
                session.start_read(key, prefetch=True)
            else:
                self.deferred.append(key)      # never wait for a write to prefetch

    def settle_write(self, index: int, key: PageKey) -> None:
        """After the page-out of ``key`` at op ``index``: wait for the write unless the plan lets it overlap."""
        if self.plan.release_before.get(index, index + 1) <= index + 1:
            self.session.wait_write(key)

    def drop_dead_copies(self) -> None:
        """A value that died while paged out needs its copy on disk no more (a paged record
        cannot die: its backward needs it paged in)."""
        for k in self.session.on_disk():
            if isinstance(k, int) and k not in self.held_on_disk and self.live_slot(k) is None:
                self.session.discard(k)

    def finish(self) -> None:
        self.drop_dead_copies()
        self.session.finish()


# --- one step in flight ----------------------------------------------------------------------

class _Run:
    """The live state of one step: held values, records and the current gradient."""

    def __init__(self, stages: Sequence[nn.Module], rng_replayed: frozenset[int], x: torch.Tensor,
                 on_op: OpCallback | None, pager: _Pager | None = None) -> None:
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

    def _internals(self, i: int) -> _Internals:
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
        with torch.enable_grad(), self._slot_hooks(i, x) as pending:
            if i > 0 and (x.is_floating_point() or x.is_complex()):
                box = GradBox()
                stage_input = _CatchInputGrad.apply(self.anchor, x.detach(), box)
            else:
                stage_input = x.detach()  # the batch needs no gradient; cut any outer graph
            y = stage(stage_input)
            del stage_input
            output_grad = GradBox()
            seed = HandOver.apply(y, output_grad) if y.requires_grad else None
        internals = self._sort_saved(i, stage, x, y, pending)
        self.records[i] = _Record(seed, output_grad, box, _ValueRef(y), internals)
        return y

    @contextlib.contextmanager
    def _slot_hooks(self, i: int, x: torch.Tensor) -> Iterator[list[_Saved]]:
        """While stage ``i`` records: saved views of a pageable ``x_i`` go to its slot; the rest wait.

        Hooks are installed only when the schedule pages ``x_i``, ``x_{i+1}`` or this record.
        Yields the handles not sorted yet, for :meth:`_sort_saved` (NOTE [ Paged values ],
        NOTE [ Paged records ]).
        """
        pending: list[_Saved] = []
        pager = self.pager
        if pager is None or not ({i, i + 1} & pager.pageable or i in pager.paged_records):
            yield pending
            return
        slot = pager.slot(i, x) if i in pager.pageable else None
        input_key = storage_key(x) if slot is not None else None

        def pack(tensor: torch.Tensor) -> _Saved:
            saved = _Saved(tensor)
            if slot is not None and saved.key == input_key:
                saved.bind(slot)
            else:
                pending.append(saved)
            return saved

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _Saved.unpack):
                yield pending
        finally:
            # Every saved tensor's hook object keeps ``pack`` (and its closure) alive until
            # backward: the slot must not live on through it when nothing saved the input.
            slot = None

    def _sort_saved(self, i: int, stage: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    pending: list[_Saved]) -> _Internals | None:
        """Now that the output is known: views of a pageable ``x_{i+1}`` reach it through its slot,
        and a paged record's internals are gathered (NOTE [ Paged records ])."""
        pager = self.pager
        if pager is None or not pending:
            pending.clear()
            return None
        output_key = _storage_key_or_none(y)
        output = [saved for saved in pending if saved.key is not None and saved.key == output_key]
        if output and i + 1 in pager.pageable:
            slot = pager.slot(i + 1, y)
            for saved in output:
                saved.bind(slot)
        internals = None
        if i in pager.paged_records:
            internals = _Internals(i)
            values_and_own = {_storage_key_or_none(x), output_key, *_own_storages(stage)}
            for saved in pending:
                if saved.key is not None and saved.key not in values_and_own:
                    internals.add(saved)
        pending.clear()
        return internals

    def backward(self, i: int) -> None:
        record = self.records.pop(i)
        is_loss = i == len(self.stages) - 1
        if record.seed is not None and (self.delta is not None or is_loss):
            # δ_{i+1} goes to the engine alone, freed once consumed (edgetrain.autograd.seeded_backward)
            record.output_grad.grad, self.delta = self.delta, None
            seed_backward(record.seed)
        # else: nothing downstream depends on this stage's output; no gradient flows through it.
        self.delta = None
        self.release(i + 1)
        if i > 0:
            self.release(i)
        self.done.add(i)
        self.delta = record.input_grad.grad if record.input_grad is not None else None


# --- the public executor -----------------------------------------------------------------------

class Executor:
    """Runs one schedule on one list of stages, as many steps as asked.

    Args:
        stages: modules whose composition is the training step; the last is the loss (a
            :class:`~edgetrain.core.stages.LossStage` when a target is passed to :meth:`step`).
        schedule: the ops of one step, for ``len(stages)`` stages.
        chain: the cost model the schedule was planned on; when given, the schedule is
            validated against it (else against a chain of the same length, which checks the
            order of ops but not whether the model's records keep outputs alive or have
            internals to page). A paging
            schedule overlaps its transfers with compute only where the chain's simulated
            memory leaves room (NOTE [ Overlap without a higher peak ]); without a chain every
            transfer is waited for at its own op.
        page_dir: where ``PageOut`` writes (an SD card, flash); None for the temp directory.
            Each step uses its own subdirectory, removed when the step ends or fails. A
            :class:`~edgetrain.runtime.pager.PageStore` is used as it is (its own budget and
            I/O timeout).
        disk_budget_bytes: the most a step may keep on storage; a page-out beyond it raises
            :class:`PagingError` before writing.
        plain_keep_all: run the keep-all schedule as plain autograd (one graph, one backward);
            False runs it op by op like any other schedule (what ``benchmarks/executor_overhead.py``
            times to price the per-stage machinery).

    Raises:
        ScheduleError: a schedule that does not match the stages or cannot run.
        PagingError: the page directory is missing or not writable, or (with a chain) the
            schedule's simulated ``peak_disk_bytes`` exceeds ``disk_budget_bytes``.

    ``last_paging`` holds the :class:`~edgetrain.runtime.pager.PagingStats` of the last step
    of a paging schedule (None before one ran, or for a schedule that does not page).

    Example:
        >>> stages = training_stages(model)
        >>> executor = Executor(stages, uniform(chain, 3), chain)
        >>> loss = executor.step(x, y)   # grads accumulated in model parameters
    """

    def __init__(self, stages: Sequence[nn.Module], schedule: Schedule, chain: Chain | None = None, *,
                 page_dir: str | os.PathLike[str] | PageStore | None = None,
                 disk_budget_bytes: int | None = None, plain_keep_all: bool = True) -> None:
        stages = list(stages)
        if not stages:
            raise ScheduleError("no stages to run")
        if schedule.length != len(stages):
            raise ScheduleError(f"the schedule is for {schedule.length} stages but {len(stages)} stages were given "
                                "(the last stage must be the loss: see edgetrain.core.stages.training_stages)")
        if chain is not None and chain.length != len(stages):
            raise ScheduleError(f"the chain has {chain.length} stages but {len(stages)} stages were given")
        # Without a chain: one of the same length whose records keep internals, so that paging them validates.
        validate(chain if chain is not None else Chain.uniform(len(stages), saved_bytes=2), schedule)
        self.stages = stages
        self.schedule = schedule
        self._rng_replayed = rng_replayed_stages(schedule, chain)
        self._handoff, self._resume = self._loss_positions()
        # A parameter that several stages share (NOTE [ Shared parameters ] in profile/profiler.py) has its
        # gradient summed by the engine across the one graph of plain backprop, which held 50 KiB (3.4%) more
        # than the stage-by-stage accounting on a tied-embedding GPT; the op-by-op run holds what it predicts.
        self._plain = (plain_keep_all and schedule.ops == keep_all(len(stages)).ops
                       and all(len(holding) == 1 for holding in parameter_holders(stages).values()))
        self.last_paging: PagingStats | None = None
        self._store: PageStore | None = None
        self._overlap: OverlapPlan | None = None
        if any(page_key(op) is not None for op in schedule.ops):
            self._store, self._overlap = self._paging_setup(chain, page_dir, disk_budget_bytes)

    def _paging_setup(self, chain: Chain | None, page_dir: str | os.PathLike[str] | PageStore | None,
                      disk_budget_bytes: int | None) -> tuple[PageStore, OverlapPlan]:
        """The page store (which cleans up after dead steps) and when each transfer may overlap."""
        ops = self.schedule.ops
        if chain is None:
            plan = OverlapPlan.serial(ops)
        else:
            needed = simulate(chain, self.schedule).peak_disk_bytes
            if disk_budget_bytes is not None and needed > disk_budget_bytes:
                raise PagingError(f"the schedule keeps up to {needed} bytes on disk, over the disk budget of "
                                  f"{disk_budget_bytes} bytes")
            internals = [stage.saved_bytes - stage.out_bytes for stage in chain.stages]
            plan = plan_overlap(ops, memory_timeline(chain, self.schedule), chain.value_bytes, internals)
        if isinstance(page_dir, PageStore):
            if disk_budget_bytes is not None:
                raise PagingError("give the disk budget to the PageStore, not with it")
            return page_dir, plan
        return PageStore(page_dir, disk_budget_bytes=disk_budget_bytes), plan

    @property
    def loss_stage(self) -> int:
        return len(self.stages) - 1

    def step(self, x: torch.Tensor, target: torch.Tensor | None = None, *,
             on_op: OpCallback | None = None) -> torch.Tensor:
        """Forward, loss and backward of one batch; parameter gradients accumulate in ``.grad``.

        Args:
            x: the input batch (it gets no gradient).
            target: set on the final :class:`LossStage` for this step; None when the last
                stage computes the loss by itself.
            on_op: called as ``on_op(op_index, op)`` after every op (for tracing memory).

        Returns:
            The loss, detached.
        """
        with self._target(target):
            if self._plain:
                return self._plain_step(x, on_op)
            with self._paging() as pager:
                run = _Run(self.stages, self._rng_replayed, x, on_op, pager)
                run.run(list(enumerate(self.schedule.ops)))
                if pager is not None:
                    pager.finish()
        assert run.loss is not None
        return run.loss

    @contextlib.contextmanager
    def _paging(self) -> Iterator[_Pager | None]:
        """A step's pager, its files removed however the step ends; None for a schedule that does not page."""
        if self._store is None:
            yield None
            return
        session = self._store.open()
        try:
            yield self._pager(session)
        finally:
            self.last_paging = session.stats
            session.close()

    def _pager(self, session: PageSession) -> _Pager:
        assert self._overlap is not None
        return _Pager(session, self._overlap, self.schedule.ops)

    def _plain_step(self, x: torch.Tensor, on_op: OpCallback | None) -> torch.Tensor:
        """Keep-all is plain backprop: one autograd graph and one backward call, no per-stage plumbing.

        It holds exactly what the op-by-op run holds (records keep what autograd saves) and
        frees each ``δ`` as soon as it is used, without the per-stage hand-over's cost. ``on_op``
        sees each forward as it ends and every backward once the single backward returns.
        """
        ops = self.schedule.ops
        with torch.enable_grad():
            y = x.detach()
            for index, stage in enumerate(self.stages):
                y = stage(y)
                if on_op is not None:
                    on_op(index, ops[index])
            if y.requires_grad:
                y.backward()
        if on_op is not None:
            for index in range(len(self.stages), len(ops)):
                on_op(index, ops[index])
        return y.detach()

    def forward(self, x: torch.Tensor, *, on_op: OpCallback | None = None) -> tuple[torch.Tensor, PendingBackward]:
        """The ops before the loss, whose recorded forward and backward the caller does.

        Returns the model output ``x_{L-1}`` (the loss stage's input; detached from the
        executor's graphs) and a :class:`PendingBackward` to call with its gradient. This is
        how :class:`~edgetrain.runtime.Checkpointed` lets a user loop compute the loss.
        """
        session = self._store.open() if self._store is not None else None
        pager = self._pager(session) if session is not None else None
        try:
            run = _Run(self.stages, self._rng_replayed, x, on_op, pager)
            loss = self.loss_stage
            ops = [(index, op) for index, op in enumerate(self.schedule.ops) if index < self._resume]
            run.run([(index, op) for index, op in ops if index != self._handoff and not _touches(op, loss)])
            output = run.value(loss).detach()
            run.release(loss)   # as the loss's recorded forward would release it
        except BaseException:
            if session is not None:
                self.last_paging = session.stats
                session.close()
            raise
        rest = [(index, op) for index, op in enumerate(self.schedule.ops)
                if index > self._resume and not _touches(op, loss)]
        return output, PendingBackward(run, rest, self)

    def _loss_positions(self) -> tuple[int, int]:
        """Indices of the loss stage's recorded forward and of its backward in the schedule."""
        loss = len(self.stages) - 1
        ops = self.schedule.ops
        handoff = next(i for i, op in enumerate(ops) if isinstance(op, Forward) and op.stage == loss
                       and op.keep is Keep.ALL)
        resume = next(i for i, op in enumerate(ops) if isinstance(op, Backward) and op.stage == loss)
        return handoff, resume

    @contextlib.contextmanager
    def _target(self, target: torch.Tensor | None) -> Iterator[None]:
        last = self.stages[-1]
        if target is None:
            yield
            return
        if not isinstance(last, LossStage):
            raise TypeError(f"a target was given but the last stage is a {type(last).__name__}, not a LossStage")
        last.target = target
        try:
            yield
        finally:
            last.target = None


def _touches(op: Op, stage: int) -> bool:
    """Whether ``op`` works on the loss stage (forward, backward, paging its record), its output
    (discard) or its input (paging: the caller's autograd holds that one)."""
    if isinstance(op, Discard):
        return op.value == stage + 1
    if isinstance(op, (PageOut, PageIn)):
        return op.value == stage
    return op.stage == stage


class PendingBackward:
    """The rest of a step started by :meth:`Executor.forward`: call it once with the output's gradient in a box."""

    def __init__(self, run: _Run, ops: list[tuple[int, Op]], executor: Executor | None = None) -> None:
        self._run: _Run | None = run
        self._ops = ops
        self._executor = executor
        # A step abandoned between its halves must still remove its page files.
        session = run.pager.session if run.pager is not None else None
        self._cleanup = weakref.finalize(self, session.close) if session is not None else None

    def __call__(self, grad_output: GradBox) -> None:
        """Back-propagate the rest of the step from the gradient in ``grad_output``, which it empties:
        the step then holds the only reference to it and frees it once consumed, as plain backprop does."""
        run, self._run = self._run, None
        if run is None:
            raise RuntimeError("this step was already back-propagated (a checkpointed step cannot retain its graph)")
        try:
            run.delta, grad_output.grad = grad_output.grad, None
            # The caller's loss has back-propagated: as after the loss stage's own Backward, its input
            # x_{L-1} is dead, and a recomputation of the stage before it must not keep it (NOTE [ Dead outputs ]).
            run.done.add(len(run.stages) - 1)
            run.run(self._ops)
            if run.pager is not None:
                run.pager.finish()
        finally:
            if run.pager is not None and self._executor is not None:
                self._executor.last_paging = run.pager.session.stats
            if self._cleanup is not None:
                self._cleanup()
        del run

    @property
    def done(self) -> bool:
        return self._run is None


def run_schedule(stages: Sequence[nn.Module], schedule: Schedule, x: torch.Tensor,
                 target: torch.Tensor | None = None, *, chain: Chain | None = None,
                 on_op: OpCallback | None = None, page_dir: str | os.PathLike[str] | None = None,
                 disk_budget_bytes: int | None = None) -> torch.Tensor:
    """Run one training step's forward, loss and backward of ``stages`` following ``schedule``.

    Gradients accumulate into each parameter's ``.grad`` as plain autograd does (set when
    ``None``, added otherwise); BatchNorm statistics are updated once and the RNG ends where
    a plain step leaves it, however many times the schedule recomputes a stage (see
    NOTE [ Recomputation is invisible ]). Live memory follows the simulator's accounting
    (NOTE [ Executor memory semantics ]).

    Args:
        stages: e.g. :func:`edgetrain.core.stages.training_stages` ``(model, loss_fn)``.
        schedule: a schedule for ``len(stages)`` stages (a planner's output).
        x: the input batch.
        target: labels set on the final :class:`~edgetrain.core.stages.LossStage`.
        chain: the chain the schedule was planned on, to validate against.
        on_op: called as ``on_op(op_index, op)`` after every op.
        page_dir: where ``PageOut`` ops write (see :class:`Executor`); None for the temp directory.
        disk_budget_bytes: the most the step may keep on storage; None for no limit.

    Returns:
        The loss, detached.

    Raises:
        ScheduleError: the schedule does not fit the stages, or an op cannot run.
        PagingError: paging failed (directory, disk budget, full disk, failed transfer); the
            step's page files are removed.

    Example:
        >>> stages = training_stages(model)
        >>> loss = run_schedule(stages, revolve(chain, 3), x, y)
        >>> optimizer.step()
    """
    executor = Executor(stages, schedule, chain, page_dir=page_dir, disk_budget_bytes=disk_budget_bytes)
    return executor.step(x, target, on_op=on_op)

"""Run a checkpointing :class:`~edgetrain.core.schedule.Schedule` in real training steps, op by op: the public
:class:`Executor`, a step split at the loss (:class:`PendingBackward`) and :func:`run_schedule`.

Each step is a :class:`~edgetrain.runtime.schedule_run.ScheduleRun` (NOTE [ Executor memory semantics ],
NOTE [ Recomputation is invisible ]), whose values and records a
:class:`~edgetrain.runtime.step_pager.StepPager` pages (NOTE [ Paged values ], NOTE [ Paged records ]).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from ..autograd.handover import GradBox
from ..core.chain import Chain
from ..core.schedule import Backward, Discard, Forward, Keep, Op, PageIn, PageOut, Schedule, keep_all
from ..core.simulator import memory_timeline, rng_replayed_stages, simulate, validate
from ..errors import PagingError, ScheduleError
from ..models.stages import LossStage, parameter_holders
from .overlap import OverlapPlan, plan_overlap
from .pager import PageSession, PageStore, PagingStats, page_key
from .schedule_run import OpCallback, ScheduleRun
from .step_pager import StepPager

__all__ = ["Executor", "PendingBackward", "run_schedule"]


class Executor:
    """Runs one schedule on one list of stages, as many steps as asked.

    Args:
        stages: modules whose composition is the training step; the last is the loss (a
            :class:`~edgetrain.models.stages.LossStage` when a target is passed to :meth:`step`).
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
            False runs it op by op like any other schedule (what the ``executor_overhead``
            benchmark times to price the per-stage machinery).

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
                                "(the last stage must be the loss: see edgetrain.models.stages.training_stages)")
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
                run = ScheduleRun(self.stages, self._rng_replayed, x, on_op, pager)
                run.run(list(enumerate(self.schedule.ops)))
                if pager is not None:
                    pager.finish()
        assert run.loss is not None
        return run.loss

    @contextlib.contextmanager
    def _paging(self) -> Iterator[StepPager | None]:
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

    def _pager(self, session: PageSession) -> StepPager:
        assert self._overlap is not None
        return StepPager(session, self._overlap, self.schedule.ops)

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
            run = ScheduleRun(self.stages, self._rng_replayed, x, on_op, pager)
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

    def __init__(self, run: ScheduleRun, ops: list[tuple[int, Op]], executor: Executor | None = None) -> None:
        self._run: ScheduleRun | None = run
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
    NOTE [ Recomputation is invisible ] in ``schedule_run.py``). Live memory follows the simulator's
    accounting (NOTE [ Executor memory semantics ]).

    Args:
        stages: e.g. :func:`edgetrain.models.stages.training_stages` ``(model, loss_fn)``.
        schedule: a schedule for ``len(stages)`` stages (a planner's output).
        x: the input batch.
        target: labels set on the final :class:`~edgetrain.models.stages.LossStage`.
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

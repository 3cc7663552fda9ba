"""Executor ops from a POET-MILP solution on a chain: :func:`milp_schedule`.

:func:`~edgetrain.planners.milp.solve.milp` decides on the nodes of
:func:`~edgetrain.planners.milp.solve.chain_training_graph` (``F_0 .. F_{L-1}`` then
``B_{L-1} .. B_0``): which nodes each stage computes (``R``), keeps (``S``), reads back
(``M_in``) and writes (``M_out``). This module replays those decisions stage by stage on the
simulator's own state (:mod:`edgetrain.core.schedule`) and emits the ops that do the same.

NOTE [ From MILP decisions to ops ]
Node ``F_j`` is the value ``x_{j+1}`` (plus, once stage ``j`` is recorded, the record's own
tensors); ``B_i`` is ``Backward(i)`` and holds ``δ_i``. Stages run in order; within stage ``t``:

* Computations ``R[t, :]`` run in node order. The *last* computation of ``F_i`` (it is at or
  before ``B_i``'s stage: the MILP cannot read ``F_i`` later) is the recording
  ``Forward(i, "all")``: autograd can back-propagate only a recorded stage, and recording it
  any earlier would pin memory the MILP frees. Any other computation of ``F_i`` is
  ``Forward(i, "input")`` when the MILP still holds ``x_i`` afterwards (a later reader in the
  stage, or ``S[t+1]`` without a page-in) or reads it back from flash later (it is paged out
  right after), else ``Forward(i, "none")``.
* After each computation the MILP frees every input that has no later reader in the stage and
  is not kept for ``t+1`` (a value paged in at the end of ``t`` is not kept). At the end of the
  stage it drops everything else that ``S[t+1]`` does not keep. Each such *release* becomes: a
  ``PageOut`` (and ``PageOutRecord`` for a record's own tensors) when the MILP reads the node
  back from flash before computing it again; else a ``Discard`` when the executor holds the value
  only as a plain value; nothing when an op already released it.
* ``M_in[t, j]`` becomes ``PageIn(j + 1)`` (and ``PageInRecord(j)``) after the stage's releases.

The MILP writes a value once (``M_out[j, j]``) and its copy stays on flash; ``PageIn`` deletes
the copy, so each read-back takes its own ``PageOut``, issued when the value is dropped. Energy
is the MILP's when every value is read back at most once, which is what is emitted (a second
read-back raises). Memory is never more than the MILP's at any point: the ops hold a subset of
what the MILP's replay holds, and the result is checked with :func:`~edgetrain.core.simulator.simulate`
against the budget.

What the ops cannot express (each raises :class:`~edgetrain.errors.ScheduleError` naming the
stage and node):

* freeing a value a live record keeps (its input when ``input_saved``, its output when
  ``output_saved``, its own saved tensors) without reading it back from flash: the MILP then
  recomputes it and lets ``Backward`` use the recomputed copy, which autograd cannot do without
  re-recording the stage;
* reading a value back from flash twice after one write (see above);
* keeping a value that the executor's ops release (e.g. recording a stage while the MILP keeps
  its input although no record keeps it).
"""

from __future__ import annotations

import numpy as np

from ...core.chain import Chain
from ...core.schedule import (
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
)
from ...core.simulator import SimState, SimTally, apply_op, simulate
from ...errors import ScheduleError
from .solve import MilpResult

__all__ = ["milp_schedule"]


class _Converter:
    """The simulator's state, stepped op by op while the MILP's stages are walked."""

    def __init__(self, chain: Chain, result: MilpResult) -> None:
        self.chain = chain
        self.L = length = chain.length
        n = 2 * length
        mats = [np.asarray(getattr(result, key), dtype=bool) for key in ("R", "S", "M_in", "M_out")]
        if any(m.shape != (n, n) for m in mats):
            raise ScheduleError(f"MILP decision matrices are {mats[0].shape}, expected {n}x{n}: the result is not "
                                f"for chain_training_graph of this {length}-stage chain")
        self.R, self.S, self.M_in, self.M_out = mats
        if not self.R.diagonal().all() or np.triu(self.R, 1).any():
            raise ScheduleError("MILP result does not advance its frontier one node a stage")
        self.n = n
        self.deps = [self._deps(k) for k in range(n)]
        # the last computation of F_i is its recording forward
        self.record_stage = [int(np.flatnonzero(self.R[:, i])[-1]) for i in range(length)]
        for i, t in enumerate(self.record_stage):
            if t > self._b_node(i):
                raise ScheduleError(f"the MILP computes F{i} in stage {t}, after B{i}")
        self.state, self.tally = SimState(chain), SimTally()
        self.ops: list[Op] = []
        self.pageouts = np.zeros(length, dtype=int)      # per node F_j: PageOut(j + 1) emitted
        self.record_pageouts = np.zeros(length, dtype=int)

    # --- the graph of chain_training_graph ---------------------------------------------------
    def _b_node(self, i: int) -> int:
        return 2 * self.L - 1 - i

    def name(self, k: int) -> str:
        return f"F{k}" if k < self.L else f"B{2 * self.L - 1 - k}"

    def _deps(self, k: int) -> tuple[int, ...]:
        length, stages = self.L, self.chain.stages
        if k < length:
            return (k - 1,) if k > 0 else ()
        i = 2 * length - 1 - k
        s = stages[i]
        deps = [] if i == length - 1 else [k - 1]
        if s.output_saved or s.saved_bytes > s.out_bytes:
            deps.append(i)
        if s.input_saved and i > 0:
            deps.append(i - 1)
        return tuple(deps)

    # --- stepping the simulator's state ---------------------------------------------------------
    def emit(self, op: Op, where: str) -> None:
        def fail(why: str) -> ScheduleError:
            return ScheduleError(f"MILP {where}: op {op} cannot run: {why}")

        apply_op(self.state, self.tally, op, fail)
        self.state.drop_dead_copies()
        self.ops.append(op)

    # --- decisions ------------------------------------------------------------------------------
    def paged_in_later(self, j: int, t: int) -> bool:
        """Whether, after a release in stage ``t``, the MILP reads ``F_j`` back before recomputing it."""
        ins = np.flatnonzero(self.M_in[t:, j])
        if not len(ins):
            return False
        recomputes = np.flatnonzero(self.R[t + 1:, j])
        return not len(recomputes) or ins[0] < recomputes[0] + 1

    def release(self, j: int, t: int, why: str) -> None:
        """The MILP no longer holds ``F_j`` in RAM: make the ops hold no more of it either."""
        state, v = self.state, j + 1
        value_in_ram = v <= self.L and state.in_ram(v)
        record_in_ram = j in state.recorded and state.internals(j) > 0 and j not in state.paged_records
        if not value_in_ram and not record_in_ram:
            return
        where = f"stage {t} ({self.name(t)}) {why} F{j}"
        if self.paged_in_later(j, t):
            if value_in_ram:
                if v >= self.L:
                    raise ScheduleError(f"MILP {where} to read it back from flash, but the loss x_{v} cannot be paged")
                self.pageouts[j] += 1
                if self.pageouts[j] > self.M_out[:, j].sum():
                    raise ScheduleError(
                        f"MILP {where} and reads it back from flash again from its single write (M_out); PageIn "
                        f"deletes the copy on disk, so the ops would need another PageOut({v}) and cost more "
                        "energy than the MILP: not expressible at its energy")
                self.emit(PageOut(v), where)
            if record_in_ram:
                self.record_pageouts[j] += 1
                if self.record_pageouts[j] > self.M_out[:, j].sum():
                    raise ScheduleError(f"MILP {where} and reads the record of stage {j} back from flash again "
                                        "from its single write: not expressible at its energy")
                self.emit(PageOutRecord(j), where)
            return
        if record_in_ram:
            raise ScheduleError(
                f"MILP {where} (not read back from flash), but the record of stage {j} keeps its saved tensors "
                f"until Backward({j}): not expressible")
        if state.pinned(v):
            raise ScheduleError(
                f"MILP {where} (x_{v}) and recomputes it for B{v}, but the record of stage {v} keeps its input "
                f"x_{v} until Backward({v}): Backward cannot use a recomputed copy without re-recording the stage, "
                "which the MILP's model allows and autograd does not; not expressible")
        if state.covered(v):
            raise ScheduleError(
                f"MILP {where} (x_{v}), but the record of stage {j} keeps its output x_{v} until Backward({j}): "
                "not expressible")
        self.emit(Discard(v), where)

    def page_in(self, j: int, t: int) -> None:
        state, v = self.state, j + 1
        where = f"stage {t} ({self.name(t)}) reads F{j} back from flash"
        done = False
        if v < self.L and state.alive(v) and v in state.on_disk:
            self.emit(PageIn(v), where)
            done = True
        if j in state.paged_records:
            self.emit(PageInRecord(j), where)
            done = True
        if not done:
            raise ScheduleError(f"MILP {where}, but the ops have no copy of it on disk (x_{v} "
                                f"{'is in RAM' if state.in_ram(v) else 'is gone'}): not expressible")

    def stage(self, t: int) -> None:
        R, n = self.R, self.n
        keep_next = self.S[t + 1] & ~self.M_in[t] if t + 1 < n else np.zeros(n, dtype=bool)
        computed = np.flatnonzero(R[t]).tolist()
        for pos, k in enumerate(computed):
            later = computed[pos + 1:]
            where = f"stage {t} ({self.name(t)}) computes {self.name(k)}"
            if k < self.L:
                if self.record_stage[k] == t:
                    op: Op = Forward(k, Keep.ALL)
                else:
                    needed = k > 0 and (bool(keep_next[k - 1]) or any(k - 1 in self.deps[j] for j in later)
                                        or self.paged_in_later(k - 1, t))
                    op = Forward(k, Keep.INPUT if needed else Keep.NONE)
            else:
                op = Backward(2 * self.L - 1 - k)
            self.emit(op, where)
            for d in self.deps[k]:
                if d < self.L and not keep_next[d] and not any(d in self.deps[j] for j in later):
                    self.release(d, t, f"frees after {self.name(k)}")
        for j in range(self.L):
            if not keep_next[j]:
                self.release(j, t, "does not keep for the next stage")
        for j in np.flatnonzero(self.M_in[t]).tolist():
            if j < self.L:
                self.page_in(j, t)


def milp_schedule(chain: Chain, result: MilpResult) -> Schedule:
    """The executor ops of a MILP solution on ``chain`` (NOTE [ From MILP decisions to ops ]).

    Args:
        chain: the chain whose :func:`~edgetrain.planners.milp.solve.chain_training_graph` was solved.
        result: the solution, from :func:`~edgetrain.planners.milp.solve.milp`.

    Returns:
        A :class:`~edgetrain.core.schedule.Schedule` (strategy ``"milp"``) that :func:`simulate` accepts,
        with a peak within ``result.memory_bytes``; it computes every node as often as the MILP
        and pages every value as often (a record's own tensors, ``saved_bytes > out_bytes``, are
        one more transfer where the MILP pages the node whole). On chains whose records keep only
        their output its simulated energy is the MILP's.

    Raises:
        ScheduleError: a decision the ops cannot express (named, with its stage), or (a bug) a
            converted schedule that would exceed the budget.
    """
    conv = _Converter(chain, result)
    for t in range(conv.n):
        conv.stage(t)
    params = {"milp_energy_j": result.energy_j, "milp_status": result.status, "budget_bytes": result.memory_bytes}
    schedule = Schedule(tuple(conv.ops), chain.length, strategy="milp", params=params)
    stats = simulate(chain, schedule)
    if stats.peak_bytes > result.memory_bytes + chain.rng_reserve_bytes:   # the MILP leaves the states out
        raise ScheduleError(f"converted MILP schedule peaks at {stats.peak_bytes} B, above the budget "
                            f"{result.memory_bytes} B (MILP replay: {result.peak_bytes} B)")
    return schedule

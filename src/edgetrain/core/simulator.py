"""The simulator every planner is judged by: it validates a schedule op by op and counts its memory, time and energy.

The ops and what each one does are in :mod:`edgetrain.core.schedule`; the memory model of a stage is
NOTE [ The chain memory model ] in ``chain.py``.

NOTE [ Dead outputs ]
A forward of stage ``i`` whose successor ``i + 1`` is already back-propagated (the last stage
of a recomputed segment) makes an ``x_{i+1}`` that nothing will read: it is released as
soon as the forward returns unless the record keeps it (``output_saved``), as torch's own
checkpoint does. The loss ``x_L`` is kept: the step returns it.

NOTE [ Paging time and energy ]
Paging is charged *serially*: an op waits for its transfer, ``latency + bytes / throughput``
(POET's per-transfer formula, :func:`edgetrain.costs.energy.page_time_s`). The executor overlaps
transfers with compute on background threads, so a real step can only be faster than this
price, and a deadline met here is met there. A paged-out value's copy on disk is deleted when
it is paged in or when the value dies; ``peak_disk_bytes`` is the most the step keeps there.

NOTE [ Generator states in the plan ]
A recomputed stage that draws random numbers (dropout) must draw the same ones again, or its
gradient is not the one of the forward that made the loss. The executor keeps a copy of the
generators' state (``Chain.rng_state_bytes``: 5,056 bytes for the CPU generator) from the stage's
first forward until its recorded one, the last, and a replay copies the current state while it
runs, to put it back after. The states are tensors like any other, which the c10 allocator (and
the tracker, to which the executor shows them) sees, so the simulator counts them: every
stage of :func:`rng_replayed_stages` holds one from its first forward to its recorded forward,
and each of its forwards pays one more while it runs. The optimal DP's recurrence leaves them
out; :func:`~edgetrain.planners.choose.plan` checks its schedules here and plans lower where they
would not fit (the MILP and paging planners plan ``Chain.rng_reserve_bytes`` below a budget).
A stage checkpointed inside (``models/segmented.py``) keeps the states of its segments that draw
in its record, where the profiler counts them (``saved_bytes``), and shows them to the trackers too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from .chain import Chain
from .schedule import Backward, Discard, Forward, Keep, Op, PageIn, PageInRecord, PageOut, PageOutRecord, Schedule

if TYPE_CHECKING:
    from ..costs.energy import EnergyProfile

__all__ = ["Stats", "validate", "simulate", "OpMemory", "memory_timeline", "SimState", "SimTally", "apply_op",
           "rng_replayed_stages"]


@dataclass(frozen=True)
class Stats:
    """What a schedule costs on a chain, from :func:`simulate`.

    ``forward_advances`` counts forwards that do not record (Griewank's "advances"); every
    stage is recorded exactly once, so ``forward_count = length + forward_advances``.
    ``time_s`` is compute plus paging time (NOTE [ Paging time and energy ]); the energy
    fields are None unless :func:`simulate` was given a device profile. ``recompute_factor`` is
    ``time_s`` over the step without recomputation (NOTE [ Recompute factor ]).
    """

    peak_bytes: int
    time_s: float
    forward_advances: int
    forward_count: int
    backward_count: int
    peak_op: int | None
    resident_bytes: int
    recompute_factor: float
    peak_grad_bytes: int = 0
    compute_time_s: float = 0.0
    page_time_s: float = 0.0
    pageout_count: int = 0
    pageout_bytes: int = 0
    pagein_count: int = 0
    pagein_bytes: int = 0
    peak_disk_bytes: int = 0
    energy_compute_j: float | None = None
    energy_pagein_j: float | None = None
    energy_pageout_j: float | None = None

    @property
    def activation_peak_bytes(self) -> int:
        """Peak above the resident weights, optimizer state and input."""
        return self.peak_bytes - self.resident_bytes

    @property
    def energy_j(self) -> float | None:
        """Compute + page-in + page-out energy of the step, J (None without a device profile)."""
        if self.energy_compute_j is None or self.energy_pagein_j is None or self.energy_pageout_j is None:
            return None
        return self.energy_compute_j + self.energy_pagein_j + self.energy_pageout_j


class SimState:
    """Live values, records and gradients while a schedule runs; sizes from the chain.

    :func:`apply_op` steps it; :func:`simulate` is the loop over a schedule, and a planner that
    turns another model's solution into ops (``planners/milp/ops.py``) steps it op by op.
    """

    def __init__(self, chain: Chain, rng_replayed: frozenset[int] = frozenset()) -> None:
        self.chain = chain
        self.rng_replayed = rng_replayed if chain.rng_state_bytes else frozenset()
        self.rng_held: set[int] = set()   # stages whose generator state is kept to replay their draws
        self.values = chain.value_bytes
        self.held: set[int] = {0}
        self.recorded: set[int] = set()
        self.done: set[int] = set()
        self.on_disk: set[int] = set()
        self.paged_records: set[int] = set()
        self.delta: int | None = chain.length  # δ_L: the loss seeds its own gradient (0 bytes)
        self.grads = 0
        # fixed by the chain, read at every op: memory() is the simulator's inner loop
        self._resident_state = chain.resident_state_bytes
        self._internals = tuple(s.saved_bytes - s.out_bytes for s in chain.stages)
        self._inputs_saved = frozenset(i for i, s in enumerate(chain.stages) if s.input_saved)
        self._outputs_saved = frozenset(i for i, s in enumerate(chain.stages) if s.output_saved)

    def covered(self, value: int) -> bool:
        """Whether ``x_value`` is part of the record of the stage that produced it."""
        return (value - 1) in self.recorded and self.chain.stages[value - 1].output_saved

    def pinned(self, value: int) -> bool:
        """Whether the record of the stage that reads ``x_value`` keeps it."""
        return value in self.recorded and self.chain.stages[value].input_saved

    def alive(self, value: int) -> bool:
        return value in self.held or self.pinned(value) or self.covered(value)

    def in_ram(self, value: int) -> bool:
        return self.alive(value) and value not in self.on_disk

    def drop_dead_copies(self) -> None:
        """A value that died while paged out needs its copy on disk no more."""
        self.on_disk = {k for k in self.on_disk if self.alive(k)}

    def internals(self, stage: int) -> int:
        """Bytes of a record besides its stage's input and output."""
        return self._internals[stage]

    @property
    def disk_bytes(self) -> int:
        return sum(self.values[k] for k in self.on_disk) + sum(self.internals(i) for i in self.paged_records)

    def memory(self) -> int:
        """RAM of the state: resident state (the loss held to the step's end included), gradients,
        records' own tensors, live values in RAM, δ."""
        mem = self._resident_state + self.grads + len(self.rng_held) * self.chain.rng_state_bytes
        # a record's own tensors; its input and output are values, alive while held, pinned or covered
        mem += sum(map(self._internals.__getitem__, self.recorded - self.paged_records))
        alive = (self.held | (self.recorded & self._inputs_saved)
                 | set(map((1).__add__, self.recorded & self._outputs_saved)))
        mem += sum(map(self.values.__getitem__, alive - self.on_disk))
        if self.delta is not None and self.delta < self.chain.length:
            mem += self.values[self.delta]
        return mem


@dataclass
class SimTally:
    """Counters of one simulated step."""

    compute_time_s: float = 0.0
    advances: int = 0
    forwards: int = 0
    backwards: int = 0
    pagein_transfers: list[int] = field(default_factory=list)
    pageout_transfers: list[int] = field(default_factory=list)


def _forward(state: SimState, tally: SimTally, op: Forward, before: int, fail: Callable[[str], ScheduleError]) -> int:
    chain, i = state.chain, op.stage
    if not 0 <= i < chain.length:
        raise fail(f"no stage {i} in a chain of {chain.length}")
    if i in state.done:
        raise fail(f"stage {i} was already back-propagated")
    if i in state.recorded:
        raise fail(f"stage {i} is already recorded")
    if not (i in state.held or state.covered(i)):
        raise fail(f"its input x_{i} is not in memory")
    if i in state.on_disk:
        raise fail(f"its input x_{i} is paged out (PageIn({i}) first)")
    stage = chain.stages[i]
    if op.keep is Keep.ALL:
        transient = before + stage.saved_bytes + stage.rec_workspace_bytes
        state.recorded.add(i)
    else:
        transient = before + stage.out_bytes + stage.fwd_workspace_bytes
        tally.advances += 1
    if i in state.rng_replayed:   # NOTE [ Generator states in the plan ]: the state noted, or the replay's copy
        transient += chain.rng_state_bytes
        state.rng_held.add(i)
        if op.keep is Keep.ALL:
            state.rng_held.discard(i)
    if op.keep is not Keep.INPUT and i > 0:
        state.held.discard(i)
    output_dead = i + 1 < chain.length and i + 1 in state.done   # NOTE [ Dead outputs ]
    if not output_dead:
        state.held.add(i + 1)
    tally.compute_time_s += stage.fwd_time_s
    tally.forwards += 1
    return transient


def _backward(state: SimState, tally: SimTally, op: Backward, before: int, fail: Callable[[str], ScheduleError]) -> int:
    chain, i = state.chain, op.stage
    if not 0 <= i < chain.length:
        raise fail(f"no stage {i} in a chain of {chain.length}")
    if i in state.done:
        raise fail(f"stage {i} was already back-propagated")
    if i not in state.recorded:
        raise fail(f"stage {i} is not recorded (run Forward({i}, keep='all') first)")
    if state.delta != i + 1:
        raise fail(f"the gradient δ_{i + 1} of its output is not available")
    if i in state.paged_records:
        raise fail(f"its record is paged out (PageInRecord({i}) first)")
    stage = chain.stages[i]
    for k, kept in ((i, stage.input_saved and i > 0), (i + 1, stage.output_saved)):
        if kept and k in state.on_disk:
            raise fail(f"its record needs x_{k}, which is paged out (PageIn({k}) first)")
    grad_in = state.values[i] if i > 0 else 0
    transient = before + grad_in + stage.grad_bytes + stage.bwd_workspace_bytes
    state.recorded.discard(i)
    state.done.add(i)
    state.held.discard(i + 1)
    if i > 0:
        state.held.discard(i)
    state.delta = i if i > 0 else None
    state.grads += stage.grad_bytes
    tally.compute_time_s += stage.bwd_time_s
    tally.backwards += 1
    return transient


def _page(state: SimState, tally: SimTally, op: PageOut | PageIn, before: int,
          fail: Callable[[str], ScheduleError]) -> int:
    k, chain = op.value, state.chain
    if not 0 < k < chain.length:
        raise fail("only stage outputs x_1 .. x_{L-1} can be paged (x_0 is the caller's batch)")
    if not state.alive(k):
        raise fail(f"x_{k} is not alive (nothing holds or keeps it)")
    size = state.values[k]
    if isinstance(op, PageOut):
        if k in state.on_disk:
            raise fail(f"x_{k} is already paged out")
        state.on_disk.add(k)
        tally.pageout_transfers.append(size)
        return before            # the value stays in RAM until its write completes
    if k not in state.on_disk:
        raise fail(f"x_{k} is not paged out")
    state.on_disk.discard(k)
    tally.pagein_transfers.append(size)
    return before + size


@dataclass(frozen=True)
class OpMemory:
    """RAM of the step while one op runs (``transient_bytes``) and once it returns (``after_bytes``)."""

    transient_bytes: int
    after_bytes: int


def _page_record(state: SimState, tally: SimTally, op: PageOutRecord | PageInRecord, before: int,
                 fail: Callable[[str], ScheduleError]) -> int:
    i = op.stage
    if i not in state.recorded:
        raise fail(f"stage {i} is not recorded")
    size = state.internals(i)
    if isinstance(op, PageOutRecord):
        if i in state.paged_records:
            raise fail(f"the record of stage {i} is already paged out")
        if size <= 0:
            raise fail(f"the record of stage {i} keeps nothing besides its input and output")
        state.paged_records.add(i)
        tally.pageout_transfers.append(size)
        return before
    if i not in state.paged_records:
        raise fail(f"the record of stage {i} is not paged out")
    state.paged_records.discard(i)
    tally.pagein_transfers.append(size)
    return before + size


def apply_op(state: SimState, tally: SimTally, op: Op, fail: Callable[[str], ScheduleError]) -> int:
    """Run ``op`` on ``state``, counting it in ``tally``; returns the RAM while it runs.

    Raises ``fail(why)`` when the op cannot run. A value that died while paged out keeps its
    copy on disk until ``state.drop_dead_copies()``, so a caller can read the disk's peak first.
    """
    before = state.memory()
    if isinstance(op, Forward):
        return _forward(state, tally, op, before, fail)
    if isinstance(op, Backward):
        return _backward(state, tally, op, before, fail)
    if isinstance(op, (PageOut, PageIn)):
        return _page(state, tally, op, before, fail)
    if isinstance(op, (PageOutRecord, PageInRecord)):
        return _page_record(state, tally, op, before, fail)
    if isinstance(op, Discard):
        k = op.value
        if k == 0:
            raise fail("x_0 is the caller's input and stays in memory")
        if k not in state.held:
            raise fail(f"x_{k} is not held")
        state.held.discard(k)
        return before
    raise fail("unknown op type")


def _run(chain: Chain, schedule: Schedule, profile: EnergyProfile | None = None,
         timeline: list[OpMemory] | None = None) -> Stats:
    """Check every op against the state and account memory, time and energy; raise on the first bad op."""
    if schedule.length != chain.length:
        raise ScheduleError(f"schedule is for {schedule.length} stages, chain has {chain.length}")
    state, tally = SimState(chain, rng_replayed_stages(schedule, chain)), SimTally()
    peak, peak_op, peak_grads, peak_disk = state.memory(), None, 0, 0

    for index, op in enumerate(schedule.ops):
        def fail(why: str, index: int = index, op: Op = op) -> ScheduleError:
            return ScheduleError(f"op {index} {op}: {why}")

        transient = apply_op(state, tally, op, fail)
        peak_disk = max(peak_disk, state.disk_bytes)
        state.drop_dead_copies()
        after = state.memory()
        transient = max(transient, after)
        if timeline is not None:
            timeline.append(OpMemory(transient, after))
        if transient > peak:
            peak, peak_op = transient, index
            peak_grads = state.grads
    if state.done != set(range(chain.length)):
        missing = min(set(range(chain.length)) - state.done)
        raise ScheduleError(f"schedule ends before the backward of stage {missing}")
    step_peak = chain.resident_bytes + state.grads + chain.optimizer_workspace_bytes
    if step_peak > peak:
        peak, peak_op, peak_grads = step_peak, None, state.grads
    return _stats(chain, tally, profile, peak=peak, peak_op=peak_op, peak_grads=peak_grads, peak_disk=peak_disk)


# NOTE [ Recompute factor ]
# ρ = the schedule's simulated step time over ``Chain.compute_time_s``, the step without recomputation (every
# stage's forward and backward once, nothing paged): 1.0 for plain backprop, and each advance adds its stage's
# forward time to the numerator. This is Griewank's convention for Revolve and the founding paper's (Kukreja et al.,
# PAISE 2019: unit forward and backward per layer, ``ρ = (2l + advances) / 2l``). Stage times are whatever the chain
# carries (measured seconds, or FLOPs at NOMINAL_FLOPS_PER_S where nothing is timed), so ρ weighs a recomputed stage
# by its own cost, not by one unit. The numerator is the step's ``time_s``: compute, plus paging time charged
# serially when :func:`simulate` is given a device profile (NOTE [ Paging time and energy ]; without one paging
# costs no time), so with a profile a schedule pays for its transfers in ρ as it pays for its advances. A chain with
# no time at all (every stage 0 s) has ρ = 1.
def _stats(chain: Chain, tally: SimTally, profile: EnergyProfile | None, *, peak: int, peak_op: int | None,
           peak_grads: int, peak_disk: int) -> Stats:
    page_time_s = 0.0
    energies: dict[str, float | None] = {"energy_compute_j": None, "energy_pagein_j": None, "energy_pageout_j": None}
    if profile is not None:
        page_time_s = (sum(profile.page_time_s(n, "in") for n in tally.pagein_transfers)
                       + sum(profile.page_time_s(n, "out") for n in tally.pageout_transfers))
        energies = {"energy_compute_j": profile.compute_power_w * tally.compute_time_s,
                    "energy_pagein_j": sum(profile.page_energy_j(n, "in") for n in tally.pagein_transfers),
                    "energy_pageout_j": sum(profile.page_energy_j(n, "out") for n in tally.pageout_transfers)}
    time_s = tally.compute_time_s + page_time_s
    baseline = chain.compute_time_s
    return Stats(peak_bytes=peak, time_s=time_s, forward_advances=tally.advances,
                 forward_count=tally.forwards, backward_count=tally.backwards, peak_op=peak_op,
                 resident_bytes=chain.resident_bytes,
                 recompute_factor=time_s / baseline if baseline > 0 else 1.0, peak_grad_bytes=peak_grads,
                 compute_time_s=tally.compute_time_s, page_time_s=page_time_s,
                 pageout_count=len(tally.pageout_transfers), pageout_bytes=sum(tally.pageout_transfers),
                 pagein_count=len(tally.pagein_transfers), pagein_bytes=sum(tally.pagein_transfers),
                 peak_disk_bytes=peak_disk, **energies)


def rng_replayed_stages(schedule: Schedule, chain: Chain | None = None) -> frozenset[int]:
    """The stages ``schedule`` forwards more than once whose forward draws random numbers (every stage it
    forwards more than once, without a chain): a recomputation replays their draws (NOTE [ Generator states
    in the plan ])."""
    counts = Counter(op.stage for op in schedule.ops if isinstance(op, Forward))
    return frozenset(stage for stage, count in counts.items()
                     if count > 1 and (chain is None or chain.stages[stage].uses_rng))


def validate(chain: Chain, schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` naming the first op that cannot run, or if the step is incomplete."""
    _run(chain, schedule)


def simulate(chain: Chain, schedule: Schedule, profile: EnergyProfile | None = None) -> Stats:
    """Peak bytes, time, forward counts (and energy) of ``schedule`` on ``chain``; validates on the way.

    The peak includes everything a step holds: weights, optimizer state, the input batch,
    activations, gradients and transient workspace, and the optimizer step itself.

    Args:
        chain: the cost model; its stage times must be the target device's when ``profile``
            is given (see :func:`edgetrain.costs.energy.scale_chain`).
        schedule: the ops of one step.
        profile: a device's energy profile: prices paging time (else paging is free) and fills
            the energy fields (compute = power x compute time; paging per transfer).
    """
    return _run(chain, schedule, profile)


def memory_timeline(chain: Chain, schedule: Schedule) -> tuple[OpMemory, ...]:
    """The simulated RAM at every op of ``schedule``: what an executor may overlap I/O into.

    ``max(m.transient_bytes)`` is the step's peak before the optimizer step (:func:`simulate`
    also counts that); ``peak - m.transient_bytes`` is the headroom while op ``i`` runs.
    """
    timeline: list[OpMemory] = []
    _run(chain, schedule, timeline=timeline)
    return tuple(timeline)

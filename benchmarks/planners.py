"""Planners on real models: measured step time and peak of PyTorch, checkpoint_sequential, revolve, optimal.

For each model the chain is profiled on the real model with measured stage times, budgets are
spread evenly from the least feasible (``optimal``'s table minimum) to keep-everything's
simulated peak, and every configuration is run for real on this CPU:

* ``pytorch``: ``loss_fn(model(x), y).backward()``;
* ``checkpoint_sequential``: ``torch.utils.checkpoint.checkpoint_sequential(nn.Sequential(*stages),
  segments, x, use_reentrant=False)`` then the loss, at every segment count ``1..L``;
* ``revolve``: for each budget the slot count with the least simulated time whose simulated
  peak fits, run by our :class:`~edgetrain.runtime.Executor`;
* ``optimal``: one :func:`~edgetrain.planners.solve` table, ``table.schedule(budget)`` for each
  budget (keep-all where it fits), plus the least-memory schedule with simulated ρ <= 2
  (``plan(chain, recompute=2)``) and the least-*activation* one (see :func:`activations_only`),
  run by the Executor.

The simulated peaks and ρ of ``pytorch`` and ``checkpoint_sequential`` are those of the same
schedules in our simulator (keep-all; :func:`torch_sequential_schedule`).

NOTE [ What one measured step is ]
Every step, timed or tracked, is ``zero_grad(set_to_none)``, forward + loss + backward, then an
SGD-momentum step (``lr=0``, so all configurations see identical weights; the step's work and
memory do not depend on the rate). The step time reported is forward + loss + backward only
(the ρ of the simulator); the optimizer step is timed apart (``opt_time_s``). The peak is the
live tensor bytes of the whole step, optimizer step included, with weights, buffers, momentum
and the batch registered: the quantity the simulator's peak (which counts the optimizer step)
predicts. Peaks come from a separate tracked step, since the tracker slows every op.

NOTE [ Time ratios on a shared CPU ]
Configurations are timed in rounds; in every round each configuration runs once, in blocks
of ``BLOCK`` with a plain PyTorch step before and after each block. A configuration's ratio
in a round is its time over the mean of the two plain steps bracketing its block, and its
``time_ratio`` is the median over rounds, robust to load drifting between rounds. The order
of the configurations rotates (and reverses) from round to round. Wall-clock and process CPU
time are both kept (``time_ratio``, ``cpu_time_ratio``); CPU time does not count the time the
process was descheduled by other jobs.

torch runs on one thread by default here. On a 2-core machine that other jobs share, two
intra-op threads stall whenever one of them is descheduled: plain ResNet-18 steps measured
0.03 s typically and up to 2.5 s (a third of the steps 10x slower or worse), while with one
thread every step after the first stayed within 1.3x of the median (``THREADS``).

glibc's malloc is told to keep freed memory (:func:`keep_freed_memory`): otherwise a step
that follows a smaller-footprint step pays page faults, up to 35% of a plain BERT-base step.

The noise figure of a run is the largest distance from 1 of the ratios of the two
configurations that run exactly the plain step (``pytorch`` itself and
``checkpoint_sequential`` with one segment).

Every point keeps its per-round ratios and their spread (median, quartiles, CoV:
:func:`edgetrain.bench.stats.spread`), which the tables show.
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from benchmarks._allocator import keep_freed_memory
from edgetrain.bench.stats import Spread, spread
from edgetrain.core.chain import Chain
from edgetrain.core.optim import make_optimizer
from edgetrain.core.schedule import Backward, Forward, Keep, Op, Schedule, keep_all
from edgetrain.core.simulator import Stats, simulate
from edgetrain.models import get_model_spec, stages_of
from edgetrain.models.stages import training_stages
from edgetrain.planners import OptimalTable, plan, revolve, solve
from edgetrain.planners.uniform import segment_bounds
from edgetrain.profiling import LiveBytesTracker, profile
from edgetrain.profiling.tracker import storage_bytes, storage_key
from edgetrain.runtime import Executor

log = logging.getLogger(__name__)

TITLE = "Planners against checkpoint_sequential: measured step time and peak"

MiB = 2**20
# (model, batch, image side or sequence length). The encoder is BERT-base-shaped (12 layers,
# d_model 768, 110 M parameters): batch 4 of 128 tokens takes about 3.5 s a step here (one thread).
FULL_CASES = (("resnet18", 8, 224), ("resnet50", 8, 224), ("transformer", 4, 128))
QUICK_CASES = (("resnet18", 2, 64), ("transformer_small", 4, 32))
REPS, QUICK_REPS = 5, 3   # timed rounds per configuration
BUDGETS, QUICK_BUDGETS = 8, 3   # budgets from the least feasible to keep-all
SLOTS = 4000              # memory units of the optimal table
THREADS = 1               # torch's intra-op threads: see NOTE [ Time ratios on a shared CPU ]
LABELS = {"resnet18": "ResNet-18", "resnet50": "ResNet-50", "transformer": "BERT-base encoder",
          "transformer_small": "small encoder"}
BLOCK = 3                 # configurations between two plain PyTorch reference steps
RHO_LIMIT = 2.0           # target (2): least memory with a time ratio at most this
PEAK_TOLERANCE = 1.05     # target (3): measured / simulated peak of our executor
MEMORY_TARGET = 0.5       # target (2): optimal's least memory / checkpoint_sequential's

StepFn = Callable[[], None]
CLOCKS = ("wall_s", "cpu_s")  # fields of Timing


# --- configurations --------------------------------------------------------------------------

@dataclass
class Config:
    """One schedule of one strategy; measured once, reported at every budget that selects it."""

    strategy: str
    schedule: Schedule
    run: StepFn = field(repr=False)
    predicted: Stats
    peaks: Peaks | None = None
    times: list[Timing] = field(default_factory=list)
    ratios: dict[str, list[float]] = field(default_factory=lambda: {clock: [] for clock in CLOCKS})

    @property
    def params(self) -> dict[str, object]:
        return self.schedule.params


def torch_sequential_schedule(chain: Chain, segments: int) -> Schedule:
    """The schedule of ``checkpoint_sequential`` over the model stages, with the loss after it.

    The model's ``L = chain.length - 1`` stages are cut as torch cuts them; the loss stage
    runs with the last, non-checkpointed segment. (``uniform(chain, s)`` would cut all
    ``L + 1`` stages, loss included, which is not what a user of torch's function runs.)
    """
    model_stages = chain.length - 1
    *checkpointed, (last_start, _) = segment_bounds(model_stages, segments)
    ops: list[Op] = []
    for start, end in checkpointed:
        ops += [Forward(start, Keep.INPUT), *(Forward(i, Keep.NONE) for i in range(start + 1, end))]
    ops += [Forward(i, Keep.ALL) for i in range(last_start, chain.length)]
    ops += [Backward(i) for i in reversed(range(last_start, chain.length))]
    for start, end in reversed(checkpointed):
        ops += [*(Forward(i, Keep.ALL) for i in range(start, end)), *(Backward(i) for i in reversed(range(start, end)))]
    return Schedule(tuple(ops), chain.length, strategy="checkpoint_sequential", params={"segments": segments})


def best_revolve(budget_bytes: int, candidates: Sequence[tuple[Schedule, Stats]]) -> Schedule | None:
    """The revolve slot count with the least simulated time (then peak) within the budget."""
    fitting = [(stats.time_s, stats.peak_bytes, schedule) for schedule, stats in candidates
               if stats.peak_bytes <= budget_bytes]
    return min(fitting, key=lambda item: item[:2])[2] if fitting else None


def activations_only(chain: Chain) -> Chain:
    """The chain without parameter gradients and optimizer state: planning on it minimises activations.

    A whole-step budget cannot go below the optimizer step (weights, momentum, all
    gradients), and activations early in the backward, when few gradients exist yet, hide
    under that floor: the least whole-step schedule is not the least-activation one. Target
    (2)'s activation comparison wants the latter, so the benchmark also runs the schedule
    ``plan(activations_only(chain), recompute=2)`` (on the real model; only its planning
    ignores the gradients).
    """
    return replace(chain, stages=tuple(replace(stage, grad_bytes=0) for stage in chain.stages),
                   optimizer_state_bytes=0, optimizer_workspace_bytes=0)


def even_budgets(low_bytes: int, high_bytes: int, count: int) -> list[int]:
    """``count`` budgets from ``low_bytes`` to ``high_bytes`` inclusive, increasing."""
    if count == 1:
        return [high_bytes]
    return [low_bytes + (high_bytes - low_bytes) * k // (count - 1) for k in range(count)]


# --- measuring -------------------------------------------------------------------------------

class Bench:
    """A model, its batch, its optimizer, and the step functions of every strategy."""

    def __init__(self, name: str, batch: int, size: int) -> None:
        spec = get_model_spec(name)
        torch.manual_seed(0)
        self.name, self.batch, self.size = name, batch, size
        self.model = spec.build()
        self.model.train()
        self.x, self.y = spec.example_input(batch, size), spec.example_target(batch)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # lr=0: every configuration runs on identical weights (see NOTE [ What one measured step is ]).
        self.opt = make_optimizer("sgd", self.params, lr=0.0)
        self.sequential = nn.Sequential(*stages_of(self.model))

    def plain(self) -> None:
        nn.functional.cross_entropy(self.model(self.x), self.y).backward()

    def checkpointed(self, segments: int) -> StepFn:
        def run() -> None:
            out = checkpoint_sequential(self.sequential, segments, self.x, use_reentrant=False)
            nn.functional.cross_entropy(out, self.y).backward()
        return run

    def executed(self, schedule: Schedule, chain: Chain) -> StepFn:
        executor = Executor(training_stages(self.model), schedule, chain)

        def run() -> None:
            executor.step(self.x, self.y)
        return run

    def _zero(self) -> None:
        for p in self.params:
            p.grad = None

    def timed_step(self, run: StepFn) -> Timing:
        """Wall and CPU seconds of forward + loss + backward, and wall seconds of the optimizer step."""
        self._zero()
        gc.collect()
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        middle, middle_cpu = time.perf_counter(), time.process_time()
        self.opt.step()
        end = time.perf_counter()
        return Timing(middle - start, middle_cpu - start_cpu, end - middle)

    def tracked_step(self, run: StepFn) -> Peaks:
        """Live bytes of one whole step: its peak, its floor and its activation peak (see :class:`Peaks`)."""
        self._zero()
        gc.collect()
        with ActivationTracker(self.params) as tracker:
            tracker.register_training_state(self.model, self.opt, self.x, self.y)
            tracker.resident_bytes = tracker.current_bytes
            run()
            self.opt.step()
        tracker.close()
        floor = tracker.resident_bytes + storage_bytes(p.grad for p in self.params if p.grad is not None)
        self._zero()
        return Peaks(tracker.peak_bytes, floor, tracker.activation_peak_bytes)


@dataclass(frozen=True)
class Peaks:
    """What one tracked step held.

    ``floor_bytes`` is what every schedule holds at the optimizer step: weights, buffers,
    momentum, the batch and all parameter gradients; ``peak_bytes - floor_bytes`` is what the
    schedule adds above it. ``activation_bytes`` is the peak over the step of live bytes minus
    the resident state and minus the gradients that exist *at that moment*: activations,
    activation gradients and transients, the quantity checkpointing papers call activation memory.
    """

    peak_bytes: int
    floor_bytes: int
    activation_bytes: int


class ActivationTracker(LiveBytesTracker):
    """A :class:`LiveBytesTracker` that also follows parameter gradients as they appear.

    A post-accumulate-grad hook on every parameter counts its ``.grad`` once it exists
    (gradients start at ``None``), so ``current_bytes - resident_bytes - grad_bytes`` after each
    op is the live non-resident, non-gradient memory; its maximum is ``activation_peak_bytes``.
    A gradient counts as an activation between the op that makes it and its accumulation.
    """

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        super().__init__()
        self.resident_bytes = 0
        self.grad_bytes = 0
        self.activation_peak_bytes = 0
        self._grad_keys: set[int] = set()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def _on_grad(self, param: torch.Tensor) -> None:
        assert param.grad is not None
        key = storage_key(param.grad)
        if key not in self._grad_keys:
            self._grad_keys.add(key)
            self.grad_bytes += param.grad.untyped_storage().nbytes()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.activation_peak_bytes = max(self.activation_peak_bytes,
                                         self.current_bytes - self.resident_bytes - self.grad_bytes)
        return out


class Timing(NamedTuple):
    """One timed step: ``wall_s`` and ``cpu_s`` (process time) of forward + loss + backward."""

    wall_s: float
    cpu_s: float
    opt_s: float


def measure(bench: Bench, configs: list[Config], reps: int) -> tuple[int, list[Timing]]:
    """Peaks (one tracked step each), then ``reps`` timed rounds.

    Returns the measured floor (see :meth:`Bench.tracked_step`) and the plain PyTorch
    reference steps.
    """
    bench.timed_step(bench.plain)  # creates the momentum buffers: every tracked step is steady-state
    floors = set()
    for index, config in enumerate(configs):
        config.peaks = bench.tracked_step(config.run)
        floors.add(config.peaks.floor_bytes)
        log.info("%s: peak %d/%d %s %s: %.1f MiB (simulated %.1f MiB), activations %.1f MiB", bench.name, index + 1,
                 len(configs), config.strategy, config.params, config.peaks.peak_bytes / MiB,
                 config.predicted.peak_bytes / MiB, config.peaks.activation_bytes / MiB)
    if len(floors) != 1:
        log.warning("%s: the floor differs between configurations: %s", bench.name, sorted(floors))
    gc.freeze()  # the model, chain and executors stay: keep them out of the collections before each step
    plain_times: list[Timing] = []
    for round_index in range(reps):  # the tracked steps above warmed every configuration up
        shift = (round_index * (BLOCK + 1)) % len(configs)
        order = configs[shift:] + configs[:shift]
        if round_index % 2:
            order.reverse()
        before = bench.timed_step(bench.plain)
        plain_times.append(before)
        for start in range(0, len(order), BLOCK):
            block = order[start:start + BLOCK]
            results = [bench.timed_step(config.run) for config in block]
            after = bench.timed_step(bench.plain)
            plain_times.append(after)
            for config, timing in zip(block, results, strict=True):
                config.times.append(timing)
                for clock in CLOCKS:
                    reference = (getattr(before, clock) + getattr(after, clock)) / 2
                    config.ratios[clock].append(getattr(timing, clock) / reference)
            before = after
        log.info("%s: timing round %d/%d done (plain median so far %.3f s wall, %.3f s CPU)", bench.name,
                 round_index + 1, reps, statistics.median(t.wall_s for t in plain_times),
                 statistics.median(t.cpu_s for t in plain_times))
    gc.unfreeze()
    return max(floors), plain_times


# --- one model -------------------------------------------------------------------------------

def _stats_dict(stats: Stats) -> dict[str, object]:
    return {"predicted_peak_bytes": stats.peak_bytes, "predicted_time_s": stats.time_s,
            "predicted_rho": stats.recompute_factor, "predicted_forward_advances": stats.forward_advances}


def _point(config: Config | None, strategy: str, params: dict[str, object], budget: int | None, floor: int,
           plain: Timing) -> dict[str, object]:
    if config is None:
        return {"strategy": strategy, "params": params, "budget_bytes": budget, "feasible": False}
    time_s = statistics.median(t.wall_s for t in config.times)
    cpu_s = statistics.median(t.cpu_s for t in config.times)
    assert config.peaks is not None
    peak = config.peaks.peak_bytes
    return {
        "strategy": strategy, "params": params, "budget_bytes": budget, "feasible": True,
        **_stats_dict(config.predicted),
        "measured_peak_bytes": peak, "measured_above_floor_bytes": peak - floor,
        "predicted_above_floor_bytes": config.predicted.peak_bytes - floor,
        "measured_activation_bytes": config.peaks.activation_bytes,
        "peak_ratio": peak / config.predicted.peak_bytes,
        "measured_time_s": time_s, "time_ratio": statistics.median(config.ratios["wall_s"]),
        "time_ratio_of_medians": time_s / plain.wall_s,
        "measured_cpu_time_s": cpu_s, "cpu_time_ratio": statistics.median(config.ratios["cpu_s"]),
        "opt_time_s": statistics.median(t.opt_s for t in config.times),
        "times_s": [t.wall_s for t in config.times], "cpu_times_s": [t.cpu_s for t in config.times],
        "time_ratios": config.ratios["wall_s"], "cpu_time_ratios": config.ratios["cpu_s"],
        "time_ratio_spread": spread(config.ratios["wall_s"]).to_dict(),
        "cpu_time_ratio_spread": spread(config.ratios["cpu_s"]).to_dict(),
        "measured_time_spread": spread([t.wall_s for t in config.times]).to_dict(),
    }


def bench_model(name: str, batch: int, size: int, reps: int, n_budgets: int, slots: int) -> dict[str, object]:
    """Profile, plan, measure and summarise one model; returns its JSON record."""
    bench = Bench(name, batch, size)
    started = time.perf_counter()
    log.info("%s (batch %d, size %d): profiling with measured times", name, batch, size)
    chain = profile(bench.model, bench.x, bench.y, measure_time=True,
                    progress=lambda i, n: log.debug("%s: profiled stage %d/%d", name, i, n))
    everything = simulate(chain, keep_all(chain.length))
    table: OptimalTable = solve(chain, everything.peak_bytes, slots=slots)
    budgets = even_budgets(table.min_memory_bytes, everything.peak_bytes, n_budgets)
    # Where keep-all fits, it is the optimum; the table's rounding (up to one unit per stage)
    # can miss it at the top budget, so, as plan() does, it is taken directly there.
    everything_schedule = Schedule(keep_all(chain.length).ops, chain.length, strategy="optimal",
                                   params={"recompute": False})
    log.info("%s: %d stages, budgets %.1f .. %.1f MiB", name, chain.length, budgets[0] / MiB, budgets[-1] / MiB)

    configs: dict[tuple[str, tuple[Op, ...]], Config] = {}

    def add(strategy: str, schedule: Schedule, run_factory: Callable[[], StepFn]) -> Config:
        """The configuration running ``schedule`` with ``strategy``'s code; one per distinct schedule."""
        key = (strategy, schedule.ops)
        if key not in configs:
            configs[key] = Config(strategy, schedule, run_factory(), simulate(chain, schedule))
        return configs[key]

    plain_config = add("pytorch", keep_all(chain.length), lambda: bench.plain)
    sequential = [add("checkpoint_sequential", torch_sequential_schedule(chain, s),
                      lambda s=s: bench.checkpointed(s)) for s in range(1, chain.length)]  # type: ignore[misc]
    revolve_schedules = [revolve(chain, k) for k in range(1, max(chain.length - 1, 1) + 1)]
    revolve_candidates = [(schedule, simulate(chain, schedule)) for schedule in revolve_schedules]
    revolve_points: list[tuple[int, Config | None]] = []
    optimal_points: list[tuple[int, Config]] = []
    for budget in budgets:
        chosen = best_revolve(budget, revolve_candidates)
        revolve_points.append((budget, None if chosen is None else add(
            "revolve", chosen, lambda c=chosen: bench.executed(c, chain))))  # type: ignore[misc]
        schedule = everything_schedule if everything.peak_bytes <= budget else table.schedule(budget)
        optimal_points.append((budget, add("optimal", schedule,
                                           lambda c=schedule: bench.executed(c, chain))))  # type: ignore[misc]
    rho_plan = plan(chain, recompute=RHO_LIMIT, strategy="optimal", slots=slots)
    rho_point = add("optimal", rho_plan.schedule, lambda: bench.executed(rho_plan.schedule, chain))
    act_plan = plan(activations_only(chain), recompute=RHO_LIMIT, strategy="optimal", slots=slots)
    act_point = add("optimal", act_plan.schedule, lambda: bench.executed(act_plan.schedule, chain))
    log.info("%s: %d distinct configurations", name, len(configs))

    floor, plain_times = measure(bench, list(configs.values()), reps)
    plain = Timing(*(statistics.median(getattr(t, f) for t in plain_times) for f in Timing._fields))
    points = [_point(plain_config, "pytorch", {}, None, floor, plain)]
    points += [_point(c, "checkpoint_sequential", dict(c.params), None, floor, plain) for c in sequential]
    points += [_point(c, "revolve", {} if c is None else dict(c.params), b, floor, plain)
               for b, c in revolve_points]
    points += [_point(c, "optimal", {"slots": slots, "budget_bytes": b, "keep_all": c.params.get("recompute") is False},
                      b, floor, plain) for b, c in optimal_points]
    points.append(_point(rho_point, "optimal", {"slots": slots, "recompute_limit": RHO_LIMIT},
                         rho_point.predicted.peak_bytes, floor, plain))
    points.append(_point(act_point, "optimal", {"slots": slots, "recompute_limit": RHO_LIMIT,
                                                "objective": "activations"},
                         act_point.predicted.peak_bytes, floor, plain))
    record: dict[str, object] = {
        "model": name, "batch": batch, "size": size, "stages": chain.length,
        "chain": {"weights_bytes": chain.weights_bytes, "gradients_bytes": chain.gradients_bytes,
                  "optimizer_state_bytes": chain.optimizer_state_bytes, "input_bytes": chain.input_bytes,
                  "resident_bytes": chain.resident_bytes, "compute_time_s": chain.compute_time_s,
                  "step_floor_bytes": table.step_bytes},
        "measured_floor_bytes": floor, "budgets_bytes": budgets, "optimal_unit_bytes": table.unit_bytes,
        "plain_time_s": plain.wall_s, "plain_cpu_time_s": plain.cpu_s, "plain_opt_time_s": plain.opt_s,
        "plain_times_s": [t.wall_s for t in plain_times], "plain_cpu_times_s": [t.cpu_s for t in plain_times],
        "plain_time_spread": spread([t.wall_s for t in plain_times]).to_dict(),
        "plain_cpu_time_spread": spread([t.cpu_s for t in plain_times]).to_dict(),
        "points": points, "wall_s": None,
    }
    record["targets"] = evaluate(record)
    record["wall_s"] = time.perf_counter() - started
    return record


# --- targets ---------------------------------------------------------------------------------

RATIO_KEYS = {"wall": "time_ratio", "cpu": "cpu_time_ratio"}


def evaluate(record: dict[str, Any]) -> dict[str, object]:
    """The three targets, from the measured points (evaluated, never asserted): (1) optimal's time against
    the fastest fitting ``checkpoint_sequential``, (2) least memory within a time ratio of 2, (3) our executor's
    measured peak against the simulated one.

    Targets (1) and (2) depend on times: they are evaluated on wall-clock ratios (what the
    targets ask for) and on CPU-time ratios (immune to the process being descheduled).
    """
    points = [p for p in record["points"] if p["feasible"]]
    ours = [p for p in points if p["strategy"] in ("optimal", "revolve")]
    ratios = [p["peak_ratio"] for p in ours]
    target3 = {"worst_ratio": max(ratios, default=None), "best_ratio": min(ratios, default=None),
               "points": len(ratios), "pass": all(r <= PEAK_TOLERANCE for r in ratios),
               "violations": [{"strategy": p["strategy"], "params": p["params"], "ratio": p["peak_ratio"]}
                              for p in ours if p["peak_ratio"] > PEAK_TOLERANCE]}
    return {"1_optimal_time_vs_sequential": {clock: _target1(points, key) for clock, key in RATIO_KEYS.items()},
            "2_memory_at_rho_2": {clock: _target2(points, key) for clock, key in RATIO_KEYS.items()},
            "3_peak_vs_simulated": target3}


def _target1(points: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """(1) optimal's time against the fastest checkpoint_sequential whose *measured* peak fits the budget."""
    sequential = [p for p in points if p["strategy"] == "checkpoint_sequential"]
    # Two configurations run exactly the plain step: how far their ratios stray from 1 is the noise.
    noise = max(abs(p[key] - 1.0) for p in points if p["strategy"] == "pytorch" or p["params"] == {"segments": 1})
    per_budget = []
    for p in points:
        if p["strategy"] != "optimal" or "recompute_limit" in p["params"]:
            continue
        fitting = [q for q in sequential if q["measured_peak_bytes"] <= p["budget_bytes"]]
        best = min(fitting, key=lambda q: q[key], default=None)
        per_budget.append({
            "budget_bytes": p["budget_bytes"], "keep_all": bool(p["params"].get("keep_all")),
            "optimal_time_ratio": p[key],
            "optimal_measured_peak_bytes": p["measured_peak_bytes"],
            "best_sequential_segments": None if best is None else best["params"]["segments"],
            "best_sequential_time_ratio": None if best is None else best[key],
            "optimal_over_sequential": None if best is None else p[key] / best[key],
        })
    compared = [b["optimal_over_sequential"] for b in per_budget if b["optimal_over_sequential"] is not None]
    return {"per_budget": per_budget, "worst_ratio": max(compared, default=None), "noise": noise,
            "pass": all(r <= 1.0 for r in compared), "pass_within_noise": all(r <= 1.0 + noise for r in compared),
            "budgets_without_sequential": sum(b["optimal_over_sequential"] is None for b in per_budget)}


def _target2(points: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """(2) least memory within a time ratio of 2, by three measures of memory (see :class:`Peaks`)."""
    def least(strategy: str, measure: str) -> dict[str, Any] | None:
        within = [p for p in points if p["strategy"] == strategy and p[key] <= RHO_LIMIT]
        return min(within, key=lambda p: (p[measure], p[key]), default=None)

    target: dict[str, Any] = {"rho_limit": RHO_LIMIT, "target": MEMORY_TARGET}
    for label, measure in (("peak", "measured_peak_bytes"), ("activation", "measured_activation_bytes"),
                           ("above_floor", "measured_above_floor_bytes")):
        ours, theirs = least("optimal", measure), least("checkpoint_sequential", measure)
        if ours is None or theirs is None:
            target[label] = None
            continue
        ratio = ours[measure] / max(theirs[measure], 1)
        target[label] = {"optimal_bytes": ours[measure], "optimal_params": ours["params"],
                         "optimal_time_ratio": ours[key], "sequential_bytes": theirs[measure],
                         "sequential_segments": theirs["params"]["segments"], "sequential_time_ratio": theirs[key],
                         "ratio": ratio, "pass": ratio <= MEMORY_TARGET}
    return target


def _iqr_over_median(record: dict[str, Any], clock: str) -> str:
    """How noisy a model's repeated plain reference steps were: their IQR over their median."""
    item = Spread.from_dict(record["plain_time_spread" if clock == "wall" else "plain_cpu_time_spread"])
    return f"{item.iqr / item.median:.3f}" if item.median else "-"


def summary(record: dict[str, Any]) -> str:
    """Human-readable verdicts of one model."""
    targets = record["targets"]
    verdict = {True: "PASS", False: "FAIL"}
    lines = [f"== {record['model']} (batch {record['batch']}, size {record['size']}, {record['stages']} stages): "
             f"plain step {record['plain_time_s']:.3f} s wall (IQR/median {_iqr_over_median(record, 'wall')}), "
             f"{record['plain_cpu_time_s']:.3f} s CPU (IQR/median {_iqr_over_median(record, 'cpu')})"]
    for clock in RATIO_KEYS:
        t1 = targets["1_optimal_time_vs_sequential"][clock]
        worst = t1["worst_ratio"]
        if worst is None:
            lines.append(f"(1, {clock}) no budget where a checkpoint_sequential fits")
        else:
            noisy = ("PASS" if t1["pass"] else f"PASS within noise {t1['noise']:.3f}" if t1["pass_within_noise"]
                     else f"FAIL, noise {t1['noise']:.3f}")
            lines.append(f"(1, {clock}) optimal time / fastest fitting checkpoint_sequential: worst {worst:.3f} "
                         f"[{noisy}] over {len(t1['per_budget']) - t1['budgets_without_sequential']} budgets "
                         f"({t1['budgets_without_sequential']} where no checkpoint_sequential fits)")
        for b in t1["per_budget"]:
            theirs = ("none fits" if b["best_sequential_segments"] is None else
                      f"seq({b['best_sequential_segments']}) x{b['best_sequential_time_ratio']:.3f} "
                      f"-> {b['optimal_over_sequential']:.3f}")
            lines.append(f"    budget {b['budget_bytes'] / MiB:8.1f} MiB: optimal x{b['optimal_time_ratio']:.3f} "
                         f"(peak {b['optimal_measured_peak_bytes'] / MiB:.1f} MiB) vs {theirs}")
    names = {"peak": "whole peak", "activation": "activation peak", "above_floor": "peak above the floor"}
    for clock in RATIO_KEYS:
        t2 = targets["2_memory_at_rho_2"][clock]
        for label, name in names.items():
            item = t2[label]
            if item is None:
                lines.append(f"(2, {clock}) {name}: no configuration of one of the two within ratio {RHO_LIMIT}")
                continue
            which = ("optimal[activation objective]" if "objective" in item["optimal_params"] else
                     "optimal[rho <= 2]" if "recompute_limit" in item["optimal_params"] else
                     f"optimal[budget {item['optimal_params']['budget_bytes'] / MiB:.1f} MiB]")
            lines.append(f"(2, {clock}) least {name} at time ratio <= {RHO_LIMIT}: {which} "
                         f"{item['optimal_bytes'] / MiB:.1f} MiB (x{item['optimal_time_ratio']:.2f}) vs "
                         f"checkpoint_sequential({item['sequential_segments']}) {item['sequential_bytes'] / MiB:.1f} "
                         f"MiB (x{item['sequential_time_ratio']:.2f}): {item['ratio']:.3f} "
                         f"[{verdict[item['pass']]}] (target <= {MEMORY_TARGET})")
    t3 = targets["3_peak_vs_simulated"]
    lines.append(f"(3) measured / simulated peak of our executor: {t3['best_ratio']:.4f} .. {t3['worst_ratio']:.4f} "
                 f"over {t3['points']} points [{verdict[t3['pass']]}] (target <= {PEAK_TOLERANCE})")
    return "\n".join(lines)


# --- markdown ----------------------------------------------------------------------------

def tables(records: Sequence[dict[str, Any]]) -> str:
    """One Markdown table per model: every point, as in the JSON (sizes in MiB)."""
    out = []
    for record in records:
        out.append(f"### {record['model']} (batch {record['batch']}, size {record['size']}, "
                   f"{record['stages']} stages)\n")
        out.append(f"Plain step {record['plain_time_s']:.3f} s wall, {record['plain_cpu_time_s']:.3f} s CPU "
                   f"(medians of {len(record['plain_times_s'])} reference steps, IQR/median "
                   f"{_iqr_over_median(record, 'wall')} wall, "
                   f"{_iqr_over_median(record, 'cpu')} CPU); floor (weights, buffers, momentum, batch, all "
                   f"gradients) {record['measured_floor_bytes'] / MiB:.1f} MiB measured, "
                   f"{record['chain']['step_floor_bytes'] / MiB:.1f} MiB simulated.\n")
        out.append("| strategy | params | budget | simulated peak | measured peak | measured / simulated | "
                   "above floor | activation peak | simulated ρ | wall time ratio (IQR) | wall ratio CoV | "
                   "CPU time ratio | CPU ratio CoV | median wall (s) | wall CoV |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for p in record["points"]:
            hidden = ("slots", "budget_bytes") if p["strategy"] == "optimal" else ()
            params = ", ".join(f"{k}={v}" for k, v in p["params"].items() if k not in hidden and v is not False) or "-"
            budget = "-" if p["budget_bytes"] is None else f"{p['budget_bytes'] / MiB:.1f}"
            if not p["feasible"]:
                out.append(f"| {p['strategy']} | - | {budget} | infeasible | | | | | | | | | | | |")
                continue
            out.append(f"| {p['strategy']} | {params} | {budget} | {p['predicted_peak_bytes'] / MiB:.1f} | "
                       f"{p['measured_peak_bytes'] / MiB:.1f} | {p['peak_ratio']:.3f} | "
                       f"{p['measured_above_floor_bytes'] / MiB:.1f} | {p['measured_activation_bytes'] / MiB:.1f} | "
                       f"{p['predicted_rho']:.3f} | "
                       f"{p['time_ratio']:.3f}{_quartiles(p, 'time_ratio_spread')} | {_cov(p, 'time_ratio_spread')} | "
                       f"{p['cpu_time_ratio']:.3f} | {_cov(p, 'cpu_time_ratio_spread')} | "
                       f"{p['measured_time_s']:.3f} | {_cov(p, 'measured_time_spread')} |")
        out.append("")
    return "\n".join(out)


def _quartiles(point: dict[str, Any], key: str) -> str:
    """' (q1-q3)' of a point's per-round spread; empty for runs saved without spreads."""
    item = point.get(key)
    return "" if item is None or item["n"] < 2 else f" ({item['q1']:.3f}-{item['q3']:.3f})"


def _cov(point: dict[str, Any], key: str) -> str:
    """A point's per-round CoV in %; '-' for one round or runs saved without spreads."""
    item = point.get(key)
    return "-" if item is None else Spread.from_dict(item).cov_text


# --- the runner's interface ---------------------------------------------------------------------

def run(quick: bool) -> dict[str, Any]:
    """Every case of the full or quick list, measured one after the other, on ``THREADS`` torch threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        pinned = keep_freed_memory()
        reps, n_budgets = (QUICK_REPS, QUICK_BUDGETS) if quick else (REPS, BUDGETS)
        models = [bench_model(name, batch, size, reps, n_budgets, SLOTS)
                  for name, batch, size in (QUICK_CASES if quick else FULL_CASES)]
    finally:
        torch.set_num_threads(threads)
    return {"reps": reps, "budgets": n_budgets, "slots": SLOTS, "block": BLOCK, "threads": THREADS,
            "malloc_keeps_freed_memory": pinned, "models": models}


def _label(record: dict[str, Any]) -> str:
    return f"{LABELS.get(record['model'], record['model'])} (b{record['batch']} x {record['size']})"


def _below_keep_all(record: dict[str, Any], clock: str = "cpu") -> list[float]:
    """Target (1)'s ratios at the budgets below keep-all where some ``checkpoint_sequential`` fits."""
    return [b["optimal_over_sequential"] for b in record["targets"]["1_optimal_time_vs_sequential"][clock]["per_budget"]
            if not b["keep_all"] and b["optimal_over_sequential"] is not None]


def _range(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}-{high}"


def _mib(n: float) -> str:
    return f"{n / MiB:.1f}"


def _summary_table(records: Sequence[dict[str, Any]]) -> str:
    """The figures of the three targets, one column per model (CPU-time ratios)."""
    rows: dict[str, list[str]] = {}
    for record in records:
        points = [p for p in record["points"] if p["feasible"]]
        plain = next(p for p in points if p["strategy"] == "pytorch")
        t1 = record["targets"]["1_optimal_time_vs_sequential"]["cpu"]
        t2 = record["targets"]["2_memory_at_rho_2"]["cpu"]
        t3 = record["targets"]["3_peak_vs_simulated"]
        budgets = record["budgets_bytes"]
        per_budget = [b for b in t1["per_budget"] if not b["keep_all"]]
        missing = sum(b["optimal_over_sequential"] is None for b in per_budget)
        ratios = " ".join(f"{b['optimal_over_sequential']:.3f}" for b in per_budget
                          if b["optimal_over_sequential"] is not None)
        at_keep_all = [b for b in t1["per_budget"] if b["keep_all"]]
        cells = {
            "plain step, CPU s (IQR/median)": f"{record['plain_cpu_time_s']:.3f} ({_iqr_over_median(record, 'cpu')})",
            "noise, CPU": f"{t1['noise']:.3f}",
            "plain peak, MiB (simulated)":
                f"{_mib(plain['measured_peak_bytes'])} ({_mib(plain['predicted_peak_bytes'])})",
            "floor (weights, momentum, all gradients, batch), MiB": _mib(record["measured_floor_bytes"]),
            "budgets, MiB": f"{_mib(budgets[0])} .. {_mib(budgets[-1])} ({len(budgets)})",
            "(1) optimal / fastest fitting checkpoint_sequential, CPU, per budget below keep-all":
                (f"(none fits x{missing}) " if missing else "") + ratios,
            "(1) the same at keep-all": " ".join(f"{b['optimal_over_sequential']:.3f}" for b in at_keep_all
                                                 if b["optimal_over_sequential"] is not None) or "-",
        }
        for label, name in (("peak", "whole peak"), ("activation", "activation peak"),
                            ("above_floor", "peak above the floor")):
            item = t2[label]
            cells[f"(2) least {name} at ρ ≤ {RHO_LIMIT:g}: optimal vs checkpoint_sequential, MiB"] = (
                "-" if item is None else
                f"{_mib(item['optimal_bytes'])} vs {_mib(item['sequential_bytes'])} ({item['ratio']:.3f})")
        cells["(3) measured / simulated peak, our executor"] = f"{t3['best_ratio']:.4f} .. {t3['worst_ratio']:.4f}"
        for key, value in cells.items():
            rows.setdefault(key, []).append(value)
    header = "| | " + " | ".join(_label(r) for r in records) + " |"
    lines = [header, "|---|" + "---:|" * len(records)]
    lines += [f"| {key} | " + " | ".join(values) + " |" for key, values in rows.items()]
    return "\n".join(lines)


def _verdicts(records: Sequence[dict[str, Any]]) -> str:
    """The three targets' verdicts, each with the figures it rests on."""
    t1_lines, below_torch = [], []
    for record in records:
        ratios = _below_keep_all(record)
        t1 = record["targets"]["1_optimal_time_vs_sequential"]["cpu"]
        verdict = "holds" if all(r <= 1.0 for r in ratios) else (
            f"holds within the run's noise ({t1['noise']:.3f})" if all(r <= 1.0 + t1["noise"] for r in ratios)
            else "fails")
        t1_lines.append(f"{_label(record)}: {_range(ratios)}x, {verdict}" if ratios else
                        f"{_label(record)}: no budget below keep-all where a segmentation fits")
        points = [p for p in record["points"] if p["feasible"]]
        least_ours = min(p["measured_peak_bytes"] for p in points if p["strategy"] == "optimal")
        least_torch = min(p["measured_peak_bytes"] for p in points if p["strategy"] == "checkpoint_sequential")
        if _mib(least_ours) != _mib(least_torch) and least_ours < least_torch:
            below_torch.append(f"{_label(record)} down to {_mib(least_ours)} MiB (torch's least: {_mib(least_torch)})")
    t2_lines = []
    for record in records:
        t2 = record["targets"]["2_memory_at_rho_2"]["cpu"]
        parts = [f"{name} {t2[label]['ratio']:.3f}" for label, name in
                 (("peak", "whole peak"), ("activation", "activation peak"), ("above_floor", "above the floor"))
                 if t2[label] is not None]
        floor_share = record["measured_floor_bytes"] / max(t2["peak"]["sequential_bytes"], 1) if t2["peak"] else None
        t2_lines.append(f"{_label(record)}: {', '.join(parts) or 'not measured'}"
                        + ("" if floor_share is None else f" (the floor alone is {floor_share:.1%} of torch's least "
                                                          "whole peak)"))
    t2_pass = all(r["targets"]["2_memory_at_rho_2"]["cpu"]["activation"] is not None
                  and r["targets"]["2_memory_at_rho_2"]["cpu"]["activation"]["pass"] for r in records)
    t3 = [r["targets"]["3_peak_vs_simulated"] for r in records]
    t3_points = sum(t["points"] for t in t3)
    t3_range = f"{min(t['best_ratio'] for t in t3):.4f}-{max(t['worst_ratio'] for t in t3):.4f}"
    return "\n".join([
        "1. **`optimal`'s CPU time ≤ the fastest `checkpoint_sequential` whose measured peak fits**, at the budgets "
        "below keep-all where a segmentation fits (ratio of the two time ratios, each against plain PyTorch in the "
        "same round): " + "; ".join(t1_lines) + "."
        + (" Below `checkpoint_sequential`'s least peak no segmentation fits, and `optimal` trains: "
           + "; ".join(below_torch) + "." if below_torch else ""),
        f"2. **`optimal`'s least memory at ρ ≤ {RHO_LIMIT:g} is ≤ {MEMORY_TARGET}x `checkpoint_sequential`'s** "
        f"{'holds' if t2_pass else 'does not hold on every model'}: " + "; ".join(t2_lines) + ". Whole-step memory "
        "cannot halve where weights, momentum and gradients (the floor) are most of torch's least peak.",
        f"3. **The executor's measured peak ≤ simulated x {PEAK_TOLERANCE}** "
        f"{'holds' if all(t['pass'] for t in t3) else 'fails'}: {t3_range} over {t3_points} revolve and optimal "
        "points.",
    ])


def render(result: dict[str, Any]) -> str:
    """What is measured, the targets' figures per model, their verdicts, the caveats, then every point."""
    records = result["models"]
    cases = "; ".join(f"{LABELS.get(r['model'], r['model'])} at batch {r['batch']}, size {r['size']} ({r['stages']} "
                      "stages with the loss)" for r in records)
    intro = f"""\
edgetrain's schedules and PyTorch's `torch.utils.checkpoint.checkpoint_sequential` run for real on the same models and
budgets, and their measured step time and peak memory are compared. Three questions: is `optimal` faster than torch's
function wherever both fit (target 1), does it need at most half the memory at ρ ≤ {RHO_LIMIT:g} (target 2), and does
the executor's measured peak stay within {PEAK_TOLERANCE - 1:.0%} of the simulated one (target 3)? For how to plan, see
[Plan a step](../guide/plan.md).

## What is measured

{cases}. The chain is profiled on the real model with measured stage times. Budgets: {result['budgets']}, evenly
spaced from the optimal table's least feasible peak ({result['slots']} slots) to keep-all's simulated peak.
Configurations, each run for real:

* `pytorch`: `cross_entropy(model(x), y).backward()`;
* `checkpoint_sequential`: torch's function with `s = 1..L` segments (`use_reentrant=False`), then the loss and
  backward;
* `revolve`: per budget, the slot count with the least simulated time whose simulated peak fits, run by the `Executor`;
* `optimal`: one table, `table.schedule(budget)` per budget (keep-all where it fits, as `plan()` does), run by the
  `Executor`; plus `plan(chain, recompute={RHO_LIMIT:g})` and the same on the chain without gradients and optimizer
  state (`objective=activations`).

Every step is `zero_grad(set_to_none)`, forward, loss, backward, then an SGD-momentum step with `lr=0` (identical
weights for every configuration). **The optimizer step is in every measured step**, so measured peaks compare with the
simulator's, which counts it; step *time* is forward, loss and backward (the simulator's ρ).

* **Peak**: live tensor bytes of one steady-state step, in a run apart from the timing: the *measured peak* (what a
  device must hold); *above floor*, the peak minus weights, buffers, momentum, batch and **all** gradients, which every
  schedule holds at the optimizer step; the *activation peak*, live bytes less the resident state and the gradients that
  exist at that moment.
* **Time**: {result['reps']} rounds; in each, every configuration runs once, in blocks of {result['block']} bracketed by
  plain steps; its ratio is its time over the mean of the two plain steps around its block; the reported ratio is the
  median over rounds, with quartiles and CoV. Baseline and subject thus run in the same round, so load drifting between
  rounds cancels in the ratio. Wall-clock and process CPU time are both recorded; the verdicts on time are in CPU time,
  which does not count the time the process was descheduled. *Noise* is the largest distance from 1 of the two
  configurations that run exactly the plain step (`pytorch`, `checkpoint_sequential(1)`).
* **Predicted**: the simulator's peak, time and ρ of every configuration, torch's function as the same segmentation.

{result['threads']} torch thread(s); glibc's malloc keeps freed memory: {result['malloc_keeps_freed_memory']}.

## Results

"""
    caveats = """\
## Caveats

* **Shared, noisy CPU.** Absolute times are single-threaded; ratios are what matter, and under load the wall-clock
  ratios are noise (their CoV is in the tables).
* **The allocator.** glibc is told to keep freed memory (`mallopt`), else a step after a smaller-footprint step
  page-faults its memory back (up to 35% of a BERT-base step).
* **Stage times are measured in isolation**, while recomputation runs under `no_grad` and a whole step has other cache
  behaviour: measured and simulated ρ differ by a few percent.
* **Stage granularity limits the least memory.** The ResNet stem is four stages (conv1 | bn1 | relu | max-pool), so a
  schedule may drop bn1's input while relu back-propagates and recompute it from the batch afterwards.
* **Whole-step budgets hide activations under gradients**, hence the separate `objective=activations` schedule for
  target (2).
* **Revolve** assumes uniform stages and counts slots, not bytes.
* **torch's checkpoint updates BatchNorm running statistics twice** for recomputed segments; edgetrain runs a
  recomputation's norm layers at momentum 0, so they are updated once. It changes neither time nor memory here.

## Tables

Sizes in MiB; ratios against plain PyTorch in the same round; the rows of `revolve` and `optimal` are one per budget
(several budgets can select the same schedule, measured once). Each ratio has its spread over the rounds: the
wall-clock ratio's quartiles (q1-q3) and CoV, the CPU-time ratio's CoV, and the CoV of the configuration's own wall
step times. Under each table, the targets on both clocks.
"""
    body = [intro + _summary_table(records), "## Verdicts", _verdicts(records), caveats]
    for record in records:
        body.append(tables([record]).rstrip())
        body.append(f"```text\n{summary(record)}\n```")
    return "\n\n".join(body)


def headline(result: dict[str, Any]) -> str:
    """The README's figure: target (1)'s CPU-time ratios per model, and the model where ``optimal``'s least whole peak
    at ρ <= 2 is furthest below torch's least."""
    records = result["models"]
    times = [f"{_range(_below_keep_all(r), '{:.2f}')}x ({LABELS.get(r['model'], r['model'])})" for r in records
             if _below_keep_all(r)]
    best = min(records, key=lambda r: r["targets"]["2_memory_at_rho_2"]["cpu"]["peak"]["ratio"])
    least = best["targets"]["2_memory_at_rho_2"]["cpu"]["peak"]
    return (f"step time {', '.join(times)}; trains {LABELS.get(best['model'], best['model'])} in "
            f"{_mib(least['optimal_bytes'])} MiB where torch's least is {_mib(least['sequential_bytes'])}")

"""The executor against plain autograd (values, gradients, BN statistics, RNG) and against the
simulator (live bytes), and the ``Checkpointed`` wrapper in a user training loop.

Exactness: on one CPU thread count, with the same RNG state, a stage computes the same
floats whether it runs once or is recomputed, and each stage's backward sees the same
gradient as in one whole-graph backward; so gradients agree to ``atol=1e-6`` in fp32 (they
agree bitwise in practice). Memory: the chain is profiled on the same model and batch, and a
whole step (zero_grad, scheduled forward/loss/backward, SGD step) is measured with the
optimizer state registered, so the measured peak is comparable with the simulator's whole
peak, optimizer step included.
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
from dataclasses import dataclass, replace

import pytest
import torch
from steps import StepPeaks, StepResult, measured_schedule_step, observe, peaks_track, plain_autograd_step
from torch import nn

from edgetrain.core.chain import Chain
from edgetrain.core.optim import make_optimizer
from edgetrain.core.schedule import Backward, Forward, Keep, Schedule, keep_all
from edgetrain.core.simulator import rng_replayed_stages, simulate
from edgetrain.errors import ScheduleError
from edgetrain.models import get_model_spec
from edgetrain.models.stages import training_stages
from edgetrain.planners import OptimalTable, revolve, solve, uniform
from edgetrain.profiling import LiveBytesTracker, profile
from edgetrain.runtime import Checkpointed, Executor, run_schedule

log = logging.getLogger(__name__)

# (batch, image side or sequence length): small enough for the whole file to run in seconds.
SIZES = {"resnet18": (4, 48), "resnet50": (2, 48), "mobilenet_v2": (4, 48), "transformer_small": (8, 32)}
# The memory sweep wants activations that are not dwarfed by the ResNets' weights and gradients.
MEMORY_SIZES = {**SIZES, "resnet18": (8, 96), "resnet50": (4, 80)}
MODELS = tuple(SIZES)
SEED = 1234


@dataclass
class Case:
    """A model in its initial state, a batch, its profiled chain and the optimal table up to keep-all."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    chain: Chain
    table: OptimalTable
    keep_all_peak_bytes: int

    def fresh_model(self) -> nn.Module:
        return copy.deepcopy(self.model)

    def budgets(self, count: int) -> list[int]:
        """``count`` budgets evenly spread from the least feasible to the table's top, decreasing.

        The top is 1% above keep-all's peak: on the grid each stage may lose a unit to
        rounding, so keep-all's exact peak can be a hair short of keep-all on the table.
        """
        low, high = self.table.min_memory_bytes, self.table.max_memory_bytes
        return [high - (high - low) * k // (count - 1) for k in range(count)]


@functools.cache
def case(name: str, batch: int | None = None, size: int | None = None) -> Case:
    spec = get_model_spec(name)
    if batch is None or size is None:
        batch, size = SIZES[name]
    torch.manual_seed(0)
    model = spec.build(num_classes=10)
    x, y = spec.example_input(batch, size), spec.example_target(batch, num_classes=10)
    chain = profile(model, x, y, measure_time=False)
    peak = simulate(chain, keep_all(chain.length)).peak_bytes
    # A fine grid: with these small batches the weights dwarf the activations being planned.
    return Case(model, x, y, chain, solve(chain, peak + peak // 100, slots=4000), peak)


@functools.cache
def plain_step(name: str) -> StepResult:
    c = case(name)
    return plain_autograd_step(c.fresh_model(), c.x, c.y, SEED)


def scheduled_step(name: str, schedule: Schedule) -> StepResult:
    c = case(name)
    model = c.fresh_model()
    torch.manual_seed(SEED)
    loss = run_schedule(training_stages(model), schedule, c.x, c.y, chain=c.chain)
    return observe(model, loss)


SCHEDULES = ["keep_all", "uniform2", "uniform3", "revolve1", "revolve2", "revolve3", "optimal_min", "optimal_mid",
             "optimal_high"]


def make_schedule(name: str, kind: str) -> Schedule:
    c = case(name)
    if kind == "keep_all":
        return keep_all(c.chain.length)
    if kind.startswith("uniform"):
        return uniform(c.chain, int(kind[-1]))
    if kind.startswith("revolve"):
        return revolve(c.chain, int(kind[-1]))
    low, mid, high = c.budgets(5)[4], c.budgets(5)[2], c.budgets(5)[1]
    return c.table.schedule({"optimal_min": low, "optimal_mid": mid, "optimal_high": high}[kind])


# --- exactness -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("name", MODELS)
def test_scheduled_step_equals_plain_autograd(name: str, kind: str) -> None:
    schedule = make_schedule(name, kind)
    expected, got = plain_step(name), scheduled_step(name, schedule)

    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=1e-6)
    assert len(got.grads) == len(expected.grads)
    for mine, theirs in zip(got.grads, expected.grads, strict=False):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    # BatchNorm statistics updated once (num_batches_tracked == 1), bit for bit as by the plain step:
    # a recomputing forward runs at momentum 0 (norm_statistics.frozen_statistics).
    for mine, theirs in zip(got.buffers, expected.buffers, strict=True):
        assert torch.equal(mine, theirs)
    # Same dropout masks (exact grads above) and the generator where the plain step left it.
    assert torch.equal(got.rng, expected.rng)


def test_schedules_under_test_do_recompute() -> None:
    """The exactness grid is only meaningful if its schedules recompute stages with BN and dropout."""
    for name in MODELS:
        advances = {kind: simulate(case(name).chain, make_schedule(name, kind)).forward_advances
                    for kind in SCHEDULES}
        assert advances["keep_all"] == 0
        assert advances["revolve1"] > case(name).chain.length
        assert advances["optimal_min"] > 0


# --- memory against the simulator ------------------------------------------------------------------

def measured_step_peak(c: Case, schedule: Schedule) -> StepPeaks:
    """A steady-state SGD step run by ``schedule`` by both instruments; weights, buffers, batch and momentum
    registered with the tracker, nothing else that existed before."""
    model = c.fresh_model()
    stages = training_stages(model)
    opt = make_optimizer("sgd", model.parameters())
    return measured_schedule_step(lambda: run_schedule(stages, schedule, c.x, c.y, chain=c.chain), model, opt,
                                  c.x, c.y)


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m == "resnet50" else m for m in MODELS])
def test_measured_peak_tracks_simulated_peak_over_budgets(name: str, record_property: pytest.RecordProperty) -> None:
    c = case(name, *MEMORY_SIZES[name])
    budgets = c.budgets(6)  # keep-all's peak down to the least feasible
    schedules = [c.table.schedule(b) for b in budgets]
    stats = [simulate(c.chain, s) for s in schedules]
    peaks = [measured_step_peak(c, s) for s in schedules]
    measured = [p.allocated for p in peaks]
    ratios = [m / s.peak_bytes for m, s in zip(measured, stats, strict=False)]
    record_property("measured_over_simulated", ratios)
    log.info("%s measured/simulated over budgets %s: %s", name, budgets, [f"{r:.4f}" for r in ratios])

    for budget, stat, schedule, peak in zip(budgets, stats, schedules, peaks, strict=False):
        # the DP's recurrence leaves the generator states out (plan() plans lower where they do not fit)
        assert stat.peak_bytes <= budget + c.chain.rng_reserve_bytes
        # NOTE [ How close a measured peak is to the simulated one ] in steps.py
        assert peaks_track(peak, c.chain, schedule), (peak, stat.peak_bytes)
    assert all(later <= earlier for earlier, later in itertools.pairwise(measured))
    assert all(later.time_s >= earlier.time_s for earlier, later in itertools.pairwise(stats))
    assert measured[-1] < measured[0]  # the sweep did save memory


def test_an_executor_that_keeps_every_activation_fails_the_peak_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above has teeth: an executor that never lets go of a value (Discard and the
    release after a forward do nothing) measures far above the simulated peak, and is rejected."""
    from edgetrain.runtime.schedule_run import ScheduleRun

    c = case("transformer_small", *MEMORY_SIZES["transformer_small"])
    schedule = c.table.schedule(c.budgets(6)[-1])   # the least memory: values are dropped and recomputed
    assert peaks_track(measured_step_peak(c, schedule), c.chain, schedule)
    monkeypatch.setattr(ScheduleRun, "release", lambda self, k: None)
    hoarding = measured_step_peak(c, schedule)
    assert not peaks_track(hoarding, c.chain, schedule), hoarding


def test_unsaved_transformer_layer_input_is_freed() -> None:
    """An encoder layer does not save its input: once recorded, the executor must not pin it."""
    c = case("transformer_small")
    layer = c.chain.stages[1]
    assert not layer.input_saved
    model = c.fresh_model()
    schedule = keep_all(c.chain.length)
    live: list[int] = []
    with LiveBytesTracker() as tracker:
        tracker.register_training_state(model, None, c.x, c.y)
        before = tracker.current_bytes
        run_schedule(training_stages(model), schedule, c.x, c.y, on_op=lambda i, op: live.append(tracker.current_bytes))
    record = schedule.ops.index(Forward(1, Keep.ALL))
    growth = live[record] - live[record - 1]
    # x_1 (the embedding output) leaves memory; the record adds what autograd saved plus x_2.
    assert growth == layer.saved_bytes - c.chain.value_bytes[1]
    assert live[0] - before == c.chain.stages[0].saved_bytes


# --- errors ----------------------------------------------------------------------------------------

def test_stage_count_must_match_the_schedule() -> None:
    c = case("transformer_small")
    stages = training_stages(c.fresh_model())
    with pytest.raises(ScheduleError, match="schedule is for 4 stages but 5 stages"):
        Executor(stages, keep_all(4))


def test_invalid_schedule_is_rejected_before_running() -> None:
    c = case("transformer_small")
    bad = Schedule((Forward(0, Keep.ALL), Backward(1)), length=5)
    with pytest.raises(ScheduleError, match="op 1"):
        run_schedule(training_stages(c.fresh_model()), bad, c.x, c.y)


def test_target_needs_a_loss_stage() -> None:
    c = case("transformer_small")
    stages = training_stages(c.fresh_model())[:-1]
    with pytest.raises(TypeError, match="not a LossStage"):
        run_schedule(stages, keep_all(len(stages)), c.x, c.y)


def test_covered_output_is_found_again_after_release() -> None:
    """A value released but saved by its producer's record (output_saved) may be forwarded again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))  # ReLU saves its output
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    reference = copy.deepcopy(model)
    nn.functional.cross_entropy(reference(x), y).backward()
    ops = (Forward(0, Keep.ALL), Forward(1, Keep.ALL), Forward(2, Keep.NONE), Forward(2, Keep.ALL),
           Forward(3, Keep.ALL), Backward(3), Backward(2), Backward(1), Backward(0))
    run_schedule(training_stages(model), Schedule(ops, 4), x, y)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=False):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=1e-6)


def test_in_place_change_of_a_kept_input_is_an_error() -> None:
    """A stage that overwrites its checkpointed input would recompute from garbage: refuse it."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    ops = (Forward(0, Keep.ALL), Forward(1, Keep.INPUT), Forward(2, Keep.ALL), Forward(3, Keep.ALL), Backward(3),
           Backward(2), Forward(1, Keep.ALL), Backward(1), Backward(0))
    with pytest.raises(RuntimeError, match=r"stage 1 .ReLU. modified its input in place"):
        run_schedule(training_stages(model), Schedule(ops, 4), x, y)
    # Released after use, as by plain backprop, the same in-place stage is fine.
    run_schedule(training_stages(model), keep_all(4), x, y)


# --- Checkpointed ----------------------------------------------------------------------------------

def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, use_step_loss: bool) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if use_step_loss:
            model.step_loss(x, y)
        else:
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def mid_budget(name: str) -> int:
    c = case(name)
    return c.budgets(3)[1]


@pytest.mark.parametrize("use_step_loss", [False, True], ids=["user_loop", "step_loss"])
@pytest.mark.parametrize("name", ["transformer_small", "mobilenet_v2"])
def test_checkpointed_training_matches_the_bare_model(name: str, use_step_loss: bool) -> None:
    c = case(name)
    bare, wrapped_model = c.fresh_model(), c.fresh_model()
    budget = mid_budget(name)
    wrapped = Checkpointed(wrapped_model, sample=c.x, target=c.y, memory=budget, measure_time=False)
    assert wrapped.plan.predicted_peak_bytes <= budget
    assert wrapped.plan.stats.forward_advances > 0  # it does recompute

    torch.manual_seed(SEED)
    train(bare, c.x, c.y, 3, use_step_loss=False)
    bare_rng = torch.get_rng_state()
    torch.manual_seed(SEED)
    train(wrapped, c.x, c.y, 3, use_step_loss=use_step_loss)

    assert torch.equal(torch.get_rng_state(), bare_rng)
    for (key, mine), theirs in zip(wrapped.state_dict().items(), bare.state_dict().values(), strict=False):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5, msg=key)


def test_checkpointed_user_loop_step_stays_within_the_predicted_peak() -> None:
    c = case("transformer_small")
    model = c.fresh_model()
    wrapped = Checkpointed(model, sample=c.x, target=c.y, memory=mid_budget("transformer_small"), measure_time=False)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    peaks = measured_schedule_step(lambda: nn.functional.cross_entropy(wrapped(c.x), c.y).backward(), model, opt,
                                   c.x, c.y)
    log.info("Checkpointed user loop: measured %s, predicted %d", peaks, wrapped.plan.predicted_peak_bytes)
    # No slack: the rest of the schedule runs once the engine has let go of the model output's gradient
    # (NOTE [ Checkpointed in a user loop ]); run inside the function's backward it would be +320 bytes over.
    assert peaks_track(peaks, wrapped.chain, wrapped.plan.schedule), peaks


def test_checkpointed_replans_on_a_new_input_shape(caplog: pytest.LogCaptureFixture) -> None:
    c = case("transformer_small")
    wrapped = Checkpointed(c.fresh_model(), sample=c.x, recompute=1.5, measure_time=False)
    first = wrapped.plan
    accumulated = [torch.full_like(p, 0.5) for p in wrapped.parameters()]
    for p, grad in zip(wrapped.parameters(), accumulated, strict=False):
        p.grad = grad.clone()
    smaller = c.x[:4, :16]
    with caplog.at_level(logging.WARNING, logger="edgetrain.runtime.checkpointed"):
        out = wrapped(smaller)
    assert "planning again" in caplog.text
    assert out.shape == (4, 10)
    assert wrapped.chain.meta["input_shape"] == [4, 16]
    assert wrapped.plan.predicted_peak_bytes < first.predicted_peak_bytes
    # Profiling for the new plan left a gradient-accumulating loop's .grad alone.
    assert all(torch.equal(p.grad, grad) for p, grad in zip(wrapped.parameters(), accumulated, strict=False))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgetrain.runtime.checkpointed"):
        wrapped(smaller)
        wrapped(c.x)
    assert caplog.text == ""  # both shapes were planned already
    assert wrapped.plan is first


def test_checkpointed_is_the_plain_model_outside_training() -> None:
    c = case("mobilenet_v2")
    model = c.fresh_model()
    wrapped = Checkpointed(model, sample=c.x, recompute=1.3, measure_time=False)
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in model.parameters()]
    with torch.no_grad():
        out = wrapped(c.x)
    assert out.grad_fn is None
    wrapped.eval()
    torch.testing.assert_close(wrapped(c.x), model(c.x), rtol=0, atol=0)


def test_checkpointed_graph_cannot_be_back_propagated_twice() -> None:
    c = case("transformer_small")
    wrapped = Checkpointed(c.fresh_model(), sample=c.x, recompute=1.5, measure_time=False)
    loss = nn.functional.cross_entropy(wrapped(c.x), c.y)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already back-propagated"):
        loss.backward()


def test_a_dropout_step_holds_the_generator_states_its_plan_counts() -> None:
    """NOTE [ Generator states in the plan ]: on a small dropout net recomputed throughout (revolve with one slot),
    the states (5,056 bytes each on CPU) outweigh an activation (4 KiB); the tracker, shown them by the executor,
    measures the step's peak as predicted, states included."""
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5), nn.Linear(64, 64), nn.Dropout(0.5), nn.Linear(64, 2))
    x, y = torch.randn(16, 64), torch.randint(0, 2, (16,))
    chain = profile(model, x, y, measure_time=False)
    schedule = revolve(chain, 1)
    assert chain.rng_state_bytes == torch.get_rng_state().nbytes
    assert rng_replayed_stages(schedule, chain) == {1, 3}
    opt = make_optimizer("sgd", model.parameters())
    stages = training_stages(model)
    peaks = measured_schedule_step(lambda: run_schedule(stages, schedule, x, y, chain=chain), model, opt, x, y)
    predicted = simulate(chain, schedule).peak_bytes
    assert predicted > simulate(replace(chain, rng_state_bytes=0), schedule).peak_bytes + chain.rng_state_bytes
    assert peaks_track(peaks, chain, schedule), (peaks, predicted)


def test_only_recomputed_stages_that_draw_random_numbers_keep_the_generator_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A deterministic stage recomputes without the generator's state (5,056 bytes on CPU, which the plan counts
    for the stages that keep it); a dropout stage keeps it, so its recomputation draws the same mask (the
    exactness grid above)."""
    from edgetrain.autograd.rng_state import RngState
    captured: list[int] = []
    original = RngState.capture

    def counting_capture(counted: bool = False) -> object:
        captured.append(1)
        return original(counted)
    monkeypatch.setattr(RngState, "capture", staticmethod(counting_capture))
    torch.manual_seed(0)
    for dropout, expected in ((0.0, 0), (0.5, 1)):
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(dropout), nn.Linear(8, 8), nn.Linear(8, 2))
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
        chain = profile(model, x, y, measure_time=False)
        captured.clear()
        run_schedule(training_stages(model), revolve(chain, 1), x, y, chain=chain)
        assert chain.stages[1].uses_rng == (dropout > 0)
        # revolve(1) recomputes every stage; with dropout, stage 1's state is noted once and replayed (a capture
        # of the state to put back after each replay): more than the one note, none at all without it
        assert (len(captured) > 0) == (expected > 0)

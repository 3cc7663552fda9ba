"""NOTE [ A kernel's scratch in the plan ] (chain.py) and NOTE [ One session, many windows ] (profile/tracker.py):
the profiler measures what kernels allocate inside one op, the plans hold it, the allocator's records confirm it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from steps import allocator_step_peaks, peak_tracks
from torch import nn

from edgetrain import Checkpointed
from edgetrain.core.chain import Chain, StageCost
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.profiling import profile
from edgetrain.profiling import profiler as profiler_module
from edgetrain.profiling.tracker import AllocatorRecorder, _session_changes, records_every_allocation
from edgetrain.runtime.verify import three_budgets


def conv_net() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Four 3x3 convolutions of 64 channels at 32 px: oneDNN reorders each weight and its input into blocked
    copies that no tensor shows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return model, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))


def test_one_session_sees_a_release_of_what_it_allocated_and_leaves_out_an_older_blocks() -> None:
    before = torch.ones(1000)                       # 4,000 bytes from before the session
    with AllocatorRecorder(torch.device("cpu")) as recorder:
        with recorder.window() as first:
            kept = torch.ones(2000)                 # 8,000 bytes
        with recorder.window() as second:
            del kept, before                        # one block of this session, one from before it
            scratch = torch.ones(500)               # 2,000 bytes at the window's peak
            del scratch
    assert (first.net_bytes, first.peak_bytes) == (8000, 8000)
    assert (second.net_bytes, second.peak_bytes) == (-8000, 0)


def test_a_release_counts_only_where_the_session_allocated_the_address() -> None:
    """The allocator reports some releases of older blocks with the size an older session recorded at that address
    (a window's net had gone negative): they are left out."""
    allocations = [(1, 100, 0xA), (2, -50, 0xB), (3, -100, 0xA), (4, 30, 0xA), (5, -30, 0xA), (6, -30, 0xA)]
    assert _session_changes(allocations) == [(1, 100), (3, -100), (4, 30), (5, -30)]


def test_the_profile_holds_convolution_scratch_the_tracker_never_sees() -> None:
    assert records_every_allocation()   # tests run at one thread (conftest)
    model, x, y = conv_net()
    chain = profile(model, x, y, measure_time=False)
    convs = [s for s in chain.stages if "Conv2d" in s.name]
    assert all(s.fwd_scratch_bytes > 0 and s.bwd_scratch_bytes > 0 for s in convs)
    tracked = chain.without_scratch()
    assert all(s.fwd_scratch_bytes == 0 and s.bwd_workspace_bytes == c.bwd_workspace_bytes - c.bwd_scratch_bytes
               for s, c in zip(tracked.stages, chain.stages, strict=True))
    assert simulate(chain, keep_all(chain.length)).peak_bytes > simulate(tracked, keep_all(chain.length)).peak_bytes


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_plan_holds_the_allocators_peak_only_with_the_scratch(which: int) -> None:
    """At each of three budgets the allocator's records of a step are the plan's peak (not above it, not below 0.995
    of it); the same step against the plan's peak without the scratch is over it."""
    model, x, y = conv_net()
    chain = profile(model, x, y, measure_time=False)
    budget = three_budgets(chain)[which]
    wrapped = Checkpointed(model, sample=x, target=y, memory=budget, measure_time=False, chain=chain)
    measured, predicted = allocator_step_peaks(wrapped, model, x, y)
    assert peak_tracks(measured, predicted), (measured, predicted)
    unplanned = simulate(chain.without_scratch(), wrapped.plan.schedule).peak_bytes - chain.between_steps_bytes
    assert measured > unplanned


def test_the_profile_measures_bytes_at_one_thread_and_gives_the_threads_back(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    profile_stage = profiler_module._profile_stage
    monkeypatch.setattr(profiler_module, "_profile_stage",
                        lambda *a, **k: threads.append(torch.get_num_threads()) or profile_stage(*a, **k))
    torch.set_num_threads(2)
    try:
        profile(conv_net()[0], (2, 3, 16, 16), measure_time=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert threads and set(threads) == {1}


def test_a_user_profiler_session_leaves_the_scratch_out_and_the_tracker_measures() -> None:
    model, x, y = conv_net()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        chain = profile(model, x, y, measure_time=False)
    assert all(s.fwd_scratch_bytes == s.bwd_scratch_bytes == 0 for s in chain.stages)
    assert chain == profile(model, x, y, measure_time=False).without_scratch()


def test_without_scratch_and_the_stepped_backward() -> None:
    stage = StageCost("a", 1.0, 1.0, out_bytes=10, saved_bytes=10, param_bytes=4, grad_bytes=4,
                      fwd_workspace_bytes=30, rec_workspace_bytes=20, bwd_workspace_bytes=25,
                      bwd_stepped_workspace_bytes=27, fwd_scratch_bytes=20, rec_scratch_bytes=5, bwd_scratch_bytes=25,
                      bwd_stepped_scratch_bytes=21)
    chain = Chain(stages=(stage,), input_bytes=10)
    tracked = chain.without_scratch().stages[0]
    assert (tracked.fwd_workspace_bytes, tracked.rec_workspace_bytes, tracked.bwd_workspace_bytes,
            tracked.bwd_stepped_workspace_bytes) == (10, 15, 0, 6)
    stepped = chain.with_step_in_backward().stages[0]
    assert (stepped.bwd_workspace_bytes, stepped.bwd_scratch_bytes) == (27, 21)
    assert chain.with_step_in_backward().without_scratch().stages[0].bwd_workspace_bytes == 6
    assert Chain.from_dict(chain.to_dict()) == chain
    with pytest.raises(ValueError, match="bwd_scratch_bytes must be >= 0"):
        replace(stage, bwd_scratch_bytes=-1)


def test_a_zoo_chain_on_real_tensors_is_the_meta_chain_with_this_machines_scratch() -> None:
    """``chain_for(..., device="cpu")``: the same sizes the meta device gives (its tracker sees every tensor),
    plus the convolutions' scratch no tensor shows, without moving the caller's generator (the weights' init and
    MobileNetV2's dropout draw)."""
    from edgetrain.profiling import chain_for

    torch.manual_seed(123)
    state = torch.get_rng_state()
    meta = chain_for("mobilenet_v2", 2, 32, num_classes=10)
    real = chain_for("mobilenet_v2", 2, 32, num_classes=10, device="cpu")
    assert torch.equal(torch.get_rng_state(), state)

    def sizes(chain: Chain) -> list[dict[str, int]]:
        return [{k: v for k, v in vars(s).items() if not k.endswith("time_s")} for s in chain.stages]

    assert sizes(real.without_scratch()) == sizes(meta)
    assert (real.weights_bytes, real.input_bytes, real.optimizer_state_bytes) == \
        (meta.weights_bytes, meta.input_bytes, meta.optimizer_state_bytes)
    assert sum(s.bwd_scratch_bytes for s in real.stages) > 0 and not any(
        s.fwd_scratch_bytes or s.bwd_scratch_bytes for s in meta.stages)

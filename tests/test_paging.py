"""Paging activations to storage: the page store, and the executor running paging schedules.

Value schedules are built by hand from keep-all and uniform checkpointing: each chosen value is
paged out right after an op that leaves it alive and paged in just before the next op that
needs it in RAM. Record schedules page a record's internals (``PageOutRecord``/``PageInRecord``):
by hand on keep-all, right after the stage's forward and right before its backward, and as the
``paging-dp`` planner emits them. The executor must give plain autograd's gradients, hold what
the simulator counts (measured peak 0.995-1.000 of the simulated one, as without paging; RAM
freed exactly when a serial page-out returns) and leave no file behind, however the step ends.
"""

from __future__ import annotations

import copy
import errno
import functools
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from steps import (
    StepPeaks,
    StepResult,
    measured_schedule_step,
    observe,
    peaks_track,
    plain_autograd_step,
    with_paged_records,
)
from torch import nn

from edgetrain.autograd.handover import GradBox
from edgetrain.core.chain import Chain
from edgetrain.core.optim import make_optimizer
from edgetrain.core.schedule import (
    Backward,
    Forward,
    Keep,
    Op,
    PageIn,
    PageInRecord,
    PageOut,
    PageOutRecord,
    Schedule,
    keep_all,
)
from edgetrain.core.simulator import memory_timeline, simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.errors import PagingError
from edgetrain.models.stages import training_stages
from edgetrain.planners import uniform
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.profiling import LiveBytesTracker, profile
from edgetrain.runtime import Executor, PageStore, run_schedule
from edgetrain.runtime import pager as paging
from edgetrain.runtime.overlap import plan_overlap
from edgetrain.runtime.paging_cases import SIZES, PagingCase, case, host_paging_profile, median_step_s, with_paging

log = logging.getLogger(__name__)

SEED = 1234


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Bitwise comparisons and timings on one thread (the machine is shared)."""


# --- building paging schedules by hand ---------------------------------------------------------------

def tensors_chain(name: str) -> Chain:
    """The case's chain without its kernels' scratch: where paging moves the peak. On ResNet-18 at 96 px a
    convolution's scratch makes one op the peak of every schedule (NOTE [ A kernel's scratch in the plan ]), which
    no paging lowers; the schedules are planned on the tensors, and measured against both chains."""
    return case(name).chain.without_scratch()


def paged_schedules(name: str) -> dict[str, Schedule]:
    chain = tensors_chain(name)
    inner = range(1, chain.length - 1)
    return {"keep_all": with_paging(keep_all(chain.length), chain, inner),
            "uniform3": with_paging(uniform(chain, 3), chain, inner)}


def internals(chain: Chain, stage: int) -> int:
    """Bytes of a record besides its stage's input and output, as the simulator counts them."""
    return chain.stages[stage].saved_bytes - chain.stages[stage].out_bytes


# Storage as cheap as it gets on a device, so that the planner pages.
CHEAP_STORAGE = EnergyProfile("t", 1e9, 3.0, 1e-3, 1e8, 0.1, 1e-3, 5e7, 0.1)


@functools.cache
def record_schedules(name: str) -> dict[str, Schedule]:
    """The first three records that keep internals (ResNet: bn1, maxpool and a block) paged on
    keep-all, and ``paging-dp`` at its least budget and a quarter of the way to keep-all's peak."""
    chain = tensors_chain(name)
    paged = [i for i in range(chain.length - 1) if internals(chain, i) > 0][:3]
    peak = simulate(chain, keep_all(chain.length)).peak_bytes
    table = solve_paging(chain, CHEAP_STORAGE, peak)
    low = table.min_memory_bytes
    return {"records": with_paged_records(chain, paged), "dp_min": table.schedule(low),
            "dp_quarter": table.schedule(low + (peak - low) // 4)}


def without_record_paging(schedule: Schedule) -> Schedule:
    return Schedule(tuple(op for op in schedule.ops if not isinstance(op, (PageOutRecord, PageInRecord))),
                    schedule.length)


def test_record_paging_is_accepted_and_lowers_the_simulated_peak() -> None:
    for name in SIZES:
        chain = tensors_chain(name)
        for kind, schedule in record_schedules(name).items():
            assert any(isinstance(op, PageOutRecord) for op in schedule.ops), kind
            paged, unpaged = simulate(chain, schedule), simulate(chain, without_record_paging(schedule))
            log.info("%s %s: records %s paged, peak %d -> %d, disk %d", name, kind,
                     [op.stage for op in schedule.ops if isinstance(op, PageOutRecord)], unpaged.peak_bytes,
                     paged.peak_bytes, paged.peak_disk_bytes)
            # Paging only ever takes bytes out of RAM; the hand-built case pages to lower the peak, paging-dp
            # may page to save recomputation energy where the peak lies elsewhere (e.g. at its floor).
            if kind == "records":
                assert paged.peak_bytes < unpaged.peak_bytes
            else:
                assert paged.peak_bytes <= min(unpaged.peak_bytes, schedule.params["budget_bytes"])
            assert paged.pagein_count == paged.pageout_count and paged.peak_disk_bytes > 0


def test_hand_built_schedules_page_and_lower_the_simulated_peak() -> None:
    for name in SIZES:
        chain = tensors_chain(name)
        for kind, schedule in paged_schedules(name).items():
            base = keep_all(chain.length) if kind == "keep_all" else uniform(chain, 3)
            paged, plain = simulate(chain, schedule), simulate(chain, base)
            log.info("%s %s: %d page-outs, peak %d -> %d, disk %d", name, kind, paged.pageout_count,
                     plain.peak_bytes, paged.peak_bytes, paged.peak_disk_bytes)
            assert paged.pageout_count >= 1 and paged.pagein_count == paged.pageout_count
            if name == "transformer_small":
                # Its layers keep neither input nor output: only the head's input and checkpoints
                # can be paged, and they are back before the peak (the backward of a layer).
                assert paged.peak_bytes <= plain.peak_bytes
            else:
                assert paged.peak_bytes < plain.peak_bytes
            assert paged.peak_disk_bytes > 0


# --- exactness ----------------------------------------------------------------------------------------

@functools.cache
def plain_step(name: str) -> StepResult:
    c = case(name)
    return plain_autograd_step(c.fresh_model(), c.x, c.y, SEED)


VALUE_KINDS = ["keep_all", "uniform3"]
RECORD_KINDS = ["records", "dp_min", "dp_quarter"]


def schedule_of(name: str, kind: str) -> Schedule:
    return paged_schedules(name)[kind] if kind in VALUE_KINDS else record_schedules(name)[kind]


@pytest.mark.parametrize("kind", VALUE_KINDS + RECORD_KINDS)
@pytest.mark.parametrize("name", list(SIZES))
def test_paged_step_equals_plain_autograd(name: str, kind: str, tmp_path: Path) -> None:
    c = case(name)
    schedule = schedule_of(name, kind)
    model = c.fresh_model()
    executor = Executor(training_stages(model), schedule, c.chain, page_dir=tmp_path)
    torch.manual_seed(SEED)
    got, expected = observe(model, executor.step(c.x, c.y)), plain_step(name)

    assert torch.equal(got.loss, expected.loss)
    for mine, theirs in zip(got.grads, expected.grads, strict=False):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    for mine, theirs in zip(got.buffers, expected.buffers, strict=True):   # BN statistics updated once, exactly
        assert torch.equal(mine, theirs)
    assert torch.equal(got.rng, expected.rng)
    stats, simulated = executor.last_paging, simulate(c.chain, schedule)
    assert stats is not None and stats.pageouts == stats.pageins == simulated.pageout_count
    # Every page is the bytes the simulator moves: a value, or a record's internals.
    assert stats.bytes_written == stats.bytes_read == simulated.pageout_bytes > 0
    assert list(tmp_path.iterdir()) == []


def test_page_round_trip_is_bitwise(tmp_path: Path) -> None:
    """Odd dtypes and a strided view of a larger storage come back with the same bytes and geometry."""
    base = torch.randn(6, 10)
    values = {1: base[1:, ::3], 2: torch.randn(5, 3).to(torch.bfloat16),
              3: torch.randint(0, 255, (7,), dtype=torch.uint8),
              4: torch.empty(0), 5: torch.tensor(float("nan"))}
    with PageStore(tmp_path).session() as pages:
        for key, value in values.items():
            pages.write(key, value)
        for key, value in values.items():
            back = pages.finish_read(key)
            assert back.dtype == value.dtype and back.shape == value.shape and back.stride() == value.stride()
            assert back.storage_offset() == value.storage_offset()
            assert bytes(back.untyped_storage()) == bytes(value.untyped_storage())
        assert pages.disk_bytes == 0 and list(pages.path.iterdir()) == []
    assert list(tmp_path.iterdir()) == []


def test_record_page_round_trip_is_bitwise(tmp_path: Path) -> None:
    """A record's storages go out as one page (a file each) and come back as new storages, in order."""
    storages = [torch.randn(6, 10), torch.randint(0, 255, (7,), dtype=torch.uint8), torch.empty(0),
                torch.randn(5, 3).to(torch.bfloat16)]
    with PageStore(tmp_path).session() as pages:
        pages.write_storages(paging.RecordKey(2), storages)
        pages.wait_write(paging.RecordKey(2))
        assert sorted(p.name for p in pages.path.iterdir()) == ["r2.0.page", "r2.1.page", "r2.2.page", "r2.3.page"]
        assert pages.disk_bytes == sum(t.untyped_storage().nbytes() for t in storages)
        back = pages.finish_read_storages(paging.RecordKey(2))
        assert [bytes(b.untyped_storage()) for b in back] == [bytes(t.untyped_storage()) for t in storages]
        assert all(b.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or t.numel() == 0
                   for b, t in zip(back, storages, strict=False))
        assert pages.disk_bytes == 0 and list(pages.path.iterdir()) == []
    assert list(tmp_path.iterdir()) == []


# --- memory against the simulator ---------------------------------------------------------------------

def measured_step_peak(c: PagingCase, schedule: Schedule, page_dir: Path) -> tuple[StepPeaks, Executor]:
    """The peaks of a steady-state SGD step by both instruments (as in test_executor.measured_step_peak)."""
    model = c.fresh_model()
    opt = make_optimizer("sgd", model.parameters())
    executor = Executor(training_stages(model), schedule, c.chain, page_dir=page_dir)
    return measured_schedule_step(lambda: executor.step(c.x, c.y), model, opt, c.x, c.y), executor


@pytest.mark.parametrize("kind", VALUE_KINDS + RECORD_KINDS)
@pytest.mark.parametrize("name", list(SIZES))
def test_measured_peak_tracks_simulated_peak(name: str, kind: str, tmp_path: Path,
                                             record_property: pytest.RecordProperty) -> None:
    c = case(name)
    schedule = schedule_of(name, kind)
    simulated = simulate(c.chain, schedule).peak_bytes
    measured, executor = measured_step_peak(c, schedule, tmp_path)
    ratio = measured.allocated / simulated
    record_property("measured_over_simulated", ratio)
    log.info("%s %s paged: measured %s / simulated %d = %.4f; %s", name, kind, measured, simulated, ratio,
             executor.last_paging)
    assert peaks_track(measured, c.chain, schedule), (measured, simulated)   # measured: 0.9981-1.0000 (+4 bytes)


def test_page_out_frees_the_value_and_page_in_brings_it_back(tmp_path: Path) -> None:
    """Serial paging (no chain: no overlap): RAM drops by x_k when PageOut returns, and no
    reference to its storage survives; PageIn takes the bytes back."""
    c = case("resnet18")
    schedule = paged_schedules("resnet18")["keep_all"]
    model = c.fresh_model()
    stages = training_stages(model)
    outputs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
    for i, stage in enumerate(stages[:-1]):
        stage.register_forward_hook(lambda module, args, out, i=i: outputs.__setitem__(i + 1, weakref.ref(
            out.untyped_storage())))
    live: list[int] = []
    freed: dict[int, bool] = {}

    def on_op(index: int, op: Op) -> None:
        live.append(tracker.current_bytes)
        if isinstance(op, PageOut):
            freed[op.value] = outputs[op.value]() is None

    executor = Executor(stages, schedule, page_dir=tmp_path)   # no chain: every transfer waited for
    with LiveBytesTracker() as tracker:
        tracker.register_training_state(model, None, c.x, c.y)
        executor.step(c.x, c.y, on_op=on_op)
    # Op by op, the executor holds what the simulator counts (up to the 4-byte loss).
    offsets = [measured - simulated.after_bytes
               for measured, simulated in zip(live, memory_timeline(c.chain, schedule), strict=False)]
    assert max(offsets) - min(offsets) <= 16
    sizes = c.chain.value_bytes
    for index, op in enumerate(schedule.ops):
        if isinstance(op, PageOut):
            assert live[index] - live[index - 1] == -sizes[op.value], op
        if isinstance(op, PageIn):
            assert live[index] - live[index - 1] == sizes[op.value], op
    assert freed and all(freed.values())


def transfer_bytes(chain: Chain, op: Op) -> int:
    if isinstance(op, (PageOut, PageIn)):
        return chain.value_bytes[op.value]
    assert isinstance(op, (PageOutRecord, PageInRecord))
    return internals(chain, op.stage)


def test_record_page_out_frees_exactly_its_internals(tmp_path: Path) -> None:
    """Serial record paging: RAM drops by the record's internals when PageOutRecord returns (so
    nothing else refers to them) and PageInRecord takes them back; live bytes track the simulator."""
    c = case("resnet18")
    schedule = record_schedules("resnet18")["records"]
    model = c.fresh_model()
    live: list[int] = []
    executor = Executor(training_stages(model), schedule, page_dir=tmp_path)   # no chain: every transfer waited for
    with LiveBytesTracker() as tracker:
        tracker.register_training_state(model, None, c.x, c.y)
        executor.step(c.x, c.y, on_op=lambda index, op: live.append(tracker.current_bytes))
    offsets = [measured - simulated.after_bytes
               for measured, simulated in zip(live, memory_timeline(c.chain, schedule), strict=False)]
    assert max(offsets) - min(offsets) <= 16
    changes = {op: live[index] - live[index - 1] for index, op in enumerate(schedule.ops)
               if isinstance(op, (PageOutRecord, PageInRecord))}
    assert changes == {op: (-1 if isinstance(op, PageOutRecord) else 1) * internals(c.chain, op.stage)
                       for op in changes}
    assert {1, 3} <= {op.stage for op in changes}   # the stem's BN (its input) and max-pool (indices)
    assert list(tmp_path.iterdir()) == []


def test_overlap_stays_under_the_simulated_peak() -> None:
    """The overlap plan only stretches a transfer over ops with room for it under the peak."""
    for name in SIZES:
        c = case(name)
        record_sizes = [internals(c.chain, i) for i in range(c.chain.length)]
        for kind in VALUE_KINDS + RECORD_KINDS:
            schedule = schedule_of(name, kind)
            timeline = memory_timeline(c.chain, schedule)
            plan = plan_overlap(schedule.ops, timeline, c.chain.value_bytes, record_sizes)
            peak = max(m.transient_bytes for m in timeline)
            extra = [0] * len(schedule.ops)
            for j, end in plan.release_before.items():
                assert end > j
                for t in range(j + 1, end):
                    extra[t] += transfer_bytes(c.chain, schedule.ops[j])
            for j, start in plan.issue_before.items():
                assert start <= j
                for t in range(start, j):
                    extra[t] += transfer_bytes(c.chain, schedule.ops[j])
            assert all(m.transient_bytes + e <= peak for m, e in zip(timeline, extra, strict=False))
            assert len(plan.release_before) + len(plan.issue_before) == simulate(c.chain, schedule).pageout_count * 2
            if kind in VALUE_KINDS or name == "resnet18":
                assert any(end > j + 1 for j, end in plan.release_before.items()), kind   # it does overlap somewhere


@pytest.mark.parametrize("name", list(SIZES))
def test_step_time_against_the_simulator(name: str, tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    """Reported, not asserted: a paged step's wall time next to the unpaged one and the simulator's
    (asserted: the step paged the pages and bytes the simulator prices).

    The simulator is priced with this host's own paging throughput (from the step's
    ``write_s``/``read_s``), so its serial ``time_s`` is what the step would take without overlap.
    """
    c = case(name)
    model = c.fresh_model()
    timed = profile(model, c.x, c.y, measure_time=True)
    unpaged = uniform(timed, 3)
    paged = with_paging(unpaged, timed, range(1, timed.length - 1))
    executor = Executor(training_stages(model), paged, timed, page_dir=tmp_path)
    paged_s = median_step_s(executor, c, model)
    unpaged_s = median_step_s(Executor(training_stages(model), unpaged, timed), c, model)
    stats, counted = executor.last_paging, simulate(timed, paged)
    # What is asserted: the timed steps paged exactly what the simulator prices.
    assert stats is not None and stats.pageouts == stats.pageins == counted.pageout_count > 0
    assert stats.bytes_written == stats.bytes_read == counted.pageout_bytes
    assert stats.write_s > 0 and stats.read_s > 0
    host = host_paging_profile(stats)
    simulated = simulate(timed, paged, host)
    for key, value in {"paged_step_s": paged_s, "unpaged_step_s": unpaged_s, "simulated_time_s": simulated.time_s,
                       "simulated_compute_s": simulated.compute_time_s, "paging_wait_s": stats.wait_s}.items():
        record_property(key, value)
    log.info("%s uniform3 paged: measured %.4f s (unpaged %.4f s); simulated %.4f s = compute %.4f + serial paging "
             "%.4f at this host's %.0f/%.0f MB/s; the step waited %.4f s on I/O", name, paged_s, unpaged_s,
             simulated.time_s, simulated.compute_time_s, simulated.page_time_s, host.pageout_bps / 1e6,
             host.pagein_bps / 1e6, stats.wait_s)


@pytest.mark.parametrize("kind", ["uniform3", "records"])
def test_split_step_with_paging_cleans_up(kind: str, tmp_path: Path) -> None:
    """Executor.forward + PendingBackward (the Checkpointed path) pages too, and removes its files
    when the backward ends or when the pending half is dropped."""
    c = case("resnet18")
    model = c.fresh_model()
    executor = Executor(training_stages(model), schedule_of("resnet18", kind), c.chain, page_dir=tmp_path)
    output, pending = executor.forward(c.x)
    [step_dir] = list(tmp_path.iterdir())     # the step's pages live on between the halves
    assert step_dir.name.startswith(f"edgetrain-pages-{os.getpid()}-")
    output.requires_grad_()
    nn.functional.cross_entropy(output, c.y).backward()
    box = GradBox()
    box.grad, output.grad = output.grad, None
    pending(box)
    assert list(tmp_path.iterdir()) == []
    assert executor.last_paging is not None and executor.last_paging.pageins == executor.last_paging.pageouts
    for mine, theirs in zip(model.parameters(), plain_step("resnet18").grads, strict=False):
        torch.testing.assert_close(mine.grad, theirs, rtol=0, atol=1e-6)

    output, pending = executor.forward(c.x)
    del output, pending
    assert list(tmp_path.iterdir()) == []


# --- files and cleanup ----------------------------------------------------------------------------------

class Boom(RuntimeError):
    pass


class Explode(nn.Module):
    """An identity stage that raises on its first forward after ``armed`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            raise Boom("stage failed")
        return x * 1.0


def small_model() -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), Explode(), nn.Linear(256, 4))
    return model, torch.randn(32, 16), torch.randint(0, 4, (32,))


class Gated(nn.Module):
    """A stage whose record keeps two views of one internal storage (``h``) and one more tensor."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.inner = nn.Linear(features, 512)
        self.outer = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return self.outer(h[:, :256] * h[:, 256:])


def gated_model() -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(Gated(16), nn.ReLU(), Explode(), Gated(256), nn.Linear(256, 4))
    return model, torch.randn(32, 16), torch.randint(0, 4, (32,))


def gated_schedule(chain: Chain) -> Schedule:
    return with_paged_records(chain, [0, 3])


def test_views_of_one_storage_are_paged_once(tmp_path: Path) -> None:
    """The two saved views of ``h`` are written once and rebuilt over one storage; gradients are exact."""
    model, x, y = gated_model()
    chain = profile(model, x, y, measure_time=False)
    assert internals(chain, 0) == 32 * (512 + 256) * 4   # h and the product saved by the outer layer
    expected = copy.deepcopy(model)
    nn.functional.cross_entropy(expected(x), y).backward()
    executor = Executor(training_stages(model), gated_schedule(chain), chain, page_dir=tmp_path)
    loss = executor.step(x, y)
    assert torch.equal(loss, nn.functional.cross_entropy(expected(x), y).detach())
    for mine, theirs in zip(model.parameters(), expected.parameters(), strict=False):
        assert torch.equal(mine.grad, theirs.grad)
    stats = executor.last_paging
    assert stats is not None and stats.pageouts == 2
    assert stats.bytes_written == stats.bytes_read == internals(chain, 0) + internals(chain, 3)
    assert list(tmp_path.iterdir()) == []


def test_no_files_are_left_after_an_error_midway_with_paged_records(tmp_path: Path) -> None:
    model, x, y = gated_model()
    chain = profile(model, x, y, measure_time=False)
    executor = Executor(training_stages(model), gated_schedule(chain), page_dir=tmp_path)   # serial: files are there
    executor.step(x, y)
    assert list(tmp_path.iterdir()) == []
    seen: list[str] = []

    def on_op(index: int, op: Op) -> None:
        seen.extend(p.name for p in next(tmp_path.iterdir()).iterdir())

    model[2].armed = True
    with pytest.raises(Boom):
        executor.step(x, y, on_op=on_op)
    assert {"r0.0.page", "r0.1.page"} <= set(seen)   # the record's pages were on disk when the stage failed
    assert list(tmp_path.iterdir()) == []


def test_no_files_are_left_after_an_error_midway(tmp_path: Path) -> None:
    model, x, y = small_model()
    chain = profile(model, x, y, measure_time=False)
    schedule = with_paging(keep_all(chain.length), chain, range(1, chain.length - 1))
    explode = model[4]
    # serial (no chain, so no overlap plan): each write has finished when its PageOut op returns
    executor = Executor(training_stages(model), schedule, page_dir=tmp_path)
    executor.step(x, y)
    assert list(tmp_path.iterdir()) == []
    explode.armed = True
    seen: list[int] = []

    def on_op(index: int, op: Op) -> None:
        if isinstance(op, PageOut):
            seen.append(len(list(next(tmp_path.iterdir()).iterdir())))

    with pytest.raises(Boom):
        executor.step(x, y, on_op=on_op)
    assert seen and seen[-1] > 0          # pages were on disk when the stage failed
    assert list(tmp_path.iterdir()) == []


KILLED_STEP = textwrap.dedent("""
    import sys, time, torch
    from torch import nn
    from edgetrain.runtime import Executor
    from edgetrain.core.schedule import Forward, Backward, Keep, PageOut, PageIn, Schedule
    from edgetrain.models.stages import training_stages

    model = nn.Sequential(nn.Linear(16, 4096), nn.ReLU(), nn.Linear(4096, 4))
    ops = (Forward(0, Keep.ALL), Forward(1, Keep.ALL), Forward(2, Keep.ALL), PageOut(2), Forward(3, Keep.ALL),
           Backward(3), PageIn(2), Backward(2), Backward(1), Backward(0))

    def on_op(index, op):
        if isinstance(op, PageOut):
            print("paged", flush=True)
            time.sleep(60)

    executor = Executor(training_stages(model), Schedule(ops, 4), page_dir=sys.argv[1])
    executor.step(torch.randn(64, 16), torch.randint(0, 4, (64,)), on_op=on_op)
""")


def test_files_of_a_killed_step_are_removed_by_the_next_store(tmp_path: Path) -> None:
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", KILLED_STEP, str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "paged", child.stderr.read() if child.stderr else ""
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    [left] = list(tmp_path.iterdir())
    assert left.name.startswith(f"edgetrain-pages-{child.pid}-")
    assert [p.name for p in left.iterdir()] == ["x2.page"]

    mine = tmp_path / f"edgetrain-pages-{os.getpid()}-0123abcd"   # a live process's step is left alone
    mine.mkdir()
    store = PageStore(tmp_path)
    assert store.removed_stale == [left]
    assert sorted(tmp_path.iterdir()) == [mine]


# --- errors ---------------------------------------------------------------------------------------------

def one_page_step() -> tuple[nn.Sequential, Schedule, torch.Tensor, torch.Tensor]:
    """A 4-stage model whose x_2 (256 x 256 floats, kept by two records) is paged over the loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 8))
    ops = (Forward(0, Keep.ALL), Forward(1, Keep.ALL), Forward(2, Keep.ALL), PageOut(2), Forward(3, Keep.ALL),
           Backward(3), PageIn(2), Backward(2), Backward(1), Backward(0))
    return model, Schedule(ops, 4), torch.randn(256, 16), torch.randint(0, 8, (256,))


def within(seconds: float, fn: Callable[[], object]) -> BaseException | None:
    """Run ``fn`` on a thread; fail the test if it does not return in time; give back what it raised."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not finish within {seconds} s"
    return outcome[0]


def test_missing_or_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    model, schedule, x, y = one_page_step()
    with pytest.raises(PagingError, match=r"page directory .*nowhere does not exist"):
        Executor(training_stages(model), schedule, page_dir=tmp_path / "nowhere")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(PagingError, match="is not a directory"):
        run_schedule(training_stages(model), schedule, x, y, page_dir=not_a_dir)


def test_directory_that_becomes_unwritable_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, schedule, x, y = one_page_step()
    executor = Executor(training_stages(model), schedule, page_dir=tmp_path)

    def refuse(path: object, mode: int = 0o777) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(paging.os, "mkdir", refuse)
    with pytest.raises(PagingError,
                       match=r"cannot create the step's page directory .*Permission denied \[errno EACCES\]"):
        executor.step(x, y)


def test_read_only_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store asks the kernel (``os.access``), which answers for the caller: root may write to
    a mode-0500 directory, so the answer is stood in for to run the same check as any user."""
    real_access = os.access
    asked: list[int] = []

    def read_only(path: object, mode: int, **kwargs: object) -> bool:
        if Path(str(path)).resolve() == tmp_path.resolve():
            asked.append(mode)
            return not mode & os.W_OK
        return real_access(path, mode, **kwargs)  # type: ignore[arg-type]

    PageStore(tmp_path)   # writable: accepted
    monkeypatch.setattr(paging.os, "access", read_only)
    with pytest.raises(PagingError, match="is not writable"):
        PageStore(tmp_path)
    assert asked and all(mode & os.W_OK for mode in asked)


def test_disk_budget_is_checked_before_writing(tmp_path: Path) -> None:
    model, schedule, x, y = one_page_step()
    size = 256 * 256 * 4
    with pytest.raises(PagingError, match=f"needs {size} bytes on disk .* over the disk budget of 1000 bytes"):
        run_schedule(training_stages(model), schedule, x, y, page_dir=tmp_path, disk_budget_bytes=1000)
    assert list(tmp_path.iterdir()) == []
    # With the chain the executor refuses the schedule up front.
    chain = profile(model, x, y, measure_time=False)
    with pytest.raises(PagingError, match=f"keeps up to {size} bytes on disk, over the disk budget of 1000"):
        Executor(training_stages(model), schedule, chain, page_dir=tmp_path, disk_budget_bytes=1000)
    run_schedule(training_stages(model), schedule, x, y, page_dir=tmp_path, disk_budget_bytes=size)


def test_disk_budget_counts_paged_records(tmp_path: Path) -> None:
    model, x, y = gated_model()
    chain = profile(model, x, y, measure_time=False)
    schedule = gated_schedule(chain)
    first, second = internals(chain, 0), internals(chain, 3)
    budget = first + second - 1
    with pytest.raises(PagingError, match=f"paging out the record of stage 3 needs {second} bytes on disk with "
                                          f"{first} already there, over the disk budget of {budget} bytes"):
        run_schedule(training_stages(model), schedule, x, y, page_dir=tmp_path, disk_budget_bytes=budget)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PagingError, match=f"keeps up to {first + second} bytes on disk"):
        Executor(training_stages(model), schedule, chain, page_dir=tmp_path, disk_budget_bytes=budget)
    run_schedule(training_stages(model), schedule, x, y, chain=chain, page_dir=tmp_path, disk_budget_bytes=budget + 1)
    assert list(tmp_path.iterdir()) == []


def test_full_disk_while_paging_a_record_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, y = gated_model()
    chain = profile(model, x, y, measure_time=False)

    def full(path: Path, data: memoryview) -> None:
        path.write_bytes(bytes(data[:10]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(paging, "_write_bytes", full)
    for with_chain in (None, chain):
        executor = Executor(training_stages(model), gated_schedule(chain), with_chain, page_dir=tmp_path)
        error = within(30, lambda executor=executor: executor.step(x, y))
        assert isinstance(error, PagingError), error
        # with overlapped writes the failure may surface at a later record's write: any names its record and file
        assert re.search(r"writing the record of stage \d+ .*to .*\.page failed", str(error)), error
        assert "[errno ENOSPC]" in str(error)
        assert list(tmp_path.iterdir()) == []


def test_full_disk_is_a_clear_error_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, schedule, x, y = one_page_step()
    chain = profile(model, x, y, measure_time=False)

    def full(path: Path, data: memoryview) -> None:
        path.write_bytes(bytes(data[:10]))     # a partial file, as a full disk leaves
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(paging, "_write_bytes", full)
    for with_chain in (None, chain):   # serial, and overlapped where the plan allows it
        executor = Executor(training_stages(model), schedule, with_chain, page_dir=tmp_path)
        error = within(30, lambda executor=executor: executor.step(x, y))
        assert isinstance(error, PagingError), error
        assert "No space left on device [errno ENOSPC]" in str(error) and "x2.page" in str(error)
        assert list(tmp_path.iterdir()) == []


def test_dead_or_stuck_paging_thread_is_an_error_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, schedule, x, y = one_page_step()
    monkeypatch.setattr(paging._Worker, "run", lambda self: None)   # the worker exits at once
    error = within(30, lambda: run_schedule(training_stages(model), schedule, x, y, page_dir=tmp_path))
    assert isinstance(error, PagingError) and "died before finishing" in str(error), error
    monkeypatch.undo()

    release = threading.Event()
    monkeypatch.setattr(paging, "_write_bytes", lambda path, data: release.wait())
    monkeypatch.setattr(paging, "_JOIN_S", 0.1)   # do not wait long for the stuck writer
    store = PageStore(tmp_path, io_timeout_s=0.5)
    try:
        error = within(30, lambda: run_schedule(training_stages(model), schedule, x, y, page_dir=store))
    finally:
        release.set()
    assert isinstance(error, PagingError) and "did not finish within 0.5 s" in str(error), error
    assert list(tmp_path.iterdir()) == []

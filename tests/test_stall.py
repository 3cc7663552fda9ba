"""edgetrain.data.stall: DS-Analyzer's three-run differential against known injected costs."""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

from edgetrain.data import (
    ImageFolder,
    StallRow,
    analyze_stalls,
    drop_page_cache,
    generate_synthetic,
    make_step_fn,
    stall_table,
)
from edgetrain.data.stall import recommend_workers

logger = logging.getLogger(__name__)

# Ground truth of the acceptance test, per batch of BATCH samples: each cost is large next to
# the pipeline's own (PNG decode of a 16x16 image ~0.1 ms, DataLoader bookkeeping ~0.1 ms), and
# few in number, so a busy-wait overshooting on a loaded machine moves every share alike.
BATCH = 2
FETCH_PER_SAMPLE_S = 0.010  # throttled reader: mean file bytes / read_bps
PREP_PER_SAMPLE_S = 0.010   # busy-waiting transform
COMPUTE_PER_BATCH_S = 0.020  # busy-waiting step
SHARE_TOLERANCE = 0.10       # absolute share points


def busy_wait(seconds: float) -> None:
    """Hold a CPU for ``seconds`` of wall time, as decoding or a training step would (not sleep)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class BusyTransform:
    """A pre-processing step of known cost; a class (not a lambda) so DataLoader workers can pickle it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        busy_wait(self.seconds)
        return pixels


def busy_step(seconds: float):
    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        busy_wait(seconds)
    return step


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = generate_synthetic(tmp_path_factory.mktemp("stall") / "shapes", samples=100, image_size=16,
                              classes=4, seed=5)
    return root / "train"  # 80 images


def _mean_file_bytes(dataset: ImageFolder) -> float:
    return statistics.mean(path.stat().st_size for path, _ in dataset.samples)


def test_shares_match_injected_fetch_prep_and_compute_costs(images: Path) -> None:
    # Prepare: known costs; workers=0 so nothing overlaps and shares are the true shares
    dataset = ImageFolder(images, image_size=16, transform=BusyTransform(PREP_PER_SAMPLE_S))
    read_bps = _mean_file_bytes(dataset) / FETCH_PER_SAMPLE_S
    fetch_s, prep_s = BATCH * FETCH_PER_SAMPLE_S, BATCH * PREP_PER_SAMPLE_S
    total_s = fetch_s + prep_s + COMPUTE_PER_BATCH_S
    truth = {"fetch": fetch_s / total_s, "prep": prep_s / total_s, "compute": COMPUTE_PER_BATCH_S / total_s}

    # Execute
    report = analyze_stalls(busy_step(COMPUTE_PER_BATCH_S), dataset, BATCH, workers=(0,), batches=30,
                            read_bps=read_bps, seed=0)

    # Assert
    row = report.row(0)
    measured = {"fetch": row.fetch_share, "prep": row.prep_share, "compute": row.compute_share}
    logger.info("shares measured %s vs truth %s; per batch compute %.1f / warm %.1f / cold %.1f ms "
                "(truth %.1f / %.1f / %.1f ms)", measured, truth, 1e3 * row.compute_s, 1e3 * row.warm_s,
                1e3 * row.cold_s, 1e3 * COMPUTE_PER_BATCH_S, 1e3 * (COMPUTE_PER_BATCH_S + prep_s), 1e3 * total_s)
    for stage, share in truth.items():
        assert measured[stage] == pytest.approx(share, abs=SHARE_TOLERANCE), stage
    assert sum(measured.values()) == pytest.approx(1.0)
    # the step busy-waits its 20 ms of wall time, so no less; a load that preempts the loop around it adds time,
    # but not as much as the batch's pre-processing, which a compute run that still transformed would add
    assert COMPUTE_PER_BATCH_S <= row.compute_s < COMPUTE_PER_BATCH_S + prep_s


def test_workers_hide_a_slow_card(images: Path) -> None:
    # Prepare: fetch-dominated (sleeping reads overlap across worker processes)
    dataset = ImageFolder(images, image_size=16)
    read_bps = _mean_file_bytes(dataset) / 0.010  # 10 ms per sample, 40 ms per batch of 4

    # Execute
    report = analyze_stalls(busy_step(0.004), dataset, 4, workers=(0, 2), batches=10, read_bps=read_bps)

    # Assert
    serial, parallel = report.row(0), report.row(2)
    logger.info("cold per batch: %.1f ms with 0 workers, %.1f ms with 2", 1e3 * serial.cold_s, 1e3 * parallel.cold_s)
    assert parallel.cold_s < 0.8 * serial.cold_s
    assert parallel.stall_share < serial.stall_share
    assert serial.fetch_share > 0.6
    assert report.recommended_workers == 2


def test_stall_row_arithmetic_by_hand() -> None:
    row = StallRow(workers=0, batch_size=10, compute_s=0.010, warm_s=0.030, cold_s=0.050)

    assert (row.fetch_stall_s, row.prep_stall_s) == pytest.approx((0.020, 0.020))
    assert (row.fetch_share, row.prep_share, row.compute_share) == pytest.approx((0.4, 0.4, 0.2))
    assert row.stall_share == pytest.approx(0.8) and row.samples_per_s == pytest.approx(200.0)
    assert row.predict_batch_time_s(0.5) == pytest.approx(0.040)  # half the fetches hit a MinIO cache
    assert row.predict_batch_time_s(1.0) == pytest.approx(0.030)


def test_stall_row_clamps_noise_so_shares_stay_a_partition() -> None:
    row = StallRow(workers=1, batch_size=1, compute_s=0.010, warm_s=0.009, cold_s=0.0095)

    assert (row.fetch_share, row.prep_share, row.compute_share) == (0.0, 0.0, 1.0)


def test_recommendation_is_the_fewest_workers_under_the_threshold_else_the_fastest() -> None:
    rows = [StallRow(workers=w, batch_size=1, compute_s=0.010, warm_s=0.010, cold_s=cold)
            for w, cold in [(0, 0.030), (1, 0.0105), (2, 0.0101), (3, 0.0100)]]

    assert recommend_workers(rows, stall_threshold=0.1) == 1
    assert recommend_workers(rows, stall_threshold=0.0) == 3
    assert recommend_workers(rows[:1], stall_threshold=0.1) == 0


def test_report_serialises_and_renders(images: Path) -> None:
    dataset = ImageFolder(images, image_size=16)

    report = analyze_stalls(busy_step(0.001), dataset, 4, workers=(0, 1), batches=3)

    payload = json.loads(json.dumps(report.to_dict()))
    assert [r["workers"] for r in payload["rows"]] == [0, 1]
    assert len(payload["rows"][0]["cold_times_s"]) == 4 and len(payload["compute_times_s"]) == 4
    assert "page cache dropped" in payload["cold_method"] and payload["read_bps"] is None
    console = Console(record=True, width=120)
    console.print(stall_table(report))
    text = console.export_text()
    assert "Recommended workers" in text and "cold ms" in text


@pytest.mark.usefixtures("one_thread")
def test_make_step_fn_trains_a_real_model(images: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 4))
    step = make_step_fn(model, optimizer="sgd", lr=0.05)
    dataset = ImageFolder(images, image_size=16)
    batch = (torch.stack([dataset[i][0] for i in range(16)]), torch.tensor(dataset.targets[:16]))

    losses = [step(batch) for _ in range(10)]
    report = analyze_stalls(step, dataset, 8, workers=(0,), batches=2)

    assert losses[-1] < losses[0]
    assert report.row(0).compute_s > 0


def test_drop_page_cache_accepts_files(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(4096))

    assert drop_page_cache([path]) is hasattr(os, "posix_fadvise")
    assert path.read_bytes()  # still readable, now from storage


@pytest.mark.parametrize("kwargs", [{"workers": ()}, {"workers": (-1,)}, {"batches": 0}])
def test_analyze_stalls_rejects_bad_arguments(images: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        analyze_stalls(busy_step(0.0), ImageFolder(images, image_size=16), 4, **kwargs)  # type: ignore[arg-type]

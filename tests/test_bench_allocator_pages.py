"""The pages of the allocator benchmarks (heap_slack, mmap_threshold) and of federated, from made-up results."""

from __future__ import annotations

from benchmarks import federated, heap_slack, mmap_threshold
from edgetrain.bench.stats import spread

MiB = 2**20


def test_the_heap_slack_page_says_which_threshold_went_over_its_budget() -> None:
    steps = [{"heap_free_bytes": n * MiB, "peak_rss_bytes": 0, "heap_bytes": 0, "mapped_bytes": 0} for n in (3, 9, 5)]
    result = {"model": "m", "batch": 4, "image": 32, "memory": "1MiB", "samples": 64,
              "runs": [{"threshold_bytes": 2**20, "process_peak_bytes": 101 * MiB, "budget_bytes": 100 * MiB,
                        "steps": steps},
                       {"threshold_bytes": 256 * 2**10, "process_peak_bytes": 100 * MiB, "budget_bytes": 100 * MiB,
                        "steps": steps[:1]}]}
    page = heap_slack.render(result)
    assert "| 1 MiB | 3 | 101.0 | 100.0 (over) | 3-9 | 3 → 9 → 5 |" in page
    assert "| 256 KiB | 1 | 100.0 | 100.0 (within) | 3-3 | 3 |" in page   # at the budget is within it
    assert heap_slack.headline(result) == "1 MiB: peak 101.0 MiB of 100.0; 256 KiB: peak 100.0 MiB of 100.0"


def test_the_mmap_threshold_page_gives_each_settings_ratio_to_the_default_in_its_round() -> None:
    def row(setting: str, steps: list[float], ratios: list[float], peak: int) -> dict[str, object]:
        return {"setting": setting, "step_s": spread(steps).to_dict(), "peak_rss_bytes": peak * MiB,
                "ratio_to_default": spread(ratios).to_dict()}
    result = {"model": "m", "batch": 4, "image": 32, "steps": 2, "rounds": 2,
              "rows": [row("default", [0.1, 0.3], [1.0, 1.0], 800), row("262144+thp", [0.2, 0.9], [2.0, 3.0], 700)]}
    page = mmap_threshold.render(result)
    assert "| glibc's default | 200 | 70.7% | 1.00x | 1.00-1.00 | 800 |" in page
    assert "| pinned at 256 KiB, huge pages | 550 | 90.0% | 2.50x | 2.25-2.75 | 700 |" in page
    assert mmap_threshold.headline(result) == ("pinned at 256 KiB with huge pages: 2.50x the default's step time, "
                                               "peak RSS 700 MiB against 800")


def test_the_federated_headline_spans_every_nodes_peak_of_every_round() -> None:
    def node(peak: int) -> dict[str, int]:
        return {"peak_rss_bytes": peak * MiB, "predicted_peak_bytes": 900 * MiB, "budget_bytes": 2**30}
    records = [{"round": 1, "loss": 2.0, "accuracy": 0.5, "train_loss": 2.1, "bytes_down": 10, "bytes_up": 5,
                "time_s": 1.0, "nodes": [node(800), node(850)]},
               {"round": 2, "loss": 1.0, "accuracy": 0.75, "train_loss": 1.1, "bytes_down": 10, "bytes_up": 5,
                "time_s": 1.0, "nodes": [node(700), node(880)]}]
    result = {"nodes": 2, "rounds": 2, "memory": "1GiB", "records": records}
    assert federated.headline(result) == ("2 nodes, 2 rounds under 1GiB: peaks 700.00 MiB-880.00 MiB (predicted "
                                          "900.00 MiB); accuracy 0.75 after round 2")
    assert "| 2 | 1.0000 | 0.750 | 1.1000 | 10 | 5 | 700.00 MiB (900.00 MiB) / 1.00 GiB, " in federated.table(records)

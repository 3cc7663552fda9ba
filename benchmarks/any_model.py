"""Full-size models no one shaped for edgetrain, traced into stages and trained under ``Checkpointed``.

For each model (the issue #17 set at its published size, and the issue's three user models)
at a tiny batch: profile once (FLOP times), then at three budgets (the least feasible, the
middle, keep-all's peak) one step of ``Checkpointed(model, memory=budget, chain=chain)``
against plain autograd from the same weights and RNG state: the worst relative gradient error
``max |g - g_ref| / max |g_ref|`` over the parameters, and the live tensor bytes of a second
step (momentum buffers by then exist) against the plan's predicted peak. One torch thread.

    python benchmarks/any_model.py [--models unet,gpt2] [--out out/any_model.json]

Writes one JSON row per model and budget and prints a table. GPT-2 small's three budgets coincide
at this batch: with SGD its step peaks when every gradient exists (weights, momentum and
gradients, 1.49 GB), above its activations up to about a thousand tokens; its test-size
variant in ``tests/test_edge_models.py`` has three distinct budgets.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from edgetrain.models import densenet121, efficientnet_b0, gpt_decoder, mobilenet_v3_small, stages_of, unet, yolov8
from edgetrain.planners.plan import least_step_bytes
from edgetrain.profile import LiveBytesTracker, profile
from edgetrain.runtime import Checkpointed
from edgetrain.schedule import keep_all, simulate

Case = tuple[nn.Module, torch.Tensor, torch.Tensor]


class SkipCat(nn.Module):
    """Issue #17's skip connection: ``h = relu(a(x)); g = relu(b(h)); c(cat([h, g]))``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.c, self.head = nn.Conv2d(32, 16, 3, padding=1), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        g = torch.relu(self.b(h))
        return self.head(torch.relu(self.c(torch.cat([h, g], 1))).mean((2, 3)))


def _images(batch: int, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))


def _cases() -> dict[str, Callable[[], Case]]:
    def encoder() -> Case:
        layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        model = nn.Sequential(nn.Embedding(1000, 64), nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
                              nn.Flatten(), nn.Linear(64 * 32, 10))
        return model, torch.randint(0, 1000, (8, 32)), torch.randint(0, 10, (8,))

    def cnn() -> Case:
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 16 * 16, 10))
        return (model, *_images(8, 32, 10))

    def gpt2() -> Case:
        tokens = torch.randint(0, 50257, (1, 32))
        return gpt_decoder(), tokens, torch.roll(tokens, -1, 1)

    return {
        "mobilenet_v3_small": lambda: (mobilenet_v3_small(), *_images(4, 64, 1000)),
        "efficientnet_b0": lambda: (efficientnet_b0(), *_images(4, 64, 1000)),
        "densenet121": lambda: (densenet121(), *_images(4, 64, 1000)),
        "unet": lambda: (unet(3, 2), torch.randn(2, 3, 64, 64), torch.randint(0, 2, (2, 64, 64))),
        "yolov8n": lambda: (yolov8(), torch.randn(2, 3, 128, 128), torch.randint(0, 144, (2, 336))),
        "gpt2": gpt2,
        "user_skip_cat": lambda: (SkipCat(), *_images(8, 32, 10)),
        "user_encoder_in_sequential": encoder,
        "user_sequential_cnn": cnn,
    }


def _step_checks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget: int, chain: object) -> dict[str, object]:
    reference, mine = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(0)
    nn.functional.cross_entropy(reference(x), y).backward()
    wrapped = Checkpointed(mine, sample=x, target=y, memory=budget, measure_time=False, chain=chain)  # type: ignore[arg-type]
    torch.manual_seed(0)
    wrapped.step_loss(x, y)
    errors = [((p.grad - r.grad).abs().max() / r.grad.abs().max().clamp_min(1e-30)).item()
              for p, r in zip(mine.parameters(), reference.parameters(), strict=True) if r.grad is not None]
    del reference
    optimizer = torch.optim.SGD(mine.parameters(), lr=0.0, momentum=0.9)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with LiveBytesTracker() as tracker:
        tracker.register(mine.parameters())
        tracker.register(mine.buffers())
        tracker.register([x, y])
        tracker.register(t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor))
        wrapped.step_loss(x, y)
        optimizer.step()
    return {"budget_bytes": budget, "predicted_peak_bytes": wrapped.plan.predicted_peak_bytes,
            "measured_peak_bytes": tracker.peak_bytes,
            "measured_over_predicted": tracker.peak_bytes / wrapped.plan.predicted_peak_bytes,
            "recompute_factor": wrapped.plan.recompute_factor, "forward_advances": wrapped.plan.stats.forward_advances,
            "worst_grad_error": max(errors, default=0.0)}


def run(name: str, build: Callable[[], Case]) -> list[dict[str, object]]:
    torch.manual_seed(0)
    model, x, y = build()
    start = time.perf_counter()
    chain = profile(model, x, y, measure_time=False)
    least, top = least_step_bytes(chain), simulate(chain, keep_all(chain.length)).peak_bytes
    rows = []
    for budget in (least, (least + top) // 2, top):
        row = {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
               "stages": len(stages_of(model)), "input_shape": list(x.shape),
               **_step_checks(model, x, y, budget, chain)}
        rows.append(row)
        print(f"{name:28s} {row['parameters']:>11,d} {row['stages']:>4d} {budget:>12,d} "
              f"{row['predicted_peak_bytes']:>12,d} {row['measured_peak_bytes']:>12,d} "
              f"{row['measured_over_predicted']:.5f} {row['recompute_factor']:.3f} {row['worst_grad_error']:.1e}",
              flush=True)
    print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(_cases()), help="comma-separated names")
    parser.add_argument("--out", default="out/any_model.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = _cases()
    print(f"{'model':28s} {'parameters':>11s} {'stg':>4s} {'budget':>12s} {'predicted':>12s} {'measured':>12s} "
          "meas/pred   rho  grad err")
    rows = [row for name in args.models.split(",") for row in run(name, cases[name])]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

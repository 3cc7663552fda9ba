"""Accuracy against measured memory of each update scheme, on two transfer tasks, with ``auto`` beside them.

Two transfers of a MobileNetV2 (``edgetrain.models.mobilenet_v2``) on 32 px images, batch 64:

* **in situ** (a): the eye-level teacher, trained on crops of the camera world seen from eye level
  (``edgetrain.insitu.world.EYE_LEVEL``), fine-tuned to the node's view (``STEEP``: 8 m up, 60° down) on the
  node's crops with their true labels, scored on crops of other clips of the node;
* **generated → real** (b): a model trained on generated shapes (``edgetrain.data.generate_synthetic``), its head
  replaced, fine-tuned on scikit-learn's bundled handwritten digits (8 x 8, upsampled), scored on held-out digits.

Every scheme fine-tunes the same pretrained weights with the same seed, batches and learning rate (SGD with momentum,
cosine to 0). Its step's memory is measured with the executor (``edgetrain.runtime.check_step``: the c10
allocator's peak of a real step, the second, with the optimizer's state) at the batch and size it trains at,
without recomputation and at the least budget any schedule reaches; the gradients of a planned step equal plain
autograd's (the worst error is shown), so the accuracy does not depend on the budget and each scheme is trained
once. ``auto`` probes every candidate on the first training batches (NOTE [ Contribution analysis ]) and, at
each budget of the sweep, picks among the candidates that fit it; its accuracy is the accuracy of the scheme it
picks.

Usage: ``python -m benchmarks run transfer_accuracy [--quick]`` (needs ``pip install 'edgetrain[transfer]'``).
"""

from __future__ import annotations

import copy
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.insitu.model import augment, to_tensor
from edgetrain.insitu.teacher import crops_with_truth, render_clips
from edgetrain.insitu.world import CLASSES, EYE_LEVEL, STEEP
from edgetrain.models import mobilenet_v2
from edgetrain.models.update import apply_update
from edgetrain.planners.choose import least_step_bytes
from edgetrain.profiling import profile
from edgetrain.runtime import check_step
from edgetrain.runtime.verify import step_peaks
from edgetrain.train.contribution import Probe, pick, probe_data, probe_schemes
from edgetrain.units import format_bytes

log = logging.getLogger("transfer_accuracy")

TITLE = "Fine-tuning less: accuracy against measured memory on two transfer tasks"
BATCH, IMAGE, LR = 64, 32, 0.05
PRETRAIN_LR = 2e-3   # Adam, for the pretraining only: the fine-tuning is the SGD step the memory is measured on
FIXED = ("all", "last:8", "last:4", "last:2", "last:1", "bias")
HEADLINE_RATIO = 6.5      # TinyTL's headline: training memory this many times below full fine-tuning
WITHIN_POINTS = 1.0       # ... at accuracy within this many points of it


@dataclass(frozen=True)
class Sizes:
    eye_clips: int
    node_train_clips: int
    node_test_clips: int
    frames: int
    generated_samples: int
    digits_train: int
    pretrain_epochs: int
    finetune_epochs: int
    probe_steps: int
    schemes: tuple[str, ...]
    least_only: bool    # measure the plain step of full fine-tuning only (the reference), the least of every scheme


FULL = Sizes(eye_clips=24, node_train_clips=6, node_test_clips=4, frames=50, generated_samples=2400,
             digits_train=1200, pretrain_epochs=10, finetune_epochs=8, probe_steps=16, schemes=FIXED, least_only=False)
QUICK = Sizes(eye_clips=4, node_train_clips=3, node_test_clips=1, frames=30, generated_samples=320,
              digits_train=192, pretrain_epochs=2, finetune_epochs=1, probe_steps=2, schemes=("all", "last:1"),
              least_only=True)


@dataclass(frozen=True)
class Task:
    name: str
    model: nn.Module            # pretrained, head fitting the task
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    flips: bool                 # whether a left-right flip keeps the label (crops yes, digits no)
    schemes: tuple[str, ...]    # the fixed schemes, and auto's candidates
    pretrain_seconds: float


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int,
           flips: bool, adam: bool = False) -> nn.Module:
    """SGD with momentum (Adam with ``adam``) over the parameters that train, cosine to 0, full batches of
    ``BATCH``, flipped and brightness-jittered where ``flips``."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr) if adam else torch.optim.SGD(params, lr=lr, momentum=0.9)
    per_epoch = len(x) // BATCH
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs * per_epoch, 1))
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for k in range(per_epoch):
            idx = order[k * BATCH:(k + 1) * BATCH]
            batch = augment(x[idx], gen) if flips else x[idx]
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(batch), y[idx]).backward()
            opt.step()
            sched.step()
    model.eval()
    return model


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    right = sum(int((model(x[k:k + 256]).argmax(1) == y[k:k + 256]).sum()) for k in range(0, len(x), 256))
    return right / len(y)


def _crops(clips: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    labelled = crops_with_truth(clips)
    return to_tensor(labelled.crops), torch.from_numpy(labelled.labels.astype(np.int64))


def insitu_task(sizes: Sizes) -> Task:
    """(a): the eye-level teacher (a MobileNetV2) and the node's crops, train and test from different clips."""
    eye_x, eye_y = _crops(render_clips(EYE_LEVEL, sizes.eye_clips, sizes.frames, 100, rate=0.25))
    node_x, node_y = _crops(render_clips((STEEP,), sizes.node_train_clips, sizes.frames, 5000, rate=0.25))
    test_x, test_y = _crops(render_clips((STEEP,), sizes.node_test_clips, sizes.frames, 6000, rate=0.25))
    log.info("in situ: %d eye-level crops, %d node crops to fine-tune on, %d to test", len(eye_x), len(node_x),
             len(test_x))
    torch.manual_seed(0)
    start = time.perf_counter()
    teacher = _train(mobilenet_v2(num_classes=len(CLASSES)), eye_x, eye_y, sizes.pretrain_epochs, PRETRAIN_LR, 0, True,
                     adam=True)
    return Task("in situ: eye level → node view", teacher, node_x, node_y, test_x, test_y, True, sizes.schemes,
                time.perf_counter() - start)


def _generated(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    from edgetrain.data import generate_synthetic, read_manifest

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "generated"
        generate_synthetic(folder, samples=samples, image_size=IMAGE, classes=10, seed=0)
        manifest = read_manifest(folder)
        assert manifest is not None
        names = manifest["class_names"]
        images, labels = [], []
        for split in ("train", "val"):
            for label, name in enumerate(names):
                for path in sorted((folder / split / name).iterdir()):
                    images.append(np.asarray(Image.open(path).convert("RGB")))
                    labels.append(label)
    return to_tensor(np.stack(images)), torch.tensor(labels, dtype=torch.int64)


def _digits(train: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 bundled 8 x 8 digits, upsampled to ``IMAGE`` px, grey on three channels; a seeded split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0)[:, None]
    x = nn.functional.interpolate(x, size=(IMAGE, IMAGE), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order[:train]], y[order[:train]], x[order[train:]], y[order[train:]]


def generated_task(sizes: Sizes) -> Task:
    """(b): a MobileNetV2 trained on generated shapes, a fresh 10-class head, the digits."""
    gen_x, gen_y = _generated(sizes.generated_samples)
    train_x, train_y, test_x, test_y = _digits(sizes.digits_train)
    log.info("generated → real: %d generated images, %d digits to fine-tune on, %d to test", len(gen_x),
             len(train_x), len(test_x))
    torch.manual_seed(0)
    start = time.perf_counter()
    model = _train(mobilenet_v2(num_classes=10), gen_x, gen_y, sizes.pretrain_epochs, PRETRAIN_LR, 0, True, adam=True)
    seconds = time.perf_counter() - start
    torch.manual_seed(1)
    head = model.classifier[1]
    assert isinstance(head, nn.Linear)
    model.classifier[1] = nn.Linear(head.in_features, 10)   # a new task: a new head, trained from scratch
    schemes = (*sizes.schemes, "bias,classifier")
    return Task("generated → real digits", model, train_x, train_y, test_x, test_y, False, schemes, seconds)


def _memory(model: nn.Module, scheme: str, x: torch.Tensor, y: torch.Tensor, plain: bool) -> dict[str, Any]:
    """The step's predicted and measured peak at the least budget and, with ``plain``, without recomputation."""
    net = copy.deepcopy(model)
    apply_update(net, scheme)
    net.train()
    chain = profile(net, x, y, measure_time=False)
    runs: dict[str, Any] = {"plain": None}
    budgets = [("least", least_step_bytes(chain))]
    if plain:
        budgets.insert(0, ("plain", simulate(chain, keep_all(chain.length)).peak_bytes))
    for label, budget in budgets:
        check = check_step(net, x, y, budget, chain)
        runs[label] = {"budget_bytes": budget, "predicted_peak_bytes": check.predicted_peak_bytes,
                       "measured_peak_bytes": check.measured_peak_bytes, "recompute_factor": check.recompute_factor,
                       "worst_grad_error": check.worst_grad_error}
    runs["trained_bytes"] = sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)
    return runs


def forward_peak(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """The measured peak of one forward of the whole model that records nothing (weights and batch included): the
    least any training step can reach, since every step runs the forward once."""
    net = copy.deepcopy(model).train()
    with torch.no_grad(), step_peaks(net, None, x, y) as peaks:
        net(x)
    return peaks.allocated


def measure_task(task: Task, sizes: Sizes) -> dict[str, Any]:
    """Every fixed scheme's accuracy and memory; auto's probes; the budget sweep."""
    x, y = task.train_x[:BATCH], task.train_y[:BATCH]
    rows = []
    for scheme in task.schemes:
        log.info("%s: %s", task.name, scheme)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)   # the allocator's records see every kernel's scratch only on one thread
        try:
            memory = _memory(task.model, scheme, x, y, plain=scheme == "all" or not sizes.least_only)
        finally:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        net = copy.deepcopy(task.model)
        apply_update(net, scheme)
        accuracy = _accuracy(_train(net, task.train_x, task.train_y, sizes.finetune_epochs, LR, 1, task.flips),
                             task.test_x, task.test_y)
        rows.append({"scheme": scheme, "accuracy": accuracy, "finetune_seconds": time.perf_counter() - start,
                     **memory})
    data = probe_data(task.train_x, task.train_y, BATCH, seed=0)
    probes = probe_schemes(lambda: copy.deepcopy(task.model), data, task.schemes, steps=sizes.probe_steps, lr=LR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        forward = forward_peak(task.model, x, y)
    finally:
        torch.set_num_threads(threads)
    return {"task": task.name, "train": len(task.train_x), "test": len(task.test_x), "forward_peak_bytes": forward,
            "pretrain_seconds": task.pretrain_seconds, "before": _accuracy(task.model, task.test_x, task.test_y),
            "rows": rows, "probes": [_probe_record(p) for p in probes], "probe_steps": sizes.probe_steps,
            }


def _probe_record(probe: Probe) -> dict[str, Any]:
    return {"scheme": probe.scheme, "least_step_bytes": probe.least_step_bytes, "gain": probe.gain,
            "loss_drop": probe.loss_drop, "probe_seconds": probe.probe_seconds}


def sweep(task: dict[str, Any]) -> list[dict[str, Any]]:
    """At each budget (each scheme's measured least peak): the best fixed scheme whose measured least peak fits,
    and the scheme auto picks with its accuracy and measured peak.

    The budgets are measured peaks (at one thread, where the allocator's records see every kernel's scratch), so
    auto's fit test reads each candidate's least by the same instrument: its probe's gain, its measured least.
    """
    rows = task["rows"]
    by_scheme = {r["scheme"]: r for r in rows}
    probes = [Probe(p["scheme"], by_scheme[p["scheme"]]["least"]["measured_peak_bytes"], 0, 0.0, p["gain"],
                    p["loss_drop"], 0.0, p["probe_seconds"], cached=False) for p in task["probes"]]
    points = []
    for budget in sorted({r["least"]["measured_peak_bytes"] for r in rows}):
        fitting = [r for r in rows if r["least"]["measured_peak_bytes"] <= budget]
        best = max(fitting, key=lambda r: r["accuracy"])
        chosen = pick(probes, budget, task["probe_steps"]).scheme
        auto = by_scheme[chosen]
        points.append({"budget_bytes": budget, "best_fixed": best["scheme"], "best_fixed_accuracy": best["accuracy"],
                       "auto": chosen, "auto_accuracy": auto["accuracy"],
                       "auto_measured_peak_bytes": auto["least"]["measured_peak_bytes"]})
    return points


def run(quick: bool) -> dict[str, Any]:
    """Both tasks; the pretraining and fine-tuning at the machine's threads, the memory steps at one."""
    sizes = QUICK if quick else FULL
    tasks = [measure_task(insitu_task(sizes), sizes), measure_task(generated_task(sizes), sizes)]
    return {"batch": BATCH, "image": IMAGE, "lr": LR, "finetune_epochs": sizes.finetune_epochs,
            "pretrain_epochs": sizes.pretrain_epochs, "tasks": tasks, "headline": best_within_a_point(tasks[0])}


def best_within_a_point(task: dict[str, Any]) -> dict[str, Any]:
    """On task (a): the largest measured ratio to full plain at accuracy within a point of full fine-tuning."""
    full = next(r for r in task["rows"] if r["scheme"] == "all")
    reference = full["plain"]["measured_peak_bytes"]
    close = [r for r in task["rows"] if r["accuracy"] >= full["accuracy"] - WITHIN_POINTS / 100]
    best = max(close, key=lambda r: reference / r["least"]["measured_peak_bytes"])
    return {"scheme": best["scheme"], "ratio": reference / best["least"]["measured_peak_bytes"],
            "accuracy": best["accuracy"], "full_accuracy": full["accuracy"],
            "reached": reference / best["least"]["measured_peak_bytes"] >= HEADLINE_RATIO}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _pct(a: float | None) -> str:
    return "-" if a is None else f"{100 * a:.1f}"


def render(result: dict[str, Any]) -> str:
    """Per task: the schemes' accuracy and measured peaks; auto's probes; the budget sweep; then the headline."""
    parts = [f"MobileNetV2 at {result['image']} px, batch {result['batch']}, SGD with momentum at lr {result['lr']} "
             f"(cosine to 0), {result['finetune_epochs']} fine-tuning epochs. *Plain* is the step without "
             "recomputation, *least* the least budget any schedule reaches (ρ its recompute factor); both are the "
             "c10 allocator's measured peak of a real step (the second, with the optimizer's state), and *ratio* "
             "is full fine-tuning's measured plain peak over the scheme's measured least. Accuracy is on held-out "
             "data, in percent."]
    for task in result["tasks"]:
        full = next(r for r in task["rows"] if r["scheme"] == "all")
        reference = full["plain"]["measured_peak_bytes"]
        lines = [f"## {task['task']}\n",
                 f"{task['train']} training and {task['test']} test samples; before fine-tuning the model scores "
                 f"{_pct(task['before'])}%.\n",
                 "| scheme | trains | accuracy | plain: predicted / measured MiB | least: predicted / measured MiB "
                 "| ρ | ratio | worst gradient error |", "|---|---|---|---|---|---|---|---|"]
        for r in task["rows"]:
            plain, least = r["plain"], r["least"]
            error = max(least["worst_grad_error"], 0.0 if plain is None else plain["worst_grad_error"])
            plain_cell = "-" if plain is None else \
                f"{_mib(plain['predicted_peak_bytes'])} / {_mib(plain['measured_peak_bytes'])}"
            lines.append(f"| {r['scheme']} | {format_bytes(r['trained_bytes'])} | {_pct(r['accuracy'])} | "
                         f"{plain_cell} | "
                         f"{_mib(least['predicted_peak_bytes'])} / {_mib(least['measured_peak_bytes'])} | "
                         f"{least['recompute_factor']:.3f} | {reference / least['measured_peak_bytes']:.2f} | "
                         f"{error:.1e} |")
        probe_cost = sum(p["probe_seconds"] for p in task["probes"])
        lines += ["", f"`auto`'s probes ({task['probe_steps']} steps per candidate on a seeded sample of the "
                  f"training batches, scored on others held out; {probe_cost:.1f} s in all, profiling included), gain "
                  "in points of held-out accuracy: "
                  + ", ".join(f"{p['scheme']} {100 * p['gain']:+.1f}" for p in task["probes"]) + ".", "",
                  "| budget MiB | best fixed scheme that fits | its accuracy | auto picks | auto's accuracy | auto's "
                  "measured MiB |", "|---|---|---|---|---|---|"]
        points = sweep(task)
        for point in points:
            auto_peak = point["auto_measured_peak_bytes"]
            lines.append(f"| {_mib(point['budget_bytes'])} | {point['best_fixed']} | "
                         f"{_pct(point['best_fixed_accuracy'])} | {point['auto'] or '-'} | "
                         f"{_pct(point['auto_accuracy'])} | {'-' if auto_peak is None else _mib(auto_peak)} |")
        behind = [p for p in points if p["auto_accuracy"] is not None
                  and p["auto_accuracy"] < p["best_fixed_accuracy"]]
        lines += ["", "Auto is as accurate as the best fixed scheme that fits " +
                  ("at every budget." if not behind else f"at {len(points) - len(behind)} of "
                   f"{len(points)} budgets; behind at " + ", ".join(
                       f"{_mib(p['budget_bytes'])} MiB ({p['auto']} {_pct(p['auto_accuracy'])} against "
                       f"{p['best_fixed']} {_pct(p['best_fixed_accuracy'])})" for p in behind) + ".")]
        parts.append("\n".join(lines))
    head = result["headline"]
    insitu = result["tasks"][0]
    verdict = (f"## Headline\n\nOn the in-situ task, the largest measured ratio at accuracy within "
               f"{WITHIN_POINTS:g} point of full fine-tuning ({_pct(head['full_accuracy'])}%) is "
               f"**{head['ratio']:.2f}x**, by `{head['scheme']}` ({_pct(head['accuracy'])}%): TinyTL's "
               f"{HEADLINE_RATIO}x is {'reached' if head['reached'] else 'not reached'}.")
    if not head["reached"]:
        full = next(r for r in insitu["rows"] if r["scheme"] == "all")
        bound = full["plain"]["measured_peak_bytes"] / insitu["forward_peak_bytes"]
        verdict += (f" Every step runs the whole model's forward once, and that forward alone, recording nothing, "
                    f"peaks at {_mib(insitu['forward_peak_bytes'])} MiB here (measured the same way; weights and batch "
                    f"included): no scheme that keeps PyTorch's forward can go below it, which bounds the ratio at "
                    f"**{bound:.2f}x**. The largest transients are MobileNetV2's expanded tensors of the early "
                    "blocks, alive while their block runs. TinyTL counts the parameters and the activations "
                    "training stores, where the allocator's peak also holds these transients.")
    over = [f"{t['task']} {r['scheme']} {label}" for t in result["tasks"] for r in t["rows"]
            for label in ("plain", "least")
            if r[label] is not None and r[label]["measured_peak_bytes"] > r[label]["predicted_peak_bytes"]]
    parts.append(verdict)
    parts.append("Measured above predicted: " + (", ".join(over) if over else "in no run."))
    return "\n\n".join(parts)

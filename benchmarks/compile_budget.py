"""torch.compile's activation memory budget against edgetrain's plans, on the same model and step.

PyTorch's own answer for any traced model is the min-cut rematerialisation of AOTAutograd's
partitioner, steered by ``torch._functorch.config.activation_memory_budget`` (1.0: save what the
default partitioner saves; lower: recompute more). edgetrain plans checkpointing on a chain of
stages. Each setting runs in its own child process (one torch thread, glibc's mmap threshold
pinned as under a process budget so that freed memory leaves the process and RSS follows the
live memory): a few warm-up steps (compilation for inductor), then ``--steps`` steps, each
ending with ``zero_grad(set_to_none=True)``. Reported per setting, as the median over
``--rounds`` rounds in which the settings alternate:

* ``step_peak_mib``: the peak RSS of the measured steps above the RSS between steps (VmHWM reset
  after warm-up): activations, gradients and temporaries, whatever the process holds at rest;
* ``step_time_ratio``: median step time over eager plain training's in the same round.

    python benchmarks/compile_budget.py [--model resnet18 --batch 8 --image 128 --steps 4 --rounds 2]
        [--settings eager,inductor:1.0,inductor:0.5,inductor:0.1,inductor:0.0,edgetrain:1.1,edgetrain:1.2]

``inductor:B`` compiles with ``activation_memory_budget = B``; ``edgetrain:R`` trains under
``Checkpointed(recompute=R)`` (the least-memory plan within R times plain training's time, from
measured stage times); ``edgetrain+compile:R`` does the same with every block of the model's
``nn.Sequential`` layers (ResNet's residual blocks, MobileNetV2's features) compiled by inductor
first, so that edgetrain's stages get the same kernel fusion. Needs a C compiler for inductor (gcc here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time, torch
from edgetrain.profile.process import configure_allocator, read_process_memory, reset_peak
configure_allocator()
from edgetrain.models import get_model_spec
from edgetrain.optim import make_optimizer
setting, model_name = sys.argv[1], sys.argv[2]
batch, image, steps = (int(a) for a in sys.argv[3:6])
torch.set_num_threads(1)
torch.manual_seed(0)
model = get_model_spec(model_name).build(10)
x, y = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
kind, _, value = setting.partition(":")
if kind == "inductor":
    import torch._functorch.config as functorch_config
    functorch_config.activation_memory_budget = float(value)
    compiled = torch.compile(model)
    def loss_step():
        return torch.nn.functional.cross_entropy(compiled(x), y).backward()
elif kind in ("edgetrain", "edgetrain+compile"):
    from edgetrain.runtime import Checkpointed
    if kind == "edgetrain+compile":  # each block of the model's Sequential layers compiled in place
        for layer in model.children():
            if isinstance(layer, torch.nn.Sequential):
                for index in range(len(layer)):
                    layer[index] = torch.compile(layer[index])
    wrapped = Checkpointed(model, sample=x, target=y, recompute=float(value))
    def loss_step():
        return wrapped.step_loss(x, y)
else:
    def loss_step():
        return torch.nn.functional.cross_entropy(model(x), y).backward()
optimizer = make_optimizer("sgd", model.parameters())
def step():
    loss_step()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
for _ in range(3):
    step()
rest = read_process_memory().rss_bytes
reset_peak()
times = []
for _ in range(steps):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
print(json.dumps({"median_step_s": statistics.median(times),
                  "step_peak_bytes": read_process_memory().peak_rss_bytes - rest, "rest_rss_bytes": rest}))
"""

DEFAULT_SETTINGS = "eager,inductor:1.0,inductor:0.5,inductor:0.1,inductor:0.0,edgetrain:1.1,edgetrain:1.2"


def run_child(setting: str, args: argparse.Namespace) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, setting, args.model, str(args.batch), str(args.image),
                          str(args.steps)], capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", default=DEFAULT_SETTINGS)
    parser.add_argument("--out", default="out/compile_budget.json")
    args = parser.parse_args()
    settings = args.settings.split(",")
    if "eager" not in settings:
        settings.insert(0, "eager")
    rounds: list[dict[str, dict[str, float]]] = []
    for number in range(args.rounds):
        rounds.append({setting: run_child(setting, args) for setting in settings})
        print(f"round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    for setting in settings:
        peaks = [r[setting]["step_peak_bytes"] / 2**20 for r in rounds]
        ratios = [r[setting]["median_step_s"] / r["eager"]["median_step_s"] for r in rounds]
        rows.append({"setting": setting, "step_peak_mib": statistics.median(peaks),
                     "step_peak_mib_range": [min(peaks), max(peaks)], "step_time_ratio": statistics.median(ratios),
                     "step_time_ratio_range": [min(ratios), max(ratios)],
                     "eager_step_s": statistics.median(r["eager"]["median_step_s"] for r in rounds)})
    print(f"{'setting':16s} {'step peak MiB':>14s} {'time / eager':>13s}")
    for row in rows:
        print(f"{row['setting']:16s} {row['step_peak_mib']:14.1f} {row['step_time_ratio']:13.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

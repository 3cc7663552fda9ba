"""What edgetrain adds to a training process beyond PyTorch: resident memory that is not a tensor.

Runs, in alternating child processes, the same small CNN training (SGD with momentum, three
steps, batch 8 at 128 px) as plain PyTorch, with edgetrain's training modules imported, and
with those modules plus edgetrain's allocator setting (``configure_allocator``). Each child
prints its resident memory less the bytes of its weights, buffers, gradients, momentum and
batch: the runtime's own share. ``import torch`` is the resident memory right after importing
PyTorch, for scale.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from typing import Any

CHILD = """
import sys, torch
from torch import nn
if sys.argv[1] == "import torch":  # resident memory right after importing PyTorch, nothing else
    print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS")))
    sys.exit()
if sys.argv[1] != "plain":
    import edgetrain.data, edgetrain.planners, edgetrain.runtime, edgetrain.train
    from edgetrain.profiling.process import configure_allocator
    if sys.argv[1] == "edgetrain+allocator":
        configure_allocator()
net = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 128, 3, 2, 1),
                    nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(8, 3, 128, 128), torch.arange(8)
for _ in range(3):
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(net(x), y).backward()
    optimizer.step()
tensors = [*net.parameters(), *net.buffers(), x, y, *(p.grad for p in net.parameters()),
           *(s["momentum_buffer"] for s in optimizer.state.values())]
held = sum(t.numel() * t.element_size() for t in tensors)
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS"))
print(rss - held)
"""
SETTINGS = ("import torch", "plain", "edgetrain", "edgetrain+allocator")


TITLE = "What edgetrain adds to a training process's resident memory"


def run(quick: bool) -> dict[str, Any]:
    """Each setting's resident memory less its tensors, in alternating child processes, per round."""
    rounds = 2 if quick else 5
    runs: dict[str, list[int]] = {setting: [] for setting in SETTINGS}
    for _ in range(rounds):
        for setting in SETTINGS:
            out = subprocess.run([sys.executable, "-c", CHILD, setting], capture_output=True, text=True, check=True)
            runs[setting].append(int(out.stdout.strip()))
    return {"rounds": rounds, "runtime_bytes": runs}


def render(result: dict[str, Any]) -> str:
    """One row per setting: the median and the range over the rounds, and the difference from plain PyTorch."""
    mib = 2**20
    medians = {setting: statistics.median(values) for setting, values in result["runtime_bytes"].items()}
    rows = [f"| {setting} | {medians[setting] / mib:.1f} | {min(values) / mib:.1f}-{max(values) / mib:.1f} | "
            + ("" if setting == "import torch" else f"{(medians[setting] - medians['plain']) / mib:+.1f}") + " |"
            for setting, values in result["runtime_bytes"].items()]
    return ("The same small CNN's training (SGD with momentum, three steps, batch 8 at 128 px) in a fresh child "
            "process: as plain PyTorch, with edgetrain's training modules imported, and with those modules plus "
            "edgetrain's allocator setting (`configure_allocator`). Each child's resident memory (VmRSS) less the "
            "bytes of its weights, buffers, gradients, momentum and batch is the runtime's own share; `import torch` "
            f"is a process that only imports PyTorch. Medians over {result['rounds']} rounds, the settings "
            "alternating.\n\n"
            "| setting | runtime (MiB) | range (MiB) | beyond plain PyTorch (MiB) |\n|---|---|---|---|\n"
            + "\n".join(rows))

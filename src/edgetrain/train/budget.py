"""A memory budget for the whole training process, turned into a budget for the step's tensors.

NOTE [ Process budget ]
``edgetrain train --memory M`` promises that the training process runs to the end inside
``M`` as the kernel counts it (resident memory; the memory cgroup's charge). The planner counts
tensor bytes, so the process budget is split once the process is up:

* the *runtime baseline*: what the process holds that is not a tensor of the step, measured
  after the data pipeline is open, the model built and one batch profiled (which runs real
  forward and backward passes, so PyTorch's thread pools and kernel caches exist), with freed
  heap returned to the kernel: resident memory minus the bytes of the weights, buffers and
  the profiled batch. Planning runs without numba's JIT (``plan(jit=False)``), which would
  otherwise stay resident at about 100 MiB;
* a *cushion* for what the tensor simulation does not see: kernels' scratch memory and
  allocator slack, ``CUSHION_BYTES`` plus ``CUSHION_FRACTION`` of the tensor peak
  (``python -m benchmarks run process_memory`` trains at budgets from the least up, each in a
  memory cgroup limited to its budget, and reports at every point the process peak beyond the
  baseline and the tensor peak beside this cushion: docs/results/process_memory.md);
* the *tensor budget* the planner gets: what is left.

``Checkpointed(memory=...)`` and ``plan(memory=...)`` keep the tensor meaning; this module is
the explicit process meaning for library users too (:func:`split_process_budget`).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import InfeasibleBudgetError
from ..profiling.process import read_process_memory, return_freed_memory
from ..sysutil.processes import dies_with_this_process
from ..units import format_bytes

if TYPE_CHECKING:
    from ..devices import Device

__all__ = ["ProcessBudget", "measure_runtime_baseline", "split_process_budget", "estimate_runtime_baseline_bytes",
           "device_verdict", "device_tensor_budget", "CUSHION_BYTES", "CUSHION_FRACTION", "FIRST_STEP_BYTES"]

CUSHION_BYTES = 16 * 2**20
CUSHION_FRACTION = 0.10
# What the first training step adds to the runtime (thread pools, kernel caches, autograd's
# engine): 25-30 MiB measured on ResNet-18/MobileNetV2 here. Profiling runs real steps, so a
# baseline measured after it includes this; one measured before any step (``train --plan``)
# adds this allowance instead.
FIRST_STEP_BYTES = 32 * 2**20


@dataclass(frozen=True)
class ProcessBudget:
    """A process budget split into runtime baseline, cushion and what the step's tensors may use."""

    process_bytes: int
    runtime_baseline_bytes: int

    @property
    def tensor_bytes(self) -> int:
        """The largest tensor peak whose process peak stays within the budget."""
        return int((self.process_bytes - self.runtime_baseline_bytes - CUSHION_BYTES) / (1 + CUSHION_FRACTION))

    def predicted_process_bytes(self, tensor_peak_bytes: int) -> int:
        """The process peak a step of this tensor peak is predicted to reach."""
        return self.runtime_baseline_bytes + CUSHION_BYTES + int(tensor_peak_bytes * (1 + CUSHION_FRACTION))

    def infeasible(self, least_tensor_bytes: int) -> InfeasibleBudgetError:
        """The refusal for a step whose least tensor peak does not fit, with every part in bytes."""
        needed = self.predicted_process_bytes(least_tensor_bytes)
        return InfeasibleBudgetError(
            f"budget {format_bytes(self.process_bytes)} ({self.process_bytes} bytes) is below what training needs "
            f"in this process: runtime baseline {format_bytes(self.runtime_baseline_bytes)} "
            f"({self.runtime_baseline_bytes} bytes; Python, PyTorch, data pipeline, measured) + least step "
            f"{format_bytes(least_tensor_bytes)} ({least_tensor_bytes} bytes of tensors) + cushion = "
            f"{format_bytes(needed)} ({needed} bytes)", minimum_bytes=needed, budget_bytes=self.process_bytes)


def measure_runtime_baseline(model: nn.Module, *tensors: torch.Tensor) -> int:
    """Resident bytes of this process that are not ``model``'s weights and buffers or ``tensors``.

    Freed heap is returned to the kernel first, so leftovers of earlier work (profiling) that
    are no longer live do not count.
    """
    return_freed_memory()
    held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers(), *tensors))
    return max(0, read_process_memory().rss_bytes - held)


def split_process_budget(process_bytes: int, runtime_baseline_bytes: int) -> ProcessBudget:
    """The split of ``process_bytes``; refuses a budget above what this process's cgroup allows.

    Raises:
        InfeasibleBudgetError: the memory cgroup's limit is below ``process_bytes`` (the kernel
            would kill the run before the budget is reached).
    """
    limit = read_process_memory().cgroup_limit_bytes
    if limit is not None and limit < process_bytes:
        raise InfeasibleBudgetError(
            f"budget {format_bytes(process_bytes)} ({process_bytes} bytes) is more than this process's memory "
            f"cgroup allows: {format_bytes(limit)} ({limit} bytes); give --memory {limit} or less",
            minimum_bytes=None, budget_bytes=process_bytes)
    return ProcessBudget(process_bytes=process_bytes, runtime_baseline_bytes=runtime_baseline_bytes)


_BASELINE_PROBE = """
from edgetrain.profiling.process import configure_allocator
configure_allocator()
import torch
from edgetrain.data import open_dataset  # the data pipeline's modules, as a training process has them
from edgetrain.train.budget import measure_runtime_baseline
net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                          torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(8, 3, 64, 64), torch.arange(8)
torch.nn.functional.cross_entropy(net(x), y).backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
optimizer.state.clear()
print(measure_runtime_baseline(net, x, y))
"""


@functools.cache
def estimate_runtime_baseline_bytes() -> int:
    """The runtime baseline of a training process on this machine, for verdicts made before training.

    Measured in a fresh child process (so nothing this process loaded, such as numba, counts):
    PyTorch and edgetrain imported, the allocator set up, one training step of a small CNN run
    (thread pools and kernel caches up), then resident memory less its weights and batch. A
    real run measures its own (``runtime_baseline_bytes`` in ``summary.json``), typically
    somewhat higher: its data pipeline is open and its kernels are larger.
    """
    result = subprocess.run([sys.executable, "-c", _BASELINE_PROBE], capture_output=True, text=True, timeout=300,
                            check=True, env={**os.environ, "THP_MEM_ALLOC_ENABLE": "1"},  # as cli.main sets it
                            preexec_fn=dies_with_this_process())
    return int(result.stdout.strip().splitlines()[-1])


def device_verdict(tensor_peak_bytes: int, memory_bytes: int | None, usable_memory_bytes: int | None,
                   runtime_baseline_bytes: int) -> dict[str, object]:
    """Whether a step of ``tensor_peak_bytes`` fits a device as a whole process (NOTE [ Process budget ]).

    The capacity is the device's usable memory (RAM less its OS); where that is unknown, its RAM,
    an upper bound (``os_memory_known`` False).
    """
    capacity = usable_memory_bytes if usable_memory_bytes is not None else memory_bytes
    process = ProcessBudget(0, runtime_baseline_bytes).predicted_process_bytes(tensor_peak_bytes)
    return {"runtime_baseline_bytes": runtime_baseline_bytes, "predicted_process_bytes": process,
            "capacity_bytes": capacity, "os_memory_known": usable_memory_bytes is not None,
            "fits": None if capacity is None else process <= capacity,
            "margin_bytes": None if capacity is None else capacity - process}


def device_tensor_budget(device: Device) -> int:
    """What a training step's tensors may use on ``device``: its usable memory (RAM where unknown) less the
    runtime baseline measured here and the cushion (NOTE [ Process budget ]); at least 1 byte.

    Raises:
        ValueError: the device's memory is unknown.
    """
    capacity = device.usable_memory_bytes if device.usable_memory_bytes is not None else device.memory_bytes
    if capacity is None:
        raise ValueError(f"device {device.name!r} has no known memory size")
    return max(1, ProcessBudget(capacity, estimate_runtime_baseline_bytes()).tensor_bytes)

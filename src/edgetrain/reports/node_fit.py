"""Whether training a few models fits an edge node as a whole process, and the best plan where it does not.

The demo's first table (``edgetrain demo``): each configuration's plain step as a process
(the runtime baseline measured here + the step + the cushion, NOTE [ Process budget ] in
:mod:`edgetrain.train.budget`) against the node's usable memory (RAM where unknown), and, where
it does not fit, the fastest plan within what the node leaves for tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import InfeasibleBudgetError

if TYPE_CHECKING:
    from ..devices import Device

__all__ = ["node_fit_rows", "NODE_FIT_CONFIGS", "DEMO_SQUEEZE"]

# The configuration whose squeeze the demo's training run is put under: ResNet-50 at batch 8 and 500 px.
DEMO_SQUEEZE = ("resnet50", 8, 500)
NODE_FIT_CONFIGS = (("resnet18", 8, 224), ("resnet50", 8, 224), DEMO_SQUEEZE, ("resnet152", 8, 500),
                    ("mobilenet_v2", 32, 224))


def node_fit_rows(node: Device, progress: Callable[[int, int], None] | None = None,
                  configs: tuple[tuple[str, int, int], ...] = NODE_FIT_CONFIGS) -> list[dict[str, Any]]:
    """Plain training of each ``(model, batch, image)`` on ``node`` as a whole process; a plan where it does not fit.

    Args:
        node: the device; its usable memory (RAM where unknown) is the capacity.
        progress: called with ``(done, total)`` as the work advances: after each configuration's estimate, then
            after each one's verdict (and plan), ``2 * len(configs)`` in all.
        configs: the configurations, in the order of the rows.

    Returns:
        One row per configuration: the memory estimate (``model``, ``batch``, ``size``,
        ``total_bytes``, ...), the process verdict (``runtime_baseline_bytes``,
        ``predicted_process_bytes``, ``capacity_bytes``, ``os_memory_known``, ``fits``,
        ``margin_bytes``) and, where it does not fit, ``plan``: the chosen plan with its
        ``predicted_process_bytes``, or ``{"feasible": False, "minimum_bytes", "minimum_process_bytes"}``.
    """
    from ..planners import plan
    from ..profiling import estimate_memory
    from ..train.budget import ProcessBudget, device_verdict, estimate_runtime_baseline_bytes

    capacity = node.usable_memory_bytes if node.usable_memory_bytes is not None else node.memory_bytes
    if capacity is None:
        raise ValueError(f"device {node.name!r} has no known memory size")
    # the baseline is measured in a child process (seconds of start-up): beside the estimates, not before them
    with ThreadPoolExecutor(max_workers=1) as pool:
        probe = pool.submit(estimate_runtime_baseline_bytes)
        estimates = []
        for model, batch, image in configs:
            estimates.append(estimate_memory(model, batch, image))
            if progress is not None:
                progress(len(estimates), 2 * len(configs))
        baseline = probe.result()
    budget = ProcessBudget(capacity, baseline)
    rows = []
    for index, estimate in enumerate(estimates):
        row: dict[str, Any] = {**estimate.to_dict(), **device_verdict(estimate.total_bytes, node.memory_bytes,
                                                                      node.usable_memory_bytes, baseline)}
        if not row["fits"]:
            try:
                chosen = plan(estimate.chain, memory=max(1, budget.tensor_bytes), jit=False)  # no numba in the
                # process that trains next (its ~100 MiB would stay resident)
                row["plan"] = {**chosen.to_dict(),
                               "predicted_process_bytes": budget.predicted_process_bytes(chosen.predicted_peak_bytes)}
            except InfeasibleBudgetError as exc:
                needed = budget.predicted_process_bytes(exc.minimum_bytes or 0)
                row["plan"] = {"feasible": False, "minimum_bytes": exc.minimum_bytes,
                               "minimum_process_bytes": needed}
        rows.append(row)
        if progress is not None:
            progress(len(configs) + index + 1, 2 * len(configs))
    return rows

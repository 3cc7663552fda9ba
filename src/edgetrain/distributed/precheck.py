"""What ``cluster local`` refuses before anything is written: settings no node could run, faults that could not
fire, a batch too small to share, budgets below the least step of a node's share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..train.config import TrainConfig
from .group import ClusterError
from .netns import PRESETS, can_emulate
from .node import NodeSpec, batch_shares, check_speeds, node_speed

if TYPE_CHECKING:
    from .supervisor import LocalOptions

__all__ = ["check_before_work", "generate_data"]


def check_before_work(config: TrainConfig, nodes: Sequence[NodeSpec], options: LocalOptions) -> tuple[NodeSpec, ...]:
    """Refuse, before anything is written, what no node could run; every node with its speed fixed.

    Every node's settings, the link preset, the speeds (some nodes with one and others none), the
    faults (a node that does not exist, a cut without the network emulation), the batch (a share
    for every node) and every budget against the least step of the node's share
    (:func:`_refuse_budgets_below_the_least_step`). Nodes would otherwise each calibrate this
    machine for their speed.

    Raises:
        EdgetrainError: the first refusal, in one line.
    """
    for node in nodes:
        replace(config, device=node.device, memory=node.memory).check()
    if options.preset is not None and options.preset not in PRESETS:  # also where the emulation falls back
        raise ClusterError(f"--preset must be one of {', '.join(PRESETS)}; got {options.preset!r}")
    _check_faults(options, len(nodes))
    rated = tuple(replace(node, rate_flops_per_s=node_speed(node)) for node in nodes)
    check_speeds([node.rate_flops_per_s for node in rated])
    _refuse_budgets_below_the_least_step(config, rated, _first_shares(config, rated, options))
    return rated


def _check_faults(options: LocalOptions, nodes: int) -> None:
    """Refuse a fault that could not fire: on a node that does not exist, a cut without the emulated links."""
    ids = "0" if nodes == 1 else f"0 to {nodes - 1}"
    for fault in options.faults:
        if not 0 <= fault.node < nodes:
            raise ClusterError(f"--{fault.kind} {fault.node}@{fault.at_step}: there is no node {fault.node}; "
                               f"the nodes of --nodes {nodes} are {ids}")
    if any(f.kind == "cut" for f in options.faults) and (options.preset is None or can_emulate() is not None):
        raise ClusterError("a 'cut' fault needs the network emulation (--netns, as root)")


def _classes(config: TrainConfig) -> int:
    """The classes a model is built for before the data is read: the synthetic set's, else the least a dataset has
    (others change only the last layer)."""
    from ..data import SYNTHETIC_CLASSES

    return SYNTHETIC_CLASSES if config.data == "synthetic" else 2


def _first_shares(config: TrainConfig, rated: Sequence[NodeSpec], options: LocalOptions) -> tuple[int, ...]:
    """Every node's share of the global batch in the whole group, as the nodes will split it.

    Raises:
        EdgetrainError: the batch cannot give every node its least share.
    """
    own_norms = not options.node_options().normalises_across_nodes(len(rated)) and _has_batch_norm(config)
    return batch_shares(config.batch, [n.rate_flops_per_s for n in rated], own_norms=own_norms)


def _has_batch_norm(config: TrainConfig) -> bool:
    from torch import nn

    from ..models import get_model_spec

    model = get_model_spec(config.model).build(_classes(config))
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _refuse_budgets_below_the_least_step(config: TrainConfig, rated: Sequence[NodeSpec],
                                         shares: Sequence[int]) -> None:
    """Refuse every node whose budget cannot hold the least step of its share, as its own plan would.

    The least step is profiled here on an example batch of the share's shape. The runtime
    baseline is the one estimated for a fresh training process
    (:func:`~edgetrain.train.budget.estimate_runtime_baseline_bytes`); a node measures its own,
    typically higher, so a budget let through here may still be refused by the node, never one
    the other way round.
    """
    budgets = [replace(config, device=n.device, memory=n.memory).budget_bytes() for n in rated]
    if all(budget is None for budget in budgets):
        return
    from ..models import get_model_spec
    from ..planners.choose import least_step_bytes
    from ..train.budget import ProcessBudget, estimate_runtime_baseline_bytes
    from ..train.loop import profile_batch

    spec = get_model_spec(config.model)
    model = spec.build(_classes(config))
    baseline = estimate_runtime_baseline_bytes()
    least: dict[int, int] = {}
    refusals = []
    for node, (share, budget) in enumerate(zip(shares, budgets, strict=True)):
        if budget is None:
            continue
        if share not in least:
            x, y = spec.example_input(share, config.image), spec.example_target(share, num_classes=_classes(config))
            least[share] = least_step_bytes(profile_batch(model, x, y, replace(config, batch=share)))
        process = ProcessBudget(budget, baseline)
        if process.predicted_process_bytes(least[share]) > budget:
            refusals.append(f"node {node} cannot hold its share of {share} of {config.batch} samples per step: "
                            f"{process.infeasible(least[share])}")
    if refusals:
        raise ClusterError("; ".join(refusals))


def generate_data(config: TrainConfig) -> TrainConfig:
    """Generate the run's data once (nodes would otherwise each write the same synthetic dataset); ``config`` with
    its data root fixed."""
    from ..train.loop import open_run_data

    open_run_data(config, config.run_dir)
    return replace(config, data_root=config.data_root or config.run_dir / "data")

"""The training graph the POET MILP decides on: one step's forward and backward nodes, costed for a device.

:func:`training_graph` builds it from a captured operator DAG (:mod:`edgetrain.profiling.graph`),
:func:`chain_training_graph` from a chain (one node per stage and direction); :func:`coarsen`
merges cheap nodes and :func:`minimum_bytes` is the per-step lower bound on any schedule's peak.
The MILP (:mod:`edgetrain.planners.milp.solve`) and the replay (:mod:`edgetrain.planners.milp.replay`)
both read this model; ``docs/concepts/milp.md`` writes it out.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ...core.chain import Chain, optimizer_memory
from ...costs.energy import EnergyProfile, page_energy_j, page_time_s
from ...errors import EdgetrainError

if TYPE_CHECKING:
    from ...profiling.graph import Graph

__all__ = ["TrainingNode", "TrainingGraph", "training_graph", "chain_training_graph", "coarsen", "minimum_bytes"]


@dataclass(frozen=True)
class TrainingNode:
    """One node of a training graph: a forward operator, or the backward of one.

    ``mem_bytes`` is held from the node's computation until it is freed; ``workspace_bytes`` only
    while it runs. Times and energies are the device's; paging figures are for one transfer of
    ``mem_bytes``.
    """

    name: str
    time_s: float
    energy_j: float
    mem_bytes: int
    deps: tuple[int, ...] = ()
    backward: bool = False
    workspace_bytes: int = 0
    pagein_time_s: float = 0.0
    pagein_energy_j: float = 0.0
    pageout_time_s: float = 0.0
    pageout_energy_j: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "deps", tuple(dict.fromkeys(self.deps)))
        for key in ("time_s", "energy_j", "mem_bytes", "workspace_bytes", "pagein_time_s", "pagein_energy_j",
                    "pageout_time_s", "pageout_energy_j"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"node {self.name!r}: {key} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class TrainingGraph:
    """The data-flow graph of one training step, costed for one device.

    Nodes are in topological order (every dependency has a smaller index); forward nodes may be
    recomputed, backward nodes may not (see NOTE [ Structure the MILP exploits ]).
    ``resident_bytes`` (weights, gradients, optimizer state, the input batch) is added to every
    step's memory.
    """

    nodes: tuple[TrainingNode, ...]
    resident_bytes: int = 0
    name: str = ""
    meta: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise EdgetrainError("a training graph needs at least one node")
        if self.resident_bytes < 0:
            raise EdgetrainError(f"resident_bytes must be >= 0, got {self.resident_bytes}")
        for index, node in enumerate(self.nodes):
            for dep in node.deps:
                if not 0 <= dep < index:
                    raise EdgetrainError(f"node {index} ({node.name}): dependency {dep} breaks topological order")
            if node.backward is False and any(self.nodes[d].backward for d in node.deps):
                raise EdgetrainError(f"forward node {index} ({node.name}) depends on a backward node")

    def __len__(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the nodes that read it, ascending."""
        table: list[list[int]] = [[] for _ in self.nodes]
        for index, node in enumerate(self.nodes):
            for dep in node.deps:
                table[dep].append(index)
        return tuple(tuple(c) for c in table)

    @functools.cached_property
    def need_end(self) -> tuple[int, ...]:
        """For each node, the last stage in which any computation can read it.

        A backward reader runs only in its own stage; a forward reader can be recomputed as late
        as its own value is needed. A node nobody reads has its own index.
        """
        end = list(range(len(self.nodes)))
        for i in reversed(range(len(self.nodes))):
            for c in self.consumers[i]:
                end[i] = max(end[i], c if self.nodes[c].backward else end[c])
        return tuple(end)

    def array(self, key: str) -> np.ndarray:
        """A per-node attribute as a float array (``mem_bytes``, ``energy_j``, ...)."""
        return np.array([getattr(n, key) for n in self.nodes], dtype=float)

    @property
    def compute_energy_j(self) -> float:
        """Energy of every node once: the least any schedule can spend."""
        return sum(n.energy_j for n in self.nodes)

    @property
    def compute_time_s(self) -> float:
        return sum(n.time_s for n in self.nodes)


def _node(name: str, flops_or_time: float, mem_bytes: int, deps: Sequence[int], profile: EnergyProfile, *,
          backward: bool = False, workspace_bytes: int = 0, is_time: bool = False) -> TrainingNode:
    """A node costed on ``profile``: time = FLOPs / rate, compute energy = power x time, POET's paging."""
    time_s = float(flops_or_time) if is_time else float(flops_or_time) / profile.compute_flops_per_s
    return TrainingNode(
        name=name, time_s=time_s, energy_j=profile.compute_power_w * time_s, mem_bytes=int(mem_bytes),
        deps=tuple(deps), backward=backward, workspace_bytes=int(workspace_bytes),
        pagein_time_s=page_time_s(int(mem_bytes), profile, "in"),
        pagein_energy_j=page_energy_j(int(mem_bytes), profile, "in"),
        pageout_time_s=page_time_s(int(mem_bytes), profile, "out"),
        pageout_energy_j=page_energy_j(int(mem_bytes), profile, "out"))


def _alias_groups(graph: Graph) -> list[int]:
    """The node whose storage each graph node's result lives in (itself unless it aliases).

    A view or in-place op (``aliases_input``) shares the storage of its first input, so it is
    merged with that input's group: one value, one size. Giving the alias zero bytes while
    letting its producer be freed would be optimistic (the storage stays alive through the alias).
    """
    root = list(range(len(graph.nodes)))
    for index, node in enumerate(graph.nodes):
        if node.aliases_input and node.inputs:
            root[index] = root[node.inputs[0]]
    return root


def training_graph(graph: Graph, profile: EnergyProfile, *, optimizer: str = "sgd",
                   small_saved_bytes: int = 65536, memory_bps: float | None = None) -> TrainingGraph:
    """The training graph of an operator DAG: a forward node per operator, a backward per trainable one.

    Conventions (each never optimistic):

    * ``input`` nodes (the batch, the targets) are resident for the whole step, as in a chain.
    * An aliasing node (view, in-place op) joins the group of the value it aliases
      (:func:`_alias_groups`); a group is one forward node whose compute is the sum of its
      members' and whose value is the group's storage.
    * A forward node holds its output plus the extra tensors its operator saves for backward
      (``saved_bytes``: BatchNorm's statistics, max-pool indices, ...): recomputing the node
      recreates both. Extras of at most ``small_saved_bytes`` are instead counted as resident for
      the whole step, so the backward need not keep the node's output alive for them.
    * Backward of group ``v`` depends on the backward of every consumer group that needs
      gradients, on the forward of each saved input, and on ``v``'s own forward when its output
      or large extras are saved. It holds the gradients it produces, one per input group that
      needs one (the size of that input's output).
    * Weights, their gradients and the optimizer state (``optimizer``, as for a chain) are resident.

    Args:
        graph: a captured operator graph (:func:`edgetrain.profiling.graph.capture_graph`).
        profile: the device the costs are for.
        optimizer: ``"sgd"`` (momentum) or ``"adam"``.
        small_saved_bytes: saved extras this small are resident rather than attached to the node.
        memory_bps: if given, a node takes at least the time to read its inputs and write its
            output at this many bytes/s (twice that traffic for a backward). FLOP counts give
            elementwise operators (BatchNorm, ReLU, add) zero cost, which makes recomputing them
            free; this is an *assumed* roofline floor, not a device figure.
    """
    nodes = graph.nodes
    root = _alias_groups(graph)
    is_input = [n.kind == "input" for n in nodes]
    group_input = {g: is_input[g] for g in set(root)}
    groups = [g for g in dict.fromkeys(root) if not group_input[g]]
    members: dict[int, list[int]] = {g: [] for g in groups}
    resident = sum(n.out_bytes for i, n in enumerate(nodes) if is_input[i] and root[i] == i)
    params = sum(n.param_bytes for n in nodes)
    for i in range(len(nodes)):
        if group_input[root[i]]:
            continue
        members[root[i]].append(i)

    def ext_inputs(g: int) -> list[int]:
        found = {root[u] for m in members[g] for u in nodes[m].inputs}
        return sorted(u for u in found if u != g and not group_input[u])

    requires_grad: dict[int, bool] = {}
    for g in groups:
        requires_grad[g] = any(nodes[m].param_bytes > 0 for m in members[g]) or any(
            requires_grad[u] for u in ext_inputs(g))
    extras_attached: dict[int, int] = {}
    for g in groups:
        extras = sum(nodes[m].saved_bytes for m in members[g])
        if extras <= small_saved_bytes:
            resident += extras
            extras = 0
        extras_attached[g] = extras
    state, _ = optimizer_memory(optimizer, params, 0, 0)
    resident += 2 * params + state

    def flops(g: int, key: str, traffic: int) -> float:
        """FLOPs of the group, raised to the roofline floor of ``memory_bps`` if given."""
        total = float(sum(getattr(nodes[m], key) for m in members[g]))
        if memory_bps is None:
            return total
        moved = traffic * sum(nodes[u].out_bytes for u in ext_inputs(g)) + traffic * nodes[g].out_bytes
        return max(total, moved / memory_bps * profile.compute_flops_per_s)

    fwd_index = {g: k for k, g in enumerate(groups)}
    out: list[TrainingNode] = []
    for g in groups:
        mem = nodes[g].out_bytes + extras_attached[g]
        out.append(_node(nodes[g].name, flops(g, "fwd_flops", 1), mem,
                         [fwd_index[u] for u in ext_inputs(g)], profile))
    consumers: dict[int, set[int]] = {g: set() for g in groups}
    for g in groups:
        for u in ext_inputs(g):
            consumers[u].add(g)
    backward_groups = [g for g in reversed(groups) if requires_grad[g]]
    bwd_index = {g: len(groups) + k for k, g in enumerate(backward_groups)}
    for g in backward_groups:
        saved = {root[u] for m in members[g] for u in nodes[m].saved_inputs}
        own = (extras_attached[g] > 0 or any(nodes[m].output_saved for m in members[g]) or g in saved)
        deps = [bwd_index[c] for c in sorted(consumers[g]) if requires_grad[c]]
        deps += [fwd_index[u] for u in sorted(saved) if u != g and not group_input[u]]
        if own:
            deps.append(fwd_index[g])
        grads = sum(nodes[u].out_bytes for u in ext_inputs(g) if requires_grad[u])
        out.append(_node(f"{nodes[g].name}.backward", flops(g, "bwd_flops", 2), grads,
                         sorted(set(deps)), profile, backward=True))
    return TrainingGraph(tuple(out), resident_bytes=int(resident), name=graph.name,
                         meta={"source": "graph", "device": profile.device_name, "optimizer": optimizer,
                               "n_forward": len(groups)})


def chain_training_graph(chain: Chain, profile: EnergyProfile) -> TrainingGraph:
    """The training graph of a chain: ``F_0..F_{L-1}`` then ``B_{L-1}..B_0``.

    Stage times must already be the device's (:func:`edgetrain.costs.energy.scale_chain`). ``F_i``
    holds the stage's record, ``max(out_bytes, saved_bytes)`` (the record includes ``x_{i+1}``;
    counting only ``out_bytes`` would forget autograd's other saved tensors), with the forward
    workspace. ``B_i`` holds ``δ_i`` (``value_bytes[i]``; nothing for ``i = 0``: the input needs no
    gradient) and depends on ``B_{i+1}``, on ``F_i`` when the record keeps its output or saves
    anything else, and on ``F_{i-1}`` (``x_i``) when it keeps its input and ``i > 0`` (``x_0`` is
    resident). Resident: the chain's resident bytes plus all parameter gradients.
    """
    length = chain.length
    nodes: list[TrainingNode] = []
    for i, s in enumerate(chain.stages):
        nodes.append(_node(f"F{i}", s.fwd_time_s, max(s.out_bytes, s.saved_bytes), [i - 1] if i else [], profile,
                           workspace_bytes=max(s.fwd_workspace_bytes, s.rec_workspace_bytes), is_time=True))
    for i in reversed(range(length)):
        s = chain.stages[i]
        deps = [] if i == length - 1 else [length + (length - 2 - i)]
        if s.output_saved or s.saved_bytes > s.out_bytes:
            deps.append(i)
        if s.input_saved and i > 0:
            deps.append(i - 1)
        nodes.append(_node(f"B{i}", s.bwd_time_s, chain.value_bytes[i] if i > 0 else 0, sorted(deps), profile,
                           backward=True, workspace_bytes=max(s.bwd_workspace_bytes, 0), is_time=True))
    return TrainingGraph(tuple(nodes), resident_bytes=chain.resident_bytes + chain.gradients_bytes,
                         name=chain.name, meta={"source": "chain", "device": profile.device_name,
                                                "n_forward": length})


def coarsen(tg: TrainingGraph, *, max_time_s: float = 0.0) -> TrainingGraph:
    """Merge each cheap forward node into its only reader when no backward needs it.

    A forward node ``u`` with ``time_s <= max_time_s`` whose only dependent is the forward node
    ``v`` is folded into ``v``: the merged node computes both, holds ``v``'s value and, while it
    runs, ``u``'s value as workspace (``max(m_u + w_u - m_v, m_u + w_v)``), so its memory is never
    under-counted. What is lost: schedules that keep ``u`` without ``v`` (cheaper recomputation of
    ``v`` alone), which for ``time_s(u) = 0`` only ever save ``m_u`` bytes between stages; every
    stage removed shrinks the MILP quadratically. Loses nothing when ``m_u`` is 0.
    """
    nodes = list(tg.nodes)
    consumers = [list(c) for c in tg.consumers]
    merged_into = list(range(len(nodes)))
    for u in range(len(nodes)):
        cu = consumers[u]
        if nodes[u].backward or len(cu) != 1 or nodes[u].time_s > max_time_s:
            continue
        v = cu[0]
        if nodes[v].backward:
            continue
        nu, nv = nodes[u], nodes[v]
        work = max(nu.mem_bytes + nu.workspace_bytes - nv.mem_bytes, nu.mem_bytes + nv.workspace_bytes, 0)
        deps = tuple(sorted((set(nv.deps) - {u}) | set(nu.deps)))
        nodes[v] = replace(nv, name=f"{nu.name}+{nv.name}", time_s=nu.time_s + nv.time_s,
                           energy_j=nu.energy_j + nv.energy_j, deps=deps, workspace_bytes=int(work))
        for d in nu.deps:
            consumers[d] = sorted((set(consumers[d]) - {u}) | {v})
        merged_into[u] = v
    keep = [i for i in range(len(nodes)) if merged_into[i] == i]
    new_index = {old: k for k, old in enumerate(keep)}
    out = tuple(replace(nodes[i], deps=tuple(sorted({new_index[d] for d in nodes[i].deps}))) for i in keep)
    return TrainingGraph(out, resident_bytes=tg.resident_bytes, name=tg.name,
                         meta={**tg.meta, "coarsened_from": len(tg.nodes)})


def minimum_bytes(tg: TrainingGraph) -> int:
    """A lower bound on any schedule's peak: the largest single computation's need.

    Computing node ``k`` needs the resident bytes, all of ``k``'s inputs, its output and its
    workspace at once. With paging every budget at or above this bound is feasible (see
    :func:`paging_schedule`), so it is then the exact minimum.
    """
    mem = [n.mem_bytes for n in tg.nodes]
    return tg.resident_bytes + max(n.mem_bytes + n.workspace_bytes + sum(mem[d] for d in n.deps)
                                   for n in tg.nodes)

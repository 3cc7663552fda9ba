"""Recomputation inside a coarse stage: cut its graph where several tensors pass, checkpoint each piece.

NOTE [ Blocks planned inside ]
A traced chain is cut only where *one* tensor passes (NOTE [ Traced stages ]), so a region
spanned by skips -- a DenseNet dense block, a U-Net's inner levels under its outer skip -- is one
stage, and the chain can only keep or recompute all of it: its backward needs everything it
saved at once, which sets the chain's least feasible budget. So is an ``nn.TransformerEncoderLayer``
that a model's ``stages()`` gives whole (the zoo's encoder): it is traced for this.

Inside such a stage the graph has more cut points if a cut may carry several tensors: after
op ``i`` the *live set* is every value made at or before ``i`` that an op after ``i`` reads
(the set of tensors crossing that topological cut). :func:`segmented_stage` cuts the stage
there into *segments*, each an ``fx.GraphModule`` from the values it reads to the values it
makes that later segments (or the output) read, and returns a :class:`SegmentedStage` that
runs them in order, each under ``torch.utils.checkpoint`` (non-reentrant) when autograd
records. So the stage's recorded forward saves only the segments' inputs (each tensor once,
however many cuts it crosses), and its backward recomputes one segment at a time. For the
chain this is one stage with the same input and output, smaller ``saved_bytes``, a backward
that costs one more forward, and backward workspace of one segment's internals; the profiler
measures these like any stage's, so the chain's planners, simulator and executor need nothing new.
Whether the stage or its segmented twin serves at a budget is the outer planner's choice
(``planners/blocks.py``): a two-level schedule, with the inner level fixed (recompute every
segment once) and the outer level the chain's DP.

Cuts are chosen on sizes measured by running the stage once (no autograd, statistics frozen,
RNG forked): for each limit ``T`` on a segment's new bytes, greedily the furthest cut within
``T``; of those, the cuts whose saved live values plus the largest segment are least. A cut
is allowed only where every live value is a tensor that no later op changes in place (as
between stages). A recomputed segment that draws random numbers (noted in the sizing run) replays
the RNG state of its first forward, which the stage keeps as the executor keeps a recomputed stage's
(torch's ``preserve_rng_state`` would keep one for every segment, and unseen); a segment that draws
none keeps no state. Every segment runs its norm layers at momentum 0 (``frozen_statistics``), so
dropout masks and running statistics are plain autograd's. The states a recorded stage keeps are
made outside the dispatcher: the stage says how many (``kept_rng_states``), the profiler counts them
in its record and the trackers are shown them (NOTE [ Generator states in the plan ] in ``schedule.py``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils.checkpoint import checkpoint

from ..autograd.norm_statistics import frozen_statistics
from ..autograd.rng_state import RandomDraws, RngState, replayed_rng
from .traced import is_scalar_node, mutates, traced_module

__all__ = ["SegmentedStage", "segmented_stage", "segmented_stages"]

MAX_SEGMENTS = 64  # segment counts tried per stage


@dataclass(frozen=True)
class _Segment:
    module: fx.GraphModule
    reads: tuple[int, ...]   # value ids it takes, in order
    makes: tuple[int, ...]   # value ids it returns, in order
    drops: tuple[int, ...]   # value ids no later segment reads, released after it
    draws: bool              # it draws random numbers: its recomputation replays the generator's state


class SegmentedStage(nn.Module):
    """A stage run as segments, each checkpointed while autograd records (NOTE [ Blocks planned inside ])."""

    def __init__(self, segments: Sequence[_Segment], result: int, name: str) -> None:
        super().__init__()
        self.pieces = nn.ModuleList(segment.module for segment in segments)
        self._segments = tuple(segments)
        self._result = result
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values: dict[int, torch.Tensor] = {0: x}
        recording, counted = torch.is_grad_enabled(), x.device.type == "cpu"
        for segment in self._segments:
            args = [values[k] for k in segment.reads]
            if recording:
                # the state its recomputation replays, kept (and on CPU shown to the trackers) as the executor's
                state = RngState.capture(counted) if segment.draws else None
                made = checkpoint(segment.module, *args, use_reentrant=False, preserve_rng_state=False,
                                  context_fn=_recompute_context(segment.module, state, counted))
            else:
                made = segment.module(*args)
            del args
            values.update(zip(segment.makes, made, strict=True))
            for k in segment.drops:
                del values[k]
        return values[self._result]

    @property
    def kept_rng_states(self) -> int:
        """Generator states a record of the stage keeps until its backward: one per segment that draws."""
        return sum(segment.draws for segment in self._segments)

    @property
    def inputs_per_segment(self) -> tuple[int, ...]:
        """How many tensors cross into each segment (more than one where a cut carries several)."""
        return tuple(len(segment.reads) for segment in self._segments)

    def extra_repr(self) -> str:
        return f"{self.name}: {len(self._segments)} segments"


def _recompute_context(module: nn.Module, state: RngState | None, counted: bool) -> Any:
    return lambda: (contextlib.nullcontext(), _recomputing(module, state, counted))


@contextlib.contextmanager
def _recomputing(module: nn.Module, state: RngState | None, counted: bool) -> Iterator[None]:
    """A segment's recomputation: statistics frozen, the random numbers of its first forward drawn again."""
    replayed = replayed_rng(state, counted) if state is not None else contextlib.nullcontext()
    with frozen_statistics(module), replayed:
        yield


def segmented_stages(stages: Sequence[nn.Module], x: torch.Tensor) -> list[nn.Module]:
    """``stages`` with each traced stage (or ``nn.TransformerEncoderLayer``) that cuts into several segments
    replaced by its :class:`SegmentedStage`.

    Args:
        stages: a chain of stages (:func:`~edgetrain.models.stages_of`), without the loss.
        x: a sample input batch of the chain.

    Returns:
        As many stages, composing to the same function, sharing the same parameters.
    """
    result: list[nn.Module] = []
    with _unrecorded(nn.ModuleList(stages)):
        for stage in stages:
            graph = _graph_of(stage)
            twin = segmented_stage(graph, x) if graph is not None else None
            result.append(stage if twin is None else twin)
            x = stage(x)
    return result


def _graph_of(stage: nn.Module) -> fx.GraphModule | None:
    """A traced stage, or an encoder layer given whole by ``stages()``, as a graph; None for other stages.

    A user module given whole is not traced: its forward may read Python flags a trace would fix.
    """
    if isinstance(stage, fx.GraphModule):
        return stage
    if isinstance(stage, nn.TransformerEncoderLayer):
        return traced_module(stage)
    return None


@contextlib.contextmanager
def _unrecorded(module: nn.Module) -> Iterator[None]:
    """Run ``module`` for sizes only: no autograd, running statistics and the RNG as they were."""
    with torch.no_grad(), torch.random.fork_rng(), frozen_statistics(module):
        yield


def segmented_stage(stage: fx.GraphModule, x: torch.Tensor) -> SegmentedStage | None:
    """``stage`` cut where several tensors pass, or None when no cut lowers what its backward holds."""
    graph = _Graph(stage, x)
    cuts = graph.best_cuts()
    if not cuts:
        return None
    return SegmentedStage(graph.segments(cuts), graph.result, type(stage).__name__)


class _Graph:
    """A traced stage's ops in order, with each value's size, last reader and the allowed cuts."""

    def __init__(self, stage: fx.GraphModule, x: torch.Tensor) -> None:
        self.stage = stage
        self.nodes = [n for n in stage.graph.nodes if n.op not in ("get_attr", "output")]
        output = next(n for n in stage.graph.nodes if n.op == "output")
        self.result_node: fx.Node = output.args[0]
        self.position = {node: i for i, node in enumerate(self.nodes)}
        end = len(self.nodes)
        self.last_use = [max((self.position.get(user, end) for user in node.users), default=-1)
                         for node in self.nodes]
        self.last_use[self.position[self.result_node]] = end
        self.storage, self.nbytes, self.is_tensor, self.draws = _sizes(stage, x, self.nodes)
        self.result = self.position[self.result_node]
        # bytes of storages first made at each position: what a segment's ops hold for backward, roughly
        seen: set[int] = set()
        self.new_bytes = [0] * end
        for i in range(end):
            if self.is_tensor[i] and self.storage[i] not in seen:
                seen.add(self.storage[i])
                self.new_bytes[i] = self.nbytes[i]
        self.prefix = [0]
        for size in self.new_bytes:
            self.prefix.append(self.prefix[-1] + size)
        self.live = [[k for k in range(i + 1) if self.last_use[k] > i] for i in range(end)]
        # storages changed in place at each position (through any view of them)
        self.mutated = [self.storage[self.position[n.args[0]]]
                        if mutates(stage, n) and n.args and n.args[0] in self.position else None for n in self.nodes]
        self.allowed = [i for i in range(1, end - 1) if self._can_cut(i)]  # position 0 is the input

    def _grown(self, after: int, upto: int) -> int:
        """New bytes of the ops after position ``after`` up to ``upto``."""
        return self.prefix[upto + 1] - self.prefix[after + 1]

    def _can_cut(self, i: int) -> bool:
        """Every live value a tensor whose storage no later op changes in place (a segment's
        recomputation reads its inputs as they were)."""
        if any(not self.is_tensor[k] or is_scalar_node(self.nodes[k]) for k in self.live[i]):
            return False
        changed_later = {key for key in self.mutated[i + 1:] if key is not None}
        return not any(self.storage[k] in changed_later for k in self.live[i])

    def held_bytes(self, cuts: Sequence[int]) -> int:
        """Live values saved at the cuts (each storage once) plus the largest segment's new bytes: an
        estimate of what the stage's backward holds beside its input, to choose cuts by."""
        saved = {self.storage[k]: self.nbytes[k] for c in cuts for k in self.live[c] if k > 0}  # not the input
        bounds = [0, *cuts, len(self.nodes) - 1]
        return sum(saved.values()) + max(self._grown(a, b) for a, b in itertools.pairwise(bounds))

    def best_cuts(self) -> list[int]:
        """The greedy cuts of the limit that holds least; empty when no cuts beat the whole stage."""
        total = self._grown(0, len(self.nodes) - 1)
        best: list[int] = []
        best_held = self.held_bytes([])
        for pieces in range(2, MAX_SEGMENTS + 1):
            cuts = self._greedy(total / pieces)
            held = self.held_bytes(cuts)
            if cuts and held < best_held:
                best, best_held = cuts, held
        return best

    def _greedy(self, limit: float) -> list[int]:
        """Each cut the furthest allowed one whose segment grows at most ``limit`` (or the nearest, if none)."""
        cuts: list[int] = []
        start, previous = 0, None
        for i in self.allowed:
            if self._grown(start, i) > limit:
                cut = i if previous is None else previous
                cuts.append(cut)
                start, previous = cut, None
                if cut == i:
                    continue
            previous = i
        return cuts

    def segments(self, cuts: Sequence[int]) -> list[_Segment]:
        bounds = [0, *cuts, len(self.nodes) - 1]
        pieces = [self._segment(a, b) for a, b in itertools.pairwise(bounds)]
        read_last = {k: j for j, (_, reads, _) in enumerate(pieces) for k in reads}
        return [_Segment(module, reads, makes,
                         tuple(k for k in (*reads, *makes) if read_last.get(k, -1) <= j and k != self.result),
                         any(self.draws[a + 1:b + 1]))
                for j, ((module, reads, makes), (a, b)) in enumerate(zip(pieces, itertools.pairwise(bounds),
                                                                         strict=True))]

    def _segment(self, after: int, upto: int) -> tuple[fx.GraphModule, tuple[int, ...], tuple[int, ...]]:
        """The ops after position ``after`` up to ``upto``: a module from the values they read to those read later."""
        body = self.nodes[after + 1:upto + 1]
        reads = sorted({self.position[arg] for node in body for arg in node.all_input_nodes
                        if arg in self.position and self.position[arg] <= after})
        makes = [k for k in range(after + 1, upto + 1) if self.last_use[k] > upto]
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {self.nodes[k]: graph.placeholder(f"v{k}") for k in reads}

        def mapped(node: fx.Node) -> fx.Node:
            if node not in env:  # a parameter or buffer read
                env[node] = graph.node_copy(node)
            return env[node]

        for node in body:
            env[node] = graph.node_copy(node, mapped)
        graph.output(tuple(env[self.nodes[k]] for k in makes))
        return fx.GraphModule(self.stage, graph, class_name="Segment"), tuple(reads), tuple(makes)


def _sizes(stage: fx.GraphModule, x: torch.Tensor,
           nodes: list[fx.Node]) -> tuple[list[int], list[int], list[bool], list[bool]]:
    """Storage key, storage bytes and tensor-ness of each node's value, and whether it drew random numbers,
    from one run of the stage."""
    values: dict[fx.Node, Any] = {}
    draws: dict[fx.Node, bool] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            with RandomDraws() as watched:
                value = super().run_node(n)
            values[n], draws[n] = value, watched.drew
            return value

    with _unrecorded(stage):
        _Recorder(stage).run(x)
    storage: list[int] = []
    nbytes: list[int] = []
    is_tensor: list[bool] = []
    for node in nodes:
        value = values[node]
        tensor = isinstance(value, torch.Tensor)
        is_tensor.append(tensor)
        storage.append(value.untyped_storage().data_ptr() if tensor else -1 - len(storage))
        nbytes.append(value.untyped_storage().nbytes() if tensor else 0)
    return storage, nbytes, is_tensor, [draws[node] for node in nodes]

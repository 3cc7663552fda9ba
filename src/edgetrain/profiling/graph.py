"""A model's training step as a DAG of operator nodes with costs, for graph-aware planners.

A chain (``chain.py``) hides ResNet's skip connections and the transformer's residuals inside
stages. A planner that decides per value whether to keep, recompute or page it (POET: Patil
et al., "POET: Training Neural Networks on Tiny Devices with Integrated Rematerialization and
Paging", ICML 2022) needs the real data-flow graph, so :func:`capture_graph` traces the model
with ``torch.fx`` and costs every operator node on the meta device (nothing is allocated).

NOTE [ Graph granularity ]
Nodes are the ``call_module``, ``call_function`` and ``call_method`` nodes of a
``torch.fx.symbolic_trace``-style trace, plus one ``input`` node per model input and, when a loss
is asked for, a ``target`` input and a ``loss`` node. Built-in ``torch.nn`` modules (Conv2d,
BatchNorm2d, ReLU, Linear, LayerNorm, Dropout, Embedding, MultiheadAttention, ...) are leaf
nodes, fx's default: each is one fused kernel-sized operator whose saved tensors autograd manages
as a unit. ``nn.TransformerEncoderLayer`` in training mode is traced *through* (its training
path, ``norm(x + sa(x))`` then ``norm(x + ff(x))``), so each encoder layer shows its two
residual adds; in eval mode it stays a leaf, because its forward may take a fused inference
kernel. A user module whose forward branches on a traced value (e.g. a length check) cannot be
traced symbolically; it becomes a leaf automatically and is listed in ``Graph.meta
["auto_leaves"]``. Nodes whose result holds no tensor (``x.shape``, ``size[1]``) are dropped:
they only carry shapes, which are static here.

NOTE [ Node costs ]
Each node is run alone on meta tensors, its inputs replaced by fresh leaves that require grad
exactly when the value does in the real forward:

* ``out_bytes``    -- storages of the node's result (for a view or in-place op they are the
  input's storage: ``aliases_input`` is then True and the node adds no memory).
* ``fwd_flops`` / ``bwd_flops`` -- ``FlopCounterMode`` over the forward and over
  ``autograd.grad`` of the result (input gradients where needed, and parameter gradients).
* ``param_bytes``  -- parameters first used by this node (shared weights count once).
* ``saved_bytes``  -- storages autograd saves (``saved_tensors_hooks``) that the node itself
  created and that are not its output: BatchNorm's batch statistics, a dropout mask,
  attention's intermediates. Saved inputs and a saved output are reported separately, as
  ``saved_inputs`` (node indices) and ``output_saved``, because whether they stay alive is
  exactly what a planner decides.
"""

from __future__ import annotations

import functools
import json
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode

from ..errors import EdgetrainError
from ..models.stages import LossFn
from ..sysutil.fileio import write_atomic
from .tracker import SavedTensors, storage_bytes, storage_key

__all__ = ["GraphNode", "Graph", "capture_graph"]

log = logging.getLogger(__name__)

_GRAPH_VERSION = 1


@dataclass(frozen=True)
class GraphNode:
    """One operator of a captured graph. Sizes in bytes, compute in FLOPs (multiply-add = 2).

    ``op`` names the operator (``"Conv2d"``, ``"add"``, ``"iadd"``, ``"flatten"``, ``"input"``,
    ``"loss"``); ``kind`` is where it came from (``"input"``, ``"call_module"``,
    ``"call_function"``, ``"call_method"``, ``"get_attr"``, ``"loss"``); ``target`` is the module's
    qualified name or the function's name. ``inputs`` are indices of predecessor nodes, in the
    order the operator takes them (a node used twice appears once).
    """

    name: str
    op: str
    inputs: tuple[int, ...]
    out_bytes: int
    fwd_flops: int
    bwd_flops: int
    param_bytes: int
    saved_bytes: int
    kind: str = "call_function"
    target: str = ""
    saved_inputs: tuple[int, ...] = ()
    output_saved: bool = False
    aliases_input: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "saved_inputs", tuple(self.saved_inputs))
        for name in ("out_bytes", "fwd_flops", "bwd_flops", "param_bytes", "saved_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"node {self.name!r}: {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Graph:
    """A DAG of :class:`GraphNode` in topological order (every input index is smaller).

    Example:
        >>> graph = capture_graph(resnet18(), torch.empty(2, 3, 64, 64, device="meta"))
        >>> sum(1 for n in graph.nodes if n.op in ("add", "iadd"))
        8
    """

    nodes: tuple[GraphNode, ...]
    outputs: tuple[int, ...] = ()
    name: str = ""
    meta: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """``(producer, consumer)`` pairs, ordered by consumer then by argument position."""
        return tuple((src, dst) for dst, node in enumerate(self.nodes) for src in node.inputs)

    def successors(self, index: int) -> tuple[int, ...]:
        """Indices of the nodes that take node ``index``'s result, ascending."""
        return self._successor_table[index]

    def predecessors(self, index: int) -> tuple[int, ...]:
        return self.nodes[index].inputs

    @functools.cached_property
    def _successor_table(self) -> tuple[tuple[int, ...], ...]:
        table: list[list[int]] = [[] for _ in self.nodes]
        for src, dst in self.edges:
            table[src].append(dst)
        return tuple(tuple(s) for s in table)

    @property
    def fwd_flops(self) -> int:
        return sum(n.fwd_flops for n in self.nodes)

    @property
    def bwd_flops(self) -> int:
        return sum(n.bwd_flops for n in self.nodes)

    @property
    def param_bytes(self) -> int:
        return sum(n.param_bytes for n in self.nodes)

    def validate(self) -> None:
        """Check the graph is a DAG in topological order with consistent indices.

        Topological order (every input index below the node's own) implies acyclicity.

        Raises:
            EdgetrainError: naming the first offending node.
        """
        if not self.nodes:
            raise EdgetrainError("a graph needs at least one node")
        names: set[str] = set()
        for index, node in enumerate(self.nodes):
            if node.name in names:
                raise EdgetrainError(f"node {index}: duplicate name {node.name!r}")
            names.add(node.name)
            if len(set(node.inputs)) != len(node.inputs):
                raise EdgetrainError(f"node {index} ({node.name}): repeated input in {node.inputs}")
            for src in node.inputs:
                if not 0 <= src < len(self.nodes):
                    raise EdgetrainError(f"node {index} ({node.name}): input {src} out of range")
                if src >= index:
                    raise EdgetrainError(f"node {index} ({node.name}): input {src} breaks topological order")
            if not set(node.saved_inputs) <= set(node.inputs):
                raise EdgetrainError(f"node {index} ({node.name}): saved_inputs {node.saved_inputs} "
                                     f"not among inputs {node.inputs}")
        for out in self.outputs:
            if not 0 <= out < len(self.nodes):
                raise EdgetrainError(f"output {out} out of range")

    # --- persistence -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["version"] = _GRAPH_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Graph:
        fields = dict(data)
        version = fields.pop("version", _GRAPH_VERSION)
        if version != _GRAPH_VERSION:
            raise EdgetrainError(f"graph format version {version} is not supported (expected {_GRAPH_VERSION})")
        nodes = tuple(GraphNode(**n) for n in fields.pop("nodes"))
        return cls(nodes=nodes, **fields)

    def save(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Graph:
        return cls.from_dict(json.loads(Path(path).read_text()))


def capture_graph(model: nn.Module, sample: torch.Tensor | Sequence[int], *, target: torch.Tensor | None = None,
                  loss_fn: LossFn | None = None) -> Graph:
    """Trace ``model`` into an operator DAG and cost every node on the meta device.

    The model's own parameters and buffers are never touched: the graph is run with meta
    copies (``torch.func.functional_call``), so even BatchNorm's running statistics stay as
    they were and nothing is allocated. The model's mode matters (train mode records a
    training step; see NOTE [ Graph granularity ]).

    Args:
        model: any ``nn.Module`` that ``torch.fx`` can trace once data-dependent submodules are
            made leaves (every model of ``edgetrain.models`` can).
        sample: an input batch (only its shape and dtype are used), or the shape of a float one.
        target: labels; with it (or with ``loss_fn``) a ``target`` input and a ``loss`` node
            are appended. Class 0 for every sample when only ``loss_fn`` is given.
        loss_fn: ``loss_fn(output, target)``; cross-entropy by default.

    Returns:
        A validated :class:`Graph`; ``meta`` records the capture method and automatic leaves.

    Raises:
        EdgetrainError: if the model's own forward cannot be traced symbolically.

    Example:
        >>> with torch.device("meta"):
        ...     model = resnet18()
        >>> graph = capture_graph(model, (8, 3, 224, 224), target=torch.zeros(8, dtype=torch.long))
        >>> graph.nodes[-1].op
        'loss'
    """
    x = sample if isinstance(sample, torch.Tensor) else torch.empty(*sample)
    x = torch.empty_like(x, device="meta")
    tracer = _Tracer()
    try:
        fx_graph = tracer.trace(model)
    except Exception as error:  # the root's own forward is not symbolically traceable
        raise EdgetrainError(f"cannot trace {type(model).__name__} with torch.fx: {error}") from error
    gm = fx.GraphModule(tracer.root, fx_graph, type(model).__name__)

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise EdgetrainError(f"capture_graph takes models with one input; {type(model).__name__} has "
                             f"{len(placeholders)}")
    builder = _GraphBuilder(gm)
    state = {f"gm.{name}": _meta_copy(t) for name, t in [*gm.named_parameters(), *gm.named_buffers()]}
    builder.param_keys = {storage_key(t) for t in state.values()}
    torch.func.functional_call(_Runner(builder), state, (x,))

    if target is not None or loss_fn is not None:
        builder.add_loss(target, loss_fn)
    graph = Graph(nodes=tuple(builder.nodes), outputs=tuple(builder.outputs), name=type(model).__name__,
                  meta={"capture": "torch.fx symbolic trace, meta-device interpretation",
                        "input_shape": list(x.shape), "training": model.training,
                        "auto_leaves": list(tracer.auto_leaves)})
    graph.validate()
    log.debug("captured %s: %d nodes, %d edges", graph.name, len(graph.nodes), len(graph.edges))
    return graph


# --- tracing -----------------------------------------------------------------------------------
def _encoder_layer_training_forward(layer: nn.TransformerEncoderLayer, src: torch.Tensor,
                                    src_mask: torch.Tensor | None = None,
                                    src_key_padding_mask: torch.Tensor | None = None,
                                    is_causal: bool = False) -> torch.Tensor:
    """``nn.TransformerEncoderLayer.forward`` in training mode, where the fused path never runs.

    The mask canonicalisation of the original is the identity for ``None`` masks, the only
    ones a symbolic trace can pass through unchanged.
    """
    x = src
    if layer.norm_first:
        x = x + layer._sa_block(layer.norm1(x), src_mask, src_key_padding_mask, is_causal=is_causal)
        x = x + layer._ff_block(layer.norm2(x))
    else:
        x = layer.norm1(x + layer._sa_block(x, src_mask, src_key_padding_mask, is_causal=is_causal))
        x = layer.norm2(x + layer._ff_block(x))
    return x


class _Tracer(fx.Tracer):
    """fx's tracer, with encoder layers traced through and untraceable modules made leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.auto_leaves: list[str] = []
        self._forced_leaves: set[int] = set()

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if id(m) in self._forced_leaves:
            return True
        if isinstance(m, nn.TransformerEncoderLayer) and m.training:
            return False
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if isinstance(m, nn.TransformerEncoderLayer) and m.training:
            forward = functools.partial(_encoder_layer_training_forward, m)
        qualified_name = self.path_of_module(m)
        if self.is_leaf_module(m, qualified_name):
            return super().call_module(m, forward, args, kwargs)
        n_before = len(self.graph.nodes)
        stack = self.module_stack.copy()
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as error:  # noqa: BLE001 - data-dependent control flow, len() of a proxy, ...
            log.debug("tracing %s failed (%s); keeping it as a leaf", qualified_name, error)
            for node in reversed(list(self.graph.nodes)[n_before:]):
                self.graph.erase_node(node)
            self.module_stack.clear()
            self.module_stack.update(stack)
            self._forced_leaves.add(id(m))
            self.auto_leaves.append(qualified_name)
            return super().call_module(m, forward, args, kwargs)


# --- costing -----------------------------------------------------------------------------------
def _meta_copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = torch.empty_like(tensor, device="meta")
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _op_name(node: fx.Node, gm: fx.GraphModule) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))).__name__
    if node.op == "call_method":
        return str(node.target)
    if node.op == "get_attr":
        return "get_attr"
    target = node.target
    return getattr(target, "__name__", str(target))


def _target_name(node: fx.Node) -> str:
    if isinstance(node.target, str):
        return node.target
    module = getattr(node.target, "__module__", None) or ""
    name = getattr(node.target, "__name__", str(node.target))
    return f"{module}.{name}" if module and module != operator.__name__ else name


@dataclass
class _Cost:
    fwd_flops: int
    bwd_flops: int
    saved_bytes: int
    saved_input_keys: set[int]
    output_saved: bool


def _measure(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             grad_params: list[torch.Tensor], param_keys: set[int]) -> _Cost:
    """FLOPs and saved tensors of ``fn`` alone on fresh copies of its (meta) inputs."""
    inputs: list[torch.Tensor] = []
    original_keys: dict[int, int] = {}  # key of the fresh input -> key of the value it stands for

    def fresh(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.requires_grad and value.is_floating_point():
            leaf = value.detach().requires_grad_()
            copy = leaf.clone()  # non-leaf, so in-place ops (ReLU(inplace), +=) are allowed
            inputs.append(leaf)
        else:
            copy = value.detach()
        original_keys[storage_key(copy)] = storage_key(value)
        return copy

    args, kwargs = tree_map(fresh, (args, kwargs))
    existing = set(original_keys) | param_keys
    with FlopCounterMode(display=False) as fwd_counter, SavedTensors(existing) as recorded:
        out = fn(*args, **kwargs)
    saved, saved_keys = recorded.new_bytes, recorded.keys
    outs = [t for t in _tensors(out) if t.grad_fn is not None]
    out_keys = {storage_key(t) for t in _tensors(out)}
    bwd_flops = 0
    wrt = [*inputs, *grad_params]
    if outs and wrt:
        with FlopCounterMode(display=False) as bwd_counter:
            torch.autograd.grad(outs, wrt, [torch.ones_like(t) for t in outs], allow_unused=True)
        bwd_flops = int(bwd_counter.get_total_flops())
    return _Cost(fwd_flops=int(fwd_counter.get_total_flops()), bwd_flops=bwd_flops,
                 saved_bytes=sum(v for k, v in saved.items() if k not in out_keys),
                 saved_input_keys={original_keys[k] for k in saved_keys if k in original_keys},
                 output_saved=bool(out_keys & saved_keys) and not out_keys <= set(original_keys))


class _GraphBuilder(fx.Interpreter):
    """Runs the traced graph on meta tensors, costing each node and recording the DAG."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.gm = gm
        self.nodes: list[GraphNode] = []
        self.outputs: list[int] = []
        self.param_keys: set[int] = set()
        self._index: dict[fx.Node, int] = {}
        self._seen_params: set[int] = set()
        self._logits: torch.Tensor | None = None

    def run_node(self, n: fx.Node) -> Any:
        if n.op == "output":
            result = super().run_node(n)
            self.outputs = [self._index[a] for a in n.all_input_nodes if a in self._index]
            values = _tensors(result)
            self._logits = values[0] if len(values) == 1 else None
            return result
        input_nodes = [a for a in n.all_input_nodes if a in self._index]
        inputs = tuple(dict.fromkeys(self._index[a] for a in input_nodes))
        params: list[torch.Tensor] = []
        if n.op == "call_module":
            params = list(self.gm.get_submodule(str(n.target)).parameters())
        cost = None
        if n.op in ("call_module", "call_function", "call_method"):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            call = getattr(self, n.op)
            cost = _measure(lambda *a, **k: call(n.target, a, k), args, kwargs,
                            [p for p in params if p.requires_grad], self.param_keys)
        result = super().run_node(n)
        values = _tensors(result)
        if not values:
            return result  # a shape or another non-tensor value: no memory, no compute
        if n.op == "get_attr":
            params = [v for v in values if isinstance(v, nn.Parameter)]
        new_params = [p for p in params if storage_key(p) not in self._seen_params]
        self._seen_params.update(storage_key(p) for p in new_params)
        input_keys = {storage_key(t) for a in input_nodes for t in _tensors(self.env[a])}
        out_keys = {storage_key(t) for t in values}
        index = len(self.nodes)
        saved_inputs = () if cost is None else tuple(dict.fromkeys(
            self._index[a] for a in input_nodes
            if any(storage_key(t) in cost.saved_input_keys for t in _tensors(self.env[a]))))
        self.nodes.append(GraphNode(
            name=n.name, op="input" if n.op == "placeholder" else _op_name(n, self.gm),
            kind="input" if n.op == "placeholder" else n.op, target=_target_name(n), inputs=inputs,
            out_bytes=storage_bytes(values), fwd_flops=cost.fwd_flops if cost else 0,
            bwd_flops=cost.bwd_flops if cost else 0, param_bytes=storage_bytes(new_params) if new_params else 0,
            saved_bytes=cost.saved_bytes if cost else 0,
            saved_inputs=tuple(i for i in inputs if i in saved_inputs),
            output_saved=cost.output_saved if cost else False,
            aliases_input=bool(input_keys) and out_keys <= input_keys))
        self._index[n] = index
        return result

    def add_loss(self, target: torch.Tensor | None, loss_fn: LossFn | None) -> None:
        """Append a ``target`` input and a ``loss`` node taking the model's single output."""
        if self._logits is None or len(self.outputs) != 1:
            raise EdgetrainError("a loss node needs a model with a single tensor output")
        logits, logits_index = self._logits, self.outputs[0]
        target = (torch.zeros(logits.shape[0], dtype=torch.long, device="meta") if target is None
                  else torch.empty_like(target, device="meta"))
        fn = loss_fn if loss_fn is not None else nn.functional.cross_entropy
        target_index = len(self.nodes)
        self.nodes.append(GraphNode(name="target", op="input", kind="input", target="target", inputs=(),
                                    out_bytes=storage_bytes([target]), fwd_flops=0, bwd_flops=0, param_bytes=0,
                                    saved_bytes=0))
        cost = _measure(fn, (logits, target), {}, [], self.param_keys)
        loss = fn(logits, target)
        inputs = (logits_index, target_index)
        saved_inputs = {i for i, t in zip(inputs, (logits, target), strict=True)
                        if storage_key(t) in cost.saved_input_keys}
        self.nodes.append(GraphNode(
            name="loss", op="loss", kind="loss", target=getattr(fn, "__name__", type(fn).__name__),
            inputs=inputs, out_bytes=storage_bytes(_tensors(loss)), fwd_flops=cost.fwd_flops,
            bwd_flops=cost.bwd_flops, param_bytes=0, saved_bytes=cost.saved_bytes,
            saved_inputs=tuple(i for i in inputs if i in saved_inputs), output_saved=cost.output_saved))
        self.outputs = [len(self.nodes) - 1]


class _Runner(nn.Module):
    """Holds the traced module so ``functional_call`` can swap in meta parameters and buffers."""

    def __init__(self, builder: _GraphBuilder) -> None:
        super().__init__()
        self.builder = builder
        self.add_module("gm", builder.gm)

    def forward(self, x: torch.Tensor) -> Any:
        return self.builder.run(x)


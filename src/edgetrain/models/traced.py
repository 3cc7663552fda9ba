"""Stages of any traceable model: trace it with torch.fx and cut the graph where one tensor passes.

NOTE [ Traced stages ]
A model without ``stages()`` is traced with :mod:`torch.fx` into one graph of operations. The
tracer descends into containers (nested ``nn.Sequential``, user modules, ``ModuleList``
loops, ``nn.TransformerEncoder`` and its layers); the modules of ``torch.nn`` itself (convolutions,
norms, attention, activations) stay whole, as ``call_module`` nodes. A submodule whose forward
cannot be traced (data-dependent control flow, say) is kept whole too, so only the model's
own forward must trace.

The chain is cut after node ``i`` when exactly one value made at or before ``i`` is used after
it, that value is a tensor, and nothing after the cut changes it in place: the graph's
*articulation values*, through which every later op depends on everything earlier. Between two
cuts lies one stage: a skip-connected region (a residual block, a DenseNet block, a
squeeze-excite, a U-Net's nested skips) is one stage, as the chain model (one tensor between
stages) needs.
A stage made of views alone (a transpose, a ``Flatten``) joins its neighbour: its output would
share its input's storage, which the chain would count twice. A stage of a single ``torch.nn``
module applied to its input is that module itself. A user's ``nn.Sequential`` is not traced
(``stages_of``): its children are the stages as written, nested ``nn.Sequential`` and
``nn.TransformerEncoder`` children opened, since a trace would bake a user module's Python
control flow (a flag read in ``forward``) into the graph. Any other stage is an
``fx.GraphModule`` whose submodules and parameters are the model's own objects (no copies):
the optimizer, ``state_dict`` and ``.train()``/``.eval()`` of the model act on them.

The trace is taken in training mode (what the stages run for) with PyTorch's multi-head
attention fast path off, which training never takes; a Python value that does not come from
the input (``self.training``) is fixed in the graph as it was then. Extra arguments of
``forward`` keep their defaults. A model whose own forward cannot be traced, that takes
more than one tensor, or that returns anything but one tensor is refused in one line naming
the construct, unless a sample batch is given and ``torch.export`` can capture it (NOTE
[ Exported stages ]).
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import itertools
import logging
import operator
import re
import traceback
from collections.abc import Callable, Iterator, Set
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from .call import Inputs, ModelCall, SideValues, WithSideValues, as_call, input_shapes

__all__ = ["traced_stages", "traced_module", "exported_for", "exported_stages", "model_call", "training_mode",
           "NotTraceableError"]

log = logging.getLogger(__name__)

_TORCH_DIR = str(Path(torch.__file__).parent)
_SCALAR_METHODS = frozenset({"size", "dim", "numel", "item", "tolist", "__len__", "stride", "nelement"})
_SCALAR_FUNCTIONS = frozenset({builtins.getattr, builtins.len, builtins.int, builtins.float})
_VIEW_METHODS = frozenset({"view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "transpose", "permute",
                           "squeeze", "unsqueeze", "expand", "expand_as", "t", "narrow", "select", "chunk", "split",
                           "unbind", "contiguous", "__getitem__", "movedim", "swapaxes", "detach"})
_VIEW_FUNCTIONS = frozenset({torch.flatten, torch.reshape, torch.transpose, torch.permute, torch.squeeze,
                             torch.unsqueeze, torch.t, torch.narrow, torch.select, torch.chunk, torch.split,
                             torch.unbind, torch.movedim, torch.swapaxes, operator.getitem})
_INPLACE_FUNCTIONS = frozenset({operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift})


class NotTraceableError(TypeError):
    """A model that torch.fx cannot turn into a chain of stages; the message names the construct."""


class _StageTracer(fx.Tracer):
    """fx's tracer that keeps ``torch.nn`` layers whole and keeps whole any submodule it cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.whole: set[int] = set()     # ids of submodules kept whole after their trace failed
        self.kept_whole: list[str] = []  # "qualname: construct", for the log

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if id(m) in self.whole:
            return True
        if isinstance(m, (nn.Sequential, nn.TransformerEncoderLayer)):
            return False
        return m.__module__.startswith("torch.nn")

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if isinstance(m, nn.TransformerEncoder) and len(args) == 1 and not kwargs:
            return self._encoder_layers(m, args[0])
        if self.is_leaf_module(m, self.path_of_module(m)):
            return super().call_module(m, forward, args, kwargs)
        last = next(iter(reversed(self.graph.nodes)))
        stack = list(self.module_stack.items())
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure of a submodule's trace: keep it whole
            self._erase_after(last)
            self.module_stack.clear()
            self.module_stack.update(stack)
            self.whole.add(id(m))
            self.kept_whole.append(f"{self.path_of_module(m)}: {_construct(exc)}")
            return super().call_module(m, forward, args, kwargs)

    def _encoder_layers(self, encoder: nn.TransformerEncoder, src: Any) -> Any:
        """``nn.TransformerEncoder(src)`` without masks in training is its layers in turn, then its norm."""
        for layer in encoder.layers:
            src = self.call_module(layer, layer.forward, (src,), {})
        if encoder.norm is not None:
            src = self.call_module(encoder.norm, encoder.norm.forward, (src,), {})
        return src

    def _erase_after(self, last: fx.Node) -> None:
        nodes = list(self.graph.nodes)
        for node in reversed(nodes[nodes.index(last) + 1:]):
            self.graph.erase_node(node)


def traced_stages(model: nn.Module, sample: Inputs | None = None) -> list[nn.Module]:
    """The chain of stages of ``model`` cut at its graph's articulation values (NOTE [ Traced stages ]).

    Args:
        model: any module whose forward takes one tensor (other arguments keep their defaults)
            and returns one tensor.
        sample: an input batch. With it, a model torch.fx cannot trace whole, or whose stages would pass
            something other than a tensor, is captured by ``torch.export`` instead (NOTE [ Exported stages ]);
            so is one called with several inputs (a tuple or dict of tensors: NOTE [ Side inputs ] in
            ``models/call.py``).

    Returns:
        Modules whose composition in order computes ``model(x)`` with the same ops in the same
        order, sharing the model's parameters.

    Raises:
        NotTraceableError: naming what stopped the trace (or the extra input or output).

    Example:
        >>> class Skip(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(8, 2)
        ...     def forward(self, x):
        ...         h = torch.relu(self.a(x))
        ...         return self.c(torch.cat([h, torch.relu(self.b(h))], 1))
        >>> [type(s).__name__ for s in traced_stages(Skip())]
        ['Linear', 'Stage_relu', 'Stage_b_cat', 'Linear']
    """
    if sample is not None and not isinstance(sample, torch.Tensor):
        return exported_stages(model, sample)
    try:
        graph, tracer = _trace(model)
    except NotTraceableError as exc:
        if sample is None:
            raise
        return _exported_or_refused(model, sample, exc)
    if tracer.kept_whole:
        log.info("%s: kept whole (not traceable inside): %s", type(model).__name__, "; ".join(tracer.kept_whole))
    nodes = [node for node in graph.nodes if node.op not in ("get_attr", "output")]
    result = _output_value(model, graph)
    cuts = _cuts(model, nodes, result)
    stages = [_stage(model, nodes, start, end) for start, end in itertools.pairwise(cuts)]
    log.debug("%s traced into %d stages", type(model).__name__, len(stages))
    if sample is not None and tracer.kept_whole and not _passes_tensors(stages, sample):
        return _exported_or_refused(model, sample, NotTraceableError(
            f"{type(model).__name__}: a stage kept whole returns no tensor ({'; '.join(tracer.kept_whole)})"))
    return stages


# NOTE [ Exported stages ]
# torch.fx traces symbolically, so a forward that branches on a shape, a dtype or a flag computed from the
# input (a Hugging Face model's masks and dtype checks) stops it; a submodule kept whole for that reason
# may return a structured value (a ``ModelOutput``), which no stage can pass on. Given a sample batch,
# such a model is captured by ``torch.export`` (non-strict: Python runs for real and the branches take
# the sample's values), whose graph of ATen operators is cut at its articulation values like fx's. The
# graph reads the model's own parameters, so the optimizer, ``state_dict`` and the executor see them. The
# capture is specialised to the sample's shapes: each stage records them (``exported_for``) and a batch of
# another shape is captured again. Views and in-place operators are told by their ATen schema. BatchNorm in
# training updates its running statistics inside the graph, where a recomputation would update them
# again (NOTE [ Recomputation is invisible ] in ``runtime/schedule_run.py``): such a model is refused.

def exported_stages(model: nn.Module, sample: Inputs) -> list[nn.Module]:
    """``model``'s stages from its ``torch.export`` graph on ``sample`` (NOTE [ Exported stages ]): a tensor, or
    the model's inputs as a tuple or dict, side inputs and a structured output among them (NOTE [ Side inputs ]
    in ``models/call.py``; :func:`model_call` gives how such a model is called).

    Raises:
        NotTraceableError: the export fails, the graph updates norm statistics, or it returns more than one tensor.
    """
    name = type(model).__name__
    args, kwargs = as_call(sample)
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with training_mode(model), _mha_fastpath_off():
        try:
            exported = torch.export.export(model, args, kwargs, strict=False)
        except Exception as exc:  # whatever stopped the capture is what the user must see
            raise NotTraceableError(f"{name} cannot be exported into stages: {_construct(exc)}") from exc
    module = exported.module()
    graph = module.graph
    if any(node.op == "call_function" and "batch_norm" in str(node.target) for node in graph.nodes):
        raise NotTraceableError(f"{name}: BatchNorm inside a forward only torch.export can capture: a "
                                "recomputation would update its running statistics twice")
    (output,) = [node for node in graph.nodes if node.op == "output"]
    results = [value for value in pytree.tree_leaves(output.args[0]) if isinstance(value, fx.Node)]
    if len(results) != 1:
        raise NotTraceableError(f"{name}.forward returns {len(results)} tensors; a chain ends in one tensor "
                                "(give the labels to the loss, not to the model)")
    inputs = [node for node in graph.nodes if node.op == "placeholder"]   # one per argument of the call, in order
    leaves = pytree.tree_leaves((args, kwargs))
    main = next((i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)), None)
    if main is None or len(inputs) != len(leaves):
        raise NotTraceableError(f"{name}.forward takes no tensor")
    sides = _side_values(module, graph, inputs[main])
    nodes = [node for node in graph.nodes if node.op not in ("get_attr", "output") and node not in sides]
    cuts = _cuts(module, nodes, results[0])
    holder = SideValues()
    stages = [_stage(module, nodes, start, end, sides, holder) for start, end in itertools.pairwise(cuts)]
    read = [node for node in graph.nodes if node in sides and any(user not in sides for user in node.users)]
    call = ModelCall(in_spec=exported.call_spec.in_spec, main=main, sides=_side_module(module, inputs, sides, read),
                     names=[node.name for node in read], holder=holder, out_spec=exported.call_spec.out_spec,
                     shapes=input_shapes(args, kwargs))
    for stage in stages:
        stage.exported_for = call.shapes  # type: ignore[assignment]
    if not call.plain:
        stages[0].model_call = call  # type: ignore[assignment]
    log.info("%s: exported into %d stages for inputs %s", name, len(stages), call.shapes)
    return stages


def exported_for(stages: list[nn.Module]) -> tuple[tuple[int, ...], ...] | None:
    """The input shapes ``stages`` were captured for by ``torch.export`` (they hold for those alone), or None."""
    for stage in stages:
        for module in stage.modules():
            shapes = getattr(module, "exported_for", None)
            if shapes is not None:
                return tuple(shapes)
    return None


def model_call(stages: list[nn.Module]) -> ModelCall | None:
    """How the model of exported ``stages`` is called, where it has side inputs or a structured output (NOTE
    [ Side inputs ] in ``models/call.py``); None for a model of one tensor in, one out."""
    for stage in stages:
        for module in stage.modules():
            call = getattr(module, "model_call", None)
            if isinstance(call, ModelCall):
                return call
    return None


def _side_values(module: nn.Module, graph: fx.Graph, main: fx.Node) -> set[fx.Node]:
    """The graph's side values: nodes that depend neither on ``main`` nor on a parameter (NOTE [ Side inputs ])."""
    parameters = {name for name, _ in module.named_parameters()}
    on_chain: set[fx.Node] = set()
    for node in graph.nodes:
        if node is main or (node.op == "get_attr" and node.target in parameters) or any(
                arg in on_chain for arg in node.all_input_nodes):
            on_chain.add(node)
    return {node for node in graph.nodes if node not in on_chain and node.op not in ("get_attr", "output")}


def _side_module(module: nn.Module, inputs: list[fx.Node], sides: set[fx.Node], read: list[fx.Node]) -> fx.GraphModule:
    """The module that computes the side values ``read`` from every input tensor, the side ops in the graph's order."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {node: graph.placeholder(node.name) for node in inputs}

    def mapped(node: fx.Node) -> fx.Node:
        if node not in env:  # a buffer read
            env[node] = graph.node_copy(node)
        return env[node]

    for node in inputs[0].graph.nodes:
        if node in sides and node not in env:
            env[node] = graph.node_copy(node, mapped)
    graph.output(tuple(env[node] for node in read))
    graph.eliminate_dead_code()
    return fx.GraphModule(module, graph, class_name="SideValues")


def _exported_or_refused(model: nn.Module, sample: torch.Tensor, traced: NotTraceableError) -> list[nn.Module]:
    try:
        return exported_stages(model, sample)
    except NotTraceableError as exported:
        raise NotTraceableError(f"{traced}; and {exported}") from exported


def _passes_tensors(stages: list[nn.Module], sample: torch.Tensor) -> bool:
    """Whether every stage, run once on ``sample`` without autograd, returns a tensor; the generators and the
    buffers (norm statistics) are left as they were."""
    buffers = [(buffer, buffer.clone()) for stage in stages for buffer in stage.buffers()]
    value: object = sample
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for stage in stages:
                value = stage(value)
                if not isinstance(value, torch.Tensor):
                    return False
        return True
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)


def traced_module(module: nn.Module) -> fx.GraphModule:
    """``module`` as one ``fx.GraphModule`` traced as :func:`traced_stages` traces (sharing its parameters).

    Raises:
        NotTraceableError: naming what stopped the trace.
    """
    graph, _ = _trace(module)
    return fx.GraphModule(module, graph, class_name=f"Traced{type(module).__name__}")


# --- tracing ------------------------------------------------------------------------------------

def _trace(model: nn.Module) -> tuple[fx.Graph, _StageTracer]:
    name = type(model).__name__
    concrete = _concrete_args(model)
    tracer = _StageTracer()
    with training_mode(model), _mha_fastpath_off():
        try:
            graph = tracer.trace(model, concrete_args=concrete)
        except Exception as exc:  # whatever stopped the trace is what the user must see
            raise NotTraceableError(f"{name} cannot be traced into stages: {_construct(exc)}; give it a method "
                                    "stages() -> list[nn.Module] whose composition equals forward()") from exc
    _drop_specialised_args(graph, name)
    return graph, tracer


def _concrete_args(model: nn.Module) -> dict[str, Any]:
    """Every argument of ``forward`` after the first, fixed at its default; refuse one without."""
    parameters = list(inspect.signature(model.forward).parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not positional or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        raise NotTraceableError(f"{type(model).__name__}.forward must take one tensor (and arguments with "
                                "defaults) to be traced into stages")
    missing = [p.name for p in positional[1:] if p.default is inspect.Parameter.empty]
    if missing:
        raise NotTraceableError(f"{type(model).__name__}.forward takes more than one input ({', '.join(missing)} "
                                "beside the first); a chain's stages take one tensor")
    return {p.name: p.default for p in positional[1:]}


def _drop_specialised_args(graph: fx.Graph, name: str) -> None:
    """Remove the placeholders of fixed arguments and the checks fx adds on them."""
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    reached: list[fx.Node] = []
    for node in graph.nodes:
        if node in placeholders[1:] or any(arg in reached for arg in node.all_input_nodes):
            reached.append(node)
    for node in reversed(reached):
        if node.op == "output" or any(user not in reached for user in node.users):
            raise NotTraceableError(f"{name}: an argument after the first reaches the output; a chain's stages "
                                    "take one tensor")
        graph.erase_node(node)


def _output_value(model: nn.Module, graph: fx.Graph) -> fx.Node:
    output = next(node for node in graph.nodes if node.op == "output")
    value = output.args[0]
    if not isinstance(value, fx.Node) or is_scalar_node(value):
        raise NotTraceableError(f"{type(model).__name__}.forward returns {type(value).__name__}, not one tensor; "
                                "a chain ends in one tensor (return the logits, compute the rest outside)")
    return value


def _construct(exc: BaseException) -> str:
    """What stopped a trace, in one line: the error and the user's line of code that raised it."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_TORCH_DIR)]
    if not frames:
        return f"{type(exc).__name__}: {message}"
    frame = frames[-1]
    return f"{type(exc).__name__}: {message} (at {Path(frame.filename).name}:{frame.lineno}: {frame.line})"


@contextlib.contextmanager
def training_mode(model: nn.Module) -> Iterator[None]:
    """Every module of ``model`` in training mode for the block, each put back as it was after."""
    modes = {module: module.training for module in model.modules()}
    model.train()
    try:
        yield
    finally:
        for module, mode in modes.items():
            module.training = mode


@contextlib.contextmanager
def _mha_fastpath_off() -> Iterator[None]:
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


# --- cutting ------------------------------------------------------------------------------------

_Cut = tuple[int, fx.Node]  # (position of the last node before the cut, the one value passed on)


def _cuts(model: nn.Module, nodes: list[fx.Node], result: fx.Node) -> list[_Cut]:
    """The articulation values in order: after the input, each single tensor every later op depends on."""
    position = {node: i for i, node in enumerate(nodes)}
    end = len(nodes)
    last_use = {node: max((position.get(user, end) for user in node.users), default=-1) for node in nodes}
    cuts: list[_Cut] = []
    live: set[fx.Node] = set()
    for i, node in enumerate(nodes):
        live.add(node)
        live = {value for value in live if last_use[value] > i}
        if len(live) != 1:
            continue
        (value,) = live
        if is_scalar_node(value) or _changed_in_place(model, value):
            continue
        if cuts and cuts[-1][1] is value:
            cuts[-1] = (i, value)    # ops that only read or rewrite nothing: keep them before the cut
        else:
            cuts.append((i, value))
    if not cuts or cuts[-1][1] is not result:
        cuts.append((end - 1, result))
    return _without_view_stages(model, nodes, cuts)


def _changed_in_place(model: nn.Module, value: fx.Node) -> bool:
    """Whether a later op changes ``value`` in place, itself or through a view of it (EfficientNet's in-place dropout
    on its flattened features): a stage's input is a leaf of the stage's own graph, and autograd refuses an in-place
    op on a leaf that requires grad, or on a view of one."""
    shared, pending = {value}, [value]
    while pending:
        node = pending.pop()
        for later in node.users:
            if later.args[:1] != (node,):
                continue
            if mutates(model, later):
                return True
            if _is_view(model, later) and later not in shared:
                shared.add(later)
                pending.append(later)
    return False


def _without_view_stages(model: nn.Module, nodes: list[fx.Node], cuts: list[_Cut]) -> list[_Cut]:
    """Merge each stage of views alone (a transpose, a flatten) into the next (the last into the previous).

    Its output would share its input's storage, which the chain counts as two values.
    """
    kept = list(cuts)
    index = 1
    while index < len(kept) and len(kept) > 2:
        body = nodes[kept[index - 1][0] + 1:kept[index][0] + 1]
        if all(_is_view(model, node) for node in body):
            del kept[index if index < len(kept) - 1 else index - 1]
        else:
            index += 1
    return kept


def _is_view(model: nn.Module, node: fx.Node) -> bool:
    """Whether ``node``'s result may share its input's storage."""
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        returns = node.target._schema.returns
        return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
    if node.op == "call_function":
        return node.target in _VIEW_FUNCTIONS
    if node.op == "call_module":
        return isinstance(model.get_submodule(str(node.target)), (nn.Flatten, nn.Unflatten, nn.Identity))
    return False


def is_scalar_node(node: fx.Node) -> bool:
    """A shape, size or Python number computed from tensors: never a stage boundary."""
    if node.op == "call_method":
        return node.target in _SCALAR_METHODS
    if node.op == "call_function":
        if node.target in _SCALAR_FUNCTIONS:
            return True
        inputs = node.all_input_nodes
        return getattr(node.target, "__module__", None) in ("_operator", "operator") and bool(inputs) and all(
            is_scalar_node(arg) for arg in inputs)
    return False


def mutates(model: nn.Module, node: fx.Node) -> bool:
    """Whether ``node`` changes its first argument in place (``add_``, ``torch.relu_``, ``+=``, ``x[i] = v``,
    ``ReLU(inplace=True)``)."""
    if node.op == "call_method":
        return isinstance(node.target, str) and node.target.endswith("_") and not node.target.startswith("_")
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        arguments = node.target._schema.arguments
        return bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        return (node.target in _INPLACE_FUNCTIONS or bool(node.kwargs.get("inplace"))
                or (name.endswith("_") and not name.startswith("_")))
    if node.op == "call_module":
        return bool(getattr(model.get_submodule(str(node.target)), "inplace", False))
    return False


def _stage(model: nn.Module, nodes: list[fx.Node], start: _Cut, end: _Cut, sides: Set[fx.Node] = frozenset(),
           holder: SideValues | None = None) -> nn.Module:
    """The ops after cut ``start`` up to cut ``end`` as one module: itself when it is one submodule call; one that
    reads its side values from ``holder`` where it reads any (NOTE [ Side inputs ] in ``models/call.py``)."""
    body = nodes[start[0] + 1:end[0] + 1]
    first, source, result = body[0], start[1], end[1]
    if (len(body) == 1 and first is result and first.op == "call_module" and first.args == (source,)
            and not first.kwargs):
        return model.get_submodule(str(first.target))
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {source: graph.placeholder("x")}
    read = list(dict.fromkeys(arg for node in body for arg in node.all_input_nodes if arg in sides))
    for side in read:
        env[side] = graph.placeholder(side.name)

    def mapped(node: fx.Node) -> fx.Node:
        if node not in env:  # a parameter or buffer read: copied into each stage that reads it
            env[node] = graph.node_copy(node)
        return env[node]

    for node in body:
        env[node] = graph.node_copy(node, mapped)
    graph.output(mapped(result))
    stage = fx.GraphModule(model, graph, class_name=_stage_class_name(body))
    if not read:
        return stage
    assert holder is not None
    return WithSideValues(stage, [side.name for side in read], holder)


def _stage_class_name(body: list[fx.Node]) -> str:
    label = body[0].name if len(body) == 1 else f"{body[0].name}_{body[-1].name}"
    return "Stage_" + re.sub(r"\W", "_", label)

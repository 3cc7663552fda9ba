"""Operator graphs: the DAG structure, and costs held against whole-model counts (meta device)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from edgetrain.errors import EdgetrainError
from edgetrain.models import get_model_spec
from edgetrain.profiling.graph import Graph, GraphNode, capture_graph

BATCH = 2


def meta_model(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    spec = get_model_spec(name)
    with torch.device("meta"):
        model = spec.build()
    size = 32 if spec.input_kind == "tokens" else 64
    return model, spec.example_input(BATCH, size, device="meta"), spec.example_target(BATCH, device="meta")


def whole_model_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    with FlopCounterMode(display=False) as fwd:
        out = model(x)
    with FlopCounterMode(display=False) as bwd:
        nn.functional.cross_entropy(out, y).backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


def ancestors(graph: Graph, index: int) -> set[int]:
    """``index`` and every node it depends on."""
    found, todo = {index}, [index]
    while todo:
        for src in graph.nodes[todo.pop()].inputs:
            if src not in found:
                found.add(src)
                todo.append(src)
    return found


@pytest.fixture(scope="module")
def resnet18_graph() -> tuple[Graph, nn.Module, torch.Tensor, torch.Tensor]:
    model, x, y = meta_model("resnet18")
    return capture_graph(model, x, target=y), model, x, y


class Branch(nn.Module):
    """relu -> two linears -> add: a diamond."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x)
        return self.a(h) + self.b(h)


def test_branch_module_gives_exact_dag() -> None:
    # Prepare: a CPU model, so capture must not touch its real tensors.
    model = Branch()
    weight = model.a.weight.detach().clone()
    # Execute
    graph = capture_graph(model, torch.randn(3, 4))
    # Assert: structure
    assert [(n.name, n.op, n.inputs) for n in graph.nodes] == [
        ("x", "input", ()), ("relu", "relu", (0,)), ("a", "Linear", (1,)), ("b", "Linear", (1,)),
        ("add", "add", (2, 3))]
    assert graph.edges == ((0, 1), (1, 2), (1, 3), (2, 4), (3, 4))
    assert [graph.successors(i) for i in range(5)] == [(1,), (2, 3), (4,), (4,), ()]
    assert graph.outputs == (4,)
    # Assert: hand-computed costs. Activations (3, 4) float32 = 48 B; a linear is 2*3*4*4 FLOPs.
    assert [n.out_bytes for n in graph.nodes] == [48] * 5
    assert [n.fwd_flops for n in graph.nodes] == [0, 0, 96, 96, 0]
    # x needs no gradient, so neither does h: a linear's backward is its weight gradient only.
    assert [n.bwd_flops for n in graph.nodes] == [0, 0, 96, 96, 0]
    assert [n.param_bytes for n in graph.nodes] == [0, 0, 80, 80, 0]
    assert [n.saved_inputs for n in graph.nodes] == [(), (), (1,), (1,), ()]
    assert all(n.saved_bytes == 0 for n in graph.nodes)
    assert model.a.weight.device.type == "cpu" and torch.equal(model.a.weight, weight)


def test_resnet18_has_eight_residual_adds(resnet18_graph: tuple[Graph, nn.Module, torch.Tensor, torch.Tensor]) -> None:
    graph = resnet18_graph[0]
    graph.validate()
    adds = [i for i, n in enumerate(graph.nodes) if n.op in ("add", "iadd")]
    assert len(adds) == 8  # one per BasicBlock: 2 + 2 + 2 + 2
    for i in adds:
        left, right = graph.nodes[i].inputs
        # Branch and shortcut meet again here: where they split is a node with two successors.
        split = max(ancestors(graph, left) & ancestors(graph, right))
        assert len(graph.successors(split)) == 2
    forks = [i for i in range(len(graph.nodes)) if len(graph.successors(i)) == 2]
    assert len(forks) == 8  # each block's input: residual branch + shortcut (identity or downsample)


def test_resnet18_costs_match_whole_model(resnet18_graph: tuple[Graph, nn.Module, torch.Tensor, torch.Tensor]) -> None:
    graph, model, x, y = resnet18_graph
    fwd, bwd = whole_model_flops(model, x, y)
    assert graph.fwd_flops == pytest.approx(fwd, rel=1e-2)
    assert graph.bwd_flops == pytest.approx(bwd, rel=1e-2)
    assert graph.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert graph.nodes[-1].op == "loss" and graph.nodes[-1].inputs[1] == len(graph.nodes) - 2
    logits = graph.nodes[graph.nodes[-1].inputs[0]]
    assert logits.name == "fc" and logits.out_bytes == BATCH * 1000 * 4
    assert graph.nodes[-1].out_bytes == 4  # a float32 scalar


def test_resnet18_saved_tensors_closed_form(
        resnet18_graph: tuple[Graph, nn.Module, torch.Tensor, torch.Tensor]) -> None:
    nodes = {n.name: n for n in resnet18_graph[0].nodes}
    assert nodes["bn1"].saved_bytes == 2 * 64 * 4  # batch mean and inverse std, float32
    assert nodes["maxpool"].saved_bytes == BATCH * 64 * 16 * 16 * 8  # int64 argmax indices
    assert nodes["conv1"].saved_inputs == (0,) and nodes["conv1"].saved_bytes == 0
    assert nodes["relu"].aliases_input  # ReLU(inplace=True) writes into bn1's output
    assert nodes["flatten"].aliases_input  # a view


def test_no_loss_node_without_target() -> None:
    model, x, _ = meta_model("resnet18")
    graph = capture_graph(model, x)
    assert graph.nodes[-1].name == "fc" and graph.outputs == (len(graph.nodes) - 1,)
    assert graph.nodes[-1].out_bytes == BATCH * 1000 * 4


def test_custom_loss_without_target() -> None:
    model = Branch()
    graph = capture_graph(model, (3, 4), loss_fn=lambda out, target: out.pow(2).mean())
    assert [n.name for n in graph.nodes[-2:]] == ["target", "loss"]
    assert graph.nodes[-2].out_bytes == 3 * 8  # default int64 class-0 labels
    assert graph.nodes[-1].inputs == (4, 5)


@pytest.mark.parametrize("name, n_adds", [("mobilenet_v2", 10), ("transformer_small", 4), ("resnet50", 16)])
def test_zoo_captures_and_matches_flops(name: str, n_adds: int) -> None:
    model, x, y = meta_model(name)
    graph = capture_graph(model, x, target=y)
    graph.validate()
    fwd, bwd = whole_model_flops(model, x, y)
    assert graph.fwd_flops == pytest.approx(fwd, rel=1e-2)
    assert graph.bwd_flops == pytest.approx(bwd, rel=1e-2)
    assert graph.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(1 for n in graph.nodes if n.op in ("add", "iadd") and len(n.inputs) == 2) == n_adds


def test_transformer_layers_traced_through_embedding_kept_whole() -> None:
    model, x, y = meta_model("transformer_small")
    graph = capture_graph(model, x, target=y)
    # The embedding checks the sequence length in Python, so it cannot be traced: a leaf.
    assert graph.meta["auto_leaves"] == ["embedding"]
    ops = [n.op for n in graph.nodes]
    assert ops.count("MultiheadAttention") == 2 and ops.count("LayerNorm") == 4 and ops.count("gelu") == 2
    assert "TransformerEncoderLayer" not in ops


def test_capture_leaves_batchnorm_statistics_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graph = capture_graph(model, torch.randn(2, 3, 8, 8))
    assert [n.op for n in graph.nodes] == ["input", "Conv2d", "BatchNorm2d", "ReLU"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_json_round_trip(resnet18_graph: tuple[Graph, nn.Module, torch.Tensor, torch.Tensor], tmp_path) -> None:
    graph = resnet18_graph[0]
    again = Graph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert again == graph and again.meta == graph.meta
    graph.save(tmp_path / "graph.json")
    assert Graph.load(tmp_path / "graph.json") == graph


def node(name: str, inputs: tuple[int, ...]) -> GraphNode:
    return GraphNode(name=name, op="op", inputs=inputs, out_bytes=1, fwd_flops=0, bwd_flops=0, param_bytes=0,
                     saved_bytes=0)


@pytest.mark.parametrize("nodes, message", [
    ((node("a", ()), node("b", (1,))), "topological"),
    ((node("a", (1,)), node("b", (0,))), "topological"),
    ((node("a", ()), node("b", (5,))), "out of range"),
    ((node("a", ()), node("a", (0,))), "duplicate"),
    ((), "at least one"),
])
def test_validate_rejects_malformed_graphs(nodes: tuple[GraphNode, ...], message: str) -> None:
    with pytest.raises(EdgetrainError, match=message):
        Graph(nodes=nodes).validate()


def test_untraceable_root_forward_is_a_clean_error() -> None:
    class Gate(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(EdgetrainError, match="cannot trace Gate"):
        capture_graph(Gate(), (2, 2))

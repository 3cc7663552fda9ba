"""Whole gradients summed in half precision, bucket by bucket during the backward (NOTE [ Half-precision buckets
overlapped with the backward ])."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from edgetrain.core.chain import Chain
from edgetrain.core.optim import make_optimizer
from edgetrain.distributed.group import ClusterError
from edgetrain.distributed.half_allreduce import HalfPrecisionAllReduce
from edgetrain.distributed.node import ClusterOptions
from edgetrain.distributed.step import cluster_step
from edgetrain.distributed.supervisor import LocalOptions
from edgetrain.errors import EdgetrainError
from edgetrain.models.stages import training_stages
from edgetrain.planners import uniform
from edgetrain.runtime import Executor

STEPS = 10
SHARES = (5, 3)  # unequal: each node's part is weighted by its samples
BATCH = sum(SHARES)
HALF_REL = 2.0 ** -9  # float16: each node's part rounded (2^-11), and each of the sum's additions (2^-11 each)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 6, generator=generator), torch.randint(0, 4, (STEPS, BATCH), generator=generator)


def _executor(model: nn.Module) -> Executor:
    """A schedule that recomputes (two segments): gradients arrive stage by stage from the executor's backwards."""
    stages = training_stages(model)
    return Executor(stages, uniform(Chain.uniform(len(stages)), 2))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _CountsStarted(HalfPrecisionAllReduce):
    """Records, at each step's :meth:`finish`, how many buckets had started during the backward."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.started_before_finish: list[int] = []

    def finish(self, scale: float) -> None:
        self.started_before_finish.append(len(self._in_flight))
        super().finish(scale)


def _rank(rank: int, port: int, out: str) -> None:
    """One of two nodes: for each step, the float32 sum of its gradients (at the same weights), then the step with
    the float16 buckets; and which buckets had started before the backward ended."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, (xs, ys) = _model(), _data()
    optimizer = make_optimizer("sgd", model.parameters(), 0.1)
    executor = _executor(model)
    half = _CountsStarted(model.parameters(), torch.float16, group=dist.new_group(backend="gloo"),
                          bucket_numbers=300)
    offset, share = sum(SHARES[:rank]), SHARES[rank]
    exact, summed, losses = [], [], []
    for x, y in zip(xs, ys, strict=True):
        batch = (x[offset:offset + share], y[offset:offset + share])
        with torch.no_grad():
            weights = [p.clone() for p in model.parameters()]
        reference = make_optimizer("sgd", model.parameters(), 0.0)  # a step that leaves the weights as they are
        cluster_step(executor, model, reference, batch)
        exact.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights, strict=True):
                p.copy_(w)
        result = cluster_step(executor, model, optimizer, batch, half=half)
        losses.append(result.loss)
        summed.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
    torch.save({"exact": exact, "summed": summed, "started": half.started_before_finish, "buckets": len(half.buckets),
                "first_bucket": [tuple(p.shape) for p in half.buckets[0]], "losses": losses,
                "weights": [p.detach() for p in model.parameters()]}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def test_two_nodes_sum_whole_gradients_in_float16_within_its_rounding_and_start_buckets_in_the_backward(
        tmp_path: Path) -> None:
    # Prepare, execute: two forked gloo nodes splitting each batch 5 + 3, buckets of about 300 numbers.
    nodes = mp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=False, start_method="fork")
    while not nodes.join():
        pass
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # Assert: every step's gradient is the float32 sum at the same weights within float16's rounding, and not
    # that sum itself (so float16 crossed the wire); both nodes hold the same weights.
    for got in ranks:
        rounded = False
        for exact_step, summed_step in zip(got["exact"], got["summed"], strict=True):
            for e, s in zip(exact_step, summed_step, strict=True):
                scale = e.abs().max().item()
                assert (s - e).abs().max().item() <= HALF_REL * scale + 1e-7
                rounded = rounded or not torch.equal(s, e)
        assert rounded
        assert got["losses"][-1] < got["losses"][0]
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True):
        assert torch.equal(a, b)
    # Buckets: the last layer's parameters first, and every bucket started before the backward ended.
    assert ranks[0]["buckets"] > 2
    assert ranks[0]["first_bucket"] == [(4,), (4, 64), (64,)]
    assert all(started == ranks[0]["buckets"] for got in ranks for started in got["started"])


@pytest.fixture
def cluster_of_one() -> object:
    """A gloo group of this process alone (the sum of one node is its own numbers)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield None
    finally:
        dist.destroy_process_group()


def test_a_bucket_that_overflows_float16_is_summed_again_in_float32(cluster_of_one: object) -> None:
    # Prepare: gradients past float16's largest number (65504) in one bucket, small ones in another.
    big, small = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    half = HalfPrecisionAllReduce([small, big], torch.float16, bucket_numbers=3)
    # Execute
    with half.collecting(2.0):
        (big * torch.tensor([1e5, -3.0, 0.1])).sum().backward()
        (small * torch.tensor([0.25, 1.0 / 3.0])).sum().backward()
    half.finish(0.5)
    # Assert: the overflowing bucket is exact (float32), the other within float16's rounding
    assert big.grad is not None and small.grad is not None
    assert torch.equal(big.grad, torch.tensor([1e5, -3.0, 0.1]))
    assert small.grad[0].item() == 0.25 and small.grad[1].item() != 1.0 / 3.0
    assert abs(small.grad[1].item() - 1.0 / 3.0) <= 2.0 ** -11 / 3.0


def test_a_gradient_accumulated_twice_in_a_step_is_refused(cluster_of_one: object) -> None:
    weight = nn.Parameter(torch.ones(2))
    half = HalfPrecisionAllReduce([weight], torch.float16)
    with pytest.raises(ClusterError, match="accumulated twice"), half.collecting(1.0):
        weight.sum().backward()
        weight.sum().backward()


@pytest.mark.parametrize(("settings", "message"), [
    ({"wire_dtype": "int8"}, "--wire must be one of float32, float16, bfloat16"),
    ({"wire_dtype": "float16", "average_every": 4}, "--average-every 4 the nodes average weights"),
])
def test_bad_wire_settings_are_refused_before_any_node_starts(settings: dict[str, object], message: str) -> None:
    for options in (ClusterOptions, LocalOptions):
        with pytest.raises(EdgetrainError, match=message):
            options(**settings)  # type: ignore[arg-type]

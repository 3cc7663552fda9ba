"""Federated training of camera nodes on Flower: every node trains locally under its memory budget; only weights travel.

NOTE [ Federated rounds ]
Nodes that must not share their frames (in-situ camera nodes) still learn
together. Each node keeps its data; a server averages their models (FedAvg, McMahan et al.,
AISTATS 2017). Flower (``flwr``, the ``federated`` extra) carries the messages, through its
gRPC client and server (``flwr.client.start_client`` with a ``NumPyClient``,
``flwr.server.start_server``): plain processes that reach each other by address. Flower marks
these deprecated since 1.13 in favour of its deployment engine (SuperLink, SuperNodes and
``flwr run``, which installs the app as a bundle into processes the engine starts itself);
their simulation engine needs Ray. A round:

1. the server sends the global weights (every floating-point entry of the model's
   ``state_dict``: parameters and BatchNorm's running statistics; integer counters stay on the
   node) to every node;
2. each node loads them and takes ``local_steps`` optimizer steps on batches drawn from its own
   training data by a generator seeded by ``(seed, node, round)``, with a fresh optimizer each
   round (so its state, momentum or Adam's moments, never leaves the node), through the
   :class:`~edgetrain.runtime.Checkpointed` schedule planned once at start-up under the node's
   process budget (NOTE [ Process budget ], the rule of ``train --memory``, with
   :data:`FLOWER_RUNTIME_BYTES` and :data:`MESSAGE_COPIES` times the weights' bytes set aside
   beside the runtime baseline for gRPC and a round's messages); it returns the weights, the number
   of its own training samples and scalar metrics;
3. the server checks every reply against the global weights (same count, shapes and dtypes;
   metrics numbers only), so a reply can carry weights and nothing else, averages the weights
   weighted by samples (Flower's ``aggregate``, the nodes in a fixed order so the result does
   not depend on which reply came first), and sends the average to every node for evaluation on
   its held-out data;
4. the server appends the round's record to ``metrics.jsonl`` (held-out loss and accuracy
   weighted by held-out samples, the bytes of weights each way, every node's peak memory against
   its budget), then saves ``(round, weights)`` through
   :class:`~edgetrain.train.state.StateStore` (atomic, checksummed).

A server killed at any point resumes from the last saved round: metric lines of later rounds are
dropped and the next round runs again from the same weights on the same batches. Nodes survive
a lost server: they reconnect until ``connect_timeout_s`` passes without one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import __version__
from ..errors import EdgetrainError, InfeasibleBudgetError
from ..sysutil.fileio import to_json
from ..units import format_bytes, parse_bytes
from .flower import NDArrays, NumPyClient, Scalar, grpc, start_client

__all__ = ["FederatedConfig", "FederatedError", "NodeData", "FederatedNode", "node_data", "initial_weights",
           "refuse_budgets_below_the_least_step", "run_client", "METRICS", "STATES", "SUMMARY", "SETTINGS", "LOGS",
           "Progress"]


METRICS = "metrics.jsonl"
STATES = "state"
SUMMARY = "summary.json"
SETTINGS = "federated.json"
LOGS = "logs"
SYNTHETIC_CLASSES = 10  # open_dataset's synthetic default: the server builds the model without the data
# What a node's budget sets aside beside its measured runtime baseline (NOTE [ Federated rounds ]): gRPC's and
# Flower's runtime, which start after the node planned, and a round's messages, which hold the weights several
# times over (Flower's received bytes and arrays, the reply's copy, its serialised bytes and message). Set from
# runs of the federated benchmark (``python -m benchmarks run federated``, 5 rounds; in-situ nodes with its
# ``STORES`` set): in-situ nodes (0.1 MB of weights) peaked 60-64 MiB above the runtime baseline + planned step
# prediction without them, ResNet-18 nodes (44.7 MB) 206-333 MiB.
FLOWER_RUNTIME_BYTES = 96 * 2**20
MESSAGE_COPIES = 6
Progress = Callable[[dict[str, Any]], None]


class FederatedError(EdgetrainError):
    """A federated run that cannot go on: an unreachable server, a node's reply that is not the model's weights,
    a node that failed."""


@dataclass(frozen=True)
class FederatedConfig:
    """One federated run: the server's rounds, every node's data and budget.

    Args:
        nodes: client processes (one data slice or in-situ store each).
        rounds: FedAvg rounds in all (a resumed run continues up to this).
        local_steps: optimizer steps a node takes per round.
        batch: samples per local step.
        stores: in-situ node folders (``edgetrain insitu run``'s ``teacher.pt`` and ``frames/``), one
            per node; empty: the generic task, ``model`` on a slice of synthetic ``data`` per node.
        memory: every node's process budget (one for all, or one per node); None: no budget.
        address: the server's ``host:port``.
        threads: torch threads per node process.
    """

    run_dir: str
    nodes: int = 2
    rounds: int = 3
    local_steps: int = 10
    batch: int = 32
    lr: float | None = None
    optimizer: str = "sgd"
    seed: int = 0
    model: str = "resnet18_cifar"
    samples: int = 1000
    image: int = 32
    stores: tuple[str, ...] = ()
    memory: tuple[str | None, ...] = ()
    address: str = "127.0.0.1:8080"
    connect_timeout_s: float = 60.0
    round_timeout_s: float = 600.0
    threads: int = 1
    resume: bool = False
    overwrite: bool = False

    def check(self) -> None:
        """Refuse settings that cannot work, in one line, before any process starts."""
        from ..core.chain import OPTIMIZERS
        from ..models import get_model_spec

        for name, value in (("--nodes", self.nodes), ("--rounds", self.rounds), ("--local-steps", self.local_steps),
                            ("--batch", self.batch), ("--samples", self.samples), ("--threads", self.threads)):
            if value < 1:
                raise FederatedError(f"{name} must be at least 1, got {value}")
        if self.optimizer not in OPTIMIZERS:
            raise FederatedError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.stores and len(self.stores) != self.nodes:
            raise FederatedError(f"give one --store per node: {len(self.stores)} for {self.nodes} nodes")
        if len(self.memory) not in (0, 1, self.nodes):
            raise FederatedError(f"--memory: give one value for all nodes or one per node ({self.nodes}), "
                                 f"got {len(self.memory)}")
        for node in range(self.nodes):
            self.budget_bytes(node)
        if not self.stores:
            get_model_spec(self.model)
        for store in self.stores:
            _teacher_path(Path(store))
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise FederatedError(f"the server address must be HOST:PORT, got {self.address!r}")

    def budget_bytes(self, node: int) -> int | None:
        """Node ``node``'s process budget in bytes; None without one."""
        value = None if not self.memory else self.memory[0] if len(self.memory) == 1 else self.memory[node]
        try:
            return None if value is None else parse_bytes(value)
        except ValueError as exc:
            raise FederatedError(f"--memory: {exc}") from None

    def settings(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues (not the rounds, budgets or address)."""
        kept = ("local_steps", "batch", "lr", "optimizer", "seed", "model", "samples", "image", "stores", "nodes")
        return {"edgetrain": __version__, **{key: getattr(self, key) for key in kept}}

    def to_json(self) -> str:
        return to_json(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FederatedConfig:
        values = json.loads(text)
        return cls(**{**values, "stores": tuple(values["stores"]), "memory": tuple(values["memory"])})


# ------------------------------------------------------------------------------------------------ a node


@dataclass(frozen=True)
class NodeData:
    """What one node trains and evaluates on; it never leaves the node.

    ``own_samples`` weighs the node in the average: its own training samples (an in-situ node's
    stored frames, not the teacher's replay crops every node ships with).
    """

    train_x: torch.Tensor  # (n, ...) inputs
    train_y: torch.Tensor  # (n,) int64 labels
    val_x: torch.Tensor
    val_y: torch.Tensor
    own_samples: int
    augment: bool = False  # in-situ crops: flipped and brightness-jittered as the student's are


def node_data(config: FederatedConfig, node: int) -> NodeData:
    """Node ``node``'s data: its in-situ store, or every ``nodes``-th sample of the synthetic set from ``node`` on.

    Raises:
        FederatedError: a node with no training sample or no held-out one.
    """
    data = _store_data(Path(config.stores[node])) if config.stores else _synthetic_slice(config, node)
    if data.own_samples == 0 or len(data.val_y) == 0:
        where = config.stores[node] if config.stores else f"slice {node} of {config.samples} samples"
        raise FederatedError(f"node {node} ({where}) has {data.own_samples} training and {len(data.val_y)} held-out "
                             "samples: it needs some of both")
    return data


def _synthetic_slice(config: FederatedConfig, node: int) -> NodeData:
    from ..data import collate_skip_corrupt, open_dataset
    from ..models import get_model_spec

    train, val, _ = open_dataset("synthetic", image_size=config.image, samples=config.samples, seed=config.seed,
                                 root=Path(config.run_dir) / "data", classes=SYNTHETIC_CLASSES,
                                 vocab_size=get_model_spec(config.model).vocab_size)

    def part(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        batch = collate_skip_corrupt([dataset[i] for i in range(node, len(dataset), config.nodes)])
        return (torch.zeros(0), torch.zeros(0, dtype=torch.int64)) if batch is None else batch

    (train_x, train_y), (val_x, val_y) = part(train), part(val)
    return NodeData(train_x, train_y, val_x, val_y, own_samples=len(train_y))


def _store_data(root: Path) -> NodeData:
    """An in-situ node's stored frames (held-out tracks apart, as its student's) plus its teacher's replay crops."""
    from ..insitu.model import to_tensor
    from ..insitu.student import FRAMES, stored_split

    teacher = _teacher(root)
    (own_x, own_y), (held_x, held_y) = stored_split(root / FRAMES)
    train_x = np.concatenate([own_x, teacher.replay_crops])
    train_y = np.concatenate([own_y, teacher.replay_labels.astype(np.int64)])
    return NodeData(to_tensor(train_x), torch.from_numpy(train_y), to_tensor(held_x), torch.from_numpy(held_y),
                    own_samples=len(own_y), augment=True)


def _teacher_path(root: Path) -> Path:
    """``root``'s teacher file; refuses a folder that is not an in-situ node's."""
    from ..insitu.student import TEACHER

    if not (root / TEACHER).exists():
        raise FederatedError(f"{root} is not an in-situ node folder (no {TEACHER}; make one with "
                             "`edgetrain insitu run --store`)")
    return root / TEACHER


def _teacher(root: Path) -> Any:
    from ..insitu.teacher import load_teacher

    return load_teacher(_teacher_path(root))


def _build_model(config: FederatedConfig, node: int = 0) -> nn.Module:
    """The model at round 0: the zoo's ``model`` seeded by ``seed``, or the in-situ teacher of ``node``'s store
    (the global model starts from node 0's)."""
    import copy

    from ..models import get_model_spec

    if config.stores:
        return copy.deepcopy(_teacher(Path(config.stores[node])).model).train()
    torch.manual_seed(config.seed)
    return get_model_spec(config.model).build(SYNTHETIC_CLASSES)


def _shared_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The entries of the state that travel: floating-point parameters and buffers, in ``state_dict`` order."""
    return [(name, value) for name, value in model.state_dict().items() if value.is_floating_point()]


def _weights(model: nn.Module) -> NDArrays:
    """The model's shared entries as they travel (copies, as NumPy arrays)."""
    return [value.detach().numpy().copy() for _, value in _shared_entries(model)]


def initial_weights(config: FederatedConfig) -> NDArrays:
    """The global weights of round 0 (what :func:`run_server` starts a fresh run from)."""
    return _weights(_build_model(config))


class FederatedNode:
    """One node: its data, its model and the step planned under its process budget.

    Built once per node process: it loads the data, runs one warm-up step, measures the runtime
    baseline and plans (NOTE [ Process budget ]), so a budget that cannot hold refuses here, in
    one line, before the node connects.

    Raises:
        InfeasibleBudgetError: the least step does not fit beside the measured runtime baseline.
    """

    def __init__(self, config: FederatedConfig, node: int, data: NodeData | None = None) -> None:
        from ..profiling.process import configure_allocator, reset_peak, return_freed_memory
        from ..runtime import Checkpointed
        from ..train.budget import measure_runtime_baseline, split_process_budget

        self.config, self.node = config, node
        self.process_bytes = config.budget_bytes(node)
        if self.process_bytes is not None:  # as `edgetrain train --memory` (NOTE [ Returning freed memory ])
            configure_allocator()
        self.data = node_data(config, node) if data is None else data
        self.model = _build_model(config, node)
        x, y = self._batch(torch.Generator().manual_seed(config.seed))
        nn.functional.cross_entropy(self.model(x), y).backward()  # thread pools and kernels up, as a run's
        self.model.zero_grad(set_to_none=True)
        self.flower_bytes = _flower_bytes(self.model)
        self.runtime_baseline_bytes = measure_runtime_baseline(self.model, x, y)
        baseline_bytes = self.runtime_baseline_bytes + self.flower_bytes  # what the budget sets aside
        optimizer = config.optimizer
        if self.process_bytes is None:
            self.budget = None
            self.net = Checkpointed(self.model, sample=x, recompute=1.0, optimizer=optimizer, target=y)
        else:
            self.budget = split_process_budget(self.process_bytes, baseline_bytes)
            try:
                self.net = Checkpointed(self.model, sample=x, memory=max(self.budget.tensor_bytes, 1),
                                        optimizer=optimizer, target=y)
            except InfeasibleBudgetError as exc:  # in process terms, as `train --memory` refuses
                if exc.minimum_bytes is None:
                    raise
                raise _node_refusal(node, self.budget.infeasible(exc.minimum_bytes), self.flower_bytes) from None
        self.baseline_bytes = baseline_bytes
        self.entries = [name for name, _ in _shared_entries(self.model)]
        return_freed_memory()
        reset_peak()  # from here on the high-water mark is training's

    def _batch(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of ``batch`` samples drawn with replacement by ``generator`` (augmented for in-situ crops)."""
        from ..insitu.model import augment

        index = torch.randint(len(self.data.train_y), (self.config.batch,), generator=generator)
        x = self.data.train_x[index]
        return (augment(x, generator) if self.data.augment else x), self.data.train_y[index]

    def weights(self) -> NDArrays:
        """The node's current weights, as they travel."""
        return _weights(self.model)

    def load(self, weights: NDArrays) -> None:
        """Take the global weights; refuses arrays that are not this model's.

        Raises:
            FederatedError: another count, shape or dtype than this node's model.
        """
        state = self.model.state_dict()
        if len(weights) != len(self.entries):
            raise FederatedError(f"node {self.node}: the server sent {len(weights)} arrays, the model has "
                                 f"{len(self.entries)} (another model?)")
        for name, array in zip(self.entries, weights, strict=True):
            target = state[name]
            if tuple(array.shape) != tuple(target.shape) or torch.from_numpy(array).dtype != target.dtype:
                raise FederatedError(f"node {self.node}: the server's {name} is {array.dtype}{list(array.shape)}, "
                                     f"the model's {target.dtype}{list(target.shape)} (another model?)")
            with torch.no_grad():
                target.copy_(torch.from_numpy(array))

    def fit(self, weights: NDArrays, round_: int) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """``local_steps`` steps from ``weights`` (NOTE [ Federated rounds ]); the new weights, the node's own
        samples and its metrics (mean training loss, memory)."""
        from ..core.optim import make_optimizer
        from ..profiling.process import read_process_memory
        from ..train.budget import ProcessBudget

        self.load(weights)
        optimizer = make_optimizer(self.config.optimizer, self.model.parameters(), self.config.lr)
        seed = int(np.random.SeedSequence([self.config.seed, self.node, round_]).generate_state(1)[0])
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout draws from the process's generator
        self.net.train()
        loss_sum = 0.0
        for _ in range(self.config.local_steps):
            x, y = self._batch(generator)
            loss = nn.functional.cross_entropy(self.net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += float(loss.detach())
        metrics: dict[str, Scalar] = {
            "node": self.node, "train_loss": loss_sum / self.config.local_steps,
            "peak_rss_bytes": int(read_process_memory().peak_rss_bytes), "budget_bytes": self.process_bytes or 0,
            "planned_step_bytes": int(self.net.plan.predicted_peak_bytes),
            "predicted_peak_bytes": ProcessBudget(0, self.baseline_bytes).predicted_process_bytes(
                self.net.plan.predicted_peak_bytes),
            "runtime_baseline_bytes": int(self.runtime_baseline_bytes), "flower_bytes": self.flower_bytes}
        return self.weights(), self.data.own_samples, metrics

    def evaluate(self, weights: NDArrays) -> tuple[float, int, dict[str, Scalar]]:
        """Loss and accuracy of ``weights`` on the node's held-out data."""
        from torch.utils.data import TensorDataset

        from ..train.loop import evaluate

        self.load(weights)
        accuracy, loss = evaluate(self.model, TensorDataset(self.data.val_x, self.data.val_y), self.config.batch)
        assert accuracy is not None and loss is not None  # node_data refuses a node without held-out data
        return float(loss), len(self.data.val_y), {"node": self.node, "accuracy": float(accuracy)}


def _flower_bytes(model: nn.Module) -> int:
    """What a node's budget sets aside beside its runtime baseline for gRPC and a round's messages."""
    weights_bytes = sum(v.numel() * v.element_size() for _, v in _shared_entries(model))
    return FLOWER_RUNTIME_BYTES + MESSAGE_COPIES * weights_bytes


def _node_refusal(node: int, refusal: InfeasibleBudgetError, flower_bytes: int) -> InfeasibleBudgetError:
    """Node ``node``'s refusal of its budget, saying what the baseline sets aside for Flower."""
    return InfeasibleBudgetError(f"node {node}: {refusal}; the baseline includes {format_bytes(flower_bytes)} set "
                                 f"aside for gRPC and a round's messages ({MESSAGE_COPIES} copies of the weights)",
                                 minimum_bytes=refusal.minimum_bytes, budget_bytes=refusal.budget_bytes)


def refuse_budgets_below_the_least_step(config: FederatedConfig) -> None:
    """Refuse, before anything is written, every node whose budget cannot hold its least step, as the node would.

    The least step is profiled here on a batch of the node's shape read without writing (its
    in-situ store's samples, or an example batch of the synthetic task), beside the runtime
    baseline estimated for a fresh training process
    (:func:`~edgetrain.train.budget.estimate_runtime_baseline_bytes`) and what Flower is given. A
    node measures its own baseline, typically higher, so a budget let through here may still be
    refused by the node, never one the other way round.

    Raises:
        InfeasibleBudgetError: the first node refused (as its own refusal reads).
        FederatedError: a node's store has no training or no held-out sample.
    """
    from ..planners.choose import least_step_bytes
    from ..profiling import profile
    from ..train.budget import ProcessBudget, estimate_runtime_baseline_bytes

    budgets = [config.budget_bytes(node) for node in range(config.nodes)]
    if all(budget is None for budget in budgets):
        return
    baseline = estimate_runtime_baseline_bytes()
    for node, budget in enumerate(budgets):
        if budget is None:
            continue
        model = _build_model(config, node)
        x, y = _example_batch(config, node)
        least = least_step_bytes(profile(model, x, y, optimizer=config.optimizer, repeats=1))
        flower = _flower_bytes(model)
        process = ProcessBudget(budget, baseline + flower)
        if process.predicted_process_bytes(least) > budget:
            raise _node_refusal(node, process.infeasible(least), flower)


def _example_batch(config: FederatedConfig, node: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of node ``node``'s shape, read without writing: its in-situ store's first samples, or an example of
    the synthetic task (whose data a node generates into the run directory)."""
    from ..models import get_model_spec

    if config.stores:
        data = node_data(config, node)
        index = torch.arange(config.batch) % len(data.train_y)
        return data.train_x[index], data.train_y[index]
    spec = get_model_spec(config.model)
    return spec.example_input(config.batch, config.image), spec.example_target(config.batch,
                                                                               num_classes=SYNTHETIC_CLASSES)


class _FlowerClient(NumPyClient):
    """Flower's view of a :class:`FederatedNode` (NumPy arrays in, NumPy arrays out); ``heard_s`` is when the
    server last asked for something (``time.monotonic``)."""

    def __init__(self, node: FederatedNode) -> None:
        self.node = node
        self.heard_s = time.monotonic()

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        self.heard_s = time.monotonic()
        return self.node.weights()

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        self.heard_s = time.monotonic()
        return self.node.fit(parameters, int(config["round"]))

    def evaluate(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[float, int, dict[str, Scalar]]:
        self.heard_s = time.monotonic()
        return self.node.evaluate(parameters)


def run_client(config: FederatedConfig, node: FederatedNode) -> None:
    """Serve ``node`` to the server at ``config.address`` until the run ends; reconnects to a restarted server.

    Raises:
        FederatedError: no server answered for ``connect_timeout_s`` (at start, or after losing it).
    """
    flower = _FlowerClient(node)
    while True:
        try:
            start_client(server_address=config.address, client=flower.to_client(), insecure=True)
            return  # the server ended the run
        except grpc.RpcError as exc:  # no server, or it went away: wait for one (a resumed server) to answer
            waited_s = time.monotonic() - flower.heard_s
            if waited_s > config.connect_timeout_s:
                status = exc.code().name if hasattr(exc, "code") else type(exc).__name__
                raise FederatedError(f"node {node.node}: the server at {config.address} did not answer for "
                                     f"{waited_s:.0f} s ({status}); is it running?") from None
            time.sleep(0.5)


# ------------------------------------------------------------------------------------------------ processes

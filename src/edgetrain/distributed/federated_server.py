"""The federated run's server: FedAvg over every node each round, its records and saved state, and the run directory
it continues (NOTE [ Federated rounds ] in ``federated.py``)."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..sysutil.fileio import read_jsonl, write_json
from .federated import METRICS, SETTINGS, STATES, SUMMARY, FederatedConfig, FederatedError, initial_weights
from .flower import (
    ClientProxy,
    FedAvg,
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
    ServerConfig,
    aggregate,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
    start_server,
    weighted_loss_avg,
)
from .group import config_hash

if TYPE_CHECKING:
    from ..train.loop import MetricsLog
    from ..train.state import StateStore

__all__ = ["FederatedStrategy", "finished_summary", "open_run", "run_server"]


def _payload_bytes(parameters: Parameters) -> int:
    """Bytes of the serialised arrays in a message (NumPy ``.npy`` blobs; gRPC's framing not counted)."""
    return sum(len(blob) for blob in parameters.tensors)


class FederatedStrategy(FedAvg):
    """FedAvg over every node each round, with the checks, records and saved state of NOTE [ Federated rounds ].

    ``done`` rounds were run before (a resumed run): Flower's round ``r`` is the run's round ``done + r``.
    """

    def __init__(self, config: FederatedConfig, weights: NDArrays, done: int, store: StateStore | None,
                 metrics: MetricsLog | None) -> None:
        super().__init__(fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=config.nodes,
                         min_evaluate_clients=config.nodes, min_available_clients=config.nodes,
                         initial_parameters=ndarrays_to_parameters(weights), accept_failures=False,
                         on_fit_config_fn=self._round_config, on_evaluate_config_fn=self._round_config)
        self.config, self.done, self.store, self.metrics = config, done, store, metrics
        self.reference = [(w.shape, w.dtype) for w in weights]
        self.current = weights
        self.record: dict[str, Any] = {}
        self.started = time.perf_counter()

    def _round_config(self, server_round: int) -> dict[str, Scalar]:
        return {"round": self.done + server_round}

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> Any:
        instructions = super().configure_fit(server_round, parameters, client_manager)  # waits for every node
        self.started = time.perf_counter()  # the round's own time, not the nodes' start-up
        return instructions

    def _check(self, node: int, arrays: NDArrays, metrics: dict[str, Scalar]) -> None:
        """A reply is the model's weights and numbers: nothing else crosses (no sample, no text)."""
        shapes = [(a.shape, a.dtype) for a in arrays]
        if shapes != self.reference:
            raise FederatedError(f"node {node} replied with arrays that are not the model's weights: "
                                 f"{len(arrays)} arrays, first {shapes[:1]}; expected {len(self.reference)}, "
                                 f"first {self.reference[:1]}")
        foreign = [k for k, v in metrics.items() if isinstance(v, (str, bytes))]
        if foreign:
            raise FederatedError(f"node {node} replied with non-numeric metrics {foreign}: refused")

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]
                      ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if failures:
            raise FederatedError(f"round {self.done + server_round}: {len(failures)} of {self.config.nodes} nodes "
                                 f"failed ({_reason(failures[0])}); the run stops at the last saved round")
        replies = sorted(((int(res.metrics["node"]), parameters_to_ndarrays(res.parameters), res)
                          for _, res in results), key=lambda reply: reply[0])
        for node, arrays, res in replies:
            self._check(node, arrays, res.metrics)
        self.current = aggregate([(arrays, res.num_examples) for _, arrays, res in replies])
        samples = sum(res.num_examples for _, _, res in replies)
        sent = _payload_bytes(ndarrays_to_parameters(self.current))
        self.record = {
            "round": self.done + server_round, "step": self.done + server_round, "epoch": 0,
            "train_loss": sum(float(res.metrics["train_loss"]) * res.num_examples for _, _, res in replies) / samples,
            "bytes_down": 2 * sent * len(replies),  # the weights to every node for fit and for evaluate
            "bytes_up": sum(_payload_bytes(res.parameters) for _, _, res in replies),
            "nodes": [{"node": node, "samples": res.num_examples,
                       **{k: res.metrics[k] for k in ("train_loss", "peak_rss_bytes", "predicted_peak_bytes",
                                                      "budget_bytes", "planned_step_bytes",
                                                      "runtime_baseline_bytes", "flower_bytes")}}
                      for node, _, res in replies]}
        return ndarrays_to_parameters(self.current), {}

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, Any]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        from ..train.state import TrainingState

        if failures:
            raise FederatedError(f"round {self.done + server_round}: {len(failures)} of {self.config.nodes} nodes "
                                 f"failed to evaluate ({_reason(failures[0])})")
        loss = weighted_loss_avg([(res.num_examples, res.loss) for _, res in results])
        held_out = sum(res.num_examples for _, res in results)
        accuracy = sum(float(res.metrics["accuracy"]) * res.num_examples for _, res in results) / held_out
        round_ = self.done + server_round
        assert self.metrics is not None and self.store is not None  # None only where a test calls _check
        self.metrics.append({**self.record, "loss": loss, "accuracy": accuracy, "held_out": held_out,
                             "time_s": time.perf_counter() - self.started, "wall_time": time.time()})
        self.store.save(TrainingState(step=round_, epoch=0, model=_as_state(self.current),
                                      metadata={"settings": config_hash(self.config.settings())}))
        return loss, {"accuracy": accuracy}


def _reason(failure: Any) -> str:
    return f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) else str(failure[1].status)


def _as_state(weights: NDArrays) -> dict[str, torch.Tensor]:
    return {f"{i:04d}": torch.from_numpy(np.ascontiguousarray(w)) for i, w in enumerate(weights)}


def finished_summary(config: FederatedConfig) -> dict[str, Any] | None:
    """The saved summary when ``resume`` finds the run in ``config.run_dir`` made with these settings and every
    round served (a summary of at least ``config.rounds`` rounds), else None. It only reads: a finished run's
    resume changes no file."""
    run = Path(config.run_dir)
    if not config.resume:
        return None
    try:
        theirs = json.loads((run / SETTINGS).read_text())
        summary = json.loads((run / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(theirs, dict) or theirs.get("hash") != config_hash(config.settings()):
        return None  # open_run refuses it, naming the settings
    rounds = summary.get("rounds") if isinstance(summary, dict) else None
    return summary if isinstance(rounds, int) and rounds >= config.rounds else None


def open_run(config: FederatedConfig) -> tuple[int, NDArrays | None]:
    """Start or continue the run in ``config.run_dir``: the rounds done and the global weights saved after them
    (None for a fresh run).

    Raises:
        FederatedError: a run is there and neither ``resume`` nor ``overwrite`` is set, or the run there was
            made with other settings.
    """
    from ..train.loop import truncate_metrics
    from ..train.state import StateStore

    run = Path(config.run_dir)
    settings = run / SETTINGS
    if settings.exists() and config.overwrite:
        for name in (STATES, METRICS, SUMMARY, SETTINGS):
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    elif settings.exists() and not config.resume:
        raise FederatedError(f"{run} holds a federated run: --resume continues it, --overwrite replaces it")
    run.mkdir(parents=True, exist_ok=True)
    mine = config_hash(config.settings())
    if settings.exists():
        theirs = json.loads(settings.read_text())
        if theirs.get("hash") != mine:
            raise FederatedError(f"{run} was made with other settings ({theirs.get('settings')}); resume it with "
                                 "those, or --overwrite")
    write_json(settings, {"hash": mine, "settings": config.settings()})
    state = StateStore(run / STATES, keep_last=2).load_latest()
    done = 0 if state is None else state.step
    truncate_metrics(run / METRICS, None if state is None else (done, 0))
    return done, None if state is None else [state.model[key].numpy() for key in sorted(state.model)]


def run_server(config: FederatedConfig) -> dict[str, Any]:
    """Serve the run's remaining rounds to ``config.nodes`` nodes at ``config.address``; returns the summary
    (also written to ``summary.json``)."""
    from ..train.loop import MetricsLog
    from ..train.state import StateStore

    run = Path(config.run_dir)
    done, saved = open_run(config)
    started = time.perf_counter()
    if done < config.rounds:
        weights = initial_weights(config) if saved is None else saved
        with MetricsLog(run / METRICS) as metrics:
            strategy = FederatedStrategy(config, weights, done, StateStore(run / STATES, keep_last=2), metrics)
            start_server(server_address=config.address, strategy=strategy,
                         config=ServerConfig(num_rounds=config.rounds - done, round_timeout=config.round_timeout_s))
    summary = {"rounds": config.rounds, "resumed_from_round": done or None, "nodes": config.nodes,
               "task": "insitu" if config.stores else config.model, "wall_time_s": time.perf_counter() - started,
               "last": read_jsonl(run / METRICS)[-1:]}
    write_json(run / SUMMARY, summary)
    return summary

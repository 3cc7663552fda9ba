"""``edgetrain cluster federated``: FedAvg across camera nodes on Flower, each node training under its budget.

The main app registers it on ``edgetrain cluster`` in :mod:`edgetrain.cli`; the library, Flower and torch
are imported inside the command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from ..units import format_bytes
from .common import clean_errors, console

__all__ = ["federated_command"]


def _progress(rounds: int) -> Callable[[dict[str, Any]], None]:
    def report(record: dict[str, Any]) -> None:
        peaks = ", ".join(f"{format_bytes(n['peak_rss_bytes'])}" + (f" of {format_bytes(n['budget_bytes'])}"
                                                                    if n["budget_bytes"] else "")
                          for n in record["nodes"])
        console.print(f"round {record['round']}/{rounds}: held-out loss {record['loss']:.4f}, accuracy "
                      f"{record['accuracy']:.3f}, train loss {record['train_loss']:.4f}; weights "
                      f"{format_bytes(record['bytes_down'])} down, {format_bytes(record['bytes_up'])} up; "
                      f"node peaks {peaks}; {record['time_s']:.1f} s")

    return report


@clean_errors
def federated_command(
        nodes: int = typer.Option(2, "--nodes", "-n", min=1, help="Node processes to start."),
        rounds: int = typer.Option(3, "--rounds", min=1, help="FedAvg rounds in all (a resumed run goes on to it)."),
        local_steps: int = typer.Option(10, "--local-steps", min=1, help="Optimizer steps per node and round."),
        batch: int = typer.Option(32, "--batch", "-b", min=1, help="Samples per local step."),
        lr: float | None = typer.Option(None, "--lr", help="Learning rate (default 0.01 SGD, 0.001 Adam)."),
        optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (with momentum) or adam; its state stays "
                                      "on the node and starts afresh every round."),
        seed: int = typer.Option(0, "--seed", help="Seed of the model, the data and every node's batches."),
        model: str = typer.Option("resnet18_cifar", "--model", "-m", help="Model of the generic task (zoo name)."),
        samples: int = typer.Option(1000, "--samples", min=1, help="Synthetic samples in all, sliced among nodes."),
        image: int = typer.Option(32, "--image", min=1, help="Image side (sequence length for a token model)."),
        store: list[Path] = typer.Option([], "--store", help="In-situ node folder (from `edgetrain insitu run "
                                         "--camera SEED`), one per node: their students are averaged, the "
                                         "frames stay."),
        memory: list[str] = typer.Option([], "--memory", help="Process budget of every node, or one per node "
                                         "(as `train --memory`)."),
        port: int = typer.Option(0, "--port", min=0, help="The server's port on 127.0.0.1 (0: a free one)."),
        connect_timeout: float = typer.Option(60.0, "--connect-timeout", min=0.1, help="Seconds a node waits for "
                                              "the server."),
        round_timeout: float = typer.Option(600.0, "--round-timeout", min=0.1, help="Seconds a round may take."),
        threads: int = typer.Option(1, "--threads", min=1, help="Torch threads per node process."),
        run_dir: Path = typer.Option(Path("runs/federated"), "--run-dir", help="The server's metrics, state, "
                                     "summary and every process's log."),
        resume: bool = typer.Option(False, "--resume", help="Continue the run in --run-dir."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a run already in --run-dir.")) -> None:
    """Federated training on this machine: a Flower server and --nodes client processes; only weights travel."""
    from ..distributed.federated import FederatedConfig
    from ..distributed.federated_local import run_local
    from ..distributed.supervisor import free_port

    config = FederatedConfig(run_dir=str(run_dir), nodes=nodes, rounds=rounds, local_steps=local_steps, batch=batch,
                             lr=lr, optimizer=optimizer, seed=seed, model=model, samples=samples, image=image,
                             stores=tuple(str(s) for s in store), memory=tuple(memory),
                             address=f"127.0.0.1:{port or free_port()}", connect_timeout_s=connect_timeout,
                             round_timeout_s=round_timeout, threads=threads, resume=resume, overwrite=overwrite)
    summary = run_local(config, _progress(rounds))
    resumed = f", resumed after round {summary['resumed_from_round']}" if summary["resumed_from_round"] else ""
    console.print(f"{rounds} rounds on {nodes} nodes{resumed} in {summary['wall_time_s']:.1f} s; metrics: "
                  f"{run_dir / 'metrics.jsonl'}, logs: {run_dir / 'logs'}")


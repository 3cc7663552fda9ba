"""Federated mode: loss, bytes and every node's peak memory against its budget, per round.

Runs ``edgetrain cluster federated``'s library call (:func:`edgetrain.distributed.federated.run_local`: a
Flower server and one process per node on this machine, plain localhost processes, no shaping, no
cgroup) and tabulates each round's record from ``metrics.jsonl``: the held-out loss and accuracy of
the averaged model (weighted by the nodes' held-out samples), the nodes' mean training loss, the
bytes of serialised weights sent down (to every node, for training and for evaluation) and up, and
each node's peak resident memory (VmHWM from its planning on) against its ``--memory`` budget.

Usage: ``python benchmarks/federated.py [--nodes 2] [--rounds 5] [--local-steps 10] [--batch 32]
[--model resnet18_cifar] [--samples 1000] [--image 32] [--memory 1GiB] [--stores DIR,DIR]
[--optimizer sgd|adam] [--run-dir out/bench_federated] [--out PATH.json] [--md PATH.md]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from edgetrain.distributed.federated import METRICS, FederatedConfig
from edgetrain.distributed.federated_local import run_local
from edgetrain.distributed.supervisor import free_port
from edgetrain.units import format_bytes


def table(records: list[dict[str, Any]]) -> str:
    """One markdown row per round."""
    lines = ["| round | held-out loss | accuracy | train loss | bytes down | bytes up | "
             "node peaks (predicted) / budget | s |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in records:
        peaks = ", ".join(f"{format_bytes(n['peak_rss_bytes'])} ({format_bytes(n['predicted_peak_bytes'])})"
                          + (f" / {format_bytes(n['budget_bytes'])}" if n["budget_bytes"] else "")
                          for n in r["nodes"])
        lines.append(f"| {r['round']} | {r['loss']:.4f} | {r['accuracy']:.3f} | {r['train_loss']:.4f} | "
                     f"{r['bytes_down']:,} | {r['bytes_up']:,} | {peaks} | {r['time_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model", default="resnet18_cifar")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--memory", default=None, help="every node's process budget")
    parser.add_argument("--stores", default="", help="in-situ node folders, comma-separated, one per node")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--run-dir", type=Path, default=Path("out/bench_federated"))
    parser.add_argument("--out", type=Path, default=Path("out/bench_federated.json"))
    parser.add_argument("--md", type=Path, default=Path("out/bench_federated.md"))
    args = parser.parse_args()
    stores = tuple(s for s in args.stores.split(",") if s)
    config = FederatedConfig(run_dir=str(args.run_dir), nodes=args.nodes, rounds=args.rounds,
                             local_steps=args.local_steps, batch=args.batch, model=args.model, samples=args.samples,
                             image=args.image, stores=stores, memory=(args.memory,) if args.memory else (),
                             optimizer=args.optimizer, address=f"127.0.0.1:{free_port()}", overwrite=True)
    started = time.perf_counter()
    summary = run_local(config, lambda record: print(f"round {record['round']} done", flush=True))
    records = [json.loads(line) for line in (args.run_dir / METRICS).read_text().splitlines()]
    task = "in-situ stores " + ", ".join(stores) if stores else f"{args.model} on {args.samples} synthetic samples"
    md = (f"{args.nodes} nodes, {task}, {args.local_steps} local steps of {args.batch} per round, "
          f"{args.optimizer}; wall {time.perf_counter() - started:.0f} s\n\n{table(records)}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": vars(args) | {"run_dir": str(args.run_dir), "out": str(args.out),
                                                             "md": str(args.md)},
                                    "summary": summary, "rounds": records}, indent=2, default=str))
    args.md.write_text(md)
    print(md)


if __name__ == "__main__":
    main()

"""The **crashes** and **node-crashes** tables: whether compressed training crashes, counted over many runs.

* **crashes**: ``--crash-runs`` runs of 2 local processes training a tiny CNN with PowerSGD through the cluster step
  (a crash: any exception, or the nodes' weights differing).
* **node-crashes**: ``--node-crash-runs`` whole-node runs of ``cluster local`` per ``--node-crash-after`` value (the
  supervisor, ``--node-crash-nodes`` node processes, cross-node BatchNorm, PowerSGD rank ``--compress-rank`` after
  that many exact steps), seeds 0 .. N-1; a crash: a node killed by a signal, any restart or exception, or the
  nodes' final weights differing (each node logs its weights' digest). The default model, ResNet-18 with ImageNet's
  stem at 32 px, has the CIFAR ResNet-18's layers and so its collectives (the same BatchNorm layers, the same
  PowerSGD matrices but the stem's), at a fraction of the compute.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgetrain.distributed.node import NodeSpec
from edgetrain.distributed.supervisor import LOG_DIR, LocalOptions, run_local

from .common import int_list, keep_logs, log, run_config


def add_options(parser: argparse.ArgumentParser) -> None:
    """The crash tables' own options (:func:`.common.add_options` has the PowerSGD rank)."""
    parser.add_argument("--crash-runs", type=int, default=100, help="PowerSGD runs counted for crashes")
    parser.add_argument("--crash-steps", type=int, default=5)
    parser.add_argument("--node-crash-runs", type=int, default=50, help="whole-node runs per --node-crash-after value")
    parser.add_argument("--node-crash-model", default="resnet18")
    parser.add_argument("--node-crash-nodes", type=int, default=4)
    parser.add_argument("--node-crash-batch", type=int, default=32)
    parser.add_argument("--node-crash-steps", type=int, default=4)
    parser.add_argument("--node-crash-after", type=int_list, default=[0, 2],
                        help="PowerSGD after this many exact steps: one row of runs per value")


def _crash_runs(rank: int, runs: int, steps: int, scratch: str) -> None:
    """Node ``rank`` of 2: ``runs`` process groups, each training a tiny CNN ``steps`` steps with PowerSGD rank 2
    through :func:`cluster_step`; a run crashes on any exception or when the nodes' weights differ."""
    import torch
    import torch.distributed as dist

    from edgetrain.core.schedule import keep_all
    from edgetrain.distributed.compress import PowerSGD
    from edgetrain.distributed.step import cluster_step
    from edgetrain.models.stages import training_stages
    from edgetrain.runtime import Executor

    torch.set_num_threads(1)
    crashes = []
    for run in range(runs):
        try:
            dist.init_process_group("gloo", init_method=f"file://{scratch}/store-{run}", rank=rank, world_size=2)
            torch.manual_seed(run)
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
                                        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))
            stages = training_stages(model)
            executor, optimizer = Executor(stages, keep_all(len(stages)), None), torch.optim.SGD(
                model.parameters(), lr=0.05, momentum=0.9)
            compressor = PowerSGD(model.parameters(), 2, seed=run)
            generator = torch.Generator().manual_seed(1000 * run + rank)
            for _ in range(steps):
                batch = torch.randn(3 + rank, 3, 8, 8, generator=generator), torch.randint(0, 10, (3 + rank,),
                                                                                           generator=generator)
                cluster_step(executor, model, optimizer, batch, compressor=compressor)
            checksum = torch.cat([p.detach().flatten() for p in model.parameters()]).double().sum().reshape(1)
            low, high = checksum.clone(), checksum.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if not torch.equal(low, high):
                crashes.append(f"run {run}: the nodes' weights differ")
            dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 -- a crash of any kind is what is counted here
            crashes.append(f"run {run}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            if dist.is_initialized():
                dist.destroy_process_group()
    Path(scratch, f"crashes-{rank}.json").write_text(json.dumps(crashes))


def crashes(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """``--crash-runs`` runs of 2 local processes (no emulation) with PowerSGD rank 2: runs that crashed."""
    import torch.multiprocessing as mp

    folder = scratch / "crashes"
    folder.mkdir()
    started = time.time()
    context = mp.start_processes(_crash_runs, args=(args.crash_runs, args.crash_steps, str(folder)), nprocs=2,
                                 join=False, start_method="spawn")
    try:
        while not context.join():
            pass
        failed = sorted({c for r in range(2) for c in json.loads((folder / f"crashes-{r}.json").read_text())})
    except mp.ProcessRaisedException as exc:  # a node died: every run counts as crashed
        failed = [f"a node died: {str(exc).splitlines()[-1]}"] * args.crash_runs
    rows = [{"runs": args.crash_runs, "steps": args.crash_steps, "crashed_runs": len({f.split(':')[0] for f in failed}),
             "errors": failed[:10], "wall_s": time.time() - started}]
    log.info("crashes %s", rows[-1])
    return rows


_DIGEST = re.compile(r"node (\d+): weights after step \d+: sha256 ([0-9a-f]+)")


def node_crashes(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """Whole-node compressed runs through ``cluster local``, one row per ``--node-crash-after`` value: how many
    crashed, and how (see the module's docstring). Spares are off: with no restart allowed they never train."""
    rows = []
    for after in args.node_crash_after:
        started, problems = time.time(), []
        for seed in range(args.node_crash_runs):
            config = replace(run_config(scratch / f"node-crash-{after}-{seed}", args.node_crash_model,
                                        args.node_crash_batch, args.node_crash_steps, args.image), seed=seed)
            options = LocalOptions(compress_rank=args.compress_rank, compress_after=after, max_restarts=0,
                                   spares=False)
            try:
                run_local(config, [NodeSpec()] * args.node_crash_nodes, options)
                problem = weights_parted(config.run_dir, args.node_crash_nodes)
            except Exception as exc:  # noqa: BLE001 -- a crash of any kind is what is counted here
                problem = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            if problem:
                kept = keep_logs(config.run_dir, args.out.parent / "crash-logs" / config.run_dir.name)
                log.warning("seed %d crashed: %s (node logs: %s)", seed, problem, kept)
                problems.append(f"seed {seed}: {problem}")
            if config.run_dir.exists():  # its data and rank 0's state: 100 runs would fill the disk
                shutil.rmtree(config.run_dir)
        rows.append({"model": args.node_crash_model, "nodes": args.node_crash_nodes, "batch": args.node_crash_batch,
                     "steps": args.node_crash_steps, "compress_rank": args.compress_rank, "compress_after": after,
                     "runs": args.node_crash_runs, "crashed_runs": len(problems), "crashes": problems,
                     "wall_s": time.time() - started})
        log.info("node crashes %s", rows[-1])
    return rows


def weights_parted(run_dir: Path, nodes: int) -> str | None:
    """Why a finished run's nodes do not end with the same weights (from the digests they log); None when they do."""
    digests: dict[int, str] = {}
    for node in range(nodes):
        text = (run_dir / LOG_DIR / f"attempt-0-node-{node}.log").read_text(errors="replace")
        digests.update((int(rank), digest) for rank, digest in _DIGEST.findall(text))
    if len(digests) < nodes:
        return f"nodes {sorted(set(range(nodes)) - set(digests))} logged no final weights"
    return None if len(set(digests.values())) == 1 else f"the nodes' weights differ: {digests}"


def render(result: dict[str, Any]) -> list[str]:
    """The crash tables' markdown lines (none when ``result`` has neither)."""
    out: list[str] = []
    for r in result.get("crashes", []):
        errors = ": " + "; ".join(r["errors"]) if r["errors"] else ""
        out += ["", f"PowerSGD rank 2, 2 local processes, a tiny CNN: {r['crashed_runs']} of {r['runs']} runs of "
                f"{r['steps']} steps crashed ({r['wall_s']:.0f} s){errors}"]
    if result.get("node-crashes"):
        out += ["", "| model | nodes | batch | steps | PowerSGD | runs | crashed | wall s | crashes |",
                "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in result.get("node-crashes", []):
        out.append(f"| {r['model']} | {r['nodes']} | {r['batch']} | {r['steps']} | rank {r['compress_rank']} after "
                   f"{r['compress_after']} exact steps | {r['runs']} | {r['crashed_runs']} | {r['wall_s']:.0f} | "
                   f"{'; '.join(r['crashes']) or '-'} |")
    return out

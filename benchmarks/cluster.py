"""Data-parallel training across emulated edge nodes: scaling, periodic averaging for slow links, failures survived.

Tables from ``edgetrain cluster local`` runs on this machine; every time they print is the
median over ``--repeats`` runs with its IQR and CoV (:func:`edgetrain.bench.stats.spread`). Each family of
tables is a module of ``benchmarks/_cluster/``, whose docstring says what its tables measure:

* **link** (``link.py``): what an emulated link delivers between two nodes: round trips, throughput, the switch's
  counters.
* **scaling** (``scaling.py``): throughput of ResNet-18 (CIFAR stem, 32 px) per number of nodes x network preset x
  global batch, with the share of each step spent in the all-reduces.
* **ttt** (``ttt.py``): time to a target training loss, one node against N (exact, PowerSGD, periodic averaging,
  DiLoCo), once per seed.
* **compression** (``compression.py``): the held-out loss of PowerSGD, periodic averaging and DiLoCo against
  single-node training and the exact all-reduce, seed by seed, on the slowest link.
* **failures** and **save** (``failures.py``): a node killed, stopped or cut off on 3 nodes (detection, restarts,
  steps lost and repeated, stall), and what a durable save of the training state costs.
* **crashes** and **node-crashes** (``crashes.py``): crashes of PowerSGD training over many runs, of 2 local
  processes through the cluster step and of whole ``cluster local`` runs.

Repeats go in rounds over a table's points (all points once, then again), so a change in the
machine's load spreads over every point. Spares are off in the scaling and compression runs (no
failure is expected there).

As root, nodes run in network namespaces with tc-shaped links and cgroup CPU quotas (NOTE [ What
the emulation is ]); otherwise as plain processes, which the output says. Writes JSON (``--out``,
every run's figures too) and a markdown table (``--md``), and prints the markdown.

Usage: ``python benchmarks/cluster.py [--nodes 1,2,4] [--presets gigabit,100mbit,wifi20] [--batches 8,32]
[--steps N] [--average-every K] [--outer-lr L] [--outer-momentum M] [--ttt-modes single,...] [--compress-rank R]
[--compress-after N] [--compress-steps N] [--compress-epochs E] [--compress-modes powersgd:8:10,average,...]
[--compress-seed S] [--lr-schedule constant|cosine]
[--repeats R]
[--failures kill,stop,cut] [--failure-preset gigabit|wifi20] [--crash-runs N] [--saves N] [--local-batch-norm]
[--node-crash-runs N] [--node-crash-model M] [--node-crash-nodes N] [--node-crash-batch B] [--node-crash-steps S]
[--node-crash-after A,B] [--tables link,scaling,ttt,compression,failures,crashes,node-crashes,save] [--out PATH]
[--md PATH] [--keep-runs DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _cluster import common, compression, crashes, failures, link, scaling, ttt
from _cluster.common import load_average, name_list, write_result

from edgetrain.bench.stats import rerun_command
from edgetrain.distributed.netns import can_emulate

Table = Callable[[argparse.Namespace, Path, float], list[dict[str, Any]]]
# Run in this order, so the result's tables are in this order; each family renders its own tables' markdown.
TABLES: tuple[tuple[str, Table], ...] = (
    ("link", link.link), ("scaling", scaling.scaling), ("ttt", ttt.time_to_target),
    ("compression", compression.compression), ("failures", failures.failures), ("crashes", crashes.crashes),
    ("node-crashes", crashes.node_crashes), ("save", failures.state_saves))
FAMILIES = (link, scaling, ttt, compression, failures, crashes)


def markdown(result: dict[str, Any]) -> str:
    """The result as markdown: how to rerun it, each family's tables in turn, and how the nodes were emulated."""
    out = [f"Machine shared with other work (load average {result['load_before']} before, {result['load_after']} "
           f"after); rerun with `{result['command']}`. {result['cpu_note']}", ""]
    for family in FAMILIES:
        out += family.render(result)
    tables = ("link", "scaling", "ttt", "compression", "failures")
    emulations = sorted({r["emulation"] for t in tables for r in result.get(t, [])
                         if r.get("emulation")})
    out += ["", "Emulation: " + " / ".join(emulations)] if emulations else []
    if any(result.get(t) for t in ("scaling", "ttt", "compression")):
        local = result.get("local_batch_norm")
        out += ["", "BatchNorm: " + ("each node over its own slice (--local-batch-norm)" if local
                                     else "over the global batch (NOTE [ Cross-node BatchNorm ]; periodic averaging: "
                                     "each node over its own slice)")]
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def _scratch(kept: Path | None) -> Iterator[str]:
    """The folder the runs go in: ``kept`` (made if missing, left in place; refused when not empty, as a run folder
    that is already there would be resumed, not run) or a temporary one."""
    if kept is not None:
        if kept.exists() and any(kept.iterdir()):
            raise SystemExit(f"--keep-runs {kept}: not empty (a run already there would be resumed)")
        kept.mkdir(parents=True, exist_ok=True)
        yield str(kept)
        return
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as scratch:
        yield scratch


def _parser() -> argparse.ArgumentParser:
    """Every table's options, each declared once: the shared ones (:func:`_cluster.common.add_options`), each
    family's own, then this entry point's (the quota, which tables, where the results go)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_options(parser)
    for family in FAMILIES:
        family.add_options(parser)
    parser.add_argument("--cpus-per-node", type=float, default=None,
                        help="each node's CPU quota in cores (default: cores / the largest of --nodes)")
    parser.add_argument("--tables", type=name_list, default=[name for name, _ in TABLES])
    parser.add_argument("--keep-runs", type=Path, default=None,
                        help="run every table's runs in this folder and keep them (default: a scratch folder removed "
                        "at the end, also when the benchmark is stopped)")
    parser.add_argument("--out", type=Path, default=Path("out/bench_cluster.json"))
    parser.add_argument("--md", type=Path, default=Path("out/bench_cluster.md"))
    return parser


def main() -> None:
    """Run the ``--tables`` into one result: its JSON to ``--out``, its markdown to ``--md`` and stdout."""
    args = _parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    cpus = args.cpus_per_node or (os.cpu_count() or 1) / max(args.nodes)
    result: dict[str, Any] = {
        "load_before": load_average(), "local_batch_norm": args.local_batch_norm, "margin": args.margin,
        "command": rerun_command("benchmarks/cluster.py", vars(args), leave_out=("out", "md")),
        "cpu_note": (f"Each emulated node: {cpus:.2f} of this machine's {os.cpu_count()} cores (cgroup quota, the "
                     "same at every node count; the time-to-target table: cores / --ttt-nodes)."
                     if can_emulate() is None and args.presets != ["none"] else
                     f"Not emulated ({can_emulate() or 'preset none'}): nodes share the machine's {os.cpu_count()} "
                     "cores.")}
    with _scratch(args.keep_runs) as scratch:
        for table, build in TABLES:
            if table in args.tables:
                result[table] = build(args, Path(scratch), cpus)
    result["load_after"] = load_average()
    write_result(result, args.out, args.md, markdown)


if __name__ == "__main__":
    main()

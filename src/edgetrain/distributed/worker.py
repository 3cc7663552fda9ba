"""``python -m edgetrain.distributed.worker SPEC.json``: one node started by ``edgetrain cluster local``.

``python -m edgetrain.distributed.worker --spare READY``: a warm spare (NOTE [ Warm spares ] in spares.py).
It imports torch and edgetrain and profiles a tiny model once (the profiler's first call imports
torch's dispatch and compile machinery: seconds), profiles its node at the shares it may get
next (a line ``{"spec": PATH, "shares": [...]}`` on stdin; then it touches READY), then waits for the line
``{"spec": PATH, "env": {...}}`` and runs that node; stdin's end (the supervisor gone) ends it.

The spec holds the run's :class:`~edgetrain.train.TrainConfig`, the node's
:class:`~edgetrain.distributed.NodeSpec` and its :class:`~edgetrain.distributed.ClusterOptions`;
the rank and the master come from torchrun's variables, as for ``edgetrain cluster run``.
Exit codes tell the supervisor what happened: 0 done, 2 a refusal (the same on every node: do
not restart), 3 the cluster broke under this node (a peer died or stopped answering).

A native crash (a C++ exception ending in ``std::terminate``: SIGABRT; SIGSEGV, SIGBUS, SIGFPE, SIGILL)
leaves no Python traceback of its own; :mod:`faulthandler` prints every thread's Python stack into the
node's log first, and the supervisor's message names that log (``NodeGroup._loss_line`` in ``supervisor.py``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ..train.config import TrainConfig
from .node import ClusterOptions, NodeSpec

__all__ = ["EXIT_REFUSED", "EXIT_PEER_LOST", "SPARE_FLAG", "write_spec", "read_spec", "main"]

EXIT_REFUSED = 2
EXIT_PEER_LOST = 3
SPARE_FLAG = "--spare"
_PATHS = ("run_dir", "data_root", "plan_file", "page_dir", "heartbeat", "profile_dir")


def write_spec(path: Path, config: TrainConfig, node: NodeSpec, options: ClusterOptions) -> Path:
    """Write what a worker needs to ``path`` (JSON)."""
    record = {"config": asdict(config), "node": asdict(node), "options": asdict(options)}
    path.write_text(json.dumps(record, default=str))
    return path


def _build(kind: Any, record: dict[str, Any]) -> Any:
    names = {f.name for f in fields(kind)}
    return kind(**{k: Path(v) if k in _PATHS and v is not None else v for k, v in record.items() if k in names})


def read_spec(path: Path) -> tuple[TrainConfig, NodeSpec, ClusterOptions]:
    record = json.loads(path.read_text())
    return _build(TrainConfig, record["config"]), _build(NodeSpec, record["node"]), _build(ClusterOptions,
                                                                                             record["options"])


def _warm_up() -> None:
    """Pay the first calls' costs now: the profiler's first run imports torch's dispatch machinery."""
    import torch

    from ..profiling import profile

    profile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)), torch.randn(2, 4),
            torch.tensor([0, 1]), repeats=1)


def _wait_for_work(ready: Path) -> Path | None:
    """A spare's orders: shares to profile ahead (``{"spec": PATH, "shares": [...]}``; ``ready`` is touched
    after), then the spec to run, with the node's rank and master put into the environment; None when stdin
    ends first."""
    import os

    from .node import profile_shares

    for line in sys.stdin:
        order = json.loads(line)
        if "shares" in order:
            profile_shares(*read_spec(Path(order["spec"])), order["shares"])
            ready.touch()
            continue
        os.environ.update(order["env"])
        return Path(order["spec"])
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one node; one line on stderr for any failure (NOTE [ One error on every node ])."""
    import faulthandler
    import logging
    import os

    faulthandler.enable(sys.stderr, all_threads=True)  # a native crash's stacks, into the node's log
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # one-line errors (see _quiet_c10d in cli/cluster.py)
    from ..errors import EdgetrainError
    from .group import ClusterEnv
    from .node import train_node

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if args[0] == SPARE_FLAG:
        _warm_up()
        spec = _wait_for_work(Path(args[1]))
        if spec is None:
            return 0
    else:
        spec = Path(args[0])
    config, node, options = read_spec(spec)
    try:
        train_node(config, node, ClusterEnv.from_environ(), options)
    except EdgetrainError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except RuntimeError as exc:  # gloo: a peer closed its connection or the collective timed out
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"error: the cluster broke: {first}", file=sys.stderr, flush=True)
        return EXIT_PEER_LOST
    return 0


if __name__ == "__main__":
    exit_code = main()
    if exit_code == EXIT_REFUSED:
        from .group import end_refused_node
        end_refused_node(exit_code)
    sys.exit(exit_code)

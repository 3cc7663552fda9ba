"""Joining the cluster and talking to it: the process group, the start-up handshake, the gradient all-reduce.

NOTE [ One error on every node ]
A node that refuses to train while the others wait would leave them hanging until the process
group's timeout (30 minutes by default in torch). So every check that can fail on one node
(edgetrain and torch versions, the run's settings, whether the node's memory budget holds its
share) is *gathered* first: each node sends its verdict with ``all_gather_object`` and every
node raises the same one-line error, naming the nodes at fault. Joining itself is bounded by
``connect_timeout_s`` (an unreachable master, a node that never comes) and every later
collective by ``timeout_s``.

NOTE [ Explicit all-reduce, not DDP ]
DDP hooks its reducer into the wrapped module's ``forward`` and into autograd's parameter
hooks, and assumes one forward and one backward per step. The executor runs the model stage
by stage and recomputes stages in the backward, calling the stages directly; DDP's ``forward``
never runs. DDP would also hold its own gradient buckets (25 MiB by default) outside the
planned budget, and it averages with ``1/N`` where heterogeneous shares need ``b_r/B``. So the
executor's backward runs untouched and the gradients are then summed in place, one
asynchronous all-reduce per parameter: no byte more than the plan counts.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from ..errors import EdgetrainError

__all__ = ["ClusterError", "ClusterEnv", "join", "farewell", "leave", "end_refused_node", "gather_verdicts",
           "all_reduce_gradients", "all_reduce_tensors", "all_reduce_sum", "config_hash"]

log = logging.getLogger(__name__)


class ClusterError(EdgetrainError):
    """The cluster cannot train: a node unreachable, nodes that disagree, a node whose budget cannot hold its share."""


@dataclass(frozen=True)
class ClusterEnv:
    """Where this node stands in the cluster, as torchrun's environment gives it."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> ClusterEnv:
        """Read ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (torchrun's variables).

        Raises:
            ClusterError: a variable missing or not a number, or a rank outside the world.
        """
        env = dict(os.environ) if environ is None else environ
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
        if missing:
            raise ClusterError(f"{', '.join(missing)} not set: run under torchrun, or set RANK, WORLD_SIZE, "
                               "MASTER_ADDR and MASTER_PORT")
        try:
            rank, world, port = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["MASTER_PORT"])
        except ValueError:
            raise ClusterError(f"RANK, WORLD_SIZE and MASTER_PORT must be integers, got {env['RANK']!r}, "
                               f"{env['WORLD_SIZE']!r}, {env['MASTER_PORT']!r}") from None
        if world < 1 or not 0 <= rank < world:
            raise ClusterError(f"RANK {rank} is outside a WORLD_SIZE of {world}")
        return cls(rank, world, env["MASTER_ADDR"], port)


def join(env: ClusterEnv, *, connect_timeout_s: float, timeout_s: float) -> None:
    """Join the process group (gloo); bounded by ``connect_timeout_s`` (NOTE [ One error on every node ]).

    Raises:
        ClusterError: the master cannot be reached, or not every node joined, in time.
    """
    import torch.distributed as dist

    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.rank == 0,
                              timeout=datetime.timedelta(seconds=connect_timeout_s), wait_for_workers=True)
    except (RuntimeError, OSError) as exc:  # DistNetworkError, DistStoreError are RuntimeErrors
        what = ("not every node joined" if env.rank == 0 else
                f"cannot reach the master at {env.master_addr}:{env.master_port}")
        raise ClusterError(f"node {env.rank}: {what} within {connect_timeout_s:g} s "
                           f"({_first_line(exc)})") from None
    dist.init_process_group("gloo", store=store, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def farewell(timeout_s: float = 10.0) -> None:
    """Wait until every node is done with the group, so that rank 0's store, which the others talk to, outlives
    their last use of it (else a node tearing down after the master has gone aborted: SIGABRT in c10d).

    Only where every node is known to get here: a finished run or a refusal they all share.
    """
    import torch.distributed as dist

    with contextlib.suppress(RuntimeError):
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))


def leave() -> None:
    """Leave the process group if this process is in one."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def end_refused_node(code: int) -> NoReturn:
    """End a node's process with ``code`` at once, once its refusal is printed and it has left the group.

    The interpreter's teardown after a refusal has now and then aborted a node in torch's C++ teardown
    (SIGABRT, "terminate called without an active exception", no Python frame: once in a CI run, after
    the group was left), which turns the refusal every node shares into a crash (a supervisor restarts
    a node killed by a signal). Skipping the teardown takes the refusal out of its way: output and logs
    are flushed first, and a node holds nothing else that must be written.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def config_hash(settings: dict[str, Any]) -> str:
    """A short digest of the settings every node must share."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def gather_verdicts(verdict: Any) -> list[Any]:
    """Every node's ``verdict`` (any picklable value), in rank order, on every node."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, verdict)
    return gathered


def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter], weight: float, compressor: Any = None) -> None:
    """Replace each ``.grad`` by the weighted sum over nodes ``Σ_r weight_r · grad_r`` (NOTE [ Weighted
    averaging ] in batch_shares.py); by ``compressor``'s approximation of it when given (a
    :class:`~edgetrain.distributed.compress.PowerSGD` over the same parameters).

    A parameter without a gradient on this node gets a zero one, so every node joins the same
    collectives in the same order.
    """
    grads = []
    for p in parameters:
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    if compressor is not None:
        compressor.all_reduce(grads, weight)
    else:
        all_reduce_tensors(grads, weight)


# Tensors below this many numbers go into one flat all-reduce (NOTE [ Explicit all-reduce, not DDP ]).
SMALL_TENSOR_NUMBERS = 1 << 16


def all_reduce_tensors(tensors: Sequence[torch.Tensor], weight: float) -> None:
    """Each tensor, in place, becomes ``Σ_r weight_r · tensor_r``: one asynchronous all-reduce per large tensor and
    one for all the small ones together (NOTE [ Explicit all-reduce, not DDP ]), all in flight at once."""
    import torch.distributed as dist

    if dist.get_world_size() == 1:  # a cluster of one: nothing to sum, the weight is 1
        return
    small: dict[torch.dtype, list[torch.Tensor]] = {}
    works = []
    for tensor in tensors:
        if tensor.numel() < SMALL_TENSOR_NUMBERS:
            small.setdefault(tensor.dtype, []).append(tensor)
            continue
        tensor.mul_(weight)
        works.append(dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True))
    flats = [(group, torch.cat([t.reshape(-1) for t in group]).mul_(weight)) for group in small.values()]
    works += [dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True) for _, flat in flats]
    for work in works:
        work.wait()
    for group, flat in flats:
        for tensor, part in zip(group, flat.split([t.numel() for t in group]), strict=True):
            tensor.copy_(part.view_as(tensor))


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """The sum over nodes of each value (float64)."""
    import torch.distributed as dist

    if dist.get_world_size() == 1:
        return [float(v) for v in values]
    tensor = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor]

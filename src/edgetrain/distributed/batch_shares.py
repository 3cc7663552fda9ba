"""How a global batch is shared among heterogeneous nodes, and the weight of each node's gradient.

NOTE [ Weighted averaging ]
A step on the global batch of ``B`` samples minimises the mean loss ``(1/B) Σ_i l_i``. Node ``r``
trains on ``b_r`` of those samples (``Σ_r b_r = B``) and its executor leaves the gradient of
*its* mean loss, ``g_r = (1/b_r) Σ_{i in r} ∇l_i``, in ``.grad``. So the gradient of the global
step is ``Σ_r (b_r / B) g_r``: each node scales its gradient by its share ``b_r / B`` and one
all-reduce sums them. A plain average (``1/N``) would be right only for equal shares. The same
weights turn the nodes' mean losses into the global batch's mean loss.

This equality holds for models whose samples do not interact within a batch. BatchNorm's batch
statistics are taken over each node's ``b_r`` samples, not over ``B`` (as with DDP without
SyncBatchNorm), and dropout draws each node's masks from its own generator: both make the
distributed step differ from the single-process one by more than rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import EdgetrainError

__all__ = ["split_batch", "share_weights"]


def split_batch(global_batch: int, speeds: Sequence[float], least: int = 1) -> tuple[int, ...]:
    """The global batch split in proportion to ``speeds`` (largest remainder), each share >= ``least``.

    A node that trains ``k`` times as fast gets ``k`` times the samples, so that all nodes end
    their step at about the same time and the all-reduce waits as little as possible.

    Args:
        global_batch: samples of one step of the whole cluster.
        speeds: each node's predicted training rate (any unit, e.g. FLOP/s), > 0.
        least: the smallest share a node may get (2 for BatchNorm models: one sample gives no
            batch statistics).

    Raises:
        EdgetrainError: the batch is too small to give every node ``least`` samples, or a speed
            is not a finite number > 0.

    Example:
        >>> split_batch(12, [1.0, 1.0, 2.0])
        (3, 3, 6)
        >>> split_batch(10, [1.0, 1.0, 1.0])
        (4, 3, 3)
    """
    if not speeds:
        raise EdgetrainError("no nodes to split the batch among")
    for speed in speeds:
        if not (isinstance(speed, (int, float)) and math.isfinite(speed) and speed > 0):
            raise EdgetrainError(f"a node's speed must be a finite number > 0, got {speed!r}")
    nodes = len(speeds)
    if global_batch < least * nodes:
        raise EdgetrainError(f"a global batch of {global_batch} cannot give each of {nodes} nodes {least} "
                             f"sample(s); use --batch >= {least * nodes}")
    spare = global_batch - least * nodes
    total = float(sum(speeds))
    exact = [spare * speed / total for speed in speeds]
    shares = [math.floor(e) for e in exact]
    by_remainder = sorted(range(nodes), key=lambda r: (-(exact[r] - shares[r]), r))
    for r in by_remainder[:spare - sum(shares)]:
        shares[r] += 1
    return tuple(least + s for s in shares)


def share_weights(shares: Sequence[int]) -> tuple[float, ...]:
    """Each node's weight ``b_r / B`` in the gradient sum (NOTE [ Weighted averaging ])."""
    total = sum(shares)
    return tuple(share / total for share in shares)

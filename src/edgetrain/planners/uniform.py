"""Uniform segment checkpointing: what ``torch.utils.checkpoint.checkpoint_sequential`` does.

``checkpoint_sequential(functions, segments, input)`` cuts a sequential model of ``L``
stages into ``segments`` pieces of ``L // segments`` stages, runs every piece but the last
without autograd keeping only the piece's input, and records the last piece (the remainder,
which is the longest one when ``segments`` does not divide ``L``). During backward each
checkpointed piece is re-run with autograd, from the last to the first, and back-propagated.

This is the square-root strategy of Chen et al., "Training Deep Nets with Sublinear Memory
Cost" (arXiv:1604.06174, 2016): with ``segments ~ sqrt(L)`` the activations held at once
grow as ``O(sqrt(L))`` for one extra forward of the first ``L - last`` stages. Expressing
it as a :class:`~edgetrain.core.schedule.Schedule` lets the simulator price it like any other
planner and lets tests hold it against torch's own implementation.
"""

from __future__ import annotations

from ..core.chain import Chain
from ..core.schedule import Backward, Forward, Keep, Op, Schedule

__all__ = ["uniform", "segment_bounds", "advance", "record_and_reverse"]


def segment_bounds(length: int, segments: int) -> list[tuple[int, int]]:
    """Half-open stage ranges ``[start, end)`` of each segment, exactly as torch splits them.

    torch takes ``segment_size = length // segments`` for the first ``segments - 1``
    segments and gives the rest to the last one, so ``length=10, segments=4`` is
    ``[(0, 2), (2, 4), (4, 6), (6, 10)]``.

    Raises:
        ValueError: if ``segments < 1`` or ``segments > length`` (torch's own loop then
            fails on a zero ``range`` step; we say why instead).
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    if segments > length:
        raise ValueError(f"cannot cut a chain of {length} stages into {segments} segments: "
                         f"segments must be <= {length} (each segment needs at least one stage)")
    size = length // segments
    bounds = [(start, start + size) for start in range(0, size * (segments - 1), size)]
    bounds.append((size * (segments - 1), length))
    return bounds


def advance(start: int, end: int) -> list[Op]:
    """No-grad forward of ``[start, end)`` keeping only its input ``x_start`` (a checkpoint)."""
    return [Forward(start, Keep.INPUT), *(Forward(i, Keep.NONE) for i in range(start + 1, end))]


def record_and_reverse(start: int, end: int) -> list[Op]:
    """Recorded forward of ``[start, end)`` followed by its backward, last stage first."""
    return [*(Forward(i, Keep.ALL) for i in range(start, end)),
            *(Backward(i) for i in reversed(range(start, end)))]


def uniform(chain: Chain, segments: int) -> Schedule:
    """The schedule of ``checkpoint_sequential(model, segments, x)`` followed by ``backward()``.

    Args:
        chain: the cost model; only its length matters to the ops.
        segments: number of segments, ``1 <= segments <= chain.length``; ``1`` is plain backprop.

    Returns:
        A schedule with ``strategy="uniform"`` and ``params={"segments": segments}``. Each
        stage of the first ``segments - 1`` segments runs forward twice, the others once.

    Raises:
        ValueError: for ``segments < 1`` or ``segments > chain.length``.

    Example:
        >>> from edgetrain.core.chain import Chain
        >>> sched = uniform(Chain.uniform(4), 2)
        >>> [(type(op).__name__, op.stage) for op in sched.ops][:4]
        [('Forward', 0), ('Forward', 1), ('Forward', 2), ('Forward', 3)]
    """
    bounds = segment_bounds(chain.length, segments)
    *checkpointed, last = bounds
    ops: list[Op] = []
    for start, end in checkpointed:
        ops += advance(start, end)
    ops += record_and_reverse(*last)
    for start, end in reversed(checkpointed):
        ops += record_and_reverse(start, end)
    return Schedule(tuple(ops), chain.length, strategy="uniform", params={"segments": segments})

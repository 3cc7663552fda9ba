"""Binomial checkpointing: Griewank and Walther's Revolve on a chain of stages.

A. Griewank and A. Walther, "Algorithm 799: Revolve: An implementation of checkpointing for
the reverse or adjoint mode of computational differentiation", ACM TOMS 26(1):19-45, 2000
(the optimality proof is Griewank, "Achieving logarithmic growth of temporal and spatial
complexity in reverse automatic differentiation", Optim. Methods Softw. 1(1), 1992).

NOTE [ Revolve's conventions in edgetrain ]
* ``slots`` counts checkpoint slots *including* ``x_0``, which is always held; so
  ``slots=1`` stores nothing else and reversing ``l`` steps costs ``l(l-1)/2`` advances.
* An *advance* is a forward that does not record (``Keep.INPUT`` when it stores its input as
  a checkpoint, ``Keep.NONE`` otherwise). Every stage is recorded exactly once, right before
  its backward (Griewank's "youturn"), so ``simulate(...).forward_advances`` is Griewank's
  count of forward steps.
* A checkpoint ``x_a`` is never released explicitly: the ``Backward(a)`` that ends the
  reversal of its range releases it.

With ``β(s, r) = C(s + r, s)`` the largest chain that ``s`` slots reverse with every stage
advanced at most ``r`` times, the minimal number of advances is
``t(l, s) = r*l - β(s + 1, r - 1)`` with ``r`` the smallest integer such that
``β(s, r) >= l``. The planner reaches it by binomial splitting: for a range of ``l`` stages
with ``s`` slots it advances ``j`` stages, stores a checkpoint there, reverses the upper
``l - j`` stages with ``s - 1`` slots and then the lower ``j`` with ``s``, choosing ``j`` so
that the upper part repeats at most ``r`` times and the lower at most ``r - 1``.
"""

from __future__ import annotations

from math import comb

from ..core.chain import Chain
from ..core.schedule import Backward, Forward, Keep, Op, Schedule

__all__ = ["revolve", "revolve_advances", "revolve_repetitions"]


def revolve_repetitions(length: int, slots: int) -> int:
    """Griewank's repetition number: the smallest ``r`` with ``C(slots + r, slots) >= length``.

    It bounds how many times any one stage is advanced in an optimal reversal.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if slots < 1:
        raise ValueError(f"slots must be >= 1 (x_0 takes one), got {slots}")
    r = 0
    while comb(slots + r, slots) < length:
        r += 1
    return r


def revolve_advances(length: int, slots: int) -> int:
    """Minimal number of advances to reverse ``length`` stages with ``slots`` slots (x_0 included).

    Griewank's closed form ``t = r*l - C(s + r, s + 1)`` with ``r`` from
    :func:`revolve_repetitions`; it gives ``l - 1`` when ``slots >= length - 1`` and
    ``l(l-1)/2`` when ``slots == 1``.

    Example:
        >>> revolve_advances(10, 1), revolve_advances(10, 3), revolve_advances(10, 9)
        (45, 15, 9)
    """
    r = revolve_repetitions(length, slots)
    return r * length - comb(slots + r, slots + 1)


def _split(length: int, slots: int) -> int:
    """How many stages to advance before storing the next checkpoint (``slots >= 2``).

    With ``r`` the repetition number of ``(length, slots)``, the lower part ``j`` must lie in
    ``[β(s, r-2), β(s, r-1)]`` and the upper part ``length - j`` in ``[β(s-1, r-1), β(s-1, r)]``;
    Pascal's rule makes the two intervals meet whenever ``β(s, r-1) <= length <= β(s, r)``,
    and then the cost is exactly ``t(l, s)``. Any ``j`` in the intersection is optimal; we
    take the smallest (at least one stage).
    """
    r = revolve_repetitions(length, slots)
    lower_min = comb(slots + r - 2, slots) if r >= 2 else 0
    upper_max = comb(slots - 1 + r, slots - 1)
    return max(1, lower_min, length - upper_max)


class _Ops:
    """Shared op records, one per (stage, kind): ops are frozen, so a schedule may repeat them."""

    def __init__(self, length: int) -> None:
        self.keep_input = [Forward(i, Keep.INPUT) for i in range(length)]
        self.keep_none = [Forward(i, Keep.NONE) for i in range(length)]
        self.record = [Forward(i, Keep.ALL) for i in range(length)]
        self.backward = [Backward(i) for i in range(length)]


def _advance(out: list[Op], ops: _Ops, start: int, stop: int) -> None:
    """Non-recording forward from checkpoint ``x_start`` to ``x_stop``, keeping ``x_start``."""
    out.append(ops.keep_input[start])
    out += ops.keep_none[start + 1:stop]


def _turn(out: list[Op], ops: _Ops, stage: int) -> None:
    """Record one stage and back-propagate it at once (Griewank's youturn)."""
    out.append(ops.record[stage])
    out.append(ops.backward[stage])


def _reverse_one_slot(out: list[Op], ops: _Ops, start: int, stop: int) -> None:
    """Reverse ``[start, stop)`` holding only ``x_start``: re-advance from it for every stage."""
    for stage in range(stop - 1, start, -1):
        _advance(out, ops, start, stage)
        _turn(out, ops, stage)
    _turn(out, ops, start)


def _reverse(out: list[Op], ops: _Ops, length: int, slots: int) -> None:
    """Reverse the whole chain from ``x_0`` with ``slots`` slots by binomial splitting.

    A task ``(start, stop, slots)`` reverses ``[start, stop)`` from the held ``x_start``,
    whose slot is among ``slots``. Splitting emits the advance to the new checkpoint
    ``x_mid``, then the upper task (one slot fewer) must finish before the lower one starts,
    so the lower task goes on the stack first. An explicit stack rather than recursion keeps
    long chains with many slots (one split per stage) clear of Python's recursion limit.
    """
    tasks = [(0, length, slots)]
    while tasks:
        start, stop, free = tasks.pop()
        if stop - start == 1:
            _turn(out, ops, start)
        elif free == 1:
            _reverse_one_slot(out, ops, start, stop)
        else:
            mid = start + _split(stop - start, free)
            _advance(out, ops, start, mid)
            tasks.append((start, mid, free))
            tasks.append((mid, stop, free - 1))


def revolve(chain: Chain, slots: int) -> Schedule:
    """Binomial checkpointing schedule with the minimal number of advances for ``slots`` slots.

    Args:
        chain: the cost model; Revolve assumes uniform steps, so only the length matters.
        slots: checkpoint slots, ``x_0`` included (see NOTE [ Revolve's conventions in edgetrain ]).

    Returns:
        A schedule with ``strategy="revolve"``, ``params={"slots": slots}`` whose
        ``forward_advances`` equal :func:`revolve_advances` ``(chain.length, slots)``.

    Raises:
        ValueError: if ``slots < 1``.

    Example:
        >>> from edgetrain.core.chain import Chain
        >>> from edgetrain.core.simulator import simulate
        >>> simulate(Chain.uniform(10), revolve(Chain.uniform(10), 3)).forward_advances
        15
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1 (x_0 always takes one), got {slots}")
    out: list[Op] = []
    _reverse(out, _Ops(chain.length), chain.length, slots)
    return Schedule(tuple(out), chain.length, strategy="revolve", params={"slots": slots})

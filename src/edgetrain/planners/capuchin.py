"""``capuchin``: a greedy that swaps stage inputs to storage first and recomputes when swapping cannot hide.

Capuchin (X. Peng et al., "Capuchin: Tensor-based GPU Memory Management for Deep Learning",
ASPLOS 2020) frees memory tensor by tensor, largest first: it *swaps* a tensor out when the
transfer can hide behind the compute between its eviction and its next use, and *recomputes*
it otherwise. It optimises neither time nor energy globally, which is why it is here: the
baseline that shows what a heuristic leaves on the table against ``paging-dp``.

NOTE [ Capuchin on a chain ]
Each stage ``i >= 1`` gets a mode, all ``keep`` at first (plain backprop):

* ``keep``: record stage ``i`` in the forward; its input ``x_i`` stays in RAM until its backward.
* ``swap``: record it, ``PageOut(i)`` right after ``Forward(i, all)`` and ``PageIn(i)`` right
  before ``Backward(i)``. Only for a record that keeps its input (``input_saved``): ``paging-dp``
  pages such values too (on their own or inside the record of stage ``i - 1``), so its class
  holds every schedule built here and its optimum is never worse (up to its grid's rounding).
* ``recompute``: not recorded in the forward; a run of recompute stages ``[a, b)`` is a
  ``checkpoint_sequential`` segment: ``Forward(a, input)``, ``Forward(a+1..b-1, none)``
  forward, and ``Forward(a..b-1, all)``, ``Backward(b-1..a)`` once stage ``b`` is done.

While the simulated peak exceeds the budget the kept stage with the largest ``x_i`` changes
mode (ties to the earlier stage: a longer window to hide in): to ``swap`` when it may and its
transfer out and back (``latency + bytes / throughput`` each) fits in the compute between
``Forward(i, all)`` and ``Backward(i)`` of the current schedule, the time a DMA engine has to
overlap it, else to ``recompute``. Stage 0 (its input is the resident batch) and the last
stage (nothing runs between its forward and backward) always stay ``keep``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from ..core.chain import Chain
from ..core.schedule import Backward, Forward, Keep, Op, PageIn, PageOut, Schedule
from ..core.simulator import simulate
from ..costs.energy import EnergyProfile, page_time_s
from ..errors import InfeasibleBudgetError
from .uniform import advance, record_and_reverse

__all__ = ["Mode", "capuchin", "capuchin_schedule"]

Mode = Literal["keep", "swap", "recompute"]


def capuchin_schedule(chain: Chain, modes: list[Mode]) -> Schedule:
    """The ops of one step with stage modes ``modes`` (NOTE [ Capuchin on a chain ]).

    Recompute runs must not include stage 0 or the last stage; the caller guarantees it.
    """
    forward: list[Op] = []
    backward: list[list[Op]] = []   # one block per recorded stage or segment, in forward order
    i = 0
    while i < chain.length:
        if modes[i] == "recompute":
            end = i
            while modes[end] == "recompute":
                end += 1
            forward += advance(i, end)
            backward.append(record_and_reverse(i, end))
            i = end
            continue
        swapped = modes[i] == "swap"
        forward += [Forward(i, Keep.ALL), *([PageOut(i)] if swapped else [])]
        backward.append([*([PageIn(i)] if swapped else []), Backward(i)])
        i += 1
    ops = forward + [op for block in reversed(backward) for op in block]
    return Schedule(tuple(ops), chain.length, strategy="capuchin",
                    params={"swap": [k for k, m in enumerate(modes) if m == "swap"],
                            "recompute": [k for k, m in enumerate(modes) if m == "recompute"]})


def _may_swap(chain: Chain, i: int) -> bool:
    """Whether paging ``x_i`` frees it until the backward: record ``i`` keeps it, so nothing rereads it sooner."""
    return chain.stages[i].input_saved and chain.value_bytes[i] > 0


def _hiding_window_s(chain: Chain, schedule: Schedule, i: int) -> float:
    """Compute time between ``Forward(i, all)`` and ``Backward(i)``: what a transfer of ``x_i`` can overlap."""
    ops = schedule.ops
    start, end = ops.index(Forward(i, Keep.ALL)), ops.index(Backward(i))
    stages = chain.stages
    return sum(stages[op.stage].fwd_time_s if isinstance(op, Forward) else stages[op.stage].bwd_time_s
               for op in ops[start + 1:end] if isinstance(op, (Forward, Backward)))


def _round_trip_s(chain: Chain, profile: EnergyProfile, i: int) -> float:
    size = chain.value_bytes[i]
    return page_time_s(size, profile, "out") + page_time_s(size, profile, "in")


def capuchin(chain: Chain, profile: EnergyProfile, memory_bytes: int) -> Schedule:
    """Capuchin's greedy schedule within ``memory_bytes`` (the whole simulated peak of the step).

    Args:
        chain: the cost model, its stage times the device's (:func:`edgetrain.costs.energy.scale_chain`),
            since whether a swap hides compares them with the device's transfer times.
        profile: the device: its paging latency and throughput decide swap or recompute.
        memory_bytes: the budget, as :func:`~edgetrain.core.simulator.simulate` counts the peak.

    Returns:
        A schedule with ``strategy="capuchin"``; ``params`` lists the swapped and recomputed stages.

    Raises:
        InfeasibleBudgetError: every stage that can change has, and the peak is still above the
            budget; ``minimum_bytes`` is the least peak the greedy reached.
    """
    modes: list[Mode] = ["keep"] * chain.length
    schedule = capuchin_schedule(chain, modes)
    peak = least = simulate(chain, schedule).peak_bytes
    values = chain.value_bytes
    while peak > memory_bytes:
        kept = [i for i in range(1, chain.length - 1) if modes[i] == "keep"]
        if not kept:
            raise InfeasibleBudgetError(
                f"capuchin cannot fit {chain.name or 'this chain'} in {memory_bytes} bytes: with every stage input "
                f"swapped or recomputed the least peak it reached is {least} bytes",
                minimum_bytes=least, budget_bytes=memory_bytes)
        i = max(kept, key=lambda k: (values[k], -k))
        hides = _round_trip_s(chain, profile, i) <= _hiding_window_s(chain, schedule, i)
        modes[i] = "swap" if hides and _may_swap(chain, i) else "recompute"
        schedule = capuchin_schedule(chain, modes)
        peak = simulate(chain, schedule).peak_bytes
        least = min(least, peak)
    return replace(schedule, params={**schedule.params, "budget_bytes": memory_bytes})

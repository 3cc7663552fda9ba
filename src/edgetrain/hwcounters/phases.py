"""Counters per training phase: data, forward, backward, optimizer, and the whole step.

A step is ``next(loader)`` (data: a DataLoader over an in-memory dataset of the model's example
inputs, no workers, so the collation runs in this process), ``loss = criterion(model(x), y)``
(forward), ``loss.backward()`` (backward) and ``opt.step(); opt.zero_grad()`` (optimizer). The
counters (NOTE [ Counters without perf ]) are read at each boundary, so a phase's figure is the
difference of two snapshots summed over the timed steps. The overhead is measured, not assumed:
steps with the counters read and steps without alternate, and the report gives the ratio of
their medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..bench.stats import spread
from .metrics import metrics_by_pmu
from .perf_event import CounterSet, Reading

__all__ = ["PHASES", "count_phases"]

PHASES = ("data", "forward", "backward", "optimizer")


def _step_parts(model: str, batch: int, size: int, steps: int) -> list[Callable[[Any], Any]]:
    import torch

    from ..core.optim import make_optimizer
    from ..models import get_model_spec

    spec = get_model_spec(model)
    torch.manual_seed(0)
    net = spec.build()
    opt = make_optimizer("sgd", list(net.parameters()))
    samples = batch * steps
    dataset = torch.utils.data.TensorDataset(spec.example_input(samples, size), spec.example_target(samples))
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True)
    state: dict[str, Any] = {"iter": iter(loader)}

    def data(_: Any) -> Any:
        try:
            return next(state["iter"])
        except StopIteration:
            state["iter"] = iter(loader)
            return next(state["iter"])

    def forward(batch_: Any) -> Any:
        return torch.nn.functional.cross_entropy(net(batch_[0]), batch_[1])

    def backward(loss: Any) -> Any:
        loss.backward()
        return None

    def optimizer(_: Any) -> Any:
        opt.step()
        opt.zero_grad(set_to_none=True)
        return None

    return [data, forward, backward, optimizer]


def _add(total: dict[str, Reading | None], delta: dict[str, Reading | None]) -> None:
    for label, reading in delta.items():
        previous = total.get(label)
        total[label] = reading if previous is None or reading is None else Reading(
            previous.value + reading.value, previous.enabled_ns + reading.enabled_ns,
            previous.running_ns + reading.running_ns)


def _delta(after: dict[str, Reading | None], before: dict[str, Reading | None]) -> dict[str, Reading | None]:
    out: dict[str, Reading | None] = {}
    for label, now in after.items():
        then = before.get(label)
        out[label] = None if now is None or then is None else now - then
    return out


def _figures(readings: dict[str, Reading | None], why: dict[str, str], seconds: float) -> dict[str, Any]:
    counts: dict[str, Any] = {label: (why[label] if r is None else {"value": r.value, "scaled": r.scaled,
                                                                    "enabled_s": r.enabled_ns / 1e9,
                                                                    "running_s": r.running_ns / 1e9})
                              for label, r in readings.items()}
    return {"seconds": seconds, "counters": counts,
            "metrics": metrics_by_pmu({label: None if r is None else r.scaled for label, r in readings.items()}, why)}


def count_phases(model: str, batch: int, size: int, steps: int = 3, warmup: int = 1) -> dict[str, Any]:
    """Counters per phase and per step of ``steps`` training steps of ``model`` (after ``warmup``).

    Returns:
        ``{"phases": {phase: {"seconds", "counters", "metrics"}}, "step": {...}, "unavailable": {label: why},
        "overhead": {...}}``; a counter or metric that could not be measured is its ``unavailable: ...`` reason.
    """
    parts = _step_parts(model, batch, size, steps + warmup)

    def plain_step() -> None:
        value: Any = None
        for part in parts:
            value = part(value)

    for _ in range(warmup):
        plain_step()
    with CounterSet() as counters:
        why = counters.unavailable()
        totals: dict[str, dict[str, Reading | None]] = {phase: {} for phase in PHASES}
        seconds = dict.fromkeys(PHASES, 0.0)
        counted_s: list[float] = []
        plain_s: list[float] = []
        for _ in range(steps):
            start = time.perf_counter()
            plain_step()
            plain_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            before, value = counters.read(), None
            for phase, part in zip(PHASES, parts, strict=True):
                began = time.perf_counter()
                value = part(value)
                seconds[phase] += time.perf_counter() - began
                after = counters.read()
                _add(totals[phase], _delta(after, before))
                before = after
            counted_s.append(time.perf_counter() - start)
    step_total: dict[str, Reading | None] = {}
    for phase in PHASES:
        _add(step_total, totals[phase])
    plain, counted = statistics.median(plain_s), statistics.median(counted_s)
    return {"model": model, "batch": batch, "size": size, "steps": steps,
            "phases": {phase: _figures(totals[phase], why, seconds[phase]) for phase in PHASES},
            "step": _figures(step_total, why, sum(seconds.values())), "unavailable": why,
            "overhead": {"plain_step_s": plain, "counted_step_s": counted, "ratio": counted / plain,
                         "plain_step_spread_s": spread(plain_s).to_dict(),
                         "counted_step_spread_s": spread(counted_s).to_dict(),
                         "note": "medians of alternating steps without and with the counters read at each phase "
                                 "boundary"}}

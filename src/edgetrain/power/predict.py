"""Predict a workload's step time and power in every mode from a few profiled ones, and advise a mode.

NOTE [ The mode model ]
A mode is what bounds the CPU: ``cores`` online, a clock ``cpu_hz`` and a memory-controller clock
``emc_hz`` (:class:`ModePoint`). For one workload (a model, a batch) the step time is taken as

    time_s = fixed_s + serial_gc / cpu_ghz + parallel_gc / (cores x cpu_ghz) + memory_gc / emc_ghz

(a part no knob moves, Amdahl's serial part, which still scales with the clock, a part that
spreads over the cores, and a part bound by memory traffic; ``_gc`` are gigacycles; a per-core
parallel loss ``a (c - 1) / (c f)`` is ``a / f - a / (c f)``, so it is in the same span). The
power is

    power_w = static_w + dynamic_w x cores x f x v(f)^2 x busy + leak_w x cores x v(f) + memory_w x emc_ghz x moving,

``f`` the clock as a fraction of the grid's highest, ``v(f) = 0.6 + 0.4 f`` the core voltage
as a fraction of its highest, and ``busy`` / ``moving`` the shares of the step the fitted time
form spends in its CPU parts (serial and parallel) and in its memory part (CMOS dynamic power
~ activity x C V^2 f and leakage ~ V per powered core; DVFS tables lower the voltage with the
clock, roughly linearly from about 60% of the top voltage at the lowest operating points: an
assumption, stated here, not a board's table). A mode that stretches the memory part leaves the
cores idle part of the step, so their dynamic power is weighted by ``busy``, and the memory
controller's by ``moving``: the shares come from the time fit, never from the board. Both forms
are linear in their four coefficients (the power's once the time is fitted), so six profiled
modes fit them by non-negative least squares (every coefficient is a time or a power, never
negative; with four of them, trying every subset of columns is the exact NNLS). A coefficient
the profiled modes cannot tell apart (the EMC clock never varied) is left at zero and its effect
stays in the constant. PowerTrain (Prashanthi et al., FGCS 2024) learns the same map with a
network from ~50 profiled modes; this explicit form needs at most six.

The form misses the board's finer shape (a roofline's overlap of compute and memory is not a
sum), and its misses are smooth over the grid. So a prediction is the form times a correction
interpolated from the profiled modes' measured / fitted ratios (inverse-distance weights, squared,
in the grid's coordinates scaled to [0, 1]): a profiled mode predicts its own measurement, and its
neighbours inherit most of its residual. With an exact form every ratio is 1 and nothing changes.

The advisor then minimises energy per epoch (``steps x time_s x power_w``) over the whole grid,
among modes whose predicted epoch time, inflated by a margin, meets the deadline and whose
predicted power, inflated by its own margin, is under the cap. Each margin is twice the form's
worst relative time (power) error on the profiled modes, at least 2%: a fit of four
coefficients to six points underestimates its error elsewhere. A profiled mode keeps only the
least margin (2%): it was measured, not predicted.

NOTE [ Profiling where the answer is ]
Six fixed corners profile the grid's edges, but the best mode under a deadline usually lies
inside, where the form is worst. :func:`profile_adaptively` profiles five corners, asks the
advisor for its pick *without* margins (the mode it would choose if the form were right), and
profiles that mode as the sixth: the pick is then checked by a measurement and its neighbours
are corrected by it (NOTE [ The mode model ]). A profiles file (modes the user measured) is
fitted as it is.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import EdgetrainError

__all__ = ["Advice", "ModeModel", "ModePoint", "Profile", "advise", "choose_profile_modes", "fit_mode_model",
           "mape_percent", "profile_adaptively"]

V_FLOOR = 0.6        # core voltage at the lowest clock, as a fraction of the highest (NOTE [ The mode model ])
MIN_MARGIN = 0.02    # the least deadline margin the advisor keeps


@dataclass(frozen=True)
class ModePoint:
    """One mode as the model sees it: ``cores`` online at ``cpu_hz``, the memory controller at ``emc_hz``."""

    name: str
    cores: int
    cpu_hz: float
    emc_hz: float = 1e9

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cores": self.cores, "cpu_hz": self.cpu_hz, "emc_hz": self.emc_hz}


@dataclass(frozen=True)
class Profile:
    """A mode measured: its step time and, where a sensor read it, its power."""

    mode: ModePoint
    time_s: float
    power_w: float | None = None


Coef = tuple[float, float, float, float]
Anchor = tuple[tuple[float, float, float], float, float]  # a profiled mode scaled to [0, 1]^3, log time / power ratio


def _time_features(mode: ModePoint) -> Coef:
    ghz = mode.cpu_hz / 1e9
    return 1.0, 1.0 / ghz, 1.0 / (mode.cores * ghz), 1.0 / (mode.emc_hz / 1e9)


def _power_features(mode: ModePoint, top_hz: float, time_coef: Coef) -> Coef:
    """The power form's columns; ``busy`` and ``moving`` are the fitted time form's CPU and memory shares."""
    fixed, serial, parallel, memory = (c * x for c, x in zip(time_coef, _time_features(mode), strict=True))
    total = fixed + serial + parallel + memory
    busy, moving = ((serial + parallel) / total, memory / total) if total > 0 else (1.0, 1.0)
    f = mode.cpu_hz / top_hz
    volts = V_FLOOR + (1 - V_FLOOR) * f
    return 1.0, mode.cores * f * volts**2 * busy, mode.cores * volts, mode.emc_hz / 1e9 * moving


def _nnls(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> tuple[float, ...]:
    """Exact non-negative least squares for a few columns: the best unconstrained fit over every column subset
    whose coefficients are all >= 0 (columns constant over the rows, after the first, are dropped)."""
    import numpy as np

    a, b = np.asarray(rows, dtype=float), np.asarray(targets, dtype=float)
    usable = [0] + [j for j in range(1, a.shape[1]) if np.ptp(a[:, j]) > 1e-12 * max(1.0, np.abs(a[:, j]).max())]
    best: tuple[float, np.ndarray] | None = None
    for size in range(1, len(usable) + 1):
        for subset in itertools.combinations(usable, size):
            coef, *_ = np.linalg.lstsq(a[:, subset], b, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(a.shape[1])
            full[list(subset)] = coef
            residual = float(np.sum((a @ full - b) ** 2))
            if best is None or residual < best[0] - 1e-15:
                best = (residual, full)
    if best is None:  # unreachable with a constant column and positive targets, kept as a clear error
        raise EdgetrainError("no non-negative fit of the profiled modes (are the measured times positive?)")
    return tuple(float(x) for x in best[1])


@dataclass(frozen=True)
class ModeModel:
    """The fitted NOTE [ The mode model ]: four time and (when powers were measured) four power coefficients of the
    form, and the profiled modes' residuals that correct it (``anchors``, in coordinates scaled by ``spans``)."""

    time_coef: Coef
    power_coef: Coef | None
    top_hz: float
    fit_error: float  # the form's worst relative time error on the profiled modes
    power_fit_error: float = 0.0  # the form's worst relative power error on the profiled modes with a power
    anchors: tuple[Anchor, ...] = ()
    spans: tuple[tuple[float, float], ...] = ((0.0, 1.0), (0.0, 1.0), (0.0, 1.0))  # (low, width) per knob

    def _scaled(self, mode: ModePoint) -> tuple[float, float, float]:
        (c0, cw), (f0, fw), (e0, ew) = self.spans
        return (mode.cores - c0) / cw, (mode.cpu_hz - f0) / fw, (mode.emc_hz - e0) / ew

    def _correction(self, mode: ModePoint, of_power: bool) -> float:
        """The residual ratio at ``mode``, inverse-distance interpolated (squared weights) from the anchors."""
        if not self.anchors:
            return 1.0
        point = self._scaled(mode)
        weighted = total = 0.0
        for where, log_time_ratio, log_power_ratio in self.anchors:
            residual = log_power_ratio if of_power else log_time_ratio
            distance = math.dist(point, where)
            if distance < 1e-9:
                return math.exp(residual)
            weight = distance**-2
            weighted, total = weighted + weight * residual, total + weight
        return math.exp(weighted / total)

    def measured(self, mode: ModePoint) -> bool:
        """Whether ``mode`` is one of the profiled modes (it then predicts its own measurement)."""
        point = self._scaled(mode)
        return any(math.dist(point, anchor[0]) < 1e-9 for anchor in self.anchors)

    def form_time_s(self, mode: ModePoint) -> float:
        return sum(c * x for c, x in zip(self.time_coef, _time_features(mode), strict=True))

    def form_power_w(self, mode: ModePoint) -> float | None:
        if self.power_coef is None:
            return None
        features = _power_features(mode, self.top_hz, self.time_coef)
        return sum(c * x for c, x in zip(self.power_coef, features, strict=True))

    def time_s(self, mode: ModePoint) -> float:
        return self.form_time_s(mode) * self._correction(mode, of_power=False)

    def power_w(self, mode: ModePoint) -> float | None:
        power = self.form_power_w(mode)
        return None if power is None else power * self._correction(mode, of_power=True)

    def to_dict(self) -> dict[str, Any]:
        power = self.power_coef
        return {"fixed_s": self.time_coef[0], "serial_gc": self.time_coef[1], "parallel_gc": self.time_coef[2],
                "memory_gc": self.time_coef[3], "static_w": None if power is None else power[0],
                "dynamic_w": None if power is None else power[1], "leak_w": None if power is None else power[2],
                "memory_w_per_ghz": None if power is None else power[3], "top_hz": self.top_hz,
                "fit_error": self.fit_error, "power_fit_error": self.power_fit_error,
                "corrected_at_modes": len(self.anchors)}


def _four(values: tuple[float, ...]) -> Coef:
    return values[0], values[1], values[2], values[3]


def fit_mode_model(profiles: Sequence[Profile], top_hz: float) -> ModeModel:
    """Fit NOTE [ The mode model ] to profiled modes; ``top_hz`` is the grid's highest CPU clock.

    Raises:
        EdgetrainError: fewer than two profiles, or a non-positive time or power.

    Example:
        >>> p = [Profile(ModePoint("a", c, f), 1.0 + 2.0 / (c * f / 1e9)) for c in (1, 2, 4) for f in (1e9, 2e9)]
        >>> round(fit_mode_model(p, 1e9).time_s(ModePoint("b", 8, 1e9)), 6)
        1.25
    """
    if len(profiles) < 2:
        raise EdgetrainError(f"the mode model needs at least 2 profiled modes, got {len(profiles)}")
    if any(not p.time_s > 0 or (p.power_w is not None and not p.power_w > 0) for p in profiles):
        raise EdgetrainError("profiled times and powers must be > 0")
    time_coef = _four(_nnls([_time_features(p.mode) for p in profiles], [p.time_s for p in profiles]))
    powered = [(p, p.power_w) for p in profiles if p.power_w is not None]
    power_coef = _four(_nnls([_power_features(p.mode, top_hz, time_coef) for p, _ in powered],
                             [w for _, w in powered])) if len(powered) >= 2 else None
    form = ModeModel(time_coef, power_coef, top_hz, 0.0)
    time_ratio = [p.time_s / form.form_time_s(p.mode) for p in profiles]
    power_ratio = [1.0 if p.power_w is None or power_coef is None else p.power_w / (form.form_power_w(p.mode) or 1.0)
                   for p in profiles]
    knobs = [(float(p.mode.cores), p.mode.cpu_hz, p.mode.emc_hz) for p in profiles]
    spans = tuple((min(k[i] for k in knobs), (max(k[i] for k in knobs) - min(k[i] for k in knobs)) or 1.0)
                  for i in range(3))
    scaled = ModeModel(time_coef, power_coef, top_hz, 0.0, spans=spans)
    anchors = tuple((scaled._scaled(p.mode), math.log(rt), math.log(rp))
                    for p, rt, rp in zip(profiles, time_ratio, power_ratio, strict=True))
    return ModeModel(time_coef, power_coef, top_hz, max(abs(1 / r - 1) for r in time_ratio),
                     max(abs(1 / r - 1) for r in power_ratio), anchors, spans)


def choose_profile_modes(grid: Sequence[ModePoint], count: int = 6) -> list[ModePoint]:
    """At most ``count`` modes spread over the grid: the fastest, the slowest, and the corners that vary one knob.

    In normalised coordinates (cores, clock, EMC clock in [0, 1]) the targets are (1,1,1), (0,1,1),
    (1,0,1), (1,1,0), (0.5,0.5,0.5), (0,0,0); each picks the nearest mode not yet picked.
    """
    if not grid:
        raise EdgetrainError("an empty mode grid")

    def span(values: list[float]) -> tuple[float, float]:
        return min(values), (max(values) - min(values)) or 1.0

    spans = [span([float(getattr(m, key)) for m in grid]) for key in ("cores", "cpu_hz", "emc_hz")]

    def norm(mode: ModePoint) -> tuple[float, ...]:
        return tuple((float(getattr(mode, key)) - low) / width
                     for key, (low, width) in zip(("cores", "cpu_hz", "emc_hz"), spans, strict=True))

    targets = [(1, 1, 1), (0, 1, 1), (1, 0, 1), (1, 1, 0), (0.5, 0.5, 0.5), (0, 0, 0)]
    chosen: list[ModePoint] = []
    for target in targets[:count]:
        left = [m for m in grid if m not in chosen]
        if not left:
            break
        chosen.append(min(left, key=lambda m: math.dist(norm(m), target)))
    return chosen


@dataclass(frozen=True)
class Advice:
    """The advisor's pick and what it predicts for it.

    ``margin`` / ``power_margin`` are those of a mode not profiled (a profiled one keeps the least,
    ``MIN_MARGIN``). ``at_risk`` says the pick meets the constraints only without the margins, or
    not at all (then it is the fastest mode under the cap, or the fastest of all): the closest the
    grid comes, flagged.
    """

    mode: ModePoint
    epoch_time_s: float
    power_w: float | None
    energy_j: float | None
    margin: float
    power_margin: float
    candidates: int
    at_risk: bool

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode.to_dict(), "epoch_time_s": self.epoch_time_s, "power_w": self.power_w,
                "energy_j": self.energy_j, "margin": self.margin, "power_margin": self.power_margin,
                "feasible_modes": self.candidates,
                "at_risk": self.at_risk}


def advise(model: ModeModel, grid: Sequence[ModePoint], steps_per_epoch: int, *, deadline_s: float | None = None,
           power_cap_w: float | None = None, with_margins: bool = True) -> Advice:
    """The mode of least predicted energy per epoch meeting the deadline and the power cap (NOTE [ The mode model ]).

    Modes are first held to the constraints with the margins (a profiled mode with the least one),
    then without them; when none meets them even so, the pick is the fastest mode under the cap (or
    the fastest), flagged ``at_risk``. ``with_margins=False`` skips the first round: the pick the
    advisor would make if the model were exact. Without a power model the objective is the epoch
    time instead of the energy.

    Raises:
        EdgetrainError: an empty grid or ``steps_per_epoch < 1``.
    """
    if not grid or steps_per_epoch < 1:
        raise EdgetrainError("advise needs a non-empty mode grid and steps_per_epoch >= 1")
    margin = max(MIN_MARGIN, 2 * model.fit_error)
    power_margin = max(MIN_MARGIN, 2 * model.power_fit_error)
    rows = [(mode, steps_per_epoch * model.time_s(mode), model.power_w(mode), model.measured(mode)) for mode in grid]

    def meets(epoch_s: float, power: float | None, measured: bool, keep: float) -> bool:
        time_keep, power_keep = (MIN_MARGIN, MIN_MARGIN) if measured else (margin, power_margin)
        return (deadline_s is None or epoch_s * (1 + keep * time_keep) <= deadline_s) and \
            (power_cap_w is None or power is None or power * (1 + keep * power_keep) <= power_cap_w)

    for keep in (1.0, 0.0) if with_margins else (0.0,):
        feasible = [row for row in rows if meets(row[1], row[2], row[3], keep)]
        if feasible:
            mode, epoch_s, power, _ = min(feasible, key=lambda r: r[1] * r[2] if r[2] is not None else r[1])
            return Advice(mode, epoch_s, power, None if power is None else epoch_s * power, margin, power_margin,
                          len(feasible), keep == 0.0)
    capped = [row for row in rows if power_cap_w is None or row[2] is None or row[2] <= power_cap_w] or rows
    mode, epoch_s, power, _ = min(capped, key=lambda r: r[1])
    return Advice(mode, epoch_s, power, None if power is None else epoch_s * power, margin, power_margin, 0, True)


def profile_adaptively(grid: Sequence[ModePoint], measure: Callable[[ModePoint], Profile], steps_per_epoch: int, *,
                       deadline_s: float | None = None, power_cap_w: float | None = None,
                       count: int = 6) -> list[Profile]:
    """Profile ``count - 1`` corner modes, then the advisor's pick without margins (NOTE [ Profiling where the
    answer is ]) until ``count`` modes are profiled or the pick is one of them.

    Example:
        >>> grid = [ModePoint(f"{c}c", c, 1e9) for c in (1, 2, 3, 4)]
        >>> [p.mode.cores for p in profile_adaptively(grid, lambda m: Profile(m, 1 + 1 / m.cores), 10, count=3)]
        [4, 1]
    """
    profiles = [measure(mode) for mode in choose_profile_modes(grid, count - 1)]
    top_hz = max(mode.cpu_hz for mode in grid)
    while len(profiles) < count:
        pick = advise(fit_mode_model(profiles, top_hz), grid, steps_per_epoch, deadline_s=deadline_s,
                      power_cap_w=power_cap_w, with_margins=False).mode
        if any(p.mode == pick for p in profiles):
            break
        profiles.append(measure(pick))
    return profiles


def mape_percent(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean absolute percentage error of (measured, predicted) pairs."""
    return 100.0 * sum(abs(p - m) / m for m, p in pairs) / len(pairs)


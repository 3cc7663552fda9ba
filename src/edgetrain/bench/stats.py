"""What every timing benchmark reports beside a number: its spread over repeated runs and the setup it ran on.

Prashanthi S.K. et al., *Don't Miss the Train: A Case for Systems Research into Training on the Edge*, ask an edge-
training benchmark profile for the variation across runs (an epoch's training time was consistent across boards, CoV
below 1%) and for the software versions, which moved it more than the boards did. :func:`spread` gives median,
quartiles, IQR and CoV of repeated measurements; :func:`software_setup` records torch, Python, the kernel, the CPU,
the governor and the power mode. :func:`equivalence` decides whether paired seed-by-seed differences lie within a
margin (two one-sided tests), as "final loss within 0.5% of single-node training" is read.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError
from ..profiling.host import cpu_model

__all__ = ["Spread", "equivalence", "rerun_command", "software_setup", "spread"]


@dataclass(frozen=True)
class Spread:
    """Repeated measurements summarised: ``cov_pct`` is the sample standard deviation over the mean, in %."""

    n: int
    median: float
    q1: float
    q3: float
    cov_pct: float | None

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def cov_text(self) -> str:
        """The CoV in % for tables; '-' for a single value."""
        return "-" if self.cov_pct is None else f"{self.cov_pct:.1f}%"

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "median": self.median, "q1": self.q1, "q3": self.q3, "iqr": self.iqr,
                "cov_pct": self.cov_pct}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Spread:
        """The spread that :meth:`to_dict` wrote (its ``iqr`` is derived again)."""
        return cls(value["n"], value["median"], value["q1"], value["q3"], value["cov_pct"])

    def text(self, fmt: str = "{:.4g}") -> str:
        """'median (IQR x, CoV y%, n)' for tables."""
        return f"{fmt.format(self.median)} (IQR {fmt.format(self.iqr)}, CoV {self.cov_text}, n={self.n})"


def spread(values: Sequence[float]) -> Spread:
    """Median, quartiles (inclusive method: the sample's own range) and CoV of ``values``.

    Raises:
        EdgetrainError: no values.

    Example:
        >>> s = spread([1.0, 2.0, 3.0, 4.0, 5.0])
        >>> (s.median, s.q1, s.q3, s.iqr, round(s.cov_pct, 2))
        (3.0, 2.0, 4.0, 2.0, 52.7)
    """
    if not values:
        raise EdgetrainError("spread of no values")
    data = [float(v) for v in values]
    if len(data) == 1:
        return Spread(1, data[0], data[0], data[0], None)
    q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    mean = statistics.fmean(data)
    return Spread(len(data), statistics.median(data), q1, q3, 100.0 * statistics.stdev(data) / mean if mean else None)


def equivalence(differences: list[float], margin: float, confidence: float = 0.90) -> dict[str, Any]:
    """Mean, standard deviation and standard error of the seed-by-seed differences, their ``confidence`` interval
    (Student's t) and the verdict: "within" ±``margin`` when the whole interval lies inside (TOST at
    ``(1 - confidence) / 2`` each side), "outside" when it lies wholly beyond, else "undecided", with the seeds a
    decision would need at this mean and spread, and those it would need were the true difference 0 (normal
    quantile: ``(z · sd / gap)²``). Needs scipy (the ``insitu`` extra)."""
    from scipy.stats import t as student_t

    n = len(differences)
    mean = statistics.mean(differences)
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "se": None, "ci": None, "verdict": "undecided", "seeds_needed": None,
                "seeds_if_equal": None}
    sd = statistics.stdev(differences)
    se = sd / math.sqrt(n)
    half = float(student_t.ppf(0.5 + confidence / 2, n - 1)) * se
    low, high = mean - half, mean + half
    verdict = "within" if -margin < low and high < margin else \
        "outside" if low > margin or high < -margin else "undecided"
    gap = abs(margin - abs(mean))
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    needed = None if verdict != "undecided" or gap == 0 else max(n, math.ceil((z * sd / gap) ** 2))
    return {"n": n, "mean": mean, "sd": sd, "se": se, "ci": [low, high], "verdict": verdict, "seeds_needed": needed,
            "seeds_if_equal": math.ceil((z * sd / margin) ** 2)}


def rerun_command(script: str, options: Mapping[str, Any], leave_out: Collection[str] = ()) -> str:
    """The command line that reruns a benchmark: ``python SCRIPT`` and each parsed option (``vars(args)``) as
    ``--name value`` (a list comma-joined, ``True`` a bare flag); an unset one (``False``, ``None``, ``[]``) and
    those in ``leave_out`` (where the output goes) are omitted."""
    words = [f"python {script}"]
    for name, value in options.items():
        if name in leave_out or value is False or value is None or value == []:
            continue
        flag = f"--{name.replace('_', '-')}"
        words.append(flag if value is True else
                     f"{flag} {','.join(map(str, value)) if isinstance(value, list) else value}")
    return " ".join(words)


def software_setup(root: Path = Path("/")) -> dict[str, Any]:
    """The software and CPU settings a timing depends on: torch, Python, kernel, CPU, threads, governor, mode."""
    import torch

    from ..power.control import Board
    from ..power.modes import read_cpu_state

    state = read_cpu_state(root)
    governors = sorted(set(state.governors.values()))
    nvpmodel = Board(root).nvpmodel_mode()
    return {"torch": torch.__version__, "python": platform.python_version(), "kernel": platform.release(),
            "machine": platform.machine(), "cpu": cpu_model() or platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "online_cpus": len(state.online), "torch_threads": torch.get_num_threads(),
            "governor": ",".join(governors) if governors else "unavailable: no cpufreq",
            "cpu_max_freq_khz": max(state.max_freq_khz.values()) if state.max_freq_khz else None,
            "power_mode": "unavailable: no nvpmodel" if nvpmodel is None else f"nvpmodel {nvpmodel}"}

"""A plan made on a workstation, shipped to the device: everything ``edgetrain train --plan`` needs.

The device then trains without profiling or planning (no planner, no JIT, no solver in its
memory). The file holds the schedule, the chain it was made for (stage sizes and times), what
the chain describes (model, batch, image, optimizer, classes), the budget and the predicted
figures, the edgetrain version and a SHA-256 of all of it, so a truncated, edited or foreign
file is refused before any work, and a plan for another model or shape is refused naming the
mismatch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError
from ..sysutil.fileio import to_json, write_atomic
from .chain import Chain
from .schedule import Schedule
from .simulator import simulate, validate

__all__ = ["PlanFile", "PlanFileError", "PLAN_FILE_FORMAT", "PLAN_FILE_VERSION"]

PLAN_FILE_FORMAT = "edgetrain-plan"
PLAN_FILE_VERSION = 1
_SUBJECT = ("model", "batch", "image", "optimizer", "num_classes", "update")


class PlanFileError(EdgetrainError):
    """A plan file that cannot be used: unreadable, altered, another version, or for another run."""


@dataclass(frozen=True)
class PlanFile:
    """A schedule with the chain and the training settings it was planned for.

    ``budget_bytes`` is the step's tensor budget the plan was made within (None for a ρ request);
    ``predicted_peak_bytes``/``predicted_time_s`` are the simulator's figures on ``chain``.
    """

    model: str
    batch: int
    image: int
    optimizer: str
    num_classes: int
    chain: Chain
    schedule: Schedule
    budget_bytes: int | None
    device: str | None = None
    update: str = "all"   # the parameters that train (NOTE [ Update schemes ] in models/update.py)

    @property
    def predicted_peak_bytes(self) -> int:
        return simulate(self.chain, self.schedule).peak_bytes

    def subject(self) -> dict[str, Any]:
        """What the plan is for: the settings a training run must match."""
        return {key: getattr(self, key) for key in _SUBJECT}

    def mismatches(self, **settings: Any) -> list[str]:
        """``key: plan's -> run's`` for each of ``settings`` that differs from the plan's subject."""
        subject = self.subject()
        return [f"{key}: {subject[key]!r} (plan) -> {value!r} (run)" for key, value in settings.items()
                if subject[key] != value]

    def check_matches(self, **settings: Any) -> None:
        """Raise :class:`PlanFileError` naming every setting that differs from the plan's."""
        differing = self.mismatches(**settings)
        if differing:
            raise PlanFileError(f"the plan is for another run ({'; '.join(differing)}); make a plan for this one "
                                "with edgetrain plan ... -o")

    def body(self) -> dict[str, Any]:
        from .. import __version__

        stats = simulate(self.chain, self.schedule)
        return {**self.subject(), "device": self.device, "budget_bytes": self.budget_bytes,
                "predicted_peak_bytes": stats.peak_bytes, "predicted_time_s": stats.time_s,
                "recompute_factor": stats.recompute_factor, "strategy": self.schedule.strategy,
                "edgetrain_version": __version__, "chain": self.chain.to_dict(), "schedule": self.schedule.to_dict()}

    def save(self, path: str | Path) -> Path:
        """Write the plan atomically, with the SHA-256 of its body."""
        body = self.body()
        record = {"format": PLAN_FILE_FORMAT, "version": PLAN_FILE_VERSION, "sha256": _digest(body), "plan": body}
        return write_atomic(path, to_json(record, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> PlanFile:
        """Read and check a plan file.

        Raises:
            PlanFileError: missing, not JSON (e.g. truncated), not a plan file, another format
                version, a body that does not match its SHA-256 (edited), or a schedule that
                does not run on its chain. One line each.
        """
        path = Path(path)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanFileError(f"no plan file at {path}") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise PlanFileError(f"{path} is not a readable plan file ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0]}); it may be truncated") from None
        if not isinstance(record, dict) or record.get("format") != PLAN_FILE_FORMAT:
            raise PlanFileError(f"{path} is not an edgetrain plan file (make one with edgetrain plan ... -o)")
        if record.get("version") != PLAN_FILE_VERSION:
            raise PlanFileError(f"{path} is a plan file of format version {record.get('version')!r}; this edgetrain "
                                f"reads version {PLAN_FILE_VERSION}: make the plan again with this version")
        body = record.get("plan")
        if not isinstance(body, dict) or record.get("sha256") != _digest(body):
            raise PlanFileError(f"{path} was altered after it was written (its SHA-256 does not match); "
                                "make the plan again")
        try:
            plan = cls(chain=Chain.from_dict(body["chain"]), schedule=Schedule.from_dict(body["schedule"]),
                       budget_bytes=body["budget_bytes"], device=body["device"],
                       **{key: body[key] for key in _SUBJECT if key in body or key != "update"})
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFileError(f"{path} is missing or has a malformed field ({exc})") from None
        validate(plan.chain, plan.schedule)
        return plan


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()

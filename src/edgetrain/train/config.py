"""What a training run is, checked before any work: the settings of ``edgetrain train``.

:meth:`TrainConfig.check` runs before a dataset is generated, a model is built or a file is
written, so a bad setting costs nothing and leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.planfile import PlanFile
from ..errors import EdgetrainError, UnknownNameError
from ..units import parse_bytes
from .rundir import RunIdentity

__all__ = ["TrainConfig"]


@dataclass(frozen=True)
class TrainConfig:
    """What to train, on what data, within what budget, and where to keep the run.

    ``memory`` bounds the whole process (NOTE [ Process budget ]); ``step_memory`` bounds only
    the step's tensors, as ``plan(memory=...)`` does. ``plan_file`` trains from a plan made
    elsewhere (``edgetrain plan -o``) without profiling or planning; ``page_dir`` is where a
    paging schedule writes.
    ``resume`` continues the run in ``run_dir`` (or starts it when there is none yet);
    ``overwrite`` replaces a run that is there; ``replan`` lets a resumed run plan again when
    its saved plan does not meet a changed budget (see NOTE [ Run directory protocol ]).
    ``step_in_backward`` updates each parameter as soon as its gradient is made, one optimizer per
    parameter, and plans for it (NOTE [ The optimizer step in the backward ] in ``chain.py``).
    ``update`` names the parameters that train (NOTE [ Update schemes ] in ``models/update.py``).
    """

    model: str = "resnet18"
    data: str = "synthetic"
    samples: int = 1000
    batch: int = 8
    image: int = 64
    memory: str | int | None = None
    step_memory: str | int | None = None
    recompute: float | None = None
    plan_file: Path | None = None
    page_dir: Path | None = None
    device: str | None = None
    strategy: str = "auto"
    epochs: int = 3
    optimizer: str = "sgd"
    lr: float | None = None
    lr_schedule: str = "constant"
    workers: int = 0
    run_dir: Path = Path("runs/latest")
    data_root: Path | None = None
    resume: bool = False
    overwrite: bool = False
    replan: bool = False
    seed: int = 0
    save_every: int = 50
    keep_last: int = 2
    skip_corrupt: bool = False
    step_in_backward: bool = False
    update: str = "all"

    def check(self) -> None:
        """Refuse any setting that cannot work, before any work; one-line messages.

        Raises:
            EdgetrainError: a count below its minimum, a non-finite or non-positive number, an
                unknown model, optimizer, strategy or device, a size the model cannot take,
                conflicting options.
        """
        from ..core.chain import OPTIMIZERS
        from ..core.optim import LR_SCHEDULES
        from ..data import SYNTHETIC_CLASSES, VAL_FRACTION
        from ..data.generated import check_split
        from ..devices import get_device
        from ..models import check_input, get_model_spec
        from ..models.factory import check_factory_call, is_factory_name
        from ..planners.choose import STRATEGIES

        _at_least("--batch", self.batch, 1)
        _at_least("--samples", self.samples, 1)
        _at_least("--epochs", self.epochs, 1)
        _at_least("--save-every", self.save_every, 1)
        _at_least("--workers", self.workers, 0)
        _at_least("keep_last", self.keep_last, 1)
        if self.optimizer not in OPTIMIZERS:
            raise UnknownNameError("optimizer", self.optimizer, OPTIMIZERS)
        if self.strategy not in STRATEGIES:
            raise UnknownNameError("strategy", self.strategy, STRATEGIES)
        if self.lr_schedule not in LR_SCHEDULES:
            raise UnknownNameError("learning-rate schedule", self.lr_schedule, LR_SCHEDULES)
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise EdgetrainError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.recompute is not None and (self.memory is not None or self.step_memory is not None):
            raise EdgetrainError("give --memory/--step-memory or --recompute, not both")
        if self.memory is not None and self.step_memory is not None:
            raise EdgetrainError("give --memory (the process) or --step-memory (the step's tensors), not both")
        if self.plan_file is not None and (self.recompute is not None or self.step_memory is not None
                                           or self.strategy != "auto"):
            raise EdgetrainError("--plan replaces planning: drop --recompute, --step-memory and --strategy")
        if self.plan_file is not None and self.step_in_backward:
            raise EdgetrainError("--plan ships a plan for a whole step: drop --step-in-backward, or plan here")
        if self.recompute is not None and not (math.isfinite(self.recompute) and self.recompute >= 1):
            raise EdgetrainError(f"--recompute is a factor ρ >= 1 (time with recomputation over time without), "
                                 f"got {self.recompute}")
        if self.resume and self.overwrite:
            raise EdgetrainError("give --resume or --overwrite, not both")
        if self.data != "synthetic" and not Path(self.data).expanduser().is_dir():
            raise EdgetrainError(f"no dataset at {self.data!r}: pass 'synthetic', a folder of class subfolders with "
                                 "images, or a folder of CIFAR-10 .bin files")
        if self.data == "synthetic":
            check_split(self.samples, SYNTHETIC_CLASSES, self.batch, self.seed, VAL_FRACTION)
        spec = get_model_spec(self.model)
        check_input(spec, self.batch, self.image)
        if self.data == "synthetic" and is_factory_name(self.model):
            check_factory_call(self.model, self.batch, self.image, SYNTHETIC_CLASSES)
        self._check_update(spec)
        if self.device is not None:
            get_device(self.device)
        budget = self.budget_bytes()
        if budget is not None and budget <= 0:
            raise EdgetrainError(f"--memory must be > 0, got {self.memory!r}")
        if self.step_budget_bytes() == 0:
            raise EdgetrainError(f"--step-memory must be > 0, got {self.step_memory!r}")
        if self.page_dir is not None and not Path(self.page_dir).is_dir():
            raise EdgetrainError(f"--page-dir {self.page_dir} is not a directory")
        if self.plan_file is not None:
            self.shipped_plan().check_matches(model=self.model, batch=self.batch, image=self.image,
                                              optimizer=self.optimizer, update=self.update_text())
        if budget is not None and self.workers > 0:
            raise EdgetrainError("--workers > 0 with a memory budget: loader workers are processes of their own, "
                                 "outside the budget of the training process; use --workers 0")

    def budget_bytes(self) -> int | None:
        """The memory budget: ``memory`` if given, else the device's RAM, else none."""
        if self.memory is not None:
            try:
                return parse_bytes(self.memory)
            except ValueError as exc:
                raise EdgetrainError(f"--memory: {exc}") from None
        if self.device is not None:
            from ..devices import get_device

            return get_device(self.device).memory_bytes
        return None

    def step_budget_bytes(self) -> int | None:
        """The step's tensor budget ``step_memory``, if given."""
        if self.step_memory is None:
            return None
        try:
            return parse_bytes(self.step_memory)
        except ValueError as exc:
            raise EdgetrainError(f"--step-memory: {exc}") from None

    def shipped_plan(self) -> PlanFile:
        """The plan file given with ``plan_file`` (checked: see :meth:`PlanFile.load`)."""
        assert self.plan_file is not None
        return PlanFile.load(self.plan_file)

    def learning_rate(self) -> float:
        from ..core.optim import DEFAULT_LR

        return DEFAULT_LR[self.optimizer] if self.lr is None else float(self.lr)

    def total_steps(self, train_samples: int) -> int:
        """The run's steps over a training split of ``train_samples``: whole batches only (the loader drops the
        last, partial one), every epoch."""
        return train_samples // self.batch * self.epochs

    def learning_rate_at(self, step: int, total_steps: int) -> float:
        """The rate of the step after ``step`` of ``total_steps`` (:func:`~edgetrain.core.optim.scheduled_rate`)."""
        from ..core.optim import scheduled_rate

        return scheduled_rate(self.learning_rate(), self.lr_schedule, step, total_steps)

    def update_text(self) -> str:
        """The update scheme as plan files and ``run.json`` spell it."""
        from ..models.update import parse_update

        return parse_update(self.update).text

    def _check_update(self, spec: Any) -> None:
        """Refuse a scheme that does not parse, or that names nothing of the model, on the model built on the
        meta device (no memory, no time)."""
        import torch

        from ..models.update import AUTO, apply_update, parse_update

        if parse_update(self.update).kind == AUTO:   # chosen from the data when the run opens it
            return
        with torch.device("meta"):
            net = spec.build(spec.default_num_classes)
        apply_update(net, self.update)

    def identity(self) -> RunIdentity:
        """The settings that change the run's numbers, and the request its plan must meet."""
        data = self.data if self.data == "synthetic" else str(Path(self.data).expanduser().resolve())
        identity: dict[str, Any] = {
            "model": self.model, "data": data, "samples": self.samples if self.data == "synthetic" else None,
            "batch": self.batch, "image": self.image, "optimizer": self.optimizer, "lr": self.learning_rate(),
            "seed": self.seed, "skip_corrupt": self.skip_corrupt}
        if self.lr_schedule != "constant":  # runs recorded before schedules existed keep their identity
            identity["lr_schedule"] = self.lr_schedule
        if self.step_in_backward:   # and before the optimizer moved into the backward
            identity["step_in_backward"] = True
        if self.update_text() != "all":
            identity["update"] = self.update_text()
        request = {"budget_bytes": self.budget_bytes(), "step_budget_bytes": self.step_budget_bytes(),
                   "recompute": self.recompute, "device": self.device, "strategy": self.strategy}
        if self.plan_file is not None:
            identity["plan_sha256"] = hashlib.sha256(Path(self.plan_file).read_bytes()).hexdigest()
        return RunIdentity(identity=identity, request=request)


def _at_least(option: str, value: int, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise EdgetrainError(f"{option} must be an integer >= {least}, got {value!r}")

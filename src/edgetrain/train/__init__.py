"""Training: the loop behind ``edgetrain train`` and its crash-safe, resumable state."""

from .config import TrainConfig
from .loop import StepMetrics, TrainSummary, evaluate, train
from .rundir import RunLockedError, RunMismatchError
from .state import (
    STATE_FORMAT_VERSION,
    CorruptStateError,
    ResumableSampler,
    StateError,
    StateStore,
    TrainingState,
    capture_rng,
    load_state,
    restore_rng,
    save_state,
)

__all__ = [
    "train", "TrainConfig", "TrainSummary", "StepMetrics", "evaluate", "RunLockedError", "RunMismatchError",
    "TrainingState", "StateStore", "ResumableSampler", "StateError", "CorruptStateError",
    "capture_rng", "restore_rng", "save_state", "load_state", "STATE_FORMAT_VERSION",
]

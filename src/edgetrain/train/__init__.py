"""Training: the loop behind ``edgetrain train`` and its crash-safe, resumable state."""

from .loop import StepMetrics, TrainConfig, TrainSummary, evaluate, train
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
    "train", "TrainConfig", "TrainSummary", "StepMetrics", "evaluate",
    "TrainingState", "StateStore", "ResumableSampler", "StateError", "CorruptStateError",
    "capture_rng", "restore_rng", "save_state", "load_state", "STATE_FORMAT_VERSION",
]

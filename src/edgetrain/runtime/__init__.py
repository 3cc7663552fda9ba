"""Run planned schedules in real training steps: the executor and the ``Checkpointed`` model wrapper."""

from .checkpointed import Checkpointed
from .executor import Executor, PendingBackward, run_schedule

__all__ = ["Executor", "PendingBackward", "run_schedule", "Checkpointed"]

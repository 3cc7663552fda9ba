"""Run planned schedules in real training steps: the executor, paging, and the ``Checkpointed`` model wrapper."""

from .checkpointed import Checkpointed
from .executor import Executor, PendingBackward, run_schedule
from .pager import PageSession, PageStore, PagingStats
from .verify import StepCheck, check_step, three_budgets

__all__ = ["Executor", "PendingBackward", "run_schedule", "Checkpointed", "PageStore", "PageSession", "PagingStats",
           "StepCheck", "check_step", "three_budgets"]

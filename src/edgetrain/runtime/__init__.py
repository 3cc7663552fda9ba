"""Run planned schedules in real training steps: the executor, paging, and the ``Checkpointed`` model wrapper."""

from .checkpointed import Checkpointed
from .executor import Executor, PendingBackward, run_schedule
from .pager import PageSession, PageStore, PagingStats

__all__ = ["Executor", "PendingBackward", "run_schedule", "Checkpointed", "PageStore", "PageSession", "PagingStats"]

"""Run planned schedules in real training steps: the executor, paging, the ``Checkpointed`` model wrapper, and
``fit_compiled`` (the fastest ``torch.compile``'d step within a byte budget)."""

from .checkpointed import Checkpointed
from .compiled import CompiledStep, fit_compiled
from .executor import Executor, PendingBackward, run_schedule
from .pager import PageSession, PageStore, PagingStats
from .verify import StepCheck, check_step, three_budgets

__all__ = ["Executor", "PendingBackward", "run_schedule", "Checkpointed", "CompiledStep", "fit_compiled", "PageStore",
           "PageSession", "PagingStats", "StepCheck", "check_step", "three_budgets"]

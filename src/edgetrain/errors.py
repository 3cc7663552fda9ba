"""Typed errors of the library; the CLI turns each into one clear message and a non-zero exit."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EdgetrainError", "UnknownNameError", "InfeasibleBudgetError", "ScheduleError", "PagingError"]


class EdgetrainError(Exception):
    """Base class of every error edgetrain raises on purpose (bad input, impossible request)."""


class UnknownNameError(EdgetrainError, KeyError):
    """A model, device or strategy name that is not in its registry."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]) -> None:
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid names: {', '.join(self.valid)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class InfeasibleBudgetError(EdgetrainError):
    """The requested memory budget (or recompute factor) cannot be met; carries the minimum."""

    def __init__(self, message: str, *, minimum_bytes: int | None = None, budget_bytes: int | None = None) -> None:
        self.minimum_bytes, self.budget_bytes = minimum_bytes, budget_bytes
        super().__init__(message)


class ScheduleError(EdgetrainError):
    """A schedule that cannot run on its chain; the message names the offending op."""


class PagingError(EdgetrainError):
    """Paging activations to storage failed: the page directory, the disk budget, a full disk or
    a failed transfer; the message names the path and the OS's reason. A step never falls back
    to keeping the value in RAM: that would break the memory plan."""

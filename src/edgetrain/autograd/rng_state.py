"""The random number generators' state: noted at a stage's first forward and replayed by its recomputation
(the executor), and compared around a profiled forward to learn whether the stage draws from them (the
profiler, ``StageCost.uses_rng``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["RngState", "RandomDraws", "replayed_rng", "STATE_WATCHERS"]

# Called with the tensors of each state a plan counts as it is kept: the active byte trackers' ``register``
# (profile/tracker.py). A state is made outside the dispatcher, where a tracker would not see it (NOTE
# [ Generator states in the plan ] in schedule.py).
STATE_WATCHERS: list[Callable[[list[torch.Tensor]], None]] = []


@dataclass
class RngState:
    """The CPU generator's state, and every CUDA device's where CUDA is in use."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def capture(cls, counted: bool = False) -> RngState:
        """The state now; ``counted``: one a plan counts, shown to :data:`STATE_WATCHERS`."""
        cuda = torch.cuda.get_rng_state_all() if _cuda_rng_in_use() else []
        state = cls(torch.get_rng_state(), cuda)
        if counted:
            for watch in STATE_WATCHERS:
                watch(state.tensors)
        return state

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [self.cpu, *self.cuda]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda:
            torch.cuda.set_rng_state_all(self.cuda)

    def equals(self, other: RngState) -> bool:
        """Whether no generator moved between the two captures."""
        mine, theirs = self.tensors, other.tensors
        return len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))


class RandomDraws(TorchDispatchMode):
    """Notes whether an op that draws from a random generator ran (the ops PyTorch tags
    ``nondeterministic_seeded``: dropout's ``bernoulli_``, ``rand``, ``randperm``, ...). On the meta
    device no generator moves, so comparing states cannot tell; the ops still dispatch there."""

    def __init__(self) -> None:
        super().__init__()
        self.drew = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.drew = self.drew or torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _cuda_rng_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


@contextlib.contextmanager
def replayed_rng(state: RngState, counted: bool = False) -> Iterator[None]:
    """Run with the RNG as it was at the stage's first forward; put the global state back after (from a copy,
    ``counted`` as :meth:`RngState.capture` says)."""
    now = RngState.capture(counted)
    state.restore()
    try:
        yield
    finally:
        now.restore()

"""Running statistics of norm layers across a recomputed forward (used by the executor and by blocks
checkpointed inside a stage, ``models/segmented.py``): a recomputation must not update them twice."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from torch import nn

__all__ = ["running_norms", "frozen_statistics", "recomputing"]

_RECOMPUTING: ContextVar[bool] = ContextVar("edgetrain_recomputing", default=False)


def recomputing() -> bool:
    """Whether the forward running now repeats one of this step (inside :func:`frozen_statistics`).

    A norm whose batch statistics are not its input's alone (``distributed.batch_norm``: summed over
    nodes) reuses the first forward's, so a recomputation gives the same output and joins no collective.
    """
    return _RECOMPUTING.get()


def running_norms(stage: nn.Module) -> list[nn.modules.batchnorm._NormBase]:
    """Norm layers whose training-mode forward updates running statistics (BatchNorm, tracking InstanceNorm)."""
    return [module for module in stage.modules()
            if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats and module.training]


@contextlib.contextmanager
def frozen_statistics(stage: nn.Module) -> Iterator[None]:
    """Keep a recomputing forward from updating the stage's running statistics a second time.

    With momentum 0 the update is ``0 * batch + 1 * running``, which leaves the statistics bit
    for bit (batch statistics are finite wherever training is), so they need no copy: a copy would
    be memory the chain does not count (cloning them adds 13,156 bytes to DenseNet-121's
    recomputing steps). The batch counter goes back by a write through ``.data``, which has
    its own version counter, so autograd does not see a recorded BatchNorm's buffer modified.
    """
    norms = running_norms(stage)
    saved = [(norm.momentum, None if norm.num_batches_tracked is None else int(norm.num_batches_tracked))
             for norm in norms]
    for norm in norms:
        norm.momentum = 0.0
    token = _RECOMPUTING.set(True)
    try:
        yield
    finally:
        _RECOMPUTING.reset(token)
        for norm, (momentum, count) in zip(norms, saved, strict=True):
            norm.momentum = momentum
            if count is not None and norm.num_batches_tracked is not None:
                norm.num_batches_tracked.data.fill_(count)

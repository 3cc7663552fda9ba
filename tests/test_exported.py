"""Models torch.fx cannot trace, captured by torch.export on a sample batch (NOTE [ Exported stages ] in
``models/traced.py``): a forward that branches on its input's shape or dtype, a submodule that returns a structured
value, the way Hugging Face models are written."""

from __future__ import annotations

import copy
from typing import NamedTuple

import pytest
import torch
from torch import nn

from edgetrain import Checkpointed
from edgetrain.models import NotTraceableError, stages_of
from edgetrain.planners.choose import least_step_bytes


class Encoded(NamedTuple):
    hidden: torch.Tensor
    pooled: torch.Tensor


class Encoder(nn.Module):
    """Branches on its input's shape and dtype, and returns a structured value: fx keeps it whole."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1),
                                                  nn.Linear(64, 32)) for _ in range(4))

    def forward(self, h: torch.Tensor) -> Encoded:
        if h.shape[1] == 1 or h.dtype != torch.float32:
            h = h.float()
        for layer in self.layers:
            h = h + layer(h)
        return Encoded(h, h.mean(1))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.encoder, self.head = nn.Linear(8, 32), Encoder(), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).pooled)


class BranchingRoot(nn.Module):
    """Its own forward branches on the batch's shape: fx cannot trace it at all."""

    def __init__(self, norm: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.a, self.norm, self.b = nn.Linear(8, 16), norm(16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.a(x)))
        return self.b(h if x.shape[0] > 1 else h * 2)


def _gradient_error(model: nn.Module, x: torch.Tensor, y: torch.Tensor, memory_over_least: float) -> tuple[float, int]:
    """The worst relative gradient error of a planned user-loop step against plain autograd, and the plan's
    recomputed forwards."""
    reference = copy.deepcopy(model)
    probe = Checkpointed(model, sample=x, target=y, recompute=100.0, measure_time=False, profile_cache=False)
    wrapped = Checkpointed(model, sample=x, target=y, memory=int(least_step_bytes(probe.chain) * memory_over_least),
                           measure_time=False, chain=probe.chain, profile_cache=False)
    torch.manual_seed(3)
    nn.functional.cross_entropy(reference(x), y).backward()
    torch.manual_seed(3)
    nn.functional.cross_entropy(wrapped(x), y).backward()
    errors = [((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()
              for p, r in zip(model.parameters(), reference.parameters(), strict=True)]
    return max(errors), wrapped.plan.stats.forward_advances


def test_a_submodule_returning_a_structured_value_is_exported_into_stages_that_train_as_plain_autograd() -> None:
    torch.manual_seed(0)
    model, x, y = Classifier(), torch.randn(4, 16, 8), torch.zeros(4, dtype=torch.long)
    stages = stages_of(model, x)
    # the embedding, each of the four residual layers, the pooling, the head
    assert len(stages) == 7
    value: object = x
    with torch.no_grad():
        for stage in stages:
            value = stage(value)
            assert isinstance(value, torch.Tensor)
    error, recomputed = _gradient_error(model, x, y, 1.01)
    assert error == 0.0 and recomputed > 0
    assert {id(p) for s in stages for p in s.parameters()} <= {id(p) for p in model.parameters()}


def test_an_exported_model_is_captured_again_for_a_batch_of_another_shape() -> None:
    torch.manual_seed(0)
    model = Classifier()
    wrapped = Checkpointed(model, sample=torch.randn(4, 16, 8), recompute=1.3, measure_time=False,
                           profile_cache=False)
    x, y = torch.randn(2, 16, 8), torch.zeros(2, dtype=torch.long)
    reference = copy.deepcopy(model)
    torch.manual_seed(5)
    nn.functional.cross_entropy(reference(x), y).backward()
    torch.manual_seed(5)
    nn.functional.cross_entropy(wrapped(x), y).backward()
    assert wrapped.chain.meta["input_shape"] == [2, 16, 8]
    assert all(torch.equal(p.grad, r.grad) for p, r in zip(model.parameters(), reference.parameters(), strict=True))


def test_a_root_forward_fx_cannot_trace_is_exported_given_a_sample() -> None:
    torch.manual_seed(0)
    model, x, y = BranchingRoot(), torch.randn(4, 8), torch.zeros(4, dtype=torch.long)
    with pytest.raises(NotTraceableError, match="control flow"):
        stages_of(model)
    assert len(stages_of(model, x)) >= 2
    assert _gradient_error(model, x, y, 1.0)[0] == 0.0


def test_batchnorm_in_an_exported_forward_is_refused_naming_it() -> None:
    with pytest.raises(NotTraceableError, match=r"BranchingRoot.*control flow.*and BranchingRoot: BatchNorm"):
        stages_of(BranchingRoot(nn.BatchNorm1d), torch.randn(4, 8))

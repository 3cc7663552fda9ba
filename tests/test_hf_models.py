"""Hugging Face transformers' published architectures under ``Checkpointed``: ten models of five families, built from
small configs (no weights: nothing is downloaded), each trained one step at its least budget with gradients equal to
plain autograd's. Several of them torch.fx cannot trace whole, and are captured by torch.export (NOTE [ Exported
stages ] in ``models/traced.py``). Each runs twice: behind a one-line wrapper that returns the logits, and as
published, called with its own keyword inputs (an attention mask with padding) and returning its ``ModelOutput``
(NOTE [ Side inputs ] in ``models/call.py``)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from edgetrain import Checkpointed
from edgetrain.core.chain import Chain
from edgetrain.planners import plan
from edgetrain.planners.choose import least_step_bytes
from edgetrain.runtime import three_budgets
from edgetrain.runtime.verify import memtracker_step_peak, step_peaks

transformers = pytest.importorskip("transformers")


class Logits(nn.Module):
    """The model's logits, one row per prediction (a language model's per token)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits.flatten(0, -2)


LAYERS = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def _tokens() -> torch.Tensor:
    return torch.randint(0, 1000, (2, 16))


def _images(size: int = 32) -> torch.Tensor:
    return torch.randn(2, 3, size, size)


T = transformers
MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    # encoders
    "bert": lambda: (T.BertForSequenceClassification(T.BertConfig(vocab_size=1000, num_labels=3, **LAYERS)),
                     _tokens()),
    "distilbert": lambda: (T.DistilBertForSequenceClassification(T.DistilBertConfig(
        vocab_size=1000, dim=64, n_layers=2, n_heads=2, hidden_dim=128, num_labels=3)), _tokens()),
    "roberta": lambda: (T.RobertaForSequenceClassification(T.RobertaConfig(vocab_size=1000, num_labels=3, **LAYERS)),
                        _tokens()),
    # a decoder, its embedding tied to its output layer
    "gpt2": lambda: (T.GPT2LMHeadModel(T.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=2,
                                                    n_positions=32)), _tokens()),
    # vision transformers, and a hierarchical one
    "vit": lambda: (T.ViTForImageClassification(T.ViTConfig(image_size=32, patch_size=8, num_labels=3, **LAYERS)),
                    _images()),
    "deit": lambda: (T.DeiTForImageClassification(T.DeiTConfig(image_size=32, patch_size=8, num_labels=3, **LAYERS)),
                     _images()),
    "swin": lambda: (T.SwinForImageClassification(T.SwinConfig(image_size=32, patch_size=2, embed_dim=16,
                                                               depths=[1, 1], num_heads=[2, 2], window_size=4,
                                                               num_labels=3)), _images()),
    # convolutional: layer scale and stochastic depth; BatchNorm
    "convnext": lambda: (T.ConvNextForImageClassification(T.ConvNextConfig(
        hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=3, drop_path_rate=0.1)), _images(64)),
    "resnet": lambda: (T.ResNetForImageClassification(T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32],
                                                                     depths=[1, 1], num_labels=3)), _images()),
    # hybrid convolution and attention, mobile blocks
    "mobilevit": lambda: (T.MobileViTForImageClassification(T.MobileViTConfig(
        image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_labels=3)),
        _images(64)),
}


class Trained(NamedTuple):
    worst_gradient_error: float   # relative to the model's largest gradient
    tracked_over_plan: int        # the second step's peak by edgetrain's tracker, over the plan's (without scratch)
    allocated_over_plan: int      # by the allocator's records, over the plan's peak
    memtracker_over_tracked: int | None   # PyTorch's MemTracker over edgetrain's tracker, a third step


@functools.cache
def _trained(name: str) -> Trained:
    """``name`` trained at its least budget in a user loop against plain autograd, and its steps' peaks."""
    torch.manual_seed(0)
    model, x = MODELS[name]()
    wrapped_model = Logits(model).train()
    reference = copy.deepcopy(wrapped_model)
    y = torch.zeros(reference(x).shape[0], dtype=torch.long)
    chain = Checkpointed(wrapped_model, sample=x, target=y, recompute=100.0, measure_time=False,
                         profile_cache=False).chain
    wrapped = Checkpointed(wrapped_model, sample=x, target=y, memory=least_step_bytes(chain), measure_time=False,
                           chain=chain, profile_cache=False)
    return _measured(wrapped_model, reference, wrapped, lambda m: nn.functional.cross_entropy(m(x), y), [x, y])


def _measured(model: nn.Module, reference: nn.Module, wrapped: Checkpointed,
              loss_of: Callable[[nn.Module], torch.Tensor], batch: list[torch.Tensor]) -> Trained:
    """A step of ``wrapped`` (of ``model``) against plain autograd on ``reference`` from the same RNG state, then a
    second step's peaks (momentum buffers exist by then) and a third's by ``MemTracker``; ``loss_of(m)`` is the loss
    of one call of ``m`` on the batch, whose tensors (the labels among them) ``batch`` lists."""
    torch.manual_seed(3)
    loss_of(reference).backward()
    torch.manual_seed(3)
    loss_of(wrapped).backward()
    pairs = [(p.grad, r.grad) for p, r in zip(model.parameters(), reference.parameters(), strict=True)]
    assert all((g is None) == (r is None) for g, r in pairs)
    largest = max(r.abs().max().item() for _, r in pairs if r is not None)
    error = max((g - r).abs().max().item() for g, r in pairs if g is not None and r is not None) / largest
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with step_peaks(model, optimizer, *batch) as peaks:
        loss_of(wrapped).backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    counted = memtracker_step_peak(lambda: loss_of(wrapped).backward(), model, optimizer, *batch)
    return Trained(error, peaks.tracked - wrapped.predicted_tracked_peak_bytes,
                   peaks.allocated - wrapped.plan.predicted_peak_bytes,
                   None if counted is None else counted - peaks.tracked)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_published_architecture_trains_at_its_least_budget_as_plain_autograd(name: str) -> None:
    # relative to the largest gradient of the model: a key projection's bias has a gradient that is zero but for
    # float rounding (softmax ignores a constant added to every key), which the order of a sum changes
    assert _trained(name).worst_gradient_error <= 1e-6


# Known gaps. ViT's and DeiT's measured peaks exceed their plans by the bytes of their class (and distillation) tokens
# over the batch, 2 x 64 floats each: the stage that concatenates the tokens to the patches passes back, as its
# input's gradient, a view into the gradient of the whole concatenation, which keeps those rows alive until the stage
# before consumes it, where the chain counts a gradient the size of the input. ConvNeXt's allocator peak is 8 bytes
# over, one 2-float tensor (the size of its stochastic depth's draw at batch 2), not yet explained. strict: a fix shows
# here as an unexpected pass.
OVER_PLAN = {"vit": "512 bytes over the plan", "deit": "1,024 bytes over the plan",
             "convnext": "8 bytes over the plan by the allocator's records"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=OVER_PLAN[name]))
                                  if name in OVER_PLAN else name for name in sorted(MODELS)])
def test_a_published_architectures_step_peaks_within_its_plan_by_three_instruments(name: str) -> None:
    trained = _trained(name)
    assert trained.tracked_over_plan <= 0 and trained.allocated_over_plan <= 0
    # MemTracker sees what the tracker sees, but for the generator states kept to recompute dropout
    assert trained.memtracker_over_tracked is None or trained.memtracker_over_tracked <= 0


# --- as published: the model's own inputs and output, no wrapper -----------------------------------------------

def _text(model: nn.Module, tokens: bool = False) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A text model's batch as its tokenizer gives it: ids and a mask with padding in the second sequence."""
    ids = _tokens()
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if tokens:
        batch["token_type_ids"] = torch.zeros_like(ids)
    return model, batch


PUBLISHED: dict[str, Callable[[], tuple[nn.Module, dict[str, Any]]]] = {
    "bert": lambda: _text(MODELS["bert"]()[0], tokens=True),
    "distilbert": lambda: _text(MODELS["distilbert"]()[0]),
    "roberta": lambda: _text(MODELS["roberta"]()[0]),
    # a decoder returns its key-value cache unless told not to, as a training loop tells it
    "gpt2": lambda: (lambda built: (built[0], {**built[1], "use_cache": False}))(_text(MODELS["gpt2"]()[0])),
    **{name: (lambda name=name: (lambda built: (built[0], {"pixel_values": built[1]}))(MODELS[name]()))
       for name in ("vit", "deit", "swin", "convnext")},
}


def _logits_loss(output: object, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a ``ModelOutput``'s logits, one row per prediction (a language model's per token)."""
    return nn.functional.cross_entropy(output.logits.flatten(0, -2), target)  # type: ignore[attr-defined]


BUDGETS = ("least", "rho=1.5", "middle")


def _budget(chain: Chain, which: str) -> int:
    """The least feasible step budget, what a recompute factor of 1.5 needs, or the middle of three_budgets."""
    if which == "least":
        return least_step_bytes(chain)
    if which == "rho=1.5":
        return plan(chain, recompute=1.5).predicted_peak_bytes
    return three_budgets(chain)[1]


@functools.cache
def _trained_as_published(name: str, budget: str = "least") -> Trained:
    """``name`` called with its own keyword inputs, returning its ``ModelOutput``, trained as :func:`_trained` at
    ``budget`` (one of :data:`BUDGETS`)."""
    torch.manual_seed(0)
    model, batch = PUBLISHED[name]()
    model.train()
    reference = copy.deepcopy(model)
    y = torch.zeros(reference(**batch).logits.flatten(0, -2).shape[0], dtype=torch.long)
    chain = Checkpointed(model, sample=batch, target=y, loss_fn=_logits_loss, recompute=100.0, measure_time=False,
                         profile_cache=False).chain
    wrapped = Checkpointed(model, sample=batch, target=y, loss_fn=_logits_loss, memory=_budget(chain, budget),
                           measure_time=False, chain=chain, profile_cache=False)
    returned = type(reference(**batch))

    def loss_of(m: nn.Module) -> torch.Tensor:
        output = m(**batch)
        assert type(output) is returned, name   # the wrapper returns the model's own structure
        return _logits_loss(output, y)

    tensors = [value for value in batch.values() if isinstance(value, torch.Tensor)]
    return _measured(model, reference, wrapped, loss_of, [*tensors, y])


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_published_model_called_with_its_own_inputs_trains_as_plain_autograd(name: str, budget: str) -> None:
    assert _trained_as_published(name, budget).worst_gradient_error <= 1e-6


def _over_plan(name: str, budget: str) -> bool:
    """Whether a known gap shows in the checks below: ConvNeXt's is in the allocator's records, checked at the least."""
    return name in OVER_PLAN and (name != "convnext" or budget == "least")


@pytest.mark.parametrize(("name", "budget"), [
    pytest.param(name, budget, marks=pytest.mark.xfail(strict=True, reason=OVER_PLAN[name]))
    if _over_plan(name, budget) else (name, budget) for name in sorted(PUBLISHED) for budget in BUDGETS])
def test_a_published_model_called_with_its_own_inputs_peaks_within_its_plan(name: str, budget: str) -> None:
    trained = _trained_as_published(name, budget)
    assert trained.tracked_over_plan <= 0
    assert trained.memtracker_over_tracked is None or trained.memtracker_over_tracked <= 0
    # The allocator's records include kernels' scratch, which varies with what ran before in the process: at the
    # middle budget they read up to 48 bytes over the plan on GPT-2 and 8 on Swin after other tests, and none alone.
    if budget == "least":
        assert trained.allocated_over_plan <= 0


def test_a_flag_given_before_the_first_input_tensor_leaves_that_tensor_the_chains_input() -> None:
    # Prepare: GPT-2's call with its flag first, as a dict may order it
    torch.manual_seed(0)
    model, batch = PUBLISHED["gpt2"]()
    batch = {"use_cache": batch.pop("use_cache"), **batch}
    model.train()
    reference = copy.deepcopy(model)
    y = torch.zeros(batch["input_ids"].numel(), dtype=torch.long)

    # Execute: planned at ρ = 1.5, then one step against plain autograd
    wrapped = Checkpointed(model, sample=batch, target=y, loss_fn=_logits_loss, recompute=1.5, measure_time=False,
                           profile_cache=False)
    trained = _measured(model, reference, wrapped, lambda m: _logits_loss(m(**batch), y),
                        [batch["input_ids"], batch["attention_mask"], y])

    # Assert: the ids feed the first stage, and the step is plain autograd's within its plan
    assert wrapped.chain.length > 2
    assert trained.worst_gradient_error <= 1e-6 and trained.tracked_over_plan <= 0


def test_a_published_model_that_updates_batch_norm_inside_its_captured_forward_is_refused_naming_it() -> None:
    # MobileViT's convolutions normalise by batch statistics; called with its own keyword input it is captured by
    # torch.export, whose graph updates the running statistics, which a recomputation would update again
    model, images = MODELS["mobilevit"]()
    with pytest.raises(TypeError, match=r"MobileViTForImageClassification: BatchNorm inside a forward only "
                                        r"torch\.export can capture"):
        Checkpointed(model.train(), sample={"pixel_values": images}, recompute=2.0, measure_time=False,
                     profile_cache=False)

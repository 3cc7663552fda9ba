"""Models by CLI name, with what it takes to feed them an example batch.

The CLI, the profiler and the benchmarks all need the same three things for a named model:
build it (any number of classes), make an input of a given batch and size, and reject sizes the
model cannot take before any memory is spent. :class:`ModelSpec` keeps them together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ..errors import EdgetrainError, UnknownNameError
from .factory import build_factory_model, check_factory_call, default_classes, is_factory_name, load_factory
from .mobilenet import mobilenet_v2
from .resnet import resnet18, resnet18_cifar, resnet34, resnet50, resnet101, resnet152
from .transformer import transformer_encoder, transformer_encoder_small

__all__ = ["ModelSpec", "MODELS", "get_model_spec", "check_input"]

InputKind = Literal["image", "tokens"]


@dataclass(frozen=True)
class ModelSpec:
    """A named model: how to build it and what inputs it accepts.

    ``size`` means the side in pixels of a square RGB image for ``input_kind == "image"`` and
    the sequence length for ``"tokens"`` (bounded by ``max_len``).
    """

    name: str
    builder: Callable[[int], nn.Module] = field(repr=False, compare=False)
    input_kind: InputKind
    min_size: int
    default_num_classes: int
    max_len: int | None = None
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.input_kind not in ("image", "tokens"):
            raise ValueError(f"model {self.name!r}: input_kind must be 'image' or 'tokens', "
                             f"got {self.input_kind!r}")
        if self.min_size < 1 or self.default_num_classes < 1:
            raise ValueError(f"model {self.name!r}: min_size and default_num_classes must be >= 1")
        if self.input_kind == "tokens" and (self.vocab_size is None or self.max_len is None):
            raise ValueError(f"model {self.name!r}: a token model needs vocab_size and max_len")

    def build(self, num_classes: int | None = None) -> nn.Module:
        """A fresh model on the current default device (use ``with torch.device("meta"):`` to skip memory)."""
        return self.builder(self.default_num_classes if num_classes is None else num_classes)

    def example_input(self, batch: int, size: int, device: torch.device | str = "cpu",
                      seed: int = 0) -> torch.Tensor:
        """A deterministic input batch: float32 (batch, 3, size, size) images or int64 (batch, size) ids.

        On ``meta`` only the shape and dtype exist, so nothing is allocated.

        Raises:
            EdgetrainError: if ``batch`` or ``size`` is out of range (see :func:`check_input`).
        """
        check_input(self, batch, size)
        if self.input_kind == "image":
            shape: tuple[int, ...] = (batch, 3, size, size)
            dtype = torch.float32
        else:
            shape, dtype = (batch, size), torch.int64
        if torch.device(device).type == "meta":
            return torch.empty(shape, dtype=dtype, device="meta")
        generator = torch.Generator().manual_seed(seed)
        if self.input_kind == "image":
            values = torch.randn(shape, generator=generator)
        else:
            values = torch.randint(0, self.vocab_size or 1, shape, generator=generator)
        return values.to(device)

    def example_target(self, batch: int, device: torch.device | str = "cpu", num_classes: int | None = None,
                       seed: int = 1) -> torch.Tensor:
        """Deterministic int64 class labels of shape (batch,), for a cross-entropy loss."""
        if batch <= 0:
            raise EdgetrainError(f"batch size must be >= 1, got {batch}")
        if torch.device(device).type == "meta":
            return torch.empty((batch,), dtype=torch.int64, device="meta")
        classes = self.default_num_classes if num_classes is None else num_classes
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(0, classes, (batch,), generator=generator).to(device)


def check_input(spec: ModelSpec, batch: int, size: int) -> None:
    """Reject a batch or size the model cannot take, with a one-line message the CLI can show.

    Raises:
        EdgetrainError: ``batch <= 0``, ``size < spec.min_size`` or a sequence longer than
            ``spec.max_len``.
    """
    if batch <= 0:
        raise EdgetrainError(f"batch size must be >= 1, got {batch}")
    what = "image size" if spec.input_kind == "image" else "sequence length"
    unit = " px" if spec.input_kind == "image" else ""
    if size < spec.min_size:
        raise EdgetrainError(f"{what} for model {spec.name!r} must be at least {spec.min_size}{unit}, got {size}")
    if spec.max_len is not None and size > spec.max_len:
        raise EdgetrainError(f"{what} for model {spec.name!r} must be at most {spec.max_len}, got {size}")
    if is_factory_name(spec.name):
        check_factory_call(spec.name, batch, size)


def _image(name: str, builder: Callable[[int], nn.Module]) -> ModelSpec:
    """ImageNet-style classifiers: 1000 classes; five stride-2 steps need at least 32 px."""
    return ModelSpec(name, builder, "image", min_size=32, default_num_classes=1000)


_BERT_MAX_LEN, _BERT_VOCAB, _SMALL_MAX_LEN, _SMALL_VOCAB = 512, 30522, 128, 1000

MODELS: dict[str, ModelSpec] = {
    "resnet18": _image("resnet18", resnet18),
    # CIFAR stem: three stride-2 steps; 10 classes, CIFAR-10's.
    "resnet18_cifar": ModelSpec("resnet18_cifar", resnet18_cifar, "image", min_size=32, default_num_classes=10),
    "resnet34": _image("resnet34", resnet34),
    "resnet50": _image("resnet50", resnet50),
    "resnet101": _image("resnet101", resnet101),
    "resnet152": _image("resnet152", resnet152),
    "mobilenet_v2": _image("mobilenet_v2", mobilenet_v2),
    "transformer": ModelSpec(
        "transformer", lambda n: transformer_encoder(num_classes=n, vocab_size=_BERT_VOCAB, max_len=_BERT_MAX_LEN),
        "tokens", min_size=1, default_num_classes=2, max_len=_BERT_MAX_LEN, vocab_size=_BERT_VOCAB),
    "transformer_small": ModelSpec(
        "transformer_small",
        lambda n: transformer_encoder_small(num_classes=n, vocab_size=_SMALL_VOCAB, max_len=_SMALL_MAX_LEN),
        "tokens", min_size=1, default_num_classes=10, max_len=_SMALL_MAX_LEN, vocab_size=_SMALL_VOCAB),
}


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered under ``name``, or of the factory it names (NOTE [ A model by its factory ]).

    Raises:
        UnknownNameError: listing the valid names.
        EdgetrainError: a factory that does not import or does not take its arguments.
    """
    if is_factory_name(name):
        load_factory(name)
        return ModelSpec(name, lambda classes: build_factory_model(name, classes), "image", min_size=1,
                         default_num_classes=default_classes(name, 10))
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownNameError("model", name, MODELS) from None

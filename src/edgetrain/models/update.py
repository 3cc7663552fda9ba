"""Which parameters a training step updates: the update scheme, applied by freezing the rest.

NOTE [ Update schemes ]
Fine-tuning on a node rarely needs every parameter to learn (TinyTL, Cai et al., "TinyTL: Reduce
Memory, Not Parameters for Efficient On-Device Learning", NeurIPS 2020; Lin et al., "On-Device
Training Under 256KB Memory", NeurIPS 2022). A scheme names the parameters that train:

* ``all``: every parameter;
* ``bias``: biases and the affine parameters of normalisation layers;
* ``last:K``: every parameter of the model's last ``K`` stages (the loss is not a stage here);
* ``auto``: one of the above, chosen by probes on the training data (NOTE [ Contribution analysis ] in
  ``train/contribution.py``), resolved before anything is frozen;
* a comma-separated list of patterns (``layer4,fc``, ``features.1[0-8].*``): the parameters whose
  name (as ``model.named_parameters()`` gives it) matches one, or lies in a module that matches one;
  ``bias`` among them stands for the ``bias`` set, so ``bias,classifier`` is TinyTL's bias-only update
  with a new head that trains whole.

The rest get ``requires_grad = False``, and every part of edgetrain reads the flags, so a model the
user froze by hand is planned and trained the same way: autograd saves nothing for a gradient no one
needs (a frozen convolution whose input needs no gradient saves no input), frozen parameters get no
gradient and no optimizer state, and the stages before the first one that trains fold into it
(:func:`edgetrain.models.stages.training_stages`), so they run once, record nothing and back-propagate
nothing. The profiler measures all of this on the model as it is flagged, and the planners plan it
unchanged.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from torch import nn

from ..errors import EdgetrainError

__all__ = ["UpdateScheme", "UpdateSchemeError", "parse_update", "apply_update", "NORM_TYPES", "ALL", "AUTO"]

ALL = "all"
AUTO = "auto"   # chosen from the training data (NOTE [ Contribution analysis ] in ``train/contribution.py``)
NORM_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


class UpdateSchemeError(EdgetrainError, ValueError):
    """An update scheme that cannot be read, or that trains nothing of the model."""


@dataclass(frozen=True)
class UpdateScheme:
    """A parsed scheme (NOTE [ Update schemes ]); ``text`` is its canonical spelling, as plan files record it."""

    kind: str                       # "all", "bias", "last", "patterns" or "auto"
    last: int = 0                   # K of last:K
    patterns: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        if self.kind == "last":
            return f"last:{self.last}"
        if self.kind == "patterns":
            return ",".join(self.patterns)
        return self.kind


def parse_update(text: str) -> UpdateScheme:
    """The scheme ``text`` names.

    Raises:
        UpdateSchemeError: an empty scheme, ``last:K`` with ``K`` not a whole number >= 1, an empty pattern.
    """
    spelled = text.strip()
    if spelled in (ALL, "bias", AUTO):
        return UpdateScheme(spelled)
    if spelled.startswith("last:"):
        count = spelled[len("last:"):]
        if not count.isdigit() or int(count) < 1:
            raise UpdateSchemeError(f"--update {text!r}: last:K takes a whole number of stages K >= 1")
        return UpdateScheme("last", last=int(count))
    patterns = tuple(p.strip() for p in spelled.split(","))
    if not spelled or any(not p for p in patterns):
        raise UpdateSchemeError(f"--update {text!r}: give all, bias, last:K or comma-separated parameter patterns")
    return UpdateScheme("patterns", patterns=patterns)


def apply_update(model: nn.Module, scheme: UpdateScheme | str, stages: list[nn.Module] | None = None) -> list[str]:
    """Freeze every parameter of ``model`` that ``scheme`` does not train; the names of those it trains.

    ``stages``: the model's stages (default :func:`~edgetrain.models.stages_of`), for ``last:K``.

    Raises:
        UpdateSchemeError: a pattern that matches no parameter (named, with examples of names that exist),
            ``last:K`` beyond the model's stages, or a scheme under which no parameter trains.
    """
    chosen = parse_update(scheme) if isinstance(scheme, str) else scheme
    if chosen.kind == AUTO:
        raise UpdateSchemeError("--update auto chooses from the training data: only `edgetrain train` takes it; "
                                "give all, bias, last:K or patterns here")
    named = dict(model.named_parameters())
    trained = _trained_ids(model, chosen, named, stages)
    for param in named.values():
        param.requires_grad_(id(param) in trained)
    names = [name for name, param in named.items() if id(param) in trained]
    if not names:
        raise UpdateSchemeError(f"--update {chosen.text}: no parameter of {type(model).__name__} would train")
    return names


def _trained_ids(model: nn.Module, scheme: UpdateScheme, named: dict[str, nn.Parameter],
                 stages: list[nn.Module] | None) -> set[int]:
    if scheme.kind == ALL:
        return {id(p) for p in named.values()}
    if scheme.kind == "bias":
        return {id(p) for p in _bias_and_norm(model)}
    if scheme.kind == "last":
        return _last_stages(model, scheme.last, stages)
    trained: set[int] = set()
    for pattern in scheme.patterns:
        if pattern == "bias":
            trained |= {id(p) for p in _bias_and_norm(model)}
            continue
        matched = {id(p) for name, p in named.items()
                   if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, f"{pattern}.*")}
        if not matched:
            examples = ", ".join(list(named)[:3])
            raise UpdateSchemeError(f"--update pattern {pattern!r} matches no parameter of {type(model).__name__} "
                                    f"(its names read like {examples})")
        trained |= matched
    return trained


def _bias_and_norm(model: nn.Module) -> list[nn.Parameter]:
    """Biases of every module and the affine weights of normalisation layers."""
    found = []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if name == "bias" or (isinstance(module, NORM_TYPES) and name == "weight"):
                found.append(param)
    return found


def _last_stages(model: nn.Module, count: int, stages: list[nn.Module] | None) -> set[int]:
    from . import stages_of

    chain = stages if stages is not None else stages_of(model)
    with_params = [s for s in chain if any(True for _ in s.parameters())]
    if count > len(chain):
        raise UpdateSchemeError(f"--update last:{count}: {type(model).__name__} has {len(chain)} stages "
                                f"({len(with_params)} with parameters)")
    return {id(p) for stage in chain[len(chain) - count:] for p in stage.parameters()}

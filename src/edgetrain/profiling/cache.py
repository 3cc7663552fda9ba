"""Profiles kept on disk, so the second ``Checkpointed`` or ``train`` of the same model does not profile again.

NOTE [ What a cached profile is keyed by ]
A chain is a measurement of one model's training step on one machine, so its key is everything the
measurement depends on: the model's signature (its classes and their code, settings, train or eval
mode, and its parameters' and buffers' shapes, dtypes, devices and ``requires_grad``, which an update
scheme changes: NOTE [ A module's signature ] in ``signature.py``); the input's and target's shapes,
dtypes and device; the loss function's code; the profiler's options; and the machine (CPU model,
architecture, torch threads, which decide whether kernels' scratch is measured) with the torch,
Python and edgetrain versions. What the key cannot see is state outside the modules: a forward hook,
a global flag a ``forward`` reads. Those who change such state between runs turn the cache off
(``EDGETRAIN_PROFILE_CACHE=off``) or clear its folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.chain import Chain
from ..sysutil.fileio import write_atomic
from .host import cpu_model
from .signature import callable_code, module_signature

__all__ = ["PROFILE_CACHE_ENV", "cached_profile", "default_profile_cache", "profile_cache_folder", "profile_key",
           "store_profile"]

log = logging.getLogger(__name__)

PROFILE_CACHE_ENV = "EDGETRAIN_PROFILE_CACHE"   # a folder, or "off"
_FORMAT = 1


def default_profile_cache() -> Path | None:
    """The folder profiles are kept in: ``$EDGETRAIN_PROFILE_CACHE``, "off" for none, else
    ``$XDG_CACHE_HOME/edgetrain/profiles`` (``~/.cache`` without it)."""
    chosen = os.environ.get(PROFILE_CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "no") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgetrain" / "profiles"


def profile_cache_folder(choice: bool | str | Path) -> Path | None:
    """The folder a ``profile_cache=`` argument names: True the default (:func:`default_profile_cache`), False none."""
    if isinstance(choice, bool):
        return default_profile_cache() if choice else None
    return Path(choice)


def profile_key(model: nn.Module, sample: torch.Tensor, target: torch.Tensor | None, options: dict[str, Any],
                loss_fn: Callable[..., Any] | None = None) -> str:
    """The cache key of profiling ``model`` on ``sample`` (NOTE [ What a cached profile is keyed by ])."""
    from .. import __version__

    digest = hashlib.sha256()

    def put(*items: object) -> None:
        digest.update(repr(items).encode())

    put("profile", _FORMAT, __version__, torch.__version__, sys.version, platform.machine(), cpu_model(),
        torch.get_num_threads())
    put(tuple(sample.shape), str(sample.dtype), str(sample.device))
    put(None if target is None else (tuple(target.shape), str(target.dtype), str(target.device)))
    put(sorted(options.items()))
    digest.update(callable_code(loss_fn))
    put(module_signature(model))
    return digest.hexdigest()


def cached_profile(folder: Path, key: str) -> Chain | None:
    """The chain stored under ``key``, or None (none stored, or a file that does not read as a chain)."""
    path = _path(folder, key)
    try:
        return Chain.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:   # a torn or foreign file: profile again
        log.warning("profile cache: %s does not read as a chain (%s); profiling again", path, exc)
        return None


def store_profile(folder: Path, key: str, chain: Chain) -> None:
    """Keep ``chain`` under ``key``; a folder that cannot be written only costs the next run a profile."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(_path(folder, key), json.dumps(chain.to_dict()))
    except OSError as exc:
        log.warning("profile cache: cannot write %s (%s); profiles are not kept", folder, exc)


def _path(folder: Path, key: str) -> Path:
    return folder / f"{key}.json"


"""A model the user wrote, named on the command line as ``package.module:factory``.

NOTE [ A model by its factory ]
``--model mypkg.nets:make_net --model-arg width=32`` names a callable that returns an ``nn.Module`` (or a model of
torchvision, timm or transformers: NOTE [ Library models by name ] in ``libraries.py``), and the
keyword arguments it is called with. The two are kept as one name, ``mypkg.nets:make_net(width=32)`` (arguments
sorted, values as Python literals), so that everything that records a model by its name records how to build
it again: a plan file, a run's ``run.json``, the check that a resumed run or a shipped plan is the one asked
for. The factory is called with ``num_classes=`` the data's class count when it takes that parameter;
otherwise its model must give one output per class already. Its input is a batch of square RGB images.
The module is imported as ``python -m`` would import it: the current folder is on the path.
Everything that can be refused is refused before any work: the module must import, the name must be a
callable that takes the arguments given and returns a module, and the module's forward must accept one
batch and give one row of class scores per sample, which a forward on the meta device shows without memory
or time.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from ..errors import EdgetrainError
from .libraries import LIBRARIES, build_library_model, library_builder

__all__ = ["is_factory_name", "factory_name", "parse_model_args", "factory_parts", "load_factory",
           "build_factory_model", "default_classes", "check_factory_call"]

_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_ARGUMENTS = re.compile(r"^(?P<path>[^()]+?)(\((?P<args>.*)\))?$", re.DOTALL)


def is_factory_name(name: str) -> bool:
    """Whether ``name`` names a factory by import path (``module:callable``) rather than a zoo model."""
    return ":" in name


def parse_model_args(items: Iterable[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings as keyword arguments: a value that reads as a Python literal is that literal
    (``32``, ``0.5``, ``True``, ``'a'``, ``(1, 2)``), anything else is the string itself.

    Raises:
        EdgetrainError: an item without ``=``, a key that is not a Python name, a key given twice.
    """
    args: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise EdgetrainError(f"--model-arg {item!r}: give KEY=VALUE, with KEY a Python name")
        if key in args:
            raise EdgetrainError(f"--model-arg {key} is given twice")
        args[key] = _literal(text)
    return args


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def factory_name(path: str, args: dict[str, object]) -> str:
    """The one name of a factory with its arguments: ``path`` alone, or ``path(key=value, ...)``, keys sorted."""
    if not args:
        return path
    return f"{path}({', '.join(f'{key}={args[key]!r}' for key in sorted(args))})"


def factory_parts(name: str) -> tuple[str, str, dict[str, object]]:
    """``(module, callable, arguments)`` of a factory's name, as :func:`factory_name` writes it.

    Raises:
        EdgetrainError: a name that is not ``module:callable`` or whose arguments do not read back.
    """
    match = _ARGUMENTS.match(name.strip())
    path = match.group("path") if match else name
    module, _, attribute = path.partition(":")
    if not (_MODULE_PATH.fullmatch(module) and _MODULE_PATH.fullmatch(attribute)):
        raise EdgetrainError(f"--model {name!r}: name a model of the zoo (`edgetrain models`) or a factory as "
                             "package.module:callable")
    args: dict[str, object] = {}
    if match and match.group("args"):
        try:
            call = ast.parse(f"f({match.group('args')})", mode="eval").body
            assert isinstance(call, ast.Call) and not call.args
            args = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords
                    if keyword.arg is not None}
        except (SyntaxError, ValueError, AssertionError):
            raise EdgetrainError(f"--model {name!r}: its arguments must be key=literal pairs") from None
    return module, attribute, args


@lru_cache(maxsize=32)
def load_factory(name: str) -> tuple[Callable[..., Any], bool]:
    """The callable that ``name`` names, checked against its arguments; and whether it takes ``num_classes``.

    Raises:
        EdgetrainError: the module does not import, it has no such callable, or the callable does not take
            the arguments given (the message lists the ones it takes).
    """
    module_name, attribute, args = factory_parts(name)
    if module_name in LIBRARIES:   # NOTE [ Library models by name ] in libraries.py
        library_builder(module_name, attribute)
        return functools.partial(build_library_model, module_name, attribute), True   # takes keyword arguments
    if os.getcwd() not in sys.path and "" not in sys.path:   # as `python -m` would: the user's folder imports
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module may fail in any way while it imports
        raise EdgetrainError(f"--model {name!r}: cannot import {module_name!r}: "
                             f"{type(exc).__name__}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise EdgetrainError(f"--model {name!r}: {module_name!r} has no callable {attribute!r}")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):   # a builtin without a signature: called as given
        return factory, False
    parameters = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for key in args:
        if key not in parameters and not takes_any:
            takes = ", ".join(p for p in parameters if parameters[p].kind is not inspect.Parameter.VAR_POSITIONAL)
            raise EdgetrainError(f"--model-arg {key}: {module_name}:{attribute} takes no argument {key!r} "
                                 f"(it takes: {takes or 'none'})")
    return factory, "num_classes" in parameters or takes_any


def build_factory_model(name: str, num_classes: int) -> nn.Module:
    """The model ``name``'s factory returns, given ``num_classes`` where it takes it.

    Raises:
        EdgetrainError: the factory raised, or what it returned is not an ``nn.Module``.
    """
    factory, takes_classes = load_factory(name)
    _, _, args = factory_parts(name)
    if takes_classes and "num_classes" not in args:
        args = {**args, "num_classes": num_classes}
    try:
        model = factory(**args)
    except EdgetrainError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code
        raise EdgetrainError(f"--model {name!r}: the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise EdgetrainError(f"--model {name!r}: the factory returned an object of type {type(model).__name__}, not a "
                             "torch nn.Module")
    return model


def default_classes(name: str, fallback: int) -> int:
    """The class count a factory builds for when the data does not say: its ``num_classes`` argument or
    default where it has one, else ``fallback``."""
    factory, _ = load_factory(name)
    _, _, args = factory_parts(name)
    if isinstance(args.get("num_classes"), int):
        return int(args["num_classes"])   # type: ignore[call-overload]
    try:
        default = inspect.signature(factory).parameters["num_classes"].default
    except (KeyError, TypeError, ValueError):
        return fallback
    return default if isinstance(default, int) and not isinstance(default, bool) else fallback


def check_factory_call(name: str, batch: int, size: int, num_classes: int | None = None) -> None:
    """Build ``name``'s model on the meta device and run its forward on one batch there: refuse a forward that
    does not take one image batch, or that does not give one row of scores per sample (``num_classes`` of
    them, when given).

    Raises:
        EdgetrainError: naming what the forward needs or what it gave.
    """
    with torch.device("meta"):
        model = build_factory_model(name, num_classes or default_classes(name, 1))
        sample = torch.empty((batch, 3, size, size))
    try:
        with torch.no_grad():
            output = model(sample)
    except Exception as exc:  # noqa: BLE001 - the user's forward
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EdgetrainError(f"--model {name!r}: its forward does not take one batch of {size}x{size} RGB images "
                             f"({type(exc).__name__}: {reason})") from None
    if not isinstance(output, torch.Tensor):
        raise EdgetrainError(f"--model {name!r}: its forward returned a {type(output).__name__}; edgetrain trains "
                             "a model that returns one tensor of class scores")
    wanted = f"({batch}, {num_classes})" if num_classes is not None else f"({batch}, classes)"
    if output.dim() != 2 or output.shape[0] != batch or (num_classes is not None and output.shape[1] != num_classes):
        raise EdgetrainError(f"--model {name!r}: its forward gives scores of shape {tuple(output.shape)}, where "
                             f"the data needs {wanted}: give the factory a num_classes parameter, or a "
                             "--model-arg for its width")

"""What a module computes, as a digest: equal digests on equal inputs mean equal costs.

NOTE [ A module's signature ]
Two modules have the same signature when they run the same code on parameters and buffers of the
same shapes, dtypes, devices and ``requires_grad``, with the same settings (``extra_repr``) and
train or eval mode, down through their submodules. The code of a class is the bytecode of every
function defined on it and on its bases below ``nn.Module``, so an edited ``forward`` is another
signature. A traced stage (``fx.GraphModule``) is compared by its graph instead of its generated
code, which names submodules by their path in the model: the graph's ops in order, each argument
as the op it comes from or its constant, each called submodule by its own signature and each
attribute read by its tensor's shape. So a transformer's identical layers, traced or not, share one
signature, and the profiler measures one of them (NOTE [ Repeated stages measured once ] in
``profiler.py``). Parameter *values* are not part of it: a step's memory and time do not depend on them.
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

__all__ = ["callable_code", "module_signature"]


def module_signature(module: nn.Module) -> str:
    """The digest of what ``module`` computes (NOTE [ A module's signature ])."""
    digest = hashlib.sha256()
    _add_module(digest.update, module)
    return digest.hexdigest()


def callable_code(function: object) -> bytes:
    """A function's bytecode (a loss function, a method), with that of the function it wraps (``__wrapped__``);
    for another callable, its class's name."""
    code = getattr(function, "__code__", None)
    if code is not None:
        wrapped = getattr(function, "__wrapped__", None)
        return marshal.dumps(code) + (b"" if wrapped is None else callable_code(wrapped))
    return repr(type(function).__qualname__ if function is not None else None).encode()


def _add_module(update: Callable[[bytes], Any], module: nn.Module) -> None:
    def put(*items: object) -> None:
        update(repr(items).encode())

    put(type(module).__module__, type(module).__qualname__, module.extra_repr(), module.training)
    for name, p in module.named_parameters(recurse=False):
        put(name, tuple(p.shape), str(p.dtype), str(p.device), p.requires_grad)
    for name, b in module.named_buffers(recurse=False):
        put(name, tuple(b.shape), str(b.dtype), str(b.device))
    if isinstance(module, fx.GraphModule):
        _add_graph(update, module)
        return
    update(_class_code(type(module)))
    for name, child in module.named_children():
        put("child", name)
        _add_module(update, child)


def _add_graph(update: Callable[[bytes], Any], module: fx.GraphModule) -> None:
    """A traced module by its graph: its ops in order, their arguments by position, what they call and read."""
    index = {node: i for i, node in enumerate(module.graph.nodes)}

    def argument(value: object) -> object:
        if isinstance(value, fx.Node):
            return ("node", index[value])
        if isinstance(value, (list, tuple)):
            return tuple(argument(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, argument(v)) for k, v in value.items()))
        return repr(value)

    for node in module.graph.nodes:
        if node.op == "call_module":
            update(repr(("call_module", argument(node.args), argument(node.kwargs))).encode())
            _add_module(update, module.get_submodule(str(node.target)))
        elif node.op == "get_attr":
            value = _attribute(module, str(node.target))
            read = (tuple(value.shape), str(value.dtype), value.requires_grad) if isinstance(value, torch.Tensor) \
                else repr(value)
            update(repr(("get_attr", read)).encode())
        else:
            target = node.target if isinstance(node.target, str) else (
                getattr(node.target, "__module__", None), getattr(node.target, "__qualname__", repr(node.target)))
            update(repr((node.op, target, argument(node.args), argument(node.kwargs))).encode())


def _attribute(module: nn.Module, path: str) -> object:
    value: object = module
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _class_code(cls: type) -> bytes:
    """The bytecode of every function ``cls`` and its bases below ``nn.Module`` define."""
    parts = []
    for base in cls.__mro__:
        if base in (nn.Module, object):
            break
        functions = (getattr(value, "__func__", value) for _, value in sorted(vars(base).items()))
        parts += [callable_code(function) for function in functions if callable(function)]
    return b"".join(parts)

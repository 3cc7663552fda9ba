"""Live tensor bytes, tracked at the dispatcher so it works on CPU and on the meta device.

NOTE [ What the tracker counts ]
Every tensor storage that an ATen op returns while the tracker is active, plus the storages
registered with :meth:`LiveBytesTracker.register` (weights, buffers, optimizer state, the
input batch), counted once per storage (views and in-place results share it) from creation
until Python and autograd drop their last reference. That covers weights, gradients,
optimizer state, saved activations and transient intermediates between ops. It does not see
scratch memory an op allocates and frees inside its own kernel (e.g. a convolution's im2col
buffer), allocator caching or fragmentation, nor the Python interpreter and libraries: those
are outside what a schedule can change, and are left to the device's memory margin.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..optim import TrainingOptimizer
from ..rng_state import STATE_WATCHERS

__all__ = ["AllocatorWindow", "LiveBytesTracker", "SavedTensors", "allocator_window", "storage_key", "storage_bytes"]


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of a tensor's storage (shared by its views), stable while the storage lives."""
    return int(tensor.untyped_storage()._cdata)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        seen[storage_key(tensor)] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


class LiveBytesTracker(TorchDispatchMode):
    """Count live tensor bytes and their peak while active.

    Example:
        >>> with LiveBytesTracker() as tracker:
        ...     tracker.register(model.parameters())
        ...     loss = model(x).sum(); loss.backward()
        >>> tracker.peak_bytes
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self.current_bytes = 0
        self.peak_bytes = 0

    def __enter__(self) -> LiveBytesTracker:
        STATE_WATCHERS.append(self.register)   # generator states a plan counts, made outside the dispatcher
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        STATE_WATCHERS.remove(self.register)

    def register(self, tensors: Iterable[torch.Tensor | None]) -> None:
        """Count already existing tensors (weights, inputs, optimizer state) from now on."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)

    def register_training_state(self, model: torch.nn.Module, optimizer: TrainingOptimizer | None,
                                *batch: torch.Tensor) -> None:
        """Count what lives across a training step: weights, buffers, optimizer state, the batch."""
        self.register(model.parameters())
        self.register(model.buffers())
        if optimizer is not None:
            self.register(t for state in optimizer.state.values() for t in state.values()
                          if isinstance(t, torch.Tensor))
        self.register(batch)

    def reset_peak(self) -> None:
        self.peak_bytes = self.current_bytes

    def live_keys(self) -> set[int]:
        """Storage keys (see :func:`storage_key`) of everything counted as live now."""
        return set(self._live)

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = int(storage._cdata)
        if key in self._live:
            return
        n_bytes = storage.nbytes()
        self._live[key] = n_bytes
        self.current_bytes += n_bytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        # The storage's Python object lives exactly as long as the storage itself.
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.current_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for item in tree_leaves(out):
            if isinstance(item, torch.Tensor):
                self._track(item)
        return out


class SavedTensors:
    """Record the storages autograd saves for backward while active.

    ``keys`` holds every saved storage (to ask whether an input or output was kept);
    ``new_bytes`` the size of each one not in ``existing`` (weights and inputs are not the
    op's to pay for).

    Example:
        >>> with SavedTensors(existing={storage_key(w)}) as saved:
        ...     y = torch.relu(x @ w)
        >>> sum(saved.new_bytes.values())
    """

    def __init__(self, existing: set[int]) -> None:
        self.existing = existing
        self.keys: set[int] = set()
        self.new_bytes: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        self.keys.add(key)
        if key not in self.existing:
            self.new_bytes[key] = tensor.untyped_storage().nbytes()
        return tensor

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclass
class AllocatorWindow:
    """What the c10 allocator handed out over a window, relative to its start: the net change and the peak."""

    net_bytes: int = 0
    peak_bytes: int = 0


@contextlib.contextmanager
def allocator_window() -> Iterator[AllocatorWindow]:
    """Measure a block by the c10 allocator's own records (``torch.profiler``'s ``[memory]`` events).

    NOTE [ Compiled code and the tracker ]
    :class:`LiveBytesTracker` sees ops at the dispatcher, which code compiled by ``torch.compile``
    bypasses: inductor allocates its buffers itself. Worse, a compiled module called while any
    ``TorchDispatchMode`` is active runs eagerly, and one whose *first* call happens under a mode is
    never compiled in the process (dynamo skips its code object for good; every module of that
    class with it). So compiled code is measured outside every mode, by the allocator's records,
    which see every tensor allocation, inductor's included (and a kernel's scratch, which the
    tracker leaves out).
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    if torch._C._autograd._profiler_enabled():   # a second session would end the one running
        raise RuntimeError("compiled code is measured with torch.profiler, which is already running here: "
                           "profile (or plan) compiled stages outside your own profiler session")
    window = AllocatorWindow()
    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield window
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    for event in events:
        window.net_bytes += event.nbytes()
        window.peak_bytes = max(window.peak_bytes, window.net_bytes)

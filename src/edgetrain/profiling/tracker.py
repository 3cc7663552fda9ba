"""Live tensor bytes, tracked at the dispatcher so it works on CPU and on the meta device.

NOTE [ What the tracker counts ]
Every tensor storage that an ATen op returns while the tracker is active, plus the storages
registered with :meth:`LiveBytesTracker.register` (weights, buffers, optimizer state, the
input batch), counted once per storage (views and in-place results share it) from creation
until Python and autograd drop their last reference. That covers weights, gradients,
optimizer state, saved activations and transient intermediates between ops. It does not see
scratch memory an op allocates and frees inside its own kernel (e.g. a convolution's blocked
copies of its weight and input): the profiler measures that by the allocator's records beside it
(NOTE [ A kernel's scratch in the plan ] in chain.py). Nor allocator caching or fragmentation, nor
the Python interpreter and libraries: those are outside what a schedule can change, and are left
to the process budget's runtime share.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..autograd.rng_state import STATE_WATCHERS
from ..core.optim import TrainingOptimizer

__all__ = ["AllocatorRecorder", "AllocatorWindow", "LiveBytesTracker", "SavedTensors", "allocator_window",
           "full_allocator_window",
           "profiler_running", "records_every_allocation", "storage_bytes", "storage_key"]


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
    """What the c10 allocator handed out over a window, relative to its start: the net change and the peak;
    where a :class:`LiveBytesTracker` watched the same window, the peak it saw."""

    net_bytes: int = 0
    peak_bytes: int = 0
    tracked_peak_bytes: int | None = None

    @property
    def scratch_bytes(self) -> int:
        """Bytes of the peak only the allocator saw: what kernels allocate and free inside one op (NOTE [ What
        the tracker counts ]); 0 where no tracker watched."""
        return 0 if self.tracked_peak_bytes is None else max(0, self.peak_bytes - self.tracked_peak_bytes)


def profiler_running() -> bool:
    """Whether a ``torch.profiler`` session records on this thread (a second one would end it)."""
    return bool(torch._C._autograd._profiler_enabled())


def records_every_allocation() -> bool:
    """Whether the allocator's records can see every allocation of an op: only with one intra-op thread.

    ``torch.profiler`` records the allocations of the threads that carry its state, and the intra-op
    pool's workers (OpenMP) do not: at two threads a U-Net step's records missed 484 KiB of its
    convolutions' scratch, a different amount run to run. Where more threads run ops, the records are
    a lower bound, and the profiler measures stages by the tracker alone.
    """
    return torch.get_num_threads() == 1


class AllocatorRecorder:
    """Windows measured by the c10 allocator's own records (``torch.profiler``'s ``[memory]`` events), all in
    one profiler session: each window's figures are filled in when the session ends.

    NOTE [ Compiled code and the tracker ]
    :class:`LiveBytesTracker` sees ops at the dispatcher, which code compiled by ``torch.compile``
    bypasses: inductor allocates its buffers itself. Worse, a compiled module called while any
    ``TorchDispatchMode`` is active runs eagerly, and one whose *first* call happens under a mode is
    never compiled in the process (dynamo skips its code object for good; every module of that
    class with it). So compiled code is measured outside every mode, by the allocator's records,
    which see every tensor allocation, inductor's included (and a kernel's scratch, which the
    tracker leaves out).

    NOTE [ One session, many windows ]
    The allocator reports a block's release with its size only if the block was allocated while a
    session recorded ("Memory block of unknown size was allocated before the profiling started"):
    a session of its own around a stage's backward would miss the release of every tensor the
    recorded forward saved, and report a peak that never was. So the phases of a stage are windows
    of one session (``torch.profiler.record_function`` spans on the events' own clock), and a
    window's net and peak are the sums of the allocations and releases inside its span. A window
    over code that releases blocks from before the session still misses those releases.

    With ``tracker`` each window also holds the tracker's peak over it, so that the scratch of a
    window (``AllocatorWindow.scratch_bytes``) is what only the allocator saw. Only allocations
    on ``device``'s kind of device count (on a GPU, the host's generator states are not its memory).
    """

    def __init__(self, device: torch.device, tracker: LiveBytesTracker | None = None) -> None:
        self.device_kind = device.type.upper()
        self.tracker = tracker
        self._spans: list[tuple[str, AllocatorWindow]] = []
        self._session: Any = None

    def __enter__(self) -> AllocatorRecorder:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile
        if profiler_running():
            raise RuntimeError("the allocator's records are read with torch.profiler, which is already running here: "
                               "measure (or plan) outside your own profiler session")
        # kineto prints two lines on every session start and stop ("profiler_start"): level 6 is above them
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self._session = torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._session.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._session.__exit__(*exc)
        self._resolve(self._session.profiler.kineto_results.experimental_event_tree())

    @contextlib.contextmanager
    def window(self) -> Iterator[AllocatorWindow]:
        """A span of the session; its figures are set when the session ends."""
        from torch.profiler import record_function
        measured = AllocatorWindow()
        name = f"edgetrain.allocator_window.{len(self._spans)}"
        before = 0
        if self.tracker is not None:
            before = self.tracker.current_bytes
            self.tracker.reset_peak()
        with record_function(name):
            yield measured
        if self.tracker is not None:
            measured.tracked_peak_bytes = self.tracker.peak_bytes - before
        self._spans.append((name, measured))

    def _resolve(self, roots: Iterable[Any]) -> None:
        from torch._C._profiler import _EventType
        spans = dict(self._spans)
        bounds: dict[str, tuple[int, int]] = {}
        allocations: list[tuple[int, int, int]] = []   # (time, bytes, address); a release's bytes negative
        for event in _walk(roots):
            if event.tag == _EventType.Allocation:
                fields = event.extra_fields
                if fields.device.type.upper() == self.device_kind:
                    allocations.append((event.start_time_ns, fields.alloc_size, fields.ptr))
            elif event.name in spans:
                bounds[event.name] = (event.start_time_ns, event.end_time_ns)
        changes = _session_changes(sorted(allocations))
        times = [at for at, _ in changes]
        for name, measured in spans.items():
            start, end = bounds[name]
            for _, n_bytes in changes[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]:
                measured.net_bytes += n_bytes
                measured.peak_bytes = max(measured.peak_bytes, measured.net_bytes)


def _walk(events: Iterable[Any]) -> Iterator[Any]:
    for event in events:
        yield event
        yield from _walk(event.children)


def _session_changes(allocations: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """(time, bytes) of every allocation of a session and of the release of each block it allocated. The release
    of a block from before the session is left out: the allocator reports some with the size of an older block at
    that address, which its records remember across sessions (a window's net had gone negative)."""
    live: set[int] = set()
    changes = []
    for at, n_bytes, address in allocations:
        if n_bytes > 0:
            live.add(address)
        elif address in live:
            live.discard(address)
        else:
            continue
        changes.append((at, n_bytes))
    return changes


@contextlib.contextmanager
def allocator_window(device: torch.device | None = None) -> Iterator[AllocatorWindow]:
    """Measure a block by the c10 allocator's records (NOTE [ Compiled code and the tracker ]), in a profiler session
    of its own: blocks allocated before it and released inside it are not seen (NOTE [ One session, many windows ])."""
    with AllocatorRecorder(device or torch.device("cpu")) as recorder, recorder.window() as window:
        yield window


@contextlib.contextmanager
def full_allocator_window(device: torch.device) -> Iterator[AllocatorWindow | None]:
    """:func:`allocator_window` where the records see every allocation (:func:`records_every_allocation`), else
    None."""
    if not records_every_allocation():
        yield None
        return
    with allocator_window(device) as window:
        yield window

"""The paging side of one step: value slots, saved-tensor handles, record internals and the step's pager.

NOTE [ Paged values ]
``PageOut(k)`` must leave no reference to ``x_k``'s storage in RAM, yet a record that saved
``x_k`` (its stage's input, ``input_saved``, or output, ``output_saved``) needs it back for
its backward. So while a stage whose input or output the schedule pages is recorded,
``saved_tensors_hooks`` pack every saved tensor that shares the storage of ``x_i`` or
``x_{i+1}`` as a :class:`_Saved` handle on a :class:`_Slot` -- the executor's one reference to
that value -- plus the view's dtype, size, stride and offset. The output is only known once
the forward returns: until then each saved tensor is held as it is, and handles whose storage
turns out to be the output's are bound to its slot then. Other saved tensors (the stage's
internals) stay plain references, unless the schedule pages the record (NOTE [ Paged
records ]). ``PageOut`` empties the slot (and ``values``), ``PageIn`` fills it with the tensor
read back; unpacking rebuilds each view over the slot's current storage, which the schedule
has paged in before the backward. A slot lives as long as a record
holds it, so the value dies when plain autograd would free it; a value that dies on disk has
its copy deleted. Transfers run on background threads (NOTE [ How a page travels ] in ``pager.py``),
early or late where ``overlap.py`` allows (NOTE [ Overlap without a higher peak ]).

NOTE [ Paged records ]
``PageOutRecord(i)`` must free a record's *internals* -- what autograd saved while recording
stage ``i`` besides ``x_i`` and ``x_{i+1}`` (the chain's ``saved_bytes - out_bytes``) -- and
keep the record usable. So when the schedule pages record ``i``, the same hooks pack every
saved tensor as a :class:`_Saved` handle while it records. Once the output is known, the
handles are sorted: those sharing ``x_i``'s or ``x_{i+1}``'s storage are values (bound to
their slot when the schedule pages that value, plain otherwise); those sharing a storage the
stage itself holds (parameters, buffers, tensor attributes such as a loss stage's target)
stay plain, as the profiler does not count them; the rest are the record's
:class:`RecordInternals`. ``PageOutRecord(i)`` empties every internal handle (keeping its view's
dtype, size, stride and offset) and writes each distinct storage once, so the RAM falls by
exactly those storages; ``PageInRecord(i)`` reads them into new storages and each handle
rebuilds its view over its own. The internals object holds its handles weakly: autograd
frees each saved tensor when its node's backward is done, as without paging.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from ..core.schedule import Op, PageOut, PageOutRecord
from ..errors import ScheduleError
from ..profiling.tracker import storage_key
from .overlap import OverlapPlan
from .pager import PageKey, PageSession, page_key

__all__ = ["StepPager", "RecordInternals"]


class _Slot:
    """The executor's one reference to a pageable value ``x_k`` that records saved (NOTE [ Paged values ])."""

    __slots__ = ("__weakref__", "tensor", "value")

    def __init__(self, value: int, tensor: torch.Tensor) -> None:
        self.value = value
        self.tensor: torch.Tensor | None = tensor   # None while paged out


class _Saved:
    """What a record keeps for one saved tensor: the tensor itself, a view of a slot's value, or
    (while its record is paged out) only the view's geometry."""

    __slots__ = ("__weakref__", "dtype", "key", "offset", "size", "slot", "stride", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: torch.Tensor | None = tensor
        self.slot: _Slot | None = None
        self.key = _storage_key_or_none(tensor)

    def _let_go(self) -> torch.Tensor:
        """Keep the view's geometry and drop the tensor, which is returned."""
        tensor, self.tensor = self.tensor, None
        assert tensor is not None
        self.dtype, self.size, self.stride, self.offset = (tensor.dtype, tensor.size(), tensor.stride(),
                                                           tensor.storage_offset())
        return tensor

    def bind(self, slot: _Slot) -> None:
        """Reach the tensor through ``slot`` from now on."""
        self._let_go()
        self.slot = slot

    def page_out(self) -> torch.Tensor:
        """Let go of the tensor (returned, for the page); :meth:`page_in` gives it back."""
        return self._let_go()

    def page_in(self, storage: torch.UntypedStorage) -> None:
        self.tensor = self._view(storage)

    def _view(self, storage: torch.UntypedStorage) -> torch.Tensor:
        view = torch.empty(0, dtype=self.dtype, device=storage.device)
        return view.set_(storage, self.offset, self.size, self.stride)

    def unpack(self) -> torch.Tensor:
        if self.slot is not None:
            base = self.slot.tensor
            if base is None:
                raise ScheduleError(f"a backward needs x_{self.slot.value}, which is paged out "
                                    f"(the schedule must PageIn({self.slot.value}) before it)")
            return self._view(base.untyped_storage())
        if self.tensor is None:
            raise ScheduleError("a backward needs a saved tensor of a record that is paged out "
                                "(the schedule must PageInRecord before it)")
        return self.tensor


def _storage_key_or_none(tensor: torch.Tensor) -> int | None:
    try:
        return storage_key(tensor)
    except (RuntimeError, NotImplementedError):   # sparse and other storage-less tensors
        return None


class RecordInternals:
    """A paged record's saved tensors besides its stage's input and output (NOTE [ Paged records ]).

    The handles are held weakly, so each saved tensor dies when autograd is done with it.
    """

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self._handles: list[weakref.ref[_Saved]] = []
        self._parts: list[int] = []   # while paged out: the storage (page part) of each handle

    def add(self, saved: _Saved) -> None:
        self._handles.append(weakref.ref(saved))

    def page_out(self) -> list[torch.Tensor]:
        """Empty every handle; returns one tensor per distinct storage, in page-part order."""
        handles = [saved for saved in (ref() for ref in self._handles) if saved is not None]
        self._handles = [weakref.ref(saved) for saved in handles]
        parts: dict[int, int] = {}
        storages: list[torch.Tensor] = []
        self._parts = []
        for saved in handles:
            tensor = saved.page_out()
            part = parts.setdefault(storage_key(tensor), len(storages))
            if part == len(storages):
                storages.append(tensor)
            self._parts.append(part)
        return storages

    def page_in(self, storages: Sequence[torch.Tensor]) -> None:
        """Give each handle its view over the storage read back for its part."""
        for ref, part in zip(self._handles, self._parts, strict=False):   # handles added since page_out stay
            saved = ref()
            if saved is not None:
                saved.page_in(storages[part].untyped_storage())
        self._parts = []


def _own_storages(stage: nn.Module) -> set[int]:
    """Storages the stage itself holds (parameters, buffers, tensor attributes such as a loss
    stage's target): autograd may save them, but they are not the record's to page."""
    keys: set[int] = set()
    for module in stage.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False),
                   *(value for value in vars(module).values() if isinstance(value, torch.Tensor))]
        keys.update(key for key in map(_storage_key_or_none, tensors) if key is not None)
    return keys


class StepPager:
    """The paging side of one step: the page session, the overlap plan, slots, held paged values and the
    hooks that hand a recording stage's saved tensors to them."""

    def __init__(self, session: PageSession, plan: OverlapPlan, ops: Sequence[Op]) -> None:
        self.session = session
        self.plan = plan
        self.page_ops = {j: key for j, key in enumerate(map(page_key, ops)) if key is not None}
        self.pageable = frozenset(op.value for op in ops if isinstance(op, PageOut))
        self.paged_records = frozenset(op.stage for op in ops if isinstance(op, PageOutRecord))
        self.writes_due: dict[int, list[PageKey]] = {}   # op index -> pages whose writes must be settled by then
        for j, before in plan.release_before.items():
            self.writes_due.setdefault(before, []).append(self.page_ops[j])
        self.reads_due: dict[int, list[PageKey]] = {}    # op index -> pages to prefetch before it
        for j, before in plan.issue_before.items():
            if before < j:
                self.reads_due.setdefault(before, []).append(self.page_ops[j])
        self.deferred: list[PageKey] = []   # prefetches due whose page's write was still running
        self.slots: dict[int, weakref.ref[_Slot]] = {}
        self.held_on_disk: set[int] = set()   # paged values the executor itself holds (not only records)

    def slot(self, k: int, tensor: torch.Tensor) -> _Slot:
        """The live slot of ``x_k`` over ``tensor``'s storage, or a new one (the caller's to keep)."""
        slot = self.live_slot(k)
        if slot is not None and slot.tensor is not None and storage_key(slot.tensor) == storage_key(tensor):
            return slot
        slot = _Slot(k, tensor)
        self.slots[k] = weakref.ref(slot)
        return slot

    def live_slot(self, k: int) -> _Slot | None:
        ref = self.slots.get(k)
        return ref() if ref is not None else None

    @contextlib.contextmanager
    def saving(self, i: int, x: torch.Tensor) -> Iterator[list[_Saved]]:
        """While stage ``i`` records: saved views of a pageable ``x_i`` go to its slot; the rest wait.

        Hooks are installed only when the schedule pages ``x_i``, ``x_{i+1}`` or this record.
        Yields the handles not sorted yet, for :meth:`sort_saved` (NOTE [ Paged values ],
        NOTE [ Paged records ]).
        """
        pending: list[_Saved] = []
        if not ({i, i + 1} & self.pageable or i in self.paged_records):
            yield pending
            return
        slot = self.slot(i, x) if i in self.pageable else None
        input_key = storage_key(x) if slot is not None else None

        def pack(tensor: torch.Tensor) -> _Saved:
            saved = _Saved(tensor)
            if slot is not None and saved.key == input_key:
                saved.bind(slot)
            else:
                pending.append(saved)
            return saved

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _Saved.unpack):
                yield pending
        finally:
            # Every saved tensor's hook object keeps ``pack`` (and its closure) alive until
            # backward: the slot must not live on through it when nothing saved the input.
            slot = None

    def sort_saved(self, i: int, stage: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   pending: list[_Saved]) -> RecordInternals | None:
        """Now that the output is known: views of a pageable ``x_{i+1}`` reach it through its slot,
        and a paged record's internals are gathered (NOTE [ Paged records ])."""
        if not pending:
            return None
        output_key = _storage_key_or_none(y)
        output = [saved for saved in pending if saved.key is not None and saved.key == output_key]
        if output and i + 1 in self.pageable:
            slot = self.slot(i + 1, y)
            for saved in output:
                saved.bind(slot)
        internals = None
        if i in self.paged_records:
            internals = RecordInternals(i)
            values_and_own = {_storage_key_or_none(x), output_key, *_own_storages(stage)}
            for saved in pending:
                if saved.key is not None and saved.key not in values_and_own:
                    internals.add(saved)
        pending.clear()
        return internals

    def before(self, index: int) -> None:
        """Settle what must be settled before op ``index`` and issue the reads planned there."""
        session = self.session
        session.reap()
        for key in self.writes_due.get(index, ()):
            if not session.write_done(key):
                session.wait_write(key)
        self.drop_dead_copies()
        due, self.deferred = self.deferred + self.reads_due.get(index, []), []
        for key in due:
            if session.reading(key) or key not in session.on_disk():
                continue                       # read at its PageIn already, or died
            if session.write_done(key):
                session.start_read(key, prefetch=True)
            else:
                self.deferred.append(key)      # never wait for a write to prefetch

    def settle_write(self, index: int, key: PageKey) -> None:
        """After the page-out of ``key`` at op ``index``: wait for the write unless the plan lets it overlap."""
        if self.plan.release_before.get(index, index + 1) <= index + 1:
            self.session.wait_write(key)

    def drop_dead_copies(self) -> None:
        """A value that died while paged out needs its copy on disk no more (a paged record
        cannot die: its backward needs it paged in)."""
        for k in self.session.on_disk():
            if isinstance(k, int) and k not in self.held_on_disk and self.live_slot(k) is None:
                self.session.discard(k)

    def finish(self) -> None:
        self.drop_dead_copies()
        self.session.finish()

"""Measure a model into a :class:`~edgetrain.core.chain.Chain`, stage by stage.

Each stage is run on its own, with the previous stage's output as input, three ways: without
autograd (output size and forward workspace), recorded (what autograd saves, counted with
``saved_tensors_hooks``), and backward (gradient sizes and backward workspace). Live bytes
come from :class:`~edgetrain.profiling.tracker.LiveBytesTracker`, so the same code profiles real
tensors on the CPU and shape-only tensors on the meta device (no allocation at all).
Times are medians of repeated real runs, or, on the meta device, FLOPs divided by a rate.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode

from ..autograd.handover import GradBox, HandOver, backward_from_box
from ..autograd.rng_state import RandomDraws, RngState
from ..core.chain import NOMINAL_FLOPS_PER_S, Chain, StageCost
from ..models.stages import CompiledStage, LossFn, LossStage, parameter_holders, training_stages
from ..models.traced import model_call
from .cache import cached_profile, profile_key, store_profile
from .signature import module_signature
from .tracker import (
    AllocatorRecorder,
    AllocatorWindow,
    LiveBytesTracker,
    SavedTensors,
    profiler_running,
    storage_bytes,
    storage_key,
)

__all__ = ["profile"]

log = logging.getLogger(__name__)


@dataclass
class _StageMeasure:
    cost: StageCost
    output: torch.Tensor
    saved_live_bytes: int  # growth of live bytes over a recorded forward, a cross-check


def profile(model: nn.Module, sample: torch.Tensor | Sequence[int], target: torch.Tensor | None = None, *,
            loss_fn: LossFn | None = None, optimizer: str = "sgd", measure_time: bool = True,
            repeats: int = 5, flops_per_s: float = NOMINAL_FLOPS_PER_S,
            progress: Callable[[int, int], None] | None = None, step_in_backward: bool = False,
            cache: Path | None = None) -> Chain:
    """Profile one training step of ``model`` into a chain of stages (the loss is the last stage).

    Args:
        model: any model :func:`~edgetrain.models.stages_of` turns into stages, in train mode.
        sample: an input batch, or the shape of a float input batch (made on the model's device).
        target: labels for the loss; class 0 for every sample if omitted.
        loss_fn: ``loss_fn(output, target)``; cross-entropy by default.
        optimizer: ``"sgd"`` (with momentum) or ``"adam"``, for the resident optimizer state.
        measure_time: time stages on real tensors (median of ``repeats``); on the meta device,
            or when False, times are FLOPs / ``flops_per_s``.
        progress: called as ``progress(stage_index, n_stages)`` after each stage.
        step_in_backward: also measure each stage's backward with every parameter's gradient dropped as
            soon as it is accumulated (``StageCost.bwd_stepped_workspace_bytes``), for
            :meth:`Chain.with_step_in_backward`: one more recorded forward and backward per stage.
        cache: a folder of kept profiles (:func:`~edgetrain.profiling.cache.default_profile_cache`): a profile
            of the same model, input and options on this machine is read from there instead of measured, and a
            new one is kept there (NOTE [ What a cached profile is keyed by ] in ``profiling/cache.py``).

    Returns:
        A :class:`Chain` whose simulated keep-everything schedule predicts the step's peak.

    Example:
        >>> chain = profile(resnet18(), (8, 3, 224, 224), measure_time=False)
    """
    device = _model_device(model)
    x = sample if isinstance(sample, torch.Tensor) else torch.randn(*sample, device=device)
    timed = measure_time and x.device.type != "meta"
    key = None
    if cache is not None:
        options = {"optimizer": optimizer, "timed": timed, "repeats": repeats, "flops_per_s": flops_per_s,
                   "step_in_backward": step_in_backward}
        key = profile_key(model, x, target, options, loss_fn)
        kept = cached_profile(cache, key)
        if kept is not None:
            log.info("%s: profile read from %s", type(model).__name__, cache)
            return kept
    chain = _measured_chain(model, x, target, loss_fn, optimizer, timed, repeats, flops_per_s, progress,
                            step_in_backward)
    if cache is not None and key is not None:
        store_profile(cache, key, chain)
    return chain


def _measured_chain(model: nn.Module, x: torch.Tensor, target: torch.Tensor | None, loss_fn: LossFn | None,
                    optimizer: str, timed: bool, repeats: int, flops_per_s: float,
                    progress: Callable[[int, int], None] | None, step_in_backward: bool) -> Chain:
    stages = training_stages(model, loss_fn, sample=x)
    call = model_call(stages)
    if call is not None and not call.holder.values:   # captured here, on x: NOTE [ Side inputs ] in models/call.py
        call.bind((x,), {})
    # NOTE [ Side inputs ] in models/call.py: held for the whole step, as the batch is
    sides = [] if call is None else call.side_tensors()
    with _preserved_buffers(model):
        measures, target = _profile_all(stages, x, target, timed, repeats, flops_per_s, progress, step_in_backward,
                                        sides)
    weights = set() if call is None else {storage_key(t) for t in call.weights()}
    params = [p for p in model.parameters() if p.requires_grad]
    staged = {id(p) for stage in stages for p in stage.parameters()}
    chain = Chain(
        stages=tuple(m.cost for m in measures),
        input_bytes=storage_bytes([x, target, *(t for t in sides if storage_key(t) not in weights)]),
        # parameters no stage runs in training (a detector's decoding head) are weights all the same
        buffer_bytes=storage_bytes([*model.buffers(), *(p for p in model.parameters() if id(p) not in staged)]),
        largest_param_bytes=max((p.untyped_storage().nbytes() for p in params), default=0),
        n_param_tensors=len(params),
        name=type(model).__name__,
        meta={"input_shape": list(x.shape), "device": x.device.type, "timed": timed,
              "saved_live_bytes": [m.saved_live_bytes for m in measures]},
        loss_held_bytes=_loss_held_bytes(measures[-1].output) if isinstance(stages[-1], LossStage) else 0,
        rng_state_bytes=_rng_state_nbytes(x.device) if any(m.cost.uses_rng for m in measures) else 0,
    )
    return chain.with_optimizer(optimizer)


def _rng_state_nbytes(device: torch.device) -> int:
    """A generator state's bytes where a plan must count them: kept in host memory, they are a CPU (or meta,
    planned for CPU) step's, outside a GPU's (NOTE [ Generator states in the plan ] in schedule.py)."""
    return RngState.capture().nbytes if device.type in ("cpu", "meta") else 0


def _loss_held_bytes(loss: torch.Tensor) -> int:
    """The loss a step returns and the gradient its backward starts from (``torch.ones`` of the
    loss's shape, as ``Tensor.backward`` and :class:`~edgetrain.autograd.handover.HandOver` make it):
    both live past the loss stage's own ops (``Chain.loss_held_bytes``)."""
    return loss.untyped_storage().nbytes() + loss.numel() * loss.element_size()


def _profile_all(stages: list[nn.Module], x: torch.Tensor, target: torch.Tensor | None, timed: bool,
                 repeats: int, flops_per_s: float,
                 progress: Callable[[int, int], None] | None,
                 stepped: bool, sides: list[torch.Tensor]) -> tuple[list[_StageMeasure], torch.Tensor]:
    measures: list[_StageMeasure] = []
    repeats_of: dict[int, int] = {}   # a stage measured as the earlier one it repeats
    with LiveBytesTracker() as tracker, _one_intra_op_thread(x.device):
        for module in stages:
            tracker.register(module.parameters())
            tracker.register(module.buffers())
        tracker.register([x, *sides])
        current = x.detach()
        holders = parameter_holders(stages)
        first_of: dict[tuple[object, ...], int] = {}
        for index, module in enumerate(stages):
            if isinstance(module, LossStage):
                if target is None:
                    target = torch.zeros(current.shape[0], dtype=torch.long, device=current.device)
                module.target = target
                tracker.register([target])
            counted = _Counted(weights={id(p) for p, holding in holders.items() if holding[0] == index},
                               grads={id(p) for p, holding in holders.items() if holding[-1] == index})
            key = _repeat_key(module, current, index, counted)
            if key is not None and key in first_of:
                measure = _repeated(measures[first_of[key]], module, current, index)
                repeats_of[index] = first_of[key]
            elif is_compiled(module):
                measure = _profile_compiled_stage(module, current, index > 0, tracker, flops_per_s,
                                                  name=_stage_name(module, index), counted=counted, stepped=stepped)
            else:
                measure = _profile_stage(module, current, index > 0, tracker.live_keys(), _recorder(tracker, current),
                                         flops_per_s, name=_stage_name(module, index), counted=counted,
                                         stepped=stepped)
            if key is not None:
                first_of.setdefault(key, index)
            measures.append(measure)
            current = measure.output
            if progress is not None:
                progress(index + 1, len(stages))
    if timed:
        measures = _timed(stages, x, measures, repeats, repeats_of)
    if isinstance(stages[-1], LossStage):
        stages[-1].target = None
    assert target is not None or not isinstance(stages[-1], LossStage)
    return measures, target if target is not None else torch.empty(0)


# NOTE [ Repeated stages measured once ]
# A stage with the signature of an earlier one (NOTE [ A module's signature ] in ``signature.py``), the same
# input shape and dtype, and the same share of weights and gradients to count (NOTE [ Shared parameters ]) runs
# the same ops on tensors of the same sizes, so its costs are the earlier stage's: it is run once without autograd,
# for the next stage's input, and takes the earlier measurement and times. A transformer's identical layers are
# measured once. Off (``REUSE_REPEATED_STAGES = False``), every stage is measured, which the tests compare with.
REUSE_REPEATED_STAGES = True


def _repeat_key(module: nn.Module, x: torch.Tensor, index: int, counted: _Counted) -> tuple[object, ...] | None:
    """What makes two stages' costs equal, or None for a stage always measured (the loss, a compiled stage)."""
    if not REUSE_REPEATED_STAGES or isinstance(module, LossStage) or is_compiled(module):
        return None
    params = list(module.parameters())
    return (module_signature(module), tuple(x.shape), x.dtype, index > 0,
            tuple(id(p) in counted.weights for p in params), tuple(id(p) in counted.grads for p in params))


def _repeated(first: _StageMeasure, module: nn.Module, x: torch.Tensor, index: int) -> _StageMeasure:
    """Stage ``index``'s measure as the earlier stage it repeats: that one's costs, its own output."""
    with torch.no_grad():
        output = module(x)
    return replace(first, cost=replace(first.cost, name=_stage_name(module, index)), output=output)


@dataclass(frozen=True)
class _Counted:
    """Parameters (by ``id``) whose weights and gradients a stage's cost counts.

    NOTE [ Shared parameters ]
    A parameter that several stages use (a GPT's token embedding tied to its output layer, a
    module called twice) exists once: its weight is counted in the first stage that holds it,
    its gradient in the last, whose backward runs first and creates it; the earlier stages'
    backwards add into it in place, and what they allocate for that is their workspace.
    """

    weights: set[int]
    grads: set[int]


def _timed(stages: list[nn.Module], x: torch.Tensor, measures: list[_StageMeasure],
           repeats: int, repeats_of: dict[int, int]) -> list[_StageMeasure]:
    """The measures with each stage's forward and backward timed on its profiled input.

    Timed after the byte tracker has exited: under its Python dispatch every op pays a fixed
    overhead, which inflated the times of stages made of many small ops (MobileNetV2 at
    batch 8, 64 px: the stages summed to 1.38x the plain step).
    """
    inputs = [x.detach(), *(m.output for m in measures[:-1])]
    timed: list[_StageMeasure] = []
    for index, (module, stage_input, measure) in enumerate(zip(stages, inputs, measures, strict=True)):
        if index in repeats_of:   # NOTE [ Repeated stages measured once ]
            first = timed[repeats_of[index]].cost
            fwd_s, bwd_s = first.fwd_time_s, first.bwd_time_s
        else:
            fwd_s, bwd_s = _time_stage(module, stage_input, index > 0, repeats)
        timed.append(replace(measure, cost=replace(measure.cost, fwd_time_s=fwd_s, bwd_time_s=bwd_s)))
    return timed


class _TrackerWindows:
    """Windows measured by ``tracker`` alone, each filled as it closes: its live bytes' net change and peak. On the
    meta device, and where the user's own ``torch.profiler`` session runs (no second one can start)."""

    def __init__(self, tracker: LiveBytesTracker) -> None:
        self.tracker = tracker

    def __enter__(self) -> _TrackerWindows:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @contextlib.contextmanager
    def window(self) -> Iterator[AllocatorWindow]:
        measured = AllocatorWindow()
        before = self.tracker.current_bytes
        self.tracker.reset_peak()
        yield measured
        measured.net_bytes = self.tracker.current_bytes - before
        measured.peak_bytes = self.tracker.peak_bytes - before


Recorder = AllocatorRecorder | _TrackerWindows


def _recorder(tracker: LiveBytesTracker, x: torch.Tensor) -> Recorder:
    """How a stage's phases are measured (NOTE [ A kernel's scratch in the plan ]): by the allocator's records and
    the tracker at once, at one intra-op thread (``_one_intra_op_thread``)."""
    if x.device.type == "meta":
        return _TrackerWindows(tracker)
    if profiler_running():
        log.warning("torch.profiler is running: stages measured by the tensors alone, without their kernels' scratch")
        return _TrackerWindows(tracker)
    return AllocatorRecorder(x.device, tracker)


@contextlib.contextmanager
def _one_intra_op_thread(device: torch.device) -> Iterator[None]:
    """One intra-op thread on the CPU while a chain's bytes are measured, where the allocator's records see every
    allocation (:func:`~edgetrain.profiling.tracker.records_every_allocation`): the kernels' scratch of the profiling
    thread is planned, a further thread's own buffers are not (NOTE [ A kernel's scratch in the plan ])."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` runs code compiled by ``torch.compile`` (NOTE [ Compiled code and the tracker ])."""
    return isinstance(module, (CompiledStage, torch._dynamo.eval_frame.OptimizedModule))


def _eager(module: nn.Module) -> nn.Module:
    """``module`` as written: a compiled module called under a dispatch mode is never compiled again."""
    if isinstance(module, CompiledStage):
        return module.eager
    original: nn.Module = getattr(module, "_orig_mod", module)
    return original


def _profile_compiled_stage(module: nn.Module, x: torch.Tensor, input_grad: bool, tracker: LiveBytesTracker,
                            flops_per_s: float, name: str, counted: _Counted, stepped: bool) -> _StageMeasure:
    """A compiled stage, run and measured outside every dispatch mode (NOTE [ Compiled code and the tracker ]).

    It is compiled first, both ways the executor runs it (without autograd for a recomputation, with it
    for a recorded forward and its backward), so that no compilation falls inside a measurement; its
    output is then handed to ``tracker`` so that later stages count it as an existing tensor.
    """
    if x.device.type == "meta":
        raise ValueError(f"stage {name} is compiled: profile it on real tensors, not on the meta device")
    with _disable_current_modes():
        with torch.no_grad():
            module(x)
        warm = module(x.detach().requires_grad_(input_grad and x.is_floating_point()))
        if warm.requires_grad:
            torch.autograd.backward(warm, None if warm.dim() == 0 else torch.ones_like(warm))
        del warm
        _clear_grads(module)
        measure = _profile_stage(module, x, input_grad, tracker.live_keys(), AllocatorRecorder(x.device), flops_per_s,
                                 name=name, counted=counted, stepped=stepped)
    tracker.register([measure.output])
    return measure


def _profile_stage(module: nn.Module, x: torch.Tensor, input_grad: bool, existing: set[int], recorder: Recorder,
                   flops_per_s: float, name: str, counted: _Counted, stepped: bool = False) -> _StageMeasure:
    """One stage's costs, each phase a window of ``recorder`` (read once it has closed); ``existing``: the storages
    alive before it (weights, its input), which its saved tensors do not pay for."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    with recorder:
        # 1. Without autograd: output size, forward workspace, and whether the forward draws random numbers.
        rng_before, on_meta = RngState.capture(), x.device.type == "meta"
        # no generator moves on the meta device: there the ops that would draw are watched instead (a mode that
        # would make a compiled stage run eagerly, but compiled stages are refused on meta)
        draws = RandomDraws() if on_meta else contextlib.nullcontext()
        with recorder.window() as forward, torch.no_grad(), draws:
            output = module(x)
        uses_rng = draws.drew if isinstance(draws, RandomDraws) else not rng_before.equals(RngState.capture())
        existing = existing | {storage_key(output)}   # alive before the recorded forward too

        # 2. Recorded: saved tensors (hooks) and recorded-forward workspace.
        x_rec = x.detach().requires_grad_(input_grad and x.is_floating_point())
        with recorder.window() as recorded_forward, SavedTensors(existing) as recorded:
            y = module(x_rec)
        output_saved = storage_key(y) in recorded.keys
        # NOTE [ A stage whose output is a view of its input ]
        # Flatten, a reshape, a slice: the output shares the input's storage, so the input's bytes live
        # as long as the output does, whatever the record saves. Marked as a record that keeps its input:
        # its saved bytes (0: nothing new) less its output's then cancel the one storage counted twice.
        # Left unmarked, a plan that ran the stage before it without recording (the input then released)
        # counted the shared storage as freed: 32 KiB under the measured peak on a conv -> flatten ->
        # linear chain (tests/test_step_in_backward.py).
        aliases_input = storage_key(y) == storage_key(x_rec)
        input_saved = storage_key(x_rec) in recorded.keys or aliases_input
        saved = dict(recorded.new_bytes)
        if storage_key(y) not in existing:
            saved[storage_key(y)] = y.untyped_storage().nbytes()

        # 3. Backward: gradient of the input, parameter gradients, workspace. The output gradient
        #    is handed to the engine as the executor hands it (edgetrain.autograd.handover): freed once used.
        backward, grad_in = _handed_over_backward(y, x_rec, recorder)
        grad_bytes = storage_bytes(p.grad for p in params if p.grad is not None and id(p) in counted.grads)
        del y
        x_rec.grad = None
        for p in params:
            p.grad = None
        stepped_backward = _stepped_backward(module, x, input_grad, params, recorder) if stepped else None

    out_bytes = output.untyped_storage().nbytes()
    # a stage that checkpoints inside (models/segmented.py) keeps generator states in its record, made outside
    # the dispatcher and so no saved tensor; the copy each replay takes in its backward the tracker is shown
    saved_bytes = sum(saved.values()) + getattr(module, "kept_rng_states", 0) * _rng_state_nbytes(x.device)
    weight_bytes = storage_bytes(p for p in module.parameters() if id(p) in counted.weights)  # frozen ones too
    fwd_flops, bwd_flops = _count_flops(_eager(module), x, input_grad)
    cost = StageCost(name=name, fwd_time_s=fwd_flops / flops_per_s, bwd_time_s=bwd_flops / flops_per_s,
                     out_bytes=out_bytes, saved_bytes=saved_bytes, param_bytes=weight_bytes, grad_bytes=grad_bytes,
                     fwd_workspace_bytes=max(0, forward.peak_bytes - out_bytes),
                     rec_workspace_bytes=max(0, recorded_forward.peak_bytes - recorded_forward.net_bytes),
                     bwd_workspace_bytes=backward.peak_bytes - grad_in - grad_bytes,
                     fwd_scratch_bytes=forward.scratch_bytes, rec_scratch_bytes=recorded_forward.scratch_bytes,
                     bwd_scratch_bytes=backward.scratch_bytes,
                     input_saved=input_saved, output_saved=output_saved, uses_rng=uses_rng,
                     bwd_stepped_workspace_bytes=None if stepped_backward is None
                     else stepped_backward.peak_bytes - grad_in,
                     bwd_stepped_scratch_bytes=0 if stepped_backward is None else stepped_backward.scratch_bytes)
    log.debug("profiled %s: %s", name, cost)
    return _StageMeasure(cost=cost, output=output.detach(), saved_live_bytes=recorded_forward.net_bytes)


def _stepped_backward(module: nn.Module, x: torch.Tensor, input_grad: bool, params: list[nn.Parameter],
                      recorder: Recorder) -> AllocatorWindow:
    """The stage's backward with every parameter's gradient dropped as soon as autograd has accumulated it, as
    the optimizer stepped in the backward drops it (NOTE [ The optimizer step in the backward ] in chain.py): a
    recorded forward again, then its backward as a window of ``recorder``."""
    x_rec = x.detach().requires_grad_(input_grad and x.is_floating_point())
    y = module(x_rec)
    handles = [p.register_post_accumulate_grad_hook(_drop_grad) for p in params]
    try:
        backward, _ = _handed_over_backward(y, x_rec, recorder)
    finally:
        for handle in handles:
            handle.remove()
    return backward


def _handed_over_backward(y: torch.Tensor, x_rec: torch.Tensor, recorder: Recorder) -> tuple[AllocatorWindow, int]:
    """Back-propagate a recorded stage from ``y`` with a ones gradient handed to the engine as the executor hands
    it (edgetrain.autograd.handover: freed once used), as a window of ``recorder``; the window, and the bytes
    of the gradient it leaves in ``x_rec``."""
    box = GradBox()
    handover = HandOver.apply(y, box) if y.requires_grad else None
    box.grad = None if y.dim() == 0 else torch.ones_like(y)
    with recorder.window() as backward:
        if handover is not None:
            backward_from_box(handover)
    return backward, x_rec.grad.untyped_storage().nbytes() if x_rec.grad is not None else 0


def _drop_grad(param: torch.Tensor) -> None:
    param.grad = None


def _count_flops(module: nn.Module, x: torch.Tensor, input_grad: bool) -> tuple[float, float]:
    x_rec = x.detach().requires_grad_(input_grad and x.is_floating_point())
    with FlopCounterMode(display=False) as fwd_counter:
        y = module(x_rec)
    grad_out = None if y.dim() == 0 else torch.ones_like(y)
    with FlopCounterMode(display=False) as bwd_counter:
        if y.requires_grad:   # not a frozen first stage, whose backward is empty
            torch.autograd.backward(y, grad_out)
    _clear_grads(module)
    return float(fwd_counter.get_total_flops()), float(bwd_counter.get_total_flops())


def _time_stage(module: nn.Module, x: torch.Tensor, input_grad: bool, repeats: int) -> tuple[float, float]:
    fwd_times, bwd_times = [], []
    for _ in range(repeats + 1):  # the first run warms caches and is dropped
        x_rec = x.detach().requires_grad_(input_grad and x.is_floating_point())
        start = time.perf_counter()
        y = module(x_rec)
        middle = time.perf_counter()
        if y.requires_grad:
            torch.autograd.backward(y, None if y.dim() == 0 else torch.ones_like(y))
        end = time.perf_counter()
        fwd_times.append(middle - start)
        bwd_times.append(end - middle)
        _clear_grads(module)
    return statistics.median(fwd_times[1:]), statistics.median(bwd_times[1:])


def _clear_grads(module: nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _stage_name(module: nn.Module, index: int) -> str:
    return "loss" if isinstance(module, LossStage) else f"{index}:{type(module).__name__}"


def _model_device(model: nn.Module) -> torch.device:
    for tensor in [*model.parameters(), *model.buffers()]:
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def _preserved_buffers(model: nn.Module) -> Iterator[None]:
    """Profiling runs BatchNorm in train mode several times; put its statistics back after."""
    saved = {name: buf.clone() for name, buf in model.named_buffers() if buf.device.type != "meta"}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name in saved:
                    buf.copy_(saved[name])

"""A model wrapper that trains with a planned checkpointing schedule inside a normal training loop.

NOTE [ Checkpointed in a user loop ]
The schedule of a step covers the loss too (the last stage of every chain is the loss, so
planners see its memory), but a user loop computes the loss itself::

    loss = loss_fn(model(x), y); loss.backward(); opt.step()

So a training-mode ``forward(x)`` runs the schedule's ops up to the loss stage's recorded
forward inside a custom autograd function and returns the model output; the user's loss
plays the loss stage, and ``loss.backward()`` reaches that function's backward with the
output gradient ``δ``, from which the rest of the schedule (recomputations and stage
backwards) runs. One chain (profiled *with* ``loss_fn``) and one plan serve both this and
:meth:`Checkpointed.step_loss`, which runs the whole schedule, loss included; the plan's
predicted peak holds for the user loop as long as the loss computed there is ``loss_fn``
(measured against it with no slack: ``check_step(..., loop="user")``).

The rest of the schedule does not run *inside* that backward: the engine holds a function's
incoming gradients until its backward returns, so ``δ`` (the model output's gradient: 80 bytes
on a test-size DenseNet, 1.5 MB on YOLOv8n at 2x256) would stay alive through every stage's
backward, where the schedule, like plain backprop, frees it once the last stage's backward has
consumed it. So the backward puts ``δ`` in a box, queues the rest of the schedule as a callback
of the running backward (``queue_callback``: it runs once the engine's graph task is done and
the engine has let go of ``δ``) and returns; the callback hands ``δ`` to the executor, which
then holds the only reference. The other way, a plan that counts ``δ`` for the whole backward
when it serves a user loop, would predict (and budget) memory the step does not need to hold;
deferring keeps one prediction for both loops, tight in both, and runs the very same ops, so
the gradients are bit for bit ``step_loss``'s. Deferring is sound because nothing in the user's
graph waits for this function's backward: it returns no gradient (the batch may not require one;
were it allowed to, its gradient would have to be returned, hence computed, inside the backward,
holding ``δ`` again), so the engine has nothing to run after it. The one visible change is the
order in which ``.grad`` sums: a parameter that also gets a gradient outside the wrapped model
(tied to another module of the user's loss) receives the schedule's part last, as float sums go.
A user who keeps the output (``out = model(x)`` through ``backward()``) holds its bytes on top
of the plan, as with any tensor a loop keeps. Once the user's loss has back-propagated, the run
counts the loss stage done, as its own ``Backward`` would: the stage before it, recomputed after
that point, then keeps no output for a loss still to come (NOTE [ Dead outputs ] in
``schedule.py``; it kept the whole 1.5 MB head output of YOLOv8n at 2x256 above the plan).

The wrapper is transparent otherwise: in eval mode or under ``torch.no_grad()`` ``forward``
is the plain model; ``parameters()`` are the model's own and ``state_dict()`` /
``load_state_dict()`` use the model's keys, so optimizers and checkpoints work unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..autograd.handover import GradBox
from ..core.chain import Chain
from ..core.simulator import simulate
from ..models.call import Inputs, ModelCall, as_call, flat_inputs, input_shapes
from ..models.segmented import SegmentedStage, segmented_stages
from ..models.stages import LossFn, compiled_stages, training_stages
from ..models.traced import exported_for, model_call, training_mode
from ..models.update import apply_update
from ..planners import Plan, plan
from ..planners.blocks import BlockPlan, plan_blocks
from ..profiling import profile
from ..profiling.cache import profile_cache_folder
from ..profiling.tracker import storage_bytes, storage_key
from .executor import Executor, PendingBackward
from .step_in_backward import OptimizerFactory, StepInBackward, shared_gradient_bytes

__all__ = ["Checkpointed"]

log = logging.getLogger(__name__)

_InputKey = tuple[str, tuple[tuple[Any, ...], ...]]


class _ScheduledForward(torch.autograd.Function):
    """The schedule up to the loss as one autograd node; its backward is the rest of the schedule.

    ``anchor`` (a 0-element leaf that requires grad) makes the output require grad; the
    parameter gradients are accumulated by the inner stage backwards, not returned here.
    """

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, x: torch.Tensor, executor: Executor) -> torch.Tensor:
        output, pending = executor.forward(x)
        ctx.pending = pending
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[None, None, None]:
        # NOTE [ Checkpointed in a user loop ]: the rest of the schedule runs once the engine let go of δ.
        pending: PendingBackward = ctx.pending
        box = GradBox()
        box.grad = grad_output
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(pending, box))
        return None, None, None


class Checkpointed(nn.Module):
    """Train ``model`` within a memory budget (or a recompute factor) by planned recomputation.

    The model is profiled on ``sample`` into a :class:`~edgetrain.core.chain.Chain` (loss
    included), a schedule is planned with :func:`edgetrain.planners.plan`, and training
    steps follow it (see NOTE [ Checkpointed in a user loop ]). A batch of another shape,
    dtype or device is profiled and planned again (logged as a warning: profiling takes
    time and the new plan may differ); plans are kept per input shape, so a smaller last
    batch costs one re-plan per run, not one per epoch. Inputs of ever-changing shape
    (unpadded sequences) re-profile each new shape: pad them to a few fixed lengths.

    Args:
        model: a model with ``stages()``, an ``nn.Sequential``, or any model torch.fx traces
            (NOTE [ Traced stages ] in ``models/traced.py``).
        sample: an example input batch of the shape training will use: a tensor, or the model's inputs as a
            tuple or a dict of tensors (``{"input_ids": ids, "attention_mask": mask}``), which the model is
            then called with (NOTE [ Side inputs ] in ``models/call.py``). A model that returns a structure
            (a ``ModelOutput``) returns it under the wrapper too, and ``loss_fn`` gets that structure.
        memory: the step's tensor peak allowed (weights, gradients, optimizer state, batch,
            activations, workspace as the simulator counts them), in bytes or as text
            (``"300MiB"``). Not the process: the interpreter, PyTorch's libraries and caches
            come on top (NOTE [ Process budget ]; :func:`edgetrain.train.budget.split_process_budget`
            turns a process budget into this one).
        recompute: instead of ``memory``, the largest acceptable time / plain time (>= 1).
        strategy: ``"auto"``, ``"uniform"``, ``"revolve"`` or ``"optimal"``.
        loss_fn: the loss the user loop computes (cross-entropy by default); profiled and
            used by :meth:`step_loss`.
        optimizer: ``"sgd"`` or ``"adam"``: its state is part of the budget.
        target: example labels for profiling (class 0 everywhere when omitted); re-plans
            for another batch size repeat or cut it along the first dimension.
        measure_time: time stages on real tensors (else FLOP counts stand for times).
        chain: the chain of this model profiled on a batch of ``sample``'s shape (with
            ``loss_fn`` and ``optimizer``), to plan without profiling again: a saved one
            (:meth:`Chain.load`), or one profiled once for plans at several budgets.
        blocks: also consider recomputing inside coarse traced stages (NOTE [ Blocks planned
            inside ] in ``models/segmented.py``): their segmented twins are profiled too and
            :func:`~edgetrain.planners.blocks.plan_blocks` picks which stages run segmented.
        twins: with ``blocks``, the chain of the segmented stages (:meth:`twin_stages`)
            profiled as ``chain`` is, to plan without profiling them again.
        compile_stages: compile every stage but the loss with ``torch.compile`` (inductor)
            before profiling, so that the plan is made, and the step runs, on fused kernels
            (NOTE [ Compiled stages ]). Each stage compiles on first use (seconds each, again
            for recomputation without autograd); gradients then equal plain autograd's to
            float rounding, not bit for bit. A stage compiled this way is no longer traced, so
            ``blocks`` finds nothing to segment.
        step_in_backward: a function that builds the optimizer of one parameter (``lambda ps:
            torch.optim.SGD(ps, lr=0.1, momentum=0.9)``, of the kind ``optimizer`` names): each
            parameter is then updated as soon as its gradient is made and the gradient dropped, and
            the plan counts only the gradients of the stage whose backward runs (NOTE [ The optimizer
            step in the backward ] in ``chain.py``). The loop calls no optimizer: ``loss.backward()``
            (or :meth:`step_loss`) is the whole step. ``step_optimizers`` holds the optimizers (to
            change a learning rate). No ``.grad`` outlives the backward: no clipping by the global
            norm, no accumulation over batches; a parameter several stages share is stepped once
            the last of their backwards has added to its gradient, which is held until then.
        update: which parameters train (NOTE [ Update schemes ] in ``models/update.py``): ``"bias"``,
            ``"last:K"``, parameter patterns such as ``"layer4,fc"``; the rest of ``model`` is frozen
            (``requires_grad=False``) here, before profiling. None (the default) trains what the model's
            own flags say, all of it unless the user froze some; a frozen start runs once, records nothing.
        profile_cache: where profiles are kept between runs (NOTE [ What a cached profile is keyed by ] in
            ``profiling/cache.py``): True for ``$EDGETRAIN_PROFILE_CACHE`` or ``~/.cache/edgetrain/profiles``,
            a folder, or False to profile every time. A second ``Checkpointed`` of the same model, input and
            options on this machine reads its profile instead of measuring it.

    Attributes:
        plan: the :class:`~edgetrain.planners.Plan` in use (``.schedule``, ``.predicted_peak_bytes``).
        chain: the profiled chain it was planned on (with ``blocks``, the chosen variant's).
        block_plan: with ``blocks`` and a stage to segment, the two-level plan; else None.
        step_optimizers: with ``step_in_backward``, each parameter's optimizer; else empty.

    Example:
        >>> model = Checkpointed(resnet18(), sample=x, memory="300MiB")
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
    """

    def __init__(self, model: nn.Module, *, sample: Inputs, memory: int | str | None = None,
                 recompute: float | None = None, strategy: str = "auto", loss_fn: LossFn | None = None,
                 optimizer: str = "sgd", target: torch.Tensor | None = None, measure_time: bool = True,
                 chain: Chain | None = None, blocks: bool = False, twins: Chain | None = None,
                 compile_stages: bool = False, step_in_backward: OptimizerFactory | None = None,
                 update: str | None = None, profile_cache: bool | str | Path = True) -> None:
        super().__init__()
        if (memory is None) == (recompute is None):
            raise ValueError("give exactly one of memory= (a budget) or recompute= (a factor >= 1)")
        if update is not None:
            apply_update(model, update)
        self.model = model
        # A plain list: the stages share the model's modules and must not be registered twice.
        self._stages: list[nn.Module] = training_stages(model, loss_fn, sample=sample)
        self._call = model_call(self._stages)
        self._compile_stages = compile_stages
        if compile_stages:
            self._stages = compiled_stages(self._stages)
        self._loss_fn = loss_fn
        self._request: dict[str, Any] = {"memory": memory, "recompute": recompute, "strategy": strategy}
        self._optimizer = optimizer
        self._measure_time = measure_time
        self._profile_cache = profile_cache_folder(profile_cache)
        self._example_target = target
        self._blocks = blocks
        self._twins = twins
        self.block_plan: BlockPlan | None = None
        self._stepper = None if step_in_backward is None else StepInBackward(self._stages, step_in_backward, optimizer)
        self.step_optimizers = {} if self._stepper is None else self._stepper.optimizers
        self.plan: Plan
        self.chain: Chain
        self._executor: Executor
        args, kwargs = as_call(sample)
        self._input_key: _InputKey = _input_key(args, kwargs)
        self._plans: dict[_InputKey, tuple[Chain, Plan, Executor, BlockPlan | None, ModelCall | None]] = {}
        self._replan(args, kwargs, target, chain)

    # --- training ------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model output; in training with autograd on, produced by the planned schedule."""
        if not (self.training and torch.is_grad_enabled()):
            return self.model(*args, **kwargs)
        self._ensure_plan(args, kwargs, None)
        x = self._bind(args, kwargs)
        if x.requires_grad:
            raise ValueError("Checkpointed does not compute the gradient of its input batch; pass x.detach()")
        anchor = torch.empty(0, device=x.device, requires_grad=True)
        output = _ScheduledForward.apply(anchor, x, self._executor)
        return output if self._call is None else self._call.output(output)

    def step_loss(self, x: Inputs, target: torch.Tensor) -> torch.Tensor:
        """Forward, ``loss_fn`` and backward of one batch by the schedule; returns the detached loss.

        ``x`` is the batch as ``sample`` gives it (a tensor, a tuple or a dict of tensors). Parameter gradients
        accumulate into ``.grad`` as ``loss.backward()`` would; call the optimizer's ``step()`` after it (with
        ``step_in_backward`` the step is done: nothing to call).
        """
        args, kwargs = as_call(x)
        self._ensure_plan(args, kwargs, target)
        return self._executor.step(self._bind(args, kwargs), target)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        """The chain's input of a call, the call's side values put where the stages read them."""
        if self._call is not None:
            return self._call.bind(args, kwargs)
        if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
            raise TypeError(f"{type(self.model).__name__} was planned for one input tensor; give it one, or plan "
                            "it with the sample as the tuple or dict of tensors it takes")
        return args[0]

    # --- planning ------------------------------------------------------------------------------
    def _ensure_plan(self, args: tuple[Any, ...], kwargs: dict[str, Any], target: torch.Tensor | None) -> None:
        key = _input_key(args, kwargs)
        if key == self._input_key:
            return
        if key in self._plans:
            self._use(key)
            return
        log.warning("Checkpointed: input %s differs from the planned %s; profiling and planning again",
                    _describe(key), _describe(self._input_key))
        batch = flat_inputs(args, kwargs)[0].shape[0]
        self._replan(args, kwargs, target if target is not None else _resize_batch(self._example_target, batch))

    def _replan(self, args: tuple[Any, ...], kwargs: dict[str, Any], target: torch.Tensor | None,
                chain: Chain | None = None) -> None:
        """Profile on the call ``args``, ``kwargs`` (train mode; RNG, BN statistics and ``.grad`` untouched), unless
        ``chain`` is given, and plan."""
        captured = exported_for(self._stages)
        if captured is not None and captured != input_shapes(args, kwargs):
            # NOTE [ Exported stages ] in models/traced.py: captured for one input shape
            self._stages = training_stages(self.model, self._loss_fn, sample=kwargs or args)
            self._call = model_call(self._stages)
        sample = self._bind(args, kwargs)
        if chain is None:
            chain = self._profile(self._stages, sample, target)
        elif chain.length != len(self._stages):
            raise ValueError(f"the chain has {chain.length} stages but {type(self.model).__name__} has "
                             f"{len(self._stages)} (its stages and the loss): profile this model")
        chain = self._stepped(chain, self._stages)
        stages, chosen, block = self._stages, None, None
        if self._blocks:
            twin_stages = self.twin_stages(sample)
            segmented = [isinstance(stage, SegmentedStage) for stage in twin_stages]
            if any(segmented):
                twins = self._stepped(self._twins or self._profile(twin_stages, sample, target), twin_stages)
                self._twins = None
                block = plan_blocks(chain, twins, segmented, **self._request)
                stages = [t if use else s for s, t, use in zip(self._stages, twin_stages, block.inside, strict=True)]
                chosen, chain = block.plan, block.chain
        if chosen is None:
            chosen = plan(chain, **self._request)
        key = _input_key(args, kwargs)
        self._plans[key] = (chain, chosen, Executor(stages, chosen.schedule, chain), block, self._call)
        self._use(key)
        log.info("Checkpointed %s: %s schedule, predicted peak %d bytes, recompute factor %.3f",
                 chain.name, chosen.strategy, chosen.predicted_peak_bytes, chosen.recompute_factor)

    @property
    def predicted_tracked_peak_bytes(self) -> int:
        """The plan's peak as :class:`~edgetrain.profile.LiveBytesTracker` counts a step: without the kernels'
        scratch, which only the allocator sees (NOTE [ A kernel's scratch in the plan ] in chain.py)."""
        return simulate(self.chain.without_scratch(), self.plan.schedule).peak_bytes

    def _stepped(self, chain: Chain, stages: list[nn.Module]) -> Chain:
        """``chain`` of ``stages`` as this wrapper's step runs it: with the optimizer in the backward where it is."""
        return chain if self._stepper is None else chain.with_step_in_backward(shared_gradient_bytes(stages))

    def twin_stages(self, sample: torch.Tensor) -> list[nn.Module]:
        """The training stages with each coarse traced stage segmented for ``sample``'s sizes (the loss last)."""
        return [*segmented_stages(self._stages[:-1], sample.detach()), self._stages[-1]]

    def _profile(self, stages: list[nn.Module], sample: torch.Tensor, target: torch.Tensor | None) -> Chain:
        # Profile what training runs (dropout, batch statistics), whatever mode the model is in; the stages
        # themselves where they are not the model's own (segmented twins, compiled stages, the stages of a model's own
        # call, whose side values only they read).
        own = stages is self._stages and not self._compile_stages and self._call is None
        model = self.model if own else nn.Sequential(*stages[:-1])
        paused = self._stepper.paused() if self._stepper is not None else contextlib.nullcontext()
        with training_mode(self.model), _forked_rng(sample.device), _preserved_grads(self.model), paused:
            chain = profile(model, sample.detach(), target, loss_fn=self._loss_fn, optimizer=self._optimizer,
                            measure_time=self._measure_time, step_in_backward=self._stepper is not None,
                            cache=self._profile_cache)
        if self._call is None:
            return chain
        # the stages profiled apart from the model: its weights that no stage holds are weights all the same
        return dataclasses.replace(chain, buffer_bytes=chain.buffer_bytes + _unstaged_bytes(self.model, stages))

    def _use(self, key: _InputKey) -> None:
        """Switch to the plan of an input already seen (a smaller last batch of every epoch, say)."""
        self.chain, self.plan, self._executor, self.block_plan, self._call = self._plans[key]
        self._input_key = key

    # --- the wrapped model's state -------------------------------------------------------------
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's state dict (same keys), so checkpoints load into the bare model."""
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)


def _unstaged_bytes(model: nn.Module, stages: list[nn.Module]) -> int:
    """The bytes of ``model``'s parameters and buffers that no stage holds: a buffer only the side values read (a
    position index), one this call does not read (the default token types, where the call gives its own)."""
    held = {storage_key(t) for stage in stages for t in (*stage.parameters(), *stage.buffers())}
    return storage_bytes(t for t in (*model.parameters(), *model.buffers()) if storage_key(t) not in held)


def _input_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _InputKey:
    """What a plan holds for: every input tensor's shape, dtype and device, by its place in the call."""
    flat, spec = pytree.tree_flatten((args, kwargs))
    return str(spec), tuple((tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else (repr(t),)
                            for t in flat)


def _describe(key: _InputKey) -> str:
    return ", ".join(f"{list(leaf[0])} {leaf[1]} on {leaf[2]}" if len(leaf) == 3 else str(leaf[0]) for leaf in key[1])


def _resize_batch(target: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    """Example labels for another batch size: the first ``batch`` of them, repeated if too few."""
    if target is None or target.dim() == 0:
        return target
    index = torch.arange(batch, device=target.device) % target.shape[0]
    return target[index]


@contextlib.contextmanager
def _preserved_grads(model: nn.Module) -> Iterator[None]:
    """Profiling resets ``.grad``; keep what a gradient-accumulating loop has gathered so far."""
    grads = [(p, p.grad) for p in model.parameters()]
    try:
        yield
    finally:
        for p, grad in grads:
            p.grad = grad


@contextlib.contextmanager
def _forked_rng(device: torch.device) -> Iterator[None]:
    """Profiling draws dropout masks: keep the caller's random stream as if it never ran."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield

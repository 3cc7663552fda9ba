"""The cost model of a training step: a chain of stages with times and byte sizes.

NOTE [ The chain memory model ]
A model is a sequence of stages ``0 .. L-1``; stage ``i`` maps value ``x_i`` to ``x_{i+1}``
(``x_0`` is the input batch, the last stage is the loss). Every planner, the simulator and the
executor share this accounting, so that a schedule's predicted peak is what the executor
measures:

* ``out_bytes``   -- size of ``x_{i+1}`` (and of its gradient ``δ_{i+1}``).
* ``saved_bytes`` -- memory held after a *recorded* forward of the stage (autograd's saved
  tensors, counted with ``saved_tensors_hooks``, plus the output ``x_{i+1}``), excluding the
  stage input ``x_i``.
* ``input_saved`` / ``output_saved`` -- whether the record keeps ``x_i`` / ``x_{i+1}`` alive
  until the stage's backward. A transformer layer, for one, saves a copy of its input and not
  its LayerNorm output, so neither value outlives the next stage's forward in plain backprop.
* ``*_workspace_bytes`` -- transient memory above the steady state while an op runs
  (intermediate tensors that die before the op returns). The backward's may be negative:
  autograd frees a stage's saved tensors while it back-propagates through it, so its peak can
  stay below "state before + input gradient + parameter gradients".
* ``grad_bytes``  -- parameter gradients that the stage's backward creates (zero_grad sets
  them to ``None``, so they appear during backward and stay until the optimizer step).

Resident for the whole step: weights (parameters and buffers), optimizer state and the input
batch with its targets. The whole peak of a step is what a device's RAM has to hold.

``loss_held_bytes`` -- the loss value the step returns and its seed gradient ``δ_L`` (ones of
the loss's shape). The caller holds the loss to the step's end (through the optimizer step), and
``loss.backward()`` (a user loop, or plain backprop) holds the seed until the whole backward
returns: both outlive the loss stage's own ops, where ``out_bytes`` and the workspaces count
them. They are counted with the resident state, from the step's start: before the loss's
forward that over-counts them (a few bytes for a scalar loss), and everywhere after it is what
runs. The profiler measures them; a hand-made chain leaves them at 0.

NOTE [ A kernel's scratch in the plan ]
``*_scratch_bytes`` -- the part of each workspace that no tensor shows: buffers a kernel allocates
and frees inside one op (oneDNN's convolution reorders a 3x3 weight into a blocked copy, 9 MiB for
a 512-channel layer; its backward takes per-thread scratch). The allocator hands them out like any
tensor, so the process holds them at the op's peak; :class:`~edgetrain.profile.LiveBytesTracker`,
at the dispatcher, never sees them. The profiler measures each phase of a real-tensor stage by
the c10 allocator's records and by the tracker at once (NOTE [ One session, many windows ] in
profile/tracker.py): the workspaces are the allocator's, the scratch the difference. Every
planner plans the workspaces as they are, so a plan's peak holds for the allocator too (ResNet-18
at batch 8, 128 px: 8-10 MiB a stage; planned by the tracker alone, a plan sits 8 MiB under the
allocator's peak). ``Chain.without_scratch()`` is the chain as the tracker sees it, whose simulated peak the
tracker's measurement is checked against to the byte. The records hold only the allocations of
threads that carry the profiler's state, which the intra-op pool's workers do not: the profiler
measures bytes at one thread (times at the process's count), and a step is checked against the
records only at one thread (elsewhere the tracker against ``without_scratch()``). So at N threads
the scratch of the N-1 workers is not in a plan. On the meta device, and under a user's own
``torch.profiler`` session, scratch is 0.

``rng_state_bytes`` -- one copy of the random generators' state (NOTE [ Generator states in the
plan ] in schedule.py): what a schedule holds for each stage that draws random numbers and is
recomputed. The profiler sets it on CPU (and meta) chains; 0 leaves the states out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from ..sysutil.fileio import write_atomic

__all__ = ["StageCost", "Chain", "OPTIMIZERS", "optimizer_memory", "NOMINAL_FLOPS_PER_S"]

OPTIMIZERS = ("sgd", "adam")

# Rate that turns FLOPs into seconds when nothing is timed (meta device): only ratios of
# times matter to a planner, so any fixed rate gives the same schedules and recompute factors.
# A chain with ``meta["timed"] is False`` has stage times FLOPs / this rate.
NOMINAL_FLOPS_PER_S = 1e10

# NOTE [ The optimizer step in the backward ]
# A step that runs the optimizer after the backward holds every parameter's gradient at once: at
# its end the gradients (as many bytes as the weights) sit on top of the weights and optimizer
# state, whatever a schedule does with the activations. On a model whose weights outweigh its
# activations (MobileNetV3-Small: 9.70 MiB of gradients, the whole of inductor's
# least step peak) no schedule, ours or torch.compile's, can go below that. Updating each
# parameter as soon as autograd has accumulated its gradient, and dropping the gradient then
# (PyTorch's ``register_post_accumulate_grad_hook``, as in its "optimizer step in backward"
# recipe), keeps only the gradients of the stage whose backward runs, and of those only what one
# op has made and not yet handed over. In the chain that is a stage's backward workspace as the
# profiler measures it with each gradient dropped as made (``profile(step_in_backward=True)``,
# ``bwd_stepped_workspace_bytes``; without it, the whole-step workspace plus all the stage's
# ``grad_bytes``, an upper bound), together with one parameter's update transient (Adam's two
# temporaries, counted at the chain's largest parameter: an upper bound);
# the optimizer state stays resident. The price is the contract: no ``.grad`` outlives the
# backward, so global-norm clipping, gradient accumulation and one optimizer over the whole model
# (its ``state_dict``) are gone; each parameter has an optimizer of its own.
STEP_IN_BACKWARD = "step_in_backward"   # the chain meta key that marks the transformed chain


@dataclass(frozen=True)
class StageCost:
    """Costs of one stage of a chain. Times in seconds, sizes in bytes."""

    name: str
    fwd_time_s: float
    bwd_time_s: float
    out_bytes: int
    saved_bytes: int
    param_bytes: int = 0
    grad_bytes: int = 0
    fwd_workspace_bytes: int = 0
    rec_workspace_bytes: int = 0
    bwd_workspace_bytes: int = 0
    input_saved: bool = True
    output_saved: bool = True
    uses_rng: bool = True   # its forward draws random numbers (dropout): a recomputation replays them
    # the backward's workspace when each parameter's gradient is dropped as soon as it is accumulated (the optimizer
    # stepped in the backward), measured by profile(step_in_backward=True); None: not measured
    bwd_stepped_workspace_bytes: int | None = None
    # the part of each workspace above that kernels allocate and free inside one op, which no tensor shows
    # (NOTE [ A kernel's scratch in the plan ])
    fwd_scratch_bytes: int = 0
    rec_scratch_bytes: int = 0
    bwd_scratch_bytes: int = 0
    bwd_stepped_scratch_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("out_bytes", "saved_bytes", "param_bytes", "grad_bytes", "fwd_workspace_bytes",
                     "rec_workspace_bytes", "fwd_scratch_bytes", "rec_scratch_bytes", "bwd_scratch_bytes",
                     "bwd_stepped_scratch_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"stage {self.name!r}: {name} must be >= 0, got {getattr(self, name)}")
        if self.fwd_time_s < 0 or self.bwd_time_s < 0:
            raise ValueError(f"stage {self.name!r}: times must be >= 0")


def optimizer_memory(optimizer: str, trainable_bytes: int, largest_param_bytes: int,
                     n_param_tensors: int) -> tuple[int, int]:
    """State bytes kept across steps and transient bytes of one ``step()`` on CPU.

    SGD with momentum keeps one buffer per parameter and updates in place. Adam keeps two
    moments plus a 4-byte ``step`` tensor per parameter; its single-tensor CPU path builds
    ``denom = (exp_avg_sq.sqrt() / c).add_(eps)``, two parameter-sized temporaries at once.
    """
    if optimizer == "sgd":
        return trainable_bytes, 0
    if optimizer == "adam":
        return 2 * trainable_bytes + 4 * n_param_tensors, 2 * largest_param_bytes
    raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")


def _stepped_workspace(stage: StageCost, held: int) -> int:
    """A stage's backward workspace with its gradients dropped as they are made, ``held`` bytes of them kept: as
    measured (``bwd_stepped_workspace_bytes``), else the whole step's workspace plus every gradient the stage
    makes but the held ones, all at once (an upper bound: each is dropped once made)."""
    if stage.bwd_stepped_workspace_bytes is not None:
        return stage.bwd_stepped_workspace_bytes
    return stage.bwd_workspace_bytes + stage.grad_bytes - held


@dataclass(frozen=True)
class Chain:
    """A model's training step as a chain of :class:`StageCost` records plus resident memory.

    Example:
        >>> chain = Chain.uniform(10)
        >>> chain.length, chain.stages[0].out_bytes
        (10, 1)
    """

    stages: tuple[StageCost, ...]
    input_bytes: int
    buffer_bytes: int = 0
    optimizer: str = "sgd"
    optimizer_state_bytes: int = 0
    optimizer_workspace_bytes: int = 0
    largest_param_bytes: int = 0
    n_param_tensors: int = 0
    name: str = ""
    meta: dict[str, object] = field(default_factory=dict, compare=False)
    loss_held_bytes: int = 0
    rng_state_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a chain needs at least one stage")
        object.__setattr__(self, "stages", tuple(self.stages))

    @property
    def length(self) -> int:
        return len(self.stages)

    @property
    def weights_bytes(self) -> int:
        """Parameters and buffers (e.g. BatchNorm running statistics); ``buffer_bytes`` also holds the
        parameters no stage uses in training (YOLOv8's fixed DFL convolution, used at inference)."""
        return sum(s.param_bytes for s in self.stages) + self.buffer_bytes

    @property
    def gradients_bytes(self) -> int:
        return sum(s.grad_bytes for s in self.stages)

    @property
    def resident_bytes(self) -> int:
        """Held for the whole step whatever the schedule: weights, optimizer state, input batch, and the
        loss with its seed gradient (``loss_held_bytes``; NOTE [ The chain memory model ])."""
        return self.resident_state_bytes + self.input_bytes

    @property
    def resident_state_bytes(self) -> int:
        """``resident_bytes`` but the input batch: what the simulator adds to the values a step holds,
        among which the batch ``x_0`` is one."""
        return self.weights_bytes + self.optimizer_state_bytes + self.loss_held_bytes

    @property
    def between_steps_bytes(self) -> int:
        """``resident_bytes`` but the loss held: what lives between two steps of a loop that lets each step's loss
        go (the c10 allocator's records of such a loop count the loss and its seed inside the step). A step's
        peak *above* this is the share to set against one measured so
        (``runtime.compiled.measured_step_peak_bytes``)."""
        return self.resident_bytes - self.loss_held_bytes

    @property
    def value_bytes(self) -> tuple[int, ...]:
        """Size of ``x_0 .. x_L``: the input batch then each stage's output."""
        return (self.input_bytes, *(s.out_bytes for s in self.stages))

    @property
    def rng_reserve_bytes(self) -> int:
        """The most generator-state bytes any schedule holds at once: one state per stage that draws random
        numbers, and the copy a replay takes (NOTE [ Generator states in the plan ] in schedule.py). Planners
        whose own model leaves the states out plan this much below a budget."""
        drawing = sum(s.uses_rng for s in self.stages)
        return (drawing + 1) * self.rng_state_bytes if drawing else 0

    @property
    def compute_time_s(self) -> float:
        """Time of a step without recomputation: every forward and backward once."""
        return sum(s.fwd_time_s + s.bwd_time_s for s in self.stages)

    def with_optimizer(self, optimizer: str) -> Chain:
        """The same chain with the resident state and step transient of another optimizer."""
        if self.meta.get(STEP_IN_BACKWARD):
            raise ValueError("this chain steps its optimizer in the backward (its gradients are workspace): "
                             "choose the optimizer on the chain before with_step_in_backward()")
        state, workspace = optimizer_memory(optimizer, self.gradients_bytes, self.largest_param_bytes,
                                            self.n_param_tensors)
        return replace(self, optimizer=optimizer, optimizer_state_bytes=state,
                       optimizer_workspace_bytes=workspace)

    def with_step_in_backward(self, shared_grad_bytes: Sequence[int] | None = None) -> Chain:
        """The chain of a step whose optimizer updates each parameter as soon as its gradient is made
        (NOTE [ The optimizer step in the backward ]): a stage's gradients become backward workspace, but
        ``shared_grad_bytes[i]`` of stage ``i``'s, the gradients of parameters that earlier stages share,
        which stay held until those stages' backwards have added to them
        (:func:`edgetrain.runtime.step_in_backward.shared_gradient_bytes`)."""
        if self.meta.get(STEP_IN_BACKWARD):
            raise ValueError("this chain already steps its optimizer in the backward")
        shared = list(shared_grad_bytes or [0] * self.length)
        if len(shared) != self.length or any(not 0 <= n <= s.grad_bytes
                                             for n, s in zip(shared, self.stages, strict=False)):
            raise ValueError(f"shared_grad_bytes must give each of the {self.length} stages at most its grad_bytes, "
                             f"got {shared}")
        update = self.optimizer_workspace_bytes   # one parameter's update at a time: at most the largest's
        stages = tuple(replace(s, grad_bytes=held, bwd_workspace_bytes=_stepped_workspace(s, held)
                               + (update if s.grad_bytes or s.param_bytes else 0),
                               bwd_scratch_bytes=s.bwd_stepped_scratch_bytes if s.bwd_stepped_workspace_bytes
                               is not None else s.bwd_scratch_bytes)
                       for s, held in zip(self.stages, shared, strict=True))
        return replace(self, stages=stages, optimizer_workspace_bytes=0, meta={**self.meta, STEP_IN_BACKWARD: True})

    def without_scratch(self) -> Chain:
        """The chain as :class:`~edgetrain.profile.LiveBytesTracker` sees a step: every workspace less its kernels'
        scratch (NOTE [ A kernel's scratch in the plan ]). A schedule's peak on it is what the tracker measures."""
        stages = tuple(replace(s, fwd_workspace_bytes=s.fwd_workspace_bytes - s.fwd_scratch_bytes,
                               rec_workspace_bytes=s.rec_workspace_bytes - s.rec_scratch_bytes,
                               bwd_workspace_bytes=s.bwd_workspace_bytes - s.bwd_scratch_bytes,
                               bwd_stepped_workspace_bytes=None if s.bwd_stepped_workspace_bytes is None
                               else s.bwd_stepped_workspace_bytes - s.bwd_stepped_scratch_bytes,
                               fwd_scratch_bytes=0, rec_scratch_bytes=0, bwd_scratch_bytes=0,
                               bwd_stepped_scratch_bytes=0)
                       for s in self.stages)
        return replace(self, stages=stages)

    @classmethod
    def uniform(cls, length: int, *, fwd_time_s: float = 1.0, bwd_time_s: float = 1.0,
                act_bytes: int = 1, saved_bytes: int | None = None, param_bytes: int = 0,
                name: str = "uniform") -> Chain:
        """A homogeneous chain: every stage has the same costs (unit costs by default).

        With the defaults a step without recomputation takes ``2 * length`` time units, the
        convention of Griewank's Revolve and of the founding paper's recompute factor.
        """
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        stage = StageCost(name="layer", fwd_time_s=fwd_time_s, bwd_time_s=bwd_time_s,
                          out_bytes=act_bytes, saved_bytes=act_bytes if saved_bytes is None else saved_bytes,
                          param_bytes=param_bytes, grad_bytes=param_bytes)
        return cls(stages=tuple(replace(stage, name=f"layer{i}") for i in range(length)),
                   input_bytes=act_bytes, name=name)

    # --- persistence -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["version"] = 1
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Chain:
        fields = dict(data)
        fields.pop("version", None)
        stages = tuple(StageCost(**s) for s in cast("list[dict[str, Any]]", fields.pop("stages")))
        return cls(stages=stages, **fields)  # type: ignore[arg-type]

    def save(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Chain:
        return cls.from_dict(json.loads(Path(path).read_text()))

"""Training memory of a zoo model at any batch and size, estimated on the meta device (no allocation)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from ..core.chain import Chain
from ..errors import EdgetrainError
from .cache import default_profile_cache

if TYPE_CHECKING:
    from ..devices import Device
from ..core.schedule import keep_all
from ..core.simulator import simulate
from ..models import check_input, get_model_spec
from ..models.update import apply_update, parse_update
from .profiler import profile

__all__ = ["MemoryEstimate", "estimate_memory", "chain_for"]


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak of a plain training step and what it is made of at the peak instant.

    ``activations_bytes`` is everything that is not weights, parameter gradients or optimizer
    state: the input batch, saved activations, activation gradients and transient workspace.
    ``gradients_bytes`` are the parameter gradients alive at the peak (all of them when the
    peak is the optimizer step).
    """

    model: str
    batch: int
    size: int
    optimizer: str
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    total_bytes: int
    chain: Chain = field(repr=False, compare=False)

    def fit(self, device: Device | None) -> dict[str, object]:
        """``device_memory_bytes``, ``fits`` and ``margin_bytes`` (None without a device)."""
        if device is None or device.memory_bytes is None:
            return {"device": device.name if device else None, "device_memory_bytes": None, "fits": None,
                    "margin_bytes": None}
        margin = device.memory_bytes - self.total_bytes
        return {"device": device.name, "device_memory_bytes": device.memory_bytes, "fits": margin >= 0,
                "margin_bytes": margin}

    def to_dict(self, device: Device | None = None) -> dict[str, object]:
        return {"model": self.model, "batch": self.batch, "size": self.size, "optimizer": self.optimizer,
                "update": self.chain.meta.get("update", "all"), "weights_bytes": self.weights_bytes,
                "gradients_bytes": self.gradients_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
                "total_bytes": self.total_bytes, **self.fit(device)}


def chain_for(model: str, batch: int, size: int, *, optimizer: str = "sgd", num_classes: int | None = None,
              device: str = "meta", update: str = "all") -> Chain:
    """The chain of a zoo model: sizes exact, times from FLOPs.

    On the meta device (the default) nothing is allocated. On ``"cpu"`` the model is built (weights from seed 0;
    the caller's generator is left as it was) and profiled on real tensors, so the chain carries the scratch that this
    machine's kernels allocate inside an op (NOTE [ A kernel's scratch in the plan ] in chain.py): what a run here
    will use, and what a test's budget measured here must clear. ``update``: the parameters that train (NOTE
    [ Update schemes ] in ``models/update.py``), recorded in ``chain.meta["update"]``.
    """
    scheme = parse_update(update)
    spec = get_model_spec(model)
    check_input(spec, batch, size)
    sample = spec.example_input(batch, size, device=device)
    target = spec.example_target(batch, device=device, num_classes=num_classes)
    try:
        with torch.random.fork_rng(devices=[]):   # the weights' init and the profiled dropouts draw
            torch.manual_seed(0)
            with torch.device(device):
                net = spec.build(num_classes)
            net.train()
            apply_update(net, scheme)
            chain = profile(net, sample, target, optimizer=optimizer, measure_time=False,
                            cache=default_profile_cache())
    except ValueError as exc:
        if "more than 1 value per channel" not in str(exc):
            raise
        raise EdgetrainError(f"{model} cannot train on batch {batch} at size {size}: BatchNorm would see a "
                             "single value per channel (PyTorch refuses); use a batch of at least 2 or a larger "
                             "size") from None
    return replace(chain, name=model, meta={**chain.meta, "update": scheme.text})


def estimate_memory(model: str, batch: int, size: int, *, optimizer: str = "sgd",
                    num_classes: int | None = None, update: str = "all") -> MemoryEstimate:
    """Estimate the peak memory of one plain training step of zoo ``model``.

    Example:
        >>> estimate_memory("resnet50", batch=8, size=500).total_bytes
    """
    chain = chain_for(model, batch, size, optimizer=optimizer, num_classes=num_classes, update=update)
    stats = simulate(chain, keep_all(chain.length))
    fixed = chain.weights_bytes + chain.optimizer_state_bytes + stats.peak_grad_bytes
    return MemoryEstimate(model=model, batch=batch, size=size, optimizer=optimizer,
                          weights_bytes=chain.weights_bytes, gradients_bytes=stats.peak_grad_bytes,
                          optimizer_bytes=chain.optimizer_state_bytes, activations_bytes=stats.peak_bytes - fixed,
                          total_bytes=stats.peak_bytes, chain=chain)

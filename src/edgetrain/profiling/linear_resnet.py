"""LinearResNet: the founding paper's homogeneous stand-in for ResNet-x, as a chain of costs.

Kukreja et al. (PAISE 2019, §VI) analyse checkpointing on a "linear homogeneous network built
by analogy to ResNet-x": the same weight memory as ResNet-x, ``x`` identical layers, each with
an activation of ResNet-x's total activation divided by ``x``, and unit forward and backward
cost, so a step without recomputation costs ``2x`` and the recompute factor is
``time / 2x``. It exists only as a cost model (there is no network to run), so it is a
:class:`~edgetrain.core.chain.Chain`, built from our estimator's measurement of the real ResNet
(hence here, beside the estimator, and not in ``models``, which the estimator reads).
Only weights and activations are counted, as in the paper: no gradients, no optimizer state.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.chain import Chain
from ..errors import EdgetrainError
from .estimate import chain_for

__all__ = ["linear_resnet", "linear_resnet_from_total", "LINEAR_RESNET_DEPTHS"]

LINEAR_RESNET_DEPTHS = (18, 34, 50, 101, 152)


def linear_resnet(depth: int, batch: int = 1, image_size: int = 224) -> Chain:
    """The LinearResNet-``depth`` chain for a batch and image size.

    Example:
        >>> chain = linear_resnet(18, batch=8, image_size=500)
        >>> chain.length
        18
    """
    if depth not in LINEAR_RESNET_DEPTHS:
        raise EdgetrainError(f"LinearResNet depth must be one of {LINEAR_RESNET_DEPTHS}, got {depth}")
    resnet = chain_for(f"resnet{depth}", batch, image_size)
    total_activation = sum(stage.saved_bytes for stage in resnet.stages)
    per_layer = -(-total_activation // depth)
    chain = Chain.uniform(depth, act_bytes=per_layer, name=f"LinearResNet-{depth}")
    return replace(chain, buffer_bytes=resnet.weights_bytes,
                   meta={"batch": batch, "image_size": image_size, "resnet_activation_bytes": total_activation})


def linear_resnet_from_total(depth: int, batch: int, image_size: int, total_bytes: int) -> Chain:
    """LinearResNet-``depth`` whose weights and activations add up to ``total_bytes``, e.g. a paper's figure.

    The fixed part is ResNet-``depth``'s FP32 weights and BatchNorm buffers (our estimator's); the rest of
    ``total_bytes`` is its activation memory, split evenly over the ``depth`` layers.

    Raises:
        EdgetrainError: an unknown depth, or a total that does not exceed the weights.
    """
    if depth not in LINEAR_RESNET_DEPTHS:
        raise EdgetrainError(f"LinearResNet depth must be one of {LINEAR_RESNET_DEPTHS}, got {depth}")
    weights_bytes = chain_for(f"resnet{depth}", batch, image_size).weights_bytes
    activation = total_bytes - weights_bytes
    if activation <= 0:
        raise EdgetrainError(f"a total of {total_bytes} bytes leaves nothing for activations above ResNet-{depth}'s "
                             f"{weights_bytes} bytes of weights")
    chain = Chain.uniform(depth, act_bytes=-(-activation // depth), name=f"LinearResNet-{depth} (paper's total)")
    return replace(chain, buffer_bytes=weights_bytes,
                   meta={"batch": batch, "image_size": image_size, "total_bytes": total_bytes})

"""Profile models into chains, estimate training memory without allocating, measure real steps; LinearResNet."""

from .estimate import MemoryEstimate, chain_for, estimate_memory
from .linear_resnet import LINEAR_RESNET_DEPTHS, linear_resnet
from .measure import MeasuredStep, measure_training_step
from .profiler import profile
from .tracker import LiveBytesTracker

__all__ = ["profile", "estimate_memory", "chain_for", "MemoryEstimate", "measure_training_step", "MeasuredStep",
           "LiveBytesTracker", "linear_resnet", "LINEAR_RESNET_DEPTHS"]

"""Data-parallel training across edge nodes on torch.distributed (gloo), each node planning for its own device.

See NOTE [ Cluster step ] in :mod:`edgetrain.distributed.node`; torch.distributed is imported
inside the functions that talk to the cluster.
"""

from .batch_shares import share_weights, split_batch
from .group import ClusterEnv, ClusterError, config_hash
from .node import ClusterOptions, NodeSpec, node_speed, train_node
from .step import StepResult, cluster_step

__all__ = ["ClusterEnv", "ClusterError", "ClusterOptions", "NodeSpec", "StepResult", "cluster_step", "config_hash",
           "node_speed", "share_weights", "split_batch", "train_node"]

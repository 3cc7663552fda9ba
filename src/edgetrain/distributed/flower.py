"""Flower, imported in one place: its telemetry off before the import, and one line when it is not installed."""

from __future__ import annotations

import os

from ..errors import EdgetrainError

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # read when flwr is imported: no call home at run time
try:
    import grpc
    from flwr.client import NumPyClient, start_client
    from flwr.common import FitRes, NDArrays, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerConfig, start_server
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.strategy import FedAvg
    from flwr.server.strategy.aggregate import aggregate, weighted_loss_avg
except ImportError:
    raise EdgetrainError("federated mode needs Flower: pip install 'edgetrain[federated]' (Python 3.11 or newer)") \
        from None

__all__ = ["grpc", "NumPyClient", "start_client", "FitRes", "NDArrays", "Parameters", "Scalar",
           "ndarrays_to_parameters", "parameters_to_ndarrays", "ServerConfig", "start_server", "ClientProxy", "FedAvg",
           "aggregate", "weighted_loss_avg"]

"""The process of a federated run: ``python -m edgetrain.distributed.federated_process server|client``.

Its own module because it starts either role: the server (``federated_server``) builds on the client's module
(``federated``), so neither of them can hold the entry for both.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import EdgetrainError
from .federated import FederatedConfig, FederatedNode, run_client
from .federated_server import run_server

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    """``python -m edgetrain.distributed.federated_process server CONFIG.json`` or ``... client CONFIG.json NODE``.

    An expected failure is one line ``error: ...`` and exit status 2.
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("flwr").setLevel(logging.ERROR)  # Flower's INFO lines and its deprecation banners
    role, config = argv[0], FederatedConfig.from_json(Path(argv[1]).read_text())
    torch.set_num_threads(config.threads)
    try:
        if role == "server":
            run_server(config)
        else:
            run_client(config, FederatedNode(config, int(argv[2])))
    except EdgetrainError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        if role == "server":  # gRPC's worker threads of a server stopped mid-round would keep the process up
            os._exit(2)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Fixtures shared by the test files."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on two cores: one thread each
    torch.set_num_threads(1)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run faster on one thread, and much faster on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

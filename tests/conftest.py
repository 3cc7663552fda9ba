"""Fixtures shared by the test files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from calibration import TEST_HOST


@pytest.fixture(autouse=True)
def fixed_host_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CLI call that calibrates this machine gets :data:`TEST_HOST` instead of measuring."""
    monkeypatch.setattr("edgetrain.devices.rate.calibrate_host", lambda rounds=5: TEST_HOST)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run faster on one thread, and much faster on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

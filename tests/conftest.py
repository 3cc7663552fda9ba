"""Fixtures shared by the test files."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from calibration import TEST_HOST

from edgetrain.profiling.cache import PROFILE_CACHE_ENV
from edgetrain.profiling.host import CALIBRATION_ENV


@pytest.fixture(autouse=True)
def fixed_host_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command that calibrates this machine, in this process or a child, gets :data:`TEST_HOST`."""
    monkeypatch.setenv(CALIBRATION_ENV, f"{TEST_HOST.gemm_fp64_flops_per_s},{TEST_HOST.training_flops_per_s}")

# a profile kept by one test must not stand in for another test's measurement, here or in the commands the tests
# start; the tests of the cache give it a folder of their own
os.environ[PROFILE_CACHE_ENV] = "off"

# `make test` runs two workers on two cores: one thread each; and one thread in a single process too, where the
# allocator's records see every allocation (records_every_allocation) and plans count kernels' scratch
torch.set_num_threads(1)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # and so do the processes the tests start (`edgetrain train` ...): two workers each running a
    # two-thread child oversubscribe the cores, and OpenMP's waiting threads then slow both several-fold
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run faster on one thread, and much faster on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

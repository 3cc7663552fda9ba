"""This machine's calibration for tests (NOTE [ One time model ]).

Fixed, so that device times are exact functions of the catalog; measuring the real one takes
half a minute on a loaded machine.
"""

from __future__ import annotations

from edgetrain.costs.timemodel import HostCalibration

TEST_HOST = HostCalibration(gemm_fp64_flops_per_s=20e9, training_flops_per_s=10e9, source="fixed for the tests")

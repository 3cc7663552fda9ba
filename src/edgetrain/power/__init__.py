"""Power modes, their prediction and the advisor that picks one.

:mod:`.modes` holds the sourced nvpmodel tables and the board readers, :mod:`.control` applies a
mode with a guaranteed restore, :mod:`.predict` fits a workload's time and power over modes and
advises one, :mod:`.ground_truth` is the ground truth the advisor is scored against.
"""

from __future__ import annotations

from .control import ModeRequest, PowerControlError, PowerControlUnavailable, applied_mode, recover_pending
from .modes import PowerMode, PowerModeError, catalog_modes, modes_for_device, parse_nvpmodel_conf, read_cpu_state

__all__ = ["ModeRequest", "PowerControlError", "PowerControlUnavailable", "PowerMode", "PowerModeError",
           "applied_mode", "catalog_modes", "modes_for_device", "parse_nvpmodel_conf", "read_cpu_state",
           "recover_pending"]

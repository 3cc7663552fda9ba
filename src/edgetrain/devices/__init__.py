"""Edge devices training is planned for: a catalog of sourced figures plus ``this-machine``.

See NOTE [ Device figures and their sources ] in :mod:`edgetrain.devices.catalog` for the rules every figure
follows.
"""

from .catalog import (
    Device,
    DeviceCatalogError,
    device_names,
    devices_table,
    get_device,
    load_catalog,
    load_devices_file,
    this_machine,
    user_devices,
)

__all__ = [
    "Device",
    "DeviceCatalogError",
    "load_catalog",
    "load_devices_file",
    "get_device",
    "device_names",
    "this_machine",
    "devices_table",
    "user_devices",
]

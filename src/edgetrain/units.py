"""Byte quantities as people write them ("300MiB", "2GB") and as we print them."""

from __future__ import annotations

import math
import re

__all__ = ["parse_bytes", "format_bytes", "MAX_BYTES"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
MAX_BYTES = 2**63  # more than any address space: a typo, or 1e400
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Return a byte count from an int, a float or a string such as ``"300MiB"`` or ``"2 GB"``.

    Decimal units (kB, MB, GB) are powers of 1000, binary units (KiB, MiB, GiB) powers of 1024.

    Raises:
        ValueError: for a negative, non-finite or impossibly large amount, an unknown unit or
            text that is not a quantity.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a byte quantity: {value!r}")
    if isinstance(value, (int, float)):
        amount, factor = float(value), 1
    else:
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(f"not a byte quantity: {value!r} (try e.g. '300MiB' or '2GB')")
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}; use B, kB, MB, GB, KiB, MiB or GiB")
        amount, factor = float(match.group(1)), _UNITS[unit]
    if not math.isfinite(amount) or amount * factor >= MAX_BYTES:
        raise ValueError(f"not a byte quantity a machine can have: {value!r}")
    if amount < 0:
        raise ValueError(f"a byte quantity cannot be negative: {value!r}")
    return round(amount * factor)


def format_bytes(n_bytes: float) -> str:
    """Human-readable binary size, e.g. ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    magnitude = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(magnitude) < 1024 or unit == "GiB":
            return f"{magnitude:.0f} B" if unit == "B" else f"{magnitude:.2f} {unit}"
        magnitude /= 1024
    raise AssertionError("unreachable")

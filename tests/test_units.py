import pytest

from edgetrain import format_bytes, parse_bytes


@pytest.mark.parametrize("text, expected", [
    ("300MiB", 300 * 2**20), ("2GB", 2 * 10**9), ("2 GiB", 2 * 2**30), ("1.5kB", 1500), (4096, 4096),
    ("512", 512), ("0.5 KiB", 512),
])
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "3 parsecs", "-1MiB", True])
def test_parse_bytes_rejects_nonsense(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(bad)  # type: ignore[arg-type]


def test_format_bytes() -> None:
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(100) == "100 B"
    assert format_bytes(5 * 2**40) == "5120.00 GiB"

"""Byte counts as the plan prints them."""
from __future__ import annotations


def size(n: int | None) -> str:
    """Bytes in binary units, two decimals: "148.40 GiB", "1.50 MiB", "0 B"."""
    if n is None:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"

"""Byte sizes as people write them (``2M``, ``64KiB``, ``1048576``) and print them."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parses a size with an optional binary unit; raises ValueError otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 4096, 64K, 2M, 2MiB)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def exact(n: int, *, spelled: bool = False) -> str:
    """`n` in the largest binary unit that divides it, as an option or a policy writes
    it ("2M", "64K", "1G") or, `spelled`, as a sentence does ("2 MiB"); in bytes when
    no unit divides it."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}iB" if spelled else f"{n >> shift}{unit}"
    return f"{n} B" if spelled else str(n)


def human(n: int) -> str:
    """A short human-readable size: 512 B, 4.0 KiB, 2.0 MiB."""
    sign = "-" if n < 0 else ""
    if abs(n) < 1024:
        return f"{sign}{abs(n)} B"
    size, unit = abs(n) / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{sign}{size:.1f} {unit}"

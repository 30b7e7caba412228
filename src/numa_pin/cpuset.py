"""CPU and node list formats used by the kernel (pure functions, no I/O).

* list format: ``"0-3,8,10-11"`` (``cpulist``, ``cpuset.cpus``, ``cpuset.mems``)
* mask format: ``"ff,ffffffff"`` (``cpumap``, ``local_cpus``): comma-grouped 32-bit hex words,
  most significant word first.

Parsers raise :class:`ValueError` with the offending text; callers that know the file wrap it
in :class:`numa_pin.errors.SysfsError`.
"""

from __future__ import annotations

from collections.abc import Iterable

_MAX_ID = 1 << 20  # far above any real CPU or node id; guards against "0-999999999"


def parse_list(text: str) -> frozenset[int]:
    """Parse the kernel list format. The empty string (and whitespace) is the empty set."""
    text = text.strip()
    if not text:
        return frozenset()
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty element in list {text!r}")
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s, 10)
            hi = int(hi_s, 10) if sep else lo
        except ValueError:
            raise ValueError(f"not a number in list element {part!r}") from None
        if lo < 0 or hi < lo or hi > _MAX_ID:
            raise ValueError(f"bad range {part!r}")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def format_list(ids: Iterable[int]) -> str:
    """Format ids in the kernel list format, ranges collapsed: ``{0,1,2,5}`` -> ``"0-2,5"``."""
    items = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


def parse_mask(text: str) -> frozenset[int]:
    """Parse the comma-grouped hex mask format (``"ff,ffffffff"`` is CPUs 0-39)."""
    text = text.strip()
    if not text:
        raise ValueError("empty mask")
    value = 0
    for word in text.split(","):
        word = word.strip()
        if not word or len(word) > 8:
            raise ValueError(f"bad mask word {word!r} in {text!r}")
        try:
            value = (value << 32) | int(word, 16)
        except ValueError:
            raise ValueError(f"not hex: {word!r} in {text!r}") from None
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)



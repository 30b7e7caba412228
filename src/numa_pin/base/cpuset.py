"""CPU and node list formats used by the kernel (pure functions, no I/O).

* list format: ``"0-3,8,10-11"`` (``cpulist``, ``cpuset.cpus``, ``cpuset.mems``)
* mask format: ``"ff,ffffffff"`` (``cpumap``, ``local_cpus``): comma-grouped 32-bit hex words,
  most significant word first.

Parsers raise :class:`ValueError` with the offending text; callers that know the file wrap it
in :class:`numa_pin.errors.SysfsError`.
"""

from __future__ import annotations

from collections.abc import Iterable

from numa_pin.base.text import quote

_MAX_ID = 1 << 20  # far above any real CPU or node id; guards against "0-999999999"
#: most ids all elements of one list may name together, overlaps counted again: eight times
#: Linux's largest NR_CPUS (8192). Without a total, "0-1048576" repeated a thousand times
#: (each element within bounds) costs minutes of set building
_MAX_TOTAL = 1 << 16
_ASCII_SPACE = " \t\n\r\v\f"
_SHOWN = 60


def _number(text: str, part: str) -> int:
    digits = text.strip(_ASCII_SPACE)
    # int() would also take "1_0", "\u0663" and Unicode spaces; the kernel writes none of them
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 8:
        raise ValueError(f"not a number in list element {part[:_SHOWN]!r}")
    return int(digits)


def parse_list(text: str) -> frozenset[int]:
    """Parse the kernel list format. The empty string (and ASCII whitespace) is the empty set.

    Numbers are ASCII digits; ids above ``2**20`` and lists naming more than ``2**16`` ids in
    all (ranges summed, overlaps counted again) are refused before any set is built.

    Raises:
        ValueError: quoting the offending element.
    """
    text = text.strip(_ASCII_SPACE)
    if not text:
        return frozenset()
    ranges: list[tuple[int, int]] = []
    total = 0
    for part in text.split(","):
        if not part.strip(_ASCII_SPACE):
            raise ValueError(f"empty element in list {text[:_SHOWN]!r}")
        lo_s, sep, hi_s = part.partition("-")
        lo = _number(lo_s, part)
        hi = _number(hi_s, part) if sep else lo
        if hi < lo or hi > _MAX_ID:
            raise ValueError(f"bad range {part.strip(_ASCII_SPACE)[:_SHOWN]!r}")
        total += hi - lo + 1
        if total > _MAX_TOTAL:
            raise ValueError(f"list names more than {_MAX_TOTAL} ids in all: {text[:_SHOWN]!r}...")
        ranges.append((lo, hi))
    out: set[int] = set()
    for lo, hi in ranges:
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
            raise ValueError(f"bad mask word {quote(word)} in {quote(text)}")
        try:
            value = (value << 32) | int(word, 16)
        except ValueError:
            raise ValueError(f"not hex: {quote(word)} in {quote(text)}") from None
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)



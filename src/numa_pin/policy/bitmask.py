"""NUMA affinity masks as plain Python ints (bit *i* = NUMA node *i*). Pure functions.

Python ints have no width, so unlike kubelet's uint64 ``BitMask`` there is no 64-node limit.
Ordering follows kubelet exactly:

* ``narrower(a, b)``: fewer bits wins; equal counts compare as unsigned integers, so
  ``{1,2}`` (6) is narrower than ``{0,3}`` (9). Equal masks are not narrower than each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def from_nodes(nodes: Iterable[int]) -> int:
    mask = 0
    for n in nodes:
        if n < 0:
            raise ValueError(f"negative NUMA node id {n}")
        mask |= 1 << n
    return mask


def to_nodes(mask: int) -> frozenset[int]:
    return frozenset(bits(mask))


def bits(mask: int) -> Iterator[int]:
    """Set bits in ascending order."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def is_narrower(a: int, b: int) -> bool:
    """kubelet ``IsNarrowerThan``: fewer nodes, then smaller integer value."""
    ca, cb = a.bit_count(), b.bit_count()
    if ca != cb:
        return ca < cb
    return a < b


def format_mask(mask: int | None) -> str:
    """Human form used in messages: ``{0,2}``; ``None`` prints as ``any``."""
    if mask is None:
        return "any"
    return "{" + ",".join(str(b) for b in bits(mask)) + "}"

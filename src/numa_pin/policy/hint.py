"""Topology hints and the shapes hint providers return (pure data, no I/O).

A provider answers, per resource, with one of (kubelet semantics, see
``topology-manager.md`` §2):

* ``None`` (or the provider returns ``None``/``{}``): no preference at all;
* ``[]``: the resource cannot be satisfied anywhere ("cannot fit");
* a list of :class:`TopologyHint`;
* a :class:`CapacityFamily`: the same list, described instead of enumerated.

kubelet enumerates all ``2**N`` masks per provider. A :class:`CapacityFamily` lets a provider
describe "every mask that holds enough" in ``O(N)`` space; the merge
(:mod:`numa_pin.policy.merge`) answers exactly as if the list had been enumerated.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import combinations

from numa_pin.base.record import record
from numa_pin.policy import bitmask


class TopologyHint:
    """``(affinity, preferred)``. ``affinity`` is ``None`` ("don't care") or a set of nodes.

    The constructor accepts any iterable of node ids; ``.affinity`` reads back a
    ``frozenset[int]`` (or ``None``) and ``.mask`` the same as an int bit mask.
    An empty affinity (``frozenset()``) is distinct from ``None``: it means "no node fits".
    """

    __slots__ = ("mask", "preferred")

    mask: int | None
    preferred: bool

    def __init__(self, affinity: Iterable[int] | None, preferred: bool) -> None:
        object.__setattr__(self, "mask", None if affinity is None else bitmask.from_nodes(affinity))
        object.__setattr__(self, "preferred", bool(preferred))

    @classmethod
    def from_mask(cls, mask: int | None, preferred: bool) -> TopologyHint:
        hint = cls.__new__(cls)
        object.__setattr__(hint, "mask", mask)
        object.__setattr__(hint, "preferred", bool(preferred))
        return hint

    @property
    def affinity(self) -> frozenset[int] | None:
        return None if self.mask is None else bitmask.to_nodes(self.mask)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TopologyHint is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopologyHint):
            return NotImplemented
        return self.mask == other.mask and self.preferred == other.preferred

    def __hash__(self) -> int:
        return hash((self.mask, self.preferred))

    def __repr__(self) -> str:
        aff = None if self.mask is None else sorted(bitmask.bits(self.mask))
        return f"TopologyHint(affinity={aff}, preferred={self.preferred})"

    def __str__(self) -> str:
        return f"{bitmask.format_mask(self.mask)}{'' if self.preferred else ' (not preferred)'}"


@record
class CapacityFamily:
    """An implicit hint list: every mask ``M`` over ``nodes`` such that

    * ``M`` contains every node of ``must_include`` (a bit mask), and
    * for every dimension ``t``: ``sum(capacity[i][t] for nodes[i] in M) >= need[t]``.

    A hint is preferred iff ``popcount(M) == min_affinity``, where ``min_affinity`` is kubelet's
    ``minAffinitySize`` (computed by the provider on the *empty* machine). The family is
    upward-closed: adding nodes to a member keeps it a member.

    ``materialize()`` gives the exact list kubelet would build (sizes ascending,
    lexicographic within a size); it costs ``2**N`` and exists for small machines and tests.
    """

    nodes: tuple[int, ...]
    capacity: tuple[tuple[int, ...], ...]
    need: tuple[int, ...]
    min_affinity: int
    must_include: int = 0

    def __post_init__(self) -> None:
        if len(self.capacity) != len(self.nodes):
            raise ValueError("capacity needs one vector per node")
        dims = len(self.need)
        if any(len(c) != dims for c in self.capacity):
            raise ValueError("capacity vectors and need differ in length")

    def contains(self, mask: int) -> bool:
        """Is ``mask`` a member (ignoring bits of nodes not in ``nodes``)?"""
        if mask & self.must_include != self.must_include:
            return False
        totals = [0] * len(self.need)
        for i, node in enumerate(self.nodes):
            if mask >> node & 1:
                for t, c in enumerate(self.capacity[i]):
                    totals[t] += c
        return all(tot >= n for tot, n in zip(totals, self.need))

    def iter_masks(self) -> Iterator[int]:
        """All member masks in kubelet's enumeration order."""
        for size in range(1, len(self.nodes) + 1):
            for combo in combinations(self.nodes, size):
                mask = bitmask.from_nodes(combo)
                if self.contains(mask):
                    yield mask

    def materialize(self) -> list[TopologyHint]:
        return [TopologyHint.from_mask(m, m.bit_count() == self.min_affinity) for m in self.iter_masks()]


#: what one resource maps to in a provider's answer
ResourceHints = Sequence[TopologyHint] | CapacityFamily | None
#: one provider's answer: ``None``/``{}`` for "no preference", else per-resource hints
ProviderHints = dict[str, ResourceHints] | None

"""Shared pieces of the Topology Manager policies (pure: no I/O, no logging).

* :class:`NumaInfo`: the machine as the merge sees it (kubelet ``NUMAInfo``).
* :func:`flatten_providers`: kubelet ``filterProvidersHints`` (``topology-manager.md`` §2),
  keeping :class:`~numa_pin.policy.hint.CapacityFamily` lists unexpanded.
* :func:`filter_single_numa`: kubelet ``filterSingleNumaHints`` (§5).
* :class:`Ranker`: the order kubelet's ``HintMerger`` fold induces (§4), as sort keys.
* :class:`Policy`: the interface the four policy modules implement.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence

from numa_pin.base.record import field, record
from numa_pin.errors import PolicyError, TopologyError
from numa_pin.policy import bitmask
from numa_pin.policy.hint import CapacityFamily, ProviderHints, TopologyHint
from numa_pin.policy.options import PolicyOptions

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import ClassVar

#: one flattened per-resource list: explicit hints, or a family standing for its materialized list
HintList = list[TopologyHint] | CapacityFamily

#: distances above this are refused, so every average is computed exactly in float64
MAX_DISTANCE = 2**32 - 1


@record
class NumaInfo:
    """The NUMA nodes of the machine and, optionally, their distance matrix.

    ``nodes`` is sorted and duplicate-free. ``matrix[a][b]`` is the distance from the node at
    position ``a`` to the node at position ``b`` of ``nodes``; a row is ``None`` where the
    machine did not report one. Build it with :meth:`build`.
    """

    nodes: tuple[int, ...]
    matrix: tuple[tuple[int, ...] | None, ...] | None = None
    default_mask: int = field(init=False, repr=False, compare=False)
    _pos: dict[int, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if list(self.nodes) != sorted(set(self.nodes)):
            raise TopologyError(f"NUMA node ids must be sorted and unique, got {list(self.nodes)}")
        if any(n < 0 for n in self.nodes):
            raise TopologyError(f"negative NUMA node id in {list(self.nodes)}")
        if self.matrix is not None and len(self.matrix) != len(self.nodes):
            raise TopologyError("the distance matrix needs one row per NUMA node")
        object.__setattr__(self, "default_mask", bitmask.from_nodes(self.nodes))
        object.__setattr__(self, "_pos", {n: i for i, n in enumerate(self.nodes)})

    @classmethod
    def build(
        cls, nodes: Iterable[int], distances: Mapping[int, Sequence[int]] | None = None
    ) -> NumaInfo:
        """``distances`` maps a node id to its row: the distance to each node of ``sorted(nodes)``,
        by position (with nodes ``0..N-1`` that is kubelet's ``d[i][j]``).

        Raises :class:`TopologyError` for duplicate/negative ids or malformed distance values.
        A missing or short row is not an error here: see :meth:`missing_distances`.
        """
        ordered = sorted(nodes)
        if len(set(ordered)) != len(ordered):
            raise TopologyError(f"duplicate NUMA node id in {ordered}")
        if distances is None:
            return cls(tuple(ordered), None)
        rows: list[tuple[int, ...] | None] = []
        for node in ordered:
            row = distances.get(node)
            if row is None or len(row) < len(ordered):
                rows.append(None)
                continue
            for value in row[: len(ordered)]:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TopologyError(f"NUMA node {node}: distance {value!r} is not an integer")
                if not 0 <= value <= MAX_DISTANCE:
                    raise TopologyError(f"NUMA node {node}: distance {value} is out of range")
            rows.append(tuple(row[: len(ordered)]))
        return cls(tuple(ordered), tuple(rows))

    def missing_distances(self) -> list[int]:
        """Nodes without a complete distance row (all of them when no matrix was given)."""
        if self.matrix is None:
            return list(self.nodes)
        return [n for n, row in zip(self.nodes, self.matrix) if row is None]

    def require_distances(self) -> None:
        """Raise :class:`PolicyError` unless every node has a complete distance row."""
        missing = self.missing_distances()
        if missing:
            raise PolicyError(  # kubelet's words first: what users search for
                "cannot discover NUMA topology: error getting NUMA distances for node(s) "
                f"{','.join(str(n) for n in missing)} (prefer-closest-numa-nodes needs NUMA distances)"
            )

    def distance(self, a: int, b: int) -> int:
        """Distance from node ``a`` to node ``b`` (both must be machine nodes with distances)."""
        assert self.matrix is not None
        row = self.matrix[self._pos[a]]
        assert row is not None
        return row[self._pos[b]]

    def average_distance(self, mask: int) -> float:
        """kubelet ``CalculateAverageFor``: sum over all ordered pairs of set bits (``i == j``
        included) divided by ``count**2``, in float64; ``0.0`` for an empty mask.

        Distances are integers below ``2**32`` so the sum is exact and this equals Go's
        left-to-right float64 accumulation bit for bit.
        """
        nodes = list(bitmask.bits(mask))
        if not nodes:
            return 0.0
        total = 0
        for a in nodes:
            for b in nodes:
                total += self.distance(a, b)
        return float(total) / float(len(nodes) * len(nodes))


def flatten_providers(providers_hints: Sequence[ProviderHints] | None) -> list[HintList]:
    """kubelet ``filterProvidersHints`` (§2), families kept as they are.

    Per provider: ``None``/``{}`` -> ``[{nil, true}]``; per resource: ``None`` ->
    ``[{nil, true}]``, ``[]`` -> ``[{nil, false}]``, a list -> itself, a family -> itself.

    Raises :class:`PolicyError` when a provider's answer is not one of these shapes.
    """
    lists: list[HintList] = []
    for index, hints in enumerate(providers_hints or ()):
        if not hints:
            lists.append([TopologyHint(None, True)])
            continue
        if not isinstance(hints, Mapping):
            raise PolicyError(f"provider {index}: hints must be a mapping of resource to hints")
        for resource, value in hints.items():
            if value is None:
                lists.append([TopologyHint(None, True)])
            elif isinstance(value, CapacityFamily):
                lists.append(value)
            else:
                items = list(value)
                for item in items:
                    if not isinstance(item, TopologyHint):
                        raise PolicyError(
                            f"provider {index}: resource {resource!r}: {item!r} is not a TopologyHint"
                        )
                lists.append(items if items else [TopologyHint(None, False)])
    return lists


def filter_single_numa(lists: Sequence[HintList]) -> list[list[TopologyHint]] | None:
    """kubelet ``filterSingleNumaHints`` (§5): keep preferred don't-cares and preferred
    single-node hints. Returns ``None`` when some list ends up empty (kubelet's nil list: the
    cartesian product, hence the merge, has no permutation at all).

    A family's filtered list is its preferred singletons, present only when
    ``min_affinity == 1``, in ``nodes`` order (the order of its materialized list).
    """
    out: list[list[TopologyHint]] = []
    for lst in lists:
        if isinstance(lst, CapacityFamily):
            kept = []
            if lst.min_affinity == 1:
                kept = [
                    TopologyHint.from_mask(1 << n, True) for n in lst.nodes if lst.contains(1 << n)
                ]
        else:
            kept = [
                h for h in lst if h.preferred and (h.mask is None or h.mask.bit_count() == 1)
            ]
        if not kept:
            return None
        out.append(kept)
    return out


class Ranker:
    """The fold order of kubelet's ``HintMerger`` as sort keys (smaller key = better hint).

    ``CompareMasks`` between two different masks is a strict total order: narrowest is
    ``(count, int)``; closest is ``(count, average distance, int)``. Among preferred hints the
    fold keeps the ``CompareMasks`` winner; among non-preferred ones it ranks by the count's
    distance to ``B`` (``BestNonPreferredAffinityCount``) first, then ``CompareMasks``.
    """

    def __init__(self, info: NumaInfo, closest: bool) -> None:
        self.info = info
        self.closest = closest
        self._avg: dict[int, float] = {}
        if closest:
            info.require_distances()

    def average(self, mask: int) -> float:
        value = self._avg.get(mask)
        if value is None:
            value = self.info.average_distance(mask)
            self._avg[mask] = value
        return value

    def tie(self, mask: int) -> tuple[float, int] | tuple[int]:
        """Order among masks of equal count."""
        if self.closest:
            return (self.average(mask), mask)
        return (mask,)

    def preferred_key(self, mask: int) -> tuple[object, ...]:
        return (mask.bit_count(), *self.tie(mask))

    def nonpreferred_key(self, mask: int, best_count: int) -> tuple[object, ...]:
        """count == B first; then counts below B, larger first; then counts above B, smaller first."""
        count = mask.bit_count()
        if count == best_count:
            head: tuple[int, int] = (0, 0)
        elif count < best_count:
            head = (1, -count)
        else:
            head = (2, count)
        return (*head, *self.tie(mask))


class Policy(abc.ABC):
    """A Topology Manager policy: ``merge`` the providers' hints, then ``can_admit`` the result."""

    #: the kubelet policy name
    name: ClassVar[str]

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options if options is not None else PolicyOptions()

    @abc.abstractmethod
    def merge(self, providers_hints: Sequence[ProviderHints] | None, numa_info: NumaInfo) -> TopologyHint:
        """The merged hint for one container (or pod). Raises :class:`PolicyError` on malformed
        provider answers, or when prefer-closest-numa-nodes lacks distances."""

    @abc.abstractmethod
    def can_admit(self, hint: TopologyHint) -> bool:
        """kubelet ``canAdmitPodResult``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"

"""A literal, brute-force reimplementation of kubelet's Topology Manager merge: the test oracle.

Follows ``topology-manager.md`` step by step and shares no merge code with
:mod:`numa_pin.policy.merge`:

* ``filterProvidersHints`` (§2), :class:`CapacityFamily` answers materialized first;
* the cartesian product in kubelet's order, ``mergePermutation`` (§3);
* the ``HintMerger`` fold with ``BestNonPreferredAffinityCount`` and
  ``CompareMasks``/``Narrowest``/``Closest`` (§4), the default hint ``{all nodes, false}``;
* the single-numa-node filter and nil result (§5).

Cost is the product of the list lengths: use it on small machines and in tests only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product

from numa_pin.base import names
from numa_pin.errors import PolicyError
from numa_pin.policy.hint import CapacityFamily, ProviderHints, TopologyHint

_POLICIES = names.POLICIES


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _narrower(a: int, b: int) -> bool:
    """``IsNarrowerThan``: fewer bits, then the smaller unsigned integer."""
    if a.bit_count() != b.bit_count():
        return a.bit_count() < b.bit_count()
    return a < b


def filter_providers_hints(providers_hints: Sequence[ProviderHints] | None) -> list[list[TopologyHint]]:
    """kubelet ``filterProvidersHints``; families are materialized (``[]`` when nothing fits)."""
    out: list[list[TopologyHint]] = []
    for hints in providers_hints or ():
        if not hints:
            out.append([TopologyHint(None, True)])
            continue
        for resource in hints:
            value = hints[resource]
            if value is None:
                out.append([TopologyHint(None, True)])
                continue
            if isinstance(value, CapacityFamily):
                value = value.materialize()
            if len(value) == 0:
                out.append([TopologyHint(None, False)])
                continue
            out.append(list(value))
    return out


def filter_single_numa_hints(lists: list[list[TopologyHint]]) -> list[list[TopologyHint]]:
    """kubelet ``filterSingleNumaHints``; an emptied list stays empty (Go's nil slice)."""
    out = []
    for hints in lists:
        kept = []
        for hint in hints:
            if hint.mask is None and hint.preferred:
                kept.append(hint)
            if hint.mask is not None and hint.mask.bit_count() == 1 and hint.preferred:
                kept.append(hint)
        out.append(kept)
    return out


def merge_permutation(default: int, permutation: Sequence[TopologyHint]) -> TopologyHint:
    """kubelet ``mergePermutation``: AND of the non-nil affinities with the default; preferred
    iff every hint is preferred and every non-nil RAW affinity equals the first one."""
    preferred = True
    affinities: list[int] = []
    for hint in permutation:
        if hint.mask is not None:
            affinities.append(hint.mask)
            if hint.mask != affinities[0]:
                preferred = False
        if not hint.preferred:
            preferred = False
    merged = default
    for mask in affinities:
        merged &= mask
    return TopologyHint.from_mask(merged, preferred)


def max_of_min_affinity_counts(lists: list[list[TopologyHint]]) -> int:
    """kubelet ``maxOfMinAffinityCounts`` over raw masks; all-nil and empty lists are skipped."""
    best = 0
    for hints in lists:
        narrowest = None
        for hint in hints:
            if hint.mask is None:
                continue
            if narrowest is None or _narrower(hint.mask, narrowest):
                narrowest = hint.mask
        if narrowest is not None and narrowest.bit_count() > best:
            best = narrowest.bit_count()
    return best


class HintMerger:
    """kubelet ``HintMerger`` (§4)."""

    def __init__(
        self,
        nodes: list[int],
        lists: list[list[TopologyHint]],
        closest: bool,
        distances: Mapping[int, Sequence[int]] | None,
    ) -> None:
        self.nodes = nodes
        self.default = 0
        for n in nodes:
            self.default |= 1 << n
        self.lists = lists
        self.closest = closest
        self.distances = distances
        self.best_non_preferred_count = max_of_min_affinity_counts(lists)

    def _average(self, mask: int) -> float:
        """``CalculateAverageFor``: float64 accumulation over ordered pairs, divided by count."""
        if mask == 0:
            return 0.0
        assert self.distances is not None
        position = {n: i for i, n in enumerate(self.nodes)}
        total = 0.0
        count = 0.0
        for a in _bits(mask):
            for b in _bits(mask):
                total += float(self.distances[a][position[b]])
                count += 1.0
        return total / count

    def _closest(self, m1: int, m2: int) -> int:
        if m1.bit_count() != m2.bit_count():
            return m1 if _narrower(m1, m2) else m2
        d1, d2 = self._average(m1), self._average(m2)
        if d1 == d2:
            return m1 if m1 < m2 else m2
        return m1 if d1 < d2 else m2

    def compare_masks(self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        assert current.mask is not None and candidate.mask is not None
        if current.mask == candidate.mask:
            return current
        if self.closest:
            best = self._closest(current.mask, candidate.mask)
        else:
            best = current.mask if _narrower(current.mask, candidate.mask) else candidate.mask
        return current if best == current.mask else candidate

    def compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        assert candidate.mask is not None
        if candidate.mask.bit_count() == 0:
            return current
        if current is None:
            return candidate
        assert current.mask is not None
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self.compare_masks(current, candidate)
        best = self.best_non_preferred_count
        c, k = current.mask.bit_count(), candidate.mask.bit_count()
        if c > best:
            return self.compare_masks(current, candidate)
        if c == best:
            if k != best:
                return current
            return self.compare_masks(current, candidate)
        if k > best:
            return current
        if k == best:
            return candidate
        if k > c:
            return candidate
        if k < c:
            return current
        return self.compare_masks(current, candidate)

    def merge(self) -> TopologyHint:
        best: TopologyHint | None = None
        for permutation in product(*self.lists):
            best = self.compare(best, merge_permutation(self.default, permutation))
        if best is None:
            return TopologyHint.from_mask(self.default, False)
        return best


def reference_merge(
    policy: str,
    providers_hints: Sequence[ProviderHints] | None,
    numa_nodes: Sequence[int],
    distances: Mapping[int, Sequence[int]] | None = None,
    prefer_closest: bool = False,
) -> tuple[TopologyHint, bool]:
    """kubelet ``Policy.Merge`` for ``policy`` by brute force. Returns ``(hint, admit)``.

    ``distances[node][j]`` is the distance to the ``j``-th node of ``sorted(numa_nodes)``.
    Raises :class:`PolicyError` for an unknown policy, or when prefer-closest is in effect and a
    node lacks a complete distance row (kubelet refuses to start then).
    """
    if policy not in _POLICIES:
        raise PolicyError(f'unknown policy: "{policy}"')
    if policy == names.NONE:
        return TopologyHint(None, False), True
    nodes = sorted(numa_nodes)
    lists = filter_providers_hints(providers_hints)
    closest = prefer_closest and policy != names.SINGLE_NUMA_NODE
    if closest and (distances is None or any(len(distances.get(n) or ()) < len(nodes) for n in nodes)):
        raise PolicyError(
            "cannot discover NUMA topology: error getting NUMA distances "
            "(prefer-closest-numa-nodes needs NUMA distances)"
        )
    if policy == names.SINGLE_NUMA_NODE:
        lists = filter_single_numa_hints(lists)
    hint = HintMerger(nodes, lists, closest, distances).merge()
    if policy == names.SINGLE_NUMA_NODE:
        default = 0
        for n in nodes:
            default |= 1 << n
        if hint.mask == default:
            hint = TopologyHint(None, hint.preferred)
    admit = True if policy == names.BEST_EFFORT else hint.preferred
    return hint, admit

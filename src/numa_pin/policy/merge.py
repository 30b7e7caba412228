"""The production hint merge: kubelet's answer without kubelet's cross product (pure).

kubelet (``topology-manager.md`` §3-§4) folds ``HintMerger.compare`` over every permutation of
the cartesian product of the per-resource hint lists. Providers enumerate all ``2**N - 1`` masks,
so the product grows like ``2**(N*L)`` and kubelet refuses machines with more than 8 NUMA nodes.
:func:`merge_lists` returns exactly the hint that fold returns, for every input, with no
enumeration of the product. Facts used (proof sketches; ``D`` = all nodes, "list" = one flattened
per-resource hint list, ``B`` = ``BestNonPreferredAffinityCount``):

F1. *The fold is a maximum.* For candidates with count > 0, ``compare`` is a strict total order
    on ``(mask, preferred)``: preferred beats non-preferred; two preferred hints are ordered by
    ``CompareMasks``; two non-preferred ones by tier (count == B, then count < B with larger
    counts first, then count > B with smaller counts first) and ``CompareMasks`` inside a count.
    ``CompareMasks`` on different masks is lexicographic on ``(count, int)`` (narrowest) or
    ``(count, average distance, int)`` (closest), hence total. Checking the six branches of
    ``compare`` against this key shows it always keeps the larger of the two, so the fold returns
    the maximum of the *set* of merged hints with count > 0 (or the default ``{D, false}``).
    The result is independent of permutation order, provider order and resource order.
    See :class:`numa_pin.policy.base.Ranker`.

F2. *Preferred outcomes by hashing.* A merged hint is preferred iff every pick is preferred and
    all non-nil RAW affinities are equal, to some ``M``; its mask is ``M & D`` (or ``D`` when all
    picks are nil). So ``M`` is achievable iff every list holds a preferred ``M`` or a preferred
    nil, and at least one holds ``M``: intersect the lists' sets of preferred masks, O(total
    hints). By F1 any preferred outcome with count > 0 is the answer.

F3. *Otherwise: the best achievable intersection.* With no preferred outcome of count > 0, every
    outcome with count > 0 is non-preferred and the answer is the best set in
    ``A = {D & e_1 & ... & e_L}`` (``e_i`` ranging over list ``i``'s masks, nil read as ``D``).
    A is built list by list keeping only the *distinct* intersections (and dropping empty ones,
    which stay empty): exact, with cost ``sum |A_i| * |list_i|`` bounded by the number of distinct
    masks rather than by the product.

F4. *Families are never materialized on big machines.* A :class:`CapacityFamily` is the
    upward-closed set of masks holding enough capacity (kubelet's enumeration, described):
    (a) its preferred hints are its members of size ``min_affinity``: a preferred outcome made of
        families is a mask that is such a member of every family, found by a pruned search over
        ``min_affinity``-subsets (colex order for narrowest, :mod:`~numa_pin.policy.closest`
        for closest);
    (b) ``B`` for a family is the size ``b`` of its smallest member (same search, sizes upward);
    (c) intersections of one member per family are upward-closed (``X = cap M_i`` and
        ``X <= Y`` give ``Y = cap (M_i | Y)``), and every member of a family is such an
        intersection (take the full node set in every other family). So when every list is a
        non-empty family over ``D``, a ``B``-set is achievable and, every achievable count
        between it and ``|D|`` being achievable too, the best non-preferred answer has count
        exactly ``B = max b``;
    (d) a set ``S`` is achievable iff the nodes outside ``S`` can be split among the families so
        that each family's share fits its slack (``capacity(all) - need``, per dimension) and
        holds none of its ``must_include`` nodes: ``M_i = D - share_i`` is then a member, and
        conversely shares can be made disjoint because members are upward-closed. This
        feasibility question (:class:`Removal`) is a small multi-dimensional bin-packing search:
        free nodes (zero cost in some family) and fixed nodes (removable by none) are settled
        first, one family taking everything is tried greedily, then a depth-first search with
        memoization on the remaining slack and a count bound on optional removals;
    (e) candidates are searched in rank order: the narrowest ``B``-set is built greedily from the
        highest node down (leave the node out iff an achievable ``B``-set without it still
        exists, asked of (d)), the closest by :mod:`~numa_pin.policy.closest` (branch and bound
        over how many nodes each class of twin nodes gives, (d) as its exact validity oracle).
        With a single family, (d) reduces to a capacity check and the member searches of (a)
        answer directly.
    Explicit lists mixed with families are merged first (F3); each resulting mask ``x`` becomes
    the universe of the family search, where the achievable sets are upward-closed inside ``x``
    and the best count is ``B`` if some achievable set has at most ``B`` nodes, else the smallest
    achievable count, or ``|x|`` when ``B >= |x|``; the best over all ``x`` wins.

Complexity: F2 is linear in the hints; F3 is bounded by distinct masks; F4's searches are
exponential in the worst case (they generalize multi-dimensional knapsack and min-sum
``k``-subset problems) but pruned by capacity bounds (with a surrogate constraint across
dimensions and dominance memoization), free nodes, slack memoization and distance bounds, so
realistic 64-node decisions take milliseconds (``bench/merge_scaling.py``,
``bench/prefer_closest.py``). Known slow corner: prefer-closest on partly used 64-node machines
without twin structure across sockets (glued designs on a ring), requests spanning half the
machine, non-preferred (seconds; see ``docs/design/policy.md``).
Families on at most :data:`MATERIALIZE_LIMIT` nodes, families with nodes outside the machine and
families with duplicate nodes are simply materialized.
"""

from __future__ import annotations

from collections.abc import Sequence

from numa_pin.policy import bitmask
from numa_pin.policy.base import HintList, NumaInfo, Ranker
from numa_pin.policy.families import Family, Removal, closest_best, first_colex, greedy_narrowest
from numa_pin.policy.hint import CapacityFamily, TopologyHint

#: families over at most this many nodes are materialized (their lists are small)
MATERIALIZE_LIMIT = 4

_Explicit = list[tuple[int | None, bool]]


def _prepare(
    lists: Sequence[HintList], default: int, materialize_limit: int
) -> tuple[list[_Explicit], list[Family]]:
    explicit: list[_Explicit] = []
    fams: list[Family] = []
    for lst in lists:
        if isinstance(lst, CapacityFamily):
            fam = None if len(lst.nodes) <= materialize_limit else Family.build(lst, default)
            if fam is None:
                hints = lst.materialize()
                explicit.append([(h.mask, h.preferred) for h in hints] or [(None, False)])
            elif not lst.nodes or not lst.contains(fam.universe):
                explicit.append([(None, False)])  # nothing fits: kubelet's []
            else:
                fams.append(fam)
        else:
            explicit.append([(h.mask, h.preferred) for h in lst])
    return explicit, fams


def _best_preferred(explicit: list[_Explicit], fams: list[Family], default: int, ranker: Ranker) -> int | None:
    """Fact F2: the best preferred outcome with count > 0, or ``None``."""
    constraining: list[set[int]] = []
    union: set[int] = set()
    for lst in explicit:
        prefs = {m for m, p in lst if p and m is not None}
        if any(p and m is None for m, p in lst):
            union |= prefs
        else:
            constraining.append(prefs)
    candidates: set[int] = set()
    if constraining:
        base = min(constraining, key=len)
        for m in base:
            if all(m in s for s in constraining) and all(
                m.bit_count() == f.min_affinity and f.is_member(m) for f in fams
            ):
                candidates.add(m & default)
    elif fams:
        return _best_common_member(fams, ranker)
    else:
        candidates = {m & default for m in union}
        candidates.add(default)  # every pick nil (also: no list at all)
    candidates.discard(0)
    if not candidates:
        return None
    return min(candidates, key=ranker.preferred_key)


def _best_common_member(fams: list[Family], ranker: Ranker) -> int | None:
    """The best mask that is a preferred hint of every family (F4a)."""
    k = fams[0].min_affinity
    if any(f.min_affinity != k for f in fams) or k < 1:
        return None
    universe = fams[0].universe
    must = 0
    for f in fams:
        universe &= f.universe
        must |= f.must
    if must & ~universe:
        return None
    nodes = list(bitmask.bits(universe))
    constraints = [c for f in fams for c in f.constraints()]
    if ranker.closest:
        return closest_best(ranker, nodes, k, must, constraints)
    return first_colex(nodes, k, must, constraints)


def _best_non_preferred(
    explicit: list[_Explicit], fams: list[Family], default: int, ranker: Ranker
) -> int | None:
    """Facts F3 and F4: the best non-preferred outcome with count > 0, or ``None``."""
    best_count = 0
    for lst in explicit:
        counts = [m.bit_count() for m, _p in lst if m is not None]
        if counts:
            best_count = max(best_count, min(counts))
    for fam in fams:
        best_count = max(best_count, fam.min_size())

    reachable = {default} if default else set()
    for lst in explicit:
        effective = {default if m is None else m & default for m, _p in lst}
        reachable = {x & e for x in reachable for e in effective}
        reachable.discard(0)
        if not reachable:
            return None

    def key(mask: int) -> tuple[object, ...]:
        return ranker.nonpreferred_key(mask, best_count)

    if not fams:
        return min(reachable, key=key) if reachable else None
    universe = default
    for fam in fams:
        universe &= fam.universe
    standard = all(f.universe == default for f in fams)
    best: int | None = None
    for part in {x & universe for x in reachable}:
        if not part:
            continue
        found = _family_best(part, fams, best_count, ranker, standard and part == default)
        if found is not None and (best is None or key(found) < key(best)):
            best = found
    return best


def _family_best(universe: int, fams: list[Family], best_count: int, ranker: Ranker, standard: bool) -> int | None:
    """Best achievable intersection of family members inside ``universe`` (F4c)."""
    size = universe.bit_count()
    if best_count >= size:
        return universe  # every achievable set is smaller than B, or exactly the universe
    if len(fams) == 1:
        return _single_family_best(universe, fams[0], best_count, ranker)
    removal = Removal(universe, fams)
    if standard or removal.feasible(0, universe, size - best_count):
        count = best_count
    else:
        count = next(k for k in range(best_count + 1, size + 1) if removal.feasible(0, universe, size - k))
    if count == size:
        return universe
    if ranker.closest:
        return closest_best(
            ranker,
            list(bitmask.bits(universe)),
            count,
            removal.fixed,
            (),
            subtree_ok=lambda inc, pool: removal.feasible(
                universe & ~(inc | pool), pool, size - count - (universe & ~(inc | pool)).bit_count()
            ),
            kinds={v: tuple((f.must >> v & 1, f.weight[v]) for f in fams) for v in bitmask.bits(universe)},
        )
    return greedy_narrowest(removal, universe, count)


def _single_family_best(universe: int, fam: Family, best_count: int, ranker: Ranker) -> int | None:
    """One family: the achievable sets inside ``universe`` are the ``S`` with
    ``S | (fam.universe - universe)`` a member, so plain capacity searches answer."""
    constraints = fam.constraints(fam.universe & ~universe)
    forced = fam.must & universe
    nodes = list(bitmask.bits(universe))
    count = best_count
    while count < len(nodes) and first_colex(nodes, count, forced, constraints) is None:
        count += 1
    if count == len(nodes):
        return universe
    if ranker.closest:
        return closest_best(ranker, nodes, count, forced, constraints)
    return first_colex(nodes, count, forced, constraints)



def merge_lists(
    lists: Sequence[HintList],
    info: NumaInfo,
    closest: bool,
    *,
    materialize_limit: int | None = None,
) -> TopologyHint:
    """kubelet ``HintMerger.Merge`` over flattened lists (§3-§4), without the cross product.

    ``closest`` selects ``Closest`` over ``Narrowest`` in ``CompareMasks``. Returns the merged
    hint, or the default ``{all nodes, false}``. Raises :class:`PolicyError` when ``closest``
    is set and distances are missing.
    """
    default = info.default_mask
    ranker = Ranker(info, closest)
    limit = MATERIALIZE_LIMIT if materialize_limit is None else materialize_limit
    explicit, fams = _prepare(lists, default, limit)
    best = _best_preferred(explicit, fams, default, ranker)
    if best is not None:
        return TopologyHint.from_mask(best, True)
    best = _best_non_preferred(explicit, fams, default, ranker)
    return TopologyHint.from_mask(default if best is None else best, False)

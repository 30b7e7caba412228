"""The capacity-family searches of the hint merge (fact F4 of :mod:`~numa_pin.policy.merge`; pure).

A :class:`Family` is a :class:`~numa_pin.policy.hint.CapacityFamily` normalized for searching:
its members are the node sets holding ``must_include`` and enough capacity in every dimension.
The searches here answer the merge's questions about families without listing their members:
the numerically smallest member of a size (:func:`first_colex`), the closest one
(:func:`closest_best`, over :mod:`~numa_pin.policy.closest`), and whether a node set can be
removed from an intersection of members (:class:`Removal`, a small multi-dimensional
bin-packing search), from which :func:`greedy_narrowest` builds the narrowest achievable set.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Mapping, Sequence

from numa_pin.base.record import record
from numa_pin.policy import bitmask
from numa_pin.policy.base import Ranker
from numa_pin.policy.closest import closest_set
from numa_pin.policy.hint import CapacityFamily


@record(frozen=False)
class Family:
    """A non-empty capacity family whose nodes are machine nodes (normalized for the search)."""

    universe: int
    nodes: tuple[int, ...]
    weight: dict[int, tuple[int, ...]]
    need: tuple[int, ...]
    must: int
    min_affinity: int
    slack: tuple[int, ...]
    _min_size: int | None = None

    @classmethod
    def build(cls, family: CapacityFamily, default: int) -> Family | None:
        """``None`` when the family must be materialized instead (odd node sets)."""
        if len(set(family.nodes)) != len(family.nodes) or any(n < 0 for n in family.nodes):
            return None
        universe = bitmask.from_nodes(family.nodes)
        if universe & ~default:
            return None
        weight = dict(zip(family.nodes, family.capacity))
        totals = [sum(c[t] for c in family.capacity) for t in range(len(family.need))]
        return cls(
            universe=universe,
            nodes=tuple(sorted(family.nodes)),
            weight=weight,
            need=tuple(family.need),
            must=family.must_include,
            min_affinity=family.min_affinity,
            slack=tuple(tot - n for tot, n in zip(totals, family.need)),
        )

    def constraints(self, outside: int = 0) -> list[tuple[dict[int, int], int]]:
        """Capacity constraints ``sum(weight[v] for v in S) >= need`` a member's nodes inside the
        search universe must meet, the nodes of ``outside`` being in the member for free."""
        out = []
        for t, need in enumerate(self.need):
            weights = {v: w[t] for v, w in self.weight.items()}
            out.append((weights, need - sum(weights[v] for v in bitmask.bits(outside))))
        return _with_surrogate(out)

    def is_member(self, mask: int) -> bool:
        if mask & ~self.universe or mask & self.must != self.must:
            return False
        for t, need in enumerate(self.need):
            if sum(self.weight[v][t] for v in bitmask.bits(mask)) < need:
                return False
        return True

    def min_size(self) -> int:
        """Size of the smallest member (fact F4b): the popcount of the family's narrowest hint."""
        if self._min_size is None:
            lower = max(1, self.must.bit_count())
            cons = self.constraints()
            for weights, need in cons:
                caps = sorted(weights.values(), reverse=True)
                total, count = 0, 0
                while total < need and count < len(caps):
                    total += caps[count]
                    count += 1
                lower = max(lower, count)
            size = len(self.nodes)
            for k in range(lower, len(self.nodes) + 1):
                if first_colex(list(self.nodes), k, self.must, cons) is not None:
                    size = k
                    break
            self._min_size = size
        return self._min_size


def _with_surrogate(constraints: list[tuple[dict[int, int], int]]) -> list[tuple[dict[int, int], int]]:
    """Add the implied constraint ``sum_t P_t * w_t(S) >= len * prod(need)`` with
    ``P_t = prod(need_s, s != t)`` (every ``w_t(S) >= need_t`` implies it): an integer surrogate
    that catches dimensions trading off against each other, which per-dimension bounds miss."""
    active = [(w, need) for w, need in constraints if need > 0]
    if len(active) < 2:
        return constraints
    product = 1
    for _w, need in active:
        product *= need
    factors = [product // need for _w, need in active]
    nodes = set().union(*(w.keys() for w, _need in active))
    weights = {v: sum(f * w.get(v, 0) for f, (w, _need) in zip(factors, active)) for v in nodes}
    return [*constraints, (weights, len(active) * product)]


def first_colex(
    nodes: list[int], k: int, forced: int, constraints: Sequence[tuple[Mapping[int, int], int]]
) -> int | None:
    """The numerically smallest ``k``-subset of ``nodes`` (ascending) that holds ``forced`` and
    meets every ``sum(weight[v] for v in S) >= need`` constraint, or ``None``.

    Depth-first from the highest node down, trying "leave it out" first: the first leaf found
    is the smallest integer. Pruned by counts and by the ``k - |S|`` largest weights left.
    """
    n = len(nodes)
    if k < 0 or k > n:
        return None
    if forced & ~bitmask.from_nodes(nodes) or forced.bit_count() > k:
        return None
    below = [0] * (n + 1)
    for p in range(n):
        below[p + 1] = below[p] | (1 << nodes[p])
    # top[c][p][r]: sum of the r largest weights of constraint c among nodes[:p], r <= k
    top: list[list[list[int]]] = []
    for weights, _need in constraints:
        table = [[0]]
        best: list[int] = []
        for p in range(n):
            w = weights.get(nodes[p], 0)
            if len(best) < k:
                heapq.heappush(best, w)
            elif best and w > best[0]:
                heapq.heapreplace(best, w)
            ordered = sorted(best, reverse=True)
            sums = [0]
            for value in ordered:
                sums.append(sums[-1] + value)
            table.append(sums)
        top.append(table)
    needs = [max(need, 0) for _w, need in constraints]
    # failed[(p, r)]: sums (capped at need) from which no completion exists; any sums that are
    # componentwise smaller fail too
    failed: dict[tuple[int, int], list[tuple[int, ...]]] = {}

    def rec(p: int, inc: int, r: int, sums: tuple[int, ...]) -> int | None:
        forced_left = forced & below[p]
        if r == 0:
            if forced_left:
                return None
            return inc if all(s >= nd for s, nd in zip(sums, needs)) else None
        if r > p or forced_left.bit_count() > r:
            return None
        for c, table in enumerate(top):
            row = table[p]
            if sums[c] + row[min(r, len(row) - 1)] < needs[c]:
                return None
        dead = failed.get((p, r))
        if dead is not None and any(all(a <= b for a, b in zip(sums, f)) for f in dead):
            return None
        v = nodes[p - 1]
        bit = 1 << v
        if not forced & bit:
            found = rec(p - 1, inc, r, sums)
            if found is not None:
                return found
        new_sums = tuple(
            min(s + constraints[c][0].get(v, 0), needs[c]) for c, s in enumerate(sums)
        )
        found = rec(p - 1, inc | bit, r - 1, new_sums)
        if found is None:
            front = [f for f in failed.get((p, r), ()) if not all(a <= b for a, b in zip(f, sums))]
            front.append(sums)
            failed[(p, r)] = front
        return found

    return rec(n, 0, k, tuple(0 for _ in constraints))


def closest_best(
    ranker: Ranker,
    nodes: list[int],
    k: int,
    forced: int,
    constraints: Sequence[tuple[Mapping[int, int], int]],
    subtree_ok: Callable[[int, int], bool] | None = None,
    kinds: Mapping[int, Hashable] | None = None,
) -> int | None:
    """The ``k``-subset of ``nodes`` with the smallest ``(average distance, int)`` that holds
    ``forced``, meets the capacity ``constraints`` and is accepted by ``subtree_ok``; ``None``
    if there is none. ``subtree_ok(inc, pool)`` must say exactly whether some valid ``k``-set
    ``S`` has ``inc <= S <= inc | pool``; ``kinds`` keys the nodes it cannot tell apart.
    See :mod:`numa_pin.policy.closest` (classes of twin nodes, branch and bound over counts).
    """
    info = ranker.info
    assert info.matrix is not None  # the ranker checked every row is there
    where = {node: i for i, node in enumerate(info.nodes)}
    ordered = sorted(nodes)
    at = [where[v] for v in ordered]
    rows = []
    for i in at:
        full = info.matrix[i]
        assert full is not None
        rows.append([full[j] for j in at])
    return closest_set(rows, ordered, k, forced, constraints, subtree_ok, kinds)


class Removal:
    """Can these nodes be dropped from the intersection of family members? (fact F4c)

    Inside ``universe``, node ``v`` is removed by family ``i`` at cost ``weight_i(v)`` from the
    family's slack, unless ``v`` is one of its ``must_include`` nodes. A node some family
    removes for nothing is *free*; a node no family can remove is *fixed*.
    """

    def __init__(self, universe: int, fams: Sequence[Family]) -> None:
        self.fams = fams
        self.universe = universe
        self.options: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        self.cost: dict[int, float] = {}
        self.free = 0
        self.fixed = 0
        for v in bitmask.bits(universe):
            opts: list[tuple[int, tuple[int, ...]]] = []
            for i, fam in enumerate(fams):
                if fam.must >> v & 1:
                    continue
                w = fam.weight[v]
                if all(x <= s for x, s in zip(w, fam.slack)):
                    opts.append((i, w))
            if any(not any(w) for _i, w in opts):
                self.free |= 1 << v
            elif not opts:
                self.fixed |= 1 << v
            self.options[v] = opts
            self.cost[v] = min((self._norm(i, w) for i, w in opts), default=0.0)

    def _norm(self, i: int, w: tuple[int, ...]) -> float:
        slack = self.fams[i].slack
        return sum(x / s for x, s in zip(w, slack) if s)

    def feasible(self, mandatory: int, optional: int, r: int) -> bool:
        """Can every node of ``mandatory`` and at least ``r`` nodes of ``optional`` be removed?"""
        mandatory &= ~self.free
        if mandatory & self.fixed:
            return False
        r -= (optional & self.free).bit_count()
        optional &= ~(self.free | self.fixed | mandatory)
        if r > optional.bit_count():
            return False
        r = max(r, 0)
        if not mandatory and r == 0:
            return True
        if self._one_family(mandatory, optional, r):
            return True
        mand = sorted(
            bitmask.bits(mandatory),
            key=lambda v: (len(self.options[v]), -self.cost[v], self.options[v]),
        )
        opt = sorted(bitmask.bits(optional), key=lambda v: (self.cost[v], self.options[v]))
        return _Packing(self, mand, opt).run(r)

    def _one_family(self, mandatory: int, optional: int, r: int) -> bool:
        """Quick sufficient test: one family removes all of ``mandatory`` and (greedily, lightest
        first) ``r`` nodes of ``optional``."""
        for i, fam in enumerate(self.fams):
            slack = list(fam.slack)
            ok = True
            for v in bitmask.bits(mandatory):
                w = self._weight_in(i, v)
                if w is None or any(x > s for x, s in zip(w, slack)):
                    ok = False
                    break
                for t, x in enumerate(w):
                    slack[t] -= x
            if not ok:
                continue
            left = r
            if left > 0:
                light = sorted(
                    (self._norm(i, w), v, w)
                    for v in bitmask.bits(optional)
                    if (w := self._weight_in(i, v)) is not None
                )
                for _cost, _v, w in light:
                    if all(x <= s for x, s in zip(w, slack)):
                        for t, x in enumerate(w):
                            slack[t] -= x
                        left -= 1
                        if left == 0:
                            break
            if left <= 0:
                return True
        return False

    def _weight_in(self, i: int, v: int) -> tuple[int, ...] | None:
        for j, w in self.options[v]:
            if j == i:
                return w
        return None


class _Packing:
    """Depth-first assignment of nodes to families' slack, memoized on the slack left."""

    def __init__(self, removal: Removal, mand: list[int], opt: list[int]) -> None:
        self.removal = removal
        self.items = mand + opt
        self.n_mand = len(mand)
        self.slack = [list(f.slack) for f in removal.fams]
        self.failed: set[tuple[object, ...]] = set()

    def run(self, r: int) -> bool:
        return self._step(0, r)

    def _state(self, idx: int, r: int) -> tuple[object, ...]:
        return (idx, r, tuple(tuple(s) for s in self.slack))

    def _fits(self, i: int, w: tuple[int, ...]) -> bool:
        return all(x <= s for x, s in zip(w, self.slack[i]))

    def _room(self, i: int, w: tuple[int, ...]) -> float:
        """Relative slack family ``i`` keeps after taking ``w`` (larger first: spread the load)."""
        total0 = self.removal.fams[i].slack
        return min(((s - x) / s0 for x, s, s0 in zip(w, self.slack[i], total0) if s0), default=1.0)

    def _count_bound(self, idx: int) -> int:
        """How many optional nodes from ``idx`` on could be removed at most (per-family knapsack
        by count, each node counted once per family it fits)."""
        rest = self.items[idx:]
        bound = 0
        for i, fam in enumerate(self.removal.fams):
            ws = [w for v in rest for j, w in self.removal.options[v] if j == i and self._fits(i, w)]
            if not ws:
                continue
            best = len(ws)
            for t in range(len(fam.slack)):
                values = sorted(w[t] for w in ws)
                total, count = 0, 0
                for value in values:
                    if total + value > self.slack[i][t]:
                        break
                    total += value
                    count += 1
                best = min(best, count)
            bound += best
        return bound

    def _step(self, idx: int, r: int) -> bool:
        if idx >= self.n_mand and r <= 0:
            return True
        if idx >= len(self.items):
            return False
        if idx >= self.n_mand and len(self.items) - idx < r:
            return False
        state = self._state(idx, r)
        if state in self.failed:
            return False
        if idx >= self.n_mand and self._count_bound(idx) < r:
            self.failed.add(state)
            return False
        v = self.items[idx]
        options = [(i, w) for i, w in self.removal.options[v] if self._fits(i, w)]
        options.sort(key=lambda o: -self._room(*o))
        left = r - 1 if idx >= self.n_mand else r
        for i, w in options:
            slack = self.slack[i]
            for t, x in enumerate(w):
                slack[t] -= x
            ok = self._step(idx + 1, left)
            for t, x in enumerate(w):
                slack[t] += x
            if ok:
                return True
        if idx >= self.n_mand and self._step(idx + 1, r):
            return True
        self.failed.add(state)
        return False




def greedy_narrowest(removal: Removal, universe: int, count: int) -> int:
    """Smallest-integer achievable ``count``-set: from the highest node down, leave a node out
    whenever an achievable ``count``-set without it still exists (invariant: one exists)."""
    size = universe.bit_count()
    inc = exc = 0
    for v in sorted(bitmask.bits(universe), reverse=True):
        if inc.bit_count() == count:
            return inc
        if size - exc.bit_count() == count:
            return universe & ~exc
        bit = 1 << v
        if removal.free & bit:
            exc |= bit
            continue
        if removal.fixed & bit:
            inc |= bit
            continue
        trial = exc | bit
        if removal.feasible(trial, universe & ~inc & ~trial, size - count - trial.bit_count()):
            exc = trial
        else:
            inc |= bit
    return universe & ~exc

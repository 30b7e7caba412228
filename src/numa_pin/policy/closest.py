"""The exact prefer-closest search: the valid ``k``-set of smallest ``(average distance, int)``.

kubelet's ``Closest`` ranks two masks of equal count by their average distance (the sum over all
ordered pairs of set bits, ``i == j`` included, divided by ``count**2`` in float64), then by the
smaller integer. :func:`closest_set` returns the best ``k``-subset of ``nodes`` in that order
among the *valid* ones: those holding ``forced``, meeting the capacity ``constraints`` and
accepted by the exact existence oracle ``subtree_ok``. Facts used (proof sketches):

C1. *Twins.* Nodes ``u`` and ``v`` are twins when swapping them leaves the distance matrix (over
    ``nodes``) unchanged: ``d(u,w) = d(v,w)`` and ``d(w,u) = d(w,v)`` for every other ``w``,
    ``d(u,u) = d(v,v)`` and ``d(u,v) = d(v,u)``. This is an equivalence (for ``u ~ v ~ x``:
    ``d(u,v) = d(v,u) = d(x,u) = d(x,v)`` and ``d(u,x) = d(v,x) = d(x,v) = d(x,u)``, the other
    entries directly), and every block of the matrix between two classes, and every off-diagonal
    entry inside one class, is constant. A *type* is a set of twins that also agree on
    everything validity looks at (forced or not, each constraint's weight, the caller's
    ``kinds`` key). Permuting nodes inside a type maps valid sets to valid sets of the same
    distance sum, so both depend only on the *count vector* ``c`` (nodes taken per type):
    ``f(c) = sum_t c_t s_t + c_t (c_t - 1) a_t + sum_{t != u} c_t c_u D_tu`` with ``s`` the
    diagonal, ``a`` the inside-type entry and ``D`` the block entry; each capacity sum is
    ``sum_t c_t w_t``.

C2. *Branch and bound over count vectors.* Types are decided one at a time. A chosen node ``x``
    among the ``r`` still to choose costs its distances to the decided nodes (both directions)
    and ``d(x,x)``, plus half the round trips ``d(x,y) + d(y,x)`` to the other ``r - 1``
    chosen undecided nodes; the latter is at least the sum of the ``r - 1`` smallest round trips
    from ``x``'s type to the undecided nodes available (each type counted up to its available
    nodes, its own type one less). Taking the ``r`` cheapest such per-node terms (every type's
    required nodes first) is a lower bound on the completion's distance sum (Gilmore-Lawler).
    Capacity is bounded per constraint by the required nodes plus the heaviest available ones,
    exactly; ``subtree_ok`` prunes with the decided nodes plus every still required node kept
    and the other available nodes optional, cached by count vector (C1 makes that sound). A
    leaf is a full count vector, checked exactly. Phase A finds the minimum sum ``S*``.

C3. *Averages as Go computes them.* For a fixed count the average is ``fl(S / k**2)``, monotone
    in ``S``; ``T`` is the largest sum whose float equals ``fl(S* / k**2)`` (``T = S*`` unless
    distances are huge), so "average equal to the best" is exactly "sum at most ``T``".

C4. *The smallest integer.* Among valid sets with sum at most ``T``, the smallest integer is
    built from the highest node down: leave the node out iff some such set still exists without
    it, given the nodes decided so far (each question is phase A's search as a decision, with
    the node's type holding one node fewer). Inside a type the undecided nodes are
    interchangeable (C1), so a witness count vector is realized by the type's lowest undecided
    nodes; the highest undecided node of its type is in the witness only when the witness takes
    them all, and only then is a new search needed. With no twins every type is one node and
    this is the plain branch and bound over nodes.

Worst case exponential (minimum-sum ``k``-subset contains densest ``k``-subgraph); on machines
built from sockets, dies and boards the types are few and the decision takes milliseconds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import accumulate

#: ``(weight per node, need)``: a valid set's weights add up to at least ``need``
Constraint = tuple[Mapping[int, int], int]
#: ``subtree_ok(inc, pool)``: does some valid ``k``-set ``S`` with ``inc <= S <= inc | pool`` exist?
SubtreeOk = Callable[[int, int], bool]


def closest_set(
    distance: Callable[[int, int], int],
    nodes: Sequence[int],
    k: int,
    forced: int = 0,
    constraints: Sequence[Constraint] = (),
    subtree_ok: SubtreeOk | None = None,
    kinds: Mapping[int, Hashable] | None = None,
) -> int | None:
    """The valid ``k``-subset of ``nodes`` with the smallest ``(average distance, int)``, or
    ``None`` when there is none.

    Valid: holds ``forced``, meets every capacity constraint and is accepted by ``subtree_ok``
    (which must answer exactly, see :data:`SubtreeOk`). ``kinds`` maps each node to a key such
    that swapping two nodes of equal key (and equal forced bit and weights) never changes
    ``subtree_ok``'s answers; without it, ``subtree_ok`` makes every node its own type.
    ``distance(a, b)`` is the distance from ``a`` to ``b``.
    """
    nodes = sorted(set(nodes))
    universe = 0
    for v in nodes:
        universe |= 1 << v
    if k <= 0 or k > len(nodes) or forced & ~universe or forced.bit_count() > k:
        return None
    if subtree_ok is not None and kinds is None:
        kinds = {v: v for v in nodes}
    search = _Search(distance, nodes, k, forced, constraints, subtree_ok, kinds)
    return search.run()


def _twin_classes(rows: list[list[int]], cols: list[list[int]]) -> list[list[int]]:
    """Positions grouped into twin classes (C1), each ascending, classes by first position."""
    classes: list[list[int]] = []
    for i in range(len(rows)):
        for members in classes:
            r = members[0]
            row = rows[r][:]
            row[i], row[r] = row[r], row[i]
            if row != rows[i]:
                continue
            col = cols[r][:]
            col[i], col[r] = col[r], col[i]
            if col == cols[i]:
                members.append(i)
                break
        else:
            classes.append([i])
    return classes


class _Search:
    """One :func:`closest_set` question: types, the count-vector branch and bound, the greedy."""

    def __init__(
        self,
        distance: Callable[[int, int], int],
        nodes: list[int],
        k: int,
        forced: int,
        constraints: Sequence[Constraint],
        subtree_ok: SubtreeOk | None,
        kinds: Mapping[int, Hashable] | None,
    ) -> None:
        self.k = k
        self.subtree_ok = subtree_ok
        rows = [[distance(a, b) for b in nodes] for a in nodes]
        cols = [[rows[j][i] for j in range(len(nodes))] for i in range(len(nodes))]
        groups: dict[tuple[int, Hashable], list[int]] = {}
        for cls, members in enumerate(_twin_classes(rows, cols)):
            for i in members:
                v = nodes[i]
                key = (
                    forced >> v & 1,
                    tuple(w.get(v, 0) for w, _need in constraints),
                    None if kinds is None else kinds[v],
                )
                groups.setdefault((cls, key), []).append(i)
        key_of = {members[0]: key for (_cls, key), members in groups.items()}
        types = sorted(groups.values())
        # interchangeable types (C5): twins of the matrix over types whose diagonal entry is
        # everything a type is (its size, its validity key, its own distances)
        qrows: list[list[object]] = [
            [
                (len(t), key_of[t[0]], rows[t[0]][t[0]], rows[t[0]][t[-1]]) if u is t else rows[t[0]][u[0]]
                for u in types
            ]
            for t in types
        ]
        qcols = [[qrows[j][i] for j in range(len(types))] for i in range(len(types))]
        orbits = _twin_classes(qrows, qcols)
        types = [types[i] for orbit in orbits for i in orbit]
        #: same_as_previous[t]: types t - 1 and t are interchangeable (C5)
        self.same_as_previous = [i > 0 for orbit in orbits for i in range(len(orbit))]
        self.m = m = len(types)
        self.members = [[nodes[i] for i in t] for t in types]
        self.self_dist = [rows[t[0]][t[0]] for t in types]
        self.inner = [rows[t[0]][t[1]] if len(t) > 1 else 0 for t in types]
        self.block = [[rows[t[0]][u[0]] for u in types] for t in types]
        # round trip between a node of type t and another node of type u (t == u: inside the type)
        self.trip = [
            [2 * self.inner[t] if t == u else self.block[t][u] + self.block[u][t] for u in range(m)]
            for t in range(m)
        ]
        self.weights = [[w.get(members[0], 0) for members in self.members] for w, _need in constraints]
        self.needs = [need for _w, need in constraints]
        self.type_of = {v: t for t, members in enumerate(self.members) for v in members}
        # the domain: per type, nodes kept (in every answer) and nodes still undecided (ascending)
        self.kept: list[list[int]] = [list(ms) if forced >> ms[0] & 1 else [] for ms in self.members]
        self.open: list[list[int]] = [[] if forced >> ms[0] & 1 else list(ms) for ms in self.members]
        self._oracle_cache: dict[tuple[int, ...], bool] = {}

    # -- the objective and the oracle --------------------------------------------------------

    def cost(self, counts: Sequence[int]) -> int:
        """``f(c)``: the distance sum of any set with these type counts (C1)."""
        total = 0
        for t, c in enumerate(counts):
            if c:
                total += c * self.self_dist[t] + c * (c - 1) * self.inner[t]
                row = self.block[t]
                total += c * sum(row[u] * counts[u] for u in range(self.m) if u != t)
        return total

    def realize(self, counts: Sequence[int]) -> int:
        """The smallest-integer set with these counts in the domain: kept nodes plus the lowest
        undecided ones of each type."""
        mask = 0
        for t, c in enumerate(counts):
            for v in self.kept[t]:
                mask |= 1 << v
            for v in self.open[t][: c - len(self.kept[t])]:
                mask |= 1 << v
        return mask

    def _oracle(self, decided: Sequence[int]) -> bool:
        """``subtree_ok`` with the first ``len(decided)`` types at those counts, every other type's
        kept nodes in and its undecided nodes optional (cached by counts: C1)."""
        if self.subtree_ok is None:
            return True
        p = len(decided)
        key = (*decided, *(x for t in range(p, self.m) for x in (len(self.kept[t]), len(self.open[t]))))
        found = self._oracle_cache.get(key)
        if found is None:
            inc = self.realize([*decided, *(len(self.kept[t]) for t in range(p, self.m))])
            pool = 0
            for t in range(p, self.m):
                for v in self.open[t]:
                    pool |= 1 << v
            found = self.subtree_ok(inc, pool)
            self._oracle_cache[key] = found
        return found

    # -- the branch and bound (C2) ------------------------------------------------------------

    def _prepare(self) -> None:
        """Per-call tables over the current domain."""
        m = self.m
        self.lo = [len(self.kept[t]) for t in range(m)]
        self.hi = [len(self.kept[t]) + len(self.open[t]) for t in range(m)]
        self.lo_after = list(accumulate(reversed(self.lo), initial=0))[::-1]
        self.hi_after = list(accumulate(reversed(self.hi), initial=0))[::-1]
        self._partners: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
        self.heavy = [sorted(range(m), key=lambda t, w=w: -w[t]) for w in self.weights]
        # tied[t]: interchangeable with type t - 1 over the same domain, so that (by symmetry)
        # only count vectors with c[t] <= c[t - 1] need to be searched (C5)
        self.tied = [
            self.same_as_previous[t] and self.lo[t] == self.lo[t - 1] and self.hi[t] == self.hi[t - 1]
            for t in range(m)
        ]

    def _partner_table(self, p: int, t: int) -> tuple[list[int], list[int], list[int]]:
        """Round trips from a node of type ``t`` to the nodes of types ``p..``, cheapest first:
        (trip values, cumulative counts, cumulative sums)."""
        table = self._partners.get((p, t))
        if table is None:
            row = self.trip[t]
            items = sorted(
                (row[u], self.hi[u] - (u == t)) for u in range(p, self.m) if self.hi[u] - (u == t) > 0
            )
            trips, counts, sums = [], [0], [0]
            for trip, count in items:
                trips.append(trip)
                counts.append(counts[-1] + count)
                sums.append(sums[-1] + trip * count)
            table = (trips, counts, sums)
            self._partners[(p, t)] = table
        return table

    def _smallest_trips(self, p: int, t: int, j: int) -> int:
        """Sum of the ``j`` smallest round trips from type ``t`` to the available nodes of types
        ``p..`` (``j`` is at most their number, or the state is infeasible anyway)."""
        if j <= 0:
            return 0
        trips, counts, sums = self._partner_table(p, t)
        i = bisect_left(counts, j)
        if i >= len(counts):
            return sums[-1]
        return sums[i - 1] + (j - counts[i - 1]) * trips[i - 1]

    def _bound2(self, p: int, r: int, lin: list[int]) -> int:
        """Twice a lower bound on the distance sum the ``r`` nodes still to choose from types
        ``p..`` add (C2)."""
        if r == 0:
            return 0
        total = 0
        extra: list[tuple[int, int]] = []
        for u in range(p, self.m):
            hi = self.hi[u]
            if not hi:
                continue
            term = 2 * lin[u] + self._smallest_trips(p, u, r - 1)
            lo = self.lo[u]
            total += lo * term
            if hi > lo:
                extra.append((term, hi - lo))
        left = r - self.lo_after[p]
        if left > 0:
            extra.sort()
            for term, count in extra:
                take = count if count < left else left
                total += take * term
                left -= take
                if not left:
                    break
        return total

    def _capacity_ok(self, p: int, r: int, sums: list[int]) -> bool:
        """Can the ``r`` nodes still to choose from types ``p..`` meet every constraint? (exact
        per constraint: the required nodes, then the heaviest available)"""
        for q, need in enumerate(self.needs):
            total = sums[q]
            if total >= need:
                continue
            w = self.weights[q]
            left = r - self.lo_after[p]
            for u in range(p, self.m):
                total += self.lo[u] * w[u]
            for u in self.heavy[q]:
                if left <= 0 or total >= need:
                    break
                if u < p:
                    continue
                spare = self.hi[u] - self.lo[u]
                take = spare if spare < left else left
                total += take * w[u]
                left -= take
            if total < need:
                return False
        return True

    def best_counts(self, limit: int | None, first: bool) -> tuple[int, list[int]] | None:
        """A valid count vector in the current domain with sum at most ``limit`` (``None``: no
        limit): the first found when ``first``, else one of minimum sum. ``None`` if there is none.
        """
        self._prepare()
        m = self.m
        if not self.lo_after[0] <= self.k <= self.hi_after[0]:
            return None
        best: list[object] = [limit, None]  # [sum allowed (inclusive), counts]
        counts: list[int] = []

        def rec(p: int, r: int, cost: int, lin: list[int], sums: list[int]) -> bool:
            if p == m:
                if r or any(s < need for s, need in zip(sums, self.needs)) or not self._oracle(counts):
                    return False
                best[0], best[1] = (cost if first else cost - 1), list(counts)
                return first
            cmin = max(self.lo[p], r - self.hi_after[p + 1])
            cmax = min(self.hi[p], r - self.lo_after[p + 1])
            if self.tied[p]:
                cmax = min(cmax, counts[p - 1])
            children = []
            for c in range(cmin, cmax + 1):
                new_cost = cost + c * lin[p] + c * (c - 1) * self.inner[p]
                trip = self.trip[p]
                new_lin = lin if not c else [0] * (p + 1) + [lin[u] + c * trip[u] for u in range(p + 1, m)]
                new_sums = [s + c * w[p] for s, w in zip(sums, self.weights)]
                if not self._capacity_ok(p + 1, r - c, new_sums):
                    continue
                lower = (2 * new_cost + self._bound2(p + 1, r - c, new_lin) + 1) // 2
                if best[0] is not None and lower > best[0]:  # type: ignore[operator]
                    continue
                children.append((lower, -c, c, new_cost, new_lin, new_sums))
            children.sort(key=lambda child: child[:2])
            for lower, _neg, c, new_cost, new_lin, new_sums in children:
                if best[0] is not None and lower > best[0]:  # type: ignore[operator]
                    break
                counts.append(c)
                if p + 1 < m and not self._oracle(counts):
                    counts.pop()
                    continue
                done = rec(p + 1, r - c, new_cost, new_lin, new_sums)
                counts.pop()
                if done:
                    return True
            return False

        rec(0, self.k, 0, list(self.self_dist), [0] * len(self.needs))
        if best[1] is None:
            return None
        found: list[int] = best[1]  # type: ignore[assignment]
        return self.cost(found), found

    # -- the whole question (C3, C4) ----------------------------------------------------------

    def run(self) -> int | None:
        optimum = self.best_counts(None, first=False)
        if optimum is None:
            return None
        best_sum, witness = optimum
        scale = float(self.k * self.k)
        average = float(best_sum) / scale
        limit = best_sum
        while float(limit + 1) / scale == average:
            limit += 1
        for v in sorted(self.type_of, reverse=True):
            t = self.type_of[v]
            if not self.open[t] or self.open[t][-1] != v:
                continue  # a kept (forced) node
            in_witness = witness[t] - len(self.kept[t]) == len(self.open[t])
            self.open[t].pop()
            if not in_witness:
                continue
            found = self.best_counts(limit, first=True)
            if found is not None:
                witness = found[1]
            else:
                self.kept[t].append(v)
                self.kept[t].sort()
        return self.realize(witness)

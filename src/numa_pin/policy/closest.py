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
    entry inside one class, is constant. So the distance sum of a set depends only on how many
    nodes it takes from each class, its *totals* ``c``:
    ``f(c) = sum_i c_i s_i + c_i (c_i - 1) a_i + sum_{i != j} c_i c_j D_ij`` (``s`` the
    diagonal, ``a`` the entry inside a class, ``D`` the block entry).

C2. *Sub-types.* Inside a class, nodes that also agree on everything validity looks at (forced or
    not, each constraint's weight, the caller's ``kinds`` key) form a sub-type; permuting a
    sub-type changes neither validity nor the distance sum. A set is therefore described, up to
    such permutations, by its count per sub-type (a *split* of the class totals).

C3. *Branch and bound over class totals.* Classes are decided one at a time. A chosen node ``x``
    among the ``r`` still to choose costs ``d(x,x)`` and its distances to the decided nodes
    (both directions), plus half the round trips ``d(x,y) + d(y,x)`` to the other ``r - 1``
    chosen undecided nodes; the latter is at least the sum of the ``r - 1`` smallest round trips
    from ``x``'s class to the available undecided nodes (each class counted up to its available
    nodes, its own one less). The ``r`` cheapest such per-node terms (every class's required
    nodes first) bound the completion's sum from below (Gilmore-Lawler). Each capacity
    constraint is bounded by the required nodes plus the heaviest available ones. A full vector
    of totals is valid iff some split of it is (C2): a depth-first search over the classes'
    splits, with only the Pareto-maximal weight sums per class when validity is capacity alone
    (a split dominated in every constraint cannot help), pruned by the capacity bounds and by
    ``subtree_ok`` (asked with the decided classes' nodes in, the others' kept nodes in and
    their undecided nodes optional; answers cached by sub-type counts, C2). Phase A finds the
    minimum sum ``S*``.

C4. *Interchangeable classes.* Two classes are interchangeable when swapping them (any
    bijection: their nodes are twins) preserves the matrix, the sub-types and the current
    domain: the same twin test on the matrix over classes, whose diagonal entry is everything a
    class is. Then only totals with ``c_j <= c_i`` (``i`` just before ``j``) need searching:
    swapping the two classes maps every valid set to a valid set of equal sum.

C5. *Averages as Go computes them.* For a fixed count the average is ``fl(S / k**2)``, monotone
    in ``S``; ``T`` is the largest sum whose float equals ``fl(S* / k**2)`` (``T = S*`` unless
    distances are huge), so "average equal to the best" is exactly "sum at most ``T``".

C6. *The smallest integer.* Among valid sets with sum at most ``T``, the smallest integer is
    built from the highest node down: leave the node out iff some such set still exists without
    it, given the nodes decided so far (phase A's search as a decision, the node's sub-type
    holding one undecided node fewer). Inside a sub-type the undecided nodes are
    interchangeable (C2), so a witness split is realized by each sub-type's lowest undecided
    nodes: the highest undecided node of its sub-type is in the witness only when the witness
    takes them all, and only then is a new search needed.

Worst case exponential (minimum-sum ``k``-subset contains densest ``k``-subgraph); on machines
built from sockets, dies and boards the classes are few and a decision takes milliseconds. With
no twins every class is one node and this is a plain branch and bound over nodes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Mapping, Sequence

from numa_pin.policy.twins import Constraint, Domain, SubtreeOk


def closest_set(
    rows: Sequence[Sequence[int]],
    nodes: Sequence[int],
    k: int,
    forced: int = 0,
    constraints: Sequence[Constraint] = (),
    subtree_ok: SubtreeOk | None = None,
    kinds: Mapping[int, Hashable] | None = None,
) -> int | None:
    """The valid ``k``-subset of ``nodes`` with the smallest ``(average distance, int)``, or
    ``None`` when there is none.

    ``nodes`` are distinct node ids in ascending order and ``rows[i][j]`` is the distance from
    ``nodes[i]`` to ``nodes[j]``. Valid: holds ``forced``, meets every capacity constraint and
    is accepted by ``subtree_ok`` (which must answer exactly, see :data:`SubtreeOk`). ``kinds``
    maps each node to a key such that swapping two nodes of equal key (and equal forced bit and
    weights) never changes ``subtree_ok``'s answers; without it, ``subtree_ok`` makes every
    node its own sub-type. Raises :class:`ValueError` when ``nodes`` are not ascending and
    distinct or ``rows`` does not match them.
    """
    nodes = list(nodes)
    if any(a >= b for a, b in zip(nodes, nodes[1:])) or (nodes and nodes[0] < 0):
        raise ValueError(f"nodes must be distinct, ascending and non-negative, got {nodes}")
    if len(rows) != len(nodes) or any(len(row) != len(nodes) for row in rows):
        raise ValueError(f"the distance rows must form a {len(nodes)}x{len(nodes)} matrix")
    universe = 0
    for v in nodes:
        universe |= 1 << v
    if k <= 0 or k > len(nodes) or forced & ~universe or forced.bit_count() > k:
        return None
    if k == 1:
        return _closest_single(rows, nodes, forced, constraints, subtree_ok)
    if subtree_ok is not None and kinds is None:
        kinds = {v: v for v in nodes}
    return _Search(rows, nodes, k, forced, constraints, subtree_ok, kinds).run()


def _closest_single(
    rows: Sequence[Sequence[int]],
    nodes: list[int],
    forced: int,
    constraints: Sequence[Constraint],
    subtree_ok: SubtreeOk | None,
) -> int | None:
    """``k == 1``: the valid node with the smallest ``(d(v, v), v)``."""
    best: tuple[int, int] | None = None
    for i, v in enumerate(nodes):
        if forced & ~(1 << v):
            continue
        if any(w.get(v, 0) < need for w, need in constraints):
            continue
        key = (rows[i][i], v)
        if (best is None or key < best) and (subtree_ok is None or subtree_ok(1 << v, 0)):
            best = key
    return None if best is None else 1 << best[1]


class _Search(Domain):
    """One :func:`closest_set` question: the branch and bound over class totals, the greedy."""

    # -- the distance bound (C3) -------------------------------------------------------------------

    def _partner_table(self, p: int, i: int) -> tuple[list[int], list[int], list[int]]:
        """Round trips from a node of class ``i`` to the nodes of classes ``p..``, cheapest first:
        (trip values, cumulative counts, cumulative sums)."""
        table = self._partners.get((p, i))
        if table is None:
            row = self.trip[i]
            items = sorted((row[j], self.hi[j] - (j == i)) for j in range(p, self.m) if self.hi[j] - (j == i) > 0)
            trips, counts, sums = [], [0], [0]
            for trip, count in items:
                trips.append(trip)
                counts.append(counts[-1] + count)
                sums.append(sums[-1] + trip * count)
            table = (trips, counts, sums)
            self._partners[(p, i)] = table
        return table

    def _smallest_trips(self, p: int, i: int, j: int) -> int:
        """Sum of the ``j`` smallest round trips from class ``i`` to the available nodes of
        classes ``p..`` (all of them when there are fewer: the state is infeasible then)."""
        if j <= 0:
            return 0
        trips, counts, sums = self._partner_table(p, i)
        at = bisect_left(counts, j)
        if at >= len(counts):
            return sums[-1]
        return sums[at - 1] + (j - counts[at - 1]) * trips[at - 1]

    def _bound2(self, p: int, r: int, lin: list[int]) -> int:
        """Twice a lower bound on what the ``r`` nodes still to choose from classes ``p..`` add to
        the distance sum (C3)."""
        if r == 0:
            return 0
        total = 0
        extra: list[tuple[int, int]] = []
        for j in range(p, self.m):
            hi = self.hi[j]
            if not hi:
                continue
            term = 2 * lin[j] + self._smallest_trips(p, j, r - 1)
            lo = self.lo[j]
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
        """Can classes ``p..`` with ``r`` nodes still meet every constraint (each on its own)?"""
        spare = r - self.lo_after[p]
        for q, need in enumerate(self.needs):
            if sums[q] >= need:
                continue
            top = self.top_after[q][p]
            if sums[q] + self.kept_after[q][p] + top[min(spare, len(top) - 1)] < need:
                return False
        return True

    # -- the branch and bound over class totals (C3, C4) -----------------------------------------------

    def best(self, limit: int | None, first: bool) -> tuple[int, list[int]] | None:
        """A valid set in the current domain with distance sum at most ``limit`` (``None``: no
        limit): the first found when ``first``, else one of minimum sum; as ``(sum, counts per
        sub-type)``, or ``None`` if there is none."""
        self.prepare()
        self._partners: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
        m, needs = self.m, self.needs
        if not self.lo_after[0] <= self.k <= self.hi_after[0]:
            return None
        bar: list[int | None] = [limit]  # largest sum still wanted (inclusive)
        found: list[tuple[int, list[int]]] = []
        totals: list[int] = []

        def rec(p: int, r: int, cost: int, lin: list[int], sums: list[int]) -> bool:
            if p == m:
                split = self.split(totals)
                if split is None:
                    return False
                found.append((cost, split))
                bar[0] = cost if first else cost - 1
                return first
            cmin = max(self.lo[p], r - self.hi_after[p + 1])
            cmax = min(self.hi[p], r - self.lo_after[p + 1])
            if self.tied[p]:
                cmax = min(cmax, totals[p - 1])
            trip = self.trip[p]
            children = []
            for c in range(cmin, cmax + 1):
                new_cost = cost + c * lin[p] + c * (c - 1) * self.inner[p]
                new_lin = lin if not c else [0] * (p + 1) + [lin[j] + c * trip[j] for j in range(p + 1, m)]
                new_sums = [x + tops[p][c - self.lo[p]] for x, tops in zip(sums, self.class_top)]
                if not self._capacity_ok(p + 1, r - c, new_sums):
                    continue
                lower = (2 * new_cost + self._bound2(p + 1, r - c, new_lin) + 1) // 2
                if bar[0] is not None and lower > bar[0]:
                    continue
                children.append((lower, -c, c, new_cost, new_lin, new_sums))
            children.sort(key=lambda child: child[:2])
            for lower, _neg, c, new_cost, new_lin, new_sums in children:
                if bar[0] is not None and lower > bar[0]:
                    break
                totals.append(c)
                done = rec(p + 1, r - c, new_cost, new_lin, new_sums)
                totals.pop()
                if done:
                    return True
            return False

        rec(0, self.k, 0, list(self.self_dist), [0] * len(needs))
        return found[-1] if found else None

    # -- the whole question (C5, C6) --------------------------------------------------------------

    def run(self) -> int | None:
        optimum = self.best(None, first=False)
        if optimum is None:
            return None
        best_sum, witness = optimum
        scale = float(self.k * self.k)
        average = float(best_sum) / scale
        limit = best_sum
        while float(limit + 1) / scale == average:
            limit += 1
        for v in sorted(self.sub_of, reverse=True):
            s = self.sub_of[v]
            if not self.open[s] or self.open[s][-1] != v:
                continue  # a kept (forced) node
            in_witness = witness[s] - len(self.kept[s]) == len(self.open[s])
            self.open[s].pop()
            if not in_witness:
                continue
            found = self.best(limit, first=True)
            if found is not None:
                witness = found[1]
            else:
                self.kept[s].append(v)
                self.kept[s].sort()
        return self.realize(witness)

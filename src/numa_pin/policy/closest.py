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
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import lru_cache
from itertools import accumulate

#: ``(weight per node, need)``: a valid set's weights add up to at least ``need``
Constraint = tuple[Mapping[int, int], int]
#: ``subtree_ok(inc, pool)``: does some valid ``k``-set ``S`` with ``inc <= S <= inc | pool`` exist?
SubtreeOk = Callable[[int, int], bool]
#: one way to take nodes from a class: (capacity sums, count per sub-type of the class)
_Option = tuple[tuple[int, ...], tuple[int, ...]]


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


def _twin_classes(rows: Sequence[Sequence[object]], cols: Sequence[Sequence[object]]) -> list[list[int]]:
    """Positions grouped into twin classes (C1), each ascending, classes by first position."""
    rows = [list(row) for row in rows]
    cols = [list(col) for col in cols]
    classes: list[list[int]] = []
    n = len(rows)
    for i in range(n):
        for members in classes:
            r = members[0]
            j = 0 if r else 1 if i != 1 else 2  # a position other than i and r (r < i)
            if j < n and (rows[i][j] != rows[r][j] or cols[i][j] != cols[r][j]):
                continue
            row = list(rows[r])
            row[i], row[r] = row[r], row[i]
            if row != rows[i]:
                continue
            col = list(cols[r])
            col[i], col[r] = col[r], col[i]
            if col == cols[i]:
                members.append(i)
                break
        else:
            classes.append([i])
    return classes


@lru_cache(maxsize=8)
def _matrix_classes(rows: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """The twin classes of a distance matrix (cached: the merge asks about the same machine
    repeatedly, and a warm agent about every admission)."""
    return tuple(tuple(c) for c in _twin_classes(rows, _transpose(rows)))


def _transpose(rows: Sequence[Sequence[object]]) -> list[list[object]]:
    return [[row[i] for row in rows] for i in range(len(rows))]


class _Search:
    """One :func:`closest_set` question: classes and sub-types, the branch and bound, the greedy."""

    def __init__(
        self,
        rows: Sequence[Sequence[int]],
        nodes: list[int],
        k: int,
        forced: int,
        constraints: Sequence[Constraint],
        subtree_ok: SubtreeOk | None,
        kinds: Mapping[int, Hashable] | None,
    ) -> None:
        self.k = k
        self.subtree_ok = subtree_ok
        self.needs = [need for _w, need in constraints]
        classes = [list(c) for c in _matrix_classes(tuple(tuple(row) for row in rows))]

        def key(v: int) -> Hashable:
            return (forced >> v & 1, tuple(w.get(v, 0) for w, _need in constraints),
                    None if kinds is None else kinds[v])

        # C4: order the classes so that interchangeable ones are adjacent
        makeup = [frozenset(Counter(key(nodes[i]) for i in members).items()) for members in classes]
        qrows: list[list[object]] = [
            [
                (makeup[ci], rows[c[0]][c[0]], rows[c[0]][c[-1]]) if ci == di else rows[c[0]][d[0]]
                for di, d in enumerate(classes)
            ]
            for ci, c in enumerate(classes)
        ]
        orbits = _twin_classes(qrows, _transpose(qrows))
        classes = [classes[i] for orbit in orbits for i in orbit]
        self.same_as_previous = [i > 0 for orbit in orbits for i in range(len(orbit))]
        self.m = m = len(classes)
        self.self_dist = [rows[c[0]][c[0]] for c in classes]
        self.inner = [rows[c[0]][c[1]] if len(c) > 1 else 0 for c in classes]
        block = [[rows[c[0]][d[0]] for d in classes] for c in classes]
        self.block = block
        # round trip between a node of class i and another node of class j (i == j: inside it)
        self.trip = [
            [2 * self.inner[i] if i == j else block[i][j] + block[j][i] for j in range(m)] for i in range(m)
        ]
        # sub-types (C2): global indices; per class, its sub-types in order of their first node
        self.subs: list[list[int]] = []  # class -> sub-type indices
        self.sub_key: list[Hashable] = []
        self.sub_weight: list[tuple[int, ...]] = []
        self.kept: list[list[int]] = []  # sub-type -> nodes in every answer (ascending)
        self.open: list[list[int]] = []  # sub-type -> undecided nodes (ascending)
        self.sub_of: dict[int, int] = {}
        for members in classes:
            by_key: dict[Hashable, list[int]] = {}
            for i in members:
                by_key.setdefault(key(nodes[i]), []).append(nodes[i])
            mine = []
            for sub_key, sub_nodes in by_key.items():
                s = len(self.sub_key)
                mine.append(s)
                self.sub_key.append(sub_key)
                self.sub_weight.append(tuple(w.get(sub_nodes[0], 0) for w, _need in constraints))
                is_forced = forced >> sub_nodes[0] & 1
                self.kept.append(list(sub_nodes) if is_forced else [])
                self.open.append([] if is_forced else list(sub_nodes))
                for v in sub_nodes:
                    self.sub_of[v] = s
            self.subs.append(mine)
        self._oracle_cache: dict[tuple[object, ...], bool] = {}
        self._options_cache: dict[tuple[object, ...], list[_Option]] = {}

    # -- sets, sums and the oracle ---------------------------------------------------------

    def cost(self, totals: Sequence[int]) -> int:
        """``f(c)``: the distance sum of any set with these class totals (C1)."""
        total = 0
        for i, c in enumerate(totals):
            if c:
                total += c * self.self_dist[i] + c * (c - 1) * self.inner[i]
                row = self.block[i]
                total += c * sum(row[j] * totals[j] for j in range(self.m) if j != i)
        return total

    def realize(self, take: Sequence[int]) -> int:
        """The smallest-integer set with ``take[s]`` nodes of each sub-type in the domain: its
        kept nodes plus its lowest undecided ones."""
        mask = 0
        for s, count in enumerate(take):
            for v in self.kept[s]:
                mask |= 1 << v
            for v in self.open[s][: count - len(self.kept[s])]:
                mask |= 1 << v
        return mask

    def _masks(self) -> None:
        """Bit masks of the current domain: per sub-type, its kept nodes plus its ``j`` lowest
        undecided ones (``taken[s][j]``); per class index ``i``, the kept and the undecided
        nodes of classes ``i..``."""
        self.taken: list[list[int]] = []
        for s in range(len(self.kept)):
            base = 0
            for v in self.kept[s]:
                base |= 1 << v
            prefix = [base]
            for v in self.open[s]:
                prefix.append(prefix[-1] | 1 << v)
            self.taken.append(prefix)
        self.kept_from = [0] * (self.m + 1)
        self.open_from = [0] * (self.m + 1)
        for i in range(self.m - 1, -1, -1):
            kept, spare = self.kept_from[i + 1], self.open_from[i + 1]
            for s in self.subs[i]:
                kept |= self.taken[s][0]
                spare |= self.taken[s][-1] & ~self.taken[s][0]
            self.kept_from[i], self.open_from[i] = kept, spare

    def _oracle(self, take: Sequence[int], upto: int) -> bool:
        """``subtree_ok`` with the classes before ``upto`` at ``take`` (per sub-type, for those
        classes), every other class's kept nodes in and its undecided nodes optional."""
        if self.subtree_ok is None:
            return True
        later = self._later.get(upto)
        if later is None:
            later = tuple(
                x for i in range(upto, self.m) for s in self.subs[i] for x in (len(self.kept[s]), len(self.open[s]))
            )
            self._later[upto] = later
        key = (upto, later, *take)
        found = self._oracle_cache.get(key)
        if found is None:
            inc = self.kept_from[upto]
            for s, count in enumerate(take):
                inc |= self.taken[s][count - len(self.kept[s])]
            found = self.subtree_ok(inc, self.open_from[upto])
            self._oracle_cache[key] = found
        return found

    # -- per-call tables over the current domain -------------------------------------------------

    def _prepare(self) -> None:
        m = self.m
        self.lo = [sum(len(self.kept[s]) for s in self.subs[i]) for i in range(m)]
        self.hi = [self.lo[i] + sum(len(self.open[s]) for s in self.subs[i]) for i in range(m)]
        self.lo_after = list(accumulate(reversed(self.lo), initial=0))[::-1]
        self.hi_after = list(accumulate(reversed(self.hi), initial=0))[::-1]
        if self.subtree_ok is not None:
            self._masks()
            self._later: dict[int, tuple[int, ...]] = {}
        self._partners: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
        self._splits: dict[tuple[int, ...], list[int] | None] = {}
        self.state = [
            frozenset((self.sub_key[s], len(self.kept[s]), len(self.open[s])) for s in self.subs[i])
            for i in range(m)
        ]
        # tied[i]: interchangeable with class i - 1 over the same domain (C4)
        self.tied = [self.same_as_previous[i] and self.state[i] == self.state[i - 1] for i in range(m)]
        # capacity, per constraint q: required weight of classes i.. and, for the nodes beyond
        # the required ones, the sums of the heaviest undecided weights of classes i..
        self.kept_after: list[list[int]] = []
        self.top_after: list[list[list[int]]] = []
        self.class_top: list[list[list[int]]] = []  # [q][i][j]: kept + heaviest j undecided
        for q in range(len(self.needs)):
            kept_after = [0] * (m + 1)
            top_after: list[list[int]] = [[0]] * (m + 1)
            class_top: list[list[int]] = []
            pooled: list[int] = []
            for i in range(m):
                kept = sum(len(self.kept[s]) * self.sub_weight[s][q] for s in self.subs[i])
                spare = sorted((self.sub_weight[s][q] for s in self.subs[i] for _v in self.open[s]), reverse=True)
                class_top.append(list(accumulate(spare, initial=kept)))
            for i in range(m - 1, -1, -1):
                kept_after[i] = kept_after[i + 1] + class_top[i][0]
                pooled = sorted(
                    pooled + [self.sub_weight[s][q] for s in self.subs[i] for _v in self.open[s]], reverse=True
                )
                top_after[i] = list(accumulate(pooled, initial=0))
            self.kept_after.append(kept_after)
            self.top_after.append(top_after)
            self.class_top.append(class_top)

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

    # -- splits of a vector of totals (C2, C3) -------------------------------------------------------

    def _options(self, i: int, total: int) -> list[_Option]:
        """The ways to take ``total`` nodes from class ``i`` (kept ones included), as capacity sums
        and counts per sub-type; only the Pareto-maximal sums when validity is capacity alone.
        Heaviest first."""
        subs = self.subs[i]
        key = (i, total, *(x for s in subs for x in (len(self.kept[s]), len(self.open[s]))))
        found = self._options_cache.get(key)
        if found is not None:
            return found
        dims = len(self.needs)
        start = tuple(sum(len(self.kept[s]) * self.sub_weight[s][q] for s in subs) for q in range(dims))
        if total == self.lo[i]:  # the kept nodes only
            found = [(start, tuple(len(self.kept[s]) for s in subs))]
            self._options_cache[key] = found
            return found
        # partial[j]: options using j undecided nodes of the sub-types seen so far
        partial: dict[int, list[_Option]] = {0: [(start, ())]}
        for s in subs:
            weight, kept, spare = self.sub_weight[s], len(self.kept[s]), len(self.open[s])
            grown: dict[int, list[_Option]] = {}
            for used, options in partial.items():
                for extra in range(min(spare, total - self.lo[i] - used) + 1):
                    bucket = grown.setdefault(used + extra, [])
                    for sums, counts in options:
                        bucket.append(
                            (tuple(x + extra * w for x, w in zip(sums, weight)), (*counts, kept + extra))
                        )
            partial = grown
            if self.subtree_ok is None:
                partial = {used: _pareto(options) for used, options in partial.items()}
        found = partial.get(total - self.lo[i], [])
        found.sort(key=lambda option: tuple(-x for x in option[0]))
        self._options_cache[key] = found
        return found

    def _split(self, totals: Sequence[int]) -> list[int] | None:
        """A valid set with these class totals, as counts per sub-type, or ``None``."""
        key = tuple(totals)
        if key in self._splits:
            return self._splits[key]
        m, needs = self.m, self.needs
        options = [self._options(i, totals[i]) for i in range(m)]
        # best[q][i]: the most constraint q can get from classes i.. at these totals
        best = []
        for tops in self.class_top:
            most = [tops[i][totals[i] - self.lo[i]] for i in range(m)]
            best.append(list(accumulate(reversed(most), initial=0))[::-1])
        take: list[int] = []
        failed: set[tuple[object, ...]] = set()

        def rec(i: int, sums: tuple[int, ...]) -> bool:
            if any(s + b[i] < need for s, b, need in zip(sums, best, needs)):
                return False
            if i == m:
                return self._oracle(take, m)
            memo = (i, *(min(s, need) for s, need in zip(sums, needs)))
            if self.subtree_ok is None and memo in failed:
                return False
            for option_sums, counts in options[i]:
                take.extend(counts)
                if (i + 1 == m or self._oracle(take, i + 1)) and rec(
                    i + 1, tuple(a + b for a, b in zip(sums, option_sums))
                ):
                    return True
                del take[len(take) - len(counts):]
            failed.add(memo)
            return False

        found = list(take) if rec(0, tuple(0 for _ in needs)) else None
        self._splits[key] = found
        return found

    # -- the branch and bound over class totals (C3, C4) -----------------------------------------------

    def best(self, limit: int | None, first: bool) -> tuple[int, list[int]] | None:
        """A valid set in the current domain with distance sum at most ``limit`` (``None``: no
        limit): the first found when ``first``, else one of minimum sum; as ``(sum, counts per
        sub-type)``, or ``None`` if there is none."""
        self._prepare()
        m, needs = self.m, self.needs
        if not self.lo_after[0] <= self.k <= self.hi_after[0]:
            return None
        bar: list[int | None] = [limit]  # largest sum still wanted (inclusive)
        found: list[tuple[int, list[int]]] = []
        totals: list[int] = []

        def rec(p: int, r: int, cost: int, lin: list[int], sums: list[int]) -> bool:
            if p == m:
                split = self._split(totals)
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


def _pareto(options: list[_Option]) -> list[_Option]:
    """The options whose sums no other option's sums reach in every constraint (one per sums)."""
    kept: list[_Option] = []
    for option in sorted(options, key=lambda o: tuple(-x for x in o[0])):
        if not any(all(a >= b for a, b in zip(other[0], option[0])) for other in kept):
            kept.append(option)
    return kept

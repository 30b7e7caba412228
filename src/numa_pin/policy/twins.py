"""The symmetry of one prefer-closest question (facts C1, C2 and C4 of :mod:`~numa_pin.policy.closest`).

:func:`twin_classes` groups the nodes whose swap leaves the distance matrix unchanged; a
:class:`Domain` holds one question's classes (ordered so that interchangeable classes are
adjacent), their sub-types, the nodes still undecided, the distance sum of a vector of class
totals and whether some valid set has those totals (a split per sub-type, asked of the caller's
exact oracle). The branch and bound over the totals is :class:`~numa_pin.policy.closest._Search`.
"""

from __future__ import annotations

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


def twin_classes(rows: Sequence[Sequence[object]], cols: Sequence[Sequence[object]]) -> list[list[int]]:
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
    return tuple(tuple(c) for c in twin_classes(rows, _transpose(rows)))


def _transpose(rows: Sequence[Sequence[object]]) -> list[list[object]]:
    return [[row[i] for row in rows] for i in range(len(rows))]


class Domain:
    """One question's classes and sub-types over the current domain (kept and undecided nodes),
    the sums of class totals and the splits of a vector of totals into a valid set."""

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
        orbits = twin_classes(qrows, _transpose(qrows))
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

    def prepare(self) -> None:
        m = self.m
        self.lo = [sum(len(self.kept[s]) for s in self.subs[i]) for i in range(m)]
        self.hi = [self.lo[i] + sum(len(self.open[s]) for s in self.subs[i]) for i in range(m)]
        self.lo_after = list(accumulate(reversed(self.lo), initial=0))[::-1]
        self.hi_after = list(accumulate(reversed(self.hi), initial=0))[::-1]
        if self.subtree_ok is not None:
            self._masks()
            self._later: dict[int, tuple[int, ...]] = {}
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

    def split(self, totals: Sequence[int]) -> list[int] | None:
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


def _pareto(options: list[_Option]) -> list[_Option]:
    """The options whose sums no other option's sums reach in every constraint (one per sums)."""
    kept: list[_Option] = []
    for option in sorted(options, key=lambda o: tuple(-x for x in o[0])):
        if not any(all(a >= b for a, b in zip(other[0], option[0])) for other in kept):
            kept.append(option)
    return kept

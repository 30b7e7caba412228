"""How few of a set of vectors cover a need in every dimension (pure): the core of the memory
provider's scalable form (:func:`numa_pin.providers.memory.memory_hint_family`), where the
vectors are the free amounts per NUMA node of every requested memory resource.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def min_cover_size(vectors: Sequence[Sequence[int]], need: Sequence[int], base: int = 1) -> int | None:
    """Smallest ``k >= base`` such that some ``k`` of ``vectors`` sum to at least ``need`` in
    every dimension; ``None`` when there are fewer than ``base`` vectors or all of them together
    fall short. Values must be >= 0.

    Exact: a branch and bound over groups of identical vectors, pruned by the best
    ``k`` remaining values per dimension.
    """
    vectors = [tuple(v) for v in vectors]
    dims = len(need)
    if base > len(vectors) or any(sum(v[d] for v in vectors) < need[d] for d in range(dims)):
        return None
    lower = base
    for d in range(dims):
        acc = 0
        for i, value in enumerate(sorted((v[d] for v in vectors), reverse=True), 1):
            if acc >= need[d]:
                break
            acc += value
            if acc >= need[d]:
                lower = max(lower, i)
    for k in range(lower, len(vectors) + 1):
        if covers(vectors, need, k):
            return k
    return len(vectors)  # pragma: no cover - the full set covers, checked above


def covers(vectors: Sequence[Sequence[int]], need: Sequence[int], k: int) -> bool:
    """Do at most ``k`` of ``vectors`` sum to at least ``need`` in every dimension?"""
    groups = sorted(Counter(vectors).items(), key=lambda kv: tuple(-x for x in kv[0]))
    dims = len(need)
    # best[i][d][r]: the largest sum of r values of dimension d among groups[i:]
    best: list[list[list[int]]] = [[[0] for _ in range(dims)] for _ in range(len(groups) + 1)]
    tops: list[list[int]] = [[] for _ in range(dims)]
    for i in range(len(groups) - 1, -1, -1):
        vec, cnt = groups[i]
        for d in range(dims):
            tops[d] = sorted(tops[d] + [vec[d]] * min(cnt, k), reverse=True)[:k]
            prefix = [0]
            for value in tops[d]:
                prefix.append(prefix[-1] + value)
            best[i][d] = prefix

    def search(i: int, left: int, totals: tuple[int, ...]) -> bool:
        if all(t >= n for t, n in zip(totals, need)):
            return True
        if left == 0 or i == len(groups):
            return False
        for d in range(dims):
            prefix = best[i][d]
            if totals[d] + prefix[min(left, len(prefix) - 1)] < need[d]:
                return False
        vec, cnt = groups[i]
        for c in range(min(cnt, left), -1, -1):
            if search(i + 1, left - c, tuple(t + c * x for t, x in zip(totals, vec))):
                return True
        return False

    return search(0, k, (0,) * dims)


__all__ = ["covers", "min_cover_size"]

"""kubelet's ``takeByTopologyNUMADistributed`` (``distribute-cpus-across-numa``). Pure code.

Spreads a request evenly over the fewest NUMA nodes that can hold it, in groups of
``group_size`` CPUs (``cpu-memory-device.md`` §4):

1. requests that are not a multiple of the group size fall back to the packed allocator;
2. for k = kmin..kmax, every k-combination of the available NUMA nodes (kubelet's NUMA order)
   gets an even share ``dist`` per node plus a remainder handed out in groups; the combination
   (and remainder subset) leaving the most balanced machine wins (population stdev, rounded to
   3 decimals exactly as Go's ``math.Round``);
3. the winning split is allocated node by node with the packed allocator;
4. if no k works, the packed allocator takes over.

Two deliberate differences, neither of which changes a result kubelet would return:

* kubelet's two remainder loops spin forever when the free CPUs add up but no node holds a
  whole group; both loops here stop when a pass makes no progress;
* kubelet scores every combination. Nodes with equal free counts are interchangeable and
  kubelet keeps the first of equal scores, so only the first combination of each multiset of
  free counts is scored (the NUMA order keeps equal counts adjacent). An idle 32-node machine
  costs a handful of evaluations instead of millions; past :data:`SEARCH_BUDGET` evaluations
  the request fails with :class:`~numa_pin.errors.AllocationError` instead of stalling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from numa_pin.allocators.cpu_packed import PACKED, CpuAccumulator, not_enough_cpus, take_packed
from numa_pin.base.record import record
from numa_pin.errors import AllocationError
from numa_pin.topology.cpus import CpuTopology


def _go_round3(x: float) -> float:
    """``math.Round(x*1000)/1000`` with Go's half-away-from-zero rule."""
    y = x * 1000
    t = math.trunc(y)
    if abs(y - t) >= 0.5:
        t += 1 if y > 0 else -1
    return t / 1000


def standard_deviation(values: Sequence[int]) -> float:
    """kubelet's population standard deviation: mean and result rounded to 3 decimals."""
    if not values:
        return 0.0
    mean = _go_round3(sum(float(v) for v in values) / len(values))
    total = 0.0
    for v in values:
        total += (float(v) - mean) * (float(v) - mean)
    return _go_round3(math.sqrt(total / len(values)))


def _ceil_div(a: int, b: int) -> int:
    return (a - 1) // b + 1


def numa_range(
    topology: CpuTopology, available_numas: int, need: int, group: int
) -> tuple[int, int]:
    """``(kmin, kmax)``: how few and how many NUMA nodes a request of ``need`` CPUs can span."""
    total_nodes = len(topology.numa_nodes())
    groups = _ceil_div(topology.num_cpus, group)
    per_numa = _ceil_div(groups, total_nodes)
    need_groups = _ceil_div(need, group)
    return _ceil_div(need_groups, per_numa), min(need_groups, available_numas)


@record
class _Split:
    """One candidate: the NUMA combination, its even share and the remainder subset."""

    combo: tuple[int, ...]
    dist: int
    remainder: tuple[int, ...]
    balance: float


#: most (combination or remainder-subset) evaluations one request may cost before giving up
SEARCH_BUDGET = 100_000


class _Budget:
    """Counts scored candidates; raises once more than ``limit`` were needed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise AllocationError(
                "distribute-cpus-across-numa: too many NUMA node combinations to balance "
                f"(more than {self.limit}); disable the option on this machine"
            )


def _blocks(values: Sequence[int]) -> list[int]:
    """Lengths of the runs of equal neighbours in ``values``."""
    runs: list[int] = []
    for i, v in enumerate(values):
        if i and v == values[i - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def _first_realizations(values: Sequence[int], size: int) -> Iterator[tuple[int, ...]]:
    """Positions of the lexicographically first ``size``-combination of each value multiset.

    ``values`` must keep equal values adjacent. Combinations that only swap equal values score
    the same, and kubelet keeps the first of equal scores, so only these need scoring.
    """
    runs = _blocks(values)
    starts = [sum(runs[:i]) for i in range(len(runs))]

    def pick(i: int, left: int) -> Iterator[tuple[int, ...]]:
        if i == len(runs):
            if left == 0:
                yield ()
            return
        rest = sum(runs[i + 1 :])
        for take in range(min(runs[i], left), max(0, left - rest) - 1, -1):
            for tail in pick(i + 1, left - take):
                yield tuple(range(starts[i], starts[i] + take)) + tail

    yield from pick(0, size)


def _spread_remainder(after: dict[int, int], subset: Sequence[int], rem: int, group: int) -> bool:
    """Hand ``rem`` CPUs to ``subset`` in groups, cycling (mutates ``after``). False if stuck."""
    while rem > 0:
        progressed = False
        for numa in subset:
            if rem == 0:
                break
            if after[numa] < group:
                continue
            after[numa] -= group
            rem -= group
            progressed = True
        if not progressed:
            return False
    return True


def _best_remainder(
    after: dict[int, int], candidates: list[int], rem: int, group: int, budget: _Budget
) -> tuple[float, tuple[int, ...]] | None:
    """kubelet's remainder search: subsets largest first, first of the lowest stdev wins."""
    values = [after[n] for n in candidates]
    best: tuple[float, int, tuple[int, ...]] | None = None
    for size in range(len(candidates), 0, -1):
        for positions in _first_realizations(values, size):
            budget.spend()
            subset = tuple(candidates[p] for p in positions)
            if sum(after[n] for n in subset) < rem:
                continue
            trial = dict(after)
            if not _spread_remainder(trial, subset, rem, group):
                continue
            key = (standard_deviation(list(trial.values())), -size, positions)
            if best is None or key < best:
                best = key
    if best is None:
        return None
    return best[0], tuple(candidates[p] for p in best[2])


def _score(
    free: dict[int, int],
    numas: list[int],
    combo: tuple[int, ...],
    need: int,
    group: int,
    budget: _Budget,
) -> _Split | None:
    """Score one NUMA combination (§4 step 5); ``None`` when it is skipped or cannot fit."""
    if sum(free[n] for n in combo) < need:
        return None
    if sum(free[n] // group for n in combo) * group < need:
        return None
    dist = need // len(combo) // group * group
    if any(free[n] < dist for n in combo):
        return None
    after = {n: free[n] for n in numas}
    for n in combo:
        after[n] -= dist
    rem = need - dist * len(combo)
    if rem == 0:
        return _Split(combo, dist, (), standard_deviation(list(after.values())))
    found = _best_remainder(after, [n for n in combo if after[n] >= group], rem, group, budget)
    if found is None:
        return None
    return _Split(combo, dist, found[1], found[0])


def _best_split(
    free: dict[int, int], numas: list[int], k: int, need: int, group: int, budget: _Budget
) -> _Split | None:
    """The first k-combination (in kubelet's order) with the lowest balance."""
    best: tuple[float, tuple[int, ...], _Split] | None = None
    for positions in _first_realizations([free[n] for n in numas], k):
        budget.spend()
        split = _score(free, numas, tuple(numas[p] for p in positions), need, group, budget)
        if split is not None and (best is None or (split.balance, positions) < best[:2]):
            best = (split.balance, positions, split)
    return None if best is None else best[2]


def _allocate_split(
    acc: CpuAccumulator, split: _Split, need: int, group: int, strategy: str
) -> None:
    topo = acc.topology
    for numa in split.combo:
        pool = topo.cpus_in_numa_nodes(numa) & acc.free
        acc.take(take_packed(topo, pool, split.dist, strategy))
    rem = need - split.dist * len(split.combo)
    while rem > 0:
        progressed = False
        for numa in split.remainder:
            if rem == 0:
                break
            pool = topo.cpus_in_numa_nodes(numa) & acc.free
            if len(pool) < group:
                continue
            acc.take(take_packed(topo, pool, group, strategy))
            rem -= group
            progressed = True
        if not progressed:
            break
    if acc.need > 0:
        raise AllocationError(
            f"accounting error, not enough CPUs allocated, remaining: {acc.need}"
        )
    if acc.need < 0:
        raise AllocationError(f"accounting error, too many CPUs allocated, remaining: {acc.need}")


def take_distributed(
    topology: CpuTopology,
    available: Iterable[int],
    count: int,
    group_size: int = 1,
    strategy: str = PACKED,
) -> frozenset[int]:
    """``takeByTopologyNUMADistributed`` (§4).

    Raises :class:`~numa_pin.errors.AllocationError`: kubelet's over-request text, an
    ``accounting error`` if the split does not add up, or for a group size below 1.
    """
    if group_size < 1:
        raise AllocationError(f"cpu group size must be at least 1, got {group_size}")
    pool = frozenset(available)
    if count % group_size != 0:
        return take_packed(topology, pool, count, strategy, prefer_uncore=False)
    acc = CpuAccumulator(topology, pool, count, strategy)
    if acc.satisfied:
        return frozenset()
    if acc.failed:
        raise not_enough_cpus(count, len(pool))
    numas = acc.numa_order()
    available_now = acc.free
    free = {n: len(topology.cpus_in_numa_nodes(n) & available_now) for n in numas}
    kmin, kmax = numa_range(topology, len(numas), count, group_size)
    budget = _Budget(SEARCH_BUDGET)
    for k in range(kmin, kmax + 1):
        split = _best_split(free, numas, k, count, group_size, budget)
        if split is not None:
            _allocate_split(acc, split, count, group_size, strategy)
            return frozenset(acc.result)
    return take_packed(topology, pool, count, strategy, prefer_uncore=False)


__all__ = ["numa_range", "standard_deviation", "take_distributed"]

"""takeByTopologyNUMADistributed (§4): kubelet's ``cpu_assignment_test.go`` expectations."""

from __future__ import annotations

import pytest
from cpu_kubelet_topologies import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_HT,
    DUAL_SOCKET_MULTI_NUMA_HT_LARGE,
    SINGLE_SOCKET_HT,
    cpus,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_cpu_packed import COMMON

from numa_pin.allocators.cpu import take_cpus
from numa_pin.allocators.cpu_distribute import numa_range, standard_deviation, take_distributed
from numa_pin.allocators.cpu_packed import take_packed
from numa_pin.errors import AllocationError
from numa_pin.topology.cpus import CpuInfo, CpuTopology

# kubelet commonTakeByTopologyExtendedTestCases + TestTakeByTopologyNUMADistributed
EXTENDED = [(name, topo, free, count, 1, expected) for name, topo, free, count, expected in COMMON] + [
    ("allocate 4 full cores with 2 distributed across each NUMA node", DUAL_SOCKET_HT, "0-11", 8, 1, "0,6,2,8,1,7,3,9"),
    ("allocate 32 full cores with 8 distributed across each NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 64, 1,
     "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77"),
    ("allocate 24 full cores with 8 distributed across the first 3 NUMA nodes", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 48, 1,
     "0-7,10-17,20-27,40-47,50-57,60-67"),
    ("24 full cores across the first 3 NUMA nodes (all but 2 from the first)", DUAL_SOCKET_MULTI_NUMA_HT,
     "1-29,32-39,41-69,72-79", 48, 1, "1-8,10-17,20-27,41-48,50-57,60-67"),
    ("24 full cores across the last 3 NUMA nodes (even though the first could hold 8)", DUAL_SOCKET_MULTI_NUMA_HT,
     "2-29,31-39,42-69,71-79", 48, 1, "10-17,20-27,31-38,50-57,60-67,71-78"),
    ("allocate 8 full cores with 2 distributed across each NUMA node", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71", 16, 1, "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71"),
    ("take one cpu from dual socket with HT - core from Socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, 1, "1"),
    ("take one cpu from dual socket with HT - core from Socket 0 - cpuGroupSize 2", DUAL_SOCKET_HT, "1-5,7-11", 1, 2, "2"),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 26, 1,
     "0-6,10-16,40-45,50-55"),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes (cpuGroupSize 2)", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-79", 26, 2, "0-6,10-15,40-46,50-55"),
    ("31 full cores, 15 CPUs per NUMA node and 1 spilling over to NUMA 0, 1", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 62, 1,
     "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76"),
    ("31 full cores, 14 CPUs per NUMA node and 2 spilling over to NUMA 0, 1, 2 (cpuGroupSize 2)",
     DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 62, 2, "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76"),
    ("31 full cores, 15 CPUs per NUMA node and 1 spilling over to NUMA 2, 3 (to keep balance)",
     DUAL_SOCKET_MULTI_NUMA_HT, "0-8,10-18,20-39,40-48,50-58,60-79", 62, 1,
     "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77"),
    ("31 full cores, 14 CPUs per NUMA node and 2 spilling over to NUMA 0, 2, 3 (balance, cpuGroupSize 2)",
     DUAL_SOCKET_MULTI_NUMA_HT, "0-8,10-18,20-39,40-48,50-58,60-79", 62, 2,
     "0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77"),
    ("ensure bestRemainder chosen with NUMA nodes that have enough CPUs to satisfy the request",
     DUAL_SOCKET_MULTI_NUMA_HT, "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76", 34, 1,
     "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74"),
    ("ensure previous failure encountered on live machine has been fixed (1/1)", DUAL_SOCKET_MULTI_NUMA_HT_LARGE,
     "0,128,30,31,158,159,43-47,171-175,62,63,190,191,75-79,203-207,94,96,222,223,101-111,229-239,126,127,254,255",
     28, 1, "43-47,75-79,96,101-105,171-174,203-206,229-232"),
]


@pytest.mark.parametrize("topo, free, count, group, expected", [c[1:] for c in EXTENDED], ids=[c[0] for c in EXTENDED])
def test_take_distributed(topo, free, count, group, expected):
    assert take_distributed(topo, cpus(free), count, group) == cpus(expected)


def test_dispatcher_reaches_the_distributed_allocator():
    got = take_cpus(DUAL_SOCKET_HT, cpus("0-11"), 8, distribute_across_numa=True)
    assert got == cpus("0,6,2,8,1,7,3,9")
    assert take_cpus(DUAL_SOCKET_HT, cpus("0-11"), 8) == cpus("0,6,2,8,4,10,1,7")


def test_not_a_multiple_of_the_group_falls_back_to_packed():
    free = cpus("1-5,7-11")
    assert take_distributed(DUAL_SOCKET_HT, free, 3, 2) == take_packed(DUAL_SOCKET_HT, free, 3)


def test_over_request_error_text():
    with pytest.raises(AllocationError) as info:
        take_distributed(SINGLE_SOCKET_HT, cpus("0,2,4,6"), 6, 2)
    assert str(info.value) == "not enough cpus available to satisfy request: requested=6, available=4"


def test_zero_cpus_and_bad_group():
    assert take_distributed(SINGLE_SOCKET_HT, range(8), 0) == frozenset()
    with pytest.raises(AllocationError, match="cpu group size must be at least 1, got 0"):
        take_distributed(SINGLE_SOCKET_HT, range(8), 2, 0)


@pytest.mark.parametrize(
    "values, expected",
    [
        ([0, 0, 0], 0.0),
        ([1, 2, 3, 4], 1.118),  # sqrt(1.25) = 1.1180339...
        ([10, 0], 5.0),
        ([1, 2], 0.5),
        ([0, 0, 1], 0.471),  # mean rounds to 0.333 first: sqrt((2*0.333^2 + 0.667^2)/3) = 0.4714...
        ([2, 3, 3], 0.471),
    ],
    ids=["flat", "four-values", "two-far", "half", "mean-rounded-first", "shifted"],
)
def test_standard_deviation_rounds_like_go(values, expected):
    assert standard_deviation(values) == expected


@pytest.mark.parametrize(
    "x, expected",
    [(0.0005, 0.001), (0.0025, 0.003), (-0.0025, -0.003), (0.1235, 0.124), (0.0024, 0.002)],
    ids=["half-up", "half-not-to-even", "negative-half", "123.5", "below-half"],
)
def test_go_round_half_away_from_zero(x, expected):
    """Go's math.Round rounds x*1000 halves away from zero; Python's round() would go to even."""
    from numa_pin.allocators.cpu_distribute import _go_round3

    assert _go_round3(x) == expected


@pytest.mark.parametrize(
    "topo, free_numas, need, group, expected",
    [
        (DUAL_SOCKET_MULTI_NUMA_HT, 4, 48, 1, (3, 4)),  # 80 cpus / 4 nodes = 20 per node
        (DUAL_SOCKET_MULTI_NUMA_HT, 4, 62, 2, (4, 4)),
        (DUAL_SOCKET_MULTI_NUMA_HT, 3, 2, 1, (1, 2)),
        (DUAL_SOCKET_HT, 2, 1, 1, (1, 1)),
    ],
    ids=["48-of-80", "62-groups-of-2", "kmax-is-need", "single"],
)
def test_numa_range(topo, free_numas, need, group, expected):
    assert numa_range(topo, free_numas, need, group) == expected


def test_remainder_subset_that_kubelet_would_spin_on():
    """Derived by hand: 4 NUMA nodes x 5 CPUs (0-4, 5-9, ...), 14 CPUs in groups of 2.

    kmin = 3, but 3 nodes hold only 6 groups (12 < 14), so k = 4: dist = 2 each, remainder 6,
    every node keeps 3 free. Subsets of 4 and of 3 nodes absorb the remainder (balance
    stdev(1,1,1,3) = 0.866 for both; the first, all 4 nodes, wins). A subset of 2 nodes has
    3 + 3 >= 6 but can only give 2 + 2: kubelet's cycling loop never ends there; ours drops it.
    Allocation: 2 per node, then 2 more to nodes 0, 1, 2 in turn."""
    infos = [CpuInfo(c, 0, c // 5, c) for c in range(20)]
    topo = CpuTopology.from_cpus(infos)
    got = take_distributed(topo, range(20), 14, 2)
    assert got == cpus("0-3,5-8,10-13,15-16")


def test_idle_many_node_machine_is_fast_and_balanced():
    """32 NUMA nodes x 8 CPUs, all free: every node has the same free count, so one multiset per
    k is scored. 64 CPUs over 8 nodes of 8 (kmin = 8, remainder 0, stdev minimal for k = 8)."""
    topo = CpuTopology.from_cpus([CpuInfo(c, c // 128, c // 8, c) for c in range(256)])
    got = take_distributed(topo, range(256), 64)
    assert got == frozenset(range(64))


def test_search_budget_fails_loudly(monkeypatch):
    import numa_pin.allocators.cpu_distribute as mod

    monkeypatch.setattr(mod, "SEARCH_BUDGET", 3)
    topo = CpuTopology.from_cpus([CpuInfo(c, 0, c // 4, c) for c in range(24)])
    free = [c for c in range(24) if c % 4 < 1 + (c // 4) % 3]  # unequal free counts per node
    with pytest.raises(AllocationError, match="too many NUMA node combinations to balance"):
        take_distributed(topo, free, 6)


# ---- independent oracle: kubelet's loops written out plainly ---------------------------------
class _Spins(Exception):
    """kubelet's remainder loop would never end on this input."""


def _kubelet_reference(topo, avail, n, g):
    """takeByTopologyNUMADistributed as kubelet's Go reads, every combination scored."""
    from itertools import combinations

    from numa_pin.allocators.cpu_packed import CpuAccumulator

    if n % g:
        return take_packed(topo, avail, n)
    acc = CpuAccumulator(topo, avail, n)
    if acc.satisfied:
        return frozenset()
    numas = acc.numa_order()
    free = {m: len(topo.cpus_in_numa_nodes(m) & acc.free) for m in numas}
    kmin, kmax = numa_range(topo, len(numas), n, g)
    for k in range(kmin, kmax + 1):
        best_balance, best_combo, best_rem = float("inf"), None, None
        for combo in combinations(numas, k):
            if best_balance == 0:
                break
            if sum(free[m] for m in combo) < n or sum(free[m] // g for m in combo) * g < n:
                continue
            dist = n // k // g * g
            if any(free[m] < dist for m in combo):
                continue
            after = dict(free)
            for m in combo:
                after[m] -= dist
            rem = n - dist * k
            local, local_rem = float("inf"), None
            if rem == 0:
                local = standard_deviation(list(after.values()))
            cands = [m for m in combo if after[m] >= g]
            for size in range(len(cands), 0, -1):
                if rem == 0:
                    break
                for subset in combinations(cands, size):
                    if sum(after[m] for m in subset) < rem:
                        continue
                    trial, left, spins = dict(after), rem, 0
                    while left > 0:
                        spins += 1
                        if spins > 1000:
                            raise _Spins
                        for m in subset:
                            if left == 0:
                                break
                            if trial[m] < g:
                                continue
                            trial[m] -= g
                            left -= g
                    bal = standard_deviation(list(trial.values()))
                    if bal < local:
                        local, local_rem = bal, subset
            if local < best_balance:
                best_balance, best_combo, best_rem = local, combo, local_rem
        if best_combo is None:
            continue
        dist = n // k // g * g
        for m in best_combo:
            acc.take(take_packed(topo, topo.cpus_in_numa_nodes(m) & acc.free, dist))
        rem = n - dist * k
        while rem > 0:
            for m in best_rem or ():
                if rem == 0:
                    break
                pool = topo.cpus_in_numa_nodes(m) & acc.free
                if len(pool) < g:
                    continue
                acc.take(take_packed(topo, pool, g))
                rem -= g
        return frozenset(acc.result)
    return take_packed(topo, avail, n)


@st.composite
def _distributed_inputs(draw):
    nodes = draw(st.integers(1, 6))
    per_node = draw(st.integers(1, 6))
    topo = CpuTopology.from_cpus(
        [CpuInfo(c, c // (per_node * 2), c // per_node, c) for c in range(nodes * per_node)]
    )
    # few distinct free counts, so many nodes tie (the case the compressed search exploits)
    free = set()
    for m in range(nodes):
        keep = draw(st.sampled_from([0, 1, per_node // 2, per_node]))
        free |= set(range(m * per_node, m * per_node + keep))
    g = draw(st.integers(1, 3))
    n = draw(st.integers(1, max(1, len(free))))
    return topo, frozenset(free), n, g


@settings(max_examples=300, deadline=None)
@given(_distributed_inputs())
def test_compressed_search_equals_kubelet_loops(case):
    topo, free, n, g = case
    assume(n <= len(free))
    try:
        expected = _kubelet_reference(topo, free, n, g)
    except _Spins:
        assume(False)
    assert take_distributed(topo, free, n, g) == expected

"""CpuTopology (kubelet's CPUTopology/CPUDetails) and the accumulator's orderings (§1, §2).

Expected orderings are kubelet's ``cpu_assignment_test.go`` tables (TestCPUAccumulatorFree*).
"""

from __future__ import annotations

import pytest
from cpu_kubelet_topologies import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_HT,
    FAKE_MULTI_SOCKET_DUAL_NUMA_HT,
    QUAD_SOCKET_FOUR_WAY_HT,
    QUAD_SOCKET_LISTS,
    SINGLE_SOCKET_HT,
    TRIPLE_SOCKET_HT,
    cpus,
)

from numa_pin.allocators.cpu_packed import CpuAccumulator
from numa_pin.errors import AllocationError, TopologyError
from numa_pin.topology.cpus import CpuInfo, CpuTopology
from numa_pin.topology.model import Cpu, NumaNode, Topology


# ---- the topology view --------------------------------------------------------------------
@pytest.mark.parametrize(
    "topo, per_core, per_socket, per_uncore",
    [
        (SINGLE_SOCKET_HT, 2, 8, 0),
        (DUAL_SOCKET_HT, 2, 6, 0),
        (QUAD_SOCKET_FOUR_WAY_HT, 4, 72, 0),
        (DUAL_SOCKET_MULTI_NUMA_HT, 2, 40, 0),
        (CpuTopology.from_cpus([CpuInfo(0, 0, 0, 0)], num_cores=0, num_sockets=0, num_uncore=0), 0, 0, 0),
        (CpuTopology.from_cpus([CpuInfo(c, 0, 0, c, c // 2) for c in range(6)]), 1, 6, 2),
    ],
    ids=["single-socket-ht", "dual-socket-ht", "quad-4way", "multi-numa", "zero-counts", "uncore-default"],
)
def test_derived_sizes_divide_declared_counts(topo, per_core, per_socket, per_uncore):
    assert (topo.cpus_per_core(), topo.cpus_per_socket(), topo.cpus_per_uncore()) == (
        per_core,
        per_socket,
        per_uncore,
    )


def test_counts_default_to_distinct_ids():
    topo = CpuTopology.from_cpus([CpuInfo(c, c // 4, c // 2, c % 4, None) for c in range(8)])
    assert (topo.num_cores, topo.num_sockets, topo.num_numa_nodes, topo.num_uncore) == (4, 2, 4, 2)
    # uncore None falls back to the socket id (kubelet Discover)
    assert topo.uncore_caches() == {0, 1}
    assert topo.cpus_in_uncore_caches(1) == {4, 5, 6, 7}


@pytest.mark.parametrize(
    "query, args, expected",
    [
        ("cpus_in_numa_nodes", (1,), cpus("10-19,50-59")),
        ("cpus_in_sockets", (1,), cpus("20-39,60-79")),
        ("cpus_in_cores", (3, 4), {3, 4, 43, 44}),
        ("cores_in_numa_nodes", (3,), set(range(30, 40))),
        ("cores_in_sockets", (0,), set(range(20))),
        ("sockets_in_numa_nodes", (1, 2), {0, 1}),
        ("numa_nodes_in_sockets", (1,), {2, 3}),
        ("uncore_in_numa_nodes", (0, 3), {0}),
        ("cpus_in_numa_nodes", (9,), set()),
    ],
    ids=["cpus-in-numa", "cpus-in-socket", "cpus-in-cores", "cores-in-numa", "cores-in-socket",
         "sockets-in-numa", "numa-in-socket", "uncore-in-numa", "unknown-numa"],
)
def test_query_helpers(query, args, expected):
    assert getattr(DUAL_SOCKET_MULTI_NUMA_HT, query)(*args) == expected


def test_same_socket_and_cores_needed_in_uncore():
    topo = CpuTopology.from_cpus([CpuInfo(c, 0, c // 4, c, c // 4) for c in range(8)])
    assert DUAL_SOCKET_MULTI_NUMA_HT.numa_nodes_in_same_socket(0, 1)
    assert not DUAL_SOCKET_MULTI_NUMA_HT.numa_nodes_in_same_socket(1, 2)
    assert topo.cores_needed_in_uncore_cache(2, 1) == {4, 5}
    assert topo.cores_needed_in_uncore_cache(9, 1) == {4, 5, 6, 7}


def test_keep_only_keeps_declared_counts():
    kept = DUAL_SOCKET_HT.keep_only({0, 1, 6})
    assert kept.cpu_ids == {0, 1, 6}
    assert (kept.num_cores, kept.num_sockets, kept.num_numa_nodes) == (6, 2, 0)
    assert kept.cpus_in_cores(0) == {0, 6}


def test_duplicate_cpu_is_refused():
    with pytest.raises(TopologyError, match="cpu 3 is listed twice"):
        CpuTopology.from_cpus([CpuInfo(3, 0, 0, 3), CpuInfo(3, 0, 0, 3)])


def test_unknown_cpu_info_is_a_topology_error():
    with pytest.raises(TopologyError, match="cpu 99"):
        SINGLE_SOCKET_HT.info(99)


def test_quad_fixture_matches_kubelet_socket_lists():
    """Cross-check of the transcribed 288-CPU fixture against kubelet's own comment."""
    assert QUAD_SOCKET_FOUR_WAY_HT.cpu_ids == set(range(288))
    for socket, text in QUAD_SOCKET_LISTS.items():
        assert QUAD_SOCKET_FOUR_WAY_HT.cpus_in_sockets(socket) == cpus(text)
    assert all(len(QUAD_SOCKET_FOUR_WAY_HT.cpus_in_cores(c)) == 4 for c in QUAD_SOCKET_FOUR_WAY_HT.cores())


def _model(cpu_rows, node_cpus):
    """A model.Topology from ``(id, socket, die, core, numa, l3)`` rows."""
    node_ids = sorted(node_cpus)
    nodes = {
        n: NumaNode(n, frozenset(node_cpus[n]), 1 << 20, 1 << 19, tuple(10 if m == n else 20 for m in node_ids))
        for n in node_ids
    }
    by_core = {}
    for cid, socket, die, core, _numa, _l3 in cpu_rows:
        by_core.setdefault((socket, die, core), set()).add(cid)
    cpus_ = {
        cid: Cpu(cid, socket, die, core, numa, frozenset(by_core[(socket, die, core)]), l3)
        for cid, socket, die, core, numa, l3 in cpu_rows
    }
    return Topology(nodes=nodes, cpus=cpus_, source="/fake/sys")


def test_from_topology_uses_lowest_thread_and_l3():
    # sysfs core_id repeats across sockets; threads 2 and 6 share (socket 0, die 0, core 1)
    rows = [
        (0, 0, 0, 0, 0, 7), (4, 0, 0, 0, 0, 7),
        (2, 0, 0, 1, 0, 7), (6, 0, 0, 1, 0, 7),
        (1, 1, 0, 0, 1, None), (5, 1, 0, 0, 1, None),
        (3, 1, 0, 1, 1, None), (7, 1, 0, 1, 1, None),
    ]
    topo = CpuTopology.from_topology(_model(rows, {0: {0, 2, 4, 6}, 1: {1, 3, 5, 7}}))
    assert {c: topo.info(c).core for c in range(8)} == {0: 0, 4: 0, 2: 2, 6: 2, 1: 1, 5: 1, 3: 3, 7: 3}
    assert topo.info(6).uncore_id == 7  # L3 id
    assert topo.info(5).uncore_id == 1  # no L3: socket id
    assert (topo.num_cores, topo.num_sockets, topo.num_numa_nodes, topo.num_uncore) == (4, 2, 2, 2)


def test_from_topology_refuses_cpu_without_node():
    topo = _model([(0, 0, 0, 0, None, None)], {0: set()})
    with pytest.raises(TopologyError, match=r"cpu 0 belongs to no NUMA node \(/fake/sys\)"):
        CpuTopology.from_topology(topo)


# ---- accumulator orderings (kubelet TestCPUAccumulatorFree*) -------------------------------
FREE_SOCKETS = [
    ("single socket HT, 1 socket free", SINGLE_SOCKET_HT, "0-7", [0]),
    ("single socket HT, 0 sockets free", SINGLE_SOCKET_HT, "1-7", []),
    ("dual socket HT, 2 sockets free", DUAL_SOCKET_HT, "0-11", [0, 1]),
    ("dual socket HT, 1 socket free", DUAL_SOCKET_HT, "0-9,11", [1]),
    ("dual socket HT, 0 sockets free", DUAL_SOCKET_HT, "0,2-9,11", []),
    ("multi numa per socket, 2 sockets free", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", [0, 1]),
    ("multi numa per socket, 1 socket free", DUAL_SOCKET_MULTI_NUMA_HT, "1-79", [1]),
    ("multi numa per socket, 0 sockets free", DUAL_SOCKET_MULTI_NUMA_HT, "1-78", []),
    ("multi socket per numa, 4 sockets free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-79", [0, 1, 2, 3]),
    ("multi socket per numa, 3 sockets free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-19,21-79", [0, 1, 3]),
    ("multi socket per numa, 2 sockets free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-59,61-78", [0, 1]),
    ("multi socket per numa, 1 socket free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "1-19,21-38,41-60,61-78", [1]),
    ("multi socket per numa, 0 sockets free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-40,42-49,51-68,71-79", []),
]


@pytest.mark.parametrize("topo, free, expected", [c[1:] for c in FREE_SOCKETS], ids=[c[0] for c in FREE_SOCKETS])
def test_free_sockets(topo, free, expected):
    assert sorted(CpuAccumulator(topo, cpus(free), 0).free_sockets()) == expected


FREE_NUMA = [
    ("single socket HT, 1 NUMA node free", SINGLE_SOCKET_HT, "0-7", [0]),
    ("single socket HT, 0 NUMA nodes free", SINGLE_SOCKET_HT, "1-7", []),
    ("dual socket HT, 2 NUMA nodes free", DUAL_SOCKET_HT, "0-11", [0, 1]),
    ("dual socket HT, 1 NUMA node free", DUAL_SOCKET_HT, "0-9,11", [1]),
    ("dual socket HT, 0 NUMA nodes free", DUAL_SOCKET_HT, "0,2-9,11", []),
    ("multi numa per socket, 4 free", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", [0, 1, 2, 3]),
    ("multi numa per socket, 3 free", DUAL_SOCKET_MULTI_NUMA_HT, "1-79", [1, 2, 3]),
    ("multi numa per socket, 2 free", DUAL_SOCKET_MULTI_NUMA_HT, "1-9,11-79", [2, 3]),
    ("multi numa per socket, 1 free", DUAL_SOCKET_MULTI_NUMA_HT, "1-9,11-59,61-79", [3]),
    ("multi numa per socket, 0 free", DUAL_SOCKET_MULTI_NUMA_HT, "1-9,11-59,61-78", []),
    ("multi socket per numa, 2 free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-79", [0, 1]),
    ("multi socket per numa, 1 free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-9,11-79", [1]),
    ("multi socket per numa, 0 free", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-9,11-59,61-79", []),
]


@pytest.mark.parametrize("topo, free, expected", [c[1:] for c in FREE_NUMA], ids=[c[0] for c in FREE_NUMA])
def test_free_numa_nodes(topo, free, expected):
    assert CpuAccumulator(topo, cpus(free), 0).free_numa_nodes() == expected


@pytest.mark.parametrize(
    "free, sockets, numas",
    [("0-79", [0, 1], [0, 1, 2, 3]), ("1-79", [1], [1, 2, 3]), ("1-9,11-79", [1], [2, 3]), ("1-59,61-79", [], [1, 3])],
    ids=["2-sockets-4-numa", "1-socket-3-numa", "1-socket-2-numa", "0-socket-2-numa"],
)
def test_free_sockets_and_numa_nodes_socket_first(free, sockets, numas):
    acc = CpuAccumulator(DUAL_SOCKET_MULTI_NUMA_HT, cpus(free), 0)
    assert acc.free_numa_nodes() == numas
    assert acc.free_sockets() == sockets


FREE_CORES = [
    ("single socket HT, 4 cores free", SINGLE_SOCKET_HT, "0-7", [0, 1, 2, 3]),
    ("single socket HT, 3 cores free", SINGLE_SOCKET_HT, "0-2,4-6", [0, 1, 2]),
    ("single socket HT, 3 cores free (1 partially consumed)", SINGLE_SOCKET_HT, "0-6", [0, 1, 2]),
    ("single socket HT, 0 cores free", SINGLE_SOCKET_HT, "", []),
    ("single socket HT, 0 cores free (4 partially consumed)", SINGLE_SOCKET_HT, "0-3", []),
    ("dual socket HT, 6 cores free", DUAL_SOCKET_HT, "0-11", [0, 2, 4, 1, 3, 5]),
    ("dual socket HT, 5 cores free (1 consumed from socket 0)", DUAL_SOCKET_HT, "1-5,7-11", [2, 4, 1, 3, 5]),
    ("dual socket HT, 4 cores free (1 consumed from each socket)", DUAL_SOCKET_HT, "2-5,8-11", [2, 4, 3, 5]),
]


@pytest.mark.parametrize("topo, free, expected", [c[1:] for c in FREE_CORES], ids=[c[0] for c in FREE_CORES])
def test_free_cores(topo, free, expected):
    assert CpuAccumulator(topo, cpus(free), 0).free_cores() == expected


FREE_CPUS = [
    ("single socket HT, 8 cpus free", SINGLE_SOCKET_HT, "0-7", [0, 4, 1, 5, 2, 6, 3, 7]),
    ("single socket HT, 5 cpus free", SINGLE_SOCKET_HT, "3-7", [4, 5, 6, 3, 7]),
    ("dual socket HT, 12 cpus free", DUAL_SOCKET_HT, "0-11", [0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 11 cpus free", DUAL_SOCKET_HT, "1-11", [6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 10 cpus free", DUAL_SOCKET_HT, "1-5,7-11", [2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 10 cpus free, socket 1 emptier (derived by hand)", DUAL_SOCKET_HT, "0-4,6-10", [1, 7, 3, 9, 0, 6, 2, 8, 4, 10]),
    ("triple socket HT, 12 cpus free", TRIPLE_SOCKET_HT, "0-3,6-13", [12, 13, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11]),
]


@pytest.mark.parametrize("topo, free, expected", [c[1:] for c in FREE_CPUS], ids=[c[0] for c in FREE_CPUS])
def test_packed_cpu_order(topo, free, expected):
    assert CpuAccumulator(topo, cpus(free), 0).cpu_order() == expected


def test_spread_cpu_order_ignores_cores():
    acc = CpuAccumulator(DUAL_SOCKET_HT, cpus("1-11"), 0, "spread")
    assert acc.cpu_order() == [2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]


def test_uncore_order_repeats_a_cache_spanning_nodes():
    # one L3 (id 5) spans NUMA nodes 0 and 1
    topo = CpuTopology.from_cpus([CpuInfo(c, 0, c // 2, c, 5) for c in range(4)])
    assert CpuAccumulator(topo, range(4), 0).uncore_order() == [5, 5]
    assert CpuAccumulator(topo, range(4), 0).free_uncore_caches() == [5]


# ---- accumulator predicates (kubelet TestCPUAccumulatorTake) -------------------------------
TAKES = [
    ("take 0 cpus, require 1", "0-7", [""], 1, False, False),
    ("take 0 cpus, require 1, none available", "", [""], 1, False, True),
    ("take 1 cpu, require 1", "0-7", ["0"], 1, True, False),
    ("take 1 cpu, require 2", "0-7", ["0"], 2, False, False),
    ("take 2 cpus, require 4, expect failed", "0-2", ["0", "1"], 4, False, True),
    ("take all cpus one at a time, require 8", "0-7", ["0", "1", "2", "3", "4", "5", "6", "7"], 8, True, False),
]


@pytest.mark.parametrize("free, takes, need, satisfied, failed", [t[1:] for t in TAKES], ids=[t[0] for t in TAKES])
def test_accumulator_take(free, takes, need, satisfied, failed):
    acc = CpuAccumulator(SINGLE_SOCKET_HT, cpus(free), need)
    taken = set()
    for text in takes:
        acc.take(cpus(text))
        taken |= cpus(text)
    assert (acc.satisfied, acc.failed) == (satisfied, failed)
    assert taken <= acc.result
    assert not taken & acc.free
    assert acc.need == need - len(taken)


def test_accumulator_needs_is_at_least():
    acc = CpuAccumulator(SINGLE_SOCKET_HT, range(8), 4)
    assert acc.needs(4) and acc.needs(0) and not acc.needs(5)


def test_unknown_strategy_is_refused():
    with pytest.raises(AllocationError, match="unknown cpu sorting strategy 'wide'"):
        CpuAccumulator(SINGLE_SOCKET_HT, range(8), 1, "wide")

"""takeByTopologyNUMAPacked (§3, §3a): kubelet's ``cpu_assignment_test.go`` expectations.

Cases marked "derived by hand" are not in kubelet's tables; their expected values were worked
out from the spec step by step (the docstring of each says how).
"""

from __future__ import annotations

import pytest
from cpu_kubelet_topologies import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_HT,
    DUAL_SOCKET_NO_HT,
    FAKE_MULTI_SOCKET_DUAL_NUMA_HT,
    QUAD_SOCKET_FOUR_WAY_HT,
    SINGLE_SOCKET_HT,
    TRIPLE_SOCKET_HT,
    UNCORE_DUAL_SOCKET_NO_SMT,
    UNCORE_SINGLE_SOCKET_MULTI_NUMA,
    UNCORE_SINGLE_SOCKET_NO_SMT,
    UNCORE_SINGLE_SOCKET_SMT,
    cpus,
)

from numa_pin.allocators.cpu import take_cpus
from numa_pin.allocators.cpu_packed import take_packed
from numa_pin.errors import AllocationError
from numa_pin.topology.cpus import CpuInfo, CpuTopology

# kubelet commonTakeByTopologyTestCases (shared by packed and distributed)
COMMON = [
    ("take zero cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 0, ""),
    ("take one cpu from single socket with HT", SINGLE_SOCKET_HT, "0-7", 1, "0"),
    ("take one cpu from single socket with HT, some cpus are taken", SINGLE_SOCKET_HT, "1,3,5-7", 1, "6"),
    ("take two cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 2, "0,4"),
    ("take all cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 8, "0-7"),
    ("take two cpus from single socket with HT, only one core totally free", SINGLE_SOCKET_HT, "0-3,6", 2, "2,6"),
    ("take a socket of cpus from dual socket with HT", DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    ("take a socket from dual socket with multi-numa-per-socket with HT", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 40, "0-19,40-59"),
    ("take a NUMA node from dual socket with multi-numa-per-socket with HT", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 20, "0-9,40-49"),
    ("take a NUMA node, with 1 NUMA node already taken", DUAL_SOCKET_MULTI_NUMA_HT, "10-39,50-79", 20, "10-19,50-59"),
    ("take a socket and a NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 60, "0-29,40-69"),
    ("take a socket and a NUMA node, a core taken", DUAL_SOCKET_MULTI_NUMA_HT, "1-39,41-79", 60, "10-39,50-79"),
]

PACKED_ONLY = [
    ("take one cpu from dual socket with HT - core from Socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, "2"),
    ("allocate 4 full cores with 3 from the first NUMA node and 1 from the second", DUAL_SOCKET_HT, "0-11", 8, "0,6,2,8,4,10,1,7"),
    ("allocate 32 full cores, 30 from the first 3 NUMA nodes and 2 from the fourth", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 64, "0-29,40-69,30,31,70,71"),
]


@pytest.mark.parametrize(
    "topo, free, count, expected", [c[1:] for c in COMMON + PACKED_ONLY], ids=[c[0] for c in COMMON + PACKED_ONLY]
)
def test_take_packed(topo, free, count, expected):
    assert take_packed(topo, cpus(free), count) == cpus(expected)


@pytest.mark.parametrize(
    "topo, free, count, message",
    [
        (SINGLE_SOCKET_HT, "0,2,4,6", 5, "not enough cpus available to satisfy request: requested=5, available=4"),
        (SINGLE_SOCKET_HT, "0-7", 9, "not enough cpus available to satisfy request: requested=9, available=8"),
        (SINGLE_SOCKET_HT, "", 1, "not enough cpus available to satisfy request: requested=1, available=0"),
    ],
    ids=["take more cpus than available", "one more than the machine", "nothing available"],
)
@pytest.mark.parametrize("strategy", ["packed", "spread"])
def test_over_request_error_text(topo, free, count, message, strategy):
    with pytest.raises(AllocationError) as info:
        take_packed(topo, cpus(free), count, strategy)
    assert str(info.value) == message


def test_cpus_outside_the_topology_are_never_taken():
    """kubelet's KeepOnly drops unknown CPUs; the error still counts the set as passed."""
    assert take_packed(SINGLE_SOCKET_HT, {1, 5, 100}, 2) == {1, 5}
    with pytest.raises(AllocationError, match="requested=3, available=3"):
        take_packed(SINGLE_SOCKET_HT, {1, 5, 100}, 3)


SOCKET_VS_NUMA_FIRST = [
    # NUMA-first (4 sockets >= 2 NUMA nodes): a whole NUMA node (2 sockets) is the first unit
    ("numa-first: 40 cpus = NUMA node 0", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-79", 40, "0-19,40-59"),
    ("numa-first: 20 cpus = socket 0", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "0-79", 20, "0-9,40-49"),
    ("numa-first: NUMA 0 partly used, socket from NUMA 0", FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "1-79", 20, "10-19,50-59"),
    # socket-first (2 sockets < 4 NUMA nodes)
    ("socket-first: 40 cpus = socket 0", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 40, "0-19,40-59"),
    ("socket-first: socket 0 partly used, socket 1 whole", DUAL_SOCKET_MULTI_NUMA_HT, "1-79", 40, "20-39,60-79"),
]


@pytest.mark.parametrize(
    "topo, free, count, expected", [c[1:] for c in SOCKET_VS_NUMA_FIRST], ids=[c[0] for c in SOCKET_VS_NUMA_FIRST]
)
def test_socket_first_versus_numa_first(topo, free, count, expected):
    """Derived by hand from §2/§3: the first-level unit is the larger of socket and NUMA node;
    free units sort fullest-first, so a partly used node/socket is preferred for the next one."""
    assert take_packed(topo, cpus(free), count) == cpus(expected)


def test_declared_numa_count_zero_selects_numa_first():
    """Same CPUs, only the declared NUMA count differs: 0 (kubelet fixtures) means NUMA-first."""
    infos = DUAL_SOCKET_MULTI_NUMA_HT.cpus
    numa_first = CpuTopology.from_cpus(infos, num_numa_nodes=0)
    socket_first = CpuTopology.from_cpus(infos)  # 4 distinct NUMA ids > 2 sockets
    # 20 free in NUMA 1 (whole node) vs socket 1 whole (40): request 20 from "10-19,50-79"
    free = cpus("10-19,20-39,50-59,60-79")
    assert take_packed(socket_first, free, 20) == cpus("10-19,50-59")
    assert take_packed(numa_first, free, 20) == cpus("10-19,50-59")
    # request 40: socket-first takes socket 1 whole; NUMA-first takes the fullest whole nodes
    assert take_packed(socket_first, free, 40) == cpus("20-39,60-79")
    assert take_packed(numa_first, free, 40) == cpus("10-29,50-69")


def test_triple_socket_order():
    """Derived by hand: socket 2 has the fewest free CPUs (2), then socket 1 (4), then 0."""
    assert take_packed(TRIPLE_SOCKET_HT, cpus("0-3,6-13"), 3) == {12, 13, 0}


SPREAD = [
    ("single socket HT, 3 cpus", SINGLE_SOCKET_HT, "0-7", 3, "0,1,2"),
    ("dual socket HT, 2 cpus", DUAL_SOCKET_HT, "0-11", 2, "0,2"),
    ("dual socket HT, 3 cpus", DUAL_SOCKET_HT, "0-11", 3, "0,2,4"),
    ("dual socket HT, 6 cpus", DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    ("dual socket HT, 8 cpus", DUAL_SOCKET_HT, "0-11", 8, "0,2,4,6,8,10,1,3"),
    ("dual socket without HT, 2 cpus", DUAL_SOCKET_NO_HT, "0-7", 2, "0,1"),
    ("multi numa per socket and HT, 8 cpus", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 8, "0-7"),
    ("quad socket four way HT, 12 cpus", QUAD_SOCKET_FOUR_WAY_HT, "0-287", 12, "0-2,9-10,13-14,21-22,25-26,33"),
]


@pytest.mark.parametrize("topo, free, count, expected", [c[1:] for c in SPREAD], ids=[c[0] for c in SPREAD])
def test_take_spread(topo, free, count, expected):
    assert take_cpus(topo, cpus(free), count, strategy="spread") == cpus(expected)


UNCORE = [
    ("take cpus from two full UncoreCaches and partial from a single UncoreCache", UNCORE_SINGLE_SOCKET_NO_SMT, "1-15", 10, "1,2,4-11"),
    ("take one cpu from dual socket with HT - core from Socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, "1"),
    ("take first available UncoreCache from first socket", UNCORE_DUAL_SOCKET_NO_SMT, "0-15", 4, "0-3"),
    ("take all available UncoreCache from first socket", UNCORE_DUAL_SOCKET_NO_SMT, "2-15", 6, "2-7"),
    ("take first available UncoreCache from second socket", UNCORE_DUAL_SOCKET_NO_SMT, "8-15", 4, "8-11"),
    ("take first available UncoreCache from available NUMA", UNCORE_SINGLE_SOCKET_MULTI_NUMA, "3,4-8,12", 2, "4,5"),
    ("take cpus from best available UncoreCache group - SMT enabled", UNCORE_SINGLE_SOCKET_SMT, "2-3,10-11,4-7,12-15", 6, "4-6,12-14"),
    ("take cpus from multiple UncoreCache of single socket - SMT enabled", UNCORE_SINGLE_SOCKET_SMT, "1-7,9-15", 10, "4-7,12-15,1,9"),
]


@pytest.mark.parametrize("topo, free, count, expected", [c[1:] for c in UNCORE], ids=[c[0] for c in UNCORE])
def test_take_uncore(topo, free, count, expected):
    assert take_cpus(topo, cpus(free), count, prefer_uncore=True) == cpus(expected)


def test_uncore_odd_request_trims_the_highest_sibling():
    """Derived by hand (§3a): 3 CPUs from SMT L3 0 (cores 0-3 = {i, i+8}), all free: 2 cores
    = {0,1,8,9}, odd request trims 9 -> {0,1,8}; older kubelet (floor, no trim) could not fit."""
    assert take_cpus(UNCORE_SINGLE_SOCKET_SMT, cpus("0-15"), 3, prefer_uncore=True) == {0, 1, 8}


def test_uncore_partial_claim_needs_exact_fit():
    """Derived by hand: L3 0 holds 1 free CPU, L3 1 is whole; 2 CPUs: the partial claim on L3 0
    cannot fit exactly, so L3 1 gives its two lowest cores."""
    assert take_cpus(UNCORE_SINGLE_SOCKET_NO_SMT, cpus("3-7"), 2, prefer_uncore=True) == {4, 5}


def test_uncore_off_changes_the_choice():
    assert take_cpus(DUAL_SOCKET_HT, cpus("1-5,7-11"), 1, prefer_uncore=False) == {2}


def test_asymmetric_cores_never_hand_out_busy_cpus():
    """Derived by hand: a hybrid machine (two 2-thread cores, four 1-thread cores: 8 CPUs / 6
    cores => CPUsPerCore 1). kubelet would treat core {0,4} with 4 busy as "free" and take 4;
    numa-pin takes only the free thread."""
    infos = [CpuInfo(0, 0, 0, 0), CpuInfo(4, 0, 0, 0), CpuInfo(1, 0, 0, 1), CpuInfo(5, 0, 0, 1)]
    infos += [CpuInfo(c, 0, 0, c) for c in (2, 3, 6, 7)]
    topo = CpuTopology.from_cpus(infos)
    got = take_packed(topo, {0, 1, 5, 2}, 2)
    assert len(got) == 2 and got <= {0, 1, 5, 2}

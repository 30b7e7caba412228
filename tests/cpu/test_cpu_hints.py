"""CPU topology hints (§6): kubelet's ``topology_hints_test.go`` cases, scopes, and the
CapacityFamily form checked against the enumerated list."""

from __future__ import annotations

import pytest
from cpu_kubelet_topologies import DUAL_SOCKET_MULTI_NUMA_HT, HINTS_MACHINE, cpus
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_pin.errors import RequestError
from numa_pin.policy.hint import CapacityFamily, TopologyHint
from numa_pin.providers.cpu import (
    container_cpu_hints,
    cpu_hint_family,
    cpu_hints,
    min_affinity_size,
    pod_cpu_hints,
)
from numa_pin.topology.cpus import CpuInfo, CpuTopology


def H(nodes, preferred):
    return TopologyHint(nodes, preferred)


FIRST, SECOND, CROSS = {0}, {1}, {0, 1}

# kubelet returnTestCases (machine: NUMA 0 = 0-2,6-8; NUMA 1 = 3-5,9-11), no assignment
HINT_CASES = [
    ("Request 2 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", "2-11", 2,
     [H(FIRST, True), H(SECOND, True), H(CROSS, False)]),
    ("Request 5 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", "2-11", 5,
     [H(SECOND, True), H(CROSS, False)]),
    ("Request 7 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", "2-11", 7, [H(CROSS, True)]),
    ("Request 11 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", "2-11", 11, []),
    ("Request 2 CPUs, 1 available on NUMA 0, 1 available on NUMA 1", "0,3", 2, [H(CROSS, False)]),
    ("Request more CPUs than available", "0-3", 5, []),
]


@pytest.mark.parametrize("free, wanted, expected", [c[1:] for c in HINT_CASES], ids=[c[0] for c in HINT_CASES])
def test_cpu_hints(free, wanted, expected):
    assert cpu_hints(HINTS_MACHINE, cpus(free), wanted) == expected


@pytest.mark.parametrize("free, wanted, expected", [c[1:] for c in HINT_CASES], ids=[c[0] for c in HINT_CASES])
def test_cpu_hint_family_materializes_the_same(free, wanted, expected):
    family = cpu_hint_family(HINTS_MACHINE, cpus(free), wanted)
    if expected == []:
        assert family == []
    else:
        assert isinstance(family, CapacityFamily)
        assert family.materialize() == expected


REGENERATE = [
    ("Regenerate Single-Node NUMA Hints if already allocated 1/2", "0,6", 2, [H(FIRST, True), H(CROSS, False)]),
    ("Regenerate Single-Node NUMA Hints if already allocated 2/2", "3,9", 2, [H(SECOND, True), H(CROSS, False)]),
    ("Regenerate Cross-NUMA Hints if already allocated", "0-10", 11, [H(CROSS, True)]),
    ("Requested less than already allocated", "0,6,3,9", 2, []),
    ("Requested more than already allocated", "0,6,3,9", 11, []),
]


@pytest.mark.parametrize("assigned, wanted, expected", [c[1:] for c in REGENERATE], ids=[c[0] for c in REGENERATE])
@pytest.mark.parametrize("family", [False, True], ids=["list", "family"])
def test_container_scope_regeneration(assigned, wanted, expected, family):
    got = container_cpu_hints(HINTS_MACHINE, frozenset(), wanted, assigned=cpus(assigned), family=family)
    if isinstance(got, CapacityFamily):
        got = got.materialize()
    assert got == expected


@pytest.mark.parametrize("assigned, wanted, expected", [c[1:] for c in REGENERATE], ids=[c[0] for c in REGENERATE])
def test_pod_scope_regeneration(assigned, wanted, expected):
    got = pod_cpu_hints(HINTS_MACHINE, frozenset(), wanted, assigned=[(cpus(assigned), wanted)])
    assert got == expected


def test_pod_scope_partial_assignment_joins_reusable():
    """Pod needs 4; one container already holds {0,6} (its request, 2): those CPUs must stay
    inside every mask and count towards the request (kubelet adds them to the reusable set)."""
    got = pod_cpu_hints(HINTS_MACHINE, cpus("7,8,9"), 4, assigned=[({0, 6}, 2)])
    assert got == [H(FIRST, True), H(CROSS, False)]
    # a container holding a different number of CPUs than it asks for: cannot satisfy
    assert pod_cpu_hints(HINTS_MACHINE, cpus("1-11"), 4, assigned=[({0}, 2)]) == []


def test_zero_request_is_no_preference():
    assert cpu_hints(HINTS_MACHINE, cpus("0-11"), 0) is None
    assert cpu_hint_family(HINTS_MACHINE, cpus("0-11"), 0) is None
    assert container_cpu_hints(HINTS_MACHINE, cpus("0-11"), 0, assigned={1}) is None
    assert pod_cpu_hints(HINTS_MACHINE, cpus("0-11"), 0) is None


def test_negative_request_is_refused():
    with pytest.raises(RequestError, match="must not be negative"):
        cpu_hints(HINTS_MACHINE, cpus("0-11"), -1)


def test_reusable_cpus_pin_their_node():
    """Derived by hand: reusable CPU 3 (NUMA 1) excludes every mask without node 1; it counts
    towards the request (1 reusable + 1 available on node 1 = 2)."""
    got = cpu_hints(HINTS_MACHINE, cpus("4"), 2, reusable={3})
    assert got == [H(SECOND, True), H(CROSS, False)]
    fam = cpu_hint_family(HINTS_MACHINE, cpus("4"), 2, reusable={3})
    assert fam.must_include == 0b10 and fam.need == (1,)
    assert fam.materialize() == got


def test_min_affinity_uses_the_whole_machine():
    """Reserved/in-use CPUs count for preference: 3 CPUs fit one empty node, so the only
    mask that fits now (both nodes) is not preferred."""
    assert cpu_hints(HINTS_MACHINE, cpus("0,1,3"), 3) == [H(CROSS, False)]
    assert min_affinity_size(HINTS_MACHINE, 3) == 1
    assert min_affinity_size(HINTS_MACHINE, 7) == 2
    assert min_affinity_size(HINTS_MACHINE, 99) == 2


M = {
    "m0001": {0}, "m0011": {0, 1}, "m0101": {0, 2}, "m1001": {0, 3},
    "m0111": {0, 1, 2}, "m1011": {0, 1, 3}, "m1101": {0, 2, 3}, "m1111": {0, 1, 2, 3},
}
ALIGN = [
    ("AlignBySocket:false, Preferred hints does not contain socket aligned hints", "2,3,11", 2, False,
     [H(M["m0001"], True), H(M["m0011"], False), H(M["m0101"], False), H(M["m1001"], False),
      H(M["m0111"], False), H(M["m1011"], False), H(M["m1101"], False), H(M["m1111"], False)]),
    ("AlignBySocket:true Preferred hints contains socket aligned hints", "2,3,11", 2, True,
     [H(M["m0001"], True), H(M["m0011"], True), H(M["m0101"], False), H(M["m1001"], False),
      H(M["m0111"], False), H(M["m1011"], False), H(M["m1101"], False), H(M["m1111"], False)]),
    ("AlignBySocket:true Preferred hints are spread across socket since 2 sockets are required",
     "0-28,40-57", 41, True, [H(M["m0111"], True), H(M["m1111"], True)]),
]


@pytest.mark.parametrize("free, wanted, align, expected", [c[1:] for c in ALIGN], ids=[c[0] for c in ALIGN])
def test_align_by_socket(free, wanted, align, expected):
    assert cpu_hints(DUAL_SOCKET_MULTI_NUMA_HT, cpus(free), wanted, align_by_socket=align) == expected
    # the family form cannot express the socket rule and hands back the list
    got = cpu_hint_family(DUAL_SOCKET_MULTI_NUMA_HT, cpus(free), wanted, align_by_socket=align)
    assert (got if isinstance(got, list) else got.materialize()) == expected


def test_kubelet_mask_order():
    """Size 1, 2, ...; lexicographic within a size (bitmask.IterateBitMasks)."""
    topo = CpuTopology.from_cpus([CpuInfo(c, 0, c, c) for c in range(4)])
    got = [sorted(h.affinity) for h in cpu_hints(topo, range(4), 1)]
    assert got == [[0], [1], [2], [3], [0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3],
                   [0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3], [0, 1, 2, 3]]


def test_family_needs_no_enumeration_on_big_machines():
    """64 NUMA nodes (2**64 masks): the family answers membership directly."""
    topo = CpuTopology.from_cpus([CpuInfo(c, c // 64, c // 4, c) for c in range(256)])
    fam = cpu_hint_family(topo, range(256), 10)
    assert isinstance(fam, CapacityFamily)
    assert fam.min_affinity == 3
    assert fam.contains(0b111) and not fam.contains(0b11)


# ---- property: family.materialize() == cpu_hints() ------------------------------------------
@st.composite
def machines(draw):
    """Random machines: 1-8 NUMA nodes (ids possibly sparse), 0-4 CPUs per node, random
    available / reusable subsets and request."""
    node_ids = sorted(draw(st.sets(st.integers(0, 11), min_size=1, max_size=8)))
    infos, cpu = [], 0
    for n in node_ids:
        for _ in range(draw(st.integers(0, 4))):
            infos.append(CpuInfo(cpu, n // 2, n, cpu))
            cpu += 1
    topo = CpuTopology.from_cpus(infos)
    all_cpus = sorted(topo.cpu_ids)
    avail = draw(st.sets(st.sampled_from(all_cpus))) if all_cpus else set()
    reuse = draw(st.sets(st.sampled_from(all_cpus), max_size=3)) if all_cpus else set()
    request = draw(st.integers(0, cpu + 2))
    return topo, avail, reuse, request


@settings(max_examples=300, deadline=None)
@given(machines())
def test_family_equals_enumeration(machine):
    topo, avail, reuse, request = machine
    listed = cpu_hints(topo, avail, request, reuse)
    family = cpu_hint_family(topo, avail, request, reuse)
    if listed is None:
        assert family is None
    elif listed == []:
        assert family == []
    else:
        assert isinstance(family, CapacityFamily)
        assert family.materialize() == listed

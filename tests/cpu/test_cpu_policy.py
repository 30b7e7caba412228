"""Static-policy pieces (§5): options, reserved CPUs, Allocate, reuse, guaranteed counts.

Allocation expectations are kubelet's ``policy_static_test.go`` (TestStaticPolicyAdd,
TestTopologyAwareAllocateCPUs, TestStaticPolicyReuseCPUs) unless marked "derived by hand".
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
    UNCORE_SINGLE_SOCKET_SMT,
    cpus,
)

from numa_pin.allocators.cpu import (
    APP,
    INIT,
    RESTARTABLE_INIT,
    allocate_cpus,
    policy_take,
    reserved_cpus,
    reserved_physical_cpus,
    update_reusable,
)
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.errors import AllocationError, PolicyError, RequestError, SMTAlignmentError
from numa_pin.providers.cpu import guaranteed_cpus, pod_cpu_request

# ---- options --------------------------------------------------------------------------------
PAIRS = [
    ("full-pcpus-only + distribute-cpus-across-cores", dict(full_pcpus_only=True, distribute_cpus_across_cores=True),
     "full-pcpus-only and distribute-cpus-across-cores"),
    ("numa + cores", dict(distribute_cpus_across_numa=True, distribute_cpus_across_cores=True),
     "distribute-cpus-across-numa and distribute-cpus-across-cores"),
    ("uncore + cores", dict(prefer_align_cpus_by_uncorecache=True, distribute_cpus_across_cores=True),
     "prefer-align-cpus-by-uncorecache and distribute-cpus-across-cores"),
    ("uncore + numa", dict(prefer_align_cpus_by_uncorecache=True, distribute_cpus_across_numa=True),
     "prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa"),
]


@pytest.mark.parametrize("flags, names", [p[1:] for p in PAIRS], ids=[p[0] for p in PAIRS])
def test_incompatible_pairs(flags, names):
    with pytest.raises(PolicyError) as info:
        CpuOptions(**flags).validate(DUAL_SOCKET_HT, "best-effort")
    assert str(info.value) == f"static policy options {names} can not be used at the same time"


@pytest.mark.parametrize(
    "flags",
    [
        dict(full_pcpus_only=True, distribute_cpus_across_numa=True),
        dict(full_pcpus_only=True, prefer_align_cpus_by_uncorecache=True, strict_cpu_reservation=True),
        dict(distribute_cpus_across_cores=True, strict_cpu_reservation=True),
        dict(),
    ],
    ids=["pcpus+numa", "pcpus+uncore+strict", "cores+strict", "none"],
)
def test_compatible_options_pass(flags):
    CpuOptions(**flags).validate(DUAL_SOCKET_MULTI_NUMA_HT, "restricted")


@pytest.mark.parametrize(
    "topo, policy, message",
    [
        (DUAL_SOCKET_MULTI_NUMA_HT, "single-numa-node", "single-numa-node is incompatible with .*align-by-socket"),
        (FAKE_MULTI_SOCKET_DUAL_NUMA_HT, "restricted", r"sockets \(4\) outnumber NUMA nodes \(2\)"),
    ],
    ids=["single-numa-node", "more-sockets-than-numa"],
)
def test_align_by_socket_constraints(topo, policy, message):
    with pytest.raises(PolicyError, match=message):
        CpuOptions(align_by_socket=True).validate(topo, policy)


def test_align_by_socket_allowed_with_more_numa_nodes():
    CpuOptions(align_by_socket=True).validate(DUAL_SOCKET_MULTI_NUMA_HT, "restricted")


def test_options_from_strings():
    opts = CpuOptions.from_strings({"full-pcpus-only": "true", "align-by-socket": "F", "strict-cpu-reservation": "1"})
    assert opts == CpuOptions(full_pcpus_only=True, strict_cpu_reservation=True)
    assert opts.enabled() == ("full-pcpus-only", "strict-cpu-reservation")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"full-pcpu-only": "true"}, "unknown CPU manager policy option 'full-pcpu-only'"),
        ({"full-pcpus-only": "yes"}, "full-pcpus-only: 'yes' is not a boolean"),
        ({"distribute-cpus-across-numa": "true", "prefer-align-cpus-by-uncorecache": "true"}, "can not be used"),
    ],
    ids=["typo", "not-bool", "pair"],
)
def test_options_from_strings_errors(options, message):
    with pytest.raises(PolicyError, match=message):
        CpuOptions.from_strings(options)


# ---- reserved CPUs --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "topo, options, count, expected",
    [
        (SINGLE_SOCKET_HT, CpuOptions(), 2, {0, 4}),
        (SINGLE_SOCKET_HT, CpuOptions(), 1, {0}),
        (DUAL_SOCKET_HT, CpuOptions(full_pcpus_only=True), 2, {0, 6}),
        (DUAL_SOCKET_MULTI_NUMA_HT, CpuOptions(), 1, {0}),
        (SINGLE_SOCKET_HT, CpuOptions(distribute_cpus_across_cores=True), 2, {0, 1}),
        (SINGLE_SOCKET_HT, CpuOptions(), 0, set()),
    ],
    ids=["2-of-8-ht", "1-of-8", "dual-socket-core", "multi-numa", "spread-policy", "none"],
)
def test_reserved_by_policy(topo, options, count, expected):
    assert reserved_cpus(topo, options, count=count) == expected


def test_explicit_reserved_wins():
    assert reserved_cpus(DUAL_SOCKET_HT, CpuOptions(), explicit={1, 6}, count=2) == {1, 6}
    assert reserved_cpus(DUAL_SOCKET_HT, CpuOptions(), explicit={5}) == {5}


@pytest.mark.parametrize(
    "explicit, count, message",
    [
        ({1, 99}, 2, "reserved cpus 99 are not online CPUs"),
        ({1, 6}, 3, r"unable to reserve the required amount of CPUs \(size of 1,6 did not equal 3\)"),
        (None, 13, r"size of the empty set did not equal 13"),
        # kubelet TestStaticPolicyStartWithResvList "inconsistency between numReservedCPUs and
        # reserved": NewStaticPolicy(numReservedCPUs=1, reserved=0-1); the config derives the count
        ({0, 1}, 1, r"^unable to reserve the required amount of CPUs \(size of 0-1 did not equal 1\)$"),
    ],
    ids=["unknown-cpu", "size-mismatch", "more-than-machine", "kubelet-inconsistency"],
)
def test_reserved_errors(explicit, count, message):
    with pytest.raises(PolicyError, match=message):
        reserved_cpus(DUAL_SOCKET_HT, CpuOptions(), explicit=explicit, count=count)


def test_reserved_physical_cpus_are_all_siblings():
    assert reserved_physical_cpus(DUAL_SOCKET_HT, {1, 6}) == {0, 1, 6, 7}
    assert reserved_physical_cpus(QUAD_SOCKET_FOUR_WAY_HT, {0}) == {0, 169, 109, 229}


# ---- Allocate ---------------------------------------------------------------------------------
def _add(topo, default, count, options=CpuOptions(), num_reserved=0, explicit=None, affinity=None):  # noqa: B008 (frozen)
    """kubelet's TestStaticPolicyAdd harness: reserved from the policy, available = shared - reserved."""
    reserved = reserved_cpus(topo, options, explicit=explicit, count=num_reserved)
    available = cpus(default) - reserved
    physical = reserved_physical_cpus(topo, reserved)
    return allocate_cpus(topo, options, available, frozenset(), count, affinity, physical)


ALL_QUAD = frozenset(range(288))
SOCK1 = QUAD_SOCKET_FOUR_WAY_HT.cpus_in_sockets(1)

ADD_ANY_OPTIONS = [
    ("GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", SINGLE_SOCKET_HT, "0,1,4,5", 2, 1, "1,5"),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket", DUAL_SOCKET_HT, "0-1,3-11", 6, 1, "1,3,5,7,9,11"),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores", DUAL_SOCKET_HT, "0,2-4,6-11", 6, 1, "2-4,8-10"),
    ("GuPodMultipleCores, DualSocketNoHT, ExpectAllocOneSocket", DUAL_SOCKET_NO_HT, "0-1,3-7", 4, 1, "4-7"),
    ("GuPodMultipleCores, DualSocketNoHT, ExpectAllocFourCores", DUAL_SOCKET_NO_HT, "0-1,3,6-7", 4, 1, "1,3,6,7"),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocketOneCore", DUAL_SOCKET_HT, "0-1,3-11", 8, 1,
     "1,3-5,7,9-11"),
]


@pytest.mark.parametrize(
    "topo, default, count, num_reserved, expected", [c[1:] for c in ADD_ANY_OPTIONS], ids=[c[0] for c in ADD_ANY_OPTIONS]
)
@pytest.mark.parametrize("options", [CpuOptions(), CpuOptions(full_pcpus_only=True)], ids=["default", "full-pcpus-only"])
def test_allocate_options_insensitive(topo, default, count, num_reserved, expected, options):
    assert _add(topo, default, count, options, num_reserved) == cpus(expected)


def test_allocate_quad_socket_cases():
    # ExpectAllocSock0: some CPUs of other sockets used, 72 requested
    default = ALL_QUAD - {3, 11, 4, 5, 6, 7}
    assert allocate_cpus(QUAD_SOCKET_FOUR_WAY_HT, CpuOptions(), default, (), 72, None) == (
        QUAD_SOCKET_FOUR_WAY_HT.cpus_in_sockets(0)
    )
    # ExpectAllocAllFullCoresFromThreeSockets
    default = {1, 25, 13, 38, 2, 9, 11, 35, 23, 48, 12, 51, 53, 173, 113, 233, 54, 61}
    assert allocate_cpus(QUAD_SOCKET_FOUR_WAY_HT, CpuOptions(), default, (), 12, None) == {
        1, 25, 13, 38, 11, 35, 23, 48, 53, 173, 113, 233
    }
    # ExpectAllocAllSock1+FullCore
    default = SOCK1 | {10, 34, 22, 47, 53, 173, 61, 181, 108, 228, 115, 235}
    assert allocate_cpus(QUAD_SOCKET_FOUR_WAY_HT, CpuOptions(), default, (), 76, None) == SOCK1 | {10, 34, 22, 47}
    # ExpectAllocCPUs: only partial cores left
    default = {10, 11, 53, 67, 52}
    assert allocate_cpus(QUAD_SOCKET_FOUR_WAY_HT, CpuOptions(), default, (), 5, None) == default


def test_allocate_default_options_cases():
    assert _add(SINGLE_SOCKET_HT, "0-7", 1, num_reserved=1) == {4}  # sibling of the partial core
    with pytest.raises(AllocationError) as info:
        _add(SINGLE_SOCKET_HT, "0-7", 8, num_reserved=1)
    assert str(info.value) == "not enough cpus available to satisfy request: requested=8, available=7"
    with pytest.raises(AllocationError, match="requested=10, available=8"):
        _add(DUAL_SOCKET_HT, "0,4-11", 10, num_reserved=1)
    with pytest.raises(AllocationError, match="requested=2, available=1"):
        _add(SINGLE_SOCKET_HT, "0,7", 2, num_reserved=1)


SMT = [
    ("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", SINGLE_SOCKET_HT, "0-7", 1, 1, None,
     "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"),
    ("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocOneCPUs", QUAD_SOCKET_FOUR_WAY_HT, "0-287", 15, 8, None,
     "SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4"),
    ("GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU", DUAL_SOCKET_HT, "0,2-5,7-11", 10, 2, {1, 6},
     "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, requested CPUs = 10, "
     "CPUs per core = 2"),
]


@pytest.mark.parametrize(
    "topo, default, count, num_reserved, explicit, message", [c[1:] for c in SMT], ids=[c[0] for c in SMT]
)
def test_smt_alignment_errors(topo, default, count, num_reserved, explicit, message):
    with pytest.raises(SMTAlignmentError) as info:
        _add(topo, default, count, CpuOptions(full_pcpus_only=True), num_reserved, explicit)
    assert str(info.value) == message


def test_smt_alignment_all_cpus():
    opts = CpuOptions(full_pcpus_only=True)
    # AutoReserve: reserved = {0, 6}; everything else fits
    assert _add(DUAL_SOCKET_HT, "1-5,7-11", 10, opts, 2) == cpus("1-5,7-11")
    assert _add(DUAL_SOCKET_HT, "1-5,7-11", 10, opts, 2, explicit={0, 6}) == cpus("1-5,7-11")


TOPOLOGY_AWARE = [
    ("Request 2 CPUs, No BitMask", 2, None, "0,6"),
    ("Request 2 CPUs, BitMask on Socket 0", 2, {0}, "0,6"),
    ("Request 2 CPUs, BitMask on Socket 1", 2, {1}, "1,7"),
    ("Request 8 CPUs, BitMask on Socket 0", 8, {0}, "0,6,2,8,4,10,1,7"),
    ("Request 8 CPUs, BitMask on Socket 1", 8, {1}, "1,7,3,9,5,11,0,6"),
]


@pytest.mark.parametrize("count, nodes, expected", [c[1:] for c in TOPOLOGY_AWARE], ids=[c[0] for c in TOPOLOGY_AWARE])
def test_topology_aware_allocate(count, nodes, expected):
    affinity = None if nodes is None else frozenset(nodes)
    assert allocate_cpus(DUAL_SOCKET_HT, CpuOptions(), range(12), (), count, affinity) == cpus(expected)


@pytest.mark.parametrize(
    "align, expected",
    [(True, {2, 11}), (False, {2, 21})],
    ids=["Align by socket: true, socket of the hint's nodes", "Align by socket: false, hint's nodes only"],
)
def test_align_by_socket_allocate(align, expected):
    got = _add(DUAL_SOCKET_MULTI_NUMA_HT, "2,11,21,22", 2, CpuOptions(align_by_socket=align), 1, affinity=frozenset({0, 2}))
    assert got == expected


def test_allocate_zero_is_empty_and_distribute_dispatch():
    assert allocate_cpus(SINGLE_SOCKET_HT, CpuOptions(), range(8), (), 0, None) == frozenset()
    got = allocate_cpus(DUAL_SOCKET_HT, CpuOptions(distribute_cpus_across_numa=True), range(12), (), 8, None)
    assert got == cpus("0,6,2,8,1,7,3,9")
    # full-pcpus-only + distribute: groups of CPUsPerCore (2); one CPU falls back to packed
    opts = CpuOptions(distribute_cpus_across_numa=True, full_pcpus_only=True)
    assert policy_take(DUAL_SOCKET_HT, opts, cpus("1-5,7-11"), 1) == {2}


def test_allocate_uses_uncore_option():
    opts = CpuOptions(prefer_align_cpus_by_uncorecache=True)
    assert allocate_cpus(UNCORE_SINGLE_SOCKET_SMT, opts, cpus("1-7,9-15"), (), 10, None) == cpus("4-7,12-15,1,9")


# ---- reuse (TestStaticPolicyReuseCPUs / DoNotReuseCPUs) -------------------------------------
def _run_pod(containers):
    """Allocate a pod's containers in order the way kubelet does; returns the shared pool."""
    shared = frozenset(range(8))
    reuse: dict[str, frozenset[int]] = {}
    for kind, count in containers:
        got = allocate_cpus(SINGLE_SOCKET_HT, CpuOptions(), shared, reuse.get("pod", frozenset()), count, None)
        shared -= got
        reuse = update_reusable(reuse, "pod", got, kind)
    return shared, reuse


def test_init_container_cpus_are_reused():
    shared, reuse = _run_pod([(INIT, 4), (APP, 2)])
    assert shared == {2, 3, 6, 7}
    assert reuse == {"pod": frozenset({1, 5})}


def test_restartable_init_container_cpus_are_not_reused():
    shared, reuse = _run_pod([(RESTARTABLE_INIT, 4), (APP, 2)])
    assert shared == {3, 7}
    assert reuse == {"pod": frozenset()}


def test_update_reusable_drops_other_pods_and_checks_kind():
    assert update_reusable({"old": frozenset({1})}, "new", {2}, INIT) == {"new": frozenset({2})}
    with pytest.raises(RequestError, match="unknown container kind 'sidecar'"):
        update_reusable({}, "pod", {1}, "sidecar")


# ---- guaranteed counts (TestPodGuaranteedCPUs) ----------------------------------------------
@pytest.mark.parametrize(
    "init, app, expected",
    [
        ([], [0], 0),
        ([(2, False)], [2], 2),
        ([(5, False)], [5], 5),
        ([(2, False)], [5], 5),
        ([(5, False)], [2], 5),
        ([(2, False), (4, False)], [2, 4], 6),
        ([(1, True)], [1], 2),
        ([(5, False), (1, True), (2, True), (3, True)], [1], 7),
        ([(5, False), (1, True), (2, True), (5, False), (3, True)], [1], 8),
        ([(10, True), (200, False)], [100], 210),
    ],
    ids=["TestCase01", "TestCase04", "TestCase05", "TestCase06", "TestCase07", "TestCase08", "TestCase09",
         "TestCase10", "TestCase11", "TestCase12"],
)
def test_pod_cpu_request(init, app, expected):
    assert pod_cpu_request(init, app) == expected


@pytest.mark.parametrize(
    "guaranteed, millis, expected",
    [(True, 2000, 2), (True, 977, 0), (False, 2000, 0), (True, 0, 0), (True, 1500, 0)],
    ids=["whole", "fraction", "not-guaranteed", "zero", "one-and-a-half"],
)
def test_guaranteed_cpus(guaranteed, millis, expected):
    assert guaranteed_cpus(guaranteed, millis) == expected

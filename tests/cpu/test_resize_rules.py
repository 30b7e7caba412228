"""KEP-5554's resize rules on one machine (intel-2s-ht: node 0 = CPUs 0-7 and their threads
16-23, node 1 = 8-15 and 24-31; CPU n's sibling is n+16), checked against sets written here."""

from __future__ import annotations

import pytest

from numa_pin.allocators.resize import check_adoptable, resized_cpus, resized_memory
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.errors import AllocationError, RequestError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.testing.machine import expected_topology
from numa_pin.testing.shapes import shape

TOPO = expected_topology(shape("intel-2s-ht"))
RESERVED = frozenset({0})
NODE0 = frozenset(range(8)) | frozenset(range(16, 24))


def grant(cpus, baseline=None, affinity=None, limit=None, cid="x", memory=None, policy="none") -> Grant:
    return Grant(cid, "", cid, "exclusive", cpus=frozenset(cpus), mems=frozenset({0}), policy=policy,
                 baseline_cpus=None if baseline is None else frozenset(baseline),
                 affinity=None if affinity is None else frozenset(affinity),
                 cpuset_limit=None if limit is None else frozenset(limit), memory=memory or {})


def state(*grants: Grant) -> LedgerState:
    out = LedgerState()
    for g in grants:
        out = out.with_grant(g)
    return out


@pytest.mark.parametrize("have, baseline, count, want", [
    ({1}, None, 2, {1, 17}),                          # the held core's other thread first
    ({1, 17}, None, 2, {1, 17}),                      # no change
    ({1, 17, 2, 18, 3}, {1, 17}, 3, {1, 17, 3}),      # whole added cores go back first
    ({1, 17, 2, 18}, {1, 17}, 2, {1, 17}),            # back to the baseline exactly
], ids=["grow-completes-core", "same-size", "shrink-whole-core-first", "shrink-to-baseline"])
def test_resized_cpus(have, baseline, count, want):
    g = grant(have, baseline)
    assert resized_cpus(TOPO, CpuOptions(), state(g), g, count, RESERVED) == frozenset(want)


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_grow_stays_on_its_node_and_off_others_cpus(policy):
    other = grant(NODE0 - {0, 1, 17, 2}, cid="y")
    g = grant({1, 17}, affinity={0}, policy=policy)
    assert resized_cpus(TOPO, CpuOptions(), state(g, other), g, 3, RESERVED) == {1, 17, 2}
    with pytest.raises(AllocationError, match="free on its NUMA node"):
        resized_cpus(TOPO, CpuOptions(), state(g, other), g, 4, RESERVED)  # node 1 is free, but not its node


@pytest.mark.parametrize("policy", ["best-effort", "none"])
def test_grow_expands_the_affinity_when_the_policy_lets_it(policy):
    """KEP-5554: the current affinity is kept while it can hold the grow; when it cannot, the
    new affinity holds every node of the current one and more, and every original CPU stays."""
    other = grant(NODE0 - {0, 1, 17, 2}, cid="y")
    g = grant({1, 17}, affinity={0}, policy=policy)
    assert resized_cpus(TOPO, CpuOptions(), state(g, other), g, 3, RESERVED) == {1, 17, 2}  # fits: no expansion
    grown = resized_cpus(TOPO, CpuOptions(), state(g, other), g, 5, RESERVED)
    assert {1, 17, 2} <= grown and len(grown) == 5
    assert {TOPO.cpus[c].numa for c in grown - {1, 17, 2}} == {1}  # the rest from node 1, a whole core
    assert len({TOPO.cpus[c].core_key for c in grown - {1, 17, 2}}) == 1
    with pytest.raises(AllocationError, match="whole node"):
        resized_cpus(TOPO, CpuOptions(), state(g, other), g, 3 + 16 + 1, RESERVED)  # more than both nodes hold


def test_grow_stays_inside_its_own_cpuset():
    g = grant({1}, limit={1, 5})
    assert resized_cpus(TOPO, CpuOptions(), state(g), g, 2, RESERVED) == {1, 5}
    with pytest.raises(AllocationError):
        resized_cpus(TOPO, CpuOptions(), state(g), g, 3, RESERVED)


@pytest.mark.parametrize("have, baseline, count, error", [
    ({1, 17, 2}, {1, 17}, 1, RequestError),
    (set(), None, 2, RequestError),
], ids=["below-baseline", "shared-grant"])
def test_refusals(have, baseline, count, error):
    g = Grant("x", "", "x", "shared") if not have else grant(have, baseline)
    with pytest.raises(error):
        resized_cpus(TOPO, CpuOptions(), state(g), g, count, RESERVED)


@pytest.mark.parametrize("seen, ok", [
    ({1, 17, 2}, True),
    ({17, 2}, False),      # drops admitted CPU 1
    ({1, 17, 0}, False),   # reserved
    ({1, 17, 8}, False),   # node 1: outside its affinity
    ({1, 17, 4}, False),   # y's
], ids=["valid-grow", "drops-admitted", "reserved", "other-node", "anothers"])
def test_check_adoptable(seen, ok):
    g = grant({1, 17}, affinity={0}, policy="restricted")
    s = state(g, grant({4, 20}, cid="y"))
    if ok:
        check_adoptable(TOPO, s, g, frozenset(seen), RESERVED)
    else:
        with pytest.raises(AllocationError):
            check_adoptable(TOPO, s, g, frozenset(seen), RESERVED)


@pytest.mark.parametrize("policy, others, ok", [
    ("best-effort", NODE0 - {0, 1, 17}, True),   # node 0 is full: the affinity may expand
    ("best-effort", frozenset({4, 20}), False),  # node 0 has room: no expansion needed
    ("restricted", NODE0 - {0, 1, 17}, False),
    ("single-numa-node", NODE0 - {0, 1, 17}, False),
], ids=["best-effort-full-node", "best-effort-room-left", "restricted", "single-numa-node"])
def test_adopting_an_expanded_affinity(policy, others, ok):
    g = grant({1, 17}, affinity={0}, policy=policy)
    s = state(g, grant(others, cid="y"))
    if ok:
        check_adoptable(TOPO, s, g, frozenset({1, 17, 8}), RESERVED)
    else:
        with pytest.raises(AllocationError, match="outside its NUMA affinity"):
            check_adoptable(TOPO, s, g, frozenset({1, 17, 8}), RESERVED)


@pytest.mark.parametrize("have, total, free, want", [
    ({0: 4, 1: 4}, 10, {0: 1, 1: 5}, {0: 5, 1: 5}),
    ({0: 4, 1: 4}, 5, {}, {0: 4, 1: 1}),
    ({0: 4, 1: 4}, 3, {}, {0: 3}),
], ids=["grow-node-by-node", "shrink-from-last", "shrink-empties-a-node"])
def test_resized_memory(have, total, free, want):
    assert resized_memory(grant({1}, memory={"memory": have}), total, free) == want


def test_memory_that_does_not_fit_is_refused():
    with pytest.raises(AllocationError):
        resized_memory(grant({1}, memory={"memory": {0: 4}}), 10, {0: 5})

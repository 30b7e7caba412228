"""kubelet static Memory Manager ``Allocate``: picking, widening and taking memory."""

from __future__ import annotations

import pytest
from memkit import GiB, MiB, assign, hand_state, machine, readable

from numa_pin.allocators.memory import MemoryGrant, allocate_memory
from numa_pin.errors import AllocationError
from numa_pin.providers.memory import memory_hints, reusable_key
from numa_pin.topology.memory import build_memory_state

HP1G = "hugepages-1Gi"
TWO = machine([4, 4], hugepages={1048576: (2, 2)})  # memory 2Gi + hugepages-1Gi 2Gi allocatable per node
FOUR = machine([4, 4, 4, 4])
# kubelet-style hand-built state: a single node would fit on the empty machine, free needs both
HALF_FULL = hand_state({0: (1536 * MiB, 512 * MiB, 0, None), 1: (1536 * MiB, 512 * MiB, 0, None)})

OK_CASES = [
    # (id, state, request, affinity, preferred, reusable, nodes, per_resource)
    ("nil-affinity-best-hint", build_memory_state(TWO), {"memory": 1 * GiB}, None, False, None,
     {0}, {"memory": {0: 1 * GiB}}),
    ("affinity-used-as-given", build_memory_state(TWO), {"memory": 1 * GiB}, {1}, True, None,
     {1}, {"memory": {1: 1 * GiB}}),
    ("multi-node-affinity-kept-when-it-holds", build_memory_state(TWO), {"memory": 1 * GiB}, {0, 1}, False,
     None, {0, 1}, {"memory": {0: 1 * GiB, 1: 0}}),
    ("short-affinity-widened-ascending-take", build_memory_state(TWO), {"memory": 3 * GiB}, {1}, True, None,
     {0, 1}, {"memory": {0: 2 * GiB, 1: 1 * GiB}}),
    ("two-resources-same-nodes", build_memory_state(TWO), {"memory": 3 * GiB, HP1G: 3 * GiB}, None, False,
     None, {0, 1}, {"memory": {0: 2 * GiB, 1: 1 * GiB}, HP1G: {0: 2 * GiB, 1: 1 * GiB}}),
    ("nil-affinity-non-preferred-allowed", HALF_FULL, {"memory": 1 * GiB}, None, False, None,
     {0, 1}, {"memory": {0: 512 * MiB, 1: 512 * MiB}}),
    ("widened-non-preferred-allowed", HALF_FULL, {"memory": 1 * GiB}, {0}, False, None,
     {0, 1}, {"memory": {0: 512 * MiB, 1: 512 * MiB}}),
    ("narrowest-valid-mask", build_memory_state(FOUR, assignments=[assign("g", [0, 1], memory={0: 2 * GiB,
     1: 2 * GiB})]), {"memory": 5 * GiB}, None, False, None, {2, 3}, {"memory": {2: 4 * GiB, 3: 1 * GiB}}),
    ("exact-group-affinity", build_memory_state(FOUR, assignments=[assign("g", [0, 1], memory={0: 2 * GiB,
     1: 2 * GiB})]), {"memory": 3 * GiB}, {0, 1}, False, None, {0, 1}, {"memory": {0: 2 * GiB, 1: 1 * GiB}}),
    ("reused-init-memory-not-taken-again", build_memory_state(TWO, assignments=[assign("init", [0],
     memory={0: 2 * GiB})]), {"memory": 1 * GiB}, {0}, True, {reusable_key([0]): {"memory": 2 * GiB}},
     {0}, {"memory": {0: 0}}),
    ("partly-reused", build_memory_state(TWO, assignments=[assign("init", [0], memory={0: 1 * GiB})]),
     {"memory": 2 * GiB}, None, False, {reusable_key([0]): {"memory": 1 * GiB}}, {0}, {"memory": {0: 1 * GiB}}),
]


@pytest.mark.parametrize(("case", "state", "wanted", "affinity", "preferred", "reusable", "nodes", "per"),
                         OK_CASES, ids=[c[0] for c in OK_CASES])
def test_allocate(case, state, wanted, affinity, preferred, reusable, nodes, per) -> None:
    grant = allocate_memory(state, wanted, affinity, preferred=preferred, reusable=reusable)
    assert grant.nodes == nodes
    assert {r: dict(p) for r, p in grant.per_resource.items()} == per
    assert dict(grant.requested) == wanted


ERR_CASES = [
    # (id, state, request, affinity, preferred, message)
    ("nothing-fits", build_memory_state(TWO), {"memory": 5 * GiB}, None, False,
     "failed to get the default NUMA affinity"),
    ("default-hint-not-preferred", HALF_FULL, {"memory": 1 * GiB}, None, True,
     "failed to find the default preferred hint"),
    ("extended-hint-not-preferred", HALF_FULL, {"memory": 1 * GiB}, {0}, True,
     "failed to find the extended preferred hint"),
    ("cannot-extend", build_memory_state(FOUR, assignments=[assign("c", [0], memory={0: 3 * GiB})]),
     {"memory": 2 * GiB}, {0}, False, "failed to find NUMA nodes to extend"),
    ("pinned-node-in-multi-affinity", build_memory_state(FOUR, assignments=[assign("c", [0],
     memory={0: 1 * GiB})]), {"memory": 1 * GiB}, {0, 1}, False, "violates NUMA node allocation"),
    ("other-group-in-affinity", build_memory_state(FOUR, assignments=[assign("g", [0, 1],
     memory={0: 1 * GiB, 1: 1 * GiB})]), {"memory": 1 * GiB}, {1, 2}, False, "violates NUMA node allocation"),
    ("unknown-node", build_memory_state(TWO), {"memory": 1 * GiB}, {5}, False, "does not have"),
]


@pytest.mark.parametrize(("case", "state", "wanted", "affinity", "preferred", "message"), ERR_CASES,
                         ids=[c[0] for c in ERR_CASES])
def test_allocation_errors(case, state, wanted, affinity, preferred, message) -> None:
    with pytest.raises(AllocationError, match=message) as info:
        allocate_memory(state, wanted, affinity, preferred=preferred)
    text = str(info.value)
    assert text.startswith("[memorymanager] ")
    for resource in wanted:
        per = ", ".join(f"{n}: {state.free(n, resource)}" for n in state.node_ids)
        assert f"{resource}: requested {wanted[resource]} bytes, free per NUMA node {{{per}}}" in text


def test_empty_request_gets_an_empty_grant() -> None:
    grant = allocate_memory(build_memory_state(TWO), {}, None)
    assert grant == MemoryGrant(frozenset(), {}, {})


def test_grant_round_trips_through_state_and_regeneration() -> None:
    state = build_memory_state(TWO)
    request = {"memory": 3 * GiB, HP1G: 1 * GiB}
    grant = allocate_memory(state, request, None)
    after = build_memory_state(TWO, assignments=[grant.as_assignment("ctr")])
    assert after.free(0, "memory") == 0 and after.free(1, "memory") == 1 * GiB
    assert after.free(0, HP1G) == 1 * GiB and after.free(1, HP1G) == 2 * GiB
    assert after.nodes[0].cells == after.nodes[1].cells == {0, 1}
    assert after.nodes[0].assignments == 2  # one per resource, as kubelet counts
    assert readable(memory_hints(after, request, regenerate_from=grant.blocks())) == {
        "memory": [((0, 1), True)], HP1G: [((0, 1), True)]}
    # a second container may share the exact group, but not mix one of its nodes with another
    three = build_memory_state(machine([4, 4, 4], hugepages={1048576: (2, 2, 2)}),
                               assignments=[grant.as_assignment("ctr")])
    assert allocate_memory(three, {"memory": 512 * MiB}, {0, 1}).nodes == {0, 1}
    with pytest.raises(AllocationError, match="violates"):
        allocate_memory(three, {"memory": 512 * MiB}, {1, 2})


def test_grant_requested_defaults_to_bytes_taken() -> None:
    grant = MemoryGrant(frozenset({0, 1}), {"memory": {0: 5, 1: 7}})
    assert dict(grant.requested) == {"memory": 12}
    assert [b.size for b in grant.blocks()] == [12]


def test_64_nodes_allocation_is_immediate() -> None:
    big = machine([8] * 64)
    pinned = [assign(f"c{n}", [n], memory={n: 7 * GiB}) for n in range(40)]
    state = build_memory_state(big, assignments=pinned)
    grant = allocate_memory(state, {"memory": 20 * GiB}, None)
    assert grant.nodes == {40, 41, 42}
    grant = allocate_memory(state, {"memory": 20 * GiB}, {63})
    assert grant.nodes == {40, 41, 63}  # narrowest containing 63: smallest integer mask

"""Memory Manager hints, every §7 rule and §9 case (expected lists worked out by hand).

kubelet returns ``None`` for pods that are not Guaranteed before computing anything; that gate
is the caller's (admission) and is not tested here. The regeneration ``None`` cases are.
"""

from __future__ import annotations

import pytest
from memkit import GiB, MiB, assign, hand_state, machine, readable

from numa_pin.policy.hint import CapacityFamily
from numa_pin.providers.memory import memory_hint_family, memory_hints, reusable_key
from numa_pin.topology.memory import MemoryBlock, build_memory_state

T, F = True, False
HP1G = "hugepages-1Gi"

# two nodes: 4Gi each, 2 x 1Gi pages each -> memory allocatable 2Gi, hugepages-1Gi 2Gi
TWO = machine([4, 4], hugepages={1048576: (2, 2)})
# four nodes of 4Gi, no hugepages
FOUR = machine([4, 4, 4, 4])

PINNED_0 = [assign("c0", [0], memory={0: 1 * GiB})]
GROUP_01 = [assign("c0", [0, 1], memory={0: 2 * GiB, 1: 2 * GiB})]
GROUP_01_TWO = [assign("c0", [0, 1], memory={0: 1536 * MiB, 1: 1536 * MiB})]

CASES = [
    # (id, topology, assignments, request, reusable, expected)
    ("single-numa-both-resources", TWO, [], {"memory": 1 * GiB, HP1G: 1 * GiB}, None,
     {"memory": [((0,), T), ((1,), T), ((0, 1), F)], HP1G: [((0,), T), ((1,), T), ((0, 1), F)]}),
    ("cross-numa-only", TWO, [], {"memory": 3 * GiB}, None, {"memory": [((0, 1), T)]}),
    ("insufficient-is-empty-map", TWO, [], {"memory": 5 * GiB}, None, {}),
    ("resources-fit-differently", TWO, [], {"memory": 1 * GiB, HP1G: 3 * GiB}, None,
     {"memory": [((0, 1), T)], HP1G: [((0, 1), T)]}),
    ("hugepages-only", TWO, [], {HP1G: 3 * GiB}, None, {HP1G: [((0, 1), T)]}),
    ("page-size-missing", TWO, [], {"hugepages-2Mi": 2 * MiB}, None, {}),
    ("zero-bytes", TWO, [], {"memory": 0}, None, {"memory": [((0,), T), ((1,), T), ((0, 1), F)]}),
    ("empty-request", TWO, [], {}, None, {}),
    # multi-NUMA never preferred when one node would do on an empty machine: the singles are
    # excluded (their nodes are in a group) but still set the preferred size to 1
    ("group-never-preferred", TWO, GROUP_01_TWO, {"memory": 1 * GiB}, None, {"memory": [((0, 1), F)]}),
    # a node holding a single-node allocation: only new single nodes, never in a multi mask
    ("pinned-node-too-full", FOUR, PINNED_0, {"memory": 3584 * MiB}, None,
     {"memory": [((1,), T), ((2,), T), ((3,), T), ((1, 2), F), ((1, 3), F), ((2, 3), F), ((1, 2, 3), F)]}),
    ("pinned-node-fits-alone", FOUR, PINNED_0, {"memory": 2 * GiB}, None,
     {"memory": [((0,), T), ((1,), T), ((2,), T), ((3,), T), ((1, 2), F), ((1, 3), F), ((2, 3), F),
                 ((1, 2, 3), F)]}),
    # nodes bound to a group: only the exact group, never a single node of it or a superset
    ("group-too-full", FOUR, GROUP_01, {"memory": 5 * GiB}, None, {"memory": [((2, 3), T)]}),
    ("exact-group-fits", FOUR, GROUP_01, {"memory": 3 * GiB}, None,
     {"memory": [((2,), T), ((3,), T), ((0, 1), F), ((2, 3), F)]}),
    # reusable init-container memory counts only for its exact mask
    ("reusable-exact-mask", TWO, [assign("init", [0], memory={0: 2 * GiB})], {"memory": 1 * GiB},
     {reusable_key([0]): {"memory": 2 * GiB}}, {"memory": [((0,), T), ((1,), T)]}),
    ("no-reusable", TWO, [assign("init", [0], memory={0: 2 * GiB})], {"memory": 1 * GiB}, None,
     {"memory": [((1,), T)]}),
    ("reusable-other-mask", TWO, [assign("init", [0], memory={0: 2 * GiB})], {"memory": 1 * GiB},
     {reusable_key([0, 1]): {"memory": 2 * GiB}}, {"memory": [((1,), T)]}),
    ("reusable-int-key", TWO, [assign("init", [0], memory={0: 2 * GiB})], {"memory": 1 * GiB},
     {0b01: {"memory": 2 * GiB}}, {"memory": [((0,), T), ((1,), T)]}),
]


@pytest.mark.parametrize("provider", [memory_hints, memory_hint_family], ids=["explicit", "family"])
@pytest.mark.parametrize(("case", "topo", "assignments", "wanted", "reusable", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_calculated_hints(provider, case, topo, assignments, wanted, reusable, expected) -> None:
    state = build_memory_state(topo, assignments=assignments)
    assert readable(provider(state, wanted, reusable)) == expected


@pytest.mark.parametrize(
    ("nodes", "wanted", "expected"),
    [({0: (1536 * MiB, 512 * MiB, 0, None), 1: (1536 * MiB, 512 * MiB, 0, None)}, 1 * GiB,
      {"memory": [((0, 1), F)]}),
     ({0: (1536 * MiB, 1536 * MiB, 0, None), 1: (1536 * MiB, 512 * MiB, 0, None)}, 1 * GiB,
      {"memory": [((0,), T), ((0, 1), F)]})],
    ids=["single-fits-empty-machine-only", "one-node-still-free"],
)
def test_hand_built_state_like_kubelet_tests(nodes, wanted, expected) -> None:
    state = hand_state(nodes)
    assert readable(memory_hints(state, {"memory": wanted})) == expected
    assert readable(memory_hint_family(state, {"memory": wanted})) == expected


@pytest.mark.parametrize(
    ("case", "assignments", "wanted", "shape"),
    [("empty-machine", [], {"memory": 1 * GiB}, "family"),
     ("needs-all-nodes", [], {"memory": 3 * GiB}, "family"),
     ("pinned-node-too-full", PINNED_0, {"memory": 3584 * MiB}, "family"),
     ("pinned-node-fits-alone", PINNED_0, {"memory": 2 * GiB}, "list"),
     ("group-too-full", GROUP_01, {"memory": 5 * GiB}, "family"),
     ("exact-group-fits", GROUP_01, {"memory": 3 * GiB}, "list")],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_family_is_used_exactly_when_it_is_the_whole_answer(case, assignments, wanted, shape) -> None:
    topo = FOUR if case != "needs-all-nodes" else TWO
    state = build_memory_state(topo, assignments=assignments)
    answer = memory_hint_family(state, wanted)
    kinds = {type(v) for v in answer.values()}
    assert kinds == ({CapacityFamily} if shape == "family" else {list})
    if shape == "family":
        family = answer["memory"]
        assert set(family.nodes) == {n for n in state.node_ids if state.nodes[n].assignments == 0}
        assert len({id(v) for v in answer.values()}) == 1  # one shared family


REGEN = [
    ("one-block-per-resource", {"memory": 1 * GiB, HP1G: 1 * GiB},
     [MemoryBlock("memory", 1 * GiB, frozenset({0})), MemoryBlock(HP1G, 1 * GiB, frozenset({0}))],
     {"memory": [((0,), T)], HP1G: [((0,), T)]}),
    ("multi-numa-block-is-preferred", {"memory": 3 * GiB},
     [MemoryBlock("memory", 3 * GiB, frozenset({0, 1}))], {"memory": [((0, 1), T)]}),
    ("size-differs-is-nil", {"memory": 2 * GiB}, [MemoryBlock("memory", 1 * GiB, frozenset({0}))], None),
    ("fewer-blocks-is-nil", {"memory": 1 * GiB, HP1G: 1 * GiB},
     [MemoryBlock("memory", 1 * GiB, frozenset({0}))], None),
    ("more-blocks-is-nil", {"memory": 1 * GiB},
     [MemoryBlock("memory", 1 * GiB, frozenset({0})), MemoryBlock(HP1G, 1 * GiB, frozenset({0}))], None),
    ("type-not-requested-is-nil", {"memory": 1 * GiB, HP1G: 1 * GiB},
     [MemoryBlock("memory", 1 * GiB, frozenset({0})), MemoryBlock("hugepages-2Mi", 1 * GiB, frozenset({0}))],
     None),
    ("no-blocks-no-request", {}, [], {}),
]


@pytest.mark.parametrize("provider", [memory_hints, memory_hint_family], ids=["explicit", "family"])
@pytest.mark.parametrize(("case", "wanted", "blocks", "expected"), REGEN, ids=[c[0] for c in REGEN])
def test_regeneration_from_existing_blocks(provider, case, wanted, blocks, expected) -> None:
    # the machine is full: regeneration must not look at free memory
    state = build_memory_state(TWO, assignments=[assign("x", [0, 1], memory={0: 2 * GiB, 1: 2 * GiB})])
    assert readable(provider(state, wanted, regenerate_from=blocks)) == expected


def test_every_resource_gets_its_own_list_object() -> None:
    answer = memory_hints(build_memory_state(TWO), {"memory": 1 * GiB, HP1G: 1 * GiB})
    assert answer["memory"] == answer[HP1G] and answer["memory"] is not answer[HP1G]


# ---- past kubelet's 8 nodes ---------------------------------------------------------------
BIG = machine([8] * 64)


def test_64_nodes_empty_machine_is_one_family() -> None:
    answer = memory_hint_family(build_memory_state(BIG), {"memory": 20 * GiB})
    family = answer["memory"]
    assert isinstance(family, CapacityFamily)
    assert family.min_affinity == 3 and len(family.nodes) == 64
    assert family.contains(0b111) and not family.contains(0b11)


def test_64_nodes_with_pinned_nodes_lists_every_single_node() -> None:
    pinned = [assign(f"c{n}", [n], memory={n: 1 * GiB}) for n in range(32)]
    answer = memory_hint_family(build_memory_state(BIG, assignments=pinned), {"memory": 2 * GiB})
    hints = answer["memory"]
    assert isinstance(hints, list)
    assert [(sorted(h.affinity), h.preferred) for h in hints] == [([n], True) for n in range(64)]


def test_64_nodes_pinned_nodes_that_cannot_fit_leave_a_family_over_free_nodes() -> None:
    pinned = [assign(f"c{n}", [n], memory={n: 1 * GiB}) for n in range(32)]
    answer = memory_hint_family(build_memory_state(BIG, assignments=pinned), {"memory": 12 * GiB})
    family = answer["memory"]
    assert isinstance(family, CapacityFamily)
    assert family.nodes == tuple(range(32, 64)) and family.min_affinity == 2


def test_reusable_memory_with_a_bad_key_is_refused() -> None:
    from numa_pin.errors import RequestError

    with pytest.raises(RequestError, match="reusable"):
        memory_hints(build_memory_state(TWO), {"memory": 1}, {"zero": {"memory": 1}})

"""Pieces of the merge engine: average distance, family shapes, materialize threshold."""

from __future__ import annotations

import pytest
from policy_strategies import family_search_forced
from test_policy_kubelet_cases import DIST_EIGHT, EIGHT

from numa_pin.policy.base import NumaInfo, Ranker
from numa_pin.policy.hint import CapacityFamily
from numa_pin.policy.hint import TopologyHint as H
from numa_pin.policy.reference import reference_merge
from numa_pin.policy.registry import merge_hints

AVERAGES = [
    ("{0,2}", [0, 2], 11.0),
    ("{0,4}", [0, 4], 20.0),
    ("{6,7} reads d[7][6]=13", [6, 7], 11.0),
    ("{4,5}", [4, 5], 10.5),
    ("single node is its own distance", [3], 10.0),
    ("{0,1,2}", [0, 1, 2], (30 + 2 * 11 + 4 * 12) / 9),
    ("empty mask", [], 0.0),
]


@pytest.mark.parametrize("nodes,expected", [a[1:] for a in AVERAGES], ids=[a[0] for a in AVERAGES])
def test_average_distance(nodes: list[int], expected: float) -> None:
    info = NumaInfo.build(EIGHT, DIST_EIGHT)
    assert info.average_distance(H(nodes, True).mask or 0) == expected


def test_distance_rows_are_by_position_for_sparse_ids() -> None:
    """Row ``j`` entries are positions in sorted(numa_nodes): nodes 0 and 8 on a 2-node box."""
    info = NumaInfo.build([8, 0], {0: [10, 21], 8: [23, 11]})
    assert info.distance(0, 8) == 21 and info.distance(8, 0) == 23 and info.distance(8, 8) == 11
    assert info.average_distance(1 | 1 << 8) == (10 + 21 + 23 + 11) / 4


def test_ranker_keys_follow_compare_masks() -> None:
    ranker = Ranker(NumaInfo.build(EIGHT, DIST_EIGHT), closest=True)
    # closest never trades a narrower mask for a wider one
    assert ranker.preferred_key(0b10000) < ranker.preferred_key(0b101)
    # equal counts: average first, then the integer
    assert ranker.preferred_key(0b101) < ranker.preferred_key(0b10001)
    assert ranker.preferred_key(0b110) < ranker.preferred_key(0b11000000)


ODD_FAMILIES = [
    ("nodes outside the machine", CapacityFamily((0, 1, 9), ((2,), (2,), (5,)), (4,), 1)),
    ("a subset of the machine", CapacityFamily((1, 2), ((3,), (3,)), (3,), 1)),
    ("nothing fits", CapacityFamily((0, 1, 2), ((1,), (1,), (1,)), (4,), 1)),
    ("no nodes at all", CapacityFamily((), (), (1,), 1)),
    ("must_include outside its nodes", CapacityFamily((0, 1), ((5,), (5,)), (1,), 1, 1 << 3)),
    ("need already met by nothing", CapacityFamily((0, 1, 2, 3), ((0,), (0,), (0,), (0,)), (0,), 1)),
    ("min_affinity larger than the machine", CapacityFamily((0, 1, 2, 3), ((1,),) * 4, (2,), 7)),
]


@pytest.mark.parametrize("family", [f[1] for f in ODD_FAMILIES], ids=[f[0] for f in ODD_FAMILIES])
@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
@pytest.mark.parametrize("searched", [False, True], ids=["default", "family-search"])
def test_odd_families_equal_reference(family: CapacityFamily, policy: str, searched: bool) -> None:
    providers = [
        {"odd": family},
        {"cpu": CapacityFamily((0, 1, 2, 3), ((4,), (1,), (3,), (2,)), (4,), 1)},
        {"dev": [H([1], True), H([0, 1], False), H(None, True)]},
    ]
    nodes = [0, 1, 2, 3]
    dist = {a: [10 if a == b else 11 + a + b for b in nodes] for a in nodes}
    for closest in (False, True):
        expected = reference_merge(policy, providers, nodes, dist, closest)
        if searched:
            with family_search_forced():
                got = merge_hints(policy, providers, nodes, dist, closest)
        else:
            got = merge_hints(policy, providers, nodes, dist, closest)
        assert got == expected


def test_empty_family_reads_like_an_empty_list() -> None:
    """kubelet turns a resource's ``[]`` into ``[{nil, false}]``; a family with no member is that."""
    empty = CapacityFamily((0, 1), ((1,), (1,)), (5,), 1)
    with family_search_forced():
        as_family = merge_hints("best-effort", [{"r": empty}], [0, 1])
    assert as_family == merge_hints("best-effort", [{"r": []}], [0, 1]) == (H([0, 1], False), True)

"""The edge cases kubelet's own tests cover (``topology-manager.md`` §9), for every policy.

Expected values come from kubelet's test tables, not from either implementation; each case runs
through the production merge (``merge_hints``) and the brute-force reference alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from numa_pin.policy.hint import TopologyHint as H
from numa_pin.policy.reference import reference_merge
from numa_pin.policy.registry import merge_hints

TWO = [0, 1]
FOUR = [0, 1, 2, 3]
EIGHT = list(range(8))
# kubelet's commonNUMAInfoFourNodes / commonNUMAInfoEightNodes (asymmetric: d[7][6] = 13, d[6][7] = 11)
DIST_FOUR = {0: [10, 11, 12, 12], 1: [11, 10, 12, 12], 2: [12, 12, 10, 11], 3: [12, 12, 11, 10]}
DIST_EIGHT = {
    0: [10, 11, 12, 12, 30, 30, 30, 30],
    1: [11, 10, 12, 12, 30, 30, 30, 30],
    2: [12, 12, 10, 11, 30, 30, 30, 30],
    3: [12, 12, 11, 10, 30, 30, 30, 30],
    4: [30, 30, 30, 30, 10, 11, 12, 12],
    5: [30, 30, 30, 30, 11, 10, 12, 12],
    6: [30, 30, 30, 30, 12, 12, 10, 11],
    7: [30, 30, 30, 30, 12, 12, 13, 10],
}

T, F = True, False
NIL = None


def h(*nodes: int, p: bool) -> H:
    return H(nodes, p)


def nil(p: bool) -> H:
    return H(None, p)


@dataclass(frozen=True)
class Case:
    id: str
    nodes: list[int]
    providers: list[dict[str, object] | None]
    best_effort: tuple[list[int] | None, bool]
    #: single-numa-node's expected hint
    single: tuple[list[int] | None, bool]
    distances: dict[int, list[int]] | None = None
    closest: bool = False


def two(r1: list[H], r2: list[H]) -> list[dict[str, object] | None]:
    return [{"resource1": r1}, {"resource2": r2}]


CASES = [
    # -- no preference at all
    Case("no providers", TWO, [], ([0, 1], T), (NIL, T)),
    Case("provider returns empty map", TWO, [{}], ([0, 1], T), (NIL, T)),
    Case("provider returns nil map", TWO, [None], ([0, 1], T), (NIL, T)),
    Case("resource mapped to nil", TWO, [{"resource": None}], ([0, 1], T), (NIL, T)),
    Case("resource mapped to empty list", TWO, [{"resource": []}], ([0, 1], F), (NIL, F)),
    Case("single nil hint preferred", TWO, [{"resource": [nil(T)]}], ([0, 1], T), (NIL, T)),
    Case("single nil hint not preferred", TWO, [{"resource": [nil(F)]}], ([0, 1], F), (NIL, F)),
    Case("no providers on four nodes", FOUR, [], (FOUR, T), (NIL, T)),
    # -- kubelet commonPolicyMergeTestCases
    Case("same mask both preferred 1/2", TWO, two([h(0, p=T)], [h(0, p=T)]), ([0], T), ([0], T)),
    Case("same mask both preferred 2/2", TWO, two([h(1, p=T)], [h(1, p=T)]), ([1], T), ([1], T)),
    Case("one no-hint provider 1/2", TWO, [None, {"resource": [h(0, p=T)]}], ([0], T), ([0], T)),
    Case("one no-hint provider 2/2", TWO, [None, {"resource": [h(1, p=T)]}], ([1], T), ([1], T)),
    Case(
        "two hints vs matching single 1/2", TWO,
        two([h(0, p=T), h(1, p=T)], [h(0, p=T)]), ([0], T), ([0], T),
    ),
    Case(
        "two hints vs matching single 2/2", TWO,
        two([h(0, p=T), h(1, p=T)], [h(1, p=T)]), ([1], T), ([1], T),
    ),
    Case(
        "matching narrower preferred hint from both", TWO,
        two([h(0, p=T), h(1, p=T)], [h(0, p=T), h(0, 1, p=F)]), ([0], T), ([0], T),
    ),
    Case(
        "less narrow preferred beats narrower non-preferred (kubelet)", TWO,
        two([h(1, p=T), h(0, 1, p=F)], [h(0, p=T), h(1, p=T), h(0, 1, p=F)]), ([1], T), ([1], T),
    ),
    Case(
        "less narrow preferred beats narrower non-preferred (wide)", TWO,
        two([h(0, 1, p=T), h(0, p=F)], [h(0, 1, p=T), h(0, p=F)]), ([0, 1], T), (NIL, F),
    ),
    Case(
        "multiple resources same provider", TWO,
        [{"resource1": [h(1, p=T), h(0, 1, p=F)], "resource2": [h(0, p=T), h(1, p=T), h(0, 1, p=F)]}],
        ([1], T), ([1], T),
    ),
    # -- best-effort mergeTestCases
    Case(
        "same masks with different bits, narrowest", FOUR,
        two([h(0, 1, p=T), h(0, 2, p=T)], [h(0, 1, p=T), h(0, 2, p=T)]), ([0, 1], T), (NIL, F),
    ),
    Case("no common mask", TWO, two([h(0, p=T)], [h(1, p=T)]), ([0, 1], F), (NIL, F)),
    Case("same mask one not preferred 1/2", TWO, two([h(0, p=T)], [h(0, p=F)]), ([0], F), (NIL, F)),
    Case("same mask one not preferred 2/2", TWO, two([h(1, p=T)], [h(1, p=F)]), ([1], F), (NIL, F)),
    Case("preferred {0} and preferred {0,1} 1/2", TWO, two([h(0, p=T)], [h(0, 1, p=T)]), ([0], F), (NIL, F)),
    Case("preferred {1} and preferred {0,1} 2/2", TWO, two([h(1, p=T)], [h(0, 1, p=T)]), ([1], F), (NIL, F)),
    Case(
        "two hints vs single non-preferred", TWO,
        two([h(0, p=T), h(1, p=T)], [h(0, 1, p=F)]), ([0], F), (NIL, F),
    ),
    # -- bestNonPreferredAffinityCount (1)-(6): everything non-preferred
    Case(
        "bestNonPreferredAffinityCount (1)", FOUR,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(0, 1, p=F)]), ([0, 1], F), (NIL, F),
    ),
    Case(
        "bestNonPreferredAffinityCount (2)", FOUR,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(0, 3, p=F)]), ([0, 3], F), (NIL, F),
    ),
    Case(
        "bestNonPreferredAffinityCount (3)", FOUR,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, p=F)]), ([1, 2], F), (NIL, F),
    ),
    Case(
        "bestNonPreferredAffinityCount (4)", FOUR,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(2, 3, p=F)]), ([2, 3], F), (NIL, F),
    ),
    Case(
        "bestNonPreferredAffinityCount (5) narrowest", FOUR,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, p=F), h(2, 3, p=F)]), ([1, 2], F), (NIL, F),
    ),
    Case(
        "bestNonPreferredAffinityCount (6) narrowest", FOUR,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, 3, p=F), h(1, 2, p=F), h(1, 3, p=F), h(2, 3, p=F)]),
        ([1, 2], F), (NIL, F),
    ),
    Case(
        "bestNonPreferredAffinityCount (5) narrowest on eight nodes", EIGHT,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, p=F), h(2, 3, p=F)]), ([1, 2], F), (NIL, F),
        distances=DIST_EIGHT,
    ),
    Case(
        "bestNonPreferredAffinityCount (6) narrowest on eight nodes", EIGHT,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, 3, p=F), h(1, 2, p=F), h(1, 3, p=F), h(2, 3, p=F)]),
        ([1, 2], F), (NIL, F), distances=DIST_EIGHT,
    ),
    # -- prefer-closest-numa-nodes (kubelet mergeTestCasesClosestNUMA, eight-node matrix)
    Case(
        "closest picks {0,2} over {0,4}", EIGHT,
        two([h(0, 4, p=T), h(0, 2, p=T)], [h(0, 4, p=T), h(0, 2, p=T)]), ([0, 2], T), (NIL, F),
        distances=DIST_EIGHT, closest=True,
    ),
    Case(
        "closest keeps the narrower {4} over {0,2}", EIGHT,
        two([h(4, p=T), h(0, 2, p=T)], [h(4, p=T), h(0, 2, p=T)]), ([4], T), ([4], T),
        distances=DIST_EIGHT, closest=True,
    ),
    Case(
        "bestNonPreferredAffinityCount (5) closest", EIGHT,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, p=F), h(2, 3, p=F)]), ([2, 3], F), (NIL, F),
        distances=DIST_EIGHT, closest=True,
    ),
    Case(
        "bestNonPreferredAffinityCount (6) closest", EIGHT,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, 3, p=F), h(1, 2, p=F), h(1, 3, p=F), h(2, 3, p=F)]),
        ([2, 3], F), (NIL, F), distances=DIST_EIGHT, closest=True,
    ),
    Case(
        "bestNonPreferredAffinityCount (5) closest on four nodes", FOUR,
        two([h(0, 1, 2, 3, p=F), h(0, 1, p=F)], [h(1, 2, p=F), h(2, 3, p=F)]), ([2, 3], F), (NIL, F),
        distances=DIST_FOUR, closest=True,
    ),
    Case(
        "closest: {4,5} (avg 10.5) beats {6,7} (avg 11, d[7][6]=13)", EIGHT,
        two([h(6, 7, p=T), h(4, 5, p=T)], [h(6, 7, p=T), h(4, 5, p=T)]), ([4, 5], T), (NIL, F),
        distances=DIST_EIGHT, closest=True,
    ),
    Case(
        "closest: {1,2} ties {6,7} at 11, the smaller integer wins", EIGHT,
        two([h(6, 7, p=T), h(1, 2, p=T)], [h(6, 7, p=T), h(1, 2, p=T)]), ([1, 2], T), (NIL, F),
        distances=DIST_EIGHT, closest=True,
    ),
    Case(
        "closest: {6,7} (avg 11) beats {2,4} (avg 20)", EIGHT,
        two([h(2, 4, p=T), h(6, 7, p=T)], [h(2, 4, p=T), h(6, 7, p=T)]), ([6, 7], T), (NIL, F),
        distances=DIST_EIGHT, closest=True,
    ),
    # -- single-numa-node specifics
    Case(
        "single NUMA hint generation", TWO,
        [{"resource1": [h(0, 1, p=T)], "resource2": [h(0, p=T), h(1, p=T), h(0, 1, p=F)]}],
        ([0, 1], F), (NIL, F),
    ),
    Case(
        "one no-preference provider", TWO,
        [{"resource1": [h(0, p=T), h(1, p=T), h(0, 1, p=F)]}, None], ([0], T), ([0], T),
    ),
    Case("one-node machine: a real {0} becomes nil", [0], [{"resource": [h(0, p=T)]}], ([0], T), (NIL, T)),
    Case("one-node machine: nothing fits", [0], [{"resource": []}], ([0], F), (NIL, F)),
    Case(
        "bits outside the machine drop out", TWO,
        two([h(0, 5, p=T)], [h(0, p=T)]), ([0], F), (NIL, F),
    ),
]


def _expect(case: Case, policy: str) -> tuple[H, bool]:
    if policy == "none":
        return H(None, False), True
    aff, pref = case.best_effort if policy != "single-numa-node" else case.single
    hint = H(aff, pref)
    admit = True if policy == "best-effort" else pref
    return hint, admit


IMPLS = {"merge": merge_hints, "reference": reference_merge}


@pytest.mark.parametrize("impl", list(IMPLS), ids=list(IMPLS))
@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kubelet_case(case: Case, policy: str, impl: str) -> None:
    got = IMPLS[impl](policy, case.providers, case.nodes, case.distances, case.closest)
    assert got == _expect(case, policy)


COMPARE_ROWS = [
    # kubelet TestCompareHintsNarrowest, non-preferred rows: (current, candidate, B) -> winner
    ("1.1", [0, 1], [0, 1], 1, "current"),
    ("1.2", [1, 2], [0, 1], 1, "candidate"),
    ("1.3", [0, 1], [1, 2], 1, "current"),
    ("2.1", [0, 1], [0], 2, "current"),
    ("2.2", [0, 1], [0, 1], 2, "current"),
    ("2.3", [1, 2], [0, 1], 2, "candidate"),
    ("2.4", [0, 1], [1, 2], 2, "current"),
    ("3a", [0], [0, 1, 2], 2, "current"),
    ("3b", [0], [0, 1], 2, "candidate"),
    ("3ca.1", [0], [0, 1], 3, "candidate"),
    ("3ca.2", [0], [1, 2], 3, "candidate"),
    ("3ca.3", [0, 1], [1, 2, 3], 4, "candidate"),
    ("3cb", [1, 2, 3], [0, 1], 4, "current"),
    ("3cc.1", [0, 1, 2], [0, 1, 2], 4, "current"),
    ("3cc.2", [0, 1, 2], [1, 2, 3], 4, "current"),
    ("3cc.3", [1, 2, 3], [0, 1, 2], 4, "candidate"),
]


@pytest.mark.parametrize(
    "current,candidate,best,expected", [r[1:] for r in COMPARE_ROWS], ids=[r[0] for r in COMPARE_ROWS]
)
def test_compare_table(current: list[int], candidate: list[int], best: int, expected: str) -> None:
    """kubelet's compare() table against the reference fold step and against the total order
    (``Ranker``) the production merge maximizes."""
    from numa_pin.policy.base import NumaInfo, Ranker
    from numa_pin.policy.reference import HintMerger

    cur, cand = H(current, False), H(candidate, False)
    merger = HintMerger(FOUR, [], False, None)
    merger.best_non_preferred_count = best
    assert merger.compare(cur, cand) is (cur if expected == "current" else cand)
    ranker = Ranker(NumaInfo.build(FOUR), closest=False)
    key_cur = ranker.nonpreferred_key(cur.mask, best)  # type: ignore[arg-type]
    key_cand = ranker.nonpreferred_key(cand.mask, best)  # type: ignore[arg-type]
    assert (key_cand < key_cur) == (expected == "candidate")


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))

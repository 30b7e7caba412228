"""The family search of families.py (fact F4 of merge.py) against direct brute force.

Families are drawn *tight* (need close to total capacity: little slack), the regime where
several families must share the work of removing nodes and where greedy shortcuts fail.
The brute force builds the set of achievable intersections literally, from materialized
members, and answers each question by scanning it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_strategies import DETERMINISTIC, family_search_forced

from numa_pin.policy import families
from numa_pin.policy.base import NumaInfo, Ranker
from numa_pin.policy.hint import CapacityFamily, TopologyHint
from numa_pin.policy.reference import reference_merge
from numa_pin.policy.registry import merge_hints

SEARCH = DETERMINISTIC


def _mask(nodes: object) -> int:
    return sum(1 << n for n in nodes)  # type: ignore[union-attr]


@st.composite
def tight_families(draw: st.DrawFn, min_nodes: int = 3, max_nodes: int = 6) -> tuple[list[int], list[CapacityFamily]]:
    n = draw(st.integers(min_nodes, max_nodes))
    nodes = list(range(n))
    fams = []
    for _ in range(draw(st.integers(2, 3))):
        dims = draw(st.integers(1, 2))
        cap = tuple(tuple(draw(st.integers(0, 5)) for _ in range(dims)) for _ in nodes)
        need = tuple(max(0, sum(c[t] for c in cap) - draw(st.integers(0, 8))) for t in range(dims))
        must = _mask(n_ for n_ in nodes if draw(st.integers(0, 9)) == 0)
        fams.append(CapacityFamily(tuple(nodes), cap, need, draw(st.integers(1, n)), must))
    return nodes, fams


def _achievable(universe: int, fams: list[CapacityFamily]) -> set[int]:
    """Every intersection of one member per family, within ``universe`` (empty included).

    A family whose need is met by nothing also "holds" the empty mask; kubelet's lists never
    show it, and the merge never asks about it (it only looks for non-empty sets)."""
    members = [{m & universe for m in f.iter_masks()} | ({0} if f.contains(0) else set()) for f in fams]
    out = {universe}
    for ms in members:
        out = {x & m for x in out for m in ms}
    return out


def _prepared(nodes: list[int], fams: list[CapacityFamily]) -> list[families.Family]:
    built = [families.Family.build(f, _mask(nodes)) for f in fams]
    assert all(b is not None for b in built)
    return built  # type: ignore[return-value]


@SEARCH
@given(tight_families(), st.data())
def test_removal_oracle_matches_brute_force(case: tuple[list[int], list[CapacityFamily]], data: st.DataObject) -> None:
    nodes, fams = case
    if any(not f.contains(_mask(nodes)) for f in fams):
        return  # an empty family never reaches the search
    universe = _mask(data.draw(st.sets(st.sampled_from(nodes), min_size=1)))
    removal = families.Removal(universe, _prepared(nodes, fams))
    achievable = _achievable(universe, fams)
    removable = {universe & ~s for s in achievable}
    mand = _mask(data.draw(st.sets(st.sampled_from(nodes)))) & universe
    opt = _mask(data.draw(st.sets(st.sampled_from(nodes)))) & universe & ~mand
    r = data.draw(st.integers(-1, opt.bit_count() + 1))
    expected = any(
        rm & mand == mand and rm & ~(mand | opt) == 0 and (rm & opt).bit_count() >= r for rm in removable
    )
    assert removal.feasible(mand, opt, r) == expected


@SEARCH
@given(tight_families(), st.data())
def test_greedy_narrowest_matches_brute_force(case: tuple[list[int], list[CapacityFamily]], data: st.DataObject) -> None:
    nodes, fams = case
    if any(not f.contains(_mask(nodes)) for f in fams):
        return
    universe = _mask(data.draw(st.sets(st.sampled_from(nodes), min_size=1)))
    achievable = _achievable(universe, fams)
    counts = sorted({s.bit_count() for s in achievable if s})
    count = data.draw(st.sampled_from(counts))
    removal = families.Removal(universe, _prepared(nodes, fams))
    expected = min(s for s in achievable if s.bit_count() == count)
    assert families.greedy_narrowest(removal, universe, count) == expected


@SEARCH
@given(tight_families(max_nodes=6), st.data())
def test_closest_search_matches_brute_force(case: tuple[list[int], list[CapacityFamily]], data: st.DataObject) -> None:
    nodes, fams = case
    if any(not f.contains(_mask(nodes)) for f in fams):
        return
    distances = {a: [10 if a == b else data.draw(st.sampled_from([11, 12, 20, 21, 32])) for b in nodes] for a in nodes}
    info = NumaInfo.build(nodes, distances)
    ranker = Ranker(info, closest=True)
    universe = _mask(nodes)
    achievable = _achievable(universe, fams)
    count = data.draw(st.sampled_from(sorted({s.bit_count() for s in achievable if s})))
    removal = families.Removal(universe, _prepared(nodes, fams))
    size = universe.bit_count()
    found = families.closest_best(
        ranker, nodes, count, removal.fixed, (),
        subtree_ok=lambda inc, pool: removal.feasible(
            universe & ~(inc | pool), pool, size - count - (universe & ~(inc | pool)).bit_count()
        ),
    )
    expected = min((s for s in achievable if s.bit_count() == count), key=lambda s: (info.average_distance(s), s))
    assert found == expected


@SEARCH
@given(st.integers(2, 7), st.data())
def test_member_searches_match_brute_force(n: int, data: st.DataObject) -> None:
    """``first_colex`` (narrowest), ``closest_best`` with capacity constraints, ``min_size``."""
    nodes = list(range(n))
    fam = CapacityFamily(
        tuple(nodes),
        tuple(tuple(data.draw(st.integers(0, 6)) for _ in range(2)) for _ in nodes),
        (data.draw(st.integers(0, 15)), data.draw(st.integers(0, 15))),
        1,
        _mask(v for v in nodes if data.draw(st.integers(0, 6)) == 0),
    )
    if not fam.contains(_mask(nodes)):
        return
    built = _prepared(nodes, [fam])[0]
    members = list(fam.iter_masks())
    assert built.min_size() == min(m.bit_count() for m in members)
    k = data.draw(st.integers(1, n))
    sized = [m for m in members if m.bit_count() == k]
    assert families.first_colex(nodes, k, fam.must_include, built.constraints()) == (min(sized) if sized else None)
    distances = {a: [10 if a == b else data.draw(st.sampled_from([11, 12, 21, 32])) for b in nodes] for a in nodes}
    info = NumaInfo.build(nodes, distances)
    expected = min(sized, key=lambda s: (info.average_distance(s), s)) if sized else None
    found = families.closest_best(Ranker(info, True), nodes, k, fam.must_include, built.constraints())
    assert found == expected


@SEARCH
@given(tight_families(max_nodes=8))
def test_tight_families_through_merge_equal_reference(case: tuple[list[int], list[CapacityFamily]]) -> None:
    """Whole merges of tight families (few members each, so the reference stays affordable)."""
    nodes, fams = case
    providers = [{f"r{i}": f} for i, f in enumerate(fams)]
    distances = {a: [10 if a == b else 11 + (a * 7 + b * 3) % 20 for b in nodes] for a in nodes}
    with family_search_forced():
        for policy in ("best-effort", "restricted", "single-numa-node"):
            for closest in (False, True):
                expected = reference_merge(policy, providers, nodes, distances, closest)
                assert merge_hints(policy, providers, nodes, distances, closest) == expected


# -- 16 nodes: the family path against the same families materialized as explicit lists


def _sixteen_node_families(seed: int) -> list[CapacityFamily]:
    """Deterministic tight families on 16 nodes (members are sets of 12+ nodes: a few hundred).

    Seeds 0-3: pseudo-random weights, a high node every family must keep; seed 4: three equal families whose
    ``min_affinity`` is their smallest member size (preferred path); seed 5: heavy high nodes.
    """
    nodes = tuple(range(16))
    out = []
    for i in range(3):
        if seed == 4:
            cap = tuple(((v * 5) % 7 + 1, (v * 3) % 5 + 1) for v in nodes)
        elif seed == 5:
            cap = tuple((1 + v // 3 + (i + v) % 2, 1 + v // 4) for v in nodes)
        else:
            cap = tuple(((v * (5 + i) + seed) % 7 + 1, (v * (3 + seed) + i) % 5 + 1) for v in nodes)
        totals = [sum(c[t] for c in cap) for t in range(2)]
        if seed == 4:
            need = (totals[0] - 7, totals[1] - 5)
        else:
            need = (totals[0] - 6 - (seed + i) % 4, totals[1] - 5 - (seed * i) % 3)
        must = 1 << (15 - seed) if seed < 4 else 0
        fam = CapacityFamily(nodes, cap, need, 14 - (seed + i) % 3, must)
        if seed == 4:
            smallest = min(m.bit_count() for m in fam.iter_masks())
            fam = CapacityFamily(nodes, cap, need, smallest, must)
        out.append(fam)
    return out


SIXTEEN = list(range(16))
SIXTEEN_DIST = {a: [10 if a == b else 12 if a // 4 == b // 4 else 21 if abs(a // 4 - b // 4) == 1 else 32 for b in SIXTEEN] for a in SIXTEEN}


@pytest.mark.parametrize("seed", range(6), ids=[f"seed{s}" for s in range(6)])
@pytest.mark.parametrize("closest", [False, True], ids=["narrowest", "closest"])
@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
def test_sixteen_nodes_family_path_equals_materialized(seed: int, closest: bool, policy: str) -> None:
    fams = _sixteen_node_families(seed)
    as_families = [{f"r{i}": f} for i, f in enumerate(fams)]
    as_lists = [{f"r{i}": f.materialize()} for i, f in enumerate(fams)]
    assert all(len(lst) < 700 for p in as_lists for lst in p.values())  # type: ignore[arg-type]
    with family_search_forced():
        searched = merge_hints(policy, as_families, SIXTEEN, SIXTEEN_DIST, closest)
    materialized = merge_hints(policy, as_lists, SIXTEEN, SIXTEEN_DIST, closest)
    assert searched == materialized


@pytest.mark.parametrize("seed", range(4), ids=[f"seed{s}" for s in range(4)])
@pytest.mark.parametrize("closest", [False, True], ids=["narrowest", "closest"])
def test_sixteen_nodes_family_path_equals_reference(seed: int, closest: bool) -> None:
    """One family and one explicit list: the reference's product stays affordable on 16 nodes."""
    fam = _sixteen_node_families(seed)[0]
    explicit = [TopologyHint(range(s, s + 14), s % 2 == 0) for s in range(3)]
    providers = [{"cpu": fam}, {"dev": explicit}]
    with family_search_forced():
        got = merge_hints("best-effort", providers, SIXTEEN, SIXTEEN_DIST, closest)
    assert got == reference_merge("best-effort", providers, SIXTEEN, SIXTEEN_DIST, closest)


def test_sixteen_node_fixture_is_not_trivial() -> None:
    """The 16-node cases must reach the non-preferred family search with a real choice."""
    outcomes = set()
    for seed in range(6):
        fams = _sixteen_node_families(seed)
        hint, _ = merge_hints("best-effort", [{f"r{i}": f} for i, f in enumerate(fams)], SIXTEEN)
        outcomes.add((hint.preferred, hint.mask))
        assert hint.mask != _mask(SIXTEEN)
    assert len(outcomes) == 6
    assert {preferred for preferred, _mask_ in outcomes} == {True, False}
    # not all of them are "the lowest nodes"
    assert any(mask & (mask + 1) for _p, mask in outcomes)


def _random_tight_case(rng: random.Random) -> tuple[list[int], list[CapacityFamily]]:
    n = rng.randint(3, 5)
    nodes = list(range(n))
    fams = []
    for _ in range(rng.randint(2, 3)):
        dims = rng.randint(1, 2)
        cap = tuple(tuple(rng.randint(0, 5) for _ in range(dims)) for _ in nodes)
        need = tuple(max(0, sum(c[t] for c in cap) - rng.randint(0, 7)) for t in range(dims))
        must = _mask(v for v in nodes if rng.random() < 0.1)
        fams.append(CapacityFamily(tuple(nodes), cap, need, 1, must))
    return nodes, fams


@pytest.mark.parametrize("seed", range(4), ids=[f"seed{s}" for s in range(4)])
def test_greedy_every_count_many_small_machines(seed: int) -> None:
    """Plain seeded sweep (many small cases, every achievable count and sub-universe): the
    greedy must keep a node whenever leaving it out leaves no achievable set of that size."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(400):
        nodes, fams = _random_tight_case(rng)
        if any(not f.contains(_mask(nodes)) for f in fams):
            continue
        built = _prepared(nodes, fams)
        for universe in range(1, 1 << len(nodes)):
            achievable = _achievable(universe, fams)
            removal = families.Removal(universe, built)
            for count in sorted({s.bit_count() for s in achievable if s}):
                expected = min(s for s in achievable if s.bit_count() == count)
                assert families.greedy_narrowest(removal, universe, count) == expected, (nodes, fams, universe, count)
                checked += 1
    assert checked > 1000


GREEDY_TABLE = [
    # (families as (capacity, need, must), universe, count, expected): keeping the heavy node 3
    # is forced: leaving it out needs 3+3 or 3+5 removed by the only family with slack (6)
    ("heavy top node must stay", [((0, 3, 3, 5), 5, 1), ((1, 1, 1, 1), 4, 0)], 0b1110, 1, 0b1000),
    ("light nodes leave first", [((0, 1, 1, 1), 1, 1), ((1, 1, 1, 1), 4, 0)], 0b1110, 1, 0b0010),
    ("two families share the work", [((2, 2, 2, 2), 6, 0), ((2, 2, 2, 2), 6, 0)], 0b1111, 2, 0b0011),
]


@pytest.mark.parametrize(
    "specs,universe,count,expected", [row[1:] for row in GREEDY_TABLE], ids=[row[0] for row in GREEDY_TABLE]
)
def test_greedy_table(specs: list[tuple[tuple[int, ...], int, int]], universe: int, count: int, expected: int) -> None:
    nodes = [0, 1, 2, 3]
    fams = [CapacityFamily(tuple(nodes), tuple((c,) for c in caps), (need,), 1, must) for caps, need, must in specs]
    assert families.greedy_narrowest(families.Removal(universe, _prepared(nodes, fams)), universe, count) == expected
    assert min(s for s in _achievable(universe, fams) if s.bit_count() == count) == expected

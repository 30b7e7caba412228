"""The exact prefer-closest search (``policy/closest.py``) against independent oracles.

* Literal brute force over every ``k``-subset (the sum over ordered pairs divided by ``k**2`` in
  float, then the smaller integer: kubelet's ``Closest``), on real-world matrices (hierarchies,
  SNC, AMD NPS4, glueless and glued designs), relabeled and perturbed variants, and random ones,
  with forced nodes, capacity constraints and non-capacity oracles.
* The brute-force kubelet reference (``reference_merge``) for whole merges on up to 8 nodes.
* Beyond brute force: every ``k`` small or large enough to enumerate on 16-64 nodes; on the
  kit's 64-node machine every request size against a closed form (the kit's sum depends only on
  how many nodes each socket gives); and, on partly used 64-node machines, optimality
  certificates (valid, no single swap improves it).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from itertools import combinations

import pytest
from closest_matrices import LARGE, MATRICES, SMALL, Matrix, kit_64, perturbed, relabeled
from hypothesis import given
from hypothesis import strategies as st
from policy_strategies import DETERMINISTIC, family_search_forced, provider_answers

from numa_pin.policy import families
from numa_pin.policy.closest import _Search, closest_set
from numa_pin.policy.hint import CapacityFamily, TopologyHint
from numa_pin.policy.reference import reference_merge
from numa_pin.policy.registry import merge_hints
from numa_pin.policy.twins import twin_classes

Valid = Callable[[int], bool]


def _mask(nodes: Iterable[int]) -> int:
    return sum(1 << n for n in nodes)


def _sum(matrix: Matrix, nodes: Iterable[int]) -> int:
    members = list(nodes)
    return sum(matrix[a][b] for a in members for b in members)


def _rank(matrix: Matrix, mask: int) -> tuple[float, int]:
    """kubelet's ``Closest`` order for masks of one count: float64 average, then the integer."""
    count = mask.bit_count()
    members = [i for i in range(len(matrix)) if mask >> i & 1]
    return float(_sum(matrix, members)) / float(count * count), mask


def brute_closest(matrix: Matrix, k: int, valid: Valid) -> int | None:
    """Every ``k``-subset, literally."""
    best: tuple[float, int] | None = None
    for combo in combinations(range(len(matrix)), k):
        mask = _mask(combo)
        if valid(mask):
            key = _rank(matrix, mask)
            if best is None or key < best:
                best = key
    return None if best is None else best[1]


def _capacity_valid(forced: int, constraints: list[tuple[dict[int, int], int]]) -> Valid:
    def valid(mask: int) -> bool:
        if mask & forced != forced:
            return False
        members = [v for v in range(mask.bit_length()) if mask >> v & 1]
        return all(sum(w.get(v, 0) for v in members) >= need for w, need in constraints)

    return valid


def _exact_oracle(n: int, k: int, valid: Valid) -> Callable[[int, int], bool]:
    """``subtree_ok`` answered by scanning the valid ``k``-sets."""
    sets = [m for m in (_mask(c) for c in combinations(range(n), k)) if valid(m)]

    def subtree_ok(inc: int, pool: int) -> bool:
        return any(s & inc == inc and s & ~(inc | pool) == 0 for s in sets)

    return subtree_ok


@st.composite
def block_matrices(draw: st.DrawFn, max_nodes: int) -> Matrix:
    """Groups of twins (10 local, 11 inside a group) with random distances between groups:
    few classes holding several nodes each, in arbitrary arrangements."""
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=max(1, max_nodes // 2)))
    group = [g for g, size in enumerate(sizes) for _ in range(size)][:max_nodes]
    between = {
        (a, b): draw(st.sampled_from([16, 20, 21, 30, 40])) for a in range(len(sizes)) for b in range(a + 1, len(sizes))
    }

    def d(a: int, b: int) -> int:
        if a == b:
            return 10
        if group[a] == group[b]:
            return 11
        return between[(min(group[a], group[b]), max(group[a], group[b]))]

    return tuple(tuple(d(a, b) for b in range(len(group))) for a in range(len(group)))


@st.composite
def matrices(draw: st.DrawFn, names: dict[str, Matrix], max_nodes: int) -> Matrix:
    """A named real-world matrix (sometimes relabeled, perturbed or both), groups of twins, or a
    random one."""
    choice = draw(st.integers(0, 5))
    if choice == 5:
        return draw(block_matrices(max_nodes))
    if choice == 0:
        n = draw(st.integers(1, max_nodes))
        return tuple(
            tuple(10 if a == b else draw(st.sampled_from([11, 12, 16, 21, 22, 32])) for b in range(n))
            for a in range(n)
        )
    matrix = names[draw(st.sampled_from(sorted(n for n, m in names.items() if len(m) <= max_nodes)))]
    if choice >= 3:
        matrix = relabeled(matrix, draw(st.integers(0, 1000)))
    if choice == 2 or choice == 4:
        matrix = perturbed(matrix, draw(st.integers(0, 1000)))
    return matrix


@st.composite
def capacity_questions(draw: st.DrawFn, max_nodes: int = 12) -> tuple[Matrix, int, int, list[tuple[dict[int, int], int]]]:
    matrix = draw(matrices(MATRICES, max_nodes))
    n = len(matrix)
    k = draw(st.integers(1, n))
    forced = _mask(v for v in range(n) if draw(st.integers(0, 7)) == 0)
    constraints = []
    for _ in range(draw(st.integers(0, 2))):
        # few distinct weights, so sub-types hold several nodes
        palette = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
        weights = {v: draw(st.sampled_from(palette)) for v in range(n)}
        constraints.append((weights, draw(st.integers(0, 2 * k + 2))))
    return matrix, k, forced, constraints


@DETERMINISTIC
@given(capacity_questions())
def test_closest_set_equals_brute_force(case: tuple[Matrix, int, int, list[tuple[dict[int, int], int]]]) -> None:
    matrix, k, forced, constraints = case
    n = len(matrix)
    expected = brute_closest(matrix, k, _capacity_valid(forced, constraints))
    got = closest_set(matrix, range(n), k, forced, constraints)
    assert got == expected


@DETERMINISTIC
@given(matrices(MATRICES, 10), st.data())
def test_closest_set_with_an_oracle_equals_brute_force(matrix: Matrix, data: st.DataObject) -> None:
    """Validity no capacity sum expresses: allowed label counts, told apart only by ``kinds``."""
    n = len(matrix)
    k = data.draw(st.integers(1, n))
    labels = [data.draw(st.integers(0, 2)) for _ in range(n)]
    allowed = data.draw(st.sets(st.tuples(st.integers(0, k), st.integers(0, k)), min_size=1, max_size=12))
    forced = _mask(v for v in range(n) if data.draw(st.integers(0, 9)) == 0)

    def valid(mask: int) -> bool:
        counts = [sum(1 for v in range(n) if mask >> v & 1 and labels[v] == label) for label in (0, 1)]
        return mask & forced == forced and tuple(counts) in allowed

    subtree_ok = _exact_oracle(n, k, valid)
    expected = brute_closest(matrix, k, valid)
    with_kinds = closest_set(matrix, range(n), k, forced, (), subtree_ok, dict(enumerate(labels)))
    without = closest_set(matrix, range(n), k, forced, (), subtree_ok)
    assert with_kinds == expected
    assert without == expected


def test_oracle_split_search_does_not_reuse_failures_across_prefixes() -> None:
    """Four groups of twins, validity by label counts: the split of a later group that fails after
    one choice in an earlier group may succeed after another (found by a seeded search)."""
    tiers = ((10, 11, 20, 20, 40, 40, 40, 40), (20, 20, 10, 11, 20, 20, 40, 40))
    matrix = (
        tiers[0], (11, 10, 20, 20, 40, 40, 40, 40), tiers[1], (20, 20, 11, 10, 20, 20, 40, 40),
        (40, 40, 20, 20, 10, 11, 40, 40), (40, 40, 20, 20, 11, 10, 40, 40),
        (40, 40, 40, 40, 40, 40, 10, 11), (40, 40, 40, 40, 40, 40, 11, 10),
    )
    labels = [2, 1, 2, 1, 2, 0, 2, 2]
    allowed = {(0, 1), (0, 3), (3, 4), (4, 3)}

    def valid(mask: int) -> bool:
        counts = [sum(1 for v in range(8) if mask >> v & 1 and labels[v] == label) for label in (0, 1)]
        return tuple(counts) in allowed

    expected = brute_closest(matrix, 4, valid)
    assert expected is not None
    got = closest_set(matrix, range(8), 4, 0, (), _exact_oracle(8, 4, valid), dict(enumerate(labels)))
    assert got == expected


@DETERMINISTIC
@given(st.sampled_from(sorted(SMALL)), st.data())
def test_merge_on_real_matrices_equals_reference(name: str, data: st.DataObject) -> None:
    """Whole merges (families on the family-search path) against the brute-force reference."""
    matrix = SMALL[name]
    if data.draw(st.booleans()):
        matrix = relabeled(matrix, data.draw(st.integers(0, 1000)))
    nodes = list(range(len(matrix)))
    distances = {a: list(matrix[a]) for a in nodes}
    providers = data.draw(provider_answers(nodes))
    with family_search_forced():
        for policy in ("best-effort", "restricted"):
            expected = reference_merge(policy, providers, nodes, distances, True)  # type: ignore[arg-type]
            assert merge_hints(policy, providers, nodes, distances, True) == expected  # type: ignore[arg-type]


@st.composite
def tight_families(draw: st.DrawFn, n: int) -> list[CapacityFamily]:
    """2-3 families with little slack (several must share the removals), few distinct weights."""
    fams = []
    for _ in range(draw(st.integers(2, 3))):
        palette = draw(st.lists(st.integers(0, 3), min_size=1, max_size=2))
        cap = tuple((draw(st.sampled_from(palette)),) for _ in range(n))
        need = (max(0, sum(c[0] for c in cap) - draw(st.integers(0, 6))),)
        fams.append(CapacityFamily(tuple(range(n)), cap, need, draw(st.integers(1, n))))
    return fams


@DETERMINISTIC
@given(st.sampled_from(sorted(name for name, m in SMALL.items() if len(m) <= 8)), st.data())
def test_tight_families_on_real_matrices_equal_reference(name: str, data: st.DataObject) -> None:
    """Several tight families: the non-preferred search with the removal oracle and ``kinds``."""
    matrix = SMALL[name]
    nodes = list(range(len(matrix)))
    distances = {a: list(matrix[a]) for a in nodes}
    fams = data.draw(tight_families(len(nodes)))
    product = 1
    for fam in fams:
        product *= max(1, sum(1 for _ in fam.iter_masks()))
    if product > 20000:
        return  # the reference's cross product would be too long
    providers = [{f"r{i}": f} for i, f in enumerate(fams)]
    with family_search_forced():
        expected = reference_merge("best-effort", providers, nodes, distances, True)
        assert merge_hints("best-effort", providers, nodes, distances, True) == expected


# -- beyond brute force over the whole problem ---------------------------------------------------


def _large_cases() -> list[tuple[str, int]]:
    out = []
    for name, matrix in LARGE.items():
        n = len(matrix)
        reach = 4 if n <= 16 else 3 if n <= 32 else 2
        out += [(name, k) for k in sorted({*range(1, reach + 1), *range(n - reach + 1, n + 1)})]
    return out


@pytest.mark.parametrize("name,k", _large_cases(), ids=[f"{n}-k{k}" for n, k in _large_cases()])
def test_large_machines_small_and_large_k_equal_brute_force(name: str, k: int) -> None:
    """16-64 nodes, ``k`` near either end so that every ``k``-subset can be scanned; seeded
    capacities (weights 0-2, one forced node sometimes) make sub-types and ties interesting."""
    matrix = LARGE[name]
    n = len(matrix)
    rng = random.Random(f"{name}-{k}")
    weights = {v: rng.choice((0, 1, 2, 2)) for v in range(n)}
    need = rng.randint(0, sum(sorted(weights.values(), reverse=True)[:k]))
    forced = 1 << rng.randrange(n) if rng.random() < 0.3 else 0
    constraints = [(weights, need)]
    expected = brute_closest(matrix, k, _capacity_valid(forced, constraints))
    got = closest_set(matrix, range(n), k, forced, constraints)
    assert got == expected


def _kit_expected(k: int, exclude_node0: bool) -> int:
    """The kit's 64-node machine (8 sockets x 8 nodes, 10 / 12 / 32): a set taking ``c_s`` nodes
    of socket ``s`` sums to ``10k + 12 sum c_s (c_s - 1) + 32 (k**2 - sum c_s**2)``, so the
    closest sets are those with the largest ``sum c_s**2``: full sockets plus one remainder
    (it majorizes every other vector of socket counts). Among the ways to place them, the
    smallest integer takes each socket's lowest nodes (node 1 up in socket 0 when node 0 is out).
    """
    full, rest = divmod(k, 8)
    best = None
    for full_sockets in combinations(range(8), full):
        for rest_socket in [s for s in range(8) if s not in full_sockets] if rest else [None]:
            counts = [8 if s in full_sockets else rest if s == rest_socket else 0 for s in range(8)]
            if exclude_node0 and counts[0] == 8:
                continue
            mask = 0
            for socket, c in enumerate(counts):
                first = 8 * socket + (1 if socket == 0 and exclude_node0 else 0)
                mask |= _mask(range(first, first + c))
            if best is None or mask < best:
                best = mask
    assert best is not None
    return best


@pytest.mark.parametrize("cpus", range(1, 128))
def test_kit_64_node_machine_every_request_size(cpus: int) -> None:
    """The decision the hook makes on the kit's empty 64-node machine (node 0 has one free CPU,
    the others two): a CPU family asking for ``cpus``, prefer-closest, through the whole merge.
    The preferred result is the closest ``ceil(cpus / 2)``-set holding enough CPUs: an even
    request needs two CPUs on every node, so node 0 is out."""
    matrix = kit_64()
    nodes = list(range(64))
    distances = {a: list(matrix[a]) for a in nodes}
    k = -(-cpus // 2)
    family = CapacityFamily(tuple(nodes), tuple((1 if v == 0 else 2,) for v in nodes), (cpus,), k)
    hint, admit = merge_hints("best-effort", [{"cpu": family}, None], nodes, distances, True)
    assert admit and hint.preferred
    assert hint.mask == _kit_expected(k, exclude_node0=cpus == 2 * k)


def _swap_certificate(matrix: Matrix, mask: int, valid: Valid) -> None:
    """``mask`` is valid and no valid set one swap away ranks before it."""
    n = len(matrix)
    assert valid(mask)
    inside = [v for v in range(n) if mask >> v & 1]
    outside = [v for v in range(n) if not mask >> v & 1]
    k = len(inside)
    total = _sum(matrix, inside)
    rank = (float(total) / float(k * k), mask)
    for u in inside:
        without = total - sum(matrix[u][x] + matrix[x][u] for x in inside) + matrix[u][u]
        for w in outside:
            swapped = without + sum(matrix[w][x] + matrix[x][w] for x in inside if x != u) + matrix[w][w]
            other = mask & ~(1 << u) | 1 << w
            if (float(swapped) / float(k * k), other) < rank:
                assert not valid(other), (u, w)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ["kit-64", "glued-32-snc2", "glueless-8s-snc2"])
def test_partly_used_large_machines_certificates(name: str, seed: int) -> None:
    """Random free capacity (2 dimensions, like CPUs and memory), sizes across the machine:
    the answer is valid and no single swap improves it."""
    matrix = LARGE[name]
    n = len(matrix)
    rng = random.Random(f"{name}-{seed}")
    cpus = {v: rng.randint(0, 4) for v in range(n)}
    mem = {v: rng.choice((0, 8, 16)) for v in range(n)}
    for k in sorted({max(1, n // 8), n // 3, n // 2, 2 * n // 3}):
        # needs some random k-set meets, so that an answer exists
        witness = rng.sample(range(n), k)
        constraints = [
            (cpus, rng.randint(0, sum(cpus[v] for v in witness))),
            (mem, rng.randint(0, sum(mem[v] for v in witness))),
        ]
        valid = _capacity_valid(0, constraints)
        got = closest_set(matrix, range(n), k, 0, constraints)
        assert got is not None and got.bit_count() == k
        _swap_certificate(matrix, got, valid)


# -- the pieces -------------------------------------------------------------------------------


def test_kit_64_classes_are_its_sockets() -> None:
    matrix = kit_64()
    classes = twin_classes(matrix, [list(col) for col in zip(*matrix)])
    assert classes == [list(range(s * 8, s * 8 + 8)) for s in range(8)]


def test_twin_classes_are_twins() -> None:
    """Every class found on the real-world matrices is made of true twins (C1), and nodes that
    are twins are never split."""
    for matrix in MATRICES.values():
        n = len(matrix)

        def twins(u: int, v: int, matrix: Matrix = matrix, n: int = n) -> bool:
            return (
                matrix[u][u] == matrix[v][v]
                and matrix[u][v] == matrix[v][u]
                and all(matrix[u][w] == matrix[v][w] and matrix[w][u] == matrix[w][v] for w in range(n) if w not in (u, v))
            )

        classes = twin_classes(matrix, [list(col) for col in zip(*matrix)])
        where = {v: i for i, members in enumerate(classes) for v in members}
        for u in range(n):
            for v in range(u + 1, n):
                assert twins(u, v) == (where[u] == where[v]), (u, v)


def test_interchangeable_sockets_are_found() -> None:
    """On the kit machine the eight sockets are interchangeable classes (C4)."""
    matrix = kit_64()
    search = _Search(matrix, list(range(64)), 20, 0, (), None, None)
    assert search.same_as_previous == [False] + [True] * 7


def test_equal_float_averages_tie_on_the_integer() -> None:
    """C5: with distances near 2**50, sums that differ by one can share a float64 average, and
    kubelet then keeps the smaller integer. The search must do the same."""
    base = 1 << 50
    for seed in range(30):
        rng = random.Random(seed)
        n = 6
        matrix = tuple(
            tuple(base if a == b else base + rng.randint(0, 3) for b in range(n)) for a in range(n)
        )
        expected = brute_closest(matrix, 3, lambda mask: True)
        assert closest_set(matrix, range(n), 3) == expected


def test_an_exact_tie_on_the_sum_goes_to_the_smaller_integer() -> None:
    """Two sockets of a 10/12/32 machine hold the same sum; the lower one wins."""
    matrix = kit_64()
    got = closest_set(matrix, range(64), 8, 0, [({v: 1 for v in range(8, 64)}, 8)])
    assert got == _mask(range(8, 16))


def test_no_valid_set() -> None:
    matrix = SMALL["snc4-2s"]
    assert closest_set(matrix, range(8), 3, 0, [({0: 1}, 2)]) is None
    assert closest_set(matrix, range(8), 2, _mask([0, 1, 2])) is None
    assert closest_set(matrix, range(8), 0) is None
    assert closest_set(matrix, range(8), 9) is None


def test_merge_uses_the_search_for_families() -> None:
    """The merge's family path answers through ``closest_set`` (the wrapper keeps its contract)."""
    matrix = SMALL["glueless-8s"]
    nodes = list(range(8))
    family = CapacityFamily(tuple(nodes), tuple((1,) for _ in nodes), (3,), 3)
    from numa_pin.policy.base import NumaInfo, Ranker

    info = NumaInfo.build(nodes, {a: list(matrix[a]) for a in nodes})
    built = families.Family.build(family, _mask(nodes))
    assert built is not None
    got = families.closest_best(Ranker(info, True), nodes, 3, 0, built.constraints())
    assert got == brute_closest(matrix, 3, lambda mask: True)
    hint, _ = merge_hints("best-effort", [{"cpu": family}, {"dev": [TopologyHint(None, True)]}], nodes,
                          {a: list(matrix[a]) for a in nodes}, True)
    assert hint.mask == got and hint.preferred

"""Property tests: the production merge equals the brute-force kubelet reference.

Every example is a random machine (up to 8 nodes, ids not always contiguous, random asymmetric
distances) and random providers: None, {}, resource -> None / [] / hint lists mixing nil,
empty, preferred and non-preferred masks (some with bits outside the machine) / capacity
families. All four policies, prefer-closest on and off. Deterministic (derandomized).
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st
from policy_strategies import DETERMINISTIC, POLICY_NAMES, family_search_forced, machines, provider_answers

from numa_pin.policy.reference import reference_merge
from numa_pin.policy.registry import merge_hints


def _check_all_policies(nodes: list[int], distances: dict[int, list[int]], providers: list[object]) -> None:
    for policy in POLICY_NAMES:
        for closest in (False, True):
            expected = reference_merge(policy, providers, nodes, distances, closest)  # type: ignore[arg-type]
            got = merge_hints(policy, providers, nodes, distances, closest)  # type: ignore[arg-type]
            assert got == expected, (policy, closest)


@st.composite
def cases(draw: st.DrawFn, with_families: bool = True) -> tuple[list[int], dict[int, list[int]], list[object]]:
    nodes, distances = draw(machines())
    return nodes, distances, draw(provider_answers(nodes, with_families))


@DETERMINISTIC
@given(cases())
def test_merge_equals_reference(case: tuple[list[int], dict[int, list[int]], list[object]]) -> None:
    _check_all_policies(*case)


@DETERMINISTIC
@given(cases())
def test_merge_equals_reference_family_search(case: tuple[list[int], dict[int, list[int]], list[object]]) -> None:
    """Same, with no family materialized: exercises the family search on small machines."""
    with family_search_forced():
        _check_all_policies(*case)


@DETERMINISTIC
@given(cases(with_families=False))
def test_merge_equals_reference_explicit_lists(case: tuple[list[int], dict[int, list[int]], list[object]]) -> None:
    _check_all_policies(*case)


def _shuffled(providers: list[object], seed: int) -> list[object]:
    rng = random.Random(seed)
    out = []
    for answer in providers:
        if isinstance(answer, dict) and answer:
            items = list(answer.items())
            rng.shuffle(items)
            out.append(dict(items))
        else:
            out.append(answer)
    rng.shuffle(out)
    return out


@DETERMINISTIC
@given(cases(), st.integers(0, 2**32 - 1))
def test_independent_of_provider_and_resource_order(
    case: tuple[list[int], dict[int, list[int]], list[object]], seed: int
) -> None:
    """kubelet iterates resources in Go's random map order; the result must not depend on it."""
    nodes, distances, providers = case
    reordered = _shuffled(providers, seed)
    for policy in POLICY_NAMES:
        for closest in (False, True):
            first = merge_hints(policy, providers, nodes, distances, closest)  # type: ignore[arg-type]
            again = merge_hints(policy, reordered, nodes, distances, closest)  # type: ignore[arg-type]
            assert first == again
            assert reference_merge(policy, reordered, nodes, distances, closest) == first  # type: ignore[arg-type]

"""Properties on random machines of at most 8 nodes, against the explicit enumeration.

* the family answer materializes to exactly kubelet's lists;
* past the explicit limit the answer is a subset of kubelet's, with every preferred hint
  kept when one node can hold the request;
* :func:`best_memory_hint` is ``findBestHint`` over the enumerated list;
* :func:`allocate_memory` decides as a straightforward reimplementation of kubelet's
  ``Allocate`` over the enumerated list, never takes more than is free, and stays inside
  the nodes it grants.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memkit import GiB, MiB, machine

from numa_pin.allocators.memory import allocate_memory
from numa_pin.errors import AllocationError
from numa_pin.policy import bitmask
from numa_pin.policy.hint import CapacityFamily
from numa_pin.providers.memory import best_memory_hint, memory_hint_family, memory_hints, reusable_key
from numa_pin.topology.memory import build_memory_state

UNIT = 512 * MiB
HP1G = "hugepages-1Gi"
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw, max_nodes: int = 8):
    n = draw(st.integers(1, max_nodes))
    mem = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    pages = [draw(st.integers(0, min(3, m))) for m in mem]
    topo = machine(mem, hugepages={1048576: pages})
    state = build_memory_state(topo)
    assignments = []
    for i in range(draw(st.integers(0, 4))):
        group = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(n, 3)))
        per = {}
        for resource in draw(st.sets(st.sampled_from(["memory", HP1G]), min_size=1)):
            per[resource] = {
                node: draw(st.integers(0, state.allocatable(node, resource) // UNIT)) * UNIT for node in group
            }
        assignments.append((f"c{i}", per, frozenset(group)))
    state = build_memory_state(topo, assignments=assignments)
    request = {"memory": draw(st.integers(0, 12)) * UNIT}
    if draw(st.booleans()):
        request[HP1G] = draw(st.integers(0, 6)) * GiB
    reusable = None
    if draw(st.booleans()):
        reusable = {
            reusable_key(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))): {
                "memory": draw(st.integers(0, 8)) * UNIT}
            for _ in range(draw(st.integers(1, 2)))
        }
    return state, request, reusable


def _pairs(answer):
    if answer is None:
        return None
    out = {}
    for resource, hints in answer.items():
        if isinstance(hints, CapacityFamily):
            hints = hints.materialize()
        out[resource] = [(h.mask, h.preferred) for h in hints]
    return out


@SETTINGS
@given(scenarios(), st.booleans())
def test_family_answer_equals_the_explicit_lists(scenario, with_reusable) -> None:
    state, request, reusable = scenario
    reusable = reusable if with_reusable else None
    assert _pairs(memory_hint_family(state, request, reusable)) == _pairs(memory_hints(state, request, reusable))


@SETTINGS
@given(scenarios(max_nodes=6))
def test_family_is_returned_whenever_no_pinned_node_group_or_reuse_could_hold_the_request(scenario) -> None:
    state, request, _ = scenario
    answer = memory_hint_family(state, request)
    explicit = memory_hints(state, request)
    if not explicit:
        assert answer == {}
        return
    masks = [h.mask for h in next(iter(explicit.values()))]
    only_free = all(all(state.nodes[n].assignments == 0 for n in bitmask.bits(m)) for m in masks)
    assert all(isinstance(v, CapacityFamily) for v in answer.values()) == only_free


@SETTINGS
@given(scenarios())
def test_beyond_the_explicit_limit_the_answer_is_a_subset_keeping_preferred_singles(scenario) -> None:
    state, request, _ = scenario
    exact = _pairs(memory_hints(state, request))
    approx = _pairs(memory_hint_family(state, request, max_explicit_nodes=0))
    assert approx.keys() <= exact.keys()
    for resource, hints in approx.items():
        assert set(hints) <= set(exact[resource])
        if any(mask.bit_count() == 1 and pref for mask, pref in exact[resource]):
            assert {h for h in exact[resource] if h[1]} <= set(hints)


def _find_best(hints):
    """kubelet ``findBestHint``."""
    best = None
    for hint in hints:
        if best is None or (hint.preferred and not best.preferred):
            best = hint
        elif hint.preferred == best.preferred and bitmask.is_narrower(hint.mask, best.mask):
            best = hint
    return best


@SETTINGS
@given(scenarios(), st.data())
def test_best_hint_is_find_best_hint_over_the_list(scenario, data) -> None:
    state, request, reusable = scenario
    must = data.draw(st.sets(st.sampled_from(state.node_ids), max_size=2))
    lists = memory_hints(state, request, reusable)
    candidates = [h for h in (next(iter(lists.values())) if lists else []) if h.mask & bitmask.from_nodes(must)
                  == bitmask.from_nodes(must)]
    assert best_memory_hint(state, request, reusable, containing=must) == _find_best(candidates)


def _kubelet_allocate(state, request, affinity, preferred, reusable):
    """An independent, literal reading of kubelet's static ``Allocate`` over the enumerated hints.

    Returns ``(nodes, {resource: {node: bytes}})`` or the name of the failing step."""
    lists = memory_hints(state, request, reusable)
    hints = next(iter(lists.values())) if lists else []
    if affinity is None:
        if not hints:
            return "default"
        best = _find_best(hints)
        if preferred and not best.preferred:
            return "default-preferred"
        mask, preferred = best.mask, best.preferred
    else:
        mask = bitmask.from_nodes(affinity)
    nodes = sorted(bitmask.bits(mask))
    if any(sum(state.free(n, r) for n in nodes) < want for r, want in request.items()):
        wider = [h for h in hints if h.mask & mask == mask]
        if not wider:
            return "extend"
        best = _find_best(wider)
        if preferred and not best.preferred:
            return "extend-preferred"
        nodes = sorted(bitmask.bits(best.mask))
    if len(nodes) > 1:
        for n in nodes:
            node = state.nodes[n]
            if node.assignments and (len(node.cells) == 1 or node.cells != frozenset(nodes)):
                return "violates"
    reuse = (reusable or {}).get(reusable_key(nodes), {})
    taken = {}
    for resource, size in request.items():
        size = max(0, size - reuse.get(resource, 0))
        taken[resource] = {}
        for n in nodes:
            free = state.free(n, resource)
            part = min(size, free)
            taken[resource][n] = part
            size -= part
    return frozenset(nodes), taken


STEP = {
    "default": "failed to get the default NUMA affinity",
    "default-preferred": "failed to find the default preferred hint",
    "extend": "failed to find NUMA nodes to extend",
    "extend-preferred": "failed to find the extended preferred hint",
    "violates": "violates NUMA node allocation",
}


@SETTINGS
@given(scenarios(), st.data())
def test_allocation_matches_kubelet_and_never_overdraws(scenario, data) -> None:
    state, request, reusable = scenario
    affinity = data.draw(st.none() | st.sets(st.sampled_from(state.node_ids), min_size=1))
    preferred = data.draw(st.booleans())
    expected = _kubelet_allocate(state, request, affinity, preferred, reusable)
    if not request:
        assert allocate_memory(state, request, affinity).nodes == frozenset()
        return
    if isinstance(expected, str):
        try:
            allocate_memory(state, request, affinity, preferred=preferred, reusable=reusable)
        except AllocationError as exc:
            assert STEP[expected] in str(exc)
        else:
            raise AssertionError(f"expected the {expected!r} step to fail")
        return
    grant = allocate_memory(state, request, affinity, preferred=preferred, reusable=reusable)
    nodes, taken = expected
    assert grant.nodes == nodes
    assert {r: dict(p) for r, p in grant.per_resource.items()} == taken
    if affinity is not None:
        assert grant.nodes >= affinity
    for resource, per_node in grant.per_resource.items():
        assert set(per_node) == set(grant.nodes)
        for node, amount in per_node.items():
            assert 0 <= amount <= state.free(node, resource)
        reused = (reusable or {}).get(reusable_key(grant.nodes), {}).get(resource, 0)
        assert sum(per_node.values()) == max(0, request[resource] - reused)

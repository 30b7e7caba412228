"""Hypothesis strategies and helpers shared by the policy tests (imported, not collected)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from numa_pin.policy import merge
from numa_pin.policy.hint import CapacityFamily, TopologyHint

#: deterministic CI: fixed derandomized examples, no example database, no deadline
DETERMINISTIC = settings(
    max_examples=600,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

#: the cartesian product the brute-force reference may walk per example
MAX_PRODUCT = 6000

POLICY_NAMES = ("none", "best-effort", "restricted", "single-numa-node")


@contextlib.contextmanager
def family_search_forced() -> Iterator[None]:
    """Run merge.py with every family on the family-search path (no materializing)."""
    saved = merge.MATERIALIZE_LIMIT
    merge.MATERIALIZE_LIMIT = 0
    try:
        yield
    finally:
        merge.MATERIALIZE_LIMIT = saved


def list_size(value: object) -> int:
    """Length of the list the reference will iterate for one resource value."""
    if value is None:
        return 1
    if isinstance(value, CapacityFamily):
        return max(1, sum(1 for _ in value.iter_masks()))
    return max(1, len(value))  # type: ignore[arg-type]


def trim(providers: list[dict[str, object] | None]) -> list[dict[str, object] | None]:
    """Drop trailing resources until the reference's cross product is affordable."""
    out: list[dict[str, object] | None] = []
    product = 1
    for hints in providers:
        if not hints:
            out.append(hints)
            continue
        kept: dict[str, object] = {}
        for name, value in hints.items():
            size = list_size(value)
            if product * size > MAX_PRODUCT:
                continue
            product *= size
            kept[name] = value
        out.append(kept or None)
    return out


@st.composite
def machines(draw: st.DrawFn, max_nodes: int = 8) -> tuple[list[int], dict[int, list[int]]]:
    """Sorted node ids (not always 0..N-1) and a random, possibly asymmetric distance matrix."""
    count = draw(st.integers(1, max_nodes))
    contiguous = draw(st.booleans())
    if contiguous:
        nodes = list(range(count))
    else:
        nodes = sorted(draw(st.sets(st.integers(0, max_nodes + 1), min_size=count, max_size=count)))
    distances = {
        a: [10 if a == b else draw(st.sampled_from([11, 12, 13, 20, 21, 30, 32])) for b in nodes]
        for a in nodes
    }
    return nodes, distances


def hints_for(nodes: list[int]) -> st.SearchStrategy[TopologyHint]:
    bits = sorted(set(nodes) | {max(nodes) + 1})  # one bit outside the machine, sometimes
    masks = st.sets(st.sampled_from(bits), max_size=len(bits)).map(
        lambda s: sum(1 << b for b in s)
    )
    return st.one_of(
        st.builds(lambda p: TopologyHint(None, p), st.booleans()),
        st.builds(TopologyHint.from_mask, masks, st.booleans()),
    )


@st.composite
def families(draw: st.DrawFn, nodes: list[int], odd: bool = True) -> CapacityFamily:
    """A random family over the machine's nodes (or, with ``odd``, a subset of them)."""
    fam_nodes = list(nodes)
    if odd and len(nodes) > 1 and draw(st.integers(0, 5)) == 0:
        fam_nodes = sorted(draw(st.sets(st.sampled_from(nodes), min_size=1)))
    dims = draw(st.integers(1, 2))
    capacity = tuple(tuple(draw(st.integers(0, 5)) for _ in range(dims)) for _ in fam_nodes)
    need = tuple(draw(st.integers(0, 12)) for _ in range(dims))
    must = 0
    if draw(st.integers(0, 4)) == 0:
        for n in fam_nodes:
            if draw(st.integers(0, 2)) == 0:
                must |= 1 << n
    return CapacityFamily(tuple(fam_nodes), capacity, need, draw(st.integers(0, 3)), must)


@st.composite
def provider_answers(draw: st.DrawFn, nodes: list[int], with_families: bool = True) -> list[dict[str, object] | None]:
    """0-3 providers: None, {}, or resources mapped to None, [], hint lists or families."""
    providers: list[dict[str, object] | None] = []
    for p in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            providers.append(None)
            continue
        if kind == 1:
            providers.append({})
            continue
        answer: dict[str, object] = {}
        for r in range(draw(st.integers(1, 3))):
            choice = draw(st.integers(0, 9))
            name = f"p{p}r{r}"
            if choice == 0:
                answer[name] = None
            elif choice == 1:
                answer[name] = []
            elif with_families and choice >= 7:
                answer[name] = draw(families(nodes))
            else:
                answer[name] = draw(st.lists(hints_for(nodes), min_size=1, max_size=4))
        providers.append(answer)
    return trim(providers)

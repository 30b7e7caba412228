"""Memory and hugepages hints: kubelet's Memory Manager static policy (pure, no I/O).

Resources are ``"memory"`` and one ``"hugepages-<size>"`` per page size, named as kubelet names
them (``"hugepages-2Mi"``, ``"hugepages-1Gi"``); amounts are bytes. Each resource has its own
per-node :class:`MemoryTable` (``cpu-memory-device.md`` §7).

* The machine state (:class:`~numa_pin.topology.memory.MemoryState`, built by
  :func:`~numa_pin.topology.memory.build_memory_state`) lives in :mod:`numa_pin.topology.memory`.
* :func:`memory_hints` is kubelet's ``GetTopologyHints`` for one container: regeneration from
  existing blocks, else ``calculateHints`` over all ``2**N`` masks.
* :func:`memory_hint_family` answers the same, but as one shared
  :class:`~numa_pin.policy.hint.CapacityFamily` whenever the answer is one, so that a
  64-node machine is never enumerated.
* :func:`best_memory_hint` is kubelet's ``findBestHint`` over the calculated hints (optionally
  only hints containing a mask), computed without enumerating; the allocator uses it.

kubelet gives hints only to pods of the Guaranteed QoS class and returns ``None`` for any other
pod. That gate is the caller's job: these functions always compute.

How the valid masks decompose (used to avoid enumeration). A node with no assignment is *free*.
A node with assignments is either *pinned* (its group is itself) or in a multi-node *group*.
kubelet's rules (§7 steps 3-4) then allow exactly: any mask made only of free nodes, the
single-node mask of a pinned node, and a group's exact mask; each still needs enough free
memory (plus reusable memory keyed by that exact mask). Masks over free nodes form a
capacity family; the others are at most one per node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import combinations

from numa_pin.base.record import record
from numa_pin.errors import RequestError
from numa_pin.policy import bitmask
from numa_pin.policy.hint import CapacityFamily, ProviderHints, TopologyHint
from numa_pin.providers.cover import covers, min_cover_size
from numa_pin.providers.podrequest import pod_request
from numa_pin.topology.memory import MemoryBlock, MemoryState, check_amount, check_request

#: past this many nodes :func:`memory_hint_family` never enumerates masks (see its docstring)
DEFAULT_MAX_EXPLICIT_NODES = 16


#: what :func:`memory_hints` returns: ``None``, ``{}``, or the same hints for every resource
MemoryHints = dict[str, list[TopologyHint]] | None


# ---- hints -------------------------------------------------------------------------------
def reusable_key(nodes: Iterable[int]) -> str:
    """The key of reusable memory for a mask: :func:`numa_pin.policy.bitmask.format_mask` (``"{0,1}"``)."""
    return bitmask.format_mask(bitmask.from_nodes(nodes))


def reusable_by_mask(
    reusable: Mapping[object, Mapping[str, int]] | None, request: Mapping[str, int]
) -> dict[int, dict[str, int]]:
    """``{int mask: {resource: bytes}}`` keeping only positive amounts of requested resources.

    Keys may be :func:`reusable_key` strings, int masks or iterables of node ids.

    Raises:
        RequestError: a key that is not a mask, or a bad amount.
    """
    out: dict[int, dict[str, int]] = {}
    for key, per_resource in (reusable or {}).items():
        mask = _mask_of_key(key)
        for resource, amount in per_resource.items():
            if resource in request and check_amount(amount, f"reusable {resource}") > 0:
                out.setdefault(mask, {})[resource] = amount
    return out


def _mask_of_key(key: object) -> int:
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    if isinstance(key, str):
        text = key.strip()
        if text.startswith("{") and text.endswith("}"):
            body = text[1:-1].strip()
            try:
                return bitmask.from_nodes(int(part) for part in body.split(",")) if body else 0
            except ValueError:
                pass
        raise RequestError(f"reusable memory key {key!r} is not a mask like '{{0,1}}'")
    if isinstance(key, Iterable):
        return bitmask.from_nodes(key)
    raise RequestError(f"reusable memory key {key!r} is not a mask")


def _sum(state: MemoryState, mask: int, resource: str, attr: str) -> int:
    return sum(getattr(state.table(n, resource), attr) for n in bitmask.bits(mask))


def _fits(
    state: MemoryState, mask: int, request: Mapping[str, int], attr: str, extra: Mapping[str, int] | None = None
) -> bool:
    extra = extra or {}
    return all(_sum(state, mask, r, attr) + extra.get(r, 0) >= want for r, want in request.items())


def _allowed(state: MemoryState, mask: int) -> bool:
    """kubelet's group rules (§7 steps 3 and 4) for ``mask``."""
    members = list(bitmask.bits(mask))
    if len(members) == 1:
        return len(state.nodes[members[0]].cells) == 1
    group = frozenset(members)
    for n in members:
        node = state.nodes[n]
        if node.assignments > 0 and (len(node.cells) == 1 or node.cells != group):
            return False
    return True


def _regenerate(blocks: Iterable[MemoryBlock], request: Mapping[str, int]) -> MemoryHints:
    """kubelet ``regenerateHints``: one preferred hint per block, or ``None`` on a mismatch."""
    blocks = list(blocks)
    hints: dict[str, list[TopologyHint]] = {r: [] for r in request}
    if len(blocks) != len(request):
        return None
    for block in blocks:
        if block.resource not in request or block.size != request[block.resource]:
            return None
        hints[block.resource].append(TopologyHint(block.nodes, True))
    return hints


def _calculate(
    state: MemoryState, request: Mapping[str, int], reusable: Mapping[int, Mapping[str, int]]
) -> dict[str, list[TopologyHint]]:
    """kubelet ``calculateHints``, enumerating every mask (``2**N``)."""
    ids = state.node_ids
    min_affinity = len(ids)
    passed: list[int] = []
    for size in range(1, len(ids) + 1):
        for combo in combinations(ids, size):
            mask = bitmask.from_nodes(combo)
            if not _fits(state, mask, request, "allocatable"):
                continue
            min_affinity = min(min_affinity, size)  # before the exclusions, on purpose (§7 step 2)
            if not _allowed(state, mask):
                continue
            if _fits(state, mask, request, "free", reusable.get(mask)):
                passed.append(mask)
    if not passed:
        return {}
    return {r: [TopologyHint.from_mask(m, m.bit_count() == min_affinity) for m in passed] for r in request}


def memory_hints(
    state: MemoryState,
    request: Mapping[str, int],
    reusable: Mapping[object, Mapping[str, int]] | None = None,
    regenerate_from: Iterable[MemoryBlock] | None = None,
) -> MemoryHints:
    """kubelet's memory hints for one container (or one pod, with the pod's request).

    ``request`` maps ``memory`` / ``hugepages-<size>`` to bytes. ``reusable`` is the pod's
    init-container memory, ``{mask key: {resource: bytes}}`` (keys as :func:`reusable_key`).
    ``regenerate_from`` are the container's existing blocks (at pod scope: those of the first
    container, init containers first, that has any); when given, the answer is one
    preferred hint per block, or ``None`` if the blocks do not match the request (count,
    type or size). Otherwise every mask is checked (§7 ``calculateHints``) and every
    requested resource gets the same list; ``{}`` when no mask passes.

    Costs ``2**N`` masks: see :func:`memory_hint_family` for large machines.

    Raises:
        RequestError: a bad resource name, amount or reusable key.
    """
    req = check_request(request)
    if regenerate_from is not None:
        return _regenerate(regenerate_from, req)
    return _calculate(state, req, reusable_by_mask(reusable, req))


# ---- scalable form -------------------------------------------------------------------------
@record
class _Parts:
    """The valid masks of a request, split as the module docstring explains."""

    min_affinity: int
    resources: tuple[str, ...]
    free_nodes: tuple[int, ...]  # members of the capacity family
    free_vectors: tuple[tuple[int, ...], ...]
    need: tuple[int, ...]
    extras: tuple[int, ...]  # valid masks outside the family (pinned, groups, reusable keys)
    exact: bool  # False when the state is not one kubelet can produce (see _split)


def _split(state: MemoryState, req: Mapping[str, int], reusable: Mapping[int, Mapping[str, int]]) -> _Parts | None:
    """``None`` when no mask passes the allocatable check (nothing can ever fit)."""
    resources = tuple(sorted(req))
    need = tuple(req[r] for r in resources)
    ids = state.node_ids
    alloc = [tuple(state.allocatable(n, r) for r in resources) for n in ids]
    min_affinity = min_cover_size(alloc, need)
    if min_affinity is None:
        return None
    free_nodes = tuple(n for n in ids if state.nodes[n].assignments == 0 and len(state.nodes[n].cells) == 1)
    # neither a node without assignments bound to a group nor free above allocatable can come
    # out of build_memory_state; hand-built states like that are enumerated instead
    exact = all(
        (node.assignments > 0 or len(node.cells) == 1)
        and all(t.free <= t.allocatable for t in node.tables.values())
        for node in state.nodes.values()
    )
    candidates: set[int] = set(reusable)
    for n in ids:
        node = state.nodes[n]
        if node.assignments > 0:
            candidates.add(bitmask.from_nodes(node.cells))
    extras = tuple(
        sorted(
            (m for m in candidates if m and m & ~bitmask.from_nodes(ids) == 0 and _valid(state, m, req, reusable)),
            key=_kubelet_order,
        )
    )
    vectors = tuple(tuple(state.free(n, r) for r in resources) for n in free_nodes)
    return _Parts(min_affinity, resources, free_nodes, vectors, need, extras, exact)


def _valid(state: MemoryState, mask: int, req: Mapping[str, int], reusable: Mapping[int, Mapping[str, int]]) -> bool:
    return (
        _fits(state, mask, req, "allocatable")
        and _allowed(state, mask)
        and _fits(state, mask, req, "free", reusable.get(mask))
    )


def _kubelet_order(mask: int) -> tuple[int, tuple[int, ...]]:
    return (mask.bit_count(), tuple(bitmask.bits(mask)))


def _family(parts: _Parts) -> CapacityFamily:
    return CapacityFamily(
        nodes=parts.free_nodes,
        capacity=parts.free_vectors,
        need=parts.need,
        min_affinity=parts.min_affinity,
    )


def memory_hint_family(
    state: MemoryState,
    request: Mapping[str, int],
    reusable: Mapping[object, Mapping[str, int]] | None = None,
    regenerate_from: Iterable[MemoryBlock] | None = None,
    *,
    max_explicit_nodes: int = DEFAULT_MAX_EXPLICIT_NODES,
) -> ProviderHints:
    """:func:`memory_hints`, answered with one shared :class:`CapacityFamily` where possible.

    The family (capacity per node = free bytes of each requested resource, ``min_affinity``
    exact on allocatable) stands for the list exactly when every valid mask is made of free
    nodes only, i.e. no pinned node, group or reusable-memory mask can take the request by
    itself. Its ``nodes`` are then the nodes without assignments: a mask touching an assigned
    node is never valid, so the family never includes one. When no free-node mask fits,
    the (short) list of those other masks is the answer. Otherwise the explicit lists are
    returned, as long as the machine has at most ``max_explicit_nodes`` nodes.

    Past that size (kubelet refuses such machines by default) the answer is an exact subset
    of kubelet's: when one node can hold the request on an empty machine, the valid
    single-node masks plus the valid pinned / group / reusable masks (every preferred hint
    is among them); otherwise the family over free nodes.

    Raises:
        RequestError: as :func:`memory_hints`.
    """
    req = check_request(request)
    if regenerate_from is not None:
        return _regenerate(regenerate_from, req)  # type: ignore[return-value]
    reuse = reusable_by_mask(reusable, req)
    if not req:
        return {}
    parts = _split(state, req, reuse)
    if parts is None:
        return {}
    if not parts.exact:
        return _calculate(state, req, reuse)  # type: ignore[return-value]
    family = _family(parts)
    if not family.nodes or not family.contains(bitmask.from_nodes(family.nodes)):
        masks = list(parts.extras)  # no family member: the extras are the whole answer
    elif not parts.extras:
        return {r: family for r in parts.resources}
    elif len(state.node_ids) <= max_explicit_nodes:
        return _calculate(state, req, reuse)  # type: ignore[return-value]
    elif parts.min_affinity > 1:
        return {r: family for r in parts.resources}
    else:
        singles = {1 << n for n in parts.free_nodes if family.contains(1 << n)}
        masks = sorted(singles | set(parts.extras), key=_kubelet_order)
    if not masks:
        return {}
    return {r: [TopologyHint.from_mask(m, m.bit_count() == parts.min_affinity) for m in masks] for r in parts.resources}


def best_memory_hint(
    state: MemoryState,
    request: Mapping[str, int],
    reusable: Mapping[object, Mapping[str, int]] | None = None,
    containing: Iterable[int] | None = None,
) -> TopologyHint | None:
    """kubelet ``findBestHint`` over the calculated hints (preferred first, then narrowest),
    restricted to hints containing every node of ``containing``; ``None`` when there is none.

    Exact, and computed without enumerating masks on states :func:`build_memory_state` builds.

    Raises:
        RequestError: as :func:`memory_hints`.
    """
    req = check_request(request)
    reuse = reusable_by_mask(reusable, req)
    must = bitmask.from_nodes(containing or ())
    if not req:
        return None
    parts = _split(state, req, reuse)
    if parts is None:
        return None
    if not parts.exact:
        lists = _calculate(state, req, reuse)
        hints = [h for h in next(iter(lists.values()), []) if h.mask is not None and h.mask & must == must]
        if not hints:
            return None
        best = min(hints, key=lambda h: (not h.preferred, h.mask.bit_count(), h.mask))  # type: ignore[union-attr]
        return best
    options = [m for m in parts.extras if m & must == must]
    member = narrowest_member(_family(parts), must)
    if member is not None:
        options.append(member)
    if not options:
        return None
    # every valid mask has at least min_affinity nodes, so narrowest == preferred first
    mask = min(options, key=lambda m: (m.bit_count(), m))
    return TopologyHint.from_mask(mask, mask.bit_count() == parts.min_affinity)


def narrowest_member(family: CapacityFamily, must: int = 0) -> int | None:
    """The narrowest mask of ``family`` (kubelet ``IsNarrowerThan``: fewest nodes, then the
    smallest integer) that contains ``must``; ``None`` when there is none."""
    must |= family.must_include
    index = {n: i for i, n in enumerate(family.nodes)}
    if any(n not in index for n in bitmask.bits(must)):
        return None
    vectors = {n: tuple(family.capacity[index[n]]) for n in family.nodes}
    left = [
        max(0, want - sum(vectors[n][d] for n in bitmask.bits(must))) for d, want in enumerate(family.need)
    ]
    rest = [n for n in family.nodes if not must >> n & 1]
    extra = min_cover_size([vectors[n] for n in rest], left, base=0 if must else 1)  # masks are never empty
    if extra is None:
        return None
    chosen = must
    # the smallest integer among covers of that size has the lowest possible highest node:
    # the first prefix of ``rest`` holding a cover ends with a node every such cover uses
    while extra > 0:
        lo, hi = extra - 1, len(rest) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if covers([vectors[n] for n in rest[: mid + 1]], left, extra):
                hi = mid
            else:
                lo = mid + 1
        node = rest[lo]
        chosen |= 1 << node
        left = [max(0, x - v) for x, v in zip(left, vectors[node])]
        rest, extra = rest[:lo], extra - 1
    return chosen


# ---- pod scope -----------------------------------------------------------------------------
def pod_memory_request(
    init_containers: Iterable[tuple[Mapping[str, int], bool]],
    app_containers: Iterable[Mapping[str, int]],
) -> dict[str, int]:
    """kubelet ``getPodRequestedResources``: the pod-level request at pod scope.

    ``init_containers`` are ``(request, restartable)`` in spec order. A restartable (sidecar)
    init container adds to a running sum; a regular one counts as that running sum plus its
    own request, and the peak is kept. Each resource gets ``max(peak, sum of app containers
    + sum of sidecars)``. As in kubelet, only resources some app container requests appear.

    Raises:
        RequestError: as :func:`check_request`.
    """
    return pod_request(init_containers, app_containers, check_request, keep_init_only=False)

"""Memory and hugepages allocation: kubelet's Memory Manager static ``Allocate`` (pure).

Given the affinity the Topology Manager chose, :func:`allocate_memory` picks the NUMA nodes
(widening the affinity when it cannot hold the request) and takes the bytes of every
requested resource from those nodes in ascending node order, as kubelet's
``updateMachineState`` does. Nothing is mutated: the result is a :class:`MemoryGrant` that the
caller records; :func:`numa_pin.providers.memory.build_memory_state` reads it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from numa_pin.base.record import field, record
from numa_pin.errors import AllocationError
from numa_pin.policy import bitmask
from numa_pin.providers.memory import best_memory_hint, reusable_by_mask
from numa_pin.topology.memory import Assignment, MemoryBlock, MemoryState, check_request, hugepage_size_kb


@record
class MemoryGrant:
    """The memory one container got.

    ``nodes`` is the NUMA group (kubelet's block affinity, what ``cpuset.mems`` should be);
    ``per_resource`` maps every requested resource to ``{node: bytes taken}`` with one entry
    per node of the group (0 where nothing was taken); ``requested`` keeps the full request
    (it differs from the bytes taken when init-container memory was reused). A grant with
    no ``requested`` reads it back as the bytes taken.
    """

    nodes: frozenset[int]
    per_resource: Mapping[str, Mapping[int, int]]
    requested: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", frozenset(self.nodes))
        per = {r: MappingProxyType(dict(sorted(p.items()))) for r, p in sorted(self.per_resource.items())}
        object.__setattr__(self, "per_resource", MappingProxyType(per))
        requested = dict(self.requested) or {r: sum(p.values()) for r, p in per.items()}
        object.__setattr__(self, "requested", MappingProxyType(requested))

    def blocks(self) -> tuple[MemoryBlock, ...]:
        """kubelet's blocks, for :func:`~numa_pin.providers.memory.memory_hints` regeneration."""
        return tuple(MemoryBlock(r, size, self.nodes) for r, size in sorted(self.requested.items()))

    def as_assignment(self, container_key: str) -> Assignment:
        """The entry :func:`~numa_pin.providers.memory.build_memory_state` takes."""
        return (container_key, self.per_resource, self.nodes)


def allocate_memory(
    state: MemoryState,
    request: Mapping[str, int],
    affinity_nodes: Iterable[int] | None,
    *,
    preferred: bool = False,
    reusable: Mapping[object, Mapping[str, int]] | None = None,
    spread: frozenset[str] = frozenset(),
) -> MemoryGrant:
    """Place ``request`` (``{resource: bytes}``) on the machine (kubelet static ``Allocate``).

    1. ``affinity_nodes`` ``None``: use the best calculated hint (preferred first, then the
       narrowest); if the Topology Manager's hint was ``preferred`` and that one is not, fail.
    2. An affinity whose free memory cannot hold every resource is widened to the best
       calculated hint that contains it (same preferred rule).
    3. A multi-node result must not touch a node that holds a single-node allocation or
       belongs to another group.
    4. For each resource, reusable init-container memory keyed by the result's mask is
       subtracted, then the rest is taken from the nodes in ascending order, each node giving
       what it has free. A hugepages resource in ``spread`` (``numa-pin.io/hugepages-spread``;
       kubelet has no such option) is first taken in whole pages evenly over the nodes (the
       lower nodes give the odd pages), then what a short node could not give comes from the
       others in ascending order.

    ``preferred`` is the Topology Manager hint's flag; ``reusable`` as in
    :func:`~numa_pin.providers.memory.memory_hints`. An empty request gets an empty grant.

    Raises:
        RequestError: a bad resource name or amount.
        AllocationError: kubelet's message for the step that failed, followed by every
            requested resource's free bytes per NUMA node.
    """
    req = check_request(request)
    if not req:
        return MemoryGrant(frozenset(), {}, {})
    if affinity_nodes is None:
        best = best_memory_hint(state, req, reusable)
        if best is None:
            raise _error(
                state, req, "failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
            )
        if preferred and not best.preferred:
            raise _error(state, req, "failed to find the default preferred hint")
        mask, preferred = best.mask or 0, best.preferred
    else:
        mask = bitmask.from_nodes(affinity_nodes)
        unknown = sorted(set(bitmask.bits(mask)) - set(state.node_ids))
        if unknown:
            raise _error(state, req, f"affinity names NUMA node(s) {unknown} the machine does not have")
        if not mask:
            raise _error(state, req, "the affinity holds no NUMA node")
    if not _free_holds(state, mask, req):
        wider = best_memory_hint(state, req, reusable, containing=bitmask.bits(mask))
        if wider is None:
            raise _error(state, req, "failed to find NUMA nodes to extend the current topology hint "
                         f"{bitmask.format_mask(mask)}")
        if preferred and not wider.preferred:
            raise _error(state, req, "failed to find the extended preferred hint")
        mask = wider.mask or 0
    if _violates_groups(state, mask):
        raise _error(state, req, f"preferred hint {bitmask.format_mask(mask)} violates NUMA node allocation")

    nodes = list(bitmask.bits(mask))
    reuse = reusable_by_mask(reusable, req).get(mask, {})
    per_resource: dict[str, dict[int, int]] = {}
    for resource, size in req.items():
        left = max(0, size - reuse.get(resource, 0))
        taken = dict.fromkeys(nodes, 0)
        if resource in spread and len(nodes) > 1:
            page = hugepage_size_kb(resource) * 1024
            base, odd = divmod(left // page, len(nodes))
            for i, n in enumerate(nodes):
                taken[n] = min((base + (i < odd)) * page, state.free(n, resource))
            left -= sum(taken.values())
        for n in nodes:
            part = min(left, state.free(n, resource) - taken[n])
            taken[n] += part
            left -= part
        per_resource[resource] = taken
    return MemoryGrant(frozenset(nodes), per_resource, req)


def _free_holds(state: MemoryState, mask: int, req: Mapping[str, int]) -> bool:
    """kubelet ``isAffinitySatisfyRequest``: free bytes only, reusable memory not counted."""
    return all(sum(state.free(n, r) for n in bitmask.bits(mask)) >= want for r, want in req.items())


def _violates_groups(state: MemoryState, mask: int) -> bool:
    """kubelet ``isAffinityViolatingNUMAAllocations``."""
    members = list(bitmask.bits(mask))
    if len(members) == 1:
        return False
    group = frozenset(members)
    for n in members:
        node = state.nodes[n]
        if node.assignments == 0:
            continue
        if len(node.cells) == 1 or node.cells != group:
            return True
    return False


def _error(state: MemoryState, req: Mapping[str, int], reason: str) -> AllocationError:
    parts = []
    for resource, want in sorted(req.items()):
        per = ", ".join(f"{n}: {state.free(n, resource)}" for n in state.node_ids)
        parts.append(f"{resource}: requested {want} bytes, free per NUMA node {{{per}}}")
    return AllocationError(f"[memorymanager] {reason}; " + "; ".join(parts))

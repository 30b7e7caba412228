"""Memory and hugepages, and the memory nodes of a grant: the pure half of the memory resource.

kubelet's Memory Manager on one node: hints from :mod:`numa_pin.providers.memory`, allocation
by :mod:`numa_pin.allocators.memory`. Every admitted container with resources gets ``mems``:
the group of nodes its memory came from, else the merged affinity's nodes that have memory,
else every node with memory. The memory code is imported only when a request names memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from numa_pin.base.quantity import format_bytes
from numa_pin.errors import RequestError, TopologyAffinityError
from numa_pin.ledger.model import Grant
from numa_pin.policy.hint import ProviderHints
from numa_pin.requests.request import Amounts
from numa_pin.resources.base import Need, NodeView, Resource, zone_entry

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from typing import Any

    from numa_pin.requests.request import ContainerRequest
    from numa_pin.resources.runtime import RuntimeTarget
    from numa_pin.topology.memory import MemoryState


class MemoryResource(Resource):
    """``numa-pin.io/memory`` and ``numa-pin.io/hugepages-*``; the grant's ``mems``."""

    name = "memory"

    def view(self, need: Need) -> Need:
        return need

    def wants(self, view: Need) -> bool:
        return bool(view.request.amounts.memory_resources)

    def refusal(self, request: ContainerRequest, target: RuntimeTarget) -> str:
        """A memory policy needs a path that sets it before the container's first process runs."""
        if request.memory_policy is not None and not target.memory_policy:
            return target.cannot(f"numa-pin.io/memory-policy {request.memory_policy!r}")
        return ""

    def hints(self, view: Need, amounts: Amounts) -> ProviderHints:
        if not amounts.memory_resources:
            return None
        from numa_pin.providers.memory import memory_hint_family

        return memory_hint_family(_memory_state(view), amounts.memory_resources)

    def allocate(self, view: Need, amounts: Amounts, affinity: frozenset[int] | None,
                 strict: bool) -> Mapping[str, Any]:
        fields = dict(self._allocate(view, amounts, affinity, strict))
        tier = view.request.memory_tier_nodes
        if tier:  # a declared tier (CPU-less CXL/HBM nodes) joins the memory nodes
            missing = sorted(tier - frozenset(view.topology.node_ids))
            if missing:
                raise RequestError(f"memory tier {view.request.memory_tier} names NUMA node(s) {missing} "
                                   "this machine does not have", annotation="numa-pin.io/memory-tier")
            fields["mems"] = frozenset(fields.get("mems", frozenset())) | tier
        return fields

    def _allocate(self, view: Need, amounts: Amounts, affinity: frozenset[int] | None,
                  strict: bool) -> Mapping[str, Any]:
        topology = view.topology
        all_nodes = frozenset(topology.node_ids)
        mem_nodes = frozenset(n for n, node in topology.nodes.items() if node.memory_total_kb > 0) or all_nodes
        req = amounts.memory_resources
        if not req:
            return {"mems": affinity & mem_nodes or mem_nodes if affinity is not None else mem_nodes}
        from numa_pin.allocators.memory import allocate_memory

        mem_state = _memory_state(view)
        inside = affinity if strict else None
        if inside is not None and any(sum(mem_state.free(n, r) for n in inside) < want for r, want in req.items()):
            raise TopologyAffinityError("the memory requested does not fit there")
        huge = frozenset(r for r in req if r.startswith("hugepages-"))
        spread = huge if view.request.hugepages_spread else frozenset()
        grant = allocate_memory(mem_state, req, affinity, spread=spread)
        if inside is not None and not grant.nodes <= inside:
            raise TopologyAffinityError("the memory allocator would leave these nodes")
        if grant.nodes:
            mems = grant.nodes
        else:
            mems = affinity & mem_nodes or mem_nodes if affinity is not None else mem_nodes
        return {"memory": {res: dict(per) for res, per in grant.per_resource.items()}, "mems": mems}

    def free_summary(self, view: Need, amounts: Amounts) -> list[str]:
        req = amounts.memory_resources
        if not req:
            return []
        mem_state = _memory_state(view)
        nodes = view.topology.node_ids
        return [
            f"{res} {format_bytes(want)} requested, free per node: "
            + " ".join(f"{n}={format_bytes(mem_state.free(n, res))}" for n in nodes)
            for res, want in req.items()
        ]

    def zones(self, node: NodeView) -> Mapping[int, list[dict[str, str]]]:
        """kubelet's memory manager tables: memory, then hugepages by page size."""
        from numa_pin.topology.memory import MEMORY, build_memory_state, hugepage_size_kb

        assignments = [
            (g.container_id, g.memory, frozenset(n for per_node in g.memory.values() for n in per_node))
            for g in node.state.grants.values() if g.memory
        ]
        mem = build_memory_state(node.topology, node.settings.reserved_memory, assignments)
        names = sorted(mem.resources() - {MEMORY}, key=hugepage_size_kb)
        return {
            n: [zone_entry(res, t.total, t.allocatable, t.free, format_bytes)
                for res in (MEMORY, *names) for t in (mem.table(n, res),)]
            for n in node.topology.node_ids
        }

    def describe(self, grant: Grant) -> list[str]:
        return [
            f"{res}={','.join(f'{n}:{format_bytes(size)}' for n, size in sorted(per.items()))}"
            for res, per in sorted(grant.memory.items())
        ]


def _memory_state(need: Need) -> MemoryState:
    from numa_pin.topology.memory import build_memory_state

    return build_memory_state(need.topology, need.settings.reserved_memory, _assignments(need))


def _assignments(need: Need) -> Iterator[tuple[str, Mapping[str, Mapping[int, int]], frozenset[int]]]:
    for g in need.state.grants.values():
        if g.memory:
            nodes = frozenset(n for per_node in g.memory.values() for n in per_node)
            yield (g.container_id, g.memory, nodes)


__all__ = ["MemoryResource"]

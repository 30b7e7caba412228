"""kubelet's Memory Manager view of a machine (``NUMANodeMap``). Pure data, no I/O.

Resources are ``"memory"`` and one ``"hugepages-<size>"`` per page size, named as kubelet names
them (``"hugepages-2Mi"``, ``"hugepages-1Gi"``); amounts are bytes. Each resource has its own
per-node :class:`MemoryTable` (``cpu-memory-device.md`` §7). :func:`build_memory_state` turns the
discovered :class:`~numa_pin.topology.model.Topology`, the configured reserved memory and the
recorded assignments into a :class:`MemoryState`; the memory hint provider
(:mod:`numa_pin.providers.memory`) and allocator (:mod:`numa_pin.allocators.memory`) read it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from numa_pin.base.record import field, record
from numa_pin.errors import ConfigError, LedgerError, RequestError
from numa_pin.topology.model import Topology

MEMORY = "memory"


HUGEPAGES_PREFIX = "hugepages-"


_SUFFIXES = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


_HUGEPAGES_NAME = re.compile(r"hugepages-([1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei)")


#: one recorded assignment: (container key, {resource: {node: bytes}}, the NUMA group)
Assignment = tuple[str, Mapping[str, Mapping[int, int]], frozenset[int]]


def hugepages_resource(size_kb: int) -> str:
    """kubelet's resource name for a page size in KiB: 2048 -> ``"hugepages-2Mi"``.

    Raises:
        RequestError: ``size_kb`` is not a positive integer.
    """
    if isinstance(size_kb, bool) or not isinstance(size_kb, int) or size_kb <= 0:
        raise RequestError(f"hugepage size must be a positive number of KiB, got {size_kb!r}")
    size = size_kb << 10
    suffix, shift = next((s, k) for s, k in _SUFFIXES if size % (1 << k) == 0)  # "Ki" always divides
    return f"{HUGEPAGES_PREFIX}{size >> shift}{suffix}"


def hugepage_size_kb(resource: str) -> int:
    """The page size in KiB of a hugepages resource: ``"hugepages-1Gi"`` -> 1048576.

    Raises:
        RequestError: ``resource`` is not a canonical kubelet hugepages name
            (``"hugepages-2048Ki"`` is refused: kubelet calls it ``"hugepages-2Mi"``).
    """
    match = _HUGEPAGES_NAME.fullmatch(resource) if isinstance(resource, str) else None
    if match is None:
        raise RequestError(f"{resource!r} is not a hugepages resource (e.g. hugepages-2Mi, hugepages-1Gi)")
    shift = dict(_SUFFIXES)[match.group(2)]
    size_kb = (int(match.group(1)) << shift) >> 10
    canonical = hugepages_resource(size_kb)
    if canonical != resource:
        raise RequestError(f"{resource!r} is not kubelet's name for this page size; use {canonical!r}")
    return size_kb


def check_resource(resource: object) -> str:
    """Return ``resource`` if it is ``"memory"`` or a canonical hugepages name.

    Raises:
        RequestError: anything else.
    """
    if resource == MEMORY:
        return MEMORY
    if not isinstance(resource, str) or not resource.startswith(HUGEPAGES_PREFIX):
        raise RequestError(f"{resource!r} is not a memory resource (memory, hugepages-<size>)")
    hugepage_size_kb(resource)
    return resource


def check_amount(value: object, what: str) -> int:
    """``value`` if it is a non-negative int of bytes; raises :class:`RequestError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{what}: amount must be a non-negative number of bytes, got {value!r}")
    return value


def check_request(request: Mapping[str, int]) -> dict[str, int]:
    """Validate ``{resource: bytes}``; returns a plain copy.

    Raises:
        RequestError: unknown resource name or a negative / non-integer amount.
    """
    return {check_resource(r): check_amount(v, r) for r, v in request.items()}


@record
class MemoryTable:
    """One resource on one node, in bytes (kubelet ``MemoryTable``).

    ``allocatable = total - system_reserved`` (for ``memory`` also minus all hugepage bytes);
    ``reserved`` is what assignments hold; ``free = max(0, allocatable - reserved)``.
    """

    total: int
    system_reserved: int
    allocatable: int
    free: int
    reserved: int


_EMPTY_TABLE = MemoryTable(0, 0, 0, 0, 0)


@record
class NodeMemory:
    """One node: its tables, its group (``cells``, kubelet ``Cells``) and assignment count."""

    id: int
    tables: Mapping[str, MemoryTable]
    cells: frozenset[int]
    assignments: int = 0

    def table(self, resource: str) -> MemoryTable:
        """The table of ``resource``; all zeros when the node does not have it."""
        return self.tables.get(resource, _EMPTY_TABLE)


@record
class MemoryState:
    """Every node's memory state (kubelet ``NUMANodeMap``). Build it with :func:`build_memory_state`."""

    nodes: Mapping[int, NodeMemory]
    node_ids: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(sorted(self.nodes.items()))))
        object.__setattr__(self, "node_ids", tuple(self.nodes))

    def table(self, node: int, resource: str) -> MemoryTable:
        return self.nodes[node].table(resource)

    def free(self, node: int, resource: str) -> int:
        return self.nodes[node].table(resource).free

    def allocatable(self, node: int, resource: str) -> int:
        return self.nodes[node].table(resource).allocatable

    def resources(self) -> frozenset[str]:
        return frozenset(r for n in self.nodes.values() for r in n.tables)

    def groups(self) -> frozenset[frozenset[int]]:
        """The multi-node groups nodes are bound to."""
        return frozenset(n.cells for n in self.nodes.values() if len(n.cells) > 1)


@record
class MemoryBlock:
    """What a container holds of one resource (kubelet ``Block``): its full requested size."""

    resource: str
    size: int
    nodes: frozenset[int]


def build_memory_state(
    topology: Topology,
    reserved_memory: Mapping[int, Mapping[str, int]] | None = None,
    assignments: Iterable[Assignment] = (),
) -> MemoryState:
    """kubelet's machine state from discovery, reserved memory and recorded assignments.

    Per node: ``memory`` total is the node's MemTotal; each hugepage size present on any node
    gets a table on every node (``total = pages x size``). Allocatable subtracts the
    reserved amount (and, for ``memory``, every hugepage byte of the node). Each assignment
    adds its per-node bytes to ``reserved`` and, for every resource it names, one to the
    assignment count of every node of its group, whose ``cells`` become the group (kubelet's
    ``updateMachineState``; the last assignment naming a node sets its group). ``free`` is
    ``allocatable - reserved``, floored at 0 when a configuration change left a node
    over-committed.

    Raises:
        ConfigError: ``reserved_memory`` names a node or resource the machine lacks, has a bad
            amount, or reserves more than a node has.
        LedgerError: an assignment names an unknown node or resource, bytes outside its group,
            or a bad amount.
    """
    reserved_memory = reserved_memory or {}
    sizes = sorted({hp.size_kb for node in topology.nodes.values() for hp in node.hugepages})
    names = {size: hugepages_resource(size) for size in sizes}
    known = {MEMORY, *names.values()}
    reserved = _reserved_config(topology, reserved_memory, known)

    bases: dict[int, dict[str, tuple[int, int, int]]] = {}
    for node_id in topology.node_ids:
        node = topology.nodes[node_id]
        res = reserved.get(node_id, {})
        tables: dict[str, tuple[int, int, int]] = {}
        hugepage_bytes = 0
        for size in sizes:
            hp = node.hugepages_of(size)
            total = 0 if hp is None else hp.total * size * 1024
            hugepage_bytes += total
            tables[names[size]] = _base(total, res.get(names[size], 0), 0, node_id, names[size])
        mem_total = node.memory_total_kb * 1024
        tables[MEMORY] = _base(mem_total, res.get(MEMORY, 0), hugepage_bytes, node_id, MEMORY)
        bases[node_id] = tables

    held: dict[tuple[int, str], int] = Counter()
    counts: dict[int, int] = Counter()
    cells: dict[int, frozenset[int]] = {}
    for key, per_resource, group in assignments:
        group = frozenset(group)
        if not group or not group <= bases.keys():
            raise LedgerError(f"memory of {key}: group {sorted(group)} is not a set of this machine's NUMA nodes")
        for resource, per_node in per_resource.items():
            if resource not in known and any(per_node.values()):
                raise LedgerError(f"memory of {key}: the machine has no {resource}")
            for node_id, amount in per_node.items():
                if node_id not in group:
                    raise LedgerError(
                        f"memory of {key}: {resource} on node {node_id} lies outside its group {sorted(group)}"
                    )
                if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                    raise LedgerError(f"memory of {key}: {resource} on node {node_id}: bad amount {amount!r}")
                held[(node_id, resource)] += amount
            for node_id in group:
                counts[node_id] += 1
                cells[node_id] = group

    nodes: dict[int, NodeMemory] = {}
    for node_id, tables in bases.items():
        final = {}
        for resource, (total, sys_reserved, allocatable) in tables.items():
            taken = held.get((node_id, resource), 0)
            final[resource] = MemoryTable(total, sys_reserved, allocatable, max(0, allocatable - taken), taken)
        nodes[node_id] = NodeMemory(
            node_id, MappingProxyType(final), cells.get(node_id, frozenset({node_id})), counts.get(node_id, 0)
        )
    return MemoryState(nodes)


def _reserved_config(
    topology: Topology, reserved_memory: Mapping[int, Mapping[str, int]], known: set[str]
) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for node_id, per_resource in reserved_memory.items():
        key = f"reserved_memory.{node_id}"
        if node_id not in topology.nodes:
            raise ConfigError(f"the machine has no NUMA node {node_id!r}", key=key)
        for resource, amount in per_resource.items():
            if resource not in known:
                raise ConfigError(f"the machine has no {resource!r} (it has {', '.join(sorted(known))})", key=key)
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                raise ConfigError(f"{resource}: reserved amount must be a non-negative number of bytes", key=key)
            out.setdefault(node_id, {})[resource] = amount
    return out


def _base(total: int, sys_reserved: int, hugepages: int, node: int, resource: str) -> tuple[int, int, int]:
    allocatable = total - sys_reserved - hugepages
    if allocatable < 0:
        what = f"{sys_reserved} bytes reserved" + (f" + {hugepages} bytes of hugepages" if hugepages else "")
        raise ConfigError(f"{resource}: {what} exceed the node's {total} bytes", key=f"reserved_memory.{node}")
    return total, sys_reserved, allocatable


__all__ = [
    "HUGEPAGES_PREFIX",
    "MEMORY",
    "Assignment",
    "MemoryBlock",
    "MemoryState",
    "MemoryTable",
    "NodeMemory",
    "build_memory_state",
    "check_amount",
    "check_request",
    "check_resource",
    "hugepage_size_kb",
    "hugepages_resource",
]

"""Small helpers for the memory tests: hand-built machines and readable hint lists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numa_pin.policy.hint import CapacityFamily, TopologyHint
from numa_pin.topology.memory import MemoryState, MemoryTable, NodeMemory
from numa_pin.topology.model import Cpu, HugePages, NumaNode, Topology

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
GIB_KB = 1 << 20


def machine(mem_gib: Sequence[float], hugepages: Mapping[int, Sequence[int]] | None = None) -> Topology:
    """One node per entry of ``mem_gib`` (MemTotal in GiB); ``hugepages``: ``{size_kb: pages per node}``."""
    count = len(mem_gib)
    nodes = {}
    for i, gib in enumerate(mem_gib):
        pages = tuple(HugePages(size, per_node[i], per_node[i]) for size, per_node in (hugepages or {}).items())
        nodes[i] = NumaNode(
            id=i,
            cpus=frozenset({i}),
            memory_total_kb=int(gib * GIB_KB),
            memory_free_kb=int(gib * GIB_KB),
            distances=tuple(10 if j == i else 20 for j in range(count)),
            hugepages=pages,
        )
    cpus = {i: Cpu(id=i, socket=0, die=0, core=i, numa=i, siblings=frozenset({i})) for i in range(count)}
    return Topology(nodes=nodes, cpus=cpus)


def assign(key: str, group: Sequence[int], **per_resource: Mapping[int, int]) -> tuple:
    """An assignment; keyword ``hugepages_1Gi`` stands for ``hugepages-1Gi``."""
    return (key, {r.replace("_", "-"): dict(p) for r, p in per_resource.items()}, frozenset(group))


def hand_state(nodes: Mapping[int, tuple[int, int, int, frozenset[int] | None]]) -> MemoryState:
    """A state built like kubelet's unit tests do: ``{node: (allocatable, free, assignments, cells)}``
    of ``memory`` only (bytes); ``cells`` ``None`` means the node alone."""
    out = {}
    for n, (alloc, free, count, cells) in nodes.items():
        table = MemoryTable(alloc, 0, alloc, free, alloc - free)
        out[n] = NodeMemory(n, {"memory": table}, cells or frozenset({n}), count)
    return MemoryState(out)


def pairs(hints: Sequence[TopologyHint] | CapacityFamily) -> list[tuple[tuple[int, ...], bool]]:
    if isinstance(hints, CapacityFamily):
        hints = hints.materialize()
    return [(tuple(sorted(h.affinity)), h.preferred) for h in hints]


def readable(answer: Mapping[str, Sequence[TopologyHint] | CapacityFamily] | None):
    if answer is None:
        return None
    return {r: pairs(h) for r, h in answer.items()}

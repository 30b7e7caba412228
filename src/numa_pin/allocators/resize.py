"""Grow or shrink one exclusive grant in place (pure): ``numa-pin resize`` and adopted runtime updates.

The rules are KEP-5554's (in-place resize of containers with exclusive CPUs):

* the CPUs a grant was admitted with (its *baseline*, :attr:`~numa_pin.ledger.model.Grant.baseline_cpus`
  once a resize happened) are never taken away: a shrink below them is refused, and a shrink
  gives back only CPUs that earlier grows added, those on nodes outside the baseline's first,
  then whole cores, then the highest numbers;
* a grow keeps every CPU the grant has and adds free ones (not reserved, not held by another
  grant, inside the container's own cpuset) on the grant's NUMA affinity (the nodes its
  decision aligned it to), completing cores it already holds first, then as kubelet's static
  policy takes CPUs (:func:`~numa_pin.allocators.cpu.allocate_cpus`); too few there is a
  refusal, never CPUs from another node;
* memory (``--memory``) stays on the grant's memory nodes: a grow takes free memory there
  (kubelet's memory manager tables), node by node; a shrink gives back from the last node.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.allocators.cpu import allocate_cpus
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.cpuset import format_list
from numa_pin.errors import AllocationError, RequestError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.topology.cpus import CpuTopology
from numa_pin.topology.model import Topology

MEMORY = "memory"


def affinity_nodes(grant: Grant, topology: Topology) -> frozenset[int]:
    """The NUMA nodes a grant may grow on: its decision's affinity, else the nodes of its CPUs."""
    if grant.affinity:
        return grant.affinity
    return frozenset(n for c in grant.cpus if c in topology.cpus and (n := topology.cpus[c].numa) is not None)


def resized_cpus(topology: Topology, options: CpuOptions, state: LedgerState, grant: Grant, count: int,
                 reserved: frozenset[int]) -> frozenset[int]:
    """The grant's CPUs after a resize to ``count`` (see the module doc).

    Raises:
        RequestError: ``count`` is not positive, or below the baseline.
        AllocationError: not enough free CPUs on the grant's affinity.
    """
    cid = grant.container_id
    if not grant.cpus:
        raise RequestError(f"{cid} holds no exclusive CPUs; only an exclusive grant can be resized",
                           annotation="--cpus")
    if count < 1:
        raise RequestError(f"an exclusive grant keeps at least one CPU, got {count}", annotation="--cpus")
    baseline = grant.baseline_cpus if grant.baseline_cpus is not None else grant.cpus
    if count < len(baseline):
        raise RequestError(
            f"{cid} was admitted with CPUs {format_list(baseline)}; a resize keeps them (KEP-5554), so it "
            f"cannot go below {len(baseline)}", annotation="--cpus")
    have = len(grant.cpus)
    if count == have:
        return grant.cpus
    if count < have:
        return grant.cpus - _to_give_back(topology, grant.cpus - baseline, baseline, have - count)
    return grant.cpus | _to_add(topology, options, state, grant, count - have, reserved)


def _to_give_back(topology: Topology, extra: frozenset[int], baseline: frozenset[int], n: int) -> frozenset[int]:
    home = {topology.cpus[c].numa for c in baseline}
    per_core: dict[tuple[int, int, int], int] = {}
    for c in extra:
        per_core[topology.cpus[c].core_key] = per_core.get(topology.cpus[c].core_key, 0) + 1

    def order(c: int) -> tuple[bool, int, int]:
        cpu = topology.cpus[c]
        whole = per_core[cpu.core_key] == len(cpu.siblings)  # a core all of whose threads were added
        return (cpu.numa in home, -int(whole), -c)

    return frozenset(sorted(extra, key=order)[:n])


def _to_add(topology: Topology, options: CpuOptions, state: LedgerState, grant: Grant, n: int,
            reserved: frozenset[int]) -> frozenset[int]:
    nodes = affinity_nodes(grant, topology)
    others = frozenset().union(*(g.cpus for g in state.grants.values() if g.container_id != grant.container_id))
    free = frozenset(c for c in topology.cpu_ids - reserved - others - grant.cpus if topology.cpus[c].numa in nodes)
    if grant.cpuset_limit is not None:
        free &= grant.cpuset_limit
    if len(free) < n:
        raise AllocationError(
            f"{grant.container_id}: {n} more CPUs asked, {len(free)} free on its NUMA node(s) "
            f"{format_list(nodes)} ({format_list(free) or 'none'})")
    siblings = sorted(c for c in free if topology.cpus[c].siblings & grant.cpus)  # complete held cores first
    first = frozenset(siblings[:n])
    if len(first) == n:
        return first
    return first | allocate_cpus(CpuTopology.from_topology(topology), options, free - first, (), n - len(first),
                                 nodes)


def check_adoptable(topology: Topology, state: LedgerState, grant: Grant, seen: frozenset[int],
                    reserved: frozenset[int]) -> None:
    """Refuse CPUs a runtime gave a container (``runc update --cpuset-cpus``) that a resize
    could not have given it: losing a CPU it was admitted with, or gaining one that is not
    free (reserved, another grant's), outside its NUMA affinity or outside its own cpuset.

    Raises:
        AllocationError: naming the first rule broken.
    """
    cid, shown = grant.container_id, format_list(seen)
    baseline = grant.baseline_cpus if grant.baseline_cpus is not None else grant.cpus
    if not grant.cpus:
        raise AllocationError(f"{cid}: cpus {shown}: it holds no exclusive CPUs to resize")
    if not baseline <= seen:
        raise AllocationError(f"{cid}: cpus {shown} drop CPUs {format_list(baseline - seen)} it was admitted with")
    added = seen - grant.cpus
    others = frozenset().union(*(g.cpus for g in state.grants.values() if g.container_id != cid))
    rules = (
        (added - topology.cpu_ids, "are not online"),
        (added & reserved, "are reserved for the system"),
        (added & others, "belong to another grant"),
        (frozenset(c for c in added & topology.cpu_ids if topology.cpus[c].numa not in affinity_nodes(grant, topology)),
         "are outside its NUMA affinity"),
        (added - grant.cpuset_limit if grant.cpuset_limit is not None else frozenset(), "are outside its own cpuset"),
    )
    for broken, why in rules:
        if broken:
            raise AllocationError(f"{cid}: cpus {shown}: CPUs {format_list(broken)} {why}")


def resized_memory(grant: Grant, total: int, free: Mapping[int, int]) -> dict[int, int]:
    """The grant's ``memory`` per node after a resize to ``total`` bytes; ``free`` is what each of
    its nodes has free for it (other grants and the system's reservation counted).

    Raises:
        RequestError: ``total`` is not positive, or the grant has no memory nodes.
        AllocationError: the grant's nodes do not have the memory free.
    """
    cid = grant.container_id
    if total < 1:
        raise RequestError(f"memory must be positive, got {total}", annotation="--memory")
    current = dict(grant.memory.get(MEMORY, {}))
    nodes = sorted(current) or sorted(grant.mems)
    if not nodes:
        raise RequestError(f"{cid} has no memory nodes to resize on", annotation="--memory")
    have = sum(current.values())
    out = {n: current.get(n, 0) for n in nodes}
    if total < have:
        left = have - total
        for n in reversed(nodes):
            take = min(left, out[n])
            out[n] -= take
            left -= take
        return {n: v for n, v in out.items() if v}
    left = total - have
    for n in nodes:
        add = min(left, max(0, free.get(n, 0)))
        out[n] += add
        left -= add
    if left:
        raise AllocationError(f"{cid}: {left} more bytes of memory than its NUMA node(s) "
                              f"{format_list(nodes)} have free")
    return {n: v for n, v in out.items() if v}


__all__ = ["affinity_nodes", "check_adoptable", "resized_cpus", "resized_memory"]

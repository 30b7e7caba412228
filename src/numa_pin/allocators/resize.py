"""Grow or shrink one exclusive grant in place (pure): ``numa-pin resize`` and adopted runtime updates.

The rules are KEP-5554's (in-place resize of containers with exclusive CPUs):

* the CPUs a grant was admitted with (its *baseline*, :attr:`~numa_pin.ledger.model.Grant.baseline_cpus`
  once a resize happened) are never taken away: a shrink below them is refused, and a shrink
  gives back only CPUs that earlier grows added, those on nodes outside the baseline's first,
  then whole cores, then the highest numbers;
* a grow keeps every CPU the grant has and adds free ones (not reserved, not held by another
  grant, inside the container's own cpuset) on the grant's NUMA affinity (the nodes its
  decision aligned it to), completing cores it already holds first, then as kubelet's static
  policy takes CPUs (:func:`~numa_pin.allocators.cpu.allocate_cpus`);
* when the affinity has too few, the KEP lets the affinity expand, keeping every node it has,
  as far as the Topology Manager policy allows: under ``best-effort`` (and ``none``) the grow
  takes all the affinity still has free, then the rest on the fewest added nodes that hold it
  (nearest by SLIT to the affinity, then lowest ids); under ``restricted`` and
  ``single-numa-node`` it is a refusal, never CPUs from another node;
* memory (``--memory``) stays on the grant's memory nodes: a grow takes free memory there
  (kubelet's memory manager tables), node by node; a shrink gives back from the last node.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

from numa_pin.allocators.cpu import allocate_cpus
from numa_pin.base import names
from numa_pin.base.cpuset import format_list
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.errors import AllocationError, RequestError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.topology.cpus import CpuTopology
from numa_pin.topology.model import Topology

MEMORY = "memory"
#: the policies under which a resize may expand a grant's NUMA affinity (KEP-5554: "respecting
#: the constraints of the topology manager policy in use"; these two have none to respect)
EXPANDING_POLICIES = frozenset({names.BEST_EFFORT, names.NONE})


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
    spare = _spare(topology, state, grant, reserved)
    free = frozenset(c for c in spare if topology.cpus[c].numa in nodes)
    if len(free) >= n:
        return _take(topology, options, grant, free, nodes, n)
    if grant.policy not in EXPANDING_POLICIES:
        raise AllocationError(
            f"{grant.container_id}: {n} more CPUs asked, {len(free)} free on its NUMA node(s) "
            f"{format_list(nodes)} ({format_list(free) or 'none'}), and policy {grant.policy} "
            "keeps a resize on them")
    added = _added_nodes(topology, nodes, spare, n - len(free))
    if added is None:
        raise AllocationError(
            f"{grant.container_id}: {n} more CPUs asked, {len(spare)} free on the whole node "
            f"({format_list(spare) or 'none'})")
    more = frozenset(c for c in spare if topology.cpus[c].numa in added)
    return free | allocate_cpus(CpuTopology.from_topology(topology), options, more, (), n - len(free), added)


def _spare(topology: Topology, state: LedgerState, grant: Grant, reserved: frozenset[int]) -> frozenset[int]:
    """The CPUs a grow of ``grant`` may take on any node: online, not reserved, not held by
    another grant, inside the container's own cpuset."""
    others = frozenset().union(*(g.cpus for g in state.grants.values() if g.container_id != grant.container_id))
    spare = topology.cpu_ids - reserved - others - grant.cpus
    return spare & grant.cpuset_limit if grant.cpuset_limit is not None else spare


def _take(topology: Topology, options: CpuOptions, grant: Grant, free: frozenset[int], nodes: frozenset[int],
          n: int) -> frozenset[int]:
    siblings = sorted(c for c in free if topology.cpus[c].siblings & grant.cpus)  # complete held cores first
    first = frozenset(siblings[:n])
    if len(first) == n:
        return first
    return first | allocate_cpus(CpuTopology.from_topology(topology), options, free - first, (), n - len(first),
                                 nodes)


def _added_nodes(topology: Topology, nodes: frozenset[int], spare: frozenset[int],
                 n: int) -> frozenset[int] | None:
    """The fewest nodes outside ``nodes`` whose ``spare`` CPUs number ``n`` or more, the nearest
    to ``nodes`` by SLIT (sum of distances) among those, then the lowest ids; None when even
    every other node together has too few."""
    per_node: dict[int, int] = {}
    for c in spare:
        numa = topology.cpus[c].numa
        if numa is not None and numa not in nodes:
            per_node[numa] = per_node.get(numa, 0) + 1
    outside = sorted(per_node)
    for k in range(1, len(outside) + 1):
        fits = sorted((_distance(topology, nodes, combo), combo) for combo in combinations(outside, k)
                      if sum(per_node[m] for m in combo) >= n)
        if fits:
            return frozenset(fits[0][1])
    return None


def _distance(topology: Topology, nodes: frozenset[int], added: tuple[int, ...]) -> int:
    return sum(topology.distance(a, b) for a in nodes for b in added)


def check_adoptable(topology: Topology, state: LedgerState, grant: Grant, seen: frozenset[int],
                    reserved: frozenset[int]) -> None:
    """Refuse CPUs a runtime gave a container (``runc update --cpuset-cpus``) that a resize
    could not have given it: losing a CPU it was admitted with, or gaining one that is not
    free (reserved, another grant's), outside its own cpuset, or outside its NUMA affinity
    (under ``best-effort`` and ``none``, only while the affinity could still hold them all).

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
    nodes = affinity_nodes(grant, topology)
    outside = frozenset(c for c in added & topology.cpu_ids if topology.cpus[c].numa not in nodes)
    if outside and grant.policy in EXPANDING_POLICIES:
        spare = _spare(topology, state, grant, reserved)
        room = len(grant.cpus) + sum(1 for c in spare if topology.cpus[c].numa in nodes)
        if len(seen) > room:  # the affinity could not hold it: the KEP lets it expand
            outside = frozenset()
    rules = (
        (added - topology.cpu_ids, "are not online"),
        (added & reserved, "are reserved for the system"),
        (added & others, "belong to another grant"),
        (outside, "are outside its NUMA affinity"),
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

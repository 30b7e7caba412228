"""Is a decision made on a snapshot of the ledger still good on the ledger as it is now? (pure)

An admission decides outside the ledger lock, on a snapshot, so a slow decision never blocks
the node. Under the lock, :func:`revalidate` then checks that decision against the ledger as it
is at commit time, instead of demanding that the ledger be unchanged: other containers admitted
or released in the meantime are no reason to refuse this one. It keeps the decision when
everything it takes is still free, re-picks only its CPUs (inside the same merged hint) when
another admission took some of them, and asks for a new decision only when something the
decision depended on really changed. The argument for why no interleaving loses an admission
or grants anything twice is in ``docs/design/admission-concurrency.md``.

Checked against ``state`` (the ledger under the lock, dead grants dropped) and ``snapshot``
(the state the decision saw, dead grants dropped):

* the ``numa-pin.io/pod`` a request claims is still nobody's (else: decide again, which refuses);
* pod scope: the pod's record is the one the decision saw (another container of the pod that
  committed first fixes the pod's affinity; the decision must be made inside it);
* memory: no other grant's memory assignment is new or changed (memory groups make a cheap
  check unsound, so any new assignment means deciding again; released ones only free memory);
* devices: none of the decision's devices became in use (held, or parked in a pod's netns);
* CPUs: none of the decision's CPUs is held now; if some are, the same number is picked again
  among the free CPUs with the decision's hint, exactly as the decision's allocation step does
  (inside the hint's NUMA nodes for restricted and single-numa-node; a one-node request with
  nothing else tying it to its node moves to another node where it fits). The policy merge, the
  expensive part of a decision, is not repeated;
* the shared pool, recomputed: no shared container with a cpuset of its own is left without a
  CPU, and a shared request with its own cpuset still meets the pool.
"""

from __future__ import annotations

from numa_pin.admission.decide import STRICT_POLICIES, Decision, NodeSettings
from numa_pin.allocators.cpu import allocate_cpus, reserved_cpus
from numa_pin.base import names
from numa_pin.base.record import replace
from numa_pin.errors import AllocationError
from numa_pin.policy import bitmask
from numa_pin.policy.hint import TopologyHint

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numa_pin.ledger.model import LedgerState
    from numa_pin.requests.request import ContainerRequest
    from numa_pin.topology.cpus import CpuTopology
    from numa_pin.topology.model import Topology


def revalidate(
    decision: Decision,
    request: ContainerRequest,
    snapshot: LedgerState,
    state: LedgerState,
    *,
    topology: Topology,
    settings: NodeSettings,
    memo: Callable[[str, Callable[[], Any]], Any],
) -> Decision | None:
    """``decision`` (an admission, made on ``snapshot``) as it may be committed on ``state``:
    itself, the same with its CPUs picked again, or None when it must be decided again.

    ``request.container_id`` has no grant in ``state`` (the caller re-applies an existing
    grant instead). ``memo(key, make)`` keeps what is computed once per node (kubelet's CPU
    view of ``topology``, the reserved CPUs), as the node's resources do.
    """
    cid = request.container_id
    claimed = request.claimed_pod
    if claimed is not None and (claimed in state.pods or any(g.pod_id == claimed for g in state.grants.values())):
        return None
    if decision.scope == names.POD_SCOPE and state.pods.get(request.pod_id) != snapshot.pods.get(request.pod_id):
        return None
    if decision.memory and not _memory_unchanged(snapshot, state, cid):
        return None
    for resource, ids in decision.devices.items():
        taken = state.devices_in_use(resource) - snapshot.devices_in_use(resource)
        if taken.intersection(ids):
            return None
    held = state.exclusive_cpus()
    cpus = decision.cpus
    if cpus & held:
        from numa_pin.topology.cpus import CpuTopology

        cpu_topology: CpuTopology = memo("cpu.topology", lambda: CpuTopology.from_topology(topology))
        reserved: frozenset[int] = memo("cpu.reserved", lambda: reserved_cpus(
            cpu_topology, settings.cpu_options, settings.reserved_cpus, settings.num_reserved_cpus))
        repicked = _repick(decision, request, held, topology, cpu_topology, settings, reserved)
        if repicked is None:
            return None
        decision = repicked
        cpus = repicked.cpus
    pool = topology.cpu_ids - held - cpus
    if not cpus and request.cpuset is not None and not pool & request.cpuset:
        return None
    if cpus and any(g.cpuset_limit and not pool & g.cpuset_limit for g in state.limited_shared()):
        return None
    return decision


def _memory_unchanged(snapshot: LedgerState, state: LedgerState, cid: str) -> bool:
    """Every other grant's memory assignment in ``state`` was in ``snapshot`` as it is."""
    for other, grant in state.grants.items():
        if grant.memory and other != cid:
            before = snapshot.grants.get(other)
            if before is None or before.memory != grant.memory:
                return False
    return True


def _repick(
    decision: Decision, request: ContainerRequest, held: frozenset[int], topology: Topology,
    cpu_topology: CpuTopology, settings: NodeSettings, reserved: frozenset[int],
) -> Decision | None:
    """``decision`` with as many CPUs as it holds picked again among the CPUs free now, with its
    hint, as :func:`numa_pin.admission.decide.decide` allocates them; None when they do not fit.

    A strict decision whose single NUMA node is full now moves to the lowest-numbered other node
    where its CPUs fit, when nothing else ties it to its node (no devices, no memory, no pod
    record it must live in): every single node is a preferred hint of the same width for such a
    request (kubelet's CPU hints prefer the narrowest width that could hold it), so the policy
    would admit it there too. Without this, a burst of one-node requests would all pick the same
    first node, and all but one decide again, round after round."""
    count = len(decision.cpus)
    free = topology.cpu_ids - reserved - held
    if request.cpuset is not None:
        free &= request.cpuset
    affinity = decision.hint.affinity if decision.policy != names.NONE else None
    if decision.policy not in STRICT_POLICIES or affinity is None:
        cpus = _allocate(cpu_topology, settings, free, count, affinity)
        return None if cpus is None else replace(decision, cpus=cpus)
    inside = free & cpu_topology.cpus_in_numa_nodes(*sorted(affinity))
    if len(inside) >= count:
        cpus = _allocate(cpu_topology, settings, inside, count, affinity)
        return None if cpus is None else replace(decision, cpus=cpus)
    movable = (len(affinity) == 1 and decision.hint.preferred and not decision.devices and not decision.memory
               and (decision.scope != names.POD_SCOPE or decision.pod_affinity is not None))
    if not movable:
        return None
    for node in sorted(topology.node_ids):
        inside = free & cpu_topology.cpus_in_numa_nodes(node)
        if len(inside) >= count:
            cpus = _allocate(cpu_topology, settings, inside, count, frozenset((node,)))
            if cpus is not None:
                return _moved(decision, topology, node, cpus)
    return None


def _allocate(cpu_topology: CpuTopology, settings: NodeSettings, free: frozenset[int], count: int,
              affinity: frozenset[int] | None) -> frozenset[int] | None:
    try:
        return allocate_cpus(cpu_topology, settings.cpu_options, free, frozenset(), count, affinity)
    except AllocationError:
        return None


def _moved(decision: Decision, topology: Topology, node: int, cpus: frozenset[int]) -> Decision:
    """``decision`` moved to NUMA node ``node``: its hint, CPUs, memory nodes (as the decision
    derives them from a hint), the pod affinity it records, and its reason."""
    affinity = frozenset((node,))
    mem_nodes = frozenset(n for n, info in topology.nodes.items() if info.memory_total_kb > 0)
    mems = affinity & mem_nodes or mem_nodes or frozenset(topology.node_ids)
    hint = TopologyHint(affinity, True)
    return replace(
        decision, hint=hint, cpus=cpus, mems=mems,
        pod_affinity=affinity if decision.pod_affinity is not None else None,
        reason=f"{decision.policy}/{decision.scope}: affinity {bitmask.format_mask(hint.mask)}",
    )


__all__ = ["revalidate"]

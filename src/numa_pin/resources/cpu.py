"""Exclusive CPUs and the shared pool: the pure half of the CPU resource.

kubelet's CPU Manager on one node: hints from :mod:`numa_pin.providers.cpu`, allocation by
:mod:`numa_pin.allocators.cpu`; reserved CPUs are never granted. A container's own cpuset
(``request.cpuset``) bounds what it may take, and no exclusive grant may leave a shared
container with a cpuset of its own without a CPU of the shared pool.

Mixed CPUs (``numa-pin.io/cpu-shared``, CRI-O's ``cpu-shared.crio.io/<container>``): a container
with exclusive CPUs runs on the shared pool too. Its exclusive CPUs stay its own in the ledger;
its cpuset is them and the pool (inside its own cpuset, if it has one), following the pool as a
shared container's does, and the lists are exported to it as CRI-O exports them
(:data:`MIXED_ENV`).
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.allocators.cpu import allocate_cpus, reserved_cpus
from numa_pin.base.cpuset import format_list
from numa_pin.base.record import record
from numa_pin.errors import AdmissionError, AllocationError, TopologyAffinityError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.policy.hint import ProviderHints
from numa_pin.providers.cpu import cpu_hint_family
from numa_pin.requests.limits import CPUSET_FIELD
from numa_pin.requests.request import Amounts, ContainerRequest
from numa_pin.resources.base import Decision, Need, NodeSettings, NodeView, Resource, zone_entry
from numa_pin.topology.cpus import CpuTopology
from numa_pin.topology.model import Topology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from numa_pin.resources.runtime import RuntimeTarget

#: where :func:`_cpu_facts` keeps what it worked out, on the topology
_CPU_FACTS = "_cpu_facts"
#: the variables a mixed container gets: (exclusive list, shared pool list), CRI-O's names
#: (``OPENSHIFT_*``, so workloads written for CRI-O's high-performance runtime class work) and numa-pin's
MIXED_ENV = (("OPENSHIFT_ISOLATED_CPUS", "OPENSHIFT_SHARED_CPUS"), ("NUMA_PIN_EXCLUSIVE_CPUS", "NUMA_PIN_SHARED_CPUS"))


def mixed(grant: Grant) -> bool:
    """The grant holds exclusive CPUs and asked for the shared pool beside them (``cpu-shared``)."""
    return bool(grant.cpus) and grant.isolation.get("shared") is True


def cpuset_of(grant: Grant, pool: frozenset[int]) -> frozenset[int]:
    """The cpuset of a container with exclusive CPUs: those, with the shared pool (inside its own
    cpuset, if it has one) when it is :func:`mixed`."""
    if not mixed(grant):
        return grant.cpus
    return grant.cpus | (pool & grant.cpuset_limit if grant.cpuset_limit else pool)


def mixed_env(grant: Grant, pool: frozenset[int]) -> dict[str, str]:
    """What a mixed container is told: its exclusive CPUs and the shared CPUs of its cpuset."""
    shared = format_list(cpuset_of(grant, pool) - grant.cpus)
    return {name: value for names in MIXED_ENV for name, value in zip(names, (format_list(grant.cpus), shared))}


@record
class CpuView:
    need: Need
    cpu_topology: CpuTopology
    reserved: frozenset[int]
    free: frozenset[int]  # free for exclusive use (inside the container's own cpuset, if any)


def _cpu_facts(topology: Topology, s: NodeSettings) -> tuple[CpuTopology, frozenset[int]]:
    """kubelet's CPU view of ``topology`` and the reserved CPUs, worked out once per topology and
    CPU settings and kept on the topology (as :class:`~numa_pin.ledger.model.LedgerState` keeps
    what it derives): a node's NRI Synchronize decides for thousands of containers in a row."""
    key = (s.cpu_options, s.reserved_cpus, s.num_reserved_cpus)
    known = topology.__dict__.get(_CPU_FACTS)
    if known is not None and known[0] == key:
        return known[1], known[2]
    cpu_topo = CpuTopology.from_topology(topology)
    reserved = reserved_cpus(cpu_topo, s.cpu_options, s.reserved_cpus, s.num_reserved_cpus)
    object.__setattr__(topology, _CPU_FACTS, (key, cpu_topo, reserved))
    return cpu_topo, reserved


class CpuResource(Resource):
    """Exclusive CPUs (``numa-pin.io/cpus``) and the shared pool."""

    name = "cpu"

    def view(self, need: Need) -> CpuView:
        s = need.settings
        cpu_topo, reserved = _cpu_facts(need.topology, s)
        s.cpu_options.validate(cpu_topo, need.policy)
        free = need.topology.cpu_ids - reserved - need.state.exclusive_cpus()
        if need.request.cpuset is not None:  # the user's own cpuset: allocate inside it or not at all
            free = free & need.request.cpuset
        if s.isolated_mode != "prefer" and s.isolated_cpus:  # isolcpus/nohz_full: require or avoid them
            free = free & s.isolated_cpus if s.isolated_mode == "require" else free - s.isolated_cpus
        return CpuView(need, cpu_topo, reserved, frozenset(free))

    def wants(self, view: CpuView) -> bool:
        return view.need.request.amounts.cpus > 0

    def hints(self, view: CpuView, amounts: Amounts) -> ProviderHints:
        if not amounts.cpus:
            return None
        return {"cpu": cpu_hint_family(view.cpu_topology, view.free, amounts.cpus)}

    def allocate(self, view: CpuView, amounts: Amounts, affinity: frozenset[int] | None,
                 strict: bool) -> Mapping[str, object]:
        if not amounts.cpus:
            return {}
        free = view.free
        if strict and affinity is not None:
            free = free & view.cpu_topology.cpus_in_numa_nodes(*sorted(affinity))
            if len(free) < amounts.cpus:
                raise TopologyAffinityError(f"only {len(free)} of the {amounts.cpus} CPUs requested are free there")
        options, preferred = view.need.settings.cpu_options, free & view.need.settings.isolated_cpus
        if affinity is not None:  # the kernel's isolated CPUs first (isolation.isolated_cpus: prefer)
            preferred &= view.cpu_topology.cpus_in_numa_nodes(*sorted(affinity))
        if len(preferred) >= amounts.cpus:
            try:
                return {"cpus": allocate_cpus(view.cpu_topology, options, preferred, frozenset(), amounts.cpus,
                                              affinity)}
            except AllocationError:
                pass  # not in whole cores, say: any free CPUs then
        cpus = allocate_cpus(view.cpu_topology, options, free, frozenset(), amounts.cpus, affinity)
        return {"cpus": cpus}

    def vet(self, view: CpuView, decision: Decision, empty: bool) -> tuple[type[AdmissionError], str] | None:
        need = view.need
        own = need.request.cpuset
        if empty and own is not None:
            pool = pool_after(need.topology, need.state, frozenset())
            if not pool & own:
                return AllocationError, (
                    f"the container's cpuset {format_list(own)} ({CPUSET_FIELD}) holds no CPU of "
                    f"the shared pool ({format_list(pool)}); numa-pin never moves a cpuset the user set"
                )
        starved = _starved_shared(need.topology, need.state, decision.cpus)
        return (AllocationError, starved) if starved else None

    def free_summary(self, view: CpuView, amounts: Amounts) -> list[str]:
        if not amounts.cpus:
            return []
        topology = view.need.topology
        per = " ".join(f"{n}={len(view.free & topology.nodes[n].cpus)}" for n in topology.node_ids)
        return [f"cpu {amounts.cpus} requested, free per node: {per}"]

    def bounds(self, view: CpuView) -> list[str]:
        own = view.need.request.cpuset
        return [] if own is None else [f"only inside the container's cpuset {format_list(own)} ({CPUSET_FIELD})"]

    def zones(self, node: NodeView) -> Mapping[int, list[dict[str, str]]]:
        """Online CPUs; minus the reserved ones; minus exclusively granted ones."""
        topology, exclusive = node.topology, node.state.exclusive_cpus()
        out = {}
        for n in topology.node_ids:
            cpus = topology.nodes[n].cpus & topology.cpu_ids
            allocatable = cpus - node.reserved
            out[n] = [zone_entry("cpu", len(cpus), len(allocatable), len(allocatable - exclusive))]
        return out

    def refusal(self, request: ContainerRequest, target: RuntimeTarget) -> str:
        """``numa-pin run`` binds a process to its grant's CPUs alone: it has no shared pool to add."""
        if request.isolation.shared and not target.mixed_cpus:
            return target.cannot("numa-pin.io/cpu-shared (exclusive CPUs and the shared pool)")
        return ""

    def describe(self, grant: Grant) -> list[str]:
        # a grant's CPUs and memory nodes are columns of their own in ``status``
        return ["cpu-shared=enable"] if mixed(grant) else []


def pool_after(topology: Topology, others: LedgerState, taking: frozenset[int]) -> frozenset[int]:
    """The shared pool once the container holds ``taking`` (``others``: the ledger without it)."""
    return topology.cpu_ids - others.exclusive_cpus() - taking


def _starved_shared(topology: Topology, others: LedgerState, taking: frozenset[int]) -> str:
    """Why taking ``taking`` would leave a shared container with a cpuset of its own without a
    CPU (its cpuset is the pool inside its own set), or ``""``."""
    if not taking:
        return ""
    pool = pool_after(topology, others, taking)
    for g in others.limited_shared():
        if g.cpuset_limit and not pool & g.cpuset_limit:
            return (
                f"exclusive cpus {format_list(taking)} would leave shared container {g.container_id} without a CPU "
                f"of its own cpuset {format_list(g.cpuset_limit)} ({CPUSET_FIELD})"
            )
    return ""


__all__ = ["MIXED_ENV", "CpuResource", "CpuView", "cpuset_of", "mixed", "mixed_env", "pool_after"]

"""The admission decision: request + machine + ledger state -> grant or rejection (pure).

This is kubelet's Topology Manager admit path on one node:

1. every hint provider (CPU, memory/hugepages, devices) answers for the request,
2. the policy merges the answers into one NUMA affinity and says admit or not,
3. if admitted, every allocator takes its resources inside that affinity.

Scopes: ``container`` merges each container alone. ``pod`` merges once per pod, at the pod's
first container with exclusive resources, and records the pod's affinity; every later container
of the pod is placed inside it, as kubelet stores one hint for all of a pod's containers.
numa-pin sees one container at a time, so the pod's total may be unknown or understated; the rule:

* the first merge asks, per resource, for the larger of the pod total (``numa-pin.io/pod-*``)
  and the container's own request, so a missing or understated total never lets a container
  through that the policy would refuse alone;
* under ``restricted`` and ``single-numa-node`` every container (first or later, either scope)
  takes its CPUs, memory and devices strictly inside the affinity, and a device a device plugin
  already chose must lie there too; a container that does not fit is rejected
  (``TopologyAffinityError``), never spilled to other nodes. ``none`` and ``best-effort`` keep
  kubelet's fallback to other nodes;
* a pod named by ``numa-pin.io/pod`` is ``user:<name>``; naming a pod that a runtime sandbox (or
  another container) owns is a :class:`~numa_pin.errors.RequestError`.

Nothing here touches the machine; :mod:`numa_pin.agent` does the I/O around it.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin import names
from numa_pin.admission.request import CPUSET_FIELD, Amounts, ContainerRequest
from numa_pin.allocators.cpu import allocate_cpus, reserved_cpus
from numa_pin.cpuset import format_list
from numa_pin.errors import (
    AdmissionError,
    AllocationError,
    RequestError,
    TopologyAffinityError,
)
from numa_pin.ledger.model import LedgerState
from numa_pin.policy import bitmask
from numa_pin.policy.hint import ProviderHints, ResourceHints, TopologyHint
from numa_pin.policy.options import check_machine
from numa_pin.policy.registry import merge_hints
from numa_pin.providers.cpu import CpuOptions, cpu_hint_family
from numa_pin.quantity import format_bytes
from numa_pin.record import field, record, replace
from numa_pin.text import quote
from numa_pin.topology.cpus import CpuTopology
from numa_pin.topology.model import KIND_GPU, Topology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:  # memory and device code is imported only when a request needs it
    from numa_pin.devices.inventory import DeviceResource
    from numa_pin.devices.model import DeviceInfo

NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_VENDOR = "0x10de"
#: policies that admit only aligned results: allocation never leaves their affinity
STRICT_POLICIES = (names.RESTRICTED, names.SINGLE_NUMA_NODE)


@record
class NodeSettings:
    """The node-wide part of the config that decisions depend on."""

    policy: str = names.DEFAULT_POLICY
    scope: str = names.DEFAULT_SCOPE
    policy_options: Mapping[str, str | bool | int] = field(default_factory=dict)
    cpu_options: CpuOptions = field(default_factory=CpuOptions)
    reserved_cpus: frozenset[int] | None = None
    num_reserved_cpus: int = 1
    reserved_memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    device_resources: tuple[DeviceResource, ...] = ()


@record
class Decision:
    """What one container gets, or why it gets nothing."""

    container_id: str
    admit: bool
    policy: str
    scope: str
    hint: TopologyHint
    cpus: frozenset[int] = frozenset()
    mems: frozenset[int] = frozenset()
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    memory: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    reason: str = ""
    #: the exception a rejection raises (kubelet's error kinds); its ``kind`` is printed
    error: type[AdmissionError] = TopologyAffinityError
    pod_affinity: frozenset[int] | None = None  # set when this decision created the pod's record

    @property
    def exclusive(self) -> bool:
        return bool(self.cpus)


@record
class _Machine:
    """Derived, per-decision view of the machine and what is free on it."""

    topology: Topology
    cpu_topology: CpuTopology
    reserved: frozenset[int]
    free_cpus: frozenset[int]
    devices: Mapping[str, tuple[DeviceInfo, ...]]
    free_devices: Mapping[str, frozenset[str]]


def _machine(
    topology: Topology,
    cpu_topo: CpuTopology,
    state: LedgerState,
    settings: NodeSettings,
    container_id: str,
    need_devices: bool,
) -> _Machine:
    reserved = reserved_cpus(cpu_topo, settings.cpu_options, settings.reserved_cpus, settings.num_reserved_cpus)
    others = state.without(container_id) if container_id in state.grants else state
    free = topology.cpu_ids - reserved - others.exclusive_cpus()
    if not need_devices:
        return _Machine(topology, cpu_topo, reserved, frozenset(free), {}, {})
    from numa_pin.devices.inventory import inventory
    from numa_pin.devices.model import DeviceInfo

    devs = dict(inventory(topology, settings.device_resources))
    if NVIDIA_GPU not in devs:
        gpus = tuple(
            DeviceInfo(d.address, () if d.numa_node is None else (d.numa_node,), True)
            for d in _nvidia_gpus(topology)
        )
        if gpus:
            devs[NVIDIA_GPU] = gpus
    free_devs = {
        res: frozenset(d.id for d in infos if d.healthy) - frozenset(others.devices_in_use(res))
        for res, infos in devs.items()
    }
    return _Machine(topology, cpu_topo, reserved, frozenset(free), devs, free_devs)


def _nvidia_gpus(topology: Topology):
    """The GPUs ``nvidia.com/gpu`` means when the config defines no such resource."""
    return (d for d in topology.pci_devices if d.kind == KIND_GPU and d.vendor == NVIDIA_VENDOR)


def resolve_fixed_devices(request: ContainerRequest, machine: _Machine) -> dict[str, tuple[str, ...]]:
    """Map device-plugin env (``NVIDIA_VISIBLE_DEVICES``, ``PCIDEVICE_*``) to resources and ids.

    GPU tokens are UUIDs (``GPU-...``) or NVML indexes; an index is the GPU's position in PCI
    address order, which is NVML's default enumeration. Never the device minor.
    """
    fixed: dict[str, list[str]] = {}
    if request.fixed_gpus:
        gpus = sorted(_nvidia_gpus(machine.topology), key=lambda d: d.address)
        by_uuid = {d.gpu_uuid: d.address for d in gpus if d.gpu_uuid}
        for token in request.fixed_gpus:
            if token.isdigit() and int(token) < len(gpus):
                addr = gpus[int(token)].address
            elif token in by_uuid:
                addr = by_uuid[token]
            else:
                raise RequestError(f"GPU {quote(token)} is not on this machine", annotation="NVIDIA_VISIBLE_DEVICES")
            res = next((r for r, infos in machine.devices.items() if any(i.id == addr for i in infos)), NVIDIA_GPU)
            fixed.setdefault(res, []).append(addr)
    for suffix, addrs in request.fixed_pci.items():
        matched = next(
            (r for r in machine.devices if r.replace(".", "_").replace("/", "_").upper() == suffix), None
        )
        if matched is None:
            raise RequestError(f"no configured device resource matches {suffix!r}", annotation="PCIDEVICE_" + suffix)
        known = {d.id for d in machine.devices[matched]}
        for addr in addrs:
            if addr not in known:
                raise RequestError(f"device {addr} is not a {matched} device", annotation="PCIDEVICE_" + suffix)
        fixed.setdefault(matched, []).extend(addrs)
    if request.fixed_cdi:
        from numa_pin.admission.cdi_map import resolve_cdi

        gpus_in_order = sorted(_nvidia_gpus(machine.topology), key=lambda d: d.address)
        for res, addr in resolve_cdi(request.fixed_cdi, gpus_in_order, machine.devices, NVIDIA_GPU):
            fixed.setdefault(res, []).append(addr)
    return {r: tuple(dict.fromkeys(a)) for r, a in fixed.items()}


def _provider_hints(
    machine: _Machine,
    state: LedgerState,
    amounts: Amounts,
    fixed: Mapping[str, tuple[str, ...]],
    settings: NodeSettings,
    container_id: str,
) -> list[ProviderHints]:
    nodes = machine.topology.node_ids
    cpu: ProviderHints = None
    if amounts.cpus:
        cpu = {"cpu": cpu_hint_family(machine.cpu_topology, machine.free_cpus, amounts.cpus)}
    mem_req = amounts.memory_resources
    mem: ProviderHints = None
    if mem_req:
        from numa_pin.providers.memory import memory_hint_family
        from numa_pin.topology.memory import build_memory_state

        mem_state = build_memory_state(machine.topology, settings.reserved_memory, _assignments(state, container_id))
        mem = memory_hint_family(mem_state, mem_req)
    dev: dict[str, ResourceHints] = {}
    if amounts.devices or fixed:
        from numa_pin.providers.devices import device_hint_family, device_hints
    for res, count in amounts.devices.items():
        if res not in machine.devices:
            raise RequestError(f"unknown device resource {res!r}", annotation="numa-pin.io/devices")
        if count:
            dev[res] = device_hint_family(machine.devices[res], nodes, machine.free_devices[res], count)
    for res, ids in fixed.items():
        # already assigned by a device plugin: hints regenerate from exactly these devices
        infos = machine.devices.get(res, ())
        dev[res] = device_hints(infos, nodes, frozenset(ids), len(ids))
    return [cpu, mem, dev or None]


def _assignments(state: LedgerState, container_id: str):
    for g in state.grants.values():
        if g.container_id != container_id and g.memory:
            nodes = frozenset(n for per_node in g.memory.values() for n in per_node)
            yield (g.container_id, g.memory, nodes)


def _free_summary(
    machine: _Machine, state: LedgerState, amounts: Amounts, settings: NodeSettings, cid: str,
    fixed: Mapping[str, tuple[str, ...]] | None = None,
) -> str:
    """``cpu free per node: 0=1 1=0; memory ...`` for the resources the request names, then
    every device a device plugin already chose, with its NUMA node (it is not free to move)."""
    parts: list[str] = []
    nodes = machine.topology.node_ids
    if amounts.cpus:
        per = " ".join(f"{n}={len(machine.free_cpus & machine.topology.nodes[n].cpus)}" for n in nodes)
        parts.append(f"cpu {amounts.cpus} requested, free per node: {per}")
    mem_req = amounts.memory_resources
    if mem_req:
        from numa_pin.topology.memory import build_memory_state

        mem_state = build_memory_state(machine.topology, settings.reserved_memory, _assignments(state, cid))
        for res, want in mem_req.items():
            per = " ".join(f"{n}={format_bytes(mem_state.free(n, res))}" for n in nodes)
            parts.append(f"{res} {format_bytes(want)} requested, free per node: {per}")
    for res, count in amounts.devices.items():
        infos = {d.id: d for d in machine.devices.get(res, ())}
        per = " ".join(
            f"{n}={sum(1 for i in machine.free_devices.get(res, ()) if n in infos[i].numa_nodes)}" for n in nodes
        )
        parts.append(f"{res} {count} requested, free per node: {per}")
    for res, ids in sorted((fixed or {}).items()):
        infos = {d.id: d for d in machine.devices.get(res, ())}
        for dev_id in ids:
            info = infos.get(dev_id)
            where = (f"on NUMA node(s) {_nodes(frozenset(info.numa_nodes))}" if info is not None and info.numa_nodes
                     else "on no NUMA node")
            parts.append(f"{res} {dev_id} already assigned by the device plugin, {where}")
    return "; ".join(parts)


def _allocate(
    machine: _Machine,
    state: LedgerState,
    amounts: Amounts,
    fixed: Mapping[str, tuple[str, ...]],
    affinity: frozenset[int] | None,
    settings: NodeSettings,
    container_id: str,
    strict: bool = False,
) -> tuple[frozenset[int], dict[str, dict[int, int]], frozenset[int], dict[str, tuple[str, ...]]]:
    """Take every resource inside ``affinity``; ``strict`` (restricted, single-numa-node) refuses
    what does not fit there with :class:`TopologyAffinityError` instead of spilling to other nodes.
    Raises :class:`AllocationError` (or a subclass) when a resource is short."""
    inside = affinity if strict else None
    if inside is not None:
        _check_fixed_inside(machine, fixed, inside)
    cpus: frozenset[int] = frozenset()
    if amounts.cpus:
        free = machine.free_cpus
        if inside is not None:
            free = free & machine.cpu_topology.cpus_in_numa_nodes(*sorted(inside))
            if len(free) < amounts.cpus:
                raise TopologyAffinityError(f"only {len(free)} of the {amounts.cpus} CPUs requested are free there")
        cpus = allocate_cpus(
            machine.cpu_topology, settings.cpu_options, free, frozenset(), amounts.cpus, affinity
        )
    memory: dict[str, dict[int, int]] = {}
    mem_group: frozenset[int] = frozenset()
    if amounts.memory_resources:
        from numa_pin.allocators.memory import allocate_memory
        from numa_pin.topology.memory import build_memory_state

        mem_state = build_memory_state(machine.topology, settings.reserved_memory, _assignments(state, container_id))
        req = amounts.memory_resources
        if inside is not None and any(sum(mem_state.free(n, r) for n in inside) < want for r, want in req.items()):
            raise TopologyAffinityError("the memory requested does not fit there")
        grant = allocate_memory(mem_state, req, affinity)
        if inside is not None and not grant.nodes <= inside:
            raise TopologyAffinityError("the memory allocator would leave these nodes")
        memory = {res: dict(per) for res, per in grant.per_resource.items()}
        mem_group = grant.nodes
    devices: dict[str, tuple[str, ...]] = dict(fixed)
    if not any(amounts.devices.values()):
        return cpus, memory, mem_group, devices
    from numa_pin.allocators.devices import allocate_devices
    from numa_pin.devices.inventory import parent_keys

    closeness = parent_keys(machine.topology)
    for res, count in amounts.devices.items():
        if count and res not in fixed:
            devices[res] = allocate_devices(
                machine.devices[res], machine.free_devices[res], count, affinity, closeness=closeness, resource=res,
                allow_outside=inside is None,
            )
    return cpus, memory, mem_group, devices


def _nodes(nodes: frozenset[int]) -> str:
    return ",".join(str(n) for n in sorted(nodes))


def _check_fixed_inside(machine: _Machine, fixed: Mapping[str, tuple[str, ...]], inside: frozenset[int]) -> None:
    """A device a device plugin already chose must touch the affinity (or have no NUMA node)."""
    for res, ids in fixed.items():
        infos = {d.id: d for d in machine.devices.get(res, ())}
        for dev_id in ids:
            info = infos.get(dev_id)
            if info is not None and info.numa_nodes and not set(info.numa_nodes) & inside:
                raise TopologyAffinityError(
                    f"{res} {dev_id} (already assigned) is on NUMA node(s) {_nodes(frozenset(info.numa_nodes))}"
                )


def decide(
    topology: Topology,
    state: LedgerState,
    request: ContainerRequest,
    settings: NodeSettings,
) -> Decision:
    """Decide one container. Returns a rejected :class:`Decision` rather than raising when the
    policy says no; raises :class:`~numa_pin.errors.RequestError` / ``PolicyError`` for bad input."""
    policy = request.policy or settings.policy
    scope = request.scope or settings.scope
    options = check_machine(policy, settings.policy_options, topology.node_ids, topology.distance_rows())
    cpu_topo = CpuTopology.from_topology(topology)
    settings.cpu_options.validate(cpu_topo, policy)
    need_devices = bool(request.fixed_gpus or request.fixed_pci or request.fixed_cdi or request.amounts.devices
                        or (request.pod_amounts is not None and request.pod_amounts.devices))
    machine = _machine(topology, cpu_topo, state, settings, request.container_id, need_devices)
    if request.cpuset is not None:  # the user's own cpuset: allocate inside it or not at all
        machine = replace(machine, free_cpus=machine.free_cpus & request.cpuset)
    fixed = resolve_fixed_devices(request, machine)
    all_nodes = frozenset(topology.node_ids)
    mem_nodes = frozenset(n for n, node in topology.nodes.items() if node.memory_total_kb > 0) or all_nodes

    _check_claimed_pod(state, request)
    if request.amounts.empty and not fixed:
        hint = TopologyHint(None, True)
        pool = _pool_after(topology, state, request.container_id, frozenset())
        if request.cpuset is not None and not pool & request.cpuset:
            return Decision(
                request.container_id, False, policy, scope, hint, error=AllocationError,
                reason=f"the container's cpuset {format_list(request.cpuset)} ({CPUSET_FIELD}) holds no CPU of "
                f"the shared pool ({format_list(pool)}); numa-pin never moves a cpuset the user set",
            )
        return Decision(request.container_id, True, policy, scope, hint, mems=frozenset())

    pod = state.pods.get(request.pod_id) if scope == names.POD_SCOPE else None
    pod_affinity: frozenset[int] | None = None
    if pod is not None:
        # later containers of a pod live inside the pod's affinity; no new merge
        hint = TopologyHint(pod.affinity, True)
    else:
        amounts = request.amounts
        if scope == names.POD_SCOPE and request.pod_amounts is not None:
            amounts = at_least(request.pod_amounts, request.amounts)
        providers = _provider_hints(machine, state, amounts, fixed, settings, request.container_id)
        hint, admit = merge_hints(
            policy,
            providers,
            topology.node_ids,
            distances=topology.distance_rows(),
            prefer_closest=options.prefer_closest_numa_nodes,
        )
        if not admit:
            why = _free_summary(machine, state, amounts, settings, request.container_id, fixed) + _inside(request)
            return Decision(
                request.container_id, False, policy, scope, hint,
                reason=f"{policy} policy: resources cannot be aligned on "
                f"{'one NUMA node' if policy == names.SINGLE_NUMA_NODE else 'their preferred NUMA nodes'} ({why})",
            )
        if scope == names.POD_SCOPE:
            pod_affinity = hint.affinity if hint.affinity is not None else all_nodes

    affinity = hint.affinity if policy != names.NONE else None
    strict = policy in STRICT_POLICIES and affinity is not None
    try:
        cpus, memory, mem_group, devices = _allocate(
            machine, state, request.amounts, fixed, affinity, settings, request.container_id, strict
        )
    except (AllocationError, TopologyAffinityError) as exc:
        why = _free_summary(machine, state, request.amounts, settings, request.container_id, fixed)
        why += _inside(request)
        reason = f"{exc} ({why})" if why else str(exc)
        if isinstance(exc, TopologyAffinityError):
            where = f"pod {request.pod_id} is aligned to" if pod is not None else "the merged affinity is"
            reason = f"{policy} policy: {where} NUMA node(s) {_nodes(affinity or all_nodes)}, and {reason}"
        return Decision(request.container_id, False, policy, scope, hint, reason=reason, error=type(exc))
    starved = _starved_shared(topology, state, request.container_id, cpus)
    if starved:
        return Decision(request.container_id, False, policy, scope, hint, error=AllocationError, reason=starved)
    if mem_group:
        mems = mem_group
    elif affinity is not None and policy != names.NONE:
        mems = affinity & mem_nodes or mem_nodes
    else:
        mems = mem_nodes
    return Decision(
        request.container_id, True, policy, scope, hint, cpus=cpus, mems=mems, devices=devices,
        memory=memory, pod_affinity=pod_affinity,
        reason=f"{policy}/{scope}: affinity {bitmask.format_mask(hint.mask)}",
    )


def _inside(request: ContainerRequest) -> str:
    if request.cpuset is None:
        return ""
    return f"; only inside the container's cpuset {format_list(request.cpuset)} ({CPUSET_FIELD})"


def _pool_after(topology: Topology, state: LedgerState, container_id: str, taking: frozenset[int]) -> frozenset[int]:
    """The shared pool once ``container_id`` holds ``taking`` (reserved CPUs are never granted)."""
    others = state.without(container_id) if container_id in state.grants else state
    return topology.cpu_ids - others.exclusive_cpus() - taking


def _starved_shared(topology: Topology, state: LedgerState, container_id: str, taking: frozenset[int]) -> str:
    """Why taking ``taking`` would leave a shared container with a cpuset of its own without a
    CPU (its cpuset is the pool inside its own set), or ``""``."""
    if not taking:
        return ""
    pool = _pool_after(topology, state, container_id, taking)
    for g in state.shared_grants():
        if g.container_id != container_id and g.cpuset_limit and not pool & g.cpuset_limit:
            return (
                f"exclusive cpus {format_list(taking)} would leave shared container {g.container_id} without a CPU "
                f"of its own cpuset {format_list(g.cpuset_limit)} ({CPUSET_FIELD})"
            )
    return ""


def at_least(pod: Amounts, container: Amounts) -> Amounts:
    """Per resource, the larger of the pod's total and the container's own request."""
    devices = dict(pod.devices)
    for res, count in container.devices.items():
        devices[res] = max(devices.get(res, 0), count)
    hugepages = dict(pod.hugepages)
    for res, size in container.hugepages.items():
        hugepages[res] = max(hugepages.get(res, 0), size)
    return Amounts(max(pod.cpus, container.cpus), max(pod.memory, container.memory), hugepages, devices)


def _check_claimed_pod(state: LedgerState, request: ContainerRequest) -> None:
    """``numa-pin.io/pod`` may name a user pod, never a pod a runtime sandbox (or another
    container alone) owns. Raises :class:`RequestError` naming the annotation."""
    claimed = request.claimed_pod
    if claimed is None:
        return
    if claimed in state.pods or any(g.pod_id == claimed for g in state.grants.values()):
        raise RequestError(
            f"pod {claimed!r} belongs to another sandbox or container; a container without the runtime's "
            "sandbox annotations cannot join it",
            annotation="numa-pin.io/pod",
        )


def reject(decision: Decision) -> AdmissionError:
    """The error the entry points print for a rejected decision (same kind kubelet reports)."""
    return decision.error(decision.reason)

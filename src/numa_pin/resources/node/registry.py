"""The registered resources of a node, and the decision settings that carry them.

The default resources, in the order they enforce (release runs the other way): the isolation
knobs' checks (a container they cannot isolate is rejected before anything is written), CPUs and the
shared pool, memory and hugepages, PCI devices (the decision for every device resource),
SR-IOV VFs and GPUs (what granting those devices means on the machine), then the isolation
knobs of exclusive CPUs (quota, C-states, cpufreq governor, host services, no load balancing
through isolated partitions, IRQs off exclusive CPUs; ``docs/isolation.md``) and the exec CPU
affinity the runtime's config carries (``docs/exec-affinity.md``). A resource added with
:func:`register` joins every node service made afterwards (see ``docs/design/adding-a-resource.md``).
"""

from __future__ import annotations

from numa_pin.base.cpuset import format_list
from numa_pin.config.schema import Config
from numa_pin.resources.base import NodeSettings
from numa_pin.resources.devices import PciDevices
from numa_pin.resources.memory import MemoryResource
from numa_pin.resources.node.base import Node, NodeResource
from numa_pin.resources.node.cpu import CpuNode
from numa_pin.resources.node.execaffinity import ExecAffinityNode
from numa_pin.resources.node.gpu import GpuNode
from numa_pin.resources.node.host import HostNode
from numa_pin.resources.node.irq import IrqNode
from numa_pin.resources.node.isolation import CStatesNode, GovernorNode, IsolationStatus, QuotaNode, SettingsPreflight
from numa_pin.resources.node.partition import PartitionNode
from numa_pin.resources.node.preflight import IsolationPreflight
from numa_pin.resources.node.vf import VfNode

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from numa_pin.resources.node.runtime import RuntimeAsk, RuntimeEdit


class MemoryNode(MemoryResource, NodeResource):
    """Memory and hugepages: the cpuset's memory nodes are the CPU resource's write; where the
    runtime applies the grant, the memory policy asked for (``numa-pin.io/memory-policy``), or
    by default ``bind`` over an exclusive grant's memory nodes where the runtime can set one."""

    def runtime(self, node: Node, ask: RuntimeAsk) -> RuntimeEdit | None:
        from numa_pin.resources.node.runtime import RuntimeEdit

        grant, request = ask.grant, ask.request
        if request is None or not grant.mems:
            return None
        if request.memory_policy is not None:
            from numa_pin.enforcer.mempolicy import check_kernel, oci_policy

            check_kernel(request.memory_policy, node.config.sysfs_root)
            return RuntimeEdit(memory_policy=oci_policy(request.memory_policy, grant.mems))
        if ask.target.memory_policy and grant.cpus and grant.memory:
            return RuntimeEdit(memory_policy={"mode": "MPOL_BIND", "nodes": format_list(grant.mems)},
                               policy_default=True)
        return None


class PciNode(PciDevices, NodeResource):
    """PCI devices: decided here; what granting one means is its kind's (VFs, GPUs)."""


_DEFAULT: tuple[NodeResource, ...] = (
    # a container the node cannot isolate is refused before the first write
    SettingsPreflight(), IsolationPreflight(),
    CpuNode(), MemoryNode(), PciNode(), VfNode(), GpuNode(),
    # isolation of exclusive CPUs: each knob on its own, after the CPUs are placed
    QuotaNode(), CStatesNode(), GovernorNode(), HostNode(), PartitionNode(), IrqNode(), IsolationStatus(),
    # where the processes exec'd into it run: a field of the runtime's config only
    ExecAffinityNode(),
)
_EXTRA: list[NodeResource] = []


def node_resources() -> tuple[NodeResource, ...]:
    """Every registered resource: the defaults, then those :func:`register` added."""
    return _DEFAULT + tuple(_EXTRA)


def register(resource: NodeResource) -> None:
    """Add ``resource`` to every node service made from now on. Raises ValueError when a
    resource of that name is registered already."""
    if any(r.name == resource.name for r in node_resources()):
        raise ValueError(f"a resource named {resource.name!r} is registered already")
    _EXTRA.append(resource)


def unregister(resource: NodeResource) -> None:
    """Take back a resource :func:`register` added (nothing if it is not there)."""
    if resource in _EXTRA:
        _EXTRA.remove(resource)


def settings_from_config(config: Config) -> NodeSettings:
    """The decision-relevant part of the config, in the types the decision takes, with every
    registered resource."""
    cm = config.cpu_manager
    resources: tuple = ()
    if config.devices:
        from numa_pin.devices.inventory import DeviceResource

        resources = tuple(DeviceResource(name, tuple(selectors)) for name, selectors in config.devices.items())
    from numa_pin.topology.isolated import isolated_cpus

    isolated = frozenset().union(*isolated_cpus(config.sysfs_root))  # isolcpus and nohz_full alike
    return NodeSettings(
        policy=config.policy,
        scope=config.scope,
        policy_options=dict(config.policy_options),
        cpu_options=cm.options,
        reserved_cpus=cm.reserved_cpus,
        num_reserved_cpus=cm.num_reserved_cpus,
        reserved_memory=config.reserved_memory,
        device_resources=resources,
        resources=node_resources(),
        isolated_cpus=isolated,
        isolated_mode=config.isolation.isolated_cpus,
    )


__all__ = ["node_resources", "register", "settings_from_config", "unregister"]

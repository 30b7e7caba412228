"""The node as a ``topology.node.k8s.io/v1alpha2`` ``NodeResourceTopology`` object (pure, no I/O).

The topology-aware scheduler plugin (``NodeResourceTopologyMatch``) reads one such object per
node and filters out nodes whose NUMA zones cannot hold a pod under the node's Topology Manager
policy. :func:`build_nrt` makes it from what numa-pin already knows:

* one zone per NUMA node, ``node-<id>``, ``type: Node``;
* ``costs``: per zone, one entry ``node-<j>`` per NUMA node with the kernel's SLIT distance;
* ``resources`` per zone, each with ``capacity`` (the machine), ``allocatable`` (capacity minus
  what is reserved for the system) and ``available`` (allocatable minus the ledger's grants),
  in the words of every resource (:meth:`numa_pin.resources.base.Resource.zones`):

  - ``cpu``: online CPUs of the node; minus the reserved CPUs; minus exclusively granted CPUs
    (shared containers hold none);
  - ``memory`` and ``hugepages-<size>``: kubelet's memory manager tables (``total``,
    ``allocatable``, ``free``; memory's allocatable also leaves out the node's hugepages);
  - every configured device resource: its devices on the node; minus unhealthy ones; minus
    granted ones. Devices without a NUMA node belong to no zone and are not counted;

* ``attributes`` per zone, in Kubernetes DRA's words (:mod:`numa_pin.devices.pcie`), when the
  node has configured devices: ``numaNode`` (the node id) and
  ``resource.kubernetes.io/pcieRoot`` (the PCIe roots of its devices, comma-separated), and per
  device ``resource.kubernetes.io/pciBusID/<resource>`` (its addresses, comma-separated), so a
  DRA-aware operator can match what numa-pin grants;
* top-level ``attributes``: ``topologyManagerPolicy``, ``topologyManagerScope`` and each
  ``policy_options`` entry under kubelet's option name; and the deprecated ``topologyPolicies``
  list older plugin versions read.

Quantities are Kubernetes quantity strings (``"16"``, ``"92Gi"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from numa_pin.resources.base import NodeView
from numa_pin.resources.registry import pure_resources
from numa_pin.topology.model import Topology

if TYPE_CHECKING:
    from numa_pin.admission.decide import NodeSettings
    from numa_pin.ledger.model import LedgerState
    from numa_pin.providers.devices import DeviceInfo

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
ZONE_TYPE = "Node"
ATTR_POLICY = "topologyManagerPolicy"
ATTR_SCOPE = "topologyManagerScope"

#: (policy, scope) -> the deprecated ``topologyPolicies`` value (v1alpha2 ``TopologyManagerPolicy``)
LEGACY_POLICIES: Mapping[tuple[str, str], str] = {
    ("none", "container"): "None",
    ("none", "pod"): "None",
    ("best-effort", "container"): "BestEffortContainerLevel",
    ("best-effort", "pod"): "BestEffortPodLevel",
    ("restricted", "container"): "RestrictedContainerLevel",
    ("restricted", "pod"): "RestrictedPodLevel",
    ("single-numa-node", "container"): "SingleNUMANodeContainerLevel",
    ("single-numa-node", "pod"): "SingleNUMANodePodLevel",
}


def zone_name(node: int) -> str:
    """``node-<id>``, the zone name the scheduler plugin expects for a NUMA node."""
    return f"node-{node}"


def option_value(value: object) -> str:
    """A policy option as an attribute value: booleans as ``true``/``false``, the rest as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def reserved_cpus_of(topology: Topology, settings: NodeSettings) -> frozenset[int]:
    """The CPUs the config reserves for the system, picked as admissions pick them.

    Raises:
        PolicyError: the reserved CPUs are not online, or there are not enough CPUs.
    """
    from numa_pin.allocators.cpu import reserved_cpus
    from numa_pin.topology.cpus import CpuTopology

    return reserved_cpus(CpuTopology.from_topology(topology), settings.cpu_options, settings.reserved_cpus,
                         settings.num_reserved_cpus)


def build_nrt(
    topology: Topology,
    settings: NodeSettings,
    state: LedgerState,
    devices: Mapping[str, Sequence[DeviceInfo]],
    node_name: str,
    reserved_cpus: frozenset[int] | None = None,
) -> dict[str, Any]:
    """The ``NodeResourceTopology`` object (plain dicts and lists, ready for JSON or YAML).

    ``devices`` is the device inventory of the configured resources
    (:func:`numa_pin.devices.inventory.inventory`); ``reserved_cpus`` defaults to
    :func:`reserved_cpus_of`.

    Raises:
        PolicyError: the reserved CPUs cannot be picked (see :func:`reserved_cpus_of`).
        ConfigError: ``reserved_memory`` does not fit the machine.
        LedgerError: a grant's memory names nodes or resources the machine lacks.
    """
    reserved = reserved_cpus_of(topology, settings) if reserved_cpus is None else reserved_cpus
    view = NodeView(topology, settings, state, devices, reserved)
    per_resource = [res.zones(view) for res in settings.resources or pure_resources()]
    zones = [
        {
            "name": zone_name(node),
            "type": ZONE_TYPE,
            "costs": [{"name": zone_name(j), "value": topology.distance(node, j)} for j in topology.node_ids],
            "resources": [entry for zones in per_resource for entry in zones.get(node, ())],
            **_zone_attributes(topology, devices, node),
        }
        for node in topology.node_ids
    ]
    attributes = [{"name": ATTR_POLICY, "value": settings.policy}, {"name": ATTR_SCOPE, "value": settings.scope}]
    attributes += [{"name": str(k), "value": option_value(v)} for k, v in sorted(settings.policy_options.items())]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node_name},
        "topologyPolicies": [LEGACY_POLICIES[(settings.policy, settings.scope)]],
        "attributes": attributes,
        "zones": zones,
    }


def _zone_attributes(topology: Topology, devices: Mapping[str, Sequence[DeviceInfo]], node: int) -> dict[str, Any]:
    """The DRA attributes of a zone's configured devices (none: no ``attributes`` key)."""
    from numa_pin.devices.pcie import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT, pcie_root

    here = {res: sorted(d.id for d in infos if node in d.numa_nodes) for res, infos in sorted(devices.items())}
    here = {res: ids for res, ids in here.items() if ids}
    if not here:
        return {}
    roots = sorted({pcie_root(topology, a) for ids in here.values() for a in ids})
    attributes = [{"name": NUMA_NODE, "value": str(node)}, {"name": PCIE_ROOT, "value": ",".join(roots)}]
    attributes += [{"name": f"{PCI_BUS_ID}/{res}", "value": ",".join(ids)} for res, ids in here.items()]
    return {"attributes": attributes}


__all__ = ["API_VERSION", "KIND", "LEGACY_POLICIES", "build_nrt", "option_value", "reserved_cpus_of", "zone_name"]

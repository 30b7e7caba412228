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
  node has configured devices: ``resource.kubernetes.io/numaNode`` (the node id; also under the
  bare ``numaNode`` of earlier releases, for this release) and
  ``resource.kubernetes.io/pcieRoot`` (the PCIe roots of its devices, comma-separated), and per
  device ``resource.kubernetes.io/pciBusID/<resource>`` (its addresses, comma-separated), so a
  DRA-aware operator can match what numa-pin grants;
* top-level ``attributes``: ``topologyManagerPolicy``, ``topologyManagerScope`` and
  ``topologyManagerMaxNUMANodes`` (what the plugin's ``nodeconfig`` reads), each
  ``policy_options`` entry under kubelet's option name; when the pods on the node are known,
  ``nodeTopologyPodsFingerprint`` and ``nodeTopologyPodsFingerprintMethod`` (:func:`pods_fingerprint`);
  and the deprecated ``topologyPolicies`` list older plugin versions read.

Quantities are Kubernetes quantity strings (``"16"``, ``"92Gi"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
ATTR_MAX_NUMA_NODES = "topologyManagerMaxNUMANodes"
ATTR_FINGERPRINT = "nodeTopologyPodsFingerprint"
ATTR_FINGERPRINT_METHOD = "nodeTopologyPodsFingerprintMethod"
#: the fingerprint covers every pod bound to the node (podfingerprint's ``MethodAll``)
FINGERPRINT_METHOD_ALL = "all"
#: kubelet's topology manager limit when ``max-allowable-numa-nodes`` is not set
DEFAULT_MAX_NUMA_NODES = 8
FINGERPRINT_PREFIX, FINGERPRINT_VERSION = "pfp0", "v001"

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


_M64 = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def _merge(acc: int, val: int) -> int:
    return (((acc ^ _round(0, val)) * _P1) + _P4) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` (the algorithm of xxHash's specification, ``XXH64(data, len, seed)``)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed & _M64, (seed - _P1) & _M64]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], int.from_bytes(data[i + 8 * k:i + 8 * k + 8], "little"))
            i += 32
        acc = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for lane in v:
            acc = _merge(acc, lane)
    else:
        acc = (seed + _P5) & _M64
    acc = (acc + n) & _M64
    while i + 8 <= n:
        acc ^= _round(0, int.from_bytes(data[i:i + 8], "little"))
        acc = (_rotl(acc, 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        acc ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M64
        acc = (_rotl(acc, 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        acc ^= (data[i] * _P5) & _M64
        acc = (_rotl(acc, 11) * _P1) & _M64
        i += 1
    acc ^= acc >> 33
    acc = (acc * _P2) & _M64
    acc ^= acc >> 29
    acc = (acc * _P3) & _M64
    return acc ^ (acc >> 32)


def pods_fingerprint(pods: Iterable[tuple[str, str]]) -> str:
    """The podfingerprint package's ``Sign()`` of a set of ``(namespace, name)`` pods, which the
    scheduler plugin recomputes from the pods it sees bound to the node and compares before it
    trusts (resyncs from) this object: each pod hashes to ``XXH64(name, seed=XXH64(namespace))``;
    the hashes, sorted as unsigned integers, each as 8 little-endian bytes, hash once more
    (seed 0); the result is ``pfp0`` ``v001`` and that digest as 16 hex digits (big-endian).
    A pod listed twice counts twice, as in the package."""
    hashes = sorted(xxh64(name.encode("utf-8"), xxh64(namespace.encode("utf-8"))) for namespace, name in pods)
    digest = xxh64(b"".join(h.to_bytes(8, "little") for h in hashes))
    return f"{FINGERPRINT_PREFIX}{FINGERPRINT_VERSION}{digest:016x}"


def pods_on_node(doc: object, node_name: str) -> list[tuple[str, str]]:
    """``(namespace, name)`` of the pods in ``doc`` the scheduler plugin counts for ``node_name``.

    ``doc`` is a ``PodList`` (``kubectl get pods -A -o json``: ``items``), a list of pods, or a
    list of ``{"namespace": ..., "name": ...}`` (podfingerprint's test data). As the plugin's
    default (dedicated) pod informer does, a pod counts when it is bound to this node
    (``spec.nodeName``; a pod without ``spec`` is taken as bound) and is not ``Pending``.

    Raises:
        RequestError: the document is not one of those shapes, or a pod lacks its name.
    """
    from numa_pin.errors import RequestError

    items = doc.get("items") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise RequestError("the pods document is neither a PodList nor a list of pods", annotation="--pods")
    out: list[tuple[str, str]] = []
    for i, pod in enumerate(items):
        meta = pod.get("metadata", pod) if isinstance(pod, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise RequestError(f"pods entry {i} has no name", annotation="--pods")
        namespace = meta.get("namespace") or "default"
        if not isinstance(namespace, str):
            raise RequestError(f"pods entry {i} has a namespace that is not a string", annotation="--pods")
        spec, status = pod.get("spec"), pod.get("status")
        if isinstance(spec, dict) and spec.get("nodeName") != node_name:
            continue
        if isinstance(status, dict) and status.get("phase") == "Pending":
            continue
        out.append((namespace, meta["name"]))
    return out


def max_numa_nodes(settings: NodeSettings) -> int:
    """kubelet's ``max-allowable-numa-nodes`` option, else its default (8)."""
    from numa_pin.policy.options import MAX_ALLOWABLE_NUMA_NODES

    value = settings.policy_options.get(MAX_ALLOWABLE_NUMA_NODES)
    return DEFAULT_MAX_NUMA_NODES if value is None else int(value)


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
    pods: Iterable[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The ``NodeResourceTopology`` object (plain dicts and lists, ready for JSON or YAML).

    ``devices`` is the device inventory of the configured resources
    (:func:`numa_pin.devices.inventory.inventory`); ``reserved_cpus`` defaults to
    :func:`reserved_cpus_of`. ``pods`` are the ``(namespace, name)`` of the pods bound to the
    node; None (not known) leaves the fingerprint out, since a wrong one would stop the
    scheduler from ever resyncing the node.

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
    attributes = [{"name": ATTR_POLICY, "value": settings.policy}, {"name": ATTR_SCOPE, "value": settings.scope},
                  {"name": ATTR_MAX_NUMA_NODES, "value": str(max_numa_nodes(settings))}]
    attributes += [{"name": str(k), "value": option_value(v)} for k, v in sorted(settings.policy_options.items())]
    if pods is not None:
        attributes += [{"name": ATTR_FINGERPRINT, "value": pods_fingerprint(pods)},
                       {"name": ATTR_FINGERPRINT_METHOD, "value": FINGERPRINT_METHOD_ALL}]
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
    from numa_pin.devices.pcie import LEGACY_NUMA_NODE, NUMA_NODE, PCI_BUS_ID, PCIE_ROOT, pcie_root

    here = {res: sorted(d.id for d in infos if node in d.numa_nodes) for res, infos in sorted(devices.items())}
    here = {res: ids for res, ids in here.items() if ids}
    if not here:
        return {}
    roots = sorted({pcie_root(topology, a) for ids in here.values() for a in ids})
    attributes = [{"name": NUMA_NODE, "value": str(node)}, {"name": LEGACY_NUMA_NODE, "value": str(node)},
                  {"name": PCIE_ROOT, "value": ",".join(roots)}]
    attributes += [{"name": f"{PCI_BUS_ID}/{res}", "value": ",".join(ids)} for res, ids in here.items()]
    return {"attributes": attributes}


__all__ = ["API_VERSION", "KIND", "LEGACY_POLICIES", "build_nrt", "max_numa_nodes", "option_value", "pods_fingerprint",
           "pods_on_node", "reserved_cpus_of", "xxh64", "zone_name"]

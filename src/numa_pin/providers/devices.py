"""Device hints: kubelet's Device Manager ``GetTopologyHints`` (pure, no I/O).

One resource (``nvidia.com/gpu``, ``intel.com/sriov_netdevice``) is a set of registered
devices, each a :class:`DeviceInfo` with the NUMA nodes it is attached to (none = no
topology). Per resource (``cpu-memory-device.md`` §8):

* ``None`` ("don't care") when no registered device has topology;
* an empty list when the request cannot be met at all, or when devices already held by the
  container (pod) are not exactly the request;
* otherwise one hint per mask holding enough available devices, preferred when its size
  equals the smallest mask that holds the request among *all* registered devices.

:func:`device_hint_family` gives the same answer as one
:class:`~numa_pin.policy.hint.CapacityFamily` when devices sit on at most one node each (as
every PCI device in sysfs does), so large machines are never enumerated.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from itertools import combinations

from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import RequestError
from numa_pin.policy import bitmask
from numa_pin.policy.hint import CapacityFamily, TopologyHint
from numa_pin.providers.podrequest import pod_request

#: one resource's answer
DeviceHints = list[TopologyHint] | CapacityFamily | None


def _registry(devices: Iterable[DeviceInfo]) -> dict[str, DeviceInfo]:
    return {d.id: d for d in devices}


def _check_count(request: object, what: str = "device request") -> int:
    if isinstance(request, bool) or not isinstance(request, int) or request < 0:
        raise RequestError(f"{what} must be a non-negative number of devices, got {request!r}")
    return request


def has_topology_alignment(devices: Iterable[DeviceInfo]) -> bool:
    """kubelet ``deviceHasTopologyAlignment``: does any registered device have a NUMA node?"""
    return any(d.has_topology for d in devices)


def available_devices(devices: Iterable[DeviceInfo], in_use: Iterable[str] = ()) -> frozenset[str]:
    """kubelet ``getAvailableDevices``: healthy devices minus those allocated to anyone."""
    return frozenset(d.id for d in devices if d.healthy) - frozenset(in_use)


def _generate(
    registry: Mapping[str, DeviceInfo],
    node_ids: tuple[int, ...],
    available: frozenset[str],
    reusable: frozenset[str],
    request: int,
) -> list[TopologyHint]:
    """kubelet ``generateDeviceTopologyHints``, enumerating every mask."""
    masks_of = [d.mask for d in registry.values()]
    reuse_masks = [registry[d].mask for d in sorted(reusable) if d in registry and registry[d].has_topology]
    avail_masks = [registry[d].mask for d in sorted(available) if d in registry]
    min_affinity = len(node_ids)
    passed: list[int] = []
    for size in range(1, len(node_ids) + 1):
        for combo in combinations(node_ids, size):
            mask = bitmask.from_nodes(combo)
            if sum(1 for m in masks_of if m & mask) >= request:
                min_affinity = min(min_affinity, size)
            if any(not m & mask for m in reuse_masks):
                continue
            if len(reuse_masks) + sum(1 for m in avail_masks if m & mask) >= request:
                passed.append(mask)
    return [TopologyHint.from_mask(m, m.bit_count() == min_affinity) for m in passed]


def device_hints(
    devices: Iterable[DeviceInfo],
    numa_nodes: Iterable[int],
    available: Iterable[str],
    request: int,
    reusable: Iterable[str] = (),
) -> list[TopologyHint] | None:
    """kubelet's hints for one device resource that the container does not hold yet.

    ``devices`` are all registered devices of the resource, unhealthy ones included;
    ``numa_nodes`` the machine's nodes; ``available`` the healthy devices nobody holds
    (:func:`available_devices`); ``reusable`` the devices of the pod's init containers
    (empty at pod scope). Costs ``2**N`` masks.

    Raises:
        RequestError: a negative or non-integer ``request``.
    """
    request = _check_count(request)
    registry = _registry(devices)
    if not has_topology_alignment(registry.values()):
        return None
    avail, reuse = frozenset(available), frozenset(reusable)
    if len(avail | reuse) < request:
        return []
    return _generate(registry, tuple(sorted(set(numa_nodes))), avail, reuse, request)


def device_hints_for_allocated(
    devices: Iterable[DeviceInfo],
    numa_nodes: Iterable[int],
    allocated: Collection[str],
    request: int,
) -> list[TopologyHint] | None:
    """Hints for a container (pod) that already holds ``allocated`` devices of the resource.

    ``None`` when the resource has no topology; ``[]`` when ``len(allocated) != request``;
    otherwise the hints regenerated with ``available = allocated`` and nothing reusable.

    Raises:
        RequestError: a negative or non-integer ``request``.
    """
    request = _check_count(request)
    devices = tuple(devices)
    held = frozenset(allocated)
    if len(held) != request and has_topology_alignment(devices):
        return []
    return device_hints(devices, numa_nodes, held, request)


def device_hint_family(
    devices: Iterable[DeviceInfo],
    numa_nodes: Iterable[int],
    available: Iterable[str],
    request: int,
    reusable: Iterable[str] = (),
) -> DeviceHints:
    """:func:`device_hints`, answered as a :class:`CapacityFamily` when every device with
    topology is on exactly one node; otherwise the explicit list.

    Family: capacity of a node = available devices on it; ``must_include`` = the nodes of the
    reusable devices that have topology, ``need`` = ``request`` minus how many of those there
    are; ``min_affinity`` = fewest nodes whose registered devices reach ``request``.
    ``None`` and ``[]`` come back as :func:`device_hints` gives them.

    Raises:
        RequestError: a negative or non-integer ``request``.
    """
    request = _check_count(request)
    registry = _registry(devices)
    if any(len(d.numa_nodes) > 1 for d in registry.values()):
        return device_hints(registry.values(), numa_nodes, available, request, reusable)
    if not has_topology_alignment(registry.values()):
        return None
    avail, reuse = frozenset(available), frozenset(reusable)
    if len(avail | reuse) < request:
        return []
    node_ids = tuple(sorted(set(numa_nodes)))
    if not node_ids:
        return []
    known = frozenset(node_ids)
    pinned = [registry[d].numa_nodes[0] for d in reuse if d in registry and registry[d].has_topology]
    if any(n not in known for n in pinned):
        return []  # a reusable device on a node outside every mask rules every mask out
    per_node = {n: 0 for n in node_ids}
    for d in avail:
        info = registry.get(d)
        if info is not None and info.has_topology and info.numa_nodes[0] in per_node:
            per_node[info.numa_nodes[0]] += 1
    registered = sorted(
        (sum(1 for d in registry.values() if d.numa_nodes == (n,)) for n in node_ids), reverse=True
    )
    min_affinity, total = len(node_ids), 0
    for size, count in enumerate(registered, 1):
        total += count
        if total >= request:
            min_affinity = size
            break
    need = max(0, request - len(pinned))
    if sum(per_node.values()) < need:
        return []
    return CapacityFamily(
        nodes=node_ids,
        capacity=tuple((per_node[n],) for n in node_ids),
        need=(need,),
        min_affinity=min_affinity,
        must_include=bitmask.from_nodes(pinned),
    )


def resource_device_hints(
    devices: Iterable[DeviceInfo],
    numa_nodes: Iterable[int],
    request: int,
    *,
    in_use: Iterable[str] = (),
    held: Collection[str] = (),
    reusable: Iterable[str] = (),
    family: bool = False,
) -> DeviceHints:
    """One resource's answer, dispatching as kubelet does.

    ``held``: devices this container (pod scope: this pod) already has; when non-empty the
    hints are regenerated from them. ``in_use``: devices held by anyone (this container
    included); available = healthy minus ``in_use``. ``reusable``: the pod's init-container
    devices (leave empty at pod scope). ``family`` picks :func:`device_hint_family`.

    Raises:
        RequestError: a negative or non-integer ``request``.
    """
    registry = _registry(devices)
    if held:
        return device_hints_for_allocated(registry.values(), numa_nodes, held, request)
    available = available_devices(registry.values(), in_use)
    provider = device_hint_family if family else device_hints
    return provider(registry.values(), numa_nodes, available, request, reusable)


def container_device_hints(
    registered: Mapping[str, Iterable[DeviceInfo]],
    numa_nodes: Iterable[int],
    requests: Mapping[str, int],
    *,
    in_use: Mapping[str, Iterable[str]] | None = None,
    held: Mapping[str, Collection[str]] | None = None,
    reusable: Mapping[str, Iterable[str]] | None = None,
    family: bool = False,
) -> dict[str, DeviceHints]:
    """The device provider's answer for a container (or, with pod-level requests and
    ``held`` = the pod's devices, for a pod): one entry per requested device resource.

    Requested names that are not in ``registered`` are not device resources and are skipped,
    as kubelet only looks at device-plugin resources. An empty dict means "no preference".

    Raises:
        RequestError: a negative or non-integer request.
    """
    nodes = tuple(sorted(set(numa_nodes)))
    in_use, held, reusable = in_use or {}, held or {}, reusable or {}
    out: dict[str, DeviceHints] = {}
    for resource, count in requests.items():
        if resource not in registered:
            continue
        out[resource] = resource_device_hints(
            registered[resource],
            nodes,
            _check_count(count, f"{resource} request"),
            in_use=in_use.get(resource, ()),
            held=held.get(resource, ()),
            reusable=reusable.get(resource, ()),
            family=family,
        )
    return out


def pod_device_request(
    init_containers: Iterable[tuple[Mapping[str, int], bool]],
    app_requests: Iterable[Mapping[str, int]],
) -> dict[str, int]:
    """kubelet ``getPodDeviceRequest``, which takes ``resource.PodLimits`` of the pod.

    ``init_containers`` are ``(request, restartable)`` in spec order. A restartable (sidecar)
    init container keeps its devices for the pod's whole life: it adds to a running sum that
    every later init container sees still held, and to the app containers' sum. Per resource the
    result is ``max(sum of app containers + sum of sidecars, the peak over init containers of
    sidecars started before it + its own request, the sum of sidecars)``. Resources only init
    containers ask for are kept.

    Raises:
        RequestError: a negative or non-integer count.
    """
    return pod_request(init_containers, app_requests, _check_counts, keep_init_only=True)


def _check_counts(request: Mapping[str, int]) -> dict[str, int]:
    return {resource: _check_count(count, f"{resource} request") for resource, count in request.items()}

"""Device allocation: kubelet's Device Manager ``devicesToAllocate`` (pure).

Order of preference, as kubelet: the pod's reusable (init-container) devices; then devices
whose NUMA nodes intersect the affinity; when those are too few, all of them plus, if
allowed, devices without topology and then devices on other nodes.

kubelet takes devices from each of these sets in random order (or lets the device plugin
choose). numa-pin chooses deterministically and keeps the devices close together
(:func:`pack`): first as few NUMA nodes as possible, then as few PCIe trees (``closeness``:
device id -> the key of its root port / switch, see
:func:`numa_pin.devices.inventory.parent_keys`), preferring the node and tree of devices
already chosen, then the lowest ids.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import AllocationError, RequestError
from numa_pin.policy import bitmask

Key = Callable[[str], Hashable]


def pack(candidates: Iterable[str], count: int, levels: Sequence[Key], near: Iterable[str] = ()) -> list[str]:
    """Choose ``count`` of ``candidates`` packed by ``levels`` (outermost first).

    At each level the candidates are grouped by key. Groups that hold a device of ``near``
    come first; among the rest the smallest group that can take everything left wins
    (ties: lowest first id), else the largest group (ties: lowest first id) is taken whole
    and the search goes on. Inside a group the next level decides; after the last level,
    the lowest ids. All of ``candidates`` come back when there are at most ``count``.
    """
    pool = sorted(set(candidates))
    if count <= 0:
        return []
    if count >= len(pool):
        return pool
    if not levels:
        return pool[:count]
    key, inner = levels[0], levels[1:]
    near = list(near)
    near_keys = {key(d) for d in near}
    groups: dict[Hashable, list[str]] = {}
    for d in pool:
        groups.setdefault(key(d), []).append(d)
    chosen: list[str] = []
    while len(chosen) < count:
        left = count - len(chosen)
        options = [k for k in groups if k in near_keys] or list(groups)
        fitting = [k for k in options if len(groups[k]) >= left]
        if fitting:
            pick = min(fitting, key=lambda k: (len(groups[k]), groups[k][0]))
        else:
            pick = min(options, key=lambda k: (-len(groups[k]), groups[k][0]))
        chosen += pack(groups.pop(pick), left, inner, near + chosen)
    return chosen


def _levels(registry: Mapping[str, DeviceInfo], closeness: Mapping[str, Hashable] | None) -> list[Key]:
    def numa(d: str) -> Hashable:
        info = registry.get(d)
        return info.numa_nodes if info is not None else ()

    levels: list[Key] = [numa]
    if closeness is not None:
        levels.append(lambda d: closeness[d] if d in closeness else ("device", d))
    return levels


def _free_per_node(registry: Mapping[str, DeviceInfo], free: Iterable[str]) -> str:
    counts: dict[str, int] = {str(n): 0 for d in registry.values() for n in d.numa_nodes}
    for d in free:
        info = registry.get(d)
        for name in [str(n) for n in info.numa_nodes] if info is not None and info.has_topology else ["none"]:
            counts[name] = counts.get(name, 0) + 1
    ordered = sorted(counts, key=lambda k: (k == "none", int(k) if k != "none" else 0))
    return "{" + ", ".join(f"{k}: {counts[k]}" for k in ordered) + "}"


def allocate_devices(
    devices: Iterable[DeviceInfo],
    available: Iterable[str],
    request: int,
    affinity_nodes: Iterable[int] | None,
    reusable: Iterable[str] = (),
    closeness: Mapping[str, Hashable] | None = None,
    *,
    resource: str = "devices",
    allow_outside: bool = True,
) -> tuple[str, ...]:
    """Pick ``request`` device ids (sorted) for a container.

    ``devices``: every registered device of ``resource``; ``available``: the healthy ones
    nobody holds; ``reusable``: the pod's init-container devices, taken first;
    ``affinity_nodes``: the Topology Manager's affinity (``None``: no alignment).
    kubelet always falls back to devices outside the affinity when the affinity has too
    few; ``allow_outside=False`` refuses instead.

    Raises:
        RequestError: a negative or non-integer ``request``.
        AllocationError: kubelet's "requested number of devices unavailable" (or the
            affinity is short and ``allow_outside`` is false), with the free devices per
            NUMA node.
    """
    if isinstance(request, bool) or not isinstance(request, int) or request < 0:
        raise RequestError(f"{resource}: device request must be a non-negative number, got {request!r}")
    registry = {d.id: d for d in devices}
    levels = _levels(registry, closeness)
    aligned_resource = any(d.has_topology for d in registry.values())
    affinity = None if affinity_nodes is None or not aligned_resource else bitmask.from_nodes(affinity_nodes)

    def inside(d: str) -> bool:
        info = registry.get(d)
        return affinity is not None and info is not None and bool(info.mask & affinity)

    reuse = sorted(set(reusable))
    chosen = pack([d for d in reuse if inside(d)], request, levels)
    chosen += pack([d for d in reuse if not inside(d)], request - len(chosen), levels, chosen)
    needed = request - len(chosen)
    if needed == 0:
        return tuple(sorted(chosen))

    free = sorted(set(available) - set(chosen))
    if len(free) < needed:
        raise AllocationError(
            f"requested number of devices unavailable for {resource}. Requested: {needed}, "
            f"Available: {len(free)}; free per NUMA node: {_free_per_node(registry, free)}"
        )
    if affinity is None:
        return tuple(sorted(chosen + pack(free, needed, levels, chosen)))
    aligned = [d for d in free if inside(d)]
    chosen += pack(aligned, needed, levels, chosen)
    needed = request - len(chosen)
    if needed and not allow_outside:
        raise AllocationError(
            f"{resource}: only {len(aligned)} free device(s) on NUMA nodes {bitmask.format_mask(affinity)}, "
            f"{needed} short; free per NUMA node: {_free_per_node(registry, free)}"
        )
    without = [d for d in free if d not in registry or not registry[d].has_topology]
    chosen += pack(without, needed, levels, chosen)
    others = [d for d in free if d not in chosen and d not in without and not inside(d)]
    chosen += pack(others, request - len(chosen), levels, chosen)
    return tuple(sorted(chosen))

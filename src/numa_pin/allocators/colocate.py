"""Devices of several resources that must share a PCIe root, a NUMA node or a socket (pure).

Device plugins allocate each resource alone; GPUDirect RDMA needs the GPU and the NIC below one
PCIe root (DRA says so with ``matchAttribute``). One constraint is a :class:`Colocation`.
:func:`allocate_colocated` tries each group (a PCIe root, a node, a socket:
:func:`numa_pin.devices.pcie.group_key`) in turn, groups inside the affinity first, and takes
every resource's devices inside the first group that holds them all; :func:`in_viable_groups`
narrows the free devices hints are built from to the groups that could. Devices already
assigned (fixed) pin the group to theirs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from numa_pin.allocators.devices import allocate_devices
from numa_pin.base.record import record
from numa_pin.devices.model import DeviceInfo
from numa_pin.devices.pcie import group_key
from numa_pin.errors import AllocationError
from numa_pin.topology.model import Topology


@record
class Colocation:
    """One colocate constraint: the resources of ``wanted`` (count still to allocate) and of
    ``fixed`` (devices already assigned) must end in one ``scope`` group; ``devices`` and
    ``free`` are every resource's inventory and free ids."""

    topology: Topology
    scope: str
    wanted: Mapping[str, int]
    fixed: Mapping[str, tuple[str, ...]]
    devices: Mapping[str, tuple[DeviceInfo, ...]]
    free: Mapping[str, frozenset[str]]

    def group_keys(self) -> tuple[dict[str, dict[str, str | int | None]], set[str | int | None]]:
        """Per resource of the constraint, each device's group; and the groups of the fixed devices."""
        keys = {res: {d.id: group_key(self.topology, d.id, self.scope) for d in self.devices.get(res, ())}
                for res in {*self.wanted, *self.fixed}}
        return keys, {keys[res].get(i) for res, ids in self.fixed.items() for i in ids}


def allocate_colocated(
    constraint: Colocation,
    affinity: frozenset[int] | None,
    strict: bool,
    closeness: Mapping[str, Hashable] | None = None,
) -> dict[str, tuple[str, ...]]:
    """``{resource: ids}`` for every resource of ``constraint.wanted``, all in one group.

    Raises:
        AllocationError: no group holds them all (the message names the scope, the resources
            and what each group has free).
    """
    scope, wanted, fixed, devices, free = (constraint.scope, constraint.wanted, constraint.fixed,
                                           constraint.devices, constraint.free)
    names = sorted({*wanted, *fixed})
    keys, pinned = constraint.group_keys()
    if len(pinned) > 1 or None in pinned:
        where = ", ".join(f"{i} ({keys[r].get(i)})" for r, ids in sorted(fixed.items()) for i in ids)
        raise AllocationError(f"colocate {scope}: the devices already assigned do not share one {scope}: {where}")
    if pinned:
        candidates = list(pinned)
    else:
        counts: dict[str | int, int] = {}
        first = names[0]
        for dev_id in free.get(first, ()):
            key = keys[first].get(dev_id)
            if key is not None:
                counts[key] = counts.get(key, 0) + 1
        candidates = sorted(counts, key=lambda k: (not _inside(k, keys, devices, affinity), str(k)))
    for key in candidates:
        picked = _try(key, wanted, keys, devices, free, affinity, strict, closeness)
        if picked is not None:
            return picked
    raise no_group_holds(constraint)


def no_group_holds(constraint: Colocation) -> AllocationError:
    """The refusal of a constraint no group can hold: the scope, what is asked, and what each
    group has free of every resource of the constraint."""
    scope, wanted, fixed, free = constraint.scope, constraint.wanted, constraint.fixed, constraint.free
    names = sorted({*wanted, *fixed})
    keys, _ = constraint.group_keys()
    ask = ", ".join(f"{count} {res}" for res, count in sorted(wanted.items()))
    per = "; ".join(
        f"{key}: " + " ".join(f"{res}={sum(1 for i in free.get(res, ()) if keys[res].get(i) == key)}" for res in names)
        for key in sorted({k for res in names for k in keys[res].values() if k is not None}, key=str)
    )
    return AllocationError(f"colocate {scope}: no {scope} holds {ask}"
                           + (f" with {', '.join(sorted(fixed))}" if fixed else "") + f" (free per {scope}: {per})")


def in_viable_groups(constraint: Colocation) -> dict[str, frozenset[str]]:
    """Per resource of ``constraint.wanted``, its free devices that sit in a group holding enough free
    devices of every resource of ``wanted`` (and the fixed devices' group, if any): what the
    resource's hints should be built from, so the merged affinity lands where a group fits."""
    wanted, free = constraint.wanted, constraint.free
    keys, pinned = constraint.group_keys()
    groups = {k for res in wanted for k in keys[res].values() if k is not None}
    if pinned:
        groups &= pinned
    viable = {g for g in groups
              if all(sum(1 for i in free.get(res, ()) if keys[res].get(i) == g) >= n for res, n in wanted.items())}
    return {res: frozenset(i for i in free.get(res, ()) if keys[res].get(i) in viable) for res in wanted}


def _inside(key: Hashable, keys: Mapping[str, Mapping[str, Hashable]], devices: Mapping[str, tuple[DeviceInfo, ...]],
            affinity: frozenset[int] | None) -> bool:
    if affinity is None:
        return True
    return any(set(d.numa_nodes) & affinity for res, infos in devices.items() if res in keys
               for d in infos if keys[res].get(d.id) == key)


def _try(key: Hashable, wanted: Mapping[str, int], keys: Mapping[str, Mapping[str, Hashable]],
         devices: Mapping[str, tuple[DeviceInfo, ...]], free: Mapping[str, frozenset[str]],
         affinity: frozenset[int] | None, strict: bool,
         closeness: Mapping[str, Hashable] | None) -> dict[str, tuple[str, ...]] | None:
    out: dict[str, tuple[str, ...]] = {}
    for res, count in sorted(wanted.items()):
        here = frozenset(i for i in free.get(res, ()) if keys[res].get(i) == key)
        if len(here) < count:
            return None
        try:
            out[res] = allocate_devices(devices[res], here, count, affinity, closeness=closeness, resource=res,
                                        allow_outside=not strict)
        except AllocationError:
            return None
    return out


__all__ = ["Colocation", "allocate_colocated", "in_viable_groups", "no_group_holds"]

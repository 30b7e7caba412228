"""Devices counted per resource name: the pure half (kubelet's Device Manager on one node).

:class:`DeviceKind` is the mechanics every device kind shares: an inventory of
:class:`~numa_pin.devices.model.DeviceInfo` per resource name, hints from
:mod:`numa_pin.providers.devices`, allocation by :mod:`numa_pin.allocators.devices`, and the
devices a device plugin already chose (``fixed``: hints regenerate from exactly those, and
under ``restricted``/``single-numa-node`` they must touch the affinity). A kind overrides
:meth:`DeviceKind.inventory` (and :meth:`DeviceKind.fixed` when something names its devices
before numa-pin does).

:class:`PciDevices` is the PCI kind: the device resources of the config (``devices:``), plus
``nvidia.com/gpu`` when the config defines no such resource (:mod:`numa_pin.resources.nvidia`),
and the devices named by ``NVIDIA_VISIBLE_DEVICES``, ``PCIDEVICE_*`` and CDI, and those behind
the device nodes the container carries (:mod:`numa_pin.devices.devnode`). A device behind a node
that no configured resource lists is booked under :data:`ASSIGNED`; a node numa-pin cannot place
is a device without a hint, kept in the decision's notes (or a rejection under
``inference.strict_devices``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from numa_pin.base.record import record
from numa_pin.errors import AllocationError, RequestError, TopologyAffinityError
from numa_pin.ledger.model import Grant
from numa_pin.policy.hint import ProviderHints, ResourceHints
from numa_pin.requests.request import Amounts, ContainerRequest
from numa_pin.resources.base import Need, NodeView, Resource, nodes_text, zone_entry

#: the resource of devices someone else assigned that no configured resource lists
ASSIGNED = "numa-pin.io/assigned"

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from numa_pin.allocators.colocate import Colocation
    from numa_pin.devices.model import DeviceInfo


@record
class DeviceView:
    need: Need
    devices: Mapping[str, tuple[DeviceInfo, ...]]  # every registered device, per resource name
    free: Mapping[str, frozenset[str]]  # healthy and held by no other grant
    fixed: Mapping[str, tuple[str, ...]]  # already chosen by a device plugin
    unplaced: tuple[str, ...] = ()  # devices the container carries that numa-pin cannot place


class DeviceKind(Resource):
    """A kind of device counted per resource name (see the module doc)."""

    name = "devices"

    def involved(self, request: ContainerRequest) -> bool:
        """Whether the request may concern this kind (cheap: decides whether to take inventory)."""
        pod = request.pod_amounts
        return bool(request.amounts.devices or (pod is not None and pod.devices))

    def inventory(self, need: Need) -> Mapping[str, tuple[DeviceInfo, ...]]:
        """Every device of this kind, per resource name (in id order)."""
        return {}

    def fixed(self, need: Need, devices: Mapping[str, tuple[DeviceInfo, ...]]) -> dict[str, tuple[str, ...]]:
        """The devices something chose before numa-pin (a device plugin), per resource name."""
        return {}

    def closeness(self, need: Need) -> Mapping[str, Hashable] | None:
        """Which devices sit close to each other beyond their NUMA node (None: only that)."""
        return None

    def view(self, need: Need) -> DeviceView | None:
        if not self.involved(need.request):
            return None
        devs = self.inventory(need)
        free = {
            res: frozenset(d.id for d in infos if d.healthy) - need.state.devices_in_use(res)
            for res, infos in devs.items()
        }
        return DeviceView(need, devs, free, self.fixed(need, devs))

    def claims(self, resource: str, view: DeviceView | None) -> bool:
        return view is not None and resource in view.devices

    def wants(self, view: DeviceView | None) -> bool:
        if view is None:
            return False
        return bool(view.fixed) or any(c for r, c in view.need.request.amounts.devices.items() if r in view.devices)

    def hints(self, view: DeviceView | None, amounts: Amounts) -> ProviderHints:
        if view is None:
            return None
        from numa_pin.providers.devices import device_hint_family, device_hints

        nodes = view.need.topology.node_ids
        free = self._colocated_free(view, amounts)
        out: dict[str, ResourceHints] = {}
        for res, count in amounts.devices.items():
            if res in view.devices and count:
                out[res] = device_hint_family(view.devices[res], nodes, free[res], count)
        for res, ids in view.fixed.items():
            # already assigned by a device plugin: hints regenerate from exactly these devices
            out[res] = device_hints(view.devices.get(res, ()), nodes, frozenset(ids), len(ids))
        return out or None

    def _colocated_free(self, view: DeviceView, amounts: Amounts) -> Mapping[str, frozenset[str]]:
        """The free devices hints come from: under ``numa-pin.io/colocate``, only those in a
        group (PCIe root, node, socket) that can hold every resource of the constraint."""
        free = dict(view.free)
        for constraint in _colocations(view, amounts):
            from numa_pin.allocators.colocate import in_viable_groups

            free.update(in_viable_groups(constraint))
        return free

    def unplaceable(self, view: DeviceView | None, amounts: Amounts) -> AllocationError | None:
        """A ``numa-pin.io/colocate`` constraint no group (PCIe root, node, socket) can hold,
        whatever the affinity: the refusal best-effort's allocation gives, group by group."""
        if view is None:
            return None
        for constraint in _colocations(view, amounts):
            from numa_pin.allocators.colocate import in_viable_groups, no_group_holds

            if not all(in_viable_groups(constraint).values()):
                return no_group_holds(constraint)
        return None

    def check_inside(self, view: DeviceView | None, inside: frozenset[int]) -> None:
        """A device a device plugin already chose must touch the affinity (or have no NUMA node)."""
        if view is None:
            return
        for res, ids in view.fixed.items():
            infos = {d.id: d for d in view.devices.get(res, ())}
            for dev_id in ids:
                info = infos.get(dev_id)
                if info is not None and info.numa_nodes and not set(info.numa_nodes) & inside:
                    raise TopologyAffinityError(
                        f"{res} {dev_id} (already assigned) is on NUMA node(s) {nodes_text(frozenset(info.numa_nodes))}"
                    )

    def allocate(self, view: DeviceView | None, amounts: Amounts, affinity: frozenset[int] | None,
                 strict: bool) -> Mapping[str, Any]:
        if view is None:
            return {}
        devices: dict[str, tuple[str, ...]] = dict(view.fixed)
        wanted = _wanted(view, amounts)
        closeness = self.closeness(view.need) if any(wanted.values()) else None
        for constraint in _colocations(view, amounts):
            from numa_pin.allocators.colocate import allocate_colocated

            devices.update(allocate_colocated(constraint, affinity, strict, closeness))
        if any(c for r, c in wanted.items() if r not in devices):
            from numa_pin.allocators.devices import allocate_devices

            for res, count in wanted.items():
                if count and res not in devices:
                    devices[res] = allocate_devices(
                        view.devices[res], view.free[res], count, affinity, closeness=closeness, resource=res,
                        allow_outside=not strict,
                    )
        return {"devices": devices} if devices else {}

    def free_summary(self, view: DeviceView | None, amounts: Amounts) -> list[str]:
        """Free devices per node for every resource the request counts, then every device a
        device plugin already chose, with its NUMA node (it is not free to move)."""
        if view is None:
            return []
        parts: list[str] = []
        nodes = view.need.topology.node_ids
        for res, count in amounts.devices.items():
            if res not in view.devices:
                continue
            infos = {d.id: d for d in view.devices[res]}
            per = " ".join(f"{n}={sum(1 for i in view.free[res] if n in infos[i].numa_nodes)}" for n in nodes)
            parts.append(f"{res} {count} requested, free per node: {per}")
        for res, ids in sorted(view.fixed.items()):
            infos = {d.id: d for d in view.devices.get(res, ())}
            for dev_id in ids:
                info = infos.get(dev_id)
                where = (f"on NUMA node(s) {nodes_text(frozenset(info.numa_nodes))}"
                         if info is not None and info.numa_nodes else "on no NUMA node")
                parts.append(f"{res} {dev_id} already assigned by the device plugin, {where}")
        return parts

    def describe(self, grant: Grant) -> list[str]:
        """``<resource>=<id>,<id>`` for this kind's own resource name."""
        ids = grant.devices.get(self.name)
        return [f"{self.name}={','.join(ids)}"] if ids else []


def _wanted(view: DeviceView, amounts: Amounts) -> dict[str, int]:
    """The counts of ``amounts`` for the resources this kind has devices of."""
    return {res: count for res, count in amounts.devices.items() if res in view.devices}


def _colocations(view: DeviceView, amounts: Amounts) -> Iterator[Colocation]:
    """The request's ``numa-pin.io/colocate`` constraints that bind anything: at least two
    resources, one of them still to allocate (the others may be already assigned)."""
    wanted = _wanted(view, amounts)
    for scope, names in view.need.request.colocate:
        here = {r: wanted[r] for r in names if wanted.get(r) and r not in view.fixed}
        pinned = {r: view.fixed[r] for r in names if r in view.fixed}
        if here and len(here) + len(pinned) >= 2:
            from numa_pin.allocators.colocate import Colocation

            yield Colocation(view.need.topology, scope, here, pinned, view.devices, view.free)


class PciDevices(DeviceKind):
    """PCI devices: the config's device resources and NVIDIA's GPUs (see the module doc)."""

    name = "pci"

    def involved(self, request: ContainerRequest) -> bool:
        return bool(request.fixed_gpus or request.fixed_pci or request.fixed_cdi or request.fixed_nodes) \
            or super().involved(request)

    def view(self, need: Need) -> DeviceView | None:
        view = super().view(need)
        if view is None or not need.request.fixed_nodes:
            return view
        from numa_pin.devices.devnode import functions_of
        from numa_pin.devices.model import DeviceInfo

        devices = dict(view.devices)
        fixed = {r: list(ids) for r, ids in view.fixed.items()}
        unplaced: list[str] = []
        for node in need.request.fixed_nodes:
            addresses, why = functions_of(node, need.topology)
            if why:
                unplaced.append(f"{node.label}: {why}")
            for addr in addresses:
                res = next((r for r, infos in devices.items() if any(i.id == addr for i in infos)), ASSIGNED)
                if res == ASSIGNED and not any(i.id == addr for i in devices.get(ASSIGNED, ())):
                    dev = need.topology.device(addr)
                    numa = () if dev is None or dev.numa_node is None else (dev.numa_node,)
                    devices[ASSIGNED] = (*devices.get(ASSIGNED, ()), DeviceInfo(addr, numa, True))
                fixed.setdefault(res, []).append(addr)
        unplaced = list(dict.fromkeys(unplaced))
        if unplaced and need.request.strict_devices:
            raise RequestError(f"cannot place {unplaced[0]}" + (f" (and {len(unplaced) - 1} more)" if len(unplaced) > 1
                                                                  else ""), annotation="inference.strict_devices")
        free = dict(view.free)
        if ASSIGNED in devices:
            free[ASSIGNED] = frozenset(d.id for d in devices[ASSIGNED])
        return DeviceView(need, devices, free, {r: tuple(dict.fromkeys(a)) for r, a in fixed.items()},
                          tuple(unplaced))

    def notes(self, view: DeviceView | None) -> list[str]:
        """Why a device the container carries is not aligned to."""
        return [f"not aligned: {u}" for u in view.unplaced] if view is not None else []

    def inventory(self, need: Need) -> Mapping[str, tuple[DeviceInfo, ...]]:
        from numa_pin.devices.inventory import inventory
        from numa_pin.resources.nvidia import with_default_gpus

        return with_default_gpus(need.topology, inventory(need.topology, need.settings.device_resources))

    def fixed(self, need: Need, devices: Mapping[str, tuple[DeviceInfo, ...]]) -> dict[str, tuple[str, ...]]:
        from numa_pin.resources.nvidia import fixed_cdi, fixed_gpus

        request = need.request
        fixed: dict[str, list[str]] = {}
        for res, addr in fixed_gpus(request.fixed_gpus, need.topology, devices):
            fixed.setdefault(res, []).append(addr)
        for suffix, addrs in request.fixed_pci.items():
            matched = next((r for r in devices if r.replace(".", "_").replace("/", "_").upper() == suffix), None)
            if matched is None:
                raise RequestError(f"no configured device resource matches {suffix!r}",
                                   annotation="PCIDEVICE_" + suffix)
            known = {d.id for d in devices[matched]}
            for addr in addrs:
                if addr not in known:
                    raise RequestError(f"device {addr} is not a {matched} device", annotation="PCIDEVICE_" + suffix)
            fixed.setdefault(matched, []).extend(addrs)
        for res, addr in fixed_cdi(request.fixed_cdi, need.topology, devices):
            fixed.setdefault(res, []).append(addr)
        return {r: tuple(dict.fromkeys(a)) for r, a in fixed.items()}

    def describe(self, grant: Grant) -> list[str]:
        """``<resource>=<id>,<id>`` for every device resource of the grant."""
        return [f"{res}={','.join(ids)}" for res, ids in sorted(grant.devices.items())]

    def zones(self, node: NodeView) -> Mapping[int, list[dict[str, str]]]:
        """Every configured device resource: its devices on the node; minus unhealthy ones; minus
        granted ones. Devices without a NUMA node belong to no zone."""
        out: dict[int, list[dict[str, str]]] = {}
        for n in node.topology.node_ids:
            out[n] = []
            for res in sorted(node.devices):
                here = [d for d in node.devices[res] if n in d.numa_nodes]
                healthy = {d.id for d in here if d.healthy}
                out[n].append(zone_entry(res, len(here), len(healthy), len(healthy - node.state.devices_in_use(res))))
        return out

    def closeness(self, need: Need) -> Mapping[str, Hashable] | None:
        from numa_pin.devices.inventory import parent_keys

        return parent_keys(need.topology)


__all__ = ["DeviceKind", "DeviceView", "PciDevices"]

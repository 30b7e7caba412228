"""Device resources: named sets of discovered PCI devices chosen by selectors (pure).

A :class:`DeviceResource` (``nvidia.com/gpu``, ``intel.com/sriov_netdevice``) owns the PCI
functions that ANY of its selectors (:class:`numa_pin.devices.selector.Selector`, the type
the config builds) match; inside one selector every given field must match and the values
of one field are alternatives (the model of the SR-IOV network device plugin's
``selectors``); :func:`selector_matches` decides. :func:`inventory` turns a
:class:`~numa_pin.topology.model.Topology` into the registered devices of every resource,
the input of :mod:`numa_pin.providers.devices`.

Rules:

* A device belongs to at most one resource: the first resource, in the order given, whose
  selectors match it. So a device is never granted twice under two names.
* A physical function whose virtual functions a VF selector (``is_vf=True``) matches is
  never handed out as a whole device, by any resource: its VFs are.
* Health: a device is healthy when a driver is bound to it, unless the resource says
  ``require_driver=False`` (e.g. devices a workload binds itself). Unhealthy devices stay
  registered: kubelet counts them for the preferred mask size but never hands them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from numa_pin.base import pciaddr
from numa_pin.base.record import record
from numa_pin.devices.model import DeviceInfo
from numa_pin.devices.selector import Selector, check_resource_name
from numa_pin.errors import ConfigError
from numa_pin.topology.model import PciDevice, Topology


def selector_matches(selector: Selector, device: PciDevice, topology: Topology | None = None) -> bool:
    """Does ``device`` match ``selector``? ``topology`` is needed for ``pf_names`` on VFs (the PF's netdev)."""
    if selector.vendors and _sysfs_hex(device.vendor) not in selector.vendors:
        return False
    if selector.devices and _sysfs_hex(device.device) not in selector.devices:
        return False
    if selector.classes:
        code = _sysfs_hex(device.pci_class) or ""
        if not any(code.startswith(prefix) for prefix in selector.classes):
            return False
    if selector.drivers and device.driver not in selector.drivers:
        return False
    if selector.addresses and _address(device.address) not in selector.addresses:
        return False
    if selector.is_vf is not None and device.is_vf != selector.is_vf:
        return False
    if selector.has_netdev is not None and bool(device.netdevs) != selector.has_netdev:
        return False
    return not selector.pf_names or _pf_name_matches(selector, device, topology)


def _pf_name_matches(selector: Selector, device: PciDevice, topology: Topology | None) -> bool:
    vf_index: int | None = None
    if device.is_vf:
        pf = topology.device(device.physfn) if topology is not None and device.physfn else None
        if pf is None:
            return False
        names = pf.netdevs
        vf_index = pf.vfs.index(device.address) if device.address in pf.vfs else None
    else:
        names = device.netdevs
    for pattern in selector.pf_name_patterns():
        if pattern.name not in names:
            continue
        if pattern.ranges is None:
            return True
        if vf_index is not None and pattern.takes_vf(vf_index):
            return True
    return False


def _sysfs_hex(value: str | None) -> str | None:
    """A sysfs id (``0x10de``, ``0x030200``) in the selector's form: lower case, ``0x`` prefix."""
    return None if value is None else "0x" + value.strip().lower().removeprefix("0x")


def _address(address: str) -> str:
    try:
        return pciaddr.normalise(address)
    except ValueError:
        return address  # matches no selector address: those are all valid


@record
class DeviceResource:
    """A named device resource. ``name`` is ``domain/name`` as in Kubernetes extended resources."""

    name: str
    selectors: tuple[Selector, ...]
    require_driver: bool = True

    def __post_init__(self) -> None:
        key = f"devices.{self.name}"
        check_resource_name(self.name)
        selectors = tuple(self.selectors) if isinstance(self.selectors, Iterable) else ()
        if not selectors or not all(isinstance(s, Selector) for s in selectors):
            raise ConfigError("needs at least one selector", key=key)
        object.__setattr__(self, "selectors", selectors)
        if not isinstance(self.require_driver, bool):
            raise ConfigError(f"require_driver must be true or false, got {self.require_driver!r}", key=key)

    def matches(self, device: PciDevice, topology: Topology | None = None) -> bool:
        return any(selector_matches(s, device, topology) for s in self.selectors)


def inventory(topology: Topology, resources: Sequence[DeviceResource]) -> dict[str, tuple[DeviceInfo, ...]]:
    """The registered devices of every resource (in PCI address order), as
    :class:`~numa_pin.providers.devices.DeviceInfo`: id = PCI address, NUMA node = the
    discovered one (none when unknown), health as the module docstring says. Every resource
    gets an entry, possibly empty.

    Raises:
        ConfigError: two resources share a name.
    """
    names = [r.name for r in resources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"device resource {duplicates[0]!r} is defined twice", key=f"devices.{duplicates[0]}")
    pci = sorted(topology.pci_devices, key=lambda d: d.address)
    split_pfs = {
        d.physfn
        for r in resources
        for s in r.selectors
        if s.is_vf
        for d in pci
        if d.is_vf and selector_matches(s, d, topology)
    }
    claimed: set[str] = set()
    out: dict[str, tuple[DeviceInfo, ...]] = {}
    for resource in resources:
        mine = []
        for d in pci:
            if d.address in claimed or d.address in split_pfs or not resource.matches(d, topology):
                continue
            claimed.add(d.address)
            nodes = () if d.numa_node is None or d.numa_node < 0 else (d.numa_node,)
            mine.append(DeviceInfo(d.address, nodes, d.driver is not None or not resource.require_driver))
        out[resource.name] = tuple(mine)
    return out


def parent_keys(topology: Topology) -> dict[str, str]:
    """``{address: key}`` for :func:`numa_pin.allocators.devices.allocate_devices` closeness.

    The key is the top of the device's PCIe tree as discovery saw it: the highest upstream
    bridge reached by following ``parent`` (a root port, above any switch). Devices sharing
    it sit under one root port / switch and reach each other without crossing the host
    bridge. A VF takes its PF's key (its PF when the PF has no parent). Devices with no
    parent are left out.
    """
    by_address: Mapping[str, PciDevice] = {d.address: d for d in topology.pci_devices}

    def top(address: str) -> str:
        seen = {address}
        current = address
        while True:
            device = by_address.get(current)
            if device is None or device.parent is None or device.parent in seen:
                return current
            seen.add(device.parent)
            current = device.parent

    out: dict[str, str] = {}
    for d in topology.pci_devices:
        if d.is_vf and d.physfn is not None:
            pf = by_address.get(d.physfn)
            out[d.address] = top(pf.parent) if pf is not None and pf.parent is not None else d.physfn
        elif d.parent is not None:
            out[d.address] = top(d.parent)
    return out


__all__ = ["DeviceResource", "Selector", "check_resource_name", "inventory", "parent_keys", "selector_matches"]

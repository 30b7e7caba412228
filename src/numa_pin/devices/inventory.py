"""Device resources: named sets of discovered PCI devices chosen by selectors (pure).

A :class:`DeviceResource` (``nvidia.com/gpu``, ``intel.com/sriov_netdevice``) owns the PCI
functions that ANY of its :class:`Selector` s match; inside one selector every given field
must match and the values of one field are alternatives (the model of the SR-IOV network
device plugin's ``selectors``). :func:`inventory` turns a
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

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from numa_pin.errors import ConfigError
from numa_pin.devices.model import DeviceInfo
from numa_pin.topology.model import PciDevice, Topology

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_HEX = re.compile(r"[0-9a-f]+")
_ADDRESS = re.compile(r"(?:[0-9a-f]{4,}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_PF_NAME = re.compile(r"(?P<name>[^#\s]+)(?:#(?P<ranges>[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*))?")


def _strings(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise ConfigError(f"expected a list of strings, got {value!r}", key=key)
    out = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"expected a non-empty string, got {item!r}", key=key)
        out.append(item.strip())
    return tuple(out)


def _hex(value: str, key: str) -> str:
    text = value.lower().removeprefix("0x")
    if not _HEX.fullmatch(text):
        raise ConfigError(f"{value!r} is not a hexadecimal id", key=key)
    return text


def normalize_address(address: str) -> str:
    """``"3B:00.0"`` -> ``"0000:3b:00.0"`` (lower case, PCI domain 0000 when missing)."""
    text = address.strip().lower()
    return text if text.count(":") >= 2 else "0000:" + text


@dataclass(frozen=True)
class Selector:
    """Which PCI functions a resource takes. Empty fields are not checked.

    ``vendors`` / ``devices``: ids as sysfs prints them (``"0x10de"``; ``"10de"`` works too);
    ``classes``: prefixes of the class code (``"0x0302"`` = 3D controllers, ``"0x02"`` =
    network controllers); ``drivers``: bound driver names; ``pf_names``: netdev name of the
    PF for a VF, or the function's own netdev otherwise, optionally with VF index ranges
    (``"ens2f0#0-3,6"``, VFs only); ``is_vf`` / ``has_netdev``: required when not ``None``;
    ``addresses``: PCI addresses.
    """

    vendors: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    pf_names: tuple[str, ...] = ()
    is_vf: bool | None = None
    has_netdev: bool | None = None
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        key = "devices.selectors"
        for name in ("vendors", "devices", "classes"):
            values = tuple(_hex(v, f"{key}.{name}") for v in _strings(getattr(self, name), f"{key}.{name}"))
            object.__setattr__(self, name, values)
        object.__setattr__(self, "drivers", _strings(self.drivers, f"{key}.drivers"))
        pf_names = _strings(self.pf_names, f"{key}.pf_names")
        for pattern in pf_names:
            if not _PF_NAME.fullmatch(pattern):
                raise ConfigError(f"{pattern!r} is not a netdev name or name#ranges", key=f"{key}.pf_names")
        object.__setattr__(self, "pf_names", pf_names)
        addresses = tuple(normalize_address(a) for a in _strings(self.addresses, f"{key}.addresses"))
        for address in addresses:
            if not _ADDRESS.fullmatch(address):
                raise ConfigError(f"{address!r} is not a PCI address", key=f"{key}.addresses")
        object.__setattr__(self, "addresses", addresses)
        for name in ("is_vf", "has_netdev"):
            if getattr(self, name) not in (None, True, False):
                raise ConfigError(f"must be true, false or unset, got {getattr(self, name)!r}", key=f"{key}.{name}")
        if all(not getattr(self, f.name) and getattr(self, f.name) is not False for f in fields(self)):
            raise ConfigError("an empty selector would take every PCI device; give at least one field", key=key)

    def matches(self, device: PciDevice, topology: Topology | None = None) -> bool:
        """Does ``device`` match? ``topology`` is needed for ``pf_names`` on VFs (the PF's netdev)."""
        if self.vendors and _hex_or_none(device.vendor) not in self.vendors:
            return False
        if self.devices and _hex_or_none(device.device) not in self.devices:
            return False
        if self.classes:
            code = _hex_or_none(device.pci_class) or ""
            if not any(code.startswith(prefix) for prefix in self.classes):
                return False
        if self.drivers and device.driver not in self.drivers:
            return False
        if self.addresses and normalize_address(device.address) not in self.addresses:
            return False
        if self.is_vf is not None and device.is_vf != self.is_vf:
            return False
        if self.has_netdev is not None and bool(device.netdevs) != self.has_netdev:
            return False
        return not self.pf_names or self._pf_name_matches(device, topology)

    def _pf_name_matches(self, device: PciDevice, topology: Topology | None) -> bool:
        vf_index: int | None = None
        if device.is_vf:
            pf = topology.device(device.physfn) if topology is not None and device.physfn else None
            if pf is None:
                return False
            names = pf.netdevs
            vf_index = pf.vfs.index(device.address) if device.address in pf.vfs else None
        else:
            names = device.netdevs
        for pattern in self.pf_names:
            match = _PF_NAME.fullmatch(pattern)
            if match is None or match.group("name") not in names:
                continue
            ranges = match.group("ranges")
            if ranges is None:
                return True
            if vf_index is not None and _in_ranges(vf_index, ranges):
                return True
        return False


def _hex_or_none(value: str | None) -> str | None:
    return None if value is None else value.strip().lower().removeprefix("0x")


def _in_ranges(index: int, ranges: str) -> bool:
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if int(low) <= index <= int(high or low):
            return True
    return False


@dataclass(frozen=True)
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
        return any(s.matches(device, topology) for s in self.selectors)


def check_resource_name(name: object) -> str:
    """Validate ``domain/name`` (``nvidia.com/gpu``): a DNS subdomain outside ``kubernetes.io``,
    and a name of at most 63 letters, digits, ``-``, ``_``, ``.``.

    Raises:
        ConfigError: anything else.
    """
    key = f"devices.{name}"
    if not isinstance(name, str) or name.count("/") != 1:
        raise ConfigError(f"resource name {name!r} must look like vendor.example/name", key=key)
    domain, short = name.split("/")
    if len(domain) > 253 or not _DOMAIN.fullmatch(domain):
        raise ConfigError(f"{domain!r} is not a DNS domain (lower case)", key=key)
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ConfigError("the kubernetes.io domain is reserved for native resources", key=key)
    if len(short) > 63 or not _NAME.fullmatch(short):
        raise ConfigError(f"{short!r} is not a resource name (letters, digits, -, _, .; at most 63)", key=key)
    return name


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
        if d.is_vf and s.matches(d, topology)
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

"""PCI functions from ``bus/pci/devices`` and their NUMA locality.

Each entry of ``<sysfs>/bus/pci/devices`` is a symlink into ``devices/pci<domain>:<bus>/...``;
attributes are read from the resolved directory. Optional attributes that are absent give
the fallback listed in :func:`read_device`; present-but-garbage ones raise
:class:`~numa_pin.errors.SysfsError` naming the file.

NUMA node resolution (:meth:`Locality.node_of`), in order:

1. ``numa_node`` when it is >= 0 and names an online node;
2. the node owning every known CPU of ``local_cpulist`` (``local_cpus`` mask when the list
   is absent), only when those CPUs all lie in exactly one node;
3. the parent bridge's node, resolved the same way (recursively up the device path);
4. ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from numa_pin.base import pciaddr
from numa_pin.errors import SysfsError
from numa_pin.topology.model import KIND_GPU, KIND_NIC, KIND_OTHER, KIND_RDMA, NumaNode, PciDevice
from numa_pin.topology.sysfs import SysfsReader, parse_int, parse_key_values

PCI_DEVICES_DIR = "bus/pci/devices"
#: per-GPU file of the NVIDIA kernel driver, relative to the proc root
NVIDIA_INFO = "driver/nvidia/gpus/{address}/information"

_VIRTFN_RE = re.compile(r"virtfn(\d+)")
#: child devices that hold a function's network interface (virtio-net: ``virtioN/net``)
_NET_PARENT_RE = re.compile(r"virtio\d+")


def is_pci_address(name: str) -> bool:
    """True for a PCI function address such as ``0000:3b:00.0`` (pure)."""
    return pciaddr.is_address(name)


def classify(pci_class: str) -> str:
    """Device kind from a sysfs class string (pure).

    ``0x03xxxx`` (display controller) -> ``"gpu"``, ``0x0200xx`` (Ethernet controller)
    -> ``"nic"``, ``0x0207xx`` (InfiniBand controller: a ConnectX in IB mode) -> ``"rdma"``,
    anything else -> ``"other"``. Raises ValueError for non-hex text.
    """
    value = int(pci_class, 16)
    if value >> 16 == 0x03:
        return KIND_GPU
    if value >> 8 == 0x0200:
        return KIND_NIC
    if value >> 8 == 0x0207:
        return KIND_RDMA
    return KIND_OTHER


def parse_nvidia_information(text: str) -> tuple[str, int]:
    """``(GPU UUID, device minor)`` from ``/proc/driver/nvidia/gpus/<bdf>/information``.

    Lines other than ``Key: value`` are ignored (driver versions add free text). Raises
    ValueError when either key is missing, the UUID does not look like ``GPU-<id>`` or
    the minor is not a non-negative integer.
    """
    info = parse_key_values(text, strict=False)
    uuid = info.get("GPU UUID")
    minor_text = info.get("Device Minor")
    if uuid is None or minor_text is None:
        raise ValueError("expected 'GPU UUID' and 'Device Minor' lines")
    if not uuid.startswith("GPU-") or len(uuid) <= len("GPU-") or " " in uuid:
        raise ValueError(f"bad GPU UUID {uuid!r}")
    minor = parse_int(minor_text)
    if minor < 0:
        raise ValueError(f"negative Device Minor {minor}")
    return uuid, minor


class Locality:
    """Resolves the NUMA node and local CPUs of PCI device directories, with memoisation.

    ``nodes`` are the machine's online nodes; their CPU sets decide the
    ``local_cpulist`` fallback.
    """

    def __init__(self, reader: SysfsReader, nodes: Mapping[int, NumaNode]) -> None:
        self._reader = reader
        self._nodes = nodes
        self._cpu_node = {cpu: n.id for n in nodes.values() for cpu in n.cpus}
        self._memo: dict[Path, int | None] = {}

    def local_cpus(self, dev_dir: Path) -> frozenset[int]:
        """``local_cpulist`` (else the ``local_cpus`` mask, else empty) of ``dev_dir``.

        Raises SysfsError when the file present is garbage.
        """
        r = self._reader
        if r.exists(dev_dir / "local_cpulist"):
            return r.read_list(dev_dir / "local_cpulist")
        if r.exists(dev_dir / "local_cpus"):
            return r.read_mask(dev_dir / "local_cpus")
        return frozenset()

    def node_of(self, dev_dir: Path) -> int | None:
        """The resolved NUMA node of the PCI function at ``dev_dir`` (see module doc).

        Raises SysfsError when ``numa_node`` or ``local_cpulist`` here or in a parent
        bridge is garbage.
        """
        if dev_dir not in self._memo:
            self._memo[dev_dir] = self._resolve(dev_dir)
        return self._memo[dev_dir]

    def _resolve(self, dev_dir: Path) -> int | None:
        r = self._reader
        raw = r.read_int(dev_dir / "numa_node") if r.exists(dev_dir / "numa_node") else -1
        if raw >= 0 and raw in self._nodes:
            return raw
        known = [c for c in self.local_cpus(dev_dir) if c in self._cpu_node]
        owners = {self._cpu_node[c] for c in known}
        if len(owners) == 1:
            return owners.pop()
        parent = parent_function(dev_dir)
        return self.node_of(parent) if parent is not None else None


def parent_function(dev_dir: Path) -> Path | None:
    """The upstream PCI function directory of ``dev_dir`` (pure), or None at a root bus."""
    parent = dev_dir.parent
    return parent if is_pci_address(parent.name) else None


def discover_pci(
    reader: SysfsReader,
    nodes: Mapping[int, NumaNode],
    proc: SysfsReader | None = None,
) -> tuple[PciDevice, ...]:
    """Every PCI function of ``bus/pci/devices``, ordered by address.

    A missing ``bus/pci/devices`` directory (no PCI bus) gives ``()``. ``proc`` is the
    proc root used for NVIDIA GPU identity; None skips it. Raises SysfsError naming the
    file for a dangling link or garbage attribute.
    """
    if not reader.is_dir(PCI_DEVICES_DIR):
        return ()
    locality = Locality(reader, nodes)
    return tuple(
        read_device(reader, address, locality, proc)
        for address in reader.listdir(PCI_DEVICES_DIR)
        if is_pci_address(address)
    )


def read_device(
    reader: SysfsReader,
    address: str,
    locality: Locality,
    proc: SysfsReader | None = None,
) -> PciDevice:
    """Read one PCI function ``address`` (an entry of ``bus/pci/devices``).

    Required: the entry link, ``vendor``, ``device``, ``class``. Optional, with their
    fallbacks: ``driver`` link (None), ``iommu_group`` link (None), ``net/`` and
    ``virtioN/net/`` (no netdevs),
    ``sriov_totalvfs``/``sriov_numvfs`` (None), ``virtfnN`` links (no VFs), ``physfn``
    link (None), ``numa_node`` (-1, then the locality fallbacks), ``local_cpulist``
    (empty), NVIDIA ``information`` (UUID and minor None). Raises SysfsError naming the
    file for a missing required file, a dangling link or garbage content.
    """
    dev = reader.read_link(f"{PCI_DEVICES_DIR}/{address}")
    pci_class = reader.read_hex_str(dev / "class")
    parent = parent_function(dev)
    gpu_uuid, gpu_minor = _nvidia_identity(proc, address)
    return PciDevice(
        address=address,
        vendor=reader.read_hex_str(dev / "vendor"),
        device=reader.read_hex_str(dev / "device"),
        pci_class=pci_class,
        numa_node=locality.node_of(dev),
        driver=_optional_link_name(reader, dev / "driver"),
        iommu_group=_iommu_group(reader, dev),
        kind=classify(pci_class),
        netdevs=_netdevs(reader, dev),
        physfn=_optional_link_name(reader, dev / "physfn"),
        vfs=_virtfns(reader, dev),
        sriov_totalvfs=_optional_int(reader, dev / "sriov_totalvfs"),
        sriov_numvfs=_optional_int(reader, dev / "sriov_numvfs"),
        parent=parent.name if parent is not None else None,
        local_cpus=locality.local_cpus(dev),
        gpu_uuid=gpu_uuid,
        gpu_minor=gpu_minor,
    )


def _netdevs(reader: SysfsReader, dev: Path) -> tuple[str, ...]:
    """Interface names under ``net/``, and under ``virtioN/net/`` for virtio-net functions."""
    names: list[str] = []
    for parent in (dev, *(dev / n for n in reader.listdir(dev) if _NET_PARENT_RE.fullmatch(n))):
        if reader.is_dir(parent / "net"):
            names.extend(reader.listdir(parent / "net"))
    return tuple(sorted(names))


def _optional_link_name(reader: SysfsReader, path: Path) -> str | None:
    return reader.read_link_name(path) if reader.exists(path) else None


def _optional_int(reader: SysfsReader, path: Path) -> int | None:
    return reader.read_int(path) if reader.exists(path) else None


def _iommu_group(reader: SysfsReader, dev: Path) -> int | None:
    name = _optional_link_name(reader, dev / "iommu_group")
    if name is None:
        return None
    if not name.isdigit():
        raise SysfsError(
            dev / "iommu_group", f"garbage content: group name {name!r} is not a number"
        )
    return int(name)


def _virtfns(reader: SysfsReader, dev: Path) -> tuple[str, ...]:
    links = sorted(
        (int(m.group(1)), name) for name in reader.listdir(dev) if (m := _VIRTFN_RE.fullmatch(name))
    )
    return tuple(reader.read_link_name(dev / name) for _, name in links)


def _nvidia_identity(proc: SysfsReader | None, address: str) -> tuple[str | None, int | None]:
    if proc is None:
        return None, None
    rel = NVIDIA_INFO.format(address=address)
    if not proc.exists(rel):
        return None, None
    try:
        return parse_nvidia_information(proc.read_str(rel))
    except ValueError as exc:
        raise SysfsError(proc.path(rel), f"garbage content: {exc}") from None


__all__ = [
    "Locality",
    "classify",
    "discover_pci",
    "is_pci_address",
    "parse_nvidia_information",
    "parent_function",
    "read_device",
]

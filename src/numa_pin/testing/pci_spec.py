"""PCI functions of a fake machine, declared: :class:`PciSpec` and its :class:`VfSpec` VFs.

Pure values; invalid ones raise :class:`numa_pin.errors.TopologyError` from the constructors.
Where a function sits among the machine's nodes is :class:`~numa_pin.testing.spec.MachineSpec`'s
business (``pci_local_cpus``, ``pci_expected_node``); the functions as a tree are checked here
(:func:`check_pci_tree`).
"""

from __future__ import annotations

import re

from numa_pin.base import pciaddr
from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import record
from numa_pin.errors import TopologyError

#: PCI classes (as sysfs prints them) used by the shapes and the tests
CLASS_VGA = "0x030000"
CLASS_3D = "0x030200"
CLASS_ETHERNET = "0x020000"
#: an InfiniBand controller (a ConnectX HCA in IB mode)
CLASS_INFINIBAND = "0x020700"
CLASS_NVME = "0x010802"
CLASS_PCI_BRIDGE = "0x060400"

_HEX16_RE = re.compile(r"^0x[0-9a-f]{4}$")
_CLASS_RE = re.compile(r"^0x[0-9a-f]{6}$")
_DEV_NODE_RE = re.compile(r"^[a-z_]+/[A-Za-z0-9_-]+=\d+:\d+$")
#: the virtual character devices the kernel has without any PCI function (``/dev/vfio/vfio``,
#: ``/dev/infiniband/rdma_cm``), written beside any function's ``dev_nodes``
VIRTUAL_DEV_NODES = ("misc/vfio=10:196", "misc/rdma_cm=10:58")
#: the (dynamic) major the kit gives VFIO group devices, ``/dev/vfio/<group>`` = this:<group>
VFIO_GROUP_MAJOR = 509


@record
class VfSpec:
    """One SR-IOV virtual function of a :class:`PciSpec` physical function.

    ``driver=None`` leaves the VF unbound; ``netdev=None`` gives it no network interface
    (as with ``vfio-pci``). ``iommu_group=None`` gets the next free group number.
    """

    address: str
    netdev: str | None = None
    driver: str | None = "iavf"
    iommu_group: int | None = None

    def __post_init__(self) -> None:
        check_address(self.address, "VF")


@record
class PciSpec:
    """One PCI function and where it sits.

    ``numa_node`` is what ``numa_node`` prints (``-1``: firmware gave no proximity).
    ``local_cpulist`` overrides ``local_cpus``/``local_cpulist``; by default they are the
    node's CPUs, or every online CPU when ``numa_node`` is ``-1`` (what x86 Linux prints).
    ``parent`` is the address of the upstream bridge (another :class:`PciSpec` of class
    ``0x0604xx``) or ``None`` for a function on a root bus (``/sys/devices/pciDDDD:BB``).
    ``sriov_numvfs`` defaults to ``len(vfs)``. ``gpu_uuid``/``gpu_minor`` write
    ``/proc/driver/nvidia/gpus/<address>/information``. ``dev_nodes`` are the character devices
    of the function's drivers, ``"<class>/<name>=<major>:<minor>"`` (``"drm/renderD128=226:128"``,
    ``"infiniband_verbs/uverbs0=231:192"``): each gets its directory with a ``dev`` file below
    the function and its ``/sys/dev/char/<major>:<minor>`` link, as the kernel lays them out.
    """

    address: str
    vendor: str
    device: str
    pci_class: str
    numa_node: int = -1
    driver: str | None = None
    netdevs: tuple[str, ...] = ()
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    vfs: tuple[VfSpec, ...] = ()
    vf_device: str | None = None  # VF device id; defaults to ``device``
    parent: str | None = None
    iommu_group: int | None = None
    local_cpulist: str | None = None
    gpu_uuid: str | None = None
    gpu_minor: int | None = None
    model: str = ""
    subsystem_vendor: str | None = None  # defaults to ``vendor``
    subsystem_device: str = "0x0000"
    revision: str = "0x01"
    link_speed: str = "16.0 GT/s PCIe"
    link_width: int = 16
    dev_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_address(self.address, "PCI function")
        for node in self.dev_nodes:
            if not _DEV_NODE_RE.match(node):
                raise TopologyError(f"{self.address}: device node {node!r} is not like 'drm/renderD128=226:128'")
        for label, value in (("vendor", self.vendor), ("device", self.device)):
            if not _HEX16_RE.match(value):
                raise TopologyError(f"{self.address}: {label} {value!r} is not like '0x10de'")
        if not _CLASS_RE.match(self.pci_class):
            raise TopologyError(f"{self.address}: class {self.pci_class!r} is not like '0x030200'")
        if self.numa_node < -1:
            raise TopologyError(f"{self.address}: numa_node {self.numa_node} < -1")
        if self.parent is not None:
            check_address(self.parent, f"{self.address}: parent")
        if self.vfs and not self.sriov_totalvfs:
            raise TopologyError(f"{self.address}: VFs listed but sriov_totalvfs is not set")
        if self.sriov_totalvfs is not None and self.numvfs > self.sriov_totalvfs:
            raise TopologyError(f"{self.address}: sriov_numvfs exceeds sriov_totalvfs")
        if self.sriov_numvfs is not None and self.sriov_numvfs != len(self.vfs):
            raise TopologyError(
                f"{self.address}: sriov_numvfs {self.sriov_numvfs} but {len(self.vfs)} VFs listed"
            )
        if self.local_cpulist is not None:
            try:
                parse_list(self.local_cpulist)
            except ValueError as exc:
                raise TopologyError(f"{self.address}: local_cpulist: {exc}") from None

    @property
    def numvfs(self) -> int:
        return len(self.vfs)

    @property
    def is_bridge(self) -> bool:
        return self.pci_class.startswith("0x0604")

    @property
    def bus(self) -> int:
        return addr_parts(self.address)[1]

    @property
    def domain(self) -> int:
        return addr_parts(self.address)[0]


def _canonical(address: str) -> pciaddr.PciAddress | None:
    """The parsed address when ``address`` is already in sysfs's canonical form, else None."""
    try:
        parsed = pciaddr.parse(address, domain_optional=False)
    except ValueError:
        return None
    return parsed if str(parsed) == address else None


def addr_parts(address: str) -> tuple[int, int, int, int]:
    parsed = _canonical(address)
    if parsed is None:
        raise TopologyError(f"PCI address {address!r} is not like '0000:3b:00.0'")
    return (parsed.domain, parsed.bus, parsed.device, parsed.function)


def dev_node_parts(node: str) -> tuple[str, str, str]:
    """``("drm", "renderD128", "226:128")`` from ``"drm/renderD128=226:128"``."""
    where, _, numbers = node.partition("=")
    cls, _, name = where.partition("/")
    return cls, name, numbers


def check_address(address: str, what: str) -> None:
    if _canonical(address) is None:
        raise TopologyError(f"{what} address {address!r} is not like '0000:3b:00.0' (lower case)")


def pci_iommu_groups(pci: tuple[PciSpec, ...], iommu: bool) -> dict[str, int]:
    """IOMMU group per PCI address: the declared one, else (with ``iommu``) the lowest
    number not declared or handed out yet, in ``pci`` order (each PF, then its VFs)."""
    functions: list[tuple[str, int | None]] = []
    for p in pci:
        functions.append((p.address, p.iommu_group))
        functions.extend((v.address, v.iommu_group) for v in p.vfs)
    taken = {g for _, g in functions if g is not None}
    out: dict[str, int] = {}
    nxt = 0
    for address, wanted in functions:
        if wanted is None:
            if not iommu:
                continue
            while nxt in taken:
                nxt += 1
            taken.add(nxt)
            wanted = nxt
        out[address] = wanted
    return out


def check_pci_tree(pci: tuple[PciSpec, ...], what: str) -> None:
    """The functions of one machine (``what`` names it) as a tree: addresses, IOMMU groups and
    netdevs used once, every ``parent`` a declared bridge on a lower bus, no parent loop.

    Where the functions sit among the nodes is checked by the machine. Raises TopologyError.
    """
    seen: set[str] = set()
    groups: set[int] = set()
    netdevs: set[str] = set()
    by_addr = {p.address: p for p in pci}
    for dev in pci:
        for addr in (dev.address, *(vf.address for vf in dev.vfs)):
            if addr in seen:
                raise TopologyError(f"{what}: PCI address {addr} used twice")
            seen.add(addr)
        for grp in (dev.iommu_group, *(vf.iommu_group for vf in dev.vfs)):
            if grp is not None:
                if grp in groups:
                    raise TopologyError(f"{what}: iommu group {grp} used twice")
                groups.add(grp)
        for nd in (*dev.netdevs, *(vf.netdev for vf in dev.vfs if vf.netdev)):
            if nd in netdevs or nd == "lo":
                raise TopologyError(f"{what}: netdev {nd} used twice")
            netdevs.add(nd)
        if dev.parent is not None:
            parent = by_addr.get(dev.parent)
            if parent is None or not parent.is_bridge:
                raise TopologyError(f"{dev.address}: parent {dev.parent} is not a declared bridge")
            if dev.domain != parent.domain or dev.bus <= parent.bus:
                raise TopologyError(f"{dev.address}: bus must be below its parent {dev.parent}")
    for dev in pci:  # cycles
        hops, cur = 0, dev
        while cur.parent is not None:
            cur = by_addr[cur.parent]
            hops += 1
            if hops > len(pci):
                raise TopologyError(f"{dev.address}: parent chain loops")


__all__ = [
    "CLASS_3D",
    "CLASS_ETHERNET",
    "CLASS_INFINIBAND",
    "CLASS_NVME",
    "CLASS_PCI_BRIDGE",
    "CLASS_VGA",
    "PciSpec",
    "VfSpec",
    "addr_parts",
    "check_address",
    "check_pci_tree",
    "pci_iommu_groups",
]

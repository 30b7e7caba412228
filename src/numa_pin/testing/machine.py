"""Fake machines for tests: a declarative :class:`MachineSpec` and :func:`build`.

:func:`build` writes a ``sys/`` and ``proc/`` tree under a root directory, laid out the way
the Linux kernel lays out sysfs (directories, value files, relative symlinks, the binary PCI
``config`` space) so that numa-pin's discovery and an independent reader (hwloc's ``lstopo``
with ``--input <root>``) both see the machine the spec describes.

CPU numbering follows x86 Linux: first thread of every core (socket by socket, node by node),
then the second thread of every core, so CPU ``c`` and ``c + cores`` are siblings
(``sibling_layout="spread"``). ``sibling_layout="adjacent"`` numbers a core's threads next to
each other instead (VMs, some ARM/POWER kernels).

Everything here is pure except :func:`build`, which only writes under the root it is given.
Invalid specs raise :class:`numa_pin.errors.TopologyError` (from the constructors).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from numa_pin.cpuset import format_list, parse_list
from numa_pin.errors import TopologyError
from numa_pin.topology.model import (
    Cpu,
    HugePages,
    NumaNode,
    PciDevice,
    Topology,
)

LOCAL_DISTANCE = 10
KERNEL_MAX = 8191  # CONFIG_NR_CPUS=8192, as Debian and most distributions build
GIB_KB = 1024 * 1024

#: PCI classes (as sysfs prints them) used by the shapes and by :func:`expected_topology`
CLASS_VGA = "0x030000"
CLASS_3D = "0x030200"
CLASS_ETHERNET = "0x020000"
CLASS_INFINIBAND = "0x020700"
CLASS_NVME = "0x010802"
CLASS_PCI_BRIDGE = "0x060400"


_ADDR_RE = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_HEX16_RE = re.compile(r"^0x[0-9a-f]{4}$")
_CLASS_RE = re.compile(r"^0x[0-9a-f]{6}$")

HugePagesSpec = Mapping[int, tuple[int, int]]  # size_kb -> (total, free)
PerNode = int | Sequence[int]


# ------------------------------------------------------------------------------------------
# the spec
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
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
        _check_address(self.address, "VF")


@dataclass(frozen=True)
class PciSpec:
    """One PCI function and where it sits.

    ``numa_node`` is what ``numa_node`` prints (``-1``: firmware gave no proximity).
    ``local_cpulist`` overrides ``local_cpus``/``local_cpulist``; by default they are the
    node's CPUs, or every online CPU when ``numa_node`` is ``-1`` (what x86 Linux prints).
    ``parent`` is the address of the upstream bridge (another :class:`PciSpec` of class
    ``0x0604xx``) or ``None`` for a function on a root bus (``/sys/devices/pciDDDD:BB``).
    ``sriov_numvfs`` defaults to ``len(vfs)``. ``gpu_uuid``/``gpu_minor`` write
    ``/proc/driver/nvidia/gpus/<address>/information``.
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

    def __post_init__(self) -> None:
        _check_address(self.address, "PCI function")
        for label, value in (("vendor", self.vendor), ("device", self.device)):
            if not _HEX16_RE.match(value):
                raise TopologyError(f"{self.address}: {label} {value!r} is not like '0x10de'")
        if not _CLASS_RE.match(self.pci_class):
            raise TopologyError(f"{self.address}: class {self.pci_class!r} is not like '0x030200'")
        if self.numa_node < -1:
            raise TopologyError(f"{self.address}: numa_node {self.numa_node} < -1")
        if self.parent is not None:
            _check_address(self.parent, f"{self.address}: parent")
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
        return _addr_parts(self.address)[1]

    @property
    def domain(self) -> int:
        return _addr_parts(self.address)[0]


@dataclass(frozen=True)
class CpulessNodeSpec:
    """A NUMA node with memory and no CPUs (CXL, HBM, PMEM as system RAM).

    Its default distances: ``near`` to the CPU nodes of ``socket``, ``far`` to every other node.
    ``initiators`` writes ``access0/initiators`` links (HMAT) to the CPU nodes of ``socket``.
    """

    memory_kb: int = 64 * GIB_KB
    socket: int = 0
    near: int = 14
    far: int = 26
    initiators: bool = False
    hugepages: HugePagesSpec = field(default_factory=dict)


@dataclass(frozen=True)
class CpuLayout:
    """Where one logical CPU sits in a :class:`MachineSpec` (computed, not declared)."""

    id: int
    socket: int
    die: int
    node: int
    core: int  # core_id (index of the core inside its package)
    core_index: int  # machine-wide core index
    thread: int
    l3: int  # machine-wide L3 cache id
    online: bool


@dataclass(frozen=True)
class MachineSpec:
    """A whole machine, declared.

    CPU nodes are numbered ``0 .. sockets*nodes_per_socket-1`` socket by socket; CPU-less
    nodes follow. ``distances`` is the full matrix (row = from, column = to) over all nodes;
    when omitted it is built from ``same_socket_distance``/``remote_distance`` (and each
    :class:`CpulessNodeSpec`'s ``near``/``far``). ``memory_kb``/``memory_free_kb`` are an int
    for every CPU node or one value per CPU node. ``hugepages`` is ``{size_kb: (total, free)}``
    for every CPU node or one mapping per CPU node. ``l3_scope`` is ``"socket"``, ``"node"``
    or ``"ccx"`` (``cores_per_ccx`` cores share one L3).

    Raises :class:`TopologyError` for inconsistent values. A spec holding dicts or lists
    (``hugepages``, ``distances``) is not hashable; :func:`build_once` keys on its ``repr``.
    """

    name: str = "custom"
    sockets: int = 1
    nodes_per_socket: int = 1
    cores_per_node: int = 2
    threads_per_core: int = 1
    dies_per_socket: int = 1
    distances: Sequence[Sequence[int]] | None = None
    same_socket_distance: int = 11
    remote_distance: int = 21
    memory_kb: PerNode = 16 * GIB_KB
    memory_free_kb: PerNode | None = None
    hugepages: HugePagesSpec | Sequence[HugePagesSpec] = field(default_factory=dict)
    cpuless_nodes: tuple[CpulessNodeSpec, ...] = ()
    l3_scope: str = "socket"
    cores_per_ccx: int = 4
    pci: tuple[PciSpec, ...] = ()
    sibling_layout: str = "spread"
    offline_cpus: frozenset[int] = frozenset()
    vendor: str = "GenuineIntel"
    model_name: str = "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    iommu: bool = True

    def __post_init__(self) -> None:
        for label in (
            "sockets",
            "nodes_per_socket",
            "cores_per_node",
            "threads_per_core",
            "dies_per_socket",
            "cores_per_ccx",
        ):
            if getattr(self, label) < 1:
                raise TopologyError(f"machine {self.name}: {label} must be >= 1")
        if (
            self.nodes_per_socket % self.dies_per_socket
            and self.dies_per_socket % self.nodes_per_socket
        ):
            raise TopologyError(
                f"machine {self.name}: dies_per_socket must divide, or be a multiple of, "
                "nodes_per_socket"
            )
        if (
            self.dies_per_socket > self.nodes_per_socket
            and (self.cores_per_node * self.nodes_per_socket) % self.dies_per_socket
        ):
            raise TopologyError(f"machine {self.name}: cores per socket not divisible by dies")
        if self.l3_scope not in ("socket", "node", "ccx"):
            raise TopologyError(f"machine {self.name}: l3_scope {self.l3_scope!r} unknown")
        if self.l3_scope == "ccx" and self.cores_per_node % self.cores_per_ccx:
            raise TopologyError(
                f"machine {self.name}: cores_per_node not divisible by cores_per_ccx"
            )
        if self.sibling_layout not in ("spread", "adjacent"):
            raise TopologyError(
                f"machine {self.name}: sibling_layout {self.sibling_layout!r} unknown"
            )
        if 0 in self.offline_cpus:
            raise TopologyError(f"machine {self.name}: cpu0 cannot be offline")
        if not self.offline_cpus <= set(range(self.cpu_count)):
            raise TopologyError(f"machine {self.name}: offline_cpus outside 0-{self.cpu_count - 1}")
        for c in self.cpuless_nodes:
            if not 0 <= c.socket < self.sockets:
                raise TopologyError(f"machine {self.name}: CPU-less node socket {c.socket} unknown")
        self._check_per_node()
        self._check_distances()
        self._check_pci()

    # ---- counts and ids ------------------------------------------------------------------
    @property
    def cpu_node_count(self) -> int:
        return self.sockets * self.nodes_per_socket

    @property
    def node_count(self) -> int:
        return self.cpu_node_count + len(self.cpuless_nodes)

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(range(self.node_count))

    @property
    def core_count(self) -> int:
        return self.cpu_node_count * self.cores_per_node

    @property
    def cpu_count(self) -> int:
        return self.core_count * self.threads_per_core

    def socket_of_node(self, node: int) -> int:
        """Socket a node belongs to (for a CPU-less node: its ``socket``)."""
        if node >= self.cpu_node_count:
            return self.cpuless_nodes[node - self.cpu_node_count].socket
        return node // self.nodes_per_socket

    def cpu_layout(self) -> tuple[CpuLayout, ...]:
        """Every logical CPU (online or not), by id."""
        return self._layout

    @cached_property
    def _layout(self) -> tuple[CpuLayout, ...]:
        out: list[CpuLayout] = []
        cores_per_socket = self.cores_per_node * self.nodes_per_socket
        cores_per_die = cores_per_socket // self.dies_per_socket
        for core_index in range(self.core_count):
            socket, local = divmod(core_index, cores_per_socket)
            node = core_index // self.cores_per_node
            die = local // cores_per_die
            for thread in range(self.threads_per_core):
                if self.sibling_layout == "spread":
                    cpu = thread * self.core_count + core_index
                else:
                    cpu = core_index * self.threads_per_core + thread
                out.append(
                    CpuLayout(
                        id=cpu,
                        socket=socket,
                        die=die,
                        node=node,
                        core=local,
                        core_index=core_index,
                        thread=thread,
                        l3=self._l3_of(core_index),
                        online=cpu not in self.offline_cpus,
                    )
                )
        out.sort(key=lambda c: c.id)
        return tuple(out)

    def _l3_of(self, core_index: int) -> int:
        if self.l3_scope == "socket":
            return core_index // (self.cores_per_node * self.nodes_per_socket)
        if self.l3_scope == "node":
            return core_index // self.cores_per_node
        return core_index // self.cores_per_ccx

    @property
    def online_cpus(self) -> frozenset[int]:
        return frozenset(range(self.cpu_count)) - self.offline_cpus

    def cpus_of_node(self, node: int) -> frozenset[int]:
        """Online CPUs of a node (what ``nodeN/cpulist`` prints); empty for CPU-less nodes."""
        return self._online_by("node").get(node, frozenset())

    def cpus_of_socket(self, socket: int) -> frozenset[int]:
        """Online CPUs of a socket (``physical_package_id``)."""
        return self._online_by("socket").get(socket, frozenset())

    def _online_by(self, attr: str) -> dict[int, frozenset[int]]:
        cache: dict[str, dict[int, frozenset[int]]] = self._groups_cache
        if attr not in cache:
            groups: dict[int, set[int]] = {}
            for c in self._layout:
                if c.online:
                    groups.setdefault(getattr(c, attr), set()).add(c.id)
            cache[attr] = {k: frozenset(v) for k, v in groups.items()}
        return cache[attr]

    @cached_property
    def _groups_cache(self) -> dict[str, dict[int, frozenset[int]]]:
        return {}

    def node_memory_kb(self, node: int) -> int:
        if node >= self.cpu_node_count:
            return self.cpuless_nodes[node - self.cpu_node_count].memory_kb
        return _per_node(self.memory_kb, node)

    def node_memory_free_kb(self, node: int) -> int:
        if node < self.cpu_node_count and self.memory_free_kb is not None:
            return _per_node(self.memory_free_kb, node)
        total = self.node_memory_kb(node)
        used_by_huge = sum(size * free for size, (_, free) in self.node_hugepages(node).items())
        return max(0, total - total // 8 - used_by_huge)

    def node_hugepages(self, node: int) -> dict[int, tuple[int, int]]:
        """``{size_kb: (total, free)}`` of one node."""
        if node >= self.cpu_node_count:
            return dict(self.cpuless_nodes[node - self.cpu_node_count].hugepages)
        hp = self.hugepages
        if isinstance(hp, Mapping):
            return dict(hp)
        return dict(hp[node])

    def hugepage_sizes(self) -> tuple[int, ...]:
        """Hugepage sizes the machine supports (2M and 1G on x86, plus any declared)."""
        sizes = {2048, 1048576}
        for n in self.node_ids:
            sizes |= set(self.node_hugepages(n))
        return tuple(sorted(sizes))

    def distance_matrix(self) -> tuple[tuple[int, ...], ...]:
        """Full SLIT matrix, ``[from][to]``."""
        if self.distances is not None:
            return tuple(tuple(row) for row in self.distances)
        rows: list[tuple[int, ...]] = []
        for a in self.node_ids:
            rows.append(tuple(self._default_distance(a, b) for b in self.node_ids))
        return tuple(rows)

    def _default_distance(self, a: int, b: int) -> int:
        if a == b:
            return LOCAL_DISTANCE
        n = self.cpu_node_count
        if a >= n or b >= n:
            cpuless = self.cpuless_nodes[(a if a >= n else b) - n]
            other = b if a >= n else a
            if other < n and self.socket_of_node(other) == cpuless.socket:
                return cpuless.near
            return cpuless.far
        if self.socket_of_node(a) == self.socket_of_node(b):
            return self.same_socket_distance
        return self.remote_distance

    # ---- PCI ----------------------------------------------------------------------------
    def pci_by_address(self) -> dict[str, PciSpec]:
        return {p.address: p for p in self.pci}

    def pci_local_cpus(self, dev: PciSpec) -> frozenset[int]:
        """What ``local_cpulist`` prints for a function (VFs share their PF's)."""
        if dev.local_cpulist is not None:
            return parse_list(dev.local_cpulist)
        if dev.numa_node >= 0:
            return self.cpus_of_node(dev.numa_node)
        return self.online_cpus

    def pci_expected_node(self, dev: PciSpec) -> int | None:
        """The node numa-pin should resolve: ``numa_node``, else the one node holding every
        CPU of ``local_cpulist``, else the parent bridge's node (recursively), else None."""
        if dev.numa_node >= 0:
            return dev.numa_node
        local = self.pci_local_cpus(dev)
        owners = {n for n in self.node_ids if self.cpus_of_node(n) & local}
        if len(owners) == 1 and local <= self.cpus_of_node(next(iter(owners))):
            return owners.pop()
        if dev.parent is not None:
            parent = self.pci_by_address().get(dev.parent)
            if parent is not None:
                return self.pci_expected_node(parent)
        return None

    # ---- validation ---------------------------------------------------------------------
    def _check_per_node(self) -> None:
        for label in ("memory_kb", "memory_free_kb"):
            value = getattr(self, label)
            if value is None or isinstance(value, int):
                continue
            if len(value) != self.cpu_node_count:
                raise TopologyError(
                    f"machine {self.name}: {label} has {len(value)} values for "
                    f"{self.cpu_node_count} CPU nodes"
                )
        if not isinstance(self.hugepages, Mapping) and len(self.hugepages) != self.cpu_node_count:
            raise TopologyError(f"machine {self.name}: hugepages needs one mapping per CPU node")
        for n in self.node_ids:
            total_kb = self.node_memory_kb(n)
            if total_kb < 0:
                raise TopologyError(f"machine {self.name}: node {n} memory is negative")
            huge_kb = 0
            for size, (total, free) in self.node_hugepages(n).items():
                if size <= 4 or not 0 <= free <= total:
                    raise TopologyError(
                        f"machine {self.name}: node {n} hugepages-{size}kB "
                        f"({total} total, {free} free) invalid"
                    )
                huge_kb += size * total
            if huge_kb > total_kb:
                raise TopologyError(f"machine {self.name}: node {n} hugepages exceed its memory")

    def _check_distances(self) -> None:
        matrix = self.distance_matrix()
        n = self.node_count
        if len(matrix) != n or any(len(row) != n for row in matrix):
            raise TopologyError(f"machine {self.name}: distance matrix must be {n}x{n}")
        for a, row in enumerate(matrix):
            for b, d in enumerate(row):
                if a == b and d != LOCAL_DISTANCE:
                    raise TopologyError(f"machine {self.name}: distance[{a}][{a}] must be 10")
                if a != b and not LOCAL_DISTANCE < d <= 254:
                    raise TopologyError(
                        f"machine {self.name}: distance[{a}][{b}]={d} out of 11-254"
                    )

    def _check_pci(self) -> None:
        seen: set[str] = set()
        groups: set[int] = set()
        netdevs: set[str] = set()
        by_addr = self.pci_by_address()
        for dev in self.pci:
            for addr in (dev.address, *(vf.address for vf in dev.vfs)):
                if addr in seen:
                    raise TopologyError(f"machine {self.name}: PCI address {addr} used twice")
                seen.add(addr)
            for grp in (dev.iommu_group, *(vf.iommu_group for vf in dev.vfs)):
                if grp is not None:
                    if grp in groups:
                        raise TopologyError(f"machine {self.name}: iommu group {grp} used twice")
                    groups.add(grp)
            for nd in (*dev.netdevs, *(vf.netdev for vf in dev.vfs if vf.netdev)):
                if nd in netdevs or nd == "lo":
                    raise TopologyError(f"machine {self.name}: netdev {nd} used twice")
                netdevs.add(nd)
            if dev.numa_node >= self.node_count:
                raise TopologyError(f"{dev.address}: numa_node {dev.numa_node} does not exist")
            if dev.parent is not None:
                parent = by_addr.get(dev.parent)
                if parent is None or not parent.is_bridge:
                    raise TopologyError(
                        f"{dev.address}: parent {dev.parent} is not a declared bridge"
                    )
                if dev.domain != parent.domain or dev.bus <= parent.bus:
                    raise TopologyError(f"{dev.address}: bus must be below its parent {dev.parent}")
            if self.pci_local_cpus(dev) - self.online_cpus:
                raise TopologyError(f"{dev.address}: local_cpulist names CPUs that are not online")
        for dev in self.pci:  # cycles
            hops, cur = 0, dev
            while cur.parent is not None:
                cur = by_addr[cur.parent]
                hops += 1
                if hops > len(self.pci):
                    raise TopologyError(f"{dev.address}: parent chain loops")


def _per_node(value: PerNode, node: int) -> int:
    if isinstance(value, int):
        return value
    return int(value[node])


def _addr_parts(address: str) -> tuple[int, int, int, int]:
    m = _ADDR_RE.match(address)
    if m is None:
        raise TopologyError(f"PCI address {address!r} is not like '0000:3b:00.0'")
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16))


def _check_address(address: str, what: str) -> None:
    if _ADDR_RE.match(address) is None:
        raise TopologyError(f"{what} address {address!r} is not like '0000:3b:00.0' (lower case)")


# ------------------------------------------------------------------------------------------
# kernel text formats
# ------------------------------------------------------------------------------------------
def kernel_mask(ids: Iterable[int], nbits: int) -> str:
    """A cpumask the way the kernel's ``%*pb`` prints it for ``nbits`` bits.

    The first (most significant) group has only as many hex digits as its bits need:
    ``kernel_mask({0..7}, 8) == "ff"``, ``kernel_mask({0}, 40) == "00,00000001"``.
    """
    value = 0
    for i in ids:
        value |= 1 << i
    nbits = max(nbits, 1)
    words = (nbits + 31) // 32
    parts: list[str] = []
    for w in reversed(range(words)):
        chunk = (value >> (32 * w)) & 0xFFFFFFFF
        if w == words - 1:
            digits = (nbits - 32 * w + 3) // 4
            parts.append(f"{chunk:0{digits}x}")
        else:
            parts.append(f"{chunk:08x}")
    return ",".join(parts)


def _list_line(ids: Iterable[int]) -> str:
    return format_list(ids) + "\n"


# ------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuiltMachine:
    """Where :func:`build` wrote a machine. ``root`` holds ``sys/`` and ``proc/``."""

    spec: MachineSpec
    root: Path
    sysfs_root: Path
    proc_root: Path

    def pci_dir(self, address: str) -> Path:
        """The real (resolved) directory of a PCI function."""
        return (self.sysfs_root / "bus" / "pci" / "devices" / address).resolve()


def build(spec: MachineSpec, root: str | os.PathLike[str]) -> BuiltMachine:
    """Write ``spec`` as ``<root>/sys`` and ``<root>/proc`` and return where it went.

    Raises :class:`FileExistsError` if ``<root>/sys`` or ``<root>/proc`` already exists and
    :class:`OSError` for other write failures.
    """
    base = Path(root)
    sys_root = base / "sys"
    proc_root = base / "proc"
    base.mkdir(parents=True, exist_ok=True)
    sys_root.mkdir()
    proc_root.mkdir()
    writer = _Writer(spec, sys_root, proc_root)
    writer.write_all()
    return BuiltMachine(spec=spec, root=base, sysfs_root=sys_root, proc_root=proc_root)


_CACHE_DEFAULTS = {
    # vendor -> ((level, type, size_kb, ways) for L1d, L1i, L2), L3 size per socket-wide L3,
    # L3 ways
    "GenuineIntel": (
        ((1, "Data", 48, 12), (1, "Instruction", 32, 8), (2, "Unified", 1280, 20)),
        12,
    ),
    "AuthenticAMD": (((1, "Data", 32, 8), (1, "Instruction", 32, 8), (2, "Unified", 512, 8)), 16),
}

_NODE_MEMINFO_FIELDS = (
    "SwapCached",
    "Active",
    "Inactive",
    "Active(anon)",
    "Inactive(anon)",
    "Active(file)",
    "Inactive(file)",
    "Unevictable",
    "Mlocked",
    "Dirty",
    "Writeback",
    "FilePages",
    "Mapped",
    "AnonPages",
    "Shmem",
    "KernelStack",
    "PageTables",
    "SecPageTables",
    "NFS_Unstable",
    "Bounce",
    "WritebackTmp",
    "KReclaimable",
    "Slab",
    "SReclaimable",
    "SUnreclaim",
    "AnonHugePages",
    "ShmemHugePages",
    "ShmemPmdMapped",
    "FileHugePages",
    "FilePmdMapped",
)


class _Writer:
    """Writes one machine; state shared by the per-area writers (iommu groups, ifindex)."""

    def __init__(self, spec: MachineSpec, sys_root: Path, proc_root: Path) -> None:
        self.spec = spec
        self.sys = sys_root
        self.proc = proc_root
        self.layout = spec.cpu_layout()
        self.nbits = spec.cpu_count  # nr_cpu_ids: every possible CPU
        self.devices_dir = sys_root / "devices"
        self.node_dir = self.devices_dir / "system" / "node"
        self.cpu_dir = self.devices_dir / "system" / "cpu"
        self.groups = _assigned_groups(spec)
        self._next_ifindex = 2  # 1 is lo
        self.pci_dirs: dict[str, Path] = {}
        self._made: set[Path] = set()

    def _mkdir(self, path: Path) -> None:
        if path not in self._made:
            path.mkdir(parents=True, exist_ok=True)
            self._made.update((path, *path.parents))

    def _write(self, path: Path, text: str | bytes) -> None:
        self._mkdir(path.parent)
        data = text.encode() if isinstance(text, str) else text
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def _link(self, link: Path, target: Path) -> None:
        """Create ``link`` as a relative symlink to ``target`` (both absolute paths)."""
        self._mkdir(link.parent)
        os.symlink(os.path.relpath(target, link.parent), link)

    def write_all(self) -> None:
        self.write_nodes()
        self.write_cpus()
        self.write_global_hugepages()
        self.write_net_loopback()
        self.write_pci()
        self.write_proc()

    # ---- nodes ---------------------------------------------------------------------------
    def write_nodes(self) -> None:
        spec = self.spec
        ids = spec.node_ids
        self._write(self.node_dir / "online", _list_line(ids))
        self._write(self.node_dir / "possible", _list_line(ids))
        self._write(self.node_dir / "has_cpu", _list_line(n for n in ids if spec.cpus_of_node(n)))
        with_mem = [n for n in ids if spec.node_memory_kb(n) > 0]
        self._write(self.node_dir / "has_memory", _list_line(with_mem))
        self._write(self.node_dir / "has_normal_memory", _list_line(with_mem))
        self._write(self.node_dir / "has_generic_initiator", "\n")
        matrix = spec.distance_matrix()
        for n in ids:
            d = self.node_dir / f"node{n}"
            cpus = spec.cpus_of_node(n)
            self._write(d / "cpulist", _list_line(cpus))
            self._write(d / "cpumap", kernel_mask(cpus, self.nbits) + "\n")
            self._write(d / "distance", " ".join(str(x) for x in matrix[n]) + "\n")
            self._write(d / "meminfo", self._node_meminfo(n))
            self._write(
                d / "numastat",
                "numa_hit 0\nnuma_miss 0\nnuma_foreign 0\n"
                "interleave_hit 0\nlocal_node 0\nother_node 0\n",
            )
            node_hp = spec.node_hugepages(n)
            for size in spec.hugepage_sizes():
                total, free = node_hp.get(size, (0, 0))
                hp = d / "hugepages" / f"hugepages-{size}kB"
                self._write(hp / "nr_hugepages", f"{total}\n")
                self._write(hp / "free_hugepages", f"{free}\n")
                self._write(hp / "surplus_hugepages", "0\n")
            for c in self.layout:
                if c.node == n:
                    self._link(d / f"cpu{c.id}", self.cpu_dir / f"cpu{c.id}")
            if n >= spec.cpu_node_count:
                cpuless = spec.cpuless_nodes[n - spec.cpu_node_count]
                if cpuless.initiators:
                    acc = d / "access0" / "initiators"
                    self._mkdir(acc)
                    for m in range(spec.cpu_node_count):
                        if spec.socket_of_node(m) == cpuless.socket:
                            self._link(acc / f"node{m}", self.node_dir / f"node{m}")
                    targets = d / "access0" / "targets"
                    self._mkdir(targets)
            else:
                for other in ids[spec.cpu_node_count :]:
                    cpuless = spec.cpuless_nodes[other - spec.cpu_node_count]
                    if cpuless.initiators and cpuless.socket == spec.socket_of_node(n):
                        self._link(
                            d / "access0" / "targets" / f"node{other}",
                            self.node_dir / f"node{other}",
                        )

    def _node_meminfo(self, n: int) -> str:
        spec = self.spec
        total = spec.node_memory_kb(n)
        free = spec.node_memory_free_kb(n)
        hp2m = spec.node_hugepages(n).get(2048, (0, 0))
        lines = [
            f"Node {n} MemTotal:       {total:8d} kB",
            f"Node {n} MemFree:        {free:8d} kB",
            f"Node {n} MemUsed:        {total - free:8d} kB",
        ]
        for name in _NODE_MEMINFO_FIELDS:
            lines.append(f"Node {n} {name + ':':<15} {0:8d} kB")
        lines.append(f"Node {n} HugePages_Total: {hp2m[0]:5d}")
        lines.append(f"Node {n} HugePages_Free:  {hp2m[1]:5d}")
        lines.append(f"Node {n} HugePages_Surp:  {0:5d}")
        return "\n".join(lines) + "\n"

    # ---- cpus ----------------------------------------------------------------------------
    def write_cpus(self) -> None:
        spec = self.spec
        every = range(spec.cpu_count)
        online = spec.online_cpus
        self._write(self.cpu_dir / "possible", _list_line(every))
        self._write(self.cpu_dir / "present", _list_line(every))
        self._write(self.cpu_dir / "online", _list_line(online))
        self._write(self.cpu_dir / "offline", _list_line(spec.offline_cpus))
        self._write(self.cpu_dir / "kernel_max", f"{KERNEL_MAX}\n")
        self._write(self.cpu_dir / "isolated", "\n")
        smt = spec.threads_per_core > 1
        self._write(self.cpu_dir / "smt" / "active", "1\n" if smt else "0\n")
        self._write(self.cpu_dir / "smt" / "control", "on\n" if smt else "notsupported\n")

        def group(key: Callable[[CpuLayout], Hashable]) -> dict[int, frozenset[int]]:
            members: dict[Hashable, set[int]] = {}
            for c in self.layout:
                if c.online:
                    members.setdefault(key(c), set()).add(c.id)
            return {c.id: frozenset(members.get(key(c), ())) for c in self.layout}

        core_sets = group(lambda c: c.core_index)
        pkg_sets = group(lambda c: c.socket)
        die_sets = group(lambda c: (c.socket, c.die))
        l3_sets = group(lambda c: c.l3)
        caches, l3_ways = _CACHE_DEFAULTS.get(spec.vendor, _CACHE_DEFAULTS["GenuineIntel"])
        l3_kb = self._l3_size_kb()

        for c in self.layout:
            d = self.cpu_dir / f"cpu{c.id}"
            self._mkdir(d)
            if c.id != 0:
                self._write(d / "online", "1\n" if c.online else "0\n")
            self._link(d / f"node{c.node}", self.node_dir / f"node{c.node}")
            if not c.online:
                continue
            t = d / "topology"
            sets = {
                "thread_siblings": core_sets[c.id],
                "core_cpus": core_sets[c.id],
                "cluster_cpus": core_sets[c.id],
                "core_siblings": pkg_sets[c.id],
                "package_cpus": pkg_sets[c.id],
                "die_cpus": die_sets[c.id],
            }
            for name, cpus in sets.items():
                self._write(t / name, kernel_mask(cpus, self.nbits) + "\n")
                self._write(t / f"{name}_list", _list_line(cpus))
            self._write(t / "physical_package_id", f"{c.socket}\n")
            self._write(t / "die_id", f"{c.die}\n")
            self._write(t / "cluster_id", f"{c.core_index}\n")
            self._write(t / "core_id", f"{c.core}\n")
            index = 0
            for level, ctype, size_kb, ways in caches:
                self._cache(d, index, level, ctype, size_kb, ways, c.core_index, core_sets[c.id])
                index += 1
            self._cache(d, index, 3, "Unified", l3_kb, l3_ways, c.l3, l3_sets[c.id])

    def _l3_size_kb(self) -> int:
        spec = self.spec
        per_core = 1536 if spec.vendor == "GenuineIntel" else 4096
        if spec.l3_scope == "socket":
            cores = spec.cores_per_node * spec.nodes_per_socket
        elif spec.l3_scope == "node":
            cores = spec.cores_per_node
        else:
            cores = spec.cores_per_ccx
        return cores * per_core

    def _cache(
        self,
        cpu_dir: Path,
        index: int,
        level: int,
        ctype: str,
        size_kb: int,
        ways: int,
        cache_id: int,
        shared: frozenset[int],
    ) -> None:
        d = cpu_dir / "cache" / f"index{index}"
        line = 64
        self._write(d / "level", f"{level}\n")
        self._write(d / "type", f"{ctype}\n")
        self._write(d / "size", f"{size_kb}K\n")
        self._write(d / "ways_of_associativity", f"{ways}\n")
        self._write(d / "number_of_sets", f"{size_kb * 1024 // (ways * line)}\n")
        self._write(d / "coherency_line_size", f"{line}\n")
        self._write(d / "physical_line_partition", "1\n")
        self._write(d / "id", f"{cache_id}\n")
        self._write(d / "shared_cpu_list", _list_line(shared))
        self._write(d / "shared_cpu_map", kernel_mask(shared, self.nbits) + "\n")

    def write_global_hugepages(self) -> None:
        spec = self.spec
        for size in spec.hugepage_sizes():
            total = sum(spec.node_hugepages(n).get(size, (0, 0))[0] for n in spec.node_ids)
            free = sum(spec.node_hugepages(n).get(size, (0, 0))[1] for n in spec.node_ids)
            d = self.sys / "kernel" / "mm" / "hugepages" / f"hugepages-{size}kB"
            self._write(d / "nr_hugepages", f"{total}\n")
            self._write(d / "nr_hugepages_mempolicy", f"{total}\n")
            self._write(d / "free_hugepages", f"{free}\n")
            self._write(d / "resv_hugepages", "0\n")
            self._write(d / "surplus_hugepages", "0\n")
            self._write(d / "nr_overcommit_hugepages", "0\n")

    # ---- PCI -----------------------------------------------------------------------------
    def write_pci(self) -> None:
        spec = self.spec
        by_addr = spec.pci_by_address()
        self._write(self.sys / "bus" / "pci" / "drivers_autoprobe", "1\n")
        self._mkdir(self.sys / "bus" / "pci" / "devices")
        self._mkdir(self.sys / "bus" / "pci" / "drivers")
        self._mkdir(self.sys / "kernel" / "iommu_groups")
        for dev in sorted(spec.pci, key=lambda p: self._depth(p, by_addr)):
            self.pci_dirs[dev.address] = self._dir_for(dev, by_addr)
        acpi_bus = self.devices_dir / "LNXSYSTM:00" / "LNXSYBUS:00"
        for index, (domain, bus) in enumerate(
            sorted({self._root_of(p, by_addr) for p in spec.pci})
        ):
            host = self.devices_dir / f"pci{domain:04x}:{bus:02x}"
            acpi = acpi_bus / f"PNP0A08:{index:02x}"  # the ACPI host bridge of this root bus
            self._write(host / "uevent", "")
            self._write(acpi / "uevent", "")
            self._write(acpi / "path", f"\\_SB_.PC{index:02X}\n")
            self._link(host / "firmware_node", acpi)
            self._link(acpi / "physical_node", host)
        for dev in spec.pci:
            self._write_function(dev, by_addr)
            for index, vf in enumerate(dev.vfs):
                self._write_vf(dev, index, vf)
        for dev in spec.pci:
            if dev.gpu_uuid is not None:
                self._write_nvidia(dev)

    def _depth(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> int:
        depth = 0
        while dev.parent is not None:
            dev = by_addr[dev.parent]
            depth += 1
        return depth

    def _root_of(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> tuple[int, int]:
        while dev.parent is not None:
            dev = by_addr[dev.parent]
        return (dev.domain, dev.bus)

    def _dir_for(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> Path:
        if dev.parent is None:
            return self.devices_dir / f"pci{dev.domain:04x}:{dev.bus:02x}" / dev.address
        return self.pci_dirs[dev.parent] / dev.address

    def _bridge_buses(self, dev: PciSpec) -> tuple[int, int]:
        """(secondary, subordinate) bus numbers of a bridge, from what sits below it."""
        below: list[int] = []
        direct: list[int] = []
        for other in self.spec.pci:
            if other.parent == dev.address:
                direct.append(other.bus)
        todo = [dev.address]
        while todo:
            cur = todo.pop()
            for other in self.spec.pci:
                if other.parent == cur:
                    below.append(other.bus)
                    below.extend(_addr_parts(vf.address)[1] for vf in other.vfs)
                    todo.append(other.address)
        if not direct:
            return (dev.bus + 1, dev.bus + 1)
        return (min(direct), max(below))

    def _write_function(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> None:
        d = self.pci_dirs[dev.address]
        local = self.spec.pci_local_cpus(dev)
        self._common_files(
            d,
            dev.address,
            dev.vendor,
            dev.device,
            dev.pci_class,
            dev.numa_node,
            local,
            dev.driver,
            dev,
        )
        if dev.sriov_totalvfs is not None:
            self._write(d / "sriov_totalvfs", f"{dev.sriov_totalvfs}\n")
            self._write(d / "sriov_numvfs", f"{dev.numvfs}\n")
            self._write(d / "sriov_offset", "16\n")
            self._write(d / "sriov_stride", "1\n")
            self._write(d / "sriov_vf_device", f"{(dev.vf_device or dev.device)[2:]}\n")
            self._write(d / "sriov_drivers_autoprobe", "1\n")
        for name in dev.netdevs:
            self._netdev(d, name)
        self._iommu(d, dev.address, self.groups.get(dev.address))

    def _write_vf(self, pf: PciSpec, index: int, vf: VfSpec) -> None:
        pf_dir = self.pci_dirs[pf.address]
        d = pf_dir.parent / vf.address
        self.pci_dirs[vf.address] = d
        vf_spec = PciSpec(
            address=vf.address,
            vendor=pf.vendor,
            device=pf.vf_device or pf.device,
            pci_class=pf.pci_class,
            numa_node=pf.numa_node,
            subsystem_vendor=pf.subsystem_vendor,
            subsystem_device=pf.subsystem_device,
            revision=pf.revision,
            link_speed=pf.link_speed,
            link_width=pf.link_width,
        )
        self._common_files(
            d,
            vf.address,
            vf_spec.vendor,
            vf_spec.device,
            pf.pci_class,
            pf.numa_node,
            self.spec.pci_local_cpus(pf),
            vf.driver,
            vf_spec,
        )
        self._link(d / "physfn", pf_dir)
        self._link(pf_dir / f"virtfn{index}", d)
        if vf.netdev:
            self._netdev(d, vf.netdev)
        self._iommu(d, vf.address, self.groups.get(vf.address))

    def _common_files(
        self,
        d: Path,
        address: str,
        vendor: str,
        device: str,
        pci_class: str,
        numa_node: int,
        local: frozenset[int],
        driver: str | None,
        dev: PciSpec,
    ) -> None:
        self._mkdir(d)
        subvendor = dev.subsystem_vendor or vendor
        self._write(d / "vendor", f"{vendor}\n")
        self._write(d / "device", f"{device}\n")
        self._write(d / "class", f"{pci_class}\n")
        self._write(d / "subsystem_vendor", f"{subvendor}\n")
        self._write(d / "subsystem_device", f"{dev.subsystem_device}\n")
        self._write(d / "revision", f"{dev.revision}\n")
        self._write(d / "numa_node", f"{numa_node}\n")
        self._write(d / "local_cpus", kernel_mask(local, self.nbits) + "\n")
        self._write(d / "local_cpulist", _list_line(local))
        self._write(d / "enable", "1\n")
        self._write(d / "irq", "0\n")
        self._write(d / "dma_mask_bits", "64\n")
        self._write(d / "consistent_dma_mask_bits", "64\n")
        self._write(d / "driver_override", "(null)\n")
        self._write(d / "broken_parity_status", "0\n")
        self._write(d / "msi_bus", "1\n")
        self._write(d / "current_link_speed", f"{dev.link_speed}\n")
        self._write(d / "current_link_width", f"{dev.link_width}\n")
        self._write(d / "max_link_speed", f"{dev.link_speed}\n")
        self._write(d / "max_link_width", f"{dev.link_width}\n")
        self._write(
            d / "resource",
            "".join(
                "0x0000000000000000 0x0000000000000000 0x0000000000000000\n" for _ in range(13)
            ),
        )
        cls = int(pci_class, 16)
        ven, dv, sv, sd = (int(x, 16) for x in (vendor, device, subvendor, dev.subsystem_device))
        modalias = (
            f"pci:v{ven:08X}d{dv:08X}sv{sv:08X}sd{sd:08X}"
            f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
        )
        self._write(d / "modalias", modalias + "\n")
        uevent = [f"DRIVER={driver}"] if driver else []
        uevent += [
            f"PCI_CLASS={cls:X}",
            f"PCI_ID={ven:04X}:{dv:04X}",
            f"PCI_SUBSYS_ID={sv:04X}:{sd:04X}",
            f"PCI_SLOT_NAME={address}",
            f"MODALIAS={modalias}",
        ]
        self._write(d / "uevent", "\n".join(uevent) + "\n")
        self._write(d / "config", self._config_space(dev, vendor, device, pci_class))
        self._link(d / "subsystem", self.sys / "bus" / "pci")
        self._link(self.sys / "bus" / "pci" / "devices" / address, d)
        if driver:
            drv = self.sys / "bus" / "pci" / "drivers" / driver
            if not drv.exists():
                for name in ("bind", "unbind", "new_id", "remove_id"):
                    self._write(drv / name, "")
                self._write(drv / "uevent", "")
            self._link(drv / address, d)
            self._link(d / "driver", drv)

    def _config_space(self, dev: PciSpec, vendor: str, device: str, pci_class: str) -> bytes:
        cfg = bytearray(256)
        cls = int(pci_class, 16)
        cfg[0:2] = int(vendor, 16).to_bytes(2, "little")
        cfg[2:4] = int(device, 16).to_bytes(2, "little")
        cfg[4:6] = (0x0006).to_bytes(2, "little")  # memory space + bus master
        cfg[8] = int(dev.revision, 16) & 0xFF
        cfg[9] = cls & 0xFF
        cfg[10] = (cls >> 8) & 0xFF
        cfg[11] = (cls >> 16) & 0xFF
        cfg[0x0C] = 0x10  # cache line size (dwords)
        if dev.is_bridge:
            secondary, subordinate = self._bridge_buses(dev)
            cfg[0x0E] = 0x01
            cfg[0x18] = dev.bus
            cfg[0x19] = secondary
            cfg[0x1A] = subordinate
        else:
            cfg[0x0E] = 0x00
            cfg[0x2C:0x2E] = int(dev.subsystem_vendor or vendor, 16).to_bytes(2, "little")
            cfg[0x2E:0x30] = int(dev.subsystem_device, 16).to_bytes(2, "little")
        return bytes(cfg)

    def _netdev(self, dev_dir: Path, name: str) -> None:
        ifindex = self._next_ifindex
        self._next_ifindex += 1
        d = dev_dir / "net" / name
        mac = f"02:00:00:00:{ifindex >> 8 & 0xFF:02x}:{ifindex & 0xFF:02x}"
        self._write(d / "address", mac + "\n")
        self._write(d / "ifindex", f"{ifindex}\n")
        self._write(d / "iflink", f"{ifindex}\n")
        self._write(d / "operstate", "up\n")
        self._write(d / "carrier", "1\n")
        self._write(d / "mtu", "1500\n")
        self._write(d / "type", "1\n")
        self._write(d / "dev_port", "0\n")
        self._write(d / "uevent", f"INTERFACE={name}\nIFINDEX={ifindex}\n")
        self._link(d / "device", dev_dir)
        self._link(d / "subsystem", self.sys / "class" / "net")
        self._link(self.sys / "class" / "net" / name, d)

    def write_net_loopback(self) -> None:
        d = self.devices_dir / "virtual" / "net" / "lo"
        self._write(d / "address", "00:00:00:00:00:00\n")
        self._write(d / "ifindex", "1\n")
        self._write(d / "iflink", "1\n")
        self._write(d / "operstate", "unknown\n")
        self._write(d / "mtu", "65536\n")
        self._write(d / "type", "772\n")
        self._write(d / "uevent", "INTERFACE=lo\nIFINDEX=1\n")
        self._link(d / "subsystem", self.sys / "class" / "net")
        self._link(self.sys / "class" / "net" / "lo", d)

    def _iommu(self, dev_dir: Path, address: str, group: int | None) -> None:
        if group is None:
            return
        g = self.sys / "kernel" / "iommu_groups" / str(group)
        if not (g / "type").exists():
            self._write(g / "type", "DMA-FQ\n")
            self._write(g / "reserved_regions", "0x00000000fee00000 0x00000000feefffff msi\n")
        self._link(g / "devices" / address, dev_dir)
        self._link(dev_dir / "iommu_group", g)

    def _write_nvidia(self, dev: PciSpec) -> None:
        d = self.proc / "driver" / "nvidia" / "gpus" / dev.address
        minor = dev.gpu_minor if dev.gpu_minor is not None else 0
        rows = [
            ("Model", dev.model or "NVIDIA A100-SXM4-80GB"),
            ("IRQ", str(100 + minor)),
            ("GPU UUID", dev.gpu_uuid or ""),
            ("Video BIOS", "92.00.45.00.05"),
            ("Bus Type", "PCIe"),
            ("DMA Size", "47 bits"),
            ("DMA Mask", "0x7fffffffffff"),
            ("Bus Location", dev.address),
            ("Device Minor", str(minor)),
            ("GPU Excluded", "No"),
        ]
        text = "".join(
            f"{key}:{' ' * max(1, 7 - len(key))}\t\t {value}\n"
            if len(key) < 7
            else f"{key}: \t {value}\n"
            for key, value in rows
        )
        self._write(d / "information", text)

    # ---- proc ----------------------------------------------------------------------------
    def write_proc(self) -> None:
        spec = self.spec
        self._write(self.proc / "cpuinfo", self._cpuinfo())
        self._write(self.proc / "meminfo", self._meminfo())
        self._write(self.proc / "cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro\n")
        self._write(self.proc / "version", "Linux version 6.1.0-fake (numa-pin machine kit)\n")
        self._write(self.proc / "sys" / "kernel" / "numa_balancing", "0\n")
        self._write(self.proc / "sys" / "kernel" / "osrelease", "6.1.0-fake\n")
        mounts = (
            "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
            "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
        )
        self._write(self.proc / "mounts", mounts)
        if any(p.gpu_uuid for p in spec.pci):
            self._write(
                self.proc / "driver" / "nvidia" / "version",
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05\n",
            )

    def _cpuinfo(self) -> str:
        spec = self.spec
        cores_per_socket = spec.cores_per_node * spec.nodes_per_socket
        threads_per_socket = cores_per_socket * spec.threads_per_core
        intel = spec.vendor == "GenuineIntel"
        family, model, stepping = (6, 106, 6) if intel else (25, 1, 1)
        flags = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
        flags += "mmx fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl "
        flags += "xtopology nonstop_tsc cpuid pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic "
        flags += "movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm avx2 bmi1 bmi2"
        blocks: list[str] = []
        for c in self.layout:
            if not c.online:
                continue
            apic = (c.socket << 8) | (c.core << 1) | c.thread
            rows = [
                ("processor", str(c.id)),
                ("vendor_id", spec.vendor),
                ("cpu family", str(family)),
                ("model", str(model)),
                ("model name", spec.model_name),
                ("stepping", str(stepping)),
                ("microcode", "0xd0003a5"),
                ("cpu MHz", "2000.000"),
                ("cache size", f"{self._l3_size_kb()} KB"),
                ("physical id", str(c.socket)),
                ("siblings", str(threads_per_socket)),
                ("core id", str(c.core)),
                ("cpu cores", str(cores_per_socket)),
                ("apicid", str(apic)),
                ("initial apicid", str(apic)),
                ("fpu", "yes"),
                ("fpu_exception", "yes"),
                ("cpuid level", "27"),
                ("wp", "yes"),
                ("flags", flags),
                ("bogomips", "4000.00"),
                ("clflush size", "64"),
                ("cache_alignment", "64"),
                ("address sizes", "46 bits physical, 57 bits virtual"),
                ("power management", ""),
            ]
            lines = []
            for key, value in rows:
                tabs = "\t" if len(key) >= 8 else "\t\t"
                lines.append(
                    f"{key}{tabs}: {value}".rstrip() if value == "" else f"{key}{tabs}: {value}"
                )
            blocks.append("\n".join(lines) + "\n")
        return "\n".join(blocks) + "\n"

    def _meminfo(self) -> str:
        spec = self.spec
        total = sum(spec.node_memory_kb(n) for n in spec.node_ids)
        free = sum(spec.node_memory_free_kb(n) for n in spec.node_ids)
        default = {n: spec.node_hugepages(n).get(2048, (0, 0)) for n in spec.node_ids}
        hp_total = sum(t for t, _ in default.values())
        hp_free = sum(f for _, f in default.values())
        hugetlb = sum(
            size * t for n in spec.node_ids for size, (t, _) in spec.node_hugepages(n).items()
        )
        rows = [
            ("MemTotal", total),
            ("MemFree", free),
            ("MemAvailable", free),
            ("Buffers", 0),
            ("Cached", 0),
            ("SwapCached", 0),
            ("Active", 0),
            ("Inactive", 0),
            ("SwapTotal", 0),
            ("SwapFree", 0),
            ("Dirty", 0),
            ("Writeback", 0),
            ("AnonPages", 0),
            ("Mapped", 0),
            ("Shmem", 0),
            ("Slab", 0),
            ("PageTables", 0),
            ("CommitLimit", total // 2),
            ("Committed_AS", 0),
            ("VmallocTotal", 34359738367),
            ("AnonHugePages", 0),
        ]
        out = [f"{k + ':':<16}{v:8d} kB" for k, v in rows]
        out += [
            f"{'HugePages_Total:':<16}{hp_total:8d}",
            f"{'HugePages_Free:':<16}{hp_free:8d}",
            f"{'HugePages_Rsvd:':<16}{0:8d}",
            f"{'HugePages_Surp:':<16}{0:8d}",
            f"{'Hugepagesize:':<16}{2048:8d} kB",
            f"{'Hugetlb:':<16}{hugetlb:8d} kB",
        ]
        return "\n".join(out) + "\n"


def build_once(spec: MachineSpec, cache_dir: str | os.PathLike[str]) -> BuiltMachine:
    """:func:`build` into ``cache_dir/<name>-<digest of the spec>`` unless a complete tree is
    already there (e.g. ``tmp_path_factory.getbasetemp()`` shared by several test modules).

    The tree is written next to its final place and renamed in, so a failed build never
    leaves a half tree to be reused. Raises what :func:`build` raises.
    """
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    base = Path(cache_dir)
    root = base / f"{spec.name}-{digest}"
    if not (root / "sys").is_dir():
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=base))
        build(spec, staging)
        try:
            os.rename(staging, root)
        except OSError:
            if not (root / "sys").is_dir():
                raise
            shutil.rmtree(staging, ignore_errors=True)  # another process won the race
    return BuiltMachine(spec=spec, root=root, sysfs_root=root / "sys", proc_root=root / "proc")


# ------------------------------------------------------------------------------------------
# the spec as numa-pin's model
# ------------------------------------------------------------------------------------------
def pci_kind(pci_class: str) -> str:
    """The device kind numa-pin's discovery gives a class string (one definition, in
    :func:`numa_pin.topology.pci.classify`)."""
    from numa_pin.topology.pci import classify

    return classify(pci_class)


def expected_topology(spec: MachineSpec, source: str = "") -> Topology:
    """The :class:`Topology` the spec describes (an oracle for discovery tests).

    Node ``distances`` are rows of :meth:`MachineSpec.distance_matrix`; CPUs are the online
    ones; ``Cpu.core`` is the package-relative ``core_id``; ``Cpu.l3`` the machine-wide L3 id;
    ``Cpu.cluster`` the ``cluster_id`` (the machine-wide core index, as x86 prints per-core
    clusters); PCI ``numa_node`` follows :meth:`MachineSpec.pci_expected_node`, VFs
    inheriting their PF's. IOMMU groups are the ones :func:`build` assigns.
    """
    matrix = spec.distance_matrix()
    nodes: dict[int, NumaNode] = {}
    for n in spec.node_ids:
        declared = spec.node_hugepages(n)
        hps = tuple(HugePages(size, *declared.get(size, (0, 0))) for size in spec.hugepage_sizes())
        nodes[n] = NumaNode(
            id=n,
            cpus=spec.cpus_of_node(n),
            memory_total_kb=spec.node_memory_kb(n),
            memory_free_kb=spec.node_memory_free_kb(n),
            distances=matrix[n],
            hugepages=hps,
        )
    layout = spec.cpu_layout()
    siblings: dict[int, set[int]] = {}
    for c in layout:
        if c.online:
            siblings.setdefault(c.core_index, set()).add(c.id)
    cpus = {
        c.id: Cpu(
            id=c.id,
            socket=c.socket,
            die=c.die,
            core=c.core,
            numa=c.node,
            siblings=frozenset(siblings[c.core_index]),
            l3=c.l3,
            cluster=c.core_index,
        )
        for c in layout
        if c.online
    }
    groups = _assigned_groups(spec)
    devices: list[PciDevice] = []
    for dev in spec.pci:
        node = spec.pci_expected_node(dev)
        local = spec.pci_local_cpus(dev)
        devices.append(
            PciDevice(
                address=dev.address,
                vendor=dev.vendor,
                device=dev.device,
                pci_class=dev.pci_class,
                numa_node=node,
                driver=dev.driver,
                iommu_group=groups.get(dev.address),
                kind=pci_kind(dev.pci_class),
                netdevs=tuple(dev.netdevs),
                vfs=tuple(v.address for v in dev.vfs),
                sriov_totalvfs=dev.sriov_totalvfs,
                sriov_numvfs=dev.numvfs if dev.sriov_totalvfs is not None else None,
                parent=dev.parent,
                local_cpus=local,
                gpu_uuid=dev.gpu_uuid,
                gpu_minor=dev.gpu_minor,
            )
        )
        for vf in dev.vfs:
            devices.append(
                PciDevice(
                    address=vf.address,
                    vendor=dev.vendor,
                    device=dev.vf_device or dev.device,
                    pci_class=dev.pci_class,
                    numa_node=node,
                    driver=vf.driver,
                    iommu_group=groups.get(vf.address),
                    kind=pci_kind(dev.pci_class),
                    netdevs=(vf.netdev,) if vf.netdev else (),
                    physfn=dev.address,
                    parent=dev.parent,
                    local_cpus=local,
                )
            )
    devices.sort(key=lambda d: d.address)
    return Topology(
        nodes=nodes, cpus=dict(sorted(cpus.items())), pci_devices=tuple(devices), source=source
    )


def _assigned_groups(spec: MachineSpec) -> dict[str, int]:
    """IOMMU group per address: the declared one, else (with ``spec.iommu``) the lowest
    number not declared or handed out yet, in spec order (each PF, then its VFs)."""
    declared = [p.iommu_group for p in spec.pci] + [v.iommu_group for p in spec.pci for v in p.vfs]
    taken = {g for g in declared if g is not None}
    out: dict[str, int] = {}
    nxt = 0
    for address, wanted in _functions_with_groups(spec):
        if wanted is None:
            if not spec.iommu:
                continue
            while nxt in taken:
                nxt += 1
            taken.add(nxt)
            wanted = nxt
        out[address] = wanted
    return out


def _functions_with_groups(spec: MachineSpec) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for p in spec.pci:
        out.append((p.address, p.iommu_group))
        out.extend((v.address, v.iommu_group) for v in p.vfs)
    return out


__all__ = [
    "BuiltMachine",
    "CpuLayout",
    "CpulessNodeSpec",
    "MachineSpec",
    "PciSpec",
    "VfSpec",
    "build",
    "build_once",
    "expected_topology",
    "kernel_mask",
    "pci_kind",
]

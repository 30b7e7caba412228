"""Plain, frozen data describing one machine. No I/O happens here.

Discovery (:mod:`numa_pin.topology.discover`) fills these from sysfs; tests build them
directly or through :mod:`numa_pin.testing`. Everything downstream (hint providers,
allocators, the CLI) consumes a :class:`Topology` and never reads sysfs itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base.record import record

#: PCI device kinds numa-pin distinguishes
KIND_GPU = "gpu"
KIND_NIC = "nic"
#: an InfiniBand host channel adapter (class ``0x0207``): an RDMA device numa-pin shows as NICs
#: are shown (the devices operators pair with GPUs)
KIND_RDMA = "rdma"
KIND_OTHER = "other"


@record
class HugePages:
    """Hugepages of one size on one NUMA node."""

    size_kb: int
    total: int
    free: int | None  # None: the kernel did not say (no free_hugepages file)


@record
class NumaNode:
    """One online NUMA node.

    ``distances`` is the node's row of the SLIT table, indexed by *position* in the
    machine's sorted online node list (as ``/sys/devices/system/node/nodeN/distance``
    prints it). ``cpus`` may be empty (memory-only node); ``memory_total_kb`` may be 0
    (CPU-less but memory-less nodes do not exist on Linux, but a node can have 0 bytes).
    """

    id: int
    cpus: frozenset[int]
    memory_total_kb: int
    memory_free_kb: int | None  # None: the kernel did not say (no MemFree line)
    distances: tuple[int, ...]
    hugepages: tuple[HugePages, ...] = ()

    def hugepages_of(self, size_kb: int) -> HugePages | None:
        for hp in self.hugepages:
            if hp.size_kb == size_kb:
                return hp
        return None


@record
class Cpu:
    """One online logical CPU (hardware thread)."""

    id: int
    socket: int
    die: int
    core: int  # core_id as sysfs reports it (unique only within a socket/die)
    numa: int | None  # None only if no node lists the CPU (should not happen on Linux)
    siblings: frozenset[int]  # thread siblings, this CPU included
    l3: int | None = None  # L3 cache id; None when the CPU has no L3 information
    cluster: int | None = None

    @property
    def core_key(self) -> tuple[int, int, int]:
        """Machine-wide unique physical core identity."""
        return (self.socket, self.die, self.core)


@record
class PciDevice:
    """One PCI function from ``/sys/bus/pci/devices``.

    ``vendor``, ``device`` and ``pci_class`` are the strings sysfs prints (``"0x10de"``,
    ``"0x030200"``). ``numa_node`` is resolved: sysfs value, else the node owning
    ``local_cpulist``, else the parent bridge's node, else ``None``.
    """

    address: str
    vendor: str
    device: str
    pci_class: str
    numa_node: int | None
    driver: str | None = None
    iommu_group: int | None = None
    kind: str = KIND_OTHER
    netdevs: tuple[str, ...] = ()
    physfn: str | None = None  # PF address when this function is an SR-IOV VF
    vfs: tuple[str, ...] = ()  # VF addresses, by virtfn index
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    parent: str | None = None  # upstream bridge / switch port address, if any
    local_cpus: frozenset[int] = frozenset()
    gpu_uuid: str | None = None  # NVIDIA: from /proc/driver/nvidia/gpus/<addr>/information
    gpu_minor: int | None = None

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None

    @property
    def is_pf(self) -> bool:
        return self.sriov_totalvfs is not None and self.sriov_totalvfs > 0


@record
class Topology:
    """A whole machine. Mappings are keyed by id; iteration order is ascending id."""

    nodes: Mapping[int, NumaNode]
    cpus: Mapping[int, Cpu]
    pci_devices: tuple[PciDevice, ...] = ()
    source: str = ""  # the sysfs root it was read from, for messages

    # ---- queries -------------------------------------------------------------------
    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.nodes))

    @property
    def cpu_ids(self) -> frozenset[int]:
        return frozenset(self.cpus)

    def distance(self, a: int, b: int) -> int:
        """SLIT distance from node ``a`` to node ``b`` (row ``a``, column ``b``)."""
        ids = self.node_ids
        return self.nodes[a].distances[ids.index(b)]

    def distance_rows(self) -> dict[int, list[int]]:
        """``{node: [distance to node_ids[0], node_ids[1], ...]}``; what the policy takes."""
        return {n: list(self.nodes[n].distances) for n in self.node_ids}

    def sockets(self) -> frozenset[int]:
        return frozenset(c.socket for c in self.cpus.values())

    def device(self, address: str) -> PciDevice | None:
        for d in self.pci_devices:
            if d.address == address:
                return d
        return None

    def devices_on_node(self, node: int) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pci_devices if d.numa_node == node)


"""The pieces a :class:`~numa_pin.testing.spec.MachineSpec` is made of: CPU-less nodes, the
:class:`KernelQuirks` a kernel shows, and where each CPU sits (:class:`CpuLayout`, computed).

Pure values; invalid ones raise :class:`numa_pin.errors.TopologyError` from the constructors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numa_pin.base.record import field, record
from numa_pin.errors import TopologyError

LOCAL_DISTANCE = 10
GIB_KB = 1024 * 1024

HugePagesSpec = Mapping[int, tuple[int, int]]  # size_kb -> (total, free)
PerNode = int | Sequence[int]


@record
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


@record
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
    cluster: int = 0  # machine-wide cluster id (what ``cluster_id`` prints)
    efficiency: bool = False  # an E core of a hybrid part (no SMT, L2 shared by its cluster)


#: where :class:`KernelQuirks` puts a NUL byte after the final newline
NUL_NONE = "none"
NUL_NODE_LISTS = "node-lists"  # node/{online,possible,has_cpu,has_normal_memory}: old x86
NUL_SYSTEM = "system"  # every text file under devices/system: ARM, 5.15
#: the node-level list files :data:`NUL_NODE_LISTS` touches
NODE_LIST_FILES = ("online", "possible", "has_cpu", "has_normal_memory")


@record
class KernelQuirks:
    """What real kernels and firmware do that a tidy sysfs would not (all off by default).

    * ``nul_after_newline``: :data:`NUL_NODE_LISTS` or :data:`NUL_SYSTEM` files end with
      ``"\\n\\0"`` instead of ``"\\n"``;
    * ``node_meminfo_total_only``: ``nodeN/meminfo`` holds only the ``MemTotal`` line;
    * ``no_node_distance``: no ``nodeN/distance`` file (the kernel's own default, when the
      firmware gives no SLIT, is 10 local and 20 remote);
    * ``package_id_unknown``: every ``physical_package_id`` reads ``-1`` (POWER without
      ``ibm,chip-id``); ``package_cpus`` still groups each socket's CPUs;
    * ``has_cpu_empty``: ``node/has_cpu`` is empty although nodes list CPUs;
    * ``cache_map_only``: every ``cache/indexN`` holds ``shared_cpu_map`` but neither
      ``shared_cpu_list`` nor ``id`` (older x86 and ia64 kernels);
    * ``l3_map_zero``: the level-3 ``shared_cpu_map`` is all zeros (its ``shared_cpu_list``,
      when written, empty);
    * ``zero_node_distance``: every ``nodeN/distance`` row is all zeros (firmware without a
      SLIT on kernels that print what they got);
    * ``topology_siblings_only``: ``cpuN/topology/`` holds only ``thread_siblings`` and
      ``thread_siblings_list`` (no package, die, cluster or core id, no package lists);
    * ``hugepages_no_free``: node hugepage pools have ``nr_hugepages`` but no
      ``free_hugepages``;
    * ``node_cpulists_overlap``: every ``nodeN/cpulist`` and ``cpumap`` name every online CPU
      (a BIOS bug of some dual-socket boards), while the ``nodeN/cpuM`` and ``cpuM/nodeN``
      links keep the true node of each CPU;
    * ``core_id_per_thread``: ``core_id`` numbers each thread of a core apart, counting from 0
      again on every node of a package, and there is no ``die_id``, ``die_cpus``, ``cluster_id``
      or ``cluster_cpus`` (AMD family 15h on kernels before 5.16: the two integer cores of a
      compute unit are thread siblings by ``thread_siblings_list`` but keep their own
      ``core_id``);
    * ``flat_node_distance``: every entry of every ``nodeN/distance`` row reads 10 (firmware
      that tells its nodes apart by nothing; with ``node_cpulists_overlap``, hwloc's
      buggy-NUMA Xeon 5400 machine);
    * ``package_mask_per_core``: ``core_siblings`` holds only the core's threads,
      ``physical_package_id`` reads -1 and ``core_id`` the core's first thread, with no
      ``package_cpus``, ``core_cpus``, ``die_*`` or ``cluster_*`` files (POWER7 LPARs under
      PowerVM: the kernel derives the package mask from L2 sharing, one core on POWER7);
    * ``chip_ids_in_device_tree``: ``/proc/device-tree/cpus`` holds one ``PowerPC,POWER7@<reg>``
      node per core with its ``ibm,chip-id`` (the socket) and ``ibm,ppc-interrupt-server#s``
      (its threads), as POWER firmware writes them; hwloc 2.9 reads no device tree at all.
    """

    nul_after_newline: str = NUL_NONE
    node_meminfo_total_only: bool = False
    no_node_distance: bool = False
    package_id_unknown: bool = False
    has_cpu_empty: bool = False
    cache_map_only: bool = False
    l3_map_zero: bool = False
    zero_node_distance: bool = False
    topology_siblings_only: bool = False
    hugepages_no_free: bool = False
    node_cpulists_overlap: bool = False
    core_id_per_thread: bool = False
    flat_node_distance: bool = False
    package_mask_per_core: bool = False
    chip_ids_in_device_tree: bool = False

    def __post_init__(self) -> None:
        if self.nul_after_newline not in (NUL_NONE, NUL_NODE_LISTS, NUL_SYSTEM):
            raise TopologyError(f"unknown nul_after_newline {self.nul_after_newline!r}")


__all__ = [
    "GIB_KB",
    "LOCAL_DISTANCE",
    "NODE_LIST_FILES",
    "NUL_NODE_LISTS",
    "NUL_NONE",
    "NUL_SYSTEM",
    "CpuLayout",
    "CpulessNodeSpec",
    "HugePagesSpec",
    "KernelQuirks",
    "PerNode",
]

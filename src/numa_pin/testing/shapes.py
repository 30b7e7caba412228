"""Named machine shapes for tests: ``shape("intel-2s-snc2")`` returns a :class:`MachineSpec`.

Each shape is a function with a docstring saying what it models; :data:`SHAPES` maps the
name to the function. Specs are plain values: derive variants with ``numa_pin.base.record.replace``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from numa_pin.base.cpuset import format_list
from numa_pin.base.record import replace
from numa_pin.errors import TopologyError
from numa_pin.testing.pci_spec import CLASS_3D, CLASS_ETHERNET, CLASS_NVME, CLASS_PCI_BRIDGE, CLASS_VGA, PciSpec, VfSpec
from numa_pin.testing.spec import MachineSpec
from numa_pin.testing.spec_parts import GIB_KB, NUL_NODE_LISTS, NUL_SYSTEM, CpulessNodeSpec, KernelQuirks

_GPU_UUID_NS = uuid.UUID("6f1c3a52-2d0e-4c7e-9a0b-6e756d612d70")


def gpu_uuid(index: int) -> str:
    """The deterministic ``GPU-…`` UUID the shapes give GPU number ``index``."""
    return f"GPU-{uuid.uuid5(_GPU_UUID_NS, f'gpu{index}')}"


def laptop() -> MachineSpec:
    """One socket, one node, 4 cores x 2 threads (CPUs 0-3 + siblings 4-7), 16 GiB.

    PCI: an integrated GPU (``0000:00:02.0``) and an NVMe drive behind a root port, both with
    ``numa_node`` -1, as single-node firmware without an SRAT reports.
    """
    return MachineSpec(
        name="laptop",
        sockets=1,
        nodes_per_socket=1,
        cores_per_node=4,
        threads_per_core=2,
        memory_kb=16 * GIB_KB,
        model_name="Intel(R) Core(TM) i7-8565U CPU @ 1.80GHz",
        pci=(
            PciSpec(
                "0000:00:02.0",
                "0x8086",
                "0x3ea0",
                CLASS_VGA,
                -1,
                driver="i915",
                link_speed="Unknown",
                link_width=0,
            ),
            PciSpec("0000:00:1d.0", "0x8086", "0x9db0", CLASS_PCI_BRIDGE, -1, driver="pcieport"),
            PciSpec(
                "0000:02:00.0",
                "0x144d",
                "0xa808",
                CLASS_NVME,
                -1,
                driver="nvme",
                parent="0000:00:1d.0",
                link_speed="8.0 GT/s PCIe",
                link_width=4,
            ),
        ),
    )


def intel_2s_ht() -> MachineSpec:
    """Two sockets, one node each, 8 cores x 2 threads per socket (32 CPUs), SLIT 10/21.

    64 GiB per node with 2 MiB (1024 total, 1000 free) and 1 GiB (8 total, 6 free)
    hugepages on every node; an Intel X710 NIC on node 1.
    """
    return MachineSpec(
        name="intel-2s-ht",
        sockets=2,
        nodes_per_socket=1,
        cores_per_node=8,
        threads_per_core=2,
        remote_distance=21,
        memory_kb=64 * GIB_KB,
        hugepages={2048: (1024, 1000), 1048576: (8, 6)},
        pci=(
            PciSpec("0000:97:02.0", "0x8086", "0x347a", CLASS_PCI_BRIDGE, 1, driver="pcieport"),
            PciSpec(
                "0000:98:00.0",
                "0x8086",
                "0x1572",
                CLASS_ETHERNET,
                1,
                driver="i40e",
                netdevs=("ens3f0",),
                parent="0000:97:02.0",
                link_speed="8.0 GT/s PCIe",
                link_width=8,
            ),
        ),
    )


def intel_2s_snc2() -> MachineSpec:
    """Two sockets with Sub-NUMA Clustering 2: 4 nodes, 6 cores x 2 threads per node.

    SLIT: 10 local, 11 to the other node of the same socket, 21 across sockets. The L3 is
    shared by the whole socket (both SNC nodes), as the kernel reports it with SNC on.
    """
    return MachineSpec(
        name="intel-2s-snc2",
        sockets=2,
        nodes_per_socket=2,
        cores_per_node=6,
        threads_per_core=2,
        same_socket_distance=11,
        remote_distance=21,
        memory_kb=32 * GIB_KB,
        hugepages={2048: (512, 512)},
        l3_scope="socket",
        model_name="Intel(R) Xeon(R) Platinum 8480+",
    )


#: 8-node EPYC SLIT with one deliberately asymmetric pair (d[6][7]=11, d[7][6]=13), the
#: situation kubelet's prefer-closest tests exercise.
AMD_NPS4_DISTANCES: tuple[tuple[int, ...], ...] = (
    (10, 11, 12, 12, 32, 32, 32, 32),
    (11, 10, 12, 12, 32, 32, 32, 32),
    (12, 12, 10, 11, 32, 32, 32, 32),
    (12, 12, 11, 10, 32, 32, 32, 32),
    (32, 32, 32, 32, 10, 11, 12, 12),
    (32, 32, 32, 32, 11, 10, 12, 12),
    (32, 32, 32, 32, 12, 12, 10, 11),
    (32, 32, 32, 32, 12, 12, 13, 10),
)


def amd_nps4_8node() -> MachineSpec:
    """Two AMD EPYC sockets in NPS4: 8 nodes, 4 cores x 2 threads per node (64 CPUs).

    The SLIT is :data:`AMD_NPS4_DISTANCES` (asymmetric: node 6 sees node 7 at 11, node 7
    sees node 6 at 13). Every 2 cores share an L3 (one CCX), so each node holds two L3s.
    """
    return MachineSpec(
        name="amd-nps4-8node",
        sockets=2,
        nodes_per_socket=4,
        cores_per_node=4,
        threads_per_core=2,
        distances=AMD_NPS4_DISTANCES,
        memory_kb=32 * GIB_KB,
        hugepages={2048: (256, 200), 1048576: (2, 2)},
        l3_scope="ccx",
        cores_per_ccx=2,
        vendor="AuthenticAMD",
        model_name="AMD EPYC 7763 64-Core Processor",
    )


def _root_port(bus: int, node: int) -> PciSpec:
    return PciSpec(
        f"0000:{bus:02x}:01.0", "0x8086", "0x347a", CLASS_PCI_BRIDGE, node, driver="pcieport"
    )


def _gpu_switch(root_bus: int, node: int, first_gpu: int) -> tuple[PciSpec, ...]:
    """Root port -> PCIe switch (upstream + 2 downstream ports) -> 2 GPUs."""
    rp = _root_port(root_bus, node)
    up = PciSpec(
        f"0000:{root_bus + 1:02x}:00.0",
        "0x1000",
        "0xc010",
        CLASS_PCI_BRIDGE,
        node,
        driver="pcieport",
        parent=rp.address,
    )
    out = [rp, up]
    for port in range(2):
        down = PciSpec(
            f"0000:{root_bus + 2:02x}:{port:02x}.0",
            "0x1000",
            "0xc010",
            CLASS_PCI_BRIDGE,
            node,
            driver="pcieport",
            parent=up.address,
        )
        index = first_gpu + port
        gpu = PciSpec(
            f"0000:{root_bus + 3 + port:02x}:00.0",
            "0x10de",
            "0x20b2",
            CLASS_3D,
            node,
            driver="nvidia",
            parent=down.address,
            gpu_uuid=gpu_uuid(index),
            gpu_minor=index,
            model="NVIDIA A100-SXM4-80GB",
            subsystem_vendor="0x10de",
            subsystem_device="0x1463",
        )
        out += [down, gpu]
    return tuple(out)


#: root bus of the GPU switch of each node in ``gpu8-sriov``
GPU8_ROOT_BUSES = (0x15, 0x3A, 0x8A, 0xB5)


def gpu8_sriov() -> MachineSpec:
    """Two sockets x 2 nodes (SNC2), 8 cores x 2 threads per node, 8 GPUs and 2 SR-IOV NICs.

    * GPUs (``0x10de:0x20b2``, class ``0x030200``, driver ``nvidia``): 2 per node, each pair
      behind one PCIe switch under its own root port/root bus (:data:`GPU8_ROOT_BUSES`);
      GPU ``i`` has minor ``i`` and UUID :func:`gpu_uuid` ``(i)`` in
      ``/proc/driver/nvidia/gpus/<addr>/information``.
    * Intel E810 PF ``0000:32:00.0`` (``ens2f0``, driver ``ice``) on node 0 and Mellanox
      ConnectX-6 PF ``0000:c9:00.0`` (``ens5f0``, ``mlx5_core``) on node 3: each
      ``sriov_totalvfs`` 8, ``sriov_numvfs`` 4, VFs with netdevs (``iavf`` / ``mlx5_core``).
    * NVMe ``0000:5d:00.0`` on its own root bus with ``numa_node`` -1 and
      ``local_cpulist`` = node 1's CPUs.
    * Broadcom NIC ``0000:9c:00.0`` (``ens7f0``) with ``numa_node`` -1 and ``local_cpulist``
      = every CPU, behind root port ``0000:9b:01.0`` whose ``numa_node`` is 2.
    """
    base = MachineSpec(
        name="gpu8-sriov",
        sockets=2,
        nodes_per_socket=2,
        cores_per_node=8,
        threads_per_core=2,
        same_socket_distance=11,
        remote_distance=21,
        memory_kb=128 * GIB_KB,
        hugepages={2048: (2048, 2048), 1048576: (16, 16)},
        model_name="Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz",
    )
    pci: list[PciSpec] = []
    for node, bus in enumerate(GPU8_ROOT_BUSES):
        pci += _gpu_switch(bus, node, 2 * node)
    e810_vfs = tuple(
        VfSpec(f"0000:32:01.{i}", netdev=f"ens2f0v{i}", driver="iavf") for i in range(4)
    )
    pci += [
        _root_port(0x31, 0),
        PciSpec(
            "0000:32:00.0",
            "0x8086",
            "0x1592",
            CLASS_ETHERNET,
            0,
            driver="ice",
            netdevs=("ens2f0",),
            sriov_totalvfs=8,
            vfs=e810_vfs,
            vf_device="0x1889",
            parent="0000:31:01.0",
        ),
    ]
    cx6_vfs = tuple(
        VfSpec(f"0000:c9:00.{i + 2}", netdev=f"ens5f0v{i}", driver="mlx5_core") for i in range(4)
    )
    pci += [
        _root_port(0xC8, 3),
        PciSpec(
            "0000:c9:00.0",
            "0x15b3",
            "0x101b",
            CLASS_ETHERNET,
            3,
            driver="mlx5_core",
            netdevs=("ens5f0",),
            sriov_totalvfs=8,
            vfs=cx6_vfs,
            vf_device="0x101c",
            parent="0000:c8:01.0",
        ),
    ]
    node1_cpus = format_list(base.cpus_of_node(1))
    pci += [
        PciSpec(
            "0000:5d:00.0",
            "0x144d",
            "0xa80a",
            CLASS_NVME,
            -1,
            driver="nvme",
            local_cpulist=node1_cpus,
            link_speed="16.0 GT/s PCIe",
            link_width=4,
        ),
        _root_port(0x9B, 2),
        PciSpec(
            "0000:9c:00.0",
            "0x14e4",
            "0x16d7",
            CLASS_ETHERNET,
            -1,
            driver="bnxt_en",
            netdevs=("ens7f0",),
            parent="0000:9b:01.0",
        ),
    ]
    return replace(base, pci=tuple(pci))


#: SLIT of ``cpuless-memory-node``: node 2 (CXL) is nearer to node 1 than to node 0
CPULESS_DISTANCES: tuple[tuple[int, ...], ...] = (
    (10, 11, 20),
    (11, 10, 16),
    (20, 16, 10),
)


def cpuless_memory_node() -> MachineSpec:
    """One socket, 2 nodes with 4 cores x 2 threads each, plus node 2: 128 GiB, no CPUs (CXL).

    SLIT :data:`CPULESS_DISTANCES` (node 2 is at 16 from node 1, 20 from node 0).
    ``has_cpu`` is ``0-1``, ``has_memory`` ``0-2``; node 2's ``cpulist`` is empty.
    """
    return MachineSpec(
        name="cpuless-memory-node",
        sockets=1,
        nodes_per_socket=2,
        cores_per_node=4,
        threads_per_core=2,
        memory_kb=32 * GIB_KB,
        cpuless_nodes=(CpulessNodeSpec(memory_kb=128 * GIB_KB, socket=0),),
        distances=CPULESS_DISTANCES,
        hugepages={2048: (128, 128)},
    )


def big_64node() -> MachineSpec:
    """64 nodes (8 sockets x 8 nodes), 2 cores per node, no SMT: 128 CPUs.

    SLIT 10 local, 12 inside a socket, 32 across sockets. Past kubelet's 8-node limit:
    for scaling tests.
    """
    return MachineSpec(
        name="big-64node",
        sockets=8,
        nodes_per_socket=8,
        cores_per_node=2,
        threads_per_core=1,
        same_socket_distance=12,
        remote_distance=32,
        memory_kb=8 * GIB_KB,
        l3_scope="node",
    )


# ---- what real kernels and firmware do (issue 12) ------------------------------------------
def arm_nul_bytes() -> MachineSpec:
    """An ARM server (5.15 kernel): every text file under ``devices/system`` ends ``\\n\\0``.

    One socket, 2 nodes of 8 cores, no SMT, siblings numbered adjacently; every 4 cores share
    a ``cluster_id`` (and ``cluster_cpus``), the L3 spans the socket. A NIC on node 1.
    """
    return MachineSpec(
        name="arm-nul-bytes",
        sockets=1,
        nodes_per_socket=2,
        cores_per_node=8,
        threads_per_core=1,
        sibling_layout="adjacent",
        cores_per_cluster=4,
        same_socket_distance=20,
        memory_kb=64 * GIB_KB,
        hugepages={2048: (64, 64)},
        model_name="Ampere Altra Q80-30 (cpuinfo in x86 layout)",
        quirks=KernelQuirks(nul_after_newline=NUL_SYSTEM),
        pci=(
            PciSpec(
                "0000:01:00.0",
                "0x15b3",
                "0x1017",
                CLASS_ETHERNET,
                1,
                driver="mlx5_core",
                netdevs=("enP1p1s0f0",),
            ),
        ),
    )


def x86_nul_node_lists() -> MachineSpec:
    """``intel-2s-ht`` on an older x86 kernel: ``node/online``, ``possible``, ``has_cpu``
    and ``has_normal_memory`` end with ``\\n\\0``."""
    return replace(
        intel_2s_ht(),
        name="x86-nul-node-lists",
        quirks=KernelQuirks(nul_after_newline=NUL_NODE_LISTS),
    )


def meminfo_total_only() -> MachineSpec:
    """``intel-2s-snc2`` whose ``nodeN/meminfo`` files hold only the ``MemTotal`` line."""
    return replace(
        intel_2s_snc2(),
        name="meminfo-total-only",
        quirks=KernelQuirks(node_meminfo_total_only=True),
    )


def no_node_distance() -> MachineSpec:
    """Two sockets, one node each, and no ``nodeN/distance`` file at all.

    The firmware's SLIT would say 10/20, the kernel's own default without one.
    """
    return MachineSpec(
        name="no-node-distance",
        sockets=2,
        cores_per_node=4,
        threads_per_core=2,
        remote_distance=20,
        memory_kb=32 * GIB_KB,
        quirks=KernelQuirks(no_node_distance=True),
    )


def sparse_node_ids() -> MachineSpec:
    """Two sockets whose nodes are numbered 0 and 2, and a CPU-less CXL node 5.

    SLIT 10 local, 21 across sockets; node 5 is 14 from node 2 (its socket) and 26 from
    node 0. A NIC on node 2.
    """
    return MachineSpec(
        name="sparse-node-ids",
        sockets=2,
        cores_per_node=4,
        threads_per_core=2,
        memory_kb=32 * GIB_KB,
        hugepages={2048: (32, 32)},
        cpuless_nodes=(CpulessNodeSpec(memory_kb=64 * GIB_KB, socket=1),),
        node_numbers=(0, 2, 5),
        pci=(
            PciSpec(
                "0000:81:00.0",
                "0x8086",
                "0x1592",
                CLASS_ETHERNET,
                2,
                driver="ice",
                netdevs=("ens81f0",),
            ),
        ),
    )


def memoryless_node() -> MachineSpec:
    """One socket, node 0 with CPUs and memory, node 1 with CPUs and *no* memory (an
    unpopulated channel), and node 2 with memory and no CPUs.

    ``has_memory`` is ``0,2``, ``has_cpu`` ``0-1``.
    """
    return MachineSpec(
        name="memoryless-node",
        sockets=1,
        nodes_per_socket=2,
        cores_per_node=4,
        threads_per_core=2,
        memory_kb=(32 * GIB_KB, 0),
        hugepages=({2048: (64, 64)}, {}),
        cpuless_nodes=(CpulessNodeSpec(memory_kb=64 * GIB_KB, socket=0),),
    )


def power_no_package_id() -> MachineSpec:
    """A POWER9-like machine without ``ibm,chip-id``: ``physical_package_id`` is -1 on every
    CPU, while ``package_cpus`` still groups each chip.

    Two chips, one node each, 4 cores x SMT4 numbered adjacently (0-3 is one core). Core ids
    restart at 0 on each chip, so (package, core) alone no longer tells the cores apart.
    """
    return MachineSpec(
        name="power-no-package-id",
        sockets=2,
        cores_per_node=4,
        threads_per_core=4,
        sibling_layout="adjacent",
        remote_distance=40,
        memory_kb=64 * GIB_KB,
        l3_scope="node",
        model_name="POWER9, altivec supported (cpuinfo in x86 layout)",
        quirks=KernelQuirks(package_id_unknown=True),
    )


def pci_numa_node_unknown() -> MachineSpec:
    """Two sockets, firmware without PCI proximity: ``numa_node`` is -1 on every function.

    * GPU ``0000:17:00.0``: ``local_cpulist`` every CPU: its node is unknown;
    * NIC ``0000:b1:00.0``: ``local_cpulist`` node 1's CPUs: node 1;
    * NVMe ``0000:65:00.0`` behind root port ``0000:64:01.0`` (``local_cpulist`` node 0).
    """
    base = MachineSpec(
        name="pci-numa-node-unknown",
        sockets=2,
        cores_per_node=4,
        threads_per_core=2,
        memory_kb=32 * GIB_KB,
    )
    node0, node1 = (format_list(base.cpus_of_node(n)) for n in (0, 1))
    return replace(
        base,
        pci=(
            PciSpec(
                "0000:17:00.0",
                "0x10de",
                "0x20b2",
                CLASS_3D,
                -1,
                driver="nvidia",
                gpu_uuid=gpu_uuid(100),
                gpu_minor=0,
            ),
            PciSpec(
                "0000:b1:00.0",
                "0x8086",
                "0x1592",
                CLASS_ETHERNET,
                -1,
                driver="ice",
                netdevs=("ens6f0",),
                local_cpulist=node1,
            ),
            PciSpec(
                "0000:64:01.0",
                "0x8086",
                "0x347a",
                CLASS_PCI_BRIDGE,
                -1,
                driver="pcieport",
                local_cpulist=node0,
            ),
            PciSpec(
                "0000:65:00.0",
                "0x144d",
                "0xa80a",
                CLASS_NVME,
                -1,
                driver="nvme",
                parent="0000:64:01.0",
                local_cpulist=node0,
            ),
        ),
    )


def offline_smt() -> MachineSpec:
    """``intel-2s-ht`` booted with SMT siblings offline (CPUs 16-31): each core has one
    online thread, ``thread_siblings_list`` of an online CPU names only itself."""
    return replace(intel_2s_ht(), name="offline-smt", offline_cpus=frozenset(range(16, 32)))


def hybrid_pe() -> MachineSpec:
    """An Alder Lake-like hybrid part: 8 P cores x 2 threads (CPUs 0-15, siblings adjacent)
    and 8 single-threaded E cores (CPUs 16-23) in 2 clusters of 4 sharing an L2."""
    return MachineSpec(
        name="hybrid-pe",
        sockets=1,
        cores_per_node=8,
        threads_per_core=2,
        sibling_layout="adjacent",
        e_cores_per_node=8,
        memory_kb=32 * GIB_KB,
        model_name="12th Gen Intel(R) Core(TM) i9-12900K",
    )


def two_die_snc() -> MachineSpec:
    """A Cascade Lake-AP-like part: 2 sockets of 2 dies, each die its own node (4 nodes),
    ``die_id`` 0/1 inside each package; the L3 is per die (node)."""
    return MachineSpec(
        name="two-die-snc",
        sockets=2,
        nodes_per_socket=2,
        dies_per_socket=2,
        cores_per_node=4,
        threads_per_core=2,
        same_socket_distance=12,
        remote_distance=21,
        l3_scope="node",
        memory_kb=32 * GIB_KB,
        model_name="Intel(R) Xeon(R) Platinum 9282 CPU @ 2.60GHz",
    )


def has_cpu_empty() -> MachineSpec:
    """``intel-2s-snc2`` whose ``node/has_cpu`` is empty although every node lists CPUs."""
    return replace(intel_2s_snc2(), name="has-cpu-empty", quirks=KernelQuirks(has_cpu_empty=True))


def cache_map_only() -> MachineSpec:
    """``intel-2s-ht`` as older x86 and ia64 kernels print its caches: each ``cache/indexN``
    has ``shared_cpu_map`` but no ``shared_cpu_list`` and no ``id``."""
    return replace(intel_2s_ht(), name="cache-map-only", quirks=KernelQuirks(cache_map_only=True))


def l3_map_zero() -> MachineSpec:
    """``cache-map-only`` whose level-3 ``shared_cpu_map`` is all zeros on every CPU: the L3
    cannot be placed (hwloc then assumes one per core)."""
    return replace(
        intel_2s_ht(),
        name="l3-map-zero",
        quirks=KernelQuirks(cache_map_only=True, l3_map_zero=True),
    )


def zero_node_distance() -> MachineSpec:
    """Two sockets, one node each, whose ``nodeN/distance`` rows read ``0 0``: firmware
    without a SLIT; the kernel's own default would be 10/20."""
    return replace(
        no_node_distance(), name="zero-node-distance", quirks=KernelQuirks(zero_node_distance=True)
    )


def siblings_only_topology() -> MachineSpec:
    """One package, two nodes of 4 cores x 2 threads, on an architecture that defines neither
    package nor core ids: ``cpuN/topology/`` holds only ``thread_siblings`` (mask and list)."""
    return MachineSpec(
        name="siblings-only-topology",
        sockets=1,
        nodes_per_socket=2,
        cores_per_node=4,
        threads_per_core=2,
        memory_kb=32 * GIB_KB,
        quirks=KernelQuirks(topology_siblings_only=True),
    )


def hugepages_no_free() -> MachineSpec:
    """``intel-2s-ht`` whose node hugepage pools have ``nr_hugepages`` but no
    ``free_hugepages``."""
    return replace(intel_2s_ht(), name="hugepages-no-free", quirks=KernelQuirks(hugepages_no_free=True))


def node_cpulists_overlap() -> MachineSpec:
    """``intel-2s-ht`` with the BIOS bug of some older dual-socket boards: both
    ``nodeN/cpulist`` (and ``cpumap``) name all 32 CPUs, while the ``nodeN/cpuM`` and
    ``cpuM/nodeN`` links keep CPUs 0-7,16-23 on node 0 and 8-15,24-31 on node 1."""
    return replace(
        intel_2s_ht(), name="node-cpulists-overlap", quirks=KernelQuirks(node_cpulists_overlap=True)
    )


def opteron_6276() -> MachineSpec:
    """An AMD Opteron 6276-like machine (family 15h): 2 packages of 2 nodes, each node 4
    compute units of 2 integer cores (32 CPUs, a compute unit's cores numbered adjacently).

    The kernel makes a compute unit's two cores thread siblings (``thread_siblings_list``)
    but gives each its own ``core_id``, counting from 0 again on the package's second node,
    and writes no ``die_id``: ``core_id`` names neither a core nor a compute unit. SLIT 10
    local, 16 inside a package, 22 across.
    """
    return MachineSpec(
        name="opteron-6276",
        sockets=2,
        nodes_per_socket=2,
        cores_per_node=4,
        threads_per_core=2,
        sibling_layout="adjacent",
        same_socket_distance=16,
        remote_distance=22,
        memory_kb=32 * GIB_KB,
        l3_scope="node",
        vendor="AuthenticAMD",
        model_name="AMD Opteron(TM) Processor 6276",
        quirks=KernelQuirks(core_id_per_thread=True),
    )


def _uv_distance(a: int, b: int) -> int:
    if a == b:
        return 10
    return 13 if a // 2 == b // 2 else 19 if a // 4 == b // 4 else 29


def uv_blades() -> MachineSpec:
    """An SGI UV-like machine: 8 sockets, one node each, 2 cores x 2 threads per socket;
    two sockets share a blade (SLIT 13), two blades a chassis half (19), the rest 29.

    hwloc groups the nodes by these distances (blades, then halves) above the packages.
    """
    return MachineSpec(
        name="uv-blades",
        sockets=8,
        cores_per_node=2,
        threads_per_core=2,
        distances=tuple(tuple(_uv_distance(a, b) for b in range(8)) for a in range(8)),
        memory_kb=16 * GIB_KB,
        model_name="Intel(R) Xeon(R) CPU E7-8837 @ 2.67GHz",
    )


def harpertown_flat_numa() -> MachineSpec:
    """hwloc's buggy-NUMA Xeon 5400 (Harpertown) machine: 2 sockets x 4 cores, no SMT, that
    the kernel splits into 8 nodes of one CPU each by the ``cpuN/nodeM`` links, while every
    ``nodeN/cpulist`` names all 8 CPUs and every SLIT entry reads 10. hwloc reads one node."""
    return MachineSpec(
        name="harpertown-flat-numa",
        sockets=2,
        nodes_per_socket=4,
        cores_per_node=1,
        threads_per_core=1,
        memory_kb=2 * GIB_KB,
        model_name="Intel(R) Xeon(R) CPU E5440 @ 2.83GHz",
        quirks=KernelQuirks(node_cpulists_overlap=True, flat_node_distance=True),
    )


def _power7_distance(a: int, b: int) -> int:
    if a == b:
        return 10
    return 20 if a // 2 == b // 2 else 40


def power7_lpar() -> MachineSpec:
    """An IBM POWER7 LPAR under PowerVM: 4 chips of one node each, 4 cores x SMT4 per chip
    numbered adjacently (64 CPUs), an L3 region per core; SLIT 20 between the two chips of a
    drawer, 40 across (hwloc groups the drawers).

    The kernel takes the package mask from L2 sharing, so ``core_siblings`` is one core and
    ``physical_package_id`` -1; the firmware's device tree names each core's chip
    (``ibm,chip-id``). hwloc 2.9 reads no device tree: its packages are the cores.
    """
    return MachineSpec(
        name="power7-lpar",
        sockets=4,
        cores_per_node=4,
        threads_per_core=4,
        sibling_layout="adjacent",
        distances=tuple(tuple(_power7_distance(a, b) for b in range(4)) for a in range(4)),
        memory_kb=32 * GIB_KB,
        l3_scope="ccx",
        cores_per_ccx=1,
        model_name="POWER7 (architected), altivec supported",
        quirks=KernelQuirks(package_mask_per_core=True, chip_ids_in_device_tree=True, cache_map_only=True),
    )


SHAPES: dict[str, Callable[[], MachineSpec]] = {
    "laptop": laptop,
    "intel-2s-ht": intel_2s_ht,
    "intel-2s-snc2": intel_2s_snc2,
    "amd-nps4-8node": amd_nps4_8node,
    "gpu8-sriov": gpu8_sriov,
    "cpuless-memory-node": cpuless_memory_node,
    "big-64node": big_64node,
    "arm-nul-bytes": arm_nul_bytes,
    "x86-nul-node-lists": x86_nul_node_lists,
    "meminfo-total-only": meminfo_total_only,
    "no-node-distance": no_node_distance,
    "sparse-node-ids": sparse_node_ids,
    "memoryless-node": memoryless_node,
    "power-no-package-id": power_no_package_id,
    "pci-numa-node-unknown": pci_numa_node_unknown,
    "offline-smt": offline_smt,
    "hybrid-pe": hybrid_pe,
    "two-die-snc": two_die_snc,
    "has-cpu-empty": has_cpu_empty,
    "cache-map-only": cache_map_only,
    "l3-map-zero": l3_map_zero,
    "zero-node-distance": zero_node_distance,
    "siblings-only-topology": siblings_only_topology,
    "hugepages-no-free": hugepages_no_free,
    "node-cpulists-overlap": node_cpulists_overlap,
    "opteron-6276": opteron_6276,
    "uv-blades": uv_blades,
    "harpertown-flat-numa": harpertown_flat_numa,
    "power7-lpar": power7_lpar,
}

#: the shapes that reproduce a real kernel's or firmware's quirk (issues 12 and 23)
QUIRK_SHAPES: tuple[str, ...] = (
    "arm-nul-bytes",
    "x86-nul-node-lists",
    "meminfo-total-only",
    "no-node-distance",
    "sparse-node-ids",
    "memoryless-node",
    "power-no-package-id",
    "pci-numa-node-unknown",
    "offline-smt",
    "hybrid-pe",
    "two-die-snc",
    "has-cpu-empty",
    # issue 23: optional facts that are missing or meaningless degrade
    "cache-map-only",
    "l3-map-zero",
    "zero-node-distance",
    "siblings-only-topology",
    "hugepages-no-free",
    "node-cpulists-overlap",
    # issue 37: what hwloc reads differently
    "opteron-6276",
    "power7-lpar",
    "harpertown-flat-numa",
)


def shape(name: str) -> MachineSpec:
    """The spec of a named shape. Raises :class:`TopologyError` for an unknown name."""
    try:
        factory = SHAPES[name]
    except KeyError:
        raise TopologyError(
            f"unknown machine shape {name!r}; known: {', '.join(sorted(SHAPES))}"
        ) from None
    return factory()


def shape_names() -> tuple[str, ...]:
    return tuple(SHAPES)


__all__ = [
    "AMD_NPS4_DISTANCES",
    "CPULESS_DISTANCES",
    "GPU8_ROOT_BUSES",
    "QUIRK_SHAPES",
    "SHAPES",
    "amd_nps4_8node",
    "opteron_6276",
    "power7_lpar",
    "uv_blades",
    "harpertown_flat_numa",
    "big_64node",
    "cpuless_memory_node",
    "gpu8_sriov",
    "gpu_uuid",
    "intel_2s_ht",
    "intel_2s_snc2",
    "laptop",
    "shape",
    "shape_names",
]

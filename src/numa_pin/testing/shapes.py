"""Named machine shapes for tests: ``shape("intel-2s-snc2")`` returns a :class:`MachineSpec`.

Each shape is a function with a docstring saying what it models; :data:`SHAPES` maps the
name to the function. Specs are plain values: derive variants with ``dataclasses.replace``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace

from numa_pin.cpuset import format_list
from numa_pin.errors import TopologyError
from numa_pin.testing.machine import (
    CLASS_3D,
    CLASS_ETHERNET,
    CLASS_NVME,
    CLASS_PCI_BRIDGE,
    CLASS_VGA,
    GIB_KB,
    CpulessNodeSpec,
    MachineSpec,
    PciSpec,
    VfSpec,
)

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


SHAPES: dict[str, Callable[[], MachineSpec]] = {
    "laptop": laptop,
    "intel-2s-ht": intel_2s_ht,
    "intel-2s-snc2": intel_2s_snc2,
    "amd-nps4-8node": amd_nps4_8node,
    "gpu8-sriov": gpu8_sriov,
    "cpuless-memory-node": cpuless_memory_node,
    "big-64node": big_64node,
}


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
    "SHAPES",
    "amd_nps4_8node",
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

"""What discovery should read back from a built spec: an oracle for discovery tests.

:func:`expected_topology` states the kit's promise as numa-pin's own model; hwloc's ``lstopo``
(``tests/testing/test_lstopo_oracle.py``) checks the same trees independently.
"""

from __future__ import annotations

from numa_pin.base.record import replace
from numa_pin.testing.spec import MachineSpec
from numa_pin.testing.spec_parts import KernelQuirks
from numa_pin.topology.model import Cpu, HugePages, NumaNode, PciDevice, Topology


def pci_kind(pci_class: str) -> str:
    """The device kind numa-pin's discovery gives a class string (one definition, in
    :func:`numa_pin.topology.pci.classify`)."""
    from numa_pin.topology.pci import classify

    return classify(pci_class)


def expected_topology(spec: MachineSpec, source: str = "") -> Topology:
    """The :class:`Topology` the spec describes (an oracle for discovery tests).

    Node ``distances`` are rows of :meth:`MachineSpec.distance_matrix`; CPUs are the online
    ones; ``Cpu.core`` is the package-relative ``core_id``; ``Cpu.l3`` the machine-wide L3 id;
    ``Cpu.cluster`` the ``cluster_id`` (:attr:`CpuLayout.cluster`); PCI ``numa_node``
    follows :meth:`MachineSpec.pci_expected_node`, VFs inheriting their PF's. IOMMU groups
    are the ones :func:`build` assigns.

    Quirks read back as the kernel would have meant them: ``physical_package_id`` -1 still
    gives one socket per package (numbered by lowest CPU), a missing ``distance`` file or an
    all-zero row the kernel's no-SLIT default (10 local, 20 remote), a ``meminfo`` without
    ``MemFree`` an unknown (None) free memory, a pool without ``free_hugepages`` unknown
    (None) free pages, a cache without ``id`` the lowest CPU of its ``shared_cpu_map`` and an
    all-zero L3 map no L3 (None); a ``topology/`` with only the thread siblings one package
    (socket 0, die 0, no cluster) whose cores are numbered by their lowest CPU; overlapping
    node cpulists the node of each CPU's ``nodeN`` link, or, with an all-10 SLIT, one node (the
    first, its own memory) holding every CPU; core ids that are not the thread
    siblings' cores numbered by their lowest CPU (no cluster); a package mask of one core
    (POWER7 LPARs) one socket per core, numbered by lowest CPU (die 0, no cluster).
    """
    quirks = spec.quirks
    matrix = spec.distance_matrix()
    no_slit = quirks.no_node_distance or quirks.zero_node_distance
    nodes: dict[int, NumaNode] = {}
    for pos, n in enumerate(spec.node_ids):
        declared = spec.node_hugepages(n)
        hps = tuple(
            HugePages(size, total, None if quirks.hugepages_no_free else free)
            for size in spec.hugepage_sizes()
            for total, free in (declared.get(size, (0, 0)),)
        )
        nodes[n] = NumaNode(
            id=n,
            cpus=spec.cpus_of_node(n),
            memory_total_kb=spec.node_memory_kb(n),
            memory_free_kb=None if quirks.node_meminfo_total_only else spec.node_memory_free_kb(n),
            distances=_no_slit_row(spec, n) if no_slit else matrix[pos],
            hugepages=hps,
        )
    first = spec.node_ids[0]
    if quirks.node_cpulists_overlap and quirks.flat_node_distance:  # nothing tells the nodes apart
        nodes = {first: replace(nodes[first], cpus=spec.online_cpus, distances=(10,))}
    layout = spec.cpu_layout()
    siblings: dict[int, set[int]] = {}
    for c in layout:
        if c.online:
            siblings.setdefault(c.core_index, set()).add(c.id)
    l3_lowest: dict[int, int] = {}
    for c in layout:
        if c.online:
            l3_lowest[c.l3] = min(c.id, l3_lowest.get(c.l3, c.id))
    bare = quirks.topology_siblings_only
    per_core = quirks.package_mask_per_core
    socket_of_core = {k: i for i, k in enumerate(sorted(siblings, key=lambda k: min(siblings[k])))}
    renumbered = bare or per_core or quirks.core_id_per_thread
    cpus = {
        c.id: Cpu(
            id=c.id,
            socket=0 if bare else socket_of_core[c.core_index] if per_core else c.socket,
            die=0 if bare else c.die,
            core=min(siblings[c.core_index]) if renumbered else c.core,
            numa=first if len(nodes) == 1 else c.node,
            siblings=frozenset(siblings[c.core_index]),
            l3=_l3(quirks, c.l3, l3_lowest),
            cluster=None if renumbered else c.cluster,
        )
        for c in layout
        if c.online
    }
    groups = spec.iommu_groups()
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


def _l3(quirks: KernelQuirks, l3: int, lowest: dict[int, int]) -> int | None:
    """What discovery reads as a CPU's L3 id: the ``id`` file, else the lowest CPU of the
    map, else (an all-zero map) unknown."""
    if quirks.l3_map_zero and quirks.cache_map_only:
        return None
    return lowest[l3] if quirks.cache_map_only else l3


def _no_slit_row(spec: MachineSpec, node: int) -> tuple[int, ...]:
    return tuple(10 if other == node else 20 for other in spec.node_ids)


__all__ = ["expected_topology", "pci_kind"]

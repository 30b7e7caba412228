"""A tiny fake-sysfs writer for topology tests.

It writes only the files discovery reads, in the kernel's formats, with PCI entries as
relative symlinks the way the kernel lays them out. Expected values in the tests come
from the arguments given here, never from discovery code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list

NODE = "devices/system/node"
CPU = "devices/system/cpu"


class FakeSysfs:
    """Writes a sysfs tree below ``root`` (relative paths everywhere)."""

    NODE = NODE
    CPU = CPU

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    # ---- primitives --------------------------------------------------------------------
    def p(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, text: str | bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text + "\n")
        return path

    def link(self, rel: str, target_rel: str) -> Path:
        """Symlink ``rel`` -> ``target_rel`` (both relative to root), stored relative."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        os.symlink(os.path.relpath(self.root / target_rel, path.parent), path)
        return path

    def remove(self, rel: str) -> None:
        (self.root / rel).unlink()

    # ---- machine pieces ----------------------------------------------------------------
    def online(self, cpus: Iterable[int], nodes: Iterable[int] | None = None) -> None:
        self.write(f"{CPU}/online", format_list(cpus))
        if nodes is not None:
            self.write(f"{NODE}/online", format_list(nodes))

    def node(
        self,
        nid: int,
        cpus: Iterable[int],
        distances: Iterable[int],
        mem_total_kb: int = 1048576,
        mem_free_kb: int = 524288,
        hugepages: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        base = f"{NODE}/node{nid}"
        self.write(f"{base}/cpulist", format_list(cpus))
        self.write(f"{base}/distance", " ".join(str(d) for d in distances))
        self.write(
            f"{base}/meminfo",
            "\n".join(
                [
                    f"Node {nid} MemTotal:       {mem_total_kb} kB",
                    f"Node {nid} MemFree:        {mem_free_kb} kB",
                    f"Node {nid} MemUsed:        {mem_total_kb - mem_free_kb} kB",
                    f"Node {nid} HugePages_Total:     0",
                ]
            ),
        )
        for size, (total, free) in (hugepages or {}).items():
            self.write(f"{base}/hugepages/hugepages-{size}kB/nr_hugepages", str(total))
            self.write(f"{base}/hugepages/hugepages-{size}kB/free_hugepages", str(free))
            self.write(f"{base}/hugepages/hugepages-{size}kB/surplus_hugepages", "0")

    def cpu(
        self,
        cid: int,
        *,
        socket: int = 0,
        die: int | None = 0,
        core: int | None = None,
        siblings: Iterable[int] | None = None,
        l3: int | None = 0,
        l3_shared: Iterable[int] | None = None,
        cluster: int | None = None,
        node: int | None = None,
    ) -> None:
        """One CPU. ``die=None`` omits die_id; ``l3=None`` omits the L3 ``id`` file (a
        level-3 index with ``l3_shared`` is still written when that is given)."""
        topo = f"{CPU}/cpu{cid}/topology"
        self.write(f"{topo}/physical_package_id", str(socket))
        if die is not None:
            self.write(f"{topo}/die_id", str(die))
        self.write(f"{topo}/core_id", str(cid if core is None else core))
        self.write(f"{topo}/thread_siblings_list", format_list(siblings or [cid]))
        if cluster is not None:
            self.write(f"{topo}/cluster_id", str(cluster))
        cache = f"{CPU}/cpu{cid}/cache"
        self.write(f"{cache}/index0/level", "1")
        self.write(f"{cache}/index0/id", str(cid))
        self.write(f"{cache}/index0/shared_cpu_list", format_list(siblings or [cid]))
        self.write(f"{cache}/index2/level", "2")
        self.write(f"{cache}/index2/shared_cpu_list", format_list(siblings or [cid]))
        if l3 is not None or l3_shared is not None:
            self.write(f"{cache}/index3/level", "3")
            self.write(f"{cache}/index3/shared_cpu_list", format_list(l3_shared or [cid]))
            if l3 is not None:
                self.write(f"{cache}/index3/id", str(l3))
        if node is not None:
            self.link(f"{CPU}/cpu{cid}/node{node}", f"{NODE}/node{node}")

    def pci(
        self,
        address: str,
        *,
        under: str = "pci0000:00",
        pci_class: str = "0x020000",
        vendor: str = "0x8086",
        device: str = "0x1592",
        numa_node: int | None = -1,
        local_cpulist: Iterable[int] | None = None,
        driver: str | None = None,
        iommu_group: int | str | None = None,
        netdevs: Iterable[str] = (),
        sriov_totalvfs: int | None = None,
        sriov_numvfs: int | None = None,
    ) -> str:
        """One PCI function; ``under`` is its parent path below ``devices/``. Returns its
        directory relative to root."""
        rel = f"devices/{under}/{address}"
        self.write(f"{rel}/vendor", vendor)
        self.write(f"{rel}/device", device)
        self.write(f"{rel}/class", pci_class)
        if numa_node is not None:
            self.write(f"{rel}/numa_node", str(numa_node))
        if local_cpulist is not None:
            self.write(f"{rel}/local_cpulist", format_list(local_cpulist))
        if driver is not None:
            self.write(f"bus/pci/drivers/{driver}/bind", "")
            self.link(f"{rel}/driver", f"bus/pci/drivers/{driver}")
        if iommu_group is not None:
            (self.root / f"kernel/iommu_groups/{iommu_group}").mkdir(parents=True, exist_ok=True)
            self.link(f"{rel}/iommu_group", f"kernel/iommu_groups/{iommu_group}")
        for name in netdevs:
            self.write(f"{rel}/net/{name}/ifindex", "7")
        if sriov_totalvfs is not None:
            self.write(f"{rel}/sriov_totalvfs", str(sriov_totalvfs))
        if sriov_numvfs is not None:
            self.write(f"{rel}/sriov_numvfs", str(sriov_numvfs))
        self.link(f"bus/pci/devices/{address}", rel)
        return rel

    def simple(self, **kwargs) -> dict[int, list[int]]:
        """:func:`simple_machine` on this tree."""
        return simple_machine(self, **kwargs)

    def sriov(self, pf_rel: str, vf_rels: Mapping[int, str]) -> None:
        """Link ``virtfnN`` in the PF and ``physfn`` in each VF."""
        for index, vf_rel in vf_rels.items():
            self.link(f"{pf_rel}/virtfn{index}", vf_rel)
            self.link(f"{vf_rel}/physfn", pf_rel)


def simple_machine(
    fake: FakeSysfs,
    nodes: int = 2,
    cores_per_node: int = 2,
    smt: int = 2,
    distances: list[list[int]] | None = None,
) -> dict[int, list[int]]:
    """A symmetric machine: one socket (and one L3) per node, ``smt`` threads per core,
    thread t of core c numbered ``c + t * total_cores`` (the usual x86 numbering).
    Returns ``{node: sorted cpus}``."""
    total_cores = nodes * cores_per_node
    layout: dict[int, list[int]] = {}
    for n in range(nodes):
        cpus: list[int] = []
        for c in range(n * cores_per_node, (n + 1) * cores_per_node):
            threads = [c + t * total_cores for t in range(smt)]
            cpus.extend(threads)
            for cpu in threads:
                fake.cpu(cpu, socket=n, core=c - n * cores_per_node, siblings=threads, l3=n)
        layout[n] = sorted(cpus)
    rows = distances or [[10 if a == b else 20 for b in range(nodes)] for a in range(nodes)]
    for n in range(nodes):
        fake.node(
            n,
            layout[n],
            rows[n],
            mem_total_kb=1000 * (n + 1),
            mem_free_kb=100 * (n + 1),
            hugepages={2048: (8 * (n + 1), 4), 1048576: (n, 0)},
        )
    fake.online(range(total_cores * smt), range(nodes))
    return layout


@pytest.fixture
def fake(tmp_path: Path) -> FakeSysfs:
    """An empty fake sysfs at ``tmp_path/sys``."""
    return FakeSysfs(tmp_path / "sys")


@pytest.fixture
def make_fake():
    """Factory: ``make_fake(root) -> FakeSysfs`` for a second tree or another root."""
    return FakeSysfs


@pytest.fixture
def build_simple():
    """The :func:`simple_machine` builder, for tests that want other shapes."""
    return simple_machine


@pytest.fixture
def two_node(fake: FakeSysfs) -> FakeSysfs:
    """2 nodes x 2 cores x SMT2: node0 = {0,1,4,5}, node1 = {2,3,6,7}, distance 20."""
    simple_machine(fake)
    return fake

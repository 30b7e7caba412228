"""Writes a :class:`~numa_pin.testing.spec.MachineSpec` as kernel-shaped ``sys/`` and ``proc/``.

:func:`build` lays the tree out the way the Linux kernel lays out sysfs (directories, value
files, relative symlinks, the binary PCI ``config`` space) so that numa-pin's discovery and an
independent reader (hwloc's ``lstopo --input <root>``) both see the machine the spec
describes. It only writes under the root it is given.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Hashable
from pathlib import Path

from numa_pin.base.record import record
from numa_pin.testing.files import TreeFiles
from numa_pin.testing.kernel_text import (
    CACHE_DEFAULTS,
    cpuinfo,
    kernel_mask,
    l3_size_kb,
    list_line,
    meminfo,
    node_meminfo,
)
from numa_pin.testing.spec import MachineSpec
from numa_pin.testing.spec_parts import LOCAL_DISTANCE, NODE_LIST_FILES, NUL_NODE_LISTS, NUL_SYSTEM, CpuLayout
from numa_pin.testing.writer_pci import PciWriter

KERNEL_MAX = 8191  # CONFIG_NR_CPUS=8192, as Debian and most distributions build


@record
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


class _Writer:
    """Writes the nodes, CPUs, hugepages and proc files of one machine."""

    def __init__(self, spec: MachineSpec, sys_root: Path, proc_root: Path) -> None:
        self.spec = spec
        self.sys = sys_root
        self.proc = proc_root
        self.layout = spec.cpu_layout()
        self.nbits = spec.cpu_count  # nr_cpu_ids: every possible CPU
        self.node_dir = sys_root / "devices" / "system" / "node"
        self.cpu_dir = sys_root / "devices" / "system" / "cpu"
        self.files = TreeFiles(nul_after=self._nul_after())

    def _nul_after(self) -> Callable[[Path], bool] | None:
        """Which text files end with a NUL byte after their newline (``quirks``)."""
        scope = self.spec.quirks.nul_after_newline
        if scope == NUL_SYSTEM:
            system = self.node_dir.parent
            return lambda path: path.is_relative_to(system)
        if scope == NUL_NODE_LISTS:
            lists = frozenset(self.node_dir / name for name in NODE_LIST_FILES)
            return lambda path: path in lists
        return None

    def write_all(self) -> None:
        self.write_nodes()
        self.write_cpus()
        self.write_global_hugepages()
        PciWriter(self.spec, self.files, self.sys, self.proc).write_all()
        self.write_proc()

    # ---- nodes ---------------------------------------------------------------------------
    def write_nodes(self) -> None:
        spec = self.spec
        quirks = spec.quirks
        ids = spec.node_ids
        self.files.write(self.node_dir / "online", list_line(ids))
        self.files.write(self.node_dir / "possible", list_line(ids))
        with_cpus = [] if quirks.has_cpu_empty else [n for n in ids if spec.cpus_of_node(n)]
        self.files.write(self.node_dir / "has_cpu", list_line(with_cpus))
        with_mem = [n for n in ids if spec.node_memory_kb(n) > 0]
        self.files.write(self.node_dir / "has_memory", list_line(with_mem))
        self.files.write(self.node_dir / "has_normal_memory", list_line(with_mem))
        self.files.write(self.node_dir / "has_generic_initiator", "\n")
        matrix = spec.distance_matrix()
        for pos, n in enumerate(ids):
            d = self.node_dir / f"node{n}"
            cpus = spec.cpus_of_node(n)
            if quirks.node_cpulists_overlap and cpus:  # the BIOS bug: every CPU in every node
                cpus = spec.online_cpus
            self.files.write(d / "cpulist", list_line(cpus))
            self.files.write(d / "cpumap", kernel_mask(cpus, self.nbits) + "\n")
            row = [0] * len(ids) if quirks.zero_node_distance else matrix[pos]
            if quirks.flat_node_distance:
                row = [LOCAL_DISTANCE] * len(ids)
            if not quirks.no_node_distance:
                self.files.write(d / "distance", " ".join(str(x) for x in row) + "\n")
            meminfo_text = node_meminfo(spec, n)
            if quirks.node_meminfo_total_only:
                meminfo_text = meminfo_text.splitlines(keepends=True)[0]
            self.files.write(d / "meminfo", meminfo_text)
            self.files.write(
                d / "numastat",
                "numa_hit 0\nnuma_miss 0\nnuma_foreign 0\n"
                "interleave_hit 0\nlocal_node 0\nother_node 0\n",
            )
            node_hp = spec.node_hugepages(n)
            for size in spec.hugepage_sizes():
                total, free = node_hp.get(size, (0, 0))
                hp = d / "hugepages" / f"hugepages-{size}kB"
                self.files.write(hp / "nr_hugepages", f"{total}\n")
                if not quirks.hugepages_no_free:
                    self.files.write(hp / "free_hugepages", f"{free}\n")
                self.files.write(hp / "surplus_hugepages", "0\n")
            for c in self.layout:
                if c.node == n:
                    self.files.link(d / f"cpu{c.id}", self.cpu_dir / f"cpu{c.id}")
            cpuless = spec.cpuless_spec(n)
            if cpuless is not None:
                if cpuless.initiators:
                    acc = d / "access0" / "initiators"
                    self.files.mkdir(acc)
                    for m in spec.cpu_node_ids:
                        if spec.socket_of_node(m) == cpuless.socket:
                            self.files.link(acc / f"node{m}", self.node_dir / f"node{m}")
                    targets = d / "access0" / "targets"
                    self.files.mkdir(targets)
            else:
                for other in ids[spec.cpu_node_count :]:
                    target = spec.cpuless_spec(other)
                    assert target is not None
                    if target.initiators and target.socket == spec.socket_of_node(n):
                        self.files.link(
                            d / "access0" / "targets" / f"node{other}",
                            self.node_dir / f"node{other}",
                        )

    # ---- cpus ----------------------------------------------------------------------------
    def write_cpus(self) -> None:
        spec = self.spec
        every = range(spec.cpu_count)
        online = spec.online_cpus
        self.files.write(self.cpu_dir / "possible", list_line(every))
        self.files.write(self.cpu_dir / "present", list_line(every))
        self.files.write(self.cpu_dir / "online", list_line(online))
        self.files.write(self.cpu_dir / "offline", list_line(spec.offline_cpus))
        self.files.write(self.cpu_dir / "kernel_max", f"{KERNEL_MAX}\n")
        self.files.write(self.cpu_dir / "isolated", "\n")
        smt = spec.threads_per_core > 1
        if spec.e_cores_per_node:  # what Intel hybrid parts expose (hwloc reads them)
            for pmu, e_core in (("cpu_core", False), ("cpu_atom", True)):
                kind = [c.id for c in self.layout if c.efficiency == e_core and c.online]
                self.files.write(self.sys / "devices" / pmu / "cpus", list_line(kind))
        self.files.write(self.cpu_dir / "smt" / "active", "1\n" if smt else "0\n")
        self.files.write(self.cpu_dir / "smt" / "control", "on\n" if smt else "notsupported\n")

        def group(key: Callable[[CpuLayout], Hashable]) -> dict[int, frozenset[int]]:
            members: dict[Hashable, set[int]] = {}
            for c in self.layout:
                if c.online:
                    members.setdefault(key(c), set()).add(c.id)
            return {c.id: frozenset(members.get(key(c), ())) for c in self.layout}

        core_sets = group(lambda c: c.core_index)
        cluster_sets = group(lambda c: c.cluster)
        pkg_sets = group(lambda c: c.socket)
        die_sets = group(lambda c: (c.socket, c.die))
        l3_sets = group(lambda c: c.l3)
        caches, l3_ways = CACHE_DEFAULTS.get(spec.vendor, CACHE_DEFAULTS["GenuineIntel"])
        l3_kb = l3_size_kb(self.spec)

        for c in self.layout:
            d = self.cpu_dir / f"cpu{c.id}"
            self.files.mkdir(d)
            if c.id != 0:
                self.files.write(d / "online", "1\n" if c.online else "0\n")
            self.files.link(d / f"node{c.node}", self.node_dir / f"node{c.node}")
            if not c.online:
                continue
            t = d / "topology"
            sets = {
                "thread_siblings": core_sets[c.id],
                "core_cpus": core_sets[c.id],
                "cluster_cpus": cluster_sets[c.id],
                "core_siblings": pkg_sets[c.id],
                "package_cpus": pkg_sets[c.id],
                "die_cpus": die_sets[c.id],
            }
            if spec.quirks.topology_siblings_only:  # architectures without package/core ids
                sets = {"thread_siblings": core_sets[c.id]}
            if spec.quirks.core_id_per_thread:  # kernels before die_id and cluster_id
                del sets["die_cpus"], sets["cluster_cpus"]
            per_core = spec.quirks.package_mask_per_core
            if per_core:  # POWER7 LPARs: the package mask is the L2's CPUs, one core
                sets = {"thread_siblings": core_sets[c.id], "core_siblings": core_sets[c.id]}
            for name, cpus in sets.items():
                self.files.write(t / name, kernel_mask(cpus, self.nbits) + "\n")
                self.files.write(t / f"{name}_list", list_line(cpus))
            if not spec.quirks.topology_siblings_only:
                package_id = -1 if spec.quirks.package_id_unknown or per_core else c.socket
                self.files.write(t / "physical_package_id", f"{package_id}\n")
                core_id = min(core_sets[c.id]) if per_core else c.core
                if spec.quirks.core_id_per_thread:  # each thread its own id, from 0 on each node
                    core_id = (c.core_index % spec.cores_per_node) * spec.threads_per_core + c.thread
                elif not per_core:
                    self.files.write(t / "die_id", f"{c.die}\n")
                    self.files.write(t / "cluster_id", f"{c.cluster}\n")
                self.files.write(t / "core_id", f"{core_id}\n")
            index = 0
            for level, ctype, size_kb, ways in caches:
                cache_id, shared = c.core_index, core_sets[c.id]
                if level == 2 and c.efficiency:  # E cores share their cluster's L2
                    cache_id, shared = c.cluster, cluster_sets[c.id]
                self._cache(d, index, level, ctype, size_kb, ways, cache_id, shared)
                index += 1
            l3_shared = frozenset() if spec.quirks.l3_map_zero else l3_sets[c.id]
            self._cache(d, index, 3, "Unified", l3_kb, l3_ways, c.l3, l3_shared)

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
        self.files.attributes(d, {
            "level": level, "type": ctype, "size": f"{size_kb}K", "ways_of_associativity": ways,
            "number_of_sets": size_kb * 1024 // (ways * line), "coherency_line_size": line,
            "physical_line_partition": 1,
        })
        if not self.spec.quirks.cache_map_only:  # older kernels: the mask alone, no id
            self.files.write(d / "id", f"{cache_id}\n")
            self.files.write(d / "shared_cpu_list", list_line(shared))
        self.files.write(d / "shared_cpu_map", kernel_mask(shared, self.nbits) + "\n")

    def write_global_hugepages(self) -> None:
        spec = self.spec
        for size in spec.hugepage_sizes():
            total = sum(spec.node_hugepages(n).get(size, (0, 0))[0] for n in spec.node_ids)
            free = sum(spec.node_hugepages(n).get(size, (0, 0))[1] for n in spec.node_ids)
            d = self.sys / "kernel" / "mm" / "hugepages" / f"hugepages-{size}kB"
            self.files.attributes(d, {
                "nr_hugepages": total, "nr_hugepages_mempolicy": total, "free_hugepages": free,
                "resv_hugepages": 0, "surplus_hugepages": 0, "nr_overcommit_hugepages": 0,
            })

    # ---- proc ----------------------------------------------------------------------------
    def write_proc(self) -> None:
        spec = self.spec
        self.files.write(self.proc / "cpuinfo", cpuinfo(spec))
        self.files.write(self.proc / "meminfo", meminfo(spec))
        self.files.write(self.proc / "cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro\n")
        self.files.write(self.proc / "version", "Linux version 6.1.0-fake (numa-pin machine kit)\n")
        self.files.write(self.proc / "sys" / "kernel" / "numa_balancing", "0\n")
        self.files.write(self.proc / "sys" / "kernel" / "osrelease", "6.1.0-fake\n")
        mounts = (
            "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
            "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
        )
        self.files.write(self.proc / "mounts", mounts)
        if spec.quirks.chip_ids_in_device_tree:
            self.write_device_tree()
        if any(p.gpu_uuid for p in spec.pci):
            self.files.write(
                self.proc / "driver" / "nvidia" / "version",
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05\n",
            )

    def write_device_tree(self) -> None:
        """``/proc/device-tree/cpus``: one node per core, named by its first thread's server
        number, with its chip and its threads as big-endian 32-bit cells (POWER firmware)."""
        cpus = self.proc / "device-tree" / "cpus"
        threads: dict[int, list[CpuLayout]] = {}
        for c in self.layout:
            threads.setdefault(c.core_index, []).append(c)
        for members in threads.values():
            first = min(m.id for m in members)
            d = cpus / f"PowerPC,POWER7@{first:x}"
            self.files.write(d / "name", b"PowerPC,POWER7\0")
            self.files.write(d / "device_type", b"cpu\0")
            self.files.write(d / "reg", first.to_bytes(4, "big"))
            self.files.write(d / "ibm,chip-id", members[0].socket.to_bytes(4, "big"))
            servers = b"".join(m.id.to_bytes(4, "big") for m in sorted(members, key=lambda m: m.id))
            self.files.write(d / "ibm,ppc-interrupt-server#s", servers)


__all__ = ["KERNEL_MAX", "BuiltMachine", "build", "build_once"]

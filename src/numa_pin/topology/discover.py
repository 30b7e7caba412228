"""Build a :class:`~numa_pin.topology.model.Topology` from a live (or fake) sysfs tree.

Only this module, :mod:`numa_pin.topology.discover_cpus` (the CPU half) and
:mod:`numa_pin.topology.pci` read the machine; everything they return is frozen data. Roots
are parameters: ``discover("/sys", "/proc")`` reads the live machine, ``discover(tmp_path)``
reads a test tree.

Sources (paths relative to the sysfs root):

* ``devices/system/node/online`` (else the ``nodeN`` directories): online NUMA nodes, whose
  ids may be sparse; per node ``cpulist`` (may be empty: a CPU-less node), ``distance``,
  ``meminfo`` (``MemTotal`` may be 0: a memory-less node) and
  ``hugepages/hugepages-<size>kB/{nr_hugepages,free_hugepages}``. ``has_cpu``,
  ``has_memory`` and ``has_normal_memory`` are not read: some kernels leave ``has_cpu``
  empty although nodes list CPUs.
* ``devices/system/cpu/online``: online CPUs (a CPU whose ``cpuN/online`` reads 0 is
  dropped too); per CPU ``topology/{physical_package_id,die_id,core_id,
  thread_siblings_list,cluster_id}`` (``package_cpus_list`` or ``core_siblings_list`` when
  the package id is unknown) and the level-3 entry of ``cache/indexN``.

What is required is what a decision needs: the CPU and node lists, each node's ``MemTotal``,
each online CPU's thread siblings. Anything else that is missing or meaningless has a
fallback; a file that is present but garbage is always an error naming it, and so is a
contradiction that would make a placement unsafe (a CPU two nodes list that no single
``cpuN/nodeM`` link settles, a distance row of the wrong length or with a negative entry).

Fallbacks (each is documented in ``docs/topology.md``):

* no ``devices/system/node`` directory (kernel built without NUMA): one node 0 holding
  every online CPU, distance row ``(10,)``, memory from ``<proc_root>/meminfo`` when a
  proc root is given (else 0), hugepages from ``kernel/mm/hugepages``;
* no ``nodeN/distance`` file, or a row of zeros (firmware without a SLIT) -> what the kernel
  uses without a SLIT: 10 to itself, 20 to every other node;
* a pool without ``free_hugepages`` -> free pages unknown (``None``);
* a CPU listed by several nodes' ``cpulist`` (a BIOS bug) -> the node of its single
  ``cpuN/nodeM`` link, which must be one of them; but when, besides, every node is as near
  every other as to itself (an all-10 SLIT: early Xeon 5400 boards list every CPU in each of
  8 nodes) -> one node, the first, with every CPU and only its own memory, as hwloc reads it;
* no ``MemFree`` line in ``nodeN/meminfo`` -> free memory unknown (``None``); no decision
  uses it (kubelet's memory manager works from capacity);
* ``die_id`` missing or negative -> 0; ``cluster_id`` missing, negative or 65535 (the
  kernel's "unknown") -> ``None``;
* ``physical_package_id`` -1 (POWER without ``ibm,chip-id``) or missing -> one socket per
  distinct ``package_cpus_list`` (else ``core_siblings_list``), numbered by lowest CPU after
  the known package ids; without either list, socket 0. The device tree's ``ibm,chip-id`` is
  not read: hwloc 2.9 reads no device tree, so on a POWER7 LPAR, whose package list is one
  core, each core is a package to both;
* ``core_id`` missing, or no package information at all, or core ids that do not name the
  thread siblings (AMD family 15h gives each core of a compute unit its own id, from 0 again
  on each node of a package) -> every core is its thread siblings, numbered by the lowest
  (core ids alone may repeat across the packages it cannot tell apart);
* ``thread_siblings_list`` missing -> the ``thread_siblings`` mask;
* L3 ``id`` missing -> the lowest CPU of that cache's ``shared_cpu_list``, else of its
  ``shared_cpu_map``; an empty list or map (an all-zero L3 map), or no level-3 cache ->
  ``None`` (unknown);
* a CPU absent from every node ``cpulist`` -> the node of its ``cpuN/nodeM`` link.
"""

from __future__ import annotations

import os
import re
from pathlib import PurePath

from numa_pin.base.record import replace
from numa_pin.errors import SysfsError, TopologyError
from numa_pin.topology.discover_cpus import (
    CPU_DIR,
    NODE_DIR,
    linked_nodes,
    read_cpus,
    read_l3_id,
    read_online_cpus,
)
from numa_pin.topology.model import HugePages, NumaNode, Topology
from numa_pin.topology.pci import discover_pci
from numa_pin.topology.sysfs import SysfsReader, parse_int_row, parse_meminfo

GLOBAL_HUGEPAGES_DIR = "kernel/mm/hugepages"
#: SLIT distance of a node to itself; the only row a non-NUMA machine has
LOCAL_DISTANCE = 10
#: what the kernel uses between two different nodes when firmware gives no SLIT
REMOTE_DISTANCE = 20
_NODE_RE = re.compile(r"node(\d+)")
_HUGEPAGES_RE = re.compile(r"hugepages-(\d+)kB")


def discover(
    sysfs_root: str | os.PathLike[str] = "/sys",
    proc_root: str | os.PathLike[str] | None = None,
    *,
    pci: bool = True,
) -> Topology:
    """Read the machine below ``sysfs_root`` (and ``proc_root`` for NVIDIA GPU identity
    and the non-NUMA memory fallback).

    ``pci=False`` skips PCI devices (faster when only CPUs and memory matter).

    Raises :class:`~numa_pin.errors.SysfsError` naming the file when a required file is
    missing, unreadable or garbage, and :class:`~numa_pin.errors.TopologyError` when the
    files disagree (a CPU in no node or in two nodes, a distance row of the wrong length).
    """
    reader = SysfsReader(sysfs_root)
    proc = SysfsReader(proc_root) if proc_root is not None else None
    return discover_with(reader, proc, pci=pci)


def discover_with(
    reader: SysfsReader, proc: SysfsReader | None = None, *, pci: bool = True
) -> Topology:
    """:func:`discover` over already-built readers. Raises what :func:`discover` raises."""
    online = read_online_cpus(reader)
    nodes = read_nodes(reader, online, proc)
    cpus = read_cpus(reader, online, nodes)
    devices = discover_pci(reader, nodes, proc) if pci else ()
    return Topology(nodes=nodes, cpus=cpus, pci_devices=devices, source=str(reader.root))


# ---- NUMA nodes ------------------------------------------------------------------------
def read_online_nodes(reader: SysfsReader) -> tuple[int, ...] | None:
    """Sorted online node ids, or None when the kernel has no ``devices/system/node``.

    Uses ``node/online``; when that file is missing, the ``nodeN`` directories.
    Raises SysfsError when the list is garbage or empty.
    """
    if not reader.is_dir(NODE_DIR):
        return None
    online_path = f"{NODE_DIR}/online"
    if reader.exists(online_path):
        ids = sorted(reader.read_list(online_path))
    else:
        ids = sorted(
            int(m.group(1)) for name in reader.listdir(NODE_DIR) if (m := _NODE_RE.fullmatch(name))
        )
    if not ids:
        raise SysfsError(reader.path(online_path), "no online NUMA node")
    return tuple(ids)


def read_nodes(
    reader: SysfsReader, online_cpus: frozenset[int], proc: SysfsReader | None = None
) -> dict[int, NumaNode]:
    """One :class:`NumaNode` per online node, keyed and ordered by id.

    Node CPU sets are restricted to ``online_cpus``. Without ``devices/system/node`` the
    single-node fallback described in the module docstring applies. Raises SysfsError
    for a missing/garbage node file, including a distance row of the wrong length.
    """
    ids = read_online_nodes(reader)
    if ids is None:
        return {0: _single_node(reader, online_cpus, proc)}
    nodes = {nid: _read_node(reader, nid, ids, online_cpus) for nid in ids}
    return _settle_overlaps(reader, nodes)


def _settle_overlaps(reader: SysfsReader, nodes: dict[int, NumaNode]) -> dict[int, NumaNode]:
    """Give a CPU that several node cpulists name (a BIOS bug) to the one node its
    ``cpuN/nodeM`` link names, as the kernel's own ``cpu_to_node`` does; but when every
    distance between nodes is the same as a node's to itself, the firmware tells the nodes
    apart by nothing: the machine is one node, the first, holding every CPU (hwloc's reading).

    Raises TopologyError naming both cpulists when the links do not name exactly one node,
    or name one that does not list the CPU: its node, and so any placement on it, would be
    a guess.
    """
    listed: dict[int, list[int]] = {}
    for node in nodes.values():
        for cpu in node.cpus:
            listed.setdefault(cpu, []).append(node.id)
    if len(nodes) > 1 and any(len(owners) > 1 for owners in listed.values()) and _flat(nodes):
        kept = nodes[min(nodes)]
        return {kept.id: replace(kept, cpus=frozenset(listed), distances=kept.distances[:1])}
    owner: dict[int, int] = {}
    for cpu, owners in sorted(listed.items()):
        if len(owners) < 2:
            continue
        linked = linked_nodes(reader, cpu, nodes)
        if len(linked) != 1 or linked[0] not in owners:
            first, second = (reader.path(f"{NODE_DIR}/node{n}/cpulist") for n in owners[:2])
            links = ",".join(f"node{n}" for n in linked) or "none"
            raise TopologyError(
                f"{first} and {second} both list CPU {cpu}, and the nodeN links of "
                f"{reader.path(f'{CPU_DIR}/cpu{cpu}')} ({links}) do not name one of them: "
                "its node is unknown"
            )
        owner[cpu] = linked[0]
    if not owner:
        return nodes
    return {
        nid: replace(node, cpus=frozenset(c for c in node.cpus if owner.get(c, nid) == nid))
        for nid, node in nodes.items()
    }


def _flat(nodes: dict[int, NumaNode]) -> bool:
    """Whether every distance in every node's row is the same (an all-10 SLIT)."""
    return len({d for node in nodes.values() for d in node.distances}) == 1


def _read_node(
    reader: SysfsReader, nid: int, ids: tuple[int, ...], online_cpus: frozenset[int]
) -> NumaNode:
    base = f"{NODE_DIR}/node{nid}"
    cpus = reader.read_list(f"{base}/cpulist") & online_cpus
    distances = _read_distance_row(reader, f"{base}/distance", ids)
    total, free = _read_meminfo(reader, f"{base}/meminfo")
    return NumaNode(
        id=nid,
        cpus=cpus,
        memory_total_kb=total,
        memory_free_kb=free,
        distances=distances,
        hugepages=read_hugepages(reader, f"{base}/hugepages"),
    )


def _read_distance_row(reader: SysfsReader, rel: str, ids: tuple[int, ...]) -> tuple[int, ...]:
    full = reader.path(rel)
    nid = int(PurePath(rel).parent.name.removeprefix("node"))
    if not reader.exists(rel):
        return _no_slit_row(nid, ids)
    text = reader.read_str(rel)
    try:
        row = parse_int_row(text)
    except ValueError as exc:
        raise SysfsError(full, f"garbage content: {exc}") from exc
    if not any(row):  # all zeros: firmware gave no SLIT, as if the file were missing
        return _no_slit_row(nid, ids)
    if len(row) != len(ids):
        raise SysfsError(
            full,
            f"distance row has {len(row)} entries, expected {len(ids)} "
            f"(one per online node {list(ids)})",
        )
    if any(d <= 0 for d in row):
        raise SysfsError(full, f"non-positive distance in row {list(row)}")
    return row


def _no_slit_row(nid: int, ids: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(LOCAL_DISTANCE if other == nid else REMOTE_DISTANCE for other in ids)


def _read_meminfo(reader: SysfsReader, rel: str) -> tuple[int, int | None]:
    """``(MemTotal, MemFree)`` in kB; MemFree is None when the file has no such line."""
    full = reader.path(rel)
    text = reader.read_str(rel)
    try:
        info = parse_meminfo(text)
    except ValueError as exc:
        raise SysfsError(full, f"garbage content: {exc}") from exc
    if "MemTotal" not in info:
        raise SysfsError(
            full, "no MemTotal line (expected '[Node N] MemTotal: <kB> kB': the node's capacity)"
        )
    return info["MemTotal"], info.get("MemFree")


def read_hugepages(reader: SysfsReader, rel: str) -> tuple[HugePages, ...]:
    """Hugepage pools under ``rel`` (``hugepages-<size>kB`` dirs), ordered by size.

    A missing directory means no hugepage support: ``()``; a pool without
    ``free_hugepages`` has unknown (None) free pages. Raises SysfsError for a missing or
    garbage ``nr_hugepages``, or a garbage ``free_hugepages``, inside an existing pool.
    """
    if not reader.is_dir(rel):
        return ()
    pools = sorted(
        (int(m.group(1)), name)
        for name in reader.listdir(rel)
        if (m := _HUGEPAGES_RE.fullmatch(name))
    )
    return tuple(
        HugePages(
            size_kb=size,
            total=reader.read_int(f"{rel}/{name}/nr_hugepages"),
            free=_optional_int(reader, f"{rel}/{name}/free_hugepages"),
        )
        for size, name in pools
    )


def _optional_int(reader: SysfsReader, rel: str) -> int | None:
    return reader.read_int(rel) if reader.exists(rel) else None


def _single_node(
    reader: SysfsReader, online_cpus: frozenset[int], proc: SysfsReader | None
) -> NumaNode:
    total: int = 0
    free: int | None = 0
    if proc is not None:
        total, free = _read_meminfo(proc, "meminfo")
    return NumaNode(
        id=0,
        cpus=online_cpus,
        memory_total_kb=total,
        memory_free_kb=free,
        distances=(LOCAL_DISTANCE,),
        hugepages=read_hugepages(reader, GLOBAL_HUGEPAGES_DIR),
    )


__all__ = [
    "discover",
    "discover_with",
    "read_cpus",
    "read_hugepages",
    "read_l3_id",
    "read_nodes",
    "read_online_cpus",
    "read_online_nodes",
]

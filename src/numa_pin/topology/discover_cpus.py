"""The CPU half of sysfs discovery: online CPUs, their topology ids, thread siblings, L3 and node.

:func:`numa_pin.topology.discover.discover` calls these after reading the nodes; the fallbacks
are listed in that module's docstring and in ``docs/topology.md``. Every read goes through
:class:`~numa_pin.topology.sysfs.SysfsReader`, so every error names its file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from numa_pin.base.record import replace
from numa_pin.errors import SysfsError, TopologyError
from numa_pin.topology.model import Cpu, NumaNode
from numa_pin.topology.sysfs import SysfsReader

NODE_DIR = "devices/system/node"
CPU_DIR = "devices/system/cpu"
#: ``cluster_id`` value x86 kernels print when the cluster is unknown (BAD_APICID)
_UNKNOWN_CLUSTER = 0xFFFF
#: per-CPU lists naming the CPUs of its package, newest name first
_PACKAGE_LISTS = ("package_cpus_list", "core_siblings_list")

_NODE_RE = re.compile(r"node(\d+)")
_INDEX_RE = re.compile(r"index(\d+)")

def read_online_cpus(reader: SysfsReader) -> frozenset[int]:
    """Online CPU ids: ``cpu/online`` minus CPUs whose ``cpuN/online`` reads 0.

    Raises SysfsError when ``cpu/online`` is missing, garbage or empty.
    """
    path = f"{CPU_DIR}/online"
    listed = reader.read_list(path)
    if not listed:
        raise SysfsError(reader.path(path), "no online CPU listed")
    online = set()
    for cpu in listed:
        flag = f"{CPU_DIR}/cpu{cpu}/online"
        if reader.exists(flag) and reader.read_int(flag) == 0:
            continue
        online.add(cpu)
    return frozenset(online)


def read_cpus(
    reader: SysfsReader, online: frozenset[int], nodes: dict[int, NumaNode]
) -> dict[int, Cpu]:
    """One :class:`Cpu` per online CPU, keyed and ordered by id.

    Raises SysfsError for a missing/garbage topology file and TopologyError for a CPU
    that belongs to no node (or whose ``nodeN`` link is ambiguous).
    """
    node_of = _cpu_to_node(nodes)
    cpus = {cpu: _read_cpu(reader, cpu, online, nodes, node_of) for cpu in sorted(online)}
    cpus, guessed = _number_unknown_packages(reader, cpus)
    if guessed or any(c.core < 0 for c in cpus.values()) or not _ids_name_cores(cpus):
        # core ids are unknown, may repeat across packages that cannot be told apart, or do
        # not name the thread siblings (AMD family 15h): a physical core is its thread
        # siblings, numbered by the lowest, as hwloc makes its Core objects
        cpus = {cpu: replace(c, core=min(c.siblings)) for cpu, c in cpus.items()}
    return cpus


def _ids_name_cores(cpus: Mapping[int, Cpu]) -> bool:
    """Whether the CPUs sharing each (package, die, core id) are exactly its thread siblings."""
    members: dict[tuple[int, int, int], set[int]] = {}
    for c in cpus.values():
        members.setdefault(c.core_key, set()).add(c.id)
    return all(members[c.core_key] == c.siblings for c in cpus.values())


def _number_unknown_packages(
    reader: SysfsReader, cpus: dict[int, Cpu]
) -> tuple[dict[int, Cpu], bool]:
    """Give CPUs whose ``physical_package_id`` is negative or missing (read as -1) a socket:
    one per distinct package CPU list, numbered by lowest CPU after the highest known id.
    The flag is True when some CPU had no package list either (its socket is a guess)."""
    unknown = [cpu for cpu in cpus.values() if cpu.socket < 0]
    if not unknown:
        return cpus, False
    groups: dict[int, frozenset[int]] = {}
    for cpu in unknown:
        groups[cpu.id] = _package_list(reader, cpu.id) or frozenset({-1})
    first = max((c.socket for c in cpus.values()), default=-1) + 1
    order = sorted(set(groups.values()), key=min)
    number = {group: first + i for i, group in enumerate(order)}
    out = dict(cpus)
    for cpu in unknown:
        group = groups[cpu.id]
        socket = 0 if group == frozenset({-1}) and first == 0 else number[group]
        out[cpu.id] = replace(cpu, socket=socket)
    return out, frozenset({-1}) in number


def _package_list(reader: SysfsReader, cpu: int) -> frozenset[int] | None:
    topo = f"{CPU_DIR}/cpu{cpu}/topology"
    for name in _PACKAGE_LISTS:
        if reader.exists(f"{topo}/{name}"):
            return reader.read_list(f"{topo}/{name}")
    return None


def _read_cpu(
    reader: SysfsReader,
    cpu: int,
    online: frozenset[int],
    nodes: dict[int, NumaNode],
    node_of: dict[int, int],
) -> Cpu:
    base = f"{CPU_DIR}/cpu{cpu}"
    topo = f"{base}/topology"
    socket = -1  # unknown: numbered later
    if reader.exists(f"{topo}/physical_package_id"):
        socket = max(reader.read_int(f"{topo}/physical_package_id"), -1)
    die = max(reader.read_int(f"{topo}/die_id"), 0) if reader.exists(f"{topo}/die_id") else 0
    core_path = f"{topo}/core_id"
    core = -1  # unknown: numbered by its siblings later
    if reader.exists(core_path):
        core = reader.read_int(core_path)
        if core < 0:
            raise SysfsError(reader.path(core_path), f"negative core_id {core}")
    siblings = (_thread_siblings(reader, topo) & online) | {cpu}
    cluster: int | None = None
    if reader.exists(f"{topo}/cluster_id"):
        raw = reader.read_int(f"{topo}/cluster_id")
        cluster = raw if 0 <= raw != _UNKNOWN_CLUSTER else None
    numa = node_of.get(cpu)
    if numa is None:
        numa = _node_from_link(reader, cpu, nodes)
    return Cpu(
        id=cpu,
        socket=socket,
        die=die,
        core=core,
        numa=numa,
        siblings=frozenset(siblings),
        l3=read_l3_id(reader, cpu),
        cluster=cluster,
    )


def _thread_siblings(reader: SysfsReader, topo: str) -> frozenset[int]:
    """``thread_siblings_list``, else the ``thread_siblings`` mask; SysfsError (naming the
    list) when neither is there."""
    listed = f"{topo}/thread_siblings_list"
    if not reader.exists(listed) and reader.exists(f"{topo}/thread_siblings"):
        return reader.read_mask(f"{topo}/thread_siblings")
    return reader.read_list(listed)


def read_l3_id(reader: SysfsReader, cpu: int) -> int | None:
    """The id of ``cpu``'s level-3 cache, or None when it is unknown.

    Uses ``cache/indexN/id``; when that is missing, the lowest CPU in the cache's
    ``shared_cpu_list``, else in its ``shared_cpu_map`` (the same for every CPU sharing the
    cache). None when sysfs shows no level-3 cache, or when its list or map is empty (some
    kernels write an all-zero L3 map) or both are missing. Raises SysfsError for garbage
    ``level``/``id``/``shared_cpu_list``/``shared_cpu_map`` files.
    """
    cache = f"{CPU_DIR}/cpu{cpu}/cache"
    if not reader.is_dir(cache):
        return None
    indexes = sorted(
        (int(m.group(1)), name)
        for name in reader.listdir(cache)
        if (m := _INDEX_RE.fullmatch(name))
    )
    for _, name in indexes:
        index = f"{cache}/{name}"
        if reader.read_int(f"{index}/level") != 3:
            continue
        if reader.exists(f"{index}/id"):
            return reader.read_int(f"{index}/id")
        if reader.exists(f"{index}/shared_cpu_list"):
            shared = reader.read_list(f"{index}/shared_cpu_list")
        elif reader.exists(f"{index}/shared_cpu_map"):
            shared = reader.read_mask(f"{index}/shared_cpu_map")
        else:
            return None
        return min(shared) if shared else None
    return None


def _cpu_to_node(nodes: dict[int, NumaNode]) -> dict[int, int]:
    """CPU -> node (the node cpulists are disjoint once :func:`read_nodes` has settled them)."""
    return {cpu: node.id for node in nodes.values() for cpu in node.cpus}


def linked_nodes(reader: SysfsReader, cpu: int, nodes: Mapping[int, object]) -> list[int]:
    """The online nodes ``cpuN/nodeM`` links name (the kernel's ``cpu_to_node``)."""
    base = f"{CPU_DIR}/cpu{cpu}"
    if not reader.is_dir(base):
        return []
    return [
        int(m.group(1))
        for name in reader.listdir(base)
        if (m := _NODE_RE.fullmatch(name)) and int(m.group(1)) in nodes
    ]


def _node_from_link(reader: SysfsReader, cpu: int, nodes: dict[int, NumaNode]) -> int:
    base = f"{CPU_DIR}/cpu{cpu}"
    linked = linked_nodes(reader, cpu, nodes)
    if len(linked) == 1:
        return linked[0]
    cpulists = reader.path(f"{NODE_DIR}/node*/cpulist")
    raise TopologyError(
        f"{reader.path(base)}: CPU {cpu} is online but in no node's cpulist ({cpulists}) "
        f"and has {len(linked)} nodeN links to online nodes"
    )


__all__ = ["CPU_DIR", "NODE_DIR", "linked_nodes", "read_cpus", "read_l3_id", "read_online_cpus"]

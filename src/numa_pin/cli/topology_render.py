"""Present a :class:`~numa_pin.topology.model.Topology` as JSON data or text (pure).

:func:`to_json_dict` returns plain ``dict``/``list``/``str``/``int``/``None`` values ready
for :func:`json.dumps`; the schema is documented in ``docs/topology.md``. Object keys are
ids written as decimal strings (JSON requires string keys); every other number stays a
JSON number. :func:`render_text` is the human view printed by ``numa-pin topology``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from numa_pin.base.cpuset import format_list
from numa_pin.errors import TopologyError
from numa_pin.topology.model import KIND_OTHER, Cpu, NumaNode, PciDevice, Topology


# ---- JSON ------------------------------------------------------------------------------
def to_json_dict(topology: Topology) -> dict[str, Any]:
    """The topology as JSON-ready data (schema: ``docs/topology.md``).

    Raises TopologyError when a node's distance row does not have one entry per node.
    """
    ids = topology.node_ids
    return {
        "numa_nodes": {str(n): _node_json(topology.nodes[n], ids) for n in ids},
        "cpus": {str(c): _cpu_json(topology.cpus[c]) for c in sorted(topology.cpus)},
        "pci_devices": [_device_json(d, topology) for d in topology.pci_devices],
    }


def _node_json(node: NumaNode, ids: tuple[int, ...]) -> dict[str, Any]:
    return {
        "cpus": sorted(node.cpus),
        "memory_total_kb": node.memory_total_kb,
        "memory_free_kb": node.memory_free_kb,
        "distances": {str(other): d for other, d in zip(ids, _checked_row(node, ids), strict=True)},
        "hugepages": {
            str(hp.size_kb): {"total": hp.total, "free": hp.free}
            for hp in sorted(node.hugepages, key=lambda h: h.size_kb)
        },
    }


#: the keys of a CPU's and a PCI device's JSON object, in schema order (``docs/topology.md``)
_CPU_KEYS = ("socket", "die", "core", "cluster", "numa", "l3", "siblings")
_DEVICE_KEYS = ("address", "vendor", "device", "class", "numa_node", "driver", "kind", "netdevs", "physfn", "vfs",
                "sriov_totalvfs", "sriov_numvfs", "iommu_group", "parent", "local_cpus", "gpu_uuid", "gpu_minor")
#: a key whose attribute has another name, and the sets and tuples JSON gets as sorted lists
_ATTRIBUTE = {"class": "pci_class"}
_TO_LIST: dict[str, Callable[[Any], list[Any]]] = {
    "siblings": sorted, "local_cpus": sorted, "netdevs": list, "vfs": list,
}


def _object_json(obj: object, keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        value = getattr(obj, _ATTRIBUTE.get(key, key))
        convert = _TO_LIST.get(key)
        out[key] = value if convert is None else convert(value)
    return out


def _cpu_json(cpu: Cpu) -> dict[str, Any]:
    return _object_json(cpu, _CPU_KEYS)


def _device_json(dev: PciDevice, topology: Topology) -> dict[str, Any]:
    from numa_pin.devices.pcie import dra_attributes

    lists = {k: v for k, v in dra_attributes(topology, dev.address, lists=True).items() if isinstance(v, list)}
    return {**_object_json(dev, _DEVICE_KEYS), "dra": dra_attributes(topology, dev.address), "dra_lists": lists}


def _checked_row(node: NumaNode, ids: tuple[int, ...]) -> tuple[int, ...]:
    if len(node.distances) != len(ids):
        raise TopologyError(
            f"node {node.id}: distance row has {len(node.distances)} entries for {len(ids)} nodes"
        )
    return node.distances


# ---- text ------------------------------------------------------------------------------
def render_text(topology: Topology) -> str:
    """A human-readable report: per node its CPUs by core, memory, hugepages and local
    GPUs/NICs, then devices with no node, then the distance matrix.

    Raises TopologyError when a node's distance row does not have one entry per node.
    """
    ids = topology.node_ids
    multi_socket = len(topology.sockets()) > 1
    multi_die = len({(c.socket, c.die) for c in topology.cpus.values()}) > len(topology.sockets())
    lines = [
        f"Machine: {_count(len(ids), 'NUMA node')}, {_count(len(topology.sockets()), 'socket')}, "
        f"{_count(len(topology.cpus), 'online CPU')}"
        + (f" (from {topology.source})" if topology.source else ""),
    ]
    for n in ids:
        node = topology.nodes[n]
        lines.append("")
        lines.append(f"NUMA node {n}")
        lines.extend(_node_cpu_lines(topology, node, multi_socket, multi_die))
        free = "unknown" if node.memory_free_kb is None else _kb(node.memory_free_kb)
        lines.append(f"  memory: {_kb(node.memory_total_kb)} total, {free} free")
        lines.append(f"  hugepages: {_hugepages_text(node)}")
        lines.extend(_device_lines(topology.devices_on_node(n), "  devices:"))
    orphans = tuple(d for d in topology.pci_devices if d.numa_node is None)
    if orphans:
        lines.append("")
        lines.extend(_device_lines(orphans, "PCI devices with no NUMA node:"))
    lines.append("")
    lines.append("NUMA distances:")
    lines.extend(_distance_table(topology))
    return "\n".join(lines) + "\n"


def _node_cpu_lines(
    topology: Topology, node: NumaNode, multi_socket: bool, multi_die: bool
) -> list[str]:
    cpus = sorted(node.cpus & topology.cpu_ids)
    if not cpus:
        return ["  cpus: none (memory-only node)"]
    lines = [f"  cpus: {format_list(cpus)} ({len(cpus)})"]
    cores: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for c in cpus:
        cores[topology.cpus[c].core_key].append(c)
    for (socket, die, core), members in sorted(cores.items(), key=lambda kv: min(kv[1])):
        label = f"core {core}"
        if multi_die:
            label = f"die {die} {label}"
        if multi_socket:
            label = f"socket {socket} {label}"
        lines.append(f"    {label}: {','.join(str(m) for m in members)}")
    return lines


def _device_lines(devices: tuple[PciDevice, ...], title: str) -> list[str]:
    """GPUs, NICs and InfiniBand HCAs (``rdma``) one per line (VFs folded into their PF's line);
    others counted."""
    shown = [d for d in devices if d.kind != KIND_OTHER and not d.is_vf]
    vfs = sum(1 for d in devices if d.is_vf)
    others = sum(1 for d in devices if d.kind == KIND_OTHER and not d.is_vf)
    lines = [title if shown or vfs or others else f"{title} none"]
    indent = "  " + " " * (len(title) - len(title.lstrip()))
    for d in shown:
        parts = [d.address, f"{d.kind:<5}", f"{d.vendor}:{d.device}", d.driver or "(no driver)"]
        if d.netdevs:
            parts.append(",".join(d.netdevs))
        if d.gpu_uuid:
            parts.append(f"{d.gpu_uuid} minor {d.gpu_minor}")
        if d.is_pf:
            parts.append(f"sriov {d.sriov_numvfs or 0}/{d.sriov_totalvfs} VFs")
        lines.append(indent + "  ".join(parts))
    if vfs:
        lines.append(f"{indent}{_count(vfs, 'SR-IOV virtual function')}")
    if others:
        lines.append(f"{indent}{_count(others, 'other PCI function')}")
    return lines


def _distance_table(topology: Topology) -> list[str]:
    ids = topology.node_ids
    rows = {n: _checked_row(topology.nodes[n], ids) for n in ids}
    width = max(
        [len("node")] + [len(str(v)) for v in ids] + [len(str(d)) for r in rows.values() for d in r]
    )
    header = "  " + "node".rjust(width) + "".join(f" {n:>{width}}" for n in ids)
    body = ["  " + f"{n:>{width}}" + "".join(f" {d:>{width}}" for d in rows[n]) for n in ids]
    return [header, *body]


def _hugepages_text(node: NumaNode) -> str:
    if not node.hugepages:
        return "none"
    return "; ".join(
        f"{hp.size_kb} kB: {hp.total} total, {'unknown' if hp.free is None else hp.free} free"
        for hp in sorted(node.hugepages, key=lambda h: h.size_kb)
    )


def _kb(kb: int) -> str:
    return f"{kb} kB ({kb / (1024 * 1024):.1f} GiB)"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


__all__ = ["render_text", "to_json_dict"]

"""A discovered topology, cached for the hook (which runs on every container start).

Full discovery reads a few files per CPU and per PCI function: tens of milliseconds on a small
server, hundreds on a big one. The cache stores the :class:`Topology` as JSON next to a
*fingerprint* of the things that change it at run time, and re-discovers when any differs:

* the boot id (a reboot may change everything);
* ``cpu/online`` and ``node/online`` (CPU and node hotplug);
* every node's ``nr_hugepages`` per size (an operator reserving hugepages);
* the list of PCI functions (hotplug, ``sriov_numvfs`` creating or removing VFs).

Free memory is not part of the fingerprint and is not used for decisions (kubelet's memory
manager also works from capacity). An entry older than ``max_age`` seconds is refreshed anyway,
which bounds staleness from changes the fingerprint cannot see (driver rebinding). Any error
reading or parsing the cache falls back to discovery: the cache can make the hook faster, never
wrong for longer than ``max_age``.
"""

from __future__ import annotations

import json
import os
import time

from numa_pin.base.boundedio import UnsafeInput, json_loads_bounded, read_fd, read_regular_file
from numa_pin.base.digest import sha256_hex
from numa_pin.base.safefs import ensure_dir, open_private, replace_private
from numa_pin.errors import UnsafePathError
from numa_pin.topology.model import Cpu, HugePages, NumaNode, PciDevice, Topology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

FORMAT = 1
DEFAULT_MAX_AGE_S = 60.0
#: largest cache file read (a 64-node, 1024-CPU machine with hundreds of PCI functions is ~1 MiB)
MAX_CACHE_BYTES = 32 << 20


#: largest file a fingerprint reads (each is a line: a CPU list, a count, an id)
_MAX_PART_BYTES = 64 << 10


def _read(path: str) -> str:
    """The file's text, "-" when it cannot be read (bytes decoded here: a text-mode open costs
    every hook two more system calls a file, and its first one a codec import)."""
    try:
        return read_regular_file(path, _MAX_PART_BYTES).decode("ascii", "replace").strip()
    except (OSError, UnsafeInput):
        return "-"


def fingerprint(sysfs_root: str, proc_root: str | None) -> str:
    """A short hash of what changes a topology at run time (cheap: a few dozen reads)."""
    sysfs_root = os.fspath(sysfs_root)
    proc_root = None if proc_root is None else os.fspath(proc_root)
    parts = [sysfs_root, str(proc_root)]
    if proc_root:
        parts.append(_read(os.path.join(proc_root, "sys/kernel/random/boot_id")))
    system = os.path.join(sysfs_root, "devices/system")
    parts.append(_read(os.path.join(system, "cpu/online")))
    parts.append(_read(os.path.join(system, "node/online")))
    node_dir = os.path.join(system, "node")
    try:
        nodes = sorted(n for n in os.listdir(node_dir) if n.startswith("node"))
    except OSError:
        nodes = []
    for node in nodes:
        hp = os.path.join(node_dir, node, "hugepages")
        try:
            sizes = sorted(os.listdir(hp))
        except OSError:
            continue
        parts.extend(f"{node}/{s}={_read(os.path.join(hp, s, 'nr_hugepages'))}" for s in sizes)
    try:
        parts.extend(sorted(os.listdir(os.path.join(sysfs_root, "bus/pci/devices"))))
    except OSError:
        parts.append("no-pci")
    return sha256_hex("\n".join(parts).encode())


def to_dict(topology: Topology) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": n.id, "cpus": sorted(n.cpus), "total": n.memory_total_kb, "free": n.memory_free_kb,
             "distances": list(n.distances), "hugepages": [[h.size_kb, h.total, h.free] for h in n.hugepages]}
            for n in topology.nodes.values()
        ],
        "cpus": [
            [c.id, c.socket, c.die, c.core, c.numa, sorted(c.siblings), c.l3, c.cluster]
            for c in topology.cpus.values()
        ],
        "pci": [
            {**{k: getattr(d, k) for k in _PCI_SCALARS}, "netdevs": list(d.netdevs), "vfs": list(d.vfs),
             "local_cpus": sorted(d.local_cpus)}
            for d in topology.pci_devices
        ],
        "source": topology.source,
    }


_PCI_SCALARS = (
    "address", "vendor", "device", "pci_class", "numa_node", "driver", "iommu_group", "kind", "physfn",
    "sriov_totalvfs", "sriov_numvfs", "parent", "gpu_uuid", "gpu_minor",
)


def from_dict(d: dict[str, Any]) -> Topology:
    nodes = {
        n["id"]: NumaNode(
            n["id"], frozenset(n["cpus"]), n["total"], n["free"], tuple(n["distances"]),
            tuple(HugePages(*h) for h in n["hugepages"]),
        )
        for n in d["nodes"]
    }
    cpus = {
        c[0]: Cpu(id=c[0], socket=c[1], die=c[2], core=c[3], numa=c[4], siblings=frozenset(c[5]), l3=c[6], cluster=c[7])
        for c in d["cpus"]
    }
    pci = tuple(
        PciDevice(**{k: p[k] for k in _PCI_SCALARS}, netdevs=tuple(p["netdevs"]), vfs=tuple(p["vfs"]),
                  local_cpus=frozenset(p["local_cpus"]))
        for p in d["pci"]
    )
    return Topology(nodes=nodes, cpus=cpus, pci_devices=pci, source=d["source"])


def cached_discover(
    sysfs_root: str,
    proc_root: str | None,
    cache_dir: str | None,
    *,
    max_age: float = DEFAULT_MAX_AGE_S,
    now: float | None = None,
) -> Topology:
    """:func:`~numa_pin.topology.discover.discover`, through the cache in ``cache_dir``.

    Without a cache dir this is plain discovery. Relative roots are made absolute first (the
    cache is keyed by the tree). The cache directory is created 0700 and checked
    (:func:`numa_pin.base.safefs.ensure_dir`); a cache file that is not this user's private regular
    file is ignored and replaced.

    Raises:
        UnsafePathError: the cache directory, or one above it, could be written by others.
        TopologyError: what discovery raises.
    """
    if not cache_dir:
        return _discover(sysfs_root, proc_root)
    # one entry per tree: a relative root names another tree from another directory
    sysfs_root = os.path.abspath(sysfs_root)
    proc_root = None if proc_root is None else os.path.abspath(proc_root)
    now = time.time() if now is None else now
    fp = fingerprint(sysfs_root, proc_root)
    path = os.path.join(cache_dir, "topology-" + sha256_hex(sysfs_root.encode())[:16] + ".json")
    try:
        ensure_dir(cache_dir, 0o700)
    except OSError:
        return _discover(sysfs_root, proc_root)  # cannot create or examine it: no cache, only slower
    doc = _read_cache(path)
    try:
        if doc.get("format") == FORMAT and doc.get("fingerprint") == fp and 0 <= now - doc.get("time", 0) <= max_age:
            return from_dict(doc["topology"])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        pass  # absent, stale or damaged: rediscover below
    topology = _discover(sysfs_root, proc_root)
    _write_cache(cache_dir, path, {"format": FORMAT, "fingerprint": fp, "time": now, "topology": to_dict(topology)})
    return topology


def _discover(sysfs_root: str, proc_root: str | None) -> Topology:
    """Discovery, imported only on a miss (a hit, the hook's usual case, never needs its modules)."""
    from numa_pin.topology.discover import discover

    return discover(sysfs_root, proc_root)


def _read_cache(path: str) -> dict[str, Any]:
    """The cache document, or ``{}`` when it is absent, damaged or not trustworthy: not a regular
    file of this user (a symlink is not followed), writable by others, too large or too deep."""
    try:
        fd = open_private(path, os.O_RDONLY)
    except (OSError, UnsafePathError):
        return {}
    try:
        doc = json_loads_bounded(read_fd(fd, MAX_CACHE_BYTES), 16)
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    return doc if isinstance(doc, dict) else {}


def _write_cache(cache_dir: str, path: str, doc: dict[str, Any]) -> None:
    """Best effort: a private temp file (``O_EXCL``, 0600, unpredictable name) renamed over
    ``path``; a read-only or full cache directory only costs speed."""
    try:
        replace_private(cache_dir, path, json.dumps(doc).encode("utf-8"))
    except (OSError, ValueError):
        pass

"""Copy the topology part of a live sysfs into a small test fixture.

    python tests/testing/snapshots/capture.py NAME [--sysfs /sys]

writes ``tests/testing/snapshots/NAME/sys`` (give lstopo ``--if fsroot``: there is no
``proc``): node and CPU lists, per node ``cpulist``,
``cpumap``, ``distance``, the capacity lines of ``meminfo`` and hugepage counts; per CPU its
``topology/`` and ``cache/`` files; per PCI function its ids, class, ``numa_node``,
``local_cpus``/``local_cpulist``, the first 64 bytes of ``config`` with the BARs zeroed, the
driver link and the names of its network interfaces (no addresses). Nothing else is kept:
no DMI, serial numbers, MAC addresses, hostnames or memory usage beyond capacity and free.
Symlinks are recreated relative, as the kernel lays them out.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path

NODE_LISTS = ("online", "possible", "has_cpu", "has_memory", "has_normal_memory")
CPU_LISTS = ("online", "possible", "present", "offline", "kernel_max")
CACHE_FILES = (
    "level",
    "type",
    "size",
    "id",
    "shared_cpu_list",
    "shared_cpu_map",
    "coherency_line_size",
    "ways_of_associativity",
    "number_of_sets",
    "physical_line_partition",
)
PCI_FILES = (
    "vendor",
    "device",
    "class",
    "subsystem_vendor",
    "subsystem_device",
    "revision",
    "numa_node",
    "local_cpus",
    "local_cpulist",
)
MEMINFO_KEEP = re.compile(r"^Node \d+ (MemTotal|MemFree|HugePages_\w+):")


class Snapshot:
    def __init__(self, live: Path, out: Path) -> None:
        self.live = live
        self.out = out

    def copy(self, rel: str, data: bytes | None = None) -> None:
        src = self.live / rel
        if data is None:
            if not src.is_file():
                return
            try:
                data = src.read_bytes()
            except OSError:
                return
        dst = self.out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)

    def link(self, rel: str, target_rel: str) -> None:
        dst = self.out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        target = self.out / target_rel
        target.mkdir(parents=True, exist_ok=True)
        if not any(target.iterdir()):  # git keeps no empty directory: a link to one would dangle
            (target / "uevent").touch()
        os.symlink(os.path.relpath(target, dst.parent), dst)

    def target(self, rel: str) -> str:
        return os.path.relpath(os.path.realpath(self.live / rel), os.path.realpath(self.live))


def capture(live: Path, out: Path) -> None:
    snap = Snapshot(live, out)
    node = "devices/system/node"
    cpu = "devices/system/cpu"
    for name in NODE_LISTS:
        snap.copy(f"{node}/{name}")
    for name in CPU_LISTS:
        snap.copy(f"{cpu}/{name}")
    for d in sorted((live / node).glob("node[0-9]*")):
        rel = f"{node}/{d.name}"
        for name in ("cpulist", "cpumap", "distance"):
            snap.copy(f"{rel}/{name}")
        text = (d / "meminfo").read_text()
        kept = "".join(line + "\n" for line in text.splitlines() if MEMINFO_KEEP.match(line))
        snap.copy(f"{rel}/meminfo", kept.encode())
        for pool in sorted((d / "hugepages").glob("hugepages-*")):
            for name in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                snap.copy(f"{rel}/hugepages/{pool.name}/{name}")
    for d in sorted((live / cpu).glob("cpu[0-9]*")):
        rel = f"{cpu}/{d.name}"
        snap.copy(f"{rel}/online")
        for f in sorted((d / "topology").glob("*")):
            snap.copy(f"{rel}/topology/{f.name}")
        for index in sorted((d / "cache").glob("index*")):
            for name in CACHE_FILES:
                snap.copy(f"{rel}/cache/{index.name}/{name}")
        for link in sorted(d.glob("node[0-9]*")):
            snap.link(f"{rel}/{link.name}", f"{node}/{link.name}")
    for d in sorted((live / node).glob("node[0-9]*")):
        for link in sorted(d.glob("cpu[0-9]*")):
            snap.link(f"{node}/{d.name}/{link.name}", f"{cpu}/{link.name}")
    for entry in sorted((live / "bus/pci/devices").iterdir()):
        dev = snap.target(f"bus/pci/devices/{entry.name}")
        for name in PCI_FILES:
            snap.copy(f"{dev}/{name}")
        config = bytearray((live / dev / "config").read_bytes()[:64])
        if len(config) == 64:
            header = config[0x0E] & 0x7F
            bars = range(0x10, 0x28) if header == 0 else range(0x10, 0x18)
            for i in bars:
                config[i] = 0
        snap.copy(f"{dev}/config", bytes(config))
        if (live / dev / "driver").exists():
            snap.link(f"{dev}/driver", snap.target(f"{dev}/driver"))
        snap.link(f"bus/pci/devices/{entry.name}", dev)
    for net in sorted((live / "class/net").iterdir()):
        if not (net / "device").exists():
            continue  # virtual interfaces
        parent = snap.target(f"class/net/{net.name}/device")  # a PCI function, or virtioN
        if (out / parent).is_dir() or (out / parent).parent.is_dir():
            snap.link(f"{parent}/net/{net.name}/device", parent)
            snap.link(f"class/net/{net.name}", f"{parent}/net/{net.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--sysfs", default="/sys")
    args = parser.parse_args()
    out = Path(__file__).parent / args.name / "sys"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    capture(Path(args.sysfs), out)


if __name__ == "__main__":
    main()

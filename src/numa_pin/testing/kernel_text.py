"""The text of the kernel files the machine kit writes (pure functions of a spec).

Formats follow Linux 6.1: cpumasks as ``%*pb`` prints them, ``nodeN/meminfo`` and
``/proc/meminfo`` column layouts, ``/proc/cpuinfo`` blocks and the NVIDIA driver's
``information`` file. :mod:`numa_pin.testing.writer` puts them in place.
"""

from __future__ import annotations

from collections.abc import Iterable

from numa_pin.base.cpuset import format_list
from numa_pin.testing.pci_spec import PciSpec
from numa_pin.testing.spec import MachineSpec

CACHE_DEFAULTS = {
    # vendor -> ((level, type, size_kb, ways) for L1d, L1i, L2), L3 size per socket-wide L3,
    # L3 ways
    "GenuineIntel": (
        ((1, "Data", 48, 12), (1, "Instruction", 32, 8), (2, "Unified", 1280, 20)),
        12,
    ),
    "AuthenticAMD": (((1, "Data", 32, 8), (1, "Instruction", 32, 8), (2, "Unified", 512, 8)), 16),
}

_NODE_MEMINFO_FIELDS = (
    "SwapCached",
    "Active",
    "Inactive",
    "Active(anon)",
    "Inactive(anon)",
    "Active(file)",
    "Inactive(file)",
    "Unevictable",
    "Mlocked",
    "Dirty",
    "Writeback",
    "FilePages",
    "Mapped",
    "AnonPages",
    "Shmem",
    "KernelStack",
    "PageTables",
    "SecPageTables",
    "NFS_Unstable",
    "Bounce",
    "WritebackTmp",
    "KReclaimable",
    "Slab",
    "SReclaimable",
    "SUnreclaim",
    "AnonHugePages",
    "ShmemHugePages",
    "ShmemPmdMapped",
    "FileHugePages",
    "FilePmdMapped",
)


def kernel_mask(ids: Iterable[int], nbits: int) -> str:
    """A cpumask the way the kernel's ``%*pb`` prints it for ``nbits`` bits.

    The first (most significant) group has only as many hex digits as its bits need:
    ``kernel_mask({0..7}, 8) == "ff"``, ``kernel_mask({0}, 40) == "00,00000001"``.
    """
    value = 0
    for i in ids:
        value |= 1 << i
    nbits = max(nbits, 1)
    words = (nbits + 31) // 32
    parts: list[str] = []
    for w in reversed(range(words)):
        chunk = (value >> (32 * w)) & 0xFFFFFFFF
        if w == words - 1:
            digits = (nbits - 32 * w + 3) // 4
            parts.append(f"{chunk:0{digits}x}")
        else:
            parts.append(f"{chunk:08x}")
    return ",".join(parts)


def list_line(ids: Iterable[int]) -> str:
    """A kernel list file: ``"0-3,8\n"``."""
    return format_list(ids) + "\n"


def node_meminfo(spec: MachineSpec, n: int) -> str:
    """``nodeN/meminfo`` of node ``n``."""
    total = spec.node_memory_kb(n)
    free = spec.node_memory_free_kb(n)
    hp2m = spec.node_hugepages(n).get(2048, (0, 0))
    lines = [
        f"Node {n} MemTotal:       {total:8d} kB",
        f"Node {n} MemFree:        {free:8d} kB",
        f"Node {n} MemUsed:        {total - free:8d} kB",
    ]
    for name in _NODE_MEMINFO_FIELDS:
        lines.append(f"Node {n} {name + ':':<15} {0:8d} kB")
    lines.append(f"Node {n} HugePages_Total: {hp2m[0]:5d}")
    lines.append(f"Node {n} HugePages_Free:  {hp2m[1]:5d}")
    lines.append(f"Node {n} HugePages_Surp:  {0:5d}")
    return "\n".join(lines) + "\n"


def l3_size_kb(spec: MachineSpec) -> int:
    """Size of one L3 cache: 1.5 MiB (Intel) or 4 MiB (AMD) per core sharing it."""
    per_core = 1536 if spec.vendor == "GenuineIntel" else 4096
    if spec.l3_scope == "socket":
        cores = spec.cores_per_node * spec.nodes_per_socket
    elif spec.l3_scope == "node":
        cores = spec.cores_per_node
    else:
        cores = spec.cores_per_ccx
    return cores * per_core


def cpuinfo(spec: MachineSpec) -> str:
    """``/proc/cpuinfo``: one block per online CPU."""
    online = [c for c in spec.cpu_layout() if c.online]
    threads_per_socket = {s: sum(c.socket == s for c in online) for s in range(spec.sockets)}
    cores_per_socket = {
        s: len({c.core_index for c in online if c.socket == s}) for s in range(spec.sockets)
    }
    unknown = spec.quirks.package_id_unknown or spec.quirks.package_mask_per_core
    package_id = (lambda socket: -1) if unknown else (lambda socket: socket)
    intel = spec.vendor == "GenuineIntel"
    family, model, stepping = (6, 106, 6) if intel else (25, 1, 1)
    flags = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
    flags += "mmx fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl "
    flags += "xtopology nonstop_tsc cpuid pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic "
    flags += "movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm avx2 bmi1 bmi2"
    blocks: list[str] = []
    for c in online:
        apic = (c.socket << 8) | (c.core << 1) | c.thread
        rows = [
            ("processor", str(c.id)),
            ("vendor_id", spec.vendor),
            ("cpu family", str(family)),
            ("model", str(model)),
            ("model name", spec.model_name),
            ("stepping", str(stepping)),
            ("microcode", "0xd0003a5"),
            ("cpu MHz", "2000.000"),
            ("cache size", f"{l3_size_kb(spec)} KB"),
            ("physical id", str(package_id(c.socket))),
            ("siblings", str(threads_per_socket[c.socket])),
            ("core id", str(c.core)),
            ("cpu cores", str(cores_per_socket[c.socket])),
            ("apicid", str(apic)),
            ("initial apicid", str(apic)),
            ("fpu", "yes"),
            ("fpu_exception", "yes"),
            ("cpuid level", "27"),
            ("wp", "yes"),
            ("flags", flags),
            ("bogomips", "4000.00"),
            ("clflush size", "64"),
            ("cache_alignment", "64"),
            ("address sizes", "46 bits physical, 57 bits virtual"),
            ("power management", ""),
        ]
        lines = []
        for key, value in rows:
            tabs = "\t" if len(key) >= 8 else "\t\t"
            lines.append(
                f"{key}{tabs}: {value}".rstrip() if value == "" else f"{key}{tabs}: {value}"
            )
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def meminfo(spec: MachineSpec) -> str:
    """``/proc/meminfo``: the sum over every node."""
    total = sum(spec.node_memory_kb(n) for n in spec.node_ids)
    free = sum(spec.node_memory_free_kb(n) for n in spec.node_ids)
    default = {n: spec.node_hugepages(n).get(2048, (0, 0)) for n in spec.node_ids}
    hp_total = sum(t for t, _ in default.values())
    hp_free = sum(f for _, f in default.values())
    hugetlb = sum(
        size * t for n in spec.node_ids for size, (t, _) in spec.node_hugepages(n).items()
    )
    rows = [
        ("MemTotal", total),
        ("MemFree", free),
        ("MemAvailable", free),
        ("Buffers", 0),
        ("Cached", 0),
        ("SwapCached", 0),
        ("Active", 0),
        ("Inactive", 0),
        ("SwapTotal", 0),
        ("SwapFree", 0),
        ("Dirty", 0),
        ("Writeback", 0),
        ("AnonPages", 0),
        ("Mapped", 0),
        ("Shmem", 0),
        ("Slab", 0),
        ("PageTables", 0),
        ("CommitLimit", total // 2),
        ("Committed_AS", 0),
        ("VmallocTotal", 34359738367),
        ("AnonHugePages", 0),
    ]
    out = [f"{k + ':':<16}{v:8d} kB" for k, v in rows]
    out += [
        f"{'HugePages_Total:':<16}{hp_total:8d}",
        f"{'HugePages_Free:':<16}{hp_free:8d}",
        f"{'HugePages_Rsvd:':<16}{0:8d}",
        f"{'HugePages_Surp:':<16}{0:8d}",
        f"{'Hugepagesize:':<16}{2048:8d} kB",
        f"{'Hugetlb:':<16}{hugetlb:8d} kB",
    ]
    return "\n".join(out) + "\n"


def nvidia_information(dev: PciSpec) -> str:
    """``/proc/driver/nvidia/gpus/<address>/information`` of an NVIDIA GPU."""
    minor = dev.gpu_minor if dev.gpu_minor is not None else 0
    rows = [
        ("Model", dev.model or "NVIDIA A100-SXM4-80GB"),
        ("IRQ", str(100 + minor)),
        ("GPU UUID", dev.gpu_uuid or ""),
        ("Video BIOS", "92.00.45.00.05"),
        ("Bus Type", "PCIe"),
        ("DMA Size", "47 bits"),
        ("DMA Mask", "0x7fffffffffff"),
        ("Bus Location", dev.address),
        ("Device Minor", str(minor)),
        ("GPU Excluded", "No"),
    ]
    return "".join(
        f"{key}:{' ' * max(1, 7 - len(key))}\t\t {value}\n"
        if len(key) < 7
        else f"{key}: \t {value}\n"
        for key, value in rows
    )


__all__ = [
    "CACHE_DEFAULTS",
    "cpuinfo",
    "kernel_mask",
    "l3_size_kb",
    "list_line",
    "meminfo",
    "node_meminfo",
    "nvidia_information",
]

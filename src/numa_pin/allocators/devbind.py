"""Give each rank of ``numa-pin run --ranks N`` the granted devices nearest its CPUs (pure).

``--bind-devices none`` (the default) leaves every rank every device of the grant;
``--bind-devices closest`` shares each granted resource out among the ranks by this rule.

**Nearness.** A rank's distance to a device is the average, over the rank's CPUs, of the SLIT
distance (the matrix hwloc's distances come from) between the CPU's NUMA node and the device's:
a rank whose CPUs all sit on the device's node has the least (10), a rank split over two
nodes comes next, then the nodes of the same socket, then the rest. A device whose node is
unknown (``numa_node`` -1 and no ``local_cpulist`` to tell it) is equally far from every
rank, farther than any known one. Between devices of a resource that is not GPUs, equally
near, the one with the closer PCIe link to the rank's GPUs wins (``PIX``, ``PXB``, ``PHB``,
``NODE``, ``SYS``: :func:`numa_pin.devices.pcie.link`), as NCCL pairs a GPU with its NIC;
that is why GPUs are shared out first.

**Even shares.** Each resource is shared out on its own; with D devices and R ranks:

* D >= R: every device goes to exactly one rank; each rank gets D // R, and D % R of them one
  more. The devices go out in rounds: in each round every rank takes one (in the last round,
  when D % R is not 0, only the first D % R ranks to take one), the pairs (rank, free device)
  taken nearest first; ties go to the lower rank, then the lower PCI address;
* D < R: every rank gets one device, and each device serves R // D ranks, R % D of them one
  more. In each round every device takes one rank that has none yet (in the last round only
  R % D devices), the pairs taken nearest first; ties go to the lower PCI address, then the
  lower rank.

The balance is the rule and nearness chooses within it: a rank gets a device of its own
node(s) whenever one is left when its turn comes, and a remote one only when its node's
devices went, in the same round, to ranks as near to them, or the balance leaves them no
room. Slurm's ``--gpu-bind=closest`` binds a task to the GPUs closest to its CPUs, in a NUMA
environment possibly every GPU of its domain (several tasks sharing them); torchrun's local
rank i takes GPU i % D whatever its CPUs. This rule gives each rank its own devices while
there are enough and spreads ranks evenly over them when there are not; with as many GPUs as
ranks, balanced over the nodes in the same order, rank i gets GPU i, as torchrun does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numa_pin.devices.pcie import LINKS, link
from numa_pin.topology.model import KIND_GPU, Topology

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

BIND_NONE, BIND_CLOSEST = "none", "closest"
MODES = (BIND_NONE, BIND_CLOSEST)
#: the kernel's distances when the firmware gives no SLIT (LOCAL_DISTANCE, REMOTE_DISTANCE)
LOCAL_DISTANCE, REMOTE_DISTANCE = 10, 20
UNKNOWN = float("inf")


def _distance(topology: Topology, a: int, b: int) -> int:
    try:
        return topology.distance(a, b)
    except (KeyError, IndexError, ValueError):  # a node without a SLIT row: the kernel's defaults
        return LOCAL_DISTANCE if a == b else REMOTE_DISTANCE


def nearness(topology: Topology, share: frozenset[int], address: str) -> float:
    """The average SLIT distance from the CPUs of ``share`` to the device at ``address``
    (:data:`UNKNOWN` for a device or CPUs without a node)."""
    dev = topology.device(address)
    if dev is None or dev.numa_node is None:
        return UNKNOWN
    counts: dict[int, int] = {}
    for cpu in share:
        node = topology.cpus[cpu].numa if cpu in topology.cpus else None
        if node is not None:
            counts[node] = counts.get(node, 0) + 1
    if not counts:
        return UNKNOWN
    return sum(_distance(topology, n, dev.numa_node) * k for n, k in counts.items()) / sum(counts.values())


def _link_rank(topology: Topology, address: str, gpus: Sequence[str]) -> int:
    """The index in :data:`LINKS` of ``address``'s closest link to one of ``gpus`` (0 with no
    GPU: nothing to tell devices apart; past the end: no link known)."""
    if not gpus:
        return 0
    ranks = [LINKS.index(k) for g in gpus if (k := link(topology, address, g)) in LINKS]
    return min(ranks, default=len(LINKS))


def _share_out(keys: list[list[tuple[float, int]]], order: list[int]) -> list[list[int]]:
    """Device indices per rank, by the even-shares rule; ``keys[r][d]`` orders rank ``r``'s
    pairs with device ``d`` (smaller is nearer), ``order[d]`` is device ``d``'s PCI order."""
    ranks, devices = len(keys), len(order)
    out: list[list[int]] = [[] for _ in range(ranks)]
    if devices >= ranks:
        free = set(range(devices))
        while free:
            quota = min(ranks, len(free))
            pairs = sorted((keys[r][d], r, order[d], d) for r in range(ranks) for d in free)
            took: set[int] = set()
            for _, r, _, d in pairs:
                if len(took) == quota:
                    break
                if r not in took and d in free:
                    out[r].append(d)
                    took.add(r)
                    free.discard(d)
        return out
    waiting = set(range(ranks))
    while waiting:
        quota = min(devices, len(waiting))
        pairs = sorted((keys[r][d], order[d], r, d) for r in waiting for d in range(devices))
        took = set()
        for _, _, r, d in pairs:
            if len(took) == quota:
                break
            if d not in took and r in waiting:
                out[r].append(d)
                took.add(d)
                waiting.discard(r)
    return out


def bind_closest(topology: Topology, shares: Sequence[frozenset[int]],
                 devices: Mapping[str, Sequence[str]]) -> list[dict[str, tuple[str, ...]]]:
    """Each rank's devices (``{resource: addresses}``, in the grant's order) under
    ``closest``; ``shares`` are the ranks' CPUs, ``devices`` the grant's."""
    bound: list[dict[str, tuple[str, ...]]] = [{} for _ in shares]
    gpu_first = sorted(devices, key=lambda res: (not _is_gpu(topology, devices[res]), res))
    for resource in gpu_first:
        addresses = list(devices[resource])
        if not addresses:
            continue
        # the GPUs each rank holds so far: a NIC's tie-break (none while GPUs are shared out)
        held = [[a for got in b.values() if _is_gpu(topology, got) for a in got] for b in bound]
        by_pci = sorted(addresses)
        keys = [[(nearness(topology, share, a), _link_rank(topology, a, held[r])) for a in addresses]
                for r, share in enumerate(shares)]
        for r, picked in enumerate(_share_out(keys, [by_pci.index(a) for a in addresses])):
            bound[r][resource] = tuple(addresses[d] for d in sorted(picked))
    return bound


def _is_gpu(topology: Topology, addresses: Sequence[str]) -> bool:
    return any((dev := topology.device(a)) is not None and dev.kind == KIND_GPU for a in addresses)


__all__ = ["BIND_CLOSEST", "BIND_NONE", "MODES", "bind_closest", "nearness"]

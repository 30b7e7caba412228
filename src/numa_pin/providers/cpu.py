"""The CPU hint provider of kubelet's static CPU policy. Pure code.

Follows kubelet's static CPU manager (``cpu-memory-device.md`` §5-6); the allocation half
(reserved CPUs, ``takeByTopology``, ``Allocate``) is :mod:`numa_pin.allocators.cpu`.

* :func:`cpu_hints` / :func:`cpu_hint_family`: ``generateCPUTopologyHints``, enumerated or as a
  :class:`~numa_pin.policy.hint.CapacityFamily` that never enumerates ``2**N`` masks;
* :func:`container_cpu_hints` / :func:`pod_cpu_hints`: the container- and pod-scope wrappers;
* :func:`guaranteed_cpus` / :func:`pod_cpu_request`: the exclusive-CPU counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations

from numa_pin.errors import RequestError
from numa_pin.policy import bitmask
from numa_pin.policy.hint import CapacityFamily, ResourceHints, TopologyHint
from numa_pin.topology.cpus import CpuTopology

#: the resource name CPU hints are reported under
RESOURCE_CPU = "cpu"

# ---- guaranteed CPU counts --------------------------------------------------------------------
def guaranteed_cpus(qos_guaranteed: bool, cpu_millis: int) -> int:
    """Exclusive CPUs of one container: whole CPUs of a Guaranteed pod, else 0."""
    if not qos_guaranteed or cpu_millis <= 0 or cpu_millis % 1000:
        return 0
    return cpu_millis // 1000


def pod_cpu_request(
    init_counts_with_restartable_flags: Iterable[tuple[int, bool]], app_counts: Iterable[int]
) -> int:
    """Pod-level exclusive CPU count (§5 "Guaranteed CPUs").

    Each init container is ``(cpus, restartable)``. Restartable (sidecar) init containers add
    to a running sum; a regular one peaks at running sum + its own count. The result is the
    larger of that peak and app containers + restartable ones.
    """
    sidecars = 0
    peak = 0
    for cpus, restartable in init_counts_with_restartable_flags:
        if restartable:
            sidecars += cpus
        elif sidecars + cpus > peak:
            peak = sidecars + cpus
    return max(peak, sum(app_counts) + sidecars)


# ---- hints (§6) -----------------------------------------------------------------------------
def _known(topology: CpuTopology, cpus: Iterable[int]) -> frozenset[int]:
    return frozenset(cpus) & topology.cpu_ids


def _check_request(request: int) -> None:
    if request < 0:
        raise RequestError(f"cpu request must not be negative, got {request}")


def min_affinity_size(topology: CpuTopology, request: int) -> int:
    """Fewest NUMA nodes that hold ``request`` CPUs on the empty machine (all nodes if none)."""
    sizes = sorted(
        (len(topology.cpus_in_numa_nodes(n)) for n in topology.numa_nodes()), reverse=True
    )
    total = 0
    for k, size in enumerate(sizes, start=1):
        total += size
        if total >= request:
            return k
    return len(sizes)


def _socket_aligned(topology: CpuTopology, mask: int, min_affinity: int) -> bool:
    per_socket = topology.num_numa_nodes // topology.num_sockets if topology.num_sockets else 0
    if per_socket == 0:
        return False
    min_sockets = -(-min_affinity // per_socket)
    return len(topology.sockets_in_numa_nodes(*bitmask.bits(mask))) == min_sockets


def cpu_hints(
    topology: CpuTopology,
    available: Iterable[int],
    request: int,
    reusable: Iterable[int] = (),
    align_by_socket: bool = False,
) -> list[TopologyHint] | None:
    """kubelet's ``generateCPUTopologyHints`` (§6), enumerating every NUMA mask.

    ``None`` for a request of 0; an empty list when no mask fits. Masks come in kubelet's order
    (size 1, 2, ...; lexicographic). A mask is preferred when its size is the minimum on the
    empty machine, or (``align_by_socket``) when it spans the minimum number of sockets.
    Raises :class:`~numa_pin.errors.RequestError` for a negative request.
    """
    _check_request(request)
    if request == 0:
        return None
    avail = _known(topology, available)
    reuse = _known(topology, reusable)
    nodes = sorted(topology.numa_nodes())
    min_affinity = len(nodes)
    masks: list[int] = []
    for size in range(1, len(nodes) + 1):
        for combo in combinations(nodes, size):
            in_mask = topology.cpus_in_numa_nodes(*combo)
            if len(in_mask) >= request and size < min_affinity:
                min_affinity = size
            if not reuse <= in_mask:
                continue
            if len(reuse) + len(avail & in_mask) >= request:
                masks.append(bitmask.from_nodes(combo))
    return [
        TopologyHint.from_mask(
            m,
            (align_by_socket and _socket_aligned(topology, m, min_affinity))
            or m.bit_count() == min_affinity,
        )
        for m in masks
    ]


def cpu_hint_family(
    topology: CpuTopology,
    available: Iterable[int],
    request: int,
    reusable: Iterable[int] = (),
    align_by_socket: bool = False,
) -> CapacityFamily | list[TopologyHint] | None:
    """The hints of :func:`cpu_hints`, described instead of enumerated.

    Capacity per node = available CPUs on it; need = ``request - len(reusable)``; every mask
    must include the nodes of the reusable CPUs; ``min_affinity`` is computed exactly on the
    empty machine. Returns ``None`` for a request of 0 and ``[]`` when no mask can fit. The
    ``align_by_socket`` preference is not expressible as a family: the enumerated list comes back.
    """
    _check_request(request)
    if request == 0:
        return None
    if align_by_socket:
        return cpu_hints(topology, available, request, reusable, align_by_socket=True)
    avail = _known(topology, available)
    reuse = _known(topology, reusable)
    nodes = tuple(sorted(topology.numa_nodes()))
    family = CapacityFamily(
        nodes=nodes,
        capacity=tuple((len(avail & topology.cpus_in_numa_nodes(n)),) for n in nodes),
        need=(request - len(reuse),),
        min_affinity=min_affinity_size(topology, request),
        must_include=bitmask.from_nodes(topology.info(c).numa for c in reuse),
    )
    if not nodes or not family.contains(bitmask.from_nodes(nodes)):
        return []
    return family


def _hints(
    topology: CpuTopology,
    available: Iterable[int],
    request: int,
    reusable: Iterable[int],
    align_by_socket: bool,
    family: bool,
) -> ResourceHints:
    make = cpu_hint_family if family else cpu_hints
    return make(topology, available, request, reusable, align_by_socket)


def container_cpu_hints(
    topology: CpuTopology,
    available: Iterable[int],
    request: int,
    reusable: Iterable[int] = (),
    assigned: Iterable[int] | None = None,
    align_by_socket: bool = False,
    family: bool = False,
) -> ResourceHints:
    """Container-scope ``GetTopologyHints`` (§6).

    A container that already holds CPUs gets its hints regenerated from them, or ``[]`` when
    their number differs from ``request``. ``family=True`` answers with
    :func:`cpu_hint_family`.
    """
    _check_request(request)
    if request == 0:
        return None
    if assigned is not None:
        held = frozenset(assigned)
        if len(held) != request:
            return []
        return _hints(topology, held, request, (), align_by_socket, family)
    return _hints(topology, available, request, reusable, align_by_socket, family)


def pod_cpu_hints(
    topology: CpuTopology,
    available: Iterable[int],
    request: int,
    reusable: Iterable[int] = (),
    assigned: Sequence[tuple[Iterable[int], int]] = (),
    align_by_socket: bool = False,
    family: bool = False,
) -> ResourceHints:
    """Pod-scope ``GetPodTopologyHints`` (§6).

    ``assigned`` lists ``(cpus, container_request)`` for the pod's containers that already hold
    CPUs. Any size mismatch gives ``[]``; if their union equals the pod request the hints are
    regenerated from it, otherwise it joins the reusable CPUs.
    """
    _check_request(request)
    if request == 0:
        return None
    union: frozenset[int] = frozenset()
    for cpus, wanted in assigned:
        held = frozenset(cpus)
        if len(held) != wanted:
            return []
        union |= held
    if len(union) == request:
        return _hints(topology, union, request, (), align_by_socket, family)
    reuse = frozenset(reusable) | union
    return _hints(topology, available, request, reuse, align_by_socket, family)


__all__ = [
    "RESOURCE_CPU",
    "container_cpu_hints",
    "cpu_hint_family",
    "cpu_hints",
    "guaranteed_cpus",
    "min_affinity_size",
    "pod_cpu_hints",
    "pod_cpu_request",
]

"""Which CPUs a container gets: kubelet's static CPU policy ``Allocate``. Pure code.

* :func:`take_cpus`: the dispatcher over kubelet's two takers. ``distribute-cpus-across-numa``
  selects :mod:`numa_pin.allocators.cpu_distribute` (``takeByTopologyNUMADistributed``,
  ``cpu-memory-device.md`` §4); everything else takes :mod:`numa_pin.allocators.cpu_packed`
  (``takeByTopologyNUMAPacked``, §3);
* :func:`reserved_cpus` / :func:`reserved_physical_cpus`: the reserved set and its siblings;
* :func:`policy_take`: the static policy's ``takeByTopology`` (which taker, which options);
* :func:`allocate_cpus`: ``Allocate`` steps 1, 2 and 4 (SMT checks, aligned part first);
* :func:`update_reusable`: step 5, CPUs of init containers reused by later containers.

The hints for the same resource come from :mod:`numa_pin.providers.cpu`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from numa_pin.allocators.cpu_distribute import take_distributed
from numa_pin.allocators.cpu_packed import PACKED, SPREAD, take_packed
from numa_pin.base.cpuset import format_list
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.errors import AllocationError, PolicyError, RequestError, SMTAlignmentError
from numa_pin.topology.cpus import CpuTopology


def take_cpus(
    topology: CpuTopology,
    available: Iterable[int],
    count: int,
    strategy: str = PACKED,
    prefer_uncore: bool = False,
    distribute_across_numa: bool = False,
    group_size: int = 1,
) -> frozenset[int]:
    """Pick ``count`` CPUs out of ``available`` the way kubelet's static policy would.

    ``distribute_across_numa`` selects ``takeByTopologyNUMADistributed`` (§4) with CPU groups of
    ``group_size``; otherwise ``takeByTopologyNUMAPacked`` (§3) with the given ``strategy``
    (``"packed"`` or ``"spread"``) and uncore preference. Raises
    :class:`~numa_pin.errors.AllocationError` (see :func:`~numa_pin.allocators.cpu_packed.take_packed`).
    """
    if distribute_across_numa:
        return take_distributed(topology, available, count, group_size, strategy)
    return take_packed(topology, available, count, strategy, prefer_uncore)


def policy_take(
    topology: CpuTopology, options: CpuOptions, available: Iterable[int], count: int
) -> frozenset[int]:
    """The static policy's ``takeByTopology``: distributed if ``distribute-cpus-across-numa``
    (groups of ``CPUsPerCore`` with ``full-pcpus-only``), else packed; spread if
    ``distribute-cpus-across-cores``; uncore preference only for packed.

    Raises :class:`~numa_pin.errors.AllocationError`.
    """
    strategy = SPREAD if options.distribute_cpus_across_cores else PACKED
    if options.distribute_cpus_across_numa:
        group = topology.cpus_per_core() if options.full_pcpus_only else 1
        return take_cpus(
            topology, available, count, strategy, distribute_across_numa=True, group_size=group
        )
    uncore = options.prefer_align_cpus_by_uncorecache
    return take_cpus(topology, available, count, strategy, prefer_uncore=uncore)


def _check_smt(
    topology: CpuTopology,
    available: frozenset[int],
    count: int,
    reserved_physical: frozenset[int],
) -> None:
    per_core = topology.cpus_per_core()
    if per_core > 0 and count % per_core != 0:
        raise SMTAlignmentError(
            f"SMT Alignment Error: requested {count} cpus not multiple cpus per core = {per_core}"
        )
    physical = len(available - reserved_physical)
    if count > physical:
        raise SMTAlignmentError(
            "SMT Alignment Error: not enough free physical CPUs: "
            f"available physical CPUs = {physical}, requested CPUs = {count}, "
            f"CPUs per core = {per_core}"
        )


def aligned_cpus(
    topology: CpuTopology, options: CpuOptions, pool: frozenset[int], nodes: Iterable[int]
) -> frozenset[int]:
    """``pool`` restricted to the hint's NUMA nodes, or to their whole sockets with
    ``align-by-socket``."""
    node_ids = tuple(nodes)
    if options.align_by_socket:
        return pool & topology.cpus_in_sockets(*topology.sockets_in_numa_nodes(*node_ids))
    return pool & topology.cpus_in_numa_nodes(*node_ids)


def allocate_cpus(
    topology: CpuTopology,
    options: CpuOptions,
    available: Iterable[int],
    reusable: Iterable[int],
    count: int,
    affinity_nodes: frozenset[int] | None,
    reserved_physical: frozenset[int] = frozenset(),
) -> frozenset[int]:
    """kubelet's static ``Allocate`` for a container without an assignment (steps 1, 2, 4).

    ``available`` is the shared pool minus the reserved CPUs; ``reusable`` the CPUs this pod's
    finished init containers hold. With an affinity, as many CPUs as possible come from the
    hint's NUMA nodes first, the rest from the remaining pool. The caller removes the result
    from the shared pool. Raises :class:`~numa_pin.errors.SMTAlignmentError` (kubelet's two
    messages) and :class:`~numa_pin.errors.AllocationError`.
    """
    avail = frozenset(available)
    if options.full_pcpus_only:
        _check_smt(topology, avail, count, frozenset(reserved_physical))
    pool = avail | frozenset(reusable)
    first: frozenset[int] = frozenset()
    if affinity_nodes is not None:
        aligned = aligned_cpus(topology, options, pool, affinity_nodes)
        first = policy_take(topology, options, aligned, min(count, len(aligned)))
    rest = policy_take(topology, options, pool - first, count - len(first))
    return first | rest


INIT = "init"


RESTARTABLE_INIT = "restartable-init"


APP = "app"


_CONTAINER_KINDS = (INIT, RESTARTABLE_INIT, APP)


def update_reusable(
    reusable: Mapping[str, frozenset[int]], pod: str, cpus: Iterable[int], container_kind: str
) -> dict[str, frozenset[int]]:
    """kubelet's ``updateCPUsToReuse`` as a pure function: returns the new per-pod map.

    Entries of other pods are dropped. A regular init container's CPUs become reusable by the
    pod's later containers; an app or restartable init container's CPUs stop being reusable.
    Raises :class:`~numa_pin.errors.RequestError` for an unknown ``container_kind``.
    """
    if container_kind not in _CONTAINER_KINDS:
        raise RequestError(
            f"unknown container kind {container_kind!r}; use init, restartable-init or app"
        )
    current = reusable.get(pod, frozenset())
    assigned = frozenset(cpus)
    if container_kind == INIT:
        return {pod: current | assigned}
    return {pod: current - assigned}


def reserved_cpus(
    topology: CpuTopology,
    options: CpuOptions,
    explicit: Iterable[int] | None = None,
    count: int = 0,
) -> frozenset[int]:
    """The CPUs kept from exclusive allocation.

    A non-empty ``explicit`` set wins; otherwise the policy's own ``takeByTopology`` picks
    ``count`` CPUs out of the whole machine (2 of 8 with HT give ``{0, 4}``). Raises
    :class:`~numa_pin.errors.PolicyError` when explicit CPUs are unknown or the size is wrong.
    """
    chosen = frozenset(explicit or ())
    if chosen:
        unknown = chosen - topology.cpu_ids
        if unknown:
            raise PolicyError(f"reserved cpus {format_list(unknown)} are not online CPUs")
        if count and len(chosen) != count:
            raise PolicyError(_reserve_size_message(chosen, count))
        return chosen
    if count < 0:
        raise PolicyError(f"number of reserved CPUs must not be negative, got {count}")
    try:
        chosen = policy_take(topology, options, topology.cpu_ids, count)
    except AllocationError:
        chosen = frozenset()
    if len(chosen) != count:
        raise PolicyError(_reserve_size_message(chosen, count))
    return chosen


def _reserve_size_message(chosen: frozenset[int], count: int) -> str:
    return (
        f"unable to reserve the required amount of CPUs "
        f"(size of {format_list(chosen) or 'the empty set'} did not equal {count})"
    )


def reserved_physical_cpus(topology: CpuTopology, reserved: Iterable[int]) -> frozenset[int]:
    """Every thread sibling of every reserved CPU (kubelet's ``reservedPhysicalCPUs``)."""
    cores = {topology.info(c).core for c in reserved}
    return topology.cpus_in_cores(*cores)


__all__ = [
    "APP",
    "INIT",
    "PACKED",
    "RESTARTABLE_INIT",
    "SPREAD",
    "aligned_cpus",
    "allocate_cpus",
    "policy_take",
    "reserved_cpus",
    "reserved_physical_cpus",
    "take_cpus",
    "update_reusable",
]

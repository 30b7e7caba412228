"""kubelet's CPU accumulator and ``takeByTopologyNUMAPacked``. Pure code.

This module follows kubelet's static CPU manager (``cpu-memory-device.md`` §2-3) over the
topology view of :mod:`numa_pin.topology.cpus`:

* :class:`CpuAccumulator`: the accumulator of §2 with one mutator, :meth:`CpuAccumulator.take`,
  the ``needs`` / ``satisfied`` / ``failed`` predicates, the orderings and the phases.
* :func:`take_packed`: ``takeByTopologyNUMAPacked`` (§3, §3a), packed or spread.

Two guards make the allocator safe where kubelet's is not (identical results everywhere else):
unit orderings never list a unit twice, and a whole-unit take only takes the unit's CPUs that
are still free (matters only on asymmetric machines, e.g. hybrid P/E cores).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from numa_pin.errors import AllocationError
from numa_pin.topology.cpus import CORE, NUMA, SOCKET, UNCORE, CpuTopology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Literal

    Strategy = Literal["packed", "spread"]

PACKED = "packed"
SPREAD = "spread"
STRATEGIES = (PACKED, SPREAD)


def _unique(ids: Iterable[int]) -> list[int]:
    """First occurrence of each id, order kept (guards against units listed twice)."""
    return list(dict.fromkeys(ids))


class CpuAccumulator:
    """kubelet's ``cpuAccumulator`` (§2): free CPUs, result, and how many are still needed.

    :meth:`take` is the only mutator. Orderings are computed when asked for; every phase asks
    once and then walks its list, as kubelet does.
    """

    def __init__(
        self, topology: CpuTopology, available: Iterable[int], count: int, strategy: str = PACKED
    ) -> None:
        if strategy not in STRATEGIES:
            raise AllocationError(
                f"unknown cpu sorting strategy {strategy!r}; use packed or spread"
            )
        self.topology = topology
        self.strategy = strategy
        self.need = count
        self.result: set[int] = set()
        self._free: set[int] = set(available) & set(topology.cpu_ids)
        self._numa_first = topology.num_sockets >= topology.num_numa_nodes

    # ---- the one mutator ----------------------------------------------------------------
    def take(self, cpus: Iterable[int]) -> None:
        taken = frozenset(cpus)
        self.result |= taken
        self._free -= taken
        self.need -= len(taken)

    # ---- predicates ---------------------------------------------------------------------
    def needs(self, count: int) -> bool:
        return self.need >= count

    @property
    def satisfied(self) -> bool:
        return self.need < 1

    @property
    def failed(self) -> bool:
        return self.need > len(self._free)

    @property
    def free(self) -> frozenset[int]:
        return frozenset(self._free)

    # ---- ordering primitives ------------------------------------------------------------
    def _free_in(self, kind: str, ident: int) -> frozenset[int]:
        return self.topology._by[kind][ident] & self._free

    def _sorted(self, kind: str, ids: Iterable[int]) -> list[int]:
        """Basic sort: fewest free CPUs first, then lower id."""
        return sorted(set(ids), key=lambda i: (len(self._free_in(kind, i)), i))

    def _available(self, kind: str, within: Iterable[int] | None = None) -> set[int]:
        """Ids of ``kind`` that hold a free CPU (restricted to the CPUs ``within``)."""
        pool = self._free if within is None else (c for c in within if c in self._free)
        return {self.topology._of[kind][c] for c in pool}

    def _nested(self, kind: str, parents: list[int], parent_kind: str) -> list[int]:
        out: list[int] = []
        for p in parents:
            out += self._sorted(kind, self._available(kind, self.topology._by[parent_kind][p]))
        return out

    # ---- orderings (§2) -----------------------------------------------------------------
    def numa_order(self) -> list[int]:
        if self._numa_first:
            return self._sorted(NUMA, self._available(NUMA))
        return _unique(self._nested(NUMA, self.socket_order(), SOCKET))

    def socket_order(self) -> list[int]:
        if self._numa_first:
            return _unique(self._nested(SOCKET, self.numa_order(), NUMA))
        return self._sorted(SOCKET, self._available(SOCKET))

    def core_order(self) -> list[int]:
        if self._numa_first:
            return _unique(self._nested(CORE, self.socket_order(), SOCKET))
        return _unique(self._nested(CORE, self.numa_order(), NUMA))

    def uncore_order(self) -> list[int]:
        """Uncore caches per NUMA node; a cache spanning nodes appears once per node (§2)."""
        return self._nested(UNCORE, self.numa_order(), NUMA)

    def cpu_order(self) -> list[int]:
        if self.strategy == SPREAD:
            units, kind = self.socket_order(), SOCKET
        else:
            units, kind = self.core_order(), CORE
        return _unique(c for u in units for c in sorted(self._free_in(kind, u)))

    # ---- whole free units ---------------------------------------------------------------
    def _is_free(self, kind: str, ident: int) -> bool:
        free = len(self._free_in(kind, ident))
        if kind == SOCKET:
            return free == self.topology.cpus_per_socket()
        if kind == CORE:
            return free == self.topology.cpus_per_core()
        return free == len(self.topology._by[kind][ident])

    def free_numa_nodes(self) -> list[int]:
        return [n for n in self.numa_order() if self._is_free(NUMA, n)]

    def free_sockets(self) -> list[int]:
        return [s for s in self.socket_order() if self._is_free(SOCKET, s)]

    def free_cores(self) -> list[int]:
        return [c for c in self.core_order() if self._is_free(CORE, c)]

    def free_uncore_caches(self) -> list[int]:
        return _unique(u for u in self.uncore_order() if self._is_free(UNCORE, u))

    # ---- phases (§2, §3, §3a) -----------------------------------------------------------
    def _take_whole(self, kind: str, units: list[int]) -> None:
        """Walk ``units`` once; take each one the request still needs entirely."""
        for unit in units:
            cpus = self.topology._by[kind][unit]
            if self.needs(len(cpus)):
                self.take(cpus & self._free)

    def take_full_numa_nodes(self) -> None:
        self._take_whole(NUMA, self.free_numa_nodes())

    def take_full_sockets(self) -> None:
        self._take_whole(SOCKET, self.free_sockets())

    def take_full_cores(self) -> None:
        self._take_whole(CORE, self.free_cores())

    def take_full_uncore_caches(self) -> None:
        self._take_whole(UNCORE, self.free_uncore_caches())

    def first_levels(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """NUMA-first: full NUMA nodes then full sockets; socket-first: the reverse."""
        if self._numa_first:
            return (self.take_full_numa_nodes, self.take_full_sockets)
        return (self.take_full_sockets, self.take_full_numa_nodes)

    def take_partial_uncore(self, uncore: int) -> None:
        """Newer kubelet rule: ceil(need / CPUsPerCore) lowest free cores, odd-request trim."""
        per_core = self.topology.cpus_per_core()
        if per_core < 1:
            return
        cores_needed = -(-self.need // per_core)
        cores = sorted(self._available(CORE, self.topology._by[UNCORE][uncore]))[:cores_needed]
        cpus = sorted(c for core in cores for c in self._free_in(CORE, core))
        if per_core > 1 and self.need % 2 != 0 and len(cpus) > self.need:
            cpus.pop()
        if len(cpus) == self.need:
            self.take(cpus)

    def take_uncore_caches(self) -> None:
        size = self.topology.cpus_per_uncore()
        for uncore in self.uncore_order():
            if self.needs(size):
                self.take_full_uncore_caches()
            if self.satisfied:
                return
            self.take_partial_uncore(uncore)
            if self.satisfied:
                return

    def take_remaining_cpus(self) -> None:
        for cpu in self.cpu_order():
            self.take((cpu,))
            if self.satisfied:
                return


def not_enough_cpus(requested: int, available: int) -> AllocationError:
    """kubelet's over-request error, word for word."""
    return AllocationError(
        "not enough cpus available to satisfy request: "
        f"requested={requested}, available={available}"
    )


def take_packed(
    topology: CpuTopology,
    available: Iterable[int],
    count: int,
    strategy: str = PACKED,
    prefer_uncore: bool = False,
) -> frozenset[int]:
    """``takeByTopologyNUMAPacked`` (§3): whole NUMA nodes/sockets, uncore, cores, then CPUs.

    Raises :class:`~numa_pin.errors.AllocationError` with kubelet's text when ``count``
    exceeds the available CPUs, and ``failed to allocate cpus`` if the phases fall short.
    """
    pool = frozenset(available)
    acc = CpuAccumulator(topology, pool, count, strategy)
    if acc.satisfied:
        return frozenset()
    if acc.failed:
        raise not_enough_cpus(count, len(pool))
    for phase in _packed_phases(acc, strategy, prefer_uncore):
        phase()
        if acc.satisfied:
            return frozenset(acc.result)
    raise AllocationError("failed to allocate cpus")


def _packed_phases(
    acc: CpuAccumulator, strategy: str, prefer_uncore: bool
) -> Iterator[Callable[[], None]]:
    yield from acc.first_levels()
    if prefer_uncore:
        yield acc.take_uncore_caches
    if strategy != SPREAD:
        yield acc.take_full_cores
    yield acc.take_remaining_cpus


__all__ = [
    "PACKED",
    "SPREAD",
    "STRATEGIES",
    "CpuAccumulator",
    "not_enough_cpus",
    "take_packed",
]

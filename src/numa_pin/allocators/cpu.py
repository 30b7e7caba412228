"""The CPU topology view and kubelet's CPU allocator (``takeByTopologyNUMAPacked``). Pure code.

This module follows kubelet's static CPU manager (``cpu-memory-device.md`` §1-4):

* :class:`CpuInfo` / :class:`CpuTopology`: kubelet's ``CPUDetails`` plus the five *declared*
  counts. Derived sizes (:meth:`CpuTopology.cpus_per_core`, ...) divide the declared counts, so
  a topology built with ``num_numa_nodes=0`` behaves like kubelet's unit-test fixtures.
* :class:`CpuAccumulator`: the accumulator of §2 with one mutator, :meth:`CpuAccumulator.take`,
  the ``needs`` / ``satisfied`` / ``failed`` predicates, the orderings and the phases.
* :func:`take_packed`: ``takeByTopologyNUMAPacked`` (§3, §3a), packed or spread.
* :func:`take_cpus`: the dispatcher; ``distribute_across_numa`` hands over to
  :mod:`numa_pin.allocators.cpu_distribute` (§4).

Two guards make the allocator safe where kubelet's is not (identical results everywhere else):
unit orderings never list a unit twice, and a whole-unit take only takes the unit's CPUs that
are still free (matters only on asymmetric machines, e.g. hybrid P/E cores).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from numa_pin.errors import AllocationError, TopologyError

if TYPE_CHECKING:
    from numa_pin.topology.model import Topology

PACKED = "packed"
SPREAD = "spread"
Strategy = Literal["packed", "spread"]
STRATEGIES = (PACKED, SPREAD)

# the four groupings of CPUs kubelet knows
NUMA = "numa"
SOCKET = "socket"
CORE = "core"
UNCORE = "uncore"
_KINDS = (NUMA, SOCKET, CORE, UNCORE)


@dataclass(frozen=True)
class CpuInfo:
    """One logical CPU and the ids kubelet tracks for it.

    ``core`` must be unique machine-wide (kubelet uses the lowest thread id of the physical
    core). ``uncore`` is the last-level-cache id; ``None`` falls back to the socket id, as
    kubelet's ``Discover`` does when cAdvisor reports no uncore cache.
    """

    cpu: int
    socket: int
    numa: int
    core: int
    uncore: int | None = None

    @property
    def uncore_id(self) -> int:
        return self.socket if self.uncore is None else self.uncore


def _ids_of(info: CpuInfo) -> dict[str, int]:
    return {NUMA: info.numa, SOCKET: info.socket, CORE: info.core, UNCORE: info.uncore_id}


@dataclass(frozen=True)
class CpuTopology:
    """kubelet's ``CPUTopology``: per-CPU details plus declared counts.

    Build it with :meth:`from_cpus` or :meth:`from_topology`. Query helpers take ids and return
    frozensets over the *whole* topology (kubelet's ``CPUDetails`` helpers).

    Raises :class:`~numa_pin.errors.TopologyError` on duplicate CPU ids or negative counts.
    """

    cpus: tuple[CpuInfo, ...]
    num_cores: int
    num_sockets: int
    num_numa_nodes: int
    num_uncore: int
    _info: dict[int, CpuInfo] = field(init=False, repr=False, compare=False)
    _of: dict[str, dict[int, int]] = field(init=False, repr=False, compare=False)
    _by: dict[str, dict[int, frozenset[int]]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.cpus, key=lambda c: c.cpu))
        info: dict[int, CpuInfo] = {}
        for c in ordered:
            if c.cpu in info:
                raise TopologyError(f"cpu {c.cpu} is listed twice in the CPU topology")
            info[c.cpu] = c
        for name in ("num_cores", "num_sockets", "num_numa_nodes", "num_uncore"):
            if getattr(self, name) < 0:
                raise TopologyError(f"{name} must not be negative, got {getattr(self, name)}")
        of: dict[str, dict[int, int]] = {k: {} for k in _KINDS}
        groups: dict[str, dict[int, set[int]]] = {k: {} for k in _KINDS}
        for c in ordered:
            for kind, ident in _ids_of(c).items():
                of[kind][c.cpu] = ident
                groups[kind].setdefault(ident, set()).add(c.cpu)
        by = {k: {i: frozenset(s) for i, s in groups[k].items()} for k in _KINDS}
        object.__setattr__(self, "cpus", ordered)
        object.__setattr__(self, "_info", info)
        object.__setattr__(self, "_of", of)
        object.__setattr__(self, "_by", by)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_cpus(
        cls,
        cpus: Iterable[CpuInfo],
        num_cores: int | None = None,
        num_sockets: int | None = None,
        num_numa_nodes: int | None = None,
        num_uncore: int | None = None,
    ) -> CpuTopology:
        """Topology from CPU details; each count defaults to the distinct ids found.

        kubelet's unit-test fixtures leave ``NumNUMANodes`` (and ``NumUncoreCache``) at 0;
        pass ``num_numa_nodes=0`` to reproduce them (it selects NUMA-first ordering, §2).
        """
        items = tuple(cpus)

        def distinct(kind: str) -> int:
            return len({_ids_of(c)[kind] for c in items})

        return cls(
            cpus=items,
            num_cores=distinct(CORE) if num_cores is None else num_cores,
            num_sockets=distinct(SOCKET) if num_sockets is None else num_sockets,
            num_numa_nodes=distinct(NUMA) if num_numa_nodes is None else num_numa_nodes,
            num_uncore=distinct(UNCORE) if num_uncore is None else num_uncore,
        )

    @classmethod
    def from_topology(cls, topology: Topology) -> CpuTopology:
        """kubelet's ``Discover`` over a discovered machine.

        Core id = the lowest thread id of the physical core ``(socket, die, core)``; uncore id =
        the L3 id, else the socket id. Raises :class:`~numa_pin.errors.TopologyError` when a CPU
        belongs to no NUMA node.
        """
        lowest: dict[tuple[int, int, int], int] = {}
        for cpu in topology.cpus.values():
            key = cpu.core_key
            lowest[key] = min(cpu.id, lowest.get(key, cpu.id))
        infos = []
        for cpu in topology.cpus.values():
            if cpu.numa is None:
                where = f" ({topology.source})" if topology.source else ""
                raise TopologyError(f"cpu {cpu.id} belongs to no NUMA node{where}")
            infos.append(CpuInfo(cpu.id, cpu.socket, cpu.numa, lowest[cpu.core_key], cpu.l3))
        return cls.from_cpus(infos)

    # ---- sizes --------------------------------------------------------------------------
    @property
    def num_cpus(self) -> int:
        return len(self.cpus)

    def cpus_per_core(self) -> int:
        return self.num_cpus // self.num_cores if self.num_cores else 0

    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets if self.num_sockets else 0

    def cpus_per_uncore(self) -> int:
        return self.num_cpus // self.num_uncore if self.num_uncore else 0

    # ---- id sets ------------------------------------------------------------------------
    @property
    def cpu_ids(self) -> frozenset[int]:
        return frozenset(self._info)

    def info(self, cpu: int) -> CpuInfo:
        """Details of one CPU. Raises :class:`~numa_pin.errors.TopologyError` if unknown."""
        try:
            return self._info[cpu]
        except KeyError:
            raise TopologyError(f"cpu {cpu} is not in the CPU topology") from None

    def numa_nodes(self) -> frozenset[int]:
        return frozenset(self._by[NUMA])

    def sockets(self) -> frozenset[int]:
        return frozenset(self._by[SOCKET])

    def cores(self) -> frozenset[int]:
        return frozenset(self._by[CORE])

    def uncore_caches(self) -> frozenset[int]:
        return frozenset(self._by[UNCORE])

    # ---- CPUs in units ------------------------------------------------------------------
    def _cpus(self, kind: str, ids: Iterable[int]) -> frozenset[int]:
        out: set[int] = set()
        for i in ids:
            out |= self._by[kind].get(i, frozenset())
        return frozenset(out)

    def cpus_in_numa_nodes(self, *ids: int) -> frozenset[int]:
        return self._cpus(NUMA, ids)

    def cpus_in_sockets(self, *ids: int) -> frozenset[int]:
        return self._cpus(SOCKET, ids)

    def cpus_in_cores(self, *ids: int) -> frozenset[int]:
        return self._cpus(CORE, ids)

    def cpus_in_uncore_caches(self, *ids: int) -> frozenset[int]:
        return self._cpus(UNCORE, ids)

    # ---- units in units -----------------------------------------------------------------
    def _units(self, kind: str, parent: str, ids: Iterable[int]) -> frozenset[int]:
        return frozenset(self._of[kind][c] for c in self._cpus(parent, ids))

    def cores_in_numa_nodes(self, *ids: int) -> frozenset[int]:
        return self._units(CORE, NUMA, ids)

    def cores_in_sockets(self, *ids: int) -> frozenset[int]:
        return self._units(CORE, SOCKET, ids)

    def sockets_in_numa_nodes(self, *ids: int) -> frozenset[int]:
        return self._units(SOCKET, NUMA, ids)

    def numa_nodes_in_sockets(self, *ids: int) -> frozenset[int]:
        return self._units(NUMA, SOCKET, ids)

    def uncore_in_numa_nodes(self, *ids: int) -> frozenset[int]:
        return self._units(UNCORE, NUMA, ids)

    def cores_in_uncore_caches(self, *ids: int) -> frozenset[int]:
        return self._units(CORE, UNCORE, ids)

    def cores_needed_in_uncore_cache(self, count: int, uncore: int) -> frozenset[int]:
        """The ``count`` lowest core ids in ``uncore`` (all of them if there are fewer)."""
        return frozenset(sorted(self.cores_in_uncore_caches(uncore))[: max(count, 0)])

    def numa_nodes_in_same_socket(self, *ids: int) -> bool:
        return len(self.sockets_in_numa_nodes(*ids)) == 1

    def keep_only(self, cpus: Iterable[int]) -> CpuTopology:
        """The same machine restricted to ``cpus``; declared counts are kept (``KeepOnly``)."""
        keep = frozenset(cpus)
        return CpuTopology(
            cpus=tuple(c for c in self.cpus if c.cpu in keep),
            num_cores=self.num_cores,
            num_sockets=self.num_sockets,
            num_numa_nodes=self.num_numa_nodes,
            num_uncore=self.num_uncore,
        )


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
    :class:`~numa_pin.errors.AllocationError` (see :func:`take_packed`).
    """
    if distribute_across_numa:
        from numa_pin.allocators.cpu_distribute import take_distributed

        return take_distributed(topology, available, count, group_size, strategy)
    return take_packed(topology, available, count, strategy, prefer_uncore)


__all__ = [
    "PACKED",
    "SPREAD",
    "CpuAccumulator",
    "CpuInfo",
    "CpuTopology",
    "not_enough_cpus",
    "take_cpus",
    "take_packed",
]

"""kubelet's CPU topology view (``CPUTopology`` / ``CPUDetails``). Pure data, no I/O.

:class:`CpuInfo` is one logical CPU with the ids kubelet tracks; :class:`CpuTopology` is the set
of them plus the five *declared* counts. Derived sizes (:meth:`CpuTopology.cpus_per_core`, ...)
divide the declared counts, so a topology built with ``num_numa_nodes=0`` behaves like kubelet's
unit-test fixtures. The allocators (:mod:`numa_pin.allocators.cpu_packed`,
:mod:`numa_pin.allocators.cpu_distribute`) and the CPU hint provider read it; none of them owns it.
"""

from __future__ import annotations

from collections.abc import Iterable

from numa_pin.base.record import field, record
from numa_pin.errors import TopologyError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from numa_pin.topology.model import Topology

# the four groupings of CPUs kubelet knows
NUMA = "numa"
SOCKET = "socket"
CORE = "core"
UNCORE = "uncore"
KINDS = (NUMA, SOCKET, CORE, UNCORE)


@record
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


def ids_of(info: CpuInfo) -> dict[str, int]:
    return {NUMA: info.numa, SOCKET: info.socket, CORE: info.core, UNCORE: info.uncore_id}


@record
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
        of: dict[str, dict[int, int]] = {k: {} for k in KINDS}
        groups: dict[str, dict[int, set[int]]] = {k: {} for k in KINDS}
        for c in ordered:
            for kind, ident in ids_of(c).items():
                of[kind][c.cpu] = ident
                groups[kind].setdefault(ident, set()).add(c.cpu)
        by = {k: {i: frozenset(s) for i, s in groups[k].items()} for k in KINDS}
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
            return len({ids_of(c)[kind] for c in items})

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


__all__ = ["CORE", "KINDS", "NUMA", "SOCKET", "UNCORE", "CpuInfo", "CpuTopology", "ids_of"]

"""A fake machine, declared: :class:`MachineSpec` (its pieces are in :mod:`numa_pin.testing.spec_parts`).

CPU numbering follows x86 Linux: first thread of every core (socket by socket, node by node),
then the second thread of every core, so CPU ``c`` and ``c + cores`` are siblings
(``sibling_layout="spread"``). ``sibling_layout="adjacent"`` numbers a core's threads next to
each other instead (VMs, some ARM/POWER kernels).

Everything here is pure. Invalid specs raise :class:`numa_pin.errors.TopologyError` from the
constructors. :mod:`numa_pin.testing.writer` writes a spec as sysfs/proc trees and
:mod:`numa_pin.testing.expected` says what discovery should read back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import field, record
from numa_pin.errors import TopologyError
from numa_pin.testing.pci_spec import PciSpec, check_pci_tree, pci_iommu_groups
from numa_pin.testing.spec_parts import (
    GIB_KB,
    LOCAL_DISTANCE,
    CpuLayout,
    CpulessNodeSpec,
    HugePagesSpec,
    KernelQuirks,
    PerNode,
)


@record
class MachineSpec:
    """A whole machine, declared.

    CPU nodes are numbered ``0 .. sockets*nodes_per_socket-1`` socket by socket; CPU-less
    nodes follow. ``distances`` is the full matrix (row = from, column = to) over all nodes;
    when omitted it is built from ``same_socket_distance``/``remote_distance`` (and each
    :class:`CpulessNodeSpec`'s ``near``/``far``). ``memory_kb``/``memory_free_kb`` are an int
    for every CPU node or one value per CPU node. ``hugepages`` is ``{size_kb: (total, free)}``
    for every CPU node or one mapping per CPU node. ``l3_scope`` is ``"socket"``, ``"node"``
    or ``"ccx"`` (``cores_per_ccx`` cores share one L3).

    ``node_numbers`` gives the kernel's id of each node (CPU nodes, then CPU-less ones) when
    they are not ``0..n-1`` (sparse ids); every method taking or returning a node uses these
    ids, while ``distances`` rows and columns follow their order. ``cores_per_cluster`` cores
    share one ``cluster_id``. ``e_cores_per_node`` adds single-threaded efficiency cores to
    every CPU node (a hybrid part): their CPU ids follow every P-core thread, and each 4 of
    them share a cluster and an L2. ``quirks`` are the :class:`KernelQuirks` to reproduce.

    Raises :class:`TopologyError` for inconsistent values. A spec holding dicts or lists
    (``hugepages``, ``distances``) is not hashable; :func:`build_once` keys on its ``repr``.
    """

    name: str = "custom"
    sockets: int = 1
    nodes_per_socket: int = 1
    cores_per_node: int = 2
    threads_per_core: int = 1
    dies_per_socket: int = 1
    distances: Sequence[Sequence[int]] | None = None
    same_socket_distance: int = 11
    remote_distance: int = 21
    memory_kb: PerNode = 16 * GIB_KB
    memory_free_kb: PerNode | None = None
    hugepages: HugePagesSpec | Sequence[HugePagesSpec] = field(default_factory=dict)
    cpuless_nodes: tuple[CpulessNodeSpec, ...] = ()
    l3_scope: str = "socket"
    cores_per_ccx: int = 4
    pci: tuple[PciSpec, ...] = ()
    sibling_layout: str = "spread"
    offline_cpus: frozenset[int] = frozenset()
    vendor: str = "GenuineIntel"
    model_name: str = "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    iommu: bool = True
    node_numbers: tuple[int, ...] | None = None
    cores_per_cluster: int = 1
    e_cores_per_node: int = 0
    quirks: KernelQuirks = field(default_factory=KernelQuirks)

    def __post_init__(self) -> None:
        for label in (
            "sockets",
            "nodes_per_socket",
            "cores_per_node",
            "threads_per_core",
            "dies_per_socket",
            "cores_per_ccx",
            "cores_per_cluster",
        ):
            if getattr(self, label) < 1:
                raise TopologyError(f"machine {self.name}: {label} must be >= 1")
        self._check_numbering()
        if (
            self.nodes_per_socket % self.dies_per_socket
            and self.dies_per_socket % self.nodes_per_socket
        ):
            raise TopologyError(
                f"machine {self.name}: dies_per_socket must divide, or be a multiple of, "
                "nodes_per_socket"
            )
        if (
            self.dies_per_socket > self.nodes_per_socket
            and (self.cores_per_node * self.nodes_per_socket) % self.dies_per_socket
        ):
            raise TopologyError(f"machine {self.name}: cores per socket not divisible by dies")
        if self.l3_scope not in ("socket", "node", "ccx"):
            raise TopologyError(f"machine {self.name}: l3_scope {self.l3_scope!r} unknown")
        if self.l3_scope == "ccx" and self.cores_per_node % self.cores_per_ccx:
            raise TopologyError(
                f"machine {self.name}: cores_per_node not divisible by cores_per_ccx"
            )
        if self.sibling_layout not in ("spread", "adjacent"):
            raise TopologyError(
                f"machine {self.name}: sibling_layout {self.sibling_layout!r} unknown"
            )
        if 0 in self.offline_cpus:
            raise TopologyError(f"machine {self.name}: cpu0 cannot be offline")
        if not self.offline_cpus <= set(range(self.cpu_count)):
            raise TopologyError(f"machine {self.name}: offline_cpus outside 0-{self.cpu_count - 1}")
        for c in self.cpuless_nodes:
            if not 0 <= c.socket < self.sockets:
                raise TopologyError(f"machine {self.name}: CPU-less node socket {c.socket} unknown")
        self._check_per_node()
        self._check_distances()
        self._check_pci()

    # ---- counts and ids ------------------------------------------------------------------
    @property
    def cpu_node_count(self) -> int:
        return self.sockets * self.nodes_per_socket

    @property
    def node_count(self) -> int:
        return self.cpu_node_count + len(self.cpuless_nodes)

    @property
    def node_ids(self) -> tuple[int, ...]:
        """The kernel's node ids, CPU nodes first (``node_numbers``, else ``0..n-1``)."""
        if self.node_numbers is not None:
            return tuple(self.node_numbers)
        return tuple(range(self.node_count))

    @property
    def cpu_node_ids(self) -> tuple[int, ...]:
        return self.node_ids[: self.cpu_node_count]

    def node_index(self, node: int) -> int:
        """Position of kernel node ``node`` in :attr:`node_ids` (and in the distance matrix).

        Raises :class:`TopologyError` for a node the machine does not have."""
        try:
            return self.node_ids.index(node)
        except ValueError:
            raise TopologyError(f"machine {self.name}: no node {node}") from None

    def cpuless_spec(self, node: int) -> CpulessNodeSpec | None:
        """The :class:`CpulessNodeSpec` of kernel node ``node``, None for a CPU node."""
        index = self.node_index(node)
        if index < self.cpu_node_count:
            return None
        return self.cpuless_nodes[index - self.cpu_node_count]

    @property
    def core_count(self) -> int:
        """P cores (every core of a non-hybrid part)."""
        return self.cpu_node_count * self.cores_per_node

    @property
    def cpu_count(self) -> int:
        return self.core_count * self.threads_per_core + self.cpu_node_count * self.e_cores_per_node

    def socket_of_node(self, node: int) -> int:
        """Socket a node belongs to (for a CPU-less node: its ``socket``)."""
        cpuless = self.cpuless_spec(node)
        if cpuless is not None:
            return cpuless.socket
        return self.node_index(node) // self.nodes_per_socket

    def cpu_layout(self) -> tuple[CpuLayout, ...]:
        """Every logical CPU (online or not), by id."""
        return self._layout

    @cached_property
    def _layout(self) -> tuple[CpuLayout, ...]:
        out: list[CpuLayout] = []
        cores_per_socket = self.cores_per_node * self.nodes_per_socket
        cores_per_die = cores_per_socket // self.dies_per_socket
        for core_index in range(self.core_count):
            socket, local = divmod(core_index, cores_per_socket)
            node = self.node_ids[core_index // self.cores_per_node]
            die = local // cores_per_die
            for thread in range(self.threads_per_core):
                if self.sibling_layout == "spread":
                    cpu = thread * self.core_count + core_index
                else:
                    cpu = core_index * self.threads_per_core + thread
                out.append(
                    CpuLayout(
                        id=cpu,
                        socket=socket,
                        die=die,
                        node=node,
                        core=local,
                        core_index=core_index,
                        thread=thread,
                        l3=self._l3_of(core_index),
                        online=cpu not in self.offline_cpus,
                        cluster=core_index // self.cores_per_cluster,
                    )
                )
        out.extend(self._e_cores())
        out.sort(key=lambda c: c.id)
        return tuple(out)

    def _e_cores(self) -> list[CpuLayout]:
        """Hybrid E cores: after every P-core thread, node by node, 4 to a cluster."""
        out: list[CpuLayout] = []
        first_cpu = self.core_count * self.threads_per_core
        first_cluster = -(-self.core_count // self.cores_per_cluster)
        for index in range(self.cpu_node_count * self.e_cores_per_node):
            node_index, local = divmod(index, self.e_cores_per_node)
            socket = node_index // self.nodes_per_socket
            in_socket = (node_index % self.nodes_per_socket) * self.e_cores_per_node + local
            cpu = first_cpu + index
            out.append(
                CpuLayout(
                    id=cpu,
                    socket=socket,
                    die=0,
                    node=self.node_ids[node_index],
                    core=self.cores_per_node * self.nodes_per_socket + in_socket,
                    core_index=self.core_count + index,
                    thread=0,
                    l3=socket if self.l3_scope == "socket" else node_index,
                    online=cpu not in self.offline_cpus,
                    cluster=first_cluster + index // 4,
                    efficiency=True,
                )
            )
        return out

    def _l3_of(self, core_index: int) -> int:
        if self.l3_scope == "socket":
            return core_index // (self.cores_per_node * self.nodes_per_socket)
        if self.l3_scope == "node":
            return core_index // self.cores_per_node
        return core_index // self.cores_per_ccx

    @property
    def online_cpus(self) -> frozenset[int]:
        return frozenset(range(self.cpu_count)) - self.offline_cpus

    def cpus_of_node(self, node: int) -> frozenset[int]:
        """Online CPUs of a node (what ``nodeN/cpulist`` prints); empty for CPU-less nodes."""
        return self._online_by("node").get(node, frozenset())

    def cpus_of_socket(self, socket: int) -> frozenset[int]:
        """Online CPUs of a socket (``physical_package_id``)."""
        return self._online_by("socket").get(socket, frozenset())

    def _online_by(self, attr: str) -> dict[int, frozenset[int]]:
        cache: dict[str, dict[int, frozenset[int]]] = self._groups_cache
        if attr not in cache:
            groups: dict[int, set[int]] = {}
            for c in self._layout:
                if c.online:
                    groups.setdefault(getattr(c, attr), set()).add(c.id)
            cache[attr] = {k: frozenset(v) for k, v in groups.items()}
        return cache[attr]

    @cached_property
    def _groups_cache(self) -> dict[str, dict[int, frozenset[int]]]:
        return {}

    def node_memory_kb(self, node: int) -> int:
        cpuless = self.cpuless_spec(node)
        if cpuless is not None:
            return cpuless.memory_kb
        return _per_node(self.memory_kb, self.node_index(node))

    def node_memory_free_kb(self, node: int) -> int:
        if self.cpuless_spec(node) is None and self.memory_free_kb is not None:
            return _per_node(self.memory_free_kb, self.node_index(node))
        total = self.node_memory_kb(node)
        used_by_huge = sum(size * free for size, (_, free) in self.node_hugepages(node).items())
        return max(0, total - total // 8 - used_by_huge)

    def node_hugepages(self, node: int) -> dict[int, tuple[int, int]]:
        """``{size_kb: (total, free)}`` of one node."""
        cpuless = self.cpuless_spec(node)
        if cpuless is not None:
            return dict(cpuless.hugepages)
        hp = self.hugepages
        if isinstance(hp, Mapping):
            return dict(hp)
        return dict(hp[self.node_index(node)])

    def hugepage_sizes(self) -> tuple[int, ...]:
        """Hugepage sizes the machine supports (2M and 1G on x86, plus any declared)."""
        sizes = {2048, 1048576}
        for n in self.node_ids:
            sizes |= set(self.node_hugepages(n))
        return tuple(sorted(sizes))

    def distance_matrix(self) -> tuple[tuple[int, ...], ...]:
        """Full SLIT matrix, ``[from][to]`` by position in :attr:`node_ids`."""
        if self.distances is not None:
            return tuple(tuple(row) for row in self.distances)
        rows: list[tuple[int, ...]] = []
        for a in self.node_ids:
            rows.append(tuple(self._default_distance(a, b) for b in self.node_ids))
        return tuple(rows)

    def distance(self, a: int, b: int) -> int:
        """SLIT distance between kernel nodes ``a`` and ``b``."""
        return self.distance_matrix()[self.node_index(a)][self.node_index(b)]

    def _default_distance(self, a: int, b: int) -> int:
        if a == b:
            return LOCAL_DISTANCE
        spec_a, spec_b = self.cpuless_spec(a), self.cpuless_spec(b)
        if spec_a is not None or spec_b is not None:
            cpuless = spec_a if spec_a is not None else spec_b
            assert cpuless is not None
            other = b if spec_a is not None else a
            if self.cpuless_spec(other) is None and self.socket_of_node(other) == cpuless.socket:
                return cpuless.near
            return cpuless.far
        if self.socket_of_node(a) == self.socket_of_node(b):
            return self.same_socket_distance
        return self.remote_distance

    # ---- PCI ----------------------------------------------------------------------------
    def pci_by_address(self) -> dict[str, PciSpec]:
        return {p.address: p for p in self.pci}

    def pci_local_cpus(self, dev: PciSpec) -> frozenset[int]:
        """What ``local_cpulist`` prints for a function (VFs share their PF's)."""
        if dev.local_cpulist is not None:
            return parse_list(dev.local_cpulist)
        if dev.numa_node >= 0:
            return self.cpus_of_node(dev.numa_node)
        return self.online_cpus

    def pci_expected_node(self, dev: PciSpec) -> int | None:
        """The node numa-pin should resolve: ``numa_node``, else the one node holding every
        CPU of ``local_cpulist``, else the parent bridge's node (recursively), else None."""
        if dev.numa_node >= 0:
            return dev.numa_node
        local = self.pci_local_cpus(dev)
        owners = {n for n in self.node_ids if self.cpus_of_node(n) & local}
        if len(owners) == 1 and local <= self.cpus_of_node(next(iter(owners))):
            return owners.pop()
        if dev.parent is not None:
            parent = self.pci_by_address().get(dev.parent)
            if parent is not None:
                return self.pci_expected_node(parent)
        return None

    def iommu_groups(self) -> dict[str, int]:
        """IOMMU group per PCI address (:func:`~numa_pin.testing.pci_spec.pci_iommu_groups`)."""
        return pci_iommu_groups(self.pci, self.iommu)

    # ---- validation ---------------------------------------------------------------------
    def _check_per_node(self) -> None:
        for label in ("memory_kb", "memory_free_kb"):
            value = getattr(self, label)
            if value is None or isinstance(value, int):
                continue
            if len(value) != self.cpu_node_count:
                raise TopologyError(
                    f"machine {self.name}: {label} has {len(value)} values for "
                    f"{self.cpu_node_count} CPU nodes"
                )
        if not isinstance(self.hugepages, Mapping) and len(self.hugepages) != self.cpu_node_count:
            raise TopologyError(f"machine {self.name}: hugepages needs one mapping per CPU node")
        for n in self.node_ids:
            total_kb = self.node_memory_kb(n)
            if total_kb < 0:
                raise TopologyError(f"machine {self.name}: node {n} memory is negative")
            huge_kb = 0
            for size, (total, free) in self.node_hugepages(n).items():
                if size <= 4 or not 0 <= free <= total:
                    raise TopologyError(
                        f"machine {self.name}: node {n} hugepages-{size}kB "
                        f"({total} total, {free} free) invalid"
                    )
                huge_kb += size * total
            if huge_kb > total_kb:
                raise TopologyError(f"machine {self.name}: node {n} hugepages exceed its memory")

    def _check_numbering(self) -> None:
        if self.node_numbers is not None:
            ids = self.node_numbers
            if len(ids) != self.node_count or list(ids) != sorted(set(ids)) or min(ids) < 0:
                raise TopologyError(
                    f"machine {self.name}: node_numbers needs {self.node_count} ascending ids >= 0"
                )
        if self.e_cores_per_node:
            if self.e_cores_per_node < 0 or self.dies_per_socket != 1:
                raise TopologyError(f"machine {self.name}: E cores need one die per socket")
            if self.l3_scope == "ccx":
                raise TopologyError(f"machine {self.name}: E cores need a socket or node L3")

    def _check_distances(self) -> None:
        matrix = self.distance_matrix()
        n = self.node_count
        if len(matrix) != n or any(len(row) != n for row in matrix):
            raise TopologyError(f"machine {self.name}: distance matrix must be {n}x{n}")
        for a, row in enumerate(matrix):
            for b, d in enumerate(row):
                if a == b and d != LOCAL_DISTANCE:
                    raise TopologyError(f"machine {self.name}: distance[{a}][{a}] must be 10")
                if a != b and not LOCAL_DISTANCE < d <= 254:
                    raise TopologyError(
                        f"machine {self.name}: distance[{a}][{b}]={d} out of 11-254"
                    )

    def _check_pci(self) -> None:
        check_pci_tree(self.pci, f"machine {self.name}")
        for dev in self.pci:
            if dev.numa_node >= 0 and dev.numa_node not in self.node_ids:
                raise TopologyError(f"{dev.address}: numa_node {dev.numa_node} does not exist")
            if self.pci_local_cpus(dev) - self.online_cpus:
                raise TopologyError(f"{dev.address}: local_cpulist names CPUs that are not online")


def _per_node(value: PerNode, node: int) -> int:
    if isinstance(value, int):
        return value
    return int(value[node])


__all__ = ["MachineSpec"]

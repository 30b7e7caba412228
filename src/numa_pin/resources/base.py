"""The seam every resource implements: its pure half (pure: no I/O).

kubelet's Topology Manager asks each ``HintProvider`` for hints, merges them, then lets each
provider ``Allocate`` inside the merged affinity. numa-pin does the same through
:class:`Resource`, one object per resource (CPUs, memory and hugepages, devices, ...):

========================  ================================================================
``view(need)``            this resource's view of the machine for one decision (what is
                          free; the devices a device plugin already chose), or ``None``
                          when the request does not involve it
``wants(view)``           whether the request asks for any of it
``claims(name)``          whether a device resource name of ``numa-pin.io/devices`` is its
``hints(view, amounts)``  ``{resource name: [TopologyHint, ...]}`` or ``None`` (no preference)
``check_inside``          under ``restricted``/``single-numa-node``: refuse what sits outside
``allocate``              take the resource inside the merged affinity; returns the
                          :class:`Decision` fields it sets (mapping fields are merged)
``vet``                   a last look at the whole decision (a rejection reason, or ``""``)
``free_summary``          what is free per NUMA node, for a rejection's reason
``bounds``                what the container bounds the resource to (its own cpuset)
``describe(grant)``       short ``key=value`` words about a grant, for ``status``
``zones(node)``           its entries in each NUMA zone of ``numa-pin nrt``
``refusal``               why the request's path cannot carry what it asks of this
                          resource (``""``: it can), said before anything is decided
========================  ================================================================

The I/O half (enforce with its undo, release, repair) is
:class:`numa_pin.resources.node.base.NodeResource`, a subclass in the edge layer; the node
service and the decision only loop over a tuple of these objects, and name none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from numa_pin.base import names
from numa_pin.base.record import field, record
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.errors import AdmissionError, RequestError, TopologyAffinityError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.policy.hint import ProviderHints, TopologyHint
from numa_pin.requests.request import Amounts, ContainerRequest
from numa_pin.topology.model import Topology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from typing import Any

    from numa_pin.devices.inventory import DeviceResource
    from numa_pin.devices.model import DeviceInfo
    from numa_pin.resources.runtime import RuntimeTarget


@record
class NodeSettings:
    """The node-wide part of the config that decisions depend on. ``resources``: the resources
    the decision loops over, in order (empty: :func:`numa_pin.resources.registry.pure_resources`)."""

    policy: str = names.DEFAULT_POLICY
    scope: str = names.DEFAULT_SCOPE
    policy_options: Mapping[str, str | bool | int] = field(default_factory=dict)
    cpu_options: CpuOptions = field(default_factory=CpuOptions)
    reserved_cpus: frozenset[int] | None = None
    num_reserved_cpus: int = 1
    reserved_memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    device_resources: tuple[DeviceResource, ...] = ()
    resources: tuple[Resource, ...] = ()
    #: the kernel's isolated CPUs (isolcpus, nohz_full), and whether exclusive grants ``prefer``,
    #: ``require`` or ``avoid`` them (the config's ``isolation.isolated_cpus``)
    isolated_cpus: frozenset[int] = frozenset()
    isolated_mode: str = "prefer"


@record
class Decision:
    """What one container gets, or why it gets nothing."""

    container_id: str
    admit: bool
    policy: str
    scope: str
    hint: TopologyHint
    cpus: frozenset[int] = frozenset()
    mems: frozenset[int] = frozenset()
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    memory: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    reason: str = ""
    #: the exception a rejection raises (kubelet's error kinds); its ``kind`` is printed
    error: type[AdmissionError] = TopologyAffinityError
    pod_affinity: frozenset[int] | None = None  # set when this decision created the pod's record
    notes: tuple[str, ...] = ()  # the resources' notes on an admitted decision (Resource.notes)

    @property
    def exclusive(self) -> bool:
        return bool(self.cpus)


@record
class Need:
    """One decision's inputs, as every resource sees them."""

    topology: Topology
    state: LedgerState  # the ledger without this container's own grant
    request: ContainerRequest
    settings: NodeSettings
    policy: str


@record
class NodeView:
    """The whole node as ``numa-pin nrt`` describes it: the machine, the settings, the ledger, the
    configured devices (:func:`numa_pin.devices.inventory.inventory`) and the reserved CPUs."""

    topology: Topology
    settings: NodeSettings
    state: LedgerState
    devices: Mapping[str, Sequence[DeviceInfo]]
    reserved: frozenset[int]


def zone_entry(name: str, capacity: int, allocatable: int, available: int,
               fmt: Callable[[int], str] = str) -> dict[str, str]:
    """One resource of a NUMA zone: what the machine has, what is not reserved, what is free."""
    return {"name": name, "capacity": fmt(capacity), "allocatable": fmt(allocatable), "available": fmt(available)}


class Resource:
    """The pure half of a resource (see the module's table). Every method has a neutral default,
    so a resource implements only what it takes part in."""

    #: a short name for messages and the registry (``cpu``, ``memory``, ``example.com/widget``)
    name = ""

    def view(self, need: Need) -> Any:
        """This resource's view of the machine for one decision, or ``None`` (not involved)."""
        return None

    def wants(self, view: Any) -> bool:
        return False

    def claims(self, resource: str, view: Any) -> bool:
        """Whether ``resource`` (a name in ``numa-pin.io/devices``) is one of this resource's."""
        return False

    def hints(self, view: Any, amounts: Amounts) -> ProviderHints:
        return None

    def check_inside(self, view: Any, inside: frozenset[int]) -> None:
        """Raise :class:`TopologyAffinityError` for what sits outside ``inside`` already."""

    def allocate(self, view: Any, amounts: Amounts, affinity: frozenset[int] | None,
                 strict: bool) -> Mapping[str, Any]:
        """Take what ``amounts`` asks inside ``affinity`` (``strict``: never outside it).
        Returns the :class:`Decision` fields this resource sets. Raises
        :class:`~numa_pin.errors.AllocationError` or :class:`TopologyAffinityError`."""
        return {}

    def unplaceable(self, view: Any, amounts: Amounts) -> AdmissionError | None:
        """Why ``amounts`` cannot be placed on any affinity at all (asked when the merge refuses,
        so the refusal names the real cause rather than the per-node counts), or ``None``."""
        return None

    def vet(self, view: Any, decision: Decision, empty: bool) -> tuple[type[AdmissionError], str] | None:
        """A rejection of the admitted ``decision`` (``empty``: the request asked for nothing)."""
        return None

    def free_summary(self, view: Any, amounts: Amounts) -> list[str]:
        return []

    def notes(self, view: Any) -> list[str]:
        """What an admitted container should know (a device it carries that is not aligned to)."""
        return []

    def bounds(self, view: Any) -> list[str]:
        """What the container itself bounds this resource to (said after every free summary)."""
        return []

    def describe(self, grant: Grant) -> list[str]:
        return []

    def zones(self, node: NodeView) -> Mapping[int, list[dict[str, str]]]:
        """This resource's entries in each NUMA zone of the ``NodeResourceTopology`` object
        (:func:`zone_entry`), per node id."""
        return {}

    def refusal(self, request: ContainerRequest, target: RuntimeTarget) -> str:
        """Why ``target`` (the path the request came in by) cannot carry what ``request`` asks
        of this resource, in one line naming the path and one that can; ``""`` when it can."""
        return ""


def path_refusal(resources: Sequence[Resource], request: ContainerRequest, target: RuntimeTarget) -> None:
    """Raise :class:`~numa_pin.errors.PathLimitError` for the first resource whose part of
    ``request`` the path ``target`` cannot carry."""
    for resource in resources:
        why = resource.refusal(request, target)
        if why:
            from numa_pin.errors import PathLimitError

            raise PathLimitError(why)


def check_known(views: Sequence[tuple[Resource, Any]], amounts: Amounts, counted_only: bool = False) -> None:
    """Every device resource ``amounts`` names (``counted_only``: with a count) is some
    resource's. Raises :class:`~numa_pin.errors.RequestError` naming ``numa-pin.io/devices``."""
    for name in sorted(r for r, count in amounts.devices.items() if count or not counted_only):
        if not any(res.claims(name, view) for res, view in views):
            raise RequestError(f"unknown device resource {name!r}", annotation="numa-pin.io/devices")


def merge_fields(into: dict[str, Any], fields: Mapping[str, Any]) -> None:
    """Add one resource's :class:`Decision` fields to ``into``; mapping fields are merged."""
    for key, value in fields.items():
        old = into.get(key)
        into[key] = {**old, **value} if isinstance(old, Mapping) and isinstance(value, Mapping) else value


def nodes_text(nodes: frozenset[int]) -> str:
    return ",".join(str(n) for n in sorted(nodes))




def grant_from(request: ContainerRequest, decision: Decision, *, pid: int | None, start_time: float | None,
               cgroup: str | None, kind: str | None, created: float, boot_id: str | None = None) -> Grant:
    """The ledger's record of an admitted ``decision`` (made in the boot ``boot_id``)."""
    return Grant(
        container_id=request.container_id,
        pod_id=request.pod_id,
        container_name=request.qualified_name,
        kind=kind or ("exclusive" if decision.exclusive else "shared"),
        pid=pid,
        start_time=start_time,
        cgroup=cgroup,
        cpus=decision.cpus,
        mems=decision.mems,
        devices={k: tuple(v) for k, v in decision.devices.items()},
        memory={k: dict(v) for k, v in decision.memory.items()},
        cpuset_limit=request.cpuset,
        affinity=decision.hint.affinity,
        policy=decision.policy,
        scope=decision.scope,
        created=created,
        netdevs=(),
        boot_id=boot_id,
        notes=decision.notes,
        isolation=request.isolation.to_dict(),
        vf_config=dict(request.vf_config),
    )


def live_name_message(grant: Grant) -> str:
    """Why ``numa-pin run --name`` may not take a name a live grant holds."""
    from numa_pin.base.cpuset import format_list

    return (
        f"{grant.container_id!r} is the name of a live grant (pid {grant.pid}, cpus "
        f"{format_list(grant.cpus) or 'shared'}); choose another --name, or `numa-pin release "
        f"{grant.container_id}` once that job is gone"
    )


__all__ = [
    "Decision", "Need", "NodeSettings", "NodeView", "Resource", "check_known", "grant_from", "live_name_message",
    "merge_fields", "nodes_text", "path_refusal", "zone_entry",
]

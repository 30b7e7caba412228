"""The node ledger as plain, frozen data (pure: no I/O, no logging).

A :class:`LedgerState` holds one :class:`Grant` per container (or plain process) that
numa-pin admitted, keyed by container id, and one :class:`PodRecord` per pod whose
containers share a pod-scope decision. Updates return new states; nothing mutates.

``to_dict`` / ``from_dict`` convert to and from the JSON-ready form the store writes.
That form carries a ``version``; older versions are migrated first and newer ones refused
(:mod:`numa_pin.ledger.migrate`).

Construction checks types and raises :class:`ValueError` (a programming error);
``from_dict`` turns every shape problem into :class:`~numa_pin.errors.LedgerCorrupt`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from numa_pin import __version__
from numa_pin.base import names
from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.base.record import field, record, replace
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger import derived, shape
from numa_pin.ledger.migrate import LEDGER_VERSION, MIGRATIONS, migrate, newer_version_message
from numa_pin.ledger.pod import PodNetdev, PodRecord
from numa_pin.ledger.records import KIND_EXCLUSIVE, KIND_PROCESS, KIND_SHARED, GpuAccess

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

KINDS = (KIND_EXCLUSIVE, KIND_SHARED, KIND_PROCESS)

WRITTEN_BY = f"numa-pin {__version__}"


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@record
class Grant:
    """What one container (or process) was given.

    ``cpus`` are its *exclusive* CPUs (empty for ``kind="shared"``); ``mems`` the NUMA
    nodes of its ``cpuset.mems``; ``devices`` maps a resource name to device ids;
    ``memory`` maps a resource (``memory``, ``hugepages-2Mi``) to ``{node: bytes}``.
    ``pid``/``start_time`` (psutil ``create_time``) and ``cgroup`` (relative to the
    cgroup hierarchy root) are how :mod:`numa_pin.ledger.liveness` decides the grant is
    still in use. ``netdevs`` records SR-IOV VFs moved into this container's own netns (scope
    ``container``) so they can be put back; VFs moved once for a pod live on its
    :class:`PodRecord`. ``gpus`` is what granting GPUs added (:class:`GpuAccess`), or None.
    ``cpuset_limit`` is the cpuset the user gave the container (``linux.resources.cpu.cpus``);
    a shared container's cpuset is the shared pool inside it, never wider.

    Raises:
        ValueError: a field has the wrong type or value.
    """

    container_id: str
    pod_id: str
    container_name: str
    kind: str
    pid: int | None = None
    start_time: float | None = None
    cgroup: str | None = None
    cpus: frozenset[int] = frozenset()
    mems: frozenset[int] = frozenset()
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=_empty, hash=False)
    memory: Mapping[str, Mapping[int, int]] = field(default_factory=_empty, hash=False)
    affinity: frozenset[int] | None = None
    policy: str = names.NONE
    scope: str = names.CONTAINER_SCOPE
    created: float = 0.0
    netdevs: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    cpuset_limit: frozenset[int] | None = None
    gpus: GpuAccess | None = None
    #: CLOCK_BOOTTIME seconds when a grant was made before its container existed (no pid yet);
    #: its grace period is measured on this clock, which no wall-clock step moves
    pending_since: float | None = None
    #: the root filesystem the runtime was given for a pending grant (podman's ``root.path`` at
    #: precreate); once it is gone the container was removed before it started
    pending_root: str | None = None
    #: the boot the grant was made in (``/proc/sys/kernel/random/boot_id``); None: not recorded
    boot_id: str | None = None
    #: the exclusive CPUs it was admitted with, once a resize changed ``cpus`` (KEP-5554's
    #: "baseline CPUs": a shrink never gives them up); None: ``cpus`` are still the baseline
    baseline_cpus: frozenset[int] | None = None
    #: what the admission noted (a device the container carries that is not aligned to, and why)
    notes: tuple[str, ...] = field(default=(), hash=False)
    #: the isolation knobs the container asked (:mod:`numa_pin.requests.isolation`: field -> value)
    isolation: Mapping[str, Any] = field(default_factory=_empty, hash=False)
    #: the PF-side settings its VFs get (``numa-pin.io/vf-config``: :mod:`numa_pin.requests.vfconfig`)
    vf_config: Mapping[str, Any] = field(default_factory=_empty, hash=False)

    def __post_init__(self) -> None:
        shape.require_str("container_id", self.container_id, nonempty=True)
        shape.require_str("pod_id", self.pod_id)
        shape.require_str("container_name", self.container_name)
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.pid is not None and (not shape.is_int(self.pid) or self.pid <= 0):
            raise ValueError(f"pid must be a positive integer or None, got {self.pid!r}")
        if self.start_time is not None:
            shape.set_field(self, "start_time", shape.finite("start_time", self.start_time))
        if self.cgroup is not None:
            shape.require_str("cgroup", self.cgroup)
        shape.set_field(self, "cpus", shape.id_set("cpus", self.cpus))
        shape.set_field(self, "mems", shape.id_set("mems", self.mems))
        if self.kind == KIND_SHARED and self.cpus:
            raise ValueError("a shared grant has no exclusive cpus")
        shape.set_field(self, "devices", shape.device_map(self.devices))
        shape.set_field(self, "memory", shape.memory_map(self.memory))
        if self.affinity is not None:
            shape.set_field(self, "affinity", shape.id_set("affinity", self.affinity))
        shape.require_str("policy", self.policy, nonempty=True)
        shape.require_str("scope", self.scope, nonempty=True)
        shape.set_field(self, "created", shape.finite("created", self.created))
        shape.set_field(self, "netdevs", shape.netdev_entries(self.netdevs))
        if self.boot_id is not None:
            shape.require_str("boot_id", self.boot_id, nonempty=True)
        if not isinstance(self.notes, tuple) or not all(isinstance(n, str) for n in self.notes):
            raise ValueError(f"notes must be a tuple of strings, got {self.notes!r}")
        if self.cpuset_limit is not None:
            shape.set_field(self, "cpuset_limit", shape.id_set("cpuset_limit", self.cpuset_limit))
        if self.gpus is not None and not isinstance(self.gpus, GpuAccess):
            raise ValueError(f"gpus must be a GpuAccess or None, got {type(self.gpus).__name__}")
        if self.pending_since is not None:
            shape.set_field(self, "pending_since", shape.finite("pending_since", self.pending_since))
        if self.baseline_cpus is not None:
            shape.set_field(self, "baseline_cpus", shape.id_set("baseline_cpus", self.baseline_cpus))
            if not self.baseline_cpus <= self.cpus:
                raise ValueError("baseline_cpus must be a subset of cpus")
        shape.set_field(self, "isolation", shape.isolation_map(self.isolation))
        shape.set_field(self, "vf_config", shape.vf_config_map(self.vf_config))

    def as_shared(self) -> Grant:
        """The same container tracked as a shared one (``numa-pin release --force``): nothing
        held for it alone any more (no exclusive CPUs, devices, memory, affinity, or records of
        what was moved or opened for it); its cgroup, pid and memory nodes stay."""
        return replace(self, kind=KIND_SHARED, cpus=frozenset(), devices={}, memory={}, affinity=None,
                       netdevs=(), gpus=None, baseline_cpus=None, isolation={}, vf_config={})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: CPU and node sets as kernel list strings (``"0-3,8"``).
        ``pending_since`` appears only while it is set (between precreate and the start)."""
        out = {
            "container_id": self.container_id,
            "pod_id": self.pod_id,
            "container_name": self.container_name,
            "kind": self.kind,
            "pid": self.pid,
            "start_time": self.start_time,
            "cgroup": self.cgroup,
            "cpus": format_list(self.cpus),
            "mems": format_list(self.mems),
            "devices": {res: list(ids) for res, ids in sorted(self.devices.items())},
            "memory": {
                res: {str(node): size for node, size in sorted(per_node.items())}
                for res, per_node in sorted(self.memory.items())
            },
            "affinity": None if self.affinity is None else format_list(self.affinity),
            "policy": self.policy,
            "scope": self.scope,
            "created": self.created,
            "netdevs": [shape.plain(rec) for rec in self.netdevs],
            "cpuset_limit": None if self.cpuset_limit is None else format_list(self.cpuset_limit),
            "gpus": None if self.gpus is None else self.gpus.to_dict(),
        }
        if self.pending_since is not None:
            out["pending_since"] = self.pending_since
        if self.pending_root is not None:
            out["pending_root"] = self.pending_root
        if self.boot_id is not None:
            out["boot_id"] = self.boot_id
        if self.baseline_cpus is not None:
            out["baseline_cpus"] = format_list(self.baseline_cpus)
        if self.notes:
            out["notes"] = list(self.notes)
        if self.isolation:
            out["isolation"] = dict(self.isolation)
        if self.vf_config:
            out["vf_config"] = dict(self.vf_config)
        return out

    @classmethod
    def from_dict(cls, d: object) -> Grant:
        """Inverse of :meth:`to_dict`.

        Raises:
            LedgerCorrupt: a key is missing or unknown, or a value has the wrong shape.
        """
        optional = _OPTIONAL_KEYS & d.keys() if isinstance(d, dict) else frozenset()
        obj = shape.exact_keys("grant", d, _GRANT_KEYS | optional)
        where = f"grant {obj.get('container_id')!r}"
        try:
            return cls(
                container_id=shape.json_field(obj, "container_id", str, where),
                pod_id=shape.json_field(obj, "pod_id", str, where),
                container_name=shape.json_field(obj, "container_name", str, where),
                kind=shape.json_field(obj, "kind", str, where),
                pid=shape.json_field(obj, "pid", (int, type(None)), where),
                start_time=shape.json_field(obj, "start_time", (int, float, type(None)), where),
                cgroup=shape.json_field(obj, "cgroup", (str, type(None)), where),
                cpus=parse_list(shape.json_field(obj, "cpus", str, where)),
                mems=parse_list(shape.json_field(obj, "mems", str, where)),
                devices=shape.json_field(obj, "devices", dict, where),
                memory={
                    res: {shape.node_key(k): v for k, v in shape.as_dict(per, where).items()}
                    for res, per in shape.json_field(obj, "memory", dict, where).items()
                },
                affinity=shape.opt_list(shape.json_field(obj, "affinity", (str, type(None)), where)),
                policy=shape.json_field(obj, "policy", str, where),
                scope=shape.json_field(obj, "scope", str, where),
                created=shape.json_field(obj, "created", (int, float), where),
                netdevs=tuple(shape.json_field(obj, "netdevs", list, where)),
                cpuset_limit=shape.opt_list(shape.json_field(obj, "cpuset_limit", (str, type(None)), where)),
                gpus=None if obj["gpus"] is None else GpuAccess.from_dict(obj["gpus"], where),
                pending_since=(shape.json_field(obj, "pending_since", (int, float), where)
                               if "pending_since" in obj else None),
                pending_root=shape.json_field(obj, "pending_root", str, where) if "pending_root" in obj else None,
                boot_id=shape.json_field(obj, "boot_id", str, where) if "boot_id" in obj else None,
                baseline_cpus=(parse_list(shape.json_field(obj, "baseline_cpus", str, where))
                               if "baseline_cpus" in obj else None),
                notes=tuple(shape.json_field(obj, "notes", list, where)) if "notes" in obj else (),
                isolation=shape.json_field(obj, "isolation", dict, where) if "isolation" in obj else {},
                vf_config=shape.json_field(obj, "vf_config", dict, where) if "vf_config" in obj else {},
            )
        except (ValueError, TypeError) as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


_GRANT_KEYS = frozenset(
    ("container_id", "pod_id", "container_name", "kind", "pid", "start_time", "cgroup", "cpus")
    + ("mems", "devices", "memory", "affinity", "policy", "scope", "created", "netdevs", "cpuset_limit", "gpus")
)

#: optional: ``pending_since`` and ``pending_root`` only while a grant made before its container
#: existed waits for it; ``boot_id`` where the boot was known; ``baseline_cpus`` once a resize changed its CPUs;
#: ``notes`` where the admission noted something; ``isolation`` where the container asked any;
#: ``vf_config`` where it asked settings for its VFs
_OPTIONAL_KEYS = frozenset(("pending_since", "pending_root", "boot_id", "baseline_cpus", "notes", "isolation",
                            "vf_config"))


@record
class LedgerState:
    """Every grant and pod record on the node. Queries and updates are pure.

    Raises:
        ValueError: a mapping key differs from the id of the grant or pod it holds.
    """

    grants: Mapping[str, Grant] = field(default_factory=_empty, hash=False)
    pods: Mapping[str, PodRecord] = field(default_factory=_empty, hash=False)

    def __post_init__(self) -> None:
        grants = dict(self.grants)
        for key, grant in grants.items():
            if not isinstance(grant, Grant) or key != grant.container_id:
                raise ValueError(f"grants[{key!r}] must be the Grant of container {key!r}")
        pods = dict(self.pods)
        for key, pod in pods.items():
            if not isinstance(pod, PodRecord) or key != pod.pod_id:
                raise ValueError(f"pods[{key!r}] must be the PodRecord of pod {key!r}")
        shape.set_field(self, "grants", MappingProxyType(grants))
        shape.set_field(self, "pods", MappingProxyType(pods))

    # ---- queries -----------------------------------------------------------------

    def grant(self, container_id: str) -> Grant | None:
        """The grant of ``container_id``, or ``None``."""
        return self.grants.get(container_id)

    def exclusive_cpus(self) -> frozenset[int]:
        """Every CPU some grant holds exclusively (the shared pool is the rest); worked out once
        per state (:mod:`~numa_pin.ledger.derived`)."""
        return derived.exclusive_cpus(self)

    def devices_in_use(self, resource: str) -> frozenset[str]:
        """Device ids of ``resource`` held by any grant, or sitting in a pod's network namespace
        (a VF stays there while the pod has a grant, after the container it was granted to ended)."""
        memo: dict[str, frozenset[str]] | None = getattr(self, "_in_use", None)
        if memo is None:
            memo = {}
            shape.set_field(self, "_in_use", memo)
        known = memo.get(resource)
        if known is None:
            out: set[str] = set()
            for grant in self.grants.values():
                out.update(grant.devices.get(resource, ()))
            for pod in self.pods.values():
                out.update(n.address for n in pod.netdevs if n.resource == resource)
            known = memo[resource] = frozenset(out)
        return known

    def pod_netdev(self, address: str) -> tuple[str, PodNetdev] | None:
        """``(pod_id, record)`` of the pod whose network namespace holds VF ``address``, or None."""
        for pod_id, pod in sorted(self.pods.items()):
            found = pod.netdev(address)
            if found is not None:
                return pod_id, found
        return None

    def memory_in_use(self) -> Mapping[str, Mapping[int, int]]:
        """Bytes granted per resource and NUMA node, summed over all grants."""
        out: dict[str, dict[int, int]] = {}
        for grant in self.grants.values():
            for res, per_node in grant.memory.items():
                acc = out.setdefault(res, {})
                for node, size in per_node.items():
                    acc[node] = acc.get(node, 0) + size
        return out

    def grants_of_pod(self, pod_id: str) -> tuple[Grant, ...]:
        """The grants of one pod, ordered by container id."""
        return tuple(g for _, g in sorted(self.grants.items()) if g.pod_id == pod_id)

    def shared_grants(self) -> tuple[Grant, ...]:
        """Grants of ``kind="shared"`` (their cpuset follows the shared pool), by container id;
        worked out once per state (:mod:`~numa_pin.ledger.derived`)."""
        return derived.shared_grants(self)

    def limited_shared(self) -> tuple[Grant, ...]:
        """The shared grants with a cpuset of their own (``cpuset_limit``), by container id."""
        return derived.limited_shared(self)

    def overlaps(self, grant: Grant) -> tuple[str, ...]:
        """Ids of *other* containers holding any of ``grant``'s exclusive CPUs or devices."""
        out = []
        for cid, other in sorted(self.grants.items()):
            if cid == grant.container_id:
                continue
            if other.cpus & grant.cpus or any(
                set(ids) & set(other.devices.get(res, ())) for res, ids in grant.devices.items()
            ):
                out.append(cid)
        return tuple(out)

    # ---- updates -----------------------------------------------------------------

    def with_grant(self, grant: Grant) -> LedgerState:
        """A new state where ``grant`` replaces any grant of the same container."""
        if not isinstance(grant, Grant):
            raise ValueError(f"not a Grant: {type(grant).__name__}")
        grants = shape.copy_of(self.grants)
        grants[grant.container_id] = grant
        state = self._checked(grants, self.pods)
        derived.carry(self, state, self.grants.get(grant.container_id), grant)
        return state

    def without(self, container_id: str) -> LedgerState:
        """A new state without the grant of ``container_id`` (unchanged if absent)."""
        if container_id not in self.grants:
            return self
        grants = shape.copy_of(self.grants)
        gone = grants.pop(container_id)
        state = self._checked(grants, self.pods)
        derived.carry(self, state, gone, None)
        return state

    def _checked(self, grants: dict[str, Grant], pods: Mapping[str, PodRecord]) -> LedgerState:
        """A state of ``grants`` and ``pods`` whose every entry but the one changed is this
        state's, so checked already (a busy node's ledger has thousands)."""
        state: LedgerState = object.__new__(LedgerState)
        shape.set_field(state, "grants", MappingProxyType(grants))
        shape.set_field(state, "pods", pods if isinstance(pods, MappingProxyType) else MappingProxyType(dict(pods)))
        return state

    def with_pod(self, record: PodRecord) -> LedgerState:
        """A new state where ``record`` replaces any record of the same pod."""
        return LedgerState(self.grants, {**self.pods, record.pod_id: record})

    def without_pod(self, pod_id: str) -> LedgerState:
        """A new state without the record of ``pod_id`` (unchanged if absent; grants stay)."""
        if pod_id not in self.pods:
            return self
        return LedgerState(self.grants, {k: v for k, v in self.pods.items() if k != pod_id})

    # ---- serialisation -----------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stamped with :data:`LEDGER_VERSION` and :data:`WRITTEN_BY`."""
        return {
            "version": LEDGER_VERSION,
            "written_by": WRITTEN_BY,
            "grants": {cid: g.to_dict() for cid, g in sorted(self.grants.items())},
            "pods": {pid: p.to_dict() for pid, p in sorted(self.pods.items())},
        }

    @classmethod
    def from_dict(cls, d: object, decoded: dict[str, tuple[str, Grant]] | None = None) -> LedgerState:
        """Inverse of :meth:`to_dict`; older versions are migrated first. ``decoded`` (an owner's
        :attr:`~numa_pin.ledger.codec.Memo.decoded`) lends the grants it decoded last, reused
        where their JSON is unchanged, and then keeps these; None: every grant is decoded.

        Raises:
            LedgerCorrupt: unknown or newer version, or any shape problem.
        """
        obj = migrate(d)
        obj = shape.exact_keys("ledger data", obj, frozenset(("version", "written_by", "grants", "pods")))
        shape.json_field(obj, "written_by", str, "ledger data")
        grants = shape.json_field(obj, "grants", dict, "ledger data")
        pods = shape.json_field(obj, "pods", dict, "ledger data")
        parsed_grants = _grants_from_dict(grants, decoded)
        parsed_pods = {key: PodRecord.from_dict(value) for key, value in pods.items()}
        try:
            return cls(parsed_grants, parsed_pods)
        except ValueError as exc:
            raise LedgerCorrupt(str(exc)) from None


def _grants_from_dict(grants: dict[str, Any], decoded: dict[str, tuple[str, Grant]] | None) -> dict[str, Grant]:
    """``{id: Grant.from_dict(value)}``, reusing the grants in ``decoded`` whose JSON value has
    the same ``repr`` (unlike ``==``, it tells ``1``, ``1.0`` and ``true`` apart), and leaving
    ``decoded`` holding these grants (issue 21: a commit changes one grant of hundreds)."""
    if decoded is None:
        return {key: Grant.from_dict(value) for key, value in grants.items()}
    out: dict[str, Grant] = {}
    seen: dict[str, tuple[str, Grant]] = {}
    for key, value in grants.items():
        text = repr(value)
        known = decoded.get(key)
        grant = out[key] = known[1] if known is not None and known[0] == text else Grant.from_dict(value)
        seen[key] = (text, grant)
    decoded.clear()
    decoded.update(seen)
    return out


__all__ = [
    "KINDS",
    "KIND_EXCLUSIVE",
    "KIND_PROCESS",
    "KIND_SHARED",
    "LEDGER_VERSION",
    "MIGRATIONS",
    "Grant",
    "LedgerState",
    "PodNetdev",
    "PodRecord",
    "migrate",
    "newer_version_message",
]

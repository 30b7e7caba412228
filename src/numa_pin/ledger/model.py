"""The node ledger as plain, frozen data (pure: no I/O, no logging).

A :class:`LedgerState` holds one :class:`Grant` per container (or plain process) that
numa-pin admitted, keyed by container id, and one :class:`PodRecord` per pod whose
containers share a pod-scope decision. Updates return new states; nothing mutates.

``to_dict`` / ``from_dict`` convert to and from the JSON-ready form the store writes.
That form carries a ``version``; older versions are migrated by :data:`MIGRATIONS`
(version 1 had no ``cpuset_limit``: it becomes ``null``; version 2 kept a grant's GPU undo
record among its ``netdevs`` and had no pod-level VFs: the record moves to ``gpus``, and pods
get an empty ``netdevs``), newer ones are refused with :class:`numa_pin.errors.LedgerCorrupt`
naming the numa-pin release that wrote them.

Construction checks types and raises :class:`ValueError` (a programming error);
``from_dict`` turns every shape problem into :class:`~numa_pin.errors.LedgerCorrupt`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from numa_pin import __version__, names
from numa_pin.cpuset import format_list, parse_list
from numa_pin.errors import LedgerCorrupt
from numa_pin.record import field, record

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any, TypeGuard

#: the ledger format this numa-pin writes
LEDGER_VERSION = 3


def _v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
    """Version 2 adds ``cpuset_limit`` to every grant (``null``: no cpuset of its own)."""
    grants = d.get("grants")
    if isinstance(grants, dict):
        d["grants"] = {k: {**g, "cpuset_limit": None} if isinstance(g, dict) else g for k, g in grants.items()}
    d["version"] = 2
    return d


def _v2_to_v3(d: dict[str, Any]) -> dict[str, Any]:
    """Version 3 gives a grant's GPU undo record a field of its own (``gpus``; version 2 kept it
    as a ``{"gpu": "<json>"}`` entry of ``netdevs``) and every pod a ``netdevs`` list (VFs moved
    once into the pod's network namespace; version 2 moved none per pod).

    Raises:
        LedgerCorrupt: a version-2 GPU entry that is not the JSON object numa-pin wrote.
    """
    grants = d.get("grants")
    if isinstance(grants, dict):
        d["grants"] = {k: _split_gpu_entry(k, g) if isinstance(g, dict) else g for k, g in grants.items()}
    pods = d.get("pods")
    if isinstance(pods, dict):
        d["pods"] = {k: {**p, "netdevs": []} if isinstance(p, dict) else p for k, p in pods.items()}
    d["version"] = 3
    return d


def _split_gpu_entry(key: str, grant: dict[str, Any]) -> dict[str, Any]:
    netdevs = grant.get("netdevs")
    out = {**grant, "gpus": None}
    if not isinstance(netdevs, list):
        return out
    gpu = [e for e in netdevs if isinstance(e, dict) and "gpu" in e]
    if not gpu:
        return out
    merged: dict[str, Any] = {"nodes": [], "rules": [], "devices_dir": None, "bpf_dirs": []}
    for entry in gpu:
        try:
            rec = json.loads(entry["gpu"]) if isinstance(entry["gpu"], str) else None
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or not all(isinstance(rec.get(f), list) for f in ("nodes", "rules")):
            raise LedgerCorrupt(f"grant {key!r}: version-2 GPU record in netdevs is not a JSON object with "
                                f"nodes and rules: {str(entry['gpu'])[:80]!r}")
        merged["nodes"] += rec["nodes"]
        merged["rules"] += rec["rules"]
        if merged["devices_dir"] is None:
            merged["devices_dir"] = rec.get("devices_dir")
        if isinstance(rec.get("bpf_dirs"), list):
            merged["bpf_dirs"] += rec["bpf_dirs"]
    out["gpus"] = merged
    out["netdevs"] = [e for e in netdevs if not (isinstance(e, dict) and "gpu" in e)]
    return out


#: ``migrate`` steps: ``MIGRATIONS[n]`` turns a version-``n`` dict into a version ``n + 1`` dict
MIGRATIONS: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = MappingProxyType(
    {1: _v1_to_v2, 2: _v2_to_v3}
)

KIND_EXCLUSIVE = "exclusive"  # container with exclusive CPUs
KIND_SHARED = "shared"  # container in the shared pool (no exclusive CPUs)
KIND_PROCESS = "process"  # a plain process started by ``numa-pin run``
KINDS = (KIND_EXCLUSIVE, KIND_SHARED, KIND_PROCESS)

WRITTEN_BY = f"numa-pin {__version__}"


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@record
class GpuAccess:
    """What granting GPUs to a running container added, so a release by hand can take it back:
    the device nodes made in its mount namespace and the device ``rules``, written as
    ``devices.allow`` to the cgroup v1 ``devices`` directory ``devices_dir`` (None: none written
    there), or put in front of the device programs of the cgroup v2 directories ``bpf_dirs``.

    Raises:
        ValueError: a field has the wrong type.
    """

    nodes: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    devices_dir: str | None = None
    bpf_dirs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "nodes", _strings("gpus.nodes", self.nodes))
        _set(self, "rules", _strings("gpus.rules", self.rules))
        _set(self, "bpf_dirs", _strings("gpus.bpf_dirs", self.bpf_dirs))
        if self.devices_dir is not None:
            _require_str("gpus.devices_dir", self.devices_dir, nonempty=True)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "rules": list(self.rules), "devices_dir": self.devices_dir,
                "bpf_dirs": list(self.bpf_dirs)}

    @classmethod
    def from_dict(cls, d: object, where: str) -> GpuAccess:
        """Inverse of :meth:`to_dict`. Raises LedgerCorrupt (``where`` names the grant)."""
        obj = _exact_keys(f"{where}: gpus", d, frozenset(("nodes", "rules", "devices_dir", "bpf_dirs")))
        try:
            return cls(
                nodes=tuple(_json(obj, "nodes", list, where)),
                rules=tuple(_json(obj, "rules", list, where)),
                devices_dir=_json(obj, "devices_dir", (str, type(None)), where),
                bpf_dirs=tuple(_json(obj, "bpf_dirs", list, where)),
            )
        except ValueError as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


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
    netdevs: tuple[Mapping[str, str], ...] = field(default=(), hash=False)
    cpuset_limit: frozenset[int] | None = None
    gpus: GpuAccess | None = None

    def __post_init__(self) -> None:
        _require_str("container_id", self.container_id, nonempty=True)
        _require_str("pod_id", self.pod_id)
        _require_str("container_name", self.container_name)
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.pid is not None and (not _is_int(self.pid) or self.pid <= 0):
            raise ValueError(f"pid must be a positive integer or None, got {self.pid!r}")
        if self.start_time is not None:
            _set(self, "start_time", _finite("start_time", self.start_time))
        if self.cgroup is not None:
            _require_str("cgroup", self.cgroup)
        _set(self, "cpus", _ids("cpus", self.cpus))
        _set(self, "mems", _ids("mems", self.mems))
        if self.kind == KIND_SHARED and self.cpus:
            raise ValueError("a shared grant has no exclusive cpus")
        _set(self, "devices", _devices(self.devices))
        _set(self, "memory", _memory(self.memory))
        if self.affinity is not None:
            _set(self, "affinity", _ids("affinity", self.affinity))
        _require_str("policy", self.policy, nonempty=True)
        _require_str("scope", self.scope, nonempty=True)
        _set(self, "created", _finite("created", self.created))
        _set(self, "netdevs", _netdevs(self.netdevs))
        if self.cpuset_limit is not None:
            _set(self, "cpuset_limit", _ids("cpuset_limit", self.cpuset_limit))
        if self.gpus is not None and not isinstance(self.gpus, GpuAccess):
            raise ValueError(f"gpus must be a GpuAccess or None, got {type(self.gpus).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: CPU and node sets as kernel list strings (``"0-3,8"``)."""
        return {
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
            "netdevs": [dict(sorted(rec.items())) for rec in self.netdevs],
            "cpuset_limit": None if self.cpuset_limit is None else format_list(self.cpuset_limit),
            "gpus": None if self.gpus is None else self.gpus.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: object) -> Grant:
        """Inverse of :meth:`to_dict`.

        Raises:
            LedgerCorrupt: a key is missing or unknown, or a value has the wrong shape.
        """
        obj = _exact_keys("grant", d, _GRANT_KEYS)
        where = f"grant {obj.get('container_id')!r}"
        try:
            return cls(
                container_id=_json(obj, "container_id", str, where),
                pod_id=_json(obj, "pod_id", str, where),
                container_name=_json(obj, "container_name", str, where),
                kind=_json(obj, "kind", str, where),
                pid=_json(obj, "pid", (int, type(None)), where),
                start_time=_json(obj, "start_time", (int, float, type(None)), where),
                cgroup=_json(obj, "cgroup", (str, type(None)), where),
                cpus=parse_list(_json(obj, "cpus", str, where)),
                mems=parse_list(_json(obj, "mems", str, where)),
                devices=_json(obj, "devices", dict, where),
                memory={
                    res: {_node_key(k): v for k, v in _as_dict(per, where).items()}
                    for res, per in _json(obj, "memory", dict, where).items()
                },
                affinity=_opt_list(_json(obj, "affinity", (str, type(None)), where)),
                policy=_json(obj, "policy", str, where),
                scope=_json(obj, "scope", str, where),
                created=_json(obj, "created", (int, float), where),
                netdevs=tuple(_json(obj, "netdevs", list, where)),
                cpuset_limit=_opt_list(_json(obj, "cpuset_limit", (str, type(None)), where)),
                gpus=None if obj["gpus"] is None else GpuAccess.from_dict(obj["gpus"], where),
            )
        except (ValueError, TypeError) as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


_GRANT_KEYS = frozenset(
    ("container_id", "pod_id", "container_name", "kind", "pid", "start_time", "cgroup", "cpus")
    + ("mems", "devices", "memory", "affinity", "policy", "scope", "created", "netdevs", "cpuset_limit", "gpus")
)


@record
class PodNetdev:
    """An SR-IOV VF moved once into a pod's network namespace (scope ``pod``).

    ``address`` is the VF's PCI address and ``resource`` the device resource it was granted
    as; ``ifname`` its name there (``net1``, ``net2``, ... counted per pod netns); ``netns``
    the identity of that netns (``<st_dev>:<st_ino>`` of ``/proc/<pid>/ns/net``); ``moved_by``
    the container whose admission moved it; ``record`` the JSON of the enforcer's
    ``NetdevRecord``, which is what giving it back to the host needs.

    Raises:
        ValueError: a field is not a non-empty string.
    """

    address: str
    resource: str
    ifname: str
    netns: str
    moved_by: str
    record: str

    def __post_init__(self) -> None:
        for name in _POD_NETDEV_KEYS:
            _require_str(f"pod netdev {name}", getattr(self, name), nonempty=True)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in sorted(_POD_NETDEV_KEYS)}

    @classmethod
    def from_dict(cls, d: object, where: str) -> PodNetdev:
        """Inverse of :meth:`to_dict`. Raises LedgerCorrupt (``where`` names the pod)."""
        obj = _exact_keys(f"{where}: netdevs entry", d, _POD_NETDEV_KEYS)
        try:
            return cls(**{name: _json(obj, name, str, where) for name in _POD_NETDEV_KEYS})
        except ValueError as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


_POD_NETDEV_KEYS = frozenset(("address", "resource", "ifname", "netns", "moved_by", "record"))


@record
class PodRecord:
    """The pod-scope decision shared by the containers of one pod, and the VFs moved once into
    the pod's network namespace (``netdevs``), which go back to the host with the record.

    Raises:
        ValueError: a field has the wrong type or value.
    """

    pod_id: str
    affinity: frozenset[int] | None = None
    policy: str = names.NONE
    scope: str = names.POD_SCOPE
    created: float = 0.0
    netdevs: tuple[PodNetdev, ...] = ()

    def __post_init__(self) -> None:
        _require_str("pod_id", self.pod_id, nonempty=True)
        if self.affinity is not None:
            _set(self, "affinity", _ids("affinity", self.affinity))
        _require_str("policy", self.policy, nonempty=True)
        _require_str("scope", self.scope, nonempty=True)
        _set(self, "created", _finite("created", self.created))
        if isinstance(self.netdevs, (str, bytes, Mapping)) or not isinstance(self.netdevs, Iterable):
            raise ValueError("pod netdevs must be a sequence of PodNetdev")
        netdevs = tuple(self.netdevs)
        if not all(isinstance(n, PodNetdev) for n in netdevs):
            raise ValueError("pod netdevs must be a sequence of PodNetdev")
        addresses = [n.address for n in netdevs]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"pod {self.pod_id!r} records a VF twice: {sorted(addresses)!r}")
        _set(self, "netdevs", netdevs)

    def netdev(self, address: str) -> PodNetdev | None:
        """The record of VF ``address`` in this pod's netns, or None."""
        return next((n for n in self.netdevs if n.address == address), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod_id": self.pod_id,
            "affinity": None if self.affinity is None else format_list(self.affinity),
            "policy": self.policy,
            "scope": self.scope,
            "created": self.created,
            "netdevs": [n.to_dict() for n in self.netdevs],
        }

    @classmethod
    def from_dict(cls, d: object) -> PodRecord:
        """Inverse of :meth:`to_dict`.

        Raises:
            LedgerCorrupt: a key is missing or unknown, or a value has the wrong shape.
        """
        obj = _exact_keys("pod", d, _POD_KEYS)
        where = f"pod {obj.get('pod_id')!r}"
        try:
            return cls(
                pod_id=_json(obj, "pod_id", str, where),
                affinity=_opt_list(_json(obj, "affinity", (str, type(None)), where)),
                policy=_json(obj, "policy", str, where),
                scope=_json(obj, "scope", str, where),
                created=_json(obj, "created", (int, float), where),
                netdevs=tuple(PodNetdev.from_dict(n, where) for n in _json(obj, "netdevs", list, where)),
            )
        except (ValueError, TypeError) as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


_POD_KEYS = frozenset(("pod_id", "affinity", "policy", "scope", "created", "netdevs"))


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
        _set(self, "grants", MappingProxyType(grants))
        _set(self, "pods", MappingProxyType(pods))

    # ---- queries -----------------------------------------------------------------

    def grant(self, container_id: str) -> Grant | None:
        """The grant of ``container_id``, or ``None``."""
        return self.grants.get(container_id)

    def exclusive_cpus(self) -> frozenset[int]:
        """Every CPU some grant holds exclusively (the shared pool is the rest)."""
        out: set[int] = set()
        for grant in self.grants.values():
            out |= grant.cpus
        return frozenset(out)

    def devices_in_use(self, resource: str) -> frozenset[str]:
        """Device ids of ``resource`` held by any grant, or sitting in a pod's network namespace
        (a VF stays there while the pod has a grant, after the container it was granted to ended)."""
        out: set[str] = set()
        for grant in self.grants.values():
            out.update(grant.devices.get(resource, ()))
        for pod in self.pods.values():
            out.update(n.address for n in pod.netdevs if n.resource == resource)
        return frozenset(out)

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
        """Grants of ``kind="shared"`` (their cpuset follows the shared pool), by container id."""
        return tuple(g for _, g in sorted(self.grants.items()) if g.kind == KIND_SHARED)

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
        return LedgerState({**self.grants, grant.container_id: grant}, self.pods)

    def without(self, container_id: str) -> LedgerState:
        """A new state without the grant of ``container_id`` (unchanged if absent)."""
        if container_id not in self.grants:
            return self
        grants = {k: v for k, v in self.grants.items() if k != container_id}
        return LedgerState(grants, self.pods)

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
    def from_dict(cls, d: object) -> LedgerState:
        """Inverse of :meth:`to_dict`; older versions are migrated first.

        Raises:
            LedgerCorrupt: unknown or newer version, or any shape problem.
        """
        obj = migrate(d)
        obj = _exact_keys("ledger data", obj, frozenset(("version", "written_by", "grants", "pods")))
        _json(obj, "written_by", str, "ledger data")
        grants = _json(obj, "grants", dict, "ledger data")
        pods = _json(obj, "pods", dict, "ledger data")
        parsed_grants = _grants_from_dict(grants)
        parsed_pods = {key: PodRecord.from_dict(value) for key, value in pods.items()}
        try:
            return cls(parsed_grants, parsed_pods)
        except ValueError as exc:
            raise LedgerCorrupt(str(exc)) from None


#: ``{container id: (repr of its JSON value, Grant)}`` of the grants last decoded: a grant whose
#: JSON is unchanged is neither decoded nor checked again, and stays the same object (so the
#: store reuses its encoded text too). A commit changes one grant of hundreds (issue 21)
_DECODED: dict[str, tuple[str, Grant]] = {}


def _grants_from_dict(grants: dict[str, Any]) -> dict[str, Grant]:
    """``{id: Grant.from_dict(value)}``, reusing the grants of the last call whose JSON value
    has the same ``repr`` (unlike ``==``, it tells ``1``, ``1.0`` and ``true`` apart)."""
    out: dict[str, Grant] = {}
    seen: dict[str, tuple[str, Grant]] = {}
    for key, value in grants.items():
        text = repr(value)
        known = _DECODED.get(key)
        grant = out[key] = known[1] if known is not None and known[0] == text else Grant.from_dict(value)
        seen[key] = (text, grant)
    _DECODED.clear()
    _DECODED.update(seen)
    return out


def migrate(
    d: object,
    *,
    migrations: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = MIGRATIONS,
    current: int = LEDGER_VERSION,
) -> dict[str, Any]:
    """Bring a ledger data dict to format version ``current``.

    Raises:
        LedgerCorrupt: not a dict, no integer ``version``, a version newer than ``current``
            (the message names the release that wrote it), or no migration step for it.
    """
    if not isinstance(d, dict):
        raise LedgerCorrupt(f"ledger data must be a JSON object, got {type(d).__name__}")
    version = d.get("version")
    if not _is_int(version):
        raise LedgerCorrupt(f"ledger data has no integer version (got {version!r})")
    if version > current:
        raise LedgerCorrupt(newer_version_message(version, d.get("written_by"), current))
    while version < current:
        step = migrations.get(version)
        if step is None:
            raise LedgerCorrupt(f"unknown ledger format version {version} (no migration to {current})")
        d = step(dict(d))
        version += 1
        if d.get("version") != version:
            raise LedgerCorrupt(f"migration from version {version - 1} did not produce version {version}")
    return d


def newer_version_message(version: int, written_by: object, current: int = LEDGER_VERSION) -> str:
    """The operator-facing text for a ledger written by a newer numa-pin."""
    writer = written_by if isinstance(written_by, str) and written_by else "a newer numa-pin"
    return (
        f"ledger format version {version} was written by {writer}; this numa-pin "
        f"{__version__} reads format versions up to {current}: run that numa-pin "
        "release (or newer) on this node"
    )


# ---- helpers ---------------------------------------------------------------------


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_str(name: str, value: object, *, nonempty: bool = False) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    if nonempty and not value:
        raise ValueError(f"{name} must not be empty")


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _ids(name: str, values: Iterable[int]) -> frozenset[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a set of ids, got {type(values).__name__}")
    out = frozenset(values)
    if not all(_is_int(i) and i >= 0 for i in out):
        raise ValueError(f"{name} must hold non-negative integers, got {sorted(out, key=str)!r}")
    return out


def _devices(devices: object) -> Mapping[str, tuple[str, ...]]:
    if not isinstance(devices, Mapping):
        raise ValueError(f"devices must be a mapping, got {type(devices).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for res, ids in devices.items():
        _require_str("devices resource name", res, nonempty=True)
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise ValueError(f"devices[{res!r}] must be a list of device ids")
        tup = tuple(ids)
        for dev in tup:
            _require_str(f"devices[{res!r}] entry", dev, nonempty=True)
        out[res] = tup
    return MappingProxyType(out)


def _memory(memory: object) -> Mapping[str, Mapping[int, int]]:
    if not isinstance(memory, Mapping):
        raise ValueError(f"memory must be a mapping, got {type(memory).__name__}")
    out: dict[str, Mapping[int, int]] = {}
    for res, per_node in memory.items():
        _require_str("memory resource name", res, nonempty=True)
        if not isinstance(per_node, Mapping):
            raise ValueError(f"memory[{res!r}] must map NUMA node -> bytes")
        inner: dict[int, int] = {}
        for node, size in per_node.items():
            if not (_is_int(node) and node >= 0 and _is_int(size) and size >= 0):
                raise ValueError(f"memory[{res!r}] must map node id -> bytes, got {node!r}: {size!r}")
            inner[node] = size
        out[res] = MappingProxyType(inner)
    return MappingProxyType(out)


def _netdevs(netdevs: object) -> tuple[Mapping[str, str], ...]:
    if isinstance(netdevs, (str, bytes, Mapping)) or not isinstance(netdevs, Iterable):
        raise ValueError("netdevs must be a sequence of records")
    out = []
    for rec in netdevs:
        if not isinstance(rec, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in rec.items()
        ):
            raise ValueError(f"netdevs records must map strings to strings, got {rec!r}")
        out.append(MappingProxyType(dict(rec)))
    return tuple(out)


def _strings(name: str, values: object) -> tuple[str, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of strings, got {type(values).__name__}")
    out = tuple(values)
    if not all(isinstance(v, str) for v in out):
        raise ValueError(f"{name} must hold strings, got {out!r}")
    return out


def _exact_keys(what: str, d: object, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise LedgerCorrupt(f"{what} must be a JSON object, got {type(d).__name__}")
    missing = keys - d.keys()
    extra = d.keys() - keys
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(sorted(missing))}")
        if extra:
            parts.append(f"unknown {', '.join(sorted(map(str, extra)))}")
        raise LedgerCorrupt(f"{what}: {'; '.join(parts)}")
    return d


def _json(obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    value = obj[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise LedgerCorrupt(f"{where}: {key} has the wrong type (bool)")
    if not isinstance(value, types):
        raise LedgerCorrupt(f"{where}: {key} has the wrong type ({type(value).__name__})")
    return value


def _as_dict(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LedgerCorrupt(f"{where}: memory entries must be objects")
    return value


def _node_key(key: str) -> int:
    if not (key.isascii() and key.isdigit()) or str(int(key)) != key:
        raise ValueError(f"memory node id {key!r} is not a non-negative integer")
    return int(key)


def _opt_list(text: str | None) -> frozenset[int] | None:
    return None if text is None else parse_list(text)


__all__ = [
    "KINDS",
    "KIND_EXCLUSIVE",
    "KIND_PROCESS",
    "KIND_SHARED",
    "LEDGER_VERSION",
    "MIGRATIONS",
    "GpuAccess",
    "Grant",
    "LedgerState",
    "PodNetdev",
    "PodRecord",
    "migrate",
    "newer_version_message",
]

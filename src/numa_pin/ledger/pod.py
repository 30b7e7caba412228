"""Pod-level ledger records (pure): a pod whose containers share one pod-scope decision, and
the SR-IOV VFs moved once into its network namespace. Re-exported by
:mod:`numa_pin.ledger.model`, where :class:`~numa_pin.ledger.model.LedgerState` keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from numa_pin.base import names
from numa_pin.base.cpuset import format_list
from numa_pin.base.record import field, record
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger import shape

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


@record
class PodNetdev:
    """An SR-IOV VF moved once into a pod's network namespace (scope ``pod``).

    ``address`` is the VF's PCI address and ``resource`` the device resource it was granted
    as; ``ifname`` its name there (``net1``, ``net2``, ... counted per pod netns); ``netns``
    the identity of that netns (``<st_dev>:<st_ino>`` of ``/proc/<pid>/ns/net``); ``moved_by``
    the container whose admission moved it; ``record`` the enforcer's ``NetdevRecord`` as a
    JSON object, which is what giving it back to the host needs.

    Raises:
        ValueError: a field is not a non-empty string, or ``record`` is not a JSON object.
    """

    address: str
    resource: str
    ifname: str
    netns: str
    moved_by: str
    record: Mapping[str, Any] = field(hash=False)

    def __post_init__(self) -> None:
        for name in _POD_NETDEV_STRINGS:
            shape.require_str(f"pod netdev {name}", getattr(self, name), nonempty=True)
        shape.set_field(self, "record", shape.undo_record("pod netdev record", self.record))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in sorted(_POD_NETDEV_STRINGS)}
        out["record"] = shape.plain(self.record)
        return out

    @classmethod
    def from_dict(cls, d: object, where: str) -> PodNetdev:
        """Inverse of :meth:`to_dict`. Raises LedgerCorrupt (``where`` names the pod)."""
        obj = shape.exact_keys(f"{where}: netdevs entry", d, _POD_NETDEV_KEYS)
        try:
            return cls(**{name: shape.json_field(obj, name, str, where) for name in _POD_NETDEV_STRINGS},
                       record=shape.json_field(obj, "record", dict, where))
        except ValueError as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


_POD_NETDEV_STRINGS = frozenset(("address", "resource", "ifname", "netns", "moved_by"))
_POD_NETDEV_KEYS = _POD_NETDEV_STRINGS | {"record"}


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
        shape.require_str("pod_id", self.pod_id, nonempty=True)
        if self.affinity is not None:
            shape.set_field(self, "affinity", shape.id_set("affinity", self.affinity))
        shape.require_str("policy", self.policy, nonempty=True)
        shape.require_str("scope", self.scope, nonempty=True)
        shape.set_field(self, "created", shape.finite("created", self.created))
        if isinstance(self.netdevs, (str, bytes, Mapping)) or not isinstance(self.netdevs, Iterable):
            raise ValueError("pod netdevs must be a sequence of PodNetdev")
        netdevs = tuple(self.netdevs)
        if not all(isinstance(n, PodNetdev) for n in netdevs):
            raise ValueError("pod netdevs must be a sequence of PodNetdev")
        addresses = [n.address for n in netdevs]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"pod {self.pod_id!r} records a VF twice: {sorted(addresses)!r}")
        shape.set_field(self, "netdevs", netdevs)

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
        obj = shape.exact_keys("pod", d, _POD_KEYS)
        where = f"pod {obj.get('pod_id')!r}"
        try:
            return cls(
                pod_id=shape.json_field(obj, "pod_id", str, where),
                affinity=shape.opt_list(shape.json_field(obj, "affinity", (str, type(None)), where)),
                policy=shape.json_field(obj, "policy", str, where),
                scope=shape.json_field(obj, "scope", str, where),
                created=shape.json_field(obj, "created", (int, float), where),
                netdevs=tuple(PodNetdev.from_dict(n, where) for n in shape.json_field(obj, "netdevs", list, where)),
            )
        except (ValueError, TypeError) as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


_POD_KEYS = frozenset(("pod_id", "affinity", "policy", "scope", "created", "netdevs"))


__all__ = ["PodNetdev", "PodRecord"]

"""The small records a :class:`~numa_pin.ledger.model.Grant` carries besides its sets and maps
(pure: no I/O, no logging).

* :class:`GpuAccess` — what granting GPUs to a running container added (device nodes and
  device rules), so a release by hand can take it back.

Construction checks types and raises :class:`ValueError` (a programming error);
``from_dict`` turns every shape problem into :class:`~numa_pin.errors.LedgerCorrupt`.
"""

from __future__ import annotations

from numa_pin.base.record import record
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger import shape

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

KIND_EXCLUSIVE = "exclusive"  # container with exclusive CPUs
KIND_SHARED = "shared"  # container in the shared pool (no exclusive CPUs)
KIND_PROCESS = "process"  # a plain process started by ``numa-pin run``


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
        shape.set_field(self, "nodes", shape.strings("gpus.nodes", self.nodes))
        shape.set_field(self, "rules", shape.strings("gpus.rules", self.rules))
        shape.set_field(self, "bpf_dirs", shape.strings("gpus.bpf_dirs", self.bpf_dirs))
        if self.devices_dir is not None:
            shape.require_str("gpus.devices_dir", self.devices_dir, nonempty=True)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "rules": list(self.rules), "devices_dir": self.devices_dir,
                "bpf_dirs": list(self.bpf_dirs)}

    @classmethod
    def from_dict(cls, d: object, where: str) -> GpuAccess:
        """Inverse of :meth:`to_dict`. Raises LedgerCorrupt (``where`` names the grant)."""
        obj = shape.exact_keys(f"{where}: gpus", d, frozenset(("nodes", "rules", "devices_dir", "bpf_dirs")))
        try:
            return cls(
                nodes=tuple(shape.json_field(obj, "nodes", list, where)),
                rules=tuple(shape.json_field(obj, "rules", list, where)),
                devices_dir=shape.json_field(obj, "devices_dir", (str, type(None)), where),
                bpf_dirs=tuple(shape.json_field(obj, "bpf_dirs", list, where)),
            )
        except ValueError as exc:
            raise LedgerCorrupt(f"{where}: {exc}") from None


__all__ = ["KIND_EXCLUSIVE", "KIND_PROCESS", "KIND_SHARED", "GpuAccess"]

"""A registered device as the device manager sees it (kubelet's ``pluginapi.Device``). Pure data.

The inventory (:mod:`numa_pin.devices.inventory`) turns discovered PCI functions into
:class:`DeviceInfo` values per resource; the device hint provider and allocator read them.
"""

from __future__ import annotations

from collections.abc import Iterable

from numa_pin.base.record import record
from numa_pin.errors import RequestError
from numa_pin.policy import bitmask


@record
class DeviceInfo:
    """One registered device. ``numa_nodes``: sorted node ids; empty means no topology."""

    id: str
    numa_nodes: tuple[int, ...] = ()
    healthy: bool = True

    def __init__(self, id: str, numa_nodes: Iterable[int] | None = (), healthy: bool = True) -> None:
        if not isinstance(id, str) or not id:
            raise RequestError(f"device id must be a non-empty string, got {id!r}")
        nodes = tuple(sorted(set(numa_nodes or ())))
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in nodes):
            raise RequestError(f"device {id}: NUMA nodes must be non-negative integers, got {nodes!r}")
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "numa_nodes", nodes)
        object.__setattr__(self, "healthy", bool(healthy))

    @property
    def mask(self) -> int:
        return bitmask.from_nodes(self.numa_nodes)

    @property
    def has_topology(self) -> bool:
        return bool(self.numa_nodes)


__all__ = ["DeviceInfo"]

"""The resources a decision loops over when the settings name none (pure halves only).

The node service passes the full resources (:mod:`numa_pin.resources.node.registry`), whose
pure halves are these same classes; a decision made without the service (tests, ``nrt``)
uses these.
"""

from __future__ import annotations

from numa_pin.resources.base import Resource
from numa_pin.resources.cpu import CpuResource
from numa_pin.resources.devices import PciDevices
from numa_pin.resources.memory import MemoryResource

_PURE: tuple[Resource, ...] = (CpuResource(), MemoryResource(), PciDevices())


def pure_resources() -> tuple[Resource, ...]:
    """CPUs, memory and hugepages, PCI devices: in the order their hints are merged."""
    return _PURE


__all__ = ["pure_resources"]

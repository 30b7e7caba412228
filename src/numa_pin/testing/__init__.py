"""Fake-sysfs machine kit for tests.

Declare a machine (:class:`MachineSpec`, :class:`PciSpec`, :class:`VfSpec`,
:class:`CpulessNodeSpec`) or take a named one (:func:`shape`), then :func:`build` it under a
directory and point discovery at ``built.sysfs_root`` / ``built.proc_root``.
:func:`expected_topology` is the :class:`~numa_pin.topology.model.Topology` the spec
describes. See ``docs/design/machine-kit.md``.
"""

from numa_pin.testing.machine import (
    BuiltMachine,
    CpuLayout,
    CpulessNodeSpec,
    MachineSpec,
    PciSpec,
    VfSpec,
    build,
    build_once,
    expected_topology,
    kernel_mask,
    pci_kind,
)
from numa_pin.testing.shapes import SHAPES, gpu_uuid, shape, shape_names

__all__ = [
    "SHAPES",
    "BuiltMachine",
    "CpuLayout",
    "CpulessNodeSpec",
    "MachineSpec",
    "PciSpec",
    "VfSpec",
    "build",
    "build_once",
    "expected_topology",
    "gpu_uuid",
    "kernel_mask",
    "pci_kind",
    "shape",
    "shape_names",
]

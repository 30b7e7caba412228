"""Fake machines for tests: the public face of the machine kit.

A machine is declared (:mod:`numa_pin.testing.spec`, :mod:`numa_pin.testing.pci_spec`),
written as kernel-shaped ``sys/`` and ``proc/`` trees (:mod:`numa_pin.testing.writer`,
:mod:`numa_pin.testing.writer_pci`, :mod:`numa_pin.testing.kernel_text`) and read back
against :func:`expected_topology` (:mod:`numa_pin.testing.expected`). This module keeps the
historical import path ``numa_pin.testing.machine`` for the records and functions a test uses;
constants stay in their modules (the PCI class codes in :mod:`numa_pin.testing.pci_spec`).
"""

from __future__ import annotations

from numa_pin.testing.expected import expected_topology, pci_kind
from numa_pin.testing.kernel_text import kernel_mask
from numa_pin.testing.pci_spec import PciSpec, VfSpec
from numa_pin.testing.spec import MachineSpec
from numa_pin.testing.spec_parts import GIB_KB, LOCAL_DISTANCE, CpuLayout, CpulessNodeSpec, HugePagesSpec, PerNode
from numa_pin.testing.writer import KERNEL_MAX, BuiltMachine, build, build_once

__all__ = [
    "GIB_KB",
    "KERNEL_MAX",
    "LOCAL_DISTANCE",
    "BuiltMachine",
    "CpuLayout",
    "CpulessNodeSpec",
    "HugePagesSpec",
    "MachineSpec",
    "PciSpec",
    "PerNode",
    "VfSpec",
    "build",
    "build_once",
    "expected_topology",
    "kernel_mask",
    "pci_kind",
]

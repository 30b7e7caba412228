"""numa-pin's library API: plain Python data in, plain Python data out.

This is the stable surface for library users and for external conformance suites that compare
numa-pin with kubelet. Everything here is pure (no sysfs, no cgroups, no ledger).

Hints and merging
    ``TopologyHint(affinity, preferred)``: ``affinity`` is an iterable of NUMA node ids or
    ``None`` ("don't care"); ``.affinity`` reads back a ``frozenset[int]`` or ``None``.

    ``merge_hints(policy, providers_hints, numa_nodes, distances=None, prefer_closest=False)
    -> (TopologyHint, admit)``: ``providers_hints`` has one entry per provider, each ``None`` or a
    ``{resource: list[TopologyHint] | None}`` dict; ``distances`` is ``{node: [distance to node
    0, 1, ...]}``. Same result as kubelet's Topology Manager, on any number of nodes.

CPUs
    ``CpuInfo(cpu, socket, numa, core, uncore=None)``, ``CpuTopology.from_cpus([...])``.

    ``take_cpus(topology, available, count, strategy="packed"|"spread", prefer_uncore=False,
    distribute_across_numa=False, group_size=1) -> frozenset[int]``; raises
    :class:`numa_pin.errors.AllocationError` with kubelet's message when it cannot.

    ``cpu_hints(topology, available, request, reusable=()) -> list[TopologyHint] | None``.

Devices
    ``DeviceInfo(id, numa_nodes, healthy=True)`` and ``device_hints(devices, numa_nodes, available,
    request, reusable=()) -> list[TopologyHint] | None``.

Memory
    ``memory_hints(state, request)`` over ``build_memory_state(topology, reserved, assignments)``.
"""

from __future__ import annotations

from numa_pin.allocators.cpu import take_cpus
from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import AllocationError, NumaPinError, SMTAlignmentError, TopologyAffinityError
from numa_pin.policy.hint import CapacityFamily, TopologyHint
from numa_pin.policy.registry import merge_hints
from numa_pin.providers.cpu import cpu_hints
from numa_pin.providers.devices import device_hints
from numa_pin.providers.memory import memory_hints
from numa_pin.topology.cpus import CpuInfo, CpuTopology
from numa_pin.topology.memory import build_memory_state

__all__ = [
    "AllocationError",
    "CapacityFamily",
    "CpuInfo",
    "CpuTopology",
    "DeviceInfo",
    "NumaPinError",
    "SMTAlignmentError",
    "TopologyAffinityError",
    "TopologyHint",
    "build_memory_state",
    "cpu_hints",
    "device_hints",
    "memory_hints",
    "merge_hints",
    "take_cpus",
]

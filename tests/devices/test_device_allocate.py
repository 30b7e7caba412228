"""Device allocation: kubelet's order (reusable, aligned, no topology, other nodes) and packing."""

from __future__ import annotations

import pytest

from numa_pin.allocators.devices import allocate_devices, pack
from numa_pin.devices.inventory import DeviceResource, Selector, inventory, parent_keys
from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import AllocationError, RequestError
from numa_pin.providers.devices import available_devices
from numa_pin.testing.machine import expected_topology
from numa_pin.testing.shapes import shape


def dev(name: str, *nodes: int, healthy: bool = True) -> DeviceInfo:
    return DeviceInfo(name, nodes, healthy)


TWO_PER_NODE = [dev("Dev1", 0), dev("Dev2", 0), dev("Dev3", 1), dev("Dev4", 1)]
FOUR_PER_NODE = [dev(f"A{i}", 0) for i in range(4)] + [dev(f"B{i}", 1) for i in range(4)]
ALL = None  # "every healthy device is available"

CASES = [
    # (id, devices, available, request, affinity, reusable, closeness, expected)
    ("no-topology-ignores-affinity", [dev("Dev2"), dev("Dev1")], ALL, 1, {0}, (), None, ("Dev1",)),
    ("partial-alignment", [dev("Dev1"), dev("Dev2", 1)], ALL, 1, {1}, (), None, ("Dev2",)),
    ("nil-hint-lowest-id", [dev("Dev2", 1), dev("Dev1", 0)], ALL, 1, None, (), None, ("Dev1",)),
    ("node-mask-0", TWO_PER_NODE, ALL, 2, {0}, (), None, ("Dev1", "Dev2")),
    ("node-mask-1", TWO_PER_NODE, ALL, 2, {1}, (), None, ("Dev3", "Dev4")),
    ("affinity-too-small-spills", FOUR_PER_NODE, ALL, 5, {0}, (), None, ("A0", "A1", "A2", "A3", "B0")),
    ("cross-numa-affinity-packs-one-node", [dev("a0", 0), dev("b0", 1), dev("b1", 1)], ALL, 2, {0, 1}, (),
     None, ("b0", "b1")),
    ("best-fit-node", [dev("a0", 0), dev("a1", 0), dev("a2", 0), dev("b0", 1), dev("b1", 1)], ALL, 2, {0, 1},
     (), None, ("b0", "b1")),
    ("no-topology-before-other-nodes", [dev("a", 0), dev("n"), dev("b", 1)], ALL, 2, {0}, (), None, ("a", "n")),
    ("other-nodes-last", [dev("a", 0), dev("b", 1), dev("c", 2)], ALL, 3, {0}, (), None, ("a", "b", "c")),
    ("unhealthy-never-given", [dev("a", 0, healthy=False), dev("b", 0), dev("c", 1)], ALL, 2, {0}, (), None,
     ("b", "c")),
    ("zero", TWO_PER_NODE, ALL, 0, {0}, (), None, ()),
    # closeness: keep devices behind one switch
    ("same-switch", [dev(f"g{i}", 0) for i in range(4)], {"g1", "g2", "g3"}, 2, {0}, (),
     {"g0": "swA", "g1": "swA", "g2": "swB", "g3": "swB"}, ("g2", "g3")),
    ("switch-best-fit", [dev(f"g{i}", 0) for i in range(5)], ALL, 1, {0}, (),
     {"g0": "swA", "g1": "swA", "g2": "swA", "g3": "swB", "g4": "swB"}, ("g3",)),
    ("unknown-parent-is-alone", [dev(f"g{i}", 0) for i in range(3)], ALL, 2, {0}, (),
     {"g1": "swA", "g2": "swA"}, ("g1", "g2")),
    # reusable init-container devices come first, the rest next to them
    ("reusable-first", TWO_PER_NODE, {"Dev1", "Dev2", "Dev3"}, 2, {1}, ("Dev4",), None, ("Dev3", "Dev4")),
    ("reusable-pulls-the-rest-to-its-node", FOUR_PER_NODE, {"A0", "A1", "B1", "B2"}, 2, None, ("B0",), None,
     ("B0", "B1")),
    ("reusable-pulls-the-rest-to-its-switch", [dev(f"g{i}", 0) for i in range(4)], {"g0", "g2"}, 2, {0},
     ("g3",), {"g0": "swA", "g1": "swA", "g2": "swB", "g3": "swB"}, ("g2", "g3")),
    ("reusable-inside-affinity-preferred", TWO_PER_NODE, set(), 1, {1}, ("Dev1", "Dev3"), None, ("Dev3",)),
    ("reusable-covers-all", TWO_PER_NODE, set(), 2, {1}, ("Dev1", "Dev2"), None, ("Dev1", "Dev2")),
]


@pytest.mark.parametrize(("case", "devices", "available", "count", "affinity", "reusable", "closeness", "expected"),
                         CASES, ids=[c[0] for c in CASES])
def test_allocate(case, devices, available, count, affinity, reusable, closeness, expected) -> None:
    if available is ALL:
        available = available_devices(devices)
    got = allocate_devices(devices, available, count, affinity, reusable, closeness, resource="example.com/dev")
    assert got == expected


def test_over_request_names_resource_and_free_per_node() -> None:
    devices = [dev("a", 0), dev("b", 1), dev("c", 1, healthy=False), dev("n")]
    with pytest.raises(AllocationError) as info:
        allocate_devices(devices, available_devices(devices, ["n"]), 3, {0}, resource="example.com/dev")
    assert str(info.value) == ("requested number of devices unavailable for example.com/dev. Requested: 3, "
                               "Available: 2; free per NUMA node: {0: 1, 1: 1}")


def test_strict_mode_refuses_devices_outside_the_affinity() -> None:
    with pytest.raises(AllocationError, match=r"example.com/dev: only 2 free device\(s\) on NUMA nodes \{0\}"):
        allocate_devices(TWO_PER_NODE, available_devices(TWO_PER_NODE), 3, {0}, resource="example.com/dev",
                         allow_outside=False)
    assert allocate_devices(TWO_PER_NODE, available_devices(TWO_PER_NODE), 2, {0}, allow_outside=False) == (
        "Dev1", "Dev2")


def test_bad_request_is_refused() -> None:
    with pytest.raises(RequestError, match="example.com/dev"):
        allocate_devices(TWO_PER_NODE, (), -1, None, resource="example.com/dev")


def test_gpus_of_one_switch_on_the_gpu8_shape() -> None:
    topo = expected_topology(shape("gpu8-sriov"))
    gpus = inventory(topo, [DeviceResource("nvidia.com/gpu", (Selector(vendors=("0x10de",)),))])["nvidia.com/gpu"]
    keys = parent_keys(topo)
    free = available_devices(gpus, ["0000:18:00.0"])  # one GPU of node 0 is taken
    # two GPUs within nodes {0,1}: node 1 still has its whole switch
    assert allocate_devices(gpus, free, 2, {0, 1}, closeness=keys) == ("0000:3d:00.0", "0000:3e:00.0")
    # three: node 1's pair plus node 0's last one
    assert allocate_devices(gpus, free, 3, {0, 1}, closeness=keys) == (
        "0000:19:00.0", "0000:3d:00.0", "0000:3e:00.0")


@pytest.mark.parametrize(
    ("candidates", "count", "near", "expected"),
    [(["b", "a", "c"], 2, (), ["a", "b"]),
     (["a1", "a2", "b1"], 1, (), ["b1"]),
     (["a1", "a2", "b1"], 1, ("a9",), ["a1"]),
     (["a1", "b1", "b2", "c1", "c2", "c3"], 4, (), ["c1", "c2", "c3", "a1"]),
     (["a1"], 3, (), ["a1"])],
    ids=["lowest-ids", "best-fit-group", "near-group-first", "largest-then-best-fit", "fewer-than-asked"],
)
def test_pack(candidates, count, near, expected) -> None:
    assert pack(candidates, count, [lambda d: d[0]], near) == expected

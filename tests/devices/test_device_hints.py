"""Device Manager hints, every §8 rule and §9 case (expected lists from kubelet's test tables)."""

from __future__ import annotations

import pytest

from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import RequestError
from numa_pin.policy.hint import CapacityFamily
from numa_pin.providers.devices import (
    available_devices,
    container_device_hints,
    device_hint_family,
    device_hints,
    device_hints_for_allocated,
    pod_device_request,
    resource_device_hints,
)

T, F = True, False
NODES = (0, 1)


def dev(name: str, *nodes: int, healthy: bool = True) -> DeviceInfo:
    return DeviceInfo(name, nodes, healthy)


def pairs(hints):
    if hints is None:
        return None
    if isinstance(hints, CapacityFamily):
        hints = hints.materialize()
    return [(tuple(sorted(h.affinity)), h.preferred) for h in hints]


TWO_PER_NODE = [dev("Dev1", 0), dev("Dev2", 0), dev("Dev3", 1), dev("Dev4", 1)]

CASES = [
    # (id, devices, request, in_use, held, reusable, expected)
    ("no-topology-is-nil", [dev("Dev1"), dev("Dev2")], 1, (), (), (), None),
    ("mixed-topology", [dev("Dev1"), dev("Dev2", 1)], 1, (), (), (), [((1,), T), ((0, 1), F)]),
    ("one-per-node-request-1", [dev("Dev1", 0), dev("Dev2", 1)], 1, (), (), (),
     [((0,), T), ((1,), T), ((0, 1), F)]),
    ("one-per-node-request-2", [dev("Dev1", 0), dev("Dev2", 1)], 2, (), (), (), [((0, 1), T)]),
    ("two-per-node-request-2", TWO_PER_NODE, 2, (), (), (), [((0,), T), ((1,), T), ((0, 1), F)]),
    # optimal on one node, but others hold one device per node: cross-NUMA, not preferred
    ("forced-cross-numa", TWO_PER_NODE, 2, ("Dev1", "Dev3"), (), (), [((0, 1), F)]),
    ("over-request", TWO_PER_NODE, 6, (), (), (), []),
    ("over-request-after-other-pods", TWO_PER_NODE, 3, ("Dev1", "Dev2"), (), (), []),
    ("already-allocated-exact", [dev("Dev1", 0), dev("Dev2", 0)], 2, ("Dev1", "Dev2"), ("Dev1", "Dev2"), (),
     [((0,), T), ((0, 1), F)]),
    ("already-allocated-fewer", TWO_PER_NODE, 4, ("Dev1", "Dev2"), ("Dev1", "Dev2"), (), []),
    ("already-allocated-more", TWO_PER_NODE, 2, ("Dev1", "Dev2", "Dev3", "Dev4"),
     ("Dev1", "Dev2", "Dev3", "Dev4"), (), []),
    ("already-allocated-no-topology-is-nil", [dev("Dev1"), dev("Dev2")], 3, ("Dev1",), ("Dev1",), (), None),
    # unhealthy devices count for the preferred size but are never available
    ("unhealthy-counts-for-min-affinity", [dev("Dev1", 0), dev("Dev2", 0, healthy=False), dev("Dev3", 1)], 2,
     (), (), (), [((0, 1), F)]),
    # reusable (init-container) devices pin the mask to their node
    ("reusable-device-pins-mask", [dev("Dev1", 0), dev("Dev2", 1)], 2, ("Dev2",), (), ("Dev2",),
     [((0, 1), T)]),
    ("reusable-device-alone", [dev("Dev1", 0), dev("Dev2", 1)], 1, ("Dev2",), (), ("Dev2",),
     [((1,), T), ((0, 1), F)]),
    ("reusable-without-topology-ignored", [dev("Dev1", 0), dev("Dev2")], 2, ("Dev2",), (), ("Dev2",), []),
    ("reusable-without-topology-counts-in-pre-check", [dev("Dev1", 0), dev("Dev2", 1), dev("Dev3")], 1,
     ("Dev1", "Dev2", "Dev3"), (), ("Dev3",), []),
    # no-topology devices pass the pre-check but never count inside a mask
    ("no-topology-devices-never-in-a-mask", [dev("Dev1", 0), dev("Dev2")], 1, ("Dev1",), (), (), []),
    ("multi-node-device", [dev("Dev1", 0, 1)], 1, (), (), (), [((0,), T), ((1,), T), ((0, 1), F)]),
    ("zero-request", [dev("Dev1", 0)], 0, (), (), (), [((0,), T), ((1,), T), ((0, 1), F)]),
]


@pytest.mark.parametrize("family", [False, True], ids=["explicit", "family"])
@pytest.mark.parametrize(("case", "devices", "count", "in_use", "held", "reusable", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_resource_hints(family, case, devices, count, in_use, held, reusable, expected) -> None:
    answer = resource_device_hints(devices, NODES, count, in_use=in_use, held=held, reusable=reusable,
                                   family=family)
    assert pairs(answer) == expected


def test_two_resources_at_once() -> None:
    registered = {
        "example.com/dev1": TWO_PER_NODE,
        "example.com/dev2": [dev("Dev5", 0), dev("Dev6", 1)],
    }
    answer = container_device_hints(registered, NODES, {"example.com/dev1": 2, "example.com/dev2": 1, "cpu": 4})
    assert {r: pairs(h) for r, h in answer.items()} == {
        "example.com/dev1": [((0,), T), ((1,), T), ((0, 1), F)],
        "example.com/dev2": [((0,), T), ((1,), T), ((0, 1), F)],
    }


def test_other_pods_allocations_per_resource() -> None:
    registered = {"example.com/dev1": TWO_PER_NODE, "example.com/dev2": [dev("Dev5", 0), dev("Dev6", 1)]}
    answer = container_device_hints(
        registered, NODES, {"example.com/dev1": 2, "example.com/dev2": 1},
        in_use={"example.com/dev1": ("Dev1", "Dev3"), "example.com/dev2": ("Dev5",)},
    )
    assert {r: pairs(h) for r, h in answer.items()} == {
        "example.com/dev1": [((0, 1), F)],
        "example.com/dev2": [((1,), T), ((0, 1), F)],
    }


def test_pod_scope_uses_pod_request_and_pod_devices() -> None:
    # init containers ask 2 and 1, apps 1 + 1: the pod needs max(2, 2) = 2
    request = pod_device_request([({"example.com/dev": 2}, False), ({"example.com/dev": 1}, False)],
                                 [{"example.com/dev": 1}, {"example.com/dev": 1}])
    assert request == {"example.com/dev": 2}
    registered = {"example.com/dev": TWO_PER_NODE}
    fresh = container_device_hints(registered, NODES, request)
    assert pairs(fresh["example.com/dev"]) == [((0,), T), ((1,), T), ((0, 1), F)]
    # the pod already holds Dev1 and Dev3 (one per node): regenerate from exactly those
    held = container_device_hints(registered, NODES, request, in_use={"example.com/dev": ("Dev1", "Dev3")},
                                  held={"example.com/dev": ("Dev1", "Dev3")})
    assert pairs(held["example.com/dev"]) == [((0, 1), F)]


@pytest.mark.parametrize(
    ("init", "apps", "expected"),
    [([({"r/a": 3}, False)], [{"r/a": 1}, {"r/a": 1}], {"r/a": 3}),
     ([({"r/a": 1}, False)], [{"r/a": 2}, {"r/a": 1}], {"r/a": 3}),
     ([({"r/a": 1}, False), ({"r/a": 4}, False)], [], {"r/a": 4}),
     ([({"r/b": 2}, False)], [{"r/a": 1}], {"r/a": 1, "r/b": 2}),
     ([], [{"r/a": 0}], {"r/a": 0})],
    ids=["max-init-wins", "sum-apps-wins", "init-only", "init-only-resource-kept", "zero"],
)
def test_pod_device_request(init, apps, expected) -> None:
    assert pod_device_request(init, apps) == expected


# kubelet's TestGetPodDeviceRequest (devicemanager topology_hints_test.go), device resources only
KUBELET_POD_DEVICE_REQUEST = [
    ("empty pod", [], [], {}),
    ("init container requests device plugin resource", [({"gpu": 2}, False)], [], {"gpu": 2}),
    ("init containers request device plugin resource", [({"gpu": 2}, False), ({"gpu": 4}, False)], [],
     {"gpu": 4}),
    ("user container requests device plugin resource", [], [{"gpu": 2}], {"gpu": 2}),
    ("init and user containers request the same amount",
     [({"gpu": 2, "nic": 2}, False), ({"gpu": 2, "nic": 2}, False)],
     [{"gpu": 1, "nic": 1}, {"gpu": 1, "nic": 1}], {"gpu": 2, "nic": 2}),
    ("init containers request more than user containers",
     [({"gpu": 2, "nic": 1}, False), ({"gpu": 3, "nic": 2}, False)],
     [{"gpu": 1, "nic": 1}, {"gpu": 1}], {"gpu": 3, "nic": 2}),
    ("user containers request more than init containers",
     [({"gpu": 2, "nic": 1}, False), ({"gpu": 2, "nic": 1}, False)],
     [{"gpu": 3, "nic": 2}, {"gpu": 3, "nic": 2}], {"gpu": 6, "nic": 4}),
]


@pytest.mark.parametrize(("init", "apps", "expected"), [c[1:] for c in KUBELET_POD_DEVICE_REQUEST],
                         ids=[c[0] for c in KUBELET_POD_DEVICE_REQUEST])
def test_pod_device_request_kubelet_table(init, apps, expected) -> None:
    assert pod_device_request(init, apps) == expected


# resource.PodLimits with restartable (sidecar) init containers (KEP 753): a sidecar's devices are
# held for the pod's life, by the app containers' side and under every init container after it
SIDECARS = [
    ("sidecar-and-app", [({"gpu": 1}, True)], [{"gpu": 1}], {"gpu": 2}),
    ("init-after-sidecar-sees-it-held", [({"gpu": 1}, True), ({"gpu": 2}, False)], [{"gpu": 1}], {"gpu": 3}),
    ("init-before-sidecar-does-not", [({"gpu": 2}, False), ({"gpu": 1}, True)], [{"gpu": 1}], {"gpu": 2}),
    ("sidecars-only", [({"gpu": 1}, True), ({"gpu": 2}, True)], [], {"gpu": 3}),
    ("sidecar-of-another-resource", [({"nic": 1}, True), ({"gpu": 2}, False)], [{"gpu": 1}],
     {"gpu": 2, "nic": 1}),
    ("two-sidecars-then-init", [({"gpu": 1}, True), ({"gpu": 1}, True), ({"gpu": 1}, False)], [{"gpu": 2}],
     {"gpu": 4}),
]


@pytest.mark.parametrize(("init", "apps", "expected"), [c[1:] for c in SIDECARS], ids=[c[0] for c in SIDECARS])
def test_pod_device_request_with_sidecars(init, apps, expected) -> None:
    assert pod_device_request(init, apps) == expected


def test_device_hints_for_allocated_checks_the_count_first() -> None:
    assert device_hints_for_allocated(TWO_PER_NODE, NODES, ["Dev1"], 2) == []
    assert pairs(device_hints_for_allocated(TWO_PER_NODE, NODES, ["Dev1", "Dev3"], 2)) == [((0, 1), F)]
    assert device_hints_for_allocated([dev("x")], NODES, ["x"], 2) is None


def test_available_devices_drops_unhealthy_and_in_use() -> None:
    devices = [dev("a", 0), dev("b", 0, healthy=False), dev("c", 1)]
    assert available_devices(devices, ["c"]) == {"a"}


def test_family_shape_for_sysfs_devices() -> None:
    devices = [dev("g0", 0), dev("g1", 0), dev("g2", 1, healthy=False), dev("g3", 2), dev("nic")]
    family = device_hint_family(devices, (0, 1, 2, 3), available_devices(devices, ["g1", "g3"]), 2, reusable=["g3"])
    assert isinstance(family, CapacityFamily)
    assert family.nodes == (0, 1, 2, 3)
    assert family.capacity == ((1,), (0,), (0,), (0,))  # available per node (g3 is held by an init container)
    assert family.need == (1,) and family.must_include == 0b100 and family.min_affinity == 1


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True], ids=["negative", "float", "string", "bool"])
def test_bad_counts_are_refused(bad) -> None:
    with pytest.raises(RequestError):
        device_hints(TWO_PER_NODE, NODES, (), bad)


@pytest.mark.parametrize(
    ("args", "match"),
    [(("", (0,)), "non-empty"), (("x", (-1,)), "non-negative"), (("x", ("0",)), "non-negative")],
    ids=["empty-id", "negative-node", "string-node"],
)
def test_device_info_validation(args, match) -> None:
    with pytest.raises(RequestError, match=match):
        DeviceInfo(*args)


def test_device_info_normalizes_nodes() -> None:
    assert DeviceInfo("x", [1, 0, 1]).numa_nodes == (0, 1)
    assert DeviceInfo("x", None).numa_nodes == () and not DeviceInfo("x", None).has_topology
    assert DeviceInfo("x", (0,)) == DeviceInfo("x", [0], True)

"""Properties on random device sets over at most 8 nodes.

* :func:`device_hint_family` materializes to exactly :func:`device_hints`;
* :func:`allocate_devices` returns exactly the request, never a device that is neither
  available nor reusable, and stays inside the affinity whenever the affinity has enough.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_pin.allocators.devices import allocate_devices
from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import AllocationError
from numa_pin.policy.hint import CapacityFamily
from numa_pin.providers.devices import available_devices, device_hint_family, device_hints

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def machines(draw, multi_node: bool = False):
    node_count = draw(st.integers(1, 8))
    nodes = tuple(range(node_count))
    # a node id one past the machine's nodes stands for a device on an unlisted node
    node = st.integers(0, node_count)
    topo = st.one_of(st.just(()), node.map(lambda n: (n,)))
    if multi_node:
        topo = st.one_of(topo, st.sets(node, min_size=2, max_size=3).map(tuple))
    count = draw(st.integers(0, 10))
    devices = [DeviceInfo(f"d{i}", draw(topo), draw(st.booleans() | st.just(True))) for i in range(count)]
    ids = [d.id for d in devices] + ["ghost"]
    in_use = draw(st.sets(st.sampled_from(ids)))
    reusable = draw(st.sets(st.sampled_from(ids))) if draw(st.booleans()) else set()
    request = draw(st.integers(0, 6))
    return devices, nodes, in_use, reusable, request


def _pairs(answer):
    if isinstance(answer, CapacityFamily):
        answer = answer.materialize()
    return None if answer is None else [(h.mask, h.preferred) for h in answer]


@SETTINGS
@given(machines(multi_node=True))
def test_family_equals_explicit_list(machine) -> None:
    devices, nodes, in_use, reusable, request = machine
    available = available_devices(devices, in_use)
    family = device_hint_family(devices, nodes, available, request, reusable)
    explicit = device_hints(devices, nodes, available, request, reusable)
    assert _pairs(family) == _pairs(explicit)
    if isinstance(family, CapacityFamily):
        assert all(len(d.numa_nodes) <= 1 for d in devices)


@SETTINGS
@given(machines(), st.data())
def test_allocation_respects_availability_and_affinity(machine, data) -> None:
    devices, nodes, in_use, reusable, request = machine
    reusable = reusable - {"ghost"}
    available = available_devices(devices, in_use | reusable)
    affinity = data.draw(st.none() | st.sets(st.sampled_from(nodes), min_size=1))
    closeness = data.draw(st.none() | st.dictionaries(st.sampled_from([d.id for d in devices] or ["x"]),
                                                      st.sampled_from(["p", "q"])))
    try:
        got = allocate_devices(devices, available, request, affinity, reusable, closeness)
    except AllocationError:
        assert len(available) + len(reusable) < request
        return
    assert len(got) == len(set(got)) == request
    assert set(got) <= available | reusable
    used_reusable = set(got) & reusable
    assert len(used_reusable) == min(len(reusable), request)
    by_id = {d.id: d for d in devices}
    if affinity is not None and any(d.numa_nodes for d in devices):
        inside = {d for d in available if d in by_id and set(by_id[d].numa_nodes) & affinity}
        needed = request - len(used_reusable)
        fresh = set(got) - reusable
        assert len(fresh & inside) == min(needed, len(inside))

"""The resource seam: a test-only resource joins the node without a line of decide.py or service/node.py.

``example.com/widget`` is a device kind with four widgets, two per NUMA node of the kit's
``intel-2s-ht`` machine (``w0``, ``w1`` on node 0; ``w2``, ``w3`` on node 1). Enforcing a grant
writes the file ``widgets/<container>`` in the fake node, listing the container's widgets (its
undo removes the file); a release removes it; a reconcile writes it again where it drifted.
``docs/design/adding-a-resource.md`` walks through the same class.

Every test fails without the seam: the decision would reject ``example.com/widget`` as an
unknown device resource, and nothing would write, remove or repair the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numa_pin.config.schema import config_from_dict
from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import EnforcementError, RequestError, TopologyAffinityError
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.base import zone_entry
from numa_pin.resources.devices import DeviceKind
from numa_pin.resources.node.base import NodeResource
from numa_pin.resources.node.registry import register, unregister
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

WIDGET = "example.com/widget"
PLACEMENT = {"w0": 0, "w1": 0, "w2": 1, "w3": 1}


class Widget(DeviceKind, NodeResource):
    """Widgets: hints, allocation and free summary come from :class:`DeviceKind`; the I/O is a file."""

    name = WIDGET

    def __init__(self, root: Path, placement: dict[str, int]) -> None:
        self.root = root
        self.placement = placement

    def inventory(self, need):
        return {WIDGET: tuple(DeviceInfo(w, (n,)) for w, n in sorted(self.placement.items()))}

    def path(self, container_id: str) -> Path:
        return self.root / "widgets" / container_id

    def enforce(self, node, admission, decided):
        ids = admission.grant.devices.get(WIDGET)
        if not ids or admission.pid is None:
            return admission
        path = self.path(admission.grant.container_id)
        path.parent.mkdir(exist_ok=True)
        path.write_text(",".join(ids) + "\n")
        admission.undo.record(f"widget file {path}", lambda: os.unlink(path))
        return admission

    def release(self, node, release):
        for grant in release.gone:
            if WIDGET in grant.devices:
                self.path(grant.container_id).unlink(missing_ok=True)
        return []

    def repair(self, node, state, undo):
        repaired = []
        for grant in state.grants.values():
            ids = grant.devices.get(WIDGET)
            path = self.path(grant.container_id)
            want = ",".join(ids) + "\n" if ids else None
            if want is not None and (not path.exists() or path.read_text() != want):
                path.write_text(want)
                repaired.append(grant.container_id)
        return repaired


    def zones(self, node):
        held = node.state.devices_in_use(WIDGET)
        return {n: [zone_entry(WIDGET, len(mine := [w for w, at in self.placement.items() if at == n]), len(mine),
                               len(set(mine) - held))]
                for n in node.topology.node_ids}


class Jam(NodeResource):
    """A resource whose enforcement always fails: the step after the widget's."""

    name = "example.com/jam"

    def enforce(self, node, admission, decided):
        raise EnforcementError("the jam refuses", path=str(node.config.state_dir))


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    return tmp_path_factory.mktemp("machines")


@pytest.fixture
def node(tmp_path, machines):
    return FakeNode(tmp_path / "n", "intel-2s-ht", machines=machines)


@pytest.fixture
def widget(node):
    res = Widget(node.root, PLACEMENT)
    register(res)
    yield res
    unregister(res)


def service(node, policy="single-numa-node"):
    return NodeService(config_from_dict(node.config_dict(policy=policy)))


def ask(cid, widgets, cpus=2, cpuset=None):
    return request_from_oci(cid, {"numa-pin.io/cpus": str(cpus), "numa-pin.io/devices": f"{WIDGET}={widgets}"},
                            limits=ContainerLimits(cpuset=cpuset))


def node_of_cpus(svc, cpus):
    return {svc.topology.cpus[c].numa for c in cpus}


@pytest.mark.parametrize(
    ("placement", "count", "cpuset_node", "want_node"),
    [
        pytest.param({"w0": 0, "w1": 1, "w2": 1}, 2, None, 1, id="two-widgets-only-on-node-1-steer-the-cpus"),
        pytest.param({"w0": 0, "w1": 0, "w2": 1}, 2, None, 0, id="two-widgets-only-on-node-0-steer-the-cpus"),
        pytest.param(PLACEMENT, 1, 1, 1, id="cpus-pinned-to-node-1-steer-the-widget"),
        pytest.param(PLACEMENT, 1, 0, 0, id="cpus-pinned-to-node-0-steer-the-widget"),
    ],
)
def test_widget_hints_are_merged_and_it_is_allocated_inside_the_affinity(node, placement, count, cpuset_node,
                                                                         want_node):
    """Two widgets sit together on one node only; or the container's own cpuset pins its CPUs
    to one node: the merged affinity is that node, and CPUs and widgets both lie there."""
    res = Widget(node.root, placement)
    register(res)
    try:
        svc = service(node)
        cpuset = None
        if cpuset_node is not None:
            cpuset = ",".join(str(c) for c in sorted(svc.topology.nodes[cpuset_node].cpus))
        grant = svc.admit(ask("c", count, cpuset=cpuset), node.add_container("c", 41001)).grant
    finally:
        unregister(res)
    assert grant.affinity == frozenset({want_node})
    assert node_of_cpus(svc, grant.cpus) == {want_node}
    assert {placement[w] for w in grant.devices[WIDGET]} == {want_node}
    assert len(grant.devices[WIDGET]) == count


def test_widget_is_enforced_released_and_repaired(node, widget):
    svc = service(node)
    pid = node.add_container("c", 41001)
    grant = svc.admit(ask("c", 1), pid).grant
    path = widget.path("c")
    assert path.read_text() == ",".join(grant.devices[WIDGET]) + "\n", "enforced: the file lists the widgets"

    assert svc.describe_grant(grant) == [f"{WIDGET}={','.join(grant.devices[WIDGET])}"], "described once"

    path.unlink()  # drift: someone removed it
    removed, repaired = svc.reconcile()
    assert (removed, repaired) == ([], ["c"])
    assert path.read_text() == ",".join(grant.devices[WIDGET]) + "\n", "repaired by reconcile"
    assert svc.reconcile() == ([], []), "nothing drifted the second time"

    assert svc.release("c") == grant
    assert not path.exists(), "released"
    assert svc.ledger.read().grants == {}


def test_widget_is_rolled_back_when_a_later_step_fails(node, widget):
    jam = Jam()
    register(jam)
    try:
        svc = service(node)
        pid = node.add_container("c", 41001)
        before = node.cpuset("c")
        with pytest.raises(EnforcementError, match="the jam refuses"):
            svc.admit(ask("c", 1), pid)
    finally:
        unregister(jam)
    assert not widget.path("c").exists(), "the widget file was rolled back"
    assert node.cpuset("c") == before, "so was the cpuset written before it"
    assert svc.ledger.read().grants == {}, "nothing was committed"
    # and the widget is free again: the next container gets it
    again = service(node).admit(ask("d", 2), node.add_container("d", 41002)).grant
    assert len(again.devices[WIDGET]) == 2


def test_widget_free_summary_speaks_in_a_rejection(node, widget):
    """The rejection's reason counts the free widgets per node, in the widget's own words."""
    svc = service(node)
    first = svc.admit(ask("a", 2, cpus=1), node.add_container("a", 41000)).grant
    held = PLACEMENT[first.devices[WIDGET][0]]
    free = {held: 0, 1 - held: 2}
    with pytest.raises(TopologyAffinityError, match=f"{WIDGET} 3 requested, free per node: 0={free[0]} 1={free[1]}"):
        svc.admit(ask("b", 3, cpus=1), node.add_container("b", 41001))


def test_without_registration_the_widget_is_unknown(node):
    with pytest.raises(RequestError, match="unknown device resource"):
        service(node).admit(ask("c", 1), node.add_container("c", 41001))


def test_widget_zones_join_the_node_resource_topology(node, widget):
    """``numa-pin nrt`` asks every resource for its zone entries: the widget's appear in each
    NUMA zone, after the CPU and memory entries, and count the widget a grant holds."""
    from numa_pin.cluster.nrt import build_nrt

    svc = service(node)
    grant = svc.admit(ask("c", 1), node.add_container("c", 41001)).grant
    held_on = PLACEMENT[grant.devices[WIDGET][0]]
    nrt = build_nrt(svc.topology, svc.settings, svc.ledger.read(), {}, "n1")
    for zone in nrt["zones"]:
        n = int(zone["name"].removeprefix("node-"))
        names = [r["name"] for r in zone["resources"]]
        assert names[0] == "cpu" and names[1] == "memory" and names[-1] == WIDGET
        assert zone["resources"][-1] == {"name": WIDGET, "capacity": "2", "allocatable": "2",
                                         "available": "1" if n == held_on else "2"}

"""VF settings survive a crash (issue 36, item 2).

``numa-pin.io/vf-config`` changes a VF's VLAN, trust, spoofchk, MAC, link state and rate on its
PF. The VF's original PF-side state is journaled durably before the first PF write, so a hook
killed at any instant between that and the commit leaves it to ``numa-pin reconcile``, which puts
every original back; a release or a rollback settles the entry. The oracle is the fake PF itself
(:mod:`vf_world`): every VF's PF-side state and netdev as they were before the admission.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vf_world import HOST, SETTINGS, VFS, Crash, VfNode, vf_request

from numa_pin.errors import EnforcementError
from numa_pin.resources.node import gpu as gpu_node
from numa_pin.service.node import NodeService

PID = 61000
#: the netlink writes of one admission with a MAC among its settings: the VF's settings on the PF,
#: the MAC on the VF's netdev, the move into the container's netns, bringing it up there
WRITES = 4


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("machines")


@pytest.fixture
def node(tmp_path: Path, machines: Path, monkeypatch: pytest.MonkeyPatch) -> VfNode:
    return VfNode(tmp_path / "n", machines, monkeypatch)


def crash_before_commit(monkeypatch: pytest.MonkeyPatch, kind: type[BaseException]) -> None:
    """A resource after the VFs' (the GPUs') fails, or the hook is killed there."""
    def enforce(self, node, admission, decided):
        raise kind("killed before the commit") if kind is not Crash else Crash()

    monkeypatch.setattr(gpu_node.GpuNode, "enforce", enforce)


POINTS = [*(str(n) for n in range(WRITES)), "before-commit"]
IDS = ["after-the-journal", "after-the-pf-write", "after-the-mac", "after-the-move", "before-commit"]


@pytest.mark.parametrize("pod", [None, "pod-a"], ids=["container-scope", "pod-scope"])
@pytest.mark.parametrize("point", POINTS, ids=IDS)
def test_reconcile_puts_back_what_a_killed_admission_changed(node, monkeypatch, point, pod):
    svc = NodeService(node.config)
    node.start("c", PID, pod)
    if point == "before-commit":
        crash_before_commit(monkeypatch, Crash)
    else:
        node.crash_at(int(point))
    with pytest.raises(Crash):
        svc.admit(vf_request("c", pod=pod), PID)
    assert "c" not in svc.ledger.read().grants  # nothing was committed
    if point not in ("0",):
        assert node.snapshot() != node.original  # the PF was changed before the kill
    assert node.journaled(), "the original is journaled before the PF changes"
    node.die("c", PID)  # the runtime gives up on the container

    removed, repaired = NodeService(node.config).reconcile()
    assert node.snapshot() == node.original, "every VF's PF-side state and netdev are back"
    assert node.journaled() == {}
    assert repaired == ["c"]
    assert NodeService(node.config).reconcile() == ([], [])  # nothing left to do


@pytest.mark.parametrize("point", POINTS, ids=["pf-write-refused", "mac-refused", "move-refused", "up-refused",
                                               "a-later-resource-fails"])
def test_a_failed_admission_rolls_back_and_settles_the_journal(node, monkeypatch, point):
    svc = NodeService(node.config)
    node.start("c", PID)
    if point == "before-commit":
        crash_before_commit(monkeypatch, EnforcementError)
    else:
        node.crash_at(int(point), OSError)  # the fake raises the driver's netlink error
    with pytest.raises(EnforcementError):
        svc.admit(vf_request("c"), PID)
    assert node.snapshot() == node.original and node.journaled() == {}


def test_the_next_tenant_of_a_vf_a_killed_admission_left_gets_the_original(node):
    """Without a reconcile in between: the VF is given its saved state before it moves again."""
    svc = NodeService(node.config)
    node.start("c", PID)
    node.crash_at(WRITES)  # killed after the VF is up in the container, before the commit
    with pytest.raises(Crash):
        svc.admit(vf_request("c"), PID)
    node.die("c", PID, renamed=True)
    node.start("d", PID + 1)
    grant = svc.admit(vf_request("d", settings=None), PID + 1).grant
    (vf,) = grant.devices["example.com/vf"]
    index = VFS.index(vf)
    assert node.world.vfs[index] == node.original[0][index], "no VLAN or trust of the killed tenant"
    assert node.world.link_of(vf).mac == node.original[1][vf][2], "nor its MAC"
    assert node.journaled() == {}
    node.die("d", PID + 1)
    svc.release("d")
    assert node.snapshot()[0] == node.original[0]


@pytest.mark.parametrize("pod", [None, "pod-a"], ids=["container-scope", "pod-scope"])
def test_a_release_settles_the_journal(node, pod):
    svc = NodeService(node.config)
    node.start("c", PID, pod)
    svc.admit(vf_request("c", pod=pod), PID)
    record = svc.ledger.read().pods.get("pod-a")
    assert (record is not None and len(record.netdevs) == 1) is (pod is not None), "moved for the pod"
    assert len(node.journaled()) == 1 and node.snapshot() != node.original
    assert NodeService(node.config).reconcile() == ([], [])  # a live grant's VF is left alone
    assert len(node.journaled()) == 1
    node.die("c", PID)
    svc.release("c")  # the poststop
    assert node.journaled() == {}
    assert node.snapshot() == node.original


def test_a_container_that_died_without_its_release_gets_its_vf_back_at_reconcile(node):
    svc = NodeService(node.config)
    node.start("c", PID)
    svc.admit(vf_request("c"), PID)
    node.die("c", PID)  # no poststop
    removed, repaired = NodeService(node.config).reconcile()
    assert [g.container_id for g in removed] == ["c"] and repaired == ["c"]
    assert node.snapshot() == node.original and node.journaled() == {}


def test_a_move_without_settings_journals_nothing(node):
    svc = NodeService(node.config)
    node.start("c", PID)
    svc.admit(vf_request("c", settings=None), PID)
    assert node.journaled() == {} and node.snapshot()[0] == node.original[0]


def test_the_settings_reach_the_pf(node):
    """The harness itself: the admission sets what the annotation asks on the granted VF's PF."""
    svc = NodeService(node.config)
    node.start("c", PID)
    grant = svc.admit(vf_request("c"), PID).grant
    index = VFS.index(grant.devices["example.com/vf"][0])
    assert node.world.vfs[index]["vlan"] == 100 and node.world.vfs[index]["trust"] == 1
    assert node.world.where(VFS[index]) == (node.world.netns_path(PID), "net1")
    assert HOST in node.world.ns and "trust=on" in SETTINGS

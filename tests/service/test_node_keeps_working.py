"""A node keeps working for months: dead containers free their grants, config changes never
brick the node (issue: guarantees on a busy node, items 6 and 7)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.ledger.liveness import cgroup_populated
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path / "machines")


def service(node: FakeNode, **extra: object) -> NodeService:
    return NodeService(config_from_dict(node.config_dict(policy="restricted", **extra)))


def kill(node: FakeNode, name: str, pid: int, procs: str = "") -> None:
    """The container's init dies without a poststop: its /proc entry goes, its cgroup stays
    with ``procs`` in ``cgroup.procs`` (empty: nothing runs there any more)."""
    shutil.rmtree(node.proc_root / str(pid))
    (node.cgroup_dir(name) / "cgroup.procs").write_text(procs)


def test_an_empty_cgroup_frees_the_grant_at_reconcile_and_at_the_next_admission(node):
    svc = service(node)
    pid = node.add_container("dead", 42000, "0-31")
    svc.admit(request_from_oci("dead", {"numa-pin.io/cpus": "4"}), pid)
    held = svc.ledger.read().grants["dead"].cpus
    kill(node, "dead", pid)
    removed, _ = svc.reconcile()
    assert [g.container_id for g in removed] == ["dead"]
    assert svc.ledger.read().grants == {}
    # and without reconcile: the next admission's clean-up frees it too
    pid = node.add_container("dead2", 42001, "0-31")
    svc.admit(request_from_oci("dead2", {"numa-pin.io/cpus": "4"}), pid)
    kill(node, "dead2", pid)
    svc.admit(request_from_oci("next", {"numa-pin.io/cpus": "2"}), node.add_container("next", 42002, "0-31"))
    assert set(svc.ledger.read().grants) == {"next"}
    assert held  # the grant did hold CPUs


def test_a_cgroup_that_still_runs_something_keeps_the_grant(node):
    svc = service(node)
    pid = node.add_container("busy", 42003, "0-31")
    svc.admit(request_from_oci("busy", {"numa-pin.io/cpus": "2"}), pid)
    kill(node, "busy", pid, procs="42099\n")  # init gone, a child still runs in the cgroup
    removed, _ = svc.reconcile()
    assert removed == [] and "busy" in svc.ledger.read().grants


@pytest.mark.parametrize(
    "files, want",
    [({"cgroup.events": "populated 0\nfrozen 0\n"}, False), ({"cgroup.events": "populated 1\nfrozen 0\n"}, True),
     ({"cgroup.procs": ""}, False), ({"cgroup.procs": "12\n"}, True), ({}, True),
     ({"cgroup.procs": "", "container/cgroup.procs": "7\n"}, True)],
    ids=["v2-empty", "v2-populated", "v1-empty", "v1-busy", "not-a-cgroup", "v1-busy-child"],
)
def test_cgroup_populated(tmp_path, files, want):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert cgroup_populated(str(tmp_path)) is want


def test_a_reservation_changed_under_a_live_grant_does_not_brick_the_node(node):
    old = service(node, cpu_manager={"reserved_cpus": "1"})
    old.admit(request_from_oci("s", {}), node.add_container("s", 42010, "0-31"))
    old.admit(request_from_oci("x", {"numa-pin.io/cpus": "1"}), node.add_container("x", 42011, "0-31"))
    x_cpus = old.ledger.read().grants["x"].cpus
    new = service(node, cpu_manager={"reserved_cpus": ",".join(str(c) for c in sorted(x_cpus))})
    assert cpu_node.reserved(new) == x_cpus, "the new config reserves exactly the CPU the old grant holds"
    # unrelated admissions, exclusive and shared, keep working and never get the clashing CPU
    new.admit(request_from_oci("y", {"numa-pin.io/cpus": "2"}), node.add_container("y", 42012, "0-31"))
    new.admit(request_from_oci("s2", {}), node.add_container("s2", 42013, "0-31"))
    grants = new.ledger.read().grants
    assert not grants["y"].cpus & x_cpus
    assert not parse_list(node.cpuset("s2")[0]) & x_cpus, "the shared pool leaves the old grant's CPU alone"
    # the conflict is named with its way out; release and reconcile work
    (line,) = new.config_conflicts(new.ledger.read())
    assert "grant x holds CPU" in line and "numa-pin release x" in line
    new.reconcile()
    assert new.release("y") is not None and new.release("x") is not None
    assert new.config_conflicts(new.ledger.read()) == []

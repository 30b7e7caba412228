"""A container that asks numa-pin for nothing, on cgroup v2 as systemd, podman and runc leave it.

On cgroup v2 a runtime that was given no cpuset leaves the scope's own ``cpuset.cpus`` and
``cpuset.mems`` empty: the cgroup inherits its parent's (``cpuset.*.effective``). The shared
path moves only the CPUs of such a container: it must be admitted, keep inheriting its memory
nodes, stay off exclusive CPUs, get them back on release, and be repaired by reconcile. The fake
kernel (enforcer_fakes.FakeKernel) computes the effective values as the kernel does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from enforcer_fakes import MOUNTINFO_V2, FakeCgroupTree, FakeKernel

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer import cgroups
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

SCOPE = "/machine.slice/libpod-{name}.scope"


class V2Node:
    """The kit's intel-2s-ht machine with a cgroup v2 tree; containers in systemd scopes."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fake = FakeNode(root, "intel-2s-ht", machines=root.parent / "machines")
        (self.fake.proc_root / "self" / "mountinfo").write_text(MOUNTINFO_V2)
        self.tree = FakeCgroupTree(self.fake.cgroup_root, 2, online_cpus=self.fake.cpus,
                                   online_mems=self.fake.mems)
        self.tree.mkcg("/machine.slice")
        self.kernel = FakeKernel(self.tree)
        monkeypatch.setattr(cgroups, "write_cgroup_file", self.kernel)
        self.config = config_from_dict(self.fake.config_dict(policy="single-numa-node"))

    def container(self, name: str, pid: int) -> int:
        rel = SCOPE.format(name=name)
        self.tree.mkcg(rel)  # own cpuset.cpus and cpuset.mems empty, as the runtime left them
        proc = self.fake.proc_root / str(pid)
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "cgroup").write_text(f"0::{rel}\n")
        return pid

    def files(self, name: str) -> dict[str, frozenset[int]]:
        d = self.tree.hierarchy / SCOPE.format(name=name).lstrip("/")
        return {f: parse_list((d / f).read_text()) for f in
                ("cpuset.cpus", "cpuset.mems", "cpuset.cpus.effective", "cpuset.mems.effective")}


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> V2Node:
    return V2Node(tmp_path / "n", monkeypatch)


def test_a_plain_container_is_admitted_and_keeps_inheriting_its_memory_nodes(node: V2Node) -> None:
    service = NodeService(node.config)
    service.admit(request_from_oci("plain", {}), node.container("plain", 4001))
    files = node.files("plain")
    assert files["cpuset.mems"] == frozenset(), "its own cpuset.mems stays empty (inherited)"
    assert files["cpuset.mems.effective"] == parse_list(node.fake.mems)
    assert files["cpuset.cpus.effective"] == cpu_node.shared_pool(service, service.ledger.read())
    assert [p for p, _ in node.kernel.writes if p.endswith("cpuset.mems")] == []


def test_an_exclusive_grant_moves_only_the_plain_containers_cpus_and_release_gives_them_back(node: V2Node) -> None:
    service = NodeService(node.config)
    service.admit(request_from_oci("plain", {}), node.container("plain", 4001))
    before = node.files("plain")
    service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container("x", 4002))
    granted = service.ledger.read().grants["x"]
    shrunk = node.files("plain")
    assert not shrunk["cpuset.cpus.effective"] & granted.cpus, "exclusive means exclusive"
    assert shrunk["cpuset.mems"] == frozenset() and shrunk["cpuset.mems.effective"] == before["cpuset.mems.effective"]
    assert node.files("x")["cpuset.mems"] == granted.mems and len(granted.mems) == 1
    service.release("x")
    assert node.files("plain")["cpuset.cpus.effective"] == before["cpuset.cpus.effective"]


def test_reconcile_repairs_a_plain_containers_cpus_and_leaves_its_memory_nodes(node: V2Node) -> None:
    service = NodeService(node.config)
    service.admit(request_from_oci("plain", {}), node.container("plain", 4001))
    service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container("x", 4002))
    want = node.files("plain")
    cgroups.write_cgroup_file(str(node.tree.hierarchy / SCOPE.format(name="plain").lstrip("/") / "cpuset.cpus"),
                              node.fake.cpus)  # another writer widens it onto the exclusive CPUs
    _, repaired = service.reconcile()
    assert repaired == ["plain"]
    assert node.files("plain") == want

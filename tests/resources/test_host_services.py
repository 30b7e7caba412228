"""Host services off exclusive CPUs on a fake cgroup v1 cpuset tree: the top-level cgroups that
are not containers follow the CPUs no asking grant holds, and get their own cpusets back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer.saved import FILE as SAVED
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

HOST = ("system.slice", "user.slice", "init.scope")


class HostNode(FakeNode):
    def __init__(self, root: Path, parent: str = "ctr", **config: object) -> None:
        super().__init__(root, "laptop", machines=root / "machines", parent=parent)
        for name in (*HOST, "system.slice/ssh.service", "kubepods", "kubepods/pod1"):
            self._write_cpuset(self.cgroup_root / "cpuset" / name, "0-7")
        self.config = config_from_dict(self.config_dict(**config))

    def cpus_of(self, rel: str) -> frozenset[int]:
        return parse_list((self.cgroup_root / "cpuset" / rel / "cpuset.cpus").read_text())


def admit(service, node, name, pid, annotations):
    node.add_container(name, pid)
    return service.admit(request_from_oci(name, {"numa-pin.io/cpus": "2", **annotations}), pid).grant


def test_host_services_leave_the_grant_cpus_and_come_back(tmp_path):
    node = HostNode(tmp_path / "n")
    service = NodeService(node.config)
    node.add_container("shared", 99)
    service.admit(request_from_oci("shared", {}), 99)
    plain = admit(service, node, "plain", 100, {})
    assert all(node.cpus_of(h) == set(range(8)) for h in HOST), "a grant that does not ask leaves the host alone"
    a = admit(service, node, "a", 101, {"numa-pin.io/host-services": "disable"})
    b = admit(service, node, "b", 102, {"numa-pin.io/host-services": "disable"})
    for h in HOST:
        assert node.cpus_of(h) == set(range(8)) - a.cpus - b.cpus, h
    assert node.cpus_of("kubepods") == set(range(8)), "container managers' cgroups are not host services"
    assert node.cpus_of("ctr/plain") == plain.cpus and node.cpus_of("ctr/a") == a.cpus
    assert parse_list(service.describe(service.ledger.read())["host_services_cpus"]) == set(range(8)) - a.cpus - b.cpus
    service.release("a")
    assert all(node.cpus_of(h) == set(range(8)) - b.cpus for h in HOST)
    service.release("b")
    assert all(node.cpus_of(h) == set(range(8)) for h in HOST)
    assert json.loads((node.state_dir / SAVED).read_text()) == {}


def test_a_host_cgroup_holding_the_container_is_split(tmp_path):
    """docker's containers sit in system.slice: its other children are narrowed, not it."""
    node = HostNode(tmp_path / "n", parent="system.slice")
    service = NodeService(node.config)
    a = admit(service, node, "a", 101, {"numa-pin.io/host-services": "disable"})
    assert node.cpus_of("system.slice") == set(range(8))
    assert node.cpus_of("system.slice/ssh.service") == set(range(8)) - a.cpus
    assert node.cpus_of("system.slice/a") == a.cpus
    assert node.cpus_of("user.slice") == set(range(8)) - a.cpus
    service.release("a")
    assert node.cpus_of("system.slice/ssh.service") == set(range(8))


@pytest.mark.parametrize("how", ["reconcile-after-death", "drift"], ids=["crash", "drift"])
def test_reconcile_repairs_and_cleans(tmp_path, how):
    node = HostNode(tmp_path / "n")
    service = NodeService(node.config)
    a = admit(service, node, "a", 101, {"numa-pin.io/host-services": "disable"})
    if how == "drift":
        (node.cgroup_root / "cpuset" / "user.slice" / "cpuset.cpus").write_text("0-7\n")
        _, repaired = service.reconcile()
        assert repaired == ["a"] and node.cpus_of("user.slice") == set(range(8)) - a.cpus
    else:
        node.stop_container("a", 101)  # died without a poststop
        service.reconcile()
        assert all(node.cpus_of(h) == set(range(8)) for h in HOST)


def test_node_default_asks_for_every_exclusive_grant(tmp_path):
    node = HostNode(tmp_path / "n", isolation={"host": True})
    service = NodeService(node.config)
    node.add_container("a", 101)
    a = service.admit(request_from_oci("a", {"numa-pin.io/cpus": "1"}, isolation=node.config.isolation), 101).grant
    assert node.cpus_of("system.slice") == set(range(8)) - a.cpus


def test_an_inherited_cpuset_comes_back_as_the_parents_cpus_where_v2_refuses_empty(tmp_path, monkeypatch):
    """cgroup v2 refuses an empty ``cpuset.cpus`` on a populated cgroup (ENOSPC): a host cgroup
    that inherited its CPUs gets what it would inherit instead, and stays held as a residue."""
    from numa_pin.enforcer import cgroups
    from numa_pin.errors import EnforcementError

    node = HostNode(tmp_path / "n")
    (node.cgroup_root / "cpuset" / "user.slice" / "cpuset.cpus").write_text("\n")  # inherits
    (node.cgroup_root / "cpuset" / "cpuset.cpus.effective").write_text("0-7\n")
    service = NodeService(node.config)
    a = admit(service, node, "a", 101, {"numa-pin.io/host-services": "disable"})
    assert node.cpus_of("user.slice") == set(range(8)) - a.cpus
    real = cgroups.write_cgroup_file

    def kernel(path, text):
        if path.endswith("user.slice/cpuset.cpus") and not text.strip():
            raise EnforcementError("writing '' failed: No space left on device", path=path)
        real(path, text)

    monkeypatch.setattr(cgroups, "write_cgroup_file", kernel)
    service.release("a")
    assert node.cpus_of("user.slice") == set(range(8))
    saved = json.loads((node.state_dir / SAVED).read_text())
    assert list(saved) == [str(node.cgroup_root / "cpuset/user.slice/cpuset.cpus")], "a residue is kept"
    assert saved[str(node.cgroup_root / "cpuset/user.slice/cpuset.cpus")]["value"] == ""
    assert saved[str(node.cgroup_root / "cpuset/user.slice/cpuset.cpus")]["residue"] is True


def test_a_rollback_gives_an_inherited_cpuset_back_where_v2_refuses_empty(tmp_path, monkeypatch):
    from numa_pin.enforcer import cgroups
    from numa_pin.errors import EnforcementError
    from numa_pin.resources.node.isolation import IsolationStatus

    node = HostNode(tmp_path / "n")
    (node.cgroup_root / "cpuset" / "user.slice" / "cpuset.cpus").write_text("\n")
    (node.cgroup_root / "cpuset" / "cpuset.cpus.effective").write_text("0-7\n")
    real = cgroups.write_cgroup_file

    def kernel(path, text):
        if path.endswith("user.slice/cpuset.cpus") and not text.strip():
            raise EnforcementError("writing '' failed: No space left on device", path=path)
        real(path, text)

    def later(self, node_, admission, decided):
        raise EnforcementError("a later resource failed")

    monkeypatch.setattr(cgroups, "write_cgroup_file", kernel)
    monkeypatch.setattr(IsolationStatus, "enforce", later)
    with pytest.raises(EnforcementError) as err:
        admit(NodeService(node.config), node, "a", 101, {"numa-pin.io/host-services": "disable"})
    assert "rollback" not in str(err.value) and "undo" not in str(err.value), str(err.value)
    assert node.cpus_of("user.slice") == set(range(8)) and node.cpus_of("system.slice") == set(range(8))
    assert not (node.state_dir / SAVED).exists() or json.loads((node.state_dir / SAVED).read_text()) == {}

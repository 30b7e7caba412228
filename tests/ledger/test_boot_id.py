"""A grant belongs to a boot: grants of an earlier boot are dropped, logged, and never shown.

After a reboot a pid can be running again and a cgroup path can exist again; neither says the
grant's container survived. The fake node's ``proc/sys/kernel/random/boot_id`` is this boot's id;
changing it is a reboot.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from numa_pin.cli import cmd_status
from numa_pin.config.schema import config_from_dict
from numa_pin.ledger.liveness import read_boot_id
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

BOOT_1 = "0f3c9a52-6c1b-4c36-9f0e-3b7f8f7f6a01"
BOOT_2 = "9d1e3b7a-2a44-4e55-8c90-5d2c1e0b4b02"


class Node:
    def __init__(self, root: Path) -> None:
        self.fake = FakeNode(root, "intel-2s-ht", machines=root.parent / "machines")
        self.boot_file = self.fake.proc_root / "sys" / "kernel" / "random" / "boot_id"
        self.boot_file.parent.mkdir(parents=True)
        self.reboot(BOOT_1)
        self.config_dict = self.fake.config_dict(policy="single-numa-node", syslog=True)
        self.config_file = root / "config.json"
        self.config_file.write_text(json.dumps(self.config_dict))

    def reboot(self, boot_id: str) -> None:
        self.boot_file.write_text(boot_id + "\n")

    def service(self) -> NodeService:
        return NodeService(config_from_dict(self.config_dict))


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "n")


@pytest.fixture
def syslog(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    logged: list[str] = []
    monkeypatch.setattr("numa_pin.reporting.report.log_syslog", lambda line, error=True: logged.append(line))
    return logged


@pytest.mark.parametrize(
    ("text", "expected"),
    [(BOOT_1 + "\n", BOOT_1), ("", None), ("\x1b[2J\n", None), (None, None)],
    ids=["uuid", "empty", "control-characters", "missing"],
)
def test_read_boot_id(tmp_path: Path, text: str | None, expected: str | None) -> None:
    if text is not None:
        path = tmp_path / "sys" / "kernel" / "random" / "boot_id"
        path.parent.mkdir(parents=True)
        path.write_text(text)
    assert read_boot_id(str(tmp_path)) == expected


def test_a_grant_records_its_boot(node: Node) -> None:
    node.fake.add_container("a", 5001)
    grant = node.service().admit(request_from_oci("a", {"numa-pin.io/cpus": "2"}), 5001).grant
    assert grant.boot_id == BOOT_1
    assert Grant.from_dict(json.loads(json.dumps(grant.to_dict()))) == grant


def test_a_ledger_without_boot_ids_still_loads_and_keeps_its_grants(node: Node) -> None:
    grant = Grant("old", "", "old", "exclusive", pid=5001, cpus=frozenset({2}), mems=frozenset({0}))
    assert "boot_id" not in grant.to_dict(), "the key is written only when there is a boot id"
    state = LedgerState.from_dict(LedgerState({"old": grant}, {}).to_dict())
    assert state.grants["old"].boot_id is None


def test_status_after_a_reboot_shows_no_grant_of_the_earlier_boot(
    node: Node, syslog: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    node.fake.add_container("a", 5001)
    node.service().admit(request_from_oci("a", {"numa-pin.io/cpus": "2"}), 5001)
    node.reboot(BOOT_2)  # the pid and the cgroup are "there again" after the reboot
    args = argparse.Namespace(config=str(node.config_file), json=True, kubelet_root=str(node.fake.root / "kubelet"))
    assert cmd_status.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grants"] == []
    assert node.service().ledger.read().grants == {}
    assert [line for line in syslog if "released a" in line and "earlier boot" in line], syslog


def test_a_grant_of_this_boot_stays(node: Node, syslog: list[str]) -> None:
    node.fake.add_container("a", 5001)
    node.service().admit(request_from_oci("a", {"numa-pin.io/cpus": "2"}), 5001)
    assert node.service().drop_earlier_boots() == ()
    assert set(node.service().ledger.read().grants) == {"a"}


def test_a_grant_dropped_by_garbage_collection_gets_a_released_line(node: Node, syslog: list[str]) -> None:
    node.fake.add_container("a", 5001)
    service = node.service()
    service.admit(request_from_oci("a", {"numa-pin.io/cpus": "2"}), 5001)
    node.fake.stop_container("a", 5001)  # no poststop
    removed, _ = service.reconcile()
    assert [g.container_id for g in removed] == ["a"]
    assert [line for line in syslog if line.startswith("numa-pin: released a:") and "gone" in line], syslog


def test_the_agent_drops_grants_of_an_earlier_boot_as_it_starts(
    node: Node, syslog: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from numa_pin.cli import cmd_serve

    node.fake.add_container("a", 5001)
    node.service().admit(request_from_oci("a", {"numa-pin.io/cpus": "2"}), 5001)
    node.reboot(BOOT_2)
    monkeypatch.setenv("NUMA_PIN_CONFIG", str(node.config_file))
    cmd_serve._drop_earlier_boots()
    assert node.service().ledger.read().grants == {}
    assert [line for line in syslog if "released a" in line and "earlier boot" in line], syslog

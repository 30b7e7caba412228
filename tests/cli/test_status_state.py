"""``status`` says whether each grant's container runs: a container that stopped without a
poststop (CRI-O runs poststop only at RemoveContainer) shows as exited and still held, and the
next admission that needs its CPU reclaims it."""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.ledger.liveness import boot_clock
from numa_pin.ledger.model import Grant
from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path, tmp_path_factory, monkeypatch):
    fake = FakeNode(tmp_path / "node", "laptop", parent="", machines=tmp_path_factory.getbasetemp() / "machines")
    fake.config = fake.write_config(policy="restricted", kubelet_root=str(tmp_path / "no-kubelet"))
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def _admit(node: FakeNode, name: str, pid: int, cpus: str) -> int:
    node.add_container(name, pid)
    return hook_run(["--config", str(node.config), "prestart"],
                    io.BytesIO(node.oci_state(name, pid, {"numa-pin.io/cpus": cpus})))


def _status(node: FakeNode, capsys) -> tuple[dict[str, str], str]:
    assert main(["status", "--config", str(node.config), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["status", "--config", str(node.config)]) == 0
    return {g["container_id"]: g["state"] for g in doc["grants"]}, capsys.readouterr().out


def test_each_grant_says_whether_its_container_runs(node, capsys):
    assert _admit(node, "up", 900, "1") == 0
    assert _admit(node, "stopped", 901, "1") == 0
    node.stop_container("stopped", 901)  # CRI-O stopped it and keeps it: no poststop yet
    with Ledger(str(node.state_dir)).transaction() as txn:  # podman's precreate, cgroup not made yet
        txn.state = txn.state.with_grant(Grant("soon", "soon", "soon", "shared", cgroup="/soon",
                                               pending_since=boot_clock()))
    states, text = _status(node, capsys)
    assert states == {"up": "running", "stopped": "exited", "soon": "pending"}
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert lines["stopped"].endswith(" exited:held-until-removed"), text
    assert lines["soon"].endswith(" not-started-yet"), text
    assert "exited" not in lines["up"] and "not-started" not in lines["up"], text


def test_an_admission_reclaims_the_exited_grant(node, capsys):
    """The stopped container's CPU goes to the next container that needs it."""
    assert _admit(node, "stopped", 901, "2") == 0
    node.stop_container("stopped", 901)
    assert _status(node, capsys)[0] == {"stopped": "exited"}
    assert _admit(node, "next", 902, "2") == 0
    assert _status(node, capsys)[0] == {"next": "running"}

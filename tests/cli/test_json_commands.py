"""``--json`` on every read command: status, explain, plan, topology, release, reconcile (and nrt).

Each command runs in-process on a fake node whose grants come from real hook admissions; the
JSON must parse, be one object, and say what the ledger and the reason files say (read here
directly, not through the command), and the text output must stay what it was.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list
from numa_pin.cli.main import COMMANDS, build_parser, main
from numa_pin.entry.hook import run as hook_run
from numa_pin.ledger.store import Ledger
from numa_pin.reporting.report import reason_path
from numa_pin.testing.node import FakeNode

#: commands that only look (or whose result is worth reading): each takes --json
READ_COMMANDS = ("status", "explain", "plan", "topology", "release", "reconcile", "nrt")


@pytest.fixture
def node(tmp_path, tmp_path_factory, monkeypatch):
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    for i in range(4):
        fake.add_container(f"c{i}", 7000 + i)
    fake.config = fake.write_config(policy="single-numa-node", kubelet_root=str(tmp_path / "no-kubelet"))
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def _admit(node: FakeNode, i: int, cpus: str, capsys) -> tuple[int, str]:
    rc = hook_run(["--config", str(node.config), "prestart"],
                  io.BytesIO(node.oci_state(f"c{i}", 7000 + i, {"numa-pin.io/cpus": cpus})))
    return rc, capsys.readouterr().err


def _json(capsys, *argv: str, rc: int = 0) -> dict:
    assert main(list(argv)) == rc
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def test_every_read_command_has_json():
    for name in READ_COMMANDS:
        assert name in COMMANDS
        parser = build_parser(name)
        sub = parser._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
        assert "--json" in sub._option_string_actions, name


def test_status_json_lists_the_ledger(node, capsys):
    assert _admit(node, 0, "2", capsys)[0] == 0
    doc = _json(capsys, "status", "--config", str(node.config), "--json")
    grant = Ledger(str(node.state_dir)).read().grants["c0"]
    assert [g["container_id"] for g in doc["grants"]] == ["c0"]
    assert doc["grants"][0]["cpus"] == format_list(grant.cpus)
    assert doc["kubelet"]["policy"] is None


def test_explain_json_granted_rejected_unknown(node, capsys):
    assert _admit(node, 0, "2", capsys)[0] == 0
    granted = _json(capsys, "explain", "c0", "--config", str(node.config), "--json")
    assert (granted["state"], granted["grant"]["container_id"], granted["rejection"]) == ("granted", "c0", None)
    rc, err = _admit(node, 1, "40", capsys)
    assert rc == 1
    rejected = _json(capsys, "explain", "c1", "--config", str(node.config), "--json")
    assert rejected["state"] == "rejected" and rejected["grant"] is None
    reason = json.loads(Path(reason_path(str(node.state_dir), "c1")).read_text())
    assert rejected["rejection"] == reason and rejected["rejection"]["line"] == err.strip()
    unknown = _json(capsys, "explain", "nope", "--config", str(node.config), "--json", rc=1)
    assert (unknown["state"], unknown["grant"], unknown["rejection"]) == ("unknown", None, None)
    # the text forms are unchanged
    assert main(["explain", "c1", "--config", str(node.config)]) == 0
    assert capsys.readouterr().out == reason["line"] + "\n"
    assert main(["explain", "c0", "--config", str(node.config)]) == 0
    assert json.loads(capsys.readouterr().out)["granted"]["container_id"] == "c0"


def test_release_json(node, capsys):
    assert _admit(node, 0, "2", capsys)[0] == 0
    grant = Ledger(str(node.state_dir)).read().grants["c0"]
    node.stop_container("c0", 7000)  # a container that still runs needs --force
    first = _json(capsys, "release", "c0", "--config", str(node.config), "--json")
    assert (first["released"], first["grant"]["cpus"]) == (True, format_list(grant.cpus))
    assert Ledger(str(node.state_dir)).read().grants == {}
    again = _json(capsys, "release", "c0", "--config", str(node.config), "--json", rc=1)
    assert (again["released"], again["grant"]) == (False, None)
    assert main(["release", "c0", "--config", str(node.config)]) == 1
    assert "no grant matches 'c0'" in capsys.readouterr().err


def test_reconcile_json_drops_the_dead(node, capsys):
    assert _admit(node, 0, "2", capsys)[0] == 0
    assert _admit(node, 1, "2", capsys)[0] == 0
    shutil.rmtree(node.proc_root / "7001")  # c1's process and cgroup are gone
    shutil.rmtree(node.cgroup_dir("c1"))
    doc = _json(capsys, "reconcile", "--config", str(node.config), "--json")
    assert [g["container_id"] for g in doc["dropped"]] == ["c1"]
    assert isinstance(doc["repaired"], list)
    assert set(Ledger(str(node.state_dir)).read().grants) == {"c0"}
    assert main(["reconcile", "--config", str(node.config)]) == 0
    assert capsys.readouterr().out.strip() in ("nothing to do", "repaired cpuset of c0")


def test_plan_and_topology_json(node, capsys):
    plan = _json(capsys, "plan", "--config", str(node.config), "--cpus", "2", "--json")
    assert plan["admit"] is True and len(plan["cpus"].replace("-", ",").split(",")) >= 1
    topo = _json(capsys, "topology", "--sysfs-root", str(node.sysfs_root), "--json")
    assert set(topo) == {"numa_nodes", "cpus", "pci_devices", "isolated_cpus", "nohz_full"}


def test_nrt_json(node, capsys):
    doc = _json(capsys, "nrt", "--config", str(node.config), "--node-name", "n1", "--json")
    assert doc["kind"] == "NodeResourceTopology" and doc["metadata"] == {"name": "n1"}


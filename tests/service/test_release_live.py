"""``numa-pin release`` of a container that still runs (issue 22, item 6).

Without ``--force`` it is refused: its CPUs would go to the next container while it still runs
there. With it, the container keeps running on the shared pool and stays tracked, so the next
exclusive grant shrinks it off the CPUs it gets.
"""

from __future__ import annotations

import json

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(hook_node: FakeNode) -> FakeNode:
    return hook_node


def admit(node: FakeNode, name: str, pid: int, annotations: dict[str, str]) -> None:
    import io

    node.add_container(name, pid)
    assert hook_run(["--config", str(node.config), "prestart"], io.BytesIO(node.oci_state(name, pid, annotations))) == 0


def cpus(node: FakeNode, name: str) -> frozenset[int]:
    return parse_list(node.cpuset(name)[0])


def test_releasing_a_live_container_needs_force_and_keeps_tracking_it(node, capsys):
    admit(node, "x", 46000, {"numa-pin.io/cpus": "4"})
    ledger = Ledger(str(node.state_dir))
    held = ledger.read().grants["x"].cpus
    capsys.readouterr()
    assert main(["release", "x", "--config", str(node.config)]) == 1
    err = capsys.readouterr().err
    assert "still runs" in err and "--force" in err
    assert ledger.read().grants["x"].cpus == held  # refused: nothing changed
    assert main(["release", "x", "--force", "--json", "--config", str(node.config)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["moved_to_shared"] is True and out["released"] is False and out["grant"]["kind"] == "shared"
    grant = ledger.read().grants["x"]
    assert grant.kind == "shared" and not grant.cpus
    assert held <= cpus(node, "x")  # it runs on the shared pool, its old CPUs included
    assert main(["status", "--json", "--config", str(node.config)]) == 0
    listed = {g["container_id"]: g["kind"] for g in json.loads(capsys.readouterr().out)["grants"]}
    assert listed == {"x": "shared"}
    # still tracked: the next exclusive grant (which may take x's old CPUs) shrinks x off them
    admit(node, "y", 46001, {"numa-pin.io/cpus": "8"})
    y = ledger.read().grants["y"].cpus
    assert y and not cpus(node, "x") & y
    assert main(["reconcile", "--json", "--config", str(node.config)]) == 0
    assert json.loads(capsys.readouterr().out)["dropped"] == []


def test_a_stopped_container_is_released_without_force(node, capsys):
    admit(node, "x", 46000, {"numa-pin.io/cpus": "4"})
    node.stop_container("x", 46000)
    assert main(["release", "x", "--config", str(node.config)]) == 0
    assert Ledger(str(node.state_dir)).read().grants == {}

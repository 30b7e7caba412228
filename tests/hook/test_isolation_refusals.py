"""A knob the node cannot honour is a refusal, through the hook as a runtime runs it: the
``rejected`` line (kind ``IsolationError``, kept as the reason) and exit 1, nothing written;
before, ``numa-pin: error <id>: EnforcementError`` and exit 4 (what CRI-O showed for
``cpu-load-balancing.crio.io`` on a cgroup v1 node whose root balances). A write that fails on
the way stays an error (exit 4)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from numa_pin.enforcer import cgroups as cg
from numa_pin.entry import hook as hook_main
from numa_pin.errors import EXIT_ERROR, EXIT_REJECTED, EnforcementError
from numa_pin.ledger.store import Ledger
from numa_pin.reporting.report import reason_path
from numa_pin.testing.node import FakeNode

PID = 77


def _v1_root_balances(node: FakeNode) -> None:
    (node.cgroup_root / "cpuset" / "cpuset.sched_load_balance").write_text("1\n")
    (node.cgroup_dir("c") / "cpuset.sched_load_balance").write_text("1\n")


def _nothing(node: FakeNode) -> None:
    """The kit's laptop as it is: no PM QoS files, no cpufreq, no cpu cgroup hierarchy."""


# (annotations, what the node lacks, words of the refusal)
CASES = {
    "crio-load-balancing-v1-root-balances": ({"cpu-load-balancing.crio.io": "disable"}, _v1_root_balances,
                                             "does not turn it off for the whole node"),
    "crio-c-states-without-pm-qos": ({"cpu-c-states.crio.io": "disable"}, _nothing,
                                     "no PM QoS resume latency for CPU"),
    "crio-governor-without-cpufreq": ({"cpu-freq-governor.crio.io": "performance"}, _nothing,
                                      "has no cpufreq policy"),
    "numa-pin-quota-without-cpu-controller": ({"numa-pin.io/cpu-quota": "disable"}, _nothing,
                                              "no cgroup hierarchy carries the cpu controller"),
}


@pytest.fixture
def node(tmp_path, monkeypatch):
    fake = FakeNode(tmp_path, "laptop", parent="")
    fake.add_container("c", PID)
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.delenv("NUMA_PIN_DEBUG", raising=False)
    fake.config = fake.write_config(settled=False, policy="restricted")
    return fake


def _prestart(node: FakeNode, cid: str, annotations: dict[str, str]) -> int:
    bundle = node.root / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"annotations": annotations, "linux": {"cgroupsPath": "/c"}}))
    state = json.dumps({"id": cid, "bundle": str(bundle), "pid": PID}).encode()
    return hook_main.run(["--config", str(node.config), "prestart"], io.BytesIO(state))


@pytest.mark.parametrize(("knob", "lacks", "words"), CASES.values(), ids=CASES.keys())
def test_a_knob_the_node_cannot_honour_is_rejected(node, capsys, monkeypatch, knob, lacks, words):
    lacks(node)
    writes: list[str] = []
    monkeypatch.setattr(cg, "write_cgroup_file", lambda path, text: writes.append(path))
    rc = _prestart(node, "ctr-1", {"numa-pin.io/cpus": "1", **knob})
    err = capsys.readouterr().err
    assert rc == EXIT_REJECTED, err
    (line,) = err.splitlines()
    assert line.startswith("numa-pin: rejected ctr-1: IsolationError: ") and words in line, line
    reason = json.loads(Path(reason_path(str(node.state_dir), "ctr-1")).read_text())
    assert (reason["kind"], reason["line"]) == ("IsolationError", line)
    assert Ledger(str(node.state_dir)).read().grants == {}
    assert writes == [], "refused before anything was written"


def test_a_write_that_fails_on_the_way_stays_an_error(node, capsys, monkeypatch):
    def refuse(path, text):
        raise EnforcementError(f"writing {text!r} failed: Device or resource busy", path=path)

    monkeypatch.setattr(cg, "write_cgroup_file", refuse)
    rc = _prestart(node, "ctr-2", {"numa-pin.io/cpus": "1"})
    err = capsys.readouterr().err
    assert rc == EXIT_ERROR, err
    assert err.startswith("numa-pin: error ctr-2: EnforcementError: ") and "busy" in err, err
    assert Ledger(str(node.state_dir)).read().grants == {}

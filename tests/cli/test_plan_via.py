"""``numa-pin plan --via PATH``: a request is planned as the path it would come in by takes it.

The oracle is the paths themselves: every refusal ``plan`` predicts must be the one the path
gives (tests/nri/test_every_path.py runs the same requests through prestart, precreate and NRI).
"""

from __future__ import annotations

import json

import pytest

from numa_pin.cli.main import main
from numa_pin.testing.node import FakeNode

POLICY = ["--cpus", "1", "--memory-policy", "interleave"]


@pytest.fixture
def config(tmp_path, tmp_path_factory, monkeypatch):
    fake = FakeNode(tmp_path / "node", "laptop", machines=tmp_path_factory.getbasetemp() / "machines")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return str(fake.write_config(tmp_path / "config.yaml"))


def _plan(capsys, config: str, *args: str) -> tuple[int, dict]:
    rc = main(["plan", "--config", config, "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("via, admit", [("prestart", False), ("precreate", True), ("nri", False), ("run", True)])
def test_a_memory_policy_is_planned_as_each_path_takes_it(config, capsys, via, admit):
    rc, plan = _plan(capsys, config, *POLICY, "--via", via)
    assert plan["admit"] is admit and rc == (0 if admit else 1)
    assert list(plan["paths"]) == [via]
    if not admit:
        assert plan["cpus"] == "" and f"on the {via} path" in plan["reason"] and plan["paths"][via] == plan["reason"]


def test_without_via_every_path_is_named_and_the_decision_stands(config, capsys):
    rc, plan = _plan(capsys, config, *POLICY)
    assert rc == 0 and plan["admit"] and plan["cpus"]
    assert {p for p, why in plan["paths"].items() if why} == {"prestart", "nri"}
    assert {p for p, why in plan["paths"].items() if not why} == {"precreate", "run"}


def test_a_request_every_path_carries_names_no_refusal(config, capsys):
    rc, plan = _plan(capsys, config, "--cpus", "1")
    assert rc == 0 and not any(plan["paths"].values())


def test_an_old_runtime_spec_in_the_bundle_is_refused_at_precreate(config, capsys, tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2-dev", "annotations": {"numa-pin.io/cpus": "1", "numa-pin.io/memory-policy": "bind"}}))
    rc, plan = _plan(capsys, config, "--bundle", str(bundle), "--via", "precreate")
    assert rc == 1 and not plan["admit"] and "linux.memoryPolicy" in plan["reason"]


@pytest.mark.parametrize("version, carried", [("1.2.0", {"precreate"}), ("1.0.2-dev", set())],
                         ids=["runtime-spec-1.2", "runtime-spec-1.0"])
def test_an_exec_affinity_is_planned_as_each_path_takes_it(config, capsys, tmp_path, version, carried):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": version, "annotations": {"numa-pin.io/cpus": "1", "numa-pin.io/exec-cpu-affinity": "first"}}))
    rc, plan = _plan(capsys, config, "--bundle", str(bundle))
    assert rc == 0 and plan["admit"]
    assert {p for p, why in plan["paths"].items() if not why} == carried
    assert all("numa-pin.io/exec-cpu-affinity 'first' cannot be applied" in why
               for p, why in plan["paths"].items() if p not in carried)

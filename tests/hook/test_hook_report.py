"""A rejection is reported three ways (stderr, reason file, syslog), and the CLI explains it."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest

from numa_pin.cli.main import main as cli_main
from numa_pin.entry import hook as hook_main
from numa_pin.reporting.report import reason_path
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path):
    fake = FakeNode(tmp_path, "laptop", parent="")
    fake.add_container("c", 77)
    config = fake.write_config(tmp_path / "config.yaml", settled=False, policy="restricted", syslog=True)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    return config, bundle, fake.state_dir


@pytest.mark.parametrize(
    "annotations, kind, needle",
    [
        ({"numa-pin.io/cpus": "64"}, "TopologyAffinityError", "cpu 64 requested, free per node: 0=7"),
        ({"numa-pin.io/cpus": "lots"}, "RequestError", "numa-pin.io/cpus"),
    ],
    ids=["no-fit", "malformed"],
)
def test_rejection_goes_to_stderr_reason_file_and_syslog(node, monkeypatch, capsys, annotations, kind, needle):
    config, bundle, state_dir = node
    (bundle / "config.json").write_text(json.dumps({"annotations": annotations, "linux": {"cgroupsPath": "/c"}}))
    logged: list[tuple[int, str]] = []
    monkeypatch.setattr("syslog.syslog", lambda prio, msg: logged.append((prio, msg)))
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(state_dir.parent / "cache"))
    state = json.dumps({"id": "ctr-1", "bundle": str(bundle), "pid": 77, "status": "creating"}).encode()
    rc = hook_main.run(["--config", str(config), "prestart"], io.BytesIO(state))
    err = capsys.readouterr().err.strip()
    assert rc == 1
    verb = "rejected" if kind == "TopologyAffinityError" else "error"
    assert err.startswith(f"numa-pin: {verb} ctr-1: {kind}:") and needle in err and "\n" not in err
    assert [m for _, m in logged] == [err]
    reason = json.loads(Path(reason_path(str(state_dir), "ctr-1")).read_text())
    assert reason["line"] == err and reason["kind"] == kind
    assert cli_main(["explain", "ctr-1", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == err


def test_admitted_container_is_explained_from_the_ledger(node, monkeypatch, capsys):
    config, bundle, state_dir = node
    (bundle / "config.json").write_text(json.dumps({"annotations": {"numa-pin.io/cpus": "2"},
                                                    "linux": {"cgroupsPath": "/c"}}))
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(state_dir.parent / "cache"))
    state = json.dumps({"id": "ok-1", "bundle": str(bundle), "pid": 77}).encode()
    assert hook_main.run(["--config", str(config), "createRuntime"], io.BytesIO(state)) == 0
    capsys.readouterr()
    assert cli_main(["explain", "ok-1", "--config", str(config)]) == 0
    granted = json.loads(capsys.readouterr().out)["granted"]
    assert granted["container_id"] == "ok-1" and granted["kind"] == "exclusive"
    assert cli_main(["status", "--json", "--config", str(config)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [g["container_id"] for g in status["grants"]] == ["ok-1"]
    assert cli_main(["release", "ok-1", "--config", str(config)]) == 1  # it still runs
    capsys.readouterr()
    shutil.rmtree(state_dir.parent / "cgroup" / "cpuset" / "c", ignore_errors=True)  # now it stopped
    assert cli_main(["release", "ok-1", "--config", str(config)]) == 0
    assert "released" in capsys.readouterr().out
    assert not os.path.exists(reason_path(str(state_dir), "ok-1"))


@pytest.mark.parametrize("argv, code", [(["bogus-stage"], 2), (["--config"], 2), (["--wat"], 2),
                                        (["poststart"], 0), (["createContainer"], 0)],
                         ids=["unknown-stage", "config-without-path", "unknown-flag", "noop-poststart",
                              "noop-create-container"])
def test_hook_usage(argv, code, capsys):
    assert hook_main.run(argv, io.BytesIO(b"{}")) == code
    if code:
        assert "usage: numa-pin-hook" in capsys.readouterr().err

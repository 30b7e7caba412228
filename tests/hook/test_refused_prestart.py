"""A container refused at prestart gives back the grant precreate made for it.

podman's precreate admits without a pid (a pending grant, its CPUs taken from the shared pool);
the runtime's prestart then refuses the container (a knob this node cannot honour, a process in
another cgroup than the bundle names). The runtime will not start it, and podman runs no
poststop for a container that never started: the refusing hook itself releases the pending
grant. Through the hook's entry point on a fake node (podman's cgroupfs layout, cgroup v1).
"""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.hook import main as hook_main
from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode

CID = "0f2a83a2d618ece3563383e4d2c110bfc35717b71b479661529c6d7a83acaedb"
SCOPE = f"libpod-{CID}"


def _node(tmp_path, monkeypatch):
    fake = FakeNode(tmp_path, "laptop", parent="libpod_parent")
    cfg = fake.write_config(tmp_path / "config.yaml", settled=False)
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake, cfg


def _proposed(annotations: dict[str, str]) -> dict:
    return {
        "ociVersion": "1.0.2-dev",
        "process": {"args": ["sh"], "env": ["PATH=/usr/bin"]},
        "annotations": {"io.container.manager": "libpod", **annotations},
        "linux": {"cgroupsPath": f"/libpod_parent/{SCOPE}", "resources": {"pids": {"limit": 2048}}},
    }


def _hook(cfg, stage: str, stdin: bytes, out: io.BytesIO | None = None) -> int:
    return hook_main.run(["--config", str(cfg), stage], io.BytesIO(stdin), out or io.BytesIO())


def _precreate_then_start(tmp_path, fake, cfg, annotations: dict[str, str], cgroup_of_pid: str) -> int:
    """precreate (the runtime's config written to the bundle), then the container's process in
    ``cgroup_of_pid`` and prestart; prestart's exit code."""
    out = io.BytesIO()
    assert _hook(cfg, "precreate", json.dumps(_proposed(annotations)).encode(), out) == 0
    assert Ledger(str(fake.state_dir)).read().grants[CID].pid is None, "precreate made a pending grant"
    (tmp_path / "config.json").write_bytes(out.getvalue())
    fake.add_container(cgroup_of_pid, 4242)
    state = {"id": CID, "pid": 4242, "bundle": str(tmp_path), "status": "creating"}
    return _hook(cfg, "prestart", json.dumps(state).encode())


@pytest.mark.parametrize(
    ("annotations", "cgroup_of_pid", "why"),
    [
        pytest.param({"cpu-load-balancing.crio.io": "disable"}, SCOPE, "sched_load_balance", id="load-balancing"),
        pytest.param({"cpu-quota.crio.io": "disable"}, SCOPE, "cpu-quota cannot be honoured", id="quota"),
        pytest.param({}, "elsewhere", "cgroup", id="process-in-another-cgroup"),
    ],
)
def test_a_refusing_prestart_releases_the_precreate_grant(tmp_path, monkeypatch, capsys, annotations,
                                                           cgroup_of_pid, why):
    fake, cfg = _node(tmp_path, monkeypatch)
    rc = _precreate_then_start(tmp_path, fake, cfg, {"numa-pin.io/cpus": "2", **annotations}, cgroup_of_pid)
    err = capsys.readouterr().err
    assert rc != 0 and why in err and err.count("\n") == 1, err
    assert Ledger(str(fake.state_dir)).read().grants == {}
    # the CPUs are free again: a container asking for every CPU but the shared pool's last one fits
    out = io.BytesIO()
    other = _proposed({"numa-pin.io/cpus": "7"})
    other["linux"]["cgroupsPath"] = "/libpod_parent/libpod-" + "1" * 64
    assert _hook(cfg, "precreate", json.dumps(other).encode(), out) == 0, capsys.readouterr().err


def test_a_refused_second_admission_keeps_a_grant_bound_to_its_process(tmp_path, monkeypatch, capsys):
    """createRuntime after a prestart that bound the grant: its refusal does not take the
    running container's CPUs away (only a grant no process was bound to goes)."""
    fake, cfg = _node(tmp_path, monkeypatch)
    assert _precreate_then_start(tmp_path, fake, cfg, {"numa-pin.io/cpus": "2"}, SCOPE) == 0
    fake.add_container("elsewhere", 4343)
    state = {"id": CID, "pid": 4343, "bundle": str(tmp_path), "status": "creating"}
    assert _hook(cfg, "createRuntime", json.dumps(state).encode()) != 0
    assert Ledger(str(fake.state_dir)).read().grants[CID].pid == 4242

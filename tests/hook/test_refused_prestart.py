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

from numa_pin.entry import hook as hook_main
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


def _age(fake, seconds: float) -> None:
    """Make the pending grant ``seconds`` older (its precreate that long ago)."""
    from numa_pin.base.record import replace

    ledger = Ledger(str(fake.state_dir))
    with ledger.transaction() as txn:
        grant = txn.state.grants[CID]
        txn.state = txn.state.with_grant(replace(grant, pending_since=grant.pending_since - seconds))


def _reconcile(cfg) -> int:
    from numa_pin.cli.main import main as cli_main

    return cli_main(["reconcile", "--config", str(cfg)])


@pytest.mark.parametrize(
    ("what_the_runtime_did", "kept"),
    [
        pytest.param("rm -f", False, id="root-filesystem-removed"),
        pytest.param("cgroup made, init gone", False, id="cgroup-emptied"),
        pytest.param("cgroup made, init gone just now", True, id="cgroup-empty-within-the-settle"),
        pytest.param("nothing yet", True, id="not-created-yet"),
        pytest.param("cgroup made, init there", True, id="cgroup-populated"),
    ],
)
def test_reconcile_drops_a_pending_grant_the_runtime_gave_up(tmp_path, monkeypatch, capsys, what_the_runtime_did,
                                                             kept):
    """Evidence, not the 120 s grace: the container's storage removed (``podman rm -f``) or its
    cgroup made and emptied. A container podman has not created yet keeps its grant."""
    from numa_pin.resources.node.base import PENDING_GRACE_S, PENDING_SETTLE_S

    fake, cfg = _node(tmp_path, monkeypatch)
    rootfs = tmp_path / "storage" / "overlay" / "l1" / "merged"
    rootfs.mkdir(parents=True)
    doc = _proposed({"numa-pin.io/cpus": "2"})
    doc["root"] = {"path": str(rootfs)}
    assert _hook(cfg, "precreate", json.dumps(doc).encode()) == 0
    assert Ledger(str(fake.state_dir)).read().grants[CID].pending_root == str(rootfs)
    cgroup = fake.cgroup_dir(SCOPE)
    if what_the_runtime_did == "rm -f":
        import shutil

        shutil.rmtree(tmp_path / "storage" / "overlay" / "l1")
    elif what_the_runtime_did.startswith("cgroup made"):
        fake.add_container(SCOPE, 4242)
        (cgroup / "cgroup.procs").write_text("" if "gone" in what_the_runtime_did else "4242\n")
    _age(fake, 1.0 if what_the_runtime_did.endswith("just now") else PENDING_SETTLE_S + 1)
    assert _reconcile(cfg) == 0, capsys.readouterr().err
    assert (CID in Ledger(str(fake.state_dir)).read().grants) is kept
    assert PENDING_SETTLE_S + 1 < PENDING_GRACE_S, "the grace alone would have kept it"


def test_a_prestart_that_times_out_on_the_ledger_lock_leaves_the_grant_to_liveness(tmp_path, monkeypatch, capsys):
    """A refusal because the ledger is busy does not wait for the lock a second time to release:
    the hook's time is spent, and the evidence (or the grace) drops the grant later."""
    fake = FakeNode(tmp_path, "laptop", parent="libpod_parent")
    cfg = fake.write_config(tmp_path / "config.yaml", settled=False, lock_timeout_s=0.3)
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    out = io.BytesIO()
    assert _hook(cfg, "precreate", json.dumps(_proposed({"numa-pin.io/cpus": "2"})).encode(), out) == 0
    (tmp_path / "config.json").write_bytes(out.getvalue())
    fake.add_container(SCOPE, 4242)
    state = {"id": CID, "pid": 4242, "bundle": str(tmp_path), "status": "creating"}
    ledger = Ledger(str(fake.state_dir))
    with ledger.transaction():  # another writer holds the lock throughout
        waits: list[float | None] = []
        real = Ledger.transaction

        def counted(self, timeout=None, on_wait=None):
            waits.append(timeout)
            return real(self, timeout, on_wait)

        with monkeypatch.context() as patch:
            patch.setattr(Ledger, "transaction", counted)
            assert _hook(cfg, "prestart", json.dumps(state).encode()) != 0
    assert "lock" in capsys.readouterr().err
    assert len(waits) == 1, "one wait for the lock, not a second one to release"
    assert ledger.read().grants[CID].pid is None

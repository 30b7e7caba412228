"""A node keeps working with real runc: a container killed behind the runtime's back frees its
grant, and a reservation changed under a live grant never bricks the node."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from . import harness
from .test_hook_e2e import ONE_CPU, _bundle

pytestmark = pytest.mark.e2e


def _wait_gone(pid: int, limit_s: float = 10.0) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not exit")


def _remove_cgroups(paths: dict[str, str]) -> None:
    for controllers, rel in paths.items():
        for name in controllers.split(","):
            d = Path("/sys/fs/cgroup") / (name or "unified") / rel.lstrip("/")
            for sub in sorted(d.rglob("*"), reverse=True) if d.is_dir() else []:
                if sub.is_dir():
                    os.rmdir(sub)
            if d.is_dir() and rel.strip("/"):
                os.rmdir(d)


def test_runc_container_killed_without_delete_frees_its_grant(runc_rt, node, busybox_rootfs, tmp_path, cid):
    bundle = _bundle(tmp_path, "a", node, busybox_rootfs, ONE_CPU)
    assert runc_rt.create(bundle, cid).returncode == 0
    runc_rt.start(cid)
    pid = runc_rt.state(cid)["pid"]
    cgroups = harness.proc_cgroups(pid)
    assert cid in node.grants()
    try:
        os.kill(pid, signal.SIGKILL)  # the init dies...
        _wait_gone(pid)
        shutil.rmtree(runc_rt.root / cid)  # ...and the runtime's state goes: no delete, no poststop
        res = node.cli("reconcile")
        assert res.returncode == 0, res.stderr
        assert f"dropped {cid}" in res.stdout
        assert node.grants() == {}
        # the CPU is exclusive again for the next container
        nid = harness.new_container_id()
        with harness.running_container(runc_rt, _bundle(tmp_path, "b", node, busybox_rootfs, ONE_CPU), nid) as st:
            assert harness.read_cpuset(st["pid"]).cpus == "1"
    finally:
        _remove_cgroups(cgroups)


def test_runc_reservation_changed_under_a_live_grant(runc_rt, node, busybox_rootfs, tmp_path, cid):
    base = node.cfg.read_text()
    node.cfg.write_text(base + "cpu_manager:\n  reserved_cpus: \"1\"\n")
    with harness.running_container(runc_rt, _bundle(tmp_path, "x", node, busybox_rootfs, ONE_CPU), cid) as st:
        assert harness.read_cpuset(st["pid"]).cpus == "0", "CPU 0 is exclusive under reserved_cpus 1"
        node.cfg.write_text(base)  # back to the default reservation: CPU 0
        shared_id = harness.new_container_id()
        shared = _bundle(tmp_path, "s", node, busybox_rootfs)
        with harness.running_container(runc_rt, shared, shared_id) as sst:
            assert harness.read_cpuset(sst["pid"]).cpus == "1", "a plain container still starts"
            status = node.cli("status")
            assert status.returncode == 0, status.stderr
            assert f"grant {cid} holds CPU 0" in status.stdout and f"numa-pin release {cid}" in status.stdout
            assert node.cli("reconcile").returncode == 0
        assert shared_id not in node.grants(), "a release works while the conflict lasts"
    assert node.grants() == {}

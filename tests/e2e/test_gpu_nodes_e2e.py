"""GPU device nodes in prestart mode, with a real runc container on this cgroup v1 machine.

No GPU here, so a character device stands in for one: ``/dev/nvidia0`` is made with the numbers
of ``/dev/kmsg`` (1:11), which runc's default device rules do **not** allow (unlike /dev/null or
/dev/zero) and which any process may open write-only. A prestart hook (a few lines of Python
around :mod:`numa_pin.enforcer.devnodes` and :func:`numa_pin.enforcer.gpu.allow_device_rules`,
the two calls ``NodeService`` makes for a granted GPU) runs at the real prestart point: mounts
done, pivot_root not yet. The oracles are the kernel (open succeeds or fails with EPERM inside
the container, the node is or is not in its ``/dev``) and the cgroup's own ``devices.list``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from numa_pin.enforcer import cgroups
from numa_pin.enforcer.devnodes import DeviceNode, create_device_nodes
from numa_pin.enforcer.gpu import DeviceRule, allow_device_rules
from numa_pin.enforcer.mounts import detect_layout
from numa_pin.enforcer.undo import UndoLog

from . import harness

pytestmark = pytest.mark.e2e

STAND_IN = DeviceNode("/dev/nvidia0", 1, 11)  # /dev/kmsg's numbers
PROBE = harness.GPU_PROBE


@pytest.fixture
def gpu_hook(tmp_path):
    if harness.hybrid_cgroup2_mount() is None and not Path("/sys/fs/cgroup/devices").is_dir():
        pytest.skip("needs a cgroup v1 devices hierarchy")
    path = harness.write_gpu_stand_in_hook(tmp_path / "gpu-hook")

    def hooks(mode: str) -> dict:
        return {"prestart": [harness.hook_entry(path, [str(path), mode], timeout=30)]}

    return hooks


def _run(runc_rt, tmp_path, name, busybox_rootfs, hooks=None, cid=None) -> subprocess.CompletedProcess[str]:
    bundle = harness.make_bundle(tmp_path / name, args=["sh", "-c", PROBE], hooks=hooks or {}, rootfs=busybox_rootfs)
    return runc_rt.run(bundle, cid or harness.new_container_id())


def test_without_a_grant_there_is_no_node(runc_rt, busybox_rootfs, tmp_path):
    res = _run(runc_rt, tmp_path, "plain", busybox_rootfs)
    assert "No such file" in res.stdout + res.stderr and "OPENED" not in res.stdout


def test_a_node_without_the_cgroup_rule_cannot_be_opened(runc_rt, gpu_hook, busybox_rootfs, tmp_path):
    res = _run(runc_rt, tmp_path, "nodes", busybox_rootfs, gpu_hook("nodes-only"))
    assert res.returncode == 0, res.stderr
    assert "DENIED" in res.stdout and "OPENED" not in res.stdout, res.stdout
    assert "crw-rw-rw-" in res.stdout and "1,  11" in res.stdout


def test_granted_container_sees_and_opens_its_gpu_then_the_next_one_without_is_denied(
        runc_rt, gpu_hook, busybox_rootfs, tmp_path):
    res = _run(runc_rt, tmp_path, "full", busybox_rootfs, gpu_hook("full"))
    assert res.returncode == 0, res.stderr
    assert "OPENED" in res.stdout, res.stdout
    assert "GPU-stand-in 0" in res.stdout, "the container learns which GPU it got"
    assert not Path("/dev/nvidia0").exists() or os.major(os.stat("/dev/nvidia0").st_rdev) != 1, \
        "the node was made in the container's /dev, not the host's"
    again = _run(runc_rt, tmp_path, "after", busybox_rootfs, gpu_hook("nodes-only"))
    assert "DENIED" in again.stdout and "OPENED" not in again.stdout


def test_undo_removes_the_nodes_and_the_cgroup_rule(runc_rt, busybox_rootfs, tmp_path, cid):
    """What a failed admission (or a release while the container lives) rolls back."""
    bundle = harness.make_bundle(tmp_path / "live", args=["sleep", "1000"], rootfs=busybox_rootfs)

    def probe() -> str:
        res = runc_rt._exec("exec", cid, "sh", "-c", PROBE, timeout=60)
        return res.stdout + res.stderr

    with harness.running_container(runc_rt, bundle, cid) as state:
        pid = int(state["pid"])
        layout = detect_layout("/proc")
        devices_dir = cgroups.find_v1_controller_dir(pid, "/proc", "/sys/fs/cgroup", layout, "devices")
        assert devices_dir is not None
        rule = "c 1:11 rwm"
        undo = UndoLog()
        allow_device_rules((DeviceRule("c", 1, 11),), pid, "/proc", "/sys/fs/cgroup", layout, undo)
        created = create_device_nodes(pid, [STAND_IN], "/proc", str(busybox_rootfs), undo, gpu_text="GPU-x 0\n")
        assert "/dev/nvidia0" in created, "after pivot_root the container's root is /"
        assert rule in Path(devices_dir, "devices.list").read_text()
        seen = probe()
        assert "OPENED" in seen and "GPU-x 0" in seen, seen
        assert not undo.rollback()
        gone = probe()
        assert "No such file" in gone and "GPU-x" not in gone and "OPENED" not in gone, gone
        assert rule not in Path(devices_dir, "devices.list").read_text()


def test_release_of_a_live_container_takes_gpu_access_back(runc_rt, busybox_rootfs, tmp_path, cid, state_dir):
    """``numa-pin release ID`` while the container runs: the ledger's GPU record is undone."""
    from numa_pin.config.model import Config
    from numa_pin.ledger.liveness import process_start_time
    from numa_pin.ledger.model import Grant
    from numa_pin.ledger.records import GpuAccess
    from numa_pin.service.node import NodeService

    bundle = harness.make_bundle(tmp_path / "live", args=["sleep", "1000"], rootfs=busybox_rootfs)
    with harness.running_container(runc_rt, bundle, cid) as state:
        pid = int(state["pid"])
        layout = detect_layout("/proc")
        undo = UndoLog()
        allowed = allow_device_rules((DeviceRule("c", 1, 11),), pid, "/proc", "/sys/fs/cgroup", layout, undo)
        nodes = create_device_nodes(pid, [STAND_IN], "/proc", None, undo, gpu_text="GPU-x 0\n")
        record = GpuAccess(tuple(nodes), tuple(str(r) for r in allowed.added), allowed.cgroup_dir)
        service = NodeService(Config(state_dir=str(state_dir / "ledger"), syslog=False))
        grant = Grant(cid, cid, cid, "shared", pid=pid, start_time=process_start_time(pid, "/proc"),
                      gpus=record)
        with service.ledger.transaction() as txn:
            txn.state = txn.state.with_grant(grant)
        before = runc_rt._exec("exec", cid, "sh", "-c", PROBE, timeout=60).stdout
        assert "OPENED" in before, before
        assert service.release(cid) is not None
        after = runc_rt._exec("exec", cid, "sh", "-c", PROBE, timeout=60)
        assert "OPENED" not in after.stdout and "No such file" in after.stderr, after
        assert "c 1:11 rwm" not in Path(allowed.cgroup_dir or "", "devices.list").read_text()


def test_an_image_run_without_tmpfs_sends_the_gpu_list_to_dev(runc_rt, gpu_hook, tmp_path):
    """An image's own /run (no tmpfs on it) is the host's disk before pivot_root: the list goes to /dev."""
    rootfs = harness.make_rootfs(tmp_path / "rootfs-with-run")
    (rootfs / "run").mkdir()
    bundle = harness.make_bundle(tmp_path / "ro", args=["sh", "-c", PROBE + "; ls /dev/numa-pin"],
                                 hooks=gpu_hook("full"), rootfs=rootfs)
    res = runc_rt.run(bundle, harness.new_container_id())
    assert res.returncode == 0, res.stderr
    assert "OPENED" in res.stdout and "GPU-stand-in 0" in res.stdout and "gpus" in res.stdout, res.stdout
    assert os.listdir(rootfs / "run") == [], "nothing was written into the image on the host's disk"

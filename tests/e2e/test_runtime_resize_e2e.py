"""A runtime resizes a running container (``runc update --cpuset-cpus``) behind the ledger.

Real runc on this machine (cgroup v1, 2 CPUs, CPU 0 reserved): the container holds CPU 1
exclusively; ``runc update`` widens its cpuset to 0-1. ``numa-pin reconcile`` must notice: by
default it writes CPU 1 back; with ``resize_follow: adopt`` it refuses to adopt (CPU 0 is
reserved for the system, no resize could give it) and writes CPU 1 back as well. The oracle is
the kernel's cgroup file and the process's ``Cpus_allowed_list``.
"""

from __future__ import annotations

import json

import pytest

from . import harness

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("follow", [None, "adopt"], ids=["reassert-by-default", "adopt-refuses-a-reserved-cpu"])
def test_reconcile_notices_runc_update(runc_rt, node, busybox_rootfs, tmp_path, cid, follow):
    if follow is not None:
        node.cfg.write_text(node.cfg.read_text() + f"resize_follow: {follow}\n")
    bundle = harness.make_bundle(tmp_path / "a", args=["sleep", "1000"], annotations={"numa-pin.io/cpus": "1"},
                                 hooks=node.hooks, rootfs=busybox_rootfs)
    with harness.running_container(runc_rt, bundle, cid) as st:
        assert harness.read_cpuset(st["pid"]).cpus == "1"
        done = runc_rt._exec("update", "--cpuset-cpus", "0-1", cid, timeout=30)
        assert done.returncode == 0, done.stderr
        assert harness.read_cpuset(st["pid"]).cpus == "0-1"  # the runtime changed it behind the ledger
        res = node.cli("reconcile", "--json")
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert cid in out["repaired"] and out["adopted"] == []
        if follow == "adopt":
            assert len(out["not_adopted"]) == 1 and "reserved" in out["not_adopted"][0], out
        assert harness.read_cpuset(st["pid"]).cpus == "1"
        assert harness.proc_allowed(st["pid"])[0] == "1"
        assert node.grants()[cid].cpus == frozenset({1})


def test_numa_pin_resize_of_a_runc_container_is_refused_when_nothing_is_free(runc_rt, node, busybox_rootfs,
                                                                              tmp_path, cid):
    """CPU 1 is the only CPU an exclusive grant can hold here: growing to 2 is refused in one
    line and the kernel's cpuset stays; resizing to what it has is a no-op."""
    bundle = harness.make_bundle(tmp_path / "a", args=["sleep", "1000"], annotations={"numa-pin.io/cpus": "1"},
                                 hooks=node.hooks, rootfs=busybox_rootfs)
    with harness.running_container(runc_rt, bundle, cid) as st:
        res = node.cli("resize", cid, "--cpus", "2")
        assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and "free" in res.stderr, res.stderr
        assert harness.read_cpuset(st["pid"]).cpus == "1" and node.grants()[cid].cpus == frozenset({1})
        res = node.cli("resize", cid, "--cpus", "1")
        assert res.returncode == 0, res.stderr
        assert harness.read_cpuset(st["pid"]).cpus == "1"

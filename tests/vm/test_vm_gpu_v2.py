"""GPU access on cgroup v2, with real runc in the 2-node qemu guest (cgroup v2 only).

No GPU in the guest, so a character device stands in for one, as in the v1 test
(``tests/e2e/test_gpu_nodes_e2e.py``): ``/dev/nvidia0`` is made with ``/dev/kmsg``'s numbers
(1:11), which runc's default device rules (its BPF device program) do **not** allow. numa-pin's
real enforcement code runs: a prestart hook of a few lines calls
:func:`numa_pin.enforcer.gpu.allow_device_rules` (on v2: the device-program swap of
:mod:`numa_pin.enforcer.bpfdev`) and :func:`numa_pin.enforcer.devnodes.create_device_nodes`, the two
calls ``NodeService`` makes for a granted GPU; for a running container the driver calls them
directly, then undoes them (rollback) or releases through ``NodeService.release``. The oracle is
the kernel: the open inside the container succeeds or fails with EPERM, and the programs the
kernel holds are read back (their instructions, byte for byte).

Everything runs in ONE guest boot (TCG: 60-150 s); runc's ``--root`` and the bundles are on the
guest's ``/run``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from .guest import GuestResult, run_in_guest_with_retry, unavailable_reason

pytestmark = pytest.mark.vm

GUEST_SCRIPT = r"""
set -u
"$NP_PY" "$NP_SHARED/gpu_driver.py" > "$NP_SHARED/driver.out" 2>&1
"""

GUEST_DRIVER = r'''
import contextlib, json, os, subprocess, sys, traceback
from pathlib import Path

import harness
from numa_pin.devices.devfilter import carried_rules
from numa_pin.enforcer import bpfdev, cgroups
from numa_pin.enforcer.mounts import detect_layout
from numa_pin.enforcer.devnodes import DeviceNode, create_device_nodes
from numa_pin.enforcer.gpu import DeviceRule, allow_device_rules
from numa_pin.enforcer.undo import UndoLog

shared = Path(os.environ["NP_SHARED"])
work = Path("/run/np-gpu")
work.mkdir(parents=True, exist_ok=True)
hook = harness.write_gpu_stand_in_hook(work / "gpu-hook")
rootfs = harness.make_rootfs(work / "rootfs")
rt = harness.runtime("runc", work / "runc")
PROBE = harness.GPU_PROBE
STAND_IN = DeviceNode("/dev/nvidia0", 1, 11)
RULE = DeviceRule("c", 1, 11)
report = {"mounts": Path("/proc/self/mounts").read_text(),
          "runc": subprocess.run(["runc", "--version"], capture_output=True, text=True).stdout}


def bundle(name, args, mode=None):
    hooks = {"prestart": [harness.hook_entry(hook, [str(hook), mode], timeout=60)]} if mode else {}
    return harness.make_bundle(work / "bundles" / name, args=args, rootfs=rootfs, hooks=hooks)


def run(name, mode):
    res = rt.run(bundle(name, ["sh", "-c", PROBE], mode), harness.new_container_id(name), timeout=180)
    return {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}


def probe(cid):
    res = rt._exec("exec", cid, "sh", "-c", PROBE, timeout=60)
    return res.stdout + res.stderr


def programs(directory):
    return [{"hex": p.insns.hex(), "rules": [str(r) for r in carried_rules(p.insns)]}
            for p in bpfdev.read_programs(directory)]


@contextlib.contextmanager
def running(name):
    """A ``sleep`` container of this name: (id, pid, cgroup layout, its cgroup)."""
    cid = harness.new_container_id(name)
    with harness.running_container(rt, bundle(name, ["sleep", "1000"]), cid, timeout=180) as st:
        layout = detect_layout("/proc")
        yield cid, st["pid"], layout, cgroups.find_cgroup(st["pid"], "/proc", "/sys/fs/cgroup", layout)


def grant(pid, layout, undo, gpu_text=None):
    """The stand-in's rule on the container's device programs, then its node in the container."""
    rules = allow_device_rules((RULE,), pid, "/proc", "/sys/fs/cgroup", layout, undo)
    return rules, create_device_nodes(pid, [STAND_IN], "/proc", None, undo, gpu_text=gpu_text)


def step(name, fn):
    try:
        report[name] = fn()
    except Exception as exc:
        report[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}


# (a) (b) (c): three short-lived containers, the prestart hook at the real prestart point
step("plain", lambda: run("plain", "nodes-only"))
step("granted", lambda: run("granted", "full"))
step("after", lambda: run("after", "nodes-only"))


def live_undo():
    """grant a running container, then undo (what a failed admission does)"""
    out = {}
    with running("live") as (cid, pid, layout, ref):
        out["cgroup"] = ref.cpuset_dir
        out["before"] = programs(ref.cpuset_dir)
        out["probe_before"] = probe(cid)
        undo = UndoLog()
        rules, _ = grant(pid, layout, undo, gpu_text="GPU-x 0\n")
        out["grant"] = {"version": rules.version, "added": [str(r) for r in rules.added],
                        "bpf_dirs": list(rules.bpf_dirs)}
        out["during"] = programs(ref.cpuset_dir)
        out["probe_granted"] = probe(cid)
        out["rollback_failures"] = [str(f) for f in undo.rollback()]
        out["after"] = programs(ref.cpuset_dir)
        out["probe_undone"] = probe(cid)
        # the node alone (made again, no rule): the kernel denies
        create_device_nodes(pid, [STAND_IN], "/proc", None, UndoLog())
        out["probe_node_only"] = probe(cid)
    return out


def live_release():
    """numa-pin release of a running container: the ledger's v2 record is undone"""
    from numa_pin.config.model import Config
    from numa_pin.ledger.liveness import process_start_time
    from numa_pin.ledger.model import Grant
    from numa_pin.ledger.records import GpuAccess
    from numa_pin.service.node import NodeService

    out = {}
    with running("rel") as (cid, pid, layout, _):
        rules, nodes = grant(pid, layout, UndoLog(), gpu_text="GPU-x 0\n")
        access = GpuAccess(tuple(nodes), tuple(str(r) for r in rules.added), None, tuple(rules.bpf_dirs))
        service = NodeService(Config(state_dir=str(work / "ledger"), syslog=False))
        g = Grant(cid, cid, cid, "shared", pid=pid, start_time=process_start_time(pid, "/proc"), gpus=access)
        with service.ledger.transaction() as txn:
            txn.state = txn.state.with_grant(g)
        out["probe_granted"] = probe(cid)
        out["released"] = service.release(cid) is not None
        out["probe_released"] = probe(cid)
        out["after"] = programs(rules.bpf_dirs[0])
    return out


def runc_update():
    """what runc 1.1's update does to a granted container, with one and with two programs"""
    out = {}
    with running("upd") as (cid, pid, layout, ref):
        grant(pid, layout, UndoLog())
        out["one_granted"] = probe(cid)
        res = rt._exec("update", "--pids-limit", "500", cid, timeout=60)
        out["one_update_rc"] = res.returncode
        out["one_after_update"] = probe(cid)
        out["one_programs"] = programs(ref.cpuset_dir)
        # a second program next to runc's (what systemd adds with the systemd driver): a copy of runc's
        lib = bpfdev.libbpf()
        runc_prog = bpfdev.read_programs(ref.cpuset_dir)[0]
        fd = lib.load(runc_prog.insns, "np_second", runc_prog.gpl)
        cg_fd = os.open(ref.cpuset_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            lib.attach(cg_fd, fd)
        finally:
            os.close(cg_fd)
            os.close(fd)
        allow_device_rules((RULE,), pid, "/proc", "/sys/fs/cgroup", layout, UndoLog())
        out["two_programs"] = programs(ref.cpuset_dir)
        out["two_granted"] = probe(cid)
        res = rt._exec("update", "--pids-limit", "600", cid, timeout=60)
        out["two_update_rc"] = res.returncode
        out["two_after_update"] = probe(cid)
        out["two_programs_after"] = programs(ref.cpuset_dir)
    return out


step("live_undo", live_undo)
step("live_release", live_release)
step("runc_update", runc_update)
(shared / "gpu_report.json").write_text(json.dumps(report, indent=2))
'''


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)

    def make_shared() -> Path:
        shared = tmp_path_factory.mktemp("gpuguest")
        (shared / "gpu_driver.py").write_text(textwrap.dedent(GUEST_DRIVER))
        return shared

    result: GuestResult = run_in_guest_with_retry(make_shared, GUEST_SCRIPT, timeout=600)
    assert "gpu_report.json" in result.files, (
        f"rc={result.rc}\n{result.files.get('driver.out', b'').decode()}\nconsole:{result.console[-2000:]}"
    )
    print(f"guest boot + GPU v2 checks + poweroff: {result.elapsed_s:.1f}s")
    return json.loads(result.text("gpu_report.json"))


def _ok(entry: dict) -> dict:
    assert "error" not in entry, entry.get("trace", entry)
    return entry


def test_the_guest_is_cgroup_v2_only(report):
    cgroup_fs = {line.split()[2] for line in report["mounts"].splitlines() if "cgroup" in line.split()[2]}
    assert cgroup_fs == {"cgroup2"}


def test_a_container_without_a_grant_cannot_open_the_node(report):
    plain = _ok(report["plain"])
    assert plain["rc"] == 0, plain["stderr"]
    assert "crw-rw-rw-" in plain["stdout"] and "1,  11" in plain["stdout"], "the node is there"
    assert "DENIED" in plain["stdout"] and "OPENED" not in plain["stdout"], plain["stdout"]


def test_a_granted_container_sees_and_opens_its_gpu(report):
    granted = _ok(report["granted"])
    assert granted["rc"] == 0, granted["stderr"]
    assert "OPENED" in granted["stdout"], granted["stdout"]
    assert "crw-rw-rw-" in granted["stdout"] and "GPU-stand-in 0" in granted["stdout"]


def test_the_next_container_without_a_grant_is_denied_again(report):
    after = _ok(report["after"])
    assert after["rc"] == 0, after["stderr"]
    assert "DENIED" in after["stdout"] and "OPENED" not in after["stdout"], after["stdout"]


def test_undo_takes_access_away_from_the_same_container_and_restores_runcs_program(report):
    live = _ok(report["live_undo"])
    assert "No such file" in live["probe_before"] and "OPENED" not in live["probe_before"]
    assert live["grant"]["version"] == 2 and live["grant"]["added"] == ["c 1:11 rwm"]
    assert live["cgroup"] in live["grant"]["bpf_dirs"]
    (before,), (during,), (after,) = live["before"], live["during"], live["after"]
    assert before["rules"] == [] and during["rules"] == ["c 1:11 rwm"]
    assert during["hex"].endswith(before["hex"]), "runc's instructions follow the prologue unchanged"
    assert "OPENED" in live["probe_granted"] and "GPU-x 0" in live["probe_granted"], live["probe_granted"]
    assert live["rollback_failures"] == []
    assert after["hex"] == before["hex"], "the kernel holds runc's program again, byte for byte"
    assert "OPENED" not in live["probe_undone"] and "No such file" in live["probe_undone"]
    assert "DENIED" in live["probe_node_only"] and "crw-rw-rw-" in live["probe_node_only"]


def test_release_of_a_live_container_takes_gpu_access_back(report):
    rel = _ok(report["live_release"])
    assert "OPENED" in rel["probe_granted"], rel["probe_granted"]
    assert rel["released"]
    assert "OPENED" not in rel["probe_released"] and "No such file" in rel["probe_released"]
    assert [p["rules"] for p in rel["after"]] == [[]]


def test_runc_update_keeps_the_grant_with_one_and_with_two_programs(report):
    """runc 1.1.5's ``update`` sets ``SkipDevices`` (update.go: "runc update is unable to change
    device configuration ... in case an extra plugin (nvidia GPU) applies some configuration on top"),
    so it never reaches libcontainer/cgroups/ebpf, whose replace-one / detach-all-others logic runs
    only when runc writes devices (at create, before the prestart hooks). Measured here: the
    prologue stays in every program and the container keeps its GPU."""
    upd = _ok(report["runc_update"])
    assert "OPENED" in upd["one_granted"]
    assert upd["one_update_rc"] == 0
    assert "OPENED" in upd["one_after_update"], upd["one_after_update"]
    assert [p["rules"] for p in upd["one_programs"]] == [["c 1:11 rwm"]]
    assert [p["rules"] for p in upd["two_programs"]] == [["c 1:11 rwm"], ["c 1:11 rwm"]]
    assert "OPENED" in upd["two_granted"]
    assert upd["two_update_rc"] == 0
    assert "OPENED" in upd["two_after_update"], upd["two_after_update"]
    assert upd["two_programs_after"] == upd["two_programs"], "runc update left both programs as they were"

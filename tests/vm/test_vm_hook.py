"""numa-pin-hook on a real multi-NUMA kernel: a 2-node qemu guest on cgroup v2, runc inside.

Guest layout (DEFAULT_NUMA): node 0 = CPUs 0-1, node 1 = CPUs 2-3, 1 GiB each. The node
config reserves one CPU (CPU 0, the default ``num_reserved_cpus: 1``), so under
``single-numa-node`` a 2-CPU container can only fit on node 1, and a 3-CPU container fits on no
single node. The oracle is the kernel: ``Cpus_allowed_list``/``Mems_allowed_list`` read from
inside the container, and the container cgroup's cpuset files read from the host side.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list

from .guest import DEFAULT_NUMA, GuestResult, run_in_guest_with_retry, unavailable_reason

pytestmark = pytest.mark.vm

GUEST_SCRIPT = r"""
set -u
"$NP_PY" "$NP_SHARED/hook_driver.py" > "$NP_SHARED/driver.out" 2>&1
"""

GUEST_DRIVER = r'''
import json, os, subprocess, sys
from pathlib import Path

import harness

shared = Path(os.environ["NP_SHARED"])
hook = os.environ["NP_HOOK"]
work = Path("/run/np-hook")
work.mkdir(parents=True, exist_ok=True)
config = work / "config.yaml"
config.write_text(f"policy: single-numa-node\nstate_dir: {work / 'state'}\nsyslog: false\n")
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NUMA_PIN_CACHE_DIR={work / 'cache'}",
       "PYTHONDONTWRITEBYTECODE=1"]
hooks = {stage: [harness.hook_entry(hook, ["numa-pin-hook", "--config", str(config), stage], env=env, timeout=60)]
         for stage in ("createRuntime", "poststop")}
rootfs = harness.make_rootfs(work / "rootfs")
rt = harness.runtime("runc", work / "runc")
show = ["sh", "-c", "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status"]
report = {}

def bundle(name, annotations, args):
    return harness.make_bundle(work / "bundles" / name, args=args, rootfs=rootfs, annotations=annotations, hooks=hooks)

two = {"numa-pin.io/cpus": "2", "numa-pin.io/memory": "256Mi"}
res = rt.run(bundle("fits", two, show), harness.new_container_id("fits"), timeout=180)
report["fits"] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}

res = rt.run(bundle("too-big", {"numa-pin.io/cpus": "3"}, ["true"]), "too-big", timeout=180)
report["too_big"] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}

cid = harness.new_container_id("held")
try:
    with harness.running_container(rt, bundle("held", two, ["sleep", "1000"]), cid, timeout=180) as st:
        cs = harness.read_cpuset(st["pid"])
        report["held"] = {"version": cs.version, "cpus": cs.cpus, "mems": cs.mems,
                          "allowed": list(harness.proc_allowed(st["pid"]))}
        res = rt.run(bundle("second", two, ["true"]), "second", timeout=180)
        report["second"] = {"rc": res.returncode, "stderr": res.stderr}
        # a container that asks numa-pin for nothing: runc leaves its own cpuset.mems empty on v2
        res = rt.run(bundle("plain", {}, show), harness.new_container_id("plain"), timeout=180)
        report["plain"] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}
except (harness.HarnessError, OSError) as exc:
    report["held"] = {"error": str(exc)}
status = subprocess.run([str(Path(hook).with_name("numa-pin")), "status", "--json", "--config", str(config)],
                        capture_output=True, text=True)
report["status_after"] = status.stdout
(shared / "hook_report.json").write_text(json.dumps(report, indent=2))
'''


def _allowed(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from . import guest as guest_mod

    hook = guest_mod.REPO / ".venv" / "bin" / "numa-pin-hook"
    if not hook.exists():
        pytest.skip("numa-pin-hook is not installed in .venv")

    def make_shared() -> Path:
        shared = tmp_path_factory.mktemp("hookguest")
        (shared / "hook_driver.py").write_text(textwrap.dedent(GUEST_DRIVER))
        return shared

    script = f"export NP_HOOK={hook}\n" + GUEST_SCRIPT
    result: GuestResult = run_in_guest_with_retry(make_shared, script, timeout=600)
    assert "hook_report.json" in result.files, (
        f"rc={result.rc}\n{result.files.get('driver.out', b'').decode()}\nconsole:{result.console[-2000:]}"
    )
    print(f"guest boot + hook checks + poweroff: {result.elapsed_s:.1f}s")
    return json.loads(result.text("hook_report.json"))


def test_two_cpus_and_memory_land_on_one_node(report):
    fits = report["fits"]
    assert fits["rc"] == 0, fits["stderr"]
    allowed = _allowed(fits["stdout"])
    node1 = DEFAULT_NUMA[1].cpus
    assert allowed["Cpus_allowed_list"] == node1, "both CPUs of the one node with 2 free CPUs"
    assert allowed["Mems_allowed_list"] == "1", "memory on that same node"


def test_request_that_fits_no_single_node_is_rejected(report):
    too_big = report["too_big"]
    assert too_big["rc"] != 0
    assert "numa-pin: rejected too-big: TopologyAffinityError: single-numa-node" in too_big["stderr"]


def test_cgroup_v2_cpuset_and_second_container_rejected(report):
    held = report["held"]
    assert "error" not in held, held
    assert held["version"] == 2
    assert (held["cpus"], held["mems"]) == (DEFAULT_NUMA[1].cpus, "1")
    assert held["allowed"] == [DEFAULT_NUMA[1].cpus, "1"]
    second = report["second"]
    assert second["rc"] != 0 and "TopologyAffinityError" in second["stderr"]
    assert json.loads(report["status_after"])["grants"] == [], "everything released after exit"


def test_cgroup_v2_plain_container_starts_off_the_exclusive_cpus(report):
    """A container without numa-pin annotations starts (its scope's own cpuset.mems is empty on v2)
    and runs on the shared pool: none of the held container's CPUs, every memory node."""
    plain = report["plain"]
    assert plain["rc"] == 0, plain["stderr"]
    allowed = _allowed(plain["stdout"])
    held = parse_list(report["held"]["cpus"])
    assert parse_list(allowed["Cpus_allowed_list"]) and not parse_list(allowed["Cpus_allowed_list"]) & held
    assert allowed["Mems_allowed_list"] == f"0-{len(DEFAULT_NUMA) - 1}"

"""Prove the multi-NUMA guest: 2 nodes, cgroup v2 with cpuset, runc/crun + hooks inside.

The guest boots once per module (a TCG boot takes tens of seconds); one guest
script gathers every fact into files under the shared directory and the tests
below check them. The containers inside are built with ``tests/e2e/harness.py``
(imported in the guest through PYTHONPATH), with ``--root`` and the bundles on
the guest's own /run tmpfs.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from .guest import (
    DEFAULT_NUMA,
    GuestConfig,
    GuestError,
    GuestNode,
    GuestResult,
    run_in_guest,
    run_in_guest_with_retry,
    unavailable_reason,
    vng_command,
)

pytestmark = pytest.mark.vm

#: (case id, linux.resources.cpu or None, expected Cpus_allowed_list, expected Mems_allowed_list)
#: expectations come from DEFAULT_NUMA, the layout handed to qemu
ALL_CPUS = f"{DEFAULT_NUMA[0].cpus.split('-')[0]}-{DEFAULT_NUMA[-1].cpus.split('-')[-1]}"
CONTAINER_CASES = [
    ("unpinned", None, ALL_CPUS, f"0-{len(DEFAULT_NUMA) - 1}"),
    ("node0", {"cpus": DEFAULT_NUMA[0].cpus, "mems": "0"}, DEFAULT_NUMA[0].cpus, "0"),
    ("node1", {"cpus": DEFAULT_NUMA[1].cpus, "mems": "1"}, DEFAULT_NUMA[1].cpus, "1"),
]
RUNTIMES = ("runc", "crun")

GUEST_SCRIPT = r"""
set -u
out="$NP_SHARED/facts"
mkdir -p "$out"
for n in /sys/devices/system/node/node[0-9]*; do
    echo "$(basename "$n") $(cat "$n/cpulist") $(awk '/MemTotal/ {print $4}' "$n/meminfo")" >> "$out/nodes"
done
stat -f -c %T /sys/fs/cgroup > "$out/cgroup_fstype"
cat /sys/fs/cgroup/cgroup.controllers > "$out/controllers"
"$NP_PY" -c 'import numa_pin, sys; print(numa_pin.__name__, sys.version_info[0], sys.version_info[1])' > "$out/python" 2>&1
runc --version > "$out/runc_version" 2>&1
crun --version > "$out/crun_version" 2>&1
"$NP_PY" "$NP_SHARED/driver.py"
"""

GUEST_DRIVER = r'''
import json, os
from pathlib import Path

import harness

shared = Path(os.environ["NP_SHARED"])
cases = json.loads((shared / "cases.json").read_text())
work = Path("/run/np-vm")
rootfs = harness.make_rootfs(work / "rootfs")
probe = harness.write_probe_hook(work / "probe")
report = {"hybrid": str(harness.hybrid_cgroup2_mount()), "runs": {}, "lifecycle": {}}
show = ["sh", "-c", "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status"]

for name in cases["runtimes"]:
    rt = harness.runtime(name, work / "state" / name)
    for case_id, cpu in cases["containers"]:
        key = f"{name}-{case_id}"
        cid = harness.new_container_id(key)
        bundle = harness.make_bundle(
            work / "bundles" / key, args=show, rootfs=rootfs,
            annotations={"numa-pin.io/case": case_id},
            resources={"cpu": cpu} if cpu else None,
            hooks={"createRuntime": [harness.probe_entry(probe, shared / f"probe-{key}.jsonl", "createRuntime")]},
        )
        try:
            res = rt.run(bundle, cid, timeout=120)
            report["runs"][key] = {"cid": cid, "rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}
        except harness.HarnessError as exc:
            report["runs"][key] = {"cid": cid, "rc": -1, "stdout": "", "stderr": str(exc)}

    # lifecycle: the cgroup v2 cpuset of a running container, read from the host side
    cid = harness.new_container_id(f"{name}-life")
    cpu = dict(cases["containers"])["node1"]
    bundle = harness.make_bundle(work / "bundles" / cid, args=["sleep", "1000"], rootfs=rootfs, resources={"cpu": cpu})
    try:
        with harness.running_container(rt, bundle, cid, timeout=120) as state:
            cs = harness.read_cpuset(state["pid"])
            report["lifecycle"][name] = {
                "version": cs.version, "dir": str(cs.dir), "cpus": cs.cpus, "mems": cs.mems,
                "effective_cpus": cs.effective_cpus, "effective_mems": cs.effective_mems,
                "allowed": list(harness.proc_allowed(state["pid"])), "cid": cid,
            }
        report["lifecycle"][name]["left"] = rt.list_ids()
    except (harness.HarnessError, OSError) as exc:
        report["lifecycle"][name] = {"error": str(exc)}

(shared / "report.json").write_text(json.dumps(report, indent=2))
'''


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> GuestResult:
    """Boot the 2-node guest once and run every check in it."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    def make_shared() -> Path:
        shared = tmp_path_factory.mktemp("guest")
        cases = {"runtimes": list(RUNTIMES), "containers": [[c[0], c[1]] for c in CONTAINER_CASES]}
        (shared / "cases.json").write_text(json.dumps(cases))
        (shared / "driver.py").write_text(textwrap.dedent(GUEST_DRIVER))
        return shared

    return run_in_guest_with_retry(make_shared, GUEST_SCRIPT, timeout=600)


@pytest.fixture(scope="module")
def report(guest: GuestResult) -> dict:
    assert "report.json" in guest.files, f"rc={guest.rc} stderr={guest.stderr}\nconsole:{guest.console[-2000:]}"
    data: dict = json.loads(guest.text("report.json"))
    return data


def test_guest_script_succeeded(guest: GuestResult) -> None:
    print(f"guest boot + checks + poweroff: {guest.elapsed_s:.1f}s")
    assert guest.rc == 0, f"stdout={guest.stdout}\nstderr={guest.stderr}"


def _nodes(guest: GuestResult) -> dict[str, tuple[str, int]]:
    rows = [line.split() for line in guest.text("facts/nodes").splitlines()]
    return {row[0]: (row[1], int(row[2])) for row in rows}


def test_guest_has_exactly_the_requested_nodes(guest: GuestResult) -> None:
    assert sorted(_nodes(guest)) == [f"node{i}" for i in range(len(DEFAULT_NUMA))]


@pytest.mark.parametrize("index", range(len(DEFAULT_NUMA)), ids=[f"node{i}" for i in range(len(DEFAULT_NUMA))])
def test_guest_node_layout(guest: GuestResult, index: int) -> None:
    cpus, mem_kb = _nodes(guest)[f"node{index}"]
    assert cpus == DEFAULT_NUMA[index].cpus
    # qemu "1G" per node: the kernel reports a bit less than 1 GiB (reserved pages)
    assert 512 * 1024 < mem_kb <= 1024 * 1024


def test_guest_has_cgroup2_with_cpuset(guest: GuestResult) -> None:
    assert guest.text("facts/cgroup_fstype").strip() == "cgroup2fs"
    assert "cpuset" in guest.text("facts/controllers").split()


def test_guest_python_imports_numa_pin(guest: GuestResult) -> None:
    name, major, minor = guest.text("facts/python").split()
    assert name == "numa_pin" and (int(major), int(minor)) >= (3, 11)


def test_guest_runtimes_need_no_hybrid_workaround(report: dict) -> None:
    assert report["hybrid"] == "None"


@pytest.mark.parametrize("runtime", RUNTIMES, ids=list(RUNTIMES))
@pytest.mark.parametrize(("case_id", "cpu", "cpus", "mems"), CONTAINER_CASES, ids=[c[0] for c in CONTAINER_CASES])
def test_guest_container_sees_its_cpuset(report: dict, runtime: str, case_id: str, cpu: object, cpus: str, mems: str) -> None:
    run = report["runs"][f"{runtime}-{case_id}"]
    assert run["rc"] == 0, run["stderr"]
    seen = dict(line.split(":\t") for line in run["stdout"].strip().splitlines())
    assert seen == {"Cpus_allowed_list": cpus, "Mems_allowed_list": mems}


@pytest.mark.parametrize("runtime", RUNTIMES, ids=list(RUNTIMES))
@pytest.mark.parametrize("case_id", [c[0] for c in CONTAINER_CASES], ids=[c[0] for c in CONTAINER_CASES])
def test_guest_hook_sees_v2_cgroup_and_cpuset(guest: GuestResult, report: dict, runtime: str, case_id: str) -> None:
    key = f"{runtime}-{case_id}"
    lines = guest.text(f"probe-{key}.jsonl").splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    # pure cgroup v2: one "0::<path>" line, the container's own cgroup
    (line,) = record["pid_cgroup"].splitlines()
    assert line.startswith("0::/") and line.endswith("/" + report["runs"][key]["cid"])
    expected = {c[0]: (c[2], c[3]) for c in CONTAINER_CASES}[case_id]
    # at createRuntime the runtime has already applied linux.resources
    assert (record["cpus_allowed"], record["mems_allowed"]) == expected


@pytest.mark.parametrize("runtime", RUNTIMES, ids=list(RUNTIMES))
def test_guest_read_cpuset_of_running_container(report: dict, runtime: str) -> None:
    life = report["lifecycle"][runtime]
    assert "error" not in life, life.get("error")
    node1 = DEFAULT_NUMA[1].cpus
    assert life["version"] == 2
    assert life["dir"].startswith("/sys/fs/cgroup/") and life["dir"].endswith("/" + life["cid"])
    assert (life["cpus"], life["mems"]) == (node1, "1")
    assert (life["effective_cpus"], life["effective_mems"]) == (node1, "1")
    assert life["allowed"] == [node1, "1"]
    assert life["left"] == []


# --------------------------------------------------------------------------- guest helpers without a boot


@pytest.mark.parametrize(
    ("config", "present", "absent"),
    [
        (GuestConfig(kernel=Path("/boot/k")), ["--disable-kvm", "--numa 1G,cpus=0-1", "--numa 1G,cpus=2-3", "--cpus 4", "--memory 2G"], []),
        (GuestConfig(kernel=Path("/boot/k"), kvm=True), ["--run /boot/k"], ["--disable-kvm"]),
        (
            GuestConfig(kernel=Path("/boot/k"), cpus=8, numa=(GuestNode("512M", "0-3"), GuestNode("512M", "4-7"))),
            ["--cpus 8", "--numa 512M,cpus=0-3", "--numa 512M,cpus=4-7"],
            ["cpus=0-1"],
        ),
    ],
    ids=["default-2-nodes-tcg", "kvm", "custom-layout"],
)
def test_vng_command_line(tmp_path: Path, config: GuestConfig, present: list[str], absent: list[str]) -> None:
    if unavailable_reason() is not None:
        pytest.skip(str(unavailable_reason()))
    line = " ".join(vng_command(config, tmp_path, "sh /x"))
    for piece in present:
        assert piece in line
    for piece in absent:
        assert piece not in line
    assert line.endswith(f"--rwdir {tmp_path} --exec sh /x")


def test_guest_that_cannot_boot_raises_with_console(tmp_path: Path) -> None:
    if unavailable_reason() is not None:
        pytest.skip(str(unavailable_reason()))
    with pytest.raises(GuestError, match="did not boot") as info:
        run_in_guest("echo never", tmp_path, timeout=60, config=GuestConfig(kernel=tmp_path / "no-such-vmlinuz"))
    assert "no-such-vmlinuz" in info.value.console

"""Prove the e2e harness against the real runtimes on this machine, using the probe hook.

What these tests establish (and docs/design/e2e.md records):

* runc and crun run prestart, createRuntime, createContainer, poststart and
  poststop hooks, in that order, with the OCI state on stdin (id, pid,
  bundle, annotations, status), and the host pid they pass at
  prestart/createRuntime is the container init whose cgroup already exists;
* a failing prestart/createRuntime hook makes ``runc run`` fail with the hook's
  stderr in runc's error, and runc still runs poststop; crun hides the hook's
  stderr unless the ``run.oci.hooks.stderr`` annotation names a file;
* podman runs ``hooks.d`` files selected by annotation and fails the
  container when such a hook fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import harness
from .harness import OciRuntime, PodmanStore, ProbeRecord

pytestmark = pytest.mark.e2e

#: annotation every test container carries (the state must echo it back)
ANNOTATIONS = {"numa-pin.io/e2e": "probe", "numa-pin.io/policy": "single-numa-node"}
#: what the container prints when its process actually ran
RAN = "container-process-ran"
#: stages the probe can serve for both runc and crun (startContainer resolves
#: the hook path inside the container rootfs, where the probe does not exist)
PROBE_STAGES = ("prestart", "createRuntime", "createContainer", "poststart", "poststop")


@dataclass(frozen=True)
class RuntimeFacts:
    """What each installed runtime was observed to do (runc 1.1.5, crun 1.8.1)."""

    create_status: str  # state.status at prestart/createRuntime
    poststart_status: str
    oci_version: str | None  # None: the runtime-spec version of the binary
    container_hook_pid: int  # state.pid at createContainer
    hook_message_visible: bool  # hook stderr appears in the runtime's error
    failure_marker: str  # text of the runtime's own error for a failed hook
    poststop_after_failed_create: bool


FACTS = {
    "runc": RuntimeFacts(
        create_status="creating",
        poststart_status="created",
        oci_version=None,
        container_hook_pid=1,
        hook_message_visible=True,
        failure_marker="error running hook",
        poststop_after_failed_create=True,
    ),
    "crun": RuntimeFacts(
        create_status="created",
        poststart_status="running",
        oci_version="1.0",
        container_hook_pid=0,
        hook_message_visible=False,
        failure_marker="error executing hook",
        poststop_after_failed_create=False,
    ),
}


def _all_stage_hooks(probe: Path, out: Path, fail: dict[str, str] | None = None) -> dict[str, list[dict]]:
    fail = fail or {}
    return {stage: [harness.probe_entry(probe, out, stage, fail=fail.get(stage))] for stage in PROBE_STAGES}


def _cpuset_dir(record: ProbeRecord) -> Path:
    assert record.pid_cgroup is not None
    return Path("/sys/fs/cgroup/cpuset") / record.pid_cgroup["cpuset"].lstrip("/")


def _wait_status(rt: OciRuntime, cid: str, wanted: str, limit: float = 20.0) -> str:
    """Poll the container state until ``wanted`` (bounded; returns the last status seen)."""
    deadline = time.monotonic() + limit
    status = ""
    while time.monotonic() < deadline:
        status = rt.state(cid)["status"]
        if status == wanted:
            break
        time.sleep(0.1)
    return status


# --------------------------------------------------------------------------- builders


APPLET_CASES = [
    ("sh", ["-c", "echo sh-ok"], "", "sh-ok"),
    ("cat", [], "cat-ok", "cat-ok"),
    ("sleep", ["0"], "", ""),
    ("grep", ["-c", "x"], "x\ny\nx\n", "2"),
    ("echo", ["echo-ok"], "", "echo-ok"),
    ("true", [], "", ""),
    ("ls", ["/bin/busybox"], "", "/bin/busybox"),
]


def test_applet_table_covers_every_applet() -> None:
    assert sorted(case[0] for case in APPLET_CASES) == sorted(harness.APPLETS)


@pytest.mark.parametrize(("applet", "args", "stdin", "expected"), APPLET_CASES, ids=[c[0] for c in APPLET_CASES])
def test_rootfs_applet_works_inside_the_rootfs(busybox_rootfs: Path, applet: str, args: list[str], stdin: str, expected: str) -> None:
    assert os.readlink(busybox_rootfs / "bin" / applet) == "busybox"
    result = subprocess.run(
        ["chroot", str(busybox_rootfs), f"/bin/{applet}", *args],
        input=stdin, capture_output=True, text=True, timeout=10, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.parametrize("name", harness.ROOTFS_DIRS, ids=list(harness.ROOTFS_DIRS))
def test_rootfs_has_mount_point_dirs(busybox_rootfs: Path, name: str) -> None:
    assert (busybox_rootfs / name).is_dir()


def test_rootfs_busybox_is_static(busybox_rootfs: Path) -> None:
    # a dynamically linked ELF has a PT_INTERP segment naming the loader
    data = (busybox_rootfs / "bin" / "busybox").read_bytes()
    assert data[:4] == b"\x7fELF"
    assert b"/lib64/ld-linux" not in data and b"/lib/ld-linux" not in data


@pytest.fixture
def full_bundle(tmp_path: Path, busybox_rootfs: Path) -> dict:
    hooks = {"prestart": [harness.hook_entry("/bin/true", ["true", "x"], env=["A=1"], timeout=5)]}
    bundle = harness.make_bundle(
        tmp_path / "b",
        args=["sleep", "5"],
        annotations=ANNOTATIONS,
        hooks=hooks,
        env=["NUMA_PIN_E2E=1"],
        cgroups_path="/numa-pin-e2e/x",
        resources={"cpu": {"cpus": "0", "mems": "0"}},
        rootfs=busybox_rootfs,
    )
    config: dict = json.loads((bundle / "config.json").read_text())
    return config


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("process", "terminal"), False),
        (("process", "args"), ["sleep", "5"]),
        (("annotations",), ANNOTATIONS),
        (("linux", "cgroupsPath"), "/numa-pin-e2e/x"),
        (("linux", "resources", "cpu"), {"cpus": "0", "mems": "0"}),
        (("hooks", "prestart"), [{"path": "/bin/true", "args": ["true", "x"], "env": ["A=1"], "timeout": 5}]),
        (("process", "user"), {"uid": 0, "gid": 0}),
    ],
    ids=["terminal", "args", "annotations", "cgroupsPath", "resources", "hooks", "root-user"],
)
def test_make_bundle_sets_field(full_bundle: dict, path: tuple[str, ...], expected: object) -> None:
    value: object = full_bundle
    for key in path:
        assert isinstance(value, dict)
        value = value[key]
    assert value == expected


def test_make_bundle_keeps_defaults_and_appends_env(full_bundle: dict, busybox_rootfs: Path) -> None:
    kinds = {ns["type"] for ns in full_bundle["linux"]["namespaces"]}
    assert {"pid", "mount", "network", "ipc", "uts"} <= kinds
    env = full_bundle["process"]["env"]
    assert env[-1] == "NUMA_PIN_E2E=1" and any(e.startswith("PATH=") for e in env)
    assert full_bundle["root"]["path"] == str(busybox_rootfs.resolve())
    assert full_bundle["linux"]["resources"]["devices"]  # default deny-all kept


def test_make_bundle_default_rootfs_is_relative(tmp_path: Path) -> None:
    bundle = harness.make_bundle(tmp_path / "b", args=["true"])
    config = json.loads((bundle / "config.json").read_text())
    assert config["root"]["path"] == "rootfs"
    assert (bundle / "rootfs" / "bin" / "busybox").is_file()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda d: harness.make_bundle(d, args=["true"], hooks={"prestartt": []}), "unknown hook stage"),
        (lambda d: harness.hook_entry("relative/hook"), "absolute"),
        (lambda d: harness.hook_entry("/bin/true", timeout=0), "timeout"),
    ],
    ids=["unknown-stage", "relative-hook-path", "zero-timeout"],
)
def test_builders_reject_bad_input(tmp_path: Path, call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(tmp_path / "b")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3:cpuset:/t1\n2:cpu,cpuacct:/t1\n0::/t1\n", {"cpuset": "/t1", "cpu": "/t1", "cpuacct": "/t1", "unified": "/t1"}),
        ("9:name=systemd:/a/b\n", {"name=systemd": "/a/b"}),
        ("0::/system.slice/x.scope\n", {"unified": "/system.slice/x.scope"}),
        ("", {}),
    ],
    ids=["hybrid", "named-v1", "pure-v2", "empty"],
)
def test_parse_proc_cgroup(text: str, expected: dict[str, str]) -> None:
    assert harness.parse_proc_cgroup(text) == expected


_MI_V1 = "30 25 0:26 / /sys/fs/cgroup/cpuset rw,relatime shared:9 - cgroup cgroup rw,cpuset\n"
_MI_V2 = "31 25 0:27 / {point} rw,relatime shared:10 - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_MI_V1 + _MI_V2.format(point="/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/unified")),
        (_MI_V1, None),
        (_MI_V2.format(point="/sys/fs/cgroup"), None),
    ],
    ids=["hybrid", "pure-v1", "pure-v2"],
)
def test_hybrid_cgroup2_mount(tmp_path: Path, text: str, expected: Path | None) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(text)
    assert harness.hybrid_cgroup2_mount(mountinfo) == expected


@pytest.mark.parametrize(
    ("proc_cgroup", "files", "expected"),
    [
        (
            "3:cpuset:/c1\n0::/c1\n",
            {"cpuset/c1/cpuset.cpus": "0-1", "cpuset/c1/cpuset.mems": "0",
             "cpuset/c1/cpuset.effective_cpus": "0-1", "cpuset/c1/cpuset.effective_mems": "0"},
            ("cpuset/c1", 1, "0-1", "0"),
        ),
        (
            "0::/kubepods/c2\n",
            {"kubepods/c2/cpuset.cpus": "2-3", "kubepods/c2/cpuset.mems": "1",
             "kubepods/c2/cpuset.cpus.effective": "2-3", "kubepods/c2/cpuset.mems.effective": "1"},
            ("kubepods/c2", 2, "2-3", "1"),
        ),
    ],
    ids=["v1-hybrid", "v2"],
)
def test_read_cpuset_follows_proc_cgroup(
    tmp_path: Path, proc_cgroup: str, files: dict[str, str], expected: tuple[str, int, str, str]
) -> None:
    proc, cgroot = tmp_path / "proc", tmp_path / "cg"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(proc_cgroup)
    (proc / "42" / "status").write_text("Name:\tx\nCpus_allowed_list:\t0-3\nMems_allowed_list:\t0-1\n")
    for rel, value in files.items():
        (cgroot / rel).parent.mkdir(parents=True, exist_ok=True)
        (cgroot / rel).write_text(value + "\n")
    got = harness.read_cpuset(42, cgroup_root=cgroot, proc_root=proc)
    rel, version, cpus, mems = expected
    assert (got.dir, got.version, got.cpus, got.mems) == (cgroot / rel, version, cpus, mems)
    assert (got.effective_cpus, got.effective_mems) == (cpus, mems)
    assert harness.proc_allowed(42, proc_root=proc) == ("0-3", "0-1")


def test_execute_kills_a_hung_command() -> None:
    with pytest.raises(harness.RuntimeTimeout, match="ran past"):
        harness.execute(["sh", "-c", "echo started; sleep 30"], timeout=1)


# --------------------------------------------------------------------------- runc + crun hooks


@pytest.fixture
def stage_run(oci_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str):
    """One ``run`` with the probe on every stage; returns (runtime, bundle, result, records by label)."""
    out = tmp_path / "probe.jsonl"
    bundle = harness.make_bundle(
        tmp_path / "bundle",
        args=["sh", "-c", f"echo {RAN}"],
        annotations=ANNOTATIONS,
        hooks=_all_stage_hooks(probe_hook, out),
        rootfs=busybox_rootfs,
    )
    result = oci_rt.run(bundle, cid)
    return oci_rt, bundle, cid, result, harness.read_probe_records(out)


def test_run_calls_every_stage_once_in_order(stage_run) -> None:
    _, _, _, result, records = stage_run
    assert result.returncode == 0, result.stderr
    assert RAN in result.stdout
    assert [r.label for r in records] == list(PROBE_STAGES)


@pytest.mark.parametrize("stage", PROBE_STAGES, ids=list(PROBE_STAGES))
def test_hook_receives_state_on_stdin(stage_run, stage: str) -> None:
    rt, bundle, cid, result, records = stage_run
    assert result.returncode == 0, result.stderr
    record = harness.records_by_label(records)[stage][0]
    facts = FACTS[rt.name]
    assert record.state is not None, record.state_raw
    assert record.state["id"] == cid
    assert record.state["bundle"] == str(bundle)
    assert record.argv[1:] == ("--out", str(bundle.parent / "probe.jsonl"), "--label", stage)
    if facts.oci_version is not None:
        assert record.state["ociVersion"] == facts.oci_version
    expected_status = {
        "prestart": facts.create_status,
        "createRuntime": facts.create_status,
        "createContainer": facts.create_status,
        "poststart": facts.poststart_status,
        "poststop": "stopped",
    }[stage]
    assert record.state["status"] == expected_status
    if stage != "poststop":
        # runc and crun both pass the config.json annotations
        assert record.state.get("annotations") == ANNOTATIONS
    if stage == "createContainer":
        assert record.pid == facts.container_hook_pid
    elif stage == "poststop":
        assert not record.pid  # runc leaves pid out, crun sends 0
    else:
        assert record.pid and record.pid > 1  # a host pid
    if stage in ("prestart", "createRuntime"):
        # the container init already sits in the container's own cgroup
        # (by poststart a short-lived process may be gone)
        assert record.pid_cgroup is not None
        assert record.pid_cgroup["cpuset"].endswith("/" + cid)
        assert record.self_cgroup["cpuset"] != record.pid_cgroup["cpuset"]
    if stage != "createContainer":
        assert record.cwd == str(bundle)  # runtime-namespace hooks run in the bundle dir


@pytest.mark.parametrize("failing", ["prestart", "createRuntime"], ids=["prestart", "createRuntime"])
def test_failing_create_hook_fails_the_container(
    oci_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str, failing: str
) -> None:
    out = tmp_path / "probe.jsonl"
    message = f"numa-pin-probe refuses {cid} at {failing}"
    bundle = harness.make_bundle(
        tmp_path / "bundle",
        args=["sh", "-c", f"echo {RAN}"],
        annotations=ANNOTATIONS,
        hooks=_all_stage_hooks(probe_hook, out, fail={failing: message}),
        rootfs=busybox_rootfs,
    )
    result = oci_rt.run(bundle, cid)
    facts = FACTS[oci_rt.name]
    labels = [r.label for r in harness.read_probe_records(out)]

    assert result.returncode != 0
    assert RAN not in result.stdout
    assert facts.failure_marker in result.stderr
    assert (message in result.stderr) is facts.hook_message_visible
    # hooks after the failing one never run; poststop depends on the runtime
    created = list(PROBE_STAGES[: PROBE_STAGES.index(failing) + 1])
    expected = created + (["poststop"] if facts.poststop_after_failed_create else [])
    assert labels == expected
    # the container is gone: no state, no cgroup
    assert oci_rt.list_ids() == []
    first = harness.read_probe_records(out)[0]
    assert not _cpuset_dir(first).exists()


def test_runc_reports_hook_stdout_and_stderr(runc_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str) -> None:
    out = tmp_path / "probe.jsonl"
    bundle = harness.make_bundle(
        tmp_path / "bundle",
        args=["true"],
        hooks={"prestart": [harness.probe_entry(probe_hook, out, "prestart", fail="no-numa-fit", exit_code=7)]},
        rootfs=busybox_rootfs,
    )
    result = runc_rt.run(bundle, cid)
    assert result.returncode != 0
    assert re.search(r"error running hook #0: .*exit status 7, stdout: probe-stdout:prestart\\n, stderr: no-numa-fit", result.stderr), result.stderr


@pytest.mark.parametrize("annotated", [True, False], ids=["hooks-stderr-annotation", "no-annotation"])
def test_crun_hook_stderr_only_reaches_annotated_file(
    crun_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str, annotated: bool
) -> None:
    out = tmp_path / "probe.jsonl"
    sink = tmp_path / "hook-stderr.log"
    annotations = {"run.oci.hooks.stderr": str(sink)} if annotated else {}
    bundle = harness.make_bundle(
        tmp_path / "bundle",
        args=["true"],
        annotations=annotations,
        hooks={"prestart": [harness.probe_entry(probe_hook, out, "prestart", fail=f"crun-refusal-{cid}")]},
        rootfs=busybox_rootfs,
    )
    result = crun_rt.run(bundle, cid)
    assert result.returncode != 0
    assert f"crun-refusal-{cid}" not in result.stderr
    assert (sink.exists() and f"crun-refusal-{cid}" in sink.read_text()) is annotated


def test_hook_timeout_is_enforced(oci_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str) -> None:
    out = tmp_path / "probe.jsonl"
    bundle = harness.make_bundle(
        tmp_path / "bundle",
        args=["sh", "-c", f"echo {RAN}"],
        hooks={"createRuntime": [harness.probe_entry(probe_hook, out, "slow", sleep=30, timeout=1)]},
        rootfs=busybox_rootfs,
    )
    result = oci_rt.run(bundle, cid, timeout=25)
    assert result.returncode != 0
    assert RAN not in result.stdout
    assert "timeout" in result.stderr.lower(), result.stderr


def test_lifecycle_hook_pid_is_the_container_init(
    oci_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str
) -> None:
    out = tmp_path / "probe.jsonl"
    bundle = harness.make_bundle(
        tmp_path / "bundle",
        args=["sleep", "1000"],
        annotations=ANNOTATIONS,
        hooks={
            "createRuntime": [harness.probe_entry(probe_hook, out, "createRuntime")],
            "poststop": [harness.probe_entry(probe_hook, out, "poststop")],
        },
        rootfs=busybox_rootfs,
    )
    created = oci_rt.create(bundle, cid)
    assert created.returncode == 0, created.stderr
    state = oci_rt.state(cid)
    assert state["status"] == "created"
    (hook,) = harness.read_probe_records(out)
    # independent oracle: the runtime's own state and the kernel's /proc
    assert hook.pid == state["pid"]
    assert hook.pid_cgroup is not None
    assert harness.proc_cgroups(state["pid"])["cpuset"] == hook.pid_cgroup["cpuset"]
    cpuset = harness.read_cpuset(state["pid"])
    assert cpuset.dir == _cpuset_dir(hook) and cpuset.dir.is_dir()
    assert cpuset.cpus and cpuset.mems  # the runtime filled the v1 cpuset before the hook ran

    oci_rt.start(cid)
    assert oci_rt.state(cid)["status"] == "running"
    assert harness.proc_allowed(state["pid"])[0] == cpuset.effective_cpus

    oci_rt.kill(cid, "KILL")
    assert _wait_status(oci_rt, cid, "stopped") == "stopped"
    oci_rt.delete(cid)
    assert [r.label for r in harness.read_probe_records(out)] == ["createRuntime", "poststop"]
    assert oci_rt.list_ids() == []
    assert not cpuset.dir.exists()


def test_running_container_cleans_up_on_error(runc_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, cid: str) -> None:
    bundle = harness.make_bundle(tmp_path / "bundle", args=["sleep", "1000"], rootfs=busybox_rootfs)
    with pytest.raises(KeyError), harness.running_container(runc_rt, bundle, cid) as state:
        assert runc_rt.state(cid)["status"] == "running"
        assert state["pid"] > 1
        raise KeyError("test body failed")
    assert runc_rt.list_ids() == []


def test_cleanup_force_deletes_leftovers(runc_rt: OciRuntime, tmp_path: Path, busybox_rootfs: Path, cid: str) -> None:
    bundle = harness.make_bundle(tmp_path / "bundle", args=["sleep", "1000"], rootfs=busybox_rootfs)
    assert runc_rt.run(bundle, cid, detach=True).returncode == 0
    assert runc_rt.cleanup() == [cid]
    assert runc_rt.list_ids() == []


# --------------------------------------------------------------------------- podman + hooks.d

SELECT = {"^numa-pin\\.io/e2e$": "^probe$"}


def _podman_hooks(folder: Path, probe: Path, out: Path, stage: str, fail: str | None = None) -> Path:
    harness.write_hooks_d(
        folder, "50-probe", hook=harness.probe_entry(probe, out, stage, fail=fail),
        stages=[stage], when={"annotations": SELECT},
    )
    harness.write_hooks_d(
        folder, "60-probe-poststop", hook=harness.probe_entry(probe, out, "poststop"),
        stages=["poststop"], when={"annotations": SELECT},
    )
    return folder


@pytest.mark.parametrize("stage", ["prestart", "createRuntime"], ids=["prestart", "createRuntime"])
def test_podman_runs_selected_hooks_d_file(
    podman_runc: PodmanStore, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str, stage: str
) -> None:
    out = tmp_path / "probe.jsonl"
    hooks = _podman_hooks(tmp_path / "hooks.d", probe_hook, out, stage)
    result = harness.run_podman(
        busybox_rootfs, args=["sh", "-c", f"echo {RAN}"], store=podman_runc,
        annotations=ANNOTATIONS, hooks_dir=hooks, name=cid,
    )
    assert result.returncode == 0, result.stderr
    assert RAN in result.stdout
    records = harness.read_probe_records(out)
    assert [r.label for r in records] == [stage, "poststop"]
    create, stop = records
    assert create.state is not None and stop.state is not None
    assert create.state["status"] == "creating"
    assert create.state["annotations"]["numa-pin.io/policy"] == "single-numa-node"
    assert create.state["annotations"]["io.container.manager"] == "libpod"
    assert create.pid_cgroup is not None and "/libpod-" in create.pid_cgroup["cpuset"]
    assert stop.state["status"] == "stopped" and stop.state["id"] == create.state["id"]


def test_podman_skips_hooks_d_file_that_does_not_match(
    podman_runc: PodmanStore, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str
) -> None:
    out = tmp_path / "probe.jsonl"
    hooks = _podman_hooks(tmp_path / "hooks.d", probe_hook, out, "prestart")
    result = harness.run_podman(
        busybox_rootfs, args=["sh", "-c", f"echo {RAN}"], store=podman_runc,
        annotations={"numa-pin.io/e2e": "probe-not"}, hooks_dir=hooks, name=cid,
    )
    assert result.returncode == 0, result.stderr
    assert RAN in result.stdout
    assert harness.read_probe_records(out) == []


@pytest.mark.parametrize("runtime", ["runc", "crun"], ids=["runc", "crun"])
def test_podman_fails_when_hook_fails(
    request: pytest.FixtureRequest, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str, runtime: str
) -> None:
    store: PodmanStore = request.getfixturevalue(f"podman_{runtime}")
    out = tmp_path / "probe.jsonl"
    message = f"podman-refusal-{cid}"
    hooks = _podman_hooks(tmp_path / "hooks.d", probe_hook, out, "prestart", fail=message)
    result = harness.run_podman(
        busybox_rootfs, args=["sh", "-c", f"echo {RAN}"], store=store,
        annotations=ANNOTATIONS, hooks_dir=hooks, name=cid,
    )
    facts = FACTS[runtime]
    assert result.returncode != 0
    assert RAN not in result.stdout
    assert "Error: OCI runtime error" in result.stderr
    assert facts.failure_marker in result.stderr
    assert (message in result.stderr) is facts.hook_message_visible
    # podman runs poststop itself, and only for containers that started
    assert [r.label for r in harness.read_probe_records(out)] == ["prestart"]


def test_podman_with_crun_runs_hooks(
    podman_crun: PodmanStore, tmp_path: Path, busybox_rootfs: Path, probe_hook: Path, cid: str
) -> None:
    out = tmp_path / "probe.jsonl"
    hooks = _podman_hooks(tmp_path / "hooks.d", probe_hook, out, "createRuntime")
    result = harness.run_podman(
        busybox_rootfs, args=["sh", "-c", f"echo {RAN}"], store=podman_crun,
        annotations=ANNOTATIONS, hooks_dir=hooks, name=cid,
    )
    assert result.returncode == 0, result.stderr
    assert RAN in result.stdout
    records = harness.read_probe_records(out)
    assert [r.label for r in records] == ["createRuntime", "poststop"]
    assert records[0].state is not None and records[0].state["status"] == FACTS["crun"].create_status

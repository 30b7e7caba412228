"""numa-pin-hook driven by real runtimes on this machine (cgroup v1 hybrid, 2 CPUs, 1 node).

The node config reserves one CPU (the default ``num_reserved_cpus: 1``), so CPU 0 is the
reserved part of the shared pool and CPU 1 is the only CPU an exclusive grant can take. The
oracles are the kernel's own views: the container cgroup's ``cpuset.cpus`` and the
container process's ``Cpus_allowed_list``, plus what the runtime prints.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from numa_pin.errors import EXIT_ERROR
from numa_pin.reporting.report import reason_path

from . import harness

pytestmark = pytest.mark.e2e

ONE_CPU = {"numa-pin.io/cpus": "1"}


def _bundle(tmp_path: Path, name: str, node, rootfs: Path, annotations=None, args=("sleep", "1000")) -> Path:
    return harness.make_bundle(tmp_path / name, args=list(args), annotations=annotations or {},
                               hooks=node.hooks, rootfs=rootfs)


def _cpus_allowed(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list in {output!r}")


def test_runc_exclusive_cpu_then_release(runc_rt, node, busybox_rootfs, tmp_path, cid):
    bundle = _bundle(tmp_path, "a", node, busybox_rootfs, ONE_CPU)
    with harness.running_container(runc_rt, bundle, cid) as st:
        cs = harness.read_cpuset(st["pid"])
        assert (cs.version, cs.cpus) == (1, "1")
        assert harness.proc_allowed(st["pid"])[0] == "1"
        grant = node.grants()[cid]
        assert grant.cpus == frozenset({1}) and grant.kind == "exclusive" and grant.pid == st["pid"]
    assert cid not in node.grants(), "poststop must release the grant"


def test_runc_first_hook_starts_an_agent_that_serves_the_next(runc_rt, node, busybox_rootfs, tmp_path, cid):
    """As installed, with no agent running: the first container's hook admits in-process and
    starts an agent, detached (runc returns: the agent holds none of the hook's pipes), and the
    next containers' hooks are served by it, with the same results."""
    import json
    import os
    import time

    import psutil

    sock, log = tmp_path / "agent" / "agent.sock", tmp_path / "agent.log"
    extra = [f"NUMA_PIN_AGENT_SOCKET={sock}", f"NUMA_PIN_AGENT_LOG={log}"]
    hooks = {stage: [{**entry, "env": [*entry["env"], *extra]} for entry in entries]
             for stage, entries in node.hooks.items()}
    status = ("cat", "/proc/self/status")
    try:
        for i in range(3):
            bundle = harness.make_bundle(tmp_path / f"b{i}", args=list(status), annotations=ONE_CPU, hooks=hooks,
                                         rootfs=busybox_rootfs)
            res = runc_rt.run(bundle, f"{cid}-{i}")
            assert res.returncode == 0, res.stderr
            assert _cpus_allowed(res.stdout) == "1" and node.grants() == {}
            if i == 0:
                deadline = time.monotonic() + 60
                while not sock.exists():
                    assert time.monotonic() < deadline, "no agent came up after the first container"
                    time.sleep(0.05)
        served = [json.loads(line) for line in log.read_text().splitlines()]
        # containers 2 and 3: prestart, createRuntime and poststop each, all run by the agent; of
        # the first, the hooks that came after the agent was up (never its prestart, which started it)
        assert all(r["outcome"] == "served" and r["rc"] == 0 for r in served), served
        assert 6 <= len(served) <= 8, served
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if str(sock) in (proc.info["cmdline"] or []) and os.getpid() != proc.pid:
                proc.kill()


def test_runc_one_shot_container_sees_its_cpu(runc_rt, node, busybox_rootfs, tmp_path, cid):
    bundle = _bundle(tmp_path, "a", node, busybox_rootfs, ONE_CPU, args=("cat", "/proc/self/status"))
    res = runc_rt.run(bundle, cid)
    assert res.returncode == 0, res.stderr
    assert _cpus_allowed(res.stdout) == "1"
    assert node.grants() == {}


def test_runc_rejects_when_no_exclusive_cpu_is_left(runc_rt, node, busybox_rootfs, tmp_path, cid):
    first = _bundle(tmp_path, "a", node, busybox_rootfs, ONE_CPU)
    second_id = harness.new_container_id()
    second = _bundle(tmp_path, "b", node, busybox_rootfs, ONE_CPU, args=("true",))
    with harness.running_container(runc_rt, first, cid):
        res = runc_rt.run(second, second_id)
        assert res.returncode != 0
        assert f"numa-pin: rejected {second_id}: TopologyAffinityError:" in res.stderr
        assert "cpu 1 requested, free per node: 0=0" in res.stderr
        assert set(node.grants()) == {cid}, "a rejected container must leave nothing allocated"
        assert second_id not in runc_rt.list_ids()
        explained = node.cli("explain", second_id)
        assert f"rejected {second_id}" in explained.stdout
    # released on exit: the CPU is free for the next container
    third_id = harness.new_container_id()
    with harness.running_container(runc_rt, _bundle(tmp_path, "c", node, busybox_rootfs, ONE_CPU), third_id) as st:
        assert harness.read_cpuset(st["pid"]).cpus == "1"


def test_runc_shared_pool_shrinks_and_grows(runc_rt, node, busybox_rootfs, tmp_path, cid):
    shared = _bundle(tmp_path, "shared", node, busybox_rootfs)
    with harness.running_container(runc_rt, shared, cid) as sst:
        assert harness.read_cpuset(sst["pid"]).cpus == "0-1"
        assert node.grants()[cid].kind == "shared"
        excl_id = harness.new_container_id()
        with harness.running_container(runc_rt, _bundle(tmp_path, "x", node, busybox_rootfs, ONE_CPU), excl_id):
            assert harness.read_cpuset(sst["pid"]).cpus == "0", "shared containers leave exclusive CPUs"
            assert harness.proc_allowed(sst["pid"])[0] == "0"
        assert harness.read_cpuset(sst["pid"]).cpus == "0-1", "and get them back on release"


def test_runc_prestart_and_create_runtime_both_run_idempotently(runc_rt, node, busybox_rootfs, tmp_path, cid):
    bundle = _bundle(tmp_path, "a", node, busybox_rootfs, ONE_CPU)
    spec = json.loads((bundle / "config.json").read_text())
    assert set(spec["hooks"]) == {"prestart", "createRuntime", "poststop"}
    with harness.running_container(runc_rt, bundle, cid) as st:
        assert harness.read_cpuset(st["pid"]).cpus == "1"
        assert list(node.grants()) == [cid]


def test_runc_malformed_annotation_is_one_clear_line(runc_rt, node, busybox_rootfs, tmp_path, cid):
    bundle = _bundle(tmp_path, "a", node, busybox_rootfs, {"numa-pin.io/cpus": "-2"}, args=("true",))
    res = runc_rt.run(bundle, cid)
    assert res.returncode != 0
    assert "numa-pin.io/cpus" in res.stderr and "Traceback" not in res.stderr
    assert node.grants() == {}


def test_crun_admits_and_releases(crun_rt, node, busybox_rootfs, tmp_path, cid):
    bundle = _bundle(tmp_path, "a", node, busybox_rootfs, ONE_CPU, args=("cat", "/proc/self/status"))
    res = crun_rt.run(bundle, cid)
    assert res.returncode == 0, res.stderr
    assert _cpus_allowed(res.stdout) == "1"
    assert node.grants() == {}, "poststop released the grant"


def test_crun_rejection_is_recorded_for_explain(crun_rt, node, busybox_rootfs, tmp_path, cid):
    first = _bundle(tmp_path, "a", node, busybox_rootfs, ONE_CPU)
    second_id = harness.new_container_id()
    with harness.running_container(crun_rt, first, cid) as st:
        assert harness.read_cpuset(st["pid"]).cpus == "1"
        res = crun_rt.run(_bundle(tmp_path, "b", node, busybox_rootfs, ONE_CPU, args=("true",)), second_id)
        assert res.returncode != 0
        assert set(node.grants()) == {cid}
        reason = json.loads(Path(reason_path(str(node.state), second_id)).read_text())
        assert reason["line"].startswith(f"numa-pin: rejected {second_id}: TopologyAffinityError:")
    assert node.grants() == {}


def test_podman_cpus_and_memory_alone_stay_shared(podman_runc, node, busybox_rootfs, tmp_path):
    """``podman run --cpus 1 --memory 100m`` is no Kubernetes Guaranteed pod: it stays in the
    shared pool, and a second identical run starts while the first one runs."""
    hooks_dir = _hooks_dir(node, tmp_path / "hooks.d", SHIPPED)
    limits = ["--cpus", "1", "--memory", "100m"]
    first = harness.run_podman(busybox_rootfs, args=["sleep", "1000"], store=podman_runc, hooks_dir=hooks_dir,
                               name=harness.new_container_id(), extra=["-d", *limits])
    assert first.returncode == 0, first.stderr
    grants = node.grants()
    assert len(grants) == 1 and next(iter(grants.values())).kind == "shared"
    second = harness.run_podman(busybox_rootfs, args=["cat", "/proc/self/status"], store=podman_runc,
                                hooks_dir=hooks_dir, name=harness.new_container_id(), extra=limits)
    assert second.returncode == 0, second.stderr
    assert _cpus_allowed(second.stdout) == "0-1"


def test_podman_hooks_dir_admits_and_releases(podman_runc, node, busybox_rootfs, tmp_path):
    hooks_dir = _hooks_dir(node, tmp_path / "hooks.d", SHIPPED)
    res = harness.run_podman(busybox_rootfs, args=["cat", "/proc/self/status"], store=podman_runc,
                             annotations=ONE_CPU, hooks_dir=hooks_dir, name=harness.new_container_id())
    assert res.returncode == 0, res.stderr
    assert _cpus_allowed(res.stdout) == "1"
    assert node.grants() == {}, "podman ran the poststop hook, which released the grant"


def _forged_hook(node, bundle: Path, cid: str, pid: int) -> subprocess.CompletedProcess[str]:
    """numa-pin-hook handed a state whose pid is not the container's (as a buggy or hostile caller could)."""
    state = json.dumps({"ociVersion": "1.0.2", "id": cid, "status": "created", "pid": pid, "bundle": str(bundle)})
    return subprocess.run([str(node.path), "--config", str(node.cfg), "prestart"], input=state, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "NUMA_PIN_NO_AGENT": "1"})


def test_hook_refuses_another_runc_containers_pid(runc_rt, node, busybox_rootfs, tmp_path, cid):
    """The pid of a real runc container (no hooks) handed in another container's state: refused,
    and the real container's cpuset is left as runc made it."""
    victim = harness.make_bundle(tmp_path / "victim", args=["sleep", "1000"], rootfs=busybox_rootfs)
    forged = _bundle(tmp_path, "forged", node, busybox_rootfs, ONE_CPU)
    with harness.running_container(runc_rt, victim, cid) as st:
        before = harness.read_cpuset(st["pid"])
        group = harness.proc_cgroups(st["pid"])["cpuset"]
        res = _forged_hook(node, forged, cid + "-forged", st["pid"])
        assert res.returncode == EXIT_ERROR  # an error, not a rejection: nothing was decided
        assert res.stderr.strip() == (
            f"numa-pin: error {cid}-forged: EnforcementError: /proc/{st['pid']}/cgroup: pid {st['pid']} is in cgroup "
            f"{group}, which is not container {cid}-forged's (a leaf cgroup named after container {cid}-forged); "
            "refusing to pin another process")
        assert harness.read_cpuset(st["pid"]) == before
    assert node.grants() == {}


def test_hook_refuses_a_host_process(node, busybox_rootfs, tmp_path):
    """A host process (here in the cpuset hierarchy's root on this cgroup-v1 machine) is never
    pinned, and the hierarchy root's cpuset is never written."""
    forged = _bundle(tmp_path, "forged", node, busybox_rootfs, ONE_CPU)
    host = subprocess.Popen(["sleep", "100"])
    try:
        before = harness.read_cpuset(host.pid)
        group = harness.proc_cgroups(host.pid)["cpuset"]
        res = _forged_hook(node, forged, "np-e2e-host", host.pid)
        assert res.returncode == EXIT_ERROR
        why = ("is in the root cgroup; numa-pin never writes the root of a hierarchy" if group == "/"
               else f"is in cgroup {group}, which is not container np-e2e-host's")
        assert f"EnforcementError: /proc/{host.pid}/cgroup: pid {host.pid} {why}" in res.stderr, res.stderr
        assert harness.read_cpuset(host.pid) == before
    finally:
        host.kill()
        host.wait()
    assert node.grants() == {}


def _pinned_bundle(tmp_path: Path, name: str, node, rootfs: Path, cpus: str, annotations=None) -> Path:
    """A bundle whose user set ``linux.resources.cpu.cpus`` (podman/docker ``--cpuset-cpus``)."""
    return harness.make_bundle(tmp_path / name, args=["cat", "/proc/self/status"], annotations=annotations or {},
                               hooks=node.hooks, rootfs=rootfs, resources={"cpu": {"cpus": cpus}})


def test_runc_shared_container_keeps_its_own_cpuset(runc_rt, node, busybox_rootfs, tmp_path, cid):
    """A shared container pinned to CPU 1 is not widened to the shared pool (0-1)."""
    res = runc_rt.run(_pinned_bundle(tmp_path, "a", node, busybox_rootfs, "1"), cid)
    assert res.returncode == 0, res.stderr
    assert _cpus_allowed(res.stdout) == "1"


def test_runc_exclusive_request_outside_the_users_cpuset_is_rejected(runc_rt, node, busybox_rootfs, tmp_path, cid):
    """cpuset 0 with one exclusive CPU asked: CPU 0 is reserved, so nothing inside the set is free;
    the container is rejected instead of being moved to CPU 1."""
    res = runc_rt.run(_pinned_bundle(tmp_path, "a", node, busybox_rootfs, "0", ONE_CPU), cid)
    assert res.returncode != 0
    assert (f"numa-pin: rejected {cid}: TopologyAffinityError: restricted policy: resources cannot be aligned on "
            "their preferred NUMA nodes (cpu 1 requested, free per node: 0=0; only inside the container's cpuset 0 "
            "(linux.resources.cpu.cpus))") in res.stderr


# ---------------------------------------------------------------- podman precreate (issue 13)
def _hooks_dir(node, folder: Path, files: tuple[str, ...]) -> Path:
    """The packaged hooks.d ``files``, pointed at this checkout's hook and the test config."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        (packaged,) = [p for p in (place / name for place in PACKAGED) if p.is_file()]
        doc = json.loads(packaged.read_text())
        stage = doc["hook"]["args"][-1]
        doc["hook"]["path"] = str(node.path)
        doc["hook"]["args"] = ["numa-pin-hook", "--config", str(node.cfg), stage]
        doc["hook"]["env"] = doc["hook"]["env"] + [f"NUMA_PIN_CACHE_DIR={node.state.parent / 'cache'}"]
        (folder / name).write_text(json.dumps(doc))
    return folder


PRECREATE_ONLY = ("numa-pin-precreate.json", "numa-pin-release.json")
#: the hooks directories of the package: the files CRI-O and podman share, and podman's own
PACKAGED = (Path(__file__).resolve().parents[2] / "packaging" / "hooks.d",
            Path(__file__).resolve().parents[2] / "packaging" / "podman" / "hooks.d")
#: every hooks.d file the package ships
SHIPPED = tuple(sorted(p.name for folder in PACKAGED for p in folder.glob("*.json")))


def _oci_config(store, name: str) -> dict:
    """The config.json podman handed the runtime (``podman inspect``'s OCIConfigPath)."""
    res = harness.execute(store.argv("inspect", "--format", "{{.OCIConfigPath}}", name), timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(Path(res.stdout.strip()).read_text())


def test_podman_precreate_writes_the_cpu_into_the_config_runc_gets(podman_runc, node, busybox_rootfs, tmp_path):
    """Only the precreate and poststop files: the CPU can only come from the config podman hands runc."""
    hooks = _hooks_dir(node, tmp_path / "hooks.d", PRECREATE_ONLY)
    for _ in range(2):  # released at exit, granted again to the next container
        name = harness.new_container_id()
        res = harness.run_podman(busybox_rootfs, args=["cat", "/proc/self/status"], store=podman_runc,
                                 annotations=ONE_CPU, hooks_dir=hooks, name=name, remove=False)
        assert res.returncode == 0, res.stderr
        assert _cpus_allowed(res.stdout) == "1"
        config = _oci_config(podman_runc, name)
        assert config["linux"]["resources"]["cpu"]["cpus"] == "1"
        assert config["linux"]["resources"]["cpu"]["mems"] == "0"
        harness.execute(podman_runc.argv("rm", name), timeout=60)
        assert node.grants() == {}, "poststop released the CPU"


def test_podman_precreate_rejection_stops_the_container_and_keeps_nothing(podman_runc, node, busybox_rootfs,
                                                                            tmp_path):
    hooks = _hooks_dir(node, tmp_path / "hooks.d", PRECREATE_ONLY)
    holder = harness.new_container_id()
    res = harness.run_podman(busybox_rootfs, args=["sleep", "1000"], store=podman_runc, annotations=ONE_CPU,
                             hooks_dir=hooks, name=holder, extra=["-d"])
    assert res.returncode == 0, res.stderr
    try:
        held = node.grants()
        assert [g.cpus for g in held.values()] == [frozenset({1})]
        second = harness.new_container_id()
        res = harness.run_podman(busybox_rootfs, args=["true"], store=podman_runc, annotations=ONE_CPU,
                                 hooks_dir=hooks, name=second)
        assert res.returncode != 0
        assert "precreate" in res.stderr or "hook" in res.stderr, res.stderr
        assert node.grants() == held, "the refused container left nothing in the ledger"
        (reason,) = [json.loads(p.read_text()) for p in (node.state / "reasons").glob("*.json")]
        assert reason["line"].startswith("numa-pin: rejected ") and "TopologyAffinityError" in reason["line"]
    finally:
        harness.execute(podman_runc.argv("rm", "--force", holder), timeout=60)
    assert node.grants() == {}


def test_podman_reads_the_precreate_hook_through_the_packaged_drop_in(podman_runc, node, busybox_rootfs, tmp_path):
    """The deb's containers.conf.d drop-in (here as podman's only containers.conf, its directories
    under ``tmp_path``) and no ``--hooks-dir``: podman runs precreate from numa-pin's own
    directory and prestart and poststop from its default one, which the drop-in keeps."""
    drop_in = PACKAGED[1].parent / "containers.conf.d" / "numa-pin.conf"
    default = _hooks_dir(node, tmp_path / "usr/share/containers/oci/hooks.d", ("numa-pin.json", "numa-pin-release.json"))
    own = _hooks_dir(node, tmp_path / "usr/share/numa-pin/podman/hooks.d", ("numa-pin-precreate.json",))
    conf = tmp_path / "containers.conf"
    conf.write_text(drop_in.read_text().replace('"/usr/share/', f'"{tmp_path}/usr/share/'))
    assert f'"{default}"' in conf.read_text() and f'"{own}"' in conf.read_text()
    name = harness.new_container_id()
    res = harness.run_podman(busybox_rootfs, args=["sleep", "1000"], store=podman_runc, annotations=ONE_CPU,
                             name=name, extra=["-d"], env={**os.environ, "CONTAINERS_CONF": str(conf)})
    assert res.returncode == 0, res.stderr
    try:
        assert _oci_config(podman_runc, name)["linux"]["resources"]["cpu"]["cpus"] == "1", "precreate ran"
        (grant,) = node.grants().values()
        assert grant.cpus == frozenset({1}) and grant.pid is not None, "prestart ran"
    finally:
        harness.execute(podman_runc.argv("rm", "--force", name), timeout=60)
    assert node.grants() == {}, "poststop ran"


def test_podman_all_hooks_precreate_then_prestart_binds_the_pid(podman_runc, node, busybox_rootfs, tmp_path):
    """precreate decides, prestart binds the grant to the container's pid and cgroup, poststop releases."""
    hooks = _hooks_dir(node, tmp_path / "hooks.d", ("numa-pin-precreate.json", "numa-pin.json",
                                                   "numa-pin-release.json"))
    name = harness.new_container_id()
    res = harness.run_podman(busybox_rootfs, args=["sleep", "1000"], store=podman_runc, annotations=ONE_CPU,
                             hooks_dir=hooks, name=name, extra=["-d"])
    assert res.returncode == 0, res.stderr
    try:
        (grant,) = node.grants().values()
        assert grant.cpus == frozenset({1}) and grant.pid is not None and grant.cgroup is not None
        status = Path(f"/proc/{grant.pid}/status").read_text()
        assert _cpus_allowed(status) == "1"
    finally:
        harness.execute(podman_runc.argv("rm", "--force", name), timeout=60)
    assert node.grants() == {}

"""The container image, built for real and run under podman (``make image-test``; root, minutes).

``packaging/image/build-image.sh`` builds ``localhost/numa-pin:<version>`` once for the module;
then the image runs with this machine's sysfs and /proc mounted read-only where the DaemonSet
mounts them and the shipped ConfigMap's config. The oracle for its decision is this checkout
run on the host with the host's roots: the image must decide the same. The DaemonSet's start
(``nsenter`` into the host's cgroup namespace) runs with its capabilities, and without each of
the two it needs to start, against the failures ``docs/kubernetes-deploy.md`` lists. podman runs with runc
and the ulimits this kind of host needs (``tests/e2e/harness.py``: crun refuses a cgroup v1
hybrid host, and the caller may lack CAP_SYS_RESOURCE).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nri.fake_runtime import FakeRuntime, container, pod
from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.nri import messages as nri_messages
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
IMAGE = f"localhost/numa-pin:{VERSION}"
RUNC = ("podman", "--runtime", "runc")
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
PODMAN = (*RUNC, "run", "--rm", "--network", "none", *ULIMITS)
REQUEST = ("--cpus", "1", "--memory", "64Mi")
GI = 1 << 30


@pytest.fixture(scope="module")
def image() -> str:
    for tool in ("buildah", "podman", "debootstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (make image-test installs it)")
    start = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "packaging" / "image" / "build-image.sh")],
                          capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    size = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", IMAGE],
                          capture_output=True, text=True, check=True).stdout.strip()
    print(f"\nimage {IMAGE}: built in {time.monotonic() - start:.0f} s, {int(size) / 1e6:.0f} MB")
    return IMAGE


def _configmap(tmp_path: Path) -> Path:
    """The shipped ConfigMap's config.yaml (its state dir is the container's own: nothing mounts it)."""
    docs = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "numa-pin.yaml").read_text(encoding="utf-8"))
    text = next(d for d in docs if d and d["kind"] == "ConfigMap")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _in_image(image: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    mounts = ("-v", "/sys:/host/sys:ro", "-v", "/proc:/host/proc:ro",
              "-v", f"{_configmap(tmp_path)}:/etc/numa-pin/config.yaml:ro")
    return subprocess.run([*PODMAN, *mounts, "--entrypoint", argv[0], image, *argv[1:]],
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_image_runs_numa_pin_of_this_version(image: str, tmp_path: Path) -> None:
    done = _in_image(image, tmp_path, "numa-pin", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"numa-pin {VERSION}"


def test_the_entry_point_is_the_nri_plugin_the_daemonset_runs(image: str) -> None:
    entry = json.loads(subprocess.run(["podman", "image", "inspect", "--format", "{{json .Config.Entrypoint}}",
                                       image], capture_output=True, text=True, check=True).stdout)
    assert entry == ["numa-pin", "serve", "--nri"]
    docs = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "numa-pin.yaml").read_text(encoding="utf-8"))
    daemonset = next(d for d in docs if d and d["kind"] == "DaemonSet")
    command = daemonset["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--") + 1:] == entry


def test_the_image_decides_as_the_checkout_does_on_this_host(image: str, tmp_path: Path) -> None:
    inside = _in_image(image, tmp_path, "numa-pin", "plan", "--via", "nri", "--json", *REQUEST)
    assert inside.returncode == 0, inside.stderr
    host_config = tmp_path / "host.yaml"
    host_config.write_text(f"syslog: false\nstate_dir: {tmp_path / 'state'}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    outside = subprocess.run([sys.executable, "-m", "numa_pin.cli.main", "plan", "--config", str(host_config),
                              "--via", "nri", "--json", *REQUEST], capture_output=True, text=True, env=env,
                             timeout=300, check=False)
    assert outside.returncode == 0, outside.stderr
    assert json.loads(inside.stdout) == json.loads(outside.stdout)


def test_the_image_refuses_what_nri_cannot_carry(image: str, tmp_path: Path) -> None:
    done = _in_image(image, tmp_path, "numa-pin", "plan", "--via", "nri", "--cpus", "1",
                     "--memory-policy", "interleave")
    assert done.returncode == 1
    assert "PathLimitError" in done.stdout


@pytest.mark.parametrize("argv", [
    ("python3", "-c", "from numa_pin.nri.messages import load; load()"),
    ("nsenter", "--version"),
    ("systemctl", "--version"),
], ids=["nri-messages-on-debian-protobuf", "nsenter", "systemctl"])
def test_what_the_daemonset_needs_is_in_the_image(image: str, tmp_path: Path, argv: tuple[str, ...]) -> None:
    done = _in_image(image, tmp_path, *argv)
    assert done.returncode == 0, done.stderr


def _daemonset_container() -> dict[str, object]:
    docs = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "numa-pin.yaml").read_text(encoding="utf-8"))
    daemonset = next(d for d in docs if d and d["kind"] == "DaemonSet")
    container: dict[str, object] = daemonset["spec"]["template"]["spec"]["containers"][0]
    return container


def _enter_cgroupns(image: str, caps: list[str], target: int, *argv: str,
                    podman: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """The DaemonSet's start (``nsenter --cgroup=<proc>/<pid>/ns/cgroup --``) in a private cgroup
    namespace, host pids, /proc mounted at /host/proc, every capability dropped but ``caps``."""
    return subprocess.run([*PODMAN, *podman, "--pid=host", "--cgroupns=private", "-v", "/proc:/host/proc",
                           "--cap-drop=all", *(f"--cap-add={c}" for c in caps), "--entrypoint", "nsenter",
                           image, f"--cgroup=/host/proc/{target}/ns/cgroup", "--", *argv],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def host_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this machine's cgroup namespace that holds every capability this test does.

    The DaemonSet enters the namespace of the host's pid 1; on a build machine that is itself a
    sandbox even root may not open pid 1's namespaces, so the test enters this one's instead."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_with_its_capabilities_the_plugin_reads_cgroups_as_the_host_writes_them(image: str,
                                                                               host_process: subprocess.Popen[bytes],
                                                                               tmp_path: Path) -> None:
    caps = _daemonset_container()["securityContext"]["capabilities"]["add"]  # type: ignore[index]
    cidfile = tmp_path / "cid"
    done = _enter_cgroupns(image, caps, host_process.pid, "cat", "/proc/self/cgroup",
                           podman=("--cidfile", str(cidfile)))
    assert done.returncode == 0, done.stderr
    unified = next(line for line in done.stdout.splitlines() if line.startswith("0::"))
    assert cidfile.read_text().strip() in unified and ".." not in unified


def test_in_its_own_cgroup_namespace_other_processes_cgroups_read_as_dot_dot(image: str,
                                                                             host_process: subprocess.Popen[bytes],
                                                                             ) -> None:
    """Why the DaemonSet enters the host's cgroup namespace at all."""
    done = subprocess.run([*PODMAN, "--pid=host", "--cgroupns=private", "-v", "/proc:/host/proc", "--cap-drop=all",
                           "--entrypoint", "cat", image, f"/host/proc/{host_process.pid}/cgroup"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    unified = next(line for line in done.stdout.splitlines() if line.startswith("0::"))
    assert unified.startswith("0::/..")


@pytest.mark.parametrize(("missing", "message"), [
    ("SYS_ADMIN", "reassociate to namespace 'ns/cgroup' failed: Operation not permitted"),
    ("SYS_PTRACE", "Permission denied"),
], ids=["without-sys-admin", "without-sys-ptrace"])
def test_without_a_start_up_capability_the_pod_fails_as_documented(image: str, host_process: subprocess.Popen[bytes],
                                                                   missing: str, message: str) -> None:
    caps = [c for c in _daemonset_container()["securityContext"]["capabilities"]["add"]  # type: ignore[index]
            if c != missing]
    done = _enter_cgroupns(image, caps, host_process.pid, "true")
    assert done.returncode != 0
    assert message in done.stderr
    row = next(line for line in (REPO / "docs" / "kubernetes-deploy.md").read_text(encoding="utf-8").splitlines()
               if line.startswith(f"| `CAP_{missing}` |"))
    assert message.split(": ")[-1] in row


def _listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(120)
    return server


def _accept(server: socket.socket, m: nri_messages.Messages) -> tuple[socket.socket, FakeRuntime]:
    conn, _ = server.accept()
    conn.settimeout(120)
    runtime = FakeRuntime(conn, m)
    runtime.accept_registration()
    runtime.configure(timeout_ms=60_000)
    return conn, runtime


def test_the_daemonsets_plugin_in_the_image_keeps_its_grants_across_an_upgrade(
        image: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The image runs as the DaemonSet's container (its args, capabilities, mounts at the
    ConfigMap's roots) on a fake node, against a runtime speaking NRI's frames on the mounted
    socket; a second pod (the upgrade) on the same state dir answers the same CPUs for the
    container the first admitted. Started with the image's entry point, not ``nsenter``: the
    fake node's /proc has no namespaces."""
    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines", parent="")
    spec = _daemonset_container()
    config = yaml.safe_load(_configmap(tmp_path).read_text(encoding="utf-8"))
    (node.proc_root / "self" / "mountinfo").write_text(
        f"35 25 0:30 / {config['cgroup_root']}/cpuset rw,nosuid - cgroup cgroup rw,cpuset\n")
    (node.sysfs_root / "fs" / "cgroup").mkdir(parents=True, exist_ok=True)  # the mount point, in a read-only tree
    sockets, state, etc = tmp_path / "nri", tmp_path / "state", tmp_path / "etc"
    for d in (sockets, state, etc):
        d.mkdir(mode=0o755)
    _configmap(etc)
    mounts = {str(etc): "/etc/numa-pin:ro", str(node.sysfs_root): f"{config['sysfs_root']}:ro",
              str(node.cgroup_root): config["cgroup_root"], str(node.proc_root): config["proc_root"],
              str(state): config["state_dir"], str(sockets): os.path.dirname(spec["args"][1])}  # type: ignore[index]
    caps = spec["securityContext"]["capabilities"]["add"]  # type: ignore[index]
    argv = [*RUNC, "run", "-d", "--network", "none", "--pid=host", *ULIMITS,
            "--cap-drop=all", *(f"--cap-add={c}" for c in caps),
            *(a for host, inside in mounts.items() for a in ("-v", f"{host}:{inside}")), image, *spec["args"]]  # type: ignore[misc]
    ledger = NodeService(config_from_dict(node.config_dict(state_dir=str(state)))).ledger
    m = nri_messages.load()
    server = _listen(sockets / "nri.sock")
    a_pod = pod(m, "a", "a", "")
    a = container(m, a_pod, "c-a", cpu_milli=2000, limit_milli=2000, memory=GI)
    cids = []
    try:
        cids.append(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout.strip())
        conn, runtime = _accept(server, m)
        runtime.synchronize([], [])
        code, text, reply = runtime.create(a_pod, a)
        assert code == 0, text
        granted = parse_list(reply.adjust.linux.resources.cpu.cpus)
        before = ledger.read().grants["c-a"]
        assert len(granted) == 2 and before.cpus == granted, "the ledger is the node's (hostPath)"
        start = time.monotonic()
        subprocess.run(["podman", "stop", "-t", "30", cids[-1]], capture_output=True, check=True, timeout=120)
        assert time.monotonic() - start < 15, "SIGTERM did not end the plugin (the kubelet would kill it)"
        conn.close()

        node.add_container("kubepods/poda/c-a", 4201)
        a.state, a.pid = 3, 4201  # CONTAINER_RUNNING
        cids.append(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout.strip())
        conn, runtime = _accept(server, m)
        reply = runtime.synchronize([a_pod], [a])
        assert {u.container_id: parse_list(u.linux.resources.cpu.cpus) for u in reply.update} == {"c-a": granted}
        after = ledger.read().grants["c-a"]
        assert (after.cpus, after.created) == (granted, before.created), "kept, not admitted again"
        conn.close()
    finally:
        server.close()
        for cid in cids:
            subprocess.run(["podman", "rm", "-f", cid], capture_output=True, check=False, timeout=120)

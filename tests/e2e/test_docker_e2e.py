"""``numa-pin-runc`` under real Docker Engine (Debian 12's docker.io 20.10).

The test starts a private dockerd (its own data root, exec root, pid file and socket; no
iptables, no bridge; the cgroupfs driver; a config file of its own, so /etc/docker/daemon.json
is not read) with numa-pin's runtime added by ``--add-runtime``; dockerd starts its own
containerd, whose shim runs the runtime. The image is imported from a tarball of the busybox
rootfs (no registry). Docker 20.10 copies no ``--annotation`` and no label into config.json, so
the request comes through the environment (``NUMA_PIN_IO_CPUS``).

Oracles: the kernel's view from inside the container (``Cpus_allowed_list`` and the cgroup's
``cpuset.cpus``, printed by the container itself), the container's cgroup read from the host,
``numa-pin status --json`` and the raw ledger, and docker's own exit code and stderr.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import numa_pin
from numa_pin.base.cpuset import parse_list

from . import harness

pytestmark = [pytest.mark.e2e, pytest.mark.root]

SRC = Path(numa_pin.__file__).resolve().parents[1]
START_S = 60.0
IMAGE = "numa-pin-e2e/busybox:1"
RUNTIME = "numa-pin"
#: the container prints what the kernel gives it, then waits to be stopped
SHOW = ("grep Cpus_allowed_list /proc/self/status; echo cgroup-cpus: $(cat /sys/fs/cgroup/cpuset/cpuset.cpus); "
        "echo ready; exec sleep 120")


class Docker:
    """The docker client bound to one private dockerd."""

    def __init__(self, client: str, socket: Path) -> None:
        self.client, self.host = client, f"unix://{socket}"

    def run(self, *args: str, timeout: float = harness.DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return harness.execute([self.client, "--host", self.host, *args], timeout=timeout)

    def answers(self) -> bool:
        try:
            return self.run("version", timeout=10).returncode == 0
        except harness.RuntimeTimeout:
            return False


def _runtime_script(path: Path, node) -> Path:
    """numa-pin-runc from this checkout, with the test's config and cache (dockerd's runtime path)."""
    path.write_text(
        "#!/bin/sh\n"
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"export NUMA_PIN_CONFIG='{node.cfg}' NUMA_PIN_CACHE_DIR='{node.cache}' PYTHONPATH='{SRC}'\n"
        f"exec '{sys.executable}' -m numa_pin.entry.runc \"$@\"\n"
    )
    path.chmod(0o755)
    return path


def _debian(name: str) -> str | None:
    """Debian's binary (docker.io's /usr/bin, /usr/sbin) before any other on PATH."""
    return shutil.which(name, path="/usr/sbin:/usr/bin") or harness.find_binary(name)


@pytest.fixture
def docker(node, busybox_rootfs) -> Iterator[Docker]:
    """A private dockerd with the numa-pin runtime and the busybox image; stopped and removed after."""
    client, daemon = _debian("docker"), _debian("dockerd")
    if client is None or daemon is None:
        pytest.skip("docker.io is not installed (apt-get install docker.io)")
    # short paths: containerd's and the shim's sockets live under the exec root
    base = harness.DEFAULT_STATE_DIR / f"dk-{uuid.uuid4().hex[:8]}"
    base.mkdir(parents=True)
    (base / "daemon.json").write_text("{}")
    socket = base / "d.sock"
    runtime = _runtime_script(base / "numa-pin-runc", node)
    log = open(base / "dockerd.log", "wb")
    proc = subprocess.Popen(
        [daemon, "--config-file", str(base / "daemon.json"), "--data-root", str(base / "data"),
         "--exec-root", str(base / "x"), "--pidfile", str(base / "d.pid"), "-H", f"unix://{socket}",
         "--iptables=false", "--ip-masq=false", "--bridge=none", "--userland-proxy=false",
         "--exec-opt", "native.cgroupdriver=cgroupfs", "--storage-driver", "vfs",
         "--add-runtime", f"{RUNTIME}={runtime}"],
        stdout=log, stderr=log, start_new_session=True)
    own = Docker(client, socket)
    try:
        deadline = time.monotonic() + START_S
        while not (socket.exists() and own.answers()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dockerd did not start: {(base / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        tarball = base / "rootfs.tar"
        with tarfile.open(tarball, "w") as tar:
            tar.add(busybox_rootfs, arcname=".")
        imported = own.run("import", str(tarball), IMAGE)
        assert imported.returncode == 0, imported.stderr
        yield own
    finally:
        try:
            listed = own.run("ps", "-aq").stdout.split()
            if listed:
                own.run("rm", "-f", *listed)
        except harness.HarnessError:
            pass
        proc.terminate()
        try:
            proc.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        subprocess.run(["umount", "-R", str(base / "x")], capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], capture_output=True, timeout=60)


def _status(node) -> dict[str, str]:
    """The container ids ``numa-pin status --json`` lists as granted, with their state."""
    out = node.cli("status", "--json")
    assert out.returncode == 0, out.stderr
    return {g["container_id"]: g["state"] for g in json.loads(out.stdout)["grants"]}


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_docker_run_gets_an_exclusive_cpuset_released_when_the_container_goes(docker, node):
    started = docker.run("run", "-d", "--rm", "--runtime", RUNTIME, "--network", "none", "-e", "NUMA_PIN_IO_CPUS=1",
                         IMAGE, "/bin/sh", "-c", SHOW)
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip()
    try:
        _wait(lambda: "ready" in docker.run("logs", cid).stdout, "the container's output")
        grant = node.grants()[cid]
        assert len(grant.cpus) == 1
        inside = dict(line.split(":", 1) for line in docker.run("logs", cid).stdout.splitlines() if ":" in line)
        assert parse_list(inside["Cpus_allowed_list"].strip()) == grant.cpus
        assert parse_list(inside["cgroup-cpus"].strip()) == grant.cpus
        pid = int(docker.run("inspect", "-f", "{{.State.Pid}}", cid).stdout)
        host = harness.read_cpuset(pid)
        assert host.dir.name == cid and parse_list(host.cpus) == grant.cpus
        assert _status(node) == {cid: "running"}, "its cgroup lives: numa-pin sees it run"
    finally:
        stopped = docker.run("kill", cid)
    assert stopped.returncode == 0, stopped.stderr
    _wait(lambda: cid not in node.grants(), "the release at runc delete")
    assert _status(node) == {}


def test_a_refused_docker_run_fails_with_numa_pins_line_and_holds_nothing(docker, node):
    refused = docker.run("run", "--rm", "--runtime", RUNTIME, "--network", "none", "-e", "NUMA_PIN_IO_CPUS=4096",
                         IMAGE, "/bin/true")
    assert refused.returncode != 0
    assert "numa-pin: rejected " in refused.stderr and "TopologyAffinityError" in refused.stderr, refused.stderr
    assert node.grants() == {} and _status(node) == {}
    assert docker.run("ps", "-aq").stdout.split() == [], "--rm removed the container docker could not start"


def test_a_stopped_container_holds_nothing_and_is_admitted_again_at_start(docker, node):
    made = docker.run("run", "-d", "--runtime", RUNTIME, "--network", "none", "-e", "NUMA_PIN_IO_CPUS=1",
                      IMAGE, "/bin/sleep", "120")
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    assert len(node.grants()[cid].cpus) == 1
    assert docker.run("kill", cid).returncode == 0
    _wait(lambda: cid not in node.grants(), "the release when the stopped container's task is deleted")
    assert docker.run("start", cid).returncode == 0
    assert _status(node) == {cid: "running"} and len(node.grants()[cid].cpus) == 1
    assert docker.run("rm", "-f", cid).returncode == 0
    _wait(lambda: cid not in node.grants(), "the release at docker rm -f")

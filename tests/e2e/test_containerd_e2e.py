"""numa-pin-hook under real containerd (Debian's 1.6, ``ctr run --config``).

The spec is the one docs/install.md tells users to make: ``ctr oci spec`` (containerd's own default
spec) with numa-pin's hooks added by the shipped ``packaging/containerd/numa-pin-containerd-spec``
(createRuntime admits, poststop releases). containerd starts the shim, the shim runs runc, runc
runs the hook. When no containerd answers on its default socket, a private one is started with
a temporary root, state and address (CRI plugin disabled) and stopped afterwards; either way the
containers live in their own namespace and are removed.

Oracles, as in test_hook_e2e.py: the kernel's view of the container (``Cpus_allowed_list`` and
the cgroup's ``cpuset.cpus``), ctr's own output, the reason file, and the raw ledger file (read
without a transaction, so nothing but the hooks changes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from numa_pin.reporting.report import reason_path

from . import harness

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SPEC_TOOL = REPO / "packaging" / "containerd" / "numa-pin-containerd-spec"
DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
NAMESPACE = "numa-pin-e2e"
START_S = 30.0


class Containerd:
    """``ctr`` bound to one containerd address and the test namespace."""

    def __init__(self, ctr: str, address: str) -> None:
        self.ctr, self.address = ctr, address

    def run(self, *args: str, timeout: float = harness.DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return harness.execute([self.ctr, "--address", self.address, "--namespace", NAMESPACE, *args],
                               timeout=timeout)

    def answers(self) -> bool:
        try:
            return self.run("version", timeout=10).returncode == 0
        except harness.RuntimeTimeout:
            return False

    def remove(self, cid: str) -> None:
        """Kill, delete the task (its poststop hook runs here) and remove the container."""
        self.run("task", "kill", "--signal", "SIGKILL", cid)
        deadline = time.monotonic() + harness.DEFAULT_TIMEOUT
        while time.monotonic() < deadline:
            listed = self.run("task", "ls").stdout.split()
            if cid not in listed or "STOPPED" in listed[listed.index(cid):listed.index(cid) + 3]:
                break
            time.sleep(0.1)
        self.run("task", "delete", cid)
        self.run("container", "rm", cid)


@contextlib.contextmanager
def private_containerd(ctr: str, daemon: str, extra_toml: str = "", cri: bool = False) -> Iterator[Containerd]:
    """A containerd with its own root, state and address under /run/numa-pin-e2e, stopped and
    removed afterwards. Without ``cri`` the CRI plugin is disabled (no CNI needed)."""
    # short paths: the shim's socket path must stay under the Unix socket limit
    base = Path(harness.DEFAULT_STATE_DIR) / f"ctrd-{uuid.uuid4().hex[:8]}"
    base.mkdir(parents=True)
    address = base / "c.sock"
    config = base / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{base / "root"}"\nstate = "{base / "state"}"\n'
        + ("" if cri else 'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
        + f'[grpc]\n  address = "{address}"\n[ttrpc]\n  address = "{address}.ttrpc"\n' + extra_toml
    )
    log = open(base / "containerd.log", "wb")
    proc = subprocess.Popen([daemon, "--config", str(config)], stdout=log, stderr=log, start_new_session=True)
    own = Containerd(ctr, str(address))
    try:
        deadline = time.monotonic() + START_S
        while not (address.exists() and own.answers()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"containerd did not start: {(base / 'containerd.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield own
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        subprocess.run(["umount", "-R", str(base / "state")], capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], capture_output=True, timeout=60)


def _binaries() -> tuple[str, str]:
    ctr, daemon = harness.find_binary("ctr"), harness.find_binary("containerd")
    if ctr is None or daemon is None:
        pytest.skip("containerd is not installed (apt-get install containerd)")
    return ctr, daemon


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    ctr, daemon = _binaries()
    running = Containerd(ctr, DEFAULT_ADDRESS)
    if os.path.exists(DEFAULT_ADDRESS) and running.answers():
        yield running
        return
    with private_containerd(ctr, daemon) as own:
        yield own


@pytest.fixture(scope="module")
def base_spec(containerd: Containerd) -> dict:
    """containerd's default spec with numa-pin's hooks, made as docs/install.md says."""
    out = containerd.run("oci", "spec")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _spec(base: dict, node, rootfs: Path, tmp_path: Path, name: str, args: list[str],
          annotations: dict[str, str]) -> Path:
    raw = tmp_path / f"{name}.base.json"
    raw.write_text(json.dumps(base))
    made = subprocess.run([str(SPEC_TOOL), "--hook", str(node.path), "--config", str(node.cfg), str(raw)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    spec = json.loads(made.stdout)
    assert {s: [e["args"][-1] for e in spec["hooks"][s]] for s in spec["hooks"]} == {
        "createRuntime": ["createRuntime"], "poststop": ["poststop"]}
    for entries in spec["hooks"].values():  # a private config cache for this test
        for entry in entries:
            entry["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"NUMA_PIN_CACHE_DIR={node.cache}"]
    spec["root"] = {"path": str(rootfs), "readonly": True}
    spec["process"].update(args=args, terminal=False, env=["PATH=/bin"])
    spec["annotations"] = annotations
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def _cpus_allowed(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list in {output!r}")


def _task_pid(containerd: Containerd, cid: str) -> int:
    rows = [line.split() for line in containerd.run("task", "ls").stdout.splitlines()[1:]]
    return int(next(row[1] for row in rows if row[0] == cid))


ONE_CPU = {"numa-pin.io/cpus": "1"}


def test_containerd_admits_rejects_with_reason_and_releases(containerd, base_spec, node, busybox_rootfs, tmp_path):
    held, rejected, after = (harness.new_container_id("np-ctrd") for _ in range(3))
    long_spec = _spec(base_spec, node, busybox_rootfs, tmp_path, "held", ["sleep", "1000"], ONE_CPU)
    try:
        # admit: the container runs on the one CPU an exclusive grant can take (CPU 0 is reserved)
        started = containerd.run("run", "--detach", "--config", str(long_spec), held)
        assert started.returncode == 0, started.stderr
        pid = _task_pid(containerd, held)
        assert harness.proc_allowed(pid)[0] == "1"
        assert harness.read_cpuset(pid).cpus == "1"
        grant = node.grants()[held]
        assert grant.cpus == frozenset({1}) and grant.pid == pid

        # reject: ctr prints the hook's line, the reason file has it, nothing is allocated
        spec = _spec(base_spec, node, busybox_rootfs, tmp_path, "rejected", ["true"], ONE_CPU)
        res = containerd.run("run", "--rm", "--config", str(spec), rejected)
        assert res.returncode != 0
        line = f"numa-pin: rejected {rejected}: TopologyAffinityError:"
        assert line in res.stderr and "cpu 1 requested, free per node: 0=0" in res.stderr, res.stderr
        reason = json.loads(Path(reason_path(str(node.state), rejected)).read_text())
        assert reason["line"].startswith(line)
        assert set(node.grants()) == {held}
        assert rejected not in containerd.run("container", "ls", "--quiet").stdout.split()

        # release: the grant stays while the task is only dead; deleting the task runs poststop
        containerd.run("task", "kill", "--signal", "SIGKILL", held)
        deadline = time.monotonic() + harness.DEFAULT_TIMEOUT
        while "STOPPED" not in containerd.run("task", "ls").stdout and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held in node.grants(), "nothing but the poststop hook may drop the grant"
        deleted = containerd.run("task", "delete", held)
        assert deleted.returncode == 0, deleted.stderr
        assert node.grants() == {}, "containerd's task delete ran poststop, which released the CPU"

        # and the freed CPU goes to the next container
        spec = _spec(base_spec, node, busybox_rootfs, tmp_path, "after", ["cat", "/proc/self/status"], ONE_CPU)
        res = containerd.run("run", "--rm", "--config", str(spec), after)
        assert res.returncode == 0, res.stderr
        assert _cpus_allowed(res.stdout) == "1"
        assert node.grants() == {}
    finally:
        for cid in (held, rejected, after):
            with contextlib.suppress(harness.HarnessError):
                containerd.remove(cid)


def _cri_status(containerd: Containerd) -> str:
    rows = [line.split() for line in containerd.run("plugins", "ls").stdout.splitlines()]
    return next(row[-1] for row in rows if row[:2] == ["io.containerd.grpc.v1", "cri"])


@pytest.mark.parametrize("spec_ok", [True, False], ids=["shipped-snippet", "broken-spec"])
def test_cri_plugin_loads_the_shipped_base_spec_snippet(tmp_path, spec_ok):
    """The CRI way in: the shipped config.toml snippet with a base spec made by the shipped tool
    from ``ctr oci spec``. containerd's CRI plugin parses base_runtime_spec at start; it reports
    ``ok`` with the hooks' spec and ``error`` with a broken one (the check can fail)."""
    ctr, daemon = _binaries()
    base_spec = tmp_path / "numa-pin-base-spec.json"
    if spec_ok:
        made = subprocess.run(f"{ctr} oci spec | {SPEC_TOOL}", shell=True, capture_output=True, text=True,
                              timeout=60)
        assert made.returncode == 0, made.stderr
        assert set(json.loads(made.stdout)["hooks"]) == {"createRuntime", "poststop"}
        base_spec.write_text(made.stdout)
    else:
        base_spec.write_text('{"ociVersion": ')
    snippet = (REPO / "packaging" / "containerd" / "config.toml").read_text()
    body = "\n".join(line for line in snippet.splitlines() if not line.startswith(("#", "version")))
    assert 'base_runtime_spec = "/etc/containerd/numa-pin-base-spec.json"' in body
    body = body.replace("/etc/containerd/numa-pin-base-spec.json", str(base_spec))
    with private_containerd(ctr, daemon, body, cri=True) as cri:
        assert _cri_status(cri) == ("ok" if spec_ok else "error")

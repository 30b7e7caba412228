"""Fixtures for end-to-end tests that drive real runtimes (runc, crun, podman).

Every runtime fixture skips (with the reason) when the test does not run as
root or the binary is missing, and cleans up whatever the test left behind:
containers are force-deleted and state directories removed, even when the
test failed half way.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from numa_pin.ledger.store import Ledger

from . import harness


def _require_binary(name: str) -> str:
    found = harness.find_binary(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One read-only-use busybox rootfs shared by every bundle of the session."""
    if not harness.BUSYBOX.is_file():
        pytest.skip(f"{harness.BUSYBOX} missing: install busybox-static")
    return harness.make_rootfs(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture(scope="session")
def probe_hook(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the recording probe hook (see :func:`harness.write_probe_hook`)."""
    return harness.write_probe_hook(tmp_path_factory.mktemp("probe"))


@pytest.fixture
def cid() -> str:
    """A fresh container id."""
    return harness.new_container_id()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A private directory under /run/numa-pin-e2e, removed afterwards (root only)."""
    folder = harness.DEFAULT_STATE_DIR / f"t-{uuid.uuid4().hex[:10]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _runtime(name: str, state_dir: Path) -> Iterator[harness.OciRuntime]:
    _require_binary(name)
    rt = harness.runtime(name, state_dir / name)
    try:
        yield rt
    finally:
        rt.cleanup()


@pytest.fixture
def runc_rt(state_dir: Path) -> Iterator[harness.OciRuntime]:
    """runc with a private ``--root``; leftover containers are force-deleted after the test."""
    yield from _runtime("runc", state_dir)


@pytest.fixture
def crun_rt(state_dir: Path) -> Iterator[harness.OciRuntime]:
    """crun with a private ``--root`` (and the hybrid-cgroup workaround when needed); cleaned up after."""
    yield from _runtime("crun", state_dir)


@pytest.fixture(params=["runc", "crun"])
def oci_rt(request: pytest.FixtureRequest, state_dir: Path) -> Iterator[harness.OciRuntime]:
    """Each low-level runtime in turn (tests written once for runc and crun)."""
    yield from _runtime(request.param, state_dir)


def _podman(runtime: str, state_dir: Path) -> Iterator[harness.PodmanStore]:
    _require_binary("podman")
    _require_binary(runtime)
    store = harness.podman_store(state_dir / f"podman-{runtime}", runtime=runtime)
    try:
        yield store
    finally:
        harness.podman_cleanup(store)


@pytest.fixture
def podman_runc(state_dir: Path) -> Iterator[harness.PodmanStore]:
    """An isolated podman store using runc; containers removed after the test."""
    yield from _podman("runc", state_dir)


@pytest.fixture
def podman_crun(state_dir: Path) -> Iterator[harness.PodmanStore]:
    """An isolated podman store using crun (wrapped for hybrid cgroups); cleaned up after."""
    yield from _podman("crun", state_dir)


@pytest.fixture
def node(state_dir: Path):
    """A node config for the real machine with a private state dir, and the hook entries."""
    hook = harness.numa_pin_hook_path()
    if hook is None:
        pytest.skip("numa-pin-hook is not installed")
    config = state_dir / "config.yaml"
    ledger_dir = state_dir / "ledger"
    config.write_text(f"policy: restricted\nstate_dir: {ledger_dir}\nsyslog: false\n")
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NUMA_PIN_CACHE_DIR={state_dir / 'cache'}"]

    def entry(stage: str) -> dict:
        return harness.hook_entry(hook, ["numa-pin-hook", "--config", str(config), stage], env=env, timeout=30)

    class Node:
        path = hook
        cfg = config
        state = ledger_dir
        cache = state_dir / "cache"
        hooks = {"prestart": [entry("prestart")], "createRuntime": [entry("createRuntime")], "poststop": [entry("poststop")]}

        @staticmethod
        def grants() -> dict:
            return dict(Ledger(str(ledger_dir)).read().grants)

        @staticmethod
        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            exe = hook.with_name("numa-pin")
            return subprocess.run([str(exe), *args, "--config", str(config)], capture_output=True, text=True, timeout=60)

    return Node

"""Malformed OCI state, config.json, annotations and config never give a traceback, and the hook
never writes outside its roots.

The hook runs in-process (``numa_pin.entry.hook.run``) against a fake node: the kit's
``intel-2s-ht`` machine, a fake proc tree and a fake cgroup v1 tree, all under one temporary
directory. Every file-system write the process makes is checked against that directory.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_cases import CASES, Hostile, assert_clean
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_pin.entry import hook as hook_main
from numa_pin.testing.node import FakeNode

KEYS = ["numa-pin.io/cpus", "numa-pin.io/memory", "numa-pin.io/hugepages-2Mi", "numa-pin.io/hugepages-1Gi",
        "numa-pin.io/devices", "numa-pin.io/policy", "numa-pin.io/scope", "numa-pin.io/pod",
        "numa-pin.io/pod-cpus", "numa-pin.io/pod-memory", "numa-pin.io/pod-devices", "numa-pin.io/bogus",
        "io.kubernetes.cri-o.SandboxID"]
VALUES = st.one_of(
    st.sampled_from(["1", "2", "0", "-1", "1.5", "1e9", "99999999999999999999", "512Mi", "2Gi", "x",
                     "nvidia.com/gpu=1", "a=b", "single-numa-node", "restricted", "pod", "", " "]),
    st.text(alphabet=string.printable, max_size=20),
)
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 70), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("hookfuzz")
    node = FakeNode(root, "intel-2s-ht", parent="")
    node.add_container("c", 4242)
    config = node.write_config(policy="single-numa-node")
    return {"root": root, "config": config, "bundle": root / "bundle", "cache": node.cache_dir}


class WriteGuard:
    """Fails the test on any write outside ``allowed`` (open for writing, mkdir, replace, unlink)."""

    def __init__(self, allowed: Path) -> None:
        self.allowed = os.path.realpath(allowed)
        self.bad: list[str] = []

    def check(self, path, follow_last: bool = True, dir_fd: int | None = None) -> None:
        """``follow_last`` False: the call does not follow a symlink as the last component
        (``O_NOFOLLOW``, rename, unlink, mkdir), so only its directory is resolved. ``dir_fd``:
        a relative ``path`` is relative to that open directory."""
        if isinstance(path, int):
            return
        path = os.fspath(path)
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        if follow_last:
            real = os.path.realpath(path)
        else:
            real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
        if not (real == self.allowed or real.startswith(self.allowed + os.sep)):
            self.bad.append(real)

    def install(self, monkeypatch) -> None:
        real_open, real_os_open = builtins.open, os.open

        def guarded_open(file, mode="r", *a, **k):
            if any(c in mode for c in "wax+"):
                self.check(file)
            return real_open(file, mode, *a, **k)

        def guarded_os_open(path, flags, *a, **k):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                self.check(path, follow_last=not flags & os.O_NOFOLLOW)
            return real_os_open(path, flags, *a, **k)

        monkeypatch.setattr(builtins, "open", guarded_open)
        monkeypatch.setattr(os, "open", guarded_os_open)
        for name in ("mkdir", "makedirs", "unlink", "rmdir"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, lambda p, *a, _real=real, **k: (
                self.check(p, False, k.get("dir_fd")), _real(p, *a, **k))[1])
        for name in ("replace", "rename"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name,
                                lambda s, d, *a, _real=real, **k: (self.check(d, False), _real(s, d, *a, **k))[1])


def run_hook(fake, state_bytes: bytes, stage: str, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(fake["cache"]))
    monkeypatch.delenv("NUMA_PIN_DEBUG", raising=False)
    guard = WriteGuard(fake["root"])
    with monkeypatch.context() as m:
        guard.install(m)
        rc = hook_main.run(["--config", str(fake["config"]), stage], io.BytesIO(state_bytes))
    err = capsys.readouterr().err
    assert not guard.bad, f"wrote outside the roots: {guard.bad}"
    return rc, err


def _assert_clean(rc: int, err: str) -> None:
    assert rc in (0, 1, 2, 3, 4)  # never 70, the internal-error code
    assert "Traceback" not in err and "internal error" not in err, err
    if rc:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("numa-pin: "), err


SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(annotations=st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4),
       stage=st.sampled_from(["prestart", "createRuntime", "poststop"]))
def test_random_annotations_never_traceback(fake, annotations, stage, monkeypatch, capsys):
    fake["bundle"].mkdir(exist_ok=True)
    (fake["bundle"] / "config.json").write_text(json.dumps({"annotations": annotations, "root": {"path": "rootfs"},
                                                                 "linux": {"cgroupsPath": "/c"}}))
    state = {"ociVersion": "1.0", "id": "fuzz", "status": "creating", "pid": 4242, "bundle": str(fake["bundle"]),
             "annotations": annotations}
    rc, err = run_hook(fake, json.dumps(state).encode(), stage, monkeypatch, capsys)
    _assert_clean(rc, err)
    run_hook(fake, json.dumps(state).encode(), "poststop", monkeypatch, capsys)


@SETTINGS
@given(state=JSONISH, spec=JSONISH)
def test_random_state_and_spec_never_traceback(fake, state, spec, monkeypatch, capsys):
    fake["bundle"].mkdir(exist_ok=True)
    (fake["bundle"] / "config.json").write_text(json.dumps(spec))
    if isinstance(state, dict) and state.get("bundle") is None and len(state) % 2:
        state = {**state, "id": "fz", "bundle": str(fake["bundle"]), "pid": 4242}
    rc, err = run_hook(fake, json.dumps(state).encode(), "prestart", monkeypatch, capsys)
    _assert_clean(rc, err)
    run_hook(fake, json.dumps({"id": "fz", "bundle": str(fake["bundle"])}).encode(), "poststop", monkeypatch, capsys)


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_random_bytes_on_stdin(fake, raw, monkeypatch, capsys):
    rc, err = run_hook(fake, raw, "prestart", monkeypatch, capsys)
    _assert_clean(rc, err)
    assert rc == 1


@SETTINGS
@given(cfg=st.dictionaries(st.sampled_from(["policy", "scope", "policy_options", "cpu_manager", "devices",
                                            "reserved_memory", "lock_timeout_s", "bogus", "inference"]),
                           JSONISH, max_size=3))
def test_random_config_never_traceback(fake, cfg, monkeypatch, capsys, tmp_path_factory):
    base = fake["config"].read_text()
    bad = fake["root"] / "fuzz-config.yaml"
    bad.write_text(base + "".join(f"{k}: {json.dumps(v)}\n" for k, v in cfg.items() if k not in base))
    state = {"id": "cfg", "bundle": str(fake["bundle"]), "pid": 4242}
    fake["bundle"].mkdir(exist_ok=True)
    (fake["bundle"] / "config.json").write_text(json.dumps({"annotations": {"numa-pin.io/cpus": "1"},
                                                                 "linux": {"cgroupsPath": "/c"}}))
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(fake["cache"]))
    guard = WriteGuard(fake["root"])
    with monkeypatch.context() as m:
        guard.install(m)
        rc = hook_main.run(["--config", str(bad), "prestart"], io.BytesIO(json.dumps(state).encode()))
        hook_main.run(["--config", str(bad), "poststop"], io.BytesIO(json.dumps(state).encode()))
    err = capsys.readouterr().err
    assert not guard.bad, guard.bad
    _assert_clean(rc, err.splitlines()[0] if err else err)


def test_hook_start_up_imports_no_pyroute2_and_no_cli(fake, tmp_path):
    """A real admission in a fresh interpreter; then look at what it imported."""
    fake["bundle"].mkdir(exist_ok=True)
    (fake["bundle"] / "config.json").write_text(json.dumps({"annotations": {"numa-pin.io/cpus": "1"},
                                                                 "linux": {"cgroupsPath": "/c"}}))
    state = json.dumps({"id": "imports", "bundle": str(fake["bundle"]), "pid": 4242})
    code = (
        "import io, sys\nfrom numa_pin.entry import hook as main\n"
        f"rc = main.run(['--config', {str(fake['config'])!r}, 'prestart'], io.BytesIO({state.encode()!r}))\n"
        f"main.run(['--config', {str(fake['config'])!r}, 'poststop'], io.BytesIO({state.encode()!r}))\n"
        "print(rc); print(' '.join(sorted(sys.modules)))\n"
    )
    env = dict(os.environ, NUMA_PIN_CACHE_DIR=str(fake["cache"]))
    # the loader does not cache a file changed in the last 2 s (same-tick edits); wait that out
    time.sleep(max(0.0, 2.1 - (time.time() - os.stat(fake["config"]).st_ctime)))
    subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=120)  # fills the caches
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    rc, modules = out.stdout.splitlines()[:2]
    assert rc == "0", out.stderr
    loaded = set(modules.split())
    assert not {m for m in loaded if m.startswith("pyroute2")}
    assert not {m for m in loaded if m.startswith("prometheus_client")}, "metrics are counted, never exported, here"
    assert "argparse" not in loaded and not {m for m in loaded if m.startswith("numa_pin.cli")}
    assert not {m for m in loaded if m.startswith(("google", "numa_pin.nri"))}, "protobuf is the NRI plugin's alone"
    assert "yaml" not in loaded, "the parsed config comes from the cache"
    assert not loaded & {"ctypes", "numa_pin.enforcer.bpfdev", "numa_pin.devices.devfilter"}, \
        "libbpf (cgroup v2 device programs) is loaded only when a GPU is granted"
    # what made the in-process hook 2x slower than it is (bench/hook_latency.py): dataclasses
    # (and the inspect module it imports) and typing; threading only for a thread id
    assert not loaded & {"dataclasses", "inspect", "typing", "threading"}
    assert not {m for m in loaded if m.startswith("numa_pin.topology.") and m.split(".")[-1] in
                {"discover", "sysfs", "pci"}}, "the topology comes from the cache"
    # which numa_pin modules it may import is measured in tests/structure/test_hot_set.py


# ---- the input classes of issue 10: FIFOs, deep nesting, symlinked state files, control characters


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    node = FakeNode(root / "node", "intel-2s-ht", parent="")
    node.add_container("c", 4242)
    config = node.write_config(policy="single-numa-node")
    return Hostile(node, config, root / "outside")


@settings(SETTINGS, max_examples=int(os.environ.get("NUMA_PIN_FUZZ_EXAMPLES", "200")))
@given(case=CASES)
def test_hostile_inputs_keep_every_invariant(hostile, case, monkeypatch, capsys):
    """Before: RecursionError as "internal error", hangs on FIFOs, ledger.lock's symlink target
    truncated, reasons/ followed, forged second lines from ids with newlines."""
    rc, err = hostile.run(case, WriteGuard, monkeypatch, capsys)
    assert_clean(case, rc, err)

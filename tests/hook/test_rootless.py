"""The hook run by an unprivileged user (rootless podman runs hooks.d files that say ``always``).

The real check drops to ``nobody`` with ``setpriv`` and runs the installed ``numa-pin-hook`` on a
fake node whose ledger belongs to root, as a rootless podman would: the kernel is the oracle for
"cannot lock the ledger"; the test checks the hook never needs to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from numa_pin.hook.rootless import is_rootless
from numa_pin.testing.node import FakeNode

NOBODY = 65534
CID = "5e0c1f7a" * 8
HOOK = Path(sys.executable).with_name("numa-pin-hook")
#: the tests that drop to nobody run the installed hook under ``setpriv`` (root tier as well)
drops_to_nobody = pytest.mark.skipif(shutil.which("setpriv") is None or not HOOK.exists(),
                                     reason="needs setpriv and numa-pin-hook installed in this venv")


@pytest.mark.parametrize(
    "euid, uid_map, rootless",
    [
        (0, "         0          0 4294967295\n", False),
        (0, "         0       1000          1\n         1     100000      65536\n", True),
        (0, None, False),
        (1000, "         0          0 4294967295\n", True),
    ],
    ids=["host-root", "rootless-userns", "no-userns", "plain-user"],
)
def test_is_rootless(tmp_path, euid, uid_map, rootless):
    (tmp_path / "self").mkdir()
    if uid_map is not None:
        (tmp_path / "self" / "uid_map").write_text(uid_map)
    assert is_rootless(str(tmp_path), euid=euid) is rootless


@pytest.fixture
def unprivileged():
    """A fake node readable by everyone, its ledger directory writable by root only."""
    root = Path(tempfile.mkdtemp(prefix="numa-pin-rootless-"))
    try:
        node = FakeNode(root, "laptop", parent="")
        node.state_dir.mkdir(mode=0o755)
        cfg = node.write_config(root / "config.yaml", settled=False, policy="restricted")
        for dirpath, _dirs, _files in os.walk(root):
            os.chmod(dirpath, 0o755)
        bundle = root / "bundle"
        bundle.mkdir(mode=0o755)

        def run(stage: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
            argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    str(HOOK), "--config", str(cfg), stage]
            env = {"PATH": "/usr/bin:/bin", "NUMA_PIN_NO_AGENT": "1", "NUMA_PIN_CACHE_DIR": str(root / "cache")}
            return subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=120)

        yield run, node, bundle
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _proposed(annotations):
    return json.dumps({"ociVersion": "1.0.2-dev", "process": {"args": ["sh"], "env": ["PATH=/bin"]},
                       "annotations": annotations,
                       "linux": {"cgroupsPath": f"user.slice:libpod:{CID}", "resources": {}}}).encode()


@pytest.mark.root
@drops_to_nobody
def test_nobody_cannot_take_the_ledger_lock(unprivileged):
    """Precondition of the tests below (what failed before): the ledger is out of reach."""
    run, node, _bundle = unprivileged
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            "touch", str(node.state_dir / "ledger.lock")], capture_output=True, timeout=30)
    assert probe.returncode != 0 and b"Permission denied" in probe.stderr


@pytest.mark.root
@drops_to_nobody
def test_rootless_precreate_that_asks_nothing_passes_unchanged(unprivileged):
    run, node, _bundle = unprivileged
    doc = _proposed({"io.container.manager": "libpod"})
    res = run("precreate", doc)
    assert res.returncode == 0, res.stderr
    assert res.stdout == doc and res.stderr == b""
    assert os.listdir(node.state_dir) == []


@pytest.mark.root
@drops_to_nobody
def test_rootless_prestart_and_poststop_that_ask_nothing_pass(unprivileged):
    run, node, bundle = unprivileged
    (bundle / "config.json").write_text(json.dumps({"annotations": {}}))
    os.chmod(bundle / "config.json", 0o644)
    state = json.dumps({"id": CID, "pid": 1, "bundle": str(bundle), "status": "creating"}).encode()
    for stage in ("prestart", "createRuntime", "poststop"):
        res = run(stage, state)
        assert res.returncode == 0, (stage, res.stderr)
        assert res.stderr == b""
    assert os.listdir(node.state_dir) == []


@pytest.mark.root
@drops_to_nobody
@pytest.mark.parametrize("stage", ["precreate", "prestart"])
def test_rootless_request_is_refused_with_what_it_needs(unprivileged, stage):
    run, node, bundle = unprivileged
    ann = {"numa-pin.io/cpus": "1"}
    if stage == "precreate":
        res = run(stage, _proposed(ann))
    else:
        (bundle / "config.json").write_text(json.dumps({"annotations": ann}))
        os.chmod(bundle / "config.json", 0o644)
        res = run(stage, json.dumps({"id": CID, "pid": 1, "bundle": str(bundle), "annotations": ann}).encode())
    err = res.stderr.decode()
    assert res.returncode == 1 and res.stdout == b""
    assert err.count("\n") == 1 and "Traceback" not in err and "LedgerError" not in err
    assert err.startswith(f"numa-pin: rejected {CID}: RootlessError: numa-pin needs a root runtime to pin CPUs")
    assert "1 exclusive CPUs" in err and f"hook uid {NOBODY}" in err
    assert os.listdir(node.state_dir) == []


@pytest.mark.root
@drops_to_nobody
def test_rootless_gpu_container_that_did_not_ask_numa_pin_passes(unprivileged):
    """GPUs chosen by CDI or a device plugin are not an ask of numa-pin: a rootless one must run."""
    run, node, _bundle = unprivileged
    doc = json.loads(_proposed({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}))
    doc["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=GPU-0000")
    data = json.dumps(doc).encode()
    res = run("precreate", data)
    assert res.returncode == 0, res.stderr
    assert res.stdout == data


# (id, what the --config file holds (None: no such file), rootless, annotations, exit code, stderr says)
UNREADABLE_CONFIG = [
    ("rootless_asks_nothing_missing", None, True, {}, 0, None),
    ("rootless_asks_nothing_not_yaml", "policy: [unclosed\n", True, {}, 0, None),
    ("rootless_asks_defaults_apply", "policy: [unclosed\n", True, {"numa-pin.io/cpus": "1"}, 1, "RootlessError"),
    ("root_missing_is_a_config_error", None, False, {}, 3, "ConfigError"),
    ("root_not_yaml_is_a_config_error", "policy: [unclosed\n", False, {}, 3, "ConfigError"),
]


@pytest.mark.parametrize(("text", "rootless", "ann", "code", "says"), [u[1:] for u in UNREADABLE_CONFIG],
                         ids=[u[0] for u in UNREADABLE_CONFIG])
def test_an_unreadable_config_refuses_only_a_root_hook(tmp_path, monkeypatch, text, rootless, ann, code, says):
    """In process (the setpriv tests above run the installed hook): a rootless hook falls back to
    the built-in defaults, a root hook reports the config."""
    from numa_pin.hook import invoke
    from numa_pin.hook import rootless as rootless_mod

    monkeypatch.setattr(rootless_mod, "is_rootless", lambda: rootless)
    if text is not None:
        (tmp_path / "config.yaml").write_text(text)
    doc = _proposed(ann)
    env = {"NUMA_PIN_CACHE_DIR": str(tmp_path / "cache")}
    result = invoke.run(invoke.HookRequest(("--config", "config.yaml", "precreate"), env, doc, str(tmp_path)))
    assert result.code == code, result.stderr
    if says is None:
        assert (result.stdout, result.stderr) == (doc, ())
    else:
        assert len(result.stderr) == 1 and f": {says}: " in result.stderr[0]

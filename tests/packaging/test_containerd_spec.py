"""``numa-pin-containerd-spec``: containerd's default spec plus numa-pin's hooks, nothing else.

The CRI tier (tests/e2e/test_cri_e2e.py) proves the result against containerd itself; this
checks the tool's own contract on a spec shaped like ``ctr oci spec`` (containerd 1.6).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "packaging" / "containerd" / "numa-pin-containerd-spec"
CTR_OCI_SPEC = {
    "ociVersion": "1.0.2-dev",
    "process": {"user": {"uid": 0, "gid": 0}, "args": [], "cwd": "/", "noNewPrivileges": True,
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]},
    "root": {"path": "rootfs"},
    "hooks": {"poststart": [{"path": "/usr/bin/other"}]},
    "linux": {"cgroupsPath": "/default/"},
}


def _run(spec: dict, *args: str) -> dict:
    done = subprocess.run([str(TOOL), "--hook", "/usr/bin/numa-pin-hook", *args], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("keep", [False, True], ids=["default", "keep-rlimits"])
def test_only_hooks_are_added_and_rlimits_dropped(keep):
    out = _run(CTR_OCI_SPEC, *(["--keep-rlimits"] if keep else []))
    hooks = out.pop("hooks")
    assert [e["args"][-1] for e in hooks["createRuntime"]] == ["createRuntime"]
    assert [e["args"][-1] for e in hooks["poststop"]] == ["poststop"]
    assert hooks["poststart"] == CTR_OCI_SPEC["hooks"]["poststart"]
    expected = {k: v for k, v in CTR_OCI_SPEC.items() if k != "hooks"}
    if not keep:
        expected["process"] = {k: v for k, v in CTR_OCI_SPEC["process"].items() if k != "rlimits"}
    assert out == expected


def test_running_twice_changes_nothing():
    once = _run(CTR_OCI_SPEC)
    assert _run(once) == once

"""``numa-pin serve --nri`` does not start beside kubelet's static CPU or memory manager.

kubelet's files are written here as kubelet and kubeadm write them: the ``KubeletConfiguration``
(``cpuManagerPolicy: static``, ``memoryManagerPolicy: Static``) and the checkpoints
``cpu_manager_state`` (``policyName: static``) and ``memory_manager_state`` (``policyName:
Static``), under a temporary kubelet root the config's ``kubelet_root`` points at.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numa_pin.cli.cmd_serve import beside_kubelet
from numa_pin.cluster import kubeletpolicy
from numa_pin.errors import KubeletConflictError, KubeletError, exit_code

KUBELET_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
topologyManagerPolicy: single-numa-node
"""
CPU_STATE_STATIC = {"policyName": "static", "defaultCpuSet": "0-15", "entries": {}, "checksum": 1}
CPU_STATE_NONE = {"policyName": "none", "defaultCpuSet": "", "checksum": 1353318690}
MEMORY_STATE_STATIC = {"policyName": "Static", "machineState": {"0": {"numberOfAssignments": 0}}, "checksum": 2}
MEMORY_STATE_NONE = {"policyName": "None", "machineState": {}, "checksum": 3}

# id -> (files under the kubelet root, what happens: "start", ("refuse", file), ("error", file))
CASES = {
    "config-cpu-static": ({"config.yaml": KUBELET_CONFIG + "cpuManagerPolicy: static\n"}, ("refuse", "config.yaml")),
    "config-memory-static": ({"config.yaml": KUBELET_CONFIG + "memoryManagerPolicy: Static\n"},
                             ("refuse", "config.yaml")),
    "config-json-static": ({"config.yaml": json.dumps({"kind": "KubeletConfiguration", "cpuManagerPolicy": "static"})},
                           ("refuse", "config.yaml")),
    "cpu-state-static": ({"config.yaml": KUBELET_CONFIG + "cpuManagerPolicy: none\n",
                          "cpu_manager_state": CPU_STATE_STATIC}, ("refuse", "cpu_manager_state")),
    "memory-state-static": ({"memory_manager_state": MEMORY_STATE_STATIC}, ("refuse", "memory_manager_state")),
    "both-none": ({"config.yaml": KUBELET_CONFIG + "cpuManagerPolicy: none\nmemoryManagerPolicy: None\n",
                   "cpu_manager_state": CPU_STATE_NONE, "memory_manager_state": MEMORY_STATE_NONE}, "start"),
    "config-defaults": ({"config.yaml": KUBELET_CONFIG}, "start"),
    "files-absent": ({}, "start"),
    "config-empty": ({"config.yaml": ""}, "start"),
    "config-not-yaml": ({"config.yaml": "cpuManagerPolicy: [static\n"}, ("error", "config.yaml")),
    "config-a-list": ({"config.yaml": "- cpuManagerPolicy: static\n"}, ("error", "config.yaml")),
    "config-policy-not-a-string": ({"config.yaml": "cpuManagerPolicy: 1\n"}, ("error", "config.yaml")),
    "cpu-state-not-json": ({"cpu_manager_state": "{policyName"}, ("error", "cpu_manager_state")),
    "memory-state-no-policy": ({"memory_manager_state": {"machineState": {}}}, ("error", "memory_manager_state")),
    "cpu-state-a-directory": ({"cpu_manager_state/": None}, ("error", "cpu_manager_state")),
    "config-static-state-malformed": ({"config.yaml": "cpuManagerPolicy: static\n", "memory_manager_state": "{"},
                                      ("refuse", "config.yaml")),
}


def _kubelet(root: Path, files: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if name.endswith("/"):
            (root / name).mkdir()
        else:
            (root / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return root


@pytest.mark.parametrize("files, want", CASES.values(), ids=CASES.keys())
def test_refusal_table(files, want, tmp_path):
    root = _kubelet(tmp_path / "kubelet", files)
    if want == "start":
        kubeletpolicy.refuse_static(str(root))
        assert kubeletpolicy.static_warnings(str(root)) == []
        return
    kind, name = want
    expected = KubeletConflictError if kind == "refuse" else KubeletError
    with pytest.raises(expected) as caught:
        kubeletpolicy.refuse_static(str(root))
    line = str(caught.value)
    assert type(caught.value) is expected
    assert line.startswith(str(root / name) + ": ") and "\n" not in line
    assert "--allow-kubelet-static" in line
    assert exit_code(caught.value) == (1 if kind == "refuse" else 4)
    warnings = kubeletpolicy.static_warnings(str(root))  # allowed: warning lines instead
    assert str(root / name) in warnings[0] and "started anyway (--allow-kubelet-static)" in warnings[0]


def test_the_config_file_is_a_parameter(tmp_path):
    root = _kubelet(tmp_path / "kubelet", {"config.yaml": KUBELET_CONFIG})
    elsewhere = tmp_path / "etc" / "kubelet.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(KUBELET_CONFIG + "cpuManagerPolicy: static\n")
    kubeletpolicy.refuse_static(str(root))
    with pytest.raises(KubeletConflictError, match=str(elsewhere)):
        kubeletpolicy.refuse_static(str(root), str(elsewhere))


def _config(tmp_path: Path, kubelet_root: Path) -> Path:
    path = tmp_path / "numa-pin.yaml"
    path.write_text(json.dumps({"policy": "restricted", "syslog": False, "state_dir": str(tmp_path / "state"),
                                "kubelet_root": str(kubelet_root)}))
    return path


@pytest.mark.parametrize("case", ["config-cpu-static", "memory-state-static"])
def test_serve_nri_refuses_in_one_line_before_anything(case, tmp_path):
    files, (_, name) = CASES[case]
    root = _kubelet(tmp_path / "kubelet", files)
    env = {**os.environ, "NUMA_PIN_CONFIG": str(_config(tmp_path, root))}
    # a subprocess with a deadline: a plugin that starts would wait for the runtime's socket forever
    done = subprocess.run([sys.executable, "-m", "numa_pin.cli.main", "serve", "--nri", "--nri-socket",
                           str(tmp_path / "nri.sock")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert str(root / name) in line and "--allow-kubelet-static" in line and "KubeletConflictError" in line
    assert not (tmp_path / "state").exists()  # nothing was touched


def test_serve_nri_reads_the_config_given_and_the_override_warns(tmp_path, monkeypatch):
    root = _kubelet(tmp_path / "kubelet", {})
    monkeypatch.setenv("NUMA_PIN_CONFIG", str(_config(tmp_path, root)))
    given = tmp_path / "kubelet.yaml"
    given.write_text(KUBELET_CONFIG + "cpuManagerPolicy: static\n")
    err = io.StringIO()
    beside_kubelet(None, False, err)  # the root's files say nothing
    with pytest.raises(KubeletConflictError, match=str(given)):
        beside_kubelet(str(given), False, err)
    assert err.getvalue() == ""
    beside_kubelet(str(given), True, err)
    (line,) = err.getvalue().splitlines()
    assert line.startswith(f"numa-pin: warning: {given}: kubelet's CPU manager runs the static policy")

"""Living next to kubelet: its CPU manager checkpoint, a warning at admission, a line in status.

The checkpoints are written here in kubelet's own format (``cpu_manager_state``: policyName,
defaultCpuSet, entries per pod uid and container, checksum; and the older container-id keyed
entries). The admissions are real in-process hook runs on a fake node whose config points
``kubelet_root`` at a temporary directory.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from numa_pin.cli.main import main
from numa_pin.cluster import kubelet
from numa_pin.entry.hook import run as hook_run
from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode

STATIC_V2 = {"policyName": "static", "defaultCpuSet": "0,5-15",
             "entries": {"6f1c0e6a-pod": {"app": "1-2", "sidecar": "3"}, "9a2b-pod": {"db": "4"}},
             "checksum": 1234567890}
STATIC_V1 = {"policyName": "static", "defaultCpuSet": "0,3-7", "entries": {"d34db33f": "1-2"}, "checksum": 1}
NONE = {"policyName": "none", "defaultCpuSet": "", "checksum": 1353318690}
EMPTY_STATIC = {"policyName": "static", "defaultCpuSet": "0-15", "checksum": 9}


def _write(root: Path, doc: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cpu_manager_state"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return root


@pytest.mark.parametrize("doc, policy, cpus, count", [
    (STATIC_V2, "static", {1, 2, 3, 4}, 3),
    (STATIC_V1, "static", {1, 2}, 1),
    (NONE, "none", set(), 0),
    (EMPTY_STATIC, "static", set(), 0),
], ids=["static-v2", "static-v1", "none", "static-no-entries"])
def test_checkpoint_parsed(doc, policy, cpus, count, tmp_path):
    state = kubelet.read_cpu_manager_state(str(_write(tmp_path, doc)))
    assert state is not None
    assert (state.policy, set(state.exclusive_cpus()), len(state.exclusive)) == (policy, cpus, count)
    assert state.static == (policy == "static")


@pytest.mark.parametrize("text, want", [
    ("{not json", "not JSON"), ("[]", "no policyName"), ('{"policyName": "static", "entries": {"p": {"c": "x-1"}}}',
                                                         "entries.p.c"),
    ('{"policyName": "static", "entries": []}', "entries is not an object"),
], ids=["garbage", "array", "bad-cpuset", "bad-entries"])
def test_bad_checkpoint_is_a_value_error_and_no_warning(text, want, tmp_path):
    root = _write(tmp_path, text)
    with pytest.raises(ValueError, match=want):
        kubelet.read_cpu_manager_state(str(root))
    assert kubelet.conflict_warning(str(root)) is None
    assert want.split()[0] in str(kubelet.describe(str(root))["error"])


def test_no_kubelet(tmp_path):
    assert kubelet.read_cpu_manager_state(str(tmp_path / "nowhere")) is None
    assert kubelet.conflict_warning(str(tmp_path / "nowhere")) is None
    assert kubelet.describe(str(tmp_path))["policy"] is None


def test_warning_names_the_checkpoint_and_the_cpus(tmp_path):
    root = _write(tmp_path, STATIC_V2)
    line = kubelet.conflict_warning(str(root))
    assert line is not None and "\n" not in line
    assert str(root / "cpu_manager_state") in line and "CPUs 1-4 for 3 container(s)" in line
    assert kubelet.conflict_warning(str(_write(tmp_path / "n", NONE))) is None


@pytest.fixture
def node(tmp_path, tmp_path_factory, monkeypatch):
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    for i in range(3):
        fake.add_container(f"c{i}", 6000 + i)
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def _admit(node: FakeNode, config: Path, i: int, capsys, cpus: str = "2") -> tuple[int, str]:
    state = node.oci_state(f"c{i}", 6000 + i, {"numa-pin.io/cpus": cpus})
    rc = hook_run(["--config", str(config), "prestart"], io.BytesIO(state))
    return rc, capsys.readouterr().err


def test_admission_warns_once_and_still_admits(node, tmp_path, capsys):
    root = _write(tmp_path / "kubelet", STATIC_V2)
    config = node.write_config(kubelet_root=str(root))
    rc, err = _admit(node, config, 0, capsys)
    assert rc == 0
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("numa-pin: warning: kubelet's CPU manager runs the static policy")
    assert "c0" in Ledger(str(node.state_dir)).read().grants


@pytest.mark.parametrize("doc", [None, NONE, "{garbage"], ids=["no-kubelet", "policy-none", "unreadable"])
def test_admission_is_silent_without_a_static_kubelet(doc, node, tmp_path, capsys):
    root = tmp_path / "kubelet"
    if doc is not None:
        _write(root, doc)
    config = node.write_config(kubelet_root=str(root))
    assert _admit(node, config, 0, capsys) == (0, "")


def test_rejection_is_not_caused_by_kubelet(node, tmp_path, capsys):
    config = node.write_config(policy="single-numa-node", kubelet_root=str(_write(tmp_path / "kubelet", STATIC_V2)))
    rc, err = _admit(node, config, 0, capsys, cpus="20")
    assert rc == 1 and "TopologyAffinityError" in err and "kubelet" not in err


def test_status_says_so(node, tmp_path, capsys):
    root = _write(tmp_path / "kubelet", STATIC_V2)
    config = node.write_config(kubelet_root=str(root))
    assert _admit(node, config, 0, capsys)[0] == 0
    granted = Ledger(str(node.state_dir)).read().grants["c0"].cpus
    assert main(["status", "--config", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["kubelet"]
    assert (out["policy"], out["static"], out["exclusive_cpus"], out["containers"]) == ("static", True, "1-4", 3)
    from numa_pin.base.cpuset import format_list

    assert out["overlap_with_numa_pin"] == format_list(granted & {1, 2, 3, 4})
    assert main(["status", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "kubelet: WARNING: CPU manager policy static" in text and "docs/kubernetes.md: Living next to kubelet" in text
    # --kubelet-root wins over the config
    assert main(["status", "--config", str(config), "--kubelet-root", str(tmp_path / "none")]) == 0
    assert "kubelet" not in capsys.readouterr().out

"""``plan`` and ``explain`` say what each isolation knob does (or would do), and what it cannot;
``status`` and ``topology`` show the kernel's isolated CPUs. Real hook admissions on a fake node."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "resources"))
from test_isolation_knobs import IsoNode  # noqa: E402


@pytest.fixture
def node(tmp_path, monkeypatch):
    fake = IsoNode(tmp_path / "n", isolated="6-7")
    fake.config_path = fake.write_config(kubelet_root=str(tmp_path / "no-kubelet"))
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def _json(capsys, *argv: str, rc: int = 0) -> dict:
    assert main(list(argv)) == rc
    return json.loads(capsys.readouterr().out)


def _bundle(node: IsoNode, name: str, annotations: dict[str, str]) -> str:
    node.oci_state(name, 1, annotations)
    return str(node.root / "bundles" / name)


def test_plan_says_what_would_be_isolated_and_what_cannot(node, capsys):
    shutil.rmtree(node.sysfs_root / "devices/system/cpu/cpufreq")  # a VM: no cpufreq
    bundle = _bundle(node, "p", {"numa-pin.io/cpus": "1", "cpu-c-states.crio.io": "disable",
                                 "cpu-freq-governor.crio.io": "performance", "cpu-quota.crio.io": "disable"})
    doc = _json(capsys, "plan", "--config", str(node.config_path), "--bundle", bundle, "--json")
    iso = doc["isolation"]
    cpu = doc["cpus"]
    assert iso["c-states"] == f"sets {node.sysfs_root}/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us=n/a"
    assert iso["governor"].startswith("cannot: ") and "cpufreq" in iso["governor"]
    assert iso["quota"] == "at the container's start (its cgroup)"
    assert main(["plan", "--config", str(node.config_path), "--bundle", bundle]) == 0
    text = capsys.readouterr().out
    assert "isolation: governor: cannot: " in text and "isolation: c-states: sets " in text


def test_explain_says_what_holds_and_what_drifted(node, capsys):
    node.add_container("c1", 7001)
    rc = hook_run(["--config", str(node.config_path), "prestart"],
                  io.BytesIO(node.oci_state("c1", 7001, {"numa-pin.io/cpus": "1", "cpu-c-states.crio.io": "disable"})))
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    doc = _json(capsys, "explain", "--config", str(node.config_path), "c1", "--json")
    assert doc["grant"]["isolation"] == {"c_states": "disable"}
    assert doc["isolated"] == {"c-states": "held (1 settings)"}
    cpu = doc["grant"]["cpus"]
    (node.sysfs_root / f"devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us").write_text("0\n")
    doc = _json(capsys, "explain", "--config", str(node.config_path), "c1", "--json")
    assert doc["isolated"]["c-states"].startswith("drifted (reconcile repairs it): ")


def test_status_and_topology_show_isolated_cpus(node, capsys):
    status = _json(capsys, "status", "--config", str(node.config_path), "--json")
    assert (status["isolated_cpus"], status["nohz_full"], status["isolated_cpus_mode"]) == ("6-7", "", "prefer")
    topo = _json(capsys, "topology", "--sysfs-root", str(node.sysfs_root), "--json")
    assert topo["isolated_cpus"] == "6-7" and topo["nohz_full"] == ""
    assert main(["topology", "--sysfs-root", str(node.sysfs_root)]) == 0
    assert "isolated cpus: 6-7" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, rc, expect",
    [(["--cpus", "1", "--isolate", "cpu-c-states=disable"], 0, "isolation"),
     (["--cpus", "1", "--isolate", "cpu-c-states=deep"], 2, "--isolate cpu-c-states: unknown value"),
     (["--isolate", "cpu-quota=disable"], 2, "--isolate cpu-quota: 'disable' applies to exclusive CPUs only"),
     (["--cpus", "1", "--isolate", "nice=1"], 2, "--isolate: expected KNOB=VALUE")],
    ids=["asks", "bad-value", "shared", "unknown-knob"],
)
def test_numa_pin_run_and_plan_take_isolate_flags(node, capsys, flags, rc, expect):
    code = main(["plan", "--config", str(node.config_path), "--json", *flags])
    out, err = capsys.readouterr()
    if rc == 0:
        assert code == 0 and json.loads(out)["isolation"]["c-states"].startswith("sets ")
    else:
        assert code != 0 and expect in err and err.count("\n") == 1


def test_plan_and_explain_show_a_mixed_containers_cpuset(node, capsys):
    """``cpu-shared``: plan says the cpuset it would get, explain the one it holds (issue 40): its
    exclusive CPU and the pool, which leaves out the kernel's isolated CPUs (6-7 on this node)."""
    pool = parse_list(node.cpus) - parse_list("6-7")
    doc = _json(capsys, "plan", "--config", str(node.config_path), "--json", "--cpus", "1",
                "--isolate", "cpu-shared=true")
    cpu = doc["cpus"]
    want = format_list(pool | parse_list(cpu))
    assert doc["isolation"] == {"cpu-shared": f"cpuset {want}: exclusive {cpu} and the shared pool"}
    node.add_container("m1", 7002)
    annotations = {"numa-pin.io/cpus": "1", "cpu-shared.crio.io/m1": "enable"}
    assert hook_run(["--config", str(node.config_path), "prestart"],
                    io.BytesIO(node.oci_state("m1", 7002, annotations))) == 0, capsys.readouterr().err
    capsys.readouterr()
    doc = _json(capsys, "explain", "--config", str(node.config_path), "m1", "--json")
    cpu = doc["grant"]["cpus"]
    want = format_list(pool | parse_list(cpu))
    assert doc["grant"]["isolation"] == {"shared": True}
    assert doc["isolated"]["cpu-shared"] == f"cpuset {want}: exclusive {cpu} and the shared pool; held"
    assert node.cpuset("m1")[0] == want

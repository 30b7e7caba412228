"""What ``plan`` and ``status`` say about Kubernetes containers: the pod's QoS class and the
signal it came from, and the pod's namespace/name.

The bundles carry what containerd's CRI plugin writes for kubelet's requests (cpuManagerPolicy
none): ``cpu.shares`` from the CPU request, the quota from the limit, the pod cgroup under the
QoS level, and the CRI annotations naming the container and its pod.
"""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.testing.node import FakeNode

GI = 1 << 30
UID = "pod0b6a53c6_1f6e_4a8e_9d2f_3c1f8b7d9e10"


@pytest.fixture
def node(tmp_path, tmp_path_factory, monkeypatch):
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    fake.add_container("c0", 7000)
    fake.config = fake.write_config(policy="single-numa-node", kubelet_root=str(tmp_path / "no-kubelet"))
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def _annotations(container: str = "app") -> dict[str, str]:
    return {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.container-name": container,
            "io.kubernetes.cri.sandbox-id": "5b1e" * 16, "io.kubernetes.cri.sandbox-namespace": "shop",
            "io.kubernetes.cri.sandbox-name": "web-0"}


def _bundle(node: FakeNode, cid: str, cgroups_path: str, shares: int, quota: int) -> str:
    bundle = node.root / "bundles" / cid
    bundle.mkdir(parents=True)
    spec = {"annotations": _annotations(), "root": {"path": "rootfs"},
            "linux": {"cgroupsPath": cgroups_path, "resources": {
                "cpu": {"shares": shares, "quota": quota, "period": 100000}, "memory": {"limit": GI}}}}
    (bundle / "config.json").write_text(json.dumps(spec))
    return str(bundle)


@pytest.mark.parametrize(
    "path, shares, qos, cpus",
    [
        (f"/kubepods/{UID}/c1", 2048, "Guaranteed", 2),
        (f"/kubepods/burstable/{UID}/c1", 512, "Burstable", 0),
        (f"kubepods-burstable-{UID}.slice:cri-containerd:c1", 2048, "Burstable", 0),
        ("/c1", 512, "Burstable", 0),
    ],
    ids=["guaranteed-cgroupfs", "burstable-cgroupfs", "burstable-systemd-same-shares", "burstable-shares"],
)
def test_plan_says_the_qos_class_and_its_signal(node, capsys, path, shares, qos, cpus):
    bundle = _bundle(node, "c1", path, shares, 200000)
    assert main(["plan", "--config", str(node.config), "--bundle", bundle, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    signal = f"linux.cgroupsPath {path}" if path != "/c1" else f"cpu shares {shares} against quota 200000/100000"
    assert doc["qos"] == {"class": qos, "signal": signal}
    assert len(doc["cpus"].replace("-", ",").split(",")) == 2 if cpus else doc["cpus"] == ""
    assert main(["plan", "--config", str(node.config), "--bundle", bundle]) == 0
    assert f"qos:       pod {qos} (from {signal})" in capsys.readouterr().out.splitlines()


def test_status_names_the_pod(node, capsys):
    state = node.oci_state("c0", 7000, {**_annotations("app"), "numa-pin.io/cpus": "1"})
    assert hook_run(["--config", str(node.config), "prestart"], io.BytesIO(state)) == 0
    capsys.readouterr()
    assert main(["status", "--config", str(node.config), "--json"]) == 0
    grant = json.loads(capsys.readouterr().out)["grants"][0]
    assert (grant["pod"], grant["name"], grant["pod_id"]) == ("shop/web-0", "app", "5b1e" * 16)
    assert main(["status", "--config", str(node.config)]) == 0
    assert "pod=shop/web-0 " in capsys.readouterr().out


@pytest.mark.parametrize(
    "parent, qos",
    [(f"kubepods/burstable/{UID}", "Burstable"), (f"kubepods/besteffort/{UID}", "BestEffort"),
     (f"kubepods/{UID}", "Guaranteed"), ("ctr", None)],
    ids=["burstable", "besteffort", "guaranteed", "not-kubernetes"],
)
def test_explain_says_the_qos_class_of_a_grant(tmp_path, tmp_path_factory, monkeypatch, capsys, parent, qos):
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines",
                    parent=parent)
    fake.add_container("c0", 7000)
    config = fake.write_config(policy="single-numa-node", kubelet_root=str(tmp_path / "no-kubelet"))
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    assert hook_run(["--config", str(config), "prestart"], io.BytesIO(fake.oci_state("c0", 7000, _annotations()))) == 0
    capsys.readouterr()
    assert main(["explain", "--config", str(config), "c0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = None if qos is None else {"class": qos, "signal": f"cgroup /{parent}/c0"}
    assert doc.get("qos") == expected
    assert main(["explain", "--config", str(config), "c0"]) == 0
    assert json.loads(capsys.readouterr().out).get("qos") == expected

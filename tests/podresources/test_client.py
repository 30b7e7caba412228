"""kubelet's pod-resources API through a real gRPC server on a Unix socket (``conftest.serve``).

The oracle of the fingerprint is the ``--pods FILE`` path, checked against podfingerprint's
published vectors in ``tests/nrt/test_fingerprint.py``: the same pods served by the socket and
written to the file sign the same, and sign as the vectors say.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from numa_pin.cli.cmd_nrt import watch
from numa_pin.cli.main import main
from numa_pin.errors import KubeletError
from numa_pin.podresources.client import Allocatable, Container, Devices, Memory, Pod, PodResourcesClient
from numa_pin.testing import machine, shapes

DATA = Path(__file__).resolve().parents[1] / "nrt" / "data"
UPSTREAM_PODS = [(p["namespace"], p["name"]) for p in json.loads((DATA / "podfingerprint-pods.json").read_text())]
FIVE_PODS = [("ns1", "n1"), ("ns1", "n2"), ("ns2", "n1"), ("ns3", "n1"), ("ns3", "n2")]
GI = 1 << 30


def _answer(pb: Any, pods: list[tuple[str, str]]) -> Any:
    """A List answer as kubelet gives it: every pod with a container or two, some with devices,
    exclusive CPUs and memory."""
    out = pb.ListPodResourcesResponse()
    for i, (namespace, name) in enumerate(pods):
        pod = out.pod_resources.add(namespace=namespace, name=name)
        app = pod.containers.add(name="app")
        if i % 3 == 0:
            dev = app.devices.add(resource_name="vendor.com/gpu", device_ids=[f"gpu-{i}"])
            dev.topology.nodes.add(ID=i % 2)
            app.cpu_ids.extend([2 * i, 2 * i + 1])
            mem = app.memory.add(memory_type="memory", size=GI)
            mem.topology.nodes.add(ID=i % 2)
        if i % 2:
            pod.containers.add(name="sidecar")
    return out


def _config(tmp_path: Path, kubelet_root: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"policy": "single-numa-node", "scope": "container", "syslog": False,
                                "state_dir": str(tmp_path / "state"), "kubelet_root": kubelet_root}))
    return path


def _nrt(capsys: Any, tmp_path: Path, *extra: str, kubelet_root: str | None = None) -> tuple[int, dict[str, str], str]:
    """``numa-pin nrt --json`` on the kit's first shape: (exit code, attributes, stderr)."""
    built = machine.build_once(shapes.SHAPES[sorted(shapes.SHAPES)[0]](), tmp_path / "m")
    config = _config(tmp_path, kubelet_root or str(tmp_path / "no-kubelet"))
    rc = main(["nrt", "--config", str(config), "--sysfs-root", str(built.sysfs_root), "--proc-root",
               str(built.proc_root), "--node-name", "w7", "--json", *extra])
    out, err = capsys.readouterr()
    attrs = {a["name"]: a["value"] for a in json.loads(out)["attributes"]} if rc == 0 else {}
    return rc, attrs, err


@pytest.mark.parametrize("pods, want", [
    (UPSTREAM_PODS, "pfp0v001e477a4e3b2fc0ec6"),
    (FIVE_PODS, "pfp0v001b92008c14168b3a6"),
], ids=["podfingerprint-testdata", "tracing-five"])
def test_kubelets_pods_sign_as_the_pods_file(pods, want, pb, serve, tmp_path, capsys):
    sock = serve(list=lambda req, ctx: _answer(pb, pods))
    rc, served, err = _nrt(capsys, tmp_path, "--pod-resources", sock)
    assert rc == 0, err
    items = [{"metadata": {"namespace": ns, "name": n}, "spec": {"nodeName": "w7"}, "status": {"phase": "Running"}}
             for ns, n in pods]
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps({"kind": "PodList", "items": items}))
    rc, from_file, err = _nrt(capsys, tmp_path, "--pods", str(pods_file))
    assert rc == 0, err
    assert served["nodeTopologyPodsFingerprint"] == from_file["nodeTopologyPodsFingerprint"] == want
    assert served["nodeTopologyPodsFingerprintMethod"] == "all"


def test_kubelets_socket_under_kubelet_root_is_the_default(pb, serve, tmp_path, capsys):
    root = tempfile.mkdtemp(prefix="kubelet-")  # short: the socket's path has 107 bytes
    try:
        os.mkdir(os.path.join(root, "pod-resources"))
        serve(list=lambda req, ctx: _answer(pb, FIVE_PODS), path=os.path.join(root, "pod-resources", "kubelet.sock"))
        rc, attrs, err = _nrt(capsys, tmp_path, kubelet_root=root)
        assert rc == 0, err
        assert attrs["nodeTopologyPodsFingerprint"] == "pfp0v001b92008c14168b3a6"
        rc, attrs, err = _nrt(capsys, tmp_path, kubelet_root=str(tmp_path / "elsewhere"))
        assert rc == 0, err
        assert "nodeTopologyPodsFingerprint" not in attrs  # no kubelet here: nothing to sign
    finally:
        for dirpath, _dirs, files in os.walk(root, topdown=False):
            for name in files:
                os.unlink(os.path.join(dirpath, name))
            os.rmdir(dirpath)


def test_containers_devices_cpus_and_memory_are_read(pb, serve):
    alloc = pb.AllocatableResourcesResponse(cpu_ids=[0, 1, 2, 3])
    dev = alloc.devices.add(resource_name="vendor.com/gpu", device_ids=["gpu-0", "gpu-3"])
    dev.topology.nodes.add(ID=0)
    mem = alloc.memory.add(memory_type="hugepages-2Mi", size=4 * GI)
    mem.topology.nodes.add(ID=1)
    sock = serve(list=lambda req, ctx: _answer(pb, FIVE_PODS[:2]), allocatable=lambda req, ctx: alloc)
    with PodResourcesClient(sock) as client:
        pods = client.list()
        allocatable = client.allocatable()
    gpu = Devices("vendor.com/gpu", ("gpu-0",), frozenset({0}))
    assert pods == (
        Pod("ns1", "n1", (Container("app", (gpu,), frozenset({0, 1}), (Memory("memory", GI, frozenset({0})),)),)),
        Pod("ns1", "n2", (Container("app", (), frozenset(), ()), Container("sidecar", (), frozenset(), ()))),
    )
    assert allocatable == Allocatable((Devices("vendor.com/gpu", ("gpu-0", "gpu-3"), frozenset({0})),),
                                      frozenset({0, 1, 2, 3}), (Memory("hugepages-2Mi", 4 * GI, frozenset({1})),))


def _slow(pb: Any, seconds: float) -> Any:
    def handler(req: Any, ctx: Any) -> Any:
        time.sleep(seconds)
        return _answer(pb, FIVE_PODS)
    return handler


def test_a_slow_kubelet_hits_the_deadline_in_one_line(pb, serve, tmp_path, capsys):
    sock = serve(list=_slow(pb, 3.0))
    started = time.monotonic()
    rc, _, err = _nrt(capsys, tmp_path, "--pod-resources", sock, "--pod-resources-timeout", "0.3")
    assert time.monotonic() - started < 2.5
    assert rc == 4
    assert len(err.strip().splitlines()) == 1
    assert sock in err and "did not answer within 0.3 s" in err


@pytest.mark.parametrize("limits, pods, want", [
    ({"max_message_bytes": 4096}, [("namespace-" + "x" * 40, f"pod-{i:04d}") for i in range(200)],
     "larger than the 4096 bytes read"),
    ({"max_pods": 4}, FIVE_PODS, "5 pods, more than the 4 read"),
    ({"max_containers": 1}, FIVE_PODS, "has 2 containers, more than the 1 read"),
], ids=["answer-too-large", "too-many-pods", "too-many-containers"])
def test_oversized_answers_are_refused(limits, pods, want, pb, serve):
    sock = serve(list=lambda req, ctx: _answer(pb, pods))
    with PodResourcesClient(sock, **limits) as client, pytest.raises(KubeletError) as caught:
        client.list()
    assert want in str(caught.value) and sock in str(caught.value)
    assert "\n" not in str(caught.value)


def test_within_the_limits_the_same_answer_is_read(pb, serve):
    pods = [("namespace-" + "x" * 40, f"pod-{i:04d}") for i in range(200)]
    sock = serve(list=lambda req, ctx: _answer(pb, pods))
    with PodResourcesClient(sock, max_message_bytes=1 << 20, max_pods=200, max_containers=2) as client:
        assert [(p.namespace, p.name) for p in client.list()] == pods


@pytest.mark.parametrize("kind", ["missing", "regular-file", "nobody-listening"])
def test_no_kubelet_is_one_line_naming_the_socket(kind, tmp_path, capsys):
    sock = tmp_path / "kubelet.sock"
    if kind == "regular-file":
        sock.write_text("")
    elif kind == "nobody-listening":
        import socket

        s = socket.socket(socket.AF_UNIX)
        short = tempfile.mkdtemp(prefix="podres-")
        sock = Path(short) / "kubelet.sock"
        s.bind(str(sock))
        s.close()  # the file stays, nothing accepts
    try:
        rc, _, err = _nrt(capsys, tmp_path, "--pod-resources", str(sock), "--pod-resources-timeout", "2")
    finally:
        if kind == "nobody-listening":
            sock.unlink()
            sock.parent.rmdir()
    assert rc == 4
    assert len(err.strip().splitlines()) == 1 and str(sock) in err


def test_an_unimplemented_method_is_one_line(pb, serve):
    sock = serve(list=lambda req, ctx: _answer(pb, FIVE_PODS))  # no GetAllocatableResources
    with PodResourcesClient(sock) as client, pytest.raises(KubeletError, match="GetAllocatableResources: UNIMPLEMENTED"):
        client.allocatable()


def test_watch_asks_kubelet_at_every_check(tmp_path):
    served = [FIVE_PODS[:1], FIVE_PODS[:1], FIVE_PODS[:2], FIVE_PODS[:2]]
    checks = {"n": 0}

    def build() -> dict[str, Any]:
        pods = served[min(checks["n"], len(served) - 1)]
        checks["n"] += 1
        return {"pods": [list(p) for p in pods]}

    out = tmp_path / "nrt.json"
    written = watch(build, None, str(out), as_json=True, interval=0, publish=None,
                    stopped=lambda: checks["n"] >= len(served), sleep=lambda s: None)
    assert checks["n"] == 4  # rebuilt at every check, though no file changed
    assert written == 2  # written only when the object changed
    assert json.loads(out.read_text()) == {"pods": [list(p) for p in FIVE_PODS[:2]]}

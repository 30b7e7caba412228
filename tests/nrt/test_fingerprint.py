"""``nodeTopologyPodsFingerprint``: the podfingerprint package's signature of the pods on a node.

Oracles: the package's own test vectors (``podfingerprint_test.go``'s ``TestCheck`` over its
``testdata/pods.json``, vendored here unchanged as ``data/podfingerprint-pods.json``, and
``tracing_test.go``'s five pods), and the system's libxxhash (xxHash's reference C library)
for the hash underneath. The scheduler plugin's attribute names and pod rules come from
kubernetes-sigs/scheduler-plugins (``cache/store.go``, ``podprovider/podprovider.go``,
``nodeconfig/topologymanager.go``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from numa_pin.cli.main import main
from numa_pin.cluster.nrt import pods_fingerprint, pods_on_node, xxh64
from numa_pin.errors import RequestError
from numa_pin.testing import machine, shapes

from .test_nrt import CRD_V1ALPHA2, validate

DATA = Path(__file__).parent / "data"
UPSTREAM_PODS = [(p["namespace"], p["name"]) for p in json.loads((DATA / "podfingerprint-pods.json").read_text())]
FIVE_PODS = [("ns1", "n1"), ("ns1", "n2"), ("ns2", "n1"), ("ns3", "n1"), ("ns3", "n2")]


@pytest.mark.parametrize("pods, want", [
    (UPSTREAM_PODS, "pfp0v001e477a4e3b2fc0ec6"),
    (list(reversed(UPSTREAM_PODS)), "pfp0v001e477a4e3b2fc0ec6"),
    (FIVE_PODS, "pfp0v001b92008c14168b3a6"),
    (random.Random(7).sample(FIVE_PODS, len(FIVE_PODS)), "pfp0v001b92008c14168b3a6"),
], ids=["testdata-pods", "testdata-pods-reversed", "tracing-five", "tracing-five-shuffled"])
def test_upstream_vectors(pods, want):
    assert pods_fingerprint(pods) == want


def test_a_different_pod_set_signs_differently():
    assert pods_fingerprint(FIVE_PODS[:-1]) != pods_fingerprint(FIVE_PODS)
    assert pods_fingerprint([("ns1", "n2")]) != pods_fingerprint([("ns1n", "2")])  # namespace seeds the name's hash


LIBXXHASH = ctypes.util.find_library("xxhash")


def _libxxhash() -> Any:
    assert LIBXXHASH is not None
    lib = ctypes.CDLL(LIBXXHASH)
    lib.XXH64.restype = ctypes.c_uint64
    lib.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    return lib


@pytest.mark.skipif(LIBXXHASH is None, reason="libxxhash is not installed")
@pytest.mark.parametrize("size", [0, 1, 3, 4, 7, 8, 15, 31, 32, 33, 63, 64, 100, 257], ids=lambda n: f"{n}B")
def test_xxh64_matches_the_reference_library(size):
    lib = _libxxhash()
    rng = random.Random(size)
    for seed in (0, 1, rng.getrandbits(64), (1 << 64) - 1):
        data = bytes(rng.getrandbits(8) for _ in range(size))
        assert xxh64(data, seed) == lib.XXH64(data, size, seed)


def _pod(name: str, node: str | None, phase: str | None, namespace: str = "ns") -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"namespace": namespace, "name": name}}
    if node is not None:
        pod["spec"] = {"nodeName": node}
    if phase is not None:
        pod["status"] = {"phase": phase}
    return pod


@pytest.mark.parametrize("items, want", [
    ([_pod("a", "w7", "Running")], [("ns", "a")]),
    ([_pod("a", "w8", "Running")], []),
    ([_pod("a", "w7", "Pending")], []),
    ([_pod("a", "w7", "Succeeded"), _pod("b", "w7", "Failed")], [("ns", "a"), ("ns", "b")]),
    ([{"namespace": "x", "name": "y"}], [("x", "y")]),
    ([_pod("a", "", "Running")], []),
], ids=["running-here", "other-node", "pending", "terminal-still-listed", "bare-pair", "unbound"])
def test_which_pods_count(items, want):
    assert pods_on_node({"kind": "PodList", "items": items}, "w7") == want
    assert pods_on_node(items, "w7") == want


@pytest.mark.parametrize("doc", [{"kind": "PodList"}, "pods", [{"metadata": {}}], [{"name": 3}],
                                 [{"name": "a", "namespace": 5}]],
                         ids=["no-items", "string", "no-name", "name-not-string", "namespace-not-string"])
def test_malformed_pods_are_refused(doc):
    with pytest.raises(RequestError):
        pods_on_node(doc, "w7")


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"policy": "single-numa-node", "scope": "container", "syslog": False,
                                "state_dir": str(tmp_path / "state")}))
    return path


def _nrt(capsys, tmp_path, tmp_path_factory, *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    built = machine.build_once(shapes.SHAPES[sorted(shapes.SHAPES)[0]](), tmp_path_factory.getbasetemp() / "m")
    rc = main(["nrt", "--config", str(_config(tmp_path)), "--sysfs-root", str(built.sysfs_root),
               "--proc-root", str(built.proc_root), "--node-name", "w7", "--json", *extra])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_the_attribute_comes_from_the_pods_file(tmp_path, tmp_path_factory, capsys):
    pods = tmp_path / "pods.json"
    items = [_pod(n, "w7", "Running", ns) for ns, n in FIVE_PODS] + [_pod("elsewhere", "w8", "Running")]
    pods.write_text(json.dumps({"apiVersion": "v1", "kind": "PodList", "items": items}))
    rc, obj, err = _nrt(capsys, tmp_path, tmp_path_factory, "--pods", str(pods))
    assert rc == 0, err
    assert obj is not None and validate(obj, CRD_V1ALPHA2) == []
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs["nodeTopologyPodsFingerprint"] == "pfp0v001b92008c14168b3a6"
    assert attrs["nodeTopologyPodsFingerprintMethod"] == "all"
    assert (attrs["topologyManagerPolicy"], attrs["topologyManagerScope"]) == ("single-numa-node", "container")
    assert attrs["topologyManagerMaxNUMANodes"] == "8"  # kubelet's default limit
    assert len(attrs) == len(obj["attributes"])  # every name once: the plugin looks names up


def test_no_pods_file_no_fingerprint(tmp_path, tmp_path_factory, capsys):
    rc, obj, err = _nrt(capsys, tmp_path, tmp_path_factory)
    assert rc == 0, err
    assert obj is not None
    assert not {a["name"] for a in obj["attributes"]} & {"nodeTopologyPodsFingerprint",
                                                          "nodeTopologyPodsFingerprintMethod"}


@pytest.mark.parametrize("content", ["{not json", json.dumps({"items": [{"metadata": {}}]})], ids=["not-json", "no-name"])
def test_a_bad_pods_file_is_one_line(tmp_path, tmp_path_factory, capsys, content):
    pods = tmp_path / "pods.json"
    pods.write_text(content)
    rc, _, err = _nrt(capsys, tmp_path, tmp_path_factory, "--pods", str(pods))
    assert rc != 0
    assert str(pods) in err and len(err.strip().splitlines()) == 1


def test_the_vendored_crd_is_the_v1alpha2_schema():
    assert CRD_V1ALPHA2["required"] == ["zones"]
    assert set(CRD_V1ALPHA2["properties"]) >= {"attributes", "topologyPolicies", "zones"}
    assert yaml.safe_load((DATA / "noderesourcetopology-crd.yaml").read_text())["kind"] == "CustomResourceDefinition"

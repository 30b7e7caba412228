"""``numa-pin.io/exec-cpu-affinity`` and ``isolation.exec_cpu_affinity`` on the hook's paths.

Podman's precreate with a runtime-spec 1.2 config writes ``process.execCPUAffinity`` (``final`` =
the first exclusive CPU, the ledger's grant as the oracle); an older config and the prestart hook
cannot carry it: an annotation asking it is refused in one line with nothing kept, the node
default asks nothing there. The NRI path is in ``tests/nri/test_exec_affinity.py``; every path
at once in ``tests/nri/test_every_path.py``.
"""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.entry import hook as hook_main
from numa_pin.errors import HookInputError
from numa_pin.hook.precreate import edit_spec, runtime_features
from numa_pin.ledger.store import Ledger
from numa_pin.resources.node.runtime import RuntimeEdit, merge_edits
from numa_pin.testing.node import FakeNode

CID = "0f2a83a2d618ece3563383e4d2c110bfc35717b71b479661529c6d7a83acaedb"
ASK = "numa-pin.io/exec-cpu-affinity"


@pytest.mark.parametrize(
    "version, carried",
    [("1.0.2-dev", False), ("1.1.0", False), ("1.2.0", True), ("1.2.1", True), ("1.3.0", True), (None, False)],
    ids=["podman-4.3", "1.1", "1.2", "1.2.1", "1.3", "none"],
)
def test_exec_affinity_follows_the_spec_version(version, carried):
    """runtime-spec 1.2.0 added process.execCPUAffinity."""
    assert runtime_features({"ociVersion": version} if version else {}).exec_affinity is carried


@pytest.mark.parametrize(
    "process, edit, want",
    [
        ({}, RuntimeEdit(exec_cpus=frozenset({3})), {"final": "3"}),
        ({"execCPUAffinity": {"initial": "0"}}, RuntimeEdit(exec_cpus=frozenset({2, 3})),
         {"initial": "0", "final": "2-3"}),
        ({"execCPUAffinity": {"final": "1"}}, RuntimeEdit(cpus=frozenset({2})), {"final": "1"}),
        ({}, RuntimeEdit(cpus=frozenset({2})), None),
    ],
    ids=["written", "initial-kept", "none-asked-keeps-the-config", "none-asked"],
)
def test_edit_spec_writes_the_exec_cpus_as_final(process, edit, want):
    doc = {"process": {"args": ["sh"], **process}, "linux": {}}
    out = edit_spec(doc, edit)
    assert out["process"].get("execCPUAffinity") == want
    assert doc["process"] == {"args": ["sh"], **process}, "the input is not changed"


def test_edit_spec_refuses_an_exec_affinity_of_the_wrong_shape():
    with pytest.raises(HookInputError, match="process.execCPUAffinity must be an object"):
        edit_spec({"process": {"execCPUAffinity": "0"}}, RuntimeEdit(exec_cpus=frozenset({1})))


def test_a_later_resource_exec_cpus_win_and_none_keeps_them():
    merged = merge_edits([RuntimeEdit(exec_cpus=frozenset({1})), None, RuntimeEdit(cpus=frozenset({4}))])
    assert merged.exec_cpus == frozenset({1}) and merged.cpus == frozenset({4})
    assert merge_edits([RuntimeEdit(exec_cpus=frozenset({1})), RuntimeEdit(exec_cpus=frozenset({5}))]).exec_cpus \
        == frozenset({5})


def _node(tmp_path, monkeypatch, default: str | None = None):
    fake = FakeNode(tmp_path, "laptop", parent="libpod_parent")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    extra = {"isolation": {"exec_cpu_affinity": default}} if default else {}
    return fake, fake.write_config(tmp_path / "config.yaml", settled=False, policy="restricted", **extra)


def _precreate(cfg, annotations: dict[str, str], version: str) -> tuple[int, dict | None]:
    doc = {"ociVersion": version, "process": {"args": ["sh"], "env": ["PATH=/usr/bin"]},
           "annotations": {"io.container.manager": "libpod", **annotations},
           "linux": {"cgroupsPath": f"/libpod_parent/libpod-{CID}", "resources": {}}}
    out = io.BytesIO()
    rc = hook_main.run(["--config", str(cfg), "precreate"], io.BytesIO(json.dumps(doc).encode()), out)
    return rc, (json.loads(out.getvalue()) if out.getvalue() else None)


#: (annotations, node default, the config's ociVersion, written?)
CARRIED = [
    ({ASK: "first"}, None, "1.2.0", True),
    ({}, "first", "1.2.0", True),
    ({ASK: "default"}, "first", "1.2.0", False),
    ({}, None, "1.3.0", False),
    ({}, "first", "1.0.2-dev", False),
]


@pytest.mark.parametrize("annotations, default, version, written", CARRIED,
                         ids=["annotation", "node-default", "annotation-default-overrides", "off-by-default",
                              "node-default-old-spec-asks-nothing"])
def test_precreate_writes_the_first_exclusive_cpu_as_the_exec_affinity(tmp_path, monkeypatch, capsys,
                                                                       annotations, default, version, written):
    fake, cfg = _node(tmp_path, monkeypatch, default)
    rc, spec = _precreate(cfg, {"numa-pin.io/cpus": "2", **annotations}, version)
    assert rc == 0, capsys.readouterr().err
    grant = Ledger(str(fake.state_dir)).read().grants[CID]
    assert parse_list(spec["linux"]["resources"]["cpu"]["cpus"]) == grant.cpus and len(grant.cpus) == 2
    if written:
        assert spec["process"]["execCPUAffinity"] == {"final": str(min(grant.cpus))}
    else:
        assert "execCPUAffinity" not in spec["process"]
    assert "exec_cpu_affinity" not in grant.isolation, "the runtime's config keeps it, not the ledger"


def test_a_shared_container_with_the_node_default_gets_none(tmp_path, monkeypatch, capsys):
    fake, cfg = _node(tmp_path, monkeypatch, "first")
    rc, spec = _precreate(cfg, {"numa-pin.io/memory": "64Mi"}, "1.2.0")
    assert rc == 0, capsys.readouterr().err
    assert Ledger(str(fake.state_dir)).read().grants[CID].kind == "shared"
    assert "execCPUAffinity" not in spec["process"]


@pytest.mark.parametrize(
    "annotations, version, kind, why",
    [
        ({"numa-pin.io/cpus": "1", ASK: "first"}, "1.0.2-dev", "PathLimitError",
         "cannot be applied on the precreate path: the config's runtime-spec has no process.execCPUAffinity"),
        ({"numa-pin.io/memory": "64Mi", ASK: "first"}, "1.2.0", "RequestError", "applies to exclusive CPUs only"),
        ({"numa-pin.io/cpus": "1", ASK: "last"}, "1.2.0", "RequestError", "expected one of first, default"),
    ],
    ids=["old-runtime-spec", "shared-container", "unknown-value"],
)
def test_precreate_refuses_what_it_cannot_carry_in_one_line(tmp_path, monkeypatch, capsys, annotations, version,
                                                            kind, why):
    fake, cfg = _node(tmp_path, monkeypatch)
    rc, spec = _precreate(cfg, annotations, version)
    err = capsys.readouterr().err
    assert rc == 1 and spec is None
    assert f": {kind}: " in err and why in err and err.count("\n") == 1, err
    assert Ledger(str(fake.state_dir)).read().grants == {}


@pytest.mark.parametrize("annotations, default, admitted", [
    ({"numa-pin.io/cpus": "1", ASK: "first"}, None, False),
    ({"numa-pin.io/cpus": "1"}, "first", True),
    ({"numa-pin.io/cpus": "1", ASK: "default"}, None, True),
], ids=["annotation-refused", "node-default-asks-nothing", "annotation-default-passes"])
def test_prestart_refuses_an_annotation_asking_exec_affinity(tmp_path, monkeypatch, capsys, annotations, default,
                                                             admitted):
    fake, cfg = _node(tmp_path, monkeypatch, default)
    state = fake.oci_state(CID, fake.add_container(CID, 4242), annotations)
    rc = hook_main.run(["--config", str(cfg), "prestart"], io.BytesIO(state), io.BytesIO())
    err = capsys.readouterr().err
    grants = Ledger(str(fake.state_dir)).read().grants
    if admitted:
        assert rc == 0 and grants[CID].cpus, err
        return
    assert rc == 1 and grants == {}
    assert ": PathLimitError: " in err and err.count("\n") == 1, err
    assert f"{ASK} 'first' cannot be applied on the prestart path" in err and "runc 1.3" in err

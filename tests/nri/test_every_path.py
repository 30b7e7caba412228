"""One request, one result on every path: prestart, podman's precreate and NRI on fake nodes.

Each row of :data:`ROWS` is a request (its annotations) and what a user must see: the CPUs the
container gets, or the kind of the one-line refusal. Each row runs through three paths, each on
a fresh node of the same shape:

* ``prestart``: ``numa-pin-hook prestart`` with the bundle and OCI state a runtime pipes (numa-pin
  writes the container's cgroup; the effect read back is its ``cpuset.cpus``);
* ``precreate``: ``numa-pin-hook precreate`` with podman 4.3's proposed config (runtime-spec
  1.0.2) or a runtime-spec 1.3 one (the effect is ``linux.resources.cpu.cpus`` in its output);
* ``nri``: ``CreateContainer`` through the plugin (the effect is the adjustment's cpuset).

The grant and the effect must match across paths; a request a path cannot carry (a memory
policy or an exec CPU affinity at prestart, through NRI or to a runtime without
``linux.memoryPolicy`` or ``process.execCPUAffinity``) is refused on each with the same kind,
and nothing stays recorded. A resource added behind the seam reaches
both paths where the runtime applies the grant without a line changed in either.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.entry import hook as hook_main
from numa_pin.ledger.store import Ledger
from numa_pin.nri import messages as nri_messages
from numa_pin.resources.node.base import NodeResource
from numa_pin.resources.node.registry import register, unregister
from numa_pin.resources.node.runtime import RuntimeEdit
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

from .fake_runtime import Connected, container, pod

SHAPE = "laptop"
CID = "0f2a83a2d618ece3563383e4d2c110bfc35717b71b479661529c6d7a83acaedb"
MIB = 1 << 20

#: (id, annotations, expected: "exclusive" / "shared" / the refusal's kind, per path where it differs)
ROWS = [
    ("two-cpus", {"numa-pin.io/cpus": "2"}, {}),
    ("memory-only", {"numa-pin.io/memory": "64Mi"}, {}),
    ("too-many-cpus", {"numa-pin.io/cpus": "64"}, {}),
    ("memory-policy", {"numa-pin.io/cpus": "1", "numa-pin.io/memory-policy": "interleave"},
     {"precreate-1.3": "exclusive"}),
    ("cpu-shared", {"numa-pin.io/cpus": "2", "numa-pin.io/cpu-shared": "true"}, {}),
    ("cpu-shared-no-cpus", {"numa-pin.io/memory": "64Mi", "numa-pin.io/cpu-shared": "true"}, {}),
    ("exec-affinity", {"numa-pin.io/cpus": "1", "numa-pin.io/exec-cpu-affinity": "first"},
     {"precreate-1.3": "exclusive"}),
]
EXPECTED = {"two-cpus": "exclusive", "memory-only": "shared", "too-many-cpus": "TopologyAffinityError",
            "memory-policy": "PathLimitError", "cpu-shared": "mixed", "cpu-shared-no-cpus": "RequestError",
            "exec-affinity": "PathLimitError"}
PATHS = ["prestart", "precreate-1.0", "precreate-1.3", "nri"]


def _node(tmp_path, name: str) -> FakeNode:
    fake = FakeNode(tmp_path / name, SHAPE, machines=tmp_path / "machines", parent="libpod_parent")
    (fake.proc_root / "devices").write_text("Character devices:\n  1 mem\n\nBlock devices:\n")
    return fake


def _config(fake: FakeNode, monkeypatch, tmp_path):
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake.write_config(fake.root / "config.yaml", policy="restricted")


def _hook(cfg, stage: str, stdin: bytes) -> tuple[int, bytes]:
    out = io.BytesIO()
    return hook_main.run(["--config", str(cfg), stage], io.BytesIO(stdin), out), out.getvalue()


def _prestart(fake: FakeNode, cfg, annotations: dict[str, str]) -> frozenset[int] | None:
    pid = fake.add_container(CID, 4242)
    rc, _ = _hook(cfg, "prestart", fake.oci_state(CID, pid, annotations))
    return parse_list(fake.cpuset(CID)[0]) if rc == 0 else None


def _precreate(cfg, annotations: dict[str, str], version: str, env: dict[str, str] | None = None
               ) -> frozenset[int] | None:
    doc = {"ociVersion": version, "process": {"args": ["sh"], "env": ["PATH=/usr/bin"]},
           "annotations": {"io.container.manager": "libpod", **annotations},
           "linux": {"cgroupsPath": f"/libpod_parent/libpod-{CID}", "resources": {}}}
    rc, out = _hook(cfg, "precreate", json.dumps(doc).encode())
    if rc != 0:
        return None
    spec = json.loads(out)
    if env is not None:
        env.update(kv.split("=", 1) for kv in spec["process"]["env"])
    cpu = spec["linux"]["resources"].get("cpu", {})
    return parse_list(cpu["cpus"]) if "cpus" in cpu else frozenset()


def _nri(fake: FakeNode, annotations: dict[str, str], env: dict[str, str] | None = None
         ) -> tuple[frozenset[int] | None, str]:
    m = nri_messages.load()
    conn = Connected(NodeService(config_from_dict(fake.config_dict(policy="restricted"))), m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        p = pod(m, "u1", "p", "burstable")
        code, text, reply = conn.runtime.create(p, container(m, p, CID, cpu_milli=100, annotations=annotations))
    finally:
        conn.close()
    if env is not None and code == 0:
        env.update((kv.key, kv.value) for kv in reply.adjust.env)
    return (parse_list(reply.adjust.linux.resources.cpu.cpus) if code == 0 else None), text


def _run(path: str, tmp_path, monkeypatch, capsys, annotations: dict[str, str], env: dict[str, str] | None = None):
    """(the grant, the CPUs the container gets, the one line said) of one request on ``path``;
    ``env`` gets the variables the runtime would set (precreate, NRI: prestart sets none)."""
    fake = _node(tmp_path, path)
    cfg = _config(fake, monkeypatch, tmp_path)
    text = ""
    if path == "prestart":
        cpus = _prestart(fake, cfg, annotations)
    elif path.startswith("precreate"):
        cpus = _precreate(cfg, annotations, "1.0.2-dev" if path == "precreate-1.0" else "1.3.0", env)
    else:
        cpus, text = _nri(fake, annotations, env)
    text = text or capsys.readouterr().err.strip()
    return Ledger(str(fake.state_dir)).read().grants.get(CID), cpus, text, fake


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("row, annotations, per_path", ROWS, ids=[r[0] for r in ROWS])
def test_one_request_one_result_on_every_path(tmp_path, monkeypatch, capsys, row, annotations, per_path, path):
    grant, cpus, text, fake = _run(path, tmp_path, monkeypatch, capsys, annotations)
    want = per_path.get(path, EXPECTED[row])
    if want == "mixed":  # its exclusive CPUs, held as exclusive, and every CPU no grant holds
        assert grant is not None and grant.kind == "exclusive" and dict(grant.isolation) == {"shared": True}, text
        assert len(grant.cpus) == int(annotations["numa-pin.io/cpus"])
        assert cpus == frozenset(parse_list(fake.cpus)) and grant.cpus < cpus
        return
    if want in ("exclusive", "shared"):
        assert grant is not None and grant.kind == want, text
        if want == "exclusive":
            assert cpus == grant.cpus and len(grant.cpus) == int(annotations["numa-pin.io/cpus"])
        else:
            assert not grant.cpus and cpus == frozenset(parse_list(fake.cpus)), "a shared container gets the pool"
        return
    assert grant is None, "a refused container keeps nothing"
    assert cpus is None
    assert f": {want}: " in text and "\n" not in text, text
    if want == "PathLimitError":
        asked = next(k for k in annotations if k != "numa-pin.io/cpus")
        assert asked in text and f"on the {path.split('-')[0]} path" in text


@pytest.mark.parametrize("row", ["two-cpus", "memory-only", "cpu-shared"])
def test_every_path_grants_the_same_cpus(tmp_path, monkeypatch, capsys, row):
    annotations = dict(next(r[1] for r in ROWS if r[0] == row))
    results = {path: _run(path, tmp_path, monkeypatch, capsys, annotations) for path in PATHS}
    grants = {path: (r[0].kind, r[0].cpus, r[0].mems) for path, r in results.items()}
    effects = {path: r[1] for path, r in results.items()}
    assert len(set(grants.values())) == 1, grants
    assert len(set(effects.values())) == 1, effects


@pytest.mark.parametrize("path", ["precreate-1.0", "precreate-1.3", "nri"])
def test_a_mixed_container_is_told_its_exclusive_and_shared_cpus_where_the_runtime_sets_variables(
        tmp_path, monkeypatch, capsys, path):
    env: dict[str, str] = {}
    grant, cpus, text, _ = _run(path, tmp_path, monkeypatch, capsys, dict(next(a for r, a, _ in ROWS if r == "cpu-shared")), env)
    assert grant is not None and cpus is not None, text
    exclusive, shared = format_list(grant.cpus), format_list(cpus - grant.cpus)
    assert {k: env.get(k) for k in ("OPENSHIFT_ISOLATED_CPUS", "NUMA_PIN_EXCLUSIVE_CPUS")} == dict.fromkeys(
        ("OPENSHIFT_ISOLATED_CPUS", "NUMA_PIN_EXCLUSIVE_CPUS"), exclusive)
    assert env["OPENSHIFT_SHARED_CPUS"] == env["NUMA_PIN_SHARED_CPUS"] == shared


class Tag(NodeResource):
    """A resource added behind the seam: the runtime sets ``EXAMPLE_TAG`` in new containers."""

    name = "example.com/tag"

    def runtime(self, node, ask):
        return RuntimeEdit(env={"EXAMPLE_TAG": ask.grant.container_id}) if ask.request is not None else None


@pytest.fixture
def tag():
    resource = Tag()
    register(resource)
    yield resource
    unregister(resource)


def test_a_resource_added_behind_the_seam_reaches_precreate_and_nri(tmp_path, monkeypatch, tag):
    fake = _node(tmp_path, "precreate")
    doc = {"ociVersion": "1.0.2-dev", "process": {"env": []}, "annotations": {"numa-pin.io/cpus": "1"},
           "linux": {"cgroupsPath": f"/libpod_parent/libpod-{CID}", "resources": {}}}
    rc, out = _hook(_config(fake, monkeypatch, tmp_path), "precreate", json.dumps(doc).encode())
    assert rc == 0
    assert f"EXAMPLE_TAG={CID}" in json.loads(out)["process"]["env"]

    fake = _node(tmp_path, "nri")
    m = nri_messages.load()
    conn = Connected(NodeService(config_from_dict(fake.config_dict(policy="restricted"))), m)
    try:
        conn.runtime.configure()
        p = pod(m, "u1", "p", "")
        code, text, reply = conn.runtime.create(p, container(m, p, CID, cpu_milli=1000, limit_milli=1000,
                                                             memory=64 * MIB))
    finally:
        conn.close()
    assert code == 0, text
    assert {kv.key: kv.value for kv in reply.adjust.env}["EXAMPLE_TAG"] == CID


DOC = Path(__file__).resolve().parents[2] / "docs" / "paths.md"
DOC_PATHS = {"prestart": "prestart", "precreate (runtime-spec 1.0)": "precreate-1.0",
             "precreate (runtime-spec 1.3)": "precreate-1.3", "nri": "nri"}


def _doc_matrix() -> dict[str, dict[str, str]]:
    """``{request text: {path: cell}}`` from the table between the matrix markers of docs/paths.md."""
    text = DOC.read_text()
    table = text[text.index("<!-- matrix"):text.index("<!-- end matrix")].splitlines()[1:]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table if line.startswith("|")]
    header, body = rows[0], rows[2:]
    return {row[0]: {DOC_PATHS[h]: cell for h, cell in zip(header[1:], row[1:])} for row in body}


def _request_text(annotations: dict[str, str]) -> str:
    return ", ".join(f"`{k}: {v}`" for k, v in annotations.items())


def test_the_docs_table_is_the_matrix():
    documented = _doc_matrix()
    tested = {_request_text(a): {p: per.get(p, EXPECTED[row]) for p in PATHS} for row, a, per in ROWS}
    assert documented == tested
    assert all(re.fullmatch(r"exclusive|shared|mixed|[A-Za-z]+Error", c) for cells in documented.values()
               for c in cells.values())

"""``numa-pin nrt``: the node as a ``topology.node.k8s.io/v1alpha2`` ``NodeResourceTopology``.

Three independent checks:

* the schema: :data:`CRD_V1ALPHA2` is the ``openAPIV3Schema`` of the published CRD
  (k8stopologyawareschedwg/noderesourcetopology-api ``manifests/crd.yaml``, generated from
  its ``v1alpha2/types.go``), vendored under ``data/``, and :func:`validate` is a small structural validator for it
  (types, required, patterns, int-or-string, and no field the API server would prune);
* the quantities, for every kit machine shape, against numbers computed here from the
  machine's declarative spec (CPUs per node, MemTotal, hugepage pools, SLIT matrix, PCI
  functions), not from discovery, with a quantity parser written here;
* the ledger: a grant makes ``available`` drop by exactly what it holds, on the nodes it holds
  it, and nothing else changes.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from numa_pin.cli.main import main
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.ledger.store import Ledger
from numa_pin.testing import machine, shapes
from numa_pin.testing.machine import expected_topology

GIB = 1 << 30
QUANTITY = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
            r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
#: the published CRD (k8stopologyawareschedwg/noderesourcetopology-api ``manifests/crd.yaml``,
#: commit 7f99f9c2af03e0dd95ca81b650cd5f2427fbc8bd), vendored unchanged
CRD_FILE = Path(__file__).parent / "data" / "noderesourcetopology-crd.yaml"


def _crd_schema(version: str) -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return found["schema"]["openAPIV3Schema"]


#: ``spec.versions[name=v1alpha2].schema.openAPIV3Schema`` of the published CRD
CRD_V1ALPHA2: dict[str, Any] = _crd_schema("v1alpha2")
#: the scheduler plugin's names (noderesourcetopology-api v1alpha2 helper / its consumers)
ZONE_TYPE_NODE = "Node"
INT64 = (-(1 << 63), (1 << 63) - 1)


def validate(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema`` (the subset of OpenAPI v3 the CRD uses)."""
    errors: list[str] = []
    if "anyOf" in schema:
        if all(validate(value, alt, path) for alt in schema["anyOf"]):
            errors.append(f"{path}: {value!r} matches none of {schema['anyOf']}")
        if isinstance(value, str) and "pattern" in schema and not re.match(schema["pattern"], value):
            errors.append(f"{path}: {value!r} is not a quantity")
        return errors
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        errors += [f"{path}: missing {k}" for k in schema.get("required", ()) if k not in value]
        props = schema.get("properties")
        if props is not None:
            errors += [f"{path}: unknown field {k} (the API server prunes it)" for k in value if k not in props]
            for k, sub in props.items():
                if k in value:
                    errors += validate(value[k], sub, f"{path}.{k}")
    elif kind == "array":
        if not isinstance(value, list):
            return [f"{path}: not an array"]
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    elif kind == "string":
        if not isinstance(value, str):
            errors.append(f"{path}: {value!r} is not a string")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int) or not INT64[0] <= value <= INT64[1]:
            errors.append(f"{path}: {value!r} is not an int64")
    return errors


_SUFFIX = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def quantity(text: str) -> int:
    """A whole-number Kubernetes quantity string as an int (test-side parser)."""
    m = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?", text)
    assert m, f"{text!r} is not a whole quantity"
    return int(m.group(1)) * _SUFFIX[m.group(2) or ""]


# ---- the validator itself can fail -------------------------------------------------------


def _minimal() -> dict[str, Any]:
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": "n"}, "zones": [{"name": "node-0", "type": "Node", "costs": [
                {"name": "node-0", "value": 10}], "resources": [
                {"name": "cpu", "capacity": "4", "allocatable": "3", "available": 2}]}]}


@pytest.mark.parametrize("breaks, want", [
    (lambda o: o.pop("zones"), "missing zones"),
    (lambda o: o["zones"][0]["resources"][0].pop("available"), "missing available"),
    (lambda o: o["zones"][0]["resources"][0].update(capacity="4 Gi"), "not a quantity"),
    (lambda o: o["zones"][0]["resources"][0].update(capacity=4.5), "matches none"),
    (lambda o: o["zones"][0]["costs"][0].update(value="10"), "not an int64"),
    (lambda o: o["zones"][0].update(numa=0), "unknown field numa"),
    (lambda o: o.update(attributes=[{"name": "x"}]), "missing value"),
], ids=["no-zones", "no-available", "spaced-quantity", "float", "string-cost", "unknown-field", "attr-no-value"])
def test_validator_catches(breaks, want):
    assert validate(_minimal(), CRD_V1ALPHA2) == []
    obj = _minimal()
    breaks(obj)
    errors = validate(obj, CRD_V1ALPHA2)
    assert any(want in e for e in errors), errors


# ---- every kit machine -------------------------------------------------------------------


GPU_SELECTOR = {"vendors": ["0x10de"], "classes": ["0x0302", "0x0300"]}


def _config(tmp_path: Path, spec: machine.MachineSpec, reserved: list[int], **extra: Any) -> Path:
    doc = {
        "policy": "single-numa-node", "scope": "pod", "state_dir": str(tmp_path / "state"), "syslog": False,
        "cpu_manager": {"reserved_cpus": ",".join(map(str, reserved)) or None, "num_reserved_cpus": len(reserved)},
        "devices": {"nvidia.com/gpu": [GPU_SELECTOR], "example.com/vf": [{"is_vf": True}]},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(doc))
    return path


def _nrt(capsys, config: Path, built: machine.BuiltMachine, *extra: str) -> dict[str, Any]:
    rc = main(["nrt", "--config", str(config), "--sysfs-root", str(built.sysfs_root),
               "--proc-root", str(built.proc_root), "--node-name", "worker-7", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out) if "--json" in extra else yaml.safe_load(out)


def _spec_devices(spec: machine.MachineSpec) -> dict[str, dict[int, tuple[int, int]]]:
    """{resource: {node: (devices, devices with a driver)}} from the PCI spec."""
    out: dict[str, dict[int, tuple[int, int]]] = {"nvidia.com/gpu": {}, "example.com/vf": {}}

    def add(res: str, node: int | None, bound: bool) -> None:
        if node is None:
            return
        have, healthy = out[res].get(node, (0, 0))
        out[res][node] = (have + 1, healthy + bound)

    for dev in spec.pci:
        if dev.vendor == "0x10de" and dev.pci_class[:6] in ("0x0302", "0x0300"):
            add("nvidia.com/gpu", spec.pci_expected_node(dev), dev.driver is not None)
        for vf in dev.vfs:
            add("example.com/vf", spec.pci_expected_node(dev), vf.driver is not None)
    return out


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


@pytest.mark.parametrize("shape", sorted(shapes.SHAPES))
def test_every_kit_machine(shape, tmp_path, tmp_path_factory, capsys):
    spec = shapes.SHAPES[shape]()
    built = machine.build_once(spec, tmp_path_factory.getbasetemp() / "machines")
    cpus = sorted(c for n in spec.node_ids for c in spec.cpus_of_node(n))
    reserved = cpus[:1] + cpus[-1:]  # one CPU at each end: usually two different nodes
    config = _config(tmp_path, spec, reserved, policy_options={"max-allowable-numa-nodes": 64})
    obj = _nrt(capsys, config, built, "--json")

    assert validate(obj, CRD_V1ALPHA2) == []
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]) == (
        "topology.node.k8s.io/v1alpha2", "NodeResourceTopology", {"name": "worker-7"})
    assert obj["attributes"] == [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                                 {"name": "topologyManagerScope", "value": "pod"},
                                 {"name": "topologyManagerMaxNUMANodes", "value": "64"},
                                 {"name": "max-allowable-numa-nodes", "value": "64"}]
    assert obj["topologyPolicies"] == ["SingleNUMANodePodLevel"]
    zones = obj["zones"]
    # the kit's own reading: kernel defaults where a file is missing, hwloc's one node where
    # nothing tells the nodes apart
    expected = expected_topology(spec)
    node_ids = expected.node_ids
    assert [z["name"] for z in zones] == [f"node-{n}" for n in node_ids]
    assert {z["type"] for z in zones} == {ZONE_TYPE_NODE}
    devices = _spec_devices(spec)
    sizes = spec.hugepage_sizes()
    for node, zone in zip(node_ids, zones, strict=True):
        assert zone["costs"] == [{"name": f"node-{j}", "value": expected.distance(node, j)} for j in node_ids]
        res = {name: {k: quantity(v) for k, v in r.items() if k != "name"}
               for name, r in _by_name(zone["resources"]).items()}
        have = expected.nodes[node].cpus
        free = len(have - set(reserved))
        assert res["cpu"] == {"capacity": len(have), "allocatable": free, "available": free}
        huge_total = 0
        for size_kb in sizes:
            total = spec.node_hugepages(node).get(size_kb, (0, 0))[0] * size_kb * 1024
            huge_total += total
            name = f"hugepages-{size_kb // 1024}Mi" if size_kb < 1 << 20 else f"hugepages-{size_kb >> 20}Gi"
            assert res[name] == {"capacity": total, "allocatable": total, "available": total}, name
        mem = spec.node_memory_kb(node) * 1024
        assert res["memory"] == {"capacity": mem, "allocatable": mem - huge_total, "available": mem - huge_total}
        for name, per_node in devices.items():
            count, healthy = per_node.get(node, (0, 0))
            assert res[name] == {"capacity": count, "allocatable": healthy, "available": healthy}, name
        assert set(res) == {"cpu", "memory", *(f"hugepages-{s // 1024}Mi" if s < 1 << 20 else f"hugepages-{s >> 20}Gi"
                                                for s in sizes), *devices}


def test_yaml_and_json_are_the_same_object(tmp_path, tmp_path_factory, capsys):
    spec = shapes.SHAPES["gpu8-sriov"]()
    built = machine.build_once(spec, tmp_path_factory.getbasetemp() / "machines")
    config = _config(tmp_path, spec, [0])
    text_yaml = _nrt(capsys, config, built)
    assert text_yaml == _nrt(capsys, config, built, "--json")


def test_reserved_memory_lowers_allocatable_only_on_its_node(tmp_path, tmp_path_factory, capsys):
    spec = shapes.SHAPES["intel-2s-ht"]()
    built = machine.build_once(spec, tmp_path_factory.getbasetemp() / "machines")
    config = _config(tmp_path, spec, [0], reserved_memory={1: {"memory": "3Gi", "hugepages-2Mi": "4Mi"}})
    zones = _by_name(_nrt(capsys, config, built, "--json")["zones"])
    plain = _by_name(_nrt(capsys, _config(tmp_path, spec, [0]), built, "--json")["zones"])
    for name in ("node-0", "node-1"):
        for res in ("memory", "hugepages-2Mi"):
            got, base = _by_name(zones[name]["resources"])[res], _by_name(plain[name]["resources"])[res]
            cut = {"memory": 3 * GIB, "hugepages-2Mi": 4 << 20}[res] if name == "node-1" else 0
            assert quantity(got["capacity"]) == quantity(base["capacity"])
            assert quantity(got["allocatable"]) == quantity(base["allocatable"]) - cut
            assert quantity(got["available"]) == quantity(got["allocatable"])


def test_default_node_name_is_the_hostname(tmp_path, tmp_path_factory, capsys):
    import socket

    spec = shapes.SHAPES["laptop"]()
    built = machine.build_once(spec, tmp_path_factory.getbasetemp() / "machines")
    rc = main(["nrt", "--config", str(_config(tmp_path, spec, [0])), "--sysfs-root", str(built.sysfs_root),
               "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["metadata"]["name"] == socket.gethostname()


# ---- the ledger's effect on `available` ---------------------------------------------------


def _grant(cid: str, **kw: Any) -> Grant:
    base = dict(container_id=cid, pod_id=cid, container_name=cid, kind="exclusive", pid=None, start_time=None,
                cgroup=None, cpus=frozenset(), mems=frozenset(), devices={}, memory={}, affinity=None,
                policy="single-numa-node", scope="container", created=1.0, netdevs=())
    base.update(kw)
    return Grant(**base)


def test_grants_lower_available_exactly_where_they_are(tmp_path, tmp_path_factory, capsys):
    spec = shapes.SHAPES["gpu8-sriov"]()
    built = machine.build_once(spec, tmp_path_factory.getbasetemp() / "machines")
    config = _config(tmp_path, spec, [0])
    before = {z["name"]: _by_name(z["resources"]) for z in _nrt(capsys, config, built, "--json")["zones"]}
    node2 = sorted(spec.cpus_of_node(2))
    gpus_node3 = sorted(d.address for d in spec.pci if d.vendor == "0x10de" and spec.pci_expected_node(d) == 3)
    vfs_node0 = sorted(vf.address for d in spec.pci if spec.pci_expected_node(d) == 0 for vf in d.vfs)
    grants = [
        _grant("a", cpus=frozenset(node2[:3]), mems=frozenset({2}),
               memory={"memory": {2: 5 * GIB}, "hugepages-1Gi": {2: 2 * GIB}}),
        _grant("b", cpus=frozenset(), kind="shared"),  # shared: holds nothing exclusive
        _grant("c", devices={"nvidia.com/gpu": tuple(gpus_node3[:1]), "example.com/vf": tuple(vfs_node0[:2])},
               memory={"memory": {0: GIB, 1: GIB}}),
    ]
    with Ledger(str(tmp_path / "state")).transaction() as txn:
        state = LedgerState()
        for g in grants:
            state = state.with_grant(g)
        txn.state = state
    after = {z["name"]: _by_name(z["resources"]) for z in _nrt(capsys, config, built, "--json")["zones"]}
    taken = {("node-2", "cpu"): 3, ("node-2", "memory"): 5 * GIB, ("node-2", "hugepages-1Gi"): 2 * GIB,
             ("node-3", "nvidia.com/gpu"): 1, ("node-0", "example.com/vf"): 2,
             ("node-0", "memory"): GIB, ("node-1", "memory"): GIB}
    for zone, resources in before.items():
        for name, was in resources.items():
            now = after[zone][name]
            assert (now["capacity"], now["allocatable"]) == (was["capacity"], was["allocatable"])
            want = quantity(was["available"]) - taken.get((zone, name), 0)
            assert quantity(now["available"]) == want, (zone, name)


def test_an_admission_through_the_hook_shows_up(tmp_path, tmp_path_factory, capsys, monkeypatch):
    """The real path: numa-pin-hook admits on a fake node; NRT's available drops on the node the
    ledger says the grant is on, by what the ledger says it holds."""
    from numa_pin.entry.hook import run as hook_run
    from numa_pin.testing.node import FakeNode

    node = FakeNode(tmp_path / "node", "gpu8-sriov", machines=tmp_path_factory.getbasetemp() / "machines")
    node.add_container("c0", 4000)
    config = node.write_config(policy="single-numa-node", syslog=False,
                               devices={"nvidia.com/gpu": [GPU_SELECTOR]})
    spec = shapes.SHAPES["gpu8-sriov"]()
    built = machine.build_once(spec, tmp_path_factory.getbasetemp() / "machines")

    def zones() -> dict[str, dict[str, Any]]:
        return {z["name"]: _by_name(z["resources"]) for z in _nrt(capsys, config, built, "--json")["zones"]}

    before = zones()

    # no GPU here: granting one needs the NVIDIA proc files the fake node's proc tree lacks
    state = node.oci_state("c0", 4000, {"numa-pin.io/cpus": "4", "numa-pin.io/memory": "2Gi"})
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    assert hook_run(["--config", str(config), "prestart"], io.BytesIO(state)) == 0
    capsys.readouterr()
    grant = Ledger(str(node.state_dir)).read().grants["c0"]
    (numa,) = grant.mems
    after = zones()
    zone = f"node-{numa}"
    assert quantity(after[zone]["cpu"]["available"]) == quantity(before[zone]["cpu"]["available"]) - 4
    assert quantity(after[zone]["memory"]["available"]) == quantity(before[zone]["memory"]["available"]) - 2 * GIB
    assert after[zone]["nvidia.com/gpu"] == before[zone]["nvidia.com/gpu"]
    for other in set(before) - {zone}:
        assert after[other] == before[other]

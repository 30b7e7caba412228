"""``numa-pin-hook precreate`` on fake nodes: the decision lands in the config podman hands the runtime.

Oracles: the ledger (the spec must carry exactly the recorded grant), the kit machine's own
description (GPU minors and UUIDs written by ``numa_pin.testing``), and the device-rule evaluator of
:mod:`numa_pin.enforcer.gpu` (what a runtime allows after podman's deny-all rule).
"""

from __future__ import annotations

import io
import json
import shutil

import pytest

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.enforcer.gpu import DeviceRule, oci_allows, oci_rules_from_config
from numa_pin.entry import hook as hook_main
from numa_pin.hook.precreate import container_id_from_cgroups_path, runtime_features
from numa_pin.ledger.store import Ledger
from numa_pin.testing import machine, shapes
from numa_pin.testing.node import FakeNode

CID = "0f2a83a2d618ece3563383e4d2c110bfc35717b71b479661529c6d7a83acaedb"


@pytest.mark.parametrize(
    "path, expected",
    [
        (f"machine.slice:libpod:{CID}", CID),
        (f"/libpod_parent/libpod-{CID}", CID),
        (f"/machine.slice/libpod-{CID}.scope", CID),
        ("system.slice:crio:abc", "abc"),
        ("/mygroup/ctr-1", "ctr-1"),
        ("", None),
        (None, None),
    ],
    ids=["systemd", "cgroupfs", "scope-path", "crio", "plain", "empty", "none"],
)
def test_container_id_from_cgroups_path(path, expected):
    assert container_id_from_cgroups_path(path) == expected


@pytest.mark.parametrize(
    "version, native",
    [("1.0.2-dev", False), ("1.2.1", False), ("1.3.0", True), ("1.3.0-rc.1", True), ("2.0", True), (None, False),
     ("garbage", False)],
)
def test_native_fields_follow_the_spec_version(version, native):
    feats = runtime_features({"ociVersion": version} if version is not None else {})
    assert feats.net_devices is native and feats.memory_policy is native


def _proposed(annotations: dict[str, str], version: str = "1.0.2-dev", cid: str = CID, env=()) -> dict:
    """A config shaped like podman 4.3.1's proposed config (captured from a real run)."""
    return {
        "ociVersion": version,
        "process": {"args": ["sh"], "env": ["PATH=/usr/bin", *env]},
        "annotations": {"io.container.manager": "libpod", **annotations},
        "linux": {
            "cgroupsPath": f"/libpod_parent/libpod-{cid}",
            "resources": {"devices": [{"allow": False, "access": "rwm"}], "pids": {"limit": 2048}},
        },
    }


def _node(tmp_path, monkeypatch, shape="laptop", **config):
    fake = FakeNode(tmp_path, shape, parent="libpod_parent")  # where podman's cgroupfs driver puts containers
    built = machine.build_once(shapes.SHAPES[shape](), tmp_path / "machines")
    if (built.proc_root / "driver").is_dir():
        shutil.copytree(built.proc_root / "driver", fake.proc_root / "driver")
    (fake.proc_root / "devices").write_text("Character devices:\n  1 mem\n195 nvidia\n507 nvidia-uvm\n\nBlock devices:\n")
    cfg = fake.write_config(tmp_path / "config.yaml", settled=False, **{"policy": "restricted", **config})
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake, cfg


def _precreate(cfg, doc) -> tuple[int, dict | None]:
    out = io.BytesIO()
    rc = hook_main.run(["--config", str(cfg), "precreate"], io.BytesIO(json.dumps(doc).encode()), out)
    return rc, (json.loads(out.getvalue()) if out.getvalue() else None)


def test_exclusive_cpus_are_written_and_recorded_then_bound_and_released(tmp_path, monkeypatch, capsys):
    fake, cfg = _node(tmp_path, monkeypatch)
    rc, spec = _precreate(cfg, _proposed({"numa-pin.io/cpus": "2"}))
    assert rc == 0, capsys.readouterr().err
    grant = Ledger(str(fake.state_dir)).read().grants[CID]
    assert grant.pid is None and len(grant.cpus) == 2
    cpu = spec["linux"]["resources"]["cpu"]
    assert parse_list(cpu["cpus"]) == grant.cpus and parse_list(cpu["mems"]) == grant.mems
    assert spec["linux"]["resources"]["pids"] == {"limit": 2048}, "the rest of the config is kept"
    assert "memoryPolicy" not in spec["linux"], "podman 4.3's config is runtime-spec 1.0.2"

    # prestart binds the grant to the container's pid and cgroup and re-applies it
    fake.add_container(f"libpod-{CID}", 4242)
    state = json.dumps({"id": CID, "pid": 4242, "bundle": str(tmp_path), "status": "creating"}).encode()
    bundle_cfg = tmp_path / "config.json"
    bundle_cfg.write_text(json.dumps(spec))
    assert hook_main.run(["--config", str(cfg), "prestart"], io.BytesIO(state)) == 0
    bound = Ledger(str(fake.state_dir)).read().grants[CID]
    assert bound.pid == 4242 and bound.cgroup == f"/libpod_parent/libpod-{CID}" and bound.cpus == grant.cpus
    assert parse_list(fake.cpuset(f"libpod-{CID}")[0]) == grant.cpus

    stop = json.dumps({"id": CID, "bundle": str(tmp_path), "status": "stopped"}).encode()
    assert hook_main.run(["--config", str(cfg), "poststop"], io.BytesIO(stop)) == 0
    assert Ledger(str(fake.state_dir)).read().grants == {}


def test_a_container_that_asks_for_nothing_passes_through_unrecorded(tmp_path, monkeypatch):
    fake, cfg = _node(tmp_path, monkeypatch)
    doc = _proposed({})
    assert _precreate(cfg, doc) == (0, doc)
    assert Ledger(str(fake.state_dir)).read().grants == {}


def test_rejection_prints_one_line_no_config_and_keeps_nothing(tmp_path, monkeypatch, capsys):
    fake, cfg = _node(tmp_path, monkeypatch)
    rc, spec = _precreate(cfg, _proposed({"numa-pin.io/cpus": "64"}))
    err = capsys.readouterr().err
    assert rc == 1 and spec is None
    assert err.startswith(f"numa-pin: rejected {CID}: TopologyAffinityError:") and err.count("\n") == 1
    assert Ledger(str(fake.state_dir)).read().grants == {}


def test_a_request_without_a_container_id_is_refused_with_the_reason(tmp_path, monkeypatch, capsys):
    fake, cfg = _node(tmp_path, monkeypatch)
    doc = _proposed({"numa-pin.io/cpus": "1"})
    del doc["linux"]["cgroupsPath"]
    assert _precreate(cfg, doc) == (1, None)
    assert "linux.cgroupsPath" in capsys.readouterr().err
    assert Ledger(str(fake.state_dir)).read().grants == {}


def test_memory_policy_only_for_a_runtime_spec_that_has_it(tmp_path, monkeypatch):
    fake, cfg = _node(tmp_path, monkeypatch)
    rc, spec = _precreate(cfg, _proposed({"numa-pin.io/cpus": "1", "numa-pin.io/memory": "64Mi"}, version="1.3.0"))
    assert rc == 0
    grant = Ledger(str(fake.state_dir)).read().grants[CID]
    assert spec["linux"]["memoryPolicy"]["mode"] == "MPOL_BIND"
    assert parse_list(spec["linux"]["memoryPolicy"]["nodes"]) == grant.mems


def test_gpu_nodes_rules_and_env_in_the_config(tmp_path, monkeypatch, capsys):
    fake, cfg = _node(tmp_path, monkeypatch, shape="gpu8-sriov", policy="single-numa-node")
    rc, spec = _precreate(cfg, _proposed({"numa-pin.io/cpus": "2", "numa-pin.io/devices": "nvidia.com/gpu=1"}))
    assert rc == 0, capsys.readouterr().err
    grant = Ledger(str(fake.state_dir)).read().grants[CID]
    (address,) = grant.devices["nvidia.com/gpu"]
    kit = {g.address: g for g in machine.expected_topology(shapes.SHAPES["gpu8-sriov"]()).pci_devices}
    gpu = kit[address]
    paths = {d["path"]: (d["major"], d["minor"]) for d in spec["linux"]["devices"]}
    assert paths == {f"/dev/nvidia{gpu.gpu_minor}": (195, gpu.gpu_minor), "/dev/nvidiactl": (195, 255),
                     "/dev/nvidia-uvm": (507, 0), "/dev/nvidia-uvm-tools": (507, 1)}
    rules = oci_rules_from_config(spec)
    for major, minor in paths.values():
        assert oci_allows(rules, DeviceRule("c", major, minor))
    other = next(g for g in kit.values() if g.gpu_minor is not None and g.address != address)
    assert not oci_allows(rules, DeviceRule("c", 195, other.gpu_minor)), "podman's deny-all still holds"
    assert f"NVIDIA_VISIBLE_DEVICES={gpu.gpu_uuid}" in spec["process"]["env"]
    assert parse_list(spec["linux"]["resources"]["cpu"]["cpus"]) <= kit_cpus_of_node(gpu.numa_node)


_KIT_GPUS = sorted((d for d in machine.expected_topology(shapes.SHAPES["gpu8-sriov"]()).pci_devices
                    if d.gpu_minor is not None), key=lambda d: d.address)  # NVML's order: the index


@pytest.mark.parametrize("annotations, value, expected", [
    ({}, "3", "3"),
    ({}, "nvidia.com/gpu=5", "nvidia.com/gpu=5"),
    ({}, _KIT_GPUS[2].gpu_uuid, _KIT_GPUS[2].gpu_uuid),
    ({}, "nvidia.com/gpu=4,5", "nvidia.com/gpu=4,5"),
    ({"numa-pin.io/devices": "nvidia.com/gpu=1"}, "all", "<uuid>"),
    ({"numa-pin.io/devices": "nvidia.com/gpu=1"}, None, "<uuid>"),
], ids=["index", "cdi-name", "uuid", "cdi-name-and-index", "all-numa-pin-chooses", "numa-pin-chooses"])
def test_the_device_plugins_nvidia_visible_devices_stays_as_written_where_it_names_the_gpus_granted(
        tmp_path, monkeypatch, capsys, annotations, value, expected):
    """A device plugin that chose the GPUs keeps its own words for them (the NVIDIA container
    toolkit reads CDI names from that variable, not UUIDs); where numa-pin chooses, the variable
    is the granted GPUs' UUIDs. Oracle: the kit's GPUs (UUIDs, and NVML's index as address order)."""
    fake, cfg = _node(tmp_path, monkeypatch, shape="gpu8-sriov", policy="single-numa-node")
    env = [f"NVIDIA_VISIBLE_DEVICES={value}"] if value is not None else []
    rc, spec = _precreate(cfg, _proposed({"numa-pin.io/cpus": "2", **annotations}, env=env))
    assert rc == 0, capsys.readouterr().err
    granted = [a for ids in Ledger(str(fake.state_dir)).read().grants[CID].devices.values() for a in ids]
    uuids = ",".join(g.gpu_uuid for a in granted for g in _KIT_GPUS if g.address == a)
    listed = [kv for kv in spec["process"]["env"] if kv.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert listed == [f"NVIDIA_VISIBLE_DEVICES={expected.replace('<uuid>', uuids)}"]


def kit_cpus_of_node(node: int) -> frozenset[int]:
    topo = machine.expected_topology(shapes.SHAPES["gpu8-sriov"]())
    return frozenset(topo.nodes[node].cpus)


@pytest.mark.parametrize(
    "path, expected",
    [
        (f"/libpod_parent/libpod-{CID}", f"/libpod_parent/libpod-{CID}"),
        (f"machine.slice:libpod:{CID}", f"/machine.slice/libpod-{CID}.scope"),
        ("kubepods-burstable-pod12.slice:crio:abc",
         "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/crio-abc.scope"),
        ("system.slice:runc:x", "/system.slice/runc-x.scope"),
        ("nonsense", None),
        (None, None),
    ],
    ids=["cgroupfs", "systemd", "kubepods", "runc", "bad", "none"],
)
def test_expected_cgroup_follows_the_runtime_conventions(path, expected):
    """The systemd rows are the reference's worked example (slice expansion on dashes)."""
    from numa_pin.hook.precreate import expected_cgroup

    assert expected_cgroup(path) == expected


def test_a_container_the_runtime_never_made_loses_its_grant_after_the_grace(tmp_path, monkeypatch, capsys):
    """podman runs no poststop when the runtime fails after precreate (seen with podman 4.3.1)."""
    from numa_pin.base.record import replace
    from numa_pin.service.node import PENDING_GRACE_S

    fake, cfg = _node(tmp_path, monkeypatch)
    assert _precreate(cfg, _proposed({"numa-pin.io/cpus": "2"}))[0] == 0
    ledger = Ledger(str(fake.state_dir))
    grant = ledger.read().grants[CID]
    assert grant.cgroup == f"/libpod_parent/libpod-{CID}" and grant.pid is None
    other = "1" * 64
    assert _precreate(cfg, _proposed({"numa-pin.io/cpus": "1"}, cid=other))[0] == 0
    assert set(ledger.read().grants) == {CID, other}, "inside the grace both are kept"
    with ledger.transaction() as txn:
        txn.state = txn.state.with_grant(replace(grant, pending_since=grant.pending_since - PENDING_GRACE_S - 1))
    third = "2" * 64
    assert _precreate(cfg, _proposed({"numa-pin.io/cpus": "1"}, cid=third))[0] == 0, capsys.readouterr().err
    assert set(ledger.read().grants) == {other, third}, "the stale pending grant was collected"


@pytest.mark.parametrize("scope, settings, runtime_moves", [
    ("container", None, True), ("pod", None, False), ("container", "vlan=100,trust=on", False),
], ids=["container", "pod", "container-vf-config"])
def test_vfs_go_to_the_runtime_only_under_container_scope_without_settings(tmp_path, monkeypatch, capsys, scope,
                                                                           settings, runtime_moves):
    """Scope container: the runtime moves the VF (``linux.netDevices``, runtime-spec 1.3.0). Scope pod:
    the config does not name it, and prestart moves it once into the pod's network namespace. With
    ``numa-pin.io/vf-config`` neither: the runtime sets nothing on the PF, so prestart moves it with
    its settings (it was handed to the runtime, and prestart then refused the container)."""
    fake, cfg = _node(tmp_path, monkeypatch, shape="gpu8-sriov", policy="best-effort",
                      devices={"example.com/vf": [{"is_vf": True, "has_netdev": True}]})
    annotations = {"numa-pin.io/devices": "example.com/vf=1", "numa-pin.io/scope": scope, "numa-pin.io/pod": "web",
                   **({"numa-pin.io/vf-config": settings} if settings else {})}
    rc, spec = _precreate(cfg, _proposed(annotations, version="1.3.0"))
    assert rc == 0, capsys.readouterr().err
    grant = Ledger(str(fake.state_dir)).read().grants[CID]
    (vf,) = grant.devices["example.com/vf"]
    kit = {d.address: d for d in machine.expected_topology(shapes.SHAPES["gpu8-sriov"]()).pci_devices}
    if runtime_moves:
        assert spec["linux"]["netDevices"] == {kit[vf].netdevs[0]: {"name": "net1"}}
        assert [dict(e) for e in grant.netdevs] == [{"runtime": kit[vf].netdevs[0]}]
    else:
        assert "netDevices" not in spec["linux"] and grant.netdevs == ()


def _nested(levels: int) -> bytes:
    return b'{"linux": ' + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize(
    "data, reason",
    [
        (_nested(200), "nested more than"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b" " * (4 << 20) + b"{}", "larger than"),
    ],
    ids=["too-deep", "not-json", "not-an-object", "too-large"],
)
def test_the_proposed_config_is_bounded_like_every_hook_input(data, reason):
    """podman's proposed config on stdin meets the same size and depth bounds as config.json."""
    from numa_pin.errors import HookInputError
    from numa_pin.hook.oci import MAX_DEPTH
    from numa_pin.hook.precreate import read_proposed

    assert read_proposed(_nested(MAX_DEPTH - 1))["linux"]  # at the bound: read
    with pytest.raises(HookInputError, match=reason) as info:
        read_proposed(data)
    assert str(info.value).startswith("proposed config on stdin: ")


@pytest.mark.parametrize("mode, oci", [("interleave", "MPOL_INTERLEAVE"), ("preferred-many", "MPOL_PREFERRED_MANY"),
                                       ("bind", "MPOL_BIND"), ("weighted-interleave", "MPOL_WEIGHTED_INTERLEAVE")])
def test_the_memory_policy_asked_is_written_over_the_granted_nodes(tmp_path, monkeypatch, mode, oci):
    fake, cfg = _node(tmp_path, monkeypatch)
    (fake.sysfs_root / "kernel" / "mm" / "mempolicy" / "weighted_interleave").mkdir(parents=True, exist_ok=True)
    ann = {"numa-pin.io/cpus": "1", "numa-pin.io/memory-policy": mode}
    rc, spec = _precreate(cfg, _proposed(ann, version="1.3.0"))
    assert rc == 0
    grant = Ledger(str(fake.state_dir)).read().grants[CID]
    assert spec["linux"]["memoryPolicy"] == {"mode": oci, "nodes": format_list(grant.mems)}


@pytest.mark.parametrize("version, why", [("1.0.2", "linux.memoryPolicy"), ("1.3.0", "kernel 6.9")],
                         ids=["old-runtime-spec", "old-kernel"])
def test_a_policy_the_runtime_or_kernel_cannot_apply_is_refused_and_nothing_kept(tmp_path, monkeypatch, capsys,
                                                                                  version, why):
    fake, cfg = _node(tmp_path, monkeypatch)
    mode = "interleave" if why == "linux.memoryPolicy" else "weighted-interleave"
    rc, spec = _precreate(cfg, _proposed({"numa-pin.io/cpus": "1", "numa-pin.io/memory-policy": mode}, version=version))
    err = capsys.readouterr().err
    assert rc == 1 and spec is None and why in err and err.count("\n") == 1
    assert Ledger(str(fake.state_dir)).read().grants == {}

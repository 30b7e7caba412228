"""Ledger formats 3 and 4: GPU undo records and pod-level VFs get fields of their own (3), the
VF undo record is a JSON object instead of JSON text (4); versions 1 to 3 are read (migrated)
and version 4 is written.

The old documents are written out literally, as numa-pin 0.1 (format 1) and the format-2 and
format-3 releases left them, GPU record among ``netdevs`` and VF records as JSON text included,
rather than derived from today's ``to_dict``; ``tests/ledger/data/ledger-v*.json`` are such
files, checksum and all.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger.migrate import SNAPSHOT_ONLY_VERSION
from numa_pin.ledger.model import LEDGER_VERSION, Grant, LedgerState, PodNetdev, PodRecord
from numa_pin.ledger.records import GpuAccess
from numa_pin.ledger.store import Ledger, checksum, decode, encode

_VF_OBJECT = {"host_name": "ens2f0v1", "container_name": "net1", "netns": "/proc/4242/ns/net", "bdf": "0000:32:01.1"}
_VF_RECORD = json.dumps(_VF_OBJECT, sort_keys=True)  # what formats 1-3 kept: JSON text
_GPU_RECORD = json.dumps({"devices_dir": "/sys/fs/cgroup/devices/ctr/c1", "nodes": ["/dev/nvidia0"],
                          "rules": ["c 195:0 rwm"]}, sort_keys=True)


def _v1_grant(cid: str, **kw: Any) -> dict[str, Any]:
    g = {
        "container_id": cid, "pod_id": "pod-a", "container_name": "app", "kind": "exclusive", "pid": 4242,
        "start_time": 1700000000.25, "cgroup": f"ctr/{cid}", "cpus": "2-3", "mems": "0",
        "devices": {"nvidia.com/gpu": ["0000:07:00.0"], "example.com/vf": ["0000:32:01.1"]},
        "memory": {"memory": {"0": 1073741824}}, "affinity": "0", "policy": "restricted",
        "scope": "container", "created": 1700000001.5,
        "netdevs": [{"record": _VF_RECORD}, {"gpu": _GPU_RECORD}],
    }
    g.update(kw)
    return g


def _v1() -> dict[str, Any]:
    return {
        "version": 1, "written_by": "numa-pin 0.1.0",
        "grants": {"c1": _v1_grant("c1"), "c2": _v1_grant("c2", netdevs=[{"runtime": "ens2f0v2"}])},
        "pods": {"pod-a": {"pod_id": "pod-a", "affinity": "0", "policy": "restricted", "scope": "pod",
                           "created": 1700000000.0}},
    }


def _v2() -> dict[str, Any]:
    d = _v1()
    d["version"] = 2
    d["grants"]["c1"]["cpuset_limit"] = "0-7"
    d["grants"]["c2"]["cpuset_limit"] = None
    return d


@pytest.mark.parametrize("old", [_v1, _v2], ids=["version-1", "version-2"])
def test_old_versions_move_the_gpu_record_out_of_netdevs(old: Any) -> None:
    state = LedgerState.from_dict(old())
    c1, c2 = state.grants["c1"], state.grants["c2"]
    assert c1.gpus == GpuAccess(("/dev/nvidia0",), ("c 195:0 rwm",), "/sys/fs/cgroup/devices/ctr/c1")
    assert [dict(e) for e in c1.netdevs] == [{"record": _VF_OBJECT}], "the VF record stays, the GPU one left"
    assert c2.gpus is None and [dict(e) for e in c2.netdevs] == [{"runtime": "ens2f0v2"}]
    assert state.pods["pod-a"].netdevs == ()
    assert c1.cpuset_limit == (frozenset(range(8)) if old is _v2 else None)


def test_migrated_state_is_written_as_version_4() -> None:
    doc = json.loads(encode(LedgerState.from_dict(_v2()), SNAPSHOT_ONLY_VERSION))
    data = doc["data"]
    assert doc["version"] == data["version"] == SNAPSHOT_ONLY_VERSION == 4 and LEDGER_VERSION == 5
    g = data["grants"]["c1"]
    assert g["gpus"] == {"nodes": ["/dev/nvidia0"], "rules": ["c 195:0 rwm"],
                         "devices_dir": "/sys/fs/cgroup/devices/ctr/c1", "bpf_dirs": []}
    assert all("gpu" not in e for e in g["netdevs"])
    assert g["netdevs"] == [{"record": _VF_OBJECT}], "the VF record is structured data, not JSON text"
    assert data["pods"]["pod-a"]["netdevs"] == []
    assert LedgerState.from_dict(json.loads(json.dumps(data))) == LedgerState.from_dict(_v2())


def test_two_gpu_entries_of_one_version_2_grant_are_merged() -> None:
    d = _v2()
    other = json.dumps({"devices_dir": None, "nodes": ["/dev/nvidia1"], "rules": ["c 195:1 rwm"]})
    d["grants"]["c1"]["netdevs"].append({"gpu": other})
    gpus = LedgerState.from_dict(d).grants["c1"].gpus
    assert gpus is not None and gpus.nodes == ("/dev/nvidia0", "/dev/nvidia1")
    assert gpus.rules == ("c 195:0 rwm", "c 195:1 rwm") and gpus.devices_dir == "/sys/fs/cgroup/devices/ctr/c1"


@pytest.mark.parametrize("bad", ["not json", json.dumps([1]), json.dumps({"nodes": "x", "rules": []}), 7],
                         ids=["not-json", "a-list", "nodes-not-a-list", "not-a-string"])
def test_a_garbled_version_2_gpu_entry_is_corrupt_naming_the_grant(bad: Any) -> None:
    d = _v2()
    d["grants"]["c1"]["netdevs"][1] = {"gpu": bad}
    with pytest.raises(LedgerCorrupt, match="grant 'c1'"):
        LedgerState.from_dict(d)


def _signed_file(data: dict[str, Any]) -> bytes:
    doc = {"version": data["version"], "checksum": checksum(data), "data": data}
    return json.dumps(doc, indent=1, sort_keys=True).encode("ascii")


@pytest.mark.parametrize("old", [_v1, _v2], ids=["version-1", "version-2"])
def test_an_old_file_is_read_and_the_next_transaction_writes_version_4(tmp_path: Path, old: Any) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    path = state_dir / "ledger.json"
    path.write_bytes(_signed_file(old()))
    path.chmod(0o600)
    ledger = Ledger(state_dir)
    before = ledger.read()
    assert before.grants["c1"].gpus is not None
    with ledger.transaction() as txn:
        txn.remove("c2")
    doc = json.loads(path.read_text())
    assert doc["version"] == doc["data"]["version"] == 4 and doc["checksum"] == checksum(doc["data"])
    assert decode(path.read_bytes(), str(path)) == before.without("c2")


def test_an_old_file_with_a_bad_checksum_is_still_refused() -> None:
    raw = json.loads(_signed_file(_v2()))
    raw["data"]["grants"]["c1"]["cpus"] = "2-5"
    with pytest.raises(LedgerCorrupt, match="checksum mismatch"):
        decode(json.dumps(raw).encode(), "/x/ledger.json")


# ---- pod-level VFs -------------------------------------------------------------------


def _pod_vf(address: str = "0000:32:01.1", ifname: str = "net1", **kw: str) -> PodNetdev:
    fields = {"address": address, "resource": "example.com/vf", "ifname": ifname, "netns": "4:4026532281",
              "moved_by": "c1", "record": _VF_OBJECT}
    fields.update(kw)
    return PodNetdev(**fields)


def test_pod_vfs_round_trip_and_count_as_in_use() -> None:
    pod = PodRecord("pod-a", frozenset({0}), "restricted", "pod", 1.0, (_pod_vf(), _pod_vf("0000:32:01.2", "net2")))
    state = LedgerState({}, {"pod-a": pod})
    assert LedgerState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert state.devices_in_use("example.com/vf") == frozenset({"0000:32:01.1", "0000:32:01.2"})
    assert state.devices_in_use("nvidia.com/gpu") == frozenset()
    assert state.pod_netdev("0000:32:01.2") == ("pod-a", _pod_vf("0000:32:01.2", "net2"))
    assert state.pod_netdev("0000:32:01.3") is None and pod.netdev("0000:32:01.1") == _pod_vf()


@pytest.mark.parametrize(("make", "word"), [
    (lambda: PodRecord("p", netdevs=(_pod_vf(), _pod_vf(ifname="net2"))), "twice"),
    (lambda: PodRecord("p", netdevs=({"address": "x"},)), "PodNetdev"),
    (lambda: PodRecord("p", netdevs="net1"), "sequence"),
    (lambda: _pod_vf(netns=""), "netns"),
    (lambda: Grant("c", "p", "c", "shared", gpus={"nodes": []}), "GpuAccess"),
    (lambda: GpuAccess(nodes="/dev/nvidia0"), "nodes"),
    (lambda: GpuAccess(rules=(1,)), "rules"),
], ids=["vf-twice", "not-a-record", "a-string", "empty-netns", "gpus-dict", "nodes-string", "rules-int"])
def test_bad_values_are_refused(make: Any, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        make()


def _good() -> dict[str, Any]:
    g = Grant("c1", "pod-a", "app", "exclusive", gpus=GpuAccess(("/dev/nvidia0",), ("c 195:0 rwm",), None))
    return LedgerState({"c1": g}, {"pod-a": PodRecord("pod-a", netdevs=(_pod_vf(),))}).to_dict()


def _mutate(fn: Any) -> dict[str, Any]:
    d = copy.deepcopy(_good())
    fn(d)
    return d


CORRUPT = [
    ("grant_without_gpus", _mutate(lambda d: d["grants"]["c1"].pop("gpus")), "missing gpus"),
    ("gpus_list", _mutate(lambda d: d["grants"]["c1"].update(gpus=[])), "gpus"),
    ("gpus_extra_key", _mutate(lambda d: d["grants"]["c1"]["gpus"].update(uuid="x")), "unknown uuid"),
    ("gpus_nodes_int", _mutate(lambda d: d["grants"]["c1"]["gpus"].update(nodes=[1])), "nodes"),
    ("pod_without_netdevs", _mutate(lambda d: d["pods"]["pod-a"].pop("netdevs")), "missing netdevs"),
    ("pod_netdev_missing_key", _mutate(lambda d: d["pods"]["pod-a"]["netdevs"][0].pop("netns")), "missing netns"),
    ("pod_netdev_int", _mutate(lambda d: d["pods"]["pod-a"]["netdevs"][0].update(ifname=1)), "ifname"),
    ("pod_netdev_record_text", _mutate(lambda d: d["pods"]["pod-a"]["netdevs"][0].update(record=_VF_RECORD)),
     "record"),
    ("grant_netdev_record_list",
     _mutate(lambda d: d["grants"]["c1"].update(netdevs=[{"record": [_VF_OBJECT]}])), "netdevs"),
    ("pod_netdev_twice", _mutate(lambda d: d["pods"]["pod-a"]["netdevs"].append(d["pods"]["pod-a"]["netdevs"][0])),
     "twice"),
]


@pytest.mark.parametrize(("data", "word"), [(d, w) for _, d, w in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_version_4_shapes_are_checked(data: Any, word: str) -> None:
    with pytest.raises(LedgerCorrupt, match=word):
        LedgerState.from_dict(data)


def test_cgroup_v2_gpu_access_round_trips() -> None:
    """A v2 grant keeps the cgroup directories whose device programs got numa-pin's prologue."""
    access = GpuAccess(("/dev/nvidia0",), ("c 195:0 rwm",), None, ("/sys/fs/cgroup/x.scope/c", "/sys/fs/cgroup/x.scope"))
    assert GpuAccess.from_dict(json.loads(json.dumps(access.to_dict())), "grant 'g'") == access
    with pytest.raises(LedgerCorrupt, match="bpf_dirs"):
        GpuAccess.from_dict({**access.to_dict(), "bpf_dirs": "/sys/fs/cgroup/x.scope"}, "grant 'g'")


# ---- format 4: the VF undo record is structured data ---------------------------------


def _v3() -> dict[str, Any]:
    """A format-3 document as the format-3 releases wrote it: VF records as JSON text, in a
    grant's ``netdevs`` (scope container) and on a pod's netdevs (scope pod)."""
    d = LedgerState.from_dict(_v2()).to_dict()
    d["version"] = 3
    d["grants"]["c1"]["netdevs"] = [{"record": _VF_RECORD}]
    d["pods"]["pod-a"]["netdevs"] = [{"address": "0000:32:01.2", "resource": "example.com/vf", "ifname": "net1",
                                      "netns": "4:4026532281", "moved_by": "c1",
                                      "record": json.dumps({**_VF_OBJECT, "bdf": "0000:32:01.2"})}]
    return d


def test_version_3_vf_records_become_json_objects() -> None:
    state = LedgerState.from_dict(_v3())
    assert dict(state.grants["c1"].netdevs[0]) == {"record": _VF_OBJECT}
    assert state.pods["pod-a"].netdevs[0].record == {**_VF_OBJECT, "bdf": "0000:32:01.2"}
    assert state.devices_in_use("example.com/vf") >= {"0000:32:01.2"}


@pytest.mark.parametrize("bad", ["not json", json.dumps([1]), json.dumps("text"), "{" * 40 + "}" * 40],
                         ids=["not-json", "a-list", "a-string", "too-deep"])
@pytest.mark.parametrize("where", ["grant", "pod"])
def test_a_garbled_version_3_vf_record_is_corrupt_naming_its_owner(bad: str, where: str) -> None:
    d = _v3()
    if where == "grant":
        d["grants"]["c1"]["netdevs"][0]["record"] = bad
    else:
        d["pods"]["pod-a"]["netdevs"][0]["record"] = bad
    with pytest.raises(LedgerCorrupt, match=f"{where} '(c1|pod-a)'"):
        LedgerState.from_dict(d)


DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_real_old_file_is_read_migrated_and_rewritten_as_version_4(tmp_path: Path, version: int) -> None:
    """``data/ledger-v<N>.json``: files as the format-N releases wrote them (signed documents)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    path = state_dir / "ledger.json"
    raw = (DATA / f"ledger-v{version}.json").read_bytes()
    assert json.loads(raw)["version"] == version
    path.write_bytes(raw)
    path.chmod(0o600)
    ledger = Ledger(state_dir)
    before = ledger.read()
    assert dict(before.grants["c1"].netdevs[0]) == {"record": _VF_OBJECT}
    assert before.grants["c1"].gpus is not None
    if version == 3:
        assert before.pods["pod-a"].netdevs[0].record == {**_VF_OBJECT, "bdf": "0000:32:01.2"}
    with ledger.transaction() as txn:
        txn.remove("c2")
    doc = json.loads(path.read_text())
    assert doc["version"] == 4 and doc["checksum"] == checksum(doc["data"])
    assert doc["data"]["grants"]["c1"]["netdevs"] == [{"record": _VF_OBJECT}]
    assert decode(path.read_bytes(), str(path)) == before.without("c2")


def write_data_files() -> None:  # pragma: no cover - how data/ was made, kept for the record
    """``ledger-v1.json`` and ``ledger-v2.json`` are the literal documents above, signed.
    ``ledger-v3.json`` was written by the format-3 store itself (commit 03adb40's
    ``Ledger.transaction``), from ``_v2()`` migrated by that release plus one pod VF whose
    record is JSON text, as that release kept it."""
    DATA.mkdir(exist_ok=True)
    for version, make in ((1, _v1), (2, _v2)):
        (DATA / f"ledger-v{version}.json").write_bytes(_signed_file(make()) + b"\n")

"""How recovery tells exclusive from shared containers on a fake cpuset tree (issue 22, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.ledger.recovery import salvage, scan

ONLINE = parse_list("0-7")

# ({cgroup: "cpus|mems"}, {container id: kind}) on an 8-CPU node (mems "0" when not given)
CASES = [
    ({"/ctr/a": "2-3"}, {"a": "exclusive"}),
    ({"/ctr/a": "2-3", "/ctr/s": "0-1,4-7"}, {"a": "exclusive", "s": "shared"}),
    ({"/ctr/a": "2-3", "/ctr/s1": "0-1,4-7", "/ctr/s2": "0-1,4-7"}, {"a": "exclusive", "s1": "shared", "s2": "shared"}),
    ({"/ctr/a": "2-3", "/ctr/s": "0-1,4-7", "/ctr/l": "4-5"}, {"a": "exclusive", "s": "shared", "l": "shared"}),
    ({"/ctr/a": "2-3", "/ctr/s": "0-1,4-7", "/ctr/b": "0-7,"}, {"a": "exclusive", "s": "shared"}),
    ({"/ctr/a": "4-7|1", "/ctr/s": "0-3|0-1"}, {"a": "exclusive", "s": "shared"}),
    ({"/ctr/a": "0-5", "/ctr/s": "6-7"}, {"a": "shared", "s": "exclusive"}),  # ambiguous: see docs
    ({"/ctr/a": "2-3", "/ctr/b": "4-5"}, {"a": "exclusive", "b": "exclusive"}),
    ({"/system.slice/cron.service": "2-3", "/ctr/a": "4"}, {"a": "exclusive"}),
    ({"/ctr/docker-abc.scope": "2-3"}, {"abc": "exclusive"}),
]


@pytest.mark.parametrize("tree, kinds", CASES, ids=[
    "exclusive-alone", "pool-and-exclusive", "two-shared", "shared-with-own-cpuset", "all-online-not-tracked",
    "same-size-the-one-on-every-node-is-the-pool",
    "same-everything-the-larger-is-the-pool", "no-pool-all-exclusive", "systemd-unit-not-a-container", "runtime-leaf-prefix"])
def test_scan_tells_exclusive_from_shared(tmp_path: Path, tree, kinds) -> None:
    base = tmp_path / "cpuset"
    for rel, value in tree.items():
        cpus, _, mems = value.partition("|")
        d = base / rel.strip("/")
        d.mkdir(parents=True)
        (d / "cpuset.cpus").write_text(cpus.rstrip(",") + "\n")
        (d / "cpuset.mems").write_text((mems or "0") + "\n")
        (d / "cgroup.procs").write_text("1\n")
    found = scan(str(tmp_path), ONLINE)
    assert {cid: g.kind for cid, g in found.items()} == kinds
    for grant in found.values():
        if grant.kind == "exclusive":
            assert grant.cpus == parse_list((tmp_path / "cpuset" / grant.cgroup.strip("/") / "cpuset.cpus").read_text())


def test_an_empty_cgroup_is_no_container(tmp_path: Path) -> None:
    d = tmp_path / "cpuset" / "ctr" / "a"
    d.mkdir(parents=True)
    (d / "cpuset.cpus").write_text("2-3\n")
    (d / "cpuset.mems").write_text("0\n")
    (d / "cgroup.procs").write_text("")
    assert scan(str(tmp_path), ONLINE) == {}


@pytest.mark.parametrize("raw", [None, b"", b"\0" * 64, b"{", b"[]", b'{"data": 1}', b'{"data": {"grants": {"x": 1}}}'],
                         ids=["none", "empty", "zeroed", "cut", "list", "bad-data", "bad-grant"])
def test_salvage_takes_nothing_from_nothing(raw) -> None:
    assert salvage(raw) == ({}, {})


def test_salvage_keeps_each_entry_that_parses_under_its_own_key() -> None:
    """A refactor guard for salvage: good entries kept, a grant or pod filed under another key and
    an entry that does not parse dropped, grants and pods alike."""
    import json

    from numa_pin.ledger.model import Grant, PodRecord

    good, moved = Grant("a", "pod", "app", "exclusive", cpus={1}), Grant("b", "pod", "app", "exclusive", cpus={2})
    pod, other = PodRecord("pod-a", frozenset({0})), PodRecord("pod-b", frozenset({1}))
    data = {
        "grants": {"a": good.to_dict(), "x": moved.to_dict(), "c": {"container_id": "c"}, "d": 1},
        "pods": {"pod-a": pod.to_dict(), "pod-x": other.to_dict(), "pod-c": []},
    }
    assert salvage(json.dumps({"data": data}).encode()) == ({"a": good}, {"pod-a": pod})

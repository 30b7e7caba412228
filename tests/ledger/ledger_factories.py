"""Builders and hypothesis strategies for ledger tests (imported by tests/ledger/test_*.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from numa_pin.ledger.model import Grant, LedgerState, PodNetdev, PodRecord
from numa_pin.ledger.records import GpuAccess


def grant(cid: str = "c1", **kw: Any) -> Grant:
    """A valid exclusive grant; keyword arguments override fields."""
    fields: dict[str, Any] = {
        "container_id": cid,
        "pod_id": "pod-a",
        "container_name": "app",
        "kind": "exclusive",
        "pid": 4242,
        "start_time": 1700000000.25,
        "cgroup": f"kubepods/pod-a/{cid}",
        "cpus": frozenset({2, 3}),
        "mems": frozenset({0}),
        "devices": {"nvidia.com/gpu": ("GPU-0",)},
        "memory": {"memory": {0: 1 << 30}, "hugepages-2Mi": {0: 4 << 20}},
        "affinity": frozenset({0}),
        "policy": "single-numa-node",
        "scope": "container",
        "created": 1700000001.5,
        "netdevs": ({"address": "0000:3b:02.0", "ifname": "eth1", "netns": "/proc/4242/ns/net"},),
    }
    fields.update(kw)
    return Grant(**fields)


ids = st.frozensets(st.integers(min_value=0, max_value=300), max_size=8)
names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=4e9)


@st.composite
def grants(draw: st.DrawFn, cid: str | None = None) -> Grant:
    kind = draw(st.sampled_from(["exclusive", "shared", "process"]))
    return Grant(
        container_id=cid if cid is not None else draw(names),
        pod_id=draw(st.text(max_size=8)),
        container_name=draw(st.text(max_size=8)),
        kind=kind,
        pid=draw(st.none() | st.integers(min_value=1, max_value=2**22)),
        start_time=draw(st.none() | finite),
        cgroup=draw(st.none() | st.text(max_size=20)),
        cpus=frozenset() if kind == "shared" else draw(ids),
        mems=draw(ids),
        devices=draw(st.dictionaries(names, st.lists(names, max_size=3).map(tuple), max_size=2)),
        memory=draw(
            st.dictionaries(
                names,
                st.dictionaries(st.integers(0, 64), st.integers(0, 2**63 - 1), max_size=3),
                max_size=2,
            )
        ),
        affinity=draw(st.none() | ids),
        policy=draw(names),
        scope=draw(names),
        created=draw(finite),
        netdevs=tuple(draw(st.lists(st.fixed_dictionaries({"runtime": names}) | st.fixed_dictionaries(
            {"record": undo_records}), max_size=2))),
        gpus=draw(st.none() | gpu_access()),
    )


#: netdev undo records (ledger format 4): JSON objects, one nested object deep at most here
_leaves = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=10)
undo_records = st.dictionaries(st.text(max_size=8), _leaves | st.dictionaries(st.text(max_size=8), _leaves, max_size=3),
                               max_size=4)


@st.composite
def gpu_access(draw: st.DrawFn) -> GpuAccess:
    strs = st.lists(st.text(max_size=12), max_size=3).map(tuple)
    return GpuAccess(draw(strs), draw(strs), draw(st.none() | names))


@st.composite
def pod_netdevs(draw: st.DrawFn) -> tuple[PodNetdev, ...]:
    addresses = draw(st.lists(names, max_size=3, unique=True))
    return tuple(PodNetdev(a, draw(names), draw(names), draw(names), draw(names), draw(undo_records))
                 for a in addresses)


@st.composite
def states(draw: st.DrawFn) -> LedgerState:
    cids = draw(st.lists(names, max_size=5, unique=True))
    gs = {cid: draw(grants(cid=cid)) for cid in cids}
    pod_ids = draw(st.lists(names, max_size=3, unique=True))
    pods = {
        pid: PodRecord(pid, draw(st.none() | ids), draw(names), draw(names), draw(finite), draw(pod_netdevs()))
        for pid in pod_ids
    }
    return LedgerState(gs, pods)

"""Pure ledger model: values, queries, updates, (de)serialisation and migration."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ledger_factories import grant, grants, states

from numa_pin import __version__
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger.model import LEDGER_VERSION, Grant, LedgerState, PodRecord, migrate

# ---- construction ------------------------------------------------------------------

BAD_GRANTS = [
    ({"kind": "gpu"}, "kind"),
    ({"container_id": ""}, "container_id"),
    ({"container_id": 7}, "container_id"),
    ({"pid": 0}, "pid"),
    ({"pid": True}, "pid"),
    ({"pid": "12"}, "pid"),
    ({"start_time": float("nan")}, "start_time"),
    ({"created": float("inf")}, "created"),
    ({"cpus": {-1}}, "cpus"),
    ({"cpus": "0-3"}, "cpus"),
    ({"mems": {1.5}}, "mems"),
    ({"kind": "shared", "cpus": {1}}, "shared"),
    ({"devices": {"nvidia.com/gpu": "GPU-0"}}, "devices"),
    ({"devices": {"": ("x",)}}, "devices"),
    ({"memory": {"memory": {0: -1}}}, "memory"),
    ({"memory": {"memory": {"0": 1}}}, "memory"),
    ({"affinity": {"a"}}, "affinity"),
    ({"netdevs": ({"a": 1},)}, "netdevs"),
    ({"netdevs": {"a": "b"}}, "netdevs"),
    ({"policy": ""}, "policy"),
]


@pytest.mark.parametrize(
    ("override", "word"), BAD_GRANTS, ids=[f"{next(iter(o))}-{i}" for i, (o, _) in enumerate(BAD_GRANTS)]
)
def test_grant_rejects_bad_fields(override: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        grant(**override)


def test_grant_normalises_containers() -> None:
    g = grant(cpus=[3, 2, 3], mems=(0,), devices={"r": ["a", "b"]}, affinity=[0, 1])
    assert g.cpus == frozenset({2, 3}) and isinstance(g.cpus, frozenset)
    assert g.devices["r"] == ("a", "b")
    assert g.affinity == frozenset({0, 1})
    with pytest.raises(TypeError):
        g.devices["r"] = ("c",)  # type: ignore[index]
    assert hash(g) == hash(grant(cpus=[2, 3], mems=(0,), devices={"r": ["a", "b"]}, affinity=[0, 1]))


def test_state_rejects_mismatched_keys() -> None:
    with pytest.raises(ValueError, match="c9"):
        LedgerState({"c9": grant("c1")})
    with pytest.raises(ValueError, match="p9"):
        LedgerState({}, {"p9": PodRecord("p1")})


# ---- queries -----------------------------------------------------------------------


def _state() -> LedgerState:
    return LedgerState(
        {
            "a": grant("a", cpus={2, 3}, devices={"gpu": ("G0",)}, memory={"memory": {0: 100}}),
            "b": grant("b", pod_id="pod-b", cpus={4}, devices={"gpu": ("G1",), "nic": ("vf0",)},
                       memory={"memory": {0: 5, 1: 7}, "hugepages-1Gi": {1: 1 << 30}}),
            "s": grant("s", pod_id="pod-b", kind="shared", cpus=frozenset(), devices={}, memory={}),
        },
        {"pod-b": PodRecord("pod-b", frozenset({1}), "restricted", "pod", 1.0)},
    )


QUERIES = [
    ("exclusive_cpus", lambda s: s.exclusive_cpus(), frozenset({2, 3, 4})),
    ("devices_gpu", lambda s: s.devices_in_use("gpu"), frozenset({"G0", "G1"})),
    ("devices_nic", lambda s: s.devices_in_use("nic"), frozenset({"vf0"})),
    ("devices_unknown", lambda s: s.devices_in_use("fpga"), frozenset()),
    ("memory", lambda s: s.memory_in_use(), {"memory": {0: 105, 1: 7}, "hugepages-1Gi": {1: 1 << 30}}),
    ("pod_b", lambda s: tuple(g.container_id for g in s.grants_of_pod("pod-b")), ("b", "s")),
    ("pod_none", lambda s: s.grants_of_pod("nope"), ()),
    ("shared", lambda s: tuple(g.container_id for g in s.shared_grants()), ("s",)),
    ("grant", lambda s: s.grant("a").container_id, "a"),
    ("grant_missing", lambda s: s.grant("zz"), None),
    ("overlaps_cpu", lambda s: s.overlaps(grant("x", cpus={4}, devices={})), ("b",)),
    ("overlaps_dev", lambda s: s.overlaps(grant("x", cpus=set(), devices={"gpu": ("G0",)})), ("a",)),
    ("overlaps_self", lambda s: s.overlaps(s.grant("a")), ()),
]


@pytest.mark.parametrize(("query", "expected"), [(q, e) for _, q, e in QUERIES], ids=[n for n, _, _ in QUERIES])
def test_queries(query: Any, expected: Any) -> None:
    assert query(_state()) == expected


def test_updates_are_pure() -> None:
    s0 = _state()
    snapshot = s0.to_dict()
    s1 = s0.with_grant(grant("new", cpus={9}))
    s2 = s1.without("a").with_pod(PodRecord("pod-z")).without_pod("pod-b")
    assert s0.to_dict() == snapshot
    assert set(s2.grants) == {"b", "s", "new"}
    assert set(s2.pods) == {"pod-z"}
    assert s0.without("missing") is s0 and s0.without_pod("missing") is s0
    replaced = s0.with_grant(grant("a", cpus={7}))
    assert replaced.grant("a").cpus == frozenset({7}) and len(replaced.grants) == 3


# ---- serialisation -----------------------------------------------------------------


@given(states())
def test_roundtrip_through_json(state: LedgerState) -> None:
    text = json.dumps(state.to_dict(), allow_nan=False)
    assert LedgerState.from_dict(json.loads(text)) == state


@given(grants())
def test_grant_roundtrip(g: Grant) -> None:
    assert Grant.from_dict(json.loads(json.dumps(g.to_dict()))) == g


def test_to_dict_is_readable() -> None:
    d = grant(cpus={0, 1, 2, 3, 8}, mems={0, 1}).to_dict()
    assert d["cpus"] == "0-3,8" and d["mems"] == "0-1"
    assert d["memory"]["memory"] == {"0": 1 << 30}
    data = LedgerState().to_dict()
    assert data == {"version": LEDGER_VERSION, "written_by": f"numa-pin {__version__}", "grants": {}, "pods": {}}


def _good() -> dict[str, Any]:
    return LedgerState({"c1": grant("c1")}, {"pod-a": PodRecord("pod-a")}).to_dict()


def _mutate(fn: Any) -> dict[str, Any]:
    d = copy.deepcopy(_good())
    fn(d)
    return d


CORRUPT = [
    ("not_dict", ["x"], "JSON object"),
    ("no_version", _mutate(lambda d: d.pop("version")), "version"),
    ("bool_version", _mutate(lambda d: d.update(version=True)), "version"),
    ("version_zero", _mutate(lambda d: d.update(version=0)), "unknown ledger format version 0"),
    ("extra_top", _mutate(lambda d: d.update(extra=1)), "unknown extra"),
    ("grants_list", _mutate(lambda d: d.update(grants=[])), "grants"),
    ("grant_missing_key", _mutate(lambda d: d["grants"]["c1"].pop("cpus")), "missing cpus"),
    ("grant_extra_key", _mutate(lambda d: d["grants"]["c1"].update(color="red")), "unknown color"),
    ("grant_key_mismatch", _mutate(lambda d: d["grants"].update(c2=d["grants"].pop("c1"))), "c2"),
    ("cpus_int", _mutate(lambda d: d["grants"]["c1"].update(cpus=3)), "cpus"),
    ("cpus_garbage", _mutate(lambda d: d["grants"]["c1"].update(cpus="0-x")), "not a number"),
    ("pid_bool", _mutate(lambda d: d["grants"]["c1"].update(pid=True)), "pid"),
    ("pid_negative", _mutate(lambda d: d["grants"]["c1"].update(pid=-4)), "pid"),
    ("kind_unknown", _mutate(lambda d: d["grants"]["c1"].update(kind="vm")), "kind"),
    ("memory_node", _mutate(lambda d: d["grants"]["c1"]["memory"]["memory"].update({"x": 1})), "node id"),
    ("memory_node_leading_zero", _mutate(lambda d: d["grants"]["c1"]["memory"]["memory"].update({"01": 1})), "node id"),
    ("memory_not_obj", _mutate(lambda d: d["grants"]["c1"]["memory"].update(memory=[1])), "memory"),
    ("netdev_value", _mutate(lambda d: d["grants"]["c1"].update(netdevs=[{"a": 1}])), "netdevs"),
    ("created_str", _mutate(lambda d: d["grants"]["c1"].update(created="now")), "created"),
    ("pod_missing_key", _mutate(lambda d: d["pods"]["pod-a"].pop("scope")), "missing scope"),
    ("pod_affinity", _mutate(lambda d: d["pods"]["pod-a"].update(affinity=[0])), "affinity"),
]


@pytest.mark.parametrize(("data", "word"), [(d, w) for _, d, w in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_from_dict_refuses_bad_shapes(data: Any, word: str) -> None:
    with pytest.raises(LedgerCorrupt, match=word):
        LedgerState.from_dict(data)


def test_newer_version_names_the_writer() -> None:
    d = _good()
    d.update(version=LEDGER_VERSION + 1, written_by="numa-pin 9.4.0")
    with pytest.raises(LedgerCorrupt) as info:
        LedgerState.from_dict(d)
    message = str(info.value)
    assert "numa-pin 9.4.0" in message
    assert f"version {LEDGER_VERSION + 1}" in message
    assert __version__ in message


def test_newer_version_without_writer() -> None:
    with pytest.raises(LedgerCorrupt, match="a newer numa-pin"):
        migrate({"version": 99})


def test_migration_hook_runs_steps_in_order() -> None:
    calls: list[int] = []

    def step(n: int) -> Any:
        def run(d: dict[str, Any]) -> dict[str, Any]:
            calls.append(n)
            return {**d, "version": n + 1, f"seen{n}": True}

        return run

    out = migrate({"version": 1}, migrations={1: step(1), 2: step(2)}, current=3)
    assert calls == [1, 2]
    assert out == {"version": 3, "seen1": True, "seen2": True}


def test_version_1_ledgers_gain_an_empty_cpuset_limit() -> None:
    g = Grant("c1", "p", "c1", "shared", cpuset_limit=frozenset({1, 2}))
    v2 = LedgerState({"c1": g}).to_dict()
    v1 = {**v2, "version": 1, "grants": {"c1": {k: v for k, v in v2["grants"]["c1"].items() if k != "cpuset_limit"}}}
    state = LedgerState.from_dict(v1)
    assert state.grants["c1"].cpuset_limit is None
    assert LedgerState.from_dict(v2).grants["c1"] == g and v2["grants"]["c1"]["cpuset_limit"] == "1-2"


def test_migration_must_advance_version() -> None:
    with pytest.raises(LedgerCorrupt, match="did not produce version 2"):
        migrate({"version": 1}, migrations={1: lambda d: d}, current=2)


def test_missing_migration_step() -> None:
    with pytest.raises(LedgerCorrupt, match="no migration"):
        migrate({"version": 1}, migrations={}, current=2)


_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=15,
)
_grant_like = st.fixed_dictionaries(
    {},
    optional={key: _json_values for key in grant().to_dict()},
)


_data_like = st.fixed_dictionaries({
    "version": st.sampled_from([1, 2, 3]),
    "written_by": st.text(max_size=5),
    "grants": st.dictionaries(st.text(max_size=4), _grant_like, max_size=2),
    "pods": _json_values,
})


@given(st.one_of(_json_values, _data_like))
def test_random_data_raises_only_ledger_corrupt(data: Any) -> None:
    try:
        state = LedgerState.from_dict(data)
    except LedgerCorrupt:
        pass
    else:
        assert isinstance(state, LedgerState)

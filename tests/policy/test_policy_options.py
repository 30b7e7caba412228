"""Policy options, load-time checks, the policy registry and scopes (kubelet §5-§7)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_strategies import DETERMINISTIC

from numa_pin.errors import PolicyError, TopologyError
from numa_pin.policy.base import NumaInfo, Ranker, flatten_providers
from numa_pin.policy.hint import TopologyHint
from numa_pin.policy.options import PolicyOptions, check_machine, parse_bool, parse_int, parse_options
from numa_pin.policy.reference import reference_merge
from numa_pin.policy.registry import POLICIES, SCOPES, check_scope, get_policy, merge_hints

PC, MAX = "prefer-closest-numa-nodes", "max-allowable-numa-nodes"

GOOD = [
    ("no options", None, PolicyOptions(False, 8)),
    ("empty options", {}, PolicyOptions(False, 8)),
    ("kubelet: closest and max 8", {PC: "true", MAX: "8"}, PolicyOptions(True, 8)),
    ("kubelet: max 12", {MAX: "12"}, PolicyOptions(False, 12)),
    ("bool 1", {PC: "1"}, PolicyOptions(True, 8)),
    ("bool t", {PC: "t"}, PolicyOptions(True, 8)),
    ("bool T", {PC: "T"}, PolicyOptions(True, 8)),
    ("bool TRUE", {PC: "TRUE"}, PolicyOptions(True, 8)),
    ("bool True", {PC: "True"}, PolicyOptions(True, 8)),
    ("bool 0", {PC: "0"}, PolicyOptions(False, 8)),
    ("bool f", {PC: "f"}, PolicyOptions(False, 8)),
    ("bool F", {PC: "F"}, PolicyOptions(False, 8)),
    ("bool FALSE", {PC: "FALSE"}, PolicyOptions(False, 8)),
    ("bool false", {PC: "false"}, PolicyOptions(False, 8)),
    ("bool False", {PC: "False"}, PolicyOptions(False, 8)),
    ("yaml bool", {PC: True}, PolicyOptions(True, 8)),
    ("yaml int", {MAX: 64}, PolicyOptions(False, 64)),
    ("yaml int for a bool", {PC: 1}, PolicyOptions(True, 8)),
    ("atoi plus sign", {MAX: "+16"}, PolicyOptions(False, 16)),
    ("atoi leading zeros", {MAX: "0010"}, PolicyOptions(False, 10)),
]


@pytest.mark.parametrize("raw,expected", [g[1:] for g in GOOD], ids=[g[0] for g in GOOD])
def test_parse_options(raw: dict[str, object] | None, expected: PolicyOptions) -> None:
    assert parse_options(raw) == expected  # type: ignore[arg-type]


BAD = [
    ("unknown option", {"numa-allocation-strategy": "x"}, 'unknown Topology Manager Policy option: "numa-allocation-strategy"'),
    ("unknown option quoted like %q", {'we"ird': "1"}, 'unknown Topology Manager Policy option: "we\\"ird"'),
    ("max below 8", {MAX: "7"}, 'the minimum value of "max-allowable-numa-nodes" should not be less than 8'),
    ("max negative", {MAX: "-8"}, 'the minimum value of "max-allowable-numa-nodes" should not be less than 8'),
    ("max not an integer", {MAX: "abc"}, 'unable to convert policy option to integer "max-allowable-numa-nodes": strconv.Atoi: parsing "abc": invalid syntax'),
    ("max float", {MAX: "8.0"}, 'unable to convert policy option to integer "max-allowable-numa-nodes": strconv.Atoi: parsing "8.0": invalid syntax'),
    ("max underscore", {MAX: "1_000"}, "unable to convert policy option to integer"),
    ("max space", {MAX: " 8"}, "unable to convert policy option to integer"),
    ("max empty", {MAX: ""}, "unable to convert policy option to integer"),
    ("max yaml bool", {MAX: True}, "unable to convert policy option to integer"),
    ("max out of int64", {MAX: "9223372036854775808"}, 'unable to convert policy option to integer "max-allowable-numa-nodes": strconv.Atoi: parsing "9223372036854775808": value out of range'),
    ("bool yes", {PC: "yes"}, 'bad value for option "prefer-closest-numa-nodes": strconv.ParseBool: parsing "yes": invalid syntax'),
    ("bool mixed case", {PC: "TrUe"}, 'bad value for option "prefer-closest-numa-nodes"'),
    ("bool 2", {PC: 2}, 'bad value for option "prefer-closest-numa-nodes"'),
]


@pytest.mark.parametrize("raw,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_parse_options_errors(raw: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_options(raw)  # type: ignore[arg-type]
    assert str(err.value).startswith(message)


GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
            "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


@DETERMINISTIC
@given(st.one_of(st.sampled_from(sorted(GO_BOOLS)), st.text(max_size=6)))
def test_parse_bool_is_go_parsebool(text: str) -> None:
    if text in GO_BOOLS:
        assert parse_bool(text) is GO_BOOLS[text]
    else:
        with pytest.raises(ValueError, match="strconv.ParseBool"):
            parse_bool(text)


@DETERMINISTIC
@given(st.one_of(st.integers(-(2**64), 2**64).map(str), st.from_regex(r"[+\-]?[0-9_ .a-f]{0,5}", fullmatch=True)))
def test_parse_int_is_go_atoi(text: str) -> None:
    well_formed = re.fullmatch(r"[+-]?[0-9]+", text) is not None
    if well_formed and -(2**63) <= int(text) < 2**63:
        assert parse_int(text) == int(text)
    else:
        with pytest.raises(ValueError, match="strconv.Atoi"):
            parse_int(text)


@DETERMINISTIC
@given(st.booleans(), st.integers(8, 10_000))
def test_options_round_trip(closest: bool, max_nodes: int) -> None:
    raw = {PC: "true" if closest else "false", MAX: str(max_nodes)}
    assert parse_options(raw) == PolicyOptions(closest, max_nodes)


# -- check_machine: kubelet NewManager order

DIST4 = {n: [10 if n == m else 20 for m in range(4)] for n in range(4)}

MACHINE_OK = [
    ("none skips everything", "none", {"bogus": "x", MAX: "1"}, 100, None, PolicyOptions()),
    ("best-effort on 8 nodes", "best-effort", None, 8, None, PolicyOptions()),
    ("max raised to 16", "restricted", {MAX: "16"}, 16, None, PolicyOptions(False, 16)),
    ("64 nodes with max 64", "single-numa-node", {MAX: 64}, 64, None, PolicyOptions(False, 64)),
    ("closest with distances", "best-effort", {PC: "true"}, 4, DIST4, PolicyOptions(True, 8)),
    ("already parsed options", "best-effort", PolicyOptions(False, 9), 9, None, PolicyOptions(False, 9)),
]


@pytest.mark.parametrize(
    "policy,options,nodes,distances,expected", [m[1:] for m in MACHINE_OK], ids=[m[0] for m in MACHINE_OK]
)
def test_check_machine_ok(policy: str, options: object, nodes: int, distances: object, expected: PolicyOptions) -> None:
    assert check_machine(policy, options, nodes, distances) == expected  # type: ignore[arg-type]


MACHINE_BAD = [
    ("9 nodes, default max (kubelet TestNewManager)", "best-effort", None, 9, None, "unsupported on machines with more than 8 NUMA Nodes"),
    ("13 nodes, max 12", "restricted", {MAX: "12"}, 13, None, "unsupported on machines with more than 12 NUMA Nodes"),
    ("the message says how to lift the limit", "best-effort", None, 9, None, "max-allowable-numa-nodes"),
    ("options are checked before nodes", "best-effort", {MAX: "7"}, 9, None, "should not be less than 8"),
    ("closest without distances", "best-effort", {PC: "true"}, 4, None, "NUMA distances"),
    ("closest with a short row", "single-numa-node", {PC: "true"}, 4, {**DIST4, 3: [20, 20]}, "node(s) 3"),
    ("distances are checked before nodes", "best-effort", {PC: "true"}, 9, None, "NUMA distances"),
]


@pytest.mark.parametrize(
    "policy,options,nodes,distances,message", [m[1:] for m in MACHINE_BAD], ids=[m[0] for m in MACHINE_BAD]
)
def test_check_machine_errors(policy: str, options: object, nodes: int, distances: object, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        check_machine(policy, options, nodes, distances)  # type: ignore[arg-type]


# kubelet: NewManager wraps NewNUMAInfo's "error getting NUMA distances ..." in "cannot discover NUMA
# topology: ..."; those words come first wherever numa-pin refuses for missing distances
KUBELET_DISTANCE_WORDS = "^cannot discover NUMA topology: error getting NUMA distances"
MISSING_DISTANCES = [
    ("check_machine", lambda: check_machine("best-effort", {PC: "true"}, 2, None)),  # type: ignore[arg-type]
    ("merge ranker", lambda: Ranker(NumaInfo.build([0, 1], None), closest=True)),
    ("reference merge", lambda: reference_merge("best-effort", [], [0, 1], None, prefer_closest=True)),
]


@pytest.mark.parametrize("where", [m[1] for m in MISSING_DISTANCES], ids=[m[0] for m in MISSING_DISTANCES])
def test_missing_distances_keep_kubelets_words_first(where) -> None:
    with pytest.raises(PolicyError, match=KUBELET_DISTANCE_WORDS) as err:
        where()
    assert "prefer-closest-numa-nodes" in str(err.value), "then numa-pin's detail"


def test_check_machine_accepts_node_ids() -> None:
    distances = {0: [10, 20], 8: [20, 10]}
    assert check_machine("best-effort", {PC: "1"}, [8, 0], distances) == PolicyOptions(True, 8)


# -- registry, scopes, admission

@pytest.mark.parametrize("name", sorted(POLICIES), ids=sorted(POLICIES))
def test_registry_names(name: str) -> None:
    policy = get_policy(name, {PC: "true"})
    assert policy.name == name
    assert policy.options == PolicyOptions(True, 8)


@pytest.mark.parametrize("name", ["", "Best-Effort", "strict", "single_numa_node"], ids=["empty", "case", "fork-only", "underscore"])
def test_unknown_policy(name: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(f'unknown policy: "{name}"')):
        get_policy(name)


@pytest.mark.parametrize("name", list(SCOPES), ids=list(SCOPES))
def test_scopes(name: str) -> None:
    assert check_scope(name) == name


@pytest.mark.parametrize("name", ["", "Pod", "node"], ids=["empty", "case", "node"])
def test_unknown_scope(name: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(f'unknown scope: "{name}"')):
        check_scope(name)


ADMIT = [
    ("none", TopologyHint(None, False), True),
    ("best-effort", TopologyHint([0], False), True),
    ("restricted", TopologyHint([0], False), False),
    ("restricted", TopologyHint([0, 1], True), True),
    ("single-numa-node", TopologyHint(None, False), False),
    ("single-numa-node", TopologyHint(None, True), True),
    ("single-numa-node", TopologyHint([1], True), True),
]


@pytest.mark.parametrize("name,hint,admit", ADMIT, ids=[f"{a[0]}-{a[1]}" for a in ADMIT])
def test_can_admit(name: str, hint: TopologyHint, admit: bool) -> None:
    assert get_policy(name).can_admit(hint) is admit


def test_none_policy_ignores_hints() -> None:
    hint = get_policy("none").merge([{"r": "not even hints"}], NumaInfo.build([0, 1]))  # type: ignore[dict-item]
    assert hint == TopologyHint(None, False)


# -- input validation

@pytest.mark.parametrize(
    "nodes,distances",
    [([0, 0], None), ([-1, 0], None), ([0, 1], {0: [10, "x"], 1: [20, 10]}), ([0, 1], {0: [10, -1], 1: [20, 10]})],
    ids=["duplicate", "negative", "non-integer distance", "negative distance"],
)
def test_numa_info_rejects(nodes: list[int], distances: dict[int, list[object]] | None) -> None:
    with pytest.raises(TopologyError):
        NumaInfo.build(nodes, distances)  # type: ignore[arg-type]


@pytest.mark.parametrize("impl", [merge_hints, reference_merge], ids=["merge", "reference"])
def test_closest_without_distances_is_a_policy_error(impl: object) -> None:
    with pytest.raises(PolicyError, match="NUMA distances"):
        impl("best-effort", [{"r": [TopologyHint([0], True)]}], [0, 1], None, True)  # type: ignore[operator]


@pytest.mark.parametrize("impl", [merge_hints, reference_merge], ids=["merge", "reference"])
def test_single_numa_node_does_not_need_distances(impl: object) -> None:
    got = impl("single-numa-node", [{"r": [TopologyHint([1], True)]}], [0, 1], None, True)  # type: ignore[operator]
    assert got == (TopologyHint([1], True), True)


@pytest.mark.parametrize(
    "providers,where",
    [([{"cpu": [TopologyHint([0], True), "0"]}], "resource 'cpu'"), ([["not a mapping"]], "provider 0")],
    ids=["bad hint", "bad provider"],
)
def test_flatten_rejects_malformed_answers(providers: list[object], where: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(where)):
        flatten_providers(providers)  # type: ignore[arg-type]

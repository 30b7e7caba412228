"""A decision made on a snapshot, checked against the ledger as it is at commit (issue 21).

Oracle: the decision itself, made again on the ledger at commit time (``decide`` on ``T``), for
what may be committed; and the ledger's own queries for what is still free. Each case changes
the ledger between the snapshot ``S`` and the commit ``T`` the way a concurrent writer does.
"""

from __future__ import annotations

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.admission.validate import revalidate
from numa_pin.ledger.model import Grant, LedgerState, PodRecord
from numa_pin.requests.request import request_from_oci
from numa_pin.testing import machine, shapes

TOPO = machine.expected_topology(shapes.SHAPES["intel-2s-ht"]())
GPU8 = machine.expected_topology(shapes.SHAPES["gpu8-sriov"]())
SETTINGS = NodeSettings(policy="restricted")


def held(cid: str, cpus=frozenset(), pod: str | None = None, **kw) -> Grant:
    """A grant another writer committed."""
    return Grant(cid, pod or f"pod-{cid}", cid, "exclusive" if cpus else "shared", pid=1, cgroup=f"/c/{cid}",
                 cpus=frozenset(cpus), **kw)


def check(topo, annotations: dict[str, str], snapshot: LedgerState, change):
    """(decision on S, revalidate's answer on T = change(S, decision), T)."""
    request = request_from_oci("me", annotations)
    decision = decide(topo, snapshot, request, SETTINGS)
    assert decision.admit, decision.reason
    now = change(snapshot, decision)
    memo: dict = {}

    def remember(key, make):
        if key not in memo:
            memo[key] = make()
        return memo[key]

    return decision, revalidate(decision, request, snapshot, now, topology=topo, settings=SETTINGS,
                                memo=remember), now


def node_cpus(topo, node: int) -> frozenset[int]:
    return topo.nodes[node].cpus


def fill_node_but(topo, node: int, keep: int):
    """A writer that takes every free CPU of ``node`` but ``keep``."""
    def change(state: LedgerState, decision) -> LedgerState:
        free = sorted(node_cpus(topo, node) - state.exclusive_cpus() - {0})  # 0: the reserved CPU
        return state.with_grant(held("filler", free[: len(free) - keep]))
    return change


CPU4 = {"numa-pin.io/cpus": "4"}
POD = {"numa-pin.io/cpus": "4", "numa-pin.io/scope": "pod", "io.kubernetes.cri.sandbox-id": "p1"}

#: (id, machine, request, snapshot, change, expected: "same" | "repicked" | "moved" | None)
CASES = [
    ("unchanged", TOPO, CPU4, LedgerState(), lambda s, d: s, "same"),
    ("others-admitted-elsewhere", TOPO, CPU4, LedgerState(),
     lambda s, d: s.with_grant(held("other", node_cpus(TOPO, 1) - d.cpus)), "same"),
    ("others-released", TOPO, CPU4, LedgerState({"old": held("old", {8, 9})}), lambda s, d: s.without("old"), "same"),
    ("cpus-taken-repicked-in-the-hint", TOPO, CPU4, LedgerState(),
     lambda s, d: s.with_grant(held("rival", d.cpus)), "repicked"),
    ("node-full-one-node-request-moves", TOPO, CPU4, LedgerState(), fill_node_but(TOPO, 0, 2), "moved"),
    ("node-full-inside-a-pod-record", TOPO, POD,
     LedgerState({"sib": held("sib", {1}, pod="p1")}, {"p1": PodRecord("p1", frozenset({0}), "restricted", "pod")}),
     fill_node_but(TOPO, 0, 2), None),
    ("pod-record-made-meanwhile", TOPO, POD, LedgerState(),
     lambda s, d: s.with_grant(held("sib", {20}, pod="p1")).with_pod(
         PodRecord("p1", frozenset({1}), "restricted", "pod")), None),
    ("memory-assignment-added", TOPO, {"numa-pin.io/cpus": "2", "numa-pin.io/memory": "1Gi"}, LedgerState(),
     lambda s, d: s.with_grant(held("mem", {20}, memory={"memory": {1: 1 << 30}})), None),
    ("memory-assignment-released", TOPO, {"numa-pin.io/cpus": "2", "numa-pin.io/memory": "1Gi"},
     LedgerState({"mem": held("mem", {20}, memory={"memory": {1: 1 << 30}})}), lambda s, d: s.without("mem"), "same"),
    ("device-taken", GPU8, {"numa-pin.io/devices": "nvidia.com/gpu=1"}, LedgerState(),
     lambda s, d: s.with_grant(held("gpu", devices=dict(d.devices))), None),
    ("shared-cpuset-starved", TOPO, CPU4, LedgerState(),
     lambda s, d: s.with_grant(held("lim", cpuset_limit=d.cpus)), None),
]


@pytest.mark.parametrize(("topo", "annotations", "snapshot", "change", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_revalidate(topo, annotations, snapshot, change, expected):
    decision, result, now = check(topo, annotations, snapshot, change)
    if expected is None:
        assert result is None
        return
    assert result is not None
    if expected == "same":
        assert result is decision
        return
    others = now.exclusive_cpus()
    assert len(result.cpus) == len(decision.cpus) and not result.cpus & others
    afresh = decide(topo, now, request_from_oci("me", annotations), SETTINGS)  # the oracle
    assert afresh.admit
    nodes = {topo.cpus[c].numa for c in result.cpus}
    assert nodes == set(afresh.hint.affinity), "one NUMA node, where a decision made now would put it"
    if expected == "repicked":
        assert result.hint == decision.hint and result.mems == decision.mems
    else:  # moved
        assert result.hint.affinity != decision.hint.affinity
        assert result.mems == afresh.mems and result.hint == afresh.hint and result.reason == afresh.reason

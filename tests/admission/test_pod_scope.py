"""Pod scope keeps every container of a pod inside the pod's affinity (issue 9, item 1).

The decisions run on the kit's machine shapes; the ledger is updated the way
:meth:`numa_pin.service.node.NodeService.admit` and ``release`` update it (grant, pod record at the
pod's first merge, record dropped with the pod's last grant). The oracle is the machine model
itself: the NUMA node of every granted CPU, memory node and device.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numa_pin.admission.decide import Decision, NodeSettings, decide
from numa_pin.errors import RequestError
from numa_pin.ledger.model import Grant, LedgerState, PodRecord
from numa_pin.requests.request import ContainerRequest, request_from_oci
from numa_pin.testing import machine, shapes

GIB = 1 << 30
SANDBOX = "io.kubernetes.cri.sandbox-id"
STRICT = ("restricted", "single-numa-node")

_TOPOLOGIES: dict = {}


def topo(name):
    if name not in _TOPOLOGIES:
        _TOPOLOGIES[name] = machine.expected_topology(shapes.SHAPES[name]())
    return _TOPOLOGIES[name]


def nodes_of(t, cpus):
    return {t.cpus[c].numa for c in cpus}


def admitted(state: LedgerState, request: ContainerRequest, d: Decision) -> LedgerState:
    """What the service commits for an admitted decision."""
    grant = Grant(request.container_id, request.pod_id, request.name, "exclusive" if d.cpus else "shared",
                  cpus=d.cpus, mems=d.mems, devices=d.devices, memory=d.memory, affinity=d.hint.affinity,
                  policy=d.policy, scope=d.scope)
    state = state.with_grant(grant)
    if d.pod_affinity is not None and request.pod_id not in state.pods:
        state = state.with_pod(PodRecord(request.pod_id, d.pod_affinity, d.policy, d.scope))
    return state


def released(state: LedgerState, container_id: str) -> LedgerState:
    """What the service commits at release: the grant goes, and the pod record with its last grant."""
    grant = state.grants[container_id]
    state = state.without(container_id)
    if not state.grants_of_pod(grant.pod_id):
        state = state.without_pod(grant.pod_id)
    return state


def run(t, state, steps, settings):
    """Decide ``(container_id, annotations)`` steps in order; returns the state and the decisions."""
    out = []
    for cid, ann in steps:
        req = request_from_oci(cid, ann)
        d = decide(t, state, req, settings)
        out.append(d)
        if d.admit:
            state = admitted(state, req, d)
    return state, out


SNN_POD = NodeSettings(policy="single-numa-node", scope="pod")


@pytest.mark.parametrize("total", [{"numa-pin.io/pod-cpus": "4"}, {}], ids=["pod-cpus-4", "no-total"])
def test_same_sandbox_second_container_does_not_spill(total):
    """The issue's example: cpus=2 then cpus=14 in one sandbox; node 0 keeps 13 free CPUs after
    the first (CPU 0 is reserved), so the second cannot fit the pod's node and is rejected."""
    t = topo("intel-2s-ht")
    sb = {SANDBOX: "sb1", **total}
    state, (first, second) = run(t, LedgerState(), [
        ("a", {**sb, "numa-pin.io/cpus": "2"}), ("b", {**sb, "numa-pin.io/cpus": "14"})], SNN_POD)
    assert first.admit and first.pod_affinity is not None and len(first.pod_affinity) == 1
    (node,) = first.pod_affinity
    free_after_first = len(t.nodes[node].cpus - {0} - first.cpus)
    assert free_after_first < 14
    assert not second.admit and second.cpus == frozenset()
    assert second.error.kind == "TopologyAffinityError"
    assert second.reason == (
        f"single-numa-node policy: pod sb1 is aligned to NUMA node(s) {node}, and only {free_after_first} of the "
        f"14 CPUs requested are free there (cpu 14 requested, free per node: "
        + " ".join(f"{n}={len(t.nodes[n].cpus - {0} - first.cpus)}" for n in t.node_ids) + ")"
    )
    assert set(state.grants) == {"a"}


def test_same_sandbox_second_container_that_fits_stays_on_the_pods_node():
    t = topo("intel-2s-ht")
    sb = {SANDBOX: "sb1"}
    _, (first, second) = run(t, LedgerState(), [
        ("a", {**sb, "numa-pin.io/cpus": "2"}), ("b", {**sb, "numa-pin.io/cpus": "12"})], SNN_POD)
    assert first.admit and second.admit
    assert nodes_of(t, second.cpus) == set(first.pod_affinity) and not second.cpus & first.cpus


@pytest.mark.parametrize("policy", STRICT)
def test_understated_pod_total_is_no_way_around_the_policy(policy):
    """pod-cpus=1 with cpus=20: the merge asks for max(1, 20) CPUs, exactly as the same container
    alone (container scope) would be judged."""
    t = topo("intel-2s-ht")
    ann = {SANDBOX: "sb1", "numa-pin.io/cpus": "20", "numa-pin.io/pod-cpus": "1"}
    pod = decide(t, LedgerState(), request_from_oci("a", ann), NodeSettings(policy=policy, scope="pod"))
    alone = decide(t, LedgerState(), request_from_oci("a", ann), NodeSettings(policy=policy, scope="container"))
    assert pod.admit == alone.admit
    if policy == "single-numa-node":
        assert not pod.admit and "cpu 20 requested" in pod.reason
    else:  # 20 CPUs need both nodes: restricted admits the preferred two-node hint, as container scope
        assert pod.hint.affinity == alone.hint.affinity == frozenset(t.node_ids)


def test_borrowed_pod_is_refused():
    """A container without sandbox annotations naming a sandbox's pod joins nothing."""
    t = topo("intel-2s-ht")
    state, (first,) = run(t, LedgerState(), [("a", {SANDBOX: "sb1", "numa-pin.io/cpus": "2"})], SNN_POD)
    assert first.admit and "sb1" in state.pods
    thief = request_from_oci("x", {"numa-pin.io/scope": "pod", "numa-pin.io/pod": "sb1", "numa-pin.io/cpus": "20"})
    with pytest.raises(RequestError, match=r"^numa-pin.io/pod: pod 'sb1' belongs to another sandbox"):
        decide(t, state, thief, NodeSettings(policy="best-effort", scope="pod"))


def test_user_pod_never_captures_a_sandbox():
    """A user pod named like a sandbox that starts later: the sandbox's containers do not join it."""
    t = topo("intel-2s-ht")
    user = request_from_oci("u", {"numa-pin.io/pod": "sb1", "numa-pin.io/cpus": "2"})
    sandboxed = request_from_oci("a", {SANDBOX: "sb1", "numa-pin.io/cpus": "2"})
    assert user.pod_id == "user:sb1" and sandboxed.pod_id == "sb1"
    state, _ = run(t, LedgerState(), [("u", {"numa-pin.io/pod": "sb1", "numa-pin.io/cpus": "2"})], SNN_POD)
    d = decide(t, state, sandboxed, SNN_POD)
    assert d.admit and d.pod_affinity is not None, "the sandbox's first container makes its own merge"


def test_later_container_memory_stays_inside_the_pod():
    """intel-2s-ht has about 53 GiB free per node: 60 GiB in a pod aligned to one node is refused, where the
    memory allocator alone would widen to both nodes."""
    t = topo("intel-2s-ht")
    pod = {SANDBOX: "sb1"}
    _, (first, second) = run(t, LedgerState(), [
        ("a", {**pod, "numa-pin.io/cpus": "2", "numa-pin.io/memory": "1Gi"}),
        ("b", {**pod, "numa-pin.io/memory": "60Gi"})], NodeSettings(policy="restricted", scope="pod"))
    assert first.admit and len(first.pod_affinity) == 1
    assert not second.admit and "the memory requested does not fit there" in second.reason


def test_device_plugin_gpu_outside_the_pod_is_refused():
    t = topo("gpu8-sriov")
    gpu = next(d for d in t.pci_devices if d.kind == "gpu" and d.numa_node == 2)
    pod = {SANDBOX: "sb1"}
    state, (first,) = run(t, LedgerState(), [("a", {**pod, "numa-pin.io/cpus": "2"})], SNN_POD)
    assert first.admit and 2 not in first.pod_affinity
    req = request_from_oci("b", {**pod, "numa-pin.io/cpus": "2"}, {"NVIDIA_VISIBLE_DEVICES": gpu.gpu_uuid})
    d = decide(t, state, req, SNN_POD)
    assert not d.admit and f"nvidia.com/gpu {gpu.address} (already assigned) is on NUMA node(s) 2" in d.reason


def test_pod_record_lives_as_long_as_its_containers():
    t = topo("intel-2s-ht")
    sb = {SANDBOX: "sb1"}
    state, _ = run(t, LedgerState(), [("a", {**sb, "numa-pin.io/cpus": "2"}), ("b", {**sb, "numa-pin.io/cpus": "2"})],
                   SNN_POD)
    state = released(state, "a")
    assert "sb1" in state.pods
    state = released(state, "b")
    assert "sb1" not in state.pods


# ---- property: random pods never leave their affinity ------------------------------------

@st.composite
def pods(draw):
    """Up to three pods of init and app containers with random requests, totals and order."""
    steps = []
    for p in range(draw(st.integers(1, 3))):
        ann = {SANDBOX: f"sb{p}"} if draw(st.booleans()) else {"numa-pin.io/pod": f"p{p}"}
        if draw(st.booleans()):
            ann["numa-pin.io/pod-cpus"] = str(draw(st.integers(0, 24)))
        if draw(st.booleans()):
            ann["numa-pin.io/pod-memory"] = f"{draw(st.integers(1, 80))}Gi"
        for c in range(draw(st.integers(1, 4))):
            own = dict(ann)
            cpus = draw(st.integers(0, 16))
            if cpus:
                own["numa-pin.io/cpus"] = str(cpus)
            if draw(st.booleans()):
                own["numa-pin.io/memory"] = f"{draw(st.integers(1, 70))}Gi"
            steps.append((f"p{p}c{c}", own, draw(st.sampled_from(["init", "app"]))))
    return draw(st.permutations(steps))


@settings(max_examples=150)
@given(
    shape=st.sampled_from(["intel-2s-ht", "gpu8-sriov"]),
    policy=st.sampled_from(STRICT),
    busy=st.integers(0, 12),
    steps=pods(),
)
def test_no_admitted_container_leaves_its_pods_affinity(shape, policy, busy, steps):
    t = topo(shape)
    settings_ = NodeSettings(policy=policy, scope="pod")
    taken = frozenset(sorted(t.nodes[t.node_ids[-1]].cpus - {0})[:busy])
    state = LedgerState({"busy": Grant("busy", "busy", "busy", "exclusive", cpus=taken)}) if taken else LedgerState()
    for cid, ann, kind in steps:
        req = request_from_oci(cid, ann)
        d = decide(t, state, req, settings_)
        if not d.admit:
            assert d.cpus == frozenset() and d.reason
            continue
        state = admitted(state, req, d)
        if d.cpus or d.memory:
            record = state.pods[req.pod_id]
            assert record.affinity is not None
            if policy == "single-numa-node":
                assert len(record.affinity) == 1
            assert nodes_of(t, d.cpus) <= record.affinity, (cid, sorted(d.cpus), record.affinity)
            assert d.mems <= record.affinity
            assert all(set(per) <= record.affinity for per in d.memory.values())
        assert all(g.cpus.isdisjoint(d.cpus) for g in state.grants.values() if g.container_id != cid)
        if kind == "init":  # an init container runs to completion before the next one starts
            state = released(state, cid)

"""The NRI plugin against a fake runtime speaking real ttrpc and mux frames over a socketpair.

Oracles: the ledger (what the answer carries must be the recorded grant), the machine's own
description (a Guaranteed container's CPUs sit on one NUMA node; the shared pool is every CPU
no exclusive grant holds), the reason file the hook would write, and NRI's own rules (event bits,
split synchronisation, stream ids) as the fake runtime enforces them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.nri import messages as nri_messages
from numa_pin.reporting.report import read_reason
from numa_pin.service.node import NodeService
from numa_pin.testing import machine, shapes
from numa_pin.testing.node import FakeNode

from .fake_runtime import Connected, container, pod, resize

GI = 1 << 30
SHAPE = "intel-2s-ht"
TOPOLOGY = machine.expected_topology(shapes.SHAPES[SHAPE]())
ALL = frozenset(TOPOLOGY.cpu_ids)
NODE_CPUS = {n: frozenset(c for c in TOPOLOGY.cpu_ids if TOPOLOGY.cpus[c].numa == n) for n in TOPOLOGY.node_ids}


@pytest.fixture
def m() -> nri_messages.Messages:
    return nri_messages.load()


@pytest.fixture
def node(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> FakeNode:
    return FakeNode(tmp_path / "n", SHAPE, machines=tmp_path_factory.getbasetemp() / "machines", parent="")


def service(node: FakeNode) -> NodeService:
    return NodeService(config_from_dict(node.config_dict(policy="restricted")))


@pytest.fixture
def plugin(node: FakeNode, m: nri_messages.Messages):
    conn = Connected(service(node), m)
    conn.runtime.configure()
    conn.runtime.synchronize([], [])
    yield conn
    conn.close()


def _cpus(resources) -> frozenset[int]:
    return parse_list(resources.cpu.cpus)


def _node_of(cpus: frozenset[int]) -> set[int]:
    return {n for n, on in NODE_CPUS.items() if cpus & on}


def test_it_registers_and_subscribes_to_what_it_handles(node: FakeNode, m: nri_messages.Messages) -> None:
    conn = Connected(service(node), m)
    try:
        assert (conn.runtime.registered.plugin_name, conn.runtime.registered.plugin_idx) == ("numa-pin", "50")
        mask = conn.runtime.configure().events
        subscribed = {name for name, value in m.pool.FindEnumTypeByName(f"{nri_messages.API_PACKAGE}.Event")
                      .values_by_name.items() if value.number and mask & (1 << (value.number - 1))}
        assert subscribed == {"CREATE_CONTAINER", "START_CONTAINER", "UPDATE_CONTAINER", "STOP_CONTAINER",
                              "REMOVE_CONTAINER"}
    finally:
        conn.close()


QOS = {"guaranteed": ("", 2000, 2000, GI), "burstable": ("burstable", 500, 1000, GI),
       "besteffort": ("besteffort", 0, 0, 0)}


@pytest.mark.parametrize(
    "order",
    [("guaranteed", "burstable", "besteffort"), ("besteffort", "guaranteed", "burstable")],
    ids=["guaranteed-first", "shared-first"],
)
def test_create_answers_the_recorded_grant(plugin, node: FakeNode, m, order) -> None:
    answers = {}
    for i, qos in enumerate(order):
        qos_dir, req, lim, mem = QOS[qos]
        p = pod(m, f"u{i}", qos, qos_dir)
        c = container(m, p, f"c-{qos}", cpu_milli=req, limit_milli=lim, memory=mem)
        code, text, reply = plugin.runtime.create(p, c)
        assert code == 0, text
        answers[qos] = reply.adjust.linux.resources
    grants = plugin.session.handler.service.ledger.read().grants
    exclusive = grants["c-guaranteed"].cpus
    assert len(exclusive) == 2 and len(_node_of(exclusive)) == 1, "two CPUs of one NUMA node"
    assert _cpus(answers["guaranteed"]) == exclusive
    assert parse_list(answers["guaranteed"].cpu.mems) == grants["c-guaranteed"].mems == _node_of(exclusive)
    for shared in ("burstable", "besteffort"):
        assert grants[f"c-{shared}"].kind == "shared" and not grants[f"c-{shared}"].cpus
        # a shared container created before the exclusive one got the pool of its time
        before = order.index(shared) < order.index("guaranteed")
        assert _cpus(answers[shared]) == (ALL if before else ALL - exclusive)
        assert not answers[shared].cpu.mems


def test_a_refusal_is_the_hooks_one_line_and_keeps_nothing(plugin, node: FakeNode, m) -> None:
    p = pod(m, "big", "big", "")
    c = container(m, p, "c-big", cpu_milli=20000, limit_milli=20000, memory=GI)  # more than one node has
    code, text, _ = plugin.runtime.create(p, c)
    assert code != 0
    assert text.startswith("numa-pin: rejected c-big: TopologyAffinityError: ")
    assert "\n" not in text
    assert read_reason(str(node.state_dir), "c-big")["line"] == text
    assert "c-big" not in plugin.session.handler.service.ledger.read().grants


def test_stop_and_remove_release_and_an_update_keeps_the_pinning(plugin, node: FakeNode, m) -> None:
    p = pod(m, "g", "g", "")
    c = container(m, p, "c-g", cpu_milli=4000, limit_milli=4000, memory=GI)
    code, text, reply = plugin.runtime.create(p, c)
    assert code == 0, text
    pinned = _cpus(reply.adjust.linux.resources)
    node.add_container("kubepods/podg/c-g", 4100)  # the runtime made its cgroup and started it
    code, text, updated = plugin.runtime.update(p, c)
    assert code == 0, text
    assert [(u.container_id, _cpus(u.linux.resources)) for u in updated.update] == [("c-g", pinned)]
    assert plugin.runtime.stop(p, c)[0] == 0
    assert "c-g" not in plugin.session.handler.service.ledger.read().grants
    assert plugin.runtime.remove(p, c)[0] == 0  # idempotent
    be = pod(m, "b", "b", "besteffort")
    code, _, reply = plugin.runtime.create(be, container(m, be, "c-be"))
    assert code == 0 and _cpus(reply.adjust.linux.resources) == ALL, "the CPUs went back to the pool"


@pytest.mark.parametrize("chunk", [None, 1], ids=["one-message", "split"])
def test_a_restarted_plugin_synchronises(node: FakeNode, m, chunk) -> None:
    """Session 1 admits A; the plugin goes away; B starts without it (Guaranteed, no grant) and
    C stops. Session 2 (a fresh process: a fresh service) keeps A, adopts B, releases C."""
    first = Connected(service(node), m)
    first.runtime.configure()
    first.runtime.synchronize([], [])
    pods = {x: pod(m, x, x, "") for x in "abc"}
    ctrs = {x: container(m, pods[x], f"c-{x}", cpu_milli=2000, limit_milli=2000, memory=GI) for x in "abc"}
    for x in "ac":
        assert first.runtime.create(pods[x], ctrs[x])[0] == 0
    first.close()
    a_cpus = service(node).ledger.read().grants["c-a"].cpus
    for x, pid in (("a", 4201), ("b", 4202)):
        node.add_container(f"kubepods/pod{x}/c-{x}", pid)
        ctrs[x].state, ctrs[x].pid = 3, pid  # CONTAINER_RUNNING
    ctrs["c"].state = 4  # CONTAINER_STOPPED

    second = Connected(service(node), m)
    try:
        second.runtime.configure()
        reply = second.runtime.synchronize(list(pods.values()), list(ctrs.values()), chunk=chunk)
        grants = second.session.handler.service.ledger.read().grants
        assert set(grants) == {"c-a", "c-b"}
        assert grants["c-a"].cpus == a_cpus and grants["c-b"].pid == 4202
        assert len(grants["c-b"].cpus) == 2 and not grants["c-b"].cpus & a_cpus
        updates = {u.container_id: _cpus(u.linux.resources) for u in reply.update}
        assert updates == {"c-a": a_cpus, "c-b": grants["c-b"].cpus}
        assert parse_list(node.cpuset("kubepods/podb/c-b")[0]) == grants["c-b"].cpus, "adoption pins it now"
    finally:
        second.close()


def test_a_method_it_does_not_serve_is_unimplemented(plugin, m) -> None:
    code, text, _ = plugin.runtime.call("PostStartContainer", m.api("PostStartContainerRequest")(),
                                        "PostStartContainerResponse")
    assert code == 12 and "PostStartContainer" in text


def test_a_pods_annotation_reaches_its_containers_without_passthrough(plugin, m) -> None:
    """containerd copies pod annotations into a container's spec only with ``pod_annotations``
    configured; NRI hands the pod's over, and the plugin reads them under the container's."""
    p = pod(m, "ann", "ann", "besteffort", annotations={"numa-pin.io/cpus": "2"})
    code, text, reply = plugin.runtime.create(p, container(m, p, "c-ann"))
    assert code == 0, text
    grant = plugin.session.handler.service.ledger.read().grants["c-ann"]
    assert len(grant.cpus) == 2 and _cpus(reply.adjust.linux.resources) == grant.cpus


def test_an_unexpected_failure_is_one_line_and_the_plugin_keeps_serving(plugin, m, monkeypatch) -> None:
    handler = plugin.session.handler

    def broken(pod, container, pid):
        raise KeyError("boom")

    monkeypatch.setattr(handler, "_admit", broken)
    p = pod(m, "x", "x", "")
    code, text, _ = plugin.runtime.create(p, container(m, p, "c-x"))
    assert code != 0 and text == "numa-pin: internal error c-x: KeyError: 'boom'"
    monkeypatch.undo()
    assert plugin.runtime.create(p, container(m, p, "c-y"))[0] == 0


@pytest.mark.parametrize(
    ("announced_ms", "assumed_s", "admission_s", "bound_s"),
    [(0, 2.0, 20, 1.5), (0, 30.0, 20, 20), (4000, 30.0, 20, 3.0), (4000, 2.0, 1, 1)],
    ids=["nri-default", "assumed-longer", "announced", "config-shorter"],
)
def test_an_admission_gets_three_quarters_of_the_runtimes_timeout(node: FakeNode, m, monkeypatch, announced_ms,
                                                                  assumed_s, admission_s, bound_s) -> None:
    """A plugin that answers past the runtime's timeout is disconnected and the container starts
    unpinned: the admission must give up (a refusal) before that."""
    from numa_pin.nri.plugin import Handler

    svc = NodeService(config_from_dict(node.config_dict(policy="restricted", admission_timeout_s=admission_s)))
    seen = []
    real = svc.admit
    monkeypatch.setattr(svc, "admit", lambda *a, **kw: seen.append(kw["deadline"].seconds) or real(*a, **kw))
    handler = Handler(svc, m, lambda line: None, request_timeout_s=assumed_s)
    handler.configure(m.api("ConfigureRequest")(runtime_name="containerd", request_timeout=announced_ms))
    p = pod(m, "t", "t", "")
    handler.create_container(m.api("CreateContainerRequest")(pod=p, container=container(m, p, "c-t", cpu_milli=1000,
                                                                                        limit_milli=1000, memory=GI)))
    assert seen == [pytest.approx(bound_s)]


def test_one_synchronisation_is_one_budget_and_one_commit_for_every_adoption(node: FakeNode, m, monkeypatch) -> None:
    """The runtime waits for one answer to Synchronize: every adoption in it shares one deadline,
    and all of them are one ledger transaction (one write of the ledger)."""
    from numa_pin.ledger.store import Ledger
    from numa_pin.nri.plugin import Handler

    svc = service(node)
    batches, writes = [], []
    real_batch, real_write = svc.adopt_batch, Ledger._write
    monkeypatch.setattr(svc, "adopt_batch", lambda items, deadline, target=None: batches.append((items, deadline))
                        or real_batch(items, deadline, target))
    monkeypatch.setattr(Ledger, "_write", lambda self, *a, **kw: writes.append(1) or real_write(self, *a, **kw))
    handler = Handler(svc, m, lambda line: None)
    pods = {x: pod(m, x, x, "") for x in "xyz"}
    ctrs = [container(m, pods[x], f"c-{x}", cpu_milli=1000, limit_milli=1000, memory=GI, state=1) for x in "xy"]
    ctrs.append(container(m, pods["z"], "c-z", state=1))
    writes.clear()
    updates = handler.adopt({p.id: p for p in pods.values()}, ctrs)
    assert [[a.request.container_id for a in items] for items, _ in batches] == [["c-x", "c-y", "c-z"]]
    assert batches[0][1].seconds == pytest.approx(1.5)
    assert len(writes) == 1, "one commit for the whole batch"
    assert set(svc.ledger.read().grants) == {"c-x", "c-y", "c-z"}
    assert [u.container_id for u in updates] == ["c-x", "c-y", "c-z"]


def test_a_refused_adoption_is_rolled_back_alone(node: FakeNode, m) -> None:
    """One container of the batch asks for more than the node has: it is refused (a reason file),
    its writes undone; the others are adopted and pinned."""
    from numa_pin.nri.plugin import Handler

    svc = service(node)
    lines: list[str] = []
    handler = Handler(svc, m, lines.append)
    pods = {x: pod(m, x, x, "") for x in "abc"}
    milli = {"a": 2000, "b": 200_000, "c": 2000}
    ctrs = []
    for i, x in enumerate("abc"):
        pid = node.add_container(f"kubepods/pod{x}/c-{x}", 5100 + i)
        ctrs.append(container(m, pods[x], f"c-{x}", cpu_milli=milli[x], limit_milli=milli[x], memory=GI, state=3,
                              pid=pid))
    before_b = node.cpuset("kubepods/podb/c-b")
    updates = handler.adopt({p.id: p for p in pods.values()}, ctrs)
    grants = svc.ledger.read().grants
    assert set(grants) == {"c-a", "c-c"} and not grants["c-a"].cpus & grants["c-c"].cpus
    assert node.cpuset("kubepods/podb/c-b") == before_b, "the refused container is left as it was"
    doc = read_reason(str(node.state_dir), "c-b")
    assert doc is not None and str(doc["line"]).startswith("numa-pin: cannot adopt c-b: ")
    assert {u.container_id for u in updates} == {"c-a", "c-c"}
    for x in "ac":
        assert parse_list(node.cpuset(f"kubepods/pod{x}/c-{x}")[0]) == grants[f"c-{x}"].cpus


def test_running_shared_containers_leave_the_cpus_an_exclusive_one_gets(plugin, node: FakeNode, m) -> None:
    be = pod(m, "be", "be", "besteffort")
    assert plugin.runtime.create(be, container(m, be, "c-be"))[0] == 0
    node.add_container("kubepods/besteffort/podbe/c-be", 7000)  # the runtime made and started it
    g = pod(m, "g", "g", "")
    code, text, reply = plugin.runtime.create(g, container(m, g, "c-g", cpu_milli=2000, limit_milli=2000, memory=GI))
    assert code == 0, text
    assert parse_list(node.cpuset("kubepods/besteffort/podbe/c-be")[0]) == ALL - _cpus(reply.adjust.linux.resources)


@pytest.mark.parametrize("as_event", [False, True], ids=["rpc", "containerd-1.7-event"])
def test_a_shared_container_created_before_an_exclusive_grant_starts_on_the_pool_of_its_start(
        plugin, node: FakeNode, m, as_event) -> None:
    """kubelet's pod workers run in parallel: a BestEffort container is created (its adjustment
    carries the whole pool), a Guaranteed one takes exclusive CPUs before the runtime has made the
    first one's cgroup, then the runtime makes that cgroup from the old adjustment and starts it.
    At StartContainer the plugin narrows it to the pool as it is, before it runs."""
    be = pod(m, "be", "be", "besteffort")
    code, _, early = plugin.runtime.create(be, container(m, be, "c-be"))
    assert code == 0 and _cpus(early.adjust.linux.resources) == ALL
    g = pod(m, "g", "g", "")
    code, text, reply = plugin.runtime.create(g, container(m, g, "c-g", cpu_milli=2000, limit_milli=2000, memory=GI))
    assert code == 0, text
    exclusive = _cpus(reply.adjust.linux.resources)
    path = "kubepods/besteffort/podbe/c-be"
    node.add_container(path, 7001, cpus=_format(ALL))  # the runtime creates it from the adjustment it got
    code, text, _ = plugin.runtime.start(be, container(m, be, "c-be", pid=7001), as_event=as_event)
    assert code == 0, text
    assert parse_list(node.cpuset(path)[0]) == ALL - exclusive, "no shared container runs on an exclusive CPU"
    grant = plugin.session.handler.service.ledger.read().grants["c-be"]
    assert grant.pid == 7001 and grant.pending_since is None


def _format(cpus: frozenset[int]) -> str:
    from numa_pin.base.cpuset import format_list

    return format_list(cpus)


@pytest.mark.parametrize("follow", ["reassert", "adopt"])
@pytest.mark.parametrize("to", [4, 1], ids=["grow", "shrink"])
def test_kubelets_in_place_resize_is_followed_or_refused_never_reverted(node: FakeNode, m, follow, to) -> None:
    """KEP-1287 resizes a running Guaranteed container from 2 to ``to`` CPUs through NRI's
    UpdateContainer. ``adopt``: the grant grows (the CPUs it was admitted with stay, on one NUMA
    node) and the answer carries the new CPUs; below the CPUs it was admitted with it is refused
    (KEP-5554). ``reassert``: the update is refused in one line naming the setting. A refused
    resize leaves the grant as it was."""
    conn = Connected(NodeService(config_from_dict(node.config_dict(policy="restricted", resize_follow=follow))), m)
    try:
        conn.runtime.configure()
        p = pod(m, "g", "g", "")
        c = container(m, p, "c-g", cpu_milli=2000, limit_milli=2000, memory=GI)
        code, text, reply = conn.runtime.create(p, c)
        assert code == 0, text
        before = _cpus(reply.adjust.linux.resources)
        node.add_container("kubepods/podg/c-g", 4200, cpus=",".join(map(str, sorted(before))))
        assert conn.runtime.start(p, container(m, p, "c-g", cpu_milli=2000, limit_milli=2000, memory=GI,
                                               pid=4200))[0] == 0
        code, text, updated = conn.runtime.call("UpdateContainer", resize(m, p, c, to * 1000, GI),
                                                "UpdateContainerResponse")
        grant = conn.session.handler.service.ledger.read().grants["c-g"]
    finally:
        conn.close()
    if follow == "reassert" or to < 2:
        assert code != 0 and text.startswith("numa-pin: rejected c-g: AllocationError: ") and "\n" not in text
        assert ("KEP-5554" if to < 2 else "resize_follow") in text and grant.cpus == before
        return
    assert code == 0, text
    assert len(grant.cpus) == to and len(_node_of(grant.cpus)) == 1 and before <= grant.cpus
    assert [(u.container_id, _cpus(u.linux.resources)) for u in updated.update] == [("c-g", grant.cpus)]
    assert parse_list(node.cpuset("kubepods/podg/c-g")[0]) == grant.cpus


@pytest.mark.parametrize(("parts", "size"), [(3, 1 << 30), (1000, 3000)], ids=["parts", "bytes"])
def test_a_split_synchronisation_is_kept_within_bounds(plugin, m, monkeypatch, parts, size) -> None:
    """Parts marked ``more`` are kept until the last one, but only so many and so large: past
    either bound the runtime gets one line, nothing is kept, and the next Synchronize starts afresh."""
    from numa_pin.nri import plugin as nri_plugin

    monkeypatch.setattr(nri_plugin, "MAX_SYNC_PARTS", parts)
    monkeypatch.setattr(nri_plugin, "MAX_SYNC_BYTES", size)
    p = pod(m, "s", "s", "besteffort")
    codes = []
    for i in range(5):
        part = m.api("SynchronizeRequest")(pods=[p], containers=[container(m, p, f"c-{i}" + "x" * 900)], more=True)
        code, text, _ = plugin.runtime.call("Synchronize", part, "SynchronizeResponse")
        codes.append(code)
        if code:
            break
    handler = plugin.session.handler
    assert codes[-1] != 0 and codes[:-1] == [0] * (len(codes) - 1) and len(codes) <= 4
    assert text.startswith("numa-pin: error ?: NriError: Synchronize split in more than") and "\n" not in text
    assert handler._sync_containers == [] and handler._sync_parts == 0
    reply = plugin.runtime.synchronize([], [])
    assert list(reply.update) == []


def test_a_batch_works_out_the_cpu_view_of_the_machine_once(node: FakeNode, m, monkeypatch) -> None:
    """kubelet's CPU view of the machine and its reserved CPUs depend on the machine and the config
    only: a Synchronize deciding for many containers works them out once, not once per container."""
    from numa_pin.nri.plugin import Handler
    from numa_pin.topology.cpus import CpuTopology

    made = []
    real = CpuTopology.from_topology.__func__
    monkeypatch.setattr(CpuTopology, "from_topology", classmethod(lambda cls, t: made.append(t) or real(cls, t)))
    svc = service(node)
    handler = Handler(svc, m, lambda line: None)
    pods = {x: pod(m, x, x, "besteffort" if x in "abcd" else "") for x in "abcdef"}
    ctrs = [container(m, p, f"c-{x}", cpu_milli=0 if x in "abcd" else 1000, limit_milli=0 if x in "abcd" else 1000,
                      memory=0 if x in "abcd" else GI, state=1) for x, p in pods.items()]
    handler.adopt({p.id: p for p in pods.values()}, ctrs)
    assert len(svc.ledger.read().grants) == 6
    assert len(made) <= 2, "once for the decisions (and once for the node's own memo), not once per container"


def _with(ctr, **fields):
    for name, value in fields.items():
        if name == "cgroups_path":
            ctr.linux.cgroups_path = value
        else:
            setattr(ctr, name, value)
    return ctr


@pytest.mark.parametrize(
    ("fields", "pod_fields", "says"),
    [({"id": "c-\0x"}, {}, "container id"),
     ({"cgroups_path": "/kubepods/besteffort/podh/c-h\0/../../../x"}, {}, "cgroups_path"),
     ({"name": "c\x7fh"}, {}, "container name"),
     ({"pod_sandbox_id": "s" * 2000}, {}, "pod id"),
     ({}, {"namespace": "de\nfault"}, "pod namespace")],
    ids=["id-nul", "cgroups-path-nul", "name-control", "pod-id-long", "namespace-newline"],
)
def test_a_hostile_name_through_nri_is_refused_in_one_line_and_blocks_nothing(plugin, node: FakeNode, m, fields,
                                                                              pod_fields, says) -> None:
    p = pod(m, "h", "h", "besteffort")
    for name, value in pod_fields.items():
        setattr(p, name, value)
    code, text, _ = plugin.runtime.create(p, _with(container(m, p, "c-h"), **fields))
    assert code != 0 and "RequestError" in text and says in text and "\n" not in text and "\0" not in text
    svc = plugin.session.handler.service
    assert svc.ledger.read().grants == {}
    g = pod(m, "g", "g", "")
    code, text, reply = plugin.runtime.create(g, container(m, g, "c-g", cpu_milli=2000, limit_milli=2000, memory=GI))
    assert code == 0, text
    assert len(_cpus(reply.adjust.linux.resources)) == 2


def test_a_batch_resolves_the_cgroup_parents_once(node: FakeNode, m, monkeypatch) -> None:
    """Adopting a busy node's containers checks each one's cgroup path, but the pod's and the
    hierarchy's directories, shared by all of them, are resolved once for the batch: the check
    before each container's cpuset write too (it found that cgroup through the same memo)."""
    from numa_pin.enforcer import cgroups
    from numa_pin.nri.plugin import Handler

    svc = service(node)
    handler = Handler(svc, m, lambda line: None)
    p = pod(m, "many", "many", "besteffort")
    ctrs = []
    for i in range(20):
        pid = node.add_container(f"kubepods/besteffort/podmany/c-{i}", 6000 + i)
        ctrs.append(container(m, p, f"c-{i}", state=3, pid=pid))
    resolved = []
    real = cgroups.os.path.realpath
    monkeypatch.setattr(cgroups.os.path, "realpath", lambda path, **kw: resolved.append(str(path)) or real(path, **kw))
    handler.adopt({p.id: p}, ctrs)
    assert len(svc.ledger.read().grants) == 20
    resolved = [path for path in resolved if path.startswith(str(node.cgroup_root))]
    assert len(resolved) <= 3, "the shared parents once for the batch, never a path per container (its cpuset write included)"


def test_an_adopted_containers_old_refusal_is_forgotten_and_no_other(node: FakeNode, m) -> None:
    from numa_pin.nri.plugin import Handler
    from numa_pin.reporting.report import write_reason

    svc = service(node)
    state = str(node.state_dir)
    for cid in ("c-a", "c-other"):
        write_reason(state, cid, f"numa-pin: rejected {cid}: x")
    p = pod(m, "a", "a", "besteffort")
    pid = node.add_container("kubepods/besteffort/poda/c-a", 6100)
    Handler(svc, m, lambda line: None).adopt({p.id: p}, [container(m, p, "c-a", state=3, pid=pid)])
    assert "c-a" in svc.ledger.read().grants
    assert read_reason(state, "c-a") is None and read_reason(state, "c-other") is not None


def test_a_running_container_nri_cannot_carry_is_not_adopted_and_says_why(node: FakeNode, m) -> None:
    """Synchronize meets a running container that asks a memory policy: NRI cannot set one, so it
    is not adopted (the same PathLimitError its CreateContainer would get), in one line."""
    conn = Connected(service(node), m)
    try:
        conn.runtime.configure()
        p = pod(m, "mp", "mp", "")
        node.add_container("kubepods/podmp/c-mp", 7100)
        c = container(m, p, "c-mp", cpu_milli=1000, limit_milli=1000, memory=GI, state=2, pid=7100,
                      annotations={"numa-pin.io/memory-policy": "interleave"})
        conn.runtime.synchronize([p], [c])
        grants = conn.session.handler.service.ledger.read().grants
    finally:
        conn.close()
    assert "c-mp" not in grants
    line = read_reason(str(node.state_dir), "c-mp")["line"]
    assert line.startswith("numa-pin: cannot adopt c-mp: PathLimitError: ") and "nri path" in line


def test_what_the_synchronisation_budget_leaves_is_adopted_after_the_answer(node: FakeNode, m, monkeypatch) -> None:
    """The answer's budget runs out after two adoptions: the answer pins those two and comes in
    time; the three left are not refused but adopted right after it, and their updates reach the
    runtime unasked (``UpdateContainers``), each on the shared pool."""
    from numa_pin.base.deadline import Deadline
    from numa_pin.errors import AdmissionTimeout
    from numa_pin.nri import plugin as nri_plugin

    class Spent(Deadline):
        checks = 0

        def check(self) -> None:
            Spent.checks += 1
            if Spent.checks > 2:
                raise AdmissionTimeout("synchronisation took longer than its budget")

    real = nri_plugin.Handler.deadline
    monkeypatch.setattr(nri_plugin.Handler, "deadline",
                        lambda self, what: Spent(1.5, what) if what == "synchronisation" else real(self, what))
    svc = service(node)
    conn = Connected(svc, m)
    try:
        conn.runtime.configure()
        pods = {x: pod(m, x, x, "besteffort") for x in "abcde"}
        ctrs = [container(m, pods[x], f"c-{x}", state=3,
                          pid=node.add_container(f"kubepods/besteffort/pod{x}/c-{x}", 5200 + i))
                for i, x in enumerate("abcde")]
        reply = conn.runtime.synchronize(list(pods.values()), ctrs)
        answered = {u.container_id for u in reply.update}
        assert len(answered) == 2
        later = {u.container_id: u for u in conn.runtime.wait_unasked(3)}
        assert set(later) == {c.id for c in ctrs} - answered
        assert set(svc.ledger.read().grants) == {c.id for c in ctrs}
        pool = svc.describe(svc.ledger.read())["shared_pool"]
        assert {parse_list(u.linux.resources.cpu.cpus) for u in later.values()} == {parse_list(pool)}
        assert not [line for line in conn.log if "cannot adopt" in line]
    finally:
        conn.close()

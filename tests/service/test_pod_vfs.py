"""SR-IOV VFs under pod scope: moved once into the pod's network namespace, given back with the
pod's last grant (release, or garbage collection of dead grants in an admission or reconcile).

The machine is the kit's ``gpu8-sriov`` (VFs 0000:32:01.0-3 on node 0, 0000:c9:00.2-5 on node 3);
proc and cgroup are FakeNode trees, and each pod's network namespace is a FakeNode netns shared by
its containers and a pause process. :class:`FakeNet` stands in for pyroute2: it knows where each
VF is (the host, or a netns identity), refuses to move a VF that is not at home (as the kernel
would: it has no netdev in the host netns then) and counts such double moves, and gives a VF back
from a netns only through a process in it, or when no process is left in it (the kernel returns
a physical device from a namespace it destroys).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer.netdev import NetdevRecord
from numa_pin.enforcer.netns import find_netns_member, netns_id
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError, NumaPinError
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

VFS = ("0000:32:01.0", "0000:32:01.1", "0000:32:01.2", "0000:32:01.3")
VF_RES = "example.com/vf"
HOME = "host"


class FakeNet:
    """Where every VF is; installed in place of ``move_netdev_to_netns`` and ``restore_netdev``."""

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = str(proc_root)
        self.where: dict[str, str] = {}
        self.moves: list[tuple[str, int, str]] = []  # (address, pid, name)
        self.double_moves: list[str] = []
        self.restored: list[tuple[str, int | None]] = []
        self.settings: dict[str, Any] = {}  # address -> the vf_settings its move was given

    def at(self, address: str) -> str:
        return self.where.get(address, HOME)

    def ns_of(self, pid: int) -> str:
        return netns_id(pid, self.proc_root)

    def move(self, address: str, pid: int, name: str, sysfs_root: Any, proc_root: Any, *,
             bring_up: bool = False, undo: UndoLog | None = None,
             vf_settings: Any = None, journal: Any = None) -> NetdevRecord:
        if self.at(address) != HOME:
            self.double_moves.append(address)
            raise EnforcementError(f"PCI device {address} has no network interface in this netns (already moved)")
        ns = self.ns_of(pid)
        self.where[address] = ns
        self.moves.append((address, pid, name))
        if vf_settings:
            self.settings[address] = dict(vf_settings)
        rec = NetdevRecord(host_name="vf" + address[-3:], container_name=name,
                           netns=os.path.join(str(proc_root), str(pid), "ns", "net"), bdf=address)
        if undo is not None:
            undo.record(f"netdev {address} moved", lambda: self.restore(rec, pid, sysfs_root, proc_root))
        return rec

    def restore(self, record: NetdevRecord, pid: int | None, sysfs_root: Any, proc_root: Any, **kw: Any) -> str:
        address = record.bdf or ""
        ns = self.at(address)
        if ns == HOME:
            return record.host_name
        through = pid is not None and os.path.exists(os.path.join(self.proc_root, str(pid))) and self.ns_of(pid) == ns
        if through or find_netns_member(ns, self.proc_root) is None:
            self.where[address] = HOME
            self.restored.append((address, pid))
            return record.host_name
        raise EnforcementError(f"cannot find network interface {record.host_name} to restore")


class PodNode(FakeNode):
    """gpu8-sriov with a VF resource; pods are sandboxes with a pause process in their netns."""

    def __init__(self, root: Path, machines: Path, policy: str = "best-effort") -> None:
        super().__init__(root, "gpu8-sriov", machines=machines, cpus="0-127", mems="0-3")
        self.config = config_from_dict(self.config_dict(policy=policy, scope="pod", devices={
            "nvidia.com/gpu": [{"vendors": ["0x10de"]}], VF_RES: [{"is_vf": True, "has_netdev": True}],
        }))
        self.pids: dict[str, int] = {}

    def pod(self, pod: str, pause_pid: int) -> None:
        self.join_netns(pause_pid, pod)

    def start(self, cid: str, pod: str, *, netns: str | None = None) -> int:
        pid = 60000 + len(self.pids)
        self.pids[cid] = pid
        return self.add_container(cid, pid, netns=netns or pod)

    def stop(self, cid: str) -> None:
        self.stop_container(cid, self.pids[cid])


def vf_request(cid: str, pod: str, *, count: int = 0, named: tuple[str, ...] = (), scope: str = "pod"):
    annotations = {"io.kubernetes.cri.sandbox-id": pod, "numa-pin.io/scope": scope}
    if count:
        annotations["numa-pin.io/devices"] = f"{VF_RES}={count}"
    env = {"PCIDEVICE_EXAMPLE_COM_VF": ",".join(named)} if named else {}
    return request_from_oci(cid, annotations, env)


def install(monkeypatch: pytest.MonkeyPatch, net: FakeNet) -> list[str]:
    logged: list[str] = []
    monkeypatch.setattr("numa_pin.enforcer.netdev.move_netdev_to_netns", net.move)
    monkeypatch.setattr("numa_pin.enforcer.netdev.restore_netdev", net.restore)
    monkeypatch.setattr("numa_pin.reporting.report.log_syslog", lambda line, error=True: logged.append(line))
    return logged


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kit machine's sysfs, built once for the module."""
    return tmp_path_factory.mktemp("machines")


@pytest.fixture
def node(tmp_path: Path, machines: Path) -> PodNode:
    n = PodNode(tmp_path / "n", machines)
    n.pod("pod-a", 100)
    n.pod("pod-b", 200)
    return n


@pytest.fixture
def net(node: PodNode, monkeypatch: pytest.MonkeyPatch) -> FakeNet:
    fake = FakeNet(node.proc_root)
    fake.logged = install(monkeypatch, fake)  # type: ignore[attr-defined]
    return fake


def pod_vfs(service: NodeService, pod: str) -> dict[str, str]:
    """address -> ifname of the VFs the ledger keeps in ``pod``'s netns."""
    rec = service.ledger.read().pods.get(pod)
    return {} if rec is None else {n.address: n.ifname for n in rec.netdevs}


def test_second_container_of_the_pod_finds_the_vf_there_and_the_last_one_gives_it_back(node, net):
    svc = NodeService(node.config)
    a1 = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant
    (vf,) = a1.devices[VF_RES]
    pod_ns = net.ns_of(100)
    assert net.at(vf) == pod_ns and net.moves == [(vf, node.pids["a1"], "net1")]
    assert a1.netdevs == () and pod_vfs(svc, "pod-a") == {vf: "net1"}
    a2 = svc.admit(vf_request("a2", "pod-a", named=(vf,)), node.start("a2", "pod-a")).grant
    assert a2.devices[VF_RES] == (vf,) and len(net.moves) == 1, "the VF is already in the pod's netns"

    node.stop("a1")
    svc.release("a1")  # the container that moved it ends first: the VF stays with the pod
    assert net.at(vf) == pod_ns and pod_vfs(svc, "pod-a") == {vf: "net1"} and net.restored == []
    node.stop("a2")
    svc.release("a2")  # the last one: back to the host, pulled out through the pause process
    assert net.at(vf) == HOME and net.restored == [(vf, 100)]
    assert "pod-a" not in svc.ledger.read().pods and svc.ledger.read().devices_in_use(VF_RES) == frozenset()
    assert net.double_moves == [] and net.logged == []


def test_a_restarted_container_finds_its_vf_in_the_pod(node, net):
    """The container that moved the VF crashes and comes back under a new id naming the same VF
    (PCIDEVICE_*), while a sibling keeps the pod alive: nothing is moved again."""
    svc = NodeService(node.config)
    (vf,) = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant.devices[VF_RES]
    svc.admit(request_from_oci("side", {"io.kubernetes.cri.sandbox-id": "pod-a", "numa-pin.io/cpus": "1"}),
              node.start("side", "pod-a"))
    node.stop("a1")  # no poststop: the restart's admission collects the dead grant
    again = svc.admit(vf_request("a1-restarted", "pod-a", named=(vf,)), node.start("a1-restarted", "pod-a")).grant
    assert again.devices[VF_RES] == (vf,) and "a1" not in svc.ledger.read().grants
    assert len(net.moves) == 1 and net.restored == [] and net.at(vf) == net.ns_of(100)
    assert svc.ledger.read().pods["pod-a"].netdevs[0].moved_by == "a1"


def test_names_are_counted_per_pod_netns(node, net):
    svc = NodeService(node.config)
    svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a"))
    svc.admit(vf_request("a2", "pod-a", count=2), node.start("a2", "pod-a"))
    svc.admit(vf_request("b1", "pod-b", count=1), node.start("b1", "pod-b"))
    assert sorted(pod_vfs(svc, "pod-a").values()) == ["net1", "net2", "net3"]
    assert list(pod_vfs(svc, "pod-b").values()) == ["net1"]
    # net2's container ends; the next VF of the pod takes the first free name... none is free
    # (the VF stays), so it is net4
    svc.admit(vf_request("a3", "pod-a", count=1), node.start("a3", "pod-a"))
    assert sorted(pod_vfs(svc, "pod-a").values()) == ["net1", "net2", "net3", "net4"]


def test_a_parked_vf_is_not_free_to_other_pods(node, net):
    svc = NodeService(node.config)
    a1 = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant
    svc.admit(request_from_oci("a2", {"io.kubernetes.cri.sandbox-id": "pod-a"}), node.start("a2", "pod-a"))
    node.stop("a1")
    svc.release("a1")
    (vf,) = a1.devices[VF_RES]
    assert net.at(vf) == net.ns_of(100), "a2 keeps the pod alive, so the VF stays in its netns"
    b1 = svc.admit(vf_request("b1", "pod-b", count=4), node.start("b1", "pod-b")).grant
    assert vf not in b1.devices[VF_RES], "the decision counts the pod's VF as in use"
    before = svc.ledger.read()
    with pytest.raises(EnforcementError, match=f"VF {vf} granted to container b2 is in the network namespace of "
                                               "pod pod-a"):
        svc.admit(vf_request("b2", "pod-b", named=(vf,)), node.start("b2", "pod-b"))
    assert svc.ledger.read() == before and net.double_moves == []


def test_a_failed_admission_rolls_back_only_its_own_moves(node, net, monkeypatch):
    svc = NodeService(node.config)
    a1 = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant
    (held,) = a1.devices[VF_RES]
    before = svc.ledger.read()

    def broken(*args, **kwargs):
        raise EnforcementError("simulated GPU failure", path="/fake")

    monkeypatch.setattr("numa_pin.enforcer.gpu.gpu_rules", lambda *a, **k: ("c 195:* rwm",))
    monkeypatch.setattr("numa_pin.enforcer.gpu.allow_device_rules", broken)
    new = next(v for v in VFS if v != held)
    req = request_from_oci("a2", {"io.kubernetes.cri.sandbox-id": "pod-a", "numa-pin.io/devices": "nvidia.com/gpu=1"},
                           {"PCIDEVICE_EXAMPLE_COM_VF": f"{held},{new}"})
    with pytest.raises(EnforcementError, match="simulated GPU failure"):
        svc.admit(req, node.start("a2", "pod-a"))
    assert svc.ledger.read() == before, "nothing recorded"
    assert net.at(held) == net.ns_of(100), "the VF the pod already had stays"
    assert [a for a, pid, _ in net.moves if pid == node.pids["a2"]] == [new], "a2 moved only the new VF"
    assert net.at(new) == HOME, "and it went back"


def test_reconcile_gives_the_vfs_back_only_with_the_pods_last_dead_grant(node, net):
    svc = NodeService(node.config)
    a1 = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant
    svc.admit(vf_request("a2", "pod-a", count=1), node.start("a2", "pod-a"))
    vfs = set(pod_vfs(svc, "pod-a"))
    node.stop("a1")  # no poststop
    removed, _ = svc.reconcile()
    assert [g.container_id for g in removed] == ["a1"] and set(pod_vfs(svc, "pod-a")) == vfs
    assert all(net.at(v) == net.ns_of(100) for v in vfs) and a1.devices[VF_RES][0] in vfs
    node.stop("a2")
    removed, _ = svc.reconcile()
    assert [g.container_id for g in removed] == ["a2"]
    assert all(net.at(v) == HOME for v in vfs) and "pod-a" not in svc.ledger.read().pods


def test_an_admission_that_collects_a_dead_pod_gives_its_vfs_back_first(node, net):
    """A pod whose last container died without poststop: the next admission drops its grant and
    pod record, and its VF is home again before the VF is granted anew (here: to another pod)."""
    svc = NodeService(node.config)
    (vf,) = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant.devices[VF_RES]
    node.stop("a1")
    b1 = svc.admit(vf_request("b1", "pod-b", named=(vf,)), node.start("b1", "pod-b")).grant
    assert b1.devices[VF_RES] == (vf,) and net.at(vf) == net.ns_of(200)
    assert net.restored == [(vf, 100)] and net.double_moves == [] and "pod-a" not in svc.ledger.read().pods


def test_the_last_release_after_the_sandbox_is_gone_finds_the_vf_at_home(node, net):
    svc = NodeService(node.config)
    (vf,) = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant.devices[VF_RES]
    node.stop("a1")
    node.stop_container("pause", 100)  # the sandbox went too: no process is left in the netns
    svc.release("a1")
    assert net.at(vf) == HOME and net.restored == [(vf, None)] and net.logged == []


def test_a_vf_that_cannot_be_found_is_reported_and_the_record_goes(node, net, monkeypatch):
    svc = NodeService(node.config)
    (vf,) = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant.devices[VF_RES]
    node.stop("a1")

    def lost(*args, **kwargs):
        raise EnforcementError("cannot find network interface vf1.0 to restore")

    monkeypatch.setattr("numa_pin.enforcer.netdev.restore_netdev", lost)
    svc.release("a1")
    assert "pod-a" not in svc.ledger.read().pods
    assert net.logged == [f"numa-pin: pod pod-a: VF {vf} (net1) not restored: cannot find network interface "
                          "vf1.0 to restore"]


def test_containers_of_one_pod_in_different_netns_cannot_share_a_vf(node, net):
    svc = NodeService(node.config)
    (vf,) = svc.admit(vf_request("a1", "pod-a", count=1), node.start("a1", "pod-a")).grant.devices[VF_RES]
    before = svc.ledger.read()
    with pytest.raises(EnforcementError, match="pod's containers must share its network namespace"):
        svc.admit(vf_request("a2", "pod-a", named=(vf,)), node.start("a2", "pod-a", netns="elsewhere"))
    assert svc.ledger.read() == before and net.double_moves == []


def test_container_scope_keeps_moving_per_container(node, net):
    """Scope container: the record is the grant's, names count per container, and the release gives
    the VF back from the container's own netns (here gone with it, as without a pod)."""
    svc = NodeService(node.config)
    g1 = svc.admit(vf_request("a1", "pod-a", count=1, scope="container"), node.start("a1", "pod-a", netns="a1")).grant
    g2 = svc.admit(vf_request("a2", "pod-a", count=1, scope="container"), node.start("a2", "pod-a", netns="a2")).grant
    (vf1,), (vf2,) = g1.devices[VF_RES], g2.devices[VF_RES]
    assert len(g1.netdevs) == len(g2.netdevs) == 1 and "pod-a" not in svc.ledger.read().pods
    assert net.moves == [(vf1, node.pids["a1"], "net1"), (vf2, node.pids["a2"], "net1")]
    node.stop("a1")
    svc.release("a1")
    assert net.at(vf1) == HOME and net.at(vf2) == net.ns_of(node.pids["a2"])


# ---- random interleavings ------------------------------------------------------------

PODS = {"pod-a": 100, "pod-b": 200}
CONTAINERS = [(f"{pod[-1]}{i}", pod) for pod in PODS for i in range(3)]
_op = st.tuples(st.sampled_from(["start", "release", "crash", "reconcile"]), st.sampled_from(CONTAINERS),
                st.one_of(st.integers(1, 2), st.sampled_from(VFS[:3])))


def _check(svc: NodeService, net: FakeNet, alive: Callable[[str], bool], *, collected: bool) -> None:
    state = svc.ledger.read()
    recorded: dict[str, str] = {}
    for pod_id, pod in state.pods.items():
        for vf in pod.netdevs:
            assert vf.address not in recorded, f"VF {vf.address} recorded twice"
            recorded[vf.address] = vf.netns
            assert state.grants_of_pod(pod_id), f"pod {pod_id} keeps VF {vf.address} without a grant"
            if collected:
                assert any(alive(g.container_id) for g in state.grants_of_pod(pod_id)), \
                    f"VF {vf.address} stays in pod {pod_id}'s netns with no live container"
    for address in VFS + ("0000:c9:00.2", "0000:c9:00.3", "0000:c9:00.4", "0000:c9:00.5"):
        at = net.at(address)
        assert at == recorded.get(address, HOME), f"VF {address} is at {at}, the ledger says {recorded.get(address)}"
    assert net.double_moves == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=16))
def test_random_interleavings_never_lose_strand_or_double_move_a_vf(ops, monkeypatch, machines) -> None:
    """Starts (a slot started again is a restarted container with a new id, naming a VF or
    counting), releases, crashes (no poststop) and reconciles of two pods' containers: a VF is
    where the ledger says (home, or the netns of exactly one pod record), never moved while away
    from home, kept only by a pod with a grant (after a reconcile: a live one), home at the end."""
    with tempfile.TemporaryDirectory() as tmp, monkeypatch.context() as mp:
        node = PodNode(Path(tmp) / "n", machines)
        for pod, pause in PODS.items():
            node.pod(pod, pause)
        net = FakeNet(node.proc_root)
        install(mp, net)
        svc = NodeService(node.config)
        running: set[str] = set()
        current: dict[str, str] = {}  # slot -> its container now (a restart gets a new id)
        for what, (slot, pod), want in ops:
            cid = current.get(slot, slot)
            if what == "start" and cid not in running:
                cid = current[slot] = f"{slot}r{sum(c.startswith(slot) for c in node.pids)}"
                count, named = (want, ()) if isinstance(want, int) else (0, (want,))
                pid = node.start(cid, pod)
                running.add(cid)
                try:
                    svc.admit(vf_request(cid, pod, count=count, named=named), pid)
                except NumaPinError:
                    pass  # e.g. a VF named here that another pod holds: nothing stays
            elif what == "release" and cid in running:
                node.stop(cid)
                running.discard(cid)
                svc.release(cid)
            elif what == "crash" and cid in running:
                node.stop(cid)
                running.discard(cid)
            elif what == "reconcile":
                svc.reconcile()
            _check(svc, net, lambda c: c in running, collected=what == "reconcile")
        for cid in sorted(running):
            node.stop(cid)
        svc.reconcile()
        _check(svc, net, lambda c: False, collected=True)
        assert all(net.at(a) == HOME for a in net.where), "every VF is home once every container ended"


# ---- VF settings (numa-pin.io/vf-config) reach the move through the grant ---------------------
@pytest.mark.parametrize("scope", ["container", "pod"])
def test_vf_settings_reach_the_move_of_every_vf(node, net, scope: str) -> None:
    svc = NodeService(node.config)
    req = request_from_oci("a1", {"io.kubernetes.cri.sandbox-id": "pod-a", "numa-pin.io/scope": scope,
                                  "numa-pin.io/devices": f"{VF_RES}=2",
                                  "numa-pin.io/vf-config": "vlan=100,trust=on,max_tx_rate=1000"})
    grant = svc.admit(req, node.start("a1", "pod-a")).grant
    want = {"vlan": 100, "trust": True, "max_tx_rate": 1000}
    assert net.settings == {vf: want for vf in grant.devices[VF_RES]} and len(net.settings) == 2
    assert dict(svc.ledger.read().grants["a1"].vf_config) == want


@pytest.mark.parametrize(
    "annotations, match",
    [
        ({"numa-pin.io/cpus": "1", "numa-pin.io/vf-config": "vlan=100"}, "is granted no SR-IOV VF"),
        ({"numa-pin.io/devices": "nvidia.com/gpu=1", "numa-pin.io/vf-config": "vlan=100"}, "is granted no SR-IOV VF"),
        ({"numa-pin.io/devices": f"{VF_RES}=2", "numa-pin.io/vf-config": "mac=02:00:5e:00:00:07"},
         "one mac for 2 VFs"),
    ],
    ids=["no-device", "only-a-gpu", "one-mac-two-vfs"],
)
def test_vf_settings_no_vf_would_get_are_refused(node, net, annotations: dict, match: str) -> None:
    svc = NodeService(node.config)
    req = request_from_oci("a1", {"io.kubernetes.cri.sandbox-id": "pod-a", "numa-pin.io/scope": "container",
                                  **annotations})
    with pytest.raises(NumaPinError, match=match) as info:
        svc.admit(req, node.start("a1", "pod-a"))
    assert "numa-pin.io/vf-config" in str(info.value) and "\n" not in str(info.value)
    assert net.moves == [] and "a1" not in svc.ledger.read().grants


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_reconcile_sets_drifted_vf_settings_again(node, net, monkeypatch, scope: str) -> None:
    calls: list[tuple[str, dict]] = []

    def reassert(record: NetdevRecord, settings: Any) -> list[str]:
        calls.append((record.bdf or "", dict(settings)))
        return ["vlan"]

    monkeypatch.setattr("numa_pin.enforcer.vfsettings.reassert_vf_settings", reassert)
    svc = NodeService(node.config)
    base = {"io.kubernetes.cri.sandbox-id": "pod-a", "numa-pin.io/scope": scope}
    a1 = svc.admit(request_from_oci("a1", {**base, "numa-pin.io/devices": f"{VF_RES}=1",
                                           "numa-pin.io/vf-config": "vlan=100"}), node.start("a1", "pod-a")).grant
    svc.admit(request_from_oci("a2", {**base, "numa-pin.io/devices": f"{VF_RES}=1"}), node.start("a2", "pod-a"))
    _, repaired = svc.reconcile()
    assert calls == [(a1.devices[VF_RES][0], {"vlan": 100})], "only the VF moved with settings"
    assert "a1" in repaired and "a2" not in repaired

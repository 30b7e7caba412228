"""The node service on fake roots: one admission = one ledger transaction, rolled back on failure.

The machine is the kit's ``gpu8-sriov`` shape (4 nodes, 8 GPUs, SR-IOV NICs); proc and cgroup
are small fake trees (cgroup v1, cpuset hierarchy), so every write can be checked on disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer.owner import ContainerCgroup
from numa_pin.errors import AllocationError, EnforcementError, RequestError, TopologyAffinityError
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode


class Node(FakeNode):
    """The kit's gpu8-sriov machine with a GPU and a VF resource configured."""

    def __init__(self, root: Path, policy: str = "restricted", devices=None):
        super().__init__(root, "gpu8-sriov", machines=root.parent / "machines", cpus="0-127", mems="0-3")
        self.cg = self.cgroup_root
        self.config = config_from_dict(self.config_dict(policy=policy, devices=devices or {
            "nvidia.com/gpu": [{"vendors": ["0x10de"]}],
            "example.com/vf": [{"is_vf": True, "has_netdev": True}],
        }))

    def container(self, index: int, cpus: str = "0-127") -> int:
        return self.add_container(f"c{index}", 50000 + index, cpus)

    def cpuset(self, index: int) -> tuple[str, str]:  # type: ignore[override]
        return super().cpuset(f"c{index}")


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path / "n")


def test_exclusive_grant_is_written_and_recorded(node):
    agent = NodeService(node.config)
    pid = node.container(1)
    admitted = agent.admit(request_from_oci("c1", {"numa-pin.io/cpus": "4", "numa-pin.io/memory": "1Gi"}), pid)
    cpus, mems = node.cpuset(1)
    grant = agent.ledger.read().grants["c1"]
    assert parse_list(cpus) == grant.cpus and len(grant.cpus) == 4
    assert mems == "0" and grant.mems == frozenset({0}) and admitted.grant == grant
    assert agent.describe_grant(grant) == ["memory=0:1Gi"], "what numa-pin status adds to the grant's line"
    # every CPU granted lies on the granted memory node
    topo = agent.topology
    assert all(topo.cpus[c].numa == 0 for c in grant.cpus)


def test_idempotent_second_stage(node):
    agent = NodeService(node.config)
    pid = node.container(1)
    req = request_from_oci("c1", {"numa-pin.io/cpus": "2"})
    first = agent.admit(req, pid).grant
    second = agent.admit(req, pid)
    assert second.decision is None and second.grant.cpus == first.cpus
    assert list(agent.ledger.read().grants) == ["c1"]


def test_shared_container_shrinks_then_grows(node):
    agent = NodeService(node.config)
    agent.admit(request_from_oci("s", {}), node.container(1))
    all_cpus = node.cpuset(1)[0]
    agent.admit(request_from_oci("x", {"numa-pin.io/cpus": "8"}), node.container(2))
    shrunk = node.cpuset(1)[0]
    assert shrunk != all_cpus
    exclusive = agent.ledger.read().grants["x"].cpus
    assert not parse_list(shrunk) & exclusive
    agent.release("x")
    assert parse_list(node.cpuset(1)[0]) == parse_list(all_cpus)


def test_rejection_leaves_nothing(node):
    agent = NodeService(node.config)
    pid = node.container(1)
    before = node.cpuset(1)
    with pytest.raises(TopologyAffinityError, match="cpu 999 requested"):
        agent.admit(request_from_oci("big", {"numa-pin.io/cpus": "999"}), pid)
    assert agent.ledger.read().grants == {}
    assert node.cpuset(1) == before


def test_enforcement_failure_rolls_back_and_records_nothing(node, monkeypatch):
    agent = NodeService(node.config)
    agent.admit(request_from_oci("s", {}), node.container(1))
    shared_before = node.cpuset(1)
    before = agent.ledger.read()

    def broken(*args, **kwargs):
        raise EnforcementError("simulated failure", path="/fake")

    monkeypatch.setattr("numa_pin.resources.node.cpu.resize_shared", broken)
    with pytest.raises(EnforcementError, match="simulated"):
        agent.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container(2))
    assert agent.ledger.read() == before, "the ledger did not change"
    assert node.cpuset(2) == ("0-127", "0-3"), "the container's own cpuset write was undone"
    assert node.cpuset(1) == shared_before


def test_gpu_and_vf_alignment_moves_the_vf(node, monkeypatch):
    moved, restored = [], []

    class Rec:
        def __init__(self, address, name):
            self.address, self.name = address, name

        def to_dict(self):
            return {"bdf": self.address, "container_name": self.name}

    def fake_move(address, pid, name, sysfs_root, proc_root, **kw):
        moved.append((address, pid, name))
        return Rec(address, name)

    def fake_restore(record, pid, sysfs_root, proc_root, **kw):
        restored.append(record)
        return "restored"

    class Loaded(dict):  # the record as the ledger gives it back, with the address the journal keys on
        @property
        def bdf(self):
            return self["bdf"]

    monkeypatch.setattr("numa_pin.enforcer.netdev.move_netdev_to_netns", fake_move)
    monkeypatch.setattr("numa_pin.enforcer.netdev.NetdevRecord.from_dict", classmethod(lambda cls, d: Loaded(d)))
    monkeypatch.setattr("numa_pin.enforcer.netdev.restore_netdev", fake_restore)
    monkeypatch.setattr("numa_pin.enforcer.gpu.gpu_rules", lambda *a, **k: ())
    monkeypatch.setattr("numa_pin.enforcer.gpu.allow_device_rules", lambda *a, **k: None)
    monkeypatch.setattr("numa_pin.enforcer.devnodes.expose_gpus", lambda *a, **k: ())
    agent = NodeService(node.config)
    req = request_from_oci("g", {"numa-pin.io/cpus": "2", "numa-pin.io/devices": "nvidia.com/gpu=1,example.com/vf=1"})
    grant = agent.admit(req, node.container(1)).grant
    topo = agent.topology
    (gpu,), (vf,) = grant.devices["nvidia.com/gpu"], grant.devices["example.com/vf"]
    node_of = {d.address: d.numa_node for d in topo.pci_devices}
    assert node_of[gpu] == node_of[vf] and grant.mems == frozenset({node_of[gpu]}), "GPU, VF, CPUs on one node"
    assert all(topo.cpus[c].numa == node_of[gpu] for c in grant.cpus)
    assert moved == [(vf, 50001, "net1")]
    assert len(agent.ledger.read().grants["g"].netdevs) == 1
    # ledger format 4: the undo record is a JSON object in the file, not JSON text inside it
    import json

    on_disk = json.loads((node.state_dir / "ledger.json").read_text())["data"]["grants"]["g"]["netdevs"]
    assert on_disk == [{"record": {"bdf": vf, "container_name": "net1"}}]
    agent.release("g")
    assert [r["bdf"] for r in restored] == [vf]


def test_v2_gpu_grant_is_recorded_and_a_live_release_takes_the_program_rules_back(node, monkeypatch):
    """cgroup v2: what the device programs were given is kept in the ledger, and ``release`` of a
    container that still runs hands exactly that to revoke_device_rules (no devices.deny)."""
    from numa_pin.enforcer import cgroups
    from numa_pin.enforcer.gpu import DeviceRule, GpuGrant

    rules = (DeviceRule("c", 195, 0), DeviceRule("c", 195, 255))
    dirs = ("/sys/fs/cgroup/x.scope/container", "/sys/fs/cgroup/x.scope")
    revoked, removed = [], []
    monkeypatch.setattr("numa_pin.enforcer.gpu.gpu_rules", lambda *a, **k: rules)
    monkeypatch.setattr("numa_pin.enforcer.gpu.allow_device_rules",
                        lambda *a, **k: GpuGrant(2, dirs[1], rules, rules, True, dirs))
    monkeypatch.setattr("numa_pin.enforcer.devnodes.expose_gpus", lambda *a, **k: ("/dev/nvidia0",))
    monkeypatch.setattr("numa_pin.enforcer.devnodes.remove_device_nodes", lambda *a, **k: removed.append(a[1]))
    monkeypatch.setattr("numa_pin.enforcer.gpu.revoke_device_rules", lambda r, d: revoked.append((list(r), list(d))))
    real_write = cgroups.write_cgroup_file

    def write(path: str, text: str) -> None:
        assert "devices." not in path, f"no devices.* write on v2: {path}"
        real_write(path, text)

    monkeypatch.setattr(cgroups, "write_cgroup_file", write)
    agent = NodeService(node.config)
    agent.admit(request_from_oci("g", {"numa-pin.io/devices": "nvidia.com/gpu=1"}), node.container(1))
    grant = agent.ledger.read().grants["g"]
    assert grant.netdevs == ()  # GPU records have a field of their own (ledger format 3)
    assert grant.gpus is not None
    assert grant.gpus.bpf_dirs == dirs and grant.gpus.devices_dir is None
    assert grant.gpus.rules == ("c 195:0 rwm", "c 195:255 rwm")
    agent.release("g")
    assert revoked == [(["c 195:0 rwm", "c 195:255 rwm"], list(dirs))]
    assert removed == [["/dev/nvidia0"]]


def test_a_plain_process_gets_its_gpu_without_device_rules(node, monkeypatch):
    """``numa-pin run`` asks a GPU for a plain process: it is aligned and recorded, but no device
    program or rule is touched (the process keeps the host's device access; on a node without
    libbpf, asking for one failed the whole run)."""
    def no_rules(*a, **k):
        raise AssertionError("a plain process needs no device rules")

    monkeypatch.setattr("numa_pin.enforcer.gpu.gpu_rules", no_rules)
    monkeypatch.setattr("numa_pin.enforcer.gpu.allow_device_rules", no_rules)
    agent = NodeService(node.config)
    grant = agent.admit(request_from_oci("job", {"numa-pin.io/cpus": "2", "numa-pin.io/devices": "nvidia.com/gpu=1"}),
                        node.container(1), kind="process").grant
    (gpu,) = grant.devices["nvidia.com/gpu"]
    assert {d.address: d.numa_node for d in agent.topology.pci_devices}[gpu] in grant.mems
    assert grant.gpus is None
    agent.release("job")


def test_plan_changes_nothing(node):
    agent = NodeService(node.config)
    decision = agent.plan(request_from_oci("p", {"numa-pin.io/cpus": "4"}))
    assert decision.admit and len(decision.cpus) == 4
    assert agent.ledger.read().grants == {}


def test_reconcile_drops_dead_grants_and_repairs_drift(node):
    import shutil

    agent = NodeService(node.config)
    agent.admit(request_from_oci("a", {"numa-pin.io/cpus": "2"}), node.container(1))
    agent.admit(request_from_oci("b", {"numa-pin.io/cpus": "2"}), node.container(2))
    want_b = node.cpuset(2)
    (node.cg / "cpuset" / "ctr" / "c2" / "cpuset.cpus").write_text("0-127\n")  # drift
    shutil.rmtree(node.cg / "cpuset" / "ctr" / "c1")  # container a died without poststop
    removed, repaired = agent.reconcile()
    assert [g.container_id for g in removed] == ["a"] and repaired == ["b"]
    assert node.cpuset(2) == want_b


def test_rollback_failures_ride_on_the_error_and_reach_syslog(node, monkeypatch):
    """An undo step that fails is not dropped: it is part of the error's one line and logged."""
    agent = NodeService(node.config)
    logged: list[str] = []
    monkeypatch.setattr("numa_pin.reporting.report.log_syslog", lambda line, error=True: logged.append(line))
    real_apply = __import__("numa_pin.resources.node.cpu", fromlist=["apply_cpuset"]).apply_cpuset

    def apply_then_jam(ref, cpus, mems, root, undo, **options):
        real_apply(ref, cpus, mems, root, undo, **options)
        undo.record("write cpuset.cpus of c2", lambda: (_ for _ in ()).throw(OSError(16, "Device or resource busy")))

    def broken(*args, **kwargs):
        raise EnforcementError("simulated failure", path="/fake")

    monkeypatch.setattr("numa_pin.resources.node.cpu.apply_cpuset", apply_then_jam)
    monkeypatch.setattr("numa_pin.resources.node.cpu.resize_shared", broken)
    with pytest.raises(EnforcementError) as info:
        agent.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container(2))
    assert info.value.rollback_failures and "busy" in info.value.rollback_failures[0]
    assert "rollback incomplete" in str(info.value) and "\n" not in str(info.value)
    assert any("rollback incomplete" in line and "x:" in line for line in logged)
    assert agent.ledger.read().grants == {}


def test_enforcement_errors_keep_errno_and_cause(tmp_path):
    from numa_pin.enforcer.cgroups import write_cgroup_file as write_file

    target = tmp_path / "no-such-dir" / "cpuset.cpus"
    with pytest.raises(EnforcementError) as info:
        write_file(str(target), "1")
    assert info.value.errno == 2 and isinstance(info.value.__cause__, OSError)
    assert str(target) in str(info.value)


def test_rejection_is_an_exception_class_with_kubelet_kind(node):
    from numa_pin.admission.decide import reject
    from numa_pin.errors import AllocationError, SMTAlignmentError

    agent = NodeService(node.config)
    decision = agent.plan(request_from_oci("big", {"numa-pin.io/cpus": "999"}))
    assert not decision.admit and decision.error is TopologyAffinityError
    assert isinstance(reject(decision), TopologyAffinityError)
    assert issubclass(SMTAlignmentError, AllocationError)


def test_syslog_setting_logs_every_decision(node, monkeypatch):
    from numa_pin.base.record import replace

    logged: list[tuple[str, bool]] = []
    monkeypatch.setattr("numa_pin.reporting.report.log_syslog", lambda line, error=True: logged.append((line, error)))
    for on in (True, False):
        logged.clear()
        agent = NodeService(replace(node.config, syslog=on))
        agent.admit(request_from_oci(f"l{on}", {"numa-pin.io/cpus": "2"}), node.container(3 + on))
        agent.release(f"l{on}")
        verbs = [line.split()[1] for line, error in logged if not error]
        assert verbs == (["admitted", "released"] if on else [])


def test_a_process_cannot_take_a_live_grant_by_name(node):
    """``numa-pin run --name job`` twice: the second admission is refused inside the transaction,
    even when it got past the command's own check (a race), and the first grant is untouched."""
    agent = NodeService(node.config)
    first = agent.admit(request_from_oci("job", {"numa-pin.io/cpus": "2"}), node.container(1), kind="process").grant
    assert agent.live_grant("job") == first
    with pytest.raises(RequestError, match=r"^--name: 'job' is the name of a live grant \(pid 50001, cpus "):
        agent.admit(request_from_oci("job", {"numa-pin.io/cpus": "2"}), node.container(2), kind="process")
    assert agent.ledger.read().grants["job"] == first
    # the runtime's second hook stage for the same pid stays idempotent
    assert agent.admit(request_from_oci("job", {}), 50001, kind="process").grant.cpus == first.cpus


def _host_process(node: Node, pid: int, cgroup: str) -> Path:
    """A process that is no container: ``pid`` in ``cgroup`` (``/`` is the hierarchy root)."""
    directory = node.cg / "cpuset" / cgroup.strip("/")
    directory.mkdir(parents=True, exist_ok=True)
    for leaf, value in (("cpuset.cpus", "0-127"), ("cpuset.mems", "0-3")):
        if not (directory / leaf).exists():
            (directory / leaf).write_text(value + "\n")
    (node.proc_root / str(pid)).mkdir(parents=True)
    (node.proc_root / str(pid) / "cgroup").write_text(f"4:cpuset:{cgroup}\n")
    return directory


@pytest.mark.parametrize("owner", [ContainerCgroup("c9", "/ctr/c9"), ContainerCgroup("c9", "system.slice:runc:c9"),
                                   ContainerCgroup("c9")], ids=["cgroupfs", "systemd", "no-cgroups-path"])
def test_a_foreign_pid_is_refused_before_anything_is_written(node, owner):
    session = _host_process(node, 61000, "/user.slice/session-3.scope")
    before = (session / "cpuset.cpus").read_text()
    agent = NodeService(node.config)
    with pytest.raises(EnforcementError, match=r"pid 61000 is in cgroup /user.slice/session-3.scope, which is not "
                                               r"container c9's"):
        agent.admit(request_from_oci("c9", {"numa-pin.io/cpus": "2"}), 61000, owner=owner)
    assert (session / "cpuset.cpus").read_text() == before
    assert agent.ledger.read().grants == {}


def test_a_pid_in_the_root_cgroup_is_refused(node):
    root = _host_process(node, 61001, "/")
    before = (root / "cpuset.cpus").read_text(), (root / "cpuset.mems").read_text()
    agent = NodeService(node.config)
    with pytest.raises(EnforcementError, match=r"pid 61001 is in the root cgroup; numa-pin never writes the root"):
        agent.admit(request_from_oci("c9", {"numa-pin.io/cpus": "2"}), 61001)
    assert ((root / "cpuset.cpus").read_text(), (root / "cpuset.mems").read_text()) == before
    assert agent.ledger.read().grants == {}


def test_the_containers_own_pid_passes_the_check(node):
    agent = NodeService(node.config)
    grant = agent.admit(request_from_oci("c1", {"numa-pin.io/cpus": "2"}), node.container(1),
                        owner=ContainerCgroup("c1", "/ctr/c1")).grant
    assert parse_list(node.cpuset(1)[0]) == grant.cpus


def test_a_shared_containers_own_cpuset_shrinks_and_grows_but_never_widens(node):
    agent = NodeService(node.config)
    agent.admit(request_from_oci("c1", {}, limits=ContainerLimits(cpuset="1-2")), node.container(1))
    assert node.cpuset(1)[0] == "1-2", "not widened to the shared pool"
    agent.admit(request_from_oci("c2", {"numa-pin.io/cpus": "1"}, limits=ContainerLimits(cpuset="1")), node.container(2))
    assert node.cpuset(2)[0] == "1" and node.cpuset(1)[0] == "2"
    with pytest.raises(AllocationError, match="would leave shared container c1 without a CPU of its own cpuset 1-2"):
        agent.admit(request_from_oci("c3", {"numa-pin.io/cpus": "1"}, limits=ContainerLimits(cpuset="2")), node.container(3))
    agent.release("c2")
    assert node.cpuset(1)[0] == "1-2", "grows back to its own set, not to the pool"
    assert agent.ledger.read().grants["c1"].cpuset_limit == frozenset({1, 2})


def test_gpu_access_is_kept_in_its_own_field_and_taken_back_from_a_live_container(node, monkeypatch):
    """The GPU undo record is ``grant.gpus`` (ledger format 3), never a ``netdevs`` entry; a release
    by hand of a container that still runs removes the nodes it recorded."""
    from numa_pin.ledger.records import GpuAccess

    removed: list[tuple[int, list[str]]] = []
    monkeypatch.setattr("numa_pin.enforcer.gpu.gpu_rules", lambda *a, **k: ())
    monkeypatch.setattr("numa_pin.enforcer.gpu.allow_device_rules", lambda *a, **k: None)
    monkeypatch.setattr("numa_pin.enforcer.devnodes.expose_gpus", lambda *a, **k: ("/dev/nvidia3", "/dev/nvidiactl"))
    monkeypatch.setattr("numa_pin.enforcer.devnodes.remove_device_nodes",
                        lambda pid, paths, proc_root, rootfs: removed.append((pid, paths)))
    monkeypatch.setattr(NodeService, "_alive", lambda self, grant: True)
    agent = NodeService(node.config)
    grant = agent.admit(request_from_oci("g", {"numa-pin.io/devices": "nvidia.com/gpu=1"}), node.container(1)).grant
    assert grant.gpus == GpuAccess(("/dev/nvidia3", "/dev/nvidiactl"), (), None) and grant.netdevs == ()
    assert agent.ledger.read().grants["g"].gpus == grant.gpus
    agent.release("g")
    assert removed == [(50001, ["/dev/nvidia3", "/dev/nvidiactl"])]

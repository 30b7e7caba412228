"""Isolation knobs on a fake node (kit sysfs plus cpufreq, PM QoS and isolated CPUs; cgroup v1
cpuset and cpu hierarchies): applied with the grant, reference-counted, released, rolled back,
re-asserted and cleaned after a crash by ``reconcile``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer.saved import FILE as SAVED
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import AllocationError, EnforcementError, NumaPinError
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node.isolation import CStatesNode
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

#: cpufreq policies of the fake laptop: CPUs 2 and 3 share one (a shared setting), the rest are alone
POLICIES = {"policy0": "0", "policy1": "1", "policy2": "2-3", "policy4": "4", "policy5": "5", "policy6": "6",
            "policy7": "7"}


class IsoNode(FakeNode):
    """The kit's laptop (8 CPUs, one node) with its own sysfs copy to add isolation files to."""

    def __init__(self, root: Path, *, cpufreq: bool = True, isolated: str = "", **config: object) -> None:
        super().__init__(root, "laptop", machines=root / "machines")
        cpu = self.sysfs_root / "devices" / "system" / "cpu"
        for n in range(8):
            (cpu / f"cpu{n}" / "power").mkdir(exist_ok=True)
            (cpu / f"cpu{n}" / "power" / "pm_qos_resume_latency_us").write_text("0\n")
        if cpufreq:
            for name, cpus in POLICIES.items():
                d = cpu / "cpufreq" / name
                d.mkdir(parents=True)
                (d / "related_cpus").write_text(" ".join(str(c) for c in sorted(parse_list(cpus))) + "\n")
                (d / "scaling_governor").write_text("powersave\n")
                (d / "scaling_available_governors").write_text("performance powersave\n")
        (cpu / "isolated").write_text(isolated + "\n")
        # a cgroup v1 cpu hierarchy beside the cpuset one (the quota knob's)
        with open(self.proc_root / "self" / "mountinfo", "a") as f:
            f.write(f"36 25 0:31 / {self.cgroup_root}/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n")
        self.config = config_from_dict(self.config_dict(**config))

    def add_container(self, name: str, pid: int, cpus: str | None = None, *, netns: str | None = None) -> int:
        super().add_container(name, pid, cpus, netns=netns)
        d = self.cgroup_root / "cpu,cpuacct" / self.parent / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.cfs_quota_us").write_text("50000\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
        return pid

    def latency(self, cpu: int) -> str:
        return self.cpu_file(f"cpu{cpu}/power/pm_qos_resume_latency_us")

    def governor(self, policy: str) -> str:
        return self.cpu_file(f"cpufreq/{policy}/scaling_governor")

    def cpu_file(self, rel: str) -> str:
        path = self.sysfs_root / "devices" / "system" / "cpu" / rel
        return path.read_text().strip() if path.exists() else "(none)"

    def quota(self, name: str) -> str:
        return (self.cgroup_root / "cpu,cpuacct" / self.parent / name / "cpu.cfs_quota_us").read_text().strip()

    def saved(self) -> dict[str, dict[str, str]]:
        path = self.state_dir / SAVED
        return json.loads(path.read_text()) if path.exists() else {}

    def snapshot(self) -> dict[str, str]:
        """Every setting file a knob may write, for "nothing changed" checks."""
        out = {f"lat{n}": self.latency(n) for n in range(8)}
        policies = self.sysfs_root / "devices" / "system" / "cpu" / "cpufreq"
        if policies.exists():
            out.update({p: self.governor(p) for p in POLICIES})
        return out


@pytest.fixture
def node(tmp_path: Path) -> IsoNode:
    return IsoNode(tmp_path / "n")


def admit(service: NodeService, node: IsoNode, name: str, pid: int, annotations: dict[str, str],
          cpuset: str | None = None):
    node.add_container(name, pid)
    request = request_from_oci(name, {"numa-pin.io/cpus": "1", **annotations}, limits=ContainerLimits(cpuset=cpuset))
    return service.admit(request, pid).grant


@pytest.mark.parametrize(
    "value, written",
    [("disable", "n/a"), ("max_latency:7", "7"), ("enable", "0")],
    ids=["disable", "max-latency", "enable"],
)
def test_c_states_set_on_the_grant_cpus_and_restored(node, value, written):
    for n in range(8):  # enable writes 0: start elsewhere so the write shows
        (node.sysfs_root / "devices/system/cpu" / f"cpu{n}/power/pm_qos_resume_latency_us").write_text("100\n")
    service = NodeService(node.config)
    grant = admit(service, node, "a", 100, {"cpu-c-states.crio.io": value}, cpuset="2-3")
    cpus = sorted(grant.cpus)
    assert [node.latency(c) for c in range(8)] == [written if c in cpus else "100" for c in range(8)]
    assert service.describe_grant(grant) == [f"c-states={value}"]
    assert len(node.saved()) == len(cpus)
    service.release("a")
    assert [node.latency(c) for c in range(8)] == ["100"] * 8 and node.saved() == {}


def test_a_governor_policy_spanning_cpus_is_reference_counted(node):
    service = NodeService(node.config)
    gov = {"cpu-freq-governor.crio.io": "performance"}
    a = admit(service, node, "a", 100, gov, cpuset="2")
    b = admit(service, node, "b", 101, gov, cpuset="3")
    assert (a.cpus, b.cpus) == ({2}, {3})
    assert node.governor("policy2") == "performance"
    assert node.saved()[str(node.sysfs_root / "devices/system/cpu/cpufreq/policy2/scaling_governor")]["value"] == \
        "powersave"
    service.release("a")
    assert node.governor("policy2") == "performance", "b still holds the policy"
    service.release("b")
    assert node.governor("policy2") == "powersave" and node.saved() == {}


def test_two_governors_for_one_policy_refuse_the_second(node):
    service = NodeService(node.config)
    admit(service, node, "a", 100, {"cpu-freq-governor.crio.io": "performance"}, cpuset="2")
    before, ledger = node.snapshot(), service.ledger.read()
    with pytest.raises(EnforcementError, match="a setting they share") as err:
        admit(service, node, "b", 101, {"cpu-freq-governor.crio.io": "powersave",
                                        "cpu-c-states.crio.io": "disable"}, cpuset="3")
    assert "\n" not in str(err.value)
    assert node.snapshot() == before and service.ledger.read() == ledger


@pytest.mark.parametrize(
    "annotations, missing",
    [({"cpu-freq-governor.crio.io": "performance"}, "cpufreq"),
     ({"cpu-freq-governor.crio.io": "schedutil"}, "available"),
     ({"cpu-c-states.crio.io": "disable"}, "pm_qos")],
    ids=["no-cpufreq", "governor-unavailable", "no-pm-qos"],
)
def test_a_node_without_the_knob_refuses_and_applies_nothing(tmp_path, annotations, missing):
    node = IsoNode(tmp_path / "n", cpufreq=missing != "cpufreq")
    if missing == "pm_qos":
        (node.sysfs_root / "devices/system/cpu/cpu5/power/pm_qos_resume_latency_us").unlink()
    service = NodeService(node.config)
    before = node.snapshot()
    ask = {**annotations, "cpu-quota.crio.io": "disable"}
    if missing != "pm_qos":
        ask["cpu-c-states.crio.io"] = "disable"  # a knob that would apply, enforced before the failing one
    with pytest.raises(EnforcementError):
        admit(service, node, "a", 100, ask, cpuset="5")
    assert node.snapshot() == before and node.quota("a") == "50000" and node.saved() == {}
    assert not service.ledger.read().grants
    assert node.cpuset("a")[0] == format_list(parse_list(node.cpus))


def test_quota_off_on_v1_and_back(node):
    service = NodeService(node.config)
    admit(service, node, "a", 100, {"numa-pin.io/cpu-quota": "disable"})
    assert node.quota("a") == "-1"
    service.release("a")  # a live container released by hand gets its quota back
    assert node.quota("a") == "50000" and node.saved() == {}


def test_reconcile_reasserts_drift(node):
    service = NodeService(node.config)
    grant = admit(service, node, "a", 100, {"cpu-c-states.crio.io": "disable", "cpu-quota.crio.io": "disable"},
                  cpuset="4")
    (node.sysfs_root / "devices/system/cpu/cpu4/power/pm_qos_resume_latency_us").write_text("0\n")
    (node.cgroup_root / "cpu,cpuacct/ctr/a/cpu.cfs_quota_us").write_text("20000\n")
    _, repaired = service.reconcile()
    assert repaired == [grant.container_id]
    assert node.latency(4) == "n/a" and node.quota("a") == "-1"
    assert node.saved()[str(node.sysfs_root / "devices/system/cpu/cpu4/power/pm_qos_resume_latency_us")][
        "value"] == "0", "the original stays the one saved before the first write"


def test_reconcile_cleans_up_after_a_crash(node):
    """A hook killed between its writes and its commit leaves the settings and their saved originals,
    but no grant: reconcile puts the originals back."""
    service = NodeService(node.config)
    grant = admit(service, node, "a", 100, {"cpu-c-states.crio.io": "disable"}, cpuset="6")
    crashed = UndoLog()
    # the same writes for a grant that never reached the ledger
    orphan = grant.__class__(**{**{f: getattr(grant, f) for f in ("pod_id", "container_name", "kind", "mems",
                                                                    "isolation")},
                                "container_id": "ghost", "cpus": frozenset({7})})
    from numa_pin.ledger.model import LedgerState
    from numa_pin.resources.node.base import Admission

    CStatesNode().enforce(service, Admission(orphan, LedgerState({"ghost": orphan}), crashed, None, None, None, (),
                                             False), orphan)
    assert node.latency(7) == "n/a" and len(node.saved()) == 2
    service.reconcile()
    assert node.latency(7) == "0" and node.latency(6) == "n/a" and len(node.saved()) == 1
    node.stop_container("a", 100)  # the container died without a poststop
    service.reconcile()
    assert node.latency(6) == "0" and node.saved() == {}


def test_a_later_failure_rolls_the_knobs_back(node, monkeypatch):
    service = NodeService(node.config)
    before = node.snapshot()
    from numa_pin.resources.node.isolation import GovernorNode

    def boom(self, node_, admission, decided):
        raise EnforcementError("a later resource failed")

    monkeypatch.setattr(GovernorNode, "enforce", boom)
    with pytest.raises(EnforcementError, match="later resource"):
        admit(service, node, "a", 100, {"cpu-c-states.crio.io": "disable", "cpu-quota.crio.io": "disable"})
    assert node.snapshot() == before and node.quota("a") == "50000" and node.saved() == {}


@pytest.mark.parametrize(
    "mode, isolated, expect",
    [("prefer", "5-6", {5, 6}), ("require", "5-6", {5, 6}), ("avoid", "1-6", {7}), ("prefer", "", None)],
    ids=["prefer", "require", "avoid", "none-isolated"],
)
def test_isolated_cpus_steer_exclusive_grants(tmp_path, mode, isolated, expect):
    node = IsoNode(tmp_path / "n", isolated=isolated, isolation={"isolated_cpus": mode})
    service = NodeService(node.config)
    decision = service.plan(request_from_oci("p", {"numa-pin.io/cpus": "2" if expect != {7} else "1"}))
    assert decision.admit
    if expect is not None:
        assert decision.cpus == expect


def test_require_refuses_when_too_few_isolated_cpus(tmp_path):
    node = IsoNode(tmp_path / "n", isolated="5", isolation={"isolated_cpus": "require"})
    decision = NodeService(node.config).plan(request_from_oci("p", {"numa-pin.io/cpus": "2"}))
    assert not decision.admit


@pytest.mark.parametrize("let_in", [False, True], ids=["kept-out", "let-in"])
def test_the_shared_pool_leaves_isolated_cpus_out(tmp_path, let_in):
    node = IsoNode(tmp_path / "n", isolated="6-7", isolation={"shared_pool_isolated": let_in})
    service = NodeService(node.config)
    node.add_container("s", 100)
    service.admit(request_from_oci("s", {}), 100)
    pool = parse_list(node.cpuset("s")[0])
    assert (pool & {6, 7} == {6, 7}) if let_in else not pool & {6, 7}
    status = service.describe(service.ledger.read())
    assert status["isolated_cpus"] == "6-7" and parse_list(status["shared_pool"]) == pool


def test_every_cpu_isolated_leaves_no_shared_pool(tmp_path):
    node = IsoNode(tmp_path / "n", isolated="0-7")
    service = NodeService(node.config)
    node.add_container("s", 100)
    with pytest.raises((AllocationError, NumaPinError)):
        service.admit(request_from_oci("s", {}), 100)


@pytest.mark.parametrize(
    "cgroup, quota_dirs",
    [("/system.slice/libpod-a.scope", ["system.slice/libpod-a.scope"]),
     ("/kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope",
      ["kubepods.slice/kubepods-pod1.slice", "kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope"])],
    ids=["container", "kubernetes-pod-too"],
)
def test_quota_off_on_v2_and_back(tmp_path, cgroup, quota_dirs):
    """cgroup v2: ``cpu.max`` becomes ``max <period>`` (the period kept), for a Kubernetes pod's
    cgroup too; the originals come back when the grant goes, and a second grant of the pod keeps them."""
    from numa_pin.enforcer.cgroups import ref_from_path
    from numa_pin.ledger.model import Grant, LedgerState
    from numa_pin.resources.node.base import Admission, Node, Release
    from numa_pin.resources.node.isolation import QuotaNode
    from numa_pin.resources.node.registry import settings_from_config

    root = tmp_path / "cg"
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(f"30 25 0:26 / {root} rw - cgroup2 cgroup2 rw\n")
    for rel in quota_dirs:
        (root / rel).mkdir(parents=True)
        (root / rel / "cpu.max").write_text("150000 50000\n")
    node = Node(config_from_dict({"cgroup_root": str(root), "proc_root": str(tmp_path / "proc"),
                                  "state_dir": str(tmp_path / "state"), "syslog": False}), None,
                make_settings=settings_from_config)
    grant = Grant("a", "p", "a", "exclusive", cgroup=cgroup, cpus=frozenset({1}), isolation={"quota": "disable"})
    state = LedgerState({"a": grant})
    ref = ref_from_path(cgroup, str(root), node.layout())
    QuotaNode().enforce(node, Admission(grant, state, UndoLog(), ref, 1, None, (), True), grant)
    assert [(root / d / "cpu.max").read_text().strip() for d in quota_dirs] == ["max 50000"] * len(quota_dirs)
    if len(quota_dirs) == 2:  # a second container of the pod: the pod's cgroup is shared by both
        sib = Grant("b", "p", "b", "exclusive", cgroup=cgroup.replace("-a.scope", "-b.scope"), cpus=frozenset({2}),
                    isolation={"quota": "disable"})
        (root / quota_dirs[0] / "cri-containerd-b.scope").mkdir()
        (root / quota_dirs[0] / "cri-containerd-b.scope" / "cpu.max").write_text("max 50000\n")
        QuotaNode().release(node, Release(state.with_grant(sib), LedgerState({"b": sib}), grant, (grant,),
                                          UndoLog()))
        assert (root / quota_dirs[0] / "cpu.max").read_text().strip() == "max 50000", "b still wants it"
        assert (root / quota_dirs[1] / "cpu.max").read_text().strip() == "150000 50000"
        state = LedgerState({"b": sib})
        grant = sib
    QuotaNode().release(node, Release(state, LedgerState(), grant, (grant,), UndoLog()))
    assert [(root / d / "cpu.max").read_text().strip() for d in quota_dirs] == ["150000 50000"] * len(quota_dirs)


def test_release_to_shared_gives_the_settings_back(node):
    """``numa-pin release --force``: the container runs on as a shared one, without its isolation."""
    service = NodeService(node.config)
    grant = admit(service, node, "a", 100, {"cpu-c-states.crio.io": "disable", "cpu-quota.crio.io": "disable"},
                  cpuset="4")
    assert node.latency(4) == "n/a" and node.quota("a") == "-1"
    shared = service.release_to_shared("a")
    assert shared is not None and not shared.isolation and grant.isolation
    assert node.latency(4) == "0" and node.quota("a") == "50000" and node.saved() == {}


@pytest.mark.parametrize(
    "annotations",
    [{"cpu-freq-governor.crio.io": "schedutil"}, {"numa-pin.io/host-services": "disable"}],
    ids=["governor-unavailable", "no-host-cgroup"],
)
def test_a_container_the_node_cannot_isolate_is_refused_before_the_first_write(node, monkeypatch, annotations):
    """The checks run first: the container's cpuset is never written (on cgroup v2 a populated
    cgroup's inherited cpuset cannot always be written back)."""
    from numa_pin.resources.node.cpu import CpuNode

    def written(self, node_, admission, decided):
        raise AssertionError("the CPU resource wrote before the isolation checks")

    monkeypatch.setattr(CpuNode, "enforce", written)
    with pytest.raises(EnforcementError, match="cannot be honoured|not available"):
        admit(NodeService(node.config), node, "a", 100, annotations)


def test_originals_of_an_earlier_boot_are_forgotten_not_written_back(node):
    """After a reboot the settings are the new boot's own: the saved originals of the last boot
    are dropped with its grants, never written over them."""
    boot = node.proc_root / "sys" / "kernel" / "random" / "boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("boot-1\n")
    admit(NodeService(node.config), node, "a", 100, {"cpu-c-states.crio.io": "disable"}, cpuset="4")
    assert node.latency(4) == "n/a" and node.saved()
    boot.write_text("boot-2\n")
    (node.sysfs_root / "devices/system/cpu/cpu4/power/pm_qos_resume_latency_us").write_text("50\n")  # the new boot's
    service = NodeService(node.config)
    service.drop_earlier_boots()
    service.reconcile()
    assert node.latency(4) == "50" and node.saved() == {}


def _resize(service: NodeService, name: str, cpus: int):
    from numa_pin.cli.cmd_resize import resize_change

    return service.update_grant(name, resize_change(service, cpus, None))[1]


ISOLATED = {"cpu-c-states.crio.io": "disable", "cpu-freq-governor.crio.io": "performance"}


def _policies_of(cpus: frozenset[int]) -> set[str]:
    return {p for p, listed in POLICIES.items() if parse_list(listed) & cpus}


def test_a_resize_moves_the_settings_with_the_cpus(node):
    """Issue 36 (3): a grant grown 2 -> 6 and shrunk back gives the 4 CPUs back with their
    originals, in the resize's own transaction (no reconcile, no release in between)."""
    service = NodeService(node.config)
    admitted = admit(service, node, "a", 100, {**ISOLATED, "numa-pin.io/cpus": "2"}).cpus
    grown = _resize(service, "a", 6).cpus
    assert len(grown) == 6 and admitted < grown
    assert [node.latency(c) for c in range(8)] == ["n/a" if c in grown else "0" for c in range(8)]
    assert {p for p in POLICIES if node.governor(p) == "performance"} == _policies_of(grown)

    shrunk = _resize(service, "a", 2).cpus
    assert shrunk == admitted
    assert [node.latency(c) for c in range(8)] == ["n/a" if c in admitted else "0" for c in range(8)]
    assert {p for p in POLICIES if node.governor(p) == "performance"} == _policies_of(admitted)
    assert len(node.saved()) == len(admitted) + len(_policies_of(admitted))
    service.release("a")
    assert node.snapshot() == {**{f"lat{n}": "0" for n in range(8)}, **{p: "powersave" for p in POLICIES}}
    assert node.saved() == {}


def test_a_failed_resize_puts_the_settings_back(node, monkeypatch):
    """The settings given back by a shrink return when a later step of the resize fails."""
    from numa_pin.resources.node.isolation import GovernorNode

    service = NodeService(node.config)
    admit(service, node, "a", 100, {**ISOLATED, "numa-pin.io/cpus": "2"})
    _resize(service, "a", 6)
    before, saved = node.snapshot(), node.saved()
    enforce = GovernorNode.enforce

    def boom(self, node_, admission, decided):
        enforce(self, node_, admission, decided)
        raise EnforcementError("a later resource failed")

    monkeypatch.setattr(GovernorNode, "enforce", boom)
    with pytest.raises(EnforcementError, match="later resource"):
        _resize(service, "a", 2)
    assert node.snapshot() == before and node.saved() == saved


@pytest.mark.parametrize("step", ["save", "forget"])
def test_a_saved_original_whose_directory_sync_fails_is_rolled_back_too(node, monkeypatch, step):
    """The saved-settings file was renamed into place, then its directory's fsync failed: the
    admission (or the resize that gives CPUs back) fails, and its rollback leaves the saved
    originals as they were, not with the half-stored change (found by ``make stress``)."""
    from numa_pin.base import safefs

    service = NodeService(node.config)
    if step == "forget":
        admit(service, node, "a", 100, {**ISOLATED, "numa-pin.io/cpus": "2"})
        _resize(service, "a", 4)
    before, saved = node.snapshot(), node.saved()
    real = safefs.fsync_dir
    fail = {"left": 1}

    def fsync_dir(path):
        if path == str(node.state_dir) and fail["left"]:
            fail["left"] -= 1
            raise OSError(5, "Input/output error")
        return real(path)

    monkeypatch.setattr(safefs, "fsync_dir", fsync_dir)
    with pytest.raises(EnforcementError):
        if step == "save":
            admit(service, node, "b", 101, {"cpu-c-states.crio.io": "disable"})
        else:
            _resize(service, "a", 2)
    assert not fail["left"]
    assert node.snapshot() == before and node.saved() == saved

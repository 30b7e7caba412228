"""Knob 3 of issue 24: no load balancing on exclusive CPUs (``cpu-load-balancing.crio.io: disable``).

cgroup v2 runs on a fake tree whose writes go through a small emulation of the kernel's rule for
a nested (remote) isolated partition (cgroup-v2.rst, "cpuset.cpus.partition"): every ancestor
below the root must list the partition's CPUs in ``cpuset.cpus.exclusive``, a child's exclusive
CPUs must lie in its parent's, else the kernel reads back ``isolated invalid (<reason>)``. The
real kernel's answer is the VM test's (tests/vm/test_vm_isolation.py). cgroup v1 runs through
the whole admission on the kit's fake node. Every test fails without the knob: nothing else
writes these files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError, RequestError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import journal
from numa_pin.resources.node.base import NodeResource
from numa_pin.resources.node.partition import PartitionNode, settle
from numa_pin.resources.node.registry import register, unregister
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

POD = "kubepods.slice/kubepods-pod1.slice"
FILES = ("cpuset.cpus", "cpuset.cpus.exclusive", "cpuset.cpus.partition")


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    return tmp_path_factory.mktemp("machines")


class V2Node:
    """The kit's machine with a cgroup v2 tree: ``kubepods.slice/kubepods-pod1.slice/<ctr>``."""

    def __init__(self, root: Path, machines: Path, *, partitions: bool = True, exclusive: bool = True) -> None:
        self.fake = FakeNode(root, "intel-2s-ht", machines=machines)
        self.root = self.fake.cgroup_root  # v2 is mounted at the cgroup root itself
        (self.fake.proc_root / "self" / "mountinfo").write_text(
            f"30 23 0:26 / {self.root} rw,nosuid - cgroup2 cgroup2 rw\n")
        self.partitions, self.exclusive = partitions, exclusive
        self.root.mkdir(exist_ok=True)
        (self.root / "cpuset.cpus.effective").write_text("0-31\n")
        for d in ("kubepods.slice", POD):
            self.mkcg(d)

    def mkcg(self, rel: str, exclusive: str = "") -> Path:
        d = self.root / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpuset.cpus").write_text("\n")
        if self.exclusive:
            (d / "cpuset.cpus.exclusive").write_text(exclusive + "\n")
        if self.partitions:
            (d / "cpuset.cpus.partition").write_text("member\n")
        return d

    def grant(self, cid: str, cpus: str, asks: bool = True) -> Grant:
        self.mkcg(f"{POD}/{cid}")
        return Grant(cid, "pod1", cid, "exclusive", cpus=parse_list(cpus), cgroup=f"/{POD}/{cid}",
                     isolation={"load_balancing": "disable"} if asks else {})

    def files(self) -> dict[str, str]:
        return {str(p.relative_to(self.root)): p.read_text().strip()
                for p in sorted(self.root.rglob("cpuset.cpus*")) if p.name in FILES}


def kernel(real=cg.write_cgroup_file, reason: str | None = None):
    """``write_cgroup_file`` as the kernel answers a partition: ``isolated`` stays valid only when
    every ancestor below the root holds the cgroup's exclusive CPUs (or ``reason`` says no)."""

    def write(path: str, text: str) -> None:
        d = Path(path).parent
        if path.endswith("cpuset.cpus.exclusive") and (d.parent / "cpuset.cpus.exclusive").exists():
            if not parse_list(text) <= parse_list((d.parent / "cpuset.cpus.exclusive").read_text().strip()):
                raise EnforcementError(f"writing {text!r} failed: Invalid argument", path=path)
        real(path, text)
        if path.endswith("cpuset.cpus.partition") and text == "isolated":
            own = parse_list((d / "cpuset.cpus.exclusive").read_text().strip())
            anc, why = d.parent, reason
            while why is None and (anc / "cpuset.cpus.exclusive").exists():
                if not own or not own <= parse_list((anc / "cpuset.cpus.exclusive").read_text().strip()):
                    why = "Invalid cpu list in cpuset.cpus.exclusive"
                anc = anc.parent
            if why is not None:
                real(path, f"isolated invalid ({why})")

    return write


@pytest.fixture
def v2(tmp_path, machines, monkeypatch):
    monkeypatch.setattr(cg, "write_cgroup_file", kernel())
    return V2Node(tmp_path / "n", machines)


def service(fake: FakeNode) -> NodeService:
    return NodeService(config_from_dict(fake.config_dict()))


def test_v2_container_becomes_an_isolated_partition_and_is_undone(v2):
    svc = service(v2.fake)
    grant = v2.grant("c", "2-3")
    before = v2.files()
    undo = UndoLog()
    assert settle(svc, LedgerState().with_grant(grant), undo, (grant,)) == ["c"]
    now = v2.files()
    assert now[f"{POD}/c/cpuset.cpus.partition"] == "isolated"
    assert now[f"{POD}/c/cpuset.cpus.exclusive"] == "2-3"
    assert now["kubepods.slice/cpuset.cpus.exclusive"] == "2-3"
    assert now[f"{POD}/cpuset.cpus.exclusive"] == "2-3"
    assert PartitionNode().describe(grant) == ["load-balancing=disable"]
    undo.rollback()
    assert v2.files() == before


def test_v2_release_takes_back_only_what_each_grant_added(v2):
    """An administrator's exclusive CPU 30 on the slice stays; A's release keeps B's CPUs."""
    (v2.root / "kubepods.slice" / "cpuset.cpus.exclusive").write_text("30\n")
    svc = service(v2.fake)
    a, b = v2.grant("a", "2-3"), v2.grant("b", "4-5")
    both = LedgerState().with_grant(a).with_grant(b)
    settle(svc, both, UndoLog(), (a, b))
    assert v2.files()["kubepods.slice/cpuset.cpus.exclusive"] == "2-5,30"
    settle(svc, both.without("a"), UndoLog(), ())
    now = v2.files()
    assert now["kubepods.slice/cpuset.cpus.exclusive"] == "4-5,30"
    assert now[f"{POD}/cpuset.cpus.exclusive"] == "4-5"
    assert now[f"{POD}/a/cpuset.cpus.partition"] == "member"
    assert now[f"{POD}/b/cpuset.cpus.partition"] == "isolated"
    settle(svc, LedgerState(), UndoLog(), ())
    assert v2.files()["kubepods.slice/cpuset.cpus.exclusive"] == "30"
    assert not (v2.fake.state_dir / journal.FILE).exists()


def test_v2_invalid_partition_fails_with_the_kernels_reason_and_rolls_back(v2, monkeypatch):
    monkeypatch.setattr(cg, "write_cgroup_file", kernel(reason="Cpu list in cpuset.cpus not exclusive"))
    svc = service(v2.fake)
    grant = v2.grant("c", "2-3")
    before = v2.files()
    undo = UndoLog()
    with pytest.raises(EnforcementError, match=r"isolated invalid \(Cpu list in cpuset.cpus not exclusive\)"):
        settle(svc, LedgerState().with_grant(grant), undo, (grant,))
    assert not undo.rollback()
    assert v2.files() == before


@pytest.mark.parametrize(
    ("partitions", "exclusive", "says"),
    [
        pytest.param(False, True, "no cpuset partitions", id="no-partitions"),
        pytest.param(True, False, "Linux 6.7", id="no-cpus-exclusive-for-a-nested-cgroup"),
    ],
)
def test_v2_kernel_without_what_it_needs_rejects_before_any_write(tmp_path, machines, monkeypatch, partitions,
                                                                 exclusive, says):
    monkeypatch.setattr(cg, "write_cgroup_file", kernel())
    node = V2Node(tmp_path / "n", machines, partitions=partitions, exclusive=exclusive)
    svc = service(node.fake)
    grant = node.grant("c", "2-3")
    before = node.files()
    undo = UndoLog()
    with pytest.raises(EnforcementError, match=says) as err:
        settle(svc, LedgerState().with_grant(grant), undo, (grant,))
    assert "\n" not in str(err.value)
    assert len(undo) == 0 and node.files() == before


def test_v2_repair_reasserts_drift_and_cleans_a_crashed_admission(v2):
    svc = service(v2.fake)
    a, crashed = v2.grant("a", "2-3"), v2.grant("x", "6-7")
    settle(svc, LedgerState().with_grant(a).with_grant(crashed), UndoLog(), (a, crashed))
    (v2.root / POD / "a" / "cpuset.cpus.partition").write_text("member\n")  # an outside writer
    state = LedgerState().with_grant(a)  # the ledger never got x: its hook died before the commit
    assert PartitionNode().repair(svc, state, UndoLog()) == ["a"]
    now = v2.files()
    assert now[f"{POD}/a/cpuset.cpus.partition"] == "isolated"
    assert now[f"{POD}/x/cpuset.cpus.partition"] == "member"
    assert now["kubepods.slice/cpuset.cpus.exclusive"] == "2-3"
    assert PartitionNode().repair(svc, state, UndoLog()) == [], "nothing drifted the second time"


# ---- cgroup v1, through the whole admission -----------------------------------------------
@pytest.fixture
def v1(tmp_path, machines):
    node = FakeNode(tmp_path / "n1", "intel-2s-ht", machines=machines)
    (node.cgroup_root / "cpuset" / "cpuset.sched_load_balance").write_text("0\n")
    (node.cgroup_root / "cpuset" / "ctr").mkdir(parents=True, exist_ok=True)
    (node.cgroup_root / "cpuset" / "ctr" / "cpuset.sched_load_balance").write_text("1\n")
    return node


def admit(node, cid, pid, lb="disable", cpus=2):
    node.add_container(cid, pid)
    (node.cgroup_dir(cid) / "cpuset.sched_load_balance").write_text("1\n")
    ann = {"numa-pin.io/cpus": str(cpus), **({"cpu-load-balancing.crio.io": lb} if lb else {})}
    return service(node).admit(request_from_oci(cid, ann), pid).grant


def flag(node, rel):
    return (node.cgroup_root / "cpuset" / rel / "cpuset.sched_load_balance").read_text().strip()


def test_v1_load_balancing_off_where_it_takes_effect_and_back_on_release(v1):
    admit(v1, "a", 41001)
    admit(v1, "b", 41002)
    assert (flag(v1, "ctr"), flag(v1, "ctr/a"), flag(v1, "ctr/b")) == ("0", "0", "0")
    svc = service(v1)
    svc.release("a")
    assert flag(v1, "ctr") == "0", "b still sits below it"
    svc.release("b")
    assert flag(v1, "ctr") == "1"
    assert flag(v1, "") == "0", "the root's is the administrator's"


def test_v1_root_that_balances_everything_rejects_with_one_line_before_any_write(v1, monkeypatch):
    (v1.cgroup_root / "cpuset" / "cpuset.sched_load_balance").write_text("1\n")
    writes = []
    monkeypatch.setattr(cg, "write_cgroup_file", lambda path, text: writes.append(path))
    with pytest.raises(EnforcementError, match="does not turn it off for the whole node") as err:
        admit(v1, "a", 41001)
    assert "\n" not in str(err.value)
    assert writes == [], "refused before the CPU resource wrote the cpuset (nothing to roll back)"
    assert flag(v1, "ctr") == "1" and flag(v1, "ctr/a") == "1"
    assert service(v1).ledger.read().grants == {}


def test_v1_a_container_that_asks_nothing_keeps_its_balancing(v1):
    admit(v1, "a", 41001, lb=None)
    assert flag(v1, "ctr/a") == "1" and flag(v1, "ctr") == "1"


def test_a_shared_container_that_asks_is_refused_with_one_line(v1):
    with pytest.raises(RequestError, match="cpu-load-balancing.crio.io"):
        admit(v1, "a", 41001, cpus=0)
    assert os.path.exists(v1.cgroup_dir("a"))
    assert flag(v1, "ctr/a") == "1"



class Jam(NodeResource):
    """Fails after the load-balancing knob, noting the container's flag when it ran."""

    name = "example.com/jam"
    seen: str | None = None

    def enforce(self, node, admission, decided):
        self.seen = (Path(admission.ref.cpuset_dir) / "cpuset.sched_load_balance").read_text()
        raise EnforcementError("the jam refuses")


def test_v1_a_later_failure_turns_the_flags_back_on(v1):
    jam = Jam()
    register(jam)
    try:
        with pytest.raises(EnforcementError, match="the jam refuses"):
            admit(v1, "a", 41001)
    finally:
        unregister(jam)
    assert jam.seen is not None and jam.seen.strip() == "0", "it was off when the later step failed"
    assert flag(v1, "ctr/a") == "1" and flag(v1, "ctr") == "1"
    assert not (v1.state_dir / journal.FILE).exists()

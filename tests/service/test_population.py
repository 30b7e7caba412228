"""A node carrying many shared containers (issue 21 part 2): exclusive still means exclusive.

With more shared containers than one admission checks for liveness
(:data:`~numa_pin.ledger.liveness.SHARED_CHECKS`), an exclusive admission still takes its CPUs
out of every shared container's cpuset (nested cgroups too) before it returns, a dead exclusive
grant is still dropped by the next admission (its CPUs go back to the shared containers), and a
release gives the CPUs back to every shared container.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import replace
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import AllocationError, EnforcementError
from numa_pin.ledger import liveness
from numa_pin.ledger.liveness import SHARED_CHECKS
from numa_pin.reporting.report import read_set_aside
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.resources.node.warm import WarmState
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

SHARED = SHARED_CHECKS + 4


@pytest.fixture
def busy(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[FakeNode, NodeService]:
    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted")))
    for i in range(SHARED):
        svc.admit(request_from_oci(f"s{i}", {}), node.add_container(f"s{i}", 50_000 + i))
    nested = node.cgroup_dir("s1") / "docker"
    nested.mkdir()
    for name in ("cpuset.cpus", "cpuset.mems"):
        (nested / name).write_text((node.cgroup_dir("s1") / name).read_text())
    return node, svc


def cpus_of(d: Path) -> frozenset[int]:
    return parse_list((d / "cpuset.cpus").read_text())


def shared_cpusets(node: FakeNode) -> dict[str, frozenset[int]]:
    out = {f"s{i}": cpus_of(node.cgroup_dir(f"s{i}")) for i in range(SHARED)}
    out["s1/docker"] = cpus_of(node.cgroup_dir("s1") / "docker")
    return out


def exclusive(svc: NodeService, node: FakeNode, cid: str, pid: int, cpus: int = 2) -> frozenset[int]:
    return svc.admit(request_from_oci(cid, {"numa-pin.io/cpus": str(cpus)}), node.add_container(cid, pid)).grant.cpus


def test_every_shared_container_leaves_a_new_grant_and_gets_a_released_one_back(busy) -> None:
    node, svc = busy
    everything = parse_list(node.cpus)
    assert set(shared_cpusets(node).values()) == {everything}
    x = exclusive(svc, node, "x", 60_000)
    pool = cpu_node.shared_pool(svc, svc.ledger.read())
    assert pool == everything - x
    assert shared_cpusets(node) == dict.fromkeys(shared_cpusets(node), pool)  # all of them, before admit returns
    y = exclusive(svc, node, "y", 60_001)
    assert not x & y
    assert set(shared_cpusets(node).values()) == {everything - x - y}
    svc.release("x")
    assert set(shared_cpusets(node).values()) == {everything - y}  # x's CPUs are back in every one
    assert cpus_of(node.cgroup_dir("y")) == y


def test_a_dead_exclusive_grant_is_dropped_by_the_next_admission_whatever_the_shared_population(
        busy, monkeypatch: pytest.MonkeyPatch) -> None:
    node, svc = busy
    # the shared grants checked this time are the first ones by id ("s..."), so "x" would be left out
    monkeypatch.setattr(liveness.os, "urandom", lambda n: bytes(n))
    everything = parse_list(node.cpus)
    x = exclusive(svc, node, "x", 60_000)
    node.stop_container("x", 60_000)  # killed without a poststop
    z = exclusive(svc, node, "z", 60_002)
    grants = svc.ledger.read().grants
    assert "x" not in grants and "z" in grants
    assert set(shared_cpusets(node).values()) == {everything - z}  # x's CPUs went back to the shared ones
    assert x - z <= cpu_node.shared_pool(svc, svc.ledger.read())


def test_dead_shared_grants_cost_nothing_and_reconcile_drops_them_all(busy) -> None:
    node, svc = busy
    for i in range(0, SHARED, 3):
        node.stop_container(f"s{i}", 50_000 + i)
    x = exclusive(svc, node, "x", 60_000)  # their missing cgroups do not get in the way
    live = [f"s{i}" for i in range(SHARED) if i % 3]
    assert {cpus_of(node.cgroup_dir(c)) for c in live} == {parse_list(node.cpus) - x}
    svc.reconcile()
    assert set(svc.ledger.read().grants) == {*live, "x"}


def test_after_the_spare_warmed_up_only_new_shared_cgroups_are_checked(busy, monkeypatch: pytest.MonkeyPatch) -> None:
    node, svc = busy
    checked: list[str] = []
    real = cgroups.refs_from_paths

    def counting(paths, *args, **kwargs):
        checked.extend(paths)
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(cgroups, "refs_from_paths", counting)
    exclusive(svc, node, "x", 60_000)
    assert len(checked) == SHARED  # not warmed up (a hook, the CLI): every path, every time
    cpu_node.warm(svc, svc.ledger.read())  # a cold service keeps nothing
    checked.clear()
    exclusive(svc, node, "x2", 60_010)
    assert len(checked) == SHARED
    svc.warm_state = WarmState()
    cpu_node.warm(svc, svc.ledger.read())
    svc.admit(request_from_oci("late", {}), node.add_container("late", 60_001))
    checked.clear()
    exclusive(svc, node, "y", 60_002)
    assert checked == ["/ctr/late"]
    # a path that now leaves the cgroup root is never written (it was not checked yet): its grant is
    # set aside (reported, nothing done to it), and blocks no admission (issue 34 item 7)
    outside = node.root / "outside"
    outside.mkdir()
    evil = node.cgroup_dir("late2")
    evil.parent.mkdir(parents=True, exist_ok=True)
    evil.symlink_to(outside)
    (node.proc_root / "60003").mkdir(parents=True)
    (node.proc_root / "60003" / "cgroup").write_text("4:cpuset:/ctr/late2\n")
    # liveness asks no shared grant this time (its turn comes round every few dozen admissions):
    # the resize of the shared pool itself meets the path
    monkeypatch.setattr(liveness, "_turn", lambda idle, start: [])
    svc.ledger.read()
    with svc.ledger.transaction() as txn:
        txn.put(replace(txn.state.grants["late"], container_id="late2", container_name="late2", cgroup="/ctr/late2",
                        pid=60_003))
    exclusive(svc, node, "z", 60_004)
    assert "late2" not in svc.ledger.read().grants and "late2" in read_set_aside(str(node.state_dir))
    assert list(outside.iterdir()) == []
    assert set(shared_cpusets(node).values()) == {parse_list(node.cpus) - svc.ledger.read().exclusive_cpus()}


def test_what_a_spare_warmed_stays_with_the_services_given_it(busy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm state is the agent child's, not the process's: another service in the same
    process (a cold one) still checks every path, opens nothing and defers nothing."""
    node, svc = busy
    kept = WarmState()
    warm_svc = NodeService(svc.config, warm_state=kept)
    cpu_node.warm(warm_svc, warm_svc.ledger.read())
    kept.defer()
    checked: list[str] = []
    real = cgroups.refs_from_paths
    monkeypatch.setattr(cgroups, "refs_from_paths", lambda paths, *a, **k: checked.extend(paths) or real(paths, *a, **k))
    written = _path_writes(monkeypatch)
    try:
        exclusive(svc, node, "x", 60_000)
        assert len(checked) == SHARED and len(written) >= SHARED  # every path checked, every file by path
        svc.release("x")
        assert kept.deferred == [] and set(shared_cpusets(node).values()) == {parse_list(node.cpus)}
        checked.clear()
        exclusive(warm_svc, node, "y", 60_001)
        assert checked == [] and kept.deferred  # the warm one: nothing checked again, the sweep left for later
    finally:
        kept.forget()


def test_the_agent_grows_the_shared_containers_back_after_its_reply_never_onto_a_granted_cpu(
        busy, monkeypatch: pytest.MonkeyPatch) -> None:
    node, svc = busy
    everything = parse_list(node.cpus)
    x = exclusive(svc, node, "x", 60_000, cpus=4)
    svc.warm_state = kept = WarmState()
    kept.defer()  # what the agent's child does before it runs a request
    svc.release("x")
    assert "x" not in svc.ledger.read().grants
    assert set(shared_cpusets(node).values()) == {everything - x}  # not yet: the hook has its answer first
    # an admission before the growth takes some of x's CPUs: the growth never hands them out
    y = exclusive(svc, node, "y", 60_001, cpus=2)
    kept.settle()  # after the reply
    assert set(shared_cpusets(node).values()) == {everything - y}
    assert kept.deferred is None  # one request's worth; the next release grows at once again
    svc.release("y")
    assert set(shared_cpusets(node).values()) == {everything}


def test_in_the_agent_the_shared_grants_turn_at_liveness_comes_after_the_reply(
        busy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's child asks no shared container whether it lives while the hook waits (the
    exclusive grants are asked, a dead one dropped as always); after its reply it checks
    SHARED_CHECKS of them and drops the dead ones, as an in-process admission does at once."""
    node, svc = busy
    monkeypatch.setattr(liveness.os, "urandom", lambda n: bytes(n))  # the turn starts at the first id
    asked: list[str] = []
    real = type(svc)._alive
    monkeypatch.setattr(type(svc), "_alive", lambda self, g: asked.append(g.container_id) or real(self, g))
    exclusive(svc, node, "x", 60_000)
    node.stop_container("x", 60_000)
    dead = sorted(f"s{i}" for i in range(SHARED))[0]  # first in the turn
    node.stop_container(dead, 50_000 + int(dead[1:]))
    asked.clear()
    svc.warm_state = kept = WarmState()
    kept.defer()
    y = exclusive(svc, node, "y", 60_001)
    assert not [c for c in asked if c.startswith("s")] and "x" in asked
    grants = svc.ledger.read().grants
    assert "x" not in grants and dead in grants  # the dead shared grant waits for its turn
    live = [f"s{i}" for i in range(SHARED) if f"s{i}" != dead]
    assert {cpus_of(node.cgroup_dir(c)) for c in live} == {parse_list(node.cpus) - y}
    kept.settle()  # after the reply
    assert len([c for c in asked if c.startswith("s")]) == SHARED_CHECKS
    assert dead not in svc.ledger.read().grants
    asked.clear()
    exclusive(svc, node, "z", 60_002)  # in-process again: the turn is taken at once
    assert len([c for c in asked if c.startswith("s")]) == SHARED_CHECKS


def test_an_admission_moves_the_shared_containers_from_the_ledgers_pool_without_reading_them(
        busy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool the shared containers leave is the ledger's, so their files are written, not read
    first (a busy node has thousands); a failure later in the admission puts every one back on
    that pool, one that had drifted too, and the next admission takes its CPUs out of all."""
    node, svc = busy
    everything = parse_list(node.cpus)
    (node.cgroup_dir("s3") / "cpuset.cpus").write_text("0\n")  # drifted behind numa-pin's back
    reads: list[str] = []
    real_read = cgroups.read_cgroup_file
    monkeypatch.setattr(cgroups, "read_cgroup_file", lambda path: reads.append(path) or real_read(path))
    later = next(r for r in svc.resources if type(r).__name__ == "MemoryNode")

    def fail(*_args, **_kwargs):
        raise EnforcementError("injected after the CPUs were enforced", path="memory")

    monkeypatch.setattr(type(later), "enforce", fail)
    with pytest.raises(EnforcementError, match="injected"):
        exclusive(svc, node, "x", 60_000)
    assert "x" not in svc.ledger.read().grants
    assert shared_cpusets(node) == dict.fromkeys(shared_cpusets(node), everything)
    monkeypatch.undo()
    monkeypatch.setattr(cgroups, "read_cgroup_file", lambda path: reads.append(path) or real_read(path))
    reads.clear()
    x = exclusive(svc, node, "x", 60_001)
    shared_files = {str(node.cgroup_dir(f"s{i}") / "cpuset.cpus") for i in range(SHARED) if i != 1}
    assert not shared_files & set(reads)  # s1 has a nested cgroup: that one is read, with it
    assert shared_cpusets(node) == dict.fromkeys(shared_cpusets(node), everything - x)


def test_a_ledger_whose_pool_the_config_no_longer_allows_is_read_not_trusted(busy) -> None:
    """The pool the shared containers leave is the one the ledger had under the config as it is
    now; when that would be empty (the config changed since: strict-cpu-reservation, say), the
    resize reads each container instead of giving up, and every one still leaves the new grant."""
    node, svc = busy
    everything = parse_list(node.cpus)
    state = svc.ledger.read()
    squat = replace(state.grants["s0"], container_id="squat", container_name="squat", kind="exclusive",
                    cpus=everything, cgroup=None)
    before = state.with_grant(squat)  # a ledger whose exclusive grants leave no pool at all
    with pytest.raises(AllocationError):
        cpu_node.shared_pool(svc, before)
    undo = UndoLog()
    pool = everything - {min(everything)}
    result = cpu_node._resize(svc, state, pool, undo, before=before)
    assert len(result.updated) == SHARED
    assert set(shared_cpusets(node).values()) == {pool}
    assert undo.rollback() == ()
    assert set(shared_cpusets(node).values()) == {everything}


@pytest.fixture
def warmed(busy):
    """The busy node after the agent's spare rehearsed on it: paths checked, leaves seen, their
    ``cpuset.cpus`` held open (closed after the test)."""
    node, svc = busy
    svc.warm_state = WarmState()
    cpu_node.warm(svc, svc.ledger.read())
    yield node, svc
    svc.warm_state.forget()


def _path_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    written: list[str] = []
    real = cgroups.write_cgroup_file
    monkeypatch.setattr(cgroups, "write_cgroup_file", lambda path, text: written.append(path) or real(path, text))
    return written


def test_after_the_spare_warmed_up_shared_containers_are_written_through_held_handles(
        warmed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy node's admission writes each shared leaf's cpuset.cpus through the descriptor the
    spare opened, with no path opened; a failure later rolls every one back all the same."""
    node, svc = warmed
    everything = parse_list(node.cpus)
    leaves = {str(node.cgroup_dir(f"s{i}") / "cpuset.cpus") for i in range(SHARED) if i != 1}
    assert set(svc.warm_state.handles or {}) == leaves  # s1 has a nested cgroup: not a leaf
    written = _path_writes(monkeypatch)
    x = exclusive(svc, node, "x", 60_000)
    assert not leaves & set(written)
    assert shared_cpusets(node) == dict.fromkeys(shared_cpusets(node), everything - x)
    later = next(r for r in svc.resources if type(r).__name__ == "MemoryNode")
    monkeypatch.setattr(type(later), "enforce", lambda *_a, **_k: (_ for _ in ()).throw(
        EnforcementError("injected after the CPUs were enforced", path="memory")))
    with pytest.raises(EnforcementError, match="injected"):
        exclusive(svc, node, "y", 60_001)
    assert shared_cpusets(node) == dict.fromkeys(shared_cpusets(node), everything - x)


def test_exclusive_admissions_after_the_spare_warmed_up_reuse_its_shared_cgroups(
        warmed, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state an exclusive admission commits carries the shared grants of the state it read,
    so the shared containers' cgroups the spare found are used as they are: no path is checked,
    none is listed again, and every shared container still leaves both new grants."""
    node, svc = warmed
    everything = parse_list(node.cpus)
    checked: list[str] = []
    real = cgroups.refs_from_paths
    monkeypatch.setattr(cgroups, "refs_from_paths", lambda paths, *a, **k: checked.extend(paths) or real(paths, *a, **k))
    listed = svc.warm_state.last
    x = exclusive(svc, node, "x", 60_000)
    y = exclusive(svc, node, "y", 60_001)
    assert checked == [] and listed is not None and svc.warm_state.last is listed
    assert shared_cpusets(node) == dict.fromkeys(shared_cpusets(node), everything - x - y)
    svc.release("x")  # a release carries them too; a shared admission lists its own
    svc.admit(request_from_oci("late", {}), node.add_container("late", 60_002))
    z = exclusive(svc, node, "z", 60_003)
    assert checked == ["/ctr/late"] and svc.warm_state.last is not listed
    assert {**shared_cpusets(node), "late": cpus_of(node.cgroup_dir("late"))} == dict.fromkeys(
        [*shared_cpusets(node), "late"], everything - y - z)


def test_a_shared_cgroup_made_again_since_the_spare_opened_it_is_written_by_path(
        warmed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container restarted under the same cgroup path: the held descriptor is the old file's
    (the kernel refuses it with ENODEV, a test tree's plain file is unlinked), so the new one is
    written by path and leaves the new grant too."""
    node, svc = warmed
    everything = parse_list(node.cpus)
    node.stop_container("s2", 50_002)
    node.add_container("s2", 50_002)
    (node.cgroup_dir("s2") / "cpuset.cpus").write_text("0-1,3\n")  # longer or shorter: all replaced
    written = _path_writes(monkeypatch)
    x = exclusive(svc, node, "x", 60_000)
    assert written.count(str(node.cgroup_dir("s2") / "cpuset.cpus")) == 1
    assert shared_cpusets(node) == dict.fromkeys(shared_cpusets(node), everything - x)


def test_held_handles_leave_the_descriptor_limit_room(busy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spare never takes the descriptors an admission needs: handles stop HANDLE_HEADROOM
    below the soft limit, and the shared containers past that are written by path."""
    import resource

    node, svc = busy
    probe = os.open(os.devnull, os.O_RDONLY)
    os.close(probe)
    soft = probe + cgroups.HANDLE_HEADROOM + 5  # room for about five handles
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (soft, soft))
    monkeypatch.setattr(resource, "setrlimit", lambda *_a: pytest.fail("the hard limit is the limit"))
    handles = cgroups.open_handles(str(node.cgroup_dir(f"s{i}") / "cpuset.cpus") for i in range(SHARED))
    try:
        assert 0 < len(handles) <= 5
        assert all(fd < soft - cgroups.HANDLE_HEADROOM for fd, _ in handles.values())
    finally:
        cgroups.close_handles(handles)


def test_a_handle_write_cuts_a_longer_file_and_refuses_an_unlinked_one(tmp_path: Path) -> None:
    path = tmp_path / "cpuset.cpus"
    path.write_text("0-7,9,11,13-63\n")
    handles = cgroups.open_handles([str(path)])
    ((fd, plain),) = handles.values()
    try:
        assert plain  # a test tree's file keeps what is written to it
        assert cgroups.write_cgroup_handle(fd, b"0-3\n", plain)
        assert path.read_text() == "0-3\n"
        path.unlink()
        assert not cgroups.write_cgroup_handle(fd, b"0-2\n", plain)
    finally:
        cgroups.close_handles(handles)


def test_a_shared_cgroup_that_now_leaves_the_root_blocks_no_admission_from_a_hook(
        busy, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook (nothing warmed up) checks every shared path at each exclusive admission: the one
    that leaves the cgroup root is set aside, nothing is written through it, the others shrink."""
    node, svc = busy
    monkeypatch.setattr(liveness, "_turn", lambda idle, start: [])  # liveness asks no shared grant
    outside = node.root / "outside"
    outside.mkdir()
    for name in ("cpuset.cpus", "cpuset.mems"):
        (outside / name).write_text("0")
    gone = node.cgroup_dir("s2")
    for child in gone.iterdir():
        child.unlink()
    gone.rmdir()
    gone.symlink_to(outside)
    x = exclusive(svc, node, "x", 60_000)
    assert "s2" not in svc.ledger.read().grants and "s2" in read_set_aside(str(node.state_dir))
    assert (outside / "cpuset.cpus").read_text() == "0"
    assert set(shared_cpusets_but(node, "s2").values()) == {parse_list(node.cpus) - x}
    assert exclusive(svc, node, "y", 60_001)  # and the next admission does not meet it again


def shared_cpusets_but(node: FakeNode, skip: str) -> dict[str, frozenset[int]]:
    out = {f"s{i}": cpus_of(node.cgroup_dir(f"s{i}")) for i in range(SHARED) if f"s{i}" != skip}
    out["s1/docker"] = cpus_of(node.cgroup_dir("s1") / "docker")
    return out


def test_a_transaction_checks_the_grant_the_last_one_changed_not_every_grant(busy) -> None:
    """Each transaction leaves out the grants no check can be made of (``set_aside``); the next one
    works on a ledger one change later, so it looks at that change, not at every shared grant."""
    node, svc = busy
    looked: list[str] = []

    class Counting(dict):
        def get(self, key, default=None):
            looked.append(key)
            return super().get(key, default)

    svc._usable = Counting(svc._usable)
    for i in range(3):
        svc.admit(request_from_oci(f"t{i}", {}), node.add_container(f"t{i}", 61_000 + i))
        svc.release(f"t{i}")
    assert len(svc.ledger.read().grants) == SHARED
    assert 0 < len(looked) <= 6, f"{len(looked)} grants looked at in 6 transactions over {SHARED} grants"

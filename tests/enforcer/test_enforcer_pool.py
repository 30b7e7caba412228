"""Shared pool arithmetic (pure) and resizing shared container cgroups (fake trees)."""

from __future__ import annotations

from pathlib import Path

import pytest
from enforcer_fakes import FakeCgroupTree, snapshot, write
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.enforcer import cgroups
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.pool import plan_shared_updates, reserved_conflicts, resize_shared, shared_pool
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import AllocationError, CgroupEscapeError, EnforcementError


# ---- shared_pool ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "online, grants, reserved, expected",
    [
        (range(8), [], [], set(range(8))),
        (range(8), [[2, 3]], [0], {0, 1, 4, 5, 6, 7}),
        (range(8), [[2, 3], [6, 7]], [0, 1], {0, 1, 4, 5}),
        (range(4), [[1, 2, 3]], [0], {0}),
        (range(4), [[1, 2, 3]], [], {0}),
        (range(4), [[1], [1, 2]], [], {0, 3}),
        (range(4), [[2, 3, 9]], [], {0, 1}),
        (range(4), [[1, 2, 3]], [0, 12], {0}),
    ],
    ids=["no-grants", "one-grant", "two-grants", "only-reserved-left",
         "last-unreserved-cpu", "overlapping-grants", "grant-of-offline-cpu",
         "offline-reserved-ignored"],
)
def test_shared_pool(online, grants, reserved, expected) -> None:
    assert shared_pool(online, grants, reserved) == frozenset(expected)


@pytest.mark.parametrize(
    "online, grants, reserved, match",
    [
        (range(4), [[0, 1, 2, 3]], [], "would be empty"),
        (range(4), [[0, 1], [2, 3]], [], "would be empty"),
        ([], [], [], "would be empty"),
    ],
    ids=["all-granted", "all-granted-split", "nothing-online"],
)
def test_shared_pool_refuses(online, grants, reserved, match: str) -> None:
    with pytest.raises(AllocationError, match=match):
        shared_pool(online, grants, reserved)


# kubelet's TestStaticPolicyStartWithResvList (topoDualSocketHT: 12 CPUs, reserved 0-1): the
# default cpuset a fresh static policy starts with, without and with strict-cpu-reservation
@pytest.mark.parametrize(
    "strict, expected",
    [(False, range(12)), (True, range(2, 12))],
    ids=["empty cpuset", "empty cpuset with StrictCPUReservationOption enabled"],
)
def test_shared_pool_kubelet_start_with_reserved_list(strict: bool, expected) -> None:
    assert shared_pool(range(12), [], [0, 1], strict=strict) == frozenset(expected)


@pytest.mark.parametrize(
    "online, grants, reserved, expected",
    [
        (range(8), [[2, 3]], [0], {1, 4, 5, 6, 7}),
        (range(8), [[2, 3]], [0, 12], {1, 4, 5, 6, 7}),  # an offline reserved CPU changes nothing
        (range(8), [[0, 2]], [0], {1, 3, 4, 5, 6, 7}),  # a grant holding a now-reserved CPU
    ],
    ids=["grant-and-reserved-out", "offline-reserved", "reserved-held-by-an-old-grant"],
)
def test_shared_pool_strict_keeps_reserved_cpus_out(online, grants, reserved, expected) -> None:
    assert shared_pool(online, grants, reserved, strict=True) == frozenset(expected)


def test_shared_pool_strict_refuses_to_empty_it_in_kubelets_words() -> None:
    with pytest.raises(AllocationError, match="^default cpuset cannot be empty: .*strict-cpu-reservation"):
        shared_pool(range(4), [[2, 3]], [0, 1], strict=True)
    assert shared_pool(range(4), [[2, 3]], [0, 1]) == {0, 1}  # without strict the reserved stay


def test_a_grant_holding_a_now_reserved_cpu_keeps_it_and_is_reported() -> None:
    """A reservation changed under a live grant: the node keeps working, the clash is named."""
    assert shared_pool(range(4), [[0, 1]], [0]) == {2, 3}
    assert reserved_conflicts({"old": {0, 1}, "other": {3}}, [0]) == {"old": frozenset({0})}


@given(
    online=st.frozensets(st.integers(0, 63), min_size=1),
    grants=st.lists(st.frozensets(st.integers(0, 63)), max_size=5),
    reserved_pick=st.integers(0, 63),
)
def test_shared_pool_properties(online, grants, reserved_pick) -> None:
    reserved = {min(online, key=lambda c: abs(c - reserved_pick))}
    grants = [g - reserved for g in grants]
    pool = shared_pool(online, grants, reserved)
    granted = set().union(*grants) if grants else set()
    assert pool <= online  # never offline CPUs
    assert reserved <= pool  # reserved always shared
    assert not (pool & granted)  # never an exclusive CPU
    assert pool | (granted & online) == online  # every online CPU is somewhere


@pytest.mark.parametrize(
    "current, pool, expected_keys",
    [
        ({"a": {0, 1}, "b": {0, 1, 2, 3}}, {0, 1}, ["b"]),
        ({"a": {0, 1}, "b": {0, 1}}, {0, 1}, []),
        ({"b": {0}, "a": {5}}, {0, 1}, ["b", "a"]),
        ({}, {0}, []),
    ],
    ids=["one-shrinks", "all-current", "keeps-order-and-grows", "no-shared-containers"],
)
def test_plan_shared_updates(current, pool, expected_keys) -> None:
    plan = plan_shared_updates(current, pool)
    assert [u.key for u in plan] == expected_keys
    for u in plan:
        assert u.current == frozenset(current[u.key]) and u.target == frozenset(pool)
        assert u.grows == bool(u.target - u.current)
        assert u.shrinks == bool(u.current - u.target)


# ---- resize_shared -------------------------------------------------------------------
def ref_for(tree: FakeCgroupTree, rel: str) -> CgroupRef:
    return CgroupRef(tree.version, rel, str(tree.hierarchy / rel.strip("/")))


@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2"])
def test_resize_shared(cgroup_root: Path, kernel_factory, version: int) -> None:
    tree = FakeCgroupTree(cgroup_root, version)
    if version == 2:
        write(cgroup_root / "cgroup.subtree_control", "cpuset\n")
    tree.mkcg("/runc", "0-7", "0-1", subtree="cpuset")
    tree.mkcg("/runc/shrinks", "0-7", "0-1")
    tree.mkcg("/runc/grows", "0-1", "0-1")
    tree.mkcg("/runc/same", "0-1,4-7", "0-1")
    before = snapshot(cgroup_root)
    kernel = kernel_factory(tree)
    refs = [ref_for(tree, f"/runc/{n}") for n in ("shrinks", "grows", "same", "died")]
    undo = UndoLog()
    result = resize_shared(refs, {0, 1, 4, 5, 6, 7}, cgroup_root, undo)
    assert [r.rel_path for r in result.updated] == ["/runc/shrinks", "/runc/grows"]
    assert [r.rel_path for r in result.unchanged] == ["/runc/same"]
    assert [r.rel_path for r in result.missing] == ["/runc/died"]
    for name in ("shrinks", "grows", "same"):
        assert (tree.hierarchy / "runc" / name / "cpuset.cpus").read_text().strip() == "0-1,4-7"
    assert all(p.endswith("cpuset.cpus") for p, _ in kernel.writes)
    assert len(undo) == 2
    assert undo.rollback() == ()
    assert snapshot(cgroup_root) == before


def test_resize_shared_v2_enables_cpuset_first(v2_tree: FakeCgroupTree, cgroup_root: Path,
                                               kernel_factory) -> None:
    v2_tree.mkcg("/system.slice/x.scope", "0-7", "0-1")
    kernel = kernel_factory(v2_tree)
    undo = UndoLog()
    resize_shared([ref_for(v2_tree, "/system.slice/x.scope")], {2, 3}, cgroup_root, undo)
    written = [p.rsplit("/", 1)[-1] for p, _ in kernel.writes]
    assert written == ["cgroup.subtree_control", "cgroup.subtree_control", "cpuset.cpus"]
    assert len(undo) == 3


def test_resize_shared_failure_rolls_back_earlier_writes(v1_tree: FakeCgroupTree,
                                                         cgroup_root: Path,
                                                         kernel_factory) -> None:
    v1_tree.mkcg("/a", "0-7", "0-1")
    v1_tree.mkcg("/b", "0-7", "0-1")
    before = snapshot(cgroup_root)
    kernel = kernel_factory(v1_tree)
    kernel.fail[str(v1_tree.hierarchy / "b" / "cpuset.cpus")] = "Device or resource busy"
    undo = UndoLog()
    with pytest.raises(EnforcementError, match=r"cpus 0-3 failed: .*/b/cpuset.cpus.*busy"):
        resize_shared([ref_for(v1_tree, "/a"), ref_for(v1_tree, "/b")], {0, 1, 2, 3},
                      cgroup_root, undo)
    assert snapshot(cgroup_root) == before
    assert len(undo) == 0


def test_resize_shared_cgroup_vanishing_during_write_is_skipped(
        v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    leaf = v1_tree.mkcg("/dying", "0-7", "0-1")
    kernel = kernel_factory(v1_tree)
    real_call = kernel.__call__

    def write_then_die(path: str, text: str) -> None:
        for f in leaf.iterdir():
            f.unlink()
        leaf.rmdir()
        real_call(path, text)

    monkeypatch.setattr(cgroups, "write_cgroup_file", write_then_die)
    result = resize_shared([ref_for(v1_tree, "/dying")], {0}, cgroup_root, UndoLog())
    assert [r.rel_path for r in result.missing] == ["/dying"]
    assert result.updated == ()


def test_resize_shared_refuses_escape_and_empty_pool(v1_tree: FakeCgroupTree,
                                                     cgroup_root: Path, tmp_path: Path) -> None:
    outside = CgroupRef(1, "/x", str(tmp_path))
    with pytest.raises(CgroupEscapeError):
        resize_shared([outside], {0}, cgroup_root, UndoLog())
    with pytest.raises(AllocationError):
        resize_shared([], set(), cgroup_root, UndoLog())

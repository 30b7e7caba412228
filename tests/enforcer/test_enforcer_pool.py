"""Shared pool arithmetic (pure) and resizing shared container cgroups (fake trees)."""

from __future__ import annotations

from pathlib import Path

import pytest
from enforcer_fakes import FakeCgroupTree, snapshot, write
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.base import cpuset as cpulist
from numa_pin.enforcer import cgroups
from numa_pin.enforcer import nested as nested_module
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.nested import MAX_NESTED_DEPTH, leaf_dirs
from numa_pin.enforcer.pool import reserved_conflicts, resize_shared, shared_pool
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import AllocationError, CgroupEscapeError


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
    assert len(kernel.writes) == 2  # the two that change, nothing else
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


def test_resize_shared_one_refusal_leaves_that_container_and_resizes_the_others(
        v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory) -> None:
    """One tenant's cgroup the kernel refuses is left as it was and reported; it blocks nobody."""
    v1_tree.mkcg("/a", "0-7", "0-1")
    v1_tree.mkcg("/b", "0-7", "0-1")
    v1_tree.mkcg("/c", "0-7", "0-1")
    kernel = kernel_factory(v1_tree)
    kernel.fail[str(v1_tree.hierarchy / "b" / "cpuset.cpus")] = "Device or resource busy"
    undo = UndoLog()
    result = resize_shared([ref_for(v1_tree, n) for n in ("/a", "/b", "/c")], {0, 1, 2, 3}, cgroup_root, undo)
    assert [r.rel_path for r in result.updated] == ["/a", "/c"]
    [stuck] = result.blocked
    assert stuck.ref.rel_path == "/b" and stuck.cpus == set(range(8)) and stuck.target == {0, 1, 2, 3}
    assert "busy" in str(stuck) and "/b" in str(stuck)
    assert {n: cpus(v1_tree, n) for n in ("a", "b", "c")} == {"a": "0-3", "b": "0-7", "c": "0-3"}
    assert undo.rollback() == ()
    assert {n: cpus(v1_tree, n) for n in ("a", "b", "c")} == {"a": "0-7", "b": "0-7", "c": "0-7"}


def cpus(tree: FakeCgroupTree, rel: str) -> str:
    return (tree.hierarchy / rel.strip("/") / "cpuset.cpus").read_text().strip()


# (nested cgroups below the shared container /s as {relative path: cpus}, the pool, what each gets)
NESTED = [
    ({"docker": "0-7"}, "0-3", {"": "0-3", "docker": "0-3"}),
    ({"docker": "0-7", "docker/inner": "0-7", "docker/inner/deeper": "0-7"}, "0-3",
     {"": "0-3", "docker": "0-3", "docker/inner": "0-3", "docker/inner/deeper": "0-3"}),
    ({"pinned": "2-5"}, "0-3", {"": "0-3", "pinned": "2-3"}),
    ({"pinned": "6-7"}, "0-3", {"": "0-3", "pinned": "0-3"}),
    ({"unset": ""}, "0-3", {"": "0-3", "unset": ""}),
    ({"a": "0-7", "b": "4-5"}, "0-5", {"": "0-5", "a": "0-5", "b": "4-5"}),
    ({"sub": "0-7"}, "0-3,8-9", {"": "0-3,8-9", "sub": "0-3,8-9"}),
]


@pytest.mark.parametrize("nested, pool, expected", NESTED,
                         ids=["child-copy", "three-deep", "pinned-part-kept", "pinned-none-left-follows",
                              "never-set-up", "siblings", "grows-and-shrinks"])
def test_resize_shared_v1_resizes_nested_cgroups_deepest_first(
        v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory, nested, pool, expected) -> None:
    """A shared container with its own cpuset cgroups (a nested runtime): the kernel (the fake
    refuses a parent below a child's CPUs, EBUSY, as v1 does) accepts every write, and the undo
    restores each file in the reverse order."""
    v1_tree.mkcg("/", "0-9", "0")
    v1_tree.mkcg("/s", "0-7", "0")
    for rel, value in nested.items():
        v1_tree.mkcg(f"/s/{rel}", value or None, "0")
    before = snapshot(cgroup_root)
    kernel_factory(v1_tree)
    undo = UndoLog()
    result = resize_shared([ref_for(v1_tree, "/s")], cpulist.parse_list(pool), cgroup_root, undo)
    assert result.blocked == () and [r.rel_path for r in result.updated] == ["/s"]
    assert {rel: cpus(v1_tree, f"/s/{rel}") for rel in expected} == expected
    assert undo.rollback() == ()
    assert snapshot(cgroup_root) == before


def test_resize_shared_v1_nested_refusal_rolls_that_container_back(
        v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory) -> None:
    v1_tree.mkcg("/s", "0-7", "0")
    v1_tree.mkcg("/s/inner", "0-7", "0")
    v1_tree.mkcg("/s/inner/stuck", "0-7", "0")
    v1_tree.mkcg("/t", "0-7", "0")
    before_s = {n: cpus(v1_tree, n) for n in ("s", "s/inner", "s/inner/stuck")}
    kernel = kernel_factory(v1_tree)
    kernel.fail[str(v1_tree.hierarchy / "s" / "inner" / "cpuset.cpus")] = "Device or resource busy"
    result = resize_shared([ref_for(v1_tree, "/s"), ref_for(v1_tree, "/t")], {0, 1}, cgroup_root, UndoLog())
    assert [b.ref.rel_path for b in result.blocked] == ["/s"] and "inner/cpuset.cpus" in result.blocked[0].reason
    assert {n: cpus(v1_tree, n) for n in before_s} == before_s
    assert cpus(v1_tree, "t") == "0-1"


def test_resize_shared_v1_bounds_the_nested_walk(v1_tree: FakeCgroupTree, cgroup_root: Path,
                                                 kernel_factory) -> None:
    deep = "/s" + "".join(f"/n{i}" for i in range(MAX_NESTED_DEPTH + 1))
    v1_tree.mkcg(deep, "0-7", "0")
    for i in range(len(deep.split("/")) - 1):
        v1_tree.mkcg("/".join(deep.split("/")[: i + 2]), "0-7", "0")
    kernel_factory(v1_tree)
    result = resize_shared([ref_for(v1_tree, "/s")], {0}, cgroup_root, UndoLog())
    assert [b.ref.rel_path for b in result.blocked] == ["/s"] and "deeper than" in result.blocked[0].reason
    assert cpus(v1_tree, "s") == "0-7"


@pytest.mark.parametrize("partition, reported", [("root", True), ("isolated", True), ("member", False),
                                                 ("root invalid (Parent is not a partition root)", False)],
                         ids=["root", "isolated", "member", "invalid-root"])
def test_resize_shared_v2_reports_a_nested_partition_that_keeps_cpus(
        v2_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory, partition: str, reported: bool) -> None:
    """v2 keeps a descendant's effective CPUs inside its parent, except a valid partition root's."""
    write(cgroup_root / "cgroup.subtree_control", "cpuset\n")
    v2_tree.mkcg("/s", "0-7", "0", subtree="cpuset")
    inner = v2_tree.mkcg("/s/inner", "6-7", "0")
    write(inner / "cpuset.cpus.partition", partition + "\n")
    kernel_factory(v2_tree)
    result = resize_shared([ref_for(v2_tree, "/s")], {0, 1, 2, 3}, cgroup_root, UndoLog())
    assert [r.rel_path for r in result.updated] == ["/s"]
    assert [(b.ref.rel_path, b.cpus) for b in result.blocked] == ([("/s", frozenset({6, 7}))] if reported else [])


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


# ---- resize_shared with the previous pool known (an admission, a release) ---------------
@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2"])
def test_resize_shared_from_a_known_pool_writes_without_reading(
        cgroup_root: Path, kernel_factory, monkeypatch: pytest.MonkeyPatch, version: int) -> None:
    """Moving the pool from what the ledger had (``previous``) reads no shared container's
    file: each is written its target, a drifted one put right with the rest, one whose own
    cpuset leaves its part unchanged is not touched, and the undo writes back each one's part of
    ``previous`` (the ledger the rollback returns to), not what drifted."""
    tree = FakeCgroupTree(cgroup_root, version)
    if version == 2:
        write(cgroup_root / "cgroup.subtree_control", "cpuset\n")
    tree.mkcg("/runc", "0-7", "0-1", subtree="cpuset")
    tree.mkcg("/runc/plain", "0-7", "0-1")
    tree.mkcg("/runc/drifted", "0-2,6", "0-1")
    tree.mkcg("/runc/limited", "0-3", "0-1")
    tree.mkcg("/runc/shrinks-in-limit", "4-7", "0-1")
    kernel = kernel_factory(tree)
    refs = {n: ref_for(tree, f"/runc/{n}") for n in ("plain", "drifted", "limited", "shrinks-in-limit", "died")}
    limits = {refs["limited"]: frozenset({0, 1, 2, 3}), refs["shrinks-in-limit"]: frozenset({4, 5, 6, 7})}
    reads: list[str] = []
    real_read = cgroups.read_cgroup_file

    def counting_read(path: str) -> str:
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr(cgroups, "read_cgroup_file", counting_read)
    undo = UndoLog()
    result = resize_shared(refs.values(), {0, 1, 2, 3, 4, 5}, cgroup_root, undo, limits, previous=range(8))
    assert not [p for p in reads if p.endswith("cpuset.cpus")]
    assert [r.rel_path for r in result.updated] == ["/runc/plain", "/runc/drifted", "/runc/shrinks-in-limit"]
    assert [r.rel_path for r in result.unchanged] == ["/runc/limited"]
    assert [r.rel_path for r in result.missing] == ["/runc/died"]
    assert {n: cpus(tree, f"/runc/{n}") for n in ("plain", "drifted", "limited", "shrinks-in-limit")} == {
        "plain": "0-5", "drifted": "0-5", "limited": "0-3", "shrinks-in-limit": "4-5"}
    assert str(tree.hierarchy / "runc" / "limited" / "cpuset.cpus") not in {p for p, _ in kernel.writes}
    assert undo.rollback() == ()
    assert {n: cpus(tree, f"/runc/{n}") for n in ("plain", "drifted", "limited", "shrinks-in-limit")} == {
        "plain": "0-7", "drifted": "0-7", "limited": "0-3", "shrinks-in-limit": "4-7"}


def test_resize_shared_from_a_known_pool_still_resizes_nested_cgroups(
        v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory) -> None:
    """A shared container with cpuset cgroups below it is read and resized with them (v1 refuses
    a parent below its children), though the pool it comes from is known."""
    v1_tree.mkcg("/s", "0-7", "0-1")
    v1_tree.mkcg("/s/docker", "0-7", "0-1")
    kernel_factory(v1_tree)
    undo = UndoLog()
    result = resize_shared([ref_for(v1_tree, "/s")], {0, 1, 2, 3}, cgroup_root, undo, previous=range(8))
    assert [r.rel_path for r in result.updated] == ["/s"] and not result.blocked
    assert (cpus(v1_tree, "/s"), cpus(v1_tree, "/s/docker")) == ("0-3", "0-3")
    assert undo.rollback() == ()
    assert (cpus(v1_tree, "/s"), cpus(v1_tree, "/s/docker")) == ("0-7", "0-7")


def test_resize_shared_rollback_tries_every_container_and_names_the_ones_it_could_not_restore(
        v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory) -> None:
    """The one-write containers share one undo step: a restore the kernel refuses does not stop
    the others, and the failure counts and names what stayed."""
    names = [f"/c{i}" for i in range(6)]
    for name in names:
        v1_tree.mkcg(name, "0-7", "0-1")
    kernel = kernel_factory(v1_tree)
    undo = UndoLog()
    result = resize_shared([ref_for(v1_tree, n) for n in names], {0, 1, 2, 3}, cgroup_root, undo, previous=range(8))
    assert len(result.updated) == len(names)
    stuck = [str(v1_tree.hierarchy / n.strip("/") / "cpuset.cpus") for n in ("/c2", "/c4")]
    for path in stuck:
        kernel.fail[path] = "Device or resource busy"
    [failure] = undo.rollback()
    assert "2 of 6 could not be put back" in failure.error and stuck[1] in failure.error
    assert {n: cpus(v1_tree, n) for n in names} == {
        n: "0-3" if n in ("/c2", "/c4") else "0-7" for n in names}


def test_resize_shared_trusts_recent_leaves_only_to_shrink_and_takes_the_nested_path_when_v1_refuses(
        v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """``leaves`` (what the agent's spare saw as it rehearsed) spares a shrinking container its
    ``stat``; a cgroup made below one since makes v1 refuse the write (the fake kernel keeps a
    parent above its children), and that container is resized with it; growing, each is looked at."""
    for name in ("a", "b", "c"):
        v1_tree.mkcg(f"/{name}", "0-7", "0")
    refs = [ref_for(v1_tree, f"/{n}") for n in ("a", "b", "c")]
    leaves = leaf_dirs(refs)
    assert leaves == {r.cpuset_dir for r in refs}
    v1_tree.mkcg("/b/docker", "0-7", "0")  # a nested runtime started since
    kernel_factory(v1_tree)
    looked: list[str] = []
    real_stat = nested_module.os.stat
    monkeypatch.setattr(nested_module.os, "stat", lambda p, **kw: looked.append(str(p)) or real_stat(p, **kw))
    undo = UndoLog()
    result = resize_shared(refs, {0, 1, 2, 3}, cgroup_root, undo, previous=range(8), leaves=leaves)
    assert [r.rel_path for r in result.updated] == ["/a", "/b", "/c"] and not result.blocked
    assert {n: cpus(v1_tree, n) for n in ("/a", "/b", "/b/docker", "/c")} == dict.fromkeys(
        ("/a", "/b", "/b/docker", "/c"), "0-3")
    assert refs[0].cpuset_dir not in looked and refs[2].cpuset_dir not in looked
    looked.clear()
    resize_shared(refs, range(8), cgroup_root, undo, previous={0, 1, 2, 3}, leaves=leaves)  # growing
    assert {r.cpuset_dir for r in refs} <= set(looked)
    assert {n: cpus(v1_tree, n) for n in ("/a", "/b", "/b/docker", "/c")} == dict.fromkeys(
        ("/a", "/b", "/b/docker", "/c"), "0-7")

"""apply_cpuset / read_cpuset against fake v1 and v2 trees and a fake kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from enforcer_fakes import FakeCgroupTree, snapshot, write

from numa_pin.base import cpuset as cpulist
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.cpuset import apply_cpuset, ensure_cpuset_controller, read_cpuset
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import CgroupEscapeError, EnforcementError


def ref_for(tree: FakeCgroupTree, rel: str) -> CgroupRef:
    return CgroupRef(tree.version, rel, str(tree.hierarchy / rel.strip("/")))


def names(writes: list[tuple[str, str]], base: Path) -> list[str]:
    return [os.path.relpath(p, base) for p, _ in writes]


# ---- write order and skipping ---------------------------------------------------------
@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2"])
def test_mems_written_before_cpus(cgroup_root: Path, kernel_factory, version: int) -> None:
    tree = FakeCgroupTree(cgroup_root, version)
    tree.mkcg("/runc", "0-7", "0-1", subtree="cpuset")
    tree.mkcg("/runc/abc")
    kernel = kernel_factory(tree)
    apply_cpuset(ref_for(tree, "/runc/abc"), {2, 3}, {1}, cgroup_root, UndoLog())
    cpuset_writes = [n for n in names(kernel.writes, tree.hierarchy / "runc" / "abc")
                     if n.startswith("cpuset.")]
    assert cpuset_writes == ["cpuset.mems", "cpuset.cpus"]
    assert kernel.writes[-2][1] == "1" and kernel.writes[-1][1] == "2-3"


@pytest.mark.parametrize(
    "version, initial_cpus, initial_mems, cpus, mems, expected_files",
    [
        (1, "", "", {0, 1, 2, 5}, {0}, ["cpuset.mems", "cpuset.cpus"]),
        (1, "0-2,5", "0", {0, 1, 2, 5}, {0}, []),
        (1, "0-3", "0", {4}, {0}, ["cpuset.cpus"]),
        (1, "4", "0", {4}, {0, 1}, ["cpuset.mems"]),
        (2, "", "", {6, 7}, {1}, ["cpuset.mems", "cpuset.cpus"]),
        (2, "6-7", "1", {6, 7}, {1}, []),
        (2, "6-7", "1", {6, 7}, {0, 1}, ["cpuset.mems"]),
    ],
    ids=["v1-fresh", "v1-unchanged", "v1-cpus-only", "v1-mems-only", "v2-fresh",
         "v2-unchanged", "v2-mems-only"],
)
def test_skips_writes_that_change_nothing(cgroup_root: Path, kernel_factory, version: int,
                                         initial_cpus: str, initial_mems: str, cpus: set[int],
                                         mems: set[int], expected_files: list[str]) -> None:
    tree = FakeCgroupTree(cgroup_root, version)
    if version == 2:
        write(cgroup_root / "cgroup.subtree_control", "memory cpuset\n")
    tree.mkcg("/k", "0-7", "0-1", subtree="cpuset")
    leaf = tree.mkcg("/k/c", initial_cpus or None, initial_mems or None)
    kernel = kernel_factory(tree)
    undo = UndoLog()
    state = apply_cpuset(ref_for(tree, "/k/c"), cpus, mems, cgroup_root, undo)
    assert names(kernel.writes, leaf) == expected_files
    assert len(undo) == len(expected_files)
    assert (state.cpus, state.mems) == (frozenset(cpus), frozenset(mems))
    assert (state.effective_cpus, state.effective_mems) == (frozenset(cpus), frozenset(mems))


@pytest.mark.parametrize(
    "version, initial_mems, effective_mems",
    [(2, "", "0-1"), (2, "1", "1"), (1, "0", "0")],
    ids=["v2-inherited", "v2-own", "v1-own"],
)
def test_mems_none_moves_only_the_cpus(cgroup_root: Path, kernel_factory, version: int,
                                       initial_mems: str, effective_mems: str) -> None:
    """A shared container: its memory nodes, even an empty (inherited) v2 ``cpuset.mems``, stay."""
    tree = FakeCgroupTree(cgroup_root, version)
    tree.mkcg("/k", "0-7", "0-1", subtree="cpuset")
    leaf = tree.mkcg("/k/c", None, initial_mems or None)
    kernel = kernel_factory(tree)
    undo = UndoLog()
    state = apply_cpuset(ref_for(tree, "/k/c"), {2, 3}, None, cgroup_root, undo)
    assert [n for n in names(kernel.writes, leaf) if n.startswith("cpuset.")] == ["cpuset.cpus"]
    assert state.mems == cpulist.parse_list(initial_mems)
    assert state.effective_mems == cpulist.parse_list(effective_mems)
    assert state.effective_cpus == {2, 3}
    undo.rollback()
    assert (leaf / "cpuset.mems").read_text().strip() == initial_mems


def test_mems_none_still_refuses_empty_cpus(v2_tree: FakeCgroupTree, cgroup_root: Path) -> None:
    v2_tree.mkcg("/k/c")
    with pytest.raises(EnforcementError, match="refusing an empty cpuset"):
        apply_cpuset(ref_for(v2_tree, "/k/c"), set(), None, cgroup_root, UndoLog())


# ---- v2 subtree_control --------------------------------------------------------------
def test_v2_enables_cpuset_in_every_ancestor(v2_tree: FakeCgroupTree, cgroup_root: Path,
                                             kernel_factory) -> None:
    v2_tree.mkcg("/kubepods.slice", subtree="memory")
    v2_tree.mkcg("/kubepods.slice/pod1.slice", subtree="cpuset memory")
    v2_tree.mkcg("/kubepods.slice/pod1.slice/cri-abc.scope")
    before = snapshot(cgroup_root)
    kernel = kernel_factory(v2_tree)
    undo = UndoLog()
    apply_cpuset(ref_for(v2_tree, "/kubepods.slice/pod1.slice/cri-abc.scope"), {1}, {0},
                 cgroup_root, undo)
    subtree_writes = [(os.path.relpath(p, cgroup_root), t) for p, t in kernel.writes
                      if p.endswith("cgroup.subtree_control")]
    # root lacked cpuset, kubepods.slice lacked it, pod1.slice already had it
    assert subtree_writes == [("cgroup.subtree_control", "+cpuset"),
                              ("kubepods.slice/cgroup.subtree_control", "+cpuset")]
    # ancestors are enabled before the leaf's cpuset files are written
    first_cpuset = next(i for i, (p, _) in enumerate(kernel.writes) if "cpuset.mems" in p)
    assert all(i < first_cpuset for i, (p, _) in enumerate(kernel.writes)
               if p.endswith("subtree_control"))
    assert "cpuset" in (cgroup_root / "cgroup.subtree_control").read_text().split()
    assert len(undo) == 4  # two subtree_control writes + mems + cpus
    assert undo.rollback() == ()
    assert snapshot(cgroup_root) == before


def test_v2_leaf_subtree_control_untouched(v2_tree: FakeCgroupTree, cgroup_root: Path,
                                           kernel_factory) -> None:
    v2_tree.mkcg("/a", subtree="cpuset")
    v2_tree.mkcg("/a/b")
    write(cgroup_root / "cgroup.subtree_control", "cpuset\n")
    kernel = kernel_factory(v2_tree)
    apply_cpuset(ref_for(v2_tree, "/a/b"), {0}, {0}, cgroup_root, UndoLog())
    assert not [p for p, _ in kernel.writes if p.endswith("subtree_control")]


def test_ensure_cpuset_controller_is_noop_on_v1(v1_tree: FakeCgroupTree, kernel_factory) -> None:
    v1_tree.mkcg("/a/b")
    kernel = kernel_factory(v1_tree)
    undo = UndoLog()
    assert ensure_cpuset_controller(ref_for(v1_tree, "/a/b"), undo) == ()
    assert kernel.writes == [] and len(undo) == 0


def test_v2_subtree_control_refused_rolls_back(v2_tree: FakeCgroupTree, cgroup_root: Path,
                                               kernel_factory) -> None:
    v2_tree.mkcg("/busy/leaf")
    before = snapshot(cgroup_root)
    kernel = kernel_factory(v2_tree)
    kernel.fail[str(cgroup_root / "busy" / "cgroup.subtree_control")] = "Device or resource busy"
    undo = UndoLog()
    with pytest.raises(EnforcementError, match="busy/cgroup.subtree_control.*busy") as err:
        apply_cpuset(ref_for(v2_tree, "/busy/leaf"), {0}, {0}, cgroup_root, undo)
    assert err.value.path == str(cgroup_root / "busy" / "leaf")
    assert "rollback complete" in str(err.value)
    assert snapshot(cgroup_root) == before  # the root's +cpuset was taken back
    assert len(undo) == 0


# ---- readback and parent restrictions -------------------------------------------------
def test_v2_readback_mismatch_rolls_back(v2_tree: FakeCgroupTree, cgroup_root: Path,
                                         kernel_factory) -> None:
    write(cgroup_root / "cgroup.subtree_control", "cpuset\n")
    v2_tree.mkcg("/kubepods.slice", "0-3", "0", subtree="cpuset")
    v2_tree.mkcg("/kubepods.slice/c.scope", "0-1", "0")
    before = snapshot(cgroup_root)
    kernel_factory(v2_tree)
    undo = UndoLog()
    undo.record("earlier step of the same admission", lambda: None)
    with pytest.raises(EnforcementError) as err:
        apply_cpuset(ref_for(v2_tree, "/kubepods.slice/c.scope"), {2, 3, 4, 5}, {0},
                     cgroup_root, undo)
    msg = str(err.value)
    assert err.value.path == str(cgroup_root / "kubepods.slice" / "c.scope")
    assert "asked for cpus 2-5" in msg and "effective as cpus 2-3" in msg
    assert f"parent cgroup {cgroup_root / 'kubepods.slice'} only has cpus 0-3" in msg
    assert "rollback complete" in msg
    assert snapshot(cgroup_root) == before
    assert undo.descriptions() == ["earlier step of the same admission"]


def test_v1_cpus_outside_parent_explained(v1_tree: FakeCgroupTree, cgroup_root: Path,
                                          kernel_factory) -> None:
    v1_tree.mkcg("/machine.slice", "0-3", "0-1")
    v1_tree.mkcg("/machine.slice/libpod-x.scope")
    before = snapshot(cgroup_root)
    kernel_factory(v1_tree)
    with pytest.raises(EnforcementError) as err:
        apply_cpuset(ref_for(v1_tree, "/machine.slice/libpod-x.scope"), {3, 4, 5}, {1},
                     cgroup_root, UndoLog())
    msg = str(err.value)
    assert "CPUs 4-5 are not in the parent cgroup" in msg
    assert str(cgroup_root / "cpuset" / "machine.slice") in msg
    assert "subset of its parent" in msg
    assert "Permission denied" in msg
    assert snapshot(cgroup_root) == before  # cpuset.mems (written first) was restored


def test_v1_mems_outside_parent_explained(v1_tree: FakeCgroupTree, cgroup_root: Path,
                                          kernel_factory) -> None:
    v1_tree.mkcg("/p", "0-7", "0")
    v1_tree.mkcg("/p/c")
    kernel_factory(v1_tree)
    with pytest.raises(EnforcementError, match="memory nodes 1 are not in the parent"):
        apply_cpuset(ref_for(v1_tree, "/p/c"), {0}, {1}, cgroup_root, UndoLog())


def test_v1_without_effective_files_reads_configured(v1_tree: FakeCgroupTree,
                                                     cgroup_root: Path, kernel_factory) -> None:
    leaf = v1_tree.mkcg("/old")
    for name in ("cpuset.effective_cpus", "cpuset.effective_mems"):
        (leaf / name).unlink()
    kernel_factory(v1_tree)
    state = apply_cpuset(ref_for(v1_tree, "/old"), {1, 2}, {0}, cgroup_root, UndoLog())
    assert state.effective_cpus == {1, 2} and state.effective_mems == {0}


# ---- undo ----------------------------------------------------------------------------
@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2"])
def test_undo_restores_everything(cgroup_root: Path, kernel_factory, version: int) -> None:
    tree = FakeCgroupTree(cgroup_root, version)
    tree.mkcg("/system.slice", "0-7", "0-1")
    tree.mkcg("/system.slice/a.scope", "0-7", "0-1")
    tree.mkcg("/system.slice/b.scope", "0-7", "0-1")
    before = snapshot(cgroup_root)
    kernel_factory(tree)
    undo = UndoLog()
    apply_cpuset(ref_for(tree, "/system.slice/a.scope"), {0, 1}, {0}, cgroup_root, undo)
    apply_cpuset(ref_for(tree, "/system.slice/b.scope"), {4, 5}, {1}, cgroup_root, undo)
    assert snapshot(cgroup_root) != before
    descriptions = undo.descriptions()
    assert any("a.scope/cpuset.cpus" in d for d in descriptions)
    assert any("b.scope/cpuset.mems" in d for d in descriptions)
    assert undo.rollback() == ()
    assert snapshot(cgroup_root) == before
    assert len(undo) == 0


def test_undo_failure_reported_by_rollback(v1_tree: FakeCgroupTree, cgroup_root: Path,
                                           kernel_factory) -> None:
    v1_tree.mkcg("/a", "0-7", "0-1")
    kernel = kernel_factory(v1_tree)
    undo = UndoLog()
    apply_cpuset(ref_for(v1_tree, "/a"), {1}, {1}, cgroup_root, undo)
    kernel.fail[str(v1_tree.hierarchy / "a" / "cpuset.cpus")] = "No space left on device"
    failures = undo.rollback()
    assert len(failures) == 1 and "No space left on device" in failures[0].error
    assert (v1_tree.hierarchy / "a" / "cpuset.mems").read_text().strip() == "0-1"


def test_undo_of_an_inherited_v2_cpuset_on_a_populated_cgroup(v2_tree: FakeCgroupTree, cgroup_root: Path,
                                                              kernel_factory) -> None:
    """A v2 cgroup with no cpuset of its own inherits its parent's; once it has tasks the kernel
    refuses the empty value back (ENOSPC, seen on Linux 6.1 and 6.18), so the undo writes what
    it inherited instead, and the effective CPUs and nodes are what they were."""
    write(cgroup_root / "cgroup.subtree_control", "cpuset\n")
    v2_tree.mkcg("/numa-pin", subtree="cpuset")
    job = v2_tree.mkcg("/numa-pin/job")
    kernel = kernel_factory(v2_tree)
    kernel.populated.add(str(job))
    effective = {n: (job / n).read_text() for n in ("cpuset.cpus.effective", "cpuset.mems.effective")}
    undo = UndoLog()
    apply_cpuset(ref_for(v2_tree, "/numa-pin/job"), {1, 2}, {0}, cgroup_root, undo)
    assert (job / "cpuset.cpus.effective").read_text().strip() == "1-2"
    assert undo.rollback() == ()
    assert {n: (job / n).read_text() for n in effective} == effective
    assert (job / "cpuset.cpus").read_text() == effective["cpuset.cpus.effective"]


# ---- refusals ------------------------------------------------------------------------
def test_refuses_ref_outside_cgroup_root(tmp_path: Path, cgroup_root: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ref = CgroupRef(2, "/x", str(elsewhere))
    with pytest.raises(CgroupEscapeError):
        apply_cpuset(ref, {0}, {0}, cgroup_root, UndoLog())


@pytest.mark.parametrize("cpus, mems", [(set(), {0}), ({0}, set())], ids=["no-cpus", "no-mems"])
def test_refuses_empty_sets(v1_tree: FakeCgroupTree, cgroup_root: Path, kernel_factory,
                            cpus: set[int], mems: set[int]) -> None:
    v1_tree.mkcg("/a")
    kernel = kernel_factory(v1_tree)
    with pytest.raises(EnforcementError, match="empty cpuset"):
        apply_cpuset(ref_for(v1_tree, "/a"), cpus, mems, cgroup_root, UndoLog())
    assert kernel.writes == []


def test_missing_cgroup_dir(v2_tree: FakeCgroupTree, cgroup_root: Path) -> None:
    with pytest.raises(EnforcementError, match="does not exist") as err:
        apply_cpuset(ref_for(v2_tree, "/gone.scope"), {0}, {0}, cgroup_root, UndoLog())
    assert err.value.path == str(cgroup_root / "gone.scope")


def test_read_cpuset_garbage_names_file(v2_tree: FakeCgroupTree) -> None:
    leaf = v2_tree.mkcg("/g")
    write(leaf / "cpuset.cpus", "zero-three\n")
    with pytest.raises(EnforcementError, match="not a CPU/node list") as err:
        read_cpuset(ref_for(v2_tree, "/g"))
    assert err.value.path == str(leaf / "cpuset.cpus")


def test_apply_with_real_file_writer_on_plain_tree(v2_tree: FakeCgroupTree,
                                                   cgroup_root: Path) -> None:
    """No fake kernel: the effective file does not follow, so readback must catch it."""
    write(cgroup_root / "cgroup.subtree_control", "cpuset\n")
    leaf = v2_tree.mkcg("/plain")
    before = snapshot(cgroup_root)
    with pytest.raises(EnforcementError, match="effective as cpus 0-7"):
        apply_cpuset(ref_for(v2_tree, "/plain"), {1}, {0}, cgroup_root, UndoLog())
    assert snapshot(cgroup_root) == before
    assert (leaf / "cpuset.cpus").read_text() == "\n"

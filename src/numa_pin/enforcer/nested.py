"""The cpuset cgroups below a shared container, and the ``cpuset.cpus`` file access the shared
pool's resize (:mod:`numa_pin.enforcer.pool`) shares with them.

A nested runtime in a shared container (Docker-in-Docker, systemd, runc in the container) makes
cpuset cgroups of its own below the container's and copies its CPUs into them; cgroup v1 then
refuses to shrink the container's cgroup alone (EBUSY), so :func:`resize_tree_v1` resizes the
subtree with it, and on v2 a partition below (:func:`partition_holding`) can keep CPUs its
parent loses. :func:`plan_nested` is pure; the rest reads and writes cgroup files through
:mod:`numa_pin.enforcer.cgroups`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from numa_pin.base import cpuset as cpulist
from numa_pin.base.record import record
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.cpuset import CPUSET_CPUS
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError

#: how deep :func:`~numa_pin.enforcer.pool.resize_shared` looks below a shared container for the cpuset cgroups it made
#: itself (a nested runtime, Docker-in-Docker, systemd in the container)
MAX_NESTED_DEPTH = 8
#: how many such nested cgroups one shared container may have before it is left as it is
MAX_NESTED_CGROUPS = 256
#: cgroup v2 partition types that keep their CPUs out of their parent's hands
_PARTITIONS = ("root", "isolated")


@record
class Blocked:
    """A shared container :func:`~numa_pin.enforcer.pool.resize_shared` had to leave on CPUs outside its target."""

    ref: CgroupRef
    cpus: frozenset[int]  # what it still holds (its ``cpuset.cpus``, or a v2 partition's CPUs)
    target: frozenset[int]
    reason: str

    def __str__(self) -> str:
        return (f"shared container cgroup {self.ref.rel_path} left on CPUs {cpulist.format_list(self.cpus)} "
                f"(shared pool {cpulist.format_list(self.target)}): {self.reason}")


def plan_nested(
    tree: Mapping[str, frozenset[int]], parents: Mapping[str, str], top: str, target: frozenset[int]
) -> dict[str, frozenset[int]]:
    """The CPUs each cgroup of a v1 subtree gets when its top goes to ``target`` (pure).

    ``tree`` maps every cgroup of the subtree (top first, parents before children) to its
    ``cpuset.cpus``; ``parents`` maps each other one to its parent. A cgroup that had all its
    parent's CPUs (runc copies them into a cgroup it creates) follows its parent; one pinned to
    a part of them keeps what of that part its parent keeps, or follows it when nothing would be
    left; one without CPUs (never set up, so it holds no task) stays without.
    """
    new = {top: target}
    for path, cpus in tree.items():
        if path == top:
            continue
        parent = parents[path]
        kept = cpus & new[parent]
        if not cpus:
            new[path] = cpus
        elif cpus == tree[parent] or not kept:
            new[path] = new[parent]
        else:
            new[path] = kept
    return new


def resize_tree_v1(ref: CgroupRef, target: frozenset[int], undo: UndoLog, before: str, text: str) -> None:
    """Resize ``ref`` to ``target`` with the cpuset cgroups below it (v1): every cgroup first
    grows to what it has and will have (parents first), then goes to its target (children
    first), so at each write a child stays inside its parent, as the kernel demands. Alone,
    ``ref`` is written ``text`` and its undo writes back ``before``; with cgroups below, every
    file is read first and its undo writes back what it held."""
    tree, parents = subtree(ref.cpuset_dir)
    if len(tree) == 1:
        write_list(ref.cpuset_dir, target, undo, "shared pool", before, text)
        return
    cpus = {path: read_list(os.path.join(path, CPUSET_CPUS)) for path in tree}  # the top's as it is
    new = plan_nested(cpus, parents, ref.cpuset_dir, target)
    now = dict(cpus)
    for path in tree:  # parents before children
        grown = now[path] | new[path]
        if grown != now[path]:
            write_list(path, grown, undo, "nested in a shared container, growing")
            now[path] = grown
    for path in reversed(tree):  # children before parents
        if new[path] != now[path]:
            why = "shared pool" if path == ref.cpuset_dir else "nested in a shared container"
            write_list(path, new[path], undo, why)


def subtree(top: str) -> tuple[list[str], dict[str, str]]:
    """The cgroup directories of ``top``'s subtree (``top`` first, parents before children) and
    each one's parent, at most :data:`MAX_NESTED_DEPTH` levels down.

    Raises EnforcementError when there are more than :data:`MAX_NESTED_CGROUPS` of them, or
    cgroups deeper than that (left as they are rather than resized in part)."""
    order = [top]
    parents: dict[str, str] = {}
    if no_subdirs(top):
        return order, parents
    level = [top]
    for depth in range(MAX_NESTED_DEPTH + 1):
        below: list[str] = []
        for directory in level:
            # a cgroup gone meanwhile has no children: its write fails as missing
            for child in cgroups.child_dirs(directory):
                if depth == MAX_NESTED_DEPTH:
                    raise EnforcementError(f"nested cpuset cgroups deeper than {MAX_NESTED_DEPTH} levels", path=child)
                parents[child] = directory
                below.append(child)
        order.extend(below)
        if len(order) > MAX_NESTED_CGROUPS + 1:
            raise EnforcementError(f"more than {MAX_NESTED_CGROUPS} nested cpuset cgroups", path=top)
        if not below:
            break
        level = below
    return order, parents


def leaf_dirs(refs: Iterable[CgroupRef]) -> frozenset[str]:
    """The ``cpuset_dir`` of each of ``refs`` that has no cgroup below it now (one ``stat`` each):
    :func:`~numa_pin.enforcer.pool.resize_shared`'s ``leaves``."""
    return frozenset(ref.cpuset_dir for ref in refs if no_subdirs(ref.cpuset_dir))


def no_subdirs(directory: str) -> bool:
    """True when ``directory`` has no sub-directory: a link count of 2, as cgroupfs and tmpfs keep it
    (one ``stat``, not a listing of a cgroup's files; 1 on btrfs or overlayfs: False)."""
    try:
        return os.stat(directory, follow_symlinks=False).st_nlink == 2
    except OSError:
        return False


def partition_holding(ref: CgroupRef, target: frozenset[int]) -> Blocked | None:
    """cgroup v2: a partition root below ``ref`` whose effective CPUs leave ``target`` (a nested
    tenant that made its CPUs its own); None when there is none (the kernel keeps every other
    descendant's ``cpuset.cpus.effective`` inside its parent's)."""
    if ref.version != 2:
        return None
    try:
        tree, _ = subtree(ref.cpuset_dir)
    except EnforcementError as exc:
        return Blocked(ref, frozenset(), target, str(exc))
    for path in tree[1:]:
        try:
            kind = cgroups.read_cgroup_file(os.path.join(path, "cpuset.cpus.partition")).split()
            if not kind or kind[0] not in _PARTITIONS or "invalid" in kind:
                continue  # a member, or a partition the kernel made invalid (it follows its parent)
            held = read_list(os.path.join(path, "cpuset.cpus.effective"))
        except EnforcementError:
            continue  # no partition file (no cpuset here, or an old kernel), or gone
        if held - target:
            return Blocked(ref, held, target, f"its nested cgroup {path} is a cpuset partition ({kind[0]}) on "
                                              f"CPUs {cpulist.format_list(held)}")
    return None


def cpus_file(directory: str) -> str:
    """``directory``'s ``cpuset.cpus`` (``os.path.join``'s result, at a busy node's pace)."""
    return f"{directory}{CPUSET_CPUS}" if directory.endswith("/") else f"{directory}/{CPUSET_CPUS}"


def read_list(path: str) -> frozenset[int]:
    return parse_cpus(cgroups.read_cgroup_file(path), path, None)


def parse_cpus(text: str, path: str, parsed: dict[str, frozenset[int]] | None) -> frozenset[int]:
    if parsed is not None and text in parsed:
        return parsed[text]
    try:
        cpus = cpulist.parse_list(text)
    except ValueError as exc:
        raise EnforcementError(f"not a CPU list: {exc}", path=path) from exc
    if parsed is not None:
        parsed[text] = cpus
    return cpus


def write_list(directory: str, cpus: frozenset[int], undo: UndoLog, why: str, before: str | None = None,
                text: str | None = None) -> None:
    """Write ``cpus`` (formatted: ``text``) to ``directory``'s ``cpuset.cpus``; ``undo`` puts back ``before``."""
    path = cpus_file(directory)
    if before is None:
        before = cgroups.read_cgroup_file(path)
    if text is None:
        text = cpulist.format_list(cpus)
    cgroups.write_cgroup_file(path, text)
    undo.record(f"{path}: {text!r} (was {before!r}, {why})", restorer(path, before))


def restorer_of_all(written: list[tuple[str, str]]) -> Callable[[], None]:
    """The undo of many one-file writes: each file's text written back, newest first; every one
    is tried, and the failures are raised together (the first few named, all counted)."""

    def restore() -> None:
        failed: list[EnforcementError] = []
        for path, before in reversed(written):
            try:
                cgroups.write_cgroup_file(path, before)
            except EnforcementError as exc:
                failed.append(exc)
        if failed:
            shown = "; ".join(str(e) for e in failed[:3])
            more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
            raise EnforcementError(f"{len(failed)} of {len(written)} could not be put back: {shown}{more}",
                                   path=failed[0].path)

    return restore


def restorer(path: str, before: str) -> Callable[[], None]:
    """The undo of a write to ``path``: ``before`` written back."""

    def restore() -> None:
        cgroups.write_cgroup_file(path, before)

    return restore


__all__ = [
    "MAX_NESTED_CGROUPS", "MAX_NESTED_DEPTH", "Blocked", "cpus_file", "leaf_dirs", "no_subdirs", "parse_cpus",
    "partition_holding", "plan_nested", "read_list", "resize_tree_v1", "restorer", "restorer_of_all", "subtree",
    "write_list",
]

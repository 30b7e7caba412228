"""The shared CPU pool: everything online that no exclusive grant holds.

This is kubelet's static CPU manager arithmetic. Containers without exclusive CPUs run
on the shared pool; when an exclusive grant is made the pool shrinks and every shared
container's ``cpuset.cpus`` must shrink with it, and when a grant is released they grow
back. :func:`shared_pool` and :func:`reserved_conflicts` are pure; :func:`resize_shared`
and :func:`check_shared` touch cgroup files.

Reserved CPUs (kubelet ``reservedSystemCPUs``) are never granted exclusively and stay in
the pool, so the pool is never empty while at least one CPU is reserved; with kubelet's
``strict-cpu-reservation`` they are kept out of the pool too (kubelet's default cpuset then
starts as every CPU minus the reserved ones), and a grant that would empty it is refused.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping

from numa_pin.base import cpuset as cpulist
from numa_pin.base.record import record
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.cpuset import ensure_cpuset_controller
from numa_pin.enforcer.nested import (
    Blocked,
    cpus_file,
    no_subdirs,
    parse_cpus,
    partition_holding,
    read_list,
    resize_tree_v1,
    restorer_of_all,
    subtree,
    write_list,
)
from numa_pin.enforcer.undo import UndoLog, describe_failures
from numa_pin.errors import AllocationError, EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from numa_pin.enforcer.systemd import Systemd

    #: one container's step: (ref, current CPUs, target, what its file held: the undo writes it
    #: back); plain tuples, not records keyed by cgroup: a busy node passes thousands of them
    _Step = tuple[CgroupRef, frozenset[int], frozenset[int], str]


def shared_pool(
    online_cpus: Iterable[int],
    exclusive_grants_cpus: Iterable[Iterable[int]],
    reserved_cpus: Iterable[int],
    *,
    strict: bool = False,
) -> frozenset[int]:
    """Online CPUs minus every exclusive grant, and minus the reserved CPUs when ``strict``
    (kubelet's ``strict-cpu-reservation``) (pure).

    ``exclusive_grants_cpus`` holds one CPU collection per exclusive grant. Reserved CPUs are
    never granted by a decision, so without ``strict`` they all stay in the pool. A grant made
    under an older config can still hold a CPU the config now reserves: that CPU stays with its
    grant until the grant ends (see :func:`reserved_conflicts`), it does not stop the node.
    Raises AllocationError when the pool would be empty (kubelet: "default cpuset cannot be
    empty" once containers hold CPUs).
    """
    online = frozenset(online_cpus)
    granted: set[int] = set()
    for grant in exclusive_grants_cpus:
        granted.update(grant)
    kept_out = granted | set(reserved_cpus) if strict else granted
    pool = online - kept_out
    if not pool:
        why = (
            "are granted exclusively or reserved (strict-cpu-reservation keeps the reserved CPUs "
            "out of the shared pool)" if strict else "are granted exclusively and none is reserved"
        )
        raise AllocationError(
            f"default cpuset cannot be empty: the shared CPU pool would be empty: all online CPUs "
            f"({cpulist.format_list(online) or 'none'}) {why}"
        )
    return frozenset(pool)


def reserved_conflicts(
    exclusive: Mapping[str, Iterable[int]], reserved_cpus: Iterable[int]
) -> dict[str, frozenset[int]]:
    """``{container id: reserved CPUs it holds}`` for grants that hold CPUs the config reserves
    (a grant made before the reservation changed). Pure."""
    reserved = frozenset(reserved_cpus)
    out = {cid: frozenset(cpus) & reserved for cid, cpus in exclusive.items()}
    return {cid: held for cid, held in sorted(out.items()) if held}


@record
class ResizeResult:
    """What :func:`resize_shared` did to each shared container cgroup."""

    updated: tuple[CgroupRef, ...]
    unchanged: tuple[CgroupRef, ...]
    missing: tuple[CgroupRef, ...]  # cgroup gone: the container has exited
    blocked: tuple[Blocked, ...] = ()  # left as they were (see resize_shared)


class _Batch:
    """One resize's bookkeeping, shared by its steps: what happened to each container (the
    lists of :class:`ResizeResult`), the parents made ready (v2: ``cpuset`` enabled above them;
    ``""`` stands for v1, which has no such step), the one-write files with what they held (one
    undo for all, :func:`_record_written`), and every cpuset's text formatted and encoded once."""

    def __init__(self, target: frozenset[int]) -> None:
        self.target = target
        self.updated: list[CgroupRef] = []
        self.unchanged: list[CgroupRef] = []
        self.missing: list[CgroupRef] = []
        self.blocked: list[Blocked] = []
        self.enabled = {""}
        self.written: list[tuple[str, str]] = []
        self.formatted: dict[frozenset[int], str] = {}
        self.encoded: dict[str, bytes] = {}

    def text(self, cpus: frozenset[int]) -> str:
        text = self.formatted.get(cpus)
        if text is None:
            text = self.formatted[cpus] = cpulist.format_list(cpus)
        return text

    def data(self, text: str) -> bytes:
        data = self.encoded.get(text)
        if data is None:
            data = self.encoded[text] = (text + "\n").encode("ascii")
        return data

    def lost(self, ref: CgroupRef, current: frozenset[int], want: frozenset[int], why: str) -> None:
        """A container that could not be read or written: gone (exited), or left as it was."""
        if os.path.isdir(ref.cpuset_dir):
            self.blocked.append(Blocked(ref, current, want, why))
        else:
            self.missing.append(ref)

    def result(self) -> ResizeResult:
        return ResizeResult(tuple(self.updated), tuple(self.unchanged), tuple(self.missing), tuple(self.blocked))


def resize_shared(
    refs: Iterable[CgroupRef],
    pool: Iterable[int],
    cgroup_root: str | os.PathLike[str],
    undo: UndoLog,
    limits: Mapping[CgroupRef, frozenset[int]] | None = None,
    systemd: Systemd | None = None,
    real_dirs: dict[str, str] | None = None,
    checked: bool = False,
    previous: Iterable[int] | None = None,
    leaves: Collection[str] | None = None,
    handles: Mapping[str, tuple[int, bool]] | None = None,
) -> ResizeResult:
    """Set ``cpuset.cpus`` of every shared container cgroup in ``refs`` to ``pool`` (inside the
    container's own cpuset where ``limits`` gives one): plan what each needs
    (:func:`_plan_from`, with ``previous``, or :func:`_plan_by_reading`), write it
    (:func:`_write_plan`, with ``leaves`` and ``handles``), and record its undo (one for the
    one-write containers, :func:`_record_written`; the others' own, :func:`_write_nested`).

    A cgroup whose directory no longer exists (before or during the write) is skipped
    as exited. On v2 ``cpuset`` is first enabled in the ancestors' subtree_control.

    One tenant never blocks another: a container's own cgroups are resized on their own. On v1
    the cpuset cgroups a container made below its own (a nested runtime copies its CPUs into
    them, and the kernel then refuses to shrink the parent: EBUSY) are resized with it, grown
    top-down and shrunk deepest first (see :func:`~numa_pin.enforcer.nested.plan_nested`), so ``undo`` restores them in
    the reverse order. Where the kernel still refuses (or on v2 a partition below the container
    keeps CPUs the pool no longer has), that container's writes are rolled back, it is left as
    it was and reported in :attr:`ResizeResult.blocked`; the others are resized. Every change
    is recorded in ``undo``. With ``systemd``, a cgroup a unit owns gets the unit's
    ``AllowedCPUs`` set to its target first (see :mod:`numa_pin.enforcer.systemd`).
    Raises CgroupEscapeError for a ref outside ``cgroup_root`` (``checked``: every ref was just
    made by :func:`cgroups.refs_from_paths`, which checked it, so it is not checked again) and
    AllocationError for an empty pool, or a container whose own cpuset holds no pool CPU.

    Cost per container: one path check against parents resolved once (``real_dirs``, a memo
    the caller may share with the making of ``refs``, see :func:`cgroups.realpath`; none with
    ``checked``), one read unless ``previous`` is given, one ``stat``, a write where it changes.
    """
    target = frozenset(pool)
    if not target:
        raise AllocationError("refusing to resize shared containers to an empty CPU pool")
    ref_list = list(refs)
    for ref in () if checked else ref_list:
        cgroups.check_under(cgroup_root, ref.cpuset_dir, real_dirs)
    batch = _Batch(target)
    was = None if previous is None else frozenset(previous)
    plan = _plan_by_reading(ref_list, limits, batch) if was is None else _plan_from(was, ref_list, limits, batch)
    empty = [ref.rel_path for ref, _, want, _ in plan if not want]
    if empty:
        raise AllocationError(
            f"shared containers {', '.join(empty)} would have no CPU: their own cpusets hold none of "
            f"the shared pool {cpulist.format_list(target)}"
        )
    try:
        _write_plan(plan, batch, undo, was, systemd, leaves, handles)
    finally:
        _record_written(undo, batch.written)
    return batch.result()


def _plan_from(was: frozenset[int], refs: list[CgroupRef], limits: Mapping[CgroupRef, frozenset[int]] | None,
               batch: _Batch) -> list[_Step]:
    """The plan step where the ledger knows the pool ``was`` the shared containers were on
    before this change (an admission or a release): their files are not read; each is to be
    written its target where that differs from its part of ``was``, and its undo writes that
    part back, so a rollback leaves every shared container as the ledger it goes back to says
    (one that drifted meanwhile is put right by the write). The steps of containers without a
    cpuset of their own hold ``was`` and the target themselves (:func:`_write_plan` compares them
    by identity)."""
    target = batch.target
    moved = was != target
    was_text = batch.formatted.setdefault(was, cpulist.format_list(was))
    plan: list[_Step] = []
    for ref in refs:
        limit = limits.get(ref) if limits else None
        if limit is None:  # from the same old pool to the same new one (a busy node's thousands)
            if moved:
                plan.append((ref, was, target, was_text))
            else:
                batch.unchanged.append(ref)
            continue
        want, current = target & limit, was & limit
        if current == want:
            batch.unchanged.append(ref)
        else:
            plan.append((ref, current, want, batch.text(current)))
    return plan


def _plan_by_reading(refs: list[CgroupRef], limits: Mapping[CgroupRef, frozenset[int]] | None,
                     batch: _Batch) -> list[_Step]:
    """The plan step without a known pool (``settle``, ``reconcile``): each file is read, to be
    written only where it differs from its target, and its undo writes back what it held."""
    target = batch.target
    parsed: dict[str, frozenset[int]] = {}  # shared cpusets mostly read the same text
    read = cgroups.read_cgroup_file
    plan: list[_Step] = []
    for ref in refs:
        path = cpus_file(ref.cpuset_dir)
        try:
            text = read(path)
            current = parse_cpus(text, path, parsed)
        except EnforcementError as exc:  # a cgroup gone (an exited container) cannot be read
            batch.lost(ref, frozenset(), target, str(exc))
            continue
        want = target & limits[ref] if limits and ref in limits else target
        if current == want:
            batch.unchanged.append(ref)
        else:
            plan.append((ref, current, want, text))
    return plan


def _write_plan(plan: list[_Step], batch: _Batch, undo: UndoLog, was: frozenset[int] | None,
                systemd: Systemd | None, leaves: Collection[str] | None,
                handles: Mapping[str, tuple[int, bool]] | None) -> None:
    """The write step: each container by the cheapest path that is safe for it.

    ``leaves``: cgroup directories seen lately with no cgroup below them
    (:func:`~numa_pin.enforcer.nested.leaf_dirs`; the agent's spare looks as it rehearses). One
    of them that only shrinks is written without the ``stat``: cgroup v1 refuses (EBUSY) to take
    a parent below the CPUs of a cgroup made in it since, and that refusal sends it down the
    nested path; on v2 nothing below it can keep CPUs it loses but a partition, which ``status``
    and ``reconcile`` report (:func:`check_shared`).

    ``handles``: ``cpuset.cpus`` files held open for writing, by path (the agent's spare opens
    its leaves' as it rehearses, :func:`cgroups.open_handles`): one of them on the one-write path
    is written through its descriptor, no path looked up, opened or closed; where that write
    fails (its cgroup removed, or made again since) the file is written by path as before."""
    target, enabled, dirname = batch.target, batch.enabled, os.path.dirname
    shrinks = was is not None and target <= was  # the pool only shrinks (for every container without a cpuset)
    # a busy node's common case at its own pace: a known leaf going from the old pool to the new
    # one (on v2 below a parent already made ready), written through its held handle
    quick = handles if systemd is None and shrinks and handles else None
    known_leaves = leaves if leaves is not None else ()
    target_data = batch.data(batch.formatted.setdefault(target, cpulist.format_list(target)))
    write_handle = cgroups.write_cgroup_handle
    for ref, current, want, before in plan:
        directory = ref.cpuset_dir
        if (quick is not None and want is target and current is was and directory in known_leaves
                and (ref.version == 1 or dirname(directory) in enabled)):
            path = cpus_file(directory)
            handle = quick.get(path)
            if handle is not None and write_handle(handle[0], target_data, handle[1]):
                batch.written.append((path, before))
                batch.updated.append(ref)
                continue
        text = batch.text(want)
        parent = dirname(directory) if ref.version == 2 else ""  # v1 has no subtree_control
        trusted = leaves is not None and directory in leaves and (
            shrinks if want is target and current is was else want <= current)
        # the common case, a container of one cgroup whose parent is ready: one write (and on v2
        # no partition can sit below it)
        if (systemd is None and parent in enabled and (trusted or no_subdirs(directory))
                and _write_one((ref, current, want, before), text, trusted, batch, handles)):
            continue
        _write_nested((ref, current, want, before), text, parent, batch, undo, systemd)


def _write_one(step: _Step, text: str, trusted: bool, batch: _Batch,
               handles: Mapping[str, tuple[int, bool]] | None) -> bool:
    """One write of a container's ``cpuset.cpus`` (through its held handle where there is one);
    its undo is :func:`_record_written`'s. Returns False only where a ``trusted`` leaf refused:
    a cgroup made below it since it was seen as a leaf sends it down the nested path."""
    ref, current, want, before = step
    path = cpus_file(ref.cpuset_dir)
    handle = handles.get(path) if handles else None
    try:
        if handle is None or not cgroups.write_cgroup_handle(handle[0], batch.data(text), handle[1]):
            cgroups.write_cgroup_file(path, text)
    except EnforcementError as exc:
        if trusted:
            return False
        batch.lost(ref, current, want, str(exc))
        return True
    batch.written.append((path, before))
    batch.updated.append(ref)
    return True


def _write_nested(step: _Step, text: str, parent: str, batch: _Batch, undo: UndoLog,
                  systemd: Systemd | None) -> None:
    """A container written with an undo log of its own: ``cpuset`` enabled above it (v2), its
    unit's ``AllowedCPUs`` (systemd), the cpuset cgroups nested in it (v1) or a partition check
    (v2). Where the kernel refuses, its writes are undone (:func:`_undo_container`) and it is
    left as it was; otherwise its undo joins ``undo``."""
    ref, current, want, before = step
    own = UndoLog()
    try:
        if parent not in batch.enabled:
            ensure_cpuset_controller(ref, own)
        if systemd is not None:
            from numa_pin.enforcer.systemd import assert_unit_cpuset

            assert_unit_cpuset(systemd, ref, want, None, own)
        if ref.version == 1:
            resize_tree_v1(ref, want, own, before, text)
        else:
            write_list(ref.cpuset_dir, want, own, "shared pool", before, text)
    except EnforcementError as exc:
        _undo_container(step, exc, own, batch)
        return
    undo.absorb(own)
    batch.enabled.add(parent)
    batch.updated.append(ref)
    if ref.version == 2:
        stuck = partition_holding(ref, want)
        if stuck is not None:
            batch.blocked.append(stuck)


def _undo_container(step: _Step, exc: EnforcementError, own: UndoLog, batch: _Batch) -> None:
    """The undo step of one refused container: its own writes rolled back; gone (exited), or
    left as it was and reported with what could not be put back."""
    ref, current, want, _ = step
    failures = own.rollback()
    if not os.path.isdir(ref.cpuset_dir):
        batch.missing.append(ref)
        return
    why = str(exc) if not failures else f"{exc}; {describe_failures(failures)}"
    batch.blocked.append(Blocked(ref, current, want, why))


def _record_written(undo: UndoLog, written: list[tuple[str, str]]) -> None:
    """The undo step of the one-write containers: one record for all, restored first on a
    rollback (before any parent's cpuset controller goes)."""
    if written:
        undo.record(f"shared pool: {len(written)} cpuset.cpus files back to what they held",
                    restorer_of_all(written))


def check_shared(
    refs: Iterable[CgroupRef], pool: Iterable[int], limits: Mapping[CgroupRef, frozenset[int]] | None = None
) -> tuple[Blocked, ...]:
    """The shared containers still on CPUs outside their target, read from the cgroups
    themselves without writing anything (what ``status`` and ``reconcile`` report): a
    ``cpuset.cpus`` wider than the pool, or on v2 a partition below the container."""
    target = frozenset(pool)
    out: list[Blocked] = []
    for ref in refs:
        want = target & limits[ref] if limits and ref in limits else target
        try:
            held = read_list(cpus_file(ref.cpuset_dir))
        except EnforcementError:
            continue  # gone (an exited container) or unreadable: nothing to report from here
        if held - want:
            try:
                nested = len(subtree(ref.cpuset_dir)[0]) - 1
            except EnforcementError as exc:
                nested = -1
                why = str(exc)
            if nested >= 0:
                why = (f"{nested} nested cpuset cgroup(s) below it" if nested
                       else "its cpuset.cpus was not shrunk")
            out.append(Blocked(ref, held, want, why))
            continue
        stuck = partition_holding(ref, want)
        if stuck is not None:
            out.append(stuck)
    return tuple(out)


__all__ = [
    "ResizeResult", "check_shared", "reserved_conflicts", "resize_shared",
    "shared_pool",
]

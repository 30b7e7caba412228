"""The shared CPU pool: everything online that no exclusive grant holds.

This is kubelet's static CPU manager arithmetic. Containers without exclusive CPUs run
on the shared pool; when an exclusive grant is made the pool shrinks and every shared
container's ``cpuset.cpus`` must shrink with it, and when a grant is released they grow
back. :func:`shared_pool` and :func:`plan_shared_updates` are pure; only
:func:`resize_shared` touches cgroup files.

Reserved CPUs (kubelet ``reservedSystemCPUs``) are never granted exclusively and always
stay in the pool, so the pool is never empty while at least one CPU is reserved.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Mapping

from numa_pin import cpuset as cpulist
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.cpuset import CPUSET_CPUS, ensure_cpuset_controller
from numa_pin.enforcer.undo import UndoLog, describe_failures
from numa_pin.errors import AllocationError, EnforcementError
from numa_pin.record import record

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


def shared_pool(
    online_cpus: Iterable[int],
    exclusive_grants_cpus: Iterable[Iterable[int]],
    reserved_cpus: Iterable[int],
) -> frozenset[int]:
    """Online CPUs minus every exclusive grant (pure).

    ``exclusive_grants_cpus`` holds one CPU collection per exclusive grant. Reserved CPUs are
    never granted by a decision, so they normally all stay in the pool. A grant made under an
    older config can still hold a CPU the config now reserves: that CPU stays with its grant
    until the grant ends (see :func:`reserved_conflicts`), it does not stop the node. Raises
    AllocationError when the pool would be empty (nothing reserved and every online CPU granted).
    """
    online = frozenset(online_cpus)
    granted: set[int] = set()
    for grant in exclusive_grants_cpus:
        granted.update(grant)
    pool = online - granted
    if not pool:
        raise AllocationError(
            f"the shared CPU pool would be empty: all online CPUs "
            f"({cpulist.format_list(online) or 'none'}) are granted exclusively and none is "
            f"reserved"
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
class SharedUpdate:
    """One shared container whose ``cpuset.cpus`` must change from ``current`` to ``target``."""

    key: Hashable
    current: frozenset[int]
    target: frozenset[int]

    @property
    def grows(self) -> bool:
        return bool(self.target - self.current)

    @property
    def shrinks(self) -> bool:
        return bool(self.current - self.target)


def plan_shared_updates(
    shared_refs_current: Mapping[Any, Iterable[int]],
    pool: Iterable[int],
    limits: Mapping[Any, frozenset[int]] | None = None,
) -> tuple[SharedUpdate, ...]:
    """The shared containers whose current CPUs differ from their target (pure).

    ``shared_refs_current`` maps a container key (a CgroupRef, an id) to its current
    ``cpuset.cpus``. The target is ``pool``, or ``pool`` inside the container's own cpuset
    when ``limits`` has one for the key (never wider). The result keeps the mapping's order;
    containers already on their target are left out.
    """
    pool_set = frozenset(pool)
    limits = limits or {}
    out: list[SharedUpdate] = []
    for key, current in shared_refs_current.items():
        cur = frozenset(current)
        target = pool_set & limits[key] if key in limits else pool_set
        if cur != target:
            out.append(SharedUpdate(key, cur, target))
    return tuple(out)


@record
class ResizeResult:
    """What :func:`resize_shared` did to each shared container cgroup."""

    updated: tuple[CgroupRef, ...]
    unchanged: tuple[CgroupRef, ...]
    missing: tuple[CgroupRef, ...]  # cgroup gone: the container has exited


def resize_shared(
    refs: Iterable[CgroupRef],
    pool: Iterable[int],
    cgroup_root: str | os.PathLike[str],
    undo: UndoLog,
    limits: Mapping[CgroupRef, frozenset[int]] | None = None,
    real_dirs: dict[str, str] | None = None,
) -> ResizeResult:
    """Set ``cpuset.cpus`` of every shared container cgroup in ``refs`` to ``pool`` (inside the
    container's own cpuset where ``limits`` gives one).

    A cgroup whose directory no longer exists (before or during the write) is skipped
    as exited. On v2 ``cpuset`` is first enabled in the ancestors' subtree_control.
    Every change is recorded in ``undo`` once all writes succeeded. On a failure the
    writes of this call are rolled back and EnforcementError names the cgroup (on v1
    usually a parent that lacks pool CPUs, or a child cgroup that still uses CPUs the
    pool no longer has). Raises CgroupEscapeError for a ref outside ``cgroup_root`` and
    AllocationError for an empty pool, or a container whose own cpuset holds no pool CPU.

    Cost per container: one path check against parents resolved once (``real_dirs``, a memo
    the caller may share with the making of ``refs``, see :func:`cgroups.realpath`), one read,
    and a write only where the cpuset changes.
    """
    target = frozenset(pool)
    if not target:
        raise AllocationError("refusing to resize shared containers to an empty CPU pool")
    ref_list = list(refs)
    real_dirs = {} if real_dirs is None else real_dirs
    for ref in ref_list:
        cgroups.check_under(cgroup_root, ref.cpuset_dir, real_dirs)

    local = UndoLog()
    updated: list[CgroupRef] = []
    unchanged: list[CgroupRef] = []
    missing: list[CgroupRef] = []
    try:
        current: dict[CgroupRef, frozenset[int]] = {}
        texts: dict[CgroupRef, str] = {}
        parsed: dict[str, frozenset[int]] = {}  # shared cpusets mostly read the same text
        for ref in ref_list:
            try:
                current[ref], texts[ref] = _read_cpus(ref, parsed)
            except EnforcementError:
                if os.path.isdir(ref.cpuset_dir):
                    raise
                missing.append(ref)  # the cgroup is gone: its container has exited
        plan = plan_shared_updates(current, target, limits)
        empty = [_ref(u).rel_path for u in plan if not u.target]
        if empty:
            raise AllocationError(
                f"shared containers {', '.join(empty)} would have no CPU: their own cpusets hold none of "
                f"the shared pool {cpulist.format_list(target)}"
            )
        changing = {u.key for u in plan}
        unchanged.extend(r for r in current if r not in changing)
        enabled: set[str] = set()  # parents whose ancestors have cpuset enabled (v2)
        formatted: dict[frozenset[int], str] = {}
        for update in plan:
            ref = _ref(update)
            try:
                parent = os.path.dirname(ref.cpuset_dir)
                if parent not in enabled:
                    ensure_cpuset_controller(ref, local)
                    enabled.add(parent)
                text = formatted.get(update.target)
                if text is None:
                    text = formatted[update.target] = cpulist.format_list(update.target)
                _write_cpus(ref, text, local, texts[ref])
            except EnforcementError:
                if os.path.isdir(ref.cpuset_dir):
                    raise
                missing.append(ref)
                continue
            updated.append(ref)
    except EnforcementError as exc:
        failures = local.rollback()
        raise EnforcementError(
            f"resizing shared containers to cpus {cpulist.format_list(target)} failed: "
            f"{exc}; {describe_failures(failures)}"
        ) from exc
    undo.absorb(local)
    return ResizeResult(tuple(updated), tuple(unchanged), tuple(missing))


def _ref(update: SharedUpdate) -> CgroupRef:
    """The cgroup an update of :func:`resize_shared`'s plan is for (its keys are all cgroups)."""
    if not isinstance(update.key, CgroupRef):
        raise TypeError(f"a shared-pool update keyed by {update.key!r}, not by a cgroup")
    return update.key


def _read_cpus(ref: CgroupRef, parsed: dict[str, frozenset[int]]) -> tuple[frozenset[int], str]:
    """The cgroup's CPUs, and the text they were read from (``parsed``: texts parsed before)."""
    path = os.path.join(ref.cpuset_dir, CPUSET_CPUS)
    text = cgroups.read_cgroup_file(path)
    cpus = parsed.get(text)
    if cpus is not None:
        return cpus, text
    try:
        cpus = parsed[text] = cpulist.parse_list(text)
    except ValueError as exc:
        raise EnforcementError(f"not a CPU list: {exc}", path=path) from exc
    return cpus, text


def _write_cpus(ref: CgroupRef, text: str, undo: UndoLog, before: str) -> None:
    """Write ``text`` (the update's target); the undo restores ``before``, the text the plan was
    read from."""
    path = os.path.join(ref.cpuset_dir, CPUSET_CPUS)
    cgroups.write_cgroup_file(path, text)

    def restore() -> None:
        cgroups.write_cgroup_file(path, before)

    undo.record(f"{path}: {text!r} (was {before!r}, shared pool)", restore)


__all__ = ["ResizeResult", "SharedUpdate", "plan_shared_updates", "resize_shared", "shared_pool"]

"""Write ``cpuset.mems`` and ``cpuset.cpus`` of one cgroup, verify, and make it undoable.

Order and checks (``docs/design/enforcer.md`` explains why):

1. v2 only: ``+cpuset`` is put in ``cgroup.subtree_control`` of every ancestor, from the
   hierarchy root down to the parent, where it is missing (each one recorded for undo).
2. ``cpuset.mems`` is written, then ``cpuset.cpus`` (v1 needs mems before tasks can run;
   the same order is harmless on v2). A write that would not change the value is skipped.
   ``mems=None`` leaves the memory nodes as they are: a shared container only has its CPUs
   moved, and on v2 its own ``cpuset.mems`` is usually empty (it inherits the parent's, as
   systemd, podman and runc without a cpuset leave it), which must stay so.
3. The effective values are read back (v2 ``cpuset.{cpus,mems}.effective``; v1
   ``cpuset.effective_{cpus,mems}``, or ``cpuset.{cpus,mems}`` on kernels without them).
   If they differ from the request, because a parent restricts them, every write of this
   call is rolled back and EnforcementError names the cgroup directory.

On v1 a child's cpuset must be a subset of its parent's; the kernel refuses anything
else. When that is why a write failed, the error says which CPUs or nodes the parent
lacks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from numa_pin.base import cpuset as cpulist
from numa_pin.base.record import record
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.undo import UndoFn, UndoLog, describe_failures
from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from numa_pin.enforcer.systemd import Systemd

CPUSET_CPUS = "cpuset.cpus"
CPUSET_MEMS = "cpuset.mems"
V2_EFFECTIVE_CPUS = "cpuset.cpus.effective"
V2_EFFECTIVE_MEMS = "cpuset.mems.effective"
V1_EFFECTIVE_CPUS = "cpuset.effective_cpus"
V1_EFFECTIVE_MEMS = "cpuset.effective_mems"
SUBTREE_CONTROL = "cgroup.subtree_control"


@record
class CpusetState:
    """What a cgroup's cpuset files say: configured and effective CPUs and nodes."""

    cpus: frozenset[int]
    mems: frozenset[int]
    effective_cpus: frozenset[int]
    effective_mems: frozenset[int]


def _read_list(path: str) -> frozenset[int]:
    text = cgroups.read_cgroup_file(path)
    try:
        return cpulist.parse_list(text)
    except ValueError as exc:
        raise EnforcementError(f"not a CPU/node list: {exc}", path=path) from exc


def _effective_names(ref: CgroupRef) -> tuple[str, str]:
    if ref.version == 2:
        return V2_EFFECTIVE_CPUS, V2_EFFECTIVE_MEMS
    if os.path.exists(os.path.join(ref.cpuset_dir, V1_EFFECTIVE_CPUS)):
        return V1_EFFECTIVE_CPUS, V1_EFFECTIVE_MEMS
    return CPUSET_CPUS, CPUSET_MEMS


def read_cpuset(ref: CgroupRef) -> CpusetState:
    """Read the configured and effective cpuset of ``ref``.

    Raises EnforcementError naming the file that is missing, unreadable or garbage.
    """
    d = ref.cpuset_dir
    eff_cpus, eff_mems = _effective_names(ref)
    return CpusetState(
        cpus=_read_list(os.path.join(d, CPUSET_CPUS)),
        mems=_read_list(os.path.join(d, CPUSET_MEMS)),
        effective_cpus=_read_list(os.path.join(d, eff_cpus)),
        effective_mems=_read_list(os.path.join(d, eff_mems)),
    )


def ensure_cpuset_controller(ref: CgroupRef, undo: UndoLog) -> tuple[str, ...]:
    """v2: enable ``cpuset`` in ``cgroup.subtree_control`` from the root down to the parent.

    Returns the directories where it was enabled (each recorded in ``undo`` as a
    ``-cpuset`` write). Does nothing on v1. Raises EnforcementError naming the
    ``cgroup.subtree_control`` file the kernel refused (for example a non-root cgroup
    that has processes of its own).
    """
    if ref.version != 2:
        return ()
    parts = [p for p in ref.rel_path.split("/") if p]
    ancestors = [ref.hierarchy_root]
    for part in parts[:-1]:
        ancestors.append(os.path.join(ancestors[-1], part))
    enabled: list[str] = []
    for d in ancestors:
        path = os.path.join(d, SUBTREE_CONTROL)
        if "cpuset" in cgroups.read_cgroup_file(path).split():
            continue
        cgroups.write_cgroup_file(path, "+cpuset")
        undo.record(f"{path}: +cpuset", _writer(path, "-cpuset"))
        enabled.append(d)
    return tuple(enabled)


def restore_list(path: str, text: str) -> None:
    """Write ``text`` back to the cpuset list file ``path``. An empty value (a v2 cgroup that
    inherits its parent's) that the kernel refuses (ENOSPC on a populated v2 cgroup, seen on
    Linux 6.1 and 6.18) is given what it inherits instead: its parent's effective list. Raises
    EnforcementError naming ``path``."""
    try:
        cgroups.write_cgroup_file(path, text)
    except EnforcementError:
        if text.strip():
            raise
        parent = os.path.dirname(os.path.dirname(path))
        inherited = cgroups.read_cgroup_file(os.path.join(parent, os.path.basename(path) + ".effective"))
        cgroups.write_cgroup_file(path, inherited)


def _writer(path: str, text: str) -> UndoFn:
    def undo() -> None:
        restore_list(path, text)

    return undo


def write_list_if_changed(path: str, want: frozenset[int], undo: UndoLog) -> bool:
    """Write ``want`` to the list file ``path`` unless it already holds that set.

    Records the previous text in ``undo``. Returns True when a write happened.
    Raises EnforcementError naming ``path``.
    """
    before = cgroups.read_cgroup_file(path)
    try:
        current = cpulist.parse_list(before)
    except ValueError as exc:
        raise EnforcementError(f"not a CPU/node list: {exc}", path=path) from exc
    if current == want:
        return False
    text = cpulist.format_list(want)
    cgroups.write_cgroup_file(path, text)
    undo.record(f"{path}: {text!r} (was {before!r})", _writer(path, before))
    return True


def _v1_parent_hint(ref: CgroupRef, cpus: frozenset[int], mems: frozenset[int]) -> str:
    """Why a v1 write may have failed: the parent lacks some of the CPUs or nodes."""
    if ref.version != 1 or os.path.normpath(ref.cpuset_dir) == os.path.normpath(ref.hierarchy_root):
        return ""
    parent = os.path.dirname(os.path.normpath(ref.cpuset_dir))
    notes: list[str] = []
    for name, want, what in ((CPUSET_CPUS, cpus, "CPUs"), (CPUSET_MEMS, mems, "memory nodes")):
        try:
            have = _read_list(os.path.join(parent, name))
        except EnforcementError:
            continue
        missing = want - have
        if missing:
            notes.append(
                f"{what} {cpulist.format_list(missing)} are not in the parent cgroup "
                f"{parent} ({name}={cpulist.format_list(have) or 'empty'}); on cgroup v1 a "
                f"child cpuset must be a subset of its parent's"
            )
    return "; ".join(notes)


def _v2_parent_hint(ref: CgroupRef) -> str:
    if ref.version != 2 or os.path.normpath(ref.cpuset_dir) == os.path.normpath(ref.hierarchy_root):
        return ""
    parent = os.path.dirname(os.path.normpath(ref.cpuset_dir))
    try:
        cpus = _read_list(os.path.join(parent, V2_EFFECTIVE_CPUS))
        mems = _read_list(os.path.join(parent, V2_EFFECTIVE_MEMS))
    except EnforcementError:
        return ""
    return (f"the parent cgroup {parent} only has cpus {cpulist.format_list(cpus) or 'none'}, "
            f"mems {cpulist.format_list(mems) or 'none'}")


def _relative_message(exc: EnforcementError, d: str) -> str:
    """The error text with its path shown relative to the cgroup dir ``d`` when inside it."""
    text = str(exc)
    if exc.path is None:
        return text
    prefix = f"{exc.path}: "
    reason = text[len(prefix):] if text.startswith(prefix) else text
    if os.path.normpath(exc.path) == os.path.normpath(d):
        return reason
    if exc.path.startswith(d.rstrip("/") + "/"):
        return f"{os.path.relpath(exc.path, d)}: {reason}"
    return text


def _needs_unit(ref: CgroupRef, cpus: frozenset[int], mems: frozenset[int] | None) -> bool:
    """False when the cgroup's files already say what is asked, so its unit need not be told:

    * its own lists are ``cpus`` (and ``mems`` when asked): whoever wrote them told systemd the
      same (runc's and crun's systemd drivers put a spec's cpuset in the unit they create, and
      numa-pin sets the unit before the files). An NRI container at StartContainer, whose
      runtime applied the grant at CreateContainer, costs no ``systemctl`` call, so a systemd
      slow to answer then cannot fail its start;
    * with its memory nodes left alone, it holds no CPU list of its own and already runs on
      exactly ``cpus`` (a shared container on a node without exclusive grants): there is nothing
      systemd could undo."""
    d = ref.cpuset_dir
    own = _read_list(os.path.join(d, CPUSET_CPUS))
    if not own:
        return mems is not None or _read_list(os.path.join(d, _effective_names(ref)[0])) != cpus
    return own != cpus or (mems is not None and _read_list(os.path.join(d, CPUSET_MEMS)) != mems)


def apply_cpuset(
    ref: CgroupRef,
    cpus: Iterable[int],
    mems: Iterable[int] | None,
    cgroup_root: str | os.PathLike[str],
    undo: UndoLog,
    systemd: Systemd | None = None,
    real_dirs: dict[str, str] | None = None,
) -> CpusetState:
    """Confine cgroup ``ref`` to ``cpus`` and memory nodes ``mems``; return the read-back state.

    ``mems=None`` writes only the CPUs: the memory nodes (configured and effective) stay as
    the cgroup has them, whatever they are, and are not checked.

    Every change is recorded in ``undo`` (only once the whole call succeeded). On any
    failure the writes made by this call are rolled back first, then
    :class:`~numa_pin.errors.EnforcementError` is raised naming the cgroup directory (or
    the file the kernel refused), the reason (on v1: the CPUs the parent lacks), and
    whether the rollback was complete. Raises CgroupEscapeError when ``ref.cpuset_dir``
    is not below ``cgroup_root``, and EnforcementError for an empty ``cpus`` or ``mems``
    or a cgroup directory that does not exist.

    With ``systemd`` (:func:`numa_pin.enforcer.systemd.detect`) and a cgroup a unit owns, the
    unit's ``AllowedCPUs``/``AllowedMemoryNodes`` are set first (systemd would otherwise write
    its own values back at the next ``daemon-reload``), unless the cgroup simply inherits the
    CPUs asked for (no value of its own, nothing to hold).

    ``real_dirs``: a batch's memo of real paths for the check against ``cgroup_root`` (see
    :func:`numa_pin.enforcer.cgroups.realpath`; NRI's Synchronize adopts thousands, each cgroup
    found through it moments before).
    """
    want_cpus = frozenset(cpus)
    want_mems = None if mems is None else frozenset(mems)
    d = ref.cpuset_dir
    cgroups.check_under(cgroup_root, d, real_dirs)
    if not want_cpus or want_mems == frozenset():
        shown = "unchanged" if want_mems is None else cpulist.format_list(want_mems)
        raise EnforcementError(
            f"refusing an empty cpuset (cpus={cpulist.format_list(want_cpus)!r}, "
            f"mems={shown!r})", path=d)
    if not os.path.isdir(d):
        raise EnforcementError("cgroup directory does not exist", path=d)

    local = UndoLog()
    try:
        ensure_cpuset_controller(ref, local)
        if systemd is not None and _needs_unit(ref, want_cpus, want_mems):
            from numa_pin.enforcer.systemd import assert_unit_cpuset

            assert_unit_cpuset(systemd, ref, want_cpus, want_mems, local)
        if want_mems is not None:
            write_list_if_changed(os.path.join(d, CPUSET_MEMS), want_mems, local)
        write_list_if_changed(os.path.join(d, CPUSET_CPUS), want_cpus, local)
        state = read_cpuset(ref)
        if state.effective_cpus != want_cpus or (want_mems is not None and state.effective_mems != want_mems):
            asked_mems = "unchanged" if want_mems is None else cpulist.format_list(want_mems)
            raise EnforcementError(
                f"asked for cpus {cpulist.format_list(want_cpus)} mems "
                f"{asked_mems}, the kernel made them effective as cpus "
                f"{cpulist.format_list(state.effective_cpus) or 'none'} mems "
                f"{cpulist.format_list(state.effective_mems) or 'none'}",
                path=d,
            )
    except EnforcementError as exc:
        hint = _v1_parent_hint(ref, want_cpus, want_mems or frozenset()) or _v2_parent_hint(ref)
        failures = local.rollback()
        parts = [_relative_message(exc, d)]
        if hint:
            parts.append(hint)
        parts.append(describe_failures(failures))
        raise EnforcementError("; ".join(parts), path=d) from exc
    undo.absorb(local)
    return state


__all__ = [
    "CPUSET_CPUS",
    "CPUSET_MEMS",
    "CpusetState",
    "apply_cpuset",
    "ensure_cpuset_controller",
    "read_cpuset",
    "restore_list",
    "write_list_if_changed",
]

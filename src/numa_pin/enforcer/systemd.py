"""Tell systemd about a cpuset it would otherwise undo: ``AllowedCPUs``/``AllowedMemoryNodes``.

Where systemd owns a container's cgroup (podman, runc ``--systemd-cgroup`` and containerd with
``SystemdCgroup = true`` make a transient ``*.scope``), systemd writes the unit's cgroup files
again from its own properties at every ``daemon-reload`` and unit change. A cpuset written only
to the files is then widened back, and a property another writer set
(``systemctl set-property <scope> AllowedCPUs=0-3``) wins. So where a cgroup's leaf is a unit of
a running systemd, the enforcer sets the same values as runtime properties of the unit too
(``systemctl set-property --runtime``; for a transient unit systemd keeps them in
``/run/systemd/transient``, where they replace what any earlier writer set), before it writes
the files, and records how to put the old properties back.

Whether systemd runs is read under the configured proc root (``<proc_root>/1/comm`` is
``systemd``, as on a booted systemd host), and ``systemctl`` is taken from ``PATH``. Every call
is bounded: inside an admission by what its deadline leaves (the runtime's own timeout is
behind it), elsewhere and when undoing by :data:`TIMEOUT_S` (what was changed goes back even
after the deadline passed). Nothing here runs on a host without systemd, on cgroup v1, or for
a cgroupfs path.
"""

from __future__ import annotations

import os
import time

from numa_pin.base import cpuset as cpulist
from numa_pin.base import deadline
from numa_pin.base.record import record
from numa_pin.base.text import one_line
from numa_pin.enforcer.cgroups import DRIVER_SYSTEMD, CgroupRef
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError

#: unit types whose cgroup holds a container's processes (a slice holds a pod's)
UNIT_SUFFIXES = (".scope", ".slice", ".service")
#: seconds one systemctl call may take outside an admission, and when undoing
TIMEOUT_S = 10.0
#: bytes of systemctl output kept (properties and an error line)
MAX_OUTPUT = 65536
PROPERTIES = ("AllowedCPUs", "AllowedMemoryNodes")


@record
class UnitCpuset:
    """A unit's cpuset properties as systemd shows them (``""`` when unset)."""

    unit: str
    cpus: str
    mems: str
    loaded: bool


def unit_of(ref: CgroupRef) -> str | None:
    """The systemd unit that owns ``ref``'s cgroup (its leaf is a unit name), else None (pure).

    Only on cgroup v2 with a systemd-style path: systemd has no cpuset properties on v1."""
    if ref.version != 2 or ref.driver != DRIVER_SYSTEMD:
        return None
    leaf = ref.rel_path.rstrip("/").rsplit("/", 1)[-1]
    return leaf if leaf.endswith(UNIT_SUFFIXES) and leaf not in ("-.slice", "init.scope") else None


def _find_on_path(name: str) -> str | None:
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


class Systemd:
    """Runs ``systemctl`` (``path``) with a timeout on every call."""

    def __init__(self, systemctl: str, timeout_s: float = TIMEOUT_S) -> None:
        self.systemctl = systemctl
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"Systemd({self.systemctl!r})"

    def _bound(self, args: list[str], what: str, undoing: bool) -> float:
        """How long a call may take: what the running admission's deadline leaves, else
        :attr:`timeout_s` (always when ``undoing``)."""
        running = None if undoing else deadline.current()
        if running is None:
            return self.timeout_s
        left = running.remaining()
        if left <= 0:
            raise EnforcementError(f"no time left for systemctl {' '.join(args)}: the admission's deadline passed",
                                   path=what)
        return left

    def _run(self, args: list[str], what: str, undoing: bool = False) -> str:
        import subprocess  # only where systemd owns a cgroup: the hook imports this module on every start

        argv, bound = [self.systemctl, *args], self._bound(args, what, undoing)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=bound, check=False)
        except subprocess.TimeoutExpired as exc:
            raise EnforcementError(f"systemctl {' '.join(args)} ran past {bound:g}s", path=what) from exc
        except OSError as exc:
            raise EnforcementError(f"cannot run {self.systemctl}: {exc}", path=what) from exc
        out = done.stdout[:MAX_OUTPUT].decode("utf-8", "replace")
        if done.returncode != 0:
            err = done.stderr[:MAX_OUTPUT].decode("utf-8", "replace").strip() or out.strip()
            raise EnforcementError(
                f"systemctl {' '.join(args)} failed (exit {done.returncode}): {one_line(err)[:300]}", path=what)
        return out

    def show(self, unit: str) -> UnitCpuset:
        """The unit's ``AllowedCPUs``/``AllowedMemoryNodes`` and whether systemd has it loaded."""
        out = self._run(["show", "--property=LoadState,ActiveState," + ",".join(PROPERTIES), "--", unit], unit)
        values: dict[str, str] = {}
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
        loaded = values.get("LoadState") == "loaded" and values.get("ActiveState") in ("active", "activating",
                                                                                       "reloading")
        return UnitCpuset(unit, values.get("AllowedCPUs", ""), values.get("AllowedMemoryNodes", ""), loaded)

    def start_scope(self, unit: str, pid: int, description: str, proc_root: str | os.PathLike[str]) -> str:
        """Move ``pid`` into a new transient scope ``unit`` (what ``systemd-run --scope`` makes), over
        D-Bus with ``busctl`` (beside ``systemctl``), and wait until the kernel shows it there.
        Returns the scope's cgroup path. Raises EnforcementError naming the unit."""
        busctl = os.path.join(os.path.dirname(self.systemctl), "busctl")
        props = ["PIDs", "au", "1", str(pid), "CollectMode", "s", "inactive-or-failed",
                 "Description", "s", description]
        args = ["call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))",
                unit, "fail", str(len(props) // 3), *props, "0"]
        Systemd(busctl, self.timeout_s)._run(args, unit)
        source = os.path.join(os.fspath(proc_root), str(pid), "cgroup")
        waited = 0.0
        while waited < self.timeout_s:
            try:
                with open(source, "rb") as f:
                    lines = f.read(65536).decode("utf-8", "replace").splitlines()
            except OSError as exc:
                raise EnforcementError(f"process {pid} is gone before its scope started", path=source) from exc
            for line in lines:
                path = line.split(":", 2)[-1]
                if line.startswith("0::") and path.rsplit("/", 1)[-1] == unit:
                    return path
            time.sleep(0.02)
            waited += 0.02
        raise EnforcementError(f"process {pid} did not reach {unit} within {self.timeout_s:g}s", path=source)

    def set_properties(self, unit: str, cpus: str, mems: str | None, *, undoing: bool = False) -> None:
        """``systemctl set-property --runtime UNIT AllowedCPUs=cpus [AllowedMemoryNodes=mems]``
        (``undoing``: putting earlier values back, bounded by :attr:`timeout_s` alone)."""
        args = ["set-property", "--runtime", "--", unit, f"AllowedCPUs={cpus}"]
        if mems is not None:
            args.append(f"AllowedMemoryNodes={mems}")
        self._run(args, unit, undoing)


def detect(proc_root: str | os.PathLike[str]) -> Systemd | None:
    """A :class:`Systemd` when systemd is init under ``proc_root`` and ``systemctl`` is on PATH."""
    try:
        with open(os.path.join(os.fspath(proc_root), "1", "comm"), "rb") as f:
            comm = f.read(64).strip()
    except OSError:
        return None
    if comm != b"systemd":
        return None
    path = _find_on_path("systemctl")
    return Systemd(path) if path else None


def _same(shown: str, want: frozenset[int]) -> bool:
    """Does a property as ``systemctl show`` prints it (``0 2-3``: ranges split by spaces) say ``want``?"""
    try:
        return cpulist.parse_list(",".join(shown.split())) == want
    except ValueError:
        return False


def assert_unit_cpuset(
    systemd: Systemd | None,
    ref: CgroupRef,
    cpus: frozenset[int],
    mems: frozenset[int] | None,
    undo: UndoLog,
) -> bool:
    """Make the unit owning ``ref`` say ``AllowedCPUs=cpus`` (and ``AllowedMemoryNodes=mems``
    unless None) as runtime properties; return True when something was set.

    Does nothing (False) without systemd, for a cgroup no unit owns, for a unit systemd has not
    loaded (gone, or a directory named like a unit), and when the properties already say so.
    The old values are recorded in ``undo``. Raises EnforcementError naming the unit when
    systemctl fails or runs past its timeout.
    """
    unit = unit_of(ref) if systemd is not None else None
    if systemd is None or unit is None:
        return False
    shown = systemd.show(unit)
    if not shown.loaded:
        return False
    if _same(shown.cpus, cpus) and (mems is None or _same(shown.mems, mems)):
        return False
    text_cpus = cpulist.format_list(cpus)
    text_mems = None if mems is None else cpulist.format_list(mems)
    systemd.set_properties(unit, text_cpus, text_mems)
    old_cpus, old_mems = shown.cpus, (None if mems is None else shown.mems)

    def restore() -> None:
        systemd.set_properties(unit, old_cpus, old_mems, undoing=True)

    undo.record(f"{unit}: AllowedCPUs={text_cpus!r} AllowedMemoryNodes={text_mems!r} "
                f"(was {shown.cpus!r}, {shown.mems!r})", restore)
    return True


__all__ = ["PROPERTIES", "Systemd", "UnitCpuset", "assert_unit_cpuset", "detect", "unit_of"]

"""How cgroups are mounted: ``mountinfo`` read into a :class:`CgroupLayout` (v1, v2 or hybrid).

:func:`detect_layout` reads ``<proc_root>/<pid>/mountinfo``; :func:`parse_mountinfo` and
:func:`layout_from_mounts` are its pure halves. :mod:`numa_pin.enforcer.cgroups` re-exports all
of it and uses the layout to find a process's cgroup.
"""

from __future__ import annotations

import os
import re

from numa_pin.base.record import record
from numa_pin.errors import EnforcementError

MODE_V1 = "v1"
MODE_V2 = "v2"
MODE_HYBRID = "hybrid"

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
_MOUNT_OPTIONS_NOT_CONTROLLERS = frozenset(
    {"rw", "ro", "nosuid", "nodev", "noexec", "relatime", "noatime", "xattr",
     "clone_children", "noprefix", "cpuset_v2_mode", "nsdelegate", "memory_recursiveprot",
     "favordynmods", "memory_localevents", "memory_hugetlb_accounting"}
)


@record
class CgroupMount:
    """One cgroup (v1) or cgroup2 mount from mountinfo."""

    mount_point: str
    root: str  # the directory of the hierarchy that is mounted ("/" normally)
    fstype: str  # "cgroup" or "cgroup2"
    options: frozenset[str]  # super options: controllers (v1) plus flags

    @property
    def is_v2(self) -> bool:
        return self.fstype == "cgroup2"

    @property
    def controllers(self) -> frozenset[str]:
        """v1 controllers of this hierarchy (``name=systemd`` hierarchies have none)."""
        if self.is_v2:
            return frozenset()
        return frozenset(
            o for o in self.options if "=" not in o and o not in _MOUNT_OPTIONS_NOT_CONTROLLERS
        )


@record
class CgroupLayout:
    """How cgroups are mounted, as seen by one process.

    ``cpuset_mount`` is the mount point of the hierarchy that carries the cpuset
    controller (``None`` on a v1 host without one); ``cpuset_version`` says whether it
    is a v1 or the v2 hierarchy.
    """

    mode: str
    cpuset_mount: str | None
    cpuset_version: int
    unified_mount: str | None
    mounts: tuple[CgroupMount, ...]
    source: str = ""  # the mountinfo file it was read from

    def v1_mount(self, controller: str) -> CgroupMount | None:
        """The v1 mount carrying ``controller``, or None (v2, or not mounted)."""
        for m in self.mounts:
            if not m.is_v2 and controller in m.controllers:
                return m
        return None

    def hierarchy_subdir(self, controller: str = "cpuset") -> tuple[int, str] | None:
        """(version, directory below the cgroup root) of the hierarchy with ``controller``.

        ``(1, "cpuset")`` on v1/hybrid hosts, ``(2, "")`` on v2 hosts, ``(2, "unified")``
        for a hybrid host whose controller is only on the cgroup2 side. None when the
        controller is mounted nowhere.
        """
        v1 = self.v1_mount(controller)
        if v1 is not None:
            return 1, os.path.basename(v1.mount_point.rstrip("/"))
        if self.unified_mount is None:
            return None
        if self.mode == MODE_V2:
            return 2, ""
        return 2, os.path.basename(self.unified_mount.rstrip("/"))

    def mount_root(self, version: int, controller: str) -> str:
        """The mountinfo ``root`` of the hierarchy (``/`` unless a sub-tree is mounted)."""
        if version == 1:
            m = self.v1_mount(controller)
        else:
            m = next((x for x in self.mounts if x.is_v2), None)
        return m.root if m is not None else "/"


def _unescape(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str, source: str = "mountinfo") -> tuple[CgroupMount, ...]:
    """The cgroup and cgroup2 mounts listed in mountinfo ``text`` (pure).

    Raises EnforcementError naming ``source`` for a line that is not mountinfo.
    """
    mounts: list[CgroupMount] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            sep = fields.index("-", 6)
        except ValueError:
            raise EnforcementError(f"line {lineno} is not a mountinfo line: {line!r}",
                                   path=source) from None
        if len(fields) < sep + 3:
            raise EnforcementError(f"line {lineno} is truncated: {line!r}", path=source)
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            CgroupMount(
                mount_point=_unescape(fields[4]),
                root=_unescape(fields[3]),
                fstype=fstype,
                options=frozenset(fields[sep + 3].split(",")),
            )
        )
    return tuple(mounts)


def layout_from_mounts(mounts: tuple[CgroupMount, ...], source: str = "mountinfo") -> CgroupLayout:
    """Classify cgroup mounts as v1, v2 or hybrid (pure).

    Raises EnforcementError naming ``source`` when there is no cgroup mount at all.
    """
    # one entry per hierarchy: prefer mounts of the hierarchy's root over bind mounts
    ordered = sorted(mounts, key=lambda m: m.root != "/")
    v1_controller_mounts = [m for m in ordered if not m.is_v2 and m.controllers]
    v2_mounts = [m for m in ordered if m.is_v2]
    unified = v2_mounts[0].mount_point if v2_mounts else None
    if v1_controller_mounts:
        mode = MODE_HYBRID if v2_mounts else MODE_V1
    elif v2_mounts:
        mode = MODE_V2
    else:
        raise EnforcementError("no cgroup or cgroup2 mount found", path=source)
    cpuset = next((m for m in v1_controller_mounts if "cpuset" in m.controllers), None)
    if cpuset is not None:
        cpuset_mount: str | None = cpuset.mount_point
        version = 1
    elif unified is not None:
        cpuset_mount, version = unified, 2
    else:
        cpuset_mount, version = None, 1
    return CgroupLayout(mode, cpuset_mount, version, unified, tuple(ordered), source)


def detect_layout(proc_root: str | os.PathLike[str], pid: int | str = "self") -> CgroupLayout:
    """Read ``<proc_root>/<pid>/mountinfo`` and classify the cgroup layout.

    Raises EnforcementError naming the file when it is missing, unreadable, garbage, or
    lists no cgroup mount.
    """
    path = os.path.join(os.fspath(proc_root), str(pid), "mountinfo")
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            text = fh.read()
    except OSError as exc:
        raise EnforcementError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    return layout_from_mounts(parse_mountinfo(text, path), path)


__all__ = ["MODE_HYBRID", "MODE_V1", "MODE_V2", "CgroupLayout", "CgroupMount", "detect_layout", "layout_from_mounts",
           "parse_mountinfo"]

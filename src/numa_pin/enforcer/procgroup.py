"""A cgroup of numa-pin's own for ``numa-pin run`` workloads (plain processes).

v1: ``<cgroup_root>/cpuset/numa-pin/<name>``; v2: ``<cgroup_root>/numa-pin/<name>``. A fresh v1
cpuset group starts with empty ``cpuset.cpus``/``cpuset.mems``, so both are seeded from the parent
before a task may join; the grant's values are written afterwards by the normal enforcement.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from numa_pin.cpuset import parse_list
from numa_pin.errors import EnforcementError

PARENT = "numa-pin"


@dataclass(frozen=True)
class ProcGroup:
    path: str  # absolute directory
    rel_path: str  # path inside the hierarchy, as /proc/<pid>/cgroup shows it


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as fp:
            return fp.read().strip()
    except OSError as exc:
        raise EnforcementError(f"cannot read ({exc.strerror})", path=path) from None


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w", encoding="ascii") as fp:
            fp.write(value)
    except OSError as exc:
        raise EnforcementError(f"cannot write {value!r} ({exc.strerror})", path=path) from None


def create(cgroup_root: str, name: str, version: int) -> ProcGroup:
    """Create the group (and its parent). Raises EnforcementError naming the directory."""
    if not name or "/" in name or name in (".", ".."):
        raise EnforcementError(f"bad group name {name!r}", path=cgroup_root)
    base = os.path.join(cgroup_root, "cpuset") if version == 1 else cgroup_root
    parent = os.path.join(base, PARENT)
    path = os.path.join(parent, name)
    for directory in (parent, path):
        try:
            os.mkdir(directory)
        except FileExistsError:
            pass
        except OSError as exc:
            raise EnforcementError(f"cannot create cgroup ({exc.strerror})", path=directory) from None
        if version == 1:
            up = os.path.dirname(directory)
            for leaf in ("cpuset.mems", "cpuset.cpus"):
                if not _read(os.path.join(directory, leaf)):
                    _write(os.path.join(directory, leaf), _read(os.path.join(up, leaf)))
        elif directory == parent:
            controllers = _read(os.path.join(base, "cgroup.subtree_control")).split()
            if "cpuset" not in controllers:
                _write(os.path.join(base, "cgroup.subtree_control"), "+cpuset")
            if "cpuset" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
                _write(os.path.join(parent, "cgroup.subtree_control"), "+cpuset")
    return ProcGroup(path, f"/{PARENT}/{name}")


def join(group: ProcGroup, pid: int) -> None:
    _write(os.path.join(group.path, "cgroup.procs"), str(pid))


def remove(group: ProcGroup) -> None:
    """Remove the (empty) group; a busy or vanished group is left alone."""
    try:
        os.rmdir(group.path)
    except OSError:
        return


def effective_cpus(group: ProcGroup) -> frozenset[int]:
    for leaf in ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"):
        p = os.path.join(group.path, leaf)
        if os.path.exists(p):
            return parse_list(_read(p))
    return frozenset()


__all__ = ["ProcGroup", "create", "effective_cpus", "join", "remove"]

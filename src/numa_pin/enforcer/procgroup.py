"""A cgroup of numa-pin's own for ``numa-pin run`` workloads (plain processes).

v1: ``<cgroup_root>/cpuset/numa-pin/<name>``; v2: ``<cgroup_root>/numa-pin/<name>``. A fresh v1
cpuset group starts with empty ``cpuset.cpus``/``cpuset.mems``, so both are seeded from the parent
before a task may join; the grant's values are written afterwards by the normal enforcement.
"""

from __future__ import annotations

import os

from numa_pin.base.record import record
from numa_pin.enforcer.cgroups import read_cgroup_file, write_cgroup_file
from numa_pin.errors import EnforcementError

PARENT = "numa-pin"


@record
class ProcGroup:
    path: str  # absolute directory
    rel_path: str  # path inside the hierarchy, as /proc/<pid>/cgroup shows it


def _enable_cpuset(directory: str) -> None:
    control = os.path.join(directory, "cgroup.subtree_control")
    if "cpuset" not in read_cgroup_file(control).split():
        write_cgroup_file(control, "+cpuset")


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
            raise EnforcementError(f"cannot create cgroup ({exc.strerror})", path=directory) from exc
        if version == 1:
            up = os.path.dirname(directory)
            for leaf in ("cpuset.mems", "cpuset.cpus"):
                if not read_cgroup_file(os.path.join(directory, leaf)):
                    write_cgroup_file(os.path.join(directory, leaf), read_cgroup_file(os.path.join(up, leaf)))
        elif directory == parent:
            _enable_cpuset(base)
            _enable_cpuset(parent)
    return ProcGroup(path, f"/{PARENT}/{name}")


def join(group: ProcGroup, pid: int) -> None:
    write_cgroup_file(os.path.join(group.path, "cgroup.procs"), str(pid))


def remove(group: ProcGroup) -> None:
    """Remove the (empty) group; a busy or vanished group is left alone."""
    try:
        os.rmdir(group.path)
    except OSError:
        return

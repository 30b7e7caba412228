"""Is the cgroup of the pid in an OCI state the container's own? (pure)

The hook trusts nothing in the state it is handed: before numa-pin writes a cpuset it checks
that the process sits where the runtime puts the container, from the bundle's
``linux.cgroupsPath`` and the runtime's naming:

* systemd driver, ``slice:prefix:name``: the leaf is the unit ``prefix-name.scope`` (or
  ``name.scope`` without a prefix, or ``name`` itself when it is a ``.slice``), directly below
  ``slice`` when a slice is named (``-.slice`` is the root slice);
* cgroupfs driver, ``/a/b`` or ``a/b``: the process's path ends with those components (a
  relative path is below the runtime's own cgroup; a cgroup namespace may hide a prefix);
* no ``cgroupsPath``: the leaf carries the container id, bare or as a runtime names it
  (``runc-<id>.scope``, ``libpod-<id>``, ``crio-<id>``, ``cri-containerd-<id>.scope``, ...).

crun's ``container`` sub-cgroup below a systemd scope is allowed: the process's own path and
the enforcement path are both tried. A process in the root cgroup of the hierarchy is always
refused, so the hierarchy root's cpuset is never written.
"""

from __future__ import annotations

import re

from numa_pin.base.record import record
from numa_pin.enforcer.cgroups import CgroupRef, leaf_container_id
from numa_pin.errors import EnforcementError

_SYSTEMD_PATH = re.compile(r"^([^:/]*):([^:/]*):([^:/]+)$")


@record
class ContainerCgroup:
    """What the bundle says about the container's cgroup."""

    container_id: str
    cgroups_path: str | None = None

    def describe(self) -> str:
        if self.cgroups_path:
            return f"linux.cgroupsPath {self.cgroups_path!r}"
        return f"a leaf cgroup named after container {self.container_id}"


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _systemd_leaves(prefix: str, name: str) -> tuple[str, ...]:
    if name.endswith(".slice"):
        return (name,)
    if prefix:
        return (f"{prefix}-{name}.scope",)
    return (f"{name}.scope", f"-{name}.scope")


def path_matches(path: str, container: ContainerCgroup) -> bool:
    """True when ``path`` (a cgroup path inside its hierarchy) can be ``container``'s cgroup."""
    parts = _parts(path)
    if not parts:
        return False
    wanted = (container.cgroups_path or "").strip()
    if not wanted:
        return leaf_container_id(path) == container.container_id
    systemd = _SYSTEMD_PATH.match(wanted)
    if systemd is not None:
        slice_, prefix, name = systemd.groups()
        if parts[-1] in _systemd_leaves(prefix, name) and (
            slice_ in ("", "-.slice") or (len(parts) >= 2 and parts[-2] == slice_)
        ):
            return True
    want = _parts(wanted)
    return bool(want) and parts[-len(want):] == want


def check_container_cgroup(ref: CgroupRef, container: ContainerCgroup | None, pid: int, source: str) -> None:
    """Refuse a pid in the hierarchy root, or (when ``container`` is given) in a cgroup that is
    not the container's.

    Raises:
        EnforcementError: naming ``source`` (the pid's ``cgroup`` file), the cgroup found and
            the one expected.
    """
    if not _parts(ref.rel_path) or not _parts(ref.pid_rel_path or ref.rel_path):
        raise EnforcementError(
            f"pid {pid} is in the root cgroup; numa-pin never writes the root of a hierarchy", path=source,
        )
    if container is None:
        return
    paths = {ref.rel_path, ref.pid_rel_path or ref.rel_path}
    if not any(path_matches(p, container) for p in paths):
        raise EnforcementError(
            f"pid {pid} is in cgroup {ref.pid_rel_path or ref.rel_path}, which is not container "
            f"{container.container_id}'s ({container.describe()}); refusing to pin another process",
            path=source,
        )


__all__ = ["ContainerCgroup", "check_container_cgroup", "path_matches"]

"""Where a process sits: ``<proc_root>/<pid>/cgroup``, read, parsed and placed in a hierarchy.

:mod:`numa_pin.enforcer.cgroups` turns the path found here into a directory under the cgroup
root; this module only reads the one ``/proc`` file and handles paths as text.
"""

from __future__ import annotations

import os

from numa_pin.base.record import record
from numa_pin.errors import EnforcementError


def path_parts(rel: str) -> list[str]:
    """The components of a cgroup path, without empty and ``.`` parts (pure)."""
    return [p for p in rel.split("/") if p not in ("", ".")]


@record
class ProcCgroupLine:
    """One line of ``/proc/<pid>/cgroup``: ``hierarchy-id:controllers:path``."""

    hierarchy_id: int
    controllers: frozenset[str]
    path: str


def parse_proc_cgroup(text: str, source: str = "cgroup") -> tuple[ProcCgroupLine, ...]:
    """Parse ``/proc/<pid>/cgroup`` text (pure).

    Raises EnforcementError naming ``source`` for an empty file or a malformed line.
    """
    out: list[ProcCgroupLine] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        hid, sep1, rest = line.partition(":")
        ctrls, sep2, path = rest.partition(":")
        if not (sep1 and sep2) or not hid.isdigit() or not path.startswith("/"):
            raise EnforcementError(f"line {lineno} is not 'id:controllers:/path': {line!r}",
                                   path=source)
        names = frozenset(c for c in ctrls.split(",") if c)
        out.append(ProcCgroupLine(int(hid), names, path))
    if not out:
        raise EnforcementError("empty (has the process exited?)", path=source)
    return tuple(out)


def read_proc_cgroup(
    pid: int | str, proc_root: str | os.PathLike[str]
) -> tuple[ProcCgroupLine, ...]:
    """Read and parse ``<proc_root>/<pid>/cgroup``; EnforcementError names the file."""
    path = os.path.join(os.fspath(proc_root), str(pid), "cgroup")
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise EnforcementError(f"no such process {pid}", path=path) from None
    except OSError as exc:
        raise EnforcementError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    return parse_proc_cgroup(text, path)


def select_line(lines: tuple[ProcCgroupLine, ...], version: int, controller: str,
                 source: str) -> str:
    if version == 2:
        for ln in lines:
            if ln.hierarchy_id == 0 and not ln.controllers:
                return ln.path
        raise EnforcementError("no cgroup v2 line ('0::/path')", path=source)
    for ln in lines:
        if controller in ln.controllers:
            return ln.path
    raise EnforcementError(f"no line for the v1 {controller} controller", path=source)


def strip_mount_root(path: str, mount_root: str) -> str:
    root = "/" + "/".join(path_parts(mount_root))
    if root == "/":
        return path
    if path == root:
        return "/"
    if path.startswith(root + "/"):
        return path[len(root):]
    return path


def path_below(top: str, leaf: str, limit: int = 8) -> list[str]:
    """The hierarchy paths from just below ``top`` down to ``leaf`` (inclusive), top down (pure):
    ``/a.scope`` and ``/a.scope/container/x`` give ``["/a.scope/container", "/a.scope/container/x"]``.
    Empty when ``leaf`` is not below ``top``, or more than ``limit`` levels below it."""
    upper, lower = path_parts(top), path_parts(leaf)
    if lower[:len(upper)] != upper or len(lower) - len(upper) > limit:
        return []
    return ["/" + "/".join(lower[:n]) for n in range(len(upper) + 1, len(lower) + 1)]


def process_cgroup(pid: int | str, proc_root: str | os.PathLike[str], version: int, controller: str,
                   mount_root: str) -> str:
    """The cgroup of ``pid`` on the hierarchy of ``version`` (v1: the one carrying ``controller``),
    relative to that hierarchy's mount (``mount_root`` stripped).

    Raises EnforcementError naming ``<proc_root>/<pid>/cgroup`` when the process is gone, the
    file is garbage or it has no line for that hierarchy.
    """
    source = os.path.join(os.fspath(proc_root), str(pid), "cgroup")
    raw = select_line(read_proc_cgroup(pid, proc_root), version, controller, source)
    return strip_mount_root(raw, mount_root)


__all__ = [
    "ProcCgroupLine",
    "parse_proc_cgroup",
    "path_below",
    "path_parts",
    "process_cgroup",
    "read_proc_cgroup",
    "select_line",
    "strip_mount_root",
]

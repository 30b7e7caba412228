"""Which network namespace a process is in, and which process is still in a given one.

The containers of a Kubernetes pod (and of a podman pod with an infra container) share the
sandbox's network namespace, so a VF moved there once serves them all. The namespace is named
by its identity, ``<st_dev>:<st_ino>`` of ``<proc_root>/<pid>/ns/net``, which stays the same
for every process in it and is never the identity of another live namespace. Once the process
that moved a VF is gone, :func:`find_netns_member` finds another process still in that
namespace (the sandbox's pause process, another container) through which the VF can be pulled
back; None means no process is left in it.

Standard library only; every path is under the ``proc_root`` passed in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from numa_pin.errors import EnforcementError


def netns_path(pid: int | str, proc_root: str | os.PathLike[str]) -> str:
    """``<proc_root>/<pid>/ns/net``."""
    return os.path.join(os.fspath(proc_root), str(pid), "ns", "net")


def netns_id(pid: int | str, proc_root: str | os.PathLike[str]) -> str:
    """The identity of the network namespace of ``pid``: ``"<st_dev>:<st_ino>"``.

    Raises EnforcementError naming the file when the process is gone or the file unreadable.
    """
    path = netns_path(pid, proc_root)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise EnforcementError(
            f"cannot read the network namespace of pid {pid}: {exc.strerror or exc}", path=path
        ) from exc
    return f"{st.st_dev}:{st.st_ino}"


def _same(pid: int | str, ident: str, proc_root: str | os.PathLike[str]) -> bool:
    try:
        return netns_id(pid, proc_root) == ident
    except EnforcementError:
        return False


def find_netns_member(
    ident: str, proc_root: str | os.PathLike[str], prefer: Iterable[int] = ()
) -> int | None:
    """A process in the network namespace ``ident``: the first of ``prefer`` that is, else any
    process under ``proc_root`` (lowest pid first), else None."""
    for pid in prefer:
        if _same(pid, ident, proc_root):
            return pid
    try:
        entries = [e.name for e in os.scandir(os.fspath(proc_root)) if e.name.isdigit()]
    except OSError:
        return None
    for name in sorted(entries, key=int):
        if _same(name, ident, proc_root):
            return int(name)
    return None


__all__ = ["find_netns_member", "netns_id", "netns_path"]

"""Find a process's cgroup on cgroup v1, v2 and hybrid hosts, under explicit roots.

Two inputs decide where a container's cpuset lives:

* ``<proc_root>/<pid>/mountinfo`` says how cgroups are mounted
  (:func:`numa_pin.enforcer.mounts.detect_layout`):
  ``"v2"`` (one cgroup2 hierarchy at the cgroup root), ``"v1"`` (one cgroup mount per
  controller group) or ``"hybrid"`` (v1 controllers plus an empty-ish cgroup2 at
  ``.../unified``, systemd's old default).
* ``<proc_root>/<pid>/cgroup`` says where the process sits (:func:`find_cgroup`; the file
  is read in :mod:`numa_pin.enforcer.proccgroup`). The hook runs in the host cgroup
  namespace, so the paths are host-absolute. crun's systemd ``container`` sub-cgroup is
  stepped out of so the cpuset lands on the scope.

Every directory handed back is built by :func:`safe_join`, which refuses ``..``, and
symlinks that leave the cgroup root (:class:`~numa_pin.errors.CgroupEscapeError`).
:func:`read_cgroup_file` and :func:`write_cgroup_file` are the only file access the
cgroup writers use; tests replace them to observe the order of writes. The one exception is
:func:`write_cgroup_handle`: the agent's spare holds the shared containers' ``cpuset.cpus``
open (:func:`open_handles`), and a write through one that fails goes by path after all.
"""

from __future__ import annotations

import os
import stat

from numa_pin.base.record import record
from numa_pin.enforcer.mounts import CgroupLayout
from numa_pin.enforcer.proccgroup import path_parts, process_cgroup
from numa_pin.errors import CgroupEscapeError, EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

DRIVER_SYSTEMD = "systemd"
DRIVER_CGROUPFS = "cgroupfs"

#: sub-cgroups a runtime puts the container init in, below the unit it created
#: (crun, systemd driver, ``run.oci.systemd.subgroup`` default)
RUNTIME_SUBGROUPS: tuple[str, ...] = ("container",)

#: prefixes runtimes give the leaf cgroup of a container (scope name or cgroupfs dir)
_LEAF_PREFIXES = ("cri-containerd-", "crio-", "docker-", "libpod-", "runc-", "podman-")


# ---- values --------------------------------------------------------------------------
@record
class CgroupRef:
    """Where a process's cpuset is enforced.

    ``rel_path`` is the cgroup path inside its hierarchy (``/system.slice/x.scope``);
    ``cpuset_dir`` the directory holding ``cpuset.cpus``. ``pid_rel_path`` is where the
    process itself sits, which differs from ``rel_path`` when a runtime sub-cgroup was
    stepped out of.
    """

    version: int
    rel_path: str
    cpuset_dir: str
    pid_rel_path: str = ""
    driver: str = DRIVER_CGROUPFS

    @property
    def hierarchy_root(self) -> str:
        """The directory of the hierarchy's root cgroup (``cpuset_dir`` minus ``rel_path``)."""
        parts = path_parts(self.rel_path)
        path = self.cpuset_dir
        for _ in parts:
            path = os.path.dirname(path)
        return path

    @property
    def container_id(self) -> str | None:
        """The container id the leaf cgroup name carries, when it follows a runtime's
        naming (``runc-<id>.scope``, ``libpod-<id>``, ``<id>``); best effort."""
        return leaf_container_id(self.rel_path)


def leaf_container_id(rel: str) -> str | None:
    """The container id the leaf of cgroup path ``rel`` carries (see :attr:`CgroupRef.container_id`)."""
    parts = path_parts(rel)
    if not parts:
        return None
    leaf = parts[-1]
    if leaf.endswith(".scope"):
        leaf = leaf[: -len(".scope")]
    elif leaf.endswith(".slice"):
        return None
    for prefix in _LEAF_PREFIXES:
        if leaf.startswith(prefix):
            return leaf[len(prefix):] or None
    return leaf


# ---- paths ---------------------------------------------------------------------------
def realpath(path: str | os.PathLike[str], real_dirs: dict[str, str] | None = None) -> str:
    """``os.path.realpath(path)``; with ``real_dirs`` (a memo of real paths for one batch of
    checks) a parent directory is resolved once per batch, and each path once, with one ``lstat``
    (a symlink there is resolved in full). A node's containers share a few parent
    cgroups, so checking hundreds of them no longer resolves every component of every path."""
    path = os.fspath(path)
    if real_dirs is None:
        return os.path.realpath(path)
    known = real_dirs.get(path)
    if known is not None:
        return known
    head, leaf = os.path.split(path)
    if not head or leaf in ("", ".", ".."):
        real = os.path.realpath(path)
    else:
        real_head = real_dirs.get(head)
        if real_head is None:
            real_head = real_dirs[head] = os.path.realpath(head)
        try:
            link = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            link = False  # a missing leaf resolves lexically, as realpath does
        real = os.path.realpath(path) if link else os.path.join(real_head, leaf)
    real_dirs[path] = real
    return real


def _join_under(root: str | os.PathLike[str], rel: str, error: type[EnforcementError],
                real_dirs: dict[str, str] | None = None) -> str:
    root_s = os.fspath(root)
    if "\x00" in rel:
        raise error(f"path {rel!r} contains a NUL byte", path=root_s)
    parts = path_parts(rel)
    if ".." in parts:
        raise error(f"path {rel!r} contains '..' and would leave the root", path=root_s)
    joined = os.path.join(root_s, *parts)
    real_root = realpath(root_s, real_dirs)
    real = realpath(joined, real_dirs)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise error(f"path {rel!r} resolves to {real}, outside {real_root}", path=root_s)
    return joined


def safe_join(root: str | os.PathLike[str], rel: str, real_dirs: dict[str, str] | None = None) -> str:
    """``root`` joined with the cgroup path ``rel``, guaranteed to stay below ``root``.

    ``rel`` is a hierarchy path: a leading ``/`` anchors it at ``root`` (it never
    replaces ``root`` the way :func:`os.path.join` lets ``"/etc"`` do). Raises
    :class:`~numa_pin.errors.CgroupEscapeError` when ``rel`` has a ``..`` component or a
    NUL byte, or when symlinks make ``realpath`` of the result leave ``realpath(root)``.
    The returned path is the lexical join (symlinks not resolved). ``real_dirs``: see :func:`realpath`.
    """
    return _join_under(root, rel, CgroupEscapeError, real_dirs)


def join_under(root: str | os.PathLike[str], rel: str) -> str:
    """Like :func:`safe_join` for non-cgroup trees (a container rootfs).

    Raises :class:`~numa_pin.errors.EnforcementError` on the same escapes.
    """
    return _join_under(root, rel, EnforcementError)


def check_under(root: str | os.PathLike[str], path: str | os.PathLike[str],
                real_dirs: dict[str, str] | None = None) -> None:
    """Raise CgroupEscapeError unless ``realpath(path)`` is ``realpath(root)`` or below it
    (``real_dirs``: see :func:`realpath`)."""
    real_root = realpath(root, real_dirs)
    real = realpath(path, real_dirs)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise CgroupEscapeError(f"resolves to {real}, outside the cgroup root {real_root}",
                                path=os.fspath(path))


# ---- file access (the seam tests replace) --------------------------------------------
def read_cgroup_file(path: str) -> str:
    """The text of a cgroup file, surrounding whitespace removed.

    Raises EnforcementError naming ``path`` when it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # no file object: a busy node reads hundreds
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise EnforcementError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    return b"".join(chunks).decode("ascii", "replace").strip()


def write_cgroup_file(path: str, text: str) -> None:
    """Write ``text`` (plus a newline) to an existing cgroup file in one ``write(2)``.

    The file is never created (a missing file means a missing cgroup or controller).
    Raises EnforcementError naming ``path`` and the value when the kernel refuses it.
    """
    data = (text + "\n").encode("ascii")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError as exc:
        raise EnforcementError(f"cannot open for writing: {exc.strerror or exc}",
                               path=path) from exc
    try:
        os.write(fd, data)
    except OSError as exc:
        raise EnforcementError(f"writing {text!r} failed: {exc.strerror or exc}",
                               path=path) from exc
    finally:
        os.close(fd)


#: descriptors :func:`open_handles` leaves free for whatever else the process opens
HANDLE_HEADROOM = 256


def open_handles(paths: Iterable[str], headroom: int = HANDLE_HEADROOM) -> dict[str, tuple[int, bool]]:
    """Each of ``paths`` (cgroup files, already checked to lie under the cgroup root) held open for
    writing, by path: ``(descriptor, plain)``, as many as the descriptor limit allows with
    ``headroom`` left free (the soft limit is first raised towards the hard one). ``plain``: a
    file that keeps what is written to it (a test tree's), not a kernel attribute (cgroupfs
    reports a size of 0 for a file that reads back text). A path that cannot be opened is left
    out; it is then written by path (:func:`write_cgroup_file`). Close them with
    :func:`close_handles`."""
    import resource  # only the agent's spare holds handles: no hook start pays for the import

    wanted = list(paths)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = len(wanted) + 2 * headroom
    if soft != resource.RLIM_INFINITY and soft < need and hard != soft:
        raised = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass  # not allowed: fewer handles
    highest = None if soft == resource.RLIM_INFINITY else soft - headroom
    out: dict[str, tuple[int, bool]] = {}
    for path in wanted:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone, or not writable: its admission writes by path and says why
        if highest is not None and fd >= highest:
            os.close(fd)
            break
        try:
            plain = os.fstat(fd).st_size != 0 or not os.pread(fd, 1, 0)
        except OSError:
            os.close(fd)
            continue
        out[path] = (fd, plain)
    return out


def write_cgroup_handle(fd: int, data: bytes, plain: bool) -> bool:
    """Write ``data`` (a value and its newline) through a descriptor from :func:`open_handles`, at
    offset 0. A ``plain`` file then has whatever followed cut off (where it was longer) and must
    still be linked. False, and nothing raised, when the write fails or the file is gone: the
    cgroup was removed (perhaps made again since; the kernel refuses the write with ENODEV) or the
    kernel refused the value. The caller then writes by path, which names what is wrong."""
    try:
        os.pwrite(fd, data, 0)
        if plain:
            st = os.fstat(fd)
            if st.st_size > len(data):
                os.ftruncate(fd, len(data))
            return st.st_nlink > 0
    except OSError:
        return False
    return True


def close_handles(handles: Mapping[str, tuple[int, bool]] | None) -> None:
    """Close what :func:`open_handles` opened (quietly: a handle is only ever written through)."""
    for fd, _ in (handles or {}).values():
        try:
            os.close(fd)
        except OSError:
            pass


def _driver_of(rel: str) -> str:
    parts = path_parts(rel)
    if any(p.endswith((".slice", ".scope")) for p in parts):
        return DRIVER_SYSTEMD
    return DRIVER_CGROUPFS


def enforcement_path(rel: str, version: int, subgroups: tuple[str, ...] = RUNTIME_SUBGROUPS) -> str:
    """The cgroup to write for a process in ``rel`` (pure).

    On cgroup v2, a leaf named like crun's sub-cgroup (``container``) directly below a
    systemd ``*.scope`` is replaced by the scope: cpusets are hierarchical there, and the
    scope is what systemd and the runtime manage. Anything else is returned unchanged.
    """
    parts = path_parts(rel)
    if (
        version == 2
        and len(parts) >= 2
        and parts[-1] in subgroups
        and parts[-2].endswith(".scope")
    ):
        parts = parts[:-1]
    return "/" + "/".join(parts)


def find_cgroup(
    pid: int | str,
    proc_root: str | os.PathLike[str],
    cgroup_root: str | os.PathLike[str],
    layout: CgroupLayout,
    *,
    subgroups: tuple[str, ...] = RUNTIME_SUBGROUPS,
    real_dirs: dict[str, str] | None = None,
) -> CgroupRef:
    """Where to enforce the cpuset of process ``pid`` (``real_dirs``: see :func:`realpath`; a
    batch of processes, an NRI plugin adopting a busy node's containers, resolves each parent once).

    v2: the ``0::/path`` line; v1 and hybrid: the line whose controllers include
    ``cpuset``. The directory is ``cgroup_root`` + hierarchy sub-directory (``cpuset``
    on v1, ``""`` on v2, ``unified`` on a hybrid host without a v1 cpuset) + path,
    built with :func:`safe_join`.

    Raises EnforcementError naming ``<proc_root>/<pid>/cgroup`` when the process is gone
    or the file is garbage, or naming the mountinfo when no hierarchy carries cpuset;
    CgroupEscapeError when the path would leave ``cgroup_root``.
    """
    where = layout.hierarchy_subdir("cpuset")
    if where is None:
        raise EnforcementError("no cgroup hierarchy carries the cpuset controller",
                               path=layout.source or None)
    version, subdir = where
    pid_rel = process_cgroup(pid, proc_root, version, "cpuset", layout.mount_root(version, "cpuset"))
    rel = enforcement_path(pid_rel, version, subgroups)
    base = safe_join(cgroup_root, subdir, real_dirs) if subdir else os.fspath(cgroup_root)
    cpuset_dir = safe_join(base, rel, real_dirs)
    check_under(cgroup_root, cpuset_dir, real_dirs)
    return CgroupRef(version, rel, cpuset_dir, pid_rel, _driver_of(rel))


def child_dirs(directory: str) -> list[str]:
    """The child cgroups of ``directory`` (its sub-directories, symlinks not followed), sorted;
    none when it is gone or unreadable (a cgroup removed while it is walked)."""
    try:
        with os.scandir(directory) as entries:
            return sorted(e.path for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def hierarchy_dir(rel_path: str, cgroup_root: str | os.PathLike[str], subdir: str,
                  real_dirs: dict[str, str] | None = None) -> str:
    """The directory of the cgroup at hierarchy path ``rel_path`` in the hierarchy mounted at
    ``<cgroup_root>/<subdir>`` (``subdir`` empty: at the cgroup root itself, cgroup v2), the one
    place a recorded cgroup becomes a directory. Raises CgroupEscapeError when it leaves
    ``cgroup_root`` (``..``, or symlinks). ``real_dirs``: see :func:`realpath` (a batch of
    paths checked with one ``lstat`` each)."""
    base = safe_join(cgroup_root, subdir, real_dirs) if subdir else os.fspath(cgroup_root)
    path = safe_join(base, rel_path, real_dirs)
    check_under(cgroup_root, path, real_dirs)
    return path


def ref_from_path(
    rel_path: str,
    cgroup_root: str | os.PathLike[str],
    layout: CgroupLayout,
    real_dirs: dict[str, str] | None = None,
) -> CgroupRef:
    """The CgroupRef of a cgroup known by its hierarchy path (one recorded in a ledger).

    No process is consulted and no sub-cgroup is stepped out of. Raises EnforcementError
    when no hierarchy carries cpuset, CgroupEscapeError when the path leaves
    ``cgroup_root``. ``real_dirs``: see :func:`realpath`.
    """
    return refs_from_paths([rel_path], cgroup_root, layout, real_dirs)[0]


def refs_from_paths(
    rel_paths: Iterable[str],
    cgroup_root: str | os.PathLike[str],
    layout: CgroupLayout,
    real_dirs: dict[str, str] | None = None,
) -> list[CgroupRef]:
    """:func:`ref_from_path` of each path, the hierarchy's directory found and checked once
    (a node's shared containers, hundreds of them, on every exclusive admission)."""
    where = layout.hierarchy_subdir("cpuset")
    if where is None:
        raise EnforcementError("no cgroup hierarchy carries the cpuset controller",
                               path=layout.source or None)
    version, subdir = where
    real_dirs = {} if real_dirs is None else real_dirs
    refs = []
    for rel_path in rel_paths:
        cpuset_dir = hierarchy_dir(rel_path, cgroup_root, subdir, real_dirs)
        rel = "/" + "/".join(path_parts(rel_path))
        refs.append(CgroupRef(version, rel, cpuset_dir, rel, _driver_of(rel)))
    return refs


def find_v1_controller_dir(
    pid: int | str,
    proc_root: str | os.PathLike[str],
    cgroup_root: str | os.PathLike[str],
    layout: CgroupLayout,
    controller: str,
) -> str | None:
    """The v1 directory of ``pid`` for ``controller`` (``devices``), or None when that
    controller is not on a v1 hierarchy (v2 hosts).

    Raises as :func:`find_cgroup` does.
    """
    mount = layout.v1_mount(controller)
    if mount is None:
        return None
    rel = process_cgroup(pid, proc_root, 1, controller, mount.root)
    base = safe_join(cgroup_root, os.path.basename(mount.mount_point.rstrip("/")))
    return safe_join(base, rel)


__all__ = [
    "DRIVER_CGROUPFS",
    "DRIVER_SYSTEMD",
    "HANDLE_HEADROOM",
    "RUNTIME_SUBGROUPS",
    "CgroupRef",
    "check_under",
    "close_handles",
    "enforcement_path",
    "find_cgroup",
    "find_v1_controller_dir",
    "hierarchy_dir",
    "join_under",
    "leaf_container_id",
    "open_handles",
    "read_cgroup_file",
    "ref_from_path",
    "safe_join",
    "write_cgroup_file",
    "write_cgroup_handle",
]

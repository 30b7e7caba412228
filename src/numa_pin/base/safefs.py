"""Directories and files in places a non-root user might write: checked, never followed blindly.

numa-pin runs as root from an OCI hook, and keeps files in its state directory (the ledger,
its lock, reason files), its cache directory (topology and config caches) and its socket
directory (the agent's socket and lock). If one of those directories, or a directory above
it, can be written by another user, that user can plant a symlink or a FIFO, or forge the
ledger (its checksum is unkeyed: a key would have to be stored where the same user could read
it). The protection is the directory's owner and mode, so every such directory is checked:

* it must be owned by root or by the current user;
* it must not be writable by group or others, unless the sticky bit is set (``/tmp``);
* the same holds for every directory above it (otherwise it could be renamed away).

A failed check raises :class:`~numa_pin.errors.UnsafePathError` naming the directory, which
entry points print as one line. Files inside are created with :func:`create_private` (``O_EXCL
| O_NOFOLLOW``, mode ``0600``) and opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import stat
import time

from numa_pin.base.boundedio import open_checked
from numa_pin.errors import UnsafePathError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Callable

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def check_owner_and_mode(st: os.stat_result, path: str) -> None:
    """Raise :class:`UnsafePathError` when ``st`` (of ``path``) is owned by another non-root
    user, or is writable by group or others without the sticky bit."""
    uid = os.geteuid()
    if st.st_uid not in (0, uid):
        raise UnsafePathError(f"owned by uid {st.st_uid}, neither root nor this user (uid {uid}); "
                              "numa-pin's state, cache and socket directories must be root's (mode 0700)", path=path)
    if st.st_mode & _WRITABLE_BY_OTHERS and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        raise UnsafePathError(f"writable by others (mode {stat.S_IMODE(st.st_mode):04o}: group or world) without "
                              "the sticky bit; make it 0700 or 0755", path=path)


def check_dir(path: str | os.PathLike[str], *, follow: bool = True) -> None:
    """Check the directory ``path`` and every directory above it (see the module docstring).

    With ``follow`` False, ``path`` itself must not be a symbolic link.

    Raises:
        UnsafePathError: a check failed; ``path`` is not a directory.
        OSError: ``path`` or a parent cannot be examined (FileNotFoundError when missing).
    """
    path = os.fspath(path)
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("is a symbolic link; refusing to follow it", path=path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("is not a directory", path=path)
    check_owner_and_mode(st, path)
    current = os.path.realpath(path)
    while current != os.path.dirname(current):
        current = os.path.dirname(current)
        check_owner_and_mode(os.stat(current), current)


def ensure_dir(path: str | os.PathLike[str], mode: int = 0o700, *, follow: bool = True) -> None:
    """Create ``path`` (and missing parents) with ``mode`` unless it exists, then :func:`check_dir`.

    Raises:
        UnsafePathError: as :func:`check_dir`.
        OSError: the directory cannot be created or examined.
    """
    path = os.fspath(path)
    try:
        os.makedirs(path, mode=mode)
    except FileExistsError:
        pass
    check_dir(path, follow=follow)


def check_own_file(fd: int, path: str) -> os.stat_result:
    """``fstat`` of an opened ``path``: a regular file with one link, owned by this user and not
    writable by group or others (a hard link planted to another file fails the link count).

    Raises:
        UnsafePathError: any of these does not hold.
        OSError: from ``fstat``.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError("is not a regular file", path=path)
    if st.st_nlink != 1:
        raise UnsafePathError(f"has {st.st_nlink} hard links; refusing to use it", path=path)
    if st.st_uid != os.geteuid():
        raise UnsafePathError(f"owned by uid {st.st_uid}, not this user (uid {os.geteuid()})", path=path)
    check_owner_and_mode(st, path)
    return st


def open_private(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode)`` checked with
    :func:`check_own_file` (the descriptor is made blocking again).

    Raises:
        UnsafePathError: as :func:`check_own_file`.
        OSError: the open failed (``ELOOP`` for a symlink).
    """
    return open_checked(path, flags | os.O_NOFOLLOW, lambda fd: check_own_file(fd, path), mode)[0]


def create_private(directory: str, prefix: str, suffix: str = ".tmp", *, mode: int = 0o600) -> tuple[int, str]:
    """A new file ``<directory>/<prefix><random><suffix>``, created exclusively (``O_EXCL |
    O_NOFOLLOW``) with ``mode`` (``0600`` unless told) whatever the umask. Returns (descriptor,
    path).

    Raises:
        OSError: it cannot be created.
    """
    create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    while True:
        path = os.path.join(directory, f"{prefix}{os.getpid()}.{os.urandom(6).hex()}{suffix}")
        try:
            fd, _ = open_checked(path, create, lambda fd: os.fchmod(fd, mode), 0o600)
        except FileExistsError:
            continue
        return fd, path


def write_all(fd: int, payload: bytes) -> None:
    """Write all of ``payload`` to ``fd``, looping over partial writes. Raises OSError."""
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(path: str) -> None:
    """Make a rename in directory ``path`` durable. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flock_within(fd: int, timeout: float, *, poll: tuple[float, float],
                 notice: tuple[float, Callable[[], None]] | None = None) -> bool:
    """Take the exclusive ``flock`` of ``fd`` (a private lock file: the ledger's, the counters'),
    trying until ``timeout`` seconds have passed: True once held, False when time ran out. Sleeps
    ``poll[0]`` seconds between tries at first, doubling up to ``poll[1]``, never past the
    deadline. ``notice`` is ``(after, call)``: ``call()`` runs once when the wait has lasted
    ``after`` seconds (say so while it lasts). Raises OSError from ``flock`` (not EWOULDBLOCK).
    """
    import fcntl

    start = time.monotonic()
    deadline = start + timeout
    delay, longest = poll
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if notice is not None and now - start >= notice[0]:
            notice[1]()
            notice = None
        left = deadline - now
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, longest)


class NotDurable(OSError):
    """:func:`replace_private` put the new file in place, but its directory could not be synced:
    a crash may still bring the old file back (the ledger then puts its previous state back)."""


def replace_private(directory: str, target: str, payload: bytes, *, prefix: str | None = None,
                    suffix: str = ".tmp", mode: int = 0o600, durable: bool = False) -> None:
    """Put ``payload`` at ``target`` atomically, the one way numa-pin replaces a file: a
    :func:`create_private` file in ``directory`` (exclusive, never through a symlink, ``mode``;
    named ``<prefix><random><suffix>``, the prefix by default the target's name and a dot),
    written whole, renamed over ``target``; removed again when anything fails. ``durable``
    also fsyncs the file before the rename and the directory after it, so a crash at any
    instant leaves the old or the new file (the ledger, the NRT object; caches and reason
    files skip it: they are rebuilt or only informative).

    Raises:
        NotDurable: ``durable`` and the rename was done, but the directory's fsync failed.
        OSError: it cannot be created, written, synced or renamed (``target`` is unchanged).
    """
    fd, tmp = create_private(directory, os.path.basename(target) + "." if prefix is None else prefix, suffix,
                             mode=mode)
    try:
        try:
            write_all(fd, payload)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        try:
            fsync_dir(directory)
        except OSError as exc:
            raise NotDurable(exc.errno, exc.strerror or str(exc), directory) from exc


__all__ = ["NotDurable", "check_dir", "check_own_file", "check_owner_and_mode", "create_private", "ensure_dir",
           "flock_within", "fsync_dir", "open_private", "replace_private", "write_all"]

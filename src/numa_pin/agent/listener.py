"""Where the warm agent listens: its own socket (a lock, a stale socket cleared, mode 0600 in a
private directory) or the one systemd passed by socket activation."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Mapping

from numa_pin.agent.client import CONNECT_TIMEOUT_S
from numa_pin.base.safefs import ensure_dir, open_private
from numa_pin.base.text import quote
from numa_pin.errors import AgentError

#: the first file descriptor systemd passes (``sd_listen_fds(3)``)
SD_LISTEN_FDS_START = 3


def systemd_listener(environ: Mapping[str, str], pid: int | None = None) -> socket.socket | None:
    """The listening Unix socket systemd passed by socket activation, or None without one.

    systemd sets ``LISTEN_PID`` to the service's pid and ``LISTEN_FDS`` to the number of
    sockets, the first on fd 3. Variables meant for another process (``LISTEN_PID`` is not
    ``pid``, default this process) are ignored. The socket is set close-on-exec, so the
    forked admissions and anything they exec do not keep it.

    Raises:
        AgentError: ``LISTEN_FDS``/``LISTEN_PID`` are not numbers, more than one socket was
            passed, or fd 3 is not a listening ``AF_UNIX`` stream socket (fix the
            ``.socket`` unit: ``ListenStream=`` with a path, one per unit).
    """
    fds, listen_pid = environ.get("LISTEN_FDS"), environ.get("LISTEN_PID")
    if not fds or not listen_pid:
        return None
    try:
        count, owner = int(fds), int(listen_pid)
    except ValueError as exc:
        raise AgentError(f"LISTEN_FDS={quote(fds)} LISTEN_PID={quote(listen_pid)}: not numbers") from exc
    if owner != (os.getpid() if pid is None else pid) or count == 0:
        return None
    if count != 1:
        raise AgentError(f"LISTEN_FDS={count}: systemd passed {count} sockets, numa-pin serve takes one")
    try:
        listener = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise AgentError(f"fd {SD_LISTEN_FDS_START} from systemd (LISTEN_FDS=1): not a socket: {exc.strerror}",
                         errno=exc.errno) from exc
    accepting = listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM or not accepting:
        listener.detach()
        raise AgentError(f"fd {SD_LISTEN_FDS_START} from systemd is not a listening Unix stream socket "
                         "(the .socket unit needs ListenStream=/path)")
    listener.set_inheritable(False)
    return listener


def take_lock(path: str) -> int:
    """Take ``<path>.lock``, the one-server-per-socket lock, and return its fd.

    Creates a missing parent directory with mode 0700; an existing one is used as it is, but
    one that others may write to without the sticky bit, or that another non-root user owns, is
    refused (they could swap the socket), and so is ``<path>.lock`` when it is a symlink or not
    this user's private file.

    Raises:
        AgentError: another ``numa-pin serve`` holds the lock, or an OS error.
        UnsafePathError: the directory (or one above it) or the lock file is unsafe.
    """
    parent = os.path.dirname(os.path.abspath(path))
    try:
        ensure_dir(parent, 0o700)  # UnsafePathError: others could swap the socket or plant the lock
    except OSError as exc:
        raise AgentError(f"{parent}: cannot create the agent socket directory: {exc.strerror}",
                         errno=exc.errno) from exc
    lock_path = path + ".lock"
    try:
        lock_fd = open_private(lock_path, os.O_RDWR | os.O_CREAT)  # never through a symlink
    except OSError as exc:
        raise AgentError(f"{lock_path}: cannot open: {exc.strerror}", errno=exc.errno) from exc
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(lock_fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise AgentError(f"{path}: another numa-pin serve is running (it holds {lock_path})",
                             errno=exc.errno) from exc
        raise AgentError(f"{lock_path}: cannot lock: {exc.strerror}", errno=exc.errno) from exc
    return lock_fd


def listen(path: str) -> socket.socket:
    """Clear a stale socket at ``path`` and listen there (mode 0600); the caller holds
    :func:`take_lock`.

    Raises:
        AgentError: another server answers on ``path``, the path is something other than a
            socket, or an OS error.
    """
    try:
        _clear_stale(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(path)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        listener.listen(128)
    except OSError as exc:
        raise AgentError(f"{path}: cannot listen: {exc.strerror or exc}", errno=exc.errno) from exc
    return listener


def listen_tcp(address: str) -> socket.socket:
    """A non-blocking TCP socket listening on ``address`` (``HOST:PORT``, ``[IPV6]:PORT``): the
    agent's opt-in metrics listener (the config's ``metrics_address``).

    Raises:
        AgentError: the address does not parse or resolve, or cannot be bound (in use, not ours).
    """
    from numa_pin.config.parse import split_address

    try:
        host, port = split_address(address)
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (ValueError, OSError) as exc:
        raise AgentError(f"metrics address {quote(address)}: {exc}") from exc
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(where)
        listener.listen(16)
        listener.setblocking(False)
    except OSError as exc:
        listener.close()
        raise AgentError(f"metrics address {quote(address)}: cannot listen: {exc.strerror or exc}",
                         errno=exc.errno) from exc
    return listener


def _clear_stale(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise AgentError(f"{path}: exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(CONNECT_TIMEOUT_S)
    try:
        probe.connect(path)
    except ConnectionRefusedError:  # nobody listens: a socket left by a killed server
        os.unlink(path)
        return
    except OSError as exc:
        raise AgentError(f"{path}: cannot tell whether a server answers there: {exc.strerror or exc}",
                         errno=exc.errno) from exc
    finally:
        probe.close()
    raise AgentError(f"{path}: another server answers on this socket")


__all__ = ["SD_LISTEN_FDS_START", "listen", "listen_tcp", "systemd_listener", "take_lock"]

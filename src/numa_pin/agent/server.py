"""The warm agent behind ``numa-pin serve``: hook admissions without the import cost.

An in-process hook spends almost all of its time importing numa-pin and the standard library
it needs. This server imports all of that once, listens on a Unix socket, and runs each hook in
a child of its own; the child runs :func:`numa_pin.hook.main.run` exactly as the hook would and
sends back the exit code and stderr. The parent never runs an admission, so no state carries
from one request to the next. Usually that child is the *spare*, forked and warmed before the
hook connected (:mod:`numa_pin.agent.spare`); when none is ready the parent accepts and forks.

Protocol (see :mod:`numa_pin.agent.protocol`): one framed JSON request, one
framed JSON reply, then the connection closes. A ``{"fallback": reason}`` reply tells the
hook to run in-process; the server sends it for a protocol or numa-pin version mismatch, a
peer in other namespaces, numa-pin sources that changed on disk since the server started,
an unusable working directory, and when too many children are running.

Security: the socket is ``0600`` in a directory the server creates ``0700``, and every peer
is checked with ``SO_PEERCRED``: only uid 0 and the server's own uid are served. A peer in a
different pid, mount, network or cgroup namespace is sent back to run in-process, because
the OCI state's pid and paths mean what they mean in the hook's namespaces.

Signals: SIGTERM and SIGINT close and unlink the socket (new hooks then run in-process),
wait up to :data:`DRAIN_S` for running admissions, and return 0. Children ignore SIGTERM,
SIGINT and SIGHUP, so a stop never interrupts an admission halfway.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Mapping
from typing import TextIO

from numa_pin import __version__, deadline
from numa_pin.agent import spare
from numa_pin.agent.client import CONNECT_TIMEOUT_S, NAMESPACES, namespace_mismatch
from numa_pin.agent.preload import changed_sources, preload, source_stamps
from numa_pin.agent.protocol import (
    ACCEPTED,
    KEEPALIVE,
    KEEPALIVE_S,
    MAX_REQUEST_BYTES,
    Request,
    decode_request,
    encode_fallback,
    encode_reply,
    peer_allowed,
    refusal,
)
from numa_pin.errors import AgentError
from numa_pin.record import record
from numa_pin.safefs import ensure_dir, open_private
from numa_pin.text import one_line, quote

#: admissions in flight at most; further connections are sent back to run in-process
MAX_CHILDREN = 64
#: a peer must send its whole request within this many seconds of being accepted (in all)
READ_TIMEOUT_S = 5.0
#: how long a stopping server waits for admissions in flight
DRAIN_S = 35.0
#: after a spare child died without taking a connection, the next one is forked this much later
SPARE_RETRY_S = 1.0
#: after a spare was taken, the next one is forked when that one has answered and exited (its
#: rehearsal would compete for the CPUs with the admission a hook waits for), or after this long
SERVING_WAIT_S = 0.5
_HEADER = struct.Struct("!I")
_UCRED = struct.Struct("3i")
_BLOCKED = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


@record
class Peer:
    """Who is on the other end of a connection (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int


# ---- protocol (pure) ---------------------------------------------------------------------


# ---- socket I/O ----------------------------------------------------------------------------


def peer_credentials(conn: socket.socket) -> Peer:
    """``SO_PEERCRED`` of a connected Unix socket. Raises OSError."""
    pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return Peer(pid, uid, gid)


def recv_frame(conn: socket.socket, limit: int, timeout_s: float | None = None) -> bytes:
    """One length-prefixed frame, all of it within ``timeout_s`` seconds (a total deadline, not
    one per ``recv``: a peer that drips a byte now and then is cut off all the same). Raises
    ValueError when it is cut short or over ``limit`` bytes, OSError (TimeoutError included)
    from the socket."""
    until = None if timeout_s is None else time.monotonic() + timeout_s
    (size,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size, until))  # HungUp: nothing came
    if size > limit:
        raise ValueError(f"frame of {size} bytes is over the {limit}-byte limit")
    return _recv_exact(conn, size, until)


class HungUp(ValueError):
    """The peer closed the connection before sending a byte."""


def _recv_exact(conn: socket.socket, size: int, until: float | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        if until is not None:
            left = until - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(buf)} of {size} bytes came in time")
            conn.settimeout(left)
        try:
            chunk = conn.recv(min(size - len(buf), 1 << 16))
        except TimeoutError:
            raise TimeoutError(f"{len(buf)} of {size} bytes came in time") from None
        if not chunk:
            raise (ValueError if buf else HungUp)(f"connection closed after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)


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


def open_socket(path: str) -> tuple[int, socket.socket]:
    """Take ``<path>.lock``, clear a stale socket and listen on ``path`` (mode 0600):
    :func:`take_lock`, then :func:`listen`. Returns (lock fd, listening socket)."""
    lock_fd = take_lock(path)
    try:
        return lock_fd, listen(path)
    except BaseException:
        os.close(lock_fd)
        raise


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


# ---- what the parent keeps -----------------------------------------------------------------


def append_log(path: str | None, record: Mapping[str, object]) -> None:
    """One JSON line to the ``--log`` file (O_APPEND, one write); OSError is reported, not raised."""
    if not path:
        return
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8", "backslashreplace")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        print(f"numa-pin serve: cannot write the log {path}: {exc.strerror}", file=sys.stderr, flush=True)


# ---- one request (in the forked child) -----------------------------------------------------


def run_request(request: Request) -> tuple[int, str]:
    """Run the hook for ``request`` in this process, as ``numa-pin-hook`` would
    (:func:`numa_pin.invoke.run`, given the request's arguments, variables, stdin and working
    directory): exit code and stderr. Changes no process global (environment, stderr, cwd).

    Raises OSError when the working directory is not a directory (nothing has run then)."""
    import traceback

    from numa_pin.invoke import HookRequest, run

    if not stat.S_ISDIR(os.stat(request.cwd).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), request.cwd)
    try:
        result = run(HookRequest(request.argv, dict(request.env), request.stdin, request.cwd))
    except BaseException:  # NUMA_PIN_DEBUG=1: run() re-raises; show what the interpreter would
        return 1, traceback.format_exc()
    return result.code, result.stderr_text()


def watch_client(conn: socket.socket, served: threading.Event, poll_ms: int = 100,
                 send_lock: threading.Lock | None = None) -> bool:
    """Until ``served`` is set, watch the hook's end of ``conn``; when the hook hangs up (the
    runtime killed it at its timeout, or it gave up on a stalled agent), cancel the running
    admission's deadline, so the child stops deciding and holds nothing for a container that
    will not start (or that the hook now admits in-process). With ``send_lock`` (taken around
    every write to ``conn``) it also sends a :data:`~numa_pin.agent.protocol.KEEPALIVE` byte
    every ``poll_ms``, which tells the hook that this child is alive. Returns whether the hook
    hung up."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLRDHUP)
    hung_up = False
    while not served.is_set():
        if poller.poll(poll_ms):
            hung_up = True
            break
        if send_lock is not None:
            with send_lock:
                if served.is_set():
                    break
                try:
                    conn.send(KEEPALIVE, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass  # the hook reads nothing until the reply: its buffer holds days of these
                except OSError:
                    hung_up = True
                    break
    if not hung_up:
        return False
    while not served.is_set():
        running = deadline.current()
        if running is not None:
            running.cancel("the hook that asked for it went away (killed at the runtime's hook timeout?)")
            return True
        served.wait(poll_ms / 1000)
    return True


class AgentServer:
    """The parent: accepts, checks the peer's uid, forks one child per connection, reaps, and
    stops on SIGTERM/SIGINT. Build it from :func:`open_socket`'s results, then :meth:`serve`."""

    def __init__(
        self,
        path: str,
        lock_fd: int,
        listener: socket.socket,
        *,
        log_path: str | None = None,
        proc_root: str = "/proc",
        stamps: Mapping[str, int] | None = None,
        max_children: int | None = None,
        owns_path: bool = True,
        idle_exit_s: float | None = None,
    ) -> None:
        self.path = path
        #: False for a socket systemd passed: systemd keeps listening on it after a stop
        self.owns_path = owns_path
        self.lock_fd = lock_fd
        self.listener = listener
        self.log_path = log_path
        self.proc_root = proc_root
        self.stamps = dict(stamps or {})
        self.max_children = MAX_CHILDREN if max_children is None else max_children
        self.children: set[int] = set()
        self.uid = os.geteuid()
        self.pid = os.getpid()
        self.stopping = False
        #: an agent started on demand: stops after this long without a hook, and as soon as
        #: its sources change on disk (the next hook starts the upgraded code)
        self.idle_exit_s = idle_exit_s
        self.last_active = time.monotonic()
        self._next_source_check = 0.0
        self._inode = os.stat(path).st_ino if owns_path else -1
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        #: a child forked and warmed before a hook connects (:mod:`numa_pin.agent.spare`)
        self.keep_spare = True  # False after a fork for a spare failed: accept and fork as before
        self.spare_pid: int | None = None
        self.spare_ready = False
        #: the last request a child reported: what the next spare rehearses (None: no hook yet)
        self.rehearsal: Mapping[str, object] | None = None
        self._next_spare_at = 0.0
        self._serving: int | None = None  # the last spare taken, while it serves
        self._notes_r, self._notes_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # children -> parent
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)  # closed by the parent: the spare leaves
        self._pending_notes = b""

    # ---- parent ------------------------------------------------------------------------------
    def serve(self) -> int:
        """Accept and fork until SIGTERM/SIGINT; then close, drain and return 0."""
        self.listener.setblocking(False)
        signal.set_wakeup_fd(self._wake_w)  # any handled signal wakes the select below
        signal.signal(signal.SIGCHLD, _ignore)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        try:
            while not self.stopping:
                timeout = self._keep_a_spare()
                # while a spare waits on the socket, the parent leaves the connections to it
                watched = [self._wake_r, self._notes_r] + ([] if self.spare_ready else [self.listener.fileno()])
                ready, _, _ = select.select(watched, [], [], timeout)
                if self._wake_r in ready:
                    _drain_fd(self._wake_r)
                if self._notes_r in ready:
                    self._read_notes()
                self.reap()
                if self.listener.fileno() in ready and not self.stopping:
                    self._accept()
                if self.retired():  # only a request run counts as activity, never a refusal
                    self.stopping = True
        finally:
            if os.getpid() == self.pid:
                signal.set_wakeup_fd(-1)
                self.close()
                self.drain()
        return 0

    def _keep_a_spare(self) -> float:
        """Fork a spare when none is alive and it is time; returns how long the loop may sleep."""
        if not self.keep_spare or self.spare_pid is not None or len(self.children) >= self.max_children:
            return 5.0
        wait = self._next_spare_at - time.monotonic()
        if wait > 0:
            return min(wait, 5.0)
        self._fork_spare()
        return 5.0

    def _fork_spare(self) -> None:
        """Fork the next spare child: it rehearses, says ``R``, then accepts one connection."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
            self.keep_spare = False  # no memory for one more process
            return
        if pid == 0:
            status = 1
            try:
                self._spare()
                status = 0
            finally:
                os._exit(status)
        self.children.add(pid)
        self.spare_pid, self.spare_ready = pid, False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)

    def _rehearse_again(self) -> None:
        """In an idle spare: rehearse once more (the parent accepts meanwhile)."""
        if self.rehearsal is not None:
            spare.send_note(self._notes_w, spare.BUSY)
            spare.rehearse(self.rehearsal)
            spare.send_note(self._notes_w, spare.READY)

    def _read_notes(self) -> None:
        lines, self._pending_notes = spare.read_notes(self._notes_r, self._pending_notes)
        for line in lines:
            if line == spare.READY and self.spare_pid is not None:
                self.spare_ready = True
            elif line == spare.BUSY:
                self.spare_ready = False
            elif line == spare.TAKEN:
                self._serving, self.spare_pid, self.spare_ready = self.spare_pid, None, False
                self._next_spare_at = time.monotonic() + SERVING_WAIT_S
            elif line == spare.SERVING:
                self.last_active = time.monotonic()
            else:
                request = spare.parse_request_note(line)
                if request is not None:  # a request a child runs: activity, and the next rehearsal
                    self.rehearsal = request
                    self.last_active = time.monotonic()

    def retired(self, now: float | None = None) -> bool:
        """For an agent started on demand: whether it should stop now, because it ran no request
        for :attr:`idle_exit_s` seconds (refused ones do not count: an agent of another version
        or installation retires while the hooks it sends back keep coming), because its sources
        changed, or because its socket was removed or replaced (no hook can reach it any more).
        Admissions still running then finish: a stopping server drains them."""
        now = time.monotonic() if now is None else now
        if self.idle_exit_s is None:
            return False
        if now - self.last_active >= self.idle_exit_s:
            return True
        if now >= self._next_source_check:
            self._next_source_check = now + 5.0
            return bool(changed_sources(self.stamps)) or not self._socket_is_ours()
        return False

    def _socket_is_ours(self) -> bool:
        if not self.owns_path:
            return True
        try:
            return os.stat(self.path).st_ino == self._inode
        except OSError:
            return False

    def _stop(self, _signum: int, _frame) -> None:
        self.stopping = True

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        with conn:
            conn.setblocking(True)
            try:
                peer = peer_credentials(conn)
            except OSError:
                return
            record = {"time": time.time(), "peer_pid": peer.pid, "peer_uid": peer.uid}
            if not peer_allowed(peer.uid, self.uid):
                self._refuse(conn, record, self._not_allowed(peer))
                return
            if len(self.children) >= self.max_children:
                self._refuse(conn, record, f"{len(self.children)} admissions in flight")
                return
            signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)  # no parent handler runs in the child
            try:
                pid = os.fork()
            except OSError as exc:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
                self._refuse(conn, record, f"cannot fork: {exc.strerror}")
                return
            if pid == 0:
                status = 1
                try:
                    self._child(conn, peer)
                    status = 0
                finally:
                    os._exit(status)
            self.children.add(pid)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)

    def reap(self) -> None:
        """Collect every exited child without blocking."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            if pid == self._serving:  # the spare that was taken has answered: time for the next
                self._serving, self._next_spare_at = None, 0.0
            if pid == self.spare_pid:  # it died before taking a connection: another in a while
                self.spare_pid, self.spare_ready = None, False
                self._next_spare_at = time.monotonic() + SPARE_RETRY_S

    def close(self) -> None:
        """Stop listening: remove the socket (only if it is still ours and not systemd's) and
        release the lock."""
        try:
            if self.owns_path and os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
        self.listener.close()
        os.close(self.lock_fd)
        os.close(self._stop_w)  # an idle spare sees the pipe close and exits

    def drain(self, limit_s: float = DRAIN_S) -> None:
        """Wait at most ``limit_s`` seconds for the admissions in flight."""
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        deadline = time.monotonic() + limit_s
        self.reap()
        while self.children and time.monotonic() < deadline:
            time.sleep(0.02)
            self.reap()
        if self.children:
            print(f"numa-pin serve: left {len(self.children)} admissions running", file=sys.stderr, flush=True)

    # ---- child -------------------------------------------------------------------------------
    def _become_child(self) -> None:
        """What every child does first: leave the parent's signals and descriptors behind."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # a stopping server lets the admission finish
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
        gc.disable()  # a child lives for one request; collecting would only copy pages
        for fd in (self.lock_fd, self._wake_r, self._wake_w, self._notes_r, self._stop_w):
            os.close(fd)

    def _child(self, conn: socket.socket, peer: Peer) -> None:
        self._become_child()
        self.listener.close()
        os.close(self._stop_r)
        self.handle(conn, peer)

    def _spare(self) -> None:
        self._become_child()
        by = "spare"
        if self.rehearsal is not None:
            spare.rehearse(self.rehearsal)
            by = "rehearsed"
        spare.send_note(self._notes_w, spare.READY)
        conn = spare.await_connection(self.listener, self._stop_r, every_s=spare.REHEARSE_EVERY_S,
                                      on_idle=self._rehearse_again if self.rehearsal is not None else None)
        self.listener.close()
        os.close(self._stop_r)
        if conn is None:
            return
        spare.send_note(self._notes_w, spare.TAKEN)
        with conn:
            try:
                peer = peer_credentials(conn)
            except OSError:
                return
            if not peer_allowed(peer.uid, self.uid):
                self._refuse(conn, {"time": time.time(), "peer_pid": peer.pid, "peer_uid": peer.uid},
                             self._not_allowed(peer))
                return
            self.handle(conn, peer, by)

    def handle(self, conn: socket.socket, peer: Peer, by: str = "fork") -> None:
        """Tell the hook its connection was accepted, read one request, run it or refuse it,
        reply. Never raises for socket or protocol trouble (the hook then runs in-process).
        ``by`` says which child this is in the log: ``fork`` (forked for this connection),
        ``spare`` or ``rehearsed``.

        A hook sends its request only after :data:`~numa_pin.agent.protocol.ACCEPTED`, so a
        connection this agent accepts after the hook gave up on it (the agent was stopped or
        frozen) brings no request, and nothing runs twice."""
        started = time.perf_counter()
        record: dict[str, object] = {"time": time.time(), "pid": os.getpid(), "peer_pid": peer.pid,
                                     "peer_uid": peer.uid, "by": by}
        before = set(sys.modules) if self.log_path else set()
        try:
            try:
                conn.sendall(ACCEPTED)
            except OSError as exc:  # EPIPE: the hook closed the connection before anyone accepted it
                raise HungUp(exc.strerror) from exc
            request = decode_request(recv_frame(conn, MAX_REQUEST_BYTES, READ_TIMEOUT_S))
        except HungUp:
            append_log(self.log_path, {**record, "outcome": "abandoned",
                                       "reason": "the hook gave up before sending its request"})
            return
        except (OSError, ValueError) as exc:
            append_log(self.log_path, {**record, "outcome": "bad-request", "reason": str(exc)})
            return
        record["argv"] = list(request.argv)
        reason = refusal(request) or self._environment_refusal(peer)
        if reason is not None:
            self._refuse(conn, record, reason)
            return
        # only a request this agent runs steers the next spare's rehearsal (or counts as activity)
        note = spare.request_note(request.argv, request.env, request.cwd)
        spare.send_note(self._notes_w, note if note is not None else spare.SERVING)
        served, send_lock = threading.Event(), threading.Lock()
        threading.Thread(target=watch_client, args=(conn, served, int(KEEPALIVE_S * 1000), send_lock),
                         daemon=True).start()
        try:
            rc, err = run_request(request)
        except OSError as exc:
            with send_lock:
                served.set()
            self._refuse(conn, record, f"working directory {request.cwd}: {exc.strerror}")
            return
        with send_lock:
            served.set()
        append_log(self.log_path, {
            **record, "outcome": "served", "rc": rc, "ms": round(1000 * (time.perf_counter() - started), 3),
            "new_modules": sorted(set(sys.modules) - before) if self.log_path else [],
        })
        try:
            conn.settimeout(READ_TIMEOUT_S)
            conn.sendall(encode_reply(rc, err))
        except OSError:
            pass  # the hook gave up and runs in-process; admission is idempotent

    def _refuse(self, conn: socket.socket, record: Mapping[str, object], reason: str) -> None:
        print(f"numa-pin serve: sent pid {record['peer_pid']} (uid {record['peer_uid']}) back in-process: "
              f"{one_line(reason)}",
              file=sys.stderr, flush=True)
        append_log(self.log_path, {**record, "outcome": "fallback", "reason": reason})
        try:
            conn.settimeout(READ_TIMEOUT_S)
            conn.sendall(encode_fallback(reason))
        except OSError:
            pass

    def _not_allowed(self, peer: Peer) -> str:
        return f"peer uid {peer.uid} is not allowed (only 0 and {self.uid})"

    def _environment_refusal(self, peer: Peer) -> str | None:
        ns = namespace_mismatch(peer.pid, self.proc_root)
        if ns is not None:
            return f"peer pid {peer.pid} is in another {ns} namespace"
        changed = changed_sources(self.stamps)
        if changed:
            return f"{changed[0]} changed since the agent started: restart numa-pin serve"
        return None


def _ignore(_signum: int, _frame) -> None:
    """SIGCHLD: nothing to do here; the wake-up fd makes the loop reap."""


def _drain_fd(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def serve(
    path: str,
    *,
    log_path: str | None = None,
    proc_root: str = "/proc",
    out: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    idle_exit_s: float | None = None,
) -> int:
    """Preload the hook path, listen on ``path`` and serve until SIGTERM/SIGINT. Returns 0.

    Under systemd socket activation (``LISTEN_FDS``/``LISTEN_PID`` in ``environ``, default
    ``os.environ``) the passed socket is served instead and ``path`` is ignored; a stop then
    leaves the socket to systemd, which starts the agent again on the next connection. On its
    own socket the server takes the lock before the imports, so a second server started at
    the same moment (two hooks starting one on demand) exits at once. With ``idle_exit_s`` it
    also stops after that many idle seconds or when its sources change (an agent started on
    demand by a hook, :func:`numa_pin.agent.client.start_agent`).

    Raises:
        NumaPinError: a module does not import, or the socket cannot be served (see
            :func:`take_lock`, :func:`listen` and :func:`systemd_listener`).
    """
    listener = systemd_listener(os.environ if environ is None else environ)
    if listener is None:
        path = os.path.abspath(path)
        lock_fd = take_lock(path)
        try:
            modules = preload()
            listener = listen(path)
        except BaseException:
            os.close(lock_fd)
            raise
        how, passed = "listening on", False
    else:
        modules = preload()
        if environ is None:  # as sd_listen_fds(1): the admissions must not see them
            for key in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
                os.environ.pop(key, None)
        name = listener.getsockname()
        path = name if isinstance(name, str) and name else path
        lock_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)  # systemd runs one instance
        how, passed = "serving the socket systemd passed,", True
    stamps = source_stamps(modules)
    os.chdir("/")  # keep no directory busy (a hook that starts an agent runs in a bundle)
    server = AgentServer(path, lock_fd, listener, log_path=log_path, proc_root=proc_root, stamps=stamps,
                         owns_path=not passed, idle_exit_s=idle_exit_s)
    idle = f", exits after {idle_exit_s:g} s idle" if idle_exit_s is not None else ""
    print(f"numa-pin serve: numa-pin {__version__} {how} {path} (pid {server.pid}, "
          f"{len(modules)} modules preloaded{idle})", file=out or sys.stderr, flush=True)
    return server.serve()


__all__ = [
    "AgentServer",
    "NAMESPACES",
    "Peer",
    "append_log",
    "listen",
    "namespace_mismatch",
    "open_socket",
    "peer_credentials",
    "recv_frame",
    "run_request",
    "serve",
    "systemd_listener",
    "take_lock",
    "watch_client",
]

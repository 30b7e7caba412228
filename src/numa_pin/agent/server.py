"""The warm agent behind ``numa-pin serve``: hook admissions without the import cost.

An in-process hook spends almost all of its time importing numa-pin and the standard library
it needs. This server imports all of that once, listens on a Unix socket, and runs each hook in
a child of its own; the child runs :func:`numa_pin.hook.invoke.run` exactly as the hook would and
sends back the exit code and stderr. The parent never runs an admission, so no state carries
from one request to the next. Usually that child is the *spare*, forked and warmed before the
hook connected (:mod:`numa_pin.agent.spare`); when none is ready the parent accepts and forks.

This module is the parent's job: accept, fork, reap, keep a spare, stop. The socket is
:mod:`numa_pin.agent.listener`'s, a child's connection :mod:`numa_pin.agent.request`'s, the
spare's rehearsal and the children's notes :mod:`numa_pin.agent.spare`'s.

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

import gc
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

from numa_pin import __version__
from numa_pin.agent import spare
from numa_pin.agent.listener import listen, listen_tcp, systemd_listener, take_lock
from numa_pin.agent.preload import changed_sources, preload, source_stamps
from numa_pin.agent.protocol import peer_allowed
from numa_pin.agent.request import Peer, RequestHandler, peer_credentials
from numa_pin.errors import AgentError

#: admissions in flight at most; further connections are sent back to run in-process
MAX_CHILDREN = 64
#: metrics scrapes served at once, by children of their own (never an admission's slot); a
#: further scrape's connection is closed unanswered
MAX_SCRAPES = 4
#: how long a stopping server waits for admissions in flight
DRAIN_S = 35.0
_BLOCKED = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


def open_socket(path: str) -> tuple[int, socket.socket]:
    """Take ``<path>.lock``, clear a stale socket and listen on ``path`` (mode 0600):
    :func:`take_lock`, then :func:`listen`. Returns (lock fd, listening socket)."""
    lock_fd = take_lock(path)
    try:
        return lock_fd, listen(path)
    except BaseException:
        os.close(lock_fd)
        raise


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
        metrics: socket.socket | None = None,
    ) -> None:
        self.path = path
        #: the opt-in metrics listener (TCP): each scrape is served by a child of its own
        self.metrics = metrics
        #: False for a socket systemd passed: systemd keeps listening on it after a stop
        self.owns_path = owns_path
        self.lock_fd = lock_fd
        self.listener = listener
        self.stamps = dict(stamps or {})
        self.max_children = MAX_CHILDREN if max_children is None else max_children
        self.children: set[int] = set()
        #: the scrape children, apart: a slow scraper never takes an admission's slot
        self.scrapes: set[int] = set()
        self.uid = os.geteuid()
        self.pid = os.getpid()
        self.stopping = False
        #: an agent started on demand: stops after this long without a hook, and as soon as
        #: its sources change on disk (the next hook starts the upgraded code)
        self.idle_exit_s = idle_exit_s
        self.last_active = time.monotonic()
        self._next_source_check = 0.0
        #: the socket file's inode: an agent whose socket path was removed or replaced (a purge of
        #: /run/numa-pin, a hook that then started an agent of its own) no longer reaches a hook
        self._inode = _inode(path)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        #: the child forked and warmed before a hook connects, and the notes children send
        self.spares = spare.SpareKeeper()
        #: what a child serves a connection with (:mod:`numa_pin.agent.request`)
        self.handler = RequestHandler(uid=self.uid, notes_fd=self.spares.notes_w, log_path=log_path,
                                      proc_root=proc_root, stamps=self.stamps)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)  # closed by the parent: the spare leaves

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
                watched = [self._wake_r, self.spares.notes_r] + ([] if self.spares.ready else [self.listener.fileno()])
                watched += [self.metrics.fileno()] if self.metrics is not None else []
                ready, _, _ = select.select(watched, [], [], timeout)
                if self._wake_r in ready:
                    _drain_fd(self._wake_r)
                self._collect(self.spares.notes_r in ready)
                if self.listener.fileno() in ready and not self.stopping:
                    self._accept()
                if self.metrics is not None and self.metrics.fileno() in ready and not self.stopping:
                    self._scrape()
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
        wait = self.spares.wait(time.monotonic(), len(self.children) >= self.max_children)
        if wait is not None:
            return wait
        leave_r, leave_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        pid = self._fork(lambda: self._spare(leave_r, leave_w))
        os.close(leave_r)
        self.spares.forked(pid, leave_w)
        return 5.0

    def _fork(self, child: Callable[[], None], into: set[int] | None = None) -> int | None:
        """Fork a child that runs ``child`` and exits; its pid (kept in ``into``, by default
        :attr:`children`), or None when fork failed. No handler of the parent runs in the child
        (the signals are blocked across the fork)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
            return None
        if pid == 0:
            status = 1
            try:
                child()
                status = 0
            finally:
                os._exit(status)
        (self.children if into is None else into).add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
        return pid

    def retired(self, now: float | None = None) -> bool:
        """For an agent started on demand: whether it should stop now, because it ran no request
        for :attr:`idle_exit_s` seconds (refused ones do not count: an agent of another version
        or installation retires while the hooks it sends back keep coming), because its sources
        changed, or because its socket was removed or replaced (no hook can reach it any more).
        Admissions still running then finish: a stopping server drains them."""
        now = time.monotonic() if now is None else now
        if self.idle_exit_s is None:
            if self.owns_path or now < self._next_source_check:
                return False
            # systemd's agent: its socket file gone or replaced means a second agent would serve
            # the path while this one waits on a socket no hook can reach (it leaves, and systemd
            # keeps its unit's socket)
            self._next_source_check = now + 5.0
            return not self._socket_is_ours()
        if now - self.last_active >= self.idle_exit_s:
            return True
        if now >= self._next_source_check:
            self._next_source_check = now + 5.0
            return bool(changed_sources(self.stamps)) or not self._socket_is_ours()
        return False

    def _socket_is_ours(self) -> bool:
        if self._inode is None:  # systemd passed a socket whose path could not be looked at
            return True
        return _inode(self.path) == self._inode

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
                self.handler.refuse(conn, record, self.handler.not_allowed(peer))
                return
            if len(self.children) >= self.max_children:
                self.handler.refuse(conn, record, f"{len(self.children)} admissions in flight")
                return
            if self._fork(lambda: self._child(conn, peer)) is None:
                self.handler.refuse(conn, record, "cannot fork")

    def _scrape(self) -> None:
        """Fork a child for one metrics scrape, at most :data:`MAX_SCRAPES` at once and never in
        an admission's slot; the parent only accepts (never reads files)."""
        assert self.metrics is not None
        try:
            conn, _ = self.metrics.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        with conn:
            if len(self.scrapes) < MAX_SCRAPES:
                self._fork(lambda: self._scrape_child(conn), self.scrapes)

    def _collect(self, notes_ready: bool) -> None:
        """Read the children's notes, reap, and read again after a reap: the last notes of a child
        that exited in between (a quick request) are what the spare forked next rehearses."""
        if notes_ready and self.spares.read(time.monotonic()):
            self.last_active = time.monotonic()
        if self.reap() and self.spares.read(time.monotonic()):
            self.last_active = time.monotonic()

    def reap(self) -> bool:
        """Collect every exited child without blocking; returns whether one was."""
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return reaped
            if pid == 0:
                return reaped
            reaped = True
            self.children.discard(pid)
            self.scrapes.discard(pid)
            self.spares.reaped(pid, time.monotonic())

    def close(self) -> None:
        """Stop listening: remove the socket (only if it is still ours and not systemd's) and
        release the lock."""
        try:
            if self.owns_path and os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
        self.listener.close()
        if self.metrics is not None:
            self.metrics.close()
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
        for fd in (self.lock_fd, self._wake_r, self._wake_w, self.spares.notes_r, self._stop_w):
            os.close(fd)
        self.spares.let_go()  # a waiting spare's leave pipe is the parent's alone
        if self.metrics is not None:
            self.metrics.close()

    def _scrape_child(self, conn: socket.socket) -> None:
        self._become_child()
        self.listener.close()
        os.close(self._stop_r)
        from numa_pin.agent.metrics import serve_scrape  # only an agent that serves metrics loads prometheus_client

        serve_scrape(conn)

    def _child(self, conn: socket.socket, peer: Peer) -> None:
        self._become_child()
        self.listener.close()
        os.close(self._stop_r)
        self.handler.handle(conn, peer)

    def _spare(self, leave_r: int, leave_w: int) -> None:
        self._become_child()
        os.close(leave_w)
        spare.keep_freed_memory()  # the rehearsal's pages stay for the admission
        by = "spare"
        if self.spares.rehearsal is not None:
            self.spares.watch = spare.rehearse(self.spares.rehearsal, self.spares.kept())
            by = "rehearsed"
        spare.send_note(self.spares.notes_w, spare.READY)
        conn = spare.await_connection(
            self.listener, self._stop_r, every_s=spare.REHEARSE_EVERY_S,
            on_idle=self.spares.rehearse_again if self.spares.rehearsal is not None else None,
            stale=self.spares.stale, leave_fd=leave_r)
        self.listener.close()
        os.close(self._stop_r)
        if conn is None:
            return
        spare.send_note(self.spares.notes_w, spare.TAKEN)
        with conn:
            try:
                peer = peer_credentials(conn)
            except OSError:
                return
            if not peer_allowed(peer.uid, self.uid):
                self.handler.refuse(conn, {"time": time.time(), "peer_pid": peer.pid, "peer_uid": peer.uid},
                                    self.handler.not_allowed(peer))
                return
            self.handler.handle(conn, peer, by, self.spares.kept())

def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
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
    metrics_address: str | None = None,
) -> int:
    """Preload the hook path, listen on ``path`` and serve until SIGTERM/SIGINT. Returns 0.

    Under systemd socket activation (``LISTEN_FDS``/``LISTEN_PID`` in ``environ``, default
    ``os.environ``) the passed socket is served instead and ``path`` is ignored; a stop then
    leaves the socket to systemd, which starts the agent again on the next connection. Such an
    agent stops when its socket file is removed or replaced, so it never runs beside an agent a
    hook started on the path (no hook can reach it any more). On its
    own socket the server takes the lock before the imports, so a second server started at
    the same moment (two hooks starting one on demand) exits at once. With ``idle_exit_s`` it
    also stops after that many idle seconds or when its sources change (an agent started on
    demand by a hook, :func:`numa_pin.agent.client.start_agent`). With ``metrics_address`` it
    also serves Prometheus metrics there (:mod:`numa_pin.agent.metrics`), each scrape in a child; an
    address it cannot listen on is reported and admissions are served without it.

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
    metrics = None
    if metrics_address:
        try:
            metrics = listen_tcp(metrics_address)
        except AgentError as exc:  # a second agent, a port in use: admissions matter more
            print(f"numa-pin serve: not serving metrics: {exc}", file=out or sys.stderr, flush=True)
    server = AgentServer(path, lock_fd, listener, log_path=log_path, proc_root=proc_root, stamps=stamps,
                         owns_path=not passed, idle_exit_s=idle_exit_s, metrics=metrics)
    if metrics is not None:
        print(f"numa-pin serve: serving metrics on http://{metrics_address}/metrics", file=out or sys.stderr,
              flush=True)
    idle = f", exits after {idle_exit_s:g} s idle" if idle_exit_s is not None else ""
    print(f"numa-pin serve: numa-pin {__version__} {how} {path} (pid {server.pid}, "
          f"{len(modules)} modules preloaded{idle})", file=out or sys.stderr, flush=True)
    return server.serve()


__all__ = [
    "DRAIN_S",
    "MAX_CHILDREN",
    "MAX_SCRAPES",
    "AgentServer",
    "listen",
    "open_socket",
    "serve",
    "systemd_listener",
    "take_lock",
]

"""Running one request, in the agent's child: read it, check it, run it, answer.

A child (forked for a connection, or the spare that accepted one) first tells the hook that a
live process has its connection (:data:`~numa_pin.agent.protocol.ACCEPTED`), then reads the
request within :data:`READ_TIMEOUT_S` in all, refuses it (``fallback``: another protocol,
version, installation or namespace, changed sources, an unusable working directory) or runs it
with :func:`numa_pin.hook.invoke.run`, sends keepalives while it runs (:func:`watch_client`, which
also cancels the admission when the hook hangs up), and replies. Only a request it runs is
reported to the parent (the note the next spare rehearses with, and the agent's activity).
"""

from __future__ import annotations

import binascii
import errno
import json
import os
import select
import socket
import stat
import struct
import sys
import threading
import time
import traceback
from collections.abc import Mapping

from numa_pin import __version__
from numa_pin.agent import spare
from numa_pin.agent.client import namespace_mismatch
from numa_pin.agent.preload import changed_sources
from numa_pin.agent.protocol import (
    ACCEPTED,
    HOME,
    KEEPALIVE,
    KEEPALIVE_S,
    MAX_REQUEST_BYTES,
    MAX_REQUEST_DEPTH,
    MAX_STDIN_BYTES,
    PASSED_ENV,
    PROTOCOL,
    UCRED_BYTES,
    decode_ucred,
    encode_fallback,
    encode_reply,
)
from numa_pin.base import deadline
from numa_pin.base.boundedio import json_loads_bounded
from numa_pin.base.record import field, record
from numa_pin.base.text import one_line
from numa_pin.hook import invoke
from numa_pin.hook.started import process_started
from numa_pin.resources.node.warm import WarmState

#: a peer must send its whole request within this many seconds of being accepted (in all)
READ_TIMEOUT_S = 5.0
_HEADER = struct.Struct("!I")


@record
class Peer:
    """Who is on the other end of a connection (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int


@record
class Request:
    """One decoded hook request (see :mod:`numa_pin.agent.protocol` for the wire format)."""

    protocol: int
    version: str
    argv: tuple[str, ...]
    stdin: bytes = field(repr=False)
    env: Mapping[str, str] = field(repr=False)
    cwd: str
    home: str | None = field(default=None, repr=False)
    #: the peer is the hook process itself: the budget counts from its start
    anchored: bool = False


def decode_request(body: bytes) -> Request:
    """Parse a request body. Raises ValueError naming the field that is wrong (or the nesting
    beyond :data:`~numa_pin.agent.protocol.MAX_REQUEST_DEPTH`)."""
    try:
        doc = json_loads_bounded(body, MAX_REQUEST_DEPTH)
    except ValueError as exc:  # UnicodeDecodeError and boundedio's UnsafeInput included
        raise ValueError(f"request is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("request is not a JSON object")
    protocol, version, argv = doc.get("v"), doc.get("version"), doc.get("argv")
    stdin, env, cwd = doc.get("stdin"), doc.get("env"), doc.get("cwd")
    if type(protocol) is not int:
        raise ValueError("request field 'v' must be an integer")
    if not isinstance(version, str):
        raise ValueError("request field 'version' must be a string")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("request field 'argv' must be a list of strings")
    if not isinstance(stdin, str):
        raise ValueError("request field 'stdin' must be a base64 string")
    try:
        data = binascii.a2b_base64(stdin.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("request field 'stdin' is not base64") from None
    if len(data) > MAX_STDIN_BYTES:
        raise ValueError(f"request field 'stdin' is larger than {MAX_STDIN_BYTES} bytes")
    if not isinstance(env, dict) or not all(k in PASSED_ENV and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"request field 'env' may only hold strings for {', '.join(PASSED_ENV)}")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise ValueError("request field 'cwd' must be an absolute path")
    home, anchored = doc.get("home"), doc.get("anchored", False)
    if home is not None and not isinstance(home, str):
        raise ValueError("request field 'home' must be a string")
    if not isinstance(anchored, bool):
        raise ValueError("request field 'anchored' must be true or false")
    return Request(protocol, version, tuple(argv), data, dict(env), cwd, home, anchored)


def same_home(home: str, cwd: str, server_home: str) -> bool:
    """Whether a hook's ``home`` (relative to its ``cwd`` when it is relative, as a hook started
    without site can have it) names the agent's installation directory."""
    return os.path.normpath(os.path.join(cwd, home)) == os.path.normpath(os.path.join("/", server_home))


def refusal(request: Request, server_version: str = __version__, server_home: str = HOME) -> str | None:
    """Why this server must not run ``request`` (protocol, numa-pin version, or a hook of another
    installation), or None. Pure."""
    if request.protocol != PROTOCOL:
        return f"protocol {request.protocol} (server speaks {PROTOCOL})"
    if request.version != server_version:
        return f"numa-pin {request.version} hook, {server_version} agent: restart numa-pin serve after an upgrade"
    if request.home is not None and not same_home(request.home, request.cwd, server_home):
        return f"the hook runs numa-pin from {request.home}, this agent from {server_home}"
    return None


def peer_credentials(conn: socket.socket) -> Peer:
    """``SO_PEERCRED`` of a connected Unix socket. Raises OSError."""
    return Peer(*decode_ucred(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED_BYTES)))


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


def run_request(request: Request, warm_state: WarmState | None = None,
                started: float | None = None) -> tuple[int, str, bytes]:
    """Run the hook for ``request`` in this process, as ``numa-pin-hook`` would
    (:func:`numa_pin.hook.invoke.run`, given the request's arguments, variables, stdin and working
    directory, when the hook process ``started``, and this child's ``warm_state``): exit code,
    stderr and stdout (``precreate``'s config). Changes no process global (environment, stderr,
    stdout, cwd).

    Raises OSError when the working directory is not a directory (nothing has run then)."""
    if not stat.S_ISDIR(os.stat(request.cwd).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), request.cwd)
    try:
        result = invoke.run(invoke.HookRequest(request.argv, dict(request.env), request.stdin, request.cwd,
                                               started), warm_state=warm_state)
    except BaseException:  # NUMA_PIN_DEBUG=1: run() re-raises; show what the interpreter would
        return 1, traceback.format_exc(), b""
    return result.code, result.stderr_text(), result.stdout


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


class RequestHandler:
    """What a child needs to serve one connection: the server's uid, its request log, the pipe
    to the parent, the proc root for namespace checks and the source stamps for upgrades."""

    def __init__(self, *, uid: int, notes_fd: int, log_path: str | None = None, proc_root: str = "/proc",
                 stamps: Mapping[str, int] | None = None) -> None:
        self.uid = uid
        self.notes_fd = notes_fd
        self.log_path = log_path
        self.proc_root = proc_root
        self.stamps = dict(stamps or {})

    def handle(self, conn: socket.socket, peer: Peer, by: str = "fork", warm_state: WarmState | None = None) -> None:
        """Tell the hook its connection was accepted, read one request, run it or refuse it,
        reply. Never raises for socket or protocol trouble (the hook then runs in-process).
        ``by`` says which child this is in the log: ``fork`` (forked for this connection),
        ``spare`` or ``rehearsed``; ``warm_state``: what a spare's rehearsals kept (None: cold).
        Either way, what can wait is left until after the reply.

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
            self.refuse(conn, record, reason)
            return
        # only a request this agent runs steers the next spare's rehearsal (or counts as activity)
        note = spare.request_note(request.argv, request.env, request.cwd)
        spare.send_note(self.notes_fd, note if note is not None else spare.SERVING)
        served, send_lock = threading.Event(), threading.Lock()
        threading.Thread(target=watch_client, args=(conn, served, int(KEEPALIVE_S * 1000), send_lock),
                         daemon=True).start()
        kept = warm_state if warm_state is not None else WarmState()
        kept.defer()  # a release's shared-pool growth waits for the reply
        # the budget counts from the hook's own start (the peer's; same pid namespace: checked above)
        began = process_started(peer.pid, self.proc_root) if request.anchored else None
        try:
            rc, err, out = run_request(request, kept, began)
        except OSError as exc:
            with send_lock:
                served.set()
            self.refuse(conn, record, f"working directory {request.cwd}: {exc.strerror}")
            return
        with send_lock:
            served.set()
        append_log(self.log_path, {
            **record, "outcome": "served", "rc": rc, "ms": round(1000 * (time.perf_counter() - started), 3),
            "new_modules": sorted(set(sys.modules) - before) if self.log_path else [],
        })
        try:
            conn.settimeout(READ_TIMEOUT_S)
            conn.sendall(encode_reply(rc, err, out))
        except (OSError, ValueError):
            pass  # the hook gave up and runs in-process; admission is idempotent
        kept.settle()

    def refuse(self, conn: socket.socket, record: Mapping[str, object], reason: str) -> None:
        print(f"numa-pin serve: sent pid {record['peer_pid']} (uid {record['peer_uid']}) back in-process: "
              f"{one_line(reason)}",
              file=sys.stderr, flush=True)
        append_log(self.log_path, {**record, "outcome": "fallback", "reason": reason})
        try:
            conn.settimeout(READ_TIMEOUT_S)
            conn.sendall(encode_fallback(reason))
        except OSError:
            pass

    def not_allowed(self, peer: Peer) -> str:
        return f"peer uid {peer.uid} is not allowed (only 0 and {self.uid})"

    def _environment_refusal(self, peer: Peer) -> str | None:
        ns = namespace_mismatch(peer.pid, self.proc_root)
        if ns is not None:
            return f"peer pid {peer.pid} is in another {ns} namespace"
        changed = changed_sources(self.stamps)
        if changed:
            return f"{changed[0]} changed since the agent started: restart numa-pin serve"
        return None


__all__ = ["READ_TIMEOUT_S", "HungUp", "Peer", "RequestHandler", "append_log", "peer_credentials", "recv_frame",
           "run_request", "watch_client"]

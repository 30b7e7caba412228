"""The agent's spare child: forked and warmed before a hook connects, so a hook waits for neither.

A child forked at the moment a hook connects pays for the fork and then for copy-on-write:
every page of the parent that the admission writes to (a reference count is a write) is copied
on first touch. On the 2-CPU bench machine that was about 930 page faults and 2.5 ms of a 5 ms
admission, on top of the fork itself (``bench/hook_latency.py``).

So the server keeps one *spare*: a child forked ahead of time that first *rehearses*, loading
the config and topology the last hook named and planning a one-CPU container (the first spare,
before any hook has come, has nothing to rehearse), which changes nothing on the node but makes
the pages an admission touches the child's own. Then it tells the parent it is ready and waits
on the listening socket itself. The first hook to connect is accepted by the spare; the parent
hears that it was taken and, once it has answered, forks the next spare. Until a spare is ready
(the first moments after start, a burst of hooks) the parent accepts and forks as before.

While no hook comes, the spare rehearses again every :data:`REHEARSE_EVERY_S` seconds and
rediscovers a cached topology older than :data:`REHEARSAL_TOPOLOGY_MAX_AGE_S` (a hook accepts
60 s), so on a node where containers start minutes apart a hook still finds fresh caches and
never pays for a discovery. It stops watching the socket meanwhile and says so. It also
rehearses again, within :data:`STALE_CHECK_S`, once the ledger it read was replaced by anyone
else (an in-process hook, the operator's CLI): a busy node's ledger is then decoded and its
shared containers' cgroups checked again before the next hook, not while it waits.

Messages from children to the parent go over one pipe, one line each, each written whole
(under ``PIPE_BUF``): ``R`` (the spare is ready), ``B`` (it is rehearsing again: the parent
accepts meanwhile), ``T`` (it took a connection) and ``Q <json>`` (what a request the child
runs asked for: argv, the passed environment and the working directory, which the next spare
rehearses with; ``S`` instead when that line would be too long). Only a request the agent runs
is noted: a refused one (another mount namespace, version or installation) neither steers the
rehearsal nor counts as activity that keeps an agent started on demand from retiring.
The parent forks the next spare once the one that was taken has answered and exited (at most
0.5 s later): a spare rehearsing at once would compete for the CPUs with the admission the hook
waits for (on the 2-CPU VM that spread a prestart's 5 ms over 5-9 ms).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import time
from collections.abc import Callable, Mapping, Sequence

from numa_pin.agent.protocol import PASSED_ENV
from numa_pin.config.load import entry_config
from numa_pin.hook.invoke import parse_argv
from numa_pin.ledger.liveness import prepare
from numa_pin.ledger.store import Ledger, encode
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node.cpu import warm
from numa_pin.resources.node.warm import WarmState
from numa_pin.service.node import open_service

#: the notes (one line each, without its newline)
READY = b"R"
TAKEN = b"T"
#: the spare is rehearsing again and does not watch the socket meanwhile
BUSY = b"B"
#: a child runs a request whose ``Q`` note would not fit in one write (activity all the same)
SERVING = b"S"
#: an idle spare rehearses again this often, so the caches a hook reads never go stale
#: (the topology cache is rediscovered after 60 s) and a hook never waits for a discovery
REHEARSE_EVERY_S = 20.0
#: a rehearsal rediscovers a cached topology older than this (a hook's limit is 60 s)
REHEARSAL_TOPOLOGY_MAX_AGE_S = 30.0
#: a note longer than this is not sent (pipe writes up to PIPE_BUF are atomic on Linux)
MAX_NOTE_BYTES = 4096


#: glibc's ``mallopt`` parameters (``<malloc.h>``)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: a spare's blocks up to this size come from its heap, not from a mapping of their own (glibc's
#: default starts at 128 KiB: a busy node's ledger, about 1 MiB at 2,000 containers, is mapped
#: for each encoding and unmapped when freed, so every encoding faults its pages in afresh)
KEEP_BLOCKS_BELOW = 16 << 20
#: and this much freed memory at the top of its heap stays with it (glibc's default: 128 KiB)
KEEP_FREED_BYTES = 64 << 20


def keep_freed_memory() -> bool:
    """In a spare child, before it rehearses: keep the memory it frees (glibc's ``mallopt``), so
    the admission it then runs finds the pages of the rehearsal's large blocks (a busy node's
    ledger decoded and encoded) already faulted in, instead of about 600 page faults at 2,000
    containers. A spare serves one request and exits, so nothing is kept for long; the server
    itself keeps glibc's defaults. Returns whether the C library took both settings (not glibc:
    False, nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, KEEP_BLOCKS_BELOW)) and bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


def request_note(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> bytes | None:
    """The ``Q`` note for a request, or None when its line would not fit in one atomic write."""
    body = {"argv": list(argv), "env": {k: v for k, v in env.items() if k in PASSED_ENV}, "cwd": cwd}
    note = b"Q " + json.dumps(body, sort_keys=True).encode("utf-8", "backslashreplace")
    return note if len(note) < MAX_NOTE_BYTES else None


def send_note(fd: int, note: bytes) -> None:
    """One note to the parent, as one line in one write; lost (never raised) when the pipe is
    full or the parent is gone."""
    try:
        os.write(fd, note + b"\n")
    except OSError:
        pass


def read_notes(fd: int, pending: bytes) -> tuple[list[bytes], bytes]:
    """Every whole line now readable on the non-blocking ``fd`` (after ``pending``, an
    unfinished line from before); returns (lines without their newline, what is left over)."""
    data = pending
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    *lines, rest = data.split(b"\n")
    return lines, rest


def parse_request_note(line: bytes) -> Mapping[str, object] | None:
    """The request a ``Q`` line describes, or None for anything else or anything malformed."""
    if not line.startswith(b"Q "):
        return None
    try:
        body = json.loads(line[2:])
    except ValueError:
        return None
    ok = (isinstance(body, dict) and isinstance(body.get("argv"), list) and isinstance(body.get("env"), dict)
          and isinstance(body.get("cwd"), str) and all(isinstance(a, str) for a in body["argv"])
          and all(isinstance(k, str) and isinstance(v, str) for k, v in body["env"].items()))
    return body if ok else None


class LedgerWatch:
    """Whether the ledger a rehearsal read has been changed since (an in-process hook, the
    operator's ``numa-pin release``, ``numa-pin run``: anything that is not this agent). A
    ``stat`` of the snapshot and one of the journal: a commit replaces the one (a new inode and
    change time) or appends to the other (a new size and change time). Only speed rides on it:
    a change it misses leaves the spare's caches cold, and the admission reads the ledger under
    the lock as always."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.seen = ledger.identity()  # taken before the rehearsal reads: a commit after it shows

    def changed(self) -> bool:
        return self.ledger.identity() != self.seen


def rehearse(request: Mapping[str, object], kept: WarmState) -> LedgerWatch | None:
    """Load the config and topology ``request`` (a parsed ``Q`` note) would load and plan a
    one-CPU container, as a hook's admission would, encode the ledger it read (its parsed
    and encoded grants are kept, :mod:`numa_pin.ledger.store`, and what the decision asked of it,
    :class:`~numa_pin.ledger.model.LedgerState`) and check its shared containers'
    cgroup paths (kept in ``kept``, :func:`numa_pin.resources.node.cpu.warm`, for the request
    this child serves), changing nothing (no lock, no write but the
    caches a hook writes too, the topology's when it is older than
    :data:`REHEARSAL_TOPOLOGY_MAX_AGE_S`). Best effort: a rehearsal that fails only leaves
    pages cold. Returns a watch on the ledger it read (None when it did not get that far)."""
    argv = request.get("argv")
    passed = request.get("env")
    env = {k: v for k, v in passed.items() if k in PASSED_ENV} if isinstance(passed, dict) else {}
    cwd = request.get("cwd")
    try:
        config_path, _ = parse_argv([str(a) for a in argv] if isinstance(argv, list) else [])
        config, cache_dir = entry_config(config_path, env, cwd=cwd if isinstance(cwd, str) else "/", cached=True)
        service = open_service(config, cache_dir, topology_max_age=REHEARSAL_TOPOLOGY_MAX_AGE_S, warm_state=kept)
        watch = LedgerWatch(service.ledger)
        service.plan(request_from_oci("numa-pin-rehearsal", {"numa-pin.io/cpus": "1"}))
        state = service.ledger.read()
        encode(state, memo=service.ledger.cache)  # a busy node's ledger: the commit then encodes only its change
        prepare(state, service.boot_id)  # the grants the admission's liveness pass asks, and skips
        warm(service, state)  # and its shared containers' cgroups: the commit then checks only new ones
    except (Exception, SystemExit):  # the hook itself will meet and report whatever this is
        return None
    return watch


def await_connection(listener: socket.socket, stop_fd: int, *, every_s: float | None = None,
                     on_idle: Callable[[], None] | None = None,
                     stale: Callable[[], bool] | None = None, leave_fd: int | None = None) -> socket.socket | None:
    """Accept the next connection on ``listener`` (non-blocking, shared with the parent and
    other children); None as soon as ``stop_fd`` (the read end of a pipe only the parent
    writes to) is closed or readable: the server stops, or died; None too when ``leave_fd``
    is (the parent sends this spare away). ``on_idle`` runs after each
    ``every_s`` seconds without a connection, and sooner when ``stale`` (asked every
    :data:`STALE_CHECK_S` seconds) says what it prepared is out of date."""
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    leave = {stop_fd} if leave_fd is None else {stop_fd, leave_fd}
    for fd in leave:
        poller.register(fd, select.POLLIN)
    idle_s = None if every_s is None or on_idle is None else every_s
    check_s = idle_s if stale is None or idle_s is None else min(idle_s, STALE_CHECK_S)
    due = None if idle_s is None else time.monotonic() + idle_s
    while True:
        events = dict(poller.poll(None if check_s is None else int(check_s * 1000)))
        if not events and on_idle is not None and due is not None:
            if time.monotonic() >= due or (stale is not None and stale()):
                on_idle()
                due = time.monotonic() + idle_s  # type: ignore[operator]
            continue
        if leave & events.keys():
            return None
        if listener.fileno() in events:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue  # the parent or a racing child took it
            conn.setblocking(True)
            return conn


#: a waiting spare looks this often whether the ledger it rehearsed on was replaced by someone
#: else (an in-process hook, the operator), and rehearses again if so: a busy node's admission
#: then never decodes a ledger of thousands of grants while a hook waits
STALE_CHECK_S = 0.25


#: after a spare child died without taking a connection, the next one is forked this much later
SPARE_RETRY_S = 1.0
#: after a spare was taken, the next one is forked when that one has answered and exited (its
#: rehearsal would compete for the CPUs with the admission a hook waits for), or after this long
SERVING_WAIT_S = 0.5


class SpareKeeper:
    """The parent's side of the spare: which child it is and whether it waits on the socket,
    what the next one rehearses, and the notes children send (one pipe, :attr:`notes_w` for the
    children). The server forks; this says when, and keeps the books."""

    def __init__(self) -> None:
        self.keep = True  # False after a fork for a spare failed: the parent accepts and forks
        self.pid: int | None = None
        self.ready = False
        #: the last request a child ran: what the next spare rehearses (None: no hook yet)
        self.rehearsal: Mapping[str, object] | None = None
        self.next_at = 0.0
        self.serving: int | None = None  # the last spare taken, while it serves
        self.notes_r, self.notes_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._pending = b""
        #: in a spare child: the ledger its last rehearsal read
        self.watch: LedgerWatch | None = None
        #: in a spare child: what its rehearsals keep for the request it serves
        self.warm_state: WarmState | None = None
        #: the write end of the waiting spare's leave pipe, and whether that spare was forked
        #: before any request (it rehearses nothing: the first request sends it away)
        self.leave_w: int | None = None
        self.bare = False
        self._sent_away: int | None = None

    def wait(self, now: float, at_limit: bool) -> float | None:
        """None when a spare should be forked now, else how long the loop may sleep."""
        if not self.keep or self.pid is not None or at_limit:
            return 5.0
        wait = self.next_at - now
        return min(wait, 5.0) if wait > 0 else None

    def forked(self, pid: int | None, leave_w: int) -> None:
        """A spare was forked (``pid``; None: fork failed, the parent accepts and forks from now
        on); the parent sends it away by writing to ``leave_w``."""
        if pid is None:
            os.close(leave_w)
            self.keep = False  # no memory for one more process
            return
        self.pid, self.ready, self.leave_w, self.bare = pid, False, leave_w, self.rehearsal is None

    def let_go(self) -> None:
        """Close the waiting spare's leave pipe (it was taken or is gone; in a child: its copy)."""
        if self.leave_w is not None:
            os.close(self.leave_w)
            self.leave_w = None

    def send_away(self) -> None:
        """Tell a waiting spare forked before any request to leave: the next one rehearses."""
        if self.leave_w is not None:
            send_note(self.leave_w, b"L")
            self._sent_away = self.pid
            self.let_go()

    def read(self, now: float) -> bool:
        """Take in the notes now readable; returns whether a child reported running a request
        (the agent's activity: refused requests are never noted)."""
        active = False
        lines, self._pending = read_notes(self.notes_r, self._pending)
        for line in lines:
            if line == READY and self.pid is not None:
                self.ready = True
            elif line == BUSY:
                self.ready = False
            elif line == TAKEN:
                self.serving, self.pid, self.ready = self.pid, None, False
                self.next_at = now + SERVING_WAIT_S
                self.let_go()
            elif line == SERVING:
                active = True
            else:
                request = parse_request_note(line)
                if request is not None:  # a request a child runs: activity, and the next rehearsal
                    self.rehearsal, active = request, True
                    if self.bare:  # a forked child ran it while this spare started: it never rehearses
                        self.send_away()
        return active

    def reaped(self, pid: int, now: float) -> None:
        """A child exited: the taken spare (time for the next) or the waiting one (died)."""
        if pid == self.serving:
            self.serving, self.next_at = None, 0.0
        if pid == self.pid:  # it left (sent away: another at once) or died (another in a while)
            self.pid, self.ready = None, False
            self.next_at = now if pid == self._sent_away else now + SPARE_RETRY_S
            self.let_go()

    def rehearse_again(self) -> None:
        """In an idle spare child: rehearse once more (the parent accepts meanwhile)."""
        if self.rehearsal is not None:
            send_note(self.notes_w, BUSY)
            self.watch = rehearse(self.rehearsal, self.kept())
            send_note(self.notes_w, READY)

    def kept(self) -> WarmState:
        """In a spare child: its :class:`~numa_pin.resources.node.warm.WarmState` (made on first use)."""
        if self.warm_state is None:
            self.warm_state = WarmState()
        return self.warm_state

    def stale(self) -> bool:
        """In a spare child: whether the ledger its rehearsal read was replaced since."""
        return self.watch is not None and self.watch.changed()


__all__ = [
    "BUSY", "READY", "REHEARSAL_TOPOLOGY_MAX_AGE_S", "REHEARSE_EVERY_S", "SERVING", "SERVING_WAIT_S", "SPARE_RETRY_S",
    "STALE_CHECK_S", "TAKEN", "LedgerWatch", "SpareKeeper", "await_connection", "keep_freed_memory",
    "parse_request_note", "read_notes", "rehearse", "request_note", "send_note",
]

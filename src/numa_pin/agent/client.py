"""The hook's side of the warm agent (``numa-pin serve``): hand one admission to it, or say no.

:func:`try_agent` returns the hook's exit code when the agent ran the hook, and None whenever
the caller must run the hook in-process instead: no socket, nothing answering, a server of
another uid, a protocol error, a version mismatch, a stalled agent (no process accepted the
connection, or the one running it went quiet, within ``STALL_S``), or a server that died after
the request was sent. The last case is safe because admission and release are idempotent (an admission
that finds the container's grant re-applies it), see ``docs/agent.md``.

This module runs on every container start, so it imports only C modules that are already
compiled into the interpreter or cost well under a millisecond: ``_socket`` instead of
:mod:`socket` (which pulls in :mod:`enum` and :mod:`selectors`), ``_json`` instead of
:mod:`json` (which pulls in :mod:`re`) and ``binascii`` instead of :mod:`base64`. Together
the public modules would add about 15 ms to a 13 ms interpreter start; these add about 1 ms.
The installed hook starts Python without ``site``, so not even :mod:`os` is loaded: the hot
path uses the built-in ``posix`` (0.7 ms less), and the functions that run only when no agent
answers import :mod:`os` themselves.

When nothing listens at the socket, :func:`start_agent` starts one (``numa-pin serve
--idle-exit``) detached from the hook, so the containers after the first are served warm on a
node where no service manager runs the agent (the packaged socket unit does it under systemd).
The hook that started it still runs its own admission in-process and never waits for it.

The wire format is :mod:`numa_pin.agent.protocol`.
"""

from __future__ import annotations

import posix  # the hook starts without site, which would have imported os; posix is built in
import sys

from numa_pin.agent.protocol import (
    ACCEPTED,
    AGENT_LOG_ENV,
    AUTOSTART_ENV,
    HEADER_BYTES,
    KEEPALIVE,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    NO_AGENT_ENV,
    STALL_S,
    UCRED_BYTES,
    decode_reply,
    decode_ucred,
    encode_request,
    frame,
    socket_path,
)

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: the agent must accept the connection this fast, or the hook runs in-process
CONNECT_TIMEOUT_S = 0.5
#: how long the hook waits for the verdict in all, however live the agent looks (the runtime's
#: own hook timeout is shorter); an agent that goes quiet is given up on after ``STALL_S``
REPLY_TIMEOUT_S = 60.0
#: an agent started on demand exits after this many seconds without a hook
IDLE_EXIT_S = 600
#: a hook starts no agent within this many seconds of the last start (one that failed to come
#: up is not retried by every container start)
RESTART_AFTER_S = 10.0
#: namespaces a hook and the agent must share (the OCI pid, paths, cgroups and netdevs in a
#: request mean something only there); a hook starts an agent only when it shares them with
#: pid 1, since one started in a private mount or pid namespace would serve nobody else
NAMESPACES = ("pid", "mnt", "net", "cgroup")


def peer_uid(sock) -> int:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    from _socket import SO_PEERCRED, SOL_SOCKET

    return decode_ucred(sock.getsockopt(SOL_SOCKET, SO_PEERCRED, UCRED_BYTES))[1]


def read_reply(sock, deadline: float) -> bytes | None:
    """The reply body after any :data:`~numa_pin.agent.protocol.KEEPALIVE` bytes, or None when
    the agent hangs up, goes quiet for :data:`~numa_pin.agent.protocol.STALL_S` seconds, sends
    a frame over the reply limit, or ``deadline`` (``time.monotonic``) passes. Raises OSError
    (TimeoutError included) from the socket."""
    from time import monotonic

    buf = b""
    size = -1
    while True:
        if size < 0:
            buf = buf.lstrip(KEEPALIVE)
            if len(buf) >= HEADER_BYTES:
                size = int.from_bytes(buf[:HEADER_BYTES], "big")
                if size > MAX_REPLY_BYTES:
                    return None
                buf = buf[HEADER_BYTES:]
        if size >= 0 and len(buf) >= size:
            return buf[:size]
        left = deadline - monotonic()
        if left <= 0:
            return None
        sock.settimeout(min(STALL_S, left))
        chunk = sock.recv(1 << 16)
        if not chunk:
            return None
        buf += chunk


def try_agent(argv: Sequence[str], stdin: bytes, env: Mapping[str, str], path: str | None = None) -> int | None:
    """Run the hook ``argv`` with ``stdin`` in the warm agent; return its exit code, or None.

    The agent's stderr is written to ``sys.stderr``, its stdout (``precreate``) to
    ``sys.stdout``. None means "run it in-process": nothing
    listens at the socket, the listener is neither root nor this process's uid, the request
    is too large, or the exchange failed at any point (before or after the request was sent).
    Never raises for socket or protocol trouble.
    """
    return ask_agent(argv, stdin, env, path)[0]


def ask_agent(argv: Sequence[str], stdin: bytes, env: Mapping[str, str],
              path: str | None = None, anchored: bool = False) -> tuple[int | None, bool]:
    """:func:`try_agent`, and whether the reason for a None was that no agent listens at all
    (no socket, or a socket nobody accepts on): the case in which :func:`start_agent` helps.
    ``anchored``: this process is the hook the runtime started (its start begins the budget)."""
    try:
        import _socket
    except ImportError:
        return None, False
    try:
        cwd = posix.getcwd()
    except OSError:  # a deleted working directory: relative paths mean nothing to the agent
        return None, False
    try:
        request = frame(encode_request(argv, stdin, env, cwd, anchored=anchored))
    except ImportError:  # an interpreter without the _json accelerator
        return None, False
    if len(request) > MAX_REQUEST_BYTES + HEADER_BYTES:
        return None, False
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError:
        return None, False
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(path or socket_path(env))
        except (FileNotFoundError, ConnectionRefusedError):
            return None, True
        if peer_uid(sock) not in (0, posix.geteuid()):
            return None, False
        # a stopped or frozen agent still completes connect() on its listen backlog: send the
        # request only once a live process of the agent has accepted it, so an agent that
        # wakes up after this hook gave up finds nothing to run (docs/agent.md)
        sock.settimeout(STALL_S)
        if sock.recv(1) != ACCEPTED:  # a refusal frame, a hang-up
            return None, False
        sock.sendall(request)
        from time import monotonic

        body = read_reply(sock, monotonic() + REPLY_TIMEOUT_S)
    except (OSError, ImportError):  # EACCES, timeouts (a stalled agent), EPIPE, ECONNRESET
        return None, False
    finally:
        sock.close()
    reply = decode_reply(body) if body is not None else None
    if reply is None:
        return None, False
    rc, err, out = reply
    if out:  # precreate: the config the runtime is to use
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()
    return rc, False


def namespace_mismatch(peer_pid: int, proc_root: str = "/proc", names: Sequence[str] = NAMESPACES) -> str | None:
    """The first namespace in which ``peer_pid`` differs from the calling process, or None.

    Compares the ``<proc_root>/<pid>/ns/<name>`` link targets (``pid:[4026531836]``). A kind
    this kernel does not have (no link for ``self``) is skipped; a peer whose link cannot be
    read (gone, or pid 0: not visible from this pid namespace) counts as different.
    """
    import os

    for name in names:
        try:
            mine = os.readlink(os.path.join(proc_root, "self", "ns", name))
        except OSError:
            continue
        try:
            theirs = os.readlink(os.path.join(proc_root, str(peer_pid), "ns", name)) if peer_pid > 0 else None
        except OSError:
            theirs = None
        if theirs != mine:
            return name
    return None


def host_namespaces(proc_root: str) -> bool:
    """Whether this process shares :data:`NAMESPACES` with pid 1, or, where pid 1's links
    cannot be read (an init that is not dumpable), with pid 2, the kernel's ``kthreadd``, which
    lives in the initial namespaces. False when neither can be read."""
    import os

    for ref in (1, 2):
        try:
            os.readlink(f"{proc_root}/{ref}/ns/mnt")
        except OSError:
            continue
        return namespace_mismatch(ref, proc_root) is None
    return False


def autostart_allowed(env: Mapping[str, str], proc_root: str = "/proc") -> bool:
    """Whether a hook that found no agent may start one: root (a rootless hook never touches the
    node's state), not turned off (``NUMA_PIN_NO_AGENT=1`` or ``NUMA_PIN_AGENT_AUTOSTART=0``),
    and in pid 1's namespaces."""
    import os

    if os.geteuid() != 0 or env.get(NO_AGENT_ENV) == "1" or env.get(AUTOSTART_ENV) == "0":
        return False
    return host_namespaces(proc_root)


def start_agent(env: Mapping[str, str], path: str | None = None, *, now: float | None = None,
                idle_exit_s: int = IDLE_EXIT_S, proc_root: str = "/proc", run_root: str = "/run") -> int | None:
    """Start ``numa-pin serve --idle-exit`` on the agent socket, detached; return its pid, or
    None when it was not started.

    The agent gets a session of its own, ``/dev/null`` for stdin, stdout and stderr (a runtime
    waits for every holder of the hook's output pipes) and no other inherited descriptor, and
    this process does not wait for it. At most one start per :data:`RESTART_AFTER_S`:
    ``<socket>.start`` records the last one (created without following a symlink); several agents
    started at once are harmless, the first to take ``<socket>.lock`` serves and the others exit
    before importing anything more. Under systemd the agent is started as a transient service
    (:func:`service_manager_argv`); the pid returned is then ``systemd-run``'s.
    Never raises.
    """
    import os
    import time

    sock = path or socket_path(env)
    stamp = sock + ".start"
    now = time.time() if now is None else now
    try:
        if now - os.lstat(stamp).st_mtime < RESTART_AFTER_S:
            return None
    except OSError:
        pass
    try:
        fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.utime(fd, (now, now))
        finally:
            os.close(fd)
    except OSError:
        pass  # no directory yet (the agent makes it) or not ours: start anyway, unstamped
    # -I: neither the runtime's working directory (the bundle) nor PYTHON* variables on sys.path
    argv = [sys.executable, "-I", "-m", "numa_pin.cli.main", "serve", "--socket", sock, "--idle-exit", str(idle_exit_s)]
    if env.get(AGENT_LOG_ENV):  # its stderr is /dev/null: the request log is where it can be watched
        argv += ["--log", env[AGENT_LOG_ENV]]
    argv = service_manager_argv(argv, sock, env, run_root) or argv
    child_env = {k: v for k, v in env.items() if not k.startswith("LISTEN_")}
    null = os.devnull
    actions: list[tuple] = [
        (os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    # and nothing else a runtime may have left open to its hook: a pipe the agent kept would
    # hold up whoever waits for its end
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited_fds(proc_root)]
    try:
        return os.posix_spawn(argv[0], argv, child_env, setsid=True, file_actions=actions)
    except OSError:
        return None


def service_manager_argv(argv: Sequence[str], sock: str, env: Mapping[str, str],
                         run_root: str = "/run") -> list[str] | None:
    """``argv`` run as a transient systemd service, or None where systemd is not the init system
    (``<run_root>/systemd/system`` is missing) or ``systemd-run`` is not on ``PATH``.

    Under systemd an agent started plainly would stay in the cgroup of the hook that started it,
    which for podman and CRI-O is the container's conmon scope: systemd kills it when that
    container is removed, and it keeps the scope alive until then. ``systemd-run`` gives it a
    service of its own in ``system.slice``. The unit is named after the socket, so a second start
    while it runs fails at once, and ``--collect`` removes it when the agent exits."""
    import os

    if not os.path.isdir(f"{run_root}/systemd/system"):
        return None
    for directory in (env.get("PATH") or "/usr/sbin:/usr/bin:/sbin:/bin").split(":"):
        tool = f"{directory}/systemd-run"
        if directory and os.access(tool, os.X_OK):
            break
    else:
        return None
    from binascii import crc32

    unit = f"numa-pin-agent-{crc32(sock.encode('utf-8', 'surrogateescape')):08x}"
    return [tool, "--quiet", "--collect", "--no-block", f"--unit={unit}",
            "--description=numa-pin warm agent, started on demand by numa-pin-hook", "--", *argv]


def inherited_fds(proc_root: str = "/proc") -> list[int]:
    """This process's file descriptors above 2 that a child would inherit."""
    import os

    try:
        names = os.listdir(f"{proc_root}/self/fd")
    except OSError:
        return []
    fds = []
    for name in names:
        try:
            fd = int(name)
            if fd > 2 and os.get_inheritable(fd):
                fds.append(fd)
        except (ValueError, OSError):  # the listing's own descriptor, closed by now
            continue
    return fds

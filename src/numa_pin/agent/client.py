"""The hook's side of the warm agent (``numa-pin serve``): hand one admission to it, or say no.

:func:`try_agent` returns the hook's exit code when the agent ran the hook, and None whenever
the caller must run the hook in-process instead: no socket, nothing answering, a server of
another uid, a protocol error, a version mismatch, or a server that died after the request
was sent. The last case is safe because admission and release are idempotent (an admission
that finds the container's grant re-applies it), see ``docs/agent.md``.

This module runs on every container start, so it imports only C modules that are already
compiled into the interpreter or cost well under a millisecond: ``_socket`` instead of
:mod:`socket` (which pulls in :mod:`enum` and :mod:`selectors`), ``_json`` instead of
:mod:`json` (which pulls in :mod:`re`) and ``binascii`` instead of :mod:`base64`. Together
the public modules would add about 15 ms to a 13 ms interpreter start; these add about 1 ms.

The wire format is :mod:`numa_pin.agent.protocol`.
"""

from __future__ import annotations

import os
import sys
from _collections_abc import Mapping, Sequence  # loaded at interpreter start; collections.abc is not

from numa_pin.agent.protocol import (
    HEADER_BYTES,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    decode_reply,
    encode_request,
    frame,
    socket_path,
)

#: the agent must accept the connection this fast, or the hook runs in-process
CONNECT_TIMEOUT_S = 0.5
#: how long the hook waits for the verdict (the runtime's own hook timeout is shorter)
REPLY_TIMEOUT_S = 60.0


def peer_uid(sock) -> int:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    from _socket import SO_PEERCRED, SOL_SOCKET

    cred = sock.getsockopt(SOL_SOCKET, SO_PEERCRED, 12)  # struct ucred {pid, uid, gid}
    return int.from_bytes(cred[4:8], sys.byteorder)


def _recv_exact(sock, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def try_agent(argv: Sequence[str], stdin: bytes, env: Mapping[str, str], path: str | None = None) -> int | None:
    """Run the hook ``argv`` with ``stdin`` in the warm agent; return its exit code, or None.

    The agent's stderr is written to ``sys.stderr``. None means "run it in-process": nothing
    listens at the socket, the listener is neither root nor this process's uid, the request
    is too large, or the exchange failed at any point (before or after the request was sent).
    Never raises for socket or protocol trouble.
    """
    try:
        import _socket
    except ImportError:
        return None
    try:
        cwd = os.getcwd()
    except OSError:  # a deleted working directory: relative paths mean nothing to the agent
        return None
    try:
        request = frame(encode_request(argv, stdin, env, cwd))
    except ImportError:  # an interpreter without the _json accelerator
        return None
    if len(request) > MAX_REQUEST_BYTES + HEADER_BYTES:
        return None
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(path or socket_path(env))
        if peer_uid(sock) not in (0, os.geteuid()):
            return None
        sock.settimeout(REPLY_TIMEOUT_S)
        sock.sendall(request)
        header = _recv_exact(sock, HEADER_BYTES)
        if header is None:
            return None
        size = int.from_bytes(header, "big")
        body = _recv_exact(sock, size) if size <= MAX_REPLY_BYTES else None
    except (OSError, ImportError):  # ENOENT, ECONNREFUSED, EACCES, timeouts, EPIPE, ECONNRESET
        return None
    finally:
        sock.close()
    reply = decode_reply(body) if body is not None else None
    if reply is None:
        return None
    rc, err = reply
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()
    return rc

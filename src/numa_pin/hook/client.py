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

Wire format (both directions): a 4-byte big-endian length, then that many bytes of UTF-8
JSON. Request: ``{"v": 1, "version": str, "argv": [str], "stdin": base64, "env": {str: str},
"cwd": str}``. Reply: ``{"rc": int, "stderr": str}``, or ``{"fallback": str}`` when the
server refuses (the client then returns None).
"""

from __future__ import annotations

import os
import sys
from _collections_abc import Mapping, Sequence  # loaded at interpreter start; collections.abc is not

from numa_pin import __version__

#: protocol revision; the server refuses any other
PROTOCOL = 1
#: where ``numa-pin serve`` listens unless told otherwise
DEFAULT_SOCKET = "/run/numa-pin/agent.sock"
#: environment variable naming the socket (the hook and the server both read it)
SOCKET_ENV = "NUMA_PIN_AGENT_SOCKET"
#: set to ``1`` and the hook never asks the agent
NO_AGENT_ENV = "NUMA_PIN_NO_AGENT"
#: the only environment variables the agent applies for a request (all the hook path reads)
PASSED_ENV = ("NUMA_PIN_CONFIG", "NUMA_PIN_CACHE_DIR", "NUMA_PIN_DEBUG")
#: the hook reads at most this much of stdin (one byte over the OCI state limit of
#: ``numa_pin.hook.oci.MAX_DOCUMENT_BYTES``, so an oversized state is still reported as such)
MAX_STDIN_BYTES = (4 << 20) + 1
#: largest request / reply frame either side accepts
MAX_REQUEST_BYTES = 8 << 20
MAX_REPLY_BYTES = 2 << 20
#: the agent must accept the connection this fast, or the hook runs in-process
CONNECT_TIMEOUT_S = 0.5
#: how long the hook waits for the verdict (the runtime's own hook timeout is shorter)
REPLY_TIMEOUT_S = 60.0
_HEADER = 4


def socket_path(env: Mapping[str, str], flag: str | None = None) -> str:
    """The agent socket: ``flag``, else ``$NUMA_PIN_AGENT_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return flag or env.get(SOCKET_ENV) or DEFAULT_SOCKET


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length (4 bytes, big-endian)."""
    return len(body).to_bytes(_HEADER, "big") + body


def encode_request(argv: Sequence[str], stdin: bytes, env: Mapping[str, str], cwd: str) -> bytes:
    """The request JSON (not framed), built without :mod:`json`. Pure."""
    from _json import encode_basestring_ascii as q
    from binascii import b2a_base64

    passed = ",".join(f"{q(k)}:{q(env[k])}" for k in PASSED_ENV if k in env)
    text = (
        f'{{"v":{PROTOCOL},"version":{q(__version__)},"argv":[{",".join(q(a) for a in argv)}],'
        f'"stdin":"{b2a_base64(stdin, newline=False).decode("ascii")}","env":{{{passed}}},"cwd":{q(cwd)}}}'
    )
    return text.encode("ascii")


class _ScanContext:
    """What ``_json.make_scanner`` reads from a :class:`json.JSONDecoder`."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        raise ValueError(f"{name} is not allowed")


def decode_reply(body: bytes) -> tuple[int, str] | None:
    """``(rc, stderr)`` from a reply body, or None for a refusal or anything malformed. Pure."""
    try:
        text = body.decode("utf-8")
        from _json import make_scanner

        doc, end = make_scanner(_ScanContext())(text, 0)
    except (ImportError, UnicodeDecodeError, ValueError, StopIteration, TypeError, RecursionError):
        return None
    if end != len(text) or not isinstance(doc, dict):
        return None
    if "fallback" in doc:
        return None
    rc, err = doc.get("rc"), doc.get("stderr", "")
    if type(rc) is not int or not isinstance(err, str):
        return None
    return rc, err


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
    if len(request) > MAX_REQUEST_BYTES + _HEADER:
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
        header = _recv_exact(sock, _HEADER)
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

"""The warm agent's wire protocol, shared by the hook (client) and ``numa-pin serve``. Pure.

Frames in both directions: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.
The exchange: the hook connects and waits for :data:`ACCEPTED` (one byte the agent sends once a
process of its own has accepted the connection); only then does it send its request. While the
admission runs, the agent sends a :data:`KEEPALIVE` byte every :data:`KEEPALIVE_S` seconds; then
the reply frame (whose first byte is always 0: replies are far below 16 MiB). A hook that sees
no byte for :data:`STALL_S` seconds gives up and runs in-process (see ``docs/agent.md``). Request:
``{"v": 1, "version": str, "argv": [str], "stdin": base64, "env": {str: str}, "cwd": str,
"home": str, "anchored": true}``, where ``home`` is the directory the hook loaded numa_pin from
(an agent started from another installation sends such a hook back; older hooks leave it out)
and ``anchored`` (only when true) says the peer is the hook process itself: the admission's
budget then counts from that process's start, which the agent reads from the kernel.
Reply: ``{"rc": int, "stderr": str, "stdout": base64}`` (``stdout``: what ``precreate`` prints,
the config the runtime is to use; empty for the other stages), or ``{"fallback": str}`` when the
server refuses (the hook then runs in-process).

The client half runs on every container start, so it uses only C modules that are already
compiled into the interpreter: ``_json`` instead of :mod:`json` (which pulls in :mod:`re`) and
``binascii`` instead of :mod:`base64`. The server half imports :mod:`json` when it runs; it
decodes and checks a request in :mod:`numa_pin.agent.request` (``decode_request``, ``refusal``),
where the decoded ``Request`` is a record.
"""

from __future__ import annotations

from binascii import Error as Base64Error
from binascii import a2b_base64

import numa_pin
from numa_pin import __version__

TYPE_CHECKING = False  # not even os or collections.abc: the hook starts without site, which loads them
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: protocol revision; the server refuses any other (2: the accept byte and keepalives; 3: the
#: reply carries stdout, so podman's precreate is served too: an older agent sends it back)
PROTOCOL = 3
#: the agent's first byte on a connection: a live process accepted it, the hook may send
ACCEPTED = b"A"
#: sent every :data:`KEEPALIVE_S` seconds while an admission runs, before the reply
KEEPALIVE = b"."
KEEPALIVE_S = 0.25
#: a hook that hears nothing (no accept, no keepalive, no reply) for this long runs in-process:
#: the agent is stopped or frozen (a connection on the listen backlog is accepted by nobody)
STALL_S = 2.0


#: the directory this process loaded numa_pin from (a request's ``home``)
HOME = (numa_pin.__file__ or "./").rpartition("/")[0] or "."
#: the bytes ``getsockopt(SO_PEERCRED)`` is asked for: ``struct ucred`` (:func:`decode_ucred`)
UCRED_BYTES = 12
#: where ``numa-pin serve`` listens unless told otherwise
DEFAULT_SOCKET = "/run/numa-pin/agent.sock"


#: environment variable naming the socket (the hook and the server both read it)
SOCKET_ENV = "NUMA_PIN_AGENT_SOCKET"


#: set to ``1`` and the hook never asks the agent (nor starts one)
NO_AGENT_ENV = "NUMA_PIN_NO_AGENT"
#: set to ``0`` and the hook uses an agent that answers but never starts one
AUTOSTART_ENV = "NUMA_PIN_AGENT_AUTOSTART"
#: a file an agent a hook starts appends its JSON request log to (``numa-pin serve --log``)
AGENT_LOG_ENV = "NUMA_PIN_AGENT_LOG"


#: the only environment variables the agent applies for a request (all the hook path reads)
PASSED_ENV = ("NUMA_PIN_CONFIG", "NUMA_PIN_CACHE_DIR", "NUMA_PIN_DEBUG")


#: the hook reads at most this much of stdin (one byte over the OCI state limit of
#: ``numa_pin.hook.oci.MAX_DOCUMENT_BYTES``, so an oversized state is still reported as such)
MAX_STDIN_BYTES = (4 << 20) + 1


#: largest request / reply frame either side accepts
MAX_REQUEST_BYTES = 8 << 20
#: how deep a request may nest (a real one: an object of lists and objects of strings)
MAX_REQUEST_DEPTH = 8


#: (a precreate's stdout is a whole config, at most MAX_STDIN_BYTES, in base64, and stderr)
MAX_REPLY_BYTES = 8 << 20


#: bytes of the length prefix of every frame
HEADER_BYTES = 4


def socket_path(env: Mapping[str, str], flag: str | None = None) -> str:
    """The agent socket: ``flag``, else ``$NUMA_PIN_AGENT_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return flag or env.get(SOCKET_ENV) or DEFAULT_SOCKET


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length (4 bytes, big-endian)."""
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def encode_request(argv: Sequence[str], stdin: bytes, env: Mapping[str, str], cwd: str, home: str = HOME,
                   anchored: bool = False) -> bytes:
    """The request JSON (not framed), built without :mod:`json`. Pure."""
    from _json import encode_basestring_ascii as q
    from binascii import b2a_base64

    passed = ",".join(f"{q(k)}:{q(env[k])}" for k in PASSED_ENV if k in env)
    tail = ',"anchored":true' if anchored else ""
    text = (
        f'{{"v":{PROTOCOL},"version":{q(__version__)},"argv":[{",".join(q(a) for a in argv)}],'
        f'"stdin":"{b2a_base64(stdin, newline=False).decode("ascii")}","env":{{{passed}}},"cwd":{q(cwd)},'
        f'"home":{q(home)}{tail}}}'
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


def decode_reply(body: bytes) -> tuple[int, str, bytes] | None:
    """``(rc, stderr, stdout)`` from a reply body, or None for a refusal or anything malformed
    (``stdout`` absent: empty). Pure."""
    try:
        text = body.decode("utf-8")
        from _json import make_scanner

        doc, end = make_scanner(_ScanContext())(text, 0)  # type: ignore[arg-type]
    except (ImportError, UnicodeDecodeError, ValueError, StopIteration, TypeError, RecursionError):
        return None
    if end != len(text) or not isinstance(doc, dict):
        return None
    if "fallback" in doc:
        return None
    rc, err, out = doc.get("rc"), doc.get("stderr", ""), doc.get("stdout", "")
    if type(rc) is not int or not isinstance(err, str) or not isinstance(out, str):
        return None
    try:
        data = a2b_base64(out.encode("ascii"), strict_mode=True)
    except (Base64Error, UnicodeEncodeError):
        return None
    return rc, err, data


#: stderr longer than this is cut (a real hook writes one line, or a traceback)
MAX_STDERR_CHARS = 1 << 20


def encode_reply(rc: int, stderr: str, stdout: bytes = b"") -> bytes:
    """A framed ``{"rc", "stderr", "stdout"}`` reply; stderr past :data:`MAX_STDERR_CHARS` is cut.
    Raises ValueError when ``stdout`` is larger than a hook's stdin may be (the in-process hook
    then answers)."""
    if len(stderr) > MAX_STDERR_CHARS:
        stderr = stderr[:MAX_STDERR_CHARS] + "\n[numa-pin agent: stderr cut]\n"
    if len(stdout) > MAX_STDIN_BYTES:
        raise ValueError(f"a hook's stdout of {len(stdout)} bytes is larger than {MAX_STDIN_BYTES}")
    import base64
    import json

    body = {"rc": rc, "stderr": stderr, "stdout": base64.b64encode(stdout).decode("ascii")}
    return frame(json.dumps(body).encode("ascii"))


def encode_fallback(reason: str) -> bytes:
    """A framed reply that sends the hook back to run in-process."""
    import json

    return frame(json.dumps({"fallback": reason}).encode("ascii"))


def decode_ucred(raw: bytes) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the ``struct ucred`` that ``getsockopt(SO_PEERCRED)`` returns
    (:data:`UCRED_BYTES`: three 32-bit numbers in this machine's byte order, read unsigned as
    the kernel's ``uid_t`` and ``gid_t`` are). Pure."""
    from sys import byteorder

    return (int.from_bytes(raw[0:4], byteorder), int.from_bytes(raw[4:8], byteorder),
            int.from_bytes(raw[8:12], byteorder))


def peer_allowed(uid: int, server_uid: int) -> bool:
    """Only root and the server's own user may have admissions run. Pure."""
    return uid == 0 or uid == server_uid


__all__ = [
    "ACCEPTED",
    "DEFAULT_SOCKET",
    "KEEPALIVE",
    "KEEPALIVE_S",
    "STALL_S",
    "HEADER_BYTES",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_STDERR_CHARS",
    "MAX_STDIN_BYTES",
    "AGENT_LOG_ENV",
    "AUTOSTART_ENV",
    "HOME",
    "NO_AGENT_ENV",
    "PASSED_ENV",
    "PROTOCOL",
    "SOCKET_ENV",
    "UCRED_BYTES",
    "decode_reply",
    "decode_ucred",
    "encode_fallback",
    "encode_reply",
    "encode_request",
    "frame",
    "peer_allowed",
    "socket_path",
]

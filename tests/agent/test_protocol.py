"""The warm agent's wire protocol on its own: both halves are pure, so they are tested as values.

The client half (``protocol.encode_request``, ``protocol.decode_reply``) avoids :mod:`json`; the
server half (``request.decode_request``, ``protocol.encode_reply``) uses it. :mod:`json` is the
oracle for each direction.
"""

from __future__ import annotations

import json
import os
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin import __version__
from numa_pin.agent import client, protocol, request
from numa_pin.base.record import replace

_text = st.text(max_size=40)
_env = st.dictionaries(st.sampled_from(protocol.PASSED_ENV), _text, max_size=len(protocol.PASSED_ENV))


def _unframe(data: bytes) -> bytes:
    size = int.from_bytes(data[: protocol.HEADER_BYTES], "big")
    body = data[protocol.HEADER_BYTES :]
    assert len(body) == size
    return body


@given(argv=st.lists(_text, max_size=5), stdin=st.binary(max_size=200), env=_env,
       cwd=st.text(min_size=1, max_size=20).map(lambda s: "/" + s), anchored=st.booleans())
def test_request_round_trip(argv, stdin, env, cwd, anchored):
    body = protocol.encode_request(argv, stdin, {**env, "UNRELATED": "x"}, cwd, anchored=anchored)
    assert json.loads(body)["v"] == protocol.PROTOCOL  # the hand-built JSON is real JSON
    req = request.decode_request(body)
    assert req == request.Request(protocol.PROTOCOL, __version__, tuple(argv), stdin, env, cwd, protocol.HOME,
                                  anchored)


@given(rc=st.integers(0, 255), err=st.text(max_size=100), out=st.binary(max_size=300))
def test_reply_round_trip(rc, err, out):
    assert protocol.decode_reply(_unframe(protocol.encode_reply(rc, err, out))) == (rc, err, out)


def test_a_reply_without_stdout_has_none():
    assert protocol.decode_reply(b'{"rc": 0, "stderr": ""}') == (0, "", b"")


def test_stdout_larger_than_a_hooks_stdin_is_not_sent():
    with pytest.raises(ValueError, match="larger than"):
        protocol.encode_reply(0, "", b"x" * (protocol.MAX_STDIN_BYTES + 1))
    assert len(protocol.encode_reply(0, "", b"x" * protocol.MAX_STDIN_BYTES)) <= protocol.MAX_REPLY_BYTES


def test_fallback_reply_means_in_process():
    assert protocol.decode_reply(_unframe(protocol.encode_fallback("busy"))) is None


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'{"rc": "0"}', b'{"rc": 0, "stderr": 1}', b'{"rc": 0} x', b"\xff", b'{"rc": NaN}',
     b"[" * 100_000, b'{"rc": 0, "stdout": 1}', b'{"rc": 0, "stdout": "not base64!"}'],
    ids=["empty", "list", "rc-string", "stderr-int", "trailing", "not-utf8", "nan", "deep", "stdout-int",
         "stdout-not-base64"],
)
def test_malformed_replies_are_refused(body):
    assert protocol.decode_reply(body) is None


def test_stderr_is_cut_at_the_limit():
    rc, err, _ = protocol.decode_reply(_unframe(protocol.encode_reply(3, "x" * (protocol.MAX_STDERR_CHARS + 10))))
    assert rc == 3 and len(err) < protocol.MAX_STDERR_CHARS + 100 and err.endswith("cut]\n")


@pytest.mark.parametrize(
    "doc, field",
    [({"v": "1"}, "'v'"), ({"version": 1}, "'version'"), ({"argv": "x"}, "'argv'"),
     ({"stdin": "***"}, "'stdin'"), ({"env": {"PATH": "/"}}, "'env'"), ({"cwd": "rel"}, "'cwd'"),
     ({"home": ["/x"]}, "'home'"), ({"anchored": 1}, "'anchored'")],
    ids=["v", "version", "argv", "stdin", "env", "cwd", "home", "anchored"],
)
def test_bad_request_names_the_field(doc, field):
    good = json.loads(protocol.encode_request([], b"", {}, "/"))
    with pytest.raises(ValueError, match=field):
        request.decode_request(json.dumps({**good, **doc}).encode())


def test_refusal_and_peer_rules():
    req = request.Request(protocol.PROTOCOL, "9.9", (), b"", {}, "/")
    assert "restart" in request.refusal(req, server_version="1.0")
    assert request.refusal(replace(req, version="1.0"), server_version="1.0") is None
    assert protocol.peer_allowed(0, 1000) and protocol.peer_allowed(1000, 1000)
    # a hook of another installation (another checkout, a pip install beside the package) is
    # sent back; a hook that does not say where it runs from (an older one) is served
    mine = replace(req, version="1.0", home="/opt/a/numa_pin")
    assert "/opt/b/numa_pin" in request.refusal(mine, server_version="1.0", server_home="/opt/b/numa_pin")
    assert request.refusal(mine, server_version="1.0", server_home="/opt/a/numa_pin") is None
    assert request.refusal(replace(req, version="1.0"), server_version="1.0", server_home="/opt/b") is None
    assert not protocol.peer_allowed(1001, 1000)


def test_request_names_this_installation():
    doc = json.loads(protocol.encode_request([], b"", {}, "/"))
    assert doc["home"] == protocol.HOME and os.path.isfile(os.path.join(doc["home"], "__init__.py"))
    assert request.decode_request(json.dumps({k: v for k, v in doc.items() if k != "home"}).encode()).home is None


def test_socket_path_precedence():
    assert protocol.socket_path({}, None) == protocol.DEFAULT_SOCKET
    assert protocol.socket_path({protocol.SOCKET_ENV: "/e"}, None) == "/e"
    assert protocol.socket_path({protocol.SOCKET_ENV: "/e"}, "/f") == "/f"


@pytest.mark.parametrize("home, cwd, server_home, same", [
    ("/usr/lib/python3/dist-packages/numa_pin", "/", "/usr/lib/python3/dist-packages/numa_pin", True),
    ("src/numa_pin", "/work/main", "/work/main/src/numa_pin", True),  # PYTHONPATH=src, no site
    ("/work/main/src/../src/numa_pin", "/", "/work/main/src/numa_pin", True),
    ("src/numa_pin", "/elsewhere", "/work/main/src/numa_pin", False),
    ("/opt/other/numa_pin", "/", "/work/main/src/numa_pin", False),
], ids=["same", "relative-to-cwd", "unnormalized", "relative-elsewhere", "other-install"])
def test_same_home(home, cwd, server_home, same):
    assert request.same_home(home, cwd, server_home) is same


class _Socket:
    """A connection whose ``SO_PEERCRED`` answer is ``raw``."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option, size) == (socket.SOL_SOCKET, socket.SO_PEERCRED, protocol.UCRED_BYTES)
        return self.raw


# (id, pid, uid, gid): struct ucred as the kernel fills it (pid_t, uid_t, gid_t)
UCREDS = [
    ("root", 1, 0, 0),
    ("user", 4242, 1000, 1000),
    ("nobody", 77, 65534, 65534),
    ("uid_above_2_31", 99, 2**31 + 5, 2**32 - 2),  # systemd's dynamic user ranges: uid_t is unsigned
]


@pytest.mark.parametrize(("pid", "uid", "gid"), [u[1:] for u in UCREDS], ids=[u[0] for u in UCREDS])
def test_both_ends_read_the_peer_alike(pid, uid, gid):
    raw = struct.pack("=iII", pid, uid, gid)  # the oracle: struct ucred's layout in this byte order
    assert protocol.decode_ucred(raw) == (pid, uid, gid)
    assert request.peer_credentials(_Socket(raw)) == request.Peer(pid, uid, gid)
    assert client.peer_uid(_Socket(raw)) == uid


def test_a_real_peer_is_this_process():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert request.peer_credentials(a) == request.Peer(os.getpid(), os.geteuid(), os.getegid())
        assert client.peer_uid(b) == os.geteuid()

"""NRI's wire (numa_pin.nri.wire) against the layout of containerd/nri's mux and containerd/ttrpc's
channel, written out here byte by byte (the oracle is the Go sources' header layout, not the
module's own structs)."""

from __future__ import annotations

import pytest

from numa_pin.errors import NriError
from numa_pin.nri import wire


def _go_frame(conn: int, stream: int, kind: int, flags: int, payload: bytes) -> bytes:
    """mux.go writes ``PutUint32(hdr[0:4], id); PutUint32(hdr[4:8], size)``; channel.go writes
    ``PutUint32(p[:4], Length); PutUint32(p[4:8], StreamID); p[8] = Type; p[9] = Flags``."""
    body = len(payload).to_bytes(4, "big") + stream.to_bytes(4, "big") + bytes([kind, flags]) + payload
    return conn.to_bytes(4, "big") + len(body).to_bytes(4, "big") + body


def test_a_message_is_one_frame_laid_out_as_nri_and_ttrpc_write_it() -> None:
    message = wire.Message(wire.RUNTIME_CONN, 7, wire.REQUEST, b"\x0a\x03abc", flags=0)
    assert wire.encode(message) == _go_frame(2, 7, 1, 0, b"\x0a\x03abc")


def _split(data: bytes, cuts: tuple[int, ...]) -> list[bytes]:
    edges = [0, *[c for c in cuts if c < len(data)], len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


TWO = _go_frame(1, 1, wire.REQUEST, 0, b"x" * 20) + _go_frame(2, 3, wire.RESPONSE, 0, b"")
# one ttrpc message written in two frames (Go's bufio.Writer flushes a large message in pieces)
BODY = (5).to_bytes(4, "big") + (9).to_bytes(4, "big") + bytes([wire.REQUEST, 0]) + b"hello"
SPLIT_MESSAGE = (1).to_bytes(4, "big") + (4).to_bytes(4, "big") + BODY[:4] \
    + (1).to_bytes(4, "big") + (len(BODY) - 4).to_bytes(4, "big") + BODY[4:]


@pytest.mark.parametrize(
    ("data", "cuts", "expected"),
    [
        (TWO, (), [(1, 1, wire.REQUEST, b"x" * 20), (2, 3, wire.RESPONSE, b"")]),
        (TWO, tuple(range(1, len(TWO))), [(1, 1, wire.REQUEST, b"x" * 20), (2, 3, wire.RESPONSE, b"")]),
        (TWO, (3, 9, 17, 37), [(1, 1, wire.REQUEST, b"x" * 20), (2, 3, wire.RESPONSE, b"")]),
        (SPLIT_MESSAGE, (), [(1, 9, wire.REQUEST, b"hello")]),
        (SPLIT_MESSAGE, (8, 12, 20), [(1, 9, wire.REQUEST, b"hello")]),
    ],
    ids=["whole", "byte-by-byte", "odd-cuts", "message-over-two-frames", "message-over-two-frames-cut"],
)
def test_the_decoder_finds_every_message_wherever_the_reads_end(data, cuts, expected) -> None:
    decoder = wire.Decoder()
    got = [m for chunk in _split(data, cuts) for m in decoder.feed(chunk)]
    assert [(m.conn, m.stream, m.kind, m.payload) for m in got] == expected


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ((3).to_bytes(4, "big") + (0).to_bytes(4, "big"), "unknown connection 3"),
        ((1).to_bytes(4, "big") + (wire.MAX_FRAME + 1).to_bytes(4, "big"), "over the limit"),
        ((1).to_bytes(4, "big") + (10).to_bytes(4, "big") + (wire.MAX_MESSAGE + 1).to_bytes(4, "big")
         + bytes(6), "over the limit"),
        (_go_frame(1, 1, 9, 0, b""), "unknown type 9"),
    ],
    ids=["unknown-connection", "frame-too-large", "message-too-large", "unknown-type"],
)
def test_what_the_decoder_refuses(data, words) -> None:
    with pytest.raises(NriError, match=words):
        list(wire.Decoder().feed(data))


def test_a_payload_over_ttrpcs_limit_is_not_sent() -> None:
    with pytest.raises(NriError, match="over the limit"):
        wire.encode(wire.Message(1, 1, wire.RESPONSE, bytes(wire.MAX_MESSAGE + 1)))

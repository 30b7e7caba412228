"""NRI's wire: ttrpc messages inside multiplexed frames on one Unix socket.

A plugin connects to the runtime's socket (``/var/run/nri/nri.sock``). NRI multiplexes two
logical connections over it (containerd/nri ``pkg/net/multiplex``): connection 1 carries the
plugin's service (the runtime calls ``Configure``, ``CreateContainer``...), connection 2 the
runtime's (the plugin calls ``RegisterPlugin``). Every write is one frame, an 8-byte header
(connection id, payload length; big-endian) and the payload; a connection's payloads, joined,
are a ttrpc stream. ttrpc (containerd/ttrpc ``channel.go``) frames each message with a 10-byte
header: length (4 bytes), stream id (4), type (1: request, 2: response, 3: data) and flags (1),
then a protobuf ``Request`` or ``Response`` of at most 4 MiB.

:class:`Decoder` is the pure half (bytes in, messages out, every length bounded);
:class:`Channel` reads and writes a socket with it.
"""

from __future__ import annotations

import select
import socket
import struct
from collections.abc import Iterator

from numa_pin.base.record import record
from numa_pin.errors import NriError

MUX_HEADER = struct.Struct(">II")  # connection id, payload length
TTRPC_HEADER = struct.Struct(">IIBB")  # length, stream id, type, flags
#: the logical connections: the plugin's service, the runtime's service
PLUGIN_CONN, RUNTIME_CONN = 1, 2
CONNS = (PLUGIN_CONN, RUNTIME_CONN)
#: ttrpc message types
REQUEST, RESPONSE, DATA = 1, 2, 3
#: ttrpc's largest message, and NRI's largest frame (one message with its header)
MAX_MESSAGE = 4 << 20
MAX_FRAME = MAX_MESSAGE + TTRPC_HEADER.size
RECV_CHUNK = 1 << 16


@record
class Message:
    """One ttrpc message on one logical connection."""

    conn: int
    stream: int
    kind: int
    payload: bytes
    flags: int = 0


def frame(conn: int, data: bytes) -> bytes:
    """One multiplexed frame carrying ``data`` on ``conn``."""
    return MUX_HEADER.pack(conn, len(data)) + data


def encode(message: Message) -> bytes:
    """``message`` as it goes on the socket: one frame holding the ttrpc header and payload.

    Raises NriError for a payload over :data:`MAX_MESSAGE`."""
    if len(message.payload) > MAX_MESSAGE:
        raise NriError(f"ttrpc message of {len(message.payload)} bytes is over the limit of {MAX_MESSAGE}")
    head = TTRPC_HEADER.pack(len(message.payload), message.stream, message.kind, message.flags)
    return frame(message.conn, head + message.payload)


class Decoder:
    """Bytes from the socket in, whole ttrpc messages out (pure, bounded)."""

    def __init__(self, where: str = "NRI socket") -> None:
        self.where = where
        self._trunk = bytearray()
        self._streams: dict[int, bytearray] = {conn: bytearray() for conn in CONNS}

    def feed(self, data: bytes) -> Iterator[Message]:
        """The messages ``data`` completes. Raises NriError for an unknown connection id, a frame
        or message over the limits, or a message type ttrpc does not have."""
        self._trunk += data
        while len(self._trunk) >= MUX_HEADER.size:
            conn, size = MUX_HEADER.unpack_from(self._trunk)
            if conn not in self._streams:
                raise NriError(f"frame for unknown connection {conn}", path=self.where)
            if size > MAX_FRAME:
                raise NriError(f"frame of {size} bytes is over the limit of {MAX_FRAME}", path=self.where)
            if len(self._trunk) < MUX_HEADER.size + size:
                break
            stream = self._streams[conn]
            stream += self._trunk[MUX_HEADER.size:MUX_HEADER.size + size]
            del self._trunk[:MUX_HEADER.size + size]
            yield from self._messages(conn, stream)

    def _messages(self, conn: int, stream: bytearray) -> Iterator[Message]:
        while len(stream) >= TTRPC_HEADER.size:
            length, stream_id, kind, flags = TTRPC_HEADER.unpack_from(stream)
            if length > MAX_MESSAGE:
                raise NriError(f"ttrpc message of {length} bytes is over the limit of {MAX_MESSAGE}",
                               path=self.where)
            if kind not in (REQUEST, RESPONSE, DATA):
                raise NriError(f"ttrpc message of unknown type {kind}", path=self.where)
            end = TTRPC_HEADER.size + length
            if len(stream) < end:
                return
            payload = bytes(stream[TTRPC_HEADER.size:end])
            del stream[:end]
            yield Message(conn, stream_id, kind, payload, flags)


class Channel:
    """A connected socket speaking NRI's wire: :meth:`send` one message, :meth:`receive` the next."""

    def __init__(self, sock: socket.socket, where: str = "NRI socket") -> None:
        self.sock = sock
        self.where = where
        self._decoder = Decoder(where)
        self._ready: list[Message] = []

    def send(self, message: Message) -> None:
        try:
            self.sock.sendall(encode(message))
        except OSError as exc:
            raise NriError(f"cannot write to the runtime: {exc}", path=self.where) from exc

    def receive(self) -> Message | None:
        """The next message, or None when the runtime closed the connection."""
        while not self._ready:
            try:
                data = self.sock.recv(RECV_CHUNK)
            except OSError as exc:
                raise NriError(f"cannot read from the runtime: {exc}", path=self.where) from exc
            if not data:
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.pop(0)

    def pending(self) -> bool:
        """Whether a message has arrived (or is arriving) that :meth:`receive` would return now."""
        if self._ready:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError) as exc:
            raise NriError(f"cannot poll the runtime's socket: {exc}", path=self.where) from exc
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


__all__ = ["CONNS", "DATA", "MAX_FRAME", "MAX_MESSAGE", "PLUGIN_CONN", "REQUEST", "RESPONSE", "RUNTIME_CONN",
           "Channel", "Decoder", "Message", "encode", "frame"]

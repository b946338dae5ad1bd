"""A ZeroMQ peer that reached the RocketMQ remoting port: tell it where ZNS/1 is.

A RocketMQ frame starts with its length, a big-endian int32 that is never
negative; a ZeroMQ (ZMTP 3) peer starts with the signature byte 0xFF. When zns
runs with `--remoting` on RocketMQ's usual 9876 — the port every `zns` command
and client defaults to — a ZNS/1 client that was not told otherwise connects
there. Instead of a frame error and the client's timeout, the listener speaks
just enough ZMTP 3.0 (RFC 23: greeting, NULL mechanism, READY as a ROUTER) to
answer every request with a ZNS/1 `bad_request` error that names the request
endpoint to use. Sans-I/O: bytes in, bytes out.

What it holds is bounded and known (`buffered`, which the listener counts in
its byte budget with the replies it has not sent): one frame of at most
MAX_FRAME_BYTES being received, and the parts of one message, at most
MAX_MESSAGE_FRAMES frames of MAX_MESSAGE_BYTES together (a ZNS/1 request is one
or two frames); a peer that sends more is refused (`RemotingFrameError`), and
the listener closes it.
"""

from __future__ import annotations

import struct

import msgspec

from zns.core.errors import RemotingFrameError
from zns.core.schema import Error, encode

SIGNATURE_BYTE = 0xFF  # the first byte of every ZMTP greeting; never a remoting frame's
GREETING_BYTES = 64
# signature (FF, padding, 7F), version 3.0, mechanism NULL, as-server 0, filler.
GREETING = (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
            + b"\x00" + b"\x00" * 31)
MAX_FRAME_BYTES = 64 << 10  # far above any ZNS/1 request a lost client sends first
MAX_MESSAGE_BYTES = 64 << 10  # the frames of one message together
MAX_MESSAGE_FRAMES = 32  # as a ZNS/1 envelope (zns.drivers.server.MAX_ENVELOPE_FRAMES)
_COMMAND, _LONG, _MORE = 0x04, 0x02, 0x01


def _command(name: bytes, properties: dict[bytes, bytes]) -> bytes:
    body = bytes([len(name)]) + name + b"".join(
        bytes([len(k)]) + k + struct.pack(">I", len(v)) + v for k, v in properties.items())
    return bytes([_COMMAND, len(body)]) + body


def _message(body: bytes) -> bytes:
    if len(body) <= 255:
        return bytes([0, len(body)]) + body
    return bytes([_LONG]) + struct.pack(">Q", len(body)) + body


READY = _command(b"READY", {b"Socket-Type": b"ROUTER"})


def looks_like_zmtp(first: bytes) -> bool:
    """Does a connection's first data come from a ZeroMQ peer?"""
    return bool(first) and first[0] == SIGNATURE_BYTE


class ZmtpRedirect:
    """One connection's ZMTP side: `start()` once, then `feed(data)` with what arrives;
    each returns the bytes to send. Every ZNS/1 request gets an `error` reply with
    `message`. RemotingFrameError when the peer sends what ZMTP 3 does not allow."""

    def __init__(self, message: str) -> None:
        self.message = message
        self._buffer = bytearray()
        self._greeted = False
        # The frames of the message being received before its last: only counted, never
        # kept (the last frame is the request; what comes before is its envelope).
        self._parts = 0
        self._parts_bytes = 0

    @property
    def buffered(self) -> int:
        """Bytes held: received and not yet part of an answered message."""
        return len(self._buffer)

    @property
    def receiving(self) -> bool:
        """Is a frame or a message begun and not complete (what the frame deadline times)?"""
        return bool(self._buffer) or self._parts > 0

    def start(self) -> bytes:
        return GREETING

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = bytearray()
        if not self._greeted:
            if len(self._buffer) < GREETING_BYTES:
                return b""
            if self._buffer[0] != SIGNATURE_BYTE or self._buffer[9] != 0x7F:
                raise RemotingFrameError("not a ZMTP greeting")
            if self._buffer[10] < 3:
                raise RemotingFrameError(f"ZMTP version {self._buffer[10]} is too old")
            del self._buffer[:GREETING_BYTES]
            self._greeted = True
            out += READY
        while (frame := self._next_frame()) is not None:
            flags, body = frame
            if flags & _COMMAND:
                continue  # READY (and PING, ...): nothing to answer but the request
            self._parts += 1
            self._parts_bytes += len(body)
            if self._parts > MAX_MESSAGE_FRAMES or self._parts_bytes > MAX_MESSAGE_BYTES:
                raise RemotingFrameError(
                    f"ZMTP message of more than {MAX_MESSAGE_FRAMES} frames or "
                    f"{MAX_MESSAGE_BYTES} bytes on the remoting port")
            if not flags & _MORE:
                self._parts = self._parts_bytes = 0
                out += _message(self._reply(body))
        return bytes(out)

    def _next_frame(self) -> tuple[int, bytes] | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        flags = buf[0]
        if flags & _LONG:
            if len(buf) < 9:
                return None
            size, head = struct.unpack_from(">Q", buf, 1)[0], 9
        else:
            size, head = buf[1], 2
        if size > MAX_FRAME_BYTES:
            raise RemotingFrameError(f"ZMTP frame of {size} bytes on the remoting port")
        if len(buf) < head + size:
            return None
        body = bytes(buf[head:head + size])
        del buf[:head + size]
        return flags, body

    def _reply(self, request: bytes) -> bytes:
        """A ZNS/1 `error` for `request`, with its id when it has one."""
        try:
            fields = msgspec.msgpack.decode(request)
            request_id = fields.get("id", 0) if isinstance(fields, dict) else 0
        except msgspec.DecodeError:
            request_id = 0
        if not isinstance(request_id, int) or not 0 <= request_id < 1 << 64:
            request_id = 0
        return encode(Error(id=request_id, code="bad_request", message=self.message))

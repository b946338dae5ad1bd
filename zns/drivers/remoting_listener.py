"""The RocketMQ remoting listener: plain TCP in the server's one poller loop (PROTOCOL §12).

Thin on purpose: it accepts connections, reads bytes into each connection's
`FrameDecoder`, hands every request to `RemotingService.handle`, and writes the
replies back in request order. What to answer is decided in
`zns.core.remoting`; this module only moves bytes and keeps them bounded:

- at most `max_connections` connections; one more is accepted and closed at
  once (logged), so the backlog never fills with connections nobody serves;
- a connection's unsent replies are bounded: past `high_water` bytes it is
  not read from until they drain (a pipelining client slows down, as TCP
  would make it), and past `max_unsent` bytes it is cut off (a client that
  sends requests but never reads);
- what one connection buffers of an incoming frame is bounded by the frame
  limit (the decoder refuses a larger length at once);
- at most `read_chunk` bytes are read from one connection per pass, so one
  busy connection cannot starve the others or the timers;
- a connection with no traffic for `idle_timeout_ms` (120 s, as the Java
  NameServer) is closed;
- a connection whose first byte is a ZeroMQ greeting's is a ZNS/1 client at the
  wrong port: it is answered by `zns.core.remoting.zmtp` (each request gets an
  `error` naming the request endpoint) and logged once.

Sockets are non-blocking; replies produced in one pass leave in one `send`.
"""

from __future__ import annotations

import itertools
import logging
import socket
from dataclasses import dataclass, field

import zmq

from zns.core.remoting import FrameDecoder, RemotingFrameError, encode_command
from zns.core.config import DEFAULT_REMOTING_MAX_CONNECTIONS as DEFAULT_MAX_CONNECTIONS
from zns.core.remoting.handler import Connection, RemotingService
from zns.core.remoting.zmtp import ZmtpRedirect, looks_like_zmtp
from zns.core.service import Frames
from zns.core.addresses import parse_host_port, resolve_pub_endpoint
from zns.drivers.descriptors import OUT_OF_FDS, DescriptorGuard, listen_tcp

log = logging.getLogger("zns")

DEFAULT_IDLE_TIMEOUT_MS = 120_000
HIGH_WATER = 1 << 20  # stop reading a connection with this much unsent
MAX_UNSENT = 64 << 20  # cut a connection off with this much unsent
READ_CHUNK = 256 << 10
ACCEPTS_PER_PASS = 256


@dataclass
class _Conn:
    sock: socket.socket
    conn: Connection
    decoder: FrameDecoder
    last_active: int
    unsent: bytearray = field(default_factory=bytearray)
    reading: bool = True
    fresh: bool = True  # nothing read yet: the first byte tells RocketMQ from ZeroMQ
    zmtp: ZmtpRedirect | None = None


class RemotingListener:
    def __init__(
        self,
        endpoint: str,
        service: RemotingService,
        *,
        now: int,
        max_frame_bytes: int,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        high_water: int = HIGH_WATER,
        max_unsent: int = MAX_UNSENT,
        read_chunk: int = READ_CHUNK,
        descriptors: DescriptorGuard | None = None,
    ) -> None:
        """Binds at once; OSError (or ValueError for a malformed endpoint) when it cannot."""
        self.service = service
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.idle_timeout_ms = idle_timeout_ms
        self.high_water = high_water
        self.max_unsent = max_unsent
        self.read_chunk = read_chunk
        self.listening = listen_tcp(*parse_host_port(endpoint))
        self.descriptors = descriptors
        if descriptors is not None:
            descriptors.plain.append(self.listening)
        host, port = self.listening.getsockname()[:2]
        self.endpoint = f"{'[' + host + ']' if ':' in host else host}:{port}"
        self.connections: dict[int, _Conn] = {}
        self.refused = 0  # connections closed at once: over max_connections
        self.cut_off = 0  # connections closed for unsent replies over max_unsent
        self._ids = itertools.count(1)
        self._poller: zmq.Poller | None = None
        self._now = now

    # --- the loop's side ------------------------------------------------

    def attach(self, poller: zmq.Poller) -> None:
        self._poller = poller
        poller.register(self.listening.fileno(), zmq.POLLIN)

    def handle(self, ready: dict, now: int) -> list[Frames]:
        """Accept, read, answer and write what `ready` says can be; returns events to publish."""
        self._now = now
        frames: list[Frames] = []
        if self.listening.fileno() in ready:
            self._accept(now)
        for fd, flags in ready.items():
            entry = self.connections.get(fd) if isinstance(fd, int) else None
            if entry is None:
                continue
            if flags & zmq.POLLIN and entry.reading:
                self._read(entry, now, frames)
            if fd in self.connections and entry.unsent:
                self._write(entry, now, frames)
        return frames

    def on_timer(self, now: int) -> list[Frames]:
        """Close connections idle for `idle_timeout_ms`."""
        self._now = now
        frames: list[Frames] = []
        cutoff = now - self.idle_timeout_ms
        for entry in [e for e in self.connections.values() if e.last_active < cutoff]:
            log.info("remoting connection from %s closed: idle for %d s", entry.conn.host,
                     self.idle_timeout_ms // 1000)
            self._close(entry, now, frames)
        return frames

    def close(self) -> None:
        for entry in list(self.connections.values()):
            self._unregister(entry.sock.fileno())
            entry.sock.close()
        self.connections.clear()
        if self._poller is not None:
            self._unregister(self.listening.fileno())
        self.listening.close()

    # --- internals ------------------------------------------------------

    def _accept(self, now: int) -> None:
        for _ in range(ACCEPTS_PER_PASS):
            try:
                sock, address = self.listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_FDS:
                    if self.descriptors is not None:
                        self.descriptors.out_of_descriptors(self.listening, now)
                    return
                raise
            host = address[0] if isinstance(address, tuple) else str(address)
            if len(self.connections) >= self.max_connections:
                self.refused += 1
                log.warning("remoting connection from %s refused: %d connections already open "
                            "(--remoting-max-connections)", host, len(self.connections))
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            entry = _Conn(sock=sock, conn=Connection(next(self._ids), host),
                          decoder=FrameDecoder(self.max_frame_bytes), last_active=now)
            self.connections[sock.fileno()] = entry
            if self._poller is not None:
                self._poller.register(sock.fileno(), zmq.POLLIN)

    def _read(self, entry: _Conn, now: int, frames: list[Frames]) -> None:
        try:
            data = entry.sock.recv(self.read_chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.info("remoting connection from %s failed: %s", entry.conn.host, exc)
            self._close(entry, now, frames)
            return
        if not data:
            self._close(entry, now, frames)
            return
        entry.last_active = now
        if entry.fresh:
            entry.fresh = False
            if looks_like_zmtp(data):
                entry.zmtp = ZmtpRedirect(self._where_zns1_is(entry))
                entry.unsent += entry.zmtp.start()
                log.warning("remoting connection from %s speaks ZeroMQ, not RocketMQ remoting: "
                            "its requests are answered with: %s", entry.conn.host,
                            entry.zmtp.message)
        if entry.zmtp is not None:
            try:
                entry.unsent += entry.zmtp.feed(data)
            except RemotingFrameError as exc:
                log.warning("remoting connection from %s closed: %s", entry.conn.host, exc)
                self._flush_and_close(entry, now, frames)
            return
        try:
            commands = entry.decoder.feed(data)
        except RemotingFrameError as exc:
            # The commands before the bad frame are answered, then the connection goes.
            self._answer(entry, exc.commands, now, frames)
            log.warning("remoting connection from %s closed: %s", entry.conn.host, exc)
            self._flush_and_close(entry, now, frames)
            return
        self._answer(entry, commands, now, frames)

    def _where_zns1_is(self, entry: _Conn) -> str:
        """What a ZeroMQ client at this port is told: the request endpoint, its wildcard
        host replaced by the address the client reached (so it can be pasted)."""
        router = self.service.properties.get("router", "")
        if not router:
            return ("this is a zns NameServer's RocketMQ remoting port; ZNS/1 requests go to "
                    "its request endpoint (zns serve --router)")
        host = entry.sock.getsockname()[0]
        reached = f"tcp://[{host}]:1" if ":" in host else f"tcp://{host}:1"
        router = resolve_pub_endpoint(router, reached)
        return (f"this is a zns NameServer's RocketMQ remoting port; ZNS/1 requests go to "
                f"{router} (export ZNS_ADDR={router})")

    def _answer(self, entry: _Conn, commands: list, now: int, frames: list[Frames]) -> None:
        handle = self.service.handle
        for command in commands:
            reply, events = handle(command, entry.conn, now)
            frames.extend(events)
            if reply is not None:
                entry.unsent += encode_command(reply)
                if len(entry.unsent) > self.max_unsent:
                    self.cut_off += 1
                    log.warning("remoting connection from %s cut off: %d bytes of replies "
                                "unread", entry.conn.host, len(entry.unsent))
                    self._close(entry, now, frames)
                    return

    def _write(self, entry: _Conn, now: int, frames: list[Frames]) -> None:
        try:
            sent = entry.sock.send(entry.unsent)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            log.info("remoting connection from %s failed: %s", entry.conn.host, exc)
            self._close(entry, now, frames)
            return
        if sent:
            del entry.unsent[:sent]
            entry.last_active = now
        self._update_interest(entry)

    def _flush_and_close(self, entry: _Conn, now: int, frames: list[Frames]) -> None:
        try:
            entry.sock.send(entry.unsent)  # best effort: the replies before the bad frame
        except OSError:
            pass
        self._close(entry, now, frames)

    def _update_interest(self, entry: _Conn) -> None:
        reading = len(entry.unsent) < self.high_water
        flags = (zmq.POLLIN if reading else 0) | (zmq.POLLOUT if entry.unsent else 0)
        entry.reading = reading
        if self._poller is not None:
            fd = entry.sock.fileno()
            if flags:
                self._poller.register(fd, flags)
            else:
                self._poller.unregister(fd)

    def _close(self, entry: _Conn, now: int, frames: list[Frames]) -> None:
        fd = entry.sock.fileno()
        if self.connections.pop(fd, None) is None:
            return
        self._unregister(fd)
        entry.sock.close()
        frames.extend(self.service.connection_closed(entry.conn.conn_id, now))

    def _unregister(self, fd: int) -> None:
        if self._poller is None:
            return
        try:
            self._poller.unregister(fd)
        except KeyError:
            pass


__all__ = ["RemotingListener"]

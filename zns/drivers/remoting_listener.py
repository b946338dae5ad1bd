"""The RocketMQ remoting listener: plain TCP, one source of the server's loop (PROTOCOL §12).

Thin on purpose: it accepts connections, reads bytes into each connection's
`FrameDecoder`, hands every request to `RemotingService.handle`, and writes the
replies back in request order. What to answer is decided in
`zns.core.remoting`; this module only moves bytes and keeps them bounded.

It is a source of the loop (`zns.drivers.loop`) like the ZNS/1 router, so its
work is sliced and accounted the same way:

- it works until the end of the slice it is given, then stops; a connection
  whose decoded requests were not all answered waits in a backlog (not read
  from meanwhile) and the listener asks to run again at once through its
  deadline. Busy time is therefore CPU time of a source, never a stall, and
  hb, expiry and ZNS/1 requests get their turn every few milliseconds;
- its connections live in an epoll of its own, registered in the loop's
  poller as one descriptor: adding or removing one costs O(log n) (pyzmq's
  `Poller.unregister` is O(n), which made n closes cost n²), and a pass costs
  what is ready, not what is open.

Every decision about its connections (admission, the byte budget and what is
closed past it, back-pressure, idle and frame deadlines) is
`zns.core.remoting.connections.ConnectionPolicy`'s, which says what the bounds
are. What this driver adds:

- what one connection buffers of an incoming frame is bounded by the frame
  limit (the decoder refuses a larger length at once). A frame being read
  counts at its announced length from its first bytes on: its buffer is
  allocated whole then (an anonymous mmap when large, whose memory goes back
  to the OS when it goes), and every read lands in one scratch buffer first,
  so what is counted is what is allocated;
- at most `read_chunk` bytes are read from one connection per turn, and at
  most DECODE_CHUNK (32 KiB) unless the rest of a large frame is due: what
  one read decodes (~250 small requests at most) is one unit of the loop's
  work;
- a connection whose first byte is a ZeroMQ greeting's is a ZNS/1 client at the
  wrong port: it is answered by `zns.core.remoting.zmtp` (each request gets an
  `error` naming the request endpoint) and logged once; what the redirect
  buffers and its replies count like a frame and replies.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import select
import socket
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from zns.core.errors import ConnectionLost, RemotingFrameError
from zns.core.remoting import FrameDecoder, RemotingCommand, encode_command
from zns.core.config import DEFAULT_REMOTING_MAX_BUFFER_BYTES
from zns.core.config import DEFAULT_REMOTING_MAX_CONNECTIONS as DEFAULT_MAX_CONNECTIONS
from zns.core.config import DEFAULT_REMOTING_MAX_PER_HOST as DEFAULT_MAX_PER_HOST
from zns.core.forwarding import ForwardedWrites, WriteInFlight
from zns.core.remoting.connections import Account, Close, ConnectionPolicy
from zns.core.remoting.handler import Connection, RemotingService
from zns.core.service import Frames
from zns.core.remoting.zmtp import ZmtpRedirect, looks_like_zmtp
from zns.core.addresses import parse_host_port, resolve_pub_endpoint, url_host
from zns.drivers.descriptors import OUT_OF_FDS, DescriptorGuard, listen_tcp
from zns.drivers.io_errors import REMOTING_PEER
from zns.drivers.loop import Outbox, PollSet, Ready

log = logging.getLogger("zns")

DEFAULT_IDLE_TIMEOUT_MS = 120_000
DEFAULT_FRAME_DEADLINE_MS = 30_000  # a frame begun must be complete within this
COMMAND_BYTES = 64  # what a decoded request costs besides its body
HIGH_WATER = 1 << 20  # stop reading a connection with this much unsent
MAX_UNSENT = 64 << 20  # cut a connection off with this much unsent
READ_CHUNK = 256 << 10
DECODE_CHUNK = 32 << 10  # read at a time when no large frame is being read
MAPPED_FRAME_BYTES = 256 << 10  # frames at least this long are read into an mmap
ACCEPTS_PER_TURN = 256
EVENTS_PER_TURN = 1024  # ready connections taken from the epoll per turn
# Descriptors kept free for ZNS/1 clients (two each) and the server's own use when the
# remoting connection limit is clamped to the process's descriptor limit.
DESCRIPTORS_KEPT_FOR_ZNS1 = 64

_IN, _OUT = select.EPOLLIN, select.EPOLLOUT


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    fd: int
    conn: Connection
    decoder: FrameDecoder
    account: Account
    unsent: bytearray = field(default_factory=bytearray)
    pending: deque[RemotingCommand] = field(default_factory=deque)  # decoded, not answered
    interest: int = _IN
    queued: bool = False  # in the listener's backlog
    closing: bool = False  # a bad frame: answer what came before it, flush, close
    fresh: bool = True  # nothing read yet: the first byte tells RocketMQ from ZeroMQ
    zmtp: ZmtpRedirect | None = None
    pending_bytes: int = 0  # what `pending` holds
    # A worker's: the write of the first pending request is at the state process
    # (zns.core.forwarding); the connection's requests wait until its answer is here, and
    # `resume` finishes that request from it (its body is not decoded again).
    token: int | None = None
    resume: Callable[[], tuple[RemotingCommand | None, list[Frames]]] | None = None

    def holds(self) -> int:
        """What it counts against max_buffer_bytes: a frame begun whole (its buffer is
        allocated at its announced length), what the ZMTP redirect buffers, requests
        waiting and unsent replies."""
        incoming = self.zmtp.buffered if self.zmtp is not None else self.decoder.allocated
        return incoming + len(self.unsent) + self.pending_bytes

    def in_frame(self) -> bool:
        return self.zmtp.receiving if self.zmtp is not None else bool(self.decoder.buffered)


def frame_buffer(length: int) -> bytearray | mmap.mmap:
    """The buffer a frame of `length` bytes is read into (`FrameDecoder(allocate=...)`).

    A large one is an anonymous mapping: its pages exist only once written, and closing
    the connection gives them back to the OS at once (a freed bytearray would stay in
    glibc's heap, which is how 4,096 connections feeding large frames once reached twice
    the buffer budget).
    """
    if length >= MAPPED_FRAME_BYTES:
        return mmap.mmap(-1, length)
    return bytearray(length)


def clamp_max_connections(requested: int, descriptor_limit: int) -> int:
    """What `--remoting-max-connections` may be with `descriptor_limit` open files.

    Half of the descriptors left after DESCRIPTORS_KEPT_FOR_ZNS1 go to remoting
    (one each); the other half stay for ZNS/1 clients (two each: requests and
    events), so remoting connections can never lock ZNS/1 clients out.
    """
    return max(1, min(requested, (descriptor_limit - DESCRIPTORS_KEPT_FOR_ZNS1) // 2))


class RemotingListener:
    what = "serving remoting"

    def __init__(
        self,
        endpoint: str,
        service: RemotingService,
        *,
        now: int,
        max_frame_bytes: int,
        outbox: Outbox | None = None,
        clock: Callable[[], int] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_per_host: int = DEFAULT_MAX_PER_HOST,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        high_water: int = HIGH_WATER,
        max_unsent: int = MAX_UNSENT,
        read_chunk: int = READ_CHUNK,
        max_buffer_bytes: int = DEFAULT_REMOTING_MAX_BUFFER_BYTES,
        frame_deadline_ms: int = DEFAULT_FRAME_DEADLINE_MS,
        descriptors: DescriptorGuard | None = None,
        reuse_port: bool = False,
        first_connection_id: int = 1,
    ) -> None:
        """Binds at once; OSError (or ValueError for a malformed endpoint) when it cannot.
        `reuse_port` and `first_connection_id`: a worker's (zns.drivers.worker): the port
        shared with the other workers (SO_REUSEPORT), and connection ids of its own."""
        self.service = service
        self.outbox = outbox or Outbox(lambda frames: None)
        self.clock = clock  # what ends a time slice (None: never before the work is done)
        self.max_frame_bytes = max_frame_bytes
        if descriptors is not None:
            clamped = clamp_max_connections(max_connections, descriptors.limit)
            if clamped < max_connections:
                log.warning("--remoting-max-connections %d lowered to %d: the open-file limit "
                            "is %d and ZNS/1 clients need their share (raise it with "
                            "`ulimit -n`)", max_connections, clamped, descriptors.limit)
            max_connections = clamped
        self.policy = ConnectionPolicy(
            max_connections=max_connections, max_per_host=max_per_host,
            idle_timeout_ms=idle_timeout_ms, high_water=high_water, max_unsent=max_unsent,
            max_buffer_bytes=max_buffer_bytes, frame_deadline_ms=frame_deadline_ms)
        self.read_chunk = read_chunk
        self.listening = listen_tcp(*parse_host_port(endpoint), reuse_port=reuse_port)
        self.descriptors = descriptors
        if descriptors is not None:
            descriptors.plain.append(self.listening)
        host, port = self.listening.getsockname()[:2]
        self.endpoint = f"{url_host(host)}:{port}"
        self._epoll = select.epoll()
        self._epoll.register(self.listening.fileno(), _IN)
        self.connections: dict[int, _Conn] = {}  # by descriptor
        self._by_id: dict[int, _Conn] = {}
        self._ids = itertools.count(first_connection_id)
        self._backlog: deque[_Conn] = deque()  # connections with decoded requests to answer
        self._waiting: dict[int, _Conn] = {}  # a forwarded write's token -> its connection
        self._closed: list[int] = []  # connection ids closed this turn, removed together
        self.now = now  # the `now` of the turn being run, read again after each read (`_read`)
        self._scratch = bytearray(read_chunk)  # every read lands here first
        self._scratch_view = memoryview(self._scratch)

    # --- what the policy counts and bounds, for tests, metrics and operators --

    @property
    def held(self) -> int:
        return self.policy.held

    @property
    def per_host(self) -> Counter[str]:
        return self.policy.per_host

    @property
    def refused(self) -> int:
        return self.policy.refused

    @property
    def over_budget(self) -> int:
        return self.policy.over_budget

    @property
    def too_slow(self) -> int:
        return self.policy.too_slow

    @property
    def cut_off(self) -> int:
        return self.policy.cut_off

    @property
    def max_connections(self) -> int:
        return self.policy.max_connections

    def fileno(self) -> int:
        """The listener's own epoll: readable when a connection or the listening socket is."""
        return self._epoll.fileno()

    # --- the loop's side (a `zns.drivers.loop.Source`) --------------------

    def attach(self, poll: PollSet) -> None:
        poll.register(self._epoll.fileno(), zmq.POLLIN, self)

    def next_deadline(self, now: int) -> int | None:
        if self._backlog:
            return now
        if self._waiting and any(t in self._waiting for t in self._writes().ready):
            return now  # a parked request's write is answered
        deadline = self.policy.next_deadline()
        return None if deadline is None else max(now, deadline)

    def run(self, ready: Ready, now: int, until: int) -> None:
        """Answer the backlog, then what the epoll says is ready, then the policy's timers,
        until `until`."""
        self.now = now
        if self._waiting:
            self._resume_ready(until)
        self._answer_backlog(until)
        if not self._over(until):
            for fd, flags in self._epoll.poll(0, EVENTS_PER_TURN):
                if fd == self.listening.fileno():
                    self._accept(now)
                    continue
                entry = self.connections.get(fd)
                if entry is None:
                    continue
                if flags & (_IN | select.EPOLLHUP | select.EPOLLERR) and entry.interest & _IN:
                    self._read(entry, now)
                    if entry.pending or entry.closing:
                        self._answer(entry, until)
                if self.connections.get(fd) is entry and entry.unsent:
                    self._write(entry, now)
                if self._over(until):
                    break  # the rest stays ready: level-triggered, taken next turn
        self._apply(self.policy.on_timer(now), now)
        if self._closed:
            # What the connections that closed this turn registered goes in one step: one
            # revision, each shared route rebuilt once, not once per connection.
            closed, self._closed = self._closed, []
            self.outbox.put(self.service.connections_closed(closed))

    def close(self) -> None:
        for entry in list(self.connections.values()):
            entry.sock.close()
        self.connections.clear()
        self._by_id.clear()
        self._epoll.close()
        self.listening.close()

    # --- internals ------------------------------------------------------

    def _over(self, until: int) -> bool:
        return self.clock is not None and self.clock() >= until

    def _accept(self, now: int) -> None:
        for _ in range(ACCEPTS_PER_TURN):
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
            conn_id = next(self._ids)
            account = self.policy.admit(conn_id, host, now)
            if isinstance(account, str):
                log.warning("remoting connection from %s refused: %s", host, account)
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fd = sock.fileno()
            entry = _Conn(sock=sock, fd=fd, conn=Connection(conn_id, host),
                          decoder=FrameDecoder(self.max_frame_bytes, allocate=frame_buffer),
                          account=account)
            self.connections[fd] = self._by_id[conn_id] = entry
            self._epoll.register(fd, _IN)

    def _read(self, entry: _Conn, now: int) -> None:
        try:
            # Into the one scratch buffer: the decoder copies what it keeps into a buffer of
            # the frame's exact length, so no chunk-sized object is made per read.
            # As much as one read decodes is one unit of the loop's work: small frames are
            # read DECODE_CHUNK at a time (~250 requests), the rest of a large one up to
            # read_chunk (copied, not decoded, until it is whole).
            want = min(self.read_chunk, max(DECODE_CHUNK, entry.decoder.remaining))
            with REMOTING_PEER:
                size = entry.sock.recv_into(self._scratch, want)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionLost as exc:
            log.info("remoting connection from %s failed: %s", entry.conn.host, exc)
            self._close(entry, now)
            return
        if not size:
            self._close(entry, now)
            return
        if self.clock is not None:
            # What this read holds is handled at a `now` read after it arrived, not at the
            # turn's: a registration then starts its broker's timeout no earlier than it
            # was sent (§8; the ZNS/1 router reads the clock after each request likewise).
            self.now = self.clock()
        data = self._scratch_view[:size]
        if entry.fresh:
            entry.fresh = False
            if looks_like_zmtp(bytes(data[:16])):
                entry.zmtp = ZmtpRedirect(self._where_zns1_is(entry))
                entry.unsent += entry.zmtp.start()
                log.warning("remoting connection from %s speaks ZeroMQ, not RocketMQ remoting: "
                            "its requests are answered with: %s", entry.conn.host,
                            entry.zmtp.message)
        if entry.zmtp is not None:
            try:
                entry.unsent += entry.zmtp.feed(bytes(data))
            except RemotingFrameError as exc:
                log.warning("remoting connection from %s closed: %s", entry.conn.host, exc)
                self._flush_and_close(entry, now)
                return
            cut = self.policy.reply_queued(entry.account, len(entry.unsent))
            if cut is not None:
                self._apply([cut], now)
                return
        else:
            try:
                commands = entry.decoder.feed(data)
            except RemotingFrameError as exc:
                # The commands before the bad frame are answered, then the connection goes.
                commands = exc.commands
                entry.closing = True
                log.warning("remoting connection from %s closed: %s", entry.conn.host, exc)
            entry.pending.extend(commands)
            entry.pending_bytes += sum(len(c.body) + COMMAND_BYTES for c in commands)
        # Over the budget: closed at once, as a turn reads many connections.
        self._apply(self.policy.read(entry.account, now, held=entry.holds(),
                                     frame_in_progress=entry.in_frame()), now)

    def _where_zns1_is(self, entry: _Conn) -> str:
        """What a ZeroMQ client at this port is told: the request endpoint, its wildcard
        host replaced by the address the client reached (so it can be pasted)."""
        router = self.service.properties.get("router", "")
        if not router:
            return ("this is a zns NameServer's RocketMQ remoting port; ZNS/1 requests go to "
                    "its request endpoint (zns serve --router)")
        host = entry.sock.getsockname()[0]
        reached = f"tcp://{url_host(host)}:1"
        router = resolve_pub_endpoint(router, reached)
        return (f"this is a zns NameServer's RocketMQ remoting port; ZNS/1 requests go to "
                f"{router} (export ZNS_ADDR={router})")

    def _answer_backlog(self, until: int) -> None:
        for _ in range(len(self._backlog)):
            if self._over(until):
                return
            entry = self._backlog.popleft()
            entry.queued = False
            if self.connections.get(entry.fd) is not entry:
                continue  # closed meanwhile
            self._answer(entry, until)
            if self.connections.get(entry.fd) is entry and entry.unsent:
                self._write(entry, self.now)

    def _answer(self, entry: _Conn, until: int) -> None:
        """Answer `entry`'s decoded requests in order until the slice ends (then: backlog) or
        the policy says its unsent replies are enough (then: when they drain)."""
        handle, now, policy = self.service.handle, self.now, self.policy
        may_answer, reply_queued = policy.may_answer, policy.reply_queued
        pending, unsent = entry.pending, entry.unsent
        while pending and may_answer(len(unsent)):
            command = pending[0]
            token, resume = entry.token, entry.resume
            if token is not None:  # its write is at the state process
                writes = self._writes()
                if token not in writes.ready:
                    break
                entry.token = entry.resume = None
            try:
                if resume is not None:  # finished from its write's answer: not decoded again
                    reply, events = resume()
                else:
                    reply, events = handle(command, entry.conn, now)
            except WriteInFlight as parked:  # answered once the write's answer is here
                entry.token, entry.resume = parked.token, parked.resume
                self._waiting[parked.token] = entry
                break
            finally:
                if token is not None:
                    self._writes().done(token)
            pending.popleft()
            entry.pending_bytes -= len(command.body) + COMMAND_BYTES
            self.outbox.put(events)
            if reply is not None:
                unsent += encode_command(reply)
                cut = reply_queued(entry.account, len(unsent))
                if cut is not None:
                    self._apply([cut], now)
                    return
            if pending and self._over(until):
                self._queue(entry)
                break
        if entry.closing and not pending:
            self._flush_and_close(entry, now)
            return
        self._apply(policy.account(entry.account, entry.holds()), now)
        if entry.account.open:
            self._update_interest(entry)

    def _writes(self) -> ForwardedWrites:
        writes = self.service.service.forwarded
        assert writes is not None  # a write is parked only where writes are forwarded
        return writes

    def _resume_ready(self, until: int) -> None:
        """Answer the connections whose parked write is answered, from that request on (a
        closed one's answer is dropped)."""
        writes = self._writes()
        for token in [t for t in writes.ready if t in self._waiting]:
            entry = self._waiting.pop(token)
            if self.connections.get(entry.fd) is not entry or entry.token != token:
                writes.done(token)
                continue
            self._answer(entry, until)
            if self.connections.get(entry.fd) is entry and entry.unsent:
                self._write(entry, self.now)

    def _write(self, entry: _Conn, now: int) -> None:
        try:
            with REMOTING_PEER:
                sent = entry.sock.send(entry.unsent)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except ConnectionLost as exc:
            log.info("remoting connection from %s failed: %s", entry.conn.host, exc)
            self._close(entry, now)
            return
        if sent:
            del entry.unsent[:sent]
            if entry.pending and self.policy.may_answer(len(entry.unsent)):
                self._queue(entry)  # drained enough: answer the rest
            self.policy.sent(entry.account, now, entry.holds())
        self._update_interest(entry)

    def _queue(self, entry: _Conn) -> None:
        if not entry.queued:
            entry.queued = True
            self._backlog.append(entry)

    def _flush_and_close(self, entry: _Conn, now: int) -> None:
        try:
            with REMOTING_PEER:
                entry.sock.send(entry.unsent)  # best effort: the replies before the bad frame
        except (BlockingIOError, InterruptedError, ConnectionLost):
            pass
        self._close(entry, now)

    def _update_interest(self, entry: _Conn) -> None:
        reading = self.policy.wants_read(entry.account, self.now, pending=bool(entry.pending),
                                         unsent=len(entry.unsent))
        interest = (_IN if reading else 0) | (_OUT if entry.unsent else 0)
        if interest != entry.interest:
            entry.interest = interest
            self._epoll.modify(entry.fd, interest)

    def _apply(self, closes: list[Close], now: int) -> None:
        """Close what the policy says, each logged once with its reason."""
        for close in closes:
            entry = self._by_id.get(close.account.conn_id)
            if entry is None:
                continue
            why = close.why
            if close.kind == "late":
                why += f" ({entry.zmtp.buffered if entry.zmtp else entry.decoder.buffered} " \
                       "bytes of it read)"
            log.log(logging.INFO if close.kind == "idle" else logging.WARNING,
                    "remoting connection from %s %s", entry.conn.host, why)
            self._close(entry, now)

    def _close(self, entry: _Conn, now: int) -> None:
        if not self.policy.closed(entry.account):
            return
        del self.connections[entry.fd]
        del self._by_id[entry.conn.conn_id]
        try:
            self._epoll.unregister(entry.fd)
        except OSError:
            pass
        entry.sock.close()
        entry.pending.clear()
        if entry.token is not None:
            # Its parked write is done with once answered (_resume_ready drops a closed
            # connection's answer); one answered while the connection waited for its unsent
            # replies to drain is already out of the waiting list, and would stay in `ready`.
            self._waiting[entry.token] = entry
        self._closed.append(entry.conn.conn_id)


__all__ = ["RemotingListener", "clamp_max_connections"]

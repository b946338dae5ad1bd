"""The ZNS/1 request socket as a source of the server's loop: one ROUTER, sliced serving.

It reads frames, hands the body to `NameService.respond`, sends the reply back
with the envelope unchanged and puts the events in the loop's outbox, for at
most the slice the loop gives it (`zns.drivers.loop`). Requests still waiting
when the slice ends keep the socket readable, so the loop comes back at once
after the other sources had their turn.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from zns.core.budget import ReplyBudget
from zns.core.forwarding import WriteInFlight
from zns.core.service import NameService, Response
from zns.drivers.io_errors import ZNS1_PEER
from zns.drivers.loop import Outbox, PollSet, Ready
from zns.drivers.sockets import close_dead_peers

log = logging.getLogger("zns")

# Requests released from behind a write are served reading the clock every CLOCK_EVERY:
# they were read before the `now` they are given, which only ends the slice. A request
# read from the socket gets a reading of its own (`RequestRouter.run`).
CLOCK_EVERY = 16
# §1: a request has at most this many envelope frames, and all its frames together
# at most max_message_bytes; anything else is dropped unanswered (and logged).
MAX_ENVELOPE_FRAMES = 32
# Requests a worker holds behind forwarded writes (each write's own, and a connection's
# later requests waiting behind it): past either bound it stops reading requests. Half the
# ROUTER's send high-water mark (libzmq's 1,000 replies a peer): a write's answer releases
# a connection's held requests as one burst of replies, which must fit in that mark even
# when its peer is slow to read (at 1,024, replies 1,000 on were dropped under load).
MAX_HELD_REQUESTS = 512
MAX_HELD_BYTES = 64 * 1024 * 1024
# What a parked write keeps besides its request's bytes (what its reply needs: its id and
# op, its sender, a registration's broker names; never its decoded request) is at most
# this (tests/test_worker_writes.py measures it with the longest names).
PARKED_WRITE_BYTES = 16 * 1024
# Plain ints, and the backend's send: pyzmq's IntFlag arithmetic and its Python-level
# `send` wrapper each cost a noticeable share of a small request.
_NOBLOCK, _DONTWAIT = int(zmq.NOBLOCK), int(zmq.DONTWAIT)
_SNDMORE_DONTWAIT = int(zmq.SNDMORE | zmq.DONTWAIT)
_POLLIN = int(zmq.POLLIN)
backend_send = zmq.backend.Socket.send


class RequestRouter:
    """Serves ZNS/1 requests on `router` (bound by the server) for the loop."""

    what = "serving requests"

    def __init__(
        self,
        router: zmq.Socket,
        service: NameService,
        outbox: Outbox,
        *,
        clock: Callable[[], int],
        max_message_bytes: int,
        reply_budget: ReplyBudget,
        with_key: bool,
        max_held_requests: int = MAX_HELD_REQUESTS,
        max_held_bytes: int = MAX_HELD_BYTES,
    ) -> None:
        self.router = router
        self.service = service
        self.outbox = outbox
        self.clock = clock
        self.max_message_bytes = max_message_bytes
        self.reply_budget = reply_budget
        self.with_key = with_key  # the body frame carries the ZAP User-Id (CURVE on)
        self.dropped_replies = 0
        self.dropped_requests = 0  # over §1's envelope or total-size bound
        self._draining = False  # in the middle of dropping an oversized message
        # A worker's requests held behind a forwarded write (zns.core.forwarding), by the
        # routing id of their connection, in the order they came; bounded (see `_over_held`).
        self.max_held_requests = max_held_requests
        self.max_held_bytes = max_held_bytes
        self.held_requests = 0
        self.held_bytes = 0
        self._held: dict[bytes, deque[_Held]] = {}
        self._waiting: dict[int, bytes] = {}  # write token -> routing id
        # Connections whose write is answered, with requests held behind it not yet served
        # (the slice ended first), in the order their answers came.
        self._released: deque[bytes] = deque()
        self._paused = False  # past the held bounds: the socket is not polled
        self._poll: PollSet | None = None

    @staticmethod
    def configure(router: zmq.Socket, max_message_bytes: int) -> None:
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        router.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        router.setsockopt(zmq.LINGER, 500)
        # No ZMTP heartbeat (HEARTBEAT_IVL) on any server socket: in libzmq 4.3.5 a peer
        # that resets while its inbound queue is full leaves an engine that the heartbeat
        # timer then writes to, and libzmq aborts the process (tests/test_peer_resets.py).
        # The kernel closes dead connections instead: TCP_MAXRT a peer that reads nothing
        # (its unacknowledged data), keepalive one whose host vanished while idle.
        close_dead_peers(router)

    # --- the loop's side (a `zns.drivers.loop.Source`) --------------------

    def attach(self, poll: PollSet) -> None:
        self._poll = poll
        poll.register(self.router, zmq.POLLIN, self)

    def next_deadline(self, now: int) -> int | None:
        if self._draining:
            return now
        if self._released:
            return now  # requests an answer released, left when a slice ended
        if self._waiting:
            writes = self.service.forwarded
            assert writes is not None  # a request is parked only where writes are forwarded
            if any(t in self._waiting for t in writes.ready):
                return now  # a parked request's write is answered
        return None  # else: when the socket is readable

    def waiting(self) -> bool:
        """Whether a request waits (the heap trim runs only when none does)."""
        return self._draining or bool(int(self.router.getsockopt(zmq.EVENTS)) & _POLLIN)

    def run(self, ready: Ready, now: int, until: int) -> bool:
        """Answer waiting requests until `until`; True if it handed back after one that made
        events, which leave before the next request is read.

        Frame by frame with `copy=False`: `recv_multipart` asks the socket for
        RCVMORE after every frame, which costs more than the whole request
        handling; `Frame.more` reads it from the message.

        The clock is read after each request is read, and the request is handled at
        that `now`: a registration or heartbeat starts its broker's timeout no earlier
        than the request arrived (§8). A `now` read before the request was read may be
        from before it was sent: read once every 16 requests, it stamped registrations
        behind a flood of `snapshot`s (each reply a few MB) up to 12 ms before their
        send, and their brokers expired that much early (bench/flood.py). A reading
        costs ~0.2 µs, ~2% of a small `get_route` (7.5 µs). The slice ends after the
        first request read at or past `until`.
        """
        router, respond, put = self.router, self.service.respond, self.outbox.put
        recv = router.recv
        with_key = self.with_key
        clock = self.clock
        max_bytes = self.max_message_bytes
        budget = self.reply_budget
        heavy = budget.heavy_bytes
        held = self._held
        if self._waiting or self._released:
            if self._resume_ready(now, until):
                return True
            if self._released:
                return False  # the slice ended first: the rest at the next turn
        if self._paused:
            return False
        if self._draining and not self._drain(until):
            return False
        while True:
            try:
                frame = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return False
            envelope = []
            # The first frame is the routing id the ROUTER itself prepends: the bounds
            # count what the peer sent (a DEALER's request is just its body).
            size = 0
            while frame.more:  # the rest of a message is there once its first frame is
                envelope.append(frame)
                if len(envelope) > MAX_ENVELOPE_FRAMES + 1 or size > max_bytes:
                    self._drop_oversized(len(envelope) - 1, size)
                    if not self._drain(until):
                        return False
                    envelope = []
                    break
                frame = recv(copy=False)
                size += len(frame)
            if size > max_bytes and envelope:
                self._drop_oversized(len(envelope) - 1, size)
                envelope = []
            now = clock()  # after the request arrived: its `now` (see the docstring)
            if envelope:  # a ROUTER always prepends the routing id: else nothing to answer
                if held and envelope[0].bytes in held:  # behind its own write: in order
                    self._hold(envelope, frame, None)
                    if self._over_held():
                        return False
                    continue
                try:
                    response = respond(frame.bytes, now, user_id(frame) if with_key else None,
                                       frame)
                except WriteInFlight as parked:  # answered once the write's answer is here
                    self._hold(envelope, frame, parked)
                    if self._over_held():
                        return False
                    continue
                # `_send`, inline: a call per request costs a few % of a small read.
                reply = response.reply
                if len(reply) >= heavy and not budget.allow(envelope[0].bytes, len(reply), now):
                    reply = self.service.busy_reply(response.request_id)
                try:
                    for part in envelope:
                        backend_send(router, part, _SNDMORE_DONTWAIT, False)
                    backend_send(router, reply, _DONTWAIT)
                except zmq.ZMQError as exc:
                    # A peer at its high-water mark, or one gone (EHOSTUNREACH): the loop
                    # must never block on one peer. Anything else is zns's bug: it leaves.
                    if not _peer_fault(exc):
                        raise
                    self.dropped_replies += 1
                if response.events:
                    put(response.events)
                    # Hand back so the loop publishes them now: reading the next request
                    # first would cost a failing read (a system call) when none waits.
                    return True
            if now >= until:
                return False

    def _send(self, envelope: list[Any], response: Response, now: int) -> bool:
        """Send `response` back along `envelope`; True if it made events (put in the outbox).
        For a request held behind a write, or finished from its answer (`run` has the same
        lines inline)."""
        reply = response.reply
        budget = self.reply_budget
        if len(reply) >= budget.heavy_bytes and not budget.allow(envelope[0].bytes, len(reply),
                                                                 now):
            reply = self.service.busy_reply(response.request_id)
        try:
            for part in envelope:
                backend_send(self.router, part, _SNDMORE_DONTWAIT, False)
            backend_send(self.router, reply, _DONTWAIT)
        except zmq.ZMQError as exc:
            if not _peer_fault(exc):
                raise
            self.dropped_replies += 1
        if response.events:
            self.outbox.put(response.events)
            return True
        return False

    # --- requests held behind a forwarded write (a worker's: zns.core.forwarding) -----

    def _hold(self, envelope: list[Any], frame: Any, parked: WriteInFlight | None) -> None:
        """Park a request: the one whose write is `parked`, or (None) one waiting behind
        its connection's write."""
        identity = envelope[0].bytes
        held = _Held(envelope, frame, len(frame) + sum(len(part) for part in envelope))
        self._held.setdefault(identity, deque()).append(held)
        self.held_requests += 1
        self.held_bytes += held.size
        if parked is not None:
            self._park(held, parked, identity)

    def _park(self, held: _Held, parked: WriteInFlight, identity: bytes) -> None:
        """`held`'s write is `parked`: it keeps what finishes it, not its message."""
        held.token, held.resume, held.frame = parked.token, parked.resume, None
        self._waiting[parked.token] = identity

    def _over_held(self) -> bool:
        """Past a held bound, stop reading requests (the socket is not polled) until some
        are answered: libzmq's queues hold the rest, as for a busy single process."""
        over = (self.held_requests >= self.max_held_requests
                or self.held_bytes >= self.max_held_bytes)
        if over and not self._paused and self._poll is not None:
            self._paused = True
            self._poll.unregister(self.router)
            writes = self.service.forwarded
            assert writes is not None  # requests are held only where writes are forwarded
            writes.request_pauses += 1
        return over

    def _resume_ready(self, now: int, until: int) -> bool:
        """Answer every parked request whose write is answered, then the requests of its
        connection that waited behind it, up to the next write, until the slice ends (the
        clock read every CLOCK_EVERY requests, where `run` reads it after each request it
        reads: a connection may hold hundreds of requests, each as heavy as any); True if
        events were put."""
        writes = self.service.forwarded
        assert writes is not None
        released = self._released
        for token in [t for t in writes.ready if t in self._waiting]:
            released.append(self._waiting.pop(token))
        made_events = False
        served = 0
        while released:
            identity = released[0]
            queue = self._held[identity]
            while queue:  # its head is the request of `token`, then those behind it
                held = queue[0]
                resumed, resume = held.token, held.resume
                held.token = held.resume = None
                try:
                    if resume is not None:  # finished from its write's answer: not decoded again
                        response = resume()
                    else:
                        frame = held.frame
                        response = self.service.respond(
                            frame.bytes, now, user_id(frame) if self.with_key else None, frame)
                except WriteInFlight as parked:
                    self._park(held, parked, identity)
                    break
                finally:
                    if resumed is not None:
                        writes.done(resumed)
                queue.popleft()
                self.held_requests -= 1
                self.held_bytes -= held.size
                made_events |= self._send(held.envelope, response, now)
                served += 1
                if queue and served % CLOCK_EVERY == 0:
                    now = self.clock()
                    if now >= until:
                        break
            else:
                del self._held[identity]
                released.popleft()
                continue
            if queue[0].token is not None:  # parked behind its next write
                released.popleft()
                continue
            break  # the slice ended: this connection goes on at the next turn
        if self._paused and self.held_requests < self.max_held_requests \
                and self.held_bytes < self.max_held_bytes:
            self._paused = False
            assert self._poll is not None
            self._poll.register(self.router, zmq.POLLIN, self)
        return made_events

    def _drop_oversized(self, frames: int, size: int) -> None:
        self.dropped_requests += 1
        log.warning("dropped a request unanswered: more than %d envelope frames or %d bytes "
                    "(§1 bounds; at least %d frames, %d bytes)", MAX_ENVELOPE_FRAMES,
                    self.max_message_bytes, frames, size)

    def _drain(self, until: int) -> bool:
        """Read and discard the rest of the current message; False if the slice ran out first."""
        recv, clock = self.router.recv, self.clock
        self._draining = True
        count = 0
        while True:
            frame = recv(copy=False)
            if not frame.more:
                self._draining = False
                return True
            count += 1
            if count % 1024 == 0 and clock() >= until:
                return False


@dataclass
class _Held:
    """A request parked behind a forwarded write: the write's own (`token`, and `resume`,
    which finishes it from the write's answer (zns.core.forwarding); its `frame` dropped),
    or a later one of the same connection (both None until its own write is forwarded)."""

    envelope: list[Any]
    frame: Any
    size: int  # what it counts against max_held_bytes: its frames' bytes
    token: int | None = None
    resume: Callable[[], Response] | None = None


def peer_address(frame: Any) -> str:
    """The address of the peer that sent this message, as ZeroMQ reports it (NameService's
    `address_of`: only an audit line asks)."""
    return str(frame.get("Peer-Address"))


def _peer_fault(exc: zmq.ZMQError) -> bool:
    """Whether a reply's send failed for its peer: at its high-water mark (zmq.Again) or
    gone (ZNS1_PEER's errors). Asked once a send raised, not a `with ZNS1_PEER` around
    every reply's sends: that costs ~0.15 µs a request."""
    return isinstance(exc, zmq.Again) or ZNS1_PEER.maps(exc)


def user_id(frame: Any) -> str | None:
    """The peer's CURVE key, which ZAP set on the message (CURVE on)."""
    return frame.get("User-Id")

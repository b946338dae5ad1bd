"""Peer hints (§10), the socket side: a DEALER and a SUB per `--peer`, one source of the loop.

What to do with each peer is decided by `zns.core.peer_link.PeerLink`; this
module only carries its actions out and hands each hint to the route table.

What a peer can push on is bounded here: libzmq refuses a message over
PEER_MAX_MESSAGE_BYTES (it drops the connection, and the socket reconnects
after its reconnect interval), a SUB queues PEER_RCVHWM messages at most
(libzmq then stops reading, and the peer's PUB drops: a hint is only ever an
early warning), and messages are read and handled one at a time within the
loop's slice, so a flooding peer costs the loop one slice per pass, as any
other source.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator

import msgspec
import zmq

from zns.core.errors import ConnectionLost, EndpointError
from zns.core.peer_link import AskStatus, FollowEvents, Hint, PeerLink
from zns.core.text import quote
from zns.drivers.io_errors import configured, peer_named
from zns.drivers.loop import PollSet, Ready
from zns.drivers.sockets import open_socket, parse_addresses, recv_all
from zns.core.schema import BROKER_PREFIX, HB_CHANNEL, Status, decode_event, decode_reply, encode

log = logging.getLogger("zns")

# Every message a peer sends is small: an `hb`, a `broker` event, a `status` reply (a few
# hundred bytes; its `peers` map names a peer's own peers). 64 KiB leaves room for far more.
PEER_MAX_MESSAGE_BYTES = 64 * 1024
# What a peer's SUB queues at most (at most 64 MiB with the size bound): more than the
# `broker` events of a mass expiry; past it the peer's PUB drops (hints are an early warning).
PEER_RCVHWM = 1000
# The clock is read every CLOCK_EVERY messages (reading it costs more than a small message).
CLOCK_EVERY = 16


class PeerLinks:
    """The socket side of every `--peer`: a source of the server's loop (`zns.drivers.loop`).

    `run(ready, now, until)` drains the peer sockets that are ready and runs
    the links whose deadline is due, carrying out what they ask for;
    `next_deadline(now)` is the earliest link's. Sockets come from
    `open_socket`, like every socket that reaches a NameServer, and are
    replaced as a link needs: a fresh DEALER per `status` attempt (so a retry
    never queues behind a lost one), a fresh SUB per learned events endpoint.
    The loop's poll set is kept in step here.

    `suspect(cluster, addr)` applies a hint to the route table and returns
    whether a deadline was shortened; `connected` is the `status` view of the
    peers (endpoint -> connected), kept up to date here. `clock` is the loop's
    (milliseconds): reading stops at the slice's end, and what is left is
    asked for through `next_deadline`.
    """

    def __init__(
        self,
        endpoints: list[str],
        *,
        now: int,
        suspect: Callable[[str, str, int], bool],
        connected: dict[str, bool],
        context: zmq.Context,
        clock: Callable[[], int],
        max_message_bytes: int = PEER_MAX_MESSAGE_BYTES,
    ) -> None:
        self.suspect = suspect
        self._clock = clock
        self.max_message_bytes = max_message_bytes
        self._unread: set[zmq.Socket] = set()  # sockets left readable at a slice's end
        self.connected = connected
        self._ctx = context
        self._poll: PollSet | None = None
        self.links = {endpoint: PeerLink(endpoint, now) for endpoint in _checked(endpoints, context)}
        self._dealers: dict[str, zmq.Socket] = {}
        self._subs: dict[str, zmq.Socket] = {}
        for endpoint in self.links:
            connected[endpoint] = False
        if self.links:
            log.info("taking hints from peers %s", ", ".join(self.links))

    what = "serving peer links"

    def attach(self, poll: PollSet) -> None:
        self._poll = poll

    def next_deadline(self, now: int) -> int | None:
        if self._unread:
            return now  # a slice ended with messages waiting
        deadlines = [d for link in self.links.values() if (d := link.next_deadline()) is not None]
        return max(now, min(deadlines)) if deadlines else None  # one already due is due now

    def run(self, ready: Ready, now: int, until: int) -> None:
        """Read the ready peer sockets until `until`, then run the links whose deadline is due."""
        self.handle(ready, now, until)
        for link in self.links.values():
            deadline = link.next_deadline()
            if deadline is not None and deadline <= now:
                link.on_timer(now)
                self.carry_out(link, now)

    def handle(self, ready: Ready, now: int, until: int) -> None:
        """Read the peer sockets in `ready` (and those a slice left unread), one message at a
        time until `until`, applying the hints their events carry."""
        unread, self._unread = self._unread, set()
        for endpoint, link in self.links.items():
            sock = self._dealers.get(endpoint)
            if sock is not None and (sock in ready or sock in unread):
                for frames in self._messages(sock, until, max_frames=1):
                    reply = self._decode(link, frames[-1], decode_status)
                    if reply is None:
                        continue
                    link.on_reply(reply, now)
                    self._do(link, now)
                    if not link.asking:  # answered: no request in flight any more
                        self._replace(self._dealers, endpoint, None)
                    if self._dealers.get(endpoint) is not sock:
                        break  # closed or replaced: what it still holds is not wanted
            sock = self._subs.get(endpoint)
            if sock is not None and (sock in ready or sock in unread):
                for frames in self._messages(sock, until, max_frames=2):
                    link.on_event(self._decode(link, frames[-1], decode_event), now)
                    self._do(link, now)
                    if self._subs.get(endpoint) is not sock:
                        break
            self.connected[endpoint] = link.connected

    def carry_out(self, link: PeerLink, now: int) -> None:
        """Do what a link's timer asked for."""
        self._do(link, now)
        self.connected[link.endpoint] = link.connected

    def close(self) -> None:
        for sockets in (self._dealers, self._subs):
            for endpoint in list(sockets):
                self._replace(sockets, endpoint, None)

    # --- internals ------------------------------------------------------

    def _apply(self, hint: Hint, now: int) -> None:
        if not self.suspect(hint.cluster, hint.broker_addr, now):
            log.debug("peer hint from %s: broker %s/%s at %s %s there; nothing to shorten here",
                      hint.peer, hint.cluster, hint.broker_name, hint.broker_addr, hint.reason)
            return
        log.info("peer hint from %s: broker %s/%s at %s %s there; suspected here",
                 hint.peer, hint.cluster, hint.broker_name, hint.broker_addr, hint.reason)

    def _messages(self, sock: zmq.Socket, until: int, *, max_frames: int) -> Iterator[list[bytes]]:
        """`sock`'s waiting messages one at a time until none is left or the clock reaches
        `until` (then the socket is read first in the next run). A message of more than
        `max_frames` frames or the byte bound is read and dropped."""
        for count in itertools.count(1):
            if count % CLOCK_EVERY == 0 and self._clock() >= until:
                self._unread.add(sock)
                return
            messages = recv_all(sock, 1, max_frames=max_frames, max_bytes=self.max_message_bytes)
            if messages:
                yield messages[0]
            elif not sock.poll(0, zmq.POLLIN):
                return  # nothing left (an empty read with more waiting: one was dropped)

    @staticmethod
    def _decode(link: PeerLink, body: bytes, decode: Callable[[bytes], object]) -> object:
        try:
            return decode(body)
        except msgspec.DecodeError as exc:
            log.warning("peer %s sent something unreadable: %s", link.endpoint, exc)
            return None

    def _do(self, link: PeerLink, now: int) -> None:
        for action in link.actions():
            match action:
                case Hint():
                    self._apply(action, now)
                case AskStatus(request_id=rid):
                    dealer = self._open(zmq.DEALER, link.endpoint)
                    self._replace(self._dealers, link.endpoint, dealer)
                    dealer.send(encode(Status(id=rid)), zmq.DONTWAIT)  # queued: never blocks
                case FollowEvents(endpoint=endpoint):
                    try:
                        with peer_named(f"{endpoint!r}: "):
                            sub = self._open(zmq.SUB, endpoint)
                    except ConnectionLost as exc:
                        # The peer named an endpoint nobody can connect to ("", garbage,
                        # a bad port): its problem, not ours. Ask again later.
                        log.warning("peer %s named events endpoint %s, which cannot be "
                                    "connected to (%s); asking again later", link.endpoint,
                                    quote(endpoint), exc)
                        self._replace(self._subs, link.endpoint, None)
                        link.on_subscribe_failed(now)
                        continue
                    sub.setsockopt(zmq.SUBSCRIBE, BROKER_PREFIX)
                    sub.setsockopt(zmq.SUBSCRIBE, HB_CHANNEL)
                    self._replace(self._subs, link.endpoint, sub)
                    log.info("peer %s: subscribed to its broker events on %s",
                             link.endpoint, quote(endpoint))

    def _open(self, kind: int, endpoint: str) -> zmq.Socket:
        """A socket to a peer that refuses any message over PEER_MAX_MESSAGE_BYTES and queues
        PEER_RCVHWM at most."""
        return open_socket(self._ctx, kind, endpoint, max_message_bytes=self.max_message_bytes,
                           receive_hwm=PEER_RCVHWM)

    def _replace(self, sockets: dict[str, zmq.Socket], endpoint: str,
                 new: zmq.Socket | None) -> None:
        old = sockets.pop(endpoint, None)
        if old is not None:
            self._unread.discard(old)
            if self._poll is not None:
                self._poll.unregister(old)
            old.close(linger=0)
        if new is not None:
            sockets[endpoint] = new
            if self._poll is not None:
                self._poll.register(new, zmq.POLLIN, self)


def _checked(endpoints: list[str], context: zmq.Context) -> list[str]:
    """The peers as endpoints (a bare host:port is tcp), once each; a bad one stops start-up."""
    if not endpoints:
        return []
    try:
        endpoints = parse_addresses(endpoints)
    except ValueError as exc:
        raise EndpointError(f"--peer: {exc}") from exc
    probe = context.socket(zmq.DEALER)
    try:
        for endpoint in endpoints:
            with configured(f"--peer {endpoint}: "):
                probe.connect(endpoint)  # only checks the syntax: connecting is asynchronous
    finally:
        probe.close(linger=0)
    return endpoints


def decode_status(body: bytes) -> object:
    return decode_reply(body, "status")

"""Peer hints (§10), the socket side: a DEALER and a SUB per `--peer`, one source of the loop.

What to do with each peer is decided by `zns.core.peer_link.PeerLink`; this
module only carries its actions out and hands each hint to the route table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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
    peers (endpoint -> connected), kept up to date here.
    """

    def __init__(
        self,
        endpoints: list[str],
        *,
        now: int,
        suspect: Callable[[str, str, int], bool],
        connected: dict[str, bool],
        context: zmq.Context,
        max_message_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._suspect = suspect
        self._max_bytes = max_message_bytes
        self._connected = connected
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
        deadlines = [d for link in self.links.values() if (d := link.next_deadline()) is not None]
        return max(now, min(deadlines)) if deadlines else None  # one already due is due now

    def run(self, ready: Ready, now: int, until: int) -> None:
        """Drain the ready peer sockets, then run the links whose deadline is due."""
        self.handle(ready, now)
        for link in self.links.values():
            deadline = link.next_deadline()
            if deadline is not None and deadline <= now:
                link.on_timer(now)
                self.carry_out(link, now)

    def handle(self, ready: Ready, now: int) -> None:
        """Drain the peer sockets in `ready`, applying the hints their events carry."""
        for endpoint, link in self.links.items():
            sock = self._dealers.get(endpoint)
            if sock is not None and sock in ready:
                reply = self._receive(link, sock, decode_status)
                if reply is not None:
                    link.on_reply(reply, now)
                    self._do(link, now)
                    if not link.asking:  # answered: no request in flight any more
                        self._replace(self._dealers, endpoint, None)
            sock = self._subs.get(endpoint)
            if sock is not None and sock in ready:
                for frames in recv_all(sock, max_frames=2, max_bytes=self._max_bytes):
                    link.on_event(self._decode(link, frames[-1], decode_event), now)
                    self._do(link, now)
            self._connected[endpoint] = link.connected

    def carry_out(self, link: PeerLink, now: int) -> None:
        """Do what a link's timer asked for."""
        self._do(link, now)
        self._connected[link.endpoint] = link.connected

    def close(self) -> None:
        for sockets in (self._dealers, self._subs):
            for endpoint in list(sockets):
                self._replace(sockets, endpoint, None)

    # --- internals ------------------------------------------------------

    def _apply(self, hint: Hint, now: int) -> None:
        if not self._suspect(hint.cluster, hint.broker_addr, now):
            log.debug("peer hint from %s: broker %s/%s at %s %s there; nothing to shorten here",
                      hint.peer, hint.cluster, hint.broker_name, hint.broker_addr, hint.reason)
            return
        log.info("peer hint from %s: broker %s/%s at %s %s there; suspected here",
                 hint.peer, hint.cluster, hint.broker_name, hint.broker_addr, hint.reason)

    def _receive(
        self, link: PeerLink, sock: zmq.Socket, decode: Callable[[bytes], object]
    ) -> object:
        """The last readable message of `sock`, decoded (earlier ones are superseded)."""
        messages = recv_all(sock, max_frames=1, max_bytes=self._max_bytes)
        return self._decode(link, messages[-1][-1], decode) if messages else None

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
        """A socket to a peer that refuses any message over the server's own bound."""
        return open_socket(self._ctx, kind, endpoint, max_message_bytes=self._max_bytes)

    def _replace(self, sockets: dict[str, zmq.Socket], endpoint: str,
                 new: zmq.Socket | None) -> None:
        old = sockets.pop(endpoint, None)
        if old is not None:
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

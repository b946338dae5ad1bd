"""Peer hints (§10): learn from other NameServers which brokers they took offline.

Two layers. `PeerLink` is sans-I/O: what this server knows about one peer —
its events endpoint, its epoch, when it last spoke — fed with decoded replies
and events and a `now`, answering with what to do next (ask `status`,
subscribe afresh) and with the hint a peer's event carries. `PeerLinks` is the
thin socket side the server loop polls: it carries those actions out on a
DEALER and a SUB per peer and hands each hint to the route table.

A hint only ever reaches `RouteTable.suspect`, which shortens a deadline the
broker's own silence started; a peer that is down, slow or restarting
therefore changes nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import zmq

from zns.addresses import open_socket, parse_addresses, recv_all, resolve_pub_endpoint
from zns.schema import (
    BROKER_PREFIX,
    HB_CHANNEL,
    BrokerEvent,
    Error,
    HbEvent,
    Status,
    StatusReply,
    decode_event,
    decode_reply,
    encode,
)

log = logging.getLogger("zns")

# Reasons a peer's `removed` event is a hint for. `peer_expired` is deliberately
# absent: acting on a peer's own hint-driven removal would echo between peers.
HINT_REASONS = frozenset({"expired", "unregistered"})
RETRY_MIN_MS = 200  # the first retry of an unanswered `status`; doubles up to the max
RETRY_MAX_MS = 5000
DEFAULT_PEER_INTERVAL_MS = 1000  # a peer's hb period until two of its hbs measured it
SILENCE_INTERVALS = 3  # as a client (§7): no hb for 3 intervals means the link is gone
MIN_SILENCE_MS = 1000  # as the stall rule (§8): never declare a peer silent sooner


@dataclass(frozen=True)
class Hint:
    """A peer reports that it took this broker address offline."""

    peer: str
    cluster: str
    broker_name: str
    broker_addr: str
    reason: str


def hint_from_event(peer: str, event: object) -> Hint | None:
    """The hint a peer's event carries, if any: `removed` as `expired` or `unregistered`."""
    match event:
        case BrokerEvent(change="removed", reason=reason) if reason in HINT_REASONS:
            return Hint(peer, event.cluster, event.broker_name, event.broker_addr, reason)
    return None


@dataclass(frozen=True)
class AskStatus:
    """Send a `status` request to the peer."""

    request_id: int


@dataclass(frozen=True)
class Subscribe:
    """Subscribe afresh to the peer's events at `endpoint`, replacing any earlier SUB."""

    endpoint: str


Action = AskStatus | Subscribe


class PeerLink:
    """One peer as a state machine: no sockets, no clock.

    It is asking (a `status` is due or in flight, retried with backoff) until a
    reply tells it the peer's events endpoint; from then on every `hb` and
    `broker` event proves the link alive. A new epoch (the peer restarted) or
    silence (no `hb` for 3 of the peer's intervals) sends it back to asking,
    so the endpoint is learned again; silence also renews the subscription.
    """

    def __init__(self, endpoint: str, now: int) -> None:
        self.endpoint = endpoint
        self.pub: str | None = None  # the events endpoint the SUB is connected to
        self.epoch: str | None = None
        self.connected = False  # an hb of this peer arrived and it has not gone silent since
        self.asking = True
        self._next_ask = now
        self._backoff_ms = RETRY_MIN_MS
        self._request_id = 0
        self._renew_subscription = False  # after silence: reconnect even to the same endpoint
        self._last_heard: int | None = None  # local time of the last event (or of subscribing)
        self._last_hb_time_ms: int | None = None  # the peer's clock in its last hb
        self.interval_ms = DEFAULT_PEER_INTERVAL_MS

    # --- inputs ---------------------------------------------------------

    def on_timer(self, now: int) -> list[Action]:
        if self._last_heard is not None and now - self._last_heard > self.silence_ms:
            self._on_silence(now)
        if self.asking and now >= self._next_ask:
            self._request_id += 1
            self._next_ask = now + self._backoff_ms
            self._backoff_ms = min(2 * self._backoff_ms, RETRY_MAX_MS)
            return [AskStatus(self._request_id)]
        return []

    def on_reply(self, reply: object, now: int) -> list[Action]:
        """A decoded reply on the DEALER: a `StatusReply` or an `Error`."""
        if isinstance(reply, Error):
            log.warning("peer %s refused status: %s %s", self.endpoint, reply.code, reply.message)
            return []
        if not isinstance(reply, StatusReply) or not self.asking:
            return []  # an answer to an earlier attempt that was already taken
        self.asking = False
        self._backoff_ms = RETRY_MIN_MS
        if self.epoch is not None and reply.epoch != self.epoch:
            log.info("peer %s restarted (epoch %s -> %s)", self.endpoint, self.epoch, reply.epoch)
            self._last_hb_time_ms = None
        self.epoch = reply.epoch
        pub = resolve_pub_endpoint(reply.pub_endpoint, self.endpoint)
        if pub == self.pub and not self._renew_subscription:
            return []
        self.pub = pub
        self._renew_subscription = False
        self._last_heard = now  # the silence clock starts with the subscription
        return [Subscribe(pub)]

    def on_event(self, event: object, now: int) -> Hint | None:
        """A decoded event on the SUB (None: unreadable); returns the hint it carries."""
        if not isinstance(event, (HbEvent, BrokerEvent)):
            return None
        if self.epoch is not None and event.epoch != self.epoch:
            log.info("peer %s restarted (epoch %s -> %s); asking for its endpoints again",
                     self.endpoint, self.epoch, event.epoch)
            self._last_hb_time_ms = None
            self._start_asking(now)
        self.epoch = event.epoch
        self._last_heard = now
        if isinstance(event, HbEvent):
            self._on_hb(event)
        return hint_from_event(self.endpoint, event)

    # --- timers ---------------------------------------------------------

    @property
    def silence_ms(self) -> int:
        return max(MIN_SILENCE_MS, SILENCE_INTERVALS * self.interval_ms)

    def next_wake(self) -> int | None:
        wakes = []
        if self.asking:
            wakes.append(self._next_ask)
        if self._last_heard is not None:
            wakes.append(self._last_heard + self.silence_ms + 1)
        return min(wakes, default=None)

    # --- internals ------------------------------------------------------

    def _on_hb(self, event: HbEvent) -> None:
        if self._last_hb_time_ms is not None:
            gap = event.time_ms - self._last_hb_time_ms
            if 0 < gap <= 60_000:  # a wall-clock jump on the peer says nothing of its period
                self.interval_ms = gap
        self._last_hb_time_ms = event.time_ms
        self._renew_subscription = False  # the subscription works: nothing to renew
        if not self.connected:
            self.connected = True
            log.info("peer %s connected (epoch %s, events on %s)",
                     self.endpoint, self.epoch, self.pub)

    def _on_silence(self, now: int) -> None:
        if self.connected:
            log.warning("peer %s disconnected: no hb for %d ms", self.endpoint, now - self._last_heard)
        self.connected = False
        self._last_heard = None
        self._renew_subscription = True
        self._start_asking(now)

    def _start_asking(self, now: int) -> None:
        if not self.asking:
            self.asking = True
            self._next_ask = now
            self._backoff_ms = RETRY_MIN_MS


class PeerLinks:
    """The socket side of every `--peer`, driven by the server's one poller loop.

    `attach(poller)` once; then each pass `handle(ready, now)` drains the peer
    sockets that are ready, `tick(now)` runs the links' timers, and the loop
    wakes by `next_wake()`. Sockets come from `open_socket`, like every socket
    that reaches a NameServer, and are replaced as a link needs: a fresh
    DEALER per `status` attempt (so a retry never queues behind a lost one),
    a fresh SUB per learned events endpoint. The poller is kept in step here.

    `suspect(cluster, addr)` applies a hint to the route table and returns
    whether a deadline was shortened; `connected` is the `status` view of the
    peers (endpoint -> connected), kept up to date here.
    """

    def __init__(
        self,
        endpoints: list[str],
        *,
        now: int,
        suspect: Callable[[str, str], bool],
        connected: dict[str, bool],
        context: zmq.Context,
    ) -> None:
        self._suspect = suspect
        self._connected = connected
        self._ctx = context
        self._poller: zmq.Poller | None = None
        self.links = {endpoint: PeerLink(endpoint, now) for endpoint in _checked(endpoints, context)}
        self._dealers: dict[str, zmq.Socket] = {}
        self._subs: dict[str, zmq.Socket] = {}
        for endpoint in self.links:
            connected[endpoint] = False
        if self.links:
            log.info("taking hints from peers %s", ", ".join(self.links))

    def attach(self, poller: zmq.Poller) -> None:
        self._poller = poller

    def handle(self, ready: dict[zmq.Socket, int], now: int) -> list[Hint]:
        """Drain the peer sockets in `ready`; return the hints that shortened a deadline."""
        applied = []
        for endpoint, link in self.links.items():
            sock = self._dealers.get(endpoint)
            if sock is not None and sock in ready:
                reply = self._receive(link, sock, decode_status)
                if reply is not None:
                    self._do(link, link.on_reply(reply, now))
                    if not link.asking:  # answered: no request in flight any more
                        self._replace(self._dealers, endpoint, None)
            sock = self._subs.get(endpoint)
            if sock is not None and sock in ready:
                for frames in recv_all(sock):
                    hint = link.on_event(self._decode(link, frames[-1], decode_event), now)
                    if hint is not None and self._apply(hint):
                        applied.append(hint)
            self._connected[endpoint] = link.connected
        return applied

    def tick(self, now: int) -> None:
        for endpoint, link in self.links.items():
            self._do(link, link.on_timer(now))
            self._connected[endpoint] = link.connected

    def next_wake(self) -> int | None:
        return min((w for l in self.links.values() if (w := l.next_wake()) is not None),
                   default=None)

    def close(self) -> None:
        for sockets in (self._dealers, self._subs):
            for endpoint in list(sockets):
                self._replace(sockets, endpoint, None)

    # --- internals ------------------------------------------------------

    def _apply(self, hint: Hint) -> bool:
        if not self._suspect(hint.cluster, hint.broker_addr):
            log.debug("peer hint from %s: broker %s/%s at %s %s there; nothing to shorten here",
                      hint.peer, hint.cluster, hint.broker_name, hint.broker_addr, hint.reason)
            return False
        log.info("peer hint from %s: broker %s/%s at %s %s there; suspected here",
                 hint.peer, hint.cluster, hint.broker_name, hint.broker_addr, hint.reason)
        return True

    def _receive(
        self, link: PeerLink, sock: zmq.Socket, decode: Callable[[bytes], object]
    ) -> object:
        """The last readable message of `sock`, decoded (earlier ones are superseded)."""
        messages = recv_all(sock)
        return self._decode(link, messages[-1][-1], decode) if messages else None

    @staticmethod
    def _decode(link: PeerLink, body: bytes, decode: Callable[[bytes], object]) -> object:
        try:
            return decode(body)
        except msgspec.DecodeError as exc:
            log.warning("peer %s sent something unreadable: %s", link.endpoint, exc)
            return None

    def _do(self, link: PeerLink, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case AskStatus(request_id=rid):
                    dealer = open_socket(self._ctx, zmq.DEALER, link.endpoint)
                    self._replace(self._dealers, link.endpoint, dealer)
                    dealer.send(encode(Status(id=rid)), zmq.DONTWAIT)  # queued: never blocks
                case Subscribe(endpoint=endpoint):
                    sub = open_socket(self._ctx, zmq.SUB, endpoint)
                    sub.setsockopt(zmq.SUBSCRIBE, BROKER_PREFIX)
                    sub.setsockopt(zmq.SUBSCRIBE, HB_CHANNEL)
                    self._replace(self._subs, link.endpoint, sub)
                    log.info("peer %s: subscribed to its broker events on %s",
                             link.endpoint, endpoint)

    def _replace(self, sockets: dict[str, zmq.Socket], endpoint: str,
                 new: zmq.Socket | None) -> None:
        old = sockets.pop(endpoint, None)
        if old is not None:
            if self._poller is not None:
                self._poller.unregister(old)
            old.close(linger=0)
        if new is not None:
            sockets[endpoint] = new
            if self._poller is not None:
                self._poller.register(new, zmq.POLLIN)


def _checked(endpoints: list[str], context: zmq.Context) -> list[str]:
    """The peers as endpoints (a bare host:port is tcp), once each; a bad one stops start-up."""
    if not endpoints:
        return []
    try:
        endpoints = parse_addresses(endpoints)
    except ValueError as exc:
        raise OSError(f"--peer: {exc}") from exc
    probe = context.socket(zmq.DEALER)
    try:
        for endpoint in endpoints:
            try:
                probe.connect(endpoint)  # only checks the syntax: connecting is asynchronous
            except zmq.ZMQError as exc:
                raise OSError(f"--peer {endpoint}: {exc}") from exc
    finally:
        probe.close(linger=0)
    return endpoints


def decode_status(body: bytes) -> object:
    return decode_reply(body, "status")

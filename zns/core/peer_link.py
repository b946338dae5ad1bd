"""Peer hints (§10), sans-I/O: what this server knows about one peer NameServer.

`PeerLink` holds a peer's events endpoint, its epoch and when it last spoke.
It is fed decoded replies and events with a `now` (milliseconds, as the whole
core); `actions()` hands out what to do next (`PeerAction`s: ask `status`,
follow its events afresh, apply the `Hint` a peer's event carries) and
`next_deadline()` says when `on_timer` is next due, as every session does.
`zns.drivers.peers` carries those actions out on sockets.

A hint only ever reaches `RouteTable.suspect`, which shortens a deadline the
broker's own silence started; a peer that is down, slow or restarting
therefore changes nothing here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from zns.core.addresses import resolve_pub_endpoint
from zns.core.text import quote
from zns.core.schema import (
    BrokerEvent,
    Error,
    HbEvent,
    StatusReply,
)

log = logging.getLogger("zns")

# Reasons a peer's `removed` event is a hint for. `peer_expired` is deliberately
# absent: acting on a peer's own hint-driven removal would echo between peers.
HINT_REASONS = frozenset({"expired", "unregistered", "disconnected"})
RETRY_MIN_MS = 200  # the first retry of an unanswered `status`; doubles up to the max
RETRY_MAX_MS = 5000
DEFAULT_PEER_INTERVAL_MS = 1000  # a peer's hb period until two of its hbs measured it
SILENCE_INTERVALS = 3  # as a client (§7): no hb for 3 intervals means the link is gone
MIN_SILENCE_MS = 1000  # as the stall rule (§8): never declare a peer silent sooner
MAX_PEER_INTERVAL_MS = 60_000  # a longer gap between two hbs is an outage, not a period
MIN_PEER_GRACE_MS = 1000  # §10: `--peer-grace` is at least 1 s


@dataclass(frozen=True)
class Hint:
    """A peer reports that it took this broker address offline."""

    peer: str
    cluster: str
    broker_name: str
    broker_addr: str
    reason: str


def hint_from_event(peer: str, event: object) -> Hint | None:
    """The hint a peer's event carries, if any: `removed` for a reason in HINT_REASONS."""
    match event:
        case BrokerEvent(change="removed", reason=reason) if reason in HINT_REASONS:
            return Hint(peer, event.cluster, event.broker_name, event.broker_addr, reason)
    return None


@dataclass(frozen=True)
class AskStatus:
    """Send a `status` request to the peer."""

    request_id: int


@dataclass(frozen=True)
class FollowEvents:
    """Subscribe afresh to the peer's events at `endpoint`, replacing any earlier SUB."""

    endpoint: str


PeerAction = AskStatus | FollowEvents | Hint  # a Hint: suspect that broker here


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
        self._subscribe_failures = 0  # bad events endpoints in a row (see on_subscribe_failed)
        self._last_heard: int | None = None  # local time of the last event (or of subscribing)
        self._last_hb_at: int | None = None  # local time (`now`) of the peer's last hb
        self.interval_ms = DEFAULT_PEER_INTERVAL_MS
        self._actions: list[PeerAction] = []

    # --- inputs ---------------------------------------------------------

    def on_timer(self, now: int) -> None:
        if self._last_heard is not None and now - self._last_heard > self.silence_ms:
            self._on_silence(now, now - self._last_heard)
        if self.asking and now >= self._next_ask:
            self._request_id += 1
            self._next_ask = now + self._backoff_ms
            self._backoff_ms = min(2 * self._backoff_ms, RETRY_MAX_MS)
            self._actions.append(AskStatus(self._request_id))

    def on_reply(self, reply: object, now: int) -> None:
        """A decoded reply on the DEALER: a `StatusReply` or an `Error`."""
        if isinstance(reply, Error):
            log.warning("peer %s refused status: %s %s", self.endpoint, quote(reply.code),
                        quote(reply.message))
            return
        if not isinstance(reply, StatusReply) or not self.asking:
            return  # an answer to an earlier attempt that was already taken
        self.asking = False
        self._backoff_ms = RETRY_MIN_MS
        if self.epoch is not None and reply.epoch != self.epoch:
            log.info("peer %s restarted (epoch %s -> %s)", self.endpoint, quote(self.epoch),
                     quote(reply.epoch))
            self._last_hb_at = None
        self.epoch = reply.epoch
        pub = resolve_pub_endpoint(reply.pub_endpoint, self.endpoint)
        if pub == self.pub and not self._renew_subscription:
            return
        self.pub = pub
        self._renew_subscription = False
        self._last_heard = now  # the silence clock starts with the subscription
        self._actions.append(FollowEvents(pub))

    def on_subscribe_failed(self, now: int) -> None:
        """The events endpoint the peer named cannot be connected to: ask again, backing off.

        The backoff grows with each failure in a row (the peer answering `status`
        does not reset it), so a peer that keeps naming a bad endpoint costs one
        attempt every RETRY_MAX_MS at most.
        """
        self._subscribe_failures += 1
        self.pub = None
        self.asking = True
        self._next_ask = now + min(RETRY_MIN_MS << min(self._subscribe_failures, 16), RETRY_MAX_MS)

    def on_event(self, event: object, now: int) -> None:
        """A decoded event on the SUB (None: unreadable); the hint it carries is an action."""
        if not isinstance(event, (HbEvent, BrokerEvent)):
            return
        if self.epoch is not None and event.epoch != self.epoch:
            log.info("peer %s restarted (epoch %s -> %s); asking for its endpoints again",
                     self.endpoint, quote(self.epoch), quote(event.epoch))
            self._last_hb_at = None
            self._start_asking(now)
        self.epoch = event.epoch
        self._last_heard = now
        self._subscribe_failures = 0
        if isinstance(event, HbEvent):
            self._on_hb(now)
        hint = hint_from_event(self.endpoint, event)
        if hint is not None:
            self._actions.append(hint)

    # --- outputs --------------------------------------------------------

    def actions(self) -> list[PeerAction]:
        """What to do now, in order; each action is handed out once."""
        actions, self._actions = self._actions, []
        return actions

    @property
    def silence_ms(self) -> int:
        return max(MIN_SILENCE_MS, SILENCE_INTERVALS * self.interval_ms)

    def next_deadline(self) -> int | None:
        """When `on_timer` must next run (None: only an input can change anything)."""
        wakes = []
        if self.asking:
            wakes.append(self._next_ask)
        if self._last_heard is not None:
            wakes.append(self._last_heard + self.silence_ms + 1)
        return min(wakes, default=None)

    # --- internals ------------------------------------------------------

    def _on_hb(self, now: int) -> None:
        # The period is measured on our own monotonic clock: the peer's `time_ms` is its
        # wall clock, which may jump, and a peer could claim any period it likes and so
        # stay "connected" long after it fell silent.
        if self._last_hb_at is not None:
            gap = now - self._last_hb_at
            if 0 < gap <= MAX_PEER_INTERVAL_MS:
                self.interval_ms = gap
        self._last_hb_at = now
        self._renew_subscription = False  # the subscription works: nothing to renew
        if not self.connected:
            self.connected = True
            log.info("peer %s connected (epoch %s, events on %s)",
                     self.endpoint, quote(self.epoch), quote(self.pub))

    def _on_silence(self, now: int, silent_ms: int) -> None:
        if self.connected:
            log.warning("peer %s disconnected: no hb for %d ms", self.endpoint, silent_ms)
        self.connected = False
        self._last_heard = None
        self._renew_subscription = True
        self._start_asking(now)

    def _start_asking(self, now: int) -> None:
        if not self.asking:
            self.asking = True
            self._next_ask = now
            self._backoff_ms = RETRY_MIN_MS

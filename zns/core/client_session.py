"""The client's session (PROTOCOL §5, §7, §10), sans-I/O: one NameServer at a time.

`ClientSession` follows one NameServer of a list (a random one first, the
next on a timeout, an `error` reply or silence), learns its PUB endpoint from
`status`, subscribes before it pulls, and keeps a `RouteCache` right. It is
fed replies, events and the time; it answers with small actions (`FollowServer`,
`ConnectEvents`, `Subscribe`, `Unsubscribe`, `SendBytes`, `Notify`) that a driver
carries out, and says with `next_deadline()` when it next wants `on_timer`.

Every time is an integer of milliseconds from a monotonic clock.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import msgspec

from zns.core.addresses import resolve_pub_endpoint
from zns.core.backoff import Backoff
from zns.core.errors import UsageError
from zns.core.route_cache import Change, RouteCache
from zns.core.schema import (
    HB_CHANNEL,
    ROUTE_PREFIX,
    Error,
    GetRoutes,
    GetRoutesReply,
    HbEvent,
    Request,
    Status,
    StatusReply,
    Topic,
    TopicRoute,
    decode_event,
    decode_reply,
    encode,
    request_op,
    route_channel,
)

log = logging.getLogger("zns.client")

# Past this many topics a session subscribes to every route event (the route prefix)
# and ignores the ones it does not keep: each subscription costs the server ~50 bytes
# per byte of its channel, and it disconnects a subscriber holding more than 16 MiB.
MAX_TOPIC_CHANNELS = 1_000
SILENT_HEARTBEATS = 3  # §7: no `hb` for this many intervals means the NameServer is gone
BACKOFF_BASE_MS = 100  # the first reconnect waits 50-100 ms ...
BACKOFF_CAP_MS = 10_000  # ... doubling up to 5-10 s


def check_topic(topic: str) -> str:
    """Refuse a malformed topic here, before it can fail a whole batched pull."""
    try:
        return msgspec.convert(topic, Topic)
    except msgspec.ValidationError:
        raise UsageError(
            f"{topic!r} is not a topic: 1-127 characters of [A-Za-z0-9_%|-]"
        ) from None


# --- what the session asks a driver to do --------------------------------------


@dataclass
class FollowServer:
    """Close both sockets; open a DEALER to `endpoint` (None: stay disconnected)."""

    endpoint: str | None


@dataclass
class ConnectEvents:
    """Close the SUB socket; open one to `endpoint`."""

    endpoint: str


@dataclass
class Subscribe:
    """Add `channel` to the SUB socket's subscriptions."""

    channel: bytes


@dataclass
class Unsubscribe:
    """Drop `channel` from the SUB socket's subscriptions."""

    channel: bytes


@dataclass
class SendBytes:
    """Send `body` on the DEALER (without blocking: a request not sent times out)."""

    body: bytes


@dataclass
class Notify:
    """Tell the watchers of `topic` its route changed (None: the topic has no route)."""

    topic: str
    route: TopicRoute | None


ClientAction = FollowServer | ConnectEvents | Subscribe | Unsubscribe | SendBytes | Notify


@dataclass
class _Pending:
    op: str
    deadline: int


class ClientSession:
    """Follows one NameServer (random start, next on timeout or silence) for a RouteCache."""

    def __init__(
        self,
        endpoints: list[str],
        *,
        zone: str = "",
        heartbeat_interval_ms: int = 1_000,
        request_timeout_ms: int = 3_000,
        pull_period_ms: int = 30_000,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        events: str | None = None,
        channels: tuple[bytes, ...] = (),
    ) -> None:
        """`events`: subscribe there (an events relay) instead of at the followed
        NameServer's own PUB; `channels`: more channels to subscribe besides the
        followed topics and `hb` (their events reach the driver; the cache ignores them)."""
        if not endpoints:
            raise UsageError("no NameServer endpoint")
        self.endpoints = list(endpoints)
        self.events = events
        self.channels = channels
        self.cache = RouteCache(zone, pull_period_ms)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.request_timeout_ms = request_timeout_ms
        self._rng = rng or random.Random()
        self.backoff = backoff or Backoff(BACKOFF_BASE_MS, BACKOFF_CAP_MS, rng=self._rng)
        self._index = self._rng.randrange(len(endpoints))
        self.endpoint: str | None = None  # the NameServer followed now
        self.pub_endpoint: str | None = None  # its PUB, once `status` told us
        self.switches = 0  # how many times it moved to another NameServer (for tests, metrics)
        self.pulls = 0  # get_routes requests sent
        self._resume_at: int | None = None  # when to reconnect after a failure
        self._silence_deadline: int | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._actions: list[ClientAction] = []
        self._all_routes = False  # subscribed to ROUTE_PREFIX, not to each topic's channel

    # --- inputs ---------------------------------------------------------

    def start(self, now: int) -> None:
        self._connect(now)

    def track(self, topic: str, now: int) -> None:
        """Keep `topic` (subscribed and pulled); a no-op when already kept."""
        check_topic(topic)
        if self.cache.track(topic) and self.pub_endpoint is not None and not self._all_routes:
            if len(self.cache) > MAX_TOPIC_CHANNELS:
                # The prefix first: no moment without a subscription covering every topic.
                self._all_routes = True
                self._actions.append(Subscribe(ROUTE_PREFIX))
                self._actions.extend(Unsubscribe(route_channel(t)) for t in self.cache.topics()
                                     if t != topic)
            else:
                self._actions.append(Subscribe(route_channel(topic)))
        self._pull_stale(now)

    def forget(self, topic: str) -> None:
        """Stop keeping `topic`: no more pulls of it, its subscription dropped."""
        if self.cache.forget(topic) and self.pub_endpoint is not None and not self._all_routes:
            self._actions.append(Unsubscribe(route_channel(topic)))

    def on_reply(self, body: bytes, now: int) -> None:
        try:
            reply = decode_reply(body)
        except msgspec.DecodeError as exc:
            log.warning("unreadable reply from %s: %s", self.endpoint, exc)
            return
        pending = self._pending.pop(reply.id, None)
        if pending is None:
            return  # the answer to a request we gave up on
        if isinstance(reply, Error):
            log.warning("%s answered %s with %s: %s", self.endpoint, pending.op, reply.code,
                        reply.message)
            self._fail(now, f"{pending.op} refused")
            return
        if isinstance(reply, StatusReply):
            self.pub_endpoint = self.events or resolve_pub_endpoint(reply.pub_endpoint,
                                                                    self.endpoint or "")
            self._actions.append(ConnectEvents(self.pub_endpoint))
            # Topics first, `hb` last: the first `hb` received proves all of them.
            self._all_routes = len(self.cache) > MAX_TOPIC_CHANNELS
            if self._all_routes:
                self._actions.append(Subscribe(ROUTE_PREFIX))
            else:
                for topic in self.cache.topics():
                    self._actions.append(Subscribe(route_channel(topic)))
            for channel in self.channels:
                self._actions.append(Subscribe(channel))
            self._actions.append(Subscribe(HB_CHANNEL))
            self._silence_deadline = now + self.request_timeout_ms + self._silence_after_ms
        elif isinstance(reply, GetRoutesReply):
            changes = self.cache.apply_pull(reply.epoch, reply.routes, reply.revisions, now,
                                            unchanged=reply.unchanged)
            self._notify(changes)
        self._pull_stale(now)

    def on_event(self, body: bytes, now: int) -> None:
        try:
            event = decode_event(body)
        except msgspec.DecodeError as exc:
            log.warning("unreadable event from %s: %s", self.pub_endpoint, exc)
            return
        if isinstance(event, HbEvent):
            # The NameServer is alive and reachable: a later failure is a new one and
            # starts from the shortest backoff.
            self._silence_deadline = now + self._silence_after_ms
            self.backoff.reset()
        self._notify(self.cache.apply_event(event))
        self._pull_stale(now)

    def on_events_disconnected(self, now: int) -> None:
        """The SUB's connection dropped: a relay or the NameServer's PUB went away, or
        the network did. Events published until it reconnects are lost without a gap
        to show (a topic may change once and never again), so re-pull after the next `hb`."""
        if self.pub_endpoint is not None:
            log.info("events connection to %s dropped: pulling again once it is back",
                     self.pub_endpoint)
            self.cache.subscription_lost()

    def on_timer(self, now: int) -> None:
        if self._resume_at is not None:
            if now >= self._resume_at:
                self._connect(now)
            return
        if any(p.deadline <= now for p in self._pending.values()):
            self._fail(now, "no reply within %d ms" % self.request_timeout_ms)
            return
        if self._silence_deadline is not None and now >= self._silence_deadline:
            self._fail(now, "no hb event for %d intervals" % SILENT_HEARTBEATS)
            return
        self.cache.on_timer(now)
        self._pull_stale(now)

    # --- outputs ----------------------------------------------------------

    def actions(self) -> list[ClientAction]:
        """What to do now, in order; each action is handed out once."""
        actions, self._actions = self._actions, []
        return actions

    def next_deadline(self) -> int | None:
        """When `on_timer` must next run (None: only an input can change anything)."""
        if self._resume_at is not None:
            return self._resume_at
        deadlines = [p.deadline for p in self._pending.values()]
        for d in (self._silence_deadline, self.cache.next_deadline()):
            if d is not None:
                deadlines.append(d)
        return min(deadlines, default=None)

    @property
    def connected(self) -> bool:
        return self.pub_endpoint is not None and self._resume_at is None

    # --- internals ----------------------------------------------------------

    @property
    def _silence_after_ms(self) -> int:
        return SILENT_HEARTBEATS * self.heartbeat_interval_ms

    def _connect(self, now: int) -> None:
        self._resume_at = None
        self.endpoint = self.endpoints[self._index]
        self.pub_endpoint = None
        self._silence_deadline = None
        self._actions.append(FollowServer(self.endpoint))
        self._request(Status(), now)

    def _fail(self, now: int, why: str) -> None:
        delay_ms = round(self.backoff.next_delay())
        self._index = (self._index + 1) % len(self.endpoints)
        log.warning("NameServer %s: %s; trying %s in %d ms", self.endpoint, why,
                    self.endpoints[self._index], delay_ms)
        self.switches += 1
        self._pending.clear()
        self.cache.reset()
        self.endpoint = self.pub_endpoint = None
        self._silence_deadline = None
        self._resume_at = now + delay_ms
        self._actions.append(FollowServer(None))

    def _pull_stale(self, now: int) -> None:
        if not self.connected:
            return
        topics = self.cache.take_stale()
        if topics:
            self.pulls += 1
            # Pulled by revision: what is still at the revision held comes back unchanged,
            # without its route (a worker's death or a lost events connection costs little).
            held = {t: r for t in topics if (r := self.cache.revision(t)) >= 0}
            self._request(GetRoutes(topics=topics, held_epoch=self.cache.epoch or "",
                                    held=held if self.cache.epoch else {}), now)

    def _request(self, request: Request, now: int) -> None:
        request_id = self._next_id
        self._next_id += 1
        body = encode(msgspec.structs.replace(request, id=request_id))
        self._pending[request_id] = _Pending(request_op(request), now + self.request_timeout_ms)
        self._actions.append(SendBytes(body))

    def _notify(self, changes: list[Change]) -> None:
        self._actions.extend(Notify(topic, route) for topic, route in changes)

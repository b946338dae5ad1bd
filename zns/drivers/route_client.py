"""Route clients: the sans-I/O core both clients share, and the threaded `RouteClient`.

`RouteCache` is PROTOCOL §7 in one place: which pushed events to apply, and
when a topic must be pulled again. `ClientSession` adds §10 around it: follow
one NameServer at a time, learn its PUB endpoint from `status`, time out
requests, notice a silent NameServer and move to the next one with backoff.
Neither touches a socket or a clock: they take `now` and return `Action`s,
which `RouteClient` (threads) and `zns.drivers.async_client.AsyncRouteClient`
(asyncio) carry out.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from zns.core.addresses import resolve_pub_endpoint
from zns.core.backoff import Backoff
from zns.drivers.sockets import Waker, open_socket, parse_addresses, recv_all
from zns.core.errors import (
    NameServerUnavailable,
    NotFound,
    UsageError,
    from_reply,
)
from zns.core.queues import MessageQueue, QueueSelector, read_queues, write_queues
from zns.core.routes import filter_zone
from zns.core.schema import (
    HB_CHANNEL,
    BrokerEvent,
    Error,
    GetRoutes,
    GetRoutesReply,
    HbEvent,
    Request,
    RouteEvent,
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

log = logging.getLogger("zns.drivers.route_client")

Change = tuple[str, TopicRoute | None]  # a topic and its route as this client now sees it
RouteCallback = Callable[[str, TopicRoute | None], None]

SILENT_HEARTBEATS = 3  # §7: no `hb` for this many intervals means the NameServer is gone


def check_topic(topic: str) -> str:
    """Refuse a malformed topic here, before it can fail a whole batched pull."""
    try:
        return msgspec.convert(topic, Topic)
    except msgspec.ValidationError:
        raise UsageError(
            f"{topic!r} is not a topic: 1-127 characters of [A-Za-z0-9_%|-]"
        ) from None


# --- §7: the cache --------------------------------------------------------

STALE, PULLING, CURRENT = "stale", "pulling", "current"


@dataclass
class _Entry:
    revision: int = -1  # the topic's revision at the NameServer; -1: never pulled
    route: TopicRoute | None = None  # as the NameServer has it
    view: TopicRoute | None = None  # as this client sees it (zone-filtered)
    state: str = STALE
    buffered: list[RouteEvent] = field(default_factory=list)  # arrived while pulling
    # True once an `hb` arrived after the subscription: every later event reaches us.
    proven: bool = False
    pull_again: bool = False  # proven while a pull was in flight: confirm with a new pull

    @property
    def known(self) -> bool:
        return self.revision >= 0


class RouteCache:
    """The routes of the watched topics, kept right by pulls and pushed events (§7).

    Subscribe first, then pull; an event is applied only when its `prev` is
    the remembered revision. A gap or a new epoch makes the topic (or every
    topic) stale; `take_stale` hands the driver what to pull. A subscription
    only takes effect at the publisher some time after it is made, so a pull
    made before an `hb` proved the subscription is repeated once after it.
    """

    def __init__(self, zone: str = "", pull_period: float = 30.0) -> None:
        self.zone = zone
        self.pull_period = pull_period
        self.epoch: str | None = None
        self._entries: dict[str, _Entry] = {}
        self._next_periodic_pull: float | None = None

    # --- what the client asks -------------------------------------------

    def track(self, topic: str) -> bool:
        """Start keeping `topic`; True when it is new (subscribe to it, then pull)."""
        if topic in self._entries:
            return False
        self._entries[topic] = _Entry()
        return True

    def topics(self) -> list[str]:
        return list(self._entries)

    def known(self, topic: str) -> bool:
        entry = self._entries.get(topic)
        return entry is not None and entry.known

    def view(self, topic: str) -> TopicRoute | None:
        entry = self._entries.get(topic)
        return entry.view if entry is not None else None

    def is_current(self, topic: str) -> bool:
        """Known and not waiting for a pull: its view is the route at `revision`."""
        entry = self._entries.get(topic)
        return entry is not None and entry.state == CURRENT

    def revision(self, topic: str) -> int:
        entry = self._entries.get(topic)
        return entry.revision if entry is not None else -1

    # --- pulls ------------------------------------------------------------

    def take_stale(self) -> list[str]:
        """Topics to pull now; they count as in flight until `apply_pull` or `reset`."""
        topics = [t for t, e in self._entries.items() if e.state == STALE]
        for topic in topics:
            self._entries[topic].state = PULLING
        return topics

    def apply_pull(
        self, epoch: str, routes: dict[str, TopicRoute], revisions: dict[str, int], now: float
    ) -> list[Change]:
        """A `get_routes` answer: the pulled topics are now exactly as the NameServer said."""
        if self.epoch != epoch:
            if self.epoch is not None:
                log.info("NameServer epoch changed (%s -> %s): pulling every topic again",
                         self.epoch, epoch)
            self._mark_all_stale(except_pulling=True)
            self.epoch = epoch
        changes: list[Change] = []
        for topic, revision in revisions.items():
            entry = self._entries.get(topic)
            if entry is None or entry.state != PULLING:
                continue
            was_known = entry.known
            old_view = entry.view
            entry.revision = revision
            self._set_route(entry, routes.get(topic))
            entry.state = CURRENT
            buffered, entry.buffered = entry.buffered, []
            for event in sorted(buffered, key=lambda e: e.revision):
                self._apply_route_event(entry, event)
            if entry.pull_again:
                entry.pull_again = False
                entry.state = STALE
            if not was_known or entry.view != old_view:
                changes.append((topic, entry.view))
        if self._next_periodic_pull is None:
            self._next_periodic_pull = now + self.pull_period
        return changes

    def reset(self) -> None:
        """The followed NameServer changed: pull everything again from the next one.

        Routes stay readable meanwhile (as RocketMQ serves its last known routes).
        """
        self.epoch = None
        for entry in self._entries.values():
            entry.state = STALE
            entry.buffered.clear()
            entry.proven = False
            entry.pull_again = False

    # --- events -------------------------------------------------------------

    def apply_event(self, event: RouteEvent | BrokerEvent | HbEvent) -> list[Change]:
        if self.epoch is not None and event.epoch != self.epoch:
            log.info("event from a new NameServer epoch %s: pulling every topic again", event.epoch)
            self.epoch = None  # the next pull's reply sets it
            self._mark_all_stale(except_pulling=False)
            return []
        if isinstance(event, HbEvent):
            self._prove_subscriptions()
            return []
        if not isinstance(event, RouteEvent):
            return []
        entry = self._entries.get(event.topic)
        if entry is None:
            return []
        if entry.state == PULLING:
            entry.buffered.append(event)
            return []
        if entry.state == STALE or self.epoch is None:
            return []  # a pull is about to be sent; it will include this change
        old_view = entry.view
        self._apply_route_event(entry, event)
        return [(event.topic, entry.view)] if entry.view != old_view else []

    # --- timers -------------------------------------------------------------

    def next_deadline(self) -> float | None:
        return self._next_periodic_pull

    def on_timer(self, now: float) -> None:
        """The periodic pull (§7's safety net for events dropped at a high-water mark)."""
        if self._next_periodic_pull is not None and now >= self._next_periodic_pull:
            self._next_periodic_pull = now + self.pull_period
            for entry in self._entries.values():
                if entry.state == CURRENT:
                    entry.state = STALE

    # --- internals ------------------------------------------------------------

    def _apply_route_event(self, entry: _Entry, event: RouteEvent) -> None:
        if event.epoch != self.epoch or event.revision <= entry.revision:
            return  # older than what we hold
        if event.prev != entry.revision:
            log.debug("gap on %s: event prev %d, have %d: pulling again",
                      event.topic, event.prev, entry.revision)
            entry.state = STALE
            return
        entry.revision = event.revision
        self._set_route(entry, event.route)

    def _set_route(self, entry: _Entry, route: Any) -> None:
        entry.route = route
        entry.view = filter_zone(route, self.zone) if route is not None and self.zone else route

    def _prove_subscriptions(self) -> None:
        for entry in self._entries.values():
            if entry.proven:
                continue
            entry.proven = True
            if entry.state == CURRENT:
                entry.state = STALE
            elif entry.state == PULLING:
                entry.pull_again = True

    def _mark_all_stale(self, except_pulling: bool) -> None:
        for entry in self._entries.values():
            if except_pulling and entry.state == PULLING:
                continue
            entry.state = STALE
            entry.buffered.clear()


# --- §10: the session -------------------------------------------------------


@dataclass
class Connect:
    """Close both sockets; open a DEALER to `endpoint` (None: stay disconnected)."""

    endpoint: str | None


@dataclass
class ConnectSub:
    """Close the SUB socket; open one to `endpoint`."""

    endpoint: str


@dataclass
class Subscribe:
    channel: bytes


@dataclass
class Send:
    body: bytes


@dataclass
class Notify:
    topic: str
    route: TopicRoute | None


Action = Connect | ConnectSub | Subscribe | Send | Notify


@dataclass
class _Pending:
    op: str
    deadline: float


class ClientSession:
    """Follows one NameServer (random start, next on timeout or silence) for a RouteCache."""

    def __init__(
        self,
        endpoints: list[str],
        *,
        zone: str = "",
        heartbeat_interval: float = 1.0,
        request_timeout: float = 3.0,
        pull_period: float = 30.0,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not endpoints:
            raise UsageError("no NameServer endpoint")
        self.endpoints = list(endpoints)
        self.cache = RouteCache(zone, pull_period)
        self.heartbeat_interval = heartbeat_interval
        self.request_timeout = request_timeout
        self._rng = rng or random.Random()
        self.backoff = backoff or Backoff(rng=self._rng)
        self._index = self._rng.randrange(len(endpoints))
        self.endpoint: str | None = None  # the NameServer followed now
        self.pub_endpoint: str | None = None  # its PUB, once `status` told us
        self.switches = 0  # how many times it moved to another NameServer (for tests, metrics)
        self.pulls = 0  # get_routes requests sent
        self._resume_at: float | None = None  # when to reconnect after a failure
        self._silence_deadline: float | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._actions: list[Action] = []

    # --- inputs ---------------------------------------------------------

    def start(self, now: float) -> None:
        self._connect(now)

    def track(self, topic: str, now: float) -> None:
        """Keep `topic` (subscribed and pulled); a no-op when already kept."""
        check_topic(topic)
        if self.cache.track(topic) and self.pub_endpoint is not None:
            self._actions.append(Subscribe(route_channel(topic)))
        self._pull_stale(now)

    def on_reply(self, body: bytes, now: float) -> None:
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
            self.pub_endpoint = resolve_pub_endpoint(reply.pub_endpoint, self.endpoint or "")
            self._actions.append(ConnectSub(self.pub_endpoint))
            # Topics first, `hb` last: the first `hb` received proves all of them.
            for topic in self.cache.topics():
                self._actions.append(Subscribe(route_channel(topic)))
            self._actions.append(Subscribe(HB_CHANNEL))
            self._silence_deadline = now + self.request_timeout + self._silence_after
        elif isinstance(reply, GetRoutesReply):
            changes = self.cache.apply_pull(reply.epoch, reply.routes, reply.revisions, now)
            self._notify(changes)
        self._pull_stale(now)

    def on_event(self, body: bytes, now: float) -> None:
        try:
            event = decode_event(body)
        except msgspec.DecodeError as exc:
            log.warning("unreadable event from %s: %s", self.pub_endpoint, exc)
            return
        if isinstance(event, HbEvent):
            self._silence_deadline = now + self._silence_after
            self.backoff.reset()
        self._notify(self.cache.apply_event(event))
        self._pull_stale(now)

    def on_timer(self, now: float) -> None:
        if self._resume_at is not None:
            if now >= self._resume_at:
                self._connect(now)
            return
        if any(p.deadline <= now for p in self._pending.values()):
            self._fail(now, "no reply within %.1f s" % self.request_timeout)
            return
        if self._silence_deadline is not None and now >= self._silence_deadline:
            self._fail(now, "no hb event for %d intervals" % SILENT_HEARTBEATS)
            return
        self.cache.on_timer(now)
        self._pull_stale(now)

    # --- outputs ----------------------------------------------------------

    def actions(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

    def next_deadline(self) -> float | None:
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
    def _silence_after(self) -> float:
        return SILENT_HEARTBEATS * self.heartbeat_interval

    def _connect(self, now: float) -> None:
        self._resume_at = None
        self.endpoint = self.endpoints[self._index]
        self.pub_endpoint = None
        self._silence_deadline = None
        self._actions.append(Connect(self.endpoint))
        self._request(Status(), now)

    def _fail(self, now: float, why: str) -> None:
        delay = self.backoff.next_delay()
        self._index = (self._index + 1) % len(self.endpoints)
        log.warning("NameServer %s: %s; trying %s in %.2f s", self.endpoint, why,
                    self.endpoints[self._index], delay)
        self.switches += 1
        self._pending.clear()
        self.cache.reset()
        self.endpoint = self.pub_endpoint = None
        self._silence_deadline = None
        self._resume_at = now + delay
        self._actions.append(Connect(None))

    def _pull_stale(self, now: float) -> None:
        if not self.connected:
            return
        topics = self.cache.take_stale()
        if topics:
            self.pulls += 1
            self._request(GetRoutes(topics=topics), now)

    def _request(self, request: Request, now: float) -> None:
        request_id = self._next_id
        self._next_id += 1
        body = encode(msgspec.structs.replace(request, id=request_id))
        self._pending[request_id] = _Pending(request_op(request), now + self.request_timeout)
        self._actions.append(Send(body))

    def _notify(self, changes: list[Change]) -> None:
        self._actions.extend(Notify(topic, route) for topic, route in changes)


# --- one-shot requests (tools, tests) ------------------------------------------


def call(
    endpoint: str, request: Request, timeout: float = 3.0, context: zmq.Context | None = None
) -> Any:
    """Send one request to one NameServer and return its reply.

    Raises the ErrorReply of an `error` reply, or NameServerUnavailable on timeout.
    """
    ctx = context or zmq.Context.instance()
    sock = open_socket(ctx, zmq.DEALER, endpoint)
    try:
        sock.send(encode(request))
        if not sock.poll(int(timeout * 1000)):
            raise NameServerUnavailable(f"no NameServer answered at {endpoint} within {timeout:g} s")
        reply = decode_reply(sock.recv(), request_op(request))
    finally:
        sock.close(0)
    if isinstance(reply, Error):
        raise from_reply(reply)
    return reply


def call_any(
    endpoints: Iterable[str], request: Request, timeout: float = 3.0,
    context: zmq.Context | None = None,
) -> tuple[str, Any]:
    """Ask every NameServer at once; the first answer wins: (its endpoint, its reply)."""
    ctx = context or zmq.Context.instance()
    endpoints = list(endpoints)
    socks = {open_socket(ctx, zmq.DEALER, ep): ep for ep in endpoints}
    try:
        poller = zmq.Poller()
        for sock in socks:
            sock.send(encode(request))
            poller.register(sock, zmq.POLLIN)
        ready = poller.poll(int(timeout * 1000))
        if not ready:
            raise NameServerUnavailable(
                f"no NameServer answered within {timeout:g} s (tried {', '.join(endpoints)})"
            )
        sock = ready[0][0]
        reply = decode_reply(sock.recv(), request_op(request))
        endpoint = socks[sock]
    finally:
        for sock in socks:
            sock.close(0)
    if isinstance(reply, Error):
        raise from_reply(reply)
    return endpoint, reply


def call_all(
    endpoints: Iterable[str], request: Request, timeout: float = 3.0,
    context: zmq.Context | None = None,
) -> dict[str, Any]:
    """Send to every NameServer at once (as RocketMQ's admin writes do), wait up to `timeout`.

    Returns {endpoint: reply, or the ErrorReply / NameServerUnavailable it came to}.
    """
    ctx = context or zmq.Context.instance()
    endpoints = list(endpoints)
    socks = {open_socket(ctx, zmq.DEALER, ep): ep for ep in endpoints}
    results: dict[str, Any] = {}
    try:
        poller = zmq.Poller()
        for sock in socks:
            sock.send(encode(request))
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while len(results) < len(socks):
            left = deadline - time.monotonic()
            ready = poller.poll(max(0, left) * 1000) if left > 0 else []
            if not ready:
                break
            for sock, _ in ready:
                reply = decode_reply(sock.recv(), request_op(request))
                results[socks[sock]] = from_reply(reply) if isinstance(reply, Error) else reply
                poller.unregister(sock)
    finally:
        for sock in socks:
            sock.close(0)
    for endpoint in endpoints:
        results.setdefault(endpoint, NameServerUnavailable(
            f"no answer from {endpoint} within {timeout:g} s"))
    return {endpoint: results[endpoint] for endpoint in endpoints}


# --- the threaded client ------------------------------------------------------


class SessionSockets:
    """The DEALER and SUB that a ClientSession's actions open, subscribe and close.

    Shared by the threaded and the asyncio client: `ctx` decides which sockets these are.
    """

    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.dealer: Any = None
        self.sub: Any = None

    def carry_out(self, action: Connect | ConnectSub | Subscribe) -> None:
        match action:
            case Connect(endpoint=endpoint):
                self.close()
                if endpoint is not None:
                    self.dealer = open_socket(self.ctx, zmq.DEALER, endpoint)
            case ConnectSub(endpoint=endpoint):
                if self.sub is not None:
                    self.sub.close(0)
                self.sub = open_socket(self.ctx, zmq.SUB, endpoint)
            case Subscribe(channel=channel):
                if self.sub is not None:
                    self.sub.setsockopt(zmq.SUBSCRIBE, channel)

    def close(self) -> None:
        for sock in (self.dealer, self.sub):
            if sock is not None:
                sock.close(0)
        self.dealer = self.sub = None


class RouteClient:
    """Routes of topics from a list of NameServers, kept current by pushed events.

    `route(topic)` answers from the local cache and pulls on a miss;
    `watch(topic, callback)` calls `callback(topic, route)` from the client's
    thread with the current route and then on every change (`route` None: the
    topic has no route). One background thread owns the sockets.
    """

    def __init__(
        self,
        addrs: str | Iterable[str] | None = None,
        *,
        zone: str = "",
        timeout: float = 5.0,
        request_timeout: float = 3.0,
        heartbeat_interval: float = 1.0,
        pull_period: float = 30.0,
        fault_tolerance: bool = False,
        context: zmq.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self._session = ClientSession(
            parse_addresses(addrs), zone=zone, heartbeat_interval=heartbeat_interval,
            request_timeout=request_timeout, pull_period=pull_period,
        )
        self.selector = QueueSelector(fault_tolerance=fault_tolerance, clock=clock)
        self._ctx = context or zmq.Context.instance()
        self._clock = clock
        self._changed = threading.Condition()
        self._watchers: dict[str, list[RouteCallback]] = {}
        # Calls for watchers added while the route was known: its value then, first.
        self._first_calls: list[tuple[RouteCallback, str, TopicRoute | None]] = []
        self._sockets = SessionSockets(self._ctx)
        self._stopping = False
        self._waker = Waker()
        with self._changed:
            self._session.start(self._clock())
        self._thread = threading.Thread(target=self._run, name="zns-route-client", daemon=True)
        self._thread.start()

    # --- the API ---------------------------------------------------------

    @property
    def session(self) -> ClientSession:
        return self._session

    def route(self, topic: str, timeout: float | None = None) -> TopicRoute:
        """The route of `topic`; raises NotFound when it has none, NameServerUnavailable."""
        with self._changed:
            self._session.track(topic, self._clock())
            self._waker.wake()
            ok = self._changed.wait_for(
                lambda: self._session.cache.known(topic) or self._stopping,
                self.timeout if timeout is None else timeout,
            )
            if not ok or self._stopping:
                raise NameServerUnavailable(
                    f"no route for {topic!r}: no NameServer answered "
                    f"(tried {', '.join(self._session.endpoints)})"
                )
            route = self._session.cache.view(topic)
            if route is None:
                raise NotFound(f"no route for topic {topic!r}", self._session.cache.revision(topic))
            return route

    def watch(self, topic: str, callback: RouteCallback) -> Callable[[], None]:
        """Call `callback(topic, route)` now (once known) and on every change; returns unwatch."""
        with self._changed:
            self._session.track(topic, self._clock())
            self._watchers.setdefault(topic, []).append(callback)
            if self._session.cache.known(topic):
                self._first_calls.append((callback, topic, self._session.cache.view(topic)))
            self._waker.wake()

        def unwatch() -> None:
            with self._changed:
                callbacks = self._watchers.get(topic, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return unwatch

    def write_queues(self, topic: str) -> list[MessageQueue]:
        return write_queues(self.route(topic))

    def read_queues(self, topic: str) -> list[MessageQueue]:
        return read_queues(self.route(topic))

    def select_queue(self, topic: str, avoid_broker: str | None = None) -> MessageQueue:
        """The next writable queue, round-robin, not on `avoid_broker` when possible."""
        return self.selector.select_queue(topic, self.write_queues(topic), avoid_broker)

    def report_latency(self, broker_name: str, latency_ms: float, failed: bool = False) -> None:
        """Feed the latency fault avoidance (used when `fault_tolerance=True`)."""
        self.selector.report(broker_name, latency_ms, failed)

    def close(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._waker.wake()
        self._thread.join(5)
        self._waker.close()

    def __enter__(self) -> RouteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the thread --------------------------------------------------------------

    def _run(self) -> None:
        ready: dict[Any, int] = {}
        try:
            while True:
                with self._changed:
                    if self._stopping:
                        return
                    now = self._clock()
                    if self._waker.reader in ready:
                        self._waker.drain()
                    if self._sockets.dealer is not None and self._sockets.dealer in ready:
                        for frames in recv_all(self._sockets.dealer):
                            self._session.on_reply(frames[-1], now)
                    if self._sockets.sub is not None and self._sockets.sub in ready:
                        for frames in recv_all(self._sockets.sub):
                            self._session.on_event(frames[-1], now)
                    self._session.on_timer(now)
                    calls = self._carry_out(self._session.actions())
                    first, self._first_calls = self._first_calls, []
                    calls[:0] = first
                    self._changed.notify_all()
                    poller = zmq.Poller()
                    poller.register(self._waker.reader, zmq.POLLIN)
                    for sock in (self._sockets.dealer, self._sockets.sub):
                        if sock is not None:
                            poller.register(sock, zmq.POLLIN)
                    deadline = self._session.next_deadline()
                for callback, topic, route in calls:
                    _safely(callback, topic, route)
                wait_ms = None if deadline is None else max(0, (deadline - self._clock()) * 1000)
                ready = dict(poller.poll(wait_ms))
        finally:
            with self._changed:
                self._sockets.close()

    def _carry_out(self, actions: list[Action]) -> list[tuple[RouteCallback, str, Any]]:
        """Do the socket actions; return the callbacks to run (outside the lock)."""
        calls = []
        for action in actions:
            match action:
                case Connect() | ConnectSub() | Subscribe():
                    self._sockets.carry_out(action)
                case Send(body=body):
                    if self._sockets.dealer is not None:
                        try:
                            self._sockets.dealer.send(body, zmq.DONTWAIT)
                        except zmq.Again:
                            pass  # counts as a timeout: the session moves on
                case Notify(topic=topic, route=route):
                    calls.extend((cb, topic, route) for cb in self._watchers.get(topic, ()))
        return calls


def _safely(callback: RouteCallback, topic: str, route: TopicRoute | None) -> None:
    try:
        callback(topic, route)
    except Exception:
        log.exception("route callback for %s failed", topic)


__all__ = [
    "Backoff", "ClientSession", "NameServerUnavailable", "RouteCache", "RouteClient", "call",
    "call_any", "check_topic",
]

"""What the threaded and the asyncio route client share: the driver half of a `ClientSession`.

`ClientDriver` owns the session, the queue selector, the sockets and the
clock. It turns the clock into the core's integer milliseconds, feeds the
session what the sockets received (`turn`), carries out the session's
actions and turns a finished wait into a route or the right error. Each
client holds one and supplies only how to wait and whom to tell:
`RouteClient` (one thread, one `zmq.Poller`, callbacks) and
`AsyncRouteClient` (one asyncio task, iterators).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

import zmq

from zns.core.client_session import (
    ClientAction,
    ClientSession,
    FollowServer,
    ConnectEvents,
    Notify,
    SendBytes,
    Subscribe,
    Unsubscribe,
)
from zns.core.errors import BackgroundFailure, NameServerUnavailable, NotFound, UsageError
from zns.core.queues import MessageQueue, QueueSelector
from zns.core.schema import TopicRoute
from zns.drivers.sockets import open_socket, parse_addresses, recv_all

log = logging.getLogger("zns.client")

RouteCallback = Callable[[str, TopicRoute | None], None]


EVENTS_ENV_VAR = "ZNS_EVENTS"


def events_endpoint(spec: str | None) -> str | None:
    """Where to subscribe instead of the NameServer's own PUB (an events relay):
    `spec`, else `$ZNS_EVENTS`, else None (the NameServer's PUB, learnt from `status`)."""
    if spec is None or not spec.strip():
        spec = os.environ.get(EVENTS_ENV_VAR, "").strip()
    if not spec:
        return None
    endpoints = parse_addresses(spec)
    if len(endpoints) != 1:
        raise UsageError(f"events endpoint {spec!r}: expected one endpoint, got {len(endpoints)}")
    return endpoints[0]


def _safely(hook: Callable[[bytes], None], body: bytes) -> None:
    try:
        hook(body)
    except Exception:
        log.exception("event hook failed")


def to_ms(seconds: float) -> int:
    """A duration of the drivers' API (seconds) in the core's unit."""
    return max(1, round(seconds * 1000))


class SessionSockets:
    """The DEALER and SUB that a ClientSession's actions open, subscribe and close.

    `ctx` decides what kind of sockets `dealer` and `sub` are (the driver's
    poller waits on them); messages are sent and received through a plain
    `zmq.Socket` view of each, so both clients use the one `recv_all`.
    """

    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.dealer: Any = None
        self.sub: Any = None
        self.monitor: Any = None  # the SUB's disconnections (a relay restart, a network cut)
        self._plain: dict[Any, zmq.Socket] = {}

    def carry_out(self, action: FollowServer | ConnectEvents | Subscribe | Unsubscribe) -> None:
        match action:
            case FollowServer(endpoint=endpoint):
                self.close()
                if endpoint is not None:
                    self.dealer = self._open(zmq.DEALER, endpoint)
            case ConnectEvents(endpoint=endpoint):
                self._close_sub()
                self.sub = self._open(zmq.SUB, endpoint)
                self.monitor = self.sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                self._plain[self.monitor] = zmq.Socket.shadow(self.monitor.underlying)
            case Subscribe(channel=channel):
                if self.sub is not None:
                    self._plain[self.sub].setsockopt(zmq.SUBSCRIBE, channel)
            case Unsubscribe(channel=channel):
                if self.sub is not None:
                    self._plain[self.sub].setsockopt(zmq.UNSUBSCRIBE, channel)

    def send(self, body: bytes) -> None:
        """Queue `body` on the DEALER without blocking; one not queued times out in the session."""
        if self.dealer is None:
            return
        try:
            self._plain[self.dealer].send(body, zmq.DONTWAIT)
        except zmq.Again:
            log.debug("request not queued; the session will time it out")

    def receive(self, sock: Any) -> list[bytes]:
        """The bodies waiting on `sock` (`dealer` or `sub`; the body is the last frame)."""
        return [frames[-1] for frames in recv_all(self._plain[sock])]

    @property
    def viewed(self) -> set[Any]:
        """The sockets that have a plain view: exactly the open ones."""
        return set(self._plain)

    def readable(self) -> list[Any]:
        """The open sockets, for the driver's poller."""
        return [sock for sock in (self.dealer, self.sub, self.monitor) if sock is not None]

    def disconnected(self) -> bool:
        """Read the SUB's monitor: did its connection drop since the last call?"""
        return bool(self.monitor is not None and recv_all(self._plain[self.monitor]))

    def close(self) -> None:
        self._close_sub()
        self._close(self.dealer)
        self.dealer = None

    def _close_sub(self) -> None:
        if self.monitor is not None:
            self._plain.pop(self.monitor, None)
            self.sub.disable_monitor()
            self.monitor.close(0)
            self.monitor = None
        self._close(self.sub)
        self.sub = None

    def _open(self, kind: int, endpoint: str) -> Any:
        sock = open_socket(self.ctx, kind, endpoint)
        self._plain[sock] = zmq.Socket.shadow(sock.underlying)
        return sock

    def _close(self, sock: Any) -> None:
        if sock is not None:
            self._plain.pop(sock, None)
            sock.close(0)


class DriverClient:
    """What both clients publish of the `ClientDriver` they hold as `driver`, forwarded."""

    driver: ClientDriver

    @property
    def session(self) -> ClientSession:
        return self.driver.session

    @property
    def selector(self) -> QueueSelector:
        return self.driver.selector

    @property
    def timeout(self) -> float:
        return self.driver.timeout

    @property
    def failure(self) -> BaseException | None:
        """The exception that ended the background thread or task (None while it runs)."""
        return self.driver.failure

    def forget(self, topic: str) -> None:
        """Stop following `topic`: no more pulls or events of it; its watches end."""
        self.driver.forget(topic)

    def report_latency(self, broker_name: str, latency_ms: float, failed: bool = False) -> None:
        """Feed the latency fault avoidance (used when `fault_tolerance=True`)."""
        self.driver.report_latency(broker_name, latency_ms, failed)


class ClientDriver:
    """The session, the queue selector, the sockets and the clock of one client, and the
    action loop both clients run.

    A client holds one as `driver` and hands it three hooks: `wake()` (make the
    client's loop run a turn now), `notify(topic, route)` (a watched route changed)
    and `forget_watchers(topic)` (a topic is no longer followed). Every access to
    the session happens inside `lock` (a real lock in the threaded client, a no-op
    under asyncio); `name` is the client's, for its failure.
    """

    def __init__(
        self,
        addrs: str | Iterable[str] | None,
        *,
        name: str,
        zone: str,
        timeout: float,
        request_timeout: float,
        heartbeat_interval: float,
        pull_period: float,
        fault_tolerance: bool,
        context: zmq.Context,
        clock: Callable[[], float],
        lock: contextlib.AbstractContextManager[Any],
        wake: Callable[[], None],
        notify: Callable[[str, TopicRoute | None], None],
        forget_watchers: Callable[[str], None],
        events: str | None = None,
        channels: Iterable[bytes] = (),
        on_event: Callable[[bytes], None] | None = None,
    ) -> None:
        self.name = name
        self.timeout = timeout
        self._clock = clock  # seconds, monotonic
        self.on_event = on_event  # sees every event body received, on the loop's side
        self.session = ClientSession(
            parse_addresses(addrs), zone=zone, heartbeat_interval_ms=to_ms(heartbeat_interval),
            request_timeout_ms=to_ms(request_timeout), pull_period_ms=to_ms(pull_period),
            events=events_endpoint(events), channels=tuple(channels),
        )
        self.selector = QueueSelector(fault_tolerance=fault_tolerance)
        self._selector_lock = threading.Lock()  # select_queue/report_latency from any thread
        self.sockets = SessionSockets(context)
        self.lock = lock
        self.wake, self._notify, self._forget_watchers = wake, notify, forget_watchers
        # What killed the background thread or task: every later call raises it (chained),
        # so a bug is never mistaken for an outage nor left as a hang.
        self._failure: BaseException | None = None

    # --- what the clients publish as they are ------------------------------------

    def forget(self, topic: str) -> None:
        """Stop following `topic`: no more pulls or events of it; its watchers end."""
        self.raise_if_failed()
        with self.lock:
            self.session.forget(topic)
            self._forget_watchers(topic)
        self.wake()

    def report_latency(self, broker_name: str, latency_ms: float, failed: bool = False) -> None:
        """Feed the latency fault avoidance (used when `fault_tolerance=True`)."""
        with self._selector_lock:
            self.selector.report(broker_name, latency_ms, self.now(), failed)

    @property
    def failure(self) -> BaseException | None:
        """The exception that ended the background thread or task (None while it runs)."""
        return self._failure

    # --- what the clients build on ---------------------------------------------

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise BackgroundFailure.of(f"the {self.name}'s background loop", self._failure)

    def died(self, exc: BaseException) -> None:
        """Record what ended the loop (the caller holds the lock) and say so once."""
        self._failure = exc
        log.error("the %s's background loop failed (every later call raises it): %s: %s",
                  self.name, type(exc).__name__, exc)
        log.debug("the failure", exc_info=exc)

    def now(self) -> int:
        """The clock in the core's unit: whole milliseconds."""
        return int(self._clock() * 1000)

    def track(self, topic: str) -> None:
        """Follow `topic` (a `route()` or `watch()` starting) and wake the loop."""
        self.raise_if_failed()
        with self.lock:
            self.session.track(topic, self.now())
        self.wake()

    def answer(self, topic: str, known: bool) -> TopicRoute:
        """The end of a `route()` wait: the route, or why there is none."""
        self.raise_if_failed()
        if not known:
            raise NameServerUnavailable(
                f"no route for {topic!r}: no NameServer answered "
                f"(tried {', '.join(self.session.endpoints)})"
            )
        cache = self.session.cache
        route = cache.view(topic)
        if route is None:
            raise NotFound(f"no route for topic {topic!r}", cache.revision(topic))
        return route

    def select(self, topic: str, queues: list[MessageQueue],
               avoid_broker: str | None) -> MessageQueue:
        with self._selector_lock:
            return self.selector.select_queue(topic, queues, self.now(), avoid_broker)

    def turn(self, ready: Collection[Any]) -> None:
        """One pass of the loop (inside the lock): what `ready` sockets hold, the timers,
        then the session's actions."""
        now = self.now()
        sockets, session = self.sockets, self.session
        if sockets.dealer is not None and sockets.dealer in ready:
            for body in sockets.receive(sockets.dealer):
                session.on_reply(body, now)
        if sockets.sub is not None and sockets.sub in ready:
            for body in sockets.receive(sockets.sub):
                if self.on_event is not None:
                    _safely(self.on_event, body)
                session.on_event(body, now)
        if sockets.monitor is not None and sockets.monitor in ready and sockets.disconnected():
            session.on_events_disconnected(now)
        session.on_timer(now)
        self.carry_out(session.actions())

    def wait_ms(self, deadline: int | None) -> int | None:
        """How long the loop may block before `deadline` (None: until a socket or a wake)."""
        return None if deadline is None else max(0, deadline - self.now())

    def carry_out(self, actions: list[ClientAction]) -> None:
        for action in actions:
            match action:
                case FollowServer() | ConnectEvents() | Subscribe() | Unsubscribe():
                    self.sockets.carry_out(action)
                case SendBytes(body=body):
                    self.sockets.send(body)
                case Notify(topic=topic, route=route):
                    self._notify(topic, route)

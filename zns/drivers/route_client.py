"""`RouteClient`: routes of topics from NameServers, one background thread, callbacks.

The protocol is `zns.core.client_session.ClientSession`; `ClientDriver`
carries out what it decides. This module adds only the thread: one
`zmq.Poller` over the session's sockets and a `Waker`, a condition variable
for callers waiting in `route()`, and watcher callbacks run on the thread
outside the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from zns.core.client_session import ClientSession
from zns.core.queues import MessageQueue, QueueSelector, read_queues, write_queues
from zns.core.schema import TopicRoute
from zns.drivers.client_base import ClientDriver, DriverClient, RouteCallback, log
from zns.drivers.sockets import Waker


class RouteClient(DriverClient):
    """Routes of topics from a list of NameServers, kept current by pushed events.

    `route(topic)` answers from the local cache and pulls on a miss;
    `watch(topic, callback)` calls `callback(topic, route)` from the client's
    thread with the current route and then on every change (`route` None: the
    topic has no route); `forget(topic)` stops following it. Durations are
    in seconds; `clock` is a monotonic clock in seconds.

    `events` (or `$ZNS_EVENTS`): subscribe at this endpoint, an events relay
    (`zns relay`), instead of at the NameServer's own PUB. `channels` are
    subscribed besides the followed topics, and `on_event(body)` sees every
    event body received, on the client's thread (`zns watch` uses both).
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
        events: str | None = None,
        channels: Iterable[bytes] = (),
        on_event: Callable[[bytes], None] | None = None,
    ) -> None:
        self._changed = threading.Condition()
        # The session, sockets, clock and action loop (shared with AsyncRouteClient).
        self.driver = ClientDriver(
            addrs, name=type(self).__name__, zone=zone, timeout=timeout,
            request_timeout=request_timeout, heartbeat_interval=heartbeat_interval,
            pull_period=pull_period, fault_tolerance=fault_tolerance,
            context=context or zmq.Context.instance(), clock=clock, events=events,
            channels=channels, on_event=on_event, lock=self._changed, wake=self._wake,
            notify=self._notify, forget_watchers=self._forget_watchers,
        )
        self._session = self.driver.session
        self._watchers: dict[str, list[RouteCallback]] = {}
        # Callbacks to run on the thread, outside the lock, in order.
        self._calls: list[tuple[RouteCallback, str, TopicRoute | None]] = []
        self._stopping = False
        self._waker = Waker()
        with self._changed:
            self._session.start(self.driver.now())
        self._thread = threading.Thread(target=self._run, name="zns-route-client", daemon=True)
        self._thread.start()

    # --- the API ---------------------------------------------------------

    def route(self, topic: str, timeout: float | None = None) -> TopicRoute:
        """The route of `topic`; raises NotFound when it has none, NameServerUnavailable."""
        self.driver.track(topic)
        with self._changed:
            known = self._changed.wait_for(
                lambda: self._session.cache.known(topic) or self._stopping
                or self.driver.failure is not None,
                self.timeout if timeout is None else timeout,
            )
            return self.driver.answer(topic, known and not self._stopping)

    def watch(self, topic: str, callback: RouteCallback) -> Callable[[], None]:
        """Call `callback(topic, route)` now (once known) and on every change.

        Returns a function that removes this callback (the topic stays
        followed: `forget` stops that).
        """
        self.driver.raise_if_failed()
        with self._changed:
            self._session.track(topic, self.driver.now())
            self._watchers.setdefault(topic, []).append(callback)
            if self._session.cache.known(topic):
                self._calls.append((callback, topic, self._session.cache.view(topic)))
        self._wake()

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
        return self.driver.select(topic, self.write_queues(topic), avoid_broker)

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
        ready: set[Any] = set()
        try:
            while True:
                with self._changed:
                    if self._stopping:
                        return
                    self._waker.drain_if_woken(ready)
                    self.driver.turn(ready)
                    calls, self._calls = self._calls, []
                    self._changed.notify_all()
                    poller = zmq.Poller()
                    for sock in [self._waker.fd, *self.driver.sockets.readable()]:
                        poller.register(sock, zmq.POLLIN)
                    deadline = self._session.next_deadline()
                for callback, topic, route in calls:
                    _safely(callback, topic, route)
                ready = {sock for sock, _ in poller.poll(self.driver.wait_ms(deadline))}
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, not lost in a thread
            with self._changed:
                self.driver.died(exc)
                self._changed.notify_all()
        finally:
            with self._changed:
                self.driver.sockets.close()

    def _wake(self) -> None:
        self._waker.wake()

    def _notify(self, topic: str, route: TopicRoute | None) -> None:
        self._calls.extend((cb, topic, route) for cb in self._watchers.get(topic, ()))

    def _forget_watchers(self, topic: str) -> None:
        self._watchers.pop(topic, None)
        self._calls = [call for call in self._calls if call[1] != topic]


def _safely(callback: RouteCallback, topic: str, route: TopicRoute | None) -> None:
    try:
        callback(topic, route)
    except Exception:
        log.exception("route callback for %s failed", topic)


__all__ = ["RouteClient"]

"""`AsyncRouteClient`: the route client for asyncio, same semantics as `RouteClient`.

The protocol is `zns.core.client_session.ClientSession`; `ClientDriver`
carries out what it decides. This module adds only the task: one
`zmq.asyncio.Poller` wait, raced with a wake-up event, and a one-route
buffer per `watch` iterator.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import zmq
import zmq.asyncio

from zns.core.client_session import ClientSession
from zns.core.queues import MessageQueue, QueueSelector, read_queues, write_queues
from zns.core.schema import TopicRoute
from zns.drivers.client_base import ClientDriver, DriverClient

_EMPTY = object()  # a `_Latest` with nothing new
_FORGOTTEN = object()  # the topic is no longer followed: the iterator ends
_FAILED = object()  # the client's task died: the iterator raises its failure


class _Latest:
    """One `watch` iterator's buffer: only the newest route is kept, so a consumer
    slower than the changes skips to the latest instead of holding every one."""

    def __init__(self) -> None:
        self._value: Any = _EMPTY
        self._ready = asyncio.Event()

    def put(self, value: Any) -> None:
        if self._value not in (_FORGOTTEN, _FAILED):
            self._value = value
            self._ready.set()

    async def get(self) -> Any:
        await self._ready.wait()
        value = self._value
        if value not in (_FORGOTTEN, _FAILED):
            self._value = _EMPTY
            self._ready.clear()
        return value


class AsyncRouteClient(DriverClient):
    """`async with AsyncRouteClient(addrs) as client:` then `await client.route(topic)`
    or `async for route in client.watch(topic)` (the current route, then changes;
    None when the topic has no route). Durations are in seconds. `events` (or
    `$ZNS_EVENTS`): subscribe at this events relay instead of the NameServer's PUB."""

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
        context: zmq.asyncio.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        events: str | None = None,
    ) -> None:
        # The session, sockets, clock and action loop (shared with RouteClient).
        self.driver = ClientDriver(
            addrs, name=type(self).__name__, zone=zone, timeout=timeout,
            request_timeout=request_timeout, heartbeat_interval=heartbeat_interval,
            pull_period=pull_period, fault_tolerance=fault_tolerance,
            context=context or zmq.asyncio.Context.instance(), clock=clock, events=events,
            lock=contextlib.nullcontext(),  # one task, one thread
            wake=self._wake, notify=self._notify, forget_watchers=self._forget_watchers,
        )
        self._session = self.driver.session
        self._watchers: dict[str, list[_Latest]] = {}
        self._wakeup = asyncio.Event()
        self._changed = asyncio.Event()  # set (and replaced) after every pass of the loop
        self._task: asyncio.Task[None] | None = None

    def watching(self, topic: str) -> int:
        """How many `watch` iterators follow `topic` now."""
        return len(self._watchers.get(topic, ()))

    async def start(self) -> None:
        if self._task is None:
            self._session.start(self.driver.now())
            self._task = asyncio.create_task(self._run(), name="zns-async-route-client")

    async def route(self, topic: str, timeout: float | None = None) -> TopicRoute:
        """The route of `topic`; raises NotFound when it has none, NameServerUnavailable."""
        await self.start()
        self.driver.track(topic)
        cache, known = self._session.cache, True
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                while not cache.known(topic) and self.driver.failure is None:
                    await self._changed.wait()
        except TimeoutError:
            known = False
        return self.driver.answer(topic, known)

    async def watch(self, topic: str) -> AsyncIterator[TopicRoute | None]:
        """The route of `topic` once known, then its changes, until the loop is left
        or `forget(topic)`. A consumer that falls behind gets the latest route next."""
        await self.start()
        self.driver.raise_if_failed()
        latest = _Latest()
        self._watchers.setdefault(topic, []).append(latest)
        self.driver.track(topic)
        if self._session.cache.known(topic):
            latest.put(self._session.cache.view(topic))
        try:
            while (route := await latest.get()) is not _FORGOTTEN:
                if route is _FAILED:
                    self.driver.raise_if_failed()
                yield route
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.get(topic, []).remove(latest)

    async def write_queues(self, topic: str) -> list[MessageQueue]:
        return write_queues(await self.route(topic))

    async def read_queues(self, topic: str) -> list[MessageQueue]:
        return read_queues(await self.route(topic))

    async def select_queue(self, topic: str, avoid_broker: str | None = None) -> MessageQueue:
        """The next writable queue, round-robin, not on `avoid_broker` when possible."""
        return self.driver.select(topic, await self.write_queues(topic), avoid_broker)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.driver.sockets.close()

    async def __aenter__(self) -> AsyncRouteClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the task ---------------------------------------------------------------

    async def _run(self) -> None:
        ready: set[Any] = set()
        try:
            while True:
                self.driver.turn(ready)
                self._changed.set()
                self._changed = asyncio.Event()
                ready = await wait_readable(self.driver.sockets.readable(), self._wakeup,
                                            self.driver.wait_ms(self._session.next_deadline()))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, not lost in a task
            self.driver.died(exc)
            self._changed.set()
            for watchers in self._watchers.values():
                for latest in watchers:
                    latest.put(_FAILED)

    def _wake(self) -> None:
        self._wakeup.set()

    def _notify(self, topic: str, route: TopicRoute | None) -> None:
        for latest in self._watchers.get(topic, ()):
            latest.put(route)

    def _forget_watchers(self, topic: str) -> None:
        for latest in self._watchers.pop(topic, ()):
            latest.put(_FORGOTTEN)


async def wait_readable(sockets: list[Any], wakeup: asyncio.Event,
                        timeout_ms: int | None) -> set[Any]:
    """Those of `sockets` readable once one is, `wakeup` is set (and cleared here), or
    `timeout_ms` passes (None: no timeout)."""
    poller = zmq.asyncio.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    poll = asyncio.ensure_future(poller.poll(timeout_ms))
    woken = asyncio.ensure_future(wakeup.wait())
    try:
        await asyncio.wait({poll, woken}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in (poll, woken):
            fut.cancel()
    wakeup.clear()
    return {sock for sock, _ in poll.result()} if poll.done() and not poll.cancelled() else set()

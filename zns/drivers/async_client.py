"""`AsyncRouteClient`: the route client for asyncio, same semantics as `RouteClient`.

The protocol logic is `zns.drivers.route_client.ClientSession` (sans-I/O); this module only
carries out its actions with `zmq.asyncio` sockets on one task.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import zmq
import zmq.asyncio

from zns.drivers.sockets import parse_addresses
from zns.drivers.route_client import (
    Action,
    ClientSession,
    Connect,
    ConnectSub,
    NameServerUnavailable,
    Notify,
    Send,
    SessionSockets,
    Subscribe,
    log,
)
from zns.core.errors import NotFound
from zns.core.queues import MessageQueue, QueueSelector, read_queues, write_queues
from zns.core.schema import TopicRoute


class AsyncRouteClient:
    """`async with AsyncRouteClient(addrs) as client:` then `await client.route(topic)`
    or `async for route in client.watch(topic)` (the current route, then every change;
    None when the topic has no route)."""

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
    ) -> None:
        self.timeout = timeout
        self._session = ClientSession(
            parse_addresses(addrs), zone=zone, heartbeat_interval=heartbeat_interval,
            request_timeout=request_timeout, pull_period=pull_period,
        )
        self.selector = QueueSelector(fault_tolerance=fault_tolerance, clock=clock)
        self._ctx = context or zmq.asyncio.Context.instance()
        self._clock = clock
        self._sockets = SessionSockets(self._ctx)
        self._watchers: dict[str, list[asyncio.Queue[TopicRoute | None]]] = {}
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()  # set (and replaced) after every pass of the loop
        self._task: asyncio.Task[None] | None = None

    @property
    def session(self) -> ClientSession:
        return self._session

    async def start(self) -> None:
        if self._task is None:
            self._session.start(self._clock())
            self._task = asyncio.create_task(self._run(), name="zns-async-route-client")

    async def route(self, topic: str, timeout: float | None = None) -> TopicRoute:
        """The route of `topic`; raises NotFound when it has none, NameServerUnavailable."""
        await self.start()
        self._session.track(topic, self._clock())
        self._wake.set()
        cache = self._session.cache
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                while not cache.known(topic):
                    await self._changed.wait()
        except TimeoutError:
            raise NameServerUnavailable(
                f"no route for {topic!r}: no NameServer answered "
                f"(tried {', '.join(self._session.endpoints)})"
            ) from None
        route = cache.view(topic)
        if route is None:
            raise NotFound(f"no route for topic {topic!r}", cache.revision(topic))
        return route

    async def watch(self, topic: str) -> AsyncIterator[TopicRoute | None]:
        """The route of `topic` once known, then each change, until the loop is left."""
        await self.start()
        self._session.track(topic, self._clock())
        queue: asyncio.Queue[TopicRoute | None] = asyncio.Queue()
        if self._session.cache.known(topic):
            queue.put_nowait(self._session.cache.view(topic))
        self._watchers.setdefault(topic, []).append(queue)
        self._wake.set()
        try:
            while True:
                yield await queue.get()
        finally:
            self._watchers[topic].remove(queue)

    async def write_queues(self, topic: str) -> list[MessageQueue]:
        return write_queues(await self.route(topic))

    async def read_queues(self, topic: str) -> list[MessageQueue]:
        return read_queues(await self.route(topic))

    async def select_queue(self, topic: str, avoid_broker: str | None = None) -> MessageQueue:
        return self.selector.select_queue(topic, await self.write_queues(topic), avoid_broker)

    def report_latency(self, broker_name: str, latency_ms: float, failed: bool = False) -> None:
        self.selector.report(broker_name, latency_ms, failed)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._sockets.close()

    async def __aenter__(self) -> AsyncRouteClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the task ---------------------------------------------------------------

    async def _run(self) -> None:
        ready: dict[Any, int] = {}
        session = self._session
        while True:
            now = self._clock()
            if self._sockets.dealer is not None and self._sockets.dealer in ready:
                for frames in await _recv_all(self._sockets.dealer):
                    session.on_reply(frames[-1], now)
            if self._sockets.sub is not None and self._sockets.sub in ready:
                for frames in await _recv_all(self._sockets.sub):
                    session.on_event(frames[-1], now)
            session.on_timer(now)
            self._carry_out(session.actions())
            self._changed.set()
            self._changed = asyncio.Event()
            ready = await self._wait(session.next_deadline())

    async def _wait(self, deadline: float | None) -> dict[Any, int]:
        """Until a socket is readable, `_wake` is set, or `deadline` passes."""
        poller = zmq.asyncio.Poller()
        for sock in (self._sockets.dealer, self._sockets.sub):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        wait_ms = None if deadline is None else max(0, (deadline - self._clock()) * 1000)
        poll = asyncio.ensure_future(poller.poll(wait_ms))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({poll, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (poll, woken):
                fut.cancel()
        self._wake.clear()
        return dict(poll.result()) if poll.done() and not poll.cancelled() else {}

    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Connect() | ConnectSub() | Subscribe():
                    self._sockets.carry_out(action)
                case Send(body=body):
                    if self._sockets.dealer is not None:
                        sent = self._sockets.dealer.send(body, zmq.DONTWAIT)
                        if sent.done() and sent.exception() is not None:
                            log.debug("request not queued; the session will time it out")
                case Notify(topic=topic, route=route):
                    for queue in self._watchers.get(topic, ()):
                        queue.put_nowait(route)


async def _recv_all(sock: zmq.asyncio.Socket, limit: int = 10_000) -> list[list[bytes]]:
    messages = []
    for _ in range(limit):
        try:
            messages.append(await sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            break
    return messages

"""`BrokerAgent`: keeps one broker registered with every NameServer of a list (§4, §10).

Each NameServer gets its own DEALER and its own schedule, served by one
background thread with one poller, so a NameServer that is down or slow never
delays the others. Per NameServer: a full `register_broker` at start and
every `register_period`, a `heartbeat` every `heartbeat_interval`, and a new
registration at once when a heartbeat answers `known: false` or
`changed: true` (a restarted NameServer is complete again within one
heartbeat). A request that times out closes that DEALER (so a late reply
cannot be taken for the answer to a later request) and the agent reconnects
after an exponential backoff with jitter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from zns.drivers.sockets import Waker, open_socket, parse_addresses, recv_all
from zns.core.backoff import Backoff
from zns.core.errors import UsageError
from zns.core.schema import (
    DataVersion,
    Error,
    Heartbeat,
    HeartbeatReply,
    RegisterBroker,
    RegisterBrokerReply,
    Request,
    TopicConfig,
    UnregisterBroker,
    UnregisterBrokerReply,
    decode_reply,
    describe_decode_error,
    encode,
    request_op,
)

log = logging.getLogger("zns.drivers.broker_agent")

MIN_REGISTER_PERIOD, MAX_REGISTER_PERIOD = 10.0, 60.0  # RocketMQ's clamp


@dataclass
class _Link:
    """One NameServer as this agent sees it."""

    endpoint: str
    backoff: Backoff
    sock: zmq.Socket | None = None
    in_flight: tuple[int, str, float] | None = None  # (id, op, deadline): one at a time
    registered_version: DataVersion | None = None  # what the NameServer holds, as far as we know
    sent_version: DataVersion | None = None  # the version of the registration in flight
    next_register: float = 0.0
    next_heartbeat: float = 0.0
    reconnect_at: float = 0.0
    last_error: str = ""
    registrations: int = 0
    unregistered: bool = False


@dataclass(frozen=True)
class LinkStatus:
    endpoint: str
    registered: bool
    registrations: int  # successful registrations so far
    last_error: str


@dataclass
class _Config:
    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    ha_addr: str
    zone: str
    filter_servers: list[str]
    heartbeat_timeout_ms: int
    topics: dict[str, TopicConfig] = field(default_factory=dict)


class BrokerAgent:
    """Registers one broker with every NameServer; `close()` unregisters it.

    Usable as a context manager. The topic methods are thread-safe; each bumps
    the DataVersion and registers at once.
    """

    def __init__(
        self,
        addrs: str | Iterable[str] | None = None,
        *,
        cluster: str,
        broker_name: str,
        broker_addr: str,
        broker_id: int = 0,
        ha_addr: str = "",
        zone: str = "",
        topics: Mapping[str, TopicConfig | Mapping[str, Any]] | Iterable[str] = (),
        filter_servers: Iterable[str] = (),
        register_period: float = 30.0,
        heartbeat_interval: float = 1.0,
        heartbeat_timeout_ms: int = 10_000,
        request_timeout: float = 3.0,
        state_version: int = 0,
        context: zmq.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        start: bool = True,
    ) -> None:
        if not isinstance(topics, Mapping):
            topics = {topic: TopicConfig() for topic in topics}
        self._config = _Config(
            cluster=cluster, broker_name=broker_name, broker_id=broker_id,
            broker_addr=broker_addr, ha_addr=ha_addr, zone=zone,
            filter_servers=list(filter_servers), heartbeat_timeout_ms=heartbeat_timeout_ms,
            topics={t: _topic_config(c) for t, c in topics.items()},
        )
        self._version = DataVersion(state=state_version, timestamp=_wall_ms(), counter=0)
        _validate(msgspec.to_builtins(self._registration()))
        self.register_period = min(MAX_REGISTER_PERIOD, max(MIN_REGISTER_PERIOD, register_period))
        self.heartbeat_interval = heartbeat_interval
        self.request_timeout = request_timeout
        self._close_timeout = 3.0
        self._clock = clock
        self._ctx = context or zmq.Context.instance()
        self._links = [_Link(ep, Backoff()) for ep in parse_addresses(addrs)]
        self._lock = threading.Lock()
        self._stopping = False
        self._next_id = 1
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="zns-broker-agent", daemon=True)
        if start:
            self.start()

    # --- the API -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def data_version(self) -> DataVersion:
        return self._version

    @property
    def topics(self) -> dict[str, TopicConfig]:
        with self._lock:
            return dict(self._config.topics)

    def add_topic(self, topic: str, config: TopicConfig | Mapping[str, Any] | None = None) -> None:
        """Add or update a topic; registers at once with every NameServer."""
        cfg = _topic_config(config or {})
        _validate({"op": "register_broker", "topics": {topic: msgspec.to_builtins(cfg)},
                   **_ids(self._config)})
        self._change(lambda topics: topics.__setitem__(topic, cfg))

    update_topic = add_topic

    def remove_topic(self, topic: str) -> None:
        self._change(lambda topics: topics.pop(topic, None))

    def status(self) -> list[LinkStatus]:
        with self._lock:
            return [
                LinkStatus(link.endpoint, link.registered_version == self._version,
                           link.registrations, link.last_error)
                for link in self._links
            ]

    def registered_everywhere(self) -> bool:
        return all(s.registered for s in self.status())

    def close(self, timeout: float = 3.0) -> dict[str, bool]:
        """Unregister from every NameServer (bounded by `timeout`); {endpoint: unregistered}."""
        self._close_timeout = timeout
        with self._lock:
            self._stopping = True
        self._waker.wake()
        if self._thread.is_alive():
            self._thread.join(timeout + 2)
        self._waker.close()
        return {link.endpoint: link.unregistered for link in self._links}

    def __enter__(self) -> BrokerAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -------------------------------------------------------------

    def _change(self, edit: Callable[[dict[str, TopicConfig]], object]) -> None:
        with self._lock:
            edit(self._config.topics)
            v = self._version
            self._version = DataVersion(state=v.state, timestamp=_wall_ms(), counter=v.counter + 1)
            for link in self._links:
                link.next_register = 0.0  # register the change at once, everywhere
        self._waker.wake()

    def _registration(self) -> RegisterBroker:
        c = self._config
        return RegisterBroker(
            **_ids(c), ha_addr=c.ha_addr, zone=c.zone, data_version=self._version,
            topics=dict(c.topics), filter_servers=list(c.filter_servers),
            heartbeat_timeout_ms=c.heartbeat_timeout_ms,
        )

    def _run(self) -> None:
        try:
            ready: dict[Any, int] = {}
            while True:
                now = self._clock()
                if ready.pop(self._waker.reader, None):
                    self._waker.drain()
                with self._lock:
                    if self._stopping:
                        break
                    for link in self._links:
                        if link.sock is not None and link.sock in ready:
                            for frames in recv_all(link.sock):
                                self._on_reply(link, frames[-1], now)
                        self._step(link, now)
                    poller = zmq.Poller()
                    poller.register(self._waker.reader, zmq.POLLIN)
                    for link in self._links:
                        if link.sock is not None:
                            poller.register(link.sock, zmq.POLLIN)
                    wait = max(0.0, min(self._next_wake(link) for link in self._links) - now)
                ready = dict(poller.poll(wait * 1000))
            self._unregister_all(self._close_timeout)
        finally:
            for link in self._links:
                self._drop_socket(link)

    def _step(self, link: _Link, now: float) -> None:
        """Time out, reconnect, or send what is due on this link."""
        if link.in_flight is not None:
            if now < link.in_flight[2]:
                return
            self._fail(link, now, f"no reply to {link.in_flight[1]} within "
                                  f"{self.request_timeout:g} s")
        if link.sock is None:
            if now < link.reconnect_at:
                return
            link.sock = open_socket(self._ctx, zmq.DEALER, link.endpoint)
        if now >= link.next_register:
            self._send(link, self._registration(), now)
        elif link.registered_version == self._version and now >= link.next_heartbeat:
            c = self._config
            self._send(link, Heartbeat(**_ids(c), data_version=self._version), now)

    def _next_wake(self, link: _Link) -> float:
        if link.in_flight is not None:
            return link.in_flight[2]
        if link.sock is None:
            return link.reconnect_at
        if link.registered_version == self._version:
            return min(link.next_register, link.next_heartbeat)
        return link.next_register

    def _send(self, link: _Link, request: Request, now: float) -> None:
        request_id = self._next_id
        self._next_id += 1
        assert link.sock is not None
        try:
            link.sock.send(encode(msgspec.structs.replace(request, id=request_id)), zmq.DONTWAIT)
        except zmq.Again:
            pass  # not connected yet: the timeout below handles it like a lost reply
        link.in_flight = (request_id, request_op(request), now + self.request_timeout)
        if isinstance(request, Heartbeat):
            link.next_heartbeat = now + self.heartbeat_interval
        elif isinstance(request, RegisterBroker):
            link.sent_version = request.data_version

    def _on_reply(self, link: _Link, body: bytes, now: float) -> None:
        try:
            reply = decode_reply(body)
        except msgspec.DecodeError as exc:
            log.warning("unreadable reply from %s: %s", link.endpoint, exc)
            return
        if link.in_flight is None or reply.id != link.in_flight[0]:
            return  # not the answer we wait for (a stale one): ignore
        op, link.in_flight = link.in_flight[1], None
        link.backoff.reset()
        match reply:
            case Error(code=code, message=message):
                link.last_error = f"{code}: {message}"
                link.registered_version = None
                if op == "register_broker":
                    # A conflict or a refused field does not fix itself: say so, retry per period.
                    log.error("NameServer %s refused the registration of %s: %s %s",
                              link.endpoint, self._config.broker_name, code, message)
                    link.next_register = now + self.register_period
                else:
                    log.warning("NameServer %s answered %s with %s: %s",
                                link.endpoint, op, code, message)
                    link.next_register = now
            case RegisterBrokerReply():
                link.registered_version = link.sent_version
                link.registrations += 1
                link.last_error = ""
                # A topic change made while this registration was in flight goes out now.
                current = link.sent_version == self._version
                link.next_register = now + self.register_period if current else now
                link.next_heartbeat = now + self.heartbeat_interval
                log.debug("registered with %s", link.endpoint)
            case HeartbeatReply(known=known, changed=changed):
                if not known or changed:
                    log.info("NameServer %s %s this broker: registering again", link.endpoint,
                             "does not know" if not known else "holds another version of")
                    link.registered_version = None
                    link.next_register = now
            case UnregisterBrokerReply():
                link.unregistered = True

    def _fail(self, link: _Link, now: float, why: str) -> None:
        delay = link.backoff.next_delay()
        log.warning("NameServer %s: %s; reconnecting in %.2f s", link.endpoint, why, delay)
        link.last_error = why
        link.registered_version = None
        link.next_register = 0.0
        self._drop_socket(link)
        link.reconnect_at = now + delay

    def _drop_socket(self, link: _Link) -> None:
        if link.sock is not None:
            link.sock.close(0)
        link.sock = None
        link.in_flight = None

    def _unregister_all(self, timeout: float) -> None:
        """Send `unregister_broker` everywhere at once and wait for the answers, bounded."""
        deadline = self._clock() + timeout
        request = UnregisterBroker(**_ids(self._config))
        poller = zmq.Poller()
        for link in self._links:
            self._drop_socket(link)  # a fresh socket: no stale replies, no queued requests
            link.sock = open_socket(self._ctx, zmq.DEALER, link.endpoint)
            self._send(link, request, self._clock())
            poller.register(link.sock, zmq.POLLIN)
        waiting = {link.sock: link for link in self._links}
        while waiting:
            left = deadline - self._clock()
            if left <= 0:
                break
            for sock, _ in poller.poll(left * 1000):
                link = waiting.pop(sock)
                for frames in recv_all(sock):
                    self._on_reply(link, frames[-1], self._clock())
                poller.unregister(sock)
        for link in waiting.values():
            log.warning("NameServer %s did not confirm the unregistration of %s within %g s",
                        link.endpoint, self._config.broker_name, timeout)


def _ids(c: _Config) -> dict[str, Any]:
    return dict(cluster=c.cluster, broker_name=c.broker_name, broker_id=c.broker_id,
                broker_addr=c.broker_addr)


def _validate(registration: dict[str, Any]) -> None:
    """Check a registration against the wire schema now, so a typo fails at the call."""
    try:
        msgspec.convert(registration, RegisterBroker)
    except msgspec.ValidationError as exc:
        raise UsageError(describe_decode_error(exc)) from None


def _topic_config(config: TopicConfig | Mapping[str, Any]) -> TopicConfig:
    return config if isinstance(config, TopicConfig) else msgspec.convert(config, TopicConfig)


def _wall_ms() -> int:
    return int(time.time() * 1000)

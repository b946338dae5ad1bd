"""`BrokerAgent`: keeps one broker registered with every NameServer of a list (§4, §10).

The decisions (when to register, heartbeat, reconnect, unregister) are
`zns.core.broker_session`'s: one `BrokerSession` per NameServer, all sharing
one `BrokerState`. This driver owns what they cannot: one DEALER per
NameServer, one background thread with one poller whose timeout is the
earliest `next_deadline()` of the sessions, the clock, and a lock so the topic
methods can be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from zns.core.broker_session import (
    BrokerSession,
    BrokerState,
    Connect,
    Disconnect,
    Done,
    SendRequest,
    topic_config,
)
from zns.core.errors import BackgroundFailure
from zns.core.schema import DataVersion, TopicConfig, decode_reply, encode
from zns.drivers.sockets import Waker, open_socket, parse_addresses, recv_all

log = logging.getLogger("zns.drivers.broker_agent")


@dataclass
class _Link:
    """One NameServer: its session and the socket the session asked for."""

    session: BrokerSession
    sock: zmq.Socket | None = None


@dataclass(frozen=True)
class LinkStatus:
    endpoint: str
    registered: bool
    registrations: int  # successful registrations so far
    last_error: str
    master_addr: str = ""  # what this NameServer's last registration reply said
    ha_addr: str = ""


class BrokerAgent:
    """Registers one broker with every NameServer; `close()` unregisters it.

    Usable as a context manager. The topic methods are thread-safe; each bumps
    the DataVersion and registers at once. Times are in seconds here, as
    everywhere in the public API; the sessions get milliseconds.
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
        self._broker = BrokerState(
            cluster=cluster, broker_name=broker_name, broker_id=broker_id,
            broker_addr=broker_addr, ha_addr=ha_addr, zone=zone, topics=topics,
            filter_servers=filter_servers, heartbeat_timeout_ms=heartbeat_timeout_ms,
            version=DataVersion(state=state_version, timestamp=_wall_ms(), counter=0),
        )
        self._links = [
            _Link(BrokerSession(
                endpoint, self._broker, register_period_ms=_ms(register_period),
                heartbeat_interval_ms=_ms(heartbeat_interval),
                request_timeout_ms=_ms(request_timeout),
            ))
            for endpoint in parse_addresses(addrs)
        ]
        self._clock = clock
        self._ctx = context or zmq.Context.instance()
        self._lock = threading.Condition()  # notified after every turn of the loop
        self._stopping = False
        # What killed the thread: every later call raises it (chained) instead of the agent
        # going on silently unregistered.
        self._failure: BaseException | None = None
        self._changed = False  # the topics changed since the loop last told the sessions
        self._close_timeout = 3.0
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="zns-broker-agent", daemon=True)
        if start:
            self.start()

    # --- the API -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def register_period(self) -> float:
        """Seconds between full registrations, after RocketMQ's 10–60 s clamp."""
        return self._links[0].session.register_period_ms / 1000 if self._links else 0.0

    @property
    def sessions(self) -> list[BrokerSession]:
        """Each NameServer's session, in the order given: what the core knows of that link
        (its timings, its registration). To look at; the agent's thread drives them."""
        return [link.session for link in self._links]

    @property
    def failure(self) -> BaseException | None:
        """The exception that ended the agent's thread (None while it runs)."""
        return self._failure

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise BackgroundFailure.of("the BrokerAgent's background thread", self._failure)

    @property
    def data_version(self) -> DataVersion:
        return self._broker.version

    @property
    def topics(self) -> dict[str, TopicConfig]:
        with self._lock:
            return self._broker.topics

    def add_topic(self, topic: str, config: TopicConfig | Mapping[str, Any] | None = None) -> None:
        """Add or update a topic; registers at once with every NameServer."""
        cfg = topic_config(config or {})
        self._change(lambda topics: topics.__setitem__(topic, cfg))

    def remove_topic(self, topic: str) -> None:
        self._change(lambda topics: topics.pop(topic, None))

    def status(self) -> list[LinkStatus]:
        self._raise_if_failed()
        with self._lock:
            return [
                LinkStatus(s.endpoint, s.registered, s.registrations, s.last_error,
                           s.master_addr, s.ha_addr)
                for s in (link.session for link in self._links)
            ]

    def registered_everywhere(self) -> bool:
        return all(s.registered for s in self.status())

    def wait_registered(self, timeout: float = 5.0) -> bool:
        """Wait until every NameServer holds the broker (True), or `timeout` seconds (False;
        the agent keeps trying those that do not): a broker should not take traffic before."""
        with self._lock:
            self._lock.wait_for(
                lambda: self._failure is not None
                or all(link.session.registered for link in self._links), timeout)
        return self.registered_everywhere()

    def close(self, timeout: float = 3.0) -> dict[str, bool]:
        """Unregister from every NameServer (bounded by `timeout`); {endpoint: unregistered}."""
        self._close_timeout = timeout
        with self._lock:
            self._stopping = True
        self._waker.wake()
        if self._thread.is_alive():
            self._thread.join(timeout + 2)
        self._waker.close()
        self._raise_if_failed()
        return {link.session.endpoint: link.session.unregistered for link in self._links}

    def __enter__(self) -> BrokerAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop --------------------------------------------------------------

    def _change(self, edit: Callable[[dict[str, TopicConfig]], object]) -> None:
        self._raise_if_failed()
        with self._lock:
            topics = self._broker.topics
            edit(topics)
            self._broker.set_topics(topics, _wall_ms())  # checks first: a bad topic changes nothing
            self._changed = True
        self._waker.wake()

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _run(self) -> None:
        try:
            with self._lock:
                now = self._now()
                for link in self._links:
                    link.session.start(now)
                    self._carry_out(link)
            ready: dict[Any, int] = {}
            closing = False
            while True:
                now = self._now()
                self._waker.drain_if_woken(ready)
                with self._lock:
                    if self._stopping and not closing:
                        closing = True
                        for link in self._links:
                            link.session.close(now, _ms(self._close_timeout))
                            self._carry_out(link)
                    if self._changed:
                        self._changed = False
                        for link in self._links:
                            link.session.topics_changed(now)
                            self._carry_out(link)
                    for link in self._links:
                        if link.sock is not None and link.sock in ready:
                            for frames in recv_all(link.sock):
                                self._on_reply(link, frames[-1], now)
                        link.session.on_timer(now)
                        self._carry_out(link)
                    self._lock.notify_all()
                    if all(link.session.done for link in self._links):
                        break
                    poller = zmq.Poller()
                    poller.register(self._waker.fd, zmq.POLLIN)
                    for link in self._links:
                        if link.sock is not None:
                            poller.register(link.sock, zmq.POLLIN)
                    wakes = [w for link in self._links if (w := link.session.next_deadline()) is not None]
                    wait = max(0, min(wakes) - now) if wakes else None
                ready = dict(poller.poll(wait))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, not lost in a thread
            with self._lock:
                self._failure = exc
                self._lock.notify_all()
            log.error("the BrokerAgent's thread failed (every later call raises it): %s: %s",
                      type(exc).__name__, exc)
            log.debug("the failure", exc_info=exc)
        finally:
            for link in self._links:
                self._drop_socket(link)

    def _on_reply(self, link: _Link, body: bytes, now: int) -> None:
        try:
            reply = decode_reply(body)
        except msgspec.DecodeError as exc:
            log.warning("unreadable reply from %s: %s", link.session.endpoint, exc)
            return
        link.session.on_reply(reply, now)
        self._carry_out(link)

    def _carry_out(self, link: _Link) -> None:
        """Do what the link's session asks for now, in order."""
        for action in link.session.actions():
            match action:
                case Connect():
                    self._drop_socket(link)
                    link.sock = open_socket(self._ctx, zmq.DEALER, link.session.endpoint)
                case SendRequest(request=request):
                    assert link.sock is not None
                    try:
                        link.sock.send(encode(request), zmq.DONTWAIT)
                    except zmq.Again:
                        pass  # not connected yet: the session's timeout treats it as a lost reply
                case Disconnect() | Done():
                    self._drop_socket(link)

    def _drop_socket(self, link: _Link) -> None:
        if link.sock is not None:
            link.sock.close(0)
        link.sock = None


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _wall_ms() -> int:
    return int(time.time() * 1000)

"""The broker side of §4, sans-I/O: keeping one broker registered with one NameServer.

`BrokerState` is what a broker registers: its identity, its topics and its
DataVersion. One broker has one state, shared by its `BrokerSession`s, one
per NameServer, so every NameServer is sent the same version and a NameServer
that is down or slow never delays the others.

A session decides, for its NameServer, what to send and when: a full
`register_broker` at start and every register period, a `heartbeat` every
interval once registered, a registration at once when a heartbeat answers
`known: false` (the NameServer restarted) or `changed: true` (it holds
another version) or when the topics change. It waits for one reply at a time;
a request unanswered within the request timeout means the connection is
dropped (so a late reply, or a request still queued on it, cannot be taken
for a later one) and made again after a jittered backoff. `close` unregisters.

It is fed replies and the time (`start`, `on_reply`, `on_timer`, `topics_changed`,
`close`, each with `now` in integer milliseconds); `actions()` hands out what to
do (`Connect`, `Disconnect`, `SendRequest`, `Done`) and `next_deadline()` says when
`on_timer` is next due: the vocabulary of every session (`zns.core`, rule 3). The driver
(`zns.drivers.broker_agent`, `bench.soak`) owns sockets and clocks.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

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
    describe_decode_error,
    request_op,
)

log = logging.getLogger("zns.core.broker_session")

MIN_REGISTER_PERIOD_MS, MAX_REGISTER_PERIOD_MS = 10_000, 60_000  # RocketMQ's clamp
DEFAULT_REGISTER_PERIOD_MS = 30_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 1_000
DEFAULT_HEARTBEAT_TIMEOUT_MS = 10_000
DEFAULT_REQUEST_TIMEOUT_MS = 3_000
RECONNECT_BASE_MS, RECONNECT_CAP_MS = 100, 10_000

# The reply each request expects (an `error` is accepted for any).
_REPLY_TO = {RegisterBroker: RegisterBrokerReply, Heartbeat: HeartbeatReply,
             UnregisterBroker: UnregisterBrokerReply}


def clamp_register_period(period_ms: int) -> int:
    """RocketMQ's bounds: a full registration at least every minute, at most every 10 s."""
    return min(MAX_REGISTER_PERIOD_MS, max(MIN_REGISTER_PERIOD_MS, period_ms))


def topic_config(config: TopicConfig | Mapping[str, Any]) -> TopicConfig:
    """A TopicConfig from a TopicConfig or a mapping of its fields (UsageError if invalid)."""
    if isinstance(config, TopicConfig):
        return config
    try:
        return msgspec.convert(config, TopicConfig)
    except msgspec.ValidationError as exc:
        raise UsageError(f"topic config: {describe_decode_error(exc)}") from None


class BrokerState:
    """What one broker registers, shared by its sessions: identity, topics, DataVersion.

    Every value is checked against the wire schema when it is given, so a typo
    fails at the call (UsageError) and changes nothing, instead of being
    refused by every NameServer later.
    """

    def __init__(
        self,
        *,
        cluster: str,
        broker_name: str,
        broker_addr: str,
        broker_id: int = 0,
        ha_addr: str = "",
        zone: str = "",
        topics: Mapping[str, TopicConfig | Mapping[str, Any]] = {},
        filter_servers: Iterable[str] = (),
        heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        version: DataVersion = DataVersion(),
    ) -> None:
        # The fields every request of this broker carries (str and int values).
        self._ids: dict[str, Any] = dict(cluster=cluster, broker_name=broker_name, broker_id=broker_id,
                         broker_addr=broker_addr)
        self._registration = _validated(RegisterBroker(
            **self._ids, ha_addr=ha_addr, zone=zone, data_version=version,
            topics={t: topic_config(c) for t, c in topics.items()},
            filter_servers=list(filter_servers), heartbeat_timeout_ms=heartbeat_timeout_ms,
        ))

    @property
    def version(self) -> DataVersion:
        return self._registration.data_version

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return dict(self._registration.topics)

    def set_topics(self, topics: Mapping[str, TopicConfig | Mapping[str, Any]],
                   wall_ms: int) -> None:
        """Replace the topics; the DataVersion's counter goes up by one, stamped `wall_ms`.

        `wall_ms` is wall-clock time: the DataVersion is published, and RocketMQ
        stamps it so. Nothing changes if a topic or a config is invalid.
        """
        v = self.version
        self._registration = _validated(msgspec.structs.replace(
            self._registration, topics={t: topic_config(c) for t, c in topics.items()},
            data_version=DataVersion(state=v.state, timestamp=wall_ms, counter=v.counter + 1),
        ))

    def registration(self) -> RegisterBroker:
        return self._registration

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(**self._ids, data_version=self.version)

    def unregistration(self) -> UnregisterBroker:
        return UnregisterBroker(**self._ids)


def _validated(registration: RegisterBroker) -> RegisterBroker:
    # Struct constructors do not check Meta bounds; a round trip through builtins does.
    try:
        return msgspec.convert(msgspec.to_builtins(registration), RegisterBroker)
    except msgspec.ValidationError as exc:
        raise UsageError(describe_decode_error(exc)) from None


@dataclass(frozen=True)
class Connect:
    """Open a fresh connection to the NameServer."""


@dataclass(frozen=True)
class Disconnect:
    """Close the connection: what is queued on it is dropped, nothing more is read from it."""


@dataclass(frozen=True)
class SendRequest:
    """Send `request` (its `id` set) on the connection."""

    request: Request


@dataclass(frozen=True)
class Done:
    """The session is over (after `close`): close the connection for good."""

    unregistered: bool  # the NameServer confirmed the unregistration


BrokerAction = Connect | Disconnect | SendRequest | Done


@dataclass(frozen=True)
class _Flight:
    request: Request
    deadline: int


class BrokerSession:
    """One broker and one NameServer as a state machine: no sockets, no clock.

    The driver calls `start(now)` once, then feeds every decoded reply to
    `on_reply`, calls `on_timer` when `next_deadline()` is reached, `topics_changed`
    after `BrokerState.set_topics`, and `close` to unregister; after each, it
    carries out `actions()` in order. `request_ids` may be shared by sessions that
    share a connection, so a reply's id names its session.
    """

    def __init__(
        self,
        endpoint: str,
        broker: BrokerState,
        *,
        register_period_ms: int = DEFAULT_REGISTER_PERIOD_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        backoff: Backoff | None = None,
        request_ids: Iterator[int] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.broker = broker
        self.register_period_ms = clamp_register_period(register_period_ms)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.request_timeout_ms = request_timeout_ms
        self._backoff = backoff or Backoff(RECONNECT_BASE_MS, RECONNECT_CAP_MS)
        self._ids = request_ids if request_ids is not None else itertools.count(1)
        # The registration this NameServer last confirmed (None: it holds none of ours
        # as far as we know), and what its reply said.
        self.acknowledged: RegisterBroker | None = None
        self.master_addr = ""
        self.ha_addr = ""
        self.registrations = 0  # confirmed registrations so far
        self.last_error = ""
        self.unregistered = False
        self.done = False
        self._started = False
        self._connected = False
        self._reconnect_at = 0
        self._flight: _Flight | None = None  # one request at a time
        self._next_register = 0
        self._next_heartbeat = 0
        self._close_deadline: int | None = None
        self._actions: list[BrokerAction] = []  # what actions() hands out next

    # --- state ----------------------------------------------------------------

    @property
    def registered(self) -> bool:
        """The NameServer confirmed the broker's current version."""
        return self.acknowledged is not None and \
            self.acknowledged.data_version == self.broker.version

    @property
    def in_flight(self) -> Request | None:
        """The request awaiting its reply, if any."""
        return self._flight.request if self._flight else None

    # --- inputs ---------------------------------------------------------------

    def start(self, now: int) -> None:
        """Connect and register."""
        if self._started:
            return
        self._started = True
        self._reconnect_at = self._next_register = now
        self._actions += self._step(now)

    def on_timer(self, now: int) -> None:
        self._actions += self._step(now)

    def topics_changed(self, now: int) -> None:
        """The broker's state changed: register it at once (after the reply in flight)."""
        self._next_register = now
        self._actions += self._step(now)

    def on_reply(self, reply: object, now: int) -> None:
        """A decoded reply from this NameServer; one that answers no request in flight is ignored."""
        self._actions += self._on_reply(reply, now)

    def close(self, now: int, timeout_ms: int) -> None:
        """Unregister on a fresh connection (nothing stale queued before it), within `timeout_ms`."""
        if self.done or self._close_deadline is not None:
            return
        self._started = self._connected = True
        self._close_deadline = now + timeout_ms
        request = self._with_id(self.broker.unregistration())
        self._flight = _Flight(request, self._close_deadline)
        self._actions += [Disconnect(), Connect(), SendRequest(request)]

    # --- outputs ----------------------------------------------------------------

    def actions(self) -> list[BrokerAction]:
        """What to do now, in order; each action is handed out once."""
        actions, self._actions = self._actions, []
        return actions

    def next_deadline(self) -> int | None:
        """When `on_timer` must next run (None: only an input can change anything)."""
        if self.done or not self._started:
            return None
        if self._close_deadline is not None:
            return self._close_deadline
        if self._flight is not None:
            return self._flight.deadline
        if not self._connected:
            return self._reconnect_at
        if self.registered:
            return min(self._next_register, self._next_heartbeat)
        return self._next_register

    # --- internals ------------------------------------------------------------

    def _on_reply(self, reply: object, now: int) -> list[BrokerAction]:
        flight = self._flight
        if flight is None or getattr(reply, "id", None) != flight.request.id:
            return []  # late, or for another session on a shared connection
        self._flight = None
        request = flight.request
        op = request_op(request)
        if not isinstance(reply, (Error, _REPLY_TO[type(request)])):
            return self._fail(now, f"answered {op} with a {type(reply).__name__}") + self._step(now)
        self._backoff.reset()
        match reply:
            case Error(code=code, message=message) if isinstance(request, UnregisterBroker):
                self.last_error = f"{code}: {message}"
                log.warning("NameServer %s refused to unregister %s: %s %s", self.endpoint,
                            request.broker_name, code, message)
                return self._finish(False)
            case Error(code=code, message=message):
                self.last_error = f"{code}: {message}"
                self.acknowledged = None
                if isinstance(request, RegisterBroker):
                    # A conflict or a refused field does not fix itself: say so, retry per period.
                    log.error("NameServer %s refused the registration of %s: %s %s",
                              self.endpoint, request.broker_name, code, message)
                    self._next_register = now + self.register_period_ms
                else:
                    log.warning("NameServer %s answered %s with %s: %s",
                                self.endpoint, op, code, message)
                    self._next_register = now
            case RegisterBrokerReply():
                assert isinstance(request, RegisterBroker)
                self.acknowledged = request
                self.registrations += 1
                self.last_error = ""
                self.master_addr, self.ha_addr = reply.master_addr, reply.ha_addr
                # A change made while this registration was in flight goes out now.
                current = request.data_version == self.broker.version
                self._next_register = now + self.register_period_ms if current else now
                self._next_heartbeat = now + self.heartbeat_interval_ms
                log.debug("registered with %s", self.endpoint)
            case HeartbeatReply(known=known, changed=changed):
                if not known or changed:
                    log.info("NameServer %s %s this broker: registering again", self.endpoint,
                             "does not know" if not known else "holds another version of")
                    self.acknowledged = None
                    self._next_register = now
            case UnregisterBrokerReply():
                self.acknowledged = None
                return self._finish(True)
        return self._step(now)

    def _step(self, now: int) -> list[BrokerAction]:
        """Give up on an unanswered request, reconnect, or send what is due."""
        if self.done or not self._started:
            return []
        if self._close_deadline is not None:
            if now < self._close_deadline:
                return []
            log.warning("NameServer %s did not confirm the unregistration of %s in time",
                        self.endpoint, self.broker.registration().broker_name)
            return self._finish(False)
        actions: list[BrokerAction] = []
        if self._flight is not None:
            if now < self._flight.deadline:
                return []
            actions += self._fail(now, f"no reply to {request_op(self._flight.request)} "
                                       f"within {self.request_timeout_ms} ms")
        if not self._connected:
            if now < self._reconnect_at:
                return actions
            self._connected = True
            actions.append(Connect())
        if now >= self._next_register:
            actions.append(self._send(self.broker.registration(), now))
        elif self.registered and now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_interval_ms
            actions.append(self._send(self.broker.heartbeat(), now))
        return actions

    def _send(self, request: Request, now: int) -> SendRequest:
        request = self._with_id(request)
        self._flight = _Flight(request, now + self.request_timeout_ms)
        return SendRequest(request)

    def _with_id(self, request: Request) -> Request:
        return msgspec.structs.replace(request, id=next(self._ids))

    def _fail(self, now: int, why: str) -> list[BrokerAction]:
        """Drop the connection and come back after a jittered backoff, registering afresh."""
        delay = round(self._backoff.next_delay())
        log.warning("NameServer %s: %s; reconnecting in %d ms", self.endpoint, why, delay)
        self.last_error = why
        self.acknowledged = None
        self._flight = None
        self._connected = False
        self._reconnect_at = now + delay
        self._next_register = now
        return [Disconnect()]

    def _finish(self, unregistered: bool) -> list[BrokerAction]:
        # Terminal: every input returns early once done, so no other state needs resetting.
        self.done, self.unregistered = True, unregistered
        self._flight = None
        return [Done(unregistered)]

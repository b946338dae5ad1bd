"""`zns watch`: route and broker changes, as they happen, for people (or raw with --json).

Built on `RouteClient`, so it follows the NameServer list as clients do: it
fails over when a NameServer goes silent, and re-syncs on a `prev` gap or a new
epoch. What it prints for a topic is the difference between the route it held
and the route it holds now — which brokers and queues the topic gained or lost —
so a re-sync after a gap prints what was missed, not a raw event.

With no TOPIC it watches every topic and broker: it starts with every topic's
route (one line each), and a topic created later is followed from its first
event on (its first line is its whole route; `gone` when it was deleted before
it could be followed). `--json` starts with each topic's route as well, one
`state` line per topic (`{"time", "op": "state", "topic", "revision", "route"}`,
`route` as in a route event, null when the topic has none), then prints the
events themselves, one JSON object per line with the time it arrived. Events
that arrive before every starting route is printed wait for them, so the
starting lines always come first (`revision` orders what follows).
Every line starts with the time; on stderr
it says which NameServer it follows, when it moved to another one, and when the
NameServer's epoch changed (it restarted: the routes were re-synced).
"""

from __future__ import annotations

import datetime
import json
import logging
import queue
import threading
from typing import Any

import click
import msgspec

from zns.cli.params import Endpoint
from zns.cli.tools import (
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    Target,
    ask,
    fail,
    ns_options,
    perm_text,
)
from zns.core.client_session import check_topic
from zns.core.errors import BackgroundFailure, UsageError
from zns.core.schema import (
    BROKER_PREFIX,
    ROUTE_PREFIX,
    BrokerEvent,
    GetTopics,
    HbEvent,
    QueueData,
    RouteEvent,
    Status,
    TopicRoute,
    decode_event,
)
from zns.drivers.route_client import RouteClient


# How long past --timeout to wait for the first hb at --events: a NameServer publishes one
# every heartbeat interval (1 s by default).
HB_WAIT_S = 2.0


def _stamp() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]


def _queue_text(q: QueueData) -> str:
    return f"r{q.read_queues}/w{q.write_queues} {perm_text(q.perm)}"


def _broker_text(b: Any) -> str:
    addrs = ", ".join(f"id {i} {a}" for i, a in sorted(b.addrs.items()))
    return f"{b.cluster}/{b.broker_name} ({addrs or 'no addresses'})"


def describe_route_change(topic: str, old: TopicRoute | None, new: TopicRoute | None,
                          revision: int, *, existed: bool = False) -> str:
    """One line: what `topic` gained and lost between `old` and `new` (None: no route);
    `existed`: the topic had a route before it was followed (so None is `gone`)."""
    head = f"{_stamp()} route {topic} rev {revision}"
    if new is None:
        return f"{head}: gone" if old is not None or existed else f"{head}: no route"
    if old is None:
        brokers = "; ".join(_broker_text(b) for b in new.brokers) or "none"
        queues = ", ".join(f"{q.broker_name} {_queue_text(q)}" for q in new.queues) or "none"
        return f"{head}: brokers {brokers}; queues {queues}"
    parts = []
    old_b = {b.broker_name: b for b in old.brokers}
    new_b = {b.broker_name: b for b in new.brokers}
    for name in sorted(new_b.keys() - old_b.keys()):
        parts.append(f"gained broker {_broker_text(new_b[name])}")
    for name in sorted(old_b.keys() - new_b.keys()):
        parts.append(f"lost broker {_broker_text(old_b[name])}")
    for name in sorted(old_b.keys() & new_b.keys()):
        if old_b[name] != new_b[name]:
            parts.append(f"broker {_broker_text(old_b[name])} now {_broker_text(new_b[name])}")
    old_q = {q.broker_name: q for q in old.queues}
    new_q = {q.broker_name: q for q in new.queues}
    for name in sorted(new_q.keys() - old_q.keys()):
        parts.append(f"gained queues on {name} {_queue_text(new_q[name])}")
    for name in sorted(old_q.keys() - new_q.keys()):
        parts.append(f"lost queues on {name} {_queue_text(old_q[name])}")
    for name in sorted(old_q.keys() & new_q.keys()):
        if old_q[name] != new_q[name]:
            parts.append(f"queues on {name} {_queue_text(old_q[name])} -> "
                         f"{_queue_text(new_q[name])}")
    if old.order_conf != new.order_conf:
        parts.append(f"order_conf {old.order_conf!r} -> {new.order_conf!r}")
    return f"{head}: {'; '.join(parts) or 'unchanged'}"


def describe_broker_event(event: BrokerEvent) -> str:
    reason = f" ({event.reason})" if event.reason else ""
    return (f"{_stamp()} broker {event.change}{reason} {event.cluster}/{event.broker_name} "
            f"id {event.broker_id} at {event.broker_addr} (rev {event.revision})")


class _Printer:
    """Turns what the client sees into lines on a queue; the main thread prints them."""

    def __init__(self, as_json: bool, follow_new: bool) -> None:
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.as_json = as_json
        self.follow_new = follow_new  # every topic: follow one from its first event
        self.routes: dict[str, TopicRoute | None] = {}
        self.starting: set[str] = set()  # --json: its starting state not printed yet
        self.deleted_unfollowed: set[str] = set()  # first seen deleted: its None is `gone`
        self.epoch: str | None = None
        self.client: RouteClient | None = None
        self.heard = threading.Event()  # an `hb` came through the events endpoint
        # What events make before every starting route is printed waits here (None: they
        # are); `starting` and it change on both threads, under the lock (re-entrant:
        # `on_route` holds it across `_put`).
        self._held: list[tuple[str, str]] | None = []
        self._listed = False  # every starting topic was given to `start`
        self._lock = threading.RLock()

    def _put(self, kind: str, value: str) -> None:
        """An event's line, a topic to follow or a later change of a followed topic: held
        while starting routes are due."""
        with self._lock:
            if self._held is not None:
                self._held.append((kind, value))
                return
        self.lines.put((kind, value))

    def listed(self) -> None:
        """Every starting topic was given to `start` (main thread)."""
        with self._lock:
            self._listed = True
            self._release()

    def _release(self) -> None:
        """Once every starting route is printed, the lines held behind them (lock held)."""
        if self._held is not None and self._listed and not self.starting:
            for line in self._held:
                self.lines.put(line)
            self._held = None

    def on_event(self, body: bytes) -> None:
        """Every event body the client receives (on its thread)."""
        try:
            event = decode_event(body)
        except msgspec.DecodeError:
            return  # the client logs it
        if self.epoch is not None and event.epoch != self.epoch:
            self.lines.put(("note", f"{_stamp()} the NameServer's epoch changed {self.epoch} -> "
                                    f"{event.epoch} (it restarted, or another one answers): routes "
                                    f"re-synced"))
        self.epoch = event.epoch
        if isinstance(event, HbEvent):
            self.heard.set()  # the events endpoint works
            return
        if self.as_json:
            data = {"time": _stamp(), **msgspec.to_builtins(event)}
            self._put("line", json.dumps(data))
        elif isinstance(event, BrokerEvent):
            self._put("line", describe_broker_event(event))
        elif isinstance(event, RouteEvent) and self.follow_new and event.topic not in self.routes:
            self.routes[event.topic] = None
            if event.route is None:
                self.deleted_unfollowed.add(event.topic)
            self._put("follow", event.topic)

    def start(self, topic: str) -> None:
        """Follow `topic` from its whole route (the first line it gets)."""
        self.routes[topic] = None
        with self._lock:
            self.starting.add(topic)

    def on_route(self, topic: str, route: TopicRoute | None) -> None:
        """A followed topic's route changed (also after a re-sync), on the client's thread."""
        assert self.client is not None
        old = self.routes.get(topic)
        self.routes[topic] = route
        existed = topic in self.deleted_unfollowed
        self.deleted_unfollowed.discard(topic)
        revision = self.client.session.cache.revision(topic)
        with self._lock:  # a starting line goes out now; a later change waits as events do
            starting = topic in self.starting
            if not self.as_json:
                line = describe_route_change(topic, old, route, revision, existed=existed)
                if starting:
                    self.lines.put(("line", line))
                else:
                    self._put("line", line)
            elif starting:  # later changes come as the events themselves
                self.lines.put(("line", json.dumps(state_json(topic, route, revision))))
            self.starting.discard(topic)
            self._release()


def state_json(topic: str, route: TopicRoute | None, revision: int) -> dict[str, Any]:
    """`zns watch --json`'s starting line for one topic."""
    return {"time": _stamp(), "op": "state", "topic": topic, "revision": revision,
            "route": None if route is None else msgspec.to_builtins(route)}


def connection_note(last: tuple[str | None, str | None], now: tuple[str | None, str | None],
                    connected_before: bool, events: str | None = None) -> str | None:
    """A line when the (NameServer, events endpoint) followed changed, else None; `events`:
    the events endpoint given (--events), the first suspect when events stop."""
    if now == last:
        return None
    endpoint, pub = now
    if pub is not None:
        verb = "reconnected: following" if connected_before else "following"
        return f"{_stamp()} {verb} {endpoint} (events on {pub})"
    if last[1] is not None and events is not None:
        return (f"{_stamp()} no hb from the events endpoint {events} (is it running?); "
                f"trying the next NameServer")
    if last[1] is not None:
        return f"{_stamp()} lost {last[0]}; trying the next NameServer"
    return None


@click.command()
@click.argument("topics", nargs=-1)
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Exit after this many lines (default: until Ctrl-C).")
@click.option("--events", type=Endpoint(), envvar="ZNS_EVENTS", metavar="ENDPOINT",
              help="Subscribe at this events relay (zns relay) instead of the NameServer's PUB.")
@ns_options
def watch(target: Target, topics: tuple[str, ...], count: int | None,
          events: str | None) -> None:
    """Print route and broker changes as they happen, one line each (all topics by default)."""
    _watch(target, topics, count, events)


def _watch(target: Target, topics: tuple[str, ...], count: int | None, events: str | None) -> None:
    """`zns watch` (a plain function, as the commands of zns.cli.tools)."""
    for topic in topics:  # before any socket: a usage error, one line, exit 2
        try:
            check_topic(topic)
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="TOPICS") from None
    ask(target, Status())  # fail plainly (exit 3) when no NameServer answers at all
    # The client's own log lines would be a second account of what this command reports.
    logging.getLogger("zns").addHandler(logging.NullHandler())
    printer = _Printer(target.as_json, follow_new=not topics)
    channels = [] if topics else [ROUTE_PREFIX, BROKER_PREFIX]
    client = RouteClient(target.endpoints, timeout=target.timeout,
                         request_timeout=target.timeout, events=events, channels=channels,
                         on_event=printer.on_event)
    printer.client = client
    if not target.as_json:
        where = events or "the NameServer's events"
        click.echo(f"watching {', '.join(topics) or 'every topic and broker'} via {where} "
                   f"(Ctrl-C to stop)", err=True)
    seen = 0
    following: tuple[str | None, str | None] = (None, None)
    connected = False
    try:
        for topic in topics or ask(target, GetTopics())[1].topics:
            printer.start(topic)  # every topic starts with its whole route
            client.watch(topic, printer.on_route)
        printer.listed()  # the events that came meanwhile follow the starting routes
        # A relay named with --events must be heard (its first hb) before any line counts: a
        # wrong endpoint is an error, not a watch that prints the starting routes and exits 0.
        if events is not None and not printer.heard.wait(target.timeout + HB_WAIT_S):
            fail(f"no events from {events} within {target.timeout + HB_WAIT_S:g} s (no hb): "
                 "is a relay (zns relay) or a NameServer's events socket there?",
                 EXIT_UNREACHABLE, "unreachable")
        while count is None or seen < count:
            session = client.session  # read without its lock: only for a line to people
            now = (session.endpoint, session.pub_endpoint)
            if note := connection_note(following, now, connected, events):
                click.echo(note, err=True)
            connected = connected or now[1] is not None
            following = now
            try:
                kind, value = printer.lines.get(timeout=0.5)
            except queue.Empty:
                if client.failure is not None:  # its thread died: say so once and stop
                    raise BackgroundFailure.of("the route client's thread", client.failure)
                continue
            if kind == "follow":
                client.watch(value, printer.on_route)
                continue
            if kind == "note":
                click.echo(value, err=True)
                continue
            click.echo(value)
            seen += 1
    except KeyboardInterrupt:
        pass
    except BackgroundFailure as exc:
        fail(str(exc), EXIT_FAILED)
    finally:
        client.close()

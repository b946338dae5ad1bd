"""What `zns watch` prints (zns.cli.watch), line by line: a topic's route gained and lost, queue
counts and perm bits, broker events, the notes on stderr, raw events with --json and the
starting `state` line of each topic. The printer is driven directly (no sockets) except in the
last tests, which run the command in process against a NameServer."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from helpers import register_fields
from zns.cli import main
from zns.cli.watch import (
    _Printer,
    _stamp,
    connection_note,
    describe_broker_event,
    describe_route_change,
    state_json,
)
from zns.core import schema
from zns.core.schema import BrokerData, BrokerEvent, HbEvent, QueueData, RouteEvent, TopicRoute

STAMP = r"\d\d:\d\d:\d\d\.\d{3}"


def body(line: str) -> str:
    """The line without its leading time."""
    stamp, rest = line.split(" ", 1)
    assert re.fullmatch(STAMP, stamp), line
    return rest


def queues(name: str, read: int, write: int, perm: int = 6) -> QueueData:
    return QueueData(broker_name=name, read_queues=read, write_queues=write, perm=perm, sys_flag=0)


def broker(name: str, *addrs: str, cluster: str = "c1") -> BrokerData:
    return BrokerData(cluster=cluster, broker_name=name, addrs=dict(enumerate(addrs)))


def route(brokers: list[BrokerData], queue_data: list[QueueData], order_conf: str = "") -> TopicRoute:
    return TopicRoute(topic="T", queues=queue_data, brokers=brokers, filter_servers={},
                      order_conf=order_conf)


def change(old: TopicRoute | None, new: TopicRoute | None, **kw: Any) -> str:
    return body(describe_route_change("T", old, new, 9, **kw))


def test_the_time_is_hours_to_milliseconds():
    assert re.fullmatch(STAMP, _stamp()), _stamp()


def test_a_topics_first_line_is_its_whole_route():
    first = route([broker("b1", "h:1", "h:2"), broker("b2")],
                  [queues("b1", 8, 4), queues("b2", 2, 1, perm=4)])
    assert change(None, first) == ("route T rev 9: brokers c1/b1 (id 0 h:1, id 1 h:2); "
                                   "c1/b2 (no addresses); queues b1 r8/w4 rw-, b2 r2/w1 r--")
    assert change(None, route([], [])) == "route T rev 9: brokers none; queues none"
    assert change(None, None) == "route T rev 9: no route"
    assert change(None, None, existed=True) == "route T rev 9: gone"
    assert change(first, None) == "route T rev 9: gone"


def test_a_change_names_what_was_gained_lost_and_changed():
    old = route([broker("b1", "h:1"), broker("b2", "h:2")],
                [queues("b1", 4, 4), queues("b2", 4, 4)])
    new = route([broker("b1", "h:1", "h:9"), broker("b3", "h:3")],
                [queues("b1", 4, 4, perm=4), queues("b3", 2, 2)], order_conf="b1:4")
    assert change(old, new) == (
        "route T rev 9: gained broker c1/b3 (id 0 h:3); lost broker c1/b2 (id 0 h:2); "
        "broker c1/b1 (id 0 h:1) now c1/b1 (id 0 h:1, id 1 h:9); "
        "gained queues on b3 r2/w2 rw-; lost queues on b2 r4/w4 rw-; "
        "queues on b1 r4/w4 rw- -> r4/w4 r--; order_conf '' -> 'b1:4'")
    assert change(old, old) == "route T rev 9: unchanged"


def test_a_change_of_queue_counts_alone_is_a_change():
    old = route([broker("b1", "h:1")], [queues("b1", 4, 4)])
    for new_queues, said in [(queues("b1", 8, 4), "r4/w4 rw- -> r8/w4 rw-"),
                             (queues("b1", 4, 2), "r4/w4 rw- -> r4/w2 rw-")]:
        assert change(old, route([broker("b1", "h:1")], [new_queues])) == (
            f"route T rev 9: queues on b1 {said}")


def test_several_brokers_and_queues_each_in_name_order():
    old = route([broker("a", "h:1"), broker("z", "h:2")], [queues("a", 1, 1), queues("z", 1, 1)])
    new = route([broker("m", "h:3"), broker("b", "h:4")], [queues("m", 1, 1), queues("b", 1, 1)])
    assert change(old, new) == (
        "route T rev 9: gained broker c1/b (id 0 h:4); gained broker c1/m (id 0 h:3); "
        "lost broker c1/a (id 0 h:1); lost broker c1/z (id 0 h:2); "
        "gained queues on b r1/w1 rw-; gained queues on m r1/w1 rw-; "
        "lost queues on a r1/w1 rw-; lost queues on z r1/w1 rw-")


def test_a_broker_event_with_and_without_its_reason():
    event = BrokerEvent(epoch="e", revision=5, cluster="c1", broker_name="b1", broker_id=1,
                        broker_addr="h:1", change="removed", reason="expired")
    assert body(describe_broker_event(event)) == "broker removed (expired) c1/b1 id 1 at h:1 (rev 5)"
    event.change, event.reason = "registered", ""
    assert body(describe_broker_event(event)) == "broker registered c1/b1 id 1 at h:1 (rev 5)"


def test_connection_notes():
    a, b = ("tcp://a:1", "tcp://a:2"), ("tcp://b:1", "tcp://b:2")
    assert connection_note((None, None), (None, None), False) is None
    assert connection_note((None, None), ("tcp://a:1", None), False) is None
    assert body(connection_note((None, None), a, False)) == "following tcp://a:1 (events on tcp://a:2)"
    assert body(connection_note(("tcp://a:1", None), a, True)) == (
        "reconnected: following tcp://a:1 (events on tcp://a:2)")
    assert body(connection_note(a, ("tcp://b:1", None), True)) == (
        "lost tcp://a:1; trying the next NameServer")
    assert connection_note(a, a, True) is None
    assert body(connection_note(a, b, True)) == "reconnected: following tcp://b:1 (events on tcp://b:2)"


# --- the printer, fed as the route client feeds it ---------------------------------------------


class Cache:
    def revision(self, _topic: str) -> int:
        return 9


class Client:
    class session:  # noqa: N801
        cache = Cache()


def printer(*, as_json: bool = False, follow_new: bool = True, listed: bool = True) -> _Printer:
    """A printer fed as the route client feeds it; `listed`: its starting topics (none) were
    listed, so events print as they come."""
    made = _Printer(as_json=as_json, follow_new=follow_new)
    made.client = Client()  # type: ignore[assignment]
    if listed:
        made.listed()
    return made


def drained(p: _Printer) -> list[tuple[str, str]]:
    return [p.lines.get_nowait() for _ in range(p.lines.qsize())]


def route_event(topic: str, revision: int, routed: TopicRoute | None, epoch: str = "e1") -> bytes:
    return schema.encode(RouteEvent(epoch=epoch, revision=revision, prev=revision - 1, topic=topic,
                                    route=routed))


def test_every_topic_is_followed_once_from_its_first_event():
    p = printer()
    routed = route([broker("b1", "h:1")], [queues("b1", 4, 4)])
    p.on_event(route_event("New", 3, routed))
    p.on_event(route_event("New", 4, routed))  # already followed: no second follow
    p.on_event(route_event("Gone", 5, None))
    assert drained(p) == [("follow", "New"), ("follow", "Gone")]
    assert p.routes == {"New": None, "Gone": None}
    p.on_route("Gone", None)  # deleted before it could be followed
    p.on_route("New", routed)
    p.on_route("New", None)
    lines = drained(p)
    assert [kind for kind, _ in lines] == ["line"] * 3
    assert [body(text) for _, text in lines] == [
        "route Gone rev 9: gone",
        "route New rev 9: brokers c1/b1 (id 0 h:1); queues b1 r4/w4 rw-",
        "route New rev 9: gone"]
    p.on_route("Gone", None)  # only its first None after being followed is `gone`
    assert body(drained(p)[0][1]) == "route Gone rev 9: no route"


@pytest.mark.parametrize("as_json", [False, True])
def test_events_before_the_starting_routes_are_printed_after_them(as_json):
    """The first lines are every topic's starting route, whatever events came meanwhile
    (they come from another socket than the routes, and may come first)."""
    p = printer(as_json=as_json, listed=False)
    routed = route([broker("b1", "h:1")], [queues("b1", 4, 4)])
    registered = schema.encode(BrokerEvent(epoch="e1", revision=4, cluster="c1",
                                           broker_name="b1", broker_id=0, broker_addr="h:1",
                                           change="registered"))
    p.on_event(registered)  # before the topics are even listed
    p.start("TA")
    p.start("TB")
    p.on_route("TA", routed)
    p.on_event(route_event("New", 5, routed))
    p.on_route("TA", None)  # a change of TA (text: its line; JSON: its event says it)
    p.listed()
    assert [kind for kind, _ in drained(p)] == ["line"]  # TA's start; TB's is still due
    p.on_route("TB", None)
    lines = drained(p)
    if as_json:
        assert [json.loads(text)["op"] for _, text in lines] == ["state", "broker", "route"]
    else:
        assert [(kind, body(text) if kind == "line" else text) for kind, text in lines] == [
            ("line", "route TB rev 9: no route"),
            ("line", "broker registered c1/b1 id 0 at h:1 (rev 4)"),
            ("follow", "New"),
            ("line", "route TA rev 9: gone")]
    p.on_event(registered)  # from now on, as they come
    assert len(drained(p)) == 1


def test_topics_given_by_name_follow_nothing_new_and_broker_events_are_lines():
    p = printer(follow_new=False)
    p.on_event(route_event("Other", 3, None))
    assert drained(p) == [] and p.routes == {}
    p.on_event(schema.encode(BrokerEvent(epoch="e1", revision=4, cluster="c1", broker_name="b1",
                                         broker_id=0, broker_addr="h:1", change="registered")))
    [(kind, text)] = drained(p)
    assert kind == "line" and body(text) == "broker registered c1/b1 id 0 at h:1 (rev 4)"


def test_an_epoch_change_is_a_note_and_heartbeats_print_nothing_else():
    p = printer()
    p.on_event(schema.encode(HbEvent(epoch="e1", revision=1, time_ms=1)))
    p.on_event(schema.encode(HbEvent(epoch="e1", revision=1, time_ms=2)))
    assert drained(p) == [] and p.epoch == "e1"
    p.on_event(schema.encode(HbEvent(epoch="e2", revision=1, time_ms=3)))
    [(kind, text)] = drained(p)
    assert kind == "note" and body(text) == (
        "the NameServer's epoch changed e1 -> e2 (it restarted, or another one answers): "
        "routes re-synced")
    assert p.epoch == "e2"
    p.on_event(b"not an event")
    assert drained(p) == [] and p.epoch == "e2"


def test_json_prints_each_event_with_its_time_and_each_topics_starting_state_once():
    p = printer(as_json=True)
    routed = route([broker("b1", "h:1")], [queues("b1", 4, 4)])
    p.on_event(route_event("T", 3, routed))
    p.on_event(schema.encode(HbEvent(epoch="e1", revision=3, time_ms=1)))
    [(kind, text)] = drained(p)
    event = json.loads(text)
    assert kind == "line" and re.fullmatch(STAMP, event.pop("time"))
    assert event == {"op": "route", "epoch": "e1", "revision": 3, "prev": 2, "topic": "T",
                     "route": json.loads(json.dumps(msgspec.to_builtins(routed)))}
    assert p.routes == {}  # nothing followed from events: they are printed as they are
    p.start("T")
    p.start("None")
    p.on_route("T", routed)
    p.on_route("None", None)
    p.on_route("T", None)  # a later change: its event says it
    lines = drained(p)
    assert [kind for kind, _ in lines] == ["line", "line"]
    states = [json.loads(text) for _, text in lines]
    for state in states:
        assert re.fullmatch(STAMP, state.pop("time"))
    assert states == [
        {"op": "state", "topic": "T", "revision": 9, "route": json.loads(json.dumps(msgspec.to_builtins(routed)))},
        {"op": "state", "topic": "None", "revision": 9, "route": None}]


def test_the_state_line_has_the_documented_keys_in_order():
    state = state_json("T", None, 4)
    assert list(state) == ["time", "op", "topic", "revision", "route"]
    assert (state["op"], state["topic"], state["revision"], state["route"]) == ("state", "T", 4, None)


# --- the command, in process -------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_watch_json_starts_with_every_topics_state(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(topics={"TA": {"read_queues": 2}, "TB": {}}))
    out = CliRunner().invoke(main, ["watch", "--json", "--ns", server.router, "--count", "2",
                                    "--timeout", "3"])
    assert out.exit_code == 0, out.output
    states = sorted((json.loads(line) for line in out.stdout.splitlines()),
                    key=lambda s: s["topic"])
    assert [(s["op"], s["topic"]) for s in states] == [("state", "TA"), ("state", "TB")]
    assert states[0]["route"]["queues"][0]["read_queues"] == 2
    assert states[0]["route"]["brokers"][0]["broker_name"] == "broker-a"
    assert all(s["revision"] >= 1 for s in states)


@pytest.mark.timeout(60)
def test_watch_json_of_a_named_topic_without_a_route_says_null(server):
    out = CliRunner().invoke(main, ["watch", "Nothing", "--json", "--ns", server.router,
                                    "--count", "1", "--timeout", "3"])
    assert out.exit_code == 0, out.output
    [line] = out.stdout.splitlines()
    state = json.loads(line)
    assert (state["op"], state["topic"], state["route"]) == ("state", "Nothing", None)


def _watch_while_registering(server, args: list[str], monkeypatch) -> Any:
    """`zns watch ARGS` in process while new brokers of TA register, one every 0.1 s, until it
    has printed its --count lines; once it has listed the topics, each broker brings a topic
    of its own (created after the start: followed from its first event)."""
    import threading

    import zns.cli.watch as watch_module
    from zns.core.schema import GetTopics

    listed = threading.Event()
    real_ask = watch_module.ask

    def ask(target: Any, request: Any) -> Any:
        reply = real_ask(target, request)
        if isinstance(request, GetTopics):
            listed.set()
        return reply

    monkeypatch.setattr(watch_module, "ask", ask)
    peer = server.peer()
    result: dict[str, Any] = {}

    def watch() -> None:
        result["out"] = CliRunner().invoke(main, ["watch", *args, "--ns", server.router,
                                                  "--timeout", "3"])

    thread = threading.Thread(target=watch)
    thread.start()
    n = 0
    while thread.is_alive():
        n += 1
        assert n < 300, "no lines"
        topics = {"TA": {}, f"TN{n}": {}} if listed.is_set() or args[0] == "TA" else {"TA": {}}
        peer.ok("register_broker", **register_fields(broker_name=f"bx{n}", addr=f"10.0.1.{n % 250}:1",
                                                     topics=topics))
        thread.join(0.1)
    return result["out"]


@pytest.mark.timeout(90)
def test_watch_all_prints_broker_events_and_says_what_it_watches(server, monkeypatch):
    server.peer().ok("register_broker", **register_fields(topics={"TA": {}}))
    out = _watch_while_registering(server, ["--count", "8"], monkeypatch)
    assert out.exit_code == 0, out.output
    lines = [body(line) for line in out.stdout.splitlines()]
    # A topic created after the start is followed from its whole route.
    assert any(re.fullmatch(r"route TN\d+ rev \d+: brokers c1/bx\d+ .*", line) for line in lines), lines
    assert lines[0].startswith("route TA rev ") and ": brokers c1/broker-a" in lines[0]
    assert any(re.fullmatch(r"broker registered c1/bx\d+ id 0 at 10\.0\.1\.\d+:1 \(rev \d+\)", line)
               for line in lines), lines
    notes = out.stderr.splitlines()
    assert notes[0] == "watching every topic and broker via the NameServer's events (Ctrl-C to stop)"
    following = [note for note in notes if re.fullmatch(
        STAMP + rf" following {re.escape(server.router)} \(events on {re.escape(server.pub)}\)", note)]
    assert notes[1:] == following and len(following) == 1, notes  # said once, nothing else


@pytest.mark.timeout(90)
def test_watch_of_a_topic_prints_its_changes_and_no_broker_events(server, monkeypatch):
    server.peer().ok("register_broker", **register_fields(topics={"TA": {}}))
    out = _watch_while_registering(server, ["TA", "--count", "3"], monkeypatch)
    assert out.exit_code == 0, out.output
    lines = [body(line) for line in out.stdout.splitlines()]
    assert len(lines) == 3 and all(line.startswith("route TA rev ") for line in lines), lines
    assert "gained broker c1/bx" in lines[-1], lines
    assert out.stderr.splitlines()[0] == "watching TA via the NameServer's events (Ctrl-C to stop)"


@pytest.mark.timeout(60)
def test_watch_json_says_nothing_for_people_about_what_it_watches(server, monkeypatch):
    import logging

    # The route client's own log lines are silenced (no "last resort" output on stderr).
    monkeypatch.setattr(logging.getLogger("zns"), "handlers", [])
    server.peer().ok("register_broker", **register_fields(topics={"TA": {}}))
    out = CliRunner().invoke(main, ["watch", "TA", "--json", "--ns", server.router, "--count", "1",
                                    "--timeout", "3"])
    assert out.exit_code == 0, out.output
    assert not any(line.startswith("watching") for line in out.stderr.splitlines()), out.stderr
    assert [type(h) for h in logging.getLogger("zns").handlers] == [logging.NullHandler]


@pytest.mark.timeout(90)
def test_watch_through_a_relay_subscribes_there(server, monkeypatch):
    from zns.drivers.event_relay import Relay

    server.peer().ok("register_broker", **register_fields(topics={"TA": {}}))
    with Relay(server.router, "tcp://127.0.0.1:*") as relay:
        out = _watch_while_registering(server, ["TA", "--count", "3", "--events", relay.endpoint],
                                       monkeypatch)
    assert out.exit_code == 0, out.output
    notes = out.stderr.splitlines()
    assert notes[0] == f"watching TA via {relay.endpoint} (Ctrl-C to stop)"
    # Lines 2 and 3 came as events, so the events connection was made before line 3 was asked for.
    assert any(note.endswith(f"following {server.router} (events on {relay.endpoint})")
               for note in notes), notes


@pytest.mark.timeout(60)
def test_a_note_goes_to_stderr_and_is_not_a_line(server, monkeypatch):
    import zns.cli.watch as watch_module

    class NotingPrinter(watch_module._Printer):
        def on_route(self, topic: str, route: TopicRoute | None) -> None:
            self.lines.put(("note", "a note for people"))
            super().on_route(topic, route)

    monkeypatch.setattr(watch_module, "_Printer", NotingPrinter)
    server.peer().ok("register_broker", **register_fields(topics={"TA": {}}))
    out = CliRunner().invoke(main, ["watch", "TA", "--ns", server.router, "--count", "1",
                                    "--timeout", "3"])
    assert out.exit_code == 0, out.output
    [line] = out.stdout.splitlines()
    assert body(line).startswith("route TA rev ")
    assert "a note for people" in out.stderr.splitlines()


@pytest.mark.timeout(60)
def test_a_client_that_dies_while_watching_ends_the_command_with_one_line(server, monkeypatch):
    import zns.cli.watch as watch_module

    class DyingClient(watch_module.RouteClient):
        @property
        def failure(self) -> BaseException | None:  # as if its thread died once it was asked
            return RuntimeError("Boom")

    monkeypatch.setattr(watch_module, "RouteClient", DyingClient)
    server.peer().ok("register_broker", **register_fields(topics={"TA": {}}))
    out = CliRunner().invoke(main, ["watch", "TA", "--ns", server.router, "--count", "2",
                                    "--timeout", "3"])
    assert out.exit_code == 1, out.output
    # Its first line if it came within the first wait, then no second one: the failure.
    assert all(body(line).startswith("route TA rev ") for line in out.stdout.splitlines())
    assert len(out.stdout.splitlines()) <= 1
    assert out.stderr.splitlines()[-1] == (
        "zns: the route client's thread failed: RuntimeError: Boom")


# --- the command's loop against a scripted client (no sockets) --------------------------------


def test_watch_says_reconnected_waits_through_a_quiet_spell_and_times_requests_by_timeout(monkeypatch):
    """A scripted RouteClient: what the session follows changes once per turn of the loop, two
    broker events are waiting at the start and a third comes only after a quiet spell."""
    import types

    import zns.cli.watch as watch_module

    def broker_event(revision: int) -> bytes:
        return schema.encode(BrokerEvent(epoch="e1", revision=revision, cluster="c1",
                                         broker_name="b1", broker_id=0, broker_addr="h:1",
                                         change="registered"))

    made: list[dict[str, Any]] = []

    class ScriptedClient:
        def __init__(self, endpoints: list[str], **kwargs: Any) -> None:
            made.append(kwargs)
            self.on_event = kwargs["on_event"]
            self.followed = [("tcp://a:1", "tcp://a:2"), ("tcp://b:1", None), ("tcp://b:1", "tcp://b:2")]
            self.quiet_spells = 0
            self.routing = False
            self.on_event(broker_event(1))
            self.on_event(broker_event(2))

        @property
        def session(self) -> Any:  # read once per turn, and by the route's line (in `watch`)
            if self.routing:
                return types.SimpleNamespace(cache=types.SimpleNamespace(revision=lambda t: 2))
            endpoint, pub = self.followed.pop(0) if len(self.followed) > 1 else self.followed[0]
            return types.SimpleNamespace(endpoint=endpoint, pub_endpoint=pub)

        @property
        def failure(self) -> None:  # read when no line came within a wait: the third comes now
            self.quiet_spells += 1
            self.on_event(broker_event(3))
            return None

        def watch(self, topic: str, callback: Any) -> None:
            self.routing = True  # the topic's route, as a client's first pull brings it
            callback(topic, None)
            self.routing = False

        def close(self) -> None:
            pass

    monkeypatch.setattr(watch_module, "RouteClient", ScriptedClient)
    monkeypatch.setattr(watch_module, "ask", lambda target, request: None)
    out = CliRunner().invoke(main, ["watch", "TA", "--ns", "tcp://127.0.0.1:1", "--count", "4",
                                    "--timeout", "7"])
    assert out.exit_code == 0, out.output
    # The quiet spell did not end the command: it waited for its last line. The events that
    # came first follow the topic's starting route.
    assert [body(line) for line in out.stdout.splitlines()] == ["route TA rev 2: no route"] + [
        f"broker registered c1/b1 id 0 at h:1 (rev {n})" for n in (1, 2, 3)]
    assert [body(note) for note in out.stderr.splitlines()[1:]] == [
        "following tcp://a:1 (events on tcp://a:2)",
        "lost tcp://a:1; trying the next NameServer",
        "reconnected: following tcp://b:1 (events on tcp://b:2)"]
    [kwargs] = made
    assert kwargs["request_timeout"] == 7.0  # --timeout bounds each request the client makes


def test_watch_notices_a_dead_client_within_a_second_of_silence(monkeypatch):
    """With no line to print, the loop looks at the client's failure every half second: a
    client whose thread died ends the command about then, not seconds later."""
    import time
    import types

    import zns.cli.watch as watch_module

    looks: list[float] = []

    class SilentClient:
        def __init__(self, endpoints: list[str], **kwargs: Any) -> None:
            self.session = types.SimpleNamespace(endpoint="tcp://a:1", pub_endpoint="tcp://a:2")

        @property
        def failure(self) -> BaseException | None:  # dead from the sixth look on
            if len(looks) < 6:
                looks.append(time.monotonic())
            return RuntimeError("Boom") if len(looks) == 6 else None

        def watch(self, topic: str, callback: Any) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(watch_module, "RouteClient", SilentClient)
    monkeypatch.setattr(watch_module, "ask", lambda target, request: None)
    out = CliRunner().invoke(main, ["watch", "TA", "--ns", "tcp://127.0.0.1:1"])
    assert out.exit_code == 1, out.output
    assert out.stderr.splitlines()[-1] == "zns: the route client's thread failed: RuntimeError: Boom"
    # Half a second apart; the shortest of five gaps stays far under a second even when a
    # loaded machine delays some of them.
    assert min(later - earlier for earlier, later in zip(looks, looks[1:])) < 0.9, looks

"""zns.drivers.client_base in process: the events endpoint, durations, the session's sockets
(a fake NameServer on inproc), and ClientDriver's error path, clock and action loop with a
minimal subclass and a fake clock. The clients against real servers: tests/test_client.py."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from zns.core.client_session import ConnectEvents, FollowServer, Notify, SendBytes, Subscribe, Unsubscribe
from zns.core.errors import BackgroundFailure, NameServerUnavailable, NotFound, UsageError
from zns.drivers import client_base
from zns.drivers.client_base import ClientDriver, SessionSockets, events_endpoint, to_ms

from helpers import wait_for

pytestmark = pytest.mark.timeout(60)


# --- events_endpoint, to_ms, _safely -------------------------------------------------------


def test_the_events_endpoint_comes_from_the_argument_then_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("ZNS_EVENTS", raising=False)
    assert events_endpoint(None) is None
    assert events_endpoint("  ") is None
    monkeypatch.setenv("ZNS_EVENTS", "  ")
    assert events_endpoint(None) is None
    monkeypatch.setenv("ZNS_EVENTS", " h:1 ")
    assert events_endpoint(None) == "tcp://h:1"
    assert events_endpoint("") == "tcp://h:1"
    assert events_endpoint("h:2") == "tcp://h:2"
    assert client_base.EVENTS_ENV_VAR == "ZNS_EVENTS"


def test_an_events_endpoint_is_one_endpoint() -> None:
    with pytest.raises(UsageError) as caught:
        events_endpoint("h:1;h:2")
    assert str(caught.value) == "events endpoint 'h:1;h:2': expected one endpoint, got 2"


def test_durations_become_whole_milliseconds_of_at_least_one() -> None:
    assert to_ms(1.5) == 1500
    assert to_ms(0.0004) == 1
    assert to_ms(0) == 1
    assert to_ms(0.0016) == 2


def test_an_event_hook_that_fails_is_logged_not_raised(caplog) -> None:
    seen: list[bytes] = []
    client_base._safely(seen.append, b"ev")
    assert seen == [b"ev"]

    def broken(body: bytes) -> None:
        raise ValueError("hook bug")

    client_base._safely(broken, b"ev")
    (record,) = [r for r in caplog.records if r.name == "zns.client"]
    assert record.getMessage() == "event hook failed" and record.exc_info is not None


# --- SessionSockets ----------------------------------------------------------------------------


def test_following_a_nameserver_opens_a_dealer_and_following_none_closes_it(ctx) -> None:
    router = ctx.socket(zmq.ROUTER)
    router.bind("inproc://ns-a")
    sockets = SessionSockets(ctx)
    try:
        assert sockets.readable() == []
        sockets.send(b"nobody to send to")  # no DEALER yet: nothing happens
        sockets.carry_out(FollowServer(endpoint="inproc://ns-a"))
        dealer = sockets.dealer
        assert dealer is not None and dealer.type == zmq.DEALER
        assert sockets.readable() == [dealer]
        sockets.send(b"req")
        assert router.poll(10_000)
        peer, body = router.recv_multipart()
        assert body == b"req"
        router.send_multipart([peer, b"a", b"reply-1"])
        router.send_multipart([peer, b"reply-2"])
        got: list[bytes] = []
        wait_for(lambda: got.extend(sockets.receive(dealer)) or len(got) >= 2, timeout=10)
        assert got == [b"reply-1", b"reply-2"]  # the body is the last frame
        sockets.carry_out(FollowServer(endpoint=None))
        assert sockets.dealer is None and dealer.closed and sockets.readable() == []
    finally:
        sockets.close()
        router.close(0)


def test_a_request_that_cannot_be_queued_is_left_to_time_out(ctx, caplog) -> None:
    sockets = SessionSockets(ctx)
    try:
        sockets.carry_out(FollowServer(endpoint="inproc://nobody-bound"))
        sockets.dealer.setsockopt(zmq.SNDHWM, 1)  # the plain view's socket: the same one
        with caplog.at_level(logging.DEBUG, logger="zns.client"):
            for _ in range(5000):  # nobody reads: the DEALER's queue fills, never blocks
                sockets.send(b"x")
        assert "request not queued; the session will time it out" in caplog.messages
    finally:
        sockets.close()


def test_connecting_events_opens_a_sub_with_a_monitor_and_subscriptions_reach_it(ctx) -> None:
    pub = ctx.socket(zmq.XPUB)
    pub.bind("tcp://127.0.0.1:0")
    endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    sockets = SessionSockets(ctx)
    try:
        sockets.carry_out(Subscribe(channel=b"early"))  # no SUB yet: nothing happens
        sockets.carry_out(Unsubscribe(channel=b"early"))
        sockets.carry_out(ConnectEvents(endpoint=endpoint))
        sub, monitor = sockets.sub, sockets.monitor
        assert sub is not None and sub.type == zmq.SUB and monitor is not None
        assert sockets.readable() == [sub, monitor]
        sockets.carry_out(Subscribe(channel=b"route/T"))
        assert pub.poll(10_000) and pub.recv() == b"\x01route/T"
        sockets.carry_out(Unsubscribe(channel=b"route/T"))
        assert pub.poll(10_000) and pub.recv() == b"\x00route/T"
        sockets.carry_out(Subscribe(channel=b"route/"))
        assert pub.poll(10_000) and pub.recv() == b"\x01route/"
        pub.send_multipart([b"route/T", b"body"])
        wait_for(lambda: sub.poll(0), timeout=10)
        assert sockets.receive(sub) == [b"body"]
        assert sockets.disconnected() is False
        pub.close(0)  # the connection drops: the monitor says so
        wait_for(sockets.disconnected, timeout=10)
        sockets.carry_out(ConnectEvents(endpoint=endpoint))  # again: the old SUB is closed
        assert sub.closed and monitor.closed and sockets.sub is not sub
    finally:
        sockets.close()
        if not pub.closed:
            pub.close(0)
    assert sockets.sub is None and sockets.monitor is None and sockets.dealer is None
    assert sockets.viewed == set()
    assert sockets.disconnected() is False


def test_following_another_nameserver_closes_the_events_socket_too(ctx) -> None:
    sockets = SessionSockets(ctx)
    sockets.carry_out(FollowServer(endpoint="inproc://x"))
    sockets.carry_out(ConnectEvents(endpoint="tcp://127.0.0.1:1"))
    sub, dealer = sockets.sub, sockets.dealer
    sockets.carry_out(FollowServer(endpoint="inproc://y"))
    assert sub.closed and dealer.closed and sockets.sub is None and sockets.monitor is None
    assert sockets.viewed == {sockets.dealer}
    sockets.close()


# --- ClientDriver ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Driver(ClientDriver):
    """The smallest client: its hooks record, the test runs its turns."""

    def __init__(self, ctx: zmq.Context, **kwargs: Any) -> None:
        self.clock = Clock()
        self.woken = 0
        self.notified: list[tuple[str, Any]] = []
        self.forgotten: list[str] = []
        options: dict[str, Any] = dict(
            name="Driver", zone="", timeout=1.0, request_timeout=0.5, heartbeat_interval=1.0,
            pull_period=30.0, fault_tolerance=False, context=ctx, clock=self.clock,
            lock=contextlib.nullcontext(), wake=self.count_wake,
            notify=lambda topic, route: self.notified.append((topic, route)),
            forget_watchers=self.forgotten.append)
        options.update(kwargs)
        super().__init__(options.pop("addrs", "inproc://ns-driver"), **options)

    def count_wake(self) -> None:
        self.woken += 1


@pytest.fixture
def driver(ctx) -> Iterator[Driver]:
    made = Driver(ctx)
    yield made
    made.sockets.close()


def test_the_session_is_made_of_the_options(ctx) -> None:
    driver = Driver(ctx, addrs="h1:1;h2:2", zone="z1", heartbeat_interval=2.5, request_timeout=0.25,
                    pull_period=7, events="relay:9", channels=[b"c1"], fault_tolerance=True)
    try:
        session = driver.session
        assert session.endpoints == ["tcp://h1:1", "tcp://h2:2"]
        assert driver.timeout == 1.0 and driver.selector.faults is not None
        assert driver.failure is None
        assert session.events == "tcp://relay:9" and session.channels == (b"c1",)
        assert session.heartbeat_interval_ms == 2500 and session.request_timeout_ms == 250
        assert session.cache.zone == "z1" and session.cache.pull_period_ms == 7000
    finally:
        driver.sockets.close()


def test_now_is_the_clock_in_whole_milliseconds(driver: Driver) -> None:
    driver.clock.now = 12.3456
    assert driver.now() == 12345
    assert driver.wait_ms(None) is None
    assert driver.wait_ms(12400) == 55
    assert driver.wait_ms(12000) == 0


def test_a_dead_background_loop_is_logged_once_and_raised_by_every_later_call(driver: Driver, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="zns.client")
    cause = ValueError("boom")
    driver.died(cause)
    assert driver.failure is cause
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["the Driver's background loop failed (every later call raises it): ValueError: boom"]
    (debug,) = [r for r in caplog.records if r.levelno == logging.DEBUG and r.name == "zns.client"]
    assert debug.getMessage() == "the failure" and debug.exc_info is not None
    assert debug.exc_info[1] is cause  # the traceback, for whoever turns debug on
    for call in (lambda: driver.forget("T"), lambda: driver.track("T"), lambda: driver.answer("T", True),
                 driver.raise_if_failed):
        with pytest.raises(BackgroundFailure) as caught:
            call()
        assert caught.value.__cause__ is cause
        assert str(caught.value) == "the Driver's background loop failed: ValueError: boom"
    assert driver.woken == 0


def test_forget_stops_following_ends_the_watchers_and_wakes_the_loop(driver: Driver) -> None:
    driver.track("T")
    assert driver.woken == 1
    driver.forget("T")
    assert driver.forgotten == ["T"] and driver.woken == 2


def test_answer_names_the_nameservers_tried_or_the_missing_route(ctx) -> None:
    driver = Driver(ctx, addrs="h1:1;h2:2")
    try:
        with pytest.raises(NameServerUnavailable) as caught:
            driver.answer("T", False)
        assert str(caught.value) == "no route for 'T': no NameServer answered (tried tcp://h1:1, tcp://h2:2)"
        driver.track("T")
        assert "T" in driver.session.cache.take_stale()  # asked for
        driver.session.cache.apply_pull("e1", {}, {"T": 7}, 1000)  # pulled: no route, at revision 7
        with pytest.raises(NotFound) as missing:
            driver.answer("T", True)
        assert str(missing.value) == "no route for topic 'T'"
        assert missing.value.revision == 7  # a watch can start from there
    finally:
        driver.sockets.close()


def test_report_latency_and_select_use_the_clock(driver: Driver, monkeypatch) -> None:
    reported: list[tuple[Any, ...]] = []
    monkeypatch.setattr(driver.selector, "report", lambda *args: reported.append(args))
    selected: list[tuple[Any, ...]] = []
    monkeypatch.setattr(driver.selector, "select_queue", lambda *args: selected.append(args) or "q")
    driver.clock.now = 2.0
    driver.report_latency("b1", 12.5)
    driver.report_latency("b2", 3.0, failed=True)
    assert reported == [("b1", 12.5, 2000, False), ("b2", 3.0, 2000, True)]
    assert driver.select("T", [], "b1") == "q"
    assert selected == [("T", [], 2000, "b1")]


def test_actions_are_carried_out_in_order(driver: Driver, monkeypatch) -> None:
    done: list[Any] = []
    monkeypatch.setattr(driver.sockets, "carry_out", done.append)
    monkeypatch.setattr(driver.sockets, "send", lambda body: done.append(("send", body)))
    actions = [FollowServer(endpoint="inproc://a"), SendBytes(body=b"x"), Notify(topic="T", route=None),
               ConnectEvents(endpoint="tcp://e:1"), Subscribe(channel=b"c"), Unsubscribe(channel=b"c")]
    driver.carry_out(actions)  # type: ignore[arg-type]
    assert done == [actions[0], ("send", b"x"), actions[3], actions[4], actions[5]]
    assert driver.notified == [("T", None)]


def test_a_turn_reads_the_ready_sockets_then_the_timers(driver: Driver, monkeypatch) -> None:
    seen: list[Any] = []
    session = driver.session
    monkeypatch.setattr(session, "on_reply", lambda body, now: seen.append(("reply", body, now)))
    monkeypatch.setattr(session, "on_event", lambda body, now: seen.append(("event", body, now)))
    monkeypatch.setattr(session, "on_events_disconnected", lambda now: seen.append(("gone", now)))
    monkeypatch.setattr(session, "on_timer", lambda now: seen.append(("timer", now)))
    monkeypatch.setattr(session, "actions", lambda: [])
    sockets = driver.sockets
    sockets.dealer, sockets.sub, sockets.monitor = "D", "S", "M"
    monkeypatch.setattr(sockets, "receive", lambda sock: [b"from " + sock.encode()])
    gone = [True]
    monkeypatch.setattr(sockets, "disconnected", lambda: gone[0])
    hooked: list[bytes] = []
    driver.on_event = hooked.append
    driver.clock.now = 3.0
    try:
        driver.turn({"D", "S", "M"})
        assert seen == [("reply", b"from D", 3000), ("event", b"from S", 3000), ("gone", 3000),
                        ("timer", 3000)]
        assert hooked == [b"from S"]
        seen.clear()
        driver.turn(set())
        assert seen == [("timer", 3000)]
        seen.clear()
        gone[0] = False
        driver.turn({"M"})
        assert seen == [("timer", 3000)]
        seen.clear()
        driver.on_event = None
        driver.turn({"S"})
        assert seen == [("event", b"from S", 3000), ("timer", 3000)]
    finally:
        sockets.dealer = sockets.sub = sockets.monitor = None


def test_a_turn_with_no_sockets_open_only_runs_the_timers(driver: Driver, monkeypatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(driver.session, "on_timer", lambda now: seen.append(now))
    monkeypatch.setattr(driver.session, "actions", lambda: [])
    driver.turn({None})
    assert seen == [100000]

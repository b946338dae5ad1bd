"""BrokerAgent against real NameServers: every server, re-registration, topic changes, close."""

from __future__ import annotations

import inspect
import logging
import socket
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from helpers import LOADED_DEADLINE, register_fields, wait_for
from zns.drivers import broker_agent
from zns.drivers.broker_agent import BrokerAgent
from zns.core import schema
from zns.core.errors import BackgroundFailure, UsageError
from zns.core.schema import Error


def agent_for(*endpoints: str, **kw) -> BrokerAgent:
    kw.setdefault("cluster", "c1")
    kw.setdefault("broker_name", "bk")
    kw.setdefault("broker_addr", "127.0.0.1:10911")
    kw.setdefault("topics", ["T1"])
    kw.setdefault("heartbeat_interval", 0.2)
    kw.setdefault("request_timeout", 1.0)
    kw.setdefault("register_period", 60)  # so only heartbeats can explain a quick re-registration
    return BrokerAgent(list(endpoints), **kw)


def route_of(peer, topic: str):
    reply = peer.call("get_route", topic=topic)
    return None if isinstance(reply, Error) else reply.route


@pytest.mark.timeout(30)
def test_registers_with_every_nameserver_despite_a_dead_one(make_server):
    servers = [make_server(), make_server()]
    with agent_for(servers[0].router, "tcp://127.0.0.1:1", servers[1].router) as agent:
        peers = [s.peer() for s in servers]
        wait_for(lambda: all(route_of(p, "T1") for p in peers))
        # The replies are processed a moment after the servers apply the registration.
        wait_for(lambda: sum(s.registered for s in agent.status()) == 2)
        status = {s.endpoint: s for s in agent.status()}
        assert not status["tcp://127.0.0.1:1"].registered
        assert all(status[s.router].registered for s in servers)


@pytest.mark.timeout(30)
def test_close_unregisters_from_all_within_bounds(make_server):
    servers = [make_server(), make_server()]
    agent = agent_for(servers[0].router, servers[1].router, "tcp://127.0.0.1:1")
    wait_for(lambda: sum(s.registered for s in agent.status()) == 2)
    started = time.monotonic()
    result = agent.close(timeout=1.0)
    assert time.monotonic() - started < 5
    assert result == {servers[0].router: True, servers[1].router: True, "tcp://127.0.0.1:1": False}
    for srv in servers:
        assert srv.peer().ok("get_cluster_info").brokers == {}


@pytest.mark.timeout(30)
def test_reregisters_after_nameserver_restart_by_heartbeat(make_server, tmp_path: Path):
    first = make_server(kv_path=str(tmp_path / "kv.json"))
    # The second binds the first's ports (workers share tcp:// ports only).
    endpoints = dict(router=first.router, pub=first.pub, kv_path=str(tmp_path / "kv.json"))
    with agent_for(first.router) as agent:
        wait_for(lambda: route_of(first.peer(), "T1"))
        # Its reply too: a stop before it reaches the agent would leave the agent to count
        # one registration of two (the route is readable before the reply has arrived).
        wait_for(lambda: agent.status()[0].registrations >= 1)
        first.stop()
        # A cold restart (no state dump: a warm one knows the broker, test_warm_restart.py).
        second = make_server(**endpoints, state_path=str(tmp_path / "none" / "state.dump"))
        # register_period is 60 s: only a heartbeat answered `known: false` re-registers this fast.
        wait_for(lambda: route_of(second.peer(), "T1"), timeout=10)
        # The route can be read before the agent has read the reply to its registration.
        wait_for(lambda: agent.status()[0].registrations >= 2, timeout=10)


@pytest.mark.timeout(30)
def test_topic_changes_register_at_once(server):
    peer = server.peer()
    with agent_for(server.router) as agent:
        wait_for(lambda: route_of(peer, "T1"))
        version = agent.data_version
        agent.add_topic("T2", {"read_queues": 4, "write_queues": 4})
        wait_for(lambda: route_of(peer, "T2"))
        assert route_of(peer, "T2").queues[0].read_queues == 4
        assert agent.data_version.counter == version.counter + 1
        agent.remove_topic("T1")
        wait_for(lambda: route_of(peer, "T1") is None)
        with pytest.raises(UsageError):
            agent.add_topic("bad topic!")


@pytest.mark.timeout(30)
def test_heartbeats_keep_a_short_timeout_broker_alive(server):
    peer = server.peer()
    with agent_for(server.router, heartbeat_timeout_ms=1000):
        wait_for(lambda: route_of(peer, "T1"))
        live = peer.ok("get_cluster_info").live
        assert live[0].timeout_ms == 1000
        # Outlive several timeouts: only heartbeats can keep it registered.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert route_of(peer, "T1") is not None
            time.sleep(0.1)


@pytest.mark.timeout(30)
def test_conflict_is_logged_and_retried(server, caplog):
    peer = server.peer()
    # Another address holds id 0 with a newer state: our registration is refused (§4 step 3).
    peer.ok("register_broker", **register_fields(broker_name="bk", addr="10.9.9.9:1",
                                                 data_version={"state": 5}))
    caplog.set_level(logging.ERROR, logger="zns.core.broker_session")
    with agent_for(server.router) as agent:
        wait_for(lambda: "conflict" in agent.status()[0].last_error)
        assert not agent.status()[0].registered
        assert any("conflict" in r.getMessage() for r in caplog.records)


def test_bad_configuration_fails_at_construction():
    with pytest.raises(UsageError, match="broker address"):
        BrokerAgent("tcp://127.0.0.1:1", cluster="c", broker_name="b", broker_addr="nope",
                    start=False)


@pytest.mark.timeout(30)
def test_changes_made_while_a_registration_is_in_flight_are_not_lost(server):
    peer = server.peer()
    with agent_for(server.router) as agent:
        wait_for(agent.registered_everywhere)
        for i in range(30):  # some of these land while the previous registration is in flight
            agent.add_topic(f"X{i}")
            if i % 3 == 0:
                route_of(peer, "T1")  # a round trip: lets the agent's registration get going
        topics = ["T1"] + [f"X{i}" for i in range(30)]

        def held() -> set[str]:
            reply = peer.ok("get_routes", topics=topics)
            return set(reply.routes)

        # Every topic, not only the last: a registration carries all of them, so a lost change
        # shows as a missing topic only until the next one; the version held says which won.
        wait_for(lambda: held() == set(topics))
        wait_for(agent.registered_everywhere)
        assert held() == set(topics)
        live = peer.ok("get_cluster_info").live
        assert [b.data_version for b in live] == [agent.data_version]
        assert agent.data_version.counter == 30


@pytest.mark.timeout(30)
def test_status_shows_the_master_and_ha_addresses_registrations_return(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(broker_name="bk", addr="10.0.0.1:10911",
                                                 ha_addr="10.0.0.1:10912"))
    with agent_for(server.router, broker_id=1, broker_addr="10.0.0.2:10911") as agent:
        wait_for(agent.registered_everywhere)
        status = agent.status()[0]
        assert (status.master_addr, status.ha_addr) == ("10.0.0.1:10911", "10.0.0.1:10912")


@pytest.mark.timeout(30)
def test_registered_everywhere_only_once_every_nameserver_confirmed(server):
    with agent_for(server.router, "tcp://127.0.0.1:1") as agent:
        wait_for(lambda: any(s.registered for s in agent.status()))
        assert not agent.registered_everywhere()


class FakeNameServer:
    """A ROUTER in a thread of its own; `answer()` gets each request, decoded."""

    def __init__(self) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.sock.poll(50):
                identity, body = self.sock.recv_multipart()
                self.answer(identity, msgspec.msgpack.decode(body))

    def answer(self, identity: bytes, request: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close(0)


class SlowNameServer(FakeNameServer):
    """Answers nothing but an unregistration, `delay` agent-seconds after it came."""

    def __init__(self, clock, delay: float) -> None:
        self.clock, self.delay = clock, delay
        self.unregistrations = 0
        super().__init__()

    def answer(self, identity: bytes, request: dict) -> None:
        if request["op"] != "unregister_broker":
            return
        self.unregistrations += 1
        answer_at = self.clock() + self.delay
        while self.clock() < answer_at and not self.stop.is_set():
            time.sleep(0.01)  # a NameServer slow to answer, not a wait for a condition
        self.sock.send_multipart([identity, schema.encode(
            schema.UnregisterBrokerReply(id=request["id"], removed=True))])


@pytest.mark.timeout(60)
def test_close_waits_for_the_unregistration_as_long_as_its_timeout_says():
    # The agent's clock runs 4x fast: its 6 s wait for the answer is 1.5 s of the test's time.
    def clock() -> float:
        return time.monotonic() * 4

    slow = SlowNameServer(clock, delay=6.0)
    try:
        agent = agent_for(slow.endpoint, clock=clock)
        # Past the default 3 s, well within the 30 s asked for: the answer counts.
        assert agent.close(timeout=30) == {slow.endpoint: True}
        assert slow.unregistrations == 1
    finally:
        slow.close()


@pytest.mark.timeout(60)
def test_wait_registered_says_whether_every_nameserver_holds_the_broker(server):
    with agent_for(server.router) as agent:
        assert agent.wait_registered(timeout=3600)  # woken by the registration, not the hour
        agent.remove_topic("NeverAdded")  # nothing to remove: no error
        assert agent.topics.keys() == {"T1"}
    with agent_for(server.router, "tcp://127.0.0.1:1") as agent:
        started = time.monotonic()
        assert not agent.wait_registered(timeout=0.5)
        assert time.monotonic() - started < LOADED_DEADLINE  # its 0.5 s, not forever


class GarbageNameServer(SlowNameServer):
    """Answers every request with bytes that are not a reply."""

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.sock.poll(50):
                identity, _ = self.sock.recv_multipart()
                self.sock.send_multipart([identity, b"\x93junk"])


@pytest.mark.timeout(60)
def test_an_unreadable_reply_is_logged_and_the_agent_goes_on(caplog):
    garbage = GarbageNameServer(time.monotonic, delay=0)
    try:
        with caplog.at_level(logging.WARNING, logger="zns"):
            with agent_for(garbage.endpoint) as agent:
                wait_for(lambda: any(r.getMessage().startswith(
                    f"unreadable reply from {garbage.endpoint}: Expected `object`")
                    for r in caplog.records))
                assert not agent.registered_everywhere()
                agent.close(timeout=0.2)
    finally:
        garbage.close()


def test_wait_registered_asks_its_condition_for_five_seconds_by_default(monkeypatch):
    class Spy(threading.Condition):
        """Records how long it is asked to wait, and does not wait."""

        timeouts: list[float | None] = []

        def wait_for(self, predicate, timeout=None):  # type: ignore[no-untyped-def]
            self.timeouts.append(timeout)
            return super().wait_for(predicate, 0)

    monkeypatch.setattr(broker_agent.threading, "Condition", Spy)  # the agent's lock is one
    agent = agent_for("tcp://127.0.0.1:1", start=False)
    assert agent.wait_registered() is False
    assert Spy.timeouts == [5.0]
    agent.close()


@pytest.mark.timeout(60)
def test_the_agent_clock_is_read_in_milliseconds():
    clock = [lambda: 2.5]
    agent = agent_for("tcp://127.0.0.1:1", clock=lambda: clock[0]())  # nobody answers there
    try:
        session = agent.sessions[0]
        wait_for(lambda: session.in_flight is not None)  # its registration, sent at 2.5 s
        assert session.next_deadline() == 2500 + 1000  # unanswered within request_timeout 1 s
    finally:
        clock[0] = time.monotonic  # the close's own deadline passes
        agent.close(timeout=0.2)


class CountingNameServer(FakeNameServer):
    """Answers registrations and heartbeats (known, unchanged), counting each by op."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        super().__init__()

    def answer(self, identity: bytes, request: dict) -> None:
        self.requests.append(request)
        reply = {"register_broker": schema.RegisterBrokerReply(id=request["id"]),
                 "heartbeat": schema.HeartbeatReply(id=request["id"], known=True, changed=False),
                 "unregister_broker": schema.UnregisterBrokerReply(id=request["id"], removed=True),
                 }[request["op"]]
        self.sock.send_multipart([identity, schema.encode(reply)])

    def count(self, op: str) -> int:
        return sum(r["op"] == op for r in self.requests)


@pytest.mark.timeout(60)
def test_a_topic_change_registers_once_then_heartbeats_take_over():
    """One registration per change: a "topics changed" flag left set would register again on
    every turn of the loop (each reply is a turn), and heartbeats would never be needed."""
    fake = CountingNameServer()
    try:
        with agent_for(fake.endpoint) as agent:
            assert agent.wait_registered(timeout=LOADED_DEADLINE)
            threads = [t for t in threading.enumerate() if t.name == "zns-broker-agent"]
            assert threads and all(t.daemon for t in threads)
            # Heartbeats every 0.2 s; registrations only every 60 s or on a change.
            wait_for(lambda: fake.count("heartbeat") >= 3 or fake.count("register_broker") > 1)
            assert fake.count("register_broker") == 1
            assert agent.status()[0].registrations == 1
            agent.add_topic("T2")
            wait_for(lambda: agent.status()[0].registrations == 2)
            beats = fake.count("heartbeat")
            wait_for(lambda: fake.count("heartbeat") >= beats + 3 or fake.count("register_broker") > 2)
            assert fake.count("register_broker") == 2
            second = [r for r in fake.requests if r["op"] == "register_broker"][1]
            assert set(second["topics"]) == {"T1", "T2"}
    finally:
        fake.close()


class SecondSocketFails(zmq.Context):
    """Makes the first socket, then refuses: the agent's thread fails with one socket open."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "made", [])  # zmq.Context takes other attributes for options

    def socket(self, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        if self.made:
            raise RuntimeError("no second socket")
        self.made.append(super().socket(*args, **kwargs))
        return self.made[0]


@pytest.mark.timeout(60)
def test_a_failed_thread_says_why_in_one_line_and_closes_the_sockets_it_had(caplog):
    ctx = SecondSocketFails()
    with caplog.at_level(logging.DEBUG, logger="zns.drivers.broker_agent"):
        agent = agent_for("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", context=ctx)
        with pytest.raises(BackgroundFailure):
            agent.close()  # which waits for the thread to end
    assert isinstance(agent.failure, RuntimeError)
    assert ctx.made[0].closed  # the first NameServer's socket, dropped on the way out
    records = [r for r in caplog.records if r.name == "zns.drivers.broker_agent"]
    assert [(r.levelname, r.getMessage()) for r in records] == [
        ("ERROR", "the BrokerAgent's thread failed (every later call raises it): "
                  "RuntimeError: no second socket"),
        ("DEBUG", "the failure")]
    assert records[1].exc_info is not None and records[1].exc_info[1] is agent.failure
    ctx.term()


def test_the_defaults_and_seconds_become_the_sessions_milliseconds():
    agent = BrokerAgent("tcp://127.0.0.1:1", cluster="c1", broker_name="bk",
                        broker_addr="127.0.0.1:10911", start=False)
    session = agent.sessions[0]
    assert agent.register_period == 30.0
    assert (session.register_period_ms, session.heartbeat_interval_ms,
            session.request_timeout_ms) == (30_000, 1_000, 3_000)
    registration = session.broker.registration()
    assert (registration.zone, registration.heartbeat_timeout_ms, registration.data_version.state,
            registration.ha_addr) == ("", 10_000, 0, "")
    agent.close()
    assert inspect.signature(BrokerAgent.close).parameters["timeout"].default == 3.0
    timed = agent_for("tcp://127.0.0.1:1", register_period=45, request_timeout=2.5, zone="z1",
                      heartbeat_interval=0.5, state_version=7, ha_addr="127.0.0.1:10912",
                      start=False)
    assert timed.register_period == 45.0 and timed.sessions[0].request_timeout_ms == 2500
    assert timed.sessions[0].heartbeat_interval_ms == 500
    registration = timed.sessions[0].broker.registration()
    assert registration.zone == "z1" and registration.data_version.state == 7
    assert registration.ha_addr == "127.0.0.1:10912"
    assert abs(registration.data_version.timestamp - time.time() * 1000) < 3_600_000
    timed.close()


@pytest.mark.timeout(60)
def test_a_change_wakes_the_agent_when_nothing_else_would():
    """The agent's clock stands still: no deadline ever comes, only the waker can make the
    loop see a topic change (or the close)."""
    fake = CountingNameServer()
    try:
        agent = agent_for(fake.endpoint, clock=lambda: 50.0, heartbeat_interval=600)
        assert agent.wait_registered(timeout=LOADED_DEADLINE)
        agent.add_topic("T2")
        wait_for(lambda: fake.count("register_broker") == 2)
        assert agent.close(timeout=5) == {fake.endpoint: True}
    finally:
        fake.close()


@pytest.mark.timeout(60)
def test_a_request_timed_out_drops_the_connection_during_the_backoff():
    """A NameServer that accepts the TCP connection but never speaks: the registration times
    out and the connection is closed at once, not when the backoff ends (the agent's clock
    then stands still, so it never does)."""
    mute = socket.create_server(("127.0.0.1", 0))
    now = [0.0]
    agent = agent_for(f"tcp://127.0.0.1:{mute.getsockname()[1]}", clock=lambda: now[0])
    try:
        mute.settimeout(LOADED_DEADLINE)
        conn, _ = mute.accept()
        conn.settimeout(LOADED_DEADLINE)
        now[0] = 1.5  # past the 1 s request timeout, before any reconnection
        while conn.recv(4096):  # the DEALER's greeting, then the end of the connection
            pass
        assert agent.status()[0].last_error == "no reply to register_broker within 1000 ms"
        conn.close()
    finally:
        now[0] = 1000.0
        agent.close(timeout=0.1)
        mute.close()

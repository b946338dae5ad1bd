"""The events relay (NameServer -> relay -> clients) and `zns watch` for people and in JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from helpers import Peer, SplitServer, register_fields, wait_for
from zns.core import schema
from zns.core.errors import EndpointError, NameServerUnavailable, UsageError
from zns.drivers.async_client import AsyncRouteClient
from zns.drivers.client_base import events_endpoint
from zns.drivers.event_relay import Relay
from zns.drivers.route_client import RouteClient
from zns.drivers.server import MAX_SUBSCRIPTION_BYTES


def _register(peer: Peer, name: str, addr: str, topics: dict, version: int = 1) -> None:
    peer.ok("register_broker", **register_fields(broker_name=name, addr=addr, topics=topics,
                                                 data_version={"counter": version}))


def _write_queues(client: RouteClient, topic: str) -> int | None:
    try:
        return client.route(topic, timeout=0.5).queues[0].write_queues
    except Exception:
        return None


def _rebind(upstream: str, endpoint: str) -> Relay:
    """A relay on the endpoint another one just left: libzmq closes a listening socket in its
    own thread, after close() returns, so the port is free a moment later (EADDRINUSE until)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return Relay(upstream, endpoint)
        except EndpointError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.timeout(60)
def test_relay_carries_changes_and_a_restart_is_repaired(server: SplitServer):
    peer = server.peer()
    _register(peer, "b1", "10.0.0.1:1", {"T1": {"write_queues": 1, "read_queues": 1}})
    relay = Relay(server.router, "tcp://127.0.0.1:*")
    endpoint = relay.endpoint
    seen: list[int] = []
    with RouteClient(server.router, events=endpoint, heartbeat_interval=0.2) as client:
        client.watch("T1", lambda t, r: seen.append(r.queues[0].write_queues if r else -1))
        wait_for(lambda: seen == [1])
        wait_for(lambda: client.session.connected)
        assert client.session.pub_endpoint == endpoint  # not the NameServer's own PUB
        # A change arrives through the relay, as an event (no pull needed).
        wait_for(lambda: client.session.cache._entries["T1"].proven)
        pulls = client.session.pulls
        _register(peer, "b1", "10.0.0.1:1", {"T1": {"write_queues": 2, "read_queues": 2}}, 2)
        wait_for(lambda: seen[-1] == 2)
        assert client.session.pulls == pulls
        # The relay goes away; a change is made that no event will ever repeat.
        relay.close()
        _register(peer, "b1", "10.0.0.1:1", {"T1": {"write_queues": 3, "read_queues": 3}}, 3)
        relay = _rebind(server.router, endpoint)  # same endpoint: clients reconnect by themselves
        # Silence (or a gap) makes the client pull again, and it learns the missed change.
        wait_for(lambda: seen[-1] == 3, timeout=20)
        assert client.session.pulls > pulls
    relay.close()


@pytest.mark.timeout(60)
def test_async_client_through_a_relay(server: SplitServer):
    peer = server.peer()
    _register(peer, "b1", "10.0.0.1:1", {"T1": {}})

    async def main() -> int:
        with Relay(server.router, "tcp://127.0.0.1:*") as relay:
            async with AsyncRouteClient(server.router, events=relay.endpoint,
                                        heartbeat_interval=0.2) as client:
                routes = client.watch("T1")
                first = await asyncio.wait_for(routes.__anext__(), 10)
                assert client.session.pub_endpoint == relay.endpoint
                while True:  # until the subscription through the relay is proven
                    _register(peer, "b2", "10.0.0.2:1", {"T1": {}}, int(time.time() * 1000))
                    route = await asyncio.wait_for(routes.__anext__(), 10)
                    if len(route.brokers) == 2:
                        return len(first.brokers)

    assert asyncio.run(main()) == 1


def test_events_endpoint_from_argument_or_environment(monkeypatch):
    monkeypatch.delenv("ZNS_EVENTS", raising=False)
    assert events_endpoint(None) is None
    assert events_endpoint("127.0.0.1:5000") == "tcp://127.0.0.1:5000"
    monkeypatch.setenv("ZNS_EVENTS", "tcp://127.0.0.1:5001")
    assert events_endpoint(None) == "tcp://127.0.0.1:5001"
    assert events_endpoint("tcp://127.0.0.1:5002") == "tcp://127.0.0.1:5002"
    with pytest.raises(UsageError):
        events_endpoint("a:1;b:2")


# --- the commands, as processes ------------------------------------------------------


class _Proc(subprocess.Popen):
    """A `zns` process whose output lines are read by threads into queues (select on a
    buffered pipe misses lines already read into the buffer)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queues: dict[str, queue.Queue[str | None]] = {}
        for name in ("stdout", "stderr"):
            q: queue.Queue[str | None] = queue.Queue()
            self.queues[name] = q
            threading.Thread(target=self._pump, args=(getattr(self, name), q),
                             daemon=True).start()

    @staticmethod
    def _pump(pipe, q: queue.Queue) -> None:
        for line in pipe:
            q.put(line.rstrip("\n"))
        q.put(None)

    def rest(self, stream: str = "stdout") -> str:
        lines, q = [], self.queues[stream]
        while (line := q.get(timeout=15)) is not None:
            lines.append(line)
        return "\n".join(lines)


def _zns(*args: str) -> _Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    return _Proc([sys.executable, "-m", "zns", *args], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True, env=env)


def _line(proc: _Proc, timeout: float = 30.0, stream: str = "stdout") -> str:
    try:
        line = proc.queues[stream].get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no line from {proc.args} within {timeout} s") from None
    assert line is not None, f"{proc.args} ended"
    return line


def _ready_line(proc: _Proc, timeout: float) -> str | None:
    try:
        line = proc.queues["stdout"].get(timeout=timeout)
    except queue.Empty:
        return None
    assert line is not None, f"{proc.args} ended"
    return line


def _register_until_seen(peer: Peer, proc: _Proc, seen: str, name: str,
                         registration: Callable[[int], tuple[str, dict]]) -> tuple[list[str], int]:
    """Subscriptions take effect some time after the watcher starts: register broker `name`
    at data versions 1, 2, ... (`registration(version)`: its address and topics) until
    `proc` prints a line containing `seen`, within 30 s. (The lines so far, the last version.)"""
    lines: list[str] = []
    deadline = time.monotonic() + 30
    version = 0
    while not any(seen in line for line in lines):
        assert time.monotonic() < deadline, lines
        version += 1
        addr, topics = registration(version)
        _register(peer, name, addr, topics, version)
        line = _ready_line(proc, 0.2)
        if line is not None:
            lines.append(line)
    return lines, version


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(15)


@pytest.mark.timeout(90)
def test_watch_prints_what_a_topic_gained_and_lost(server: SplitServer):
    peer = server.peer()
    _register(peer, "b1", "10.0.0.1:10911", {"T": {"read_queues": 4, "write_queues": 4}})
    proc = _zns("watch", "T", "--ns", server.router, "--count", "3", "--timeout", "3")
    try:
        first = _line(proc)
        assert re.search(r"route T rev \d+: brokers c1/b1 \(id 0 10.0.0.1:10911\); "
                         r"queues b1 r4/w4 rw-", first), first
        _register(peer, "b2", "10.0.0.2:10911", {"T": {"read_queues": 2, "write_queues": 2}})
        second = _line(proc)
        assert "gained broker c1/b2 (id 0 10.0.0.2:10911)" in second, second
        assert "gained queues on b2 r2/w2 rw-" in second and "lost" not in second, second
        peer.ok("unregister_broker", cluster="c1", broker_name="b1", broker_id=0,
                broker_addr="10.0.0.1:10911")
        third = _line(proc)
        assert "lost broker c1/b1" in third and "lost queues on b1 r4/w4 rw-" in third, third
        assert "gained" not in third, third
        assert proc.wait(15) == 0
    finally:
        _stop(proc)


@pytest.mark.timeout(90)
def test_watch_everything_shows_brokers_and_new_topics(server: SplitServer):
    peer = server.peer()
    proc = _zns("watch", "--ns", server.router, "--timeout", "3")
    try:
        lines, _ = _register_until_seen(
            peer, proc, "broker registered c1/bw", "bw",
            lambda version: (f"10.0.0.{version % 250 + 1}:1", {"NewT": {}}))
        while not any("route NewT rev" in line for line in lines):
            lines.append(_line(proc))
        assert any(re.search(r"broker registered c1/bw id 0 at 10\.0\.0\.\d+:1 \(rev \d+\)", l)
                   for l in lines), lines
    finally:
        _stop(proc)


@pytest.mark.timeout(90)
def test_watch_everything_prints_one_line_per_change_of_a_followed_topic(server: SplitServer):
    peer = server.peer()
    proc = _zns("watch", "--ns", server.router, "--timeout", "3")
    try:
        lines, version = _register_until_seen(
            peer, proc, "route CountT rev", "bq",
            lambda version: ("10.0.0.9:1", {"CountT": {"write_queues": 1 + version % 2}}))
        for read_queues in (7, 5):  # queue counts, not perm, change: each is one line
            version += 1
            _register(peer, "bq", "10.0.0.9:1",
                      {"CountT": {"read_queues": read_queues, "write_queues": 3}}, version)
            while not any(f"-> r{read_queues}/w3 rw-" in line for line in lines):
                lines.append(_line(proc))
        topic_lines = [line for line in lines if "route CountT" in line]
        assert not any("unchanged" in line for line in topic_lines), topic_lines
        for change in ("-> r7/w3 rw-", "r7/w3 rw- -> r5/w3 rw-"):
            assert sum(change in line for line in topic_lines) == 1, topic_lines
    finally:
        _stop(proc)


@pytest.mark.timeout(90)
def test_watch_json_prints_raw_events_through_a_relay(server: SplitServer):
    peer = server.peer()
    _register(peer, "b1", "10.0.0.1:1", {"TopicJ": {}})
    with Relay(server.router, "tcp://127.0.0.1:*") as relay:
        proc = _zns("watch", "TopicJ", "--json", "--ns", server.router, "--events",
                    relay.endpoint, "--count", "2", "--timeout", "3")
        try:
            version = 1
            deadline = time.monotonic() + 30
            while proc.poll() is None:
                assert time.monotonic() < deadline
                version += 1
                _register(peer, "b1", "10.0.0.1:1", {"TopicJ": {"read_queues": version}},
                          version)
                time.sleep(0.1)
            out = proc.rest()
            assert proc.returncode == 0, out + proc.rest("stderr")
            # Its starting state, then an event (either may come first: `revision` orders them).
            lines = [json.loads(line) for line in out.splitlines()]
            [state] = [line for line in lines if line["op"] == "state"]
            assert state["topic"] == "TopicJ" and state["route"]["brokers"][0]["broker_name"] == "b1"
            [event] = [line for line in lines if line["op"] == "route"]
            assert event["topic"] == "TopicJ"
            assert event["route"]["queues"][0]["read_queues"] >= 2
        finally:
            _stop(proc)


@pytest.mark.timeout(60)
def test_relay_command_serves_subscribers_and_stops_on_sigterm(server: SplitServer):
    proc = _zns("relay", "--from", server.router, "--bind", "tcp://127.0.0.1:*")
    try:
        line = ""
        while "relayed on" not in line:
            line = _line(proc, stream="stderr")
        endpoint = line.split("relayed on ")[1].strip()
        sub = Peer(server.router, endpoint)
        sub.subscribe(schema.HB_CHANNEL)
        sub.wait_subscribed()  # an hb from the NameServer, through the relay
        sub.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        _stop(proc)


def test_relay_refuses_when_no_nameserver_answers():
    proc = _zns("relay", "--from", "tcp://127.0.0.1:1", "--bind", "tcp://127.0.0.1:*",
                "--timeout", "0.2")
    assert proc.wait(30) == 3
    assert "no" in proc.rest("stderr").lower()


class FakeUpstream:
    """A NameServer that only answers `status`, naming `pub_endpoint` as its events endpoint."""

    def __init__(self, router: str, pub: str, pub_endpoint: str) -> None:
        ctx = zmq.Context.instance()
        self.router = ctx.socket(zmq.ROUTER)
        self.pub = ctx.socket(zmq.PUB)
        for sock in (self.router, self.pub):
            sock.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)  # the relay's bounds are under test, not this one's
        self.router.bind(router)
        self.pub.bind(pub)
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.pub_port = self.pub.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[-1]
        self.pub_endpoint = pub_endpoint.replace("PORT", self.pub_port)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        while not self.stop.is_set():
            if self.router.poll(50):
                identity, body = self.router.recv_multipart()
                request = schema.decode_request(body)
                self.router.send_multipart([identity, schema.encode(schema.StatusReply(
                    id=request.id, epoch="e", revision=0, version="0", uptime_ms=0, brokers=0,
                    topics=0, pub_endpoint=self.pub_endpoint))])

    def subscribed(self, sub: zmq.Socket) -> None:
        """Publish probes until `sub` (subscribed to everything) receives one; drain it."""
        deadline = time.monotonic() + 20
        while not sub.poll(20):
            assert time.monotonic() < deadline, "the subscription never reached the upstream"
            self.pub.send(b"probe")
        while sub.poll(100):
            sub.recv()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.router.close(0)
        self.pub.close(0)


def _sub(endpoint: str, rcvhwm: int) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, rcvhwm)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


@pytest.mark.timeout(60)
def test_relay_replaces_a_wildcard_host_in_the_events_endpoint():
    upstream = FakeUpstream("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "tcp://*:PORT")
    try:
        with Relay(upstream.endpoint, "tcp://127.0.0.1:*") as relay:
            assert relay.upstream_pub == f"tcp://127.0.0.1:{upstream.pub_port}"
            sub = _sub(relay.endpoint, 1000)
            upstream.subscribed(sub)  # events of the NameServer come through
            sub.close(0)
    finally:
        upstream.close()


@pytest.mark.timeout(60)
def test_relay_drops_for_a_subscriber_behind_by_its_high_water_mark():
    # inproc: no kernel buffers, so a pipe holds exactly what the marks allow.
    name = f"inproc://zns-test-{os.getpid()}-{time.monotonic_ns()}"
    upstream = FakeUpstream(f"{name}-ns", f"{name}-pub", f"{name}-pub")
    try:
        with Relay(upstream.endpoint, f"{name}-relay", hwm=10) as relay:
            behind = _sub(relay.endpoint, 10)
            reader = _sub(relay.endpoint, 0)  # unbounded: tells when the relay forwarded all
            upstream.subscribed(behind)
            upstream.subscribed(reader)
            while behind.poll(0):
                behind.recv()
            for i in range(3000):
                upstream.pub.send(b"event %d" % i)
            while reader.recv() != b"event 2999":
                pass
            kept = 0
            while behind.poll(0):
                behind.recv()
                kept += 1
            # The relay's send mark (10) plus the subscriber's receive mark (10), not thousands.
            assert 0 < kept <= 100, kept
            behind.close(0)
            reader.close(0)
    finally:
        upstream.close()


# --- zns watch's lines, without processes ----------------------------------------------------


def test_watch_starts_with_every_topics_route_each_line_stamped(server: SplitServer):
    from click.testing import CliRunner

    from zns.cli import main

    peer = server.peer()
    _register(peer, "b1", "10.0.0.1:10911", {"TA": {}, "TB": {}})
    out = CliRunner().invoke(main, ["watch", "--ns", server.router, "--count", "2",
                                    "--timeout", "3"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert sorted(line.split()[2] for line in lines) == ["TA", "TB"], lines
    for line in lines:
        assert re.match(r"\d\d:\d\d:\d\d\.\d{3} route T[AB] rev \d+: brokers c1/b1", line), line
    assert re.search(r"^\d\d:\d\d:\d\d\.\d{3} following tcp://", out.stderr, re.MULTILINE), \
        out.stderr


def test_watch_says_gone_for_a_topic_deleted_before_it_was_followed_and_notes_a_new_epoch():
    from zns.cli.watch import _Printer, connection_note

    class Cache:
        def revision(self, _topic: str) -> int:
            return 9

    class Client:
        class session:  # noqa: N801
            cache = Cache()

    printer = _Printer(as_json=False, follow_new=True)
    printer.client = Client()  # type: ignore[assignment]
    printer.listed()  # no topic to start with: events print as they come
    deleted = schema.RouteEvent(epoch="e1", revision=9, prev=8, topic="Old", route=None)
    printer.on_event(schema.encode(deleted))
    printer.on_route("Old", None)  # the pull after following: no route
    printer.on_event(schema.encode(schema.HbEvent(epoch="e2", revision=9, time_ms=1)))
    lines = [printer.lines.get_nowait() for _ in range(printer.lines.qsize())]
    assert lines[0] == ("follow", "Old")
    assert lines[1][0] == "line" and lines[1][1].endswith("route Old rev 9: gone")
    assert lines[2][0] == "note" and "epoch changed e1 -> e2 (it restarted, or another one answers)" in lines[2][1]
    # A topic given by name that never existed has no route (not gone).
    printer.on_route("Never", None)
    assert printer.lines.get_nowait()[1].endswith("route Never rev 9: no route")

    a, b = ("tcp://a:1", "tcp://a:2"), ("tcp://b:1", "tcp://b:2")
    assert connection_note((None, None), ("tcp://a:1", None), False) is None
    assert "following tcp://a:1 (events on tcp://a:2)" in connection_note((None, None), a, False)
    assert "lost tcp://a:1; trying the next NameServer" in connection_note(a, ("tcp://b:1", None),
                                                                           True)
    assert "reconnected: following tcp://b:1" in connection_note(("tcp://b:1", None), b, True)
    assert connection_note(b, b, True) is None


@pytest.mark.timeout(60)
def test_relay_takes_the_first_nameserver_of_a_list_and_two_relays_run_side_by_side(caplog):
    upstream = FakeUpstream("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "tcp://127.0.0.1:PORT")
    try:
        with caplog.at_level(logging.INFO, logger="zns"), \
                Relay(f"{upstream.endpoint};tcp://127.0.0.1:1", "tcp://127.0.0.1:*") as first, \
                Relay(upstream.endpoint, "tcp://127.0.0.1:*") as second:
            assert first.upstream == upstream.endpoint
            # The line `zns relay` prints: where subscribers connect (read by scripts).
            assert (f"zns relay: events of {first.upstream_pub} (NameServer {upstream.endpoint}) "
                    f"relayed on {first.endpoint}") in caplog.messages
            threads = [t for t in threading.enumerate() if t.name == "zns-relay"]
            assert len(threads) >= 2 and all(t.daemon for t in threads)
            for relay in (first, second):  # each its own control socket
                sub = _sub(relay.endpoint, 1000)
                upstream.subscribed(sub)
                sub.close(0)
    finally:
        upstream.close()


@pytest.mark.timeout(60)
def test_relay_refusals_say_what_and_keep_their_timeout():
    with pytest.raises(NameServerUnavailable, match=r"within 0\.2 s"):
        Relay("tcp://127.0.0.1:1", "tcp://127.0.0.1:*", timeout=0.2)
    with pytest.raises(NameServerUnavailable, match=r"within 3 s"):  # the documented default
        Relay("tcp://127.0.0.1:1", "tcp://127.0.0.1:*")
    upstream = FakeUpstream("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "tcp://127.0.0.1:PORT")
    try:
        with Relay(upstream.endpoint, "tcp://127.0.0.1:*") as relay:
            with pytest.raises(EndpointError, match=f"cannot bind {relay.endpoint}"):
                Relay(upstream.endpoint, relay.endpoint)
    finally:
        upstream.close()


@pytest.mark.timeout(60)
def test_relay_carries_a_subscription_as_long_as_the_nameserver_takes():
    upstream = FakeUpstream("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "tcp://127.0.0.1:PORT")
    try:
        with Relay(upstream.endpoint, "tcp://127.0.0.1:*") as relay:
            channel = b"x" * (MAX_SUBSCRIPTION_BYTES - 1) + b"\0"  # 1 KiB: the §1 bound
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, channel)
            sub.connect(relay.endpoint)
            deadline = time.monotonic() + 20
            while not sub.poll(50):
                assert time.monotonic() < deadline, "a 1 KiB subscription did not pass the relay"
                upstream.pub.send_multipart([channel, b"event"])
            assert sub.recv_multipart() == [channel, b"event"]
            sub.close(0)
    finally:
        upstream.close()

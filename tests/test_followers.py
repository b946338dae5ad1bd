"""Followers (`--followers`, `--follow`): read replicas on other hosts, fed by the workers.

The gateway (a worker's side) is driven in this process first, over inproc DEALERs that
speak the follower's side of the protocol; then whole NameServers and followers run as
processes, over TCP with CURVE.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import zmq
import zmq.auth

import differential as rd  # tests/interop (conftest puts it on sys.path)
from helpers import LOADED_DEADLINE, Peer, ProcessServer, register_fields, wait_for
from test_bench_smoke import SCRIPT_DEADLINE, check_script
from bench.harness import DelayRelay  # the bench's package: test_bench_smoke puts it on the path
from test_idle_cpu import assert_idle
from test_metrics import get
from test_remoting_listener import Client, register_cmd
from test_workers_differential import zns1_operation
from zns.core import schema
from zns.core.config import DEFAULT_MAX_MESSAGE_BYTES
from zns.core.remoting import DEFAULT_MAX_FRAME_BYTES
from zns.core.schema import UNSET, FollowerStatus
from zns.core.errors import Busy, NoPermission
from zns.core.state import CloseConnections, Suspect, Write
from zns.core.remoting import RemotingCommand
from zns.core.replication import (
    Ack, Answer, Apply, Forward, Joined, Report, Resync, State, Whole, decode_to_worker, encode,
)
from zns.core import followers as followers_core
from zns.core.followers import (
    FOLLOWER_ID_BITS, READMIT_MS, STATE_WINDOW_MS, STATES_PER_WINDOW, Admissions, Follower,
    FollowerIds, Ignore, Lose, Pass, Refuse, follower_ids,
)
from zns.drivers import followers
from zns.drivers.followers import FORWARD_MARGIN_BYTES, Gateway
from zns.drivers.security import apply_client_keys, client_keys, write_keypair

pytestmark = pytest.mark.timeout(120)


# --- what a gateway decides (zns.core.followers), without a socket ------------------------


class Keys:
    """A key policy: every write allowed, or refused with `refusal`."""

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal

    def check(self, key: str | None, request: Any) -> None:
        if self.refusal is not None:
            raise NoPermission(self.refusal)


def write(name: str = "b1", connection: int | None = None, op: str = "register") -> bytes:
    """A forwarded write, as a worker or a follower sends it."""
    request: Any = schema.RegisterBroker(
        cluster="c1", broker_name=name, broker_id=0, broker_addr="10.0.0.1:10911",
        topics={}) if op == "register" else schema.Heartbeat(
        cluster="c1", broker_name=name, broker_id=0, broker_addr="10.0.0.1:10911")
    return msgspec.msgpack.encode(Write(request=request, now=1, connection=connection))


def test_a_follower_is_admitted_with_a_range_of_ids_no_worker_or_other_follower_has():
    admissions = Admissions(worker_range=3, id_bits=40, max_followers=2)
    a = admissions.admit(b"a", "ka", "a", now=0)
    b = admissions.admit(b"b", "kb", "b", now=0)
    assert isinstance(a, Follower) and isinstance(b, Follower)
    for follower in (a, b):  # the upper half of worker range 3: none of the worker's own ids
        assert follower.first_id >> 40 == 3 and follower.first_id & (1 << 39)
    assert b.first_id - a.first_id == 1 << FOLLOWER_ID_BITS  # one range each, apart
    assert not a.owns(b.first_id) and a.owns(b.first_id - 2) and not a.owns((3 << 40) + 1)
    # Past the bound: not admitted, said once, then quiet until READMIT_MS passed.
    assert "at most" in admissions.admit(b"c", "kc", "c", now=0)
    assert admissions.admit(b"c", "kc", "c", now=READMIT_MS - 1) == ""
    assert "at most" in admissions.admit(b"c", "kc", "c", now=READMIT_MS)
    # A follower dropped comes back after READMIT_MS with its range again.
    assert admissions.drop(b"a", now=100) is a
    assert admissions.admit(b"a", "ka", "a", now=100 + READMIT_MS - 1) == ""
    again = admissions.admit(b"a", "ka", "a", now=100 + READMIT_MS)
    assert isinstance(again, Follower) and again.first_id == a.first_id


def test_a_worker_numbers_at_most_its_slots_of_followers(monkeypatch):
    monkeypatch.setattr(followers_core, "FOLLOWER_SLOTS", 2)
    admissions = Admissions(worker_range=1, id_bits=40)
    for identity in (b"a", b"b"):
        assert isinstance(admissions.admit(identity, None, "x", now=0), Follower)
        admissions.drop(identity, now=0)
    assert "all it can number" in admissions.admit(b"c", None, "x", now=0)


def test_a_follower_may_ask_for_a_state_a_few_times_a_window():
    admissions = Admissions(worker_range=1, id_bits=40)
    follower = admissions.admit(b"a", None, "a", now=0)
    assert isinstance(follower, Follower)
    assert [admissions.state_asked(follower, now) for now in (0, 10, 20, 30)] == [
        True, True, True, False]  # each costs a dump of the whole state
    assert admissions.state_asked(follower, STATE_WINDOW_MS + 1)  # the window moved on


def test_a_follower_passes_on_only_what_its_key_may_do_over_its_own_connections():
    admissions = Admissions(worker_range=3, id_bits=40)
    follower = admissions.admit(b"a", "ka", "fa", now=0)
    assert isinstance(follower, Follower)
    first, allowed = follower.first_id, Keys()
    assert admissions.vet(follower, write(connection=first), allowed, 0) == Pass(
        write(connection=first), "follower fa")  # a registration may displace: audited
    assert admissions.vet(follower, write(op="heartbeat"), allowed, 0) == Pass(
        write(op="heartbeat"))
    refused = admissions.vet(follower, write(), Keys("not a broker key"), 0)
    assert isinstance(refused, Refuse) and refused.error.code == "no_permission"
    assert "refused its follower's write: not a broker key" in str(refused.error)
    assert isinstance(admissions.vet(follower, write(), None, 0), Refuse)  # no keys: none
    # A write over an id not of this admission (named before it, or a worker's): busy.
    foreign = admissions.vet(follower, write(connection=(3 << 40) + 1), allowed, 0)
    assert isinstance(foreign, Refuse) and foreign.error.code == "busy"
    busy = admissions.vet(follower, write(), allowed, followers_core.MAX_FORWARDED)
    assert isinstance(busy, Refuse) and busy.error.code == "busy"
    # Closes: of its own connections only; none of its own: nothing at all.
    closes = msgspec.msgpack.encode(CloseConnections(connections=[(3 << 40) + 1, first + 1]))
    assert admissions.vet(follower, closes, allowed, 0) == Pass(
        msgspec.msgpack.encode(CloseConnections(connections=[first + 1])))
    assert admissions.vet(follower, msgspec.msgpack.encode(CloseConnections(
        connections=[(3 << 40) + 1])), allowed, 0) == Ignore()
    hint = msgspec.msgpack.encode(Suspect(cluster="c1", addr="10.0.0.1:10911", grace_ms=1,
                                          now=1))
    refused = admissions.vet(follower, hint, allowed, 0)
    assert isinstance(refused, Refuse) and refused.error.reply(0) == NoPermission(
        "a follower forwards no Suspect").reply(0)
    assert isinstance(admissions.vet(follower, b"\x01garbage", allowed, 0), Lose)


def test_a_follower_passes_its_connections_on_under_ids_of_its_current_range(monkeypatch):
    ids = FollowerIds()
    with pytest.raises(Busy):  # not admitted yet
        ids.passed_on(7)
    ids.rebase(1000)
    assert [ids.passed_on(7), ids.passed_on(9), ids.passed_on(7)] == [1000, 1001, 1000]
    assert ids.closed([7, 8]) == [1000]  # 8 never wrote: nothing to pass on
    # Admitted again: a new range; what wrote before is given an id of it when it writes
    # again, and the close of one that has not is not passed on (its id was the old range's).
    ids.rebase(5000)
    assert ids.passed_on(9) == 5000 and ids.closed([9, 11]) == [5000]
    monkeypatch.setattr(followers_core, "FOLLOWER_IDS", 3)
    ids.rebase(10)
    assert [ids.passed_on(1), ids.passed_on(2)] == [10, 11]
    with pytest.raises(Busy):  # the range used up: refused, never another's id
        ids.passed_on(3)


# --- the gateway (zns.drivers.followers), in this process over inproc ----------------------


class StubLink:
    """What a gateway uses of its worker's ReplicaLink: the seq applied, and `forward`."""

    def __init__(self, applied: int) -> None:
        self.replica = SimpleNamespace(applied=applied)
        self.forwarded: list[bytes] = []

    def forward(self, request: bytes) -> int:
        self.forwarded.append(request)
        return 1000 + len(self.forwarded)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


class Everyone:
    """Keys that may do everything, on sockets without CURVE."""

    policy = Keys()

    def apply(self, sock: zmq.Socket, domain: str) -> None:
        pass

    def follower_name(self, key: str) -> None:
        return None


class Binder:
    """Binds as the descriptor guard does (inproc, or TCP without SO_REUSEPORT)."""

    def bind(self, sock: zmq.Socket, endpoint: str, *, reuse_port: bool) -> SimpleNamespace:
        sock.bind(endpoint)
        return SimpleNamespace(endpoint=sock.getsockopt(zmq.LAST_ENDPOINT).decode())


def make_gateway(ctx: zmq.Context, applied: int = 5, audited: list | None = None,
                 dumps: Any = None, endpoint: str = "inproc://gateway",
                 ) -> tuple[Gateway, StubLink, Clock]:
    """`dumps()`: the dump in steps a gateway makes (default: two steps, then b"state")."""
    clock = Clock()
    link = StubLink(applied)
    gateway = Gateway(ctx, link, dumps or (lambda: iter([None, None, b"state"])),  # type: ignore[arg-type]
                      worker_range=3, id_bits=40,
                      refuse=lambda error: f"refused: {error.code}: {error}".encode(),
                      audit=lambda body, by: (audited if audited is not None else []).append(
                          (body, by)), clock=clock)
    gateway.bind(Everyone(), Binder(), endpoint)  # type: ignore[arg-type]
    return gateway, link, clock


def follower(ctx: zmq.Context, rcvhwm: int = 1000) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.connect("inproc://gateway")
    return sock


def turn(gateway: Gateway, clock: Clock) -> None:
    """A turn of the worker's loop, and the next ones while a dump is being made in steps."""
    now = int(clock.now * 1000)
    gateway.run({}, now, now + 5)
    for _ in range(10):
        if gateway.next_deadline(now) != now:
            return
        gateway.run({}, now, now + 5)
    raise AssertionError("a dump that does not end")


def received(sock: zmq.Socket, wait_ms: int = 200) -> list:
    messages = []
    while sock.poll(wait_ms):
        messages.append(decode_to_worker(sock.recv()))
        wait_ms = 50
    return messages


def test_a_follower_is_admitted_with_the_state_then_sent_every_command(ctx):
    gateway, link, clock = make_gateway(ctx, applied=5)
    sock = follower(ctx)
    sock.send(encode(Forward(9, write("b9"))))  # a first message only asks to be admitted
    turn(gateway, clock)
    joined, state = received(sock)
    assert joined == Joined(follower_ids(3, 1, 40)) and link.forwarded == []
    assert (state.seq, state.dump) == (5, b"state")
    gateway.applied(6, b"c6", [b"route/T\x00", b"event"])
    gateway.whole(b"figures")
    apply, whole = received(sock)
    # A follower is a domain of its own: the command's fence is its own seq.
    assert apply == Apply(6, b"c6", 6, [b"route/T\x00", b"event"])
    assert whole == Whole(b"figures")
    sock.send(encode(Ack(6)))
    turn(gateway, clock)
    assert gateway.primary.applied(1) == 6
    # The worker's replica loads a new state: the follower is sent it, in the same range.
    gateway.loaded(40)
    turn(gateway, clock)
    joined, state = received(sock)
    assert joined == Joined(follower_ids(3, 1, 40)) and state.seq == 40
    gateway.applied(41, b"c41", None)
    assert received(sock) == [Apply(41, b"c41", 41, None)]


def test_a_new_state_of_the_worker_gives_up_the_dump_of_the_old_one(ctx):
    made: list[int] = []

    def dumps() -> Any:  # each dump names the state it was made of
        made.append(len(made) + 1)
        return iter([None, None, b"state %d" % made[-1]])

    gateway, _, clock = make_gateway(ctx, dumps=dumps)
    sock = follower(ctx)
    sock.send(encode(Report(b"")))
    now = int(clock.now * 1000)
    gateway.run({}, now, now + 5)  # admitted: the dump of the state at seq 5 begins
    gateway.run({}, now, now + 5)  # one step of it
    gateway.loaded(40)  # the worker's replica is replaced meanwhile
    turn(gateway, clock)
    messages = received(sock)
    states = [m for m in messages if type(m) is State]
    assert [type(m) for m in messages].count(Joined) == 2
    assert [(m.seq, m.dump) for m in states] == [(40, b"state 2")]  # never the old state's


def test_a_write_a_follower_forwards_is_answered_once_this_worker_applied_it(ctx):
    audited: list = []
    gateway, link, clock = make_gateway(ctx, audited=audited)
    sock = follower(ctx)
    sock.send(encode(Report(b"")))
    turn(gateway, clock)
    received(sock)
    sock.send(encode(Forward(1, write("b1"))))
    sock.send(encode(Forward(2, msgspec.msgpack.encode(Suspect(
        cluster="c1", addr="10.0.0.1:10911", grace_ms=1, now=1)))))
    time.sleep(0.1)
    turn(gateway, clock)
    assert link.forwarded == [write("b1")]
    assert received(sock) == [Answer(2, 5, b"refused: no_permission: a follower forwards no "
                                           b"Suspect")]
    gateway.applied(6, b"c6", None)  # b1's command
    assert gateway.answered(1001, b"reply1")
    assert not gateway.answered(77, b"a worker's own")  # not a follower's: the worker's
    assert received(sock)[-1] == Answer(1, 6, b"reply1")  # readable once it applied 6
    assert audited == [(b"reply1", "follower key None")]  # a registration may displace one


def test_a_follower_that_garbles_or_asks_for_states_too_often_is_dropped(ctx):
    gateway, _, clock = make_gateway(ctx)
    garbler, asker = follower(ctx), follower(ctx)
    for sock in (garbler, asker):
        sock.send(encode(Report(b"")))
        time.sleep(0.05)
        turn(gateway, clock)
        received(sock)
    garbler.send(b"\x01garbage")
    for _ in range(STATES_PER_WINDOW + 1):
        asker.send(encode(Resync(5)))
    time.sleep(0.1)
    turn(gateway, clock)
    assert gateway.primary.workers == [] and gateway.admissions.joined == {}
    # Dropped, each is admitted again once READMIT_MS have passed and it speaks again.
    garbler.send(encode(Report(b"")))
    turn(gateway, clock)
    assert received(garbler) == []
    clock.now += READMIT_MS / 1000 + 0.1
    garbler.send(encode(Report(b"")))
    turn(gateway, clock)
    assert received(garbler)[0] == Joined(follower_ids(3, 1, 40))  # its range again


def test_a_follower_that_reads_nothing_is_dropped(ctx, monkeypatch):
    monkeypatch.setattr(followers, "QUEUED_MESSAGES", 4)
    gateway, _, clock = make_gateway(ctx)
    sock = follower(ctx, rcvhwm=1)
    sock.send(encode(Report(b"")))
    turn(gateway, clock)
    for seq in range(6, 200):
        gateway.applied(seq, b"c", None)
        if not gateway.primary.workers:
            break
    assert gateway.primary.workers == []  # dropped, not queued for without end


def test_a_gateway_shows_each_follower_since_its_admission_and_how_far_behind_it_is(ctx):
    gateway, _, clock = make_gateway(ctx, applied=5)
    sock = follower(ctx)
    sock.send(encode(Report(b"")))
    turn(gateway, clock)  # admitted at 100 s
    received(sock)
    assert gateway.shown == [FollowerStatus(name="key None", key="", admitted_ms=0, applied=5,
                                            lag_commands=0, lag_ms=0)]
    clock.now = 102.0
    gateway.applied(6, b"c6", None)
    gateway.applied(7, b"c7", None)
    received(sock)
    clock.now = 102.5
    turn(gateway, clock)  # shown again: a second passed since it was made
    assert gateway.shown == [FollowerStatus(name="key None", key="", admitted_ms=2_500,
                                            applied=5, lag_commands=2, lag_ms=500)]
    sock.send(encode(Ack(7)))
    time.sleep(0.05)
    clock.now = 102.7
    turn(gateway, clock)  # within the second: not made again
    assert gateway.shown[0].lag_commands == 2
    clock.now = 104.0
    turn(gateway, clock)
    assert gateway.shown == [FollowerStatus(name="key None", key="", admitted_ms=4_000,
                                            applied=7, lag_commands=0, lag_ms=0)]
    sock.send(b"\x01garbage")  # dropped: shown at once
    time.sleep(0.05)
    turn(gateway, clock)
    assert gateway.shown == []


def test_a_gateway_remakes_the_line_of_a_follower_that_says_nothing_within_a_second(ctx):
    # Its lines were remade only when a follower's message woke the gateway: one that stopped
    # (stopped reading and acknowledging) showed no lag until it was dropped, 10 s later.
    gateway, _, clock = make_gateway(ctx, applied=5)
    now = int(clock.now * 1000)
    assert gateway.next_deadline(now) is None  # no follower: nothing to remake, no wake-up
    sock = follower(ctx)
    sock.send(encode(Report(b"")))
    turn(gateway, clock)
    received(sock)
    gateway.applied(6, b"c6", None)  # the follower acknowledges nothing, and says nothing
    now = int(clock.now * 1000)
    deadline = gateway.next_deadline(now)
    assert deadline is not None and deadline <= now + followers.REPORT_INTERVAL_MS
    clock.now += 1.5
    now = int(clock.now * 1000)
    assert gateway.next_deadline(now) <= now
    gateway.run({}, now, now + 5)
    assert (gateway.shown[0].lag_commands, gateway.shown[0].lag_ms) == (1, 1_500)


def tcp_buffer_bytes() -> int:
    """The most a TCP connection's two kernel buffers hold (Linux's autotuning maxima)."""
    def largest(name: str) -> int:
        return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return largest("tcp_rmem") + largest("tcp_wmem")


def test_a_follower_that_floods_its_gateway_is_held_back_within_a_bound(ctx):
    """docs/operations.md: libzmq stops reading a follower at 64 queued messages, and TCP
    pushes back on it. A gateway that reads nothing (its loop busy: here never run) holds at
    most that many of a flooding follower's messages; the follower's sends stall after its
    own queue and the kernel's buffers fill, and go on once the gateway reads."""
    gateway, _, clock = make_gateway(ctx, endpoint="tcp://127.0.0.1:*")
    sndhwm, size = 8, 256 * 1024
    # What can be under way: the gateway's queue, the sender's, both kernel buffers, and a
    # message being decoded, encoded or in libzmq's batch buffer at each end; half again.
    bound = (followers.RECEIVED_MESSAGES + sndhwm + tcp_buffer_bytes() // size + 4) * 3 // 2
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # nothing queued before the connection is made
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sock.connect(gateway.sock.getsockopt(zmq.LAST_ENDPOINT).decode())
    try:
        assert monitor.poll(int(LOADED_DEADLINE * 1000)), "no connection"
        body = encode(Report(b"x" * size))
        sent, stalled_since = 0, None
        deadline = time.monotonic() + LOADED_DEADLINE
        while sent <= bound and time.monotonic() < deadline:
            try:
                sock.send(body, zmq.DONTWAIT)
                sent, stalled_since = sent + 1, None
            except zmq.Again:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 2.0:
                    break  # held back: two seconds without a message taken
                time.sleep(0.01)
        assert stalled_since is not None and sent <= bound, (sent, bound)
        assert sent > sndhwm  # past its own queue: the gateway's libzmq and TCP took some
        # The gateway reads again (one turn of its loop: it admits the follower, and a
        # follower's figures change nothing): the follower's sends go on.
        turn(gateway, clock)
        assert len(gateway.admissions.joined) == 1

        def taken() -> bool:
            try:
                sock.send(body, zmq.DONTWAIT)
            except zmq.Again:
                return False
            return True

        wait_for(taken, LOADED_DEADLINE)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


# --- NameServers and followers as processes ---------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> SimpleNamespace:
    """The NameServer's key pair, a broker's, a listed follower's and an unlisted one's."""
    listed, brokers = tmp_path / "followers", tmp_path / "brokers"
    server_public, server_secret = write_keypair(tmp_path, "server")
    follower_public, follower_secret = write_keypair(tmp_path, "follower")
    _, stranger_secret = write_keypair(tmp_path, "stranger")
    broker_public, broker_secret = write_keypair(tmp_path, "broker")
    listed.mkdir()
    brokers.mkdir()
    (listed / "follower.key").write_bytes(Path(follower_public).read_bytes())
    (brokers / "broker.key").write_bytes(Path(broker_public).read_bytes())
    return SimpleNamespace(server=str(server_public), server_secret=str(server_secret),
                           follower=str(follower_secret), stranger=str(stranger_secret),
                           broker=str(broker_secret), listed=str(listed), brokers=str(brokers))


def start_nameserver(process_server, keys: SimpleNamespace, *args: str) -> tuple[ProcessServer, str]:
    """A NameServer with followers (one worker unless `args` say otherwise); the endpoint."""
    server = process_server("--curve-secret", keys.server_secret, "--brokers-keys", keys.brokers,
                            "--followers", "tcp://127.0.0.1:*", "--followers-keys", keys.listed,
                            *args)
    line = wait_for(lambda: server.line("feeding followers on", required=False), LOADED_DEADLINE)
    return server, line.rsplit(" ", 1)[1]


def start_follower(process_server, tmp_path: Path, endpoint: str, keys: SimpleNamespace,
                   keypair: str, *args: str) -> ProcessServer:
    """A follower, stopped with the test (process_server's cleanup)."""
    directory = tmp_path / f"follower-{time.monotonic_ns()}"
    directory.mkdir()
    return process_server("--follow", endpoint, "--follow-server-key", keys.server,
                          "--follow-keypair", keypair, *args, kv_path=directory / "kv.json")


def curve_ctx(keys: SimpleNamespace, keypair: str | None = None) -> zmq.Context:
    ctx = zmq.Context()
    apply_client_keys(ctx, client_keys(keys.server, keypair))
    return ctx


def remoting_of(server: ProcessServer) -> str:
    """The HOST:PORT of a server's RocketMQ remoting listener, from its log."""
    return server.line("RocketMQ remoting listener on ").rsplit(" ", 1)[1]


def remoting_route(endpoint: str, topic: str) -> RemotingCommand:
    client = Client(endpoint)
    try:
        return client.call(RemotingCommand(code=105, version=479, ext_fields={"topic": topic}))
    finally:
        client.close()


def route_of(peer: Peer, topic: str):
    reply = peer.call("get_route", topic=topic)
    return None if isinstance(reply, schema.Error) else reply


def test_a_follower_serves_its_nameservers_routes_and_events_and_takes_no_write(
        process_server, keys, tmp_path):
    main, endpoint = start_nameserver(process_server, keys, "--metrics", "127.0.0.1:0")
    broker_ctx = curve_ctx(keys, keys.broker)
    at_main = Peer(main.router, None, broker_ctx)
    assert not isinstance(at_main.call("register_broker", **register_fields(
        broker_name="b1", topics={"T1": {}})), schema.Error)
    follower_server = start_follower(process_server, tmp_path, endpoint, keys, keys.follower,
                                     "--remoting", "127.0.0.1:0")
    ctx = zmq.Context()
    try:
        at_follower = Peer(follower_server.router, follower_server.pub, ctx)
        assert route_of(at_follower, "T1").route.brokers[0].broker_name == "b1"  # from its state
        answer = remoting_route(remoting_of(follower_server), "T1")  # both protocols
        assert answer.code == 0 and b'"brokerName":"b1"' in answer.body
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"route/T2")
        sub.connect(follower_server.pub)
        time.sleep(0.3)
        assert not isinstance(at_main.call("register_broker", **register_fields(
            broker_name="b2", addr="10.0.0.2:10911", topics={"T2": {}})), schema.Error)
        assert sub.poll(int(LOADED_DEADLINE * 1000)), "no event from the follower"
        channel, body = sub.recv_multipart()
        event = schema.decode_event(body)
        # The event came from the follower, and a pull there after it is not older (§7).
        assert channel == b"route/T2\x00" and route_of(at_follower, "T2").revision >= event.revision
        refused = at_follower.call("register_broker", **register_fields(
            broker_name="b3", addr="10.0.0.3:10911", topics={"T3": {}}))
        assert isinstance(refused, schema.Error) and refused.code == "no_permission"
        assert "read replica" in refused.message
        assert route_of(at_main, "T3") is None
        broker = Client(remoting_of(follower_server))
        try:
            assert broker.call(register_cmd("b4", topics=("T4",))).code != 0
        finally:
            broker.close()
        assert route_of(at_main, "T4") is None
        status = at_follower.call("status")
        assert status.epoch == at_main.call("status").epoch
        assert_idle(follower_server.proc.pid, "a follower")
        worker = int(main.line("worker 1 started (pid").split("pid ")[1].split(",")[0])
        assert_idle(worker, "a worker feeding a follower")
    finally:
        ctx.destroy(linger=0)
        broker_ctx.destroy(linger=0)
    assert main.line("followers: admitted follower (1 following")
    port = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/", main.output())[0]
    wait_for(lambda: 'zns_worker_followers{worker="1"} 1.0' in get(
        f"http://127.0.0.1:{port}/metrics")[1])  # the NameServer's view of its followers


def test_the_nameservers_status_lists_each_workers_followers(process_server, keys, tmp_path):
    main, endpoint = start_nameserver(process_server, keys, "--workers", "2",
                                      "--metrics", "127.0.0.1:0")
    broker_ctx = curve_ctx(keys, keys.broker)
    at_main = Peer(main.router, None, broker_ctx)
    try:
        start_follower(process_server, tmp_path, endpoint, keys, keys.follower)

        def fed() -> dict[int, list[FollowerStatus]] | None:
            lines = {w.worker: w.followers for w in at_main.call("status").workers}
            return lines if len(lines) == 2 and sum(map(len, lines.values())) == 1 else None

        # Every worker has its line, and the one that admitted the follower names it there.
        shown = wait_for(fed, LOADED_DEADLINE)
        gateway = next(w for w, followers_of in shown.items() if followers_of)
        assert [f for w, f in shown.items() if w != gateway] == [[]]
        public = zmq.auth.load_certificate(Path(keys.listed) / "follower.key")[0].decode()
        assert (shown[gateway][0].name, shown[gateway][0].key) == ("follower", public)
        assert not isinstance(at_main.call("register_broker", **register_fields(
            topics={"T1": {}})), schema.Error)
        seq = at_main.call("status").workers[gateway - 1].applied

        def caught_up() -> FollowerStatus | None:
            status = at_main.call("status").workers[gateway - 1]
            line = status.followers[0] if status.followers else None
            return line if line is not None and line.applied >= seq and not line.lag_commands \
                else None

        line = wait_for(caught_up, LOADED_DEADLINE)
        assert line.lag_ms == 0 and line.admitted_ms > 0
        shown_text = subprocess.run(
            [sys.executable, "-m", "zns", "status", "--ns", main.router, "--server-key",
             keys.server], capture_output=True, text=True, timeout=60).stdout
        table = shown_text.split("FOLLOWER", 1)[1].splitlines()
        assert table[0].split() == ["APPLIED", "LAG", "LAG_MS", "ADMITTED"]
        assert table[1].split()[1:3] == [str(gateway), "follower"]
        port = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/", main.output())[0]
        wait_for(lambda: f'zns_worker_follower_lag_commands{{follower="follower",worker='
                         f'"{gateway}"}} 0.0' in get(f"http://127.0.0.1:{port}/metrics")[1])
    finally:
        broker_ctx.destroy(linger=0)


def test_a_follower_with_writes_reads_its_own_and_checks_keys_as_the_nameserver(
        process_server, keys, tmp_path):
    main, endpoint = start_nameserver(process_server, keys)
    follower_server = start_follower(process_server, tmp_path, endpoint, keys, keys.follower,
                                     "--follow-writes", "--curve-secret", keys.server_secret,
                                     "--brokers-keys", keys.brokers, "--remoting", "127.0.0.1:0")
    broker_ctx, stranger_ctx = curve_ctx(keys, keys.broker), curve_ctx(keys)
    try:
        at_follower = Peer(follower_server.router, None, broker_ctx)
        # The follower's own key is no broker key at the NameServer: its writes are refused
        # there, whatever its clients' keys are at the follower.
        refused = at_follower.call("register_broker", **register_fields(topics={"W": {}}))
        assert isinstance(refused, schema.Error) and refused.code == "no_permission"
        assert "refused its follower's write" in refused.message
        (Path(keys.brokers) / "follower.key").write_bytes(
            (Path(keys.follower).parent / "follower.key").read_bytes())
        main.proc.send_signal(signal.SIGHUP)  # the keys read again

        def registered() -> bool:
            return not isinstance(at_follower.call("register_broker", **register_fields(
                topics={"W": {}})), schema.Error)

        wait_for(registered, LOADED_DEADLINE)
        for n in range(20):  # each read right after its write: read-your-writes
            reply = at_follower.call("register_broker", **register_fields(
                broker_name=f"b{n}", addr=f"10.0.1.{n}:10911", topics={f"W{n}": {}}))
            assert not isinstance(reply, schema.Error), reply
            assert route_of(at_follower, f"W{n}") is not None
        assert route_of(Peer(main.router, None, broker_ctx), "W19") is not None
        # A key that is no broker's is refused here, as the NameServer would refuse it.
        refused = Peer(follower_server.router, None, stranger_ctx).call(
            "register_broker", **register_fields(broker_name="x", topics={"X": {}}))
        assert isinstance(refused, schema.Error) and refused.code == "no_permission"
        # A RocketMQ broker registered through the follower is tied to its connection there
        # (an id of the follower's own range): its close removes it, as on the NameServer.
        broker = Client(remoting_of(follower_server))
        assert broker.call(register_cmd("rb", topics=("R1",))).code == 0
        assert remoting_route(remoting_of(follower_server), "R1").code == 0
        at_main = Peer(main.router, None, broker_ctx)
        assert route_of(at_main, "R1") is not None
        # Its gateway dies with a write of the follower's in flight: stopped first (every
        # thread of it: it reads nothing more), sent the write, then killed.
        worker = int(main.line("worker 1 started (pid").split("pid ")[1].split(",")[0])
        os.kill(worker, signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
                 == "T")
        lost = {f"Lost{n:04d}{'x' * 60}": {} for n in range(5000)}
        in_flight = Peer(follower_server.router, None, broker_ctx)
        in_flight.send_raw(schema.encode({"op": "register_broker", "id": 7, **register_fields(
            broker_name="lost", addr="10.0.2.1:10911", topics=lost)}))
        # The follower passed it on: the bytes wait unread at the stopped gateway (its
        # figures, a second's worth at a time, are far fewer).
        wait_for(lambda: unread_bytes(int(endpoint.rsplit(":", 1)[1])) > 48 * 1024,
                 LOADED_DEADLINE)
        os.kill(worker, signal.SIGKILL)
        # It is answered busy once the replacement admits the follower (not after the 30 s a
        # write waits for its answer), never with an outcome; this one was not applied.
        answer = schema.decode_reply(in_flight.recv_raw(LOADED_DEADLINE)[-1])
        assert isinstance(answer, schema.Error) and answer.code == "busy", answer
        assert follower_server.line("writes in flight answered busy")
        # The follower is admitted by the replacement, with a new range of ids; the broker's
        # next registration over the same connection is tied to one of it.

        def registered_again() -> bool:
            return broker.call(register_cmd("rb", topics=("R1", "R2"))).code == 0

        wait_for(registered_again, LOADED_DEADLINE, interval=0.2)
        wait_for(lambda: route_of(Peer(main.router, None, broker_ctx), "R2") is not None,
                 LOADED_DEADLINE)
        assert route_of(Peer(main.router, None, broker_ctx), next(iter(lost))) is None
        broker.close()
        wait_for(lambda: route_of(Peer(main.router, None, broker_ctx), "R1") is None,
                 LOADED_DEADLINE)
    finally:
        broker_ctx.destroy(linger=0)
        stranger_ctx.destroy(linger=0)


def test_a_follower_message_past_the_bound_closes_its_connection_and_nothing_else(
        process_server, keys, tmp_path):
    """docs/operations.md: a message from a follower is at most the NameServer's largest
    request + 64 KiB; a longer one closes its connection (libzmq's MAXMSGSIZE, CURVE's framing
    counted), while the worker serves its other followers and its clients."""
    probe_public, probe_secret = write_keypair(tmp_path, "probe")
    (Path(keys.listed) / "probe.key").write_bytes(Path(probe_public).read_bytes())
    main, endpoint = start_nameserver(process_server, keys)
    follower_server = start_follower(process_server, tmp_path, endpoint, keys, keys.follower)
    broker_ctx, ctx = curve_ctx(keys, keys.broker), zmq.Context()
    at_main = Peer(main.router, None, broker_ctx)
    limit = max(DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_FRAME_BYTES) + FORWARD_MARGIN_BYTES
    overhead = len(encode(Forward(1, bytes(limit)))) - limit  # a forwarded write's fields
    longest = encode(Forward(1, bytes(limit - overhead)))
    assert len(longest) == limit
    probes = []

    def admitted_probe() -> tuple[zmq.Socket, zmq.Socket]:
        """A DEALER of a listed key, as a follower's (followers.connect), admitted."""
        sock = followers.connect(ctx, endpoint, keys.server, probe_secret)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        probes.append((sock, monitor))
        sock.send(encode(Report(b"")))
        assert sock.poll(int(LOADED_DEADLINE * 1000)), "not admitted"
        assert type(decode_to_worker(sock.recv())) is Joined
        return sock, monitor

    def fed() -> list[str]:
        (worker,) = at_main.call("status").workers
        return [line.name for line in worker.followers]

    try:
        wait_for(lambda: fed() == ["follower"], LOADED_DEADLINE)
        # The longest message the bound lets in is read (and, not being a write, drops the
        # follower that sent it: the gateway read it); its connection stays.
        sock, monitor = admitted_probe()
        sock.send(longest)
        wait_for(lambda: main.line("one dropped: an unreadable forwarded command",
                                   required=False), LOADED_DEADLINE)
        assert not monitor.poll(500), "the longest message allowed closed its connection"
        # One byte more: libzmq closes the connection as it reads the message's size, before
        # anything reaches the gateway; the gateway then drops that follower as gone at its
        # next send to it (the figures it passes on each second), and holds nothing of it.
        sock, monitor = admitted_probe()
        wait_for(lambda: fed() == ["follower", "probe"], LOADED_DEADLINE)
        sock.send(encode(Forward(1, bytes(limit - overhead + 1))))
        assert monitor.poll(int(LOADED_DEADLINE * 1000)), "a message past the bound was read"
        wait_for(lambda: fed() == ["follower"], LOADED_DEADLINE)
        assert main.output().count("one dropped: an unreadable") == 1  # the first probe's only
        assert main.line("followers: one dropped: gone")
        # Its other follower and its clients noticed nothing; the worker never died.
        assert not isinstance(at_main.call("register_broker", **register_fields(
            topics={"After": {}})), schema.Error)
        at_follower = Peer(follower_server.router, None, ctx)
        wait_for(lambda: route_of(at_follower, "After") is not None, LOADED_DEADLINE)
        assert route_of(at_main, "After") is not None
        assert main.output().count("worker 1 started") == 1 and main.proc.poll() is None
    finally:
        for sock, monitor in probes:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
        ctx.destroy(linger=0)
        broker_ctx.destroy(linger=0)


def unread_bytes(port: int) -> int:
    """Bytes the kernel holds unread on the accepted side of connections to `port`."""
    held = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # established
            held += int(fields[4].split(":")[1], 16)
    return held


def test_an_unlisted_key_is_not_admitted(process_server, keys, tmp_path):
    main, endpoint = start_nameserver(process_server, keys)
    log = tmp_path / "stranger.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--follow", endpoint, "--follow-server-key",
             keys.server, "--follow-keypair", keys.stranger, "--router", "tcp://127.0.0.1:*",
             "--pub", "tcp://127.0.0.1:*"], stdout=out, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("ZNS_")})
    try:
        wait_for(lambda: main.line("refused a follower's CURVE handshake", required=False),
                 LOADED_DEADLINE)
        wait_for(lambda: "no state from" in log.read_text(), LOADED_DEADLINE)
        assert proc.poll() is None and "serving requests" not in log.read_text()
        assert not main.line("followers: admitted", required=False)
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_follower_follows_the_replacement_of_its_gateway_and_refuses_once_alone(
        process_server, keys, tmp_path):
    main, endpoint = start_nameserver(process_server, keys)
    broker_ctx, ctx = curve_ctx(keys, keys.broker), zmq.Context()
    assert not isinstance(Peer(main.router, None, broker_ctx).call(
        "register_broker", **register_fields(broker_name="b0", addr="10.0.0.9:10911",
                                             heartbeat_timeout_ms=600_000,
                                             topics={"Before": {}})), schema.Error)
    follower_server = start_follower(process_server, tmp_path, endpoint, keys, keys.follower)
    stop, answered, failed = threading.Event(), [], []

    def read() -> None:  # the follower's clients, all along: they must see nothing of it
        reader = Peer(follower_server.router, None, ctx)
        while not stop.is_set():
            reply = reader.call("get_route", topic="Before")
            (failed if isinstance(reply, schema.Error) else answered).append(reply)

    reading = threading.Thread(target=read)
    try:
        at_follower = Peer(follower_server.router, None, ctx)
        wait_for(lambda: route_of(at_follower, "Before") is not None)
        reading.start()
        worker = int(main.line("worker 1 started (pid").split("pid ")[1].split(",")[0])
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: "worker 1 started" in main.output().split("died")[-1], LOADED_DEADLINE)
        # A change made after the replacement reaches the follower: it was admitted there.
        def register() -> bool:
            try:
                reply = Peer(main.router, None, broker_ctx).call("register_broker", timeout=1.0,
                                                                 **register_fields(topics={"After": {}}))
            except AssertionError:  # no answer yet
                return False
            return not isinstance(reply, schema.Error)

        wait_for(register, LOADED_DEADLINE)
        wait_for(lambda: route_of(at_follower, "After") is not None, LOADED_DEADLINE)
        assert route_of(at_follower, "After").route.brokers[0].broker_name == "broker-a"
        wait_for(lambda: follower_server.line("loaded the state at seq", required=False)
                 and follower_server.output().count("admitted again") >= 1)
        stop.set()
        reading.join(LOADED_DEADLINE)
        # Through its gateway's death and its admission by the replacement, every read was
        # answered with the route: the follower served from its replica all along.
        assert len(answered) > 50 and failed == [], failed[:3]
        # The whole NameServer gone: the follower answers `busy` once it heard nothing for
        # SILENCE_MS, rather than routes that may have expired since.
        main.proc.kill()
        main.proc.wait(15)

        def refused() -> bool:
            reply = at_follower.call("get_route", topic="After")
            return isinstance(reply, schema.Error) and reply.code == "busy"

        wait_for(refused, followers.SILENCE_MS / 1000 + LOADED_DEADLINE)
        assert follower_server.proc.poll() is None  # it waits for its NameServer to come back
        # `status` still answers, and says whom it follows and how long it has heard nothing.
        status = at_follower.call("status")
        assert (status.follows, status.silent_ms > followers.SILENCE_MS) == (endpoint, True)
        assert status.worker is UNSET and status.workers is UNSET  # a single process's
        shown = subprocess.run([sys.executable, "-m", "zns", "status", "--ns",
                                follower_server.router], capture_output=True, text=True,
                               timeout=60)
        assert "FOLLOWS" in shown.stdout and endpoint in shown.stdout, shown
    finally:
        stop.set()
        if reading.is_alive():
            reading.join(LOADED_DEADLINE)
        ctx.destroy(linger=0)
        broker_ctx.destroy(linger=0)



def test_what_a_follower_cannot_send_waits_within_a_bound(ctx, monkeypatch, caplog):
    monkeypatch.setattr(followers, "MAX_MESSAGE_BYTES", 100)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.connect("tcp://127.0.0.1:1")  # no gateway there: libzmq takes nothing
    channel = followers.NetworkChannel(sock)
    channel.send(b"a" * 60)
    assert not channel.flush() and channel.pending == 60
    channel.send(b"b" * 60)  # past the bound: what waited is dropped, never the follower
    assert not channel.flush() and channel.pending == 60
    assert "60 bytes for the NameServer dropped" in caplog.text
    sock.close()


@pytest.mark.timeout(SCRIPT_DEADLINE + 40)
def test_the_followers_benchmark_runs_and_writes_its_figures(tmp_path):
    """bench/followers.py (by hand, not in `make bench`): a --quick run, every figure."""
    check_script("followers", tmp_path, SCRIPT_DEADLINE)


def test_the_followers_benchmark_relay_passes_every_byte_in_order_each_way_after_its_delay():
    """bench/followers.py's link with a round trip (bench/harness.py's DelayRelay): 4 MiB
    come out as they went in, none sooner than the delay, and an answer the other way
    takes the delay again."""
    delay = 0.05
    payload = os.urandom(4 << 20)  # many chunks of the relay's reads
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            DelayRelay(f"tcp://127.0.0.1:{listener.getsockname()[1]}", delay) as relay:
        host, port = relay.endpoint.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            sent = time.monotonic()
            sender = threading.Thread(target=client.sendall, args=(payload,))
            sender.start()
            server, _ = listener.accept()
            with server:
                server.settimeout(10)
                received = bytearray(server.recv(1 << 20))
                first = time.monotonic()
                while len(received) < len(payload):
                    chunk = server.recv(1 << 20)
                    assert chunk, f"the relay closed after {len(received)} bytes"
                    received += chunk
                sender.join(10)
                assert first - sent >= delay
                assert received == payload
                answered = time.monotonic()
                server.sendall(b"answer")
                assert client.recv(16) == b"answer"
                assert time.monotonic() - answered >= delay


# --- the differential: a follower reads and publishes as its NameServer does --------------


READ_OPS = frozenset({"get_route", "get_routes", "get_cluster_info", "get_topics", "snapshot",
                      "kv_list", "kv_get"})
SKIPPED_OPS = frozenset({"expiry", "large_register", "status"})  # not this test's concern


def comparable(raw: bytes) -> Any:
    """A reply as plain data, without the ages of brokers' last heartbeats (each server
    reads its clock when it answers)."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "last_heartbeat_ms"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(msgspec.msgpack.decode(raw))


def events_until_hb(sub: zmq.Socket, into: list, revision: int = 0) -> None:
    """Every event `sub` has until an `hb` at `revision` or later: the events of every
    revision up to the hb's come before it (the stream is in order, §7)."""
    deadline = time.monotonic() + LOADED_DEADLINE
    while time.monotonic() < deadline:
        if not sub.poll(100):
            continue
        channel, body = sub.recv_multipart()
        if channel == schema.HB_CHANNEL:
            if schema.decode_event(body).revision >= revision:
                return
            continue
        into.append((channel, body))
    raise AssertionError(f"no hb at revision {revision} within the deadline")


@pytest.mark.parametrize("seed", [1, 2])
def test_a_follower_answers_and_publishes_byte_for_byte_what_its_nameserver_does(
        process_server, keys, tmp_path, seed):
    """Random ZNS/1 writes (differential.py's names, test_workers_differential's requests)
    at the NameServer; each read asked of both once the follower has reached the
    NameServer's revision, the replies compared; every event of both, byte for byte."""
    main, endpoint = start_nameserver(process_server, keys, "--admins-keys", keys.brokers,
                                      "--workers", "2")
    follower_server = start_follower(process_server, tmp_path, endpoint, keys, keys.follower)
    ctx = curve_ctx(keys, keys.broker)
    plain = zmq.Context()
    try:
        at_main = Peer(main.router, None, ctx)
        at_follower = Peer(follower_server.router, None, plain)
        subs = []
        for pub, context in ((main.pub, ctx), (follower_server.pub, plain)):
            sub = context.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub)
            events_until_hb(sub, [])  # subscribed: what comes from here on is compared
            subs.append(sub)
        rnd = random.Random(seed)
        gen = rd.Generator(random.Random(seed), f"f{seed}x", seed, explore=True, expiry=False)
        writes = reads = 0
        for _ in range(300):
            fields = zns1_operation(rnd, gen)
            op = fields["op"]
            if op in SKIPPED_OPS:
                continue
            fields.pop("held", None)
            if op not in READ_OPS:
                at_main.call(op, **{k: v for k, v in fields.items() if k != "op"})
                writes += 1
                continue
            # The same answer once the follower has applied what the worker has: a heartbeat
            # changes no revision, so the revision alone cannot say when that is.
            body = schema.encode({"op": op, "id": 1, **{k: v for k, v in fields.items()
                                                         if k != "op"}})

            def same() -> bool:
                at_main.send_raw(body)
                at_follower.send_raw(body)
                return comparable(at_follower.recv_raw()[-1]) == comparable(
                    at_main.recv_raw()[-1])

            wait_for(same, LOADED_DEADLINE, interval=0.01)
            reads += 1
        assert writes > 100 and reads > 50
        revision = at_main.call("status").revision
        wait_for(lambda: at_follower.call("status").revision >= revision)
        streams: list[list] = [[], []]
        for sub, stream in zip(subs, streams):
            events_until_hb(sub, stream, revision)
        assert len(streams[0]) > 50
        assert streams[1] == streams[0]  # channels and bodies, in order, byte for byte
    finally:
        ctx.destroy(linger=0)
        plain.destroy(linger=0)

"""Followers (`--followers`, `--follow`): read replicas on other hosts, fed by the workers.

The gateway (a worker's side) is driven in this process first, over inproc DEALERs that
speak the follower's side of the protocol; then whole NameServers and followers run as
processes, over TCP with CURVE.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import zmq

import differential as rd  # tests/interop (conftest puts it on sys.path)
from helpers import LOADED_DEADLINE, Peer, ProcessServer, register_fields, wait_for
from test_bench_smoke import SCRIPT_DEADLINE, check_script
from test_idle_cpu import assert_idle
from test_remoting_listener import Client, register_cmd
from test_workers_differential import zns1_operation
from zns.core import schema
from zns.core.errors import Busy, NoPermission
from zns.core.state import CloseConnections, Suspect, Write
from zns.core.remoting import RemotingCommand
from zns.core.replication import (
    Ack, Answer, Apply, Forward, Joined, Report, Resync, State, Whole, decode_to_worker, encode,
)
from zns.drivers import followers
from zns.drivers.followers import FOLLOWER_ID_BITS, FollowerIds, Gateway, follower_ids
from zns.drivers.security import apply_client_keys, client_keys, write_keypair

pytestmark = pytest.mark.timeout(120)


# --- the gateway, in this process -----------------------------------------------------------


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
    """Keys that may do everything (the gateway's own checks remain), on sockets without
    CURVE."""

    def __init__(self) -> None:
        self.policy = SimpleNamespace(check=lambda key, request: None)

    def apply(self, sock: zmq.Socket, domain: str) -> None:
        pass

    def follower_name(self, key: str) -> None:
        return None


class Inproc:
    """Binds as the descriptor guard does, without a TCP port."""

    def bind(self, sock: zmq.Socket, endpoint: str, *, reuse_port: bool) -> SimpleNamespace:
        sock.bind(endpoint)
        return SimpleNamespace(endpoint=endpoint)


def make_gateway(ctx: zmq.Context, applied: int = 5, clock: Clock | None = None,
                 endpoint: str = "inproc://gateway", audited: list | None = None,
                 keys: Everyone | None = None) -> tuple[Gateway, StubLink, Clock]:
    clock = clock or Clock()
    link = StubLink(applied)
    gateway = Gateway(ctx, link, lambda: b"state", worker_range=3, id_bits=40,  # type: ignore[arg-type]
                      refuse=lambda error: f"refused: {error.code}: {error}".encode(),
                      audit=lambda body, by: (audited if audited is not None else []).append(
                          (body, by)), clock=clock)
    gateway.bind(keys or Everyone(), Inproc(), endpoint)  # type: ignore[arg-type]
    return gateway, link, clock


def write(name: str = "b1", connection: int | None = None) -> bytes:
    """A forwarded write, as a worker or a follower sends it."""
    return msgspec.msgpack.encode(Write(request=schema.RegisterBroker(
        cluster="c1", broker_name=name, broker_id=0, broker_addr="10.0.0.1:10911",
        topics={}), now=1, connection=connection))


def follower(ctx: zmq.Context, endpoint: str = "inproc://gateway", rcvhwm: int = 1000) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.connect(endpoint)
    return sock


def turn(gateway: Gateway, clock: Clock) -> None:
    now = int(clock.now * 1000)
    gateway.run({}, now, now + 5)


def received(sock: zmq.Socket, wait_ms: int = 200) -> list:
    messages = []
    while sock.poll(wait_ms):
        messages.append(decode_to_worker(sock.recv()))
        wait_ms = 50
    return messages


def test_a_follower_is_admitted_with_a_range_of_ids_and_the_state_then_every_command(ctx):
    gateway, link, clock = make_gateway(ctx, applied=5)
    sock = follower(ctx)
    sock.send(encode(Report(b"")))  # any first message asks to be admitted
    turn(gateway, clock)
    joined, state = received(sock)
    assert joined == Joined(follower_ids(3, 1, 40))
    first = joined.first_connection_id
    # In the upper half of worker range 3's ids: no id the worker numbers its own with.
    assert first >> 40 == 3 and first & (1 << 39) and (first - 1) & ((1 << FOLLOWER_ID_BITS) - 1) == 0
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


def test_a_write_a_follower_forwards_is_answered_once_this_worker_applied_it(ctx, monkeypatch):
    monkeypatch.setattr(followers, "MAX_FORWARDED", 2)
    audited: list = []
    gateway, link, clock = make_gateway(ctx, audited=audited)
    sock = follower(ctx)
    sock.send(encode(Forward(9, write("b9"))))  # a first message only asks to be admitted
    turn(gateway, clock)
    assert [type(m) for m in received(sock)] == [Joined, State] and link.forwarded == []
    for token in (1, 2, 3):
        sock.send(encode(Forward(token, write(f"b{token}"))))
    time.sleep(0.1)
    turn(gateway, clock)
    messages = received(sock)
    assert link.forwarded == [write("b1"), write("b2")]  # the third is over the bound
    assert Answer(3, 5, b"refused: busy: 2 followers' writes wait for the state process; "
                        b"retry") in messages
    gateway.applied(6, b"c6", None)  # b1's command
    assert gateway.answered(1001, b"reply1")
    assert not gateway.answered(77, b"a worker's own")  # not a follower's: the worker's
    messages = received(sock)
    assert messages[-1] == Answer(1, 6, b"reply1")  # readable once the follower applied 6
    assert audited == [(b"reply1", "follower key None")]  # a registration may displace one


def test_a_follower_forwards_only_what_its_key_may_do_over_its_own_connections(ctx):
    keys = Everyone()
    gateway, link, clock = make_gateway(ctx, keys=keys)

    def refuse_every_write(key, request):
        raise NoPermission("register_broker is a broker op and this key is not a broker key")

    sock = follower(ctx)
    sock.send(encode(Report(b"")))
    turn(gateway, clock)
    first = received(sock)[0].first_connection_id
    keys.policy = SimpleNamespace(check=refuse_every_write)
    sock.send(encode(Forward(1, write())))
    sock.send(encode(Forward(2, msgspec.msgpack.encode(Suspect(
        cluster="c1", addr="10.0.0.1:10911", grace_ms=1, now=1)))))
    sock.send(encode(Forward(3, msgspec.msgpack.encode(CloseConnections(
        connections=[first, first + 5])))))
    time.sleep(0.1)
    turn(gateway, clock)
    answers = {m.token: m.reply for m in received(sock) if type(m) is Answer}
    assert answers[1].startswith(b"refused: no_permission: this NameServer refused its "
                                 b"follower's write: register_broker is a broker op")
    assert answers[2] == b"refused: no_permission: a follower forwards no Suspect"
    assert link.forwarded == [msgspec.msgpack.encode(CloseConnections(
        connections=[first, first + 5]))]  # its own connections: passed on
    # Not its own (named before this admission, or a worker's or another follower's, which
    # only a follower lying about its ids would send): never passed on.
    sock.send(encode(Forward(4, msgspec.msgpack.encode(CloseConnections(
        connections=[(3 << 40) + 1, first + 1])))))
    sock.send(encode(Forward(5, write(connection=(3 << 40) + 1))))
    time.sleep(0.1)
    turn(gateway, clock)
    assert link.forwarded[1:] == [msgspec.msgpack.encode(CloseConnections(
        connections=[first + 1]))]
    answers = {m.token: m.reply for m in received(sock) if type(m) is Answer}
    assert answers[5].startswith(b"refused: busy: connection id 3298534883329 is not of")
    assert gateway.primary.workers == [1]


def test_followers_past_the_bound_are_not_admitted_and_a_garbled_one_is_dropped(ctx, monkeypatch):
    monkeypatch.setattr(followers, "MAX_FOLLOWERS", 2)
    gateway, _, clock = make_gateway(ctx)
    socks = [follower(ctx) for _ in range(3)]
    for sock in socks:
        sock.send(encode(Report(b"")))
        time.sleep(0.05)
        turn(gateway, clock)
    assert [bool(received(sock)) for sock in socks] == [True, True, False]
    # An unreadable message drops its sender, and it is not admitted again for a while.
    socks[0].send(b"\x01garbage")
    turn(gateway, clock)
    assert len(gateway.primary.workers) == 1
    socks[0].send(encode(Report(b"")))
    turn(gateway, clock)
    assert received(socks[0]) == [] and len(gateway.primary.workers) == 1
    clock.now += followers.READMIT_MS / 1000 + 0.1
    socks[0].send(encode(Report(b"")))
    turn(gateway, clock)
    joined = received(socks[0])[0]
    assert joined == Joined(follower_ids(3, 1, 40))  # its first range again


def test_a_follower_that_asks_for_states_too_often_is_dropped(ctx):
    gateway, _, clock = make_gateway(ctx)
    sock = follower(ctx)
    sock.send(encode(Report(b"")))
    turn(gateway, clock)
    for _ in range(followers.STATES_PER_WINDOW):  # each answered with a state
        sock.send(encode(Resync(5)))
        turn(gateway, clock)
        assert any(type(message) is State for message in received(sock))
    sock.send(encode(Resync(5)))  # one more within the window: each costs a whole dump
    turn(gateway, clock)
    assert gateway.primary.workers == [] and received(sock) == []


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


def test_a_follower_passes_its_connections_on_under_ids_of_its_current_range(monkeypatch):
    ids = FollowerIds()
    ids.rebase(1000)
    assert [ids.passed_on(7), ids.passed_on(9), ids.passed_on(7)] == [1000, 1001, 1000]
    assert ids.closed([7, 8]) == [1000]  # 8 never wrote: nothing to pass on
    # Admitted again: a new range; what wrote before is given an id of it when it writes
    # again, and the close of one that has not is not passed on (its id was the old range's).
    ids.rebase(5000)
    assert ids.passed_on(9) == 5000 and ids.closed([9, 11]) == [5000]
    monkeypatch.setattr(followers, "FOLLOWER_IDS", 3)
    ids.rebase(10)
    assert [ids.passed_on(1), ids.passed_on(2)] == [10, 11]
    with pytest.raises(Busy):  # the range used up: refused, never another's id
        ids.passed_on(3)


def test_a_new_state_of_the_worker_admits_its_followers_again_with_it(ctx):
    gateway, _, clock = make_gateway(ctx)
    sock = follower(ctx)
    sock.send(encode(Report(b"")))
    turn(gateway, clock)
    received(sock)
    gateway.loaded(40)
    joined, state = received(sock)
    assert joined == Joined(follower_ids(3, 1, 40)) and state.seq == 40
    gateway.applied(41, b"c41", None)
    assert received(sock) == [Apply(41, b"c41", 41, None)]


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
    main, endpoint = start_nameserver(process_server, keys)
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
    assert main.line("followers: admitted one")


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
        # Its gateway dies: the follower is admitted by the replacement, with a new range of
        # ids; the broker's next registration over the same connection is tied to one of it.
        worker = int(main.line("worker 1 started (pid").split("pid ")[1].split(",")[0])
        os.kill(worker, signal.SIGKILL)

        def registered_again() -> bool:
            return broker.call(register_cmd("rb", topics=("R1", "R2"))).code == 0

        wait_for(registered_again, LOADED_DEADLINE, interval=0.2)
        wait_for(lambda: route_of(Peer(main.router, None, broker_ctx), "R2") is not None,
                 LOADED_DEADLINE)
        broker.close()
        wait_for(lambda: route_of(Peer(main.router, None, broker_ctx), "R1") is None,
                 LOADED_DEADLINE)
    finally:
        broker_ctx.destroy(linger=0)
        stranger_ctx.destroy(linger=0)


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
    follower_server = start_follower(process_server, tmp_path, endpoint, keys, keys.follower)
    broker_ctx, ctx = curve_ctx(keys, keys.broker), zmq.Context()
    try:
        at_follower = Peer(follower_server.router, None, ctx)
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
        # The whole NameServer gone: the follower answers `busy` once it heard nothing for
        # SILENCE_MS, rather than routes that may have expired since.
        main.proc.kill()
        main.proc.wait(15)

        def refused() -> bool:
            reply = at_follower.call("get_route", topic="After")
            return isinstance(reply, schema.Error) and reply.code == "busy"

        wait_for(refused, followers.SILENCE_MS / 1000 + LOADED_DEADLINE)
        assert follower_server.proc.poll() is None  # it waits for its NameServer to come back
    finally:
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

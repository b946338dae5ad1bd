"""The remoting listener in a live server: plain sockets and the codec as the client.

Pipelining, the bounds (frame size, unsent replies, connections, idle time),
slow and hostile connections next to well-behaved ones, ZNS/1 events for
remoting brokers, and the `zns serve --remoting` command line.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import Peer, ThreadedServer, served, wait_for
from test_remoting_codec import frame
from zns.core import schema
from zns.core.remoting import FLAG_ONEWAY, FrameDecoder, RemotingCommand, body_crc32, encode_command
from zns.drivers.remoting_listener import RemotingListener

pytestmark = pytest.mark.timeout(90)

REGISTER_VECTOR = "REGISTER_BROKER request"


class Client:
    """One remoting TCP connection; replies decoded with the codec."""

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.decoder = FrameDecoder(64 << 20)
        self.pending: list[RemotingCommand] = []
        self.opaque = 0

    def send(self, cmd: RemotingCommand) -> int:
        self.opaque += 1
        cmd.opaque = self.opaque
        self.sock.sendall(encode_command(cmd))
        return cmd.opaque

    def recv(self, timeout: float = 10.0) -> RemotingCommand:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no reply within timeout")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the server")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def call(self, cmd: RemotingCommand, timeout: float = 10.0) -> RemotingCommand:
        opaque = self.send(cmd)
        reply = self.recv(timeout)
        assert reply.opaque == opaque
        return reply

    def closed_by_server(self, timeout: float = 10.0) -> bool:
        """True once the server closed the connection (EOF or reset), unread replies skipped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not data:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


def cluster_info() -> RemotingCommand:
    return RemotingCommand(code=106, version=479)


def probe(endpoint: str) -> None:
    """A fresh connection gets GET_BROKER_CLUSTER_INFO answered."""
    client = Client(endpoint)
    try:
        assert client.call(cluster_info()).code == 0
    finally:
        client.close()


@pytest.fixture
def rserver(make_server):
    """(server, its listener: None in a split server, whose listeners are in its workers,
    the listener's HOST:PORT)."""
    def make(**overrides: Any) -> tuple[Any, RemotingListener | None, str]:
        srv = make_server(remoting="127.0.0.1:0", **overrides)
        listener = srv.server.remoting if isinstance(srv, ThreadedServer) else None
        return srv, listener, srv.remoting

    return make


def register_cmd(name: str = "broker-a", addr: str = "127.0.0.1:10911",
                 topics: tuple[str, ...] = ("TopicTest",)) -> RemotingCommand:
    table = {t: {"topicName": t, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
             for t in topics}
    body = json.dumps({"topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1}, "topicConfigTable": table}}).encode()
    ext = {"brokerId": "0", "bodyCrc32": str(body_crc32(body)), "clusterName": "DefaultCluster",
           "brokerAddr": addr, "haServerAddr": "", "compressed": "false", "brokerName": name}
    return RemotingCommand(code=103, version=479, ext_fields=ext, body=body)


# --- pipelining ------------------------------------------------------------------------------


@pytest.mark.single_process("counts the listener's sends: socket.send patched in this process")
def test_pipelined_requests_answered_in_order_in_few_sends(rserver, monkeypatch):
    sends = []
    original = socket.socket.send

    def counting_send(self, data, *flags):  # the client sends with sendall only
        sends.append(len(data))
        return original(self, data, *flags)

    monkeypatch.setattr(socket.socket, "send", counting_send)
    srv, listener, endpoint = rserver()
    client = Client(endpoint)
    ops = [RemotingCommand(code=101, version=479, opaque=i,
                           ext_fields={"namespace": "ns", "key": f"k{i}"}) for i in range(1, 201)]
    client.sock.sendall(b"".join(encode_command(c) for c in ops))
    replies = [client.recv() for _ in ops]
    assert [r.opaque for r in replies] == list(range(1, 201))
    assert all(r.code == 22 and f"k{r.opaque}" in r.remark for r in replies)
    assert 1 <= len(sends) <= 20, len(sends)  # replies of one read leave in one send
    client.close()


# --- bad input -------------------------------------------------------------------------------


def test_oversized_frame_closes_only_that_connection(rserver):
    srv, listener, endpoint = rserver(max_message_bytes=1 << 16)
    good = Client(endpoint)
    assert good.call(cluster_info()).code == 0
    bad = Client(endpoint)
    assert bad.call(cluster_info()).code == 0
    bad.sock.sendall(struct.pack(">i", 1 << 16) + b"\0" * 100)  # 4 + 65536 > 65536
    assert bad.closed_by_server()
    assert good.call(cluster_info()).code == 0
    wait_for(lambda: "exceeds the limit" in srv.output())
    # exactly at the limit is still a frame
    edge = Client(endpoint)
    padding = (1 << 16) - len(encode_command(cluster_info()))
    cmd = cluster_info()
    cmd.body = b"x" * padding
    assert len(encode_command(cmd)) == 1 << 16
    assert edge.call(cmd).code == 0


@pytest.mark.parametrize("raw", [
    b"\x00\x00\x00\x02\x00\x00",  # length below 4
    b"\x00\x00\x00\x08\x05\x00\x00\x00\x00\x00\x00\x00",  # serialize type 5
    b"\x00\x00\x00\x08\x00\x00\x00\x04{{{{",  # header that is not JSON
])
def test_unframeable_input_closes_the_connection(rserver, raw):
    srv, listener, endpoint = rserver()
    before = srv.peer().ok("status").revision
    client = Client(endpoint)
    client.sock.sendall(raw)
    assert client.closed_by_server()
    probe(endpoint)
    assert srv.peer().ok("status").revision == before


def test_bad_body_is_a_system_error_and_the_connection_stays(rserver):
    srv, listener, endpoint = rserver()
    client = Client(endpoint)
    cmd = register_cmd()
    cmd.body = b"{not json"
    cmd.ext_fields["bodyCrc32"] = "0"
    reply = client.call(cmd)
    assert reply.code == 1 and "register body" in reply.remark
    cmd = register_cmd()
    cmd.body, cmd.ext_fields["compressed"] = b"\x78\xda garbage", "true"
    cmd.ext_fields["bodyCrc32"] = "0"
    assert client.call(cmd).code == 1
    assert srv.peer().ok("status").brokers == 0
    assert client.call(cluster_info()).code == 0  # same connection


def register_many(endpoint: str, count: int = 30) -> Client:
    """Brokers enough that a GET_BROKER_CLUSTER_INFO reply is ~30 times its request."""
    client = Client(endpoint)
    for i in range(count):
        assert client.call(register_cmd(f"broker-{i}", f"127.0.0.1:{20000 + i}")).code == 0
    assert len(encode_command(client.call(cluster_info()))) > 3000
    return client


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_reader_that_never_reads_is_held_at_the_high_water_mark(rserver):
    srv, listener, endpoint = rserver()
    setup = register_many(endpoint)
    listener.policy.high_water = 64 << 10
    listener.policy.max_unsent = 512 << 10
    hog = Client(endpoint)
    request = encode_command(cluster_info())
    stop = threading.Event()

    def flood() -> None:
        try:
            while not stop.is_set():
                hog.sock.sendall(request * 500)
        except OSError:
            pass  # cut off

    def held() -> list[int]:
        return [len(e.unsent) for e in list(listener.connections.values())
                if len(e.unsent) >= listener.policy.high_water]

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    try:
        # Its requests wait (in TCP's buffers and one read chunk): its replies are not made
        # faster than it reads them (they were: 58 MiB a connection, issue 21 item 4).
        wait_for(lambda: held(), timeout=30)
        for _ in range(10):
            probe(endpoint)  # the loop keeps serving others
            assert all(size < listener.policy.max_unsent for size in held()), held()
            time.sleep(0.05)
        assert listener.cut_off == 0
    finally:
        stop.set()
        hog.close()
        sender.join(10)
    probe(endpoint)
    setup.close()
    wait_for(lambda: not listener.connections)


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_slow_reader_is_paused_not_cut_off(rserver):
    srv, listener, endpoint = rserver()
    setup = register_many(endpoint)
    listener.policy.high_water = 16 << 10
    listener.policy.max_unsent = 1 << 20
    listener.read_chunk = 4096  # ~40 requests, ~120 KB of replies per pass
    client = Client(endpoint)
    count = 5000  # ~15 MB of replies: far more than max_unsent plus the kernel's buffers
    payload = b"".join(encode_command(RemotingCommand(code=106, version=479, opaque=i))
                       for i in range(count))
    sender = threading.Thread(target=client.sock.sendall, args=(payload,), daemon=True)
    sender.start()
    time.sleep(1.0)  # not reading: past high_water the server stops reading this one
    probe(endpoint)
    replies = [client.recv(timeout=30) for _ in range(count)]
    assert [r.opaque for r in replies] == list(range(count))
    sender.join(10)
    assert listener.cut_off == 0
    setup.close()


# --- connections ------------------------------------------------------------------------------


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_max_connections(rserver, caplog):
    srv, listener, endpoint = rserver(remoting_max_connections=2)
    a, b = Client(endpoint), Client(endpoint)
    assert a.call(cluster_info()).code == 0 and b.call(cluster_info()).code == 0
    with caplog.at_level(logging.WARNING, logger="zns"):
        c = Client(endpoint)
        assert c.closed_by_server()
        wait_for(lambda: "--remoting-max-connections" in caplog.text)
    assert listener.refused == 1
    a.close()
    wait_for(lambda: len(listener.connections) == 1)
    d = Client(endpoint)
    assert d.call(cluster_info()).code == 0
    assert b.call(cluster_info()).code == 0


@pytest.mark.single_process("injects the server's clock")
def test_idle_connections_are_closed(rserver):
    # The server's clock is the test's: a loaded machine can delay a call by seconds, and
    # then a real 1.5 s timeout would close the busy connection too.
    now = [time.monotonic()]
    srv, listener, endpoint = rserver(server_kwargs={"clock": lambda: now[0]})
    listener.policy.idle_timeout_ms = 1500

    def advance(seconds: float) -> None:
        for _ in range(round(seconds / 0.25)):  # steps shorter than a stall (1 s)
            now[0] += 0.25
            srv.server.wake()

    idle, busy = Client(endpoint), Client(endpoint)
    assert idle.call(cluster_info()).code == 0
    for _ in range(3):
        advance(1.0)
        assert busy.call(cluster_info()).code == 0  # traffic keeps it open
    assert idle.closed_by_server(timeout=10)
    assert not busy.closed_by_server(timeout=0.2)
    assert busy.call(cluster_info()).code == 0
    advance(2.0)
    assert busy.closed_by_server(timeout=10)


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_dribbling_connection_is_bounded_and_blocks_nobody(rserver):
    srv, listener, endpoint = rserver(max_message_bytes=4096)
    silent = Client(endpoint)  # opens and never sends
    slow = Client(endpoint)
    data = encode_command(cluster_info())
    wait_for(lambda: len(listener.connections) == 2)
    for i, byte in enumerate(data):
        slow.sock.sendall(bytes([byte]))
        if i % 20 == 0:
            probe(endpoint)
            held = [e.decoder.buffered for e in list(listener.connections.values())]
            assert max(held, default=0) <= 4096
    assert slow.recv().code == 0
    # a length field within the limit, then a trickle: it holds at most one frame
    slow.sock.sendall(struct.pack(">i", 4000) + b"\0" * 1000)
    probe(endpoint)
    assert max(e.decoder.buffered for e in list(listener.connections.values())) <= 4096
    silent.close()


# --- ZNS/1 events for remoting brokers --------------------------------------------------------


def test_zns1_watcher_sees_remoting_broker_come_and_go(rserver):
    srv, listener, endpoint = rserver()
    watcher = Peer(srv.router, srv.pub)
    watcher.subscribe(b"broker/", schema.HB_CHANNEL)
    watcher.wait_subscribed()
    broker = Client(endpoint)
    assert broker.call(register_cmd()).code == 0
    _, event = watcher.next_event(lambda ch, ev: ch.startswith(b"broker/"))
    assert (event.change, event.broker_name, event.broker_addr) == (
        "registered", "broker-a", "127.0.0.1:10911")
    broker.close()
    _, event = watcher.next_event(lambda ch, ev: ch.startswith(b"broker/"))
    assert (event.change, event.reason) == ("removed", "disconnected")
    assert watcher.ok("status").brokers == 0
    watcher.close()


# --- zns serve --remoting ----------------------------------------------------------------------


def test_cli_remoting_option_env_and_file(serve_in_process, tmp_path: Path):
    result, config = serve_in_process()
    assert result.exit_code == 0 and config.remoting is None
    assert config.remoting_brokers == [] and config.remoting_admins == ["127.0.0.0/8", "::1/128"]
    _, config = serve_in_process("--remoting", "127.0.0.1:9000")
    assert config.remoting == "127.0.0.1:9000"
    _, config = serve_in_process(env={"ZNS_REMOTING": "tcp://127.0.0.1:9001"})
    assert config.remoting == "tcp://127.0.0.1:9001"
    conf = tmp_path / "zns.toml"
    conf.write_text('remoting = "127.0.0.1:9002"\nremoting-brokers = ["10.0.0.0/8"]\n'
                    'remoting_max_connections = 7\n')
    _, config = serve_in_process("--config", str(conf))
    assert (config.remoting, config.remoting_brokers, config.remoting_max_connections) == (
        "127.0.0.1:9002", ["10.0.0.0/8"], 7)
    _, config = serve_in_process("--config", str(conf), "--remoting", "127.0.0.1:9003")
    assert config.remoting == "127.0.0.1:9003"


def test_cli_remoting_networks(serve_in_process):
    result, config = serve_in_process(
        "--remoting", "127.0.0.1:9000", "--remoting-brokers", "10.0.0.0/8",
        "--remoting-brokers", "192.168.1.7", "--remoting-admins", "10.1.0.0/16")
    assert result.exit_code == 0, result.output
    assert config.remoting_brokers == ["10.0.0.0/8", "192.168.1.7"]
    assert config.remoting_admins == ["10.1.0.0/16"]  # replaces the loopback default
    _, config = serve_in_process(env={"ZNS_REMOTING_BROKERS": "10.0.0.0/8 172.16.0.0/12"})
    assert config.remoting_brokers == ["10.0.0.0/8", "172.16.0.0/12"]
    _, config = serve_in_process("--remoting", "127.0.0.1:9000",
                                 "--remoting-clients", "10.2.0.0/16")
    assert config.remoting_clients == ["10.2.0.0/16"]
    for option in ("--remoting-brokers", "--remoting-admins", "--remoting-clients"):
        result, config = serve_in_process("--remoting", "127.0.0.1:9000", option, "10.0.0.0/33")
        assert result.exit_code == 2 and config is None
        assert option in result.output and "10.0.0.0/33" in result.output


@pytest.mark.parametrize("workers", ["0", "2"])
def test_cli_remoting_port_in_use_is_a_clear_error(tmp_path: Path, workers: str):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--router", "tcp://127.0.0.1:*",
             "--pub", "tcp://127.0.0.1:*", "--kv-path", str(tmp_path / "kv.json"),
             "--remoting", f"127.0.0.1:{port}", "--workers", workers],
            capture_output=True, text=True, timeout=30,
            env={k: v for k, v in os.environ.items() if not k.startswith("ZNS_")},
        )
    finally:
        holder.close()
    assert result.returncode != 0
    assert f"--remoting 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("endpoint, warned", [("0.0.0.0:0", True), ("127.0.0.1:0", False)])
def test_cli_remoting_non_loopback_warning(process_server, endpoint, warned):
    srv = process_server("--remoting", endpoint)
    wait_for(lambda: "RocketMQ remoting listener on" in srv.output())
    warnings = [line for line in srv.output().splitlines()
                if "WARNING" in line and "plain TCP" in line]
    assert bool(warnings) == warned, srv.output()
    if warned:  # the truth about what is open: an unset --remoting-brokers means any address
        assert ("reads from any address (--remoting-clients), broker requests from any address "
                "(--remoting-brokers), admin requests from 127.0.0.0/8, ::1/128 "
                "(--remoting-admins)") in warnings[0]
    assert srv.stop() == 0


def test_namesrv_config_shows_the_bound_endpoints(rserver):
    """GET_NAMESRV_CONFIG shows where the server listens (the Java NameServer shows its bound
    listenPort), not the configured `*` or port 0 (seen with mqadmin getNamesrvConfig)."""
    srv, listener, endpoint = rserver()
    reply = Client(endpoint).call(RemotingCommand(code=319, version=479))  # GET_NAMESRV_CONFIG
    shown = dict(line.split("=", 1) for line in reply.body.decode().splitlines())
    assert (shown["router"], shown["pub"], shown["remoting"]) == (srv.router, srv.pub, endpoint)
    assert not endpoint.endswith(":0") and "*" not in shown["router"] + shown["pub"]


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_a_connection_that_only_sends_one_way_requests_is_not_idle(rserver):
    srv, listener, endpoint = rserver()
    listener.policy.idle_timeout_ms = 1500
    quiet, talking = Client(endpoint), Client(endpoint)  # accepted together
    # Until the quiet one is closed as idle, the other only sends (one-way registrations,
    # as a broker's heartbeats can be): it never gets a reply, yet it is not idle.
    while not quiet.closed_by_server(timeout=0.1):
        cmd = register_cmd()
        cmd.flag |= FLAG_ONEWAY
        talking.send(cmd)
    assert talking.call(cluster_info()).code == 0
    assert srv.server.service.table.broker_count() == 1


def test_requests_before_a_bad_frame_are_answered_before_the_close(rserver):
    srv, listener, endpoint = rserver()
    client = Client(endpoint)
    pipelined = b"".join(encode_command(RemotingCommand(code=106, version=479, opaque=n))
                         for n in (1, 2))
    client.sock.sendall(pipelined + b"\x00\x00\x00\x02\x00\x00")  # then a length below 4
    assert [client.recv().opaque for _ in range(2)] == [1, 2]
    assert client.closed_by_server()


def test_a_star_endpoint_listens_on_every_interface(make_server):
    endpoint = make_server(remoting="*:0").remoting
    port = endpoint.rsplit(":", 1)[1]
    assert endpoint == f"0.0.0.0:{port}"
    for host in ("127.0.0.1", "127.0.0.2"):
        probe(f"{host}:{port}")


def test_namesrv_config_shows_booleans_as_java_does(rserver):
    srv, listener, endpoint = rserver(order_message_enable=True)
    client = Client(endpoint)
    reply = client.call(RemotingCommand(code=319, version=479))
    assert reply.code == 0
    lines = reply.body.decode().splitlines()
    assert "orderMessageEnable=true" in lines and "curve=false" in lines, lines
    assert not any(line.endswith(("=True", "=False")) for line in lines), lines


def test_closing_the_server_closes_the_listener_and_its_connections(tmp_path):
    srv = served(tmp_path, remoting="127.0.0.1:0")
    endpoint = srv.remoting
    client = Client(endpoint)
    assert client.call(cluster_info()).code == 0
    srv.stop()
    assert client.closed_by_server()
    host, port = endpoint.rsplit(":", 1)

    def bindable() -> bool:
        with socket.socket() as sock:  # REUSEADDR: only a listener, not TIME_WAIT, refuses
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, int(port)))
                sock.listen()
            except OSError:
                return False
            return True

    wait_for(bindable)


@pytest.mark.timeout(60)
def test_a_zeromq_client_at_the_remoting_port_is_told_where_zns1_is(make_server):
    """`zns status` against the remoting port (the recipe puts it on 9876, every zns
    command's default): an error naming the request endpoint, not a 3 s wait."""
    from click.testing import CliRunner

    from zns.cli import main
    from zns.core.errors import BadRequest
    from zns.core.schema import GetRoute, Status
    from zns.drivers.requests import call

    srv = make_server(remoting="127.0.0.1:0")
    wrong = f"tcp://{srv.remoting}"
    with pytest.raises(BadRequest, match=rf"ZNS/1 requests go to {srv.router} "
                                         rf"\(export ZNS_ADDR={srv.router}\)"):
        call(wrong, Status(), timeout=10)
    with pytest.raises(BadRequest):  # and again, on a new connection
        call(wrong, GetRoute(topic="T"), timeout=10)
    out = CliRunner().invoke(main, ["status", "--ns", wrong, "--timeout", "10"])
    assert out.exit_code == 1 and f"export ZNS_ADDR={srv.router}" in out.stderr, out.output
    # status names the listener, so the right port for each protocol can be looked up.
    assert call(srv.router, Status(), timeout=10).remoting == wrong.removeprefix("tcp://")


# --- many connections (issue 21 items 8 and 9) ------------------------------------------------


class CountingDict(dict):
    """The listener's connections, counting every walk over all of them."""

    walks = 0

    def values(self):  # type: ignore[override]
        CountingDict.walks += 1
        return super().values()

    def items(self):  # type: ignore[override]
        CountingDict.walks += 1
        return super().items()

    def __iter__(self):
        CountingDict.walks += 1
        return super().__iter__()


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_idle_connections_cost_no_pass_a_walk_nor_the_loop_a_poll_entry(rserver):
    # Idle deadlines sit in a heap and connections in the listener's own epoll: with 200
    # idle connections open, serving ZNS/1 requests never walks them (the loop did, every
    # pass), and the loop's poller holds what it held with none (a pyzmq Poller entry each
    # made every close O(n) and every poll O(n)).
    srv, listener, endpoint = rserver()
    owners = len(srv.server.loop.poll.owners)
    clients = [Client(endpoint) for _ in range(200)]
    try:
        wait_for(lambda: len(listener.connections) == 200)
        assert len(srv.server.loop.poll.owners) == owners
        CountingDict.walks = 0
        listener.connections = CountingDict(listener.connections)
        peer = srv.peer()
        before = srv.server.loop.wakeups
        for request_id in range(50):
            assert peer.ok("status", id=request_id).epoch
        time.sleep(1.0)  # and hb every 200 ms: passes with nothing for the listener to do
        assert srv.server.loop.wakeups - before >= 5
        assert CountingDict.walks == 0
    finally:
        for client in clients:
            client.close()
    wait_for(lambda: not listener.connections)
    assert len(srv.server.loop.poll.owners) == owners


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_an_idle_connection_is_closed_at_its_deadline_and_one_that_spoke_is_not(rserver):
    srv, listener, endpoint = rserver()
    listener.policy.idle_timeout_ms = 1500
    quiet, talker = Client(endpoint), Client(endpoint)
    try:
        wait_for(lambda: len(listener.connections) == 2)
        stop = time.monotonic() + 3
        while time.monotonic() < stop:  # the talker speaks every 100 ms
            assert talker.call(cluster_info()).code == 0
            time.sleep(0.1)
        assert quiet.closed_by_server(timeout=10)
        assert talker.call(cluster_info()).code == 0
    finally:
        quiet.close()
        talker.close()


@pytest.mark.single_process("sets or reads the remoting listener's internals (its policy, connections or counters)")
def test_a_source_address_holds_at_most_its_share_of_connections(rserver):
    srv, listener, endpoint = rserver(remoting_max_connections_per_host=3)
    clients = [Client(endpoint) for _ in range(5)]
    try:
        wait_for(lambda: listener.refused == 2)
        assert len(listener.connections) == 3
        assert clients[0].call(cluster_info()).code == 0
        clients[0].close()
        wait_for(lambda: len(listener.connections) == 2)
        late = Client(endpoint)  # room again for this address
        clients.append(late)
        assert late.call(cluster_info()).code == 0
    finally:
        for client in clients:
            client.close()


@pytest.mark.single_process("a buffer budget below what zns serve accepts (1 MiB), and the listener's counters")
def test_over_the_buffer_budget_a_stalled_frame_goes_before_one_arriving(rserver, caplog):
    # Issue 32 item 2: the shed closed "the connections holding the most", which is a broker
    # whose large registration is arriving. Now the bytes that have waited longest go first.
    srv, listener, endpoint = rserver(remoting_max_buffer_bytes=256 << 10)
    stalled = {"mid": 40 << 10, "small": 20 << 10}
    clients = {name: Client(endpoint) for name in (*stalled, "big")}
    big = cluster_info()
    big.body = b"x" * (200 << 10)
    arriving = encode_command(big)
    with caplog.at_level(logging.WARNING, logger="zns"):
        # Each stalled one announces a frame 1 KiB longer than it sends: a frame begun counts
        # at its announced length, so they hold 62 KiB together, big brings 200 KiB more.
        for name, size in stalled.items():
            clients[name].sock.sendall(struct.pack(">i", size + 1024) + b"\0" * size)
        wait_for(lambda: listener.held >= (60 << 10))
        # Progress is stamped in whole ms, and a tie goes to the larger holder: big's first
        # bytes read in the same ms as the stalled ones would make it the one closed (seen
        # once in a full run).
        time.sleep(0.005)
        clients["big"].sock.sendall(arriving[:-1024])
        wait_for(lambda: listener.over_budget >= 1)
        clients["big"].sock.sendall(arriving[-1024:])
        assert clients["big"].recv().code == 0  # the frame arriving completes
    assert sum(clients[name].closed_by_server(timeout=10) for name in stalled) == 1
    wait_for(lambda: listener.held <= listener.policy.max_buffer_bytes)
    assert listener.over_budget == 1  # one stalled frame went; the rest fit
    warnings = [r.getMessage() for r in caplog.records if "max-buffer-bytes" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("remoting connection from 127.0.0.1 "
                                                          "closed: it holds ")
    assert warnings[0].endswith(f", more than {256 << 10} (--remoting-max-buffer-bytes)")
    for client in clients.values():
        client.sock.close()

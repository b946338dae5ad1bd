"""The socket side over real sockets: every op through DEALER, REQ and a proxy,
pipelining, bad input, oversized messages, peers that vanish or never read,
expiry timing, the stall rule and internal errors."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from helpers import (
    LOADED_DEADLINE, Peer, SplitServer, ThreadedServer, metric_sum, register_fields, served,
    wait_for,
)
from zns.core import schema

Call = Callable[..., Any]


def exercise_every_op(call: Call) -> None:
    """Every op of §4–§6 once, with the reply each must give on a fresh server."""
    reg = call("register_broker", **register_fields(
        topics={"TopicA": {}, "TopicB": {"sys_flag": 1}}, ha_addr="10.0.0.1:10912",
    ))
    assert isinstance(reg, schema.RegisterBrokerReply)
    slave = call("register_broker", **register_fields(broker_id=1, addr="10.0.0.2:10911"))
    assert (slave.master_addr, slave.ha_addr) == ("10.0.0.1:10911", "10.0.0.1:10912")

    hb = call("heartbeat", cluster="c1", broker_name="broker-a", broker_id=0,
              broker_addr="10.0.0.1:10911")
    assert (hb.known, hb.changed) == (True, False)

    route = call("get_route", topic="TopicA")
    assert isinstance(route, schema.GetRouteReply)
    assert [q.broker_name for q in route.route.queues] == ["broker-a"]
    assert route.route.brokers[0].addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    assert route.revision >= 1 and len(route.epoch) == 16

    routes = call("get_routes", topics=["TopicA", "Nope"])
    assert set(routes.routes) == {"TopicA"} and routes.missing == ["Nope"]
    assert routes.revisions == {"TopicA": route.revision, "Nope": 0}

    info = call("get_cluster_info")
    assert info.clusters == {"c1": ["broker-a"]}
    assert [lb.broker_addr for lb in info.live] == ["10.0.0.1:10911", "10.0.0.2:10911"]

    assert call("get_topics").topics == ["TopicA", "TopicB"]
    assert call("get_topics", sys_flag=1).topics == ["TopicB"]
    assert call("get_topics", cluster="other").topics == []

    snap = call("snapshot")
    assert set(snap.routes) == {"TopicA", "TopicB"} and snap.clusters == {"c1": ["broker-a"]}
    status = call("status")
    assert (status.brokers, status.topics, status.revision) == (1, 2, snap.revision)

    assert call("wipe_write_perm", broker_name="broker-a").changed == 2
    assert call("add_write_perm", broker_name="broker-a").changed == 2
    assert isinstance(call("register_topic", topic="TopicC", queues=[dict(
        broker_name="broker-a", read_queues=4, write_queues=4, perm=6, sys_flag=0)]),
        schema.RegisterTopicReply)
    assert call("delete_topic", topic="TopicC").removed is True

    assert isinstance(call("kv_put", namespace="ns", key="k", value="v"), schema.KvPutReply)
    assert call("kv_get", namespace="ns", key="k").value == "v"
    assert call("kv_list", namespace="ns").entries == {"k": "v"}
    assert call("kv_delete", namespace="ns", key="k").removed is True
    missing = call("kv_get", namespace="ns", key="k")
    assert isinstance(missing, schema.Error) and missing.code == "not_found"

    assert call("unregister_broker", cluster="c1", broker_name="broker-a", broker_id=1,
                broker_addr="10.0.0.2:10911").removed is True
    gone = call("unregister_broker", cluster="c1", broker_name="broker-a", broker_id=1,
                broker_addr="10.0.0.2:10911")
    assert gone.removed is False


class Requester:
    """Sends one body behind fixed envelope frames and checks they come back unchanged."""

    def __init__(self, sock: zmq.Socket, envelope: tuple[bytes, ...] = ()) -> None:
        self.sock = sock
        self.envelope = list(envelope)
        self.next_id = 1

    def __call__(self, op: str, **fields: Any) -> Any:
        fields.setdefault("id", self.next_id)
        self.next_id += 1
        self.sock.send_multipart([*self.envelope, schema.encode({"op": op, **fields})])
        assert self.sock.poll(10_000), f"no reply to {op}"
        frames = self.sock.recv_multipart()
        assert frames[:-1] == self.envelope
        reply = schema.decode_reply(frames[-1])
        assert reply.id == fields["id"]
        if not isinstance(reply, schema.Error):
            assert reply.__struct_config__.tag == op
        return reply


def test_every_op_over_dealer_with_envelope_frames(server: SplitServer, ctx: zmq.Context):
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(server.router)
    exercise_every_op(Requester(dealer, envelope=(b"hop-1", b"", b"\x00\xffhop-2")))


def test_every_op_over_req(server: SplitServer, ctx: zmq.Context):
    req = ctx.socket(zmq.REQ)
    req.connect(server.router)
    exercise_every_op(Requester(req))


@pytest.fixture
def proxy(server: SplitServer, ctx: zmq.Context) -> Iterator[str]:
    """A ROUTER/DEALER proxy in a thread in front of the server; yields its endpoint."""
    frontend, backend = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    control_in, control_out = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    frontend.bind("tcp://127.0.0.1:*")
    backend.connect(server.router)
    control_in.bind("inproc://proxy-control")
    control_out.connect("inproc://proxy-control")
    thread = threading.Thread(
        target=zmq.proxy_steerable, args=(frontend, backend, None, control_in), daemon=True
    )
    thread.start()
    yield frontend.getsockopt_string(zmq.LAST_ENDPOINT)
    control_out.send(b"TERMINATE")
    thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize("socket_type", [zmq.DEALER, zmq.REQ], ids=["dealer", "req"])
def test_every_op_through_router_dealer_proxy(proxy: str, ctx: zmq.Context, socket_type: int):
    sock = ctx.socket(socket_type)
    sock.connect(proxy)
    envelope = (b"client-hop",) if socket_type == zmq.DEALER else ()
    exercise_every_op(Requester(sock, envelope))


def test_pipelined_dealer_requests_are_matched_by_id(server: SplitServer):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(topics={f"T{i}": {} for i in range(20)}))
    sent = {}
    for i in range(200):
        request_id = 1000 + i
        if i % 3 == 0:
            body = {"op": "get_route", "id": request_id, "topic": f"T{i % 20}"}
        elif i % 3 == 1:
            body = {"op": "kv_put", "id": request_id, "namespace": "ns", "key": f"k{i}",
                    "value": str(i)}
        else:
            body = {"op": "get_route", "id": request_id, "topic": "Missing"}
        sent[request_id] = body
        peer.send_raw(schema.encode(body))
    replies = {}
    while len(replies) < len(sent):
        reply = schema.decode_reply(peer.recv_raw()[-1])
        assert reply.id not in replies
        replies[reply.id] = reply
    for request_id, body in sent.items():
        reply = replies[request_id]
        if body["op"] == "kv_put":
            assert isinstance(reply, schema.KvPutReply)
        elif body["topic"] == "Missing":
            assert reply.code == "not_found"
        else:
            assert reply.route.topic == body["topic"]
    assert peer.ok("kv_list", namespace="ns").entries == {
        b["key"]: b["value"] for b in sent.values() if b["op"] == "kv_put"
    }


# --- bad input over the wire ------------------------------------------------


def _snapshot_body(peer: Peer) -> bytes:
    peer.send_raw(schema.encode({"op": "snapshot", "id": 7}))
    return peer.recv_raw()[-1]


@pytest.mark.parametrize("frames, needle", [
    ([b"\xc1\xc1 not msgpack"], "malformed"),
    ([schema.encode([1, 2, 3])], "Expected `object`"),
    ([schema.encode("register_broker")], "Expected `object`"),
    ([b""], "truncated"),
    ([schema.encode({"id": 3})], "op"),
    ([schema.encode({"op": 5, "id": 3})], "op"),
], ids=["not-msgpack", "array", "string", "empty", "no-op", "op-not-str"])
def test_malformed_bodies_get_bad_request(server: SplitServer, frames, needle):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())
    before = _snapshot_body(peer)
    peer.send_raw(*frames)
    reply = schema.decode_reply(peer.recv_raw()[-1])
    assert isinstance(reply, schema.Error) and reply.code == "bad_request", reply
    assert needle in reply.message
    assert _snapshot_body(peer) == before


def test_multi_frame_message_echoes_envelope_and_reads_only_the_last_frame(server):
    peer = server.peer()
    body = schema.encode({"op": "status", "id": 9})
    peer.send_raw(b"envelope", body)
    frames = peer.recv_raw()
    assert frames[0] == b"envelope" and schema.decode_reply(frames[1]).id == 9
    # The body is the last frame: a valid body followed by junk is junk.
    peer.send_raw(body, b"junk")
    frames = peer.recv_raw()
    assert frames[0] == body
    reply = schema.decode_reply(frames[1])
    assert reply.code == "bad_request" and reply.id == 0


def test_unknown_op_keeps_its_id(server: SplitServer):
    reply = server.peer().call("make_coffee", id=42)
    assert reply.code == "unknown_op" and reply.id == 42 and "make_coffee" in reply.message


# --- oversized messages and peers that misbehave ------------------------------


@pytest.mark.timeout(60)
def test_oversized_request_disconnects_the_peer_which_then_reconnects(make_server):
    srv = make_server(max_message_bytes=4096)
    peer, other = srv.peer(), srv.peer()
    empty = len(schema.encode({"op": "kv_put", "id": 1, "namespace": "ns", "key": "fits",
                               "value": ""}))
    fits = "x" * (4096 - empty - 2)  # a str8 header grows by 2 bytes past 31 characters
    peer.ok("kv_put", id=1, namespace="ns", key="fits", value=fits)  # exactly 4096: served
    peer.ok("kv_delete", namespace="ns", key="fits")
    peer.send_raw(schema.encode({"op": "kv_put", "id": 1, "namespace": "ns", "key": "big",
                                 "value": "x" * 8192}))
    assert not peer.dealer.poll(500), "an oversized request must get no reply"
    assert other.ok("status")  # the server keeps serving
    # The same DEALER reconnects on its own; a request sent while it was down may be
    # lost with the old connection, so retry until one is answered.
    def small_request_answered() -> bool:
        peer.send_raw(schema.encode({"op": "kv_list", "id": 2, "namespace": "ns"}))
        return bool(peer.dealer.poll(500))
    wait_for(small_request_answered, timeout=20)
    reply = schema.decode_reply(peer.dealer.recv_multipart()[-1])
    assert reply.entries == {}  # the oversized put was not applied
    assert peer.call("kv_list", namespace="ns").entries == {}
    assert other.call("kv_get", namespace="ns", key="big").code == "not_found"


@pytest.mark.single_process("holds a reply in the service (monkeypatched) until its peer is gone")
def test_vanished_peer_does_not_block_the_loop(server: ThreadedServer, monkeypatch):
    service = server.server.service
    respond = service.respond
    received, release = threading.Event(), threading.Event()

    def slow_respond(body: bytes, now: int, *args: Any) -> Any:
        if body == vanishing_request:
            received.set()
            release.wait(10)  # hold the reply until its peer has gone
        return respond(body, now, *args)

    monkeypatch.setattr(service, "respond", slow_respond)
    vanishing_request = schema.encode({"op": "snapshot", "id": 666})
    gone = zmq.Context.instance().socket(zmq.DEALER)
    gone.setsockopt(zmq.LINGER, 1000)
    gone.connect(server.router)
    gone.send(vanishing_request)
    assert received.wait(10)
    gone.close()
    time.sleep(0.5)  # no event tells us the server's side of the connection has closed
    release.set()
    wait_for(lambda: server.server.dropped_replies == 1)
    other = server.peer()
    for _ in range(5):
        assert other.ok("status")


@pytest.mark.timeout(90)
def test_peer_that_never_reads_does_not_block_the_loop(make_server):
    server = make_server(metrics="127.0.0.1:0")
    ctx = zmq.Context.instance()
    stuck = ctx.socket(zmq.DEALER)
    stuck.setsockopt(zmq.LINGER, 0)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    stuck.connect(server.router)
    other = server.peer()
    other.ok("kv_put", namespace="ns", key="k", value="v" * 16_000)
    request = schema.encode({"op": "kv_list", "id": 1, "namespace": "ns"})
    try:
        # Each reply is 16 kB: the server's send queue (1000 messages) and the TCP
        # buffers fill long before 5000 of them, after which replies must be dropped.
        for _ in range(5000):
            stuck.send(request)
        wait_for(lambda: other.ok("status") and metric_sum(server, "zns_dropped_replies_total"),
                 timeout=30)
        for _ in range(10):
            assert other.ok("kv_get", namespace="ns", key="k").value == "v" * 16_000
    finally:
        stuck.close(0)


# --- liveness over sockets: expiry timing and the stall rule -------------------


@pytest.mark.timeout(60)
def test_silent_broker_expires_after_its_deadline_and_a_heartbeating_one_stays(server):
    peer = server.peer()
    peer.subscribe(b"broker/", schema.HB_CHANNEL)
    peer.wait_subscribed()
    steady = register_fields(broker_name="steady", addr="10.0.0.9:10911",
                             heartbeat_timeout_ms=1000)
    # The server stamps a request with the clock it reads once it has read the request (in
    # whole ms, rounded down: an address expires strictly after its last heartbeat + its
    # timeout, so never before that time counted from the send).
    sent_at = time.monotonic()
    peer.ok("register_broker", **steady)
    peer.ok("register_broker", **register_fields(heartbeat_timeout_ms=1000))
    replied_at = time.monotonic()

    removed: list[tuple[float, Any]] = []
    stop = time.monotonic() + 10
    while not removed and time.monotonic() < stop:
        peer.ok("heartbeat", cluster="c1", broker_name="steady", broker_id=0,
                broker_addr="10.0.0.9:10911")
        if peer.sub.poll(200):
            _, event = _decode(peer.sub.recv_multipart())
            if isinstance(event, schema.BrokerEvent) and event.change == "removed":
                removed.append((time.monotonic(), event))
    assert removed, "the silent broker was never expired"
    arrived_at, event = removed[0]
    assert (event.broker_name, event.reason) == ("broker-a", "expired")
    assert arrived_at >= sent_at + 1.0  # never before its deadline
    assert arrived_at < replied_at + 1.0 + 1.0  # and soon after it (loose on a loaded box)
    live = peer.ok("get_cluster_info").live
    assert [lb.broker_name for lb in live] == ["steady"]


def _decode(frames: list[bytes]) -> tuple[bytes, Any]:
    return frames[0], schema.decode_event(frames[1])


class SteppedClock:
    """A monotonic clock that a test can jump forward, as a suspended process sees it."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.mark.timeout(60)
@pytest.mark.single_process("injects the server's clock")
def test_stall_moves_deadlines_with_an_injected_clock(tmp_path):
    clock = SteppedClock()
    srv = ThreadedServer(tmp_path, server_kwargs={"clock": clock})
    try:
        peer = srv.peer()
        peer.subscribe(b"broker/", schema.HB_CHANNEL)
        peer.wait_subscribed()
        # 5 s: room for a loaded machine between this registration and the jump below
        # (with 1 s, real time alone expired the broker first), far below the 30 s jump.
        peer.ok("register_broker", **register_fields(heartbeat_timeout_ms=5000))
        jumped_ms = time.time() * 1000
        clock.offset += 30.0  # the whole process "stood still" for 30 s
        srv.server.wake()
        # Events up to the first hb after the jump: the pass that saw it evicted nobody.
        while True:
            channel, event = peer.next_event()
            if channel == schema.HB_CHANNEL:
                if event.time_ms > jumped_ms:
                    break
            else:
                assert event.change == "registered", event
        info = peer.ok("get_cluster_info")
        assert [lb.broker_name for lb in info.live] == ["broker-a"]
        # The report counts real time since the heartbeat; only the deadline got the stall back.
        assert info.live[0].last_heartbeat_ms >= 30_000
        # Silence after the stall still expires it.
        wait_for(lambda: not peer.ok("get_cluster_info").live, timeout=LOADED_DEADLINE)
    finally:
        srv.stop()


@pytest.mark.timeout(90)
def test_stall_of_the_process_does_not_evict_brokers(process_server):
    srv = process_server()
    peer = Peer(srv.router, srv.pub)
    try:
        peer.subscribe(b"broker/", schema.HB_CHANNEL)
        peer.wait_subscribed()
        brokers = [
            register_fields(broker_name=f"b{i}", addr=f"10.0.0.{i}:10911",
                            heartbeat_timeout_ms=timeout)
            for i, timeout in enumerate([1000, 1500, 2000], start=1)
        ]
        for fields in brokers:
            peer.ok("register_broker", **fields)
        for fields in brokers:
            peer.ok("heartbeat", **{k: fields[k] for k in
                                    ("cluster", "broker_name", "broker_id", "broker_addr")})
        stopped_ms = time.time() * 1000
        srv.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(3.0)
        finally:
            resumed_at = time.monotonic()  # before SIGCONT: a slow test only loosens the check
            srv.proc.send_signal(signal.SIGCONT)
        # The first pass after the stall runs expiry, then sends the overdue hb:
        # every event before that hb is what the stall itself caused.
        while True:
            channel, event = _decode(peer.sub.recv_multipart())
            if channel == schema.HB_CHANNEL and event.time_ms > stopped_ms + 2000:
                break
            if isinstance(event, schema.BrokerEvent):
                assert event.change == "registered", f"evicted by the stall: {srv.output()}"
        # Silence after the stall: all three expire, each after its (moved) deadline.
        expired = set()
        while len(expired) < 3:
            _, event = peer.next_event(lambda ch, ev: isinstance(ev, schema.BrokerEvent))
            assert (event.change, event.reason) == ("removed", "expired")
            assert time.monotonic() - resumed_at > 0.5, f"{event.broker_name} expired too soon"
            expired.add(event.broker_name)
        assert "stalled" in srv.output()
    finally:
        peer.close()


# --- internal errors ----------------------------------------------------------


@pytest.mark.single_process("makes the service's read raise (monkeypatched)")
def test_internal_error_is_replied_logged_and_survived(server: ThreadedServer, monkeypatch,
                                                       caplog):
    service = server.server.service
    original = service.read

    def read(request, now):
        if isinstance(request, schema.GetTopics):
            raise RuntimeError("boom in a handler")
        return original(request, now)

    monkeypatch.setattr(service, "read", read)
    peer = server.peer()
    with caplog.at_level(logging.ERROR, logger="zns"):
        reply = peer.call("get_topics", id=77)
    assert isinstance(reply, schema.Error)
    assert (reply.code, reply.id) == ("internal", 77)
    records = [r for r in caplog.records if r.exc_info]
    assert records and "boom in a handler" in str(records[0].exc_info[1])
    peer.ok("register_broker", **register_fields())
    assert peer.ok("status").brokers == 1


@pytest.mark.single_process("makes the service's publishing raise (monkeypatched)")
def test_bug_while_publishing_is_internal_too(server: ThreadedServer, monkeypatch):
    service = server.server.service
    publish = service._publish

    def broken_publish(events):
        if events:
            raise RuntimeError("boom while encoding events")
        return publish(events)

    monkeypatch.setattr(service, "_publish", broken_publish)
    peer = server.peer()
    reply = peer.call("register_broker", id=5, **register_fields())
    assert (reply.code, reply.id) == ("internal", 5)
    assert peer.ok("status").epoch == service.epoch  # still serving


def test_reconnecting_peer_with_the_same_routing_id_takes_over(server: SplitServer,
                                                                ctx: zmq.Context):
    first = ctx.socket(zmq.DEALER)
    first.setsockopt(zmq.ROUTING_ID, b"broker-a-agent")
    first.connect(server.router)
    assert Requester(first)("status").revision == 0
    # The old connection is still up (a frozen process, say); the new one must be answered.
    second = ctx.socket(zmq.DEALER)
    second.setsockopt(zmq.ROUTING_ID, b"broker-a-agent")
    second.connect(server.router)
    assert isinstance(Requester(second)("status"), schema.StatusReply)


@pytest.mark.timeout(60)
def test_burst_of_one_large_broker_reaches_a_slow_subscriber(server: SplitServer):
    topics = 10_000  # ten times the default high-water mark of 1000
    peer = server.peer()
    peer.subscribe(schema.ROUTE_PREFIX, schema.HB_CHANNEL)
    peer.wait_subscribed()
    peer.ok("register_broker", **register_fields(topics={f"T{i}": {} for i in range(topics)}))
    # Only now does the subscriber start reading: the burst waited in the queues.
    seen = set()
    while len(seen) < topics:
        channel, event = peer.next_event(lambda ch, ev: ch != schema.HB_CHANNEL)
        seen.add(event.topic)
    assert peer.ok("status").topics == topics


@pytest.mark.timeout(60)
@pytest.mark.single_process("an inproc:// events socket (no kernel buffers): one process only")
def test_pub_hwm_bounds_what_a_subscriber_behind_is_sent(tmp_path):
    # inproc: no kernel buffers, so a pipe holds exactly what the marks allow.
    pub = f"inproc://zns-test-pub-hwm-{id(tmp_path)}"
    srv = ThreadedServer(tmp_path, pub=pub, pub_hwm=10)
    try:
        subs = []
        for rcvhwm in (10, 0):  # one subscriber behind, one reading everything
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, rcvhwm)
            sub.setsockopt(zmq.SUBSCRIBE, schema.ROUTE_PREFIX)
            sub.setsockopt(zmq.SUBSCRIBE, schema.HB_CHANNEL)
            sub.connect(srv.pub)
            subs.append(sub)
        behind, reader = subs
        for sub in subs:  # subscribed once an hb arrives
            while sub.recv_multipart()[0] != schema.HB_CHANNEL:
                pass
        topics = {f"T{i}": {} for i in range(3000)}
        srv.peer().ok("register_broker", **register_fields(topics=topics))
        seen: set[bytes] = set()
        while len(seen) < len(topics):  # every route event was published
            channel = reader.recv_multipart()[0]
            if channel.startswith(schema.ROUTE_PREFIX):
                seen.add(channel)
        kept = 0
        while behind.poll(0):
            behind.recv_multipart()
            kept += 1
        # The PUB's mark (10) plus the subscriber's (10) and an hb or two, not thousands.
        assert 0 < kept <= 100, kept
        for sub in subs:
            sub.close(0)
    finally:
        srv.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("host, warned", [("[::1]", False), ("127.0.0.2", False), ("0.0.0.0", True)])
def test_only_a_non_loopback_bind_warns_about_plain_text(tmp_path, host: str, warned: bool):
    try:
        srv = served(tmp_path, router=f"tcp://{host}:*")
    except Exception as exc:  # pragma: no cover - a machine without IPv6 loopback
        pytest.skip(f"cannot bind {host}: {exc}")
    srv.stop()  # its worker had bound and logged: SplitServer waits for its serving line
    warnings = [line for line in srv.output().splitlines() if "without CURVE" in line]
    assert bool(warnings) == warned, warnings

"""zns.drivers.request_router in process: a ROUTER on inproc, DEALERs as peers, a fake service
and a fake clock; `run()` called by the test as the loop would. What is answered, what is
dropped (with what log line), the slice, the reply budget and the socket's options."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from zns.core.budget import ReplyBudget
from zns.core.service import Response
from zns.drivers import request_router
from zns.drivers.loop import PollSet
from zns.drivers.request_router import (
    MAX_ENVELOPE_FRAMES,
    RequestRouter,
)
from zns.drivers.sockets import TCP_TIMEOUT_MS

from helpers import records_here, wait_for

pytestmark = pytest.mark.timeout(60)


class FakeService:
    """Answers b"re:" + body; a body starting with b"ev" publishes one event."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, int, str | None]] = []

    def respond(self, body: bytes, now: int, peer_key: str | None = None,
                peer: Any = None) -> Response:
        self.calls.append((body, now, peer_key))
        events = [(b"chan", body)] if body.startswith(b"ev") else []
        if body.startswith(b"size:"):
            reply = b"r" * int(body[len(b"size:"):])
        else:
            reply = body[len(b"big:"):] if body.startswith(b"big:") else b"re:" + body
        return Response(reply, len(self.calls), events)

    @staticmethod
    def busy_reply(request_id: int) -> bytes:
        return b"busy:%d" % request_id


class Puts:
    def __init__(self) -> None:
        self.put_calls: list[Any] = []

    def put(self, events: Any) -> None:
        self.put_calls.append(events)


class Clock:
    def __init__(self, now: int = 1000) -> None:
        self.now = now
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now


class Rig:
    def __init__(self, ctx: zmq.Context, name: str, *, max_bytes: int = 1 << 20,
                 budget: ReplyBudget | None = None, with_key: bool = False) -> None:
        self.ctx = ctx
        self.endpoint = f"inproc://router-{name}"
        self.router = ctx.socket(zmq.ROUTER)
        RequestRouter.configure(self.router, max_bytes)
        self.router.bind(self.endpoint)
        self.service = FakeService()
        self.outbox = Puts()
        self.clock = Clock()
        self.budget = budget or ReplyBudget()
        self.rr = RequestRouter(self.router, self.service, self.outbox,  # type: ignore[arg-type]
                                clock=self.clock, max_message_bytes=max_bytes,
                                reply_budget=self.budget, with_key=with_key)
        self.peers: list[zmq.Socket] = []

    def peer(self, rcvhwm: int | None = None) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.connect(self.endpoint)
        self.peers.append(sock)
        return sock

    def arrived(self) -> None:
        wait_for(lambda: self.router.poll(0), timeout=10)

    def close(self) -> None:
        for sock in self.peers:
            sock.close(0)
        self.router.close(0)


@pytest.fixture
def rig(ctx: zmq.Context, request: pytest.FixtureRequest) -> Iterator[Rig]:
    made = Rig(ctx, request.node.name)
    yield made
    made.close()


def reply_of(sock: zmq.Socket) -> list[bytes]:
    assert sock.poll(10_000), "no reply"
    return sock.recv_multipart()


def test_the_router_socket_is_configured_for_the_server(rig: Rig) -> None:
    router = rig.router
    assert router.getsockopt(zmq.MAXMSGSIZE) == 1 << 20
    assert router.getsockopt(zmq.LINGER) == 500
    assert router.getsockopt(zmq.TCP_MAXRT) == TCP_TIMEOUT_MS == 10_000
    assert router.getsockopt(zmq.TCP_KEEPALIVE) == 1
    with pytest.raises(zmq.ZMQError) as caught:  # ROUTER_MANDATORY: an unknown peer is an error
        router.send_multipart([b"nobody", b"x"], zmq.DONTWAIT)
    assert caught.value.errno == errno.EHOSTUNREACH


def test_a_reconnecting_peer_with_the_same_id_takes_the_replies_over(rig: Rig) -> None:
    first, second = rig.ctx.socket(zmq.DEALER), rig.ctx.socket(zmq.DEALER)
    for sock in (first, second):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, b"same")
        rig.peers.append(sock)
    first.connect(rig.endpoint)
    first.send(b"one")
    rig.arrived()
    rig.rr.run({}, 1000, 10**9)
    assert reply_of(first) == [b"re:one"]
    second.connect(rig.endpoint)  # ROUTER_HANDOVER: the newcomer takes the id over
    second.send(b"two")
    wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 2)[1], timeout=10)
    assert reply_of(second) == [b"re:two"]


def test_each_request_is_answered_with_its_envelope_and_the_time_read(rig: Rig) -> None:
    peer = rig.peer()
    peer.send_multipart([b"e1", b"e2", b"ping"])
    peer.send(b"pong")
    rig.arrived()
    rig.clock.now = 1234
    wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 2)[1], timeout=10)
    assert reply_of(peer) == [b"e1", b"e2", b"re:ping"]
    assert reply_of(peer) == [b"re:pong"]
    assert rig.service.calls == [(b"ping", 1234, None), (b"pong", 1234, None)]
    assert rig.outbox.put_calls == []  # nothing to publish: nothing put
    assert rig.rr.dropped_replies == rig.rr.dropped_requests == 0


def test_the_events_of_a_request_go_to_the_outbox(rig: Rig) -> None:
    peer = rig.peer()
    peer.send(b"ev1")
    rig.arrived()
    rig.rr.run({}, 1000, 10**9)
    assert rig.outbox.put_calls == [[(b"chan", b"ev1")]]
    assert reply_of(peer) == [b"re:ev1"]


def test_it_hands_back_after_a_request_that_made_events(rig: Rig) -> None:
    # So the loop sends them before the next request is read: that read costs a system
    # call when none waits, which would sit between the reply and its events.
    peer = rig.peer()
    for body in (b"ev1", b"plain", b"ev2"):
        peer.send(body)
    rig.arrived()  # inproc: the three are in the pipe in order once the first is
    assert rig.rr.run({}, 1000, 10**9) is True
    assert [body for body, _, _ in rig.service.calls] == [b"ev1"]
    assert rig.outbox.put_calls == [[(b"chan", b"ev1")]]
    assert rig.rr.run({}, 1000, 10**9) is True  # a request without events does not hand back
    assert [body for body, _, _ in rig.service.calls] == [b"ev1", b"plain", b"ev2"]
    assert rig.rr.run({}, 1000, 10**9) is False  # none waits
    assert len(rig.service.calls) == 3
    assert [reply_of(peer) for _ in range(3)] == [[b"re:ev1"], [b"re:plain"], [b"re:ev2"]]


def test_the_peer_key_reaches_the_service_only_with_curve(ctx, monkeypatch) -> None:
    monkeypatch.setattr(request_router, "user_id", lambda frame: "KEY:" + frame.bytes.decode())
    for with_key, expected in ((True, "KEY:x"), (False, None)):
        rig = Rig(ctx, f"key-{with_key}", with_key=with_key)
        try:
            rig.peer().send(b"x")
            rig.arrived()
            rig.rr.run({}, 1000, 10**9)
            assert rig.service.calls == [(b"x", 1000, expected)]
        finally:
            rig.close()


def test_user_id_is_read_from_the_frame_metadata() -> None:
    class Frame:
        def get(self, name: str) -> str:
            return {"User-Id": "abc"}[name]

    assert request_router.user_id(Frame()) == "abc"


def test_each_request_is_handled_at_a_clock_read_after_it_was_read(rig: Rig) -> None:
    # A registration's `now` starts its broker's timeout (§8): it must not be from before
    # the request arrived. The `now` the loop gives `run` is from before it, and so was one
    # read every 16 requests: behind heavy requests (snapshots of a few MB, here 1 ms
    # each) a registration was stamped up to 12 ms before it was even sent, and its broker
    # expired that much early (bench/flood.py).
    peer = rig.peer()
    for i in range(20):
        peer.send(b"r%d" % i)
    rig.arrived()
    respond = rig.service.respond

    def heavy(body: bytes, now: int, peer_key: str | None = None, peer: Any = None) -> Response:
        response = respond(body, now, peer_key, peer)
        rig.clock.now += 1  # each takes 1 ms
        return response

    rig.service.respond = heavy  # type: ignore[method-assign]
    rig.clock.now = 1003  # the request below arrived after the loop read 1000
    wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 20)[1], timeout=10)
    assert [now for _, now, _ in rig.service.calls] == list(range(1003, 1023))


def test_the_slice_ends_after_the_first_request_read_at_its_end(rig: Rig) -> None:
    peer = rig.peer()
    for i in range(40):
        peer.send(b"r%d" % i)
    wait_for(lambda: rig.router.getsockopt(zmq.EVENTS) & zmq.POLLIN, timeout=10)
    rig.clock.now = 1005
    assert rig.rr.run({}, 1000, 1005) is False  # over at the first reading of the clock
    assert rig.service.calls == [(b"r0", 1005, None)]
    assert rig.clock.reads == 1
    rig.clock.now = 1010
    assert rig.rr.run({}, 1010, 1011) is False  # 1010 < 1011: it carries on to the end
    assert len(rig.service.calls) == 40
    assert {now for _, now, _ in rig.service.calls[1:]} == {1010}
    assert rig.clock.reads == 40


def test_a_slice_ends_only_when_the_clock_reaches_its_end(rig: Rig) -> None:
    peer = rig.peer()
    for i in range(17):
        peer.send(b"r%d" % i)
    wait_for(lambda: rig.router.getsockopt(zmq.EVENTS) & zmq.POLLIN, timeout=10)
    wait_for(lambda: (rig.rr.run({}, 1000, 1001), len(rig.service.calls) == 17)[1], timeout=10)
    assert rig.clock.reads == 17  # now (1000) before until (1001): it carried on


def test_waiting_and_next_deadline_say_whether_a_request_waits(rig: Rig) -> None:
    assert rig.rr.waiting() is False
    assert rig.rr.next_deadline(5) is None
    peer = rig.peer()
    peer.send(b"x")
    rig.arrived()
    assert rig.rr.waiting() is True
    rig.rr.run({}, 1000, 10**9)
    assert rig.rr.waiting() is False


def test_the_router_registers_itself_with_the_loop(rig: Rig) -> None:
    class Poller:
        def __init__(self) -> None:
            self.registered: list[tuple[Any, int]] = []

        def register(self, sock: Any, flags: int) -> None:
            self.registered.append((sock, flags))

    poll = PollSet(Poller())  # type: ignore[arg-type]
    rig.rr.attach(poll)
    assert poll.poller.registered == [(rig.router, zmq.POLLIN)]  # type: ignore[attr-defined]
    assert poll.owners == {rig.router: rig.rr}
    assert rig.rr.what == "serving requests"


def test_32_envelope_frames_are_answered_and_33_dropped_with_a_log_line(rig: Rig, caplog) -> None:
    peer = rig.peer()
    peer.send_multipart([b"e"] * MAX_ENVELOPE_FRAMES + [b"ok"])
    peer.send_multipart([b"e"] * (MAX_ENVELOPE_FRAMES + 1) + [b"dropped"])
    peer.send(b"after")
    rig.arrived()
    wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 2)[1], timeout=10)
    assert MAX_ENVELOPE_FRAMES == 32
    assert reply_of(peer) == [b"e"] * 32 + [b"re:ok"]
    assert reply_of(peer) == [b"re:after"]
    assert [body for body, _, _ in rig.service.calls] == [b"ok", b"after"]
    assert rig.rr.dropped_requests == 1
    (record,) = records_here(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage() == ("dropped a request unanswered: more than 32 envelope frames or "
                                   "1048576 bytes (§1 bounds; at least 33 frames, 33 bytes)")
    assert rig.rr.next_deadline(7) is None and rig.rr.waiting() is False


@pytest.mark.parametrize("envelope", [0, 2])
def test_a_request_of_max_bytes_is_answered_and_one_byte_more_dropped(ctx, caplog, envelope) -> None:
    rig = Rig(ctx, f"size-{envelope}", max_bytes=100)
    try:
        peer = rig.peer()
        head = [b"e" * 10] * envelope
        fits = 100 - 10 * envelope
        peer.send_multipart(head + [b"a" * fits])
        peer.send_multipart(head + [b"b" * (fits + 1)])
        peer.send(b"after")
        rig.arrived()
        wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 2)[1], timeout=10)
        assert [body for body, _, _ in rig.service.calls] == [b"a" * fits, b"after"]
        assert rig.rr.dropped_requests == 1
        (record,) = records_here(caplog)
        assert record.getMessage().endswith(f"(§1 bounds; at least {envelope} frames, 101 bytes)")
    finally:
        rig.close()


def test_an_envelope_of_exactly_max_bytes_before_an_empty_body_is_answered(ctx, caplog) -> None:
    # The bound is checked after each envelope frame too: there, as at the end, max_bytes fits.
    rig = Rig(ctx, "envelope-at-max", max_bytes=100)
    try:
        peer = rig.peer()
        peer.send_multipart([b"e" * 100, b""])
        rig.arrived()
        wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 1)[1], timeout=10)
        assert rig.service.calls == [(b"", 1000, None)] and rig.rr.dropped_requests == 0
        assert records_here(caplog) == []
    finally:
        rig.close()


def test_a_message_over_the_bound_in_its_envelope_is_dropped_as_soon_as_it_is_over(ctx, caplog) -> None:
    rig = Rig(ctx, "early", max_bytes=100)
    try:
        peer = rig.peer()
        peer.send_multipart([b"x" * 101, b"y", b"z", b"body"])
        peer.send(b"after")
        rig.arrived()
        wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 1)[1], timeout=10)
        assert rig.service.calls == [(b"after", 1000, None)]
        (record,) = records_here(caplog)
        assert record.getMessage().endswith("(§1 bounds; at least 1 frames, 101 bytes)")
    finally:
        rig.close()


def test_draining_a_long_message_stops_at_the_slice_and_resumes(rig: Rig) -> None:
    peer = rig.peer()
    peer.send_multipart([b"e"] * 5000 + [b"body"])
    peer.send(b"after")
    rig.arrived()
    rig.clock.now = 2000  # past the slice's end from the start
    assert rig.rr.run({}, 1000, 1500) is False  # the slice ran out: no hand-back to ask for
    assert rig.rr.dropped_requests == 1 and rig.service.calls == []
    assert rig.rr.next_deadline(77) == 77  # draining: due at once
    assert rig.rr.waiting() is True
    reads = rig.clock.reads
    assert reads == 1  # after 1,024 frames read
    for _ in range(10):
        handed_back = rig.rr.run({}, 2000, 1500)  # still no time: 1,024 more frames each time
        if rig.rr.next_deadline(77) is None:  # drained
            break
        assert handed_back is False
    # 5,000 frames: three more slices of 1,024, then the rest and the next request (read
    # once it is read)
    assert rig.clock.reads - reads == 3 + 1
    assert rig.rr.next_deadline(77) is None
    assert rig.service.calls == [(b"after", 2000, None)]
    assert rig.rr.dropped_requests == 1


def test_draining_with_time_left_reads_the_whole_message_in_one_run(rig: Rig) -> None:
    peer = rig.peer()
    peer.send_multipart([b"e"] * 3000 + [b"body"])
    peer.send(b"after")
    rig.arrived()
    rig.clock.now = 1000
    rig.rr.run({}, 1000, 1500)
    assert rig.rr.next_deadline(77) is None  # not draining
    assert [body for body, _, _ in rig.service.calls] == [b"after"]
    assert rig.clock.reads == 2 + 2  # at 1,024 and 2,048 frames, after the message and b"after"


def test_a_large_reply_over_the_peers_budget_becomes_busy(ctx) -> None:
    budget = ReplyBudget(burst=50, rate=1, total_burst=10**6, total_rate=10**6, heavy_bytes=20)
    rig = Rig(ctx, "budget", budget=budget)
    try:
        peer = rig.peer()
        peer.send(b"big:" + b"x" * 19)  # a reply under the heavy size: never charged
        peer.send(b"big:" + b"y" * 20)  # 20 bytes: charged (30 left)
        peer.send(b"big:" + b"z" * 20)  # 20: charged (10 left)
        peer.send(b"big:" + b"w" * 20)  # 20: over what is left: busy
        rig.arrived()
        wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 4)[1], timeout=10)
        replies = [reply_of(peer)[0] for _ in range(4)]
        assert replies == [b"x" * 19, b"y" * 20, b"z" * 20, b"busy:4"]
        assert budget.refused == 1
    finally:
        rig.close()


@pytest.mark.parametrize("error", [zmq.Again(), zmq.ZMQError(errno.EHOSTUNREACH)],
                         ids=["at-its-high-water-mark", "gone"])
def test_a_reply_that_cannot_be_sent_now_is_dropped_and_the_next_one_served(ctx, monkeypatch, error) -> None:
    rig = Rig(ctx, f"drop-{type(error).__name__}")
    try:
        peer = rig.peer()
        peer.send(b"x")
        peer.send(b"ev2")
        rig.arrived()
        real_send = request_router.backend_send
        refused: list[bytes] = []

        def refuse(sock: Any, data: Any, flags: int, copy: bool = True) -> Any:
            refused.append(bytes(data))
            raise error

        monkeypatch.setattr(request_router, "backend_send", refuse)
        wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 2)[1], timeout=10)
        assert rig.rr.dropped_replies == 2
        assert rig.outbox.put_calls == [[(b"chan", b"ev2")]]  # its events are published anyway
        monkeypatch.setattr(request_router, "backend_send", real_send)
        peer.send(b"y")
        rig.arrived()
        rig.rr.run({}, 1000, 10**9)
        assert reply_of(peer) == [b"re:y"]
    finally:
        rig.close()


def _drain(sock: zmq.Socket) -> list[bytes]:
    got = []
    while sock.poll(200):
        got.append(sock.recv())
    return got


@pytest.mark.parametrize("frames, draining", [(1023, False), (1024, True)])
def test_the_clock_is_read_every_1024_frames_drained(rig: Rig, frames: int, draining: bool) -> None:
    # 33 envelope frames after the routing id are dropped at once; then `frames` more before
    # the body are drained, the clock read after every 1,024 (it says the slice is over), and
    # after the message as after any.
    peer = rig.peer()
    peer.send_multipart([b"e"] * (MAX_ENVELOPE_FRAMES + 1 + frames) + [b"body"])
    rig.arrived()
    rig.clock.now = 1500  # exactly the slice's end: over
    rig.rr.run({}, 1000, 1500)
    assert (rig.rr.next_deadline(77) == 77) is draining  # draining: due at once
    assert rig.clock.reads == 1  # within the message, or after it
    rig.rr.run({}, 1500, 10**9)
    assert rig.rr.next_deadline(77) is None  # not draining


def test_every_oversized_request_is_counted(rig: Rig) -> None:
    peer = rig.peer()
    for _ in range(3):
        peer.send_multipart([b"e"] * (MAX_ENVELOPE_FRAMES + 1) + [b"dropped"])
    peer.send(b"after")
    rig.arrived()
    wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 1)[1], timeout=10)
    assert rig.rr.dropped_requests == 3


def test_each_peer_has_its_own_reply_budget(ctx) -> None:
    budget = ReplyBudget(burst=50, rate=1, total_burst=10**6, total_rate=10**6, heavy_bytes=20)
    rig = Rig(ctx, "two-budgets", budget=budget)
    try:
        a, b = rig.peer(), rig.peer()
        a.send(b"size:40")
        wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 1)[1], timeout=10)
        b.send(b"size:40")  # another peer: its own 50 bytes
        wait_for(lambda: (rig.rr.run({}, 1000, 10**9), len(rig.service.calls) == 2)[1], timeout=10)
        assert reply_of(a) == [b"r" * 40] and reply_of(b) == [b"r" * 40]
        assert budget.refused == 0
    finally:
        rig.close()


@pytest.mark.timeout(30)
def test_a_peer_that_reads_nothing_never_blocks_the_router(ctx) -> None:
    router = ctx.socket(zmq.ROUTER)
    RequestRouter.configure(router, 1 << 20)
    router.setsockopt(zmq.SNDHWM, 1)
    router.setsockopt(zmq.SNDBUF, 4096)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.RCVHWM, 1)
    peer.setsockopt(zmq.RCVBUF, 4096)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(f"tcp://127.0.0.1:{port}")
    service = FakeService()
    rr = RequestRouter(router, service, Puts(), clock=Clock(),  # type: ignore[arg-type]
                       max_message_bytes=1 << 20, reply_budget=ReplyBudget(), with_key=False)
    try:
        for _ in range(200):
            peer.send(b"size:65536")
        wait_for(lambda: (rr.run({}, 1000, 10**9), len(service.calls) == 200)[1], timeout=20)
        assert rr.dropped_replies > 0  # the rest did not fit: dropped, never waited for
    finally:
        peer.close(0)
        router.close(0)

"""A worker's forwarded writes do not hold its loop (zns.core.forwarding, zns.drivers.worker).

The state process is stopped (SIGSTOP) while writes are at it: a worker must go on
answering every other connection, hold a writing connection's later requests behind
its write (each connection answered in order, read-your-writes), refuse writes past
its in-flight bound with `busy`, and stop reading ZNS/1 requests past its held bound;
/metrics counts each of those, labelled with the worker.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from helpers import LOADED_DEADLINE, Peer, ProcessServer, register_fields, wait_for
from zns.core import schema
from zns.core.forwarding import DEFAULT_MAX_IN_FLIGHT
from zns.core.remoting import RemotingCommand
from zns.drivers.request_router import MAX_HELD_REQUESTS

pytestmark = pytest.mark.timeout(120)

# How long a reply that must not come is waited for: long enough that a worker serving
# would have answered (its answers take a few ms), not a bound on anything.
QUIET_S = 1.0



@pytest.fixture
def one_worker(tmp_path: Path) -> Iterator[ProcessServer]:
    server = ProcessServer(tmp_path, "--workers", "1", "--remoting", "127.0.0.1:0",
                           "--metrics", "127.0.0.1:0")
    try:
        wait_for(lambda: "serving requests on" in server.output()
                 and "loaded the state" in server.output())
        yield server
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        assert server.stop() == 0


def stopped(server: ProcessServer) -> Any:
    """Stop the state process (its worker keeps running) until the block ends."""

    class Stopped:
        def __enter__(self) -> None:
            os.kill(server.proc.pid, signal.SIGSTOP)

        def __exit__(self, *exc: object) -> None:
            os.kill(server.proc.pid, signal.SIGCONT)

    return Stopped()


def worker_counter(server: ProcessServer, name: str) -> float:
    """Worker 1's `name` in /metrics (answered by the worker's own thread, the state process
    stopped or not)."""
    from prometheus_client.parser import text_string_to_metric_families
    from test_metrics import get

    port = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/", server.output())[0]
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    (value,) = [s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == name and s.labels == {"worker": "1"}]
    return value


def request(peer: Peer, op: str, id: int, **fields: Any) -> None:
    peer.send_raw(schema.encode({"op": op, "id": id, **fields}))


def reply(peer: Peer, timeout: float = LOADED_DEADLINE) -> Any:
    return schema.decode_reply(peer.recv_raw(timeout)[-1])


def test_a_write_at_the_state_process_delays_no_other_connection_and_its_own_waits_in_order(
        one_worker: ProcessServer, ctx: zmq.Context) -> None:
    writer, reader = Peer(one_worker.router, ctx=ctx), Peer(one_worker.router, ctx=ctx)
    assert reader.ok("status").worker == 1  # both connections are on the one worker
    with stopped(one_worker):
        request(writer, "register_broker", 1, **register_fields(topics={"T": {}}))
        request(writer, "get_route", 2, topic="T")  # after the write: must see it
        # Another connection is answered while the write waits for the state process.
        for _ in range(20):
            assert reader.ok("status").revision == 0
        assert isinstance(reader.call("get_route", topic="T"), schema.Error)
        # The writer's read is not answered before its write.
        assert not writer.dealer.poll(int(QUIET_S * 1000))
    first, second = reply(writer), reply(writer)
    assert first.id == 1 and not isinstance(first, schema.Error), first
    assert second.id == 2 and second.route.brokers[0].broker_name == "broker-a"


def test_writes_of_many_connections_are_at_the_state_process_together(
        one_worker: ProcessServer, ctx: zmq.Context) -> None:
    """Up to the in-flight bound; one past it is answered `busy` at once, and the rest
    are answered once the state process runs again."""
    writers = [Peer(one_worker.router, ctx=ctx) for _ in range(DEFAULT_MAX_IN_FLIGHT + 1)]
    for peer in writers:
        peer.ok("status")  # connected: each request below reaches the worker
    assert worker_counter(one_worker, "zns_worker_writes_refused_total") == 0
    with stopped(one_worker):
        for n, peer in enumerate(writers):
            request(peer, "kv_put", 1, namespace="ns", key=f"k{n}", value="v")
        # Whichever write the worker reads last (a ROUTER takes its connections in turn)
        # is one too many: answered `busy` while the others wait for the state process.
        poller = zmq.Poller()
        for peer in writers:
            poller.register(peer.dealer, zmq.POLLIN)
        answered = dict(poller.poll(int(LOADED_DEADLINE * 1000)))
        assert len(answered) == 1
        refused = next(p for p in writers if p.dealer in answered)
        last = reply(refused)
        assert isinstance(last, schema.Error) and last.code == "busy", last
        assert "writes are already at the state process" in last.message
        assert not poller.poll(int(QUIET_S * 1000))  # none of the others is answered
        assert worker_counter(one_worker, "zns_worker_writes_refused_total") == 1
    for peer in writers:
        if peer is not refused:
            answer = reply(peer)
            assert not isinstance(answer, schema.Error), answer
    assert len(writers[0].ok("kv_list", namespace="ns").entries) == DEFAULT_MAX_IN_FLIGHT


def test_writes_waiting_for_a_stalled_state_process_are_bounded_by_their_bytes_as_forwarded(
        one_worker: ProcessServer, ctx: zmq.Context) -> None:
    # A write is forwarded encoded with every field: a registration whose 20,000 topics
    # came as `{}` (116 KB) is 1.1 MB on the channel. Under the in-flight count (256), 80
    # such writes at a stopped state process made the worker hold 88 MB unsent (256 of them
    # would be 285 MB, their requests counting 30 MB of the held 64 MiB; 256 of 127-character
    # names 920 MB, past the 512 MiB at which the channel ends and the worker stops). Now
    # the bytes waiting for the state process to read them are bounded (64 MiB): the writes
    # past it are answered `busy` at once, the others once the state process runs again.
    from zns.core.forwarding import DEFAULT_MAX_QUEUED_BYTES

    topics = {f"{n:x}": {} for n in range(20_000)}
    body = schema.encode({"op": "register_broker", "id": 1, **register_fields(topics=topics)})
    writers = [Peer(one_worker.router, ctx=ctx) for _ in range(80)]
    for peer in writers:
        peer.ok("status")  # connected: each request below reaches the worker
    with stopped(one_worker):
        for peer in writers:
            peer.send_raw(body)
        poller = zmq.Poller()
        for peer in writers:
            poller.register(peer.dealer, zmq.POLLIN)
        # Those past the bound are refused as the worker reads them; the others wait.
        refused: list[Peer] = []
        while events := dict(poller.poll(int(QUIET_S * 1000) * 3)):
            for peer in [p for p in writers if p.dealer in events]:
                answer = reply(peer)
                assert isinstance(answer, schema.Error) and answer.code == "busy", answer
                assert "bytes of writes wait for the state process" in answer.message
                refused.append(peer)
                poller.unregister(peer.dealer)
        # ~1.1 MB each: 64 MiB takes about 61 of them (and the kernel's buffer one more).
        forwarded = len(writers) - len(refused)
        assert forwarded * 1_100_000 <= DEFAULT_MAX_QUEUED_BYTES + 2_000_000, forwarded
        assert refused, "no write was refused: their bytes at the state process are unbounded"
        assert worker_counter(one_worker, "zns_worker_writes_refused_total") == len(refused)
    for peer in writers:
        if peer not in refused:
            answer = reply(peer)
            assert not isinstance(answer, schema.Error), answer
    assert writers[0].ok("status").topics == len(topics)


def test_past_the_held_bound_the_worker_stops_reading_requests_until_its_writes_are_answered(
        one_worker: ProcessServer, ctx: zmq.Context) -> None:
    writer, other = Peer(one_worker.router, ctx=ctx), Peer(one_worker.router, ctx=ctx)
    other.ok("status")
    total = MAX_HELD_REQUESTS + 10
    assert worker_counter(one_worker, "zns_worker_request_pauses_total") == 0
    with stopped(one_worker):
        request(writer, "kv_put", 0, namespace="ns", key="k", value="v")
        for n in range(1, MAX_HELD_REQUESTS - 10):  # held behind the write
            request(writer, "kv_get", n, namespace="ns", key="k")
        # Under the bound, the other connection is answered (once all those are read)...
        wait_for(lambda: other.call("status", id=98).worker == 1)
        for n in range(MAX_HELD_REQUESTS - 10, total):
            request(writer, "kv_get", n, namespace="ns", key="k")
        # ...past it (once the worker has read that far: a ROUTER takes its connections in
        # turn), nothing more is read.
        wait_for(lambda: _unanswered(other))
        assert worker_counter(one_worker, "zns_worker_request_pauses_total") == 1
    # Once the write is answered, everything is, each connection in order.
    assert reply(other).id == 99
    for n in range(total):
        answer = reply(writer)
        assert answer.id == n and not isinstance(answer, schema.Error), answer
        if n:
            assert answer.value == "v"


def _unanswered(peer: Peer) -> bool:
    """Send a status (id 99) and see it not answered for QUIET_S (else: take the reply)."""
    request(peer, "status", 99)
    if peer.dealer.poll(int(QUIET_S * 1000)):
        peer.recv_raw()
        return False
    return True


def test_remoting_a_write_at_the_state_process_delays_no_other_connection(
        one_worker: ProcessServer) -> None:
    from test_remoting_listener import Client, register_cmd

    endpoint = re.findall(r"RocketMQ remoting on (\S+)", one_worker.output())[0]
    broker, reader = Client(endpoint), Client(endpoint)
    try:
        assert reader.call(RemotingCommand(code=106, version=479)).code == 0
        with stopped(one_worker):
            registered = broker.send(register_cmd(topics=("Remote",)))
            read = broker.send(RemotingCommand(code=105, version=479,
                                               ext_fields={"topic": "Remote"}))
            for _ in range(20):  # another connection: answered meanwhile
                assert reader.call(RemotingCommand(code=105, version=479,
                                                   ext_fields={"topic": "Remote"})).code == 17
            with pytest.raises((AssertionError, TimeoutError)):
                broker.recv(timeout=QUIET_S)  # its own read waits behind its write
        first, second = broker.recv(), broker.recv()
        assert (first.opaque, first.code) == (registered, 0)
        assert (second.opaque, second.code) == (read, 0)
        assert b"broker-a" in second.body
    finally:
        broker.close()
        reader.close()


# --- in process: a worker's request router around a ReplicaService, its channel faked ------


class FakeLink:
    """What ReplicaService asks of its ReplicaLink: forward a command, get a token."""

    pending = 0  # the state process reads every byte at once

    def __init__(self) -> None:
        self.forwarded: list[bytes] = []

    def forward(self, request: bytes) -> int:
        self.forwarded.append(request)
        return len(self.forwarded)

    def run(self) -> None:
        pass  # nothing comes from the state process


@pytest.fixture
def worker_router(ctx: zmq.Context) -> Iterator[tuple[Any, Any, zmq.Socket]]:
    from test_request_router import Clock, Puts
    from zns.core.budget import ReplyBudget
    from zns.drivers.loop import PollSet
    from zns.drivers.request_router import RequestRouter
    from zns.drivers.worker import ReplicaService

    service = ReplicaService(1, started_at_ms=0)
    service.link = FakeLink()  # type: ignore[assignment]
    router = ctx.socket(zmq.ROUTER)
    router.bind("inproc://worker-router")
    requests = RequestRouter(router, service, Puts(), clock=Clock(),  # type: ignore[arg-type]
                             max_message_bytes=1 << 20, reply_budget=ReplyBudget(),
                             with_key=False)
    requests.attach(PollSet())
    peer = ctx.socket(zmq.DEALER)
    peer.connect("inproc://worker-router")
    yield service, requests, peer
    peer.close(0)
    router.close(0)


def test_a_write_whose_answer_does_not_come_in_time_is_answered_busy_and_its_late_answer_dropped(
        worker_router: tuple[Any, Any, zmq.Socket]) -> None:
    from zns.drivers.worker import WRITE_TIMEOUT_MS, ReplicaSource

    from test_metrics import Idle, collected

    service, requests, peer = worker_router
    # What /metrics shows of this worker (1): its live counts.
    observed = Idle()
    observed.service, observed.worker = service, 1
    timed_out = ("zns_worker_writes_timed_out_total", (("worker", "1"),))
    assert collected(observed)[timed_out] == 0
    peer.send(schema.encode({"op": "kv_put", "id": 5, "namespace": "ns", "key": "k",
                             "value": "v"}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), service.forwarded.in_flight == 1)[1])
    assert not peer.poll(0) and requests.next_deadline(1000) is None
    # The replication channel's source of the worker's loop runs the writes' timer.
    source = ReplicaSource(service.link, service.forwarded, lambda: None)
    assert source.next_deadline(1000) == 1000 + WRITE_TIMEOUT_MS
    source.run({}, 1000 + WRITE_TIMEOUT_MS - 1, 10**9)
    assert requests.next_deadline(1000 + WRITE_TIMEOUT_MS - 1) is None  # not yet
    now = 1000 + WRITE_TIMEOUT_MS
    source.run({}, now, 10**9)
    assert requests.next_deadline(now) == now  # its request is finished: `busy`
    requests.run({}, now, now + 5)
    answer = schema.decode_reply(peer.recv())
    assert isinstance(answer, schema.Error) and answer.id == 5 and answer.code == "busy", answer
    assert "did not answer this write in time" in answer.message
    assert collected(observed)[timed_out] == 1
    service.answered(1, b"late")  # dropped: nobody waits for it
    assert not service.forwarded.ready and requests.next_deadline(now) is None


def test_past_the_held_bytes_the_worker_stops_reading_having_held_at_most_one_request_more(
        worker_router: tuple[Any, Any, zmq.Socket], ctx: zmq.Context) -> None:
    # The held bytes' bound (MAX_HELD_BYTES) is checked once a request is held: the one that
    # reaches it is held whole, so what is held is the bound plus at most one request of
    # max_message_bytes (docs/operations.md: 64 MiB + 16 MiB). Nothing more is read until a
    # write is answered, from any connection.
    service, requests, peer = worker_router
    requests.max_held_bytes = bound = 2 << 20
    largest = requests.max_message_bytes  # the fixture's 1 MiB
    peer.send(schema.encode({"op": "kv_put", "id": 1, "namespace": "ns", "key": "k",
                             "value": "v"}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), service.forwarded.in_flight == 1)[1])
    for _ in range(6):  # each as large as a request may be, held behind the write
        peer.send(b"x" * largest)
    other = ctx.socket(zmq.DEALER)
    try:
        other.connect("inproc://worker-router")
        wait_for(lambda: (requests.run({}, 1000, 10**9), requests.held_bytes >= bound)[1])
        other.send(schema.encode({"op": "status", "id": 2}))
        for _ in range(20):
            requests.run({}, 1000, 10**9)  # paused: reads nothing more
        assert bound <= requests.held_bytes <= bound + largest + 64, requests.held_bytes
        assert requests.held_requests == 3 and service.forwarded.request_pauses == 1
        assert not other.poll(0)
    finally:
        other.close(0)


def test_a_write_answered_is_replied_from_its_answer_then_the_requests_behind_it(
        worker_router: tuple[Any, Any, zmq.Socket]) -> None:
    import msgspec

    from zns.core.state import Outcome
    from zns.drivers.worker import WriteAnswer

    service, requests, peer = worker_router
    peer.send(schema.encode({"op": "kv_put", "id": 1, "namespace": "ns", "key": "k",
                             "value": "v"}))
    peer.send(schema.encode({"op": "status", "id": 2}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), requests.held_requests == 2)[1])
    assert not peer.poll(0)
    service.answered(1, msgspec.msgpack.encode(WriteAnswer(
        outcome=Outcome(), reply=schema.encode(schema.KvPutReply(id=1)))))
    assert requests.next_deadline(1000) == 1000
    requests.run({}, 1000, 1005)
    first, second = (schema.decode_reply(peer.recv()) for _ in range(2))
    assert (type(first), first.id) == (schema.KvPutReply, 1)
    assert (type(second), second.id) == (schema.StatusReply, 2)
    assert requests.held_requests == 0 and requests.held_bytes == 0
    assert not service.forwarded.ready


def test_past_the_held_bytes_the_worker_stops_reading_requests_the_one_that_crossed_held(
        worker_router: tuple[Any, Any, zmq.Socket]) -> None:
    # docs/operations.md: past MAX_HELD_BYTES of held requests the worker reads no more
    # until some are answered. The request that crossed the bound was read already and is
    # held: the bytes held reach at most the bound plus one request. Here at 10,000 bytes.
    import msgspec

    from zns.core.state import Outcome
    from zns.drivers.worker import WriteAnswer

    service, requests, peer = worker_router
    requests.max_held_bytes = 10_000
    bodies = [schema.encode({"op": "kv_put", "id": n, "namespace": "ns", "key": f"k{n}",
                             "value": "x" * 4_000}) for n in range(1, 5)]
    for body in bodies:
        peer.send(body)
    # The first is forwarded; the next two wait behind it, and the third crosses the bound.
    wait_for(lambda: (requests.run({}, 1000, 10**9), requests.held_requests == 3)[1])
    for _ in range(3):
        requests.run({}, 1000, 10**9)
    assert requests.held_requests == 3 and service.forwarded.request_pauses == 1
    assert 10_000 <= requests.held_bytes < 10_000 + len(bodies[2]) + 64  # and its routing id
    assert service.forwarded.in_flight == 1
    service.answered(1, msgspec.msgpack.encode(WriteAnswer(
        outcome=Outcome(), reply=schema.encode(schema.KvPutReply(id=1)))))
    # The first is answered and the second forwarded in its turn: under the bound again,
    # the worker reads on, the fourth, which crosses it again.
    wait_for(lambda: (requests.run({}, 1000, 10**9), requests.held_requests == 3)[1])
    assert schema.decode_reply(peer.recv()).id == 1
    assert service.forwarded.in_flight == 1 and service.forwarded.request_pauses == 2
    assert 10_000 <= requests.held_bytes < 10_000 + len(bodies[3]) + 64


def test_the_requests_an_answer_releases_are_served_in_the_loops_slices(
        worker_router: tuple[Any, Any, zmq.Socket]) -> None:
    # The requests held behind a write (up to 512) are answered once its answer is here.
    # They were all answered in one turn, with no look at the clock: 450 `get_routes` of
    # 20,000 topics (140 KB each: within the held bounds) held the worker's loop 9.1 s, its
    # `hb` and every other connection waiting. Now they are served in the loop's slices:
    # the clock read every CLOCK_EVERY requests, the rest left for the loop's next turn
    # once the slice has ended (0.45 s).
    import msgspec

    from zns.core.state import Outcome
    from zns.drivers.request_router import CLOCK_EVERY
    from zns.drivers.worker import WriteAnswer

    service, requests, peer = worker_router
    peer.send(schema.encode({"op": "kv_put", "id": 0, "namespace": "ns", "key": "k",
                             "value": "v"}))
    for n in range(1, 101):
        peer.send(schema.encode({"op": "status", "id": n}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), requests.held_requests == 101)[1])
    service.answered(1, msgspec.msgpack.encode(WriteAnswer(
        outcome=Outcome(), reply=schema.encode(schema.KvPutReply(id=0)))))
    answered: list[int] = []

    def take() -> int:
        count = 0
        while peer.poll(0):
            answered.append(schema.decode_reply(peer.recv()).id)
            count += 1
        return count

    requests.run({}, 1000, 1000)  # a slice over at once
    assert 1 <= take() <= CLOCK_EVERY + 1
    for _ in range(200):
        if len(answered) == 101:
            break
        assert requests.next_deadline(1000) == 1000  # the rest is due at once
        requests.run({}, 1000, 1000)
        take()
    assert answered == list(range(101))  # in order
    assert requests.held_requests == 0 and requests.next_deadline(1000) is None


def test_a_forwarded_write_takes_in_what_the_state_process_wrote_before_it_is_parked(
        worker_router: tuple[Any, Any, zmq.Socket]) -> None:
    # Under --cpus the state process runs on the worker's core while the worker sends the
    # write, so the write's command, events and answer are in the channel when the send
    # returns. The worker takes them in at once (the catch-up a read makes), before it parks
    # the request: the events leave and the answer is ready at once. Before, they waited
    # for the worker's next pass over its channel (push p50 +82 against +34 us).
    import msgspec

    from zns.core.state import Outcome
    from zns.drivers.worker import WriteAnswer

    service, requests, peer = worker_router
    caught_up: list[int] = []  # the writes in flight each time the worker caught up

    def take_in_written() -> None:  # the state process's answer, written while it sent
        caught_up.append(service.forwarded.in_flight)
        service.answered(1, msgspec.msgpack.encode(WriteAnswer(
            outcome=Outcome(), reply=schema.encode(schema.KvPutReply(id=1)))))

    service.take_in_written = take_in_written
    peer.send(schema.encode({"op": "kv_put", "id": 1, "namespace": "ns", "key": "k",
                             "value": "v"}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), requests.held_requests == 1)[1])
    assert caught_up == [1]  # after the write was forwarded
    assert requests.next_deadline(1000) == 1000  # its answer is here: replied next turn
    requests.run({}, 1000, 1005)
    answer = schema.decode_reply(peer.recv())
    assert (type(answer), answer.id) == (schema.KvPutReply, 1)
    assert caught_up == [1] and not service.forwarded.ready


def test_a_forwarded_write_larger_than_the_channel_buffer_goes_on_as_the_state_process_reads():
    # A registration of thousands of topics is larger than the socketpair's buffer: the
    # worker's loop polls its channel for writing while bytes are pending, and writes the
    # rest as the state process reads. Before, the channel was polled for reading only, and
    # the rest waited for the state process's next message (up to a second: its expiry
    # step, the figures), about 0.4 s of the 0.5 s a 10,000-topic registration took in the
    # storm benchmark with 2 workers.
    import socket

    from zns.core.forwarding import ForwardedWrites
    from zns.core.replication import Forward, Replica, decode_to_primary
    from zns.drivers.loop import PollSet
    from zns.drivers.replication_link import HEADER, ReplicaLink
    from zns.drivers.worker import ReplicaSource

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setblocking(False)
    link = ReplicaLink(ours, Replica(), apply=lambda seq, command, produce: [],
                       load=lambda seq, dump: None, publish=lambda seq, events: None)
    source = ReplicaSource(link, ForwardedWrites(timeout_ms=30_000), lambda: None)
    poll = PollSet()
    source.attach(poll)
    request = os.urandom(4 << 20)  # more than any socketpair buffer holds
    token = link.forward(request)
    assert link.channel.pending
    received = bytearray()
    while link.channel.pending:
        source.next_deadline(0)  # the loop asks every source before it polls
        while True:  # the state process reads what is there
            try:
                received += theirs.recv(1 << 20)
            except BlockingIOError:
                break
        ready = dict(poll.poller.poll(1_000))  # the worker's loop
        assert ready.get(ours.fileno(), 0) & zmq.POLLOUT, "the channel is not polled for writing"
        source.run(ready, 0, 10**9)
    while len(received) < HEADER.size + len(request) + 64:
        try:
            received += theirs.recv(1 << 20)
        except BlockingIOError:
            break
    (size,) = HEADER.unpack_from(received)
    assert decode_to_primary(bytes(received[HEADER.size:HEADER.size + size])) == Forward(
        token, request)
    ours.close()
    theirs.close()


def test_a_worker_whose_replica_fails_to_apply_a_command_stops(
        caplog: pytest.LogCaptureFixture) -> None:
    # The fence passes a command once it is written to every worker (zns.core.replication),
    # so a worker that fails to apply one (a bug, or a Renew of what its replica does not
    # hold) must not serve on: other workers would publish that command's events while this
    # one answers from a state without it, and its later events would wait behind the one
    # never produced. It stops, and the state process starts another from a state transfer.
    # Before, the loop logged the exception and the worker carried on.
    import socket

    from zns.core.forwarding import ForwardedWrites
    from zns.core.replication import Ack, Apply, Replica, State, decode_to_primary, encode
    from zns.drivers.replication_link import HEADER, ReplicaLink
    from zns.drivers.worker import ReplicaSource

    def apply(seq: int, command: bytes, produce: bool) -> list[bytes]:
        raise RuntimeError("a bug while applying")

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    link = ReplicaLink(ours, Replica(), apply=apply, load=lambda seq, dump: None,
                       publish=lambda seq, events: None)
    stopped: list[bool] = []
    source = ReplicaSource(link, ForwardedWrites(timeout_ms=30_000), lambda: stopped.append(True))
    for message in (State(seq=0, dump=b""), Apply(seq=1, command=b"command", events=None)):
        body = encode(message)
        theirs.sendall(HEADER.pack(len(body)) + body)
    wait_for(lambda: select_readable(ours))
    with caplog.at_level(logging.ERROR, logger="zns"):
        source.run({}, 0, 10**9)
    assert stopped == [True] and source.failed  # the worker exits with code 1
    # At ERROR, with its traceback (docs/operations.md, Workers); the worker's filter names it.
    (record,) = [r for r in caplog.records if r.exc_info]
    assert record.levelno == logging.ERROR and "a bug while applying" in caplog.text
    assert record.getMessage() == ("a bug while applying the state process's commands; "
                                   "stopping")
    # It acknowledged nothing: not the command it failed to apply.
    theirs.setblocking(False)
    try:
        received = theirs.recv(1 << 16)
    except BlockingIOError:
        received = b""
    acks = []
    while received:
        (size,) = HEADER.unpack_from(received)
        acks.append(decode_to_primary(received[HEADER.size:HEADER.size + size]))
        received = received[HEADER.size + size:]
    assert Ack(1) not in acks
    ours.close()
    theirs.close()


@pytest.mark.parametrize("failure", ["apply", "decode"])
def test_a_worker_that_stopped_on_its_channel_answers_no_more_reads(failure: str) -> None:
    # A replica hands out a command (its `applied` moves) before the driver applies it; when
    # applying it raises, or a later message of the batch cannot be decoded, the commands
    # handed out are not all applied, and the worker stops. It stops at the end of its
    # loop's pass, though, and every read meanwhile first catches up (`ReplicaSource.
    # catch_up`): the counter of what was written is no higher than `applied`, so, before,
    # that read was answered, from a state without the commands, while other workers had
    # published their events. Now the source refuses every read once it stopped the worker.
    import socket

    from zns.core.errors import Busy
    from zns.core.forwarding import ForwardedWrites
    from zns.core.replication import Apply, Replica, State, encode
    from zns.drivers.replication_link import HEADER, ReplicaLink, WrittenSeq
    from zns.drivers.worker import ReplicaSource

    applied: list[int] = []

    def apply(seq: int, command: bytes, produce: bool) -> list[bytes]:
        if failure == "apply" and seq == 1:
            raise RuntimeError("a bug while applying")
        applied.append(seq)
        return []

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    written = WrittenSeq()
    link = ReplicaLink(ours, Replica(), apply=apply, load=lambda seq, dump: None,
                       publish=lambda seq, events: None, written=written)
    stopped: list[bool] = []
    source = ReplicaSource(link, ForwardedWrites(timeout_ms=30_000), lambda: stopped.append(True),
                           lambda: bool(stopped))
    bodies = [encode(State(seq=0, dump=b"")), encode(Apply(seq=1, command=b"c1", events=[])),
              encode(Apply(seq=2, command=b"c2", events=[]))]
    if failure == "decode":  # no msgpack at all (the state process's bug) after both
        bodies.append(b"\xc1")
    theirs.sendall(b"".join(HEADER.pack(len(body)) + body for body in bodies))
    written.set(2)  # as the state process does once the kernel took them
    wait_for(lambda: select_readable(ours))
    with pytest.raises(Busy):
        source.catch_up()  # the read that met the failure
    assert stopped == [True] and 2 not in applied
    with pytest.raises(Busy):
        source.catch_up()  # a later read of the same pass: refused too
    source.run({}, 0, 10**9)  # and the loop's turn applies nothing more
    assert 2 not in applied and stopped == [True]
    written.close()
    ours.close()
    theirs.close()


def select_readable(sock: Any) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


# --- a forwarded write is decoded once: finished from what its first decode produced -------


def _answer_register(service: Any, token: int, request_id: int = 1) -> None:
    import msgspec

    from zns.core.state import Outcome
    from zns.drivers.worker import WriteAnswer

    service.answered(token, msgspec.msgpack.encode(WriteAnswer(
        outcome=Outcome(), reply=schema.encode(schema.RegisterBrokerReply(id=request_id)))))


def test_a_forwarded_zns1_write_is_decoded_once(
        worker_router: tuple[Any, Any, zmq.Socket], monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the parked request was handled again from its bytes once the answer came:
    # decoded twice (51 µs each for 100 topics, a third of the forwarding worker's CPU).
    import zns.core.service

    service, requests, peer = worker_router
    decoded: list[bytes] = []
    decode = zns.core.service.decode_request
    monkeypatch.setattr(zns.core.service, "decode_request",
                        lambda body: (decoded.append(body), decode(body))[1])
    topics = {f"T{n}": {} for n in range(100)}
    peer.send(schema.encode({"op": "register_broker", "id": 1, **register_fields(topics=topics)}))
    peer.send(schema.encode({"op": "status", "id": 2}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), requests.held_requests == 2)[1])
    assert len(decoded) == 1 and service.forwarded.in_flight == 1
    _answer_register(service, 1)
    requests.run({}, 1000, 1005)
    first, second = (schema.decode_reply(peer.recv()) for _ in range(2))
    assert (type(first), first.id) == (schema.RegisterBrokerReply, 1)
    assert (type(second), second.id) == (schema.StatusReply, 2)
    assert len(decoded) == 2  # the write once, then the status held behind it
    assert service.ok_counts[schema.RegisterBroker] == 1
    assert requests.held_requests == 0 and not service.forwarded.ready


def test_a_forwarded_zns1_write_refused_by_the_state_process_is_answered_from_its_id(
        worker_router: tuple[Any, Any, zmq.Socket], caplog: pytest.LogCaptureFixture) -> None:
    import msgspec

    from zns.core.errors import Conflict
    from zns.drivers.worker import WriteAnswer

    service, requests, peer = worker_router
    peer.send(schema.encode({"op": "register_broker", "id": 7, **register_fields()}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), service.forwarded.in_flight == 1)[1])
    refused = Conflict("taken").reply(7)
    service.answered(1, msgspec.msgpack.encode(WriteAnswer(error=refused)))
    with caplog.at_level("WARNING", logger="zns"):
        requests.run({}, 1000, 1005)
    answer = schema.decode_reply(peer.recv())
    assert isinstance(answer, schema.Error) and (answer.id, answer.code) == (7, refused.code)
    assert service.error_counts["register_broker", refused.code] == 1
    # The warning names the broker from what the first pass kept of the request.
    assert [r.getMessage() for r in caplog.records] == [
        "broker c1/broker-a id 0 at 10.0.0.1:10911 refused: taken"]


@pytest.fixture
def worker_listener() -> Iterator[tuple[Any, Any, Any]]:
    from test_remoting_listener import Client
    from zns.core.remoting.handler import RemotingService
    from zns.drivers.remoting_listener import RemotingListener
    from zns.drivers.worker import ReplicaService

    service = ReplicaService(1, started_at_ms=0)
    service.link = FakeLink()  # type: ignore[assignment]
    listener = RemotingListener("127.0.0.1:0", RemotingService(service), now=1000,
                                max_frame_bytes=16 << 20)
    client = Client(listener.endpoint)
    yield service, listener, client
    client.close()
    listener.close()


def test_a_forwarded_remoting_write_is_decoded_once(
        worker_listener: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the parked REGISTER_BROKER was handled again once the answer came: its body
    # decoded twice (135 µs each for 100 topics).
    import zns.core.remoting.handler as handler
    from test_remoting_listener import register_cmd

    service, listener, client = worker_listener
    decoded: list[bytes] = []
    decode = handler.decode_register_broker_body
    monkeypatch.setattr(handler, "decode_register_broker_body",
                        lambda body, **kw: (decoded.append(body), decode(body, **kw))[1])
    registered = client.send(register_cmd(topics=tuple(f"T{n}" for n in range(100))))
    read = client.send(RemotingCommand(code=105, version=479, ext_fields={"topic": "T1"}))
    wait_for(lambda: (listener.run({}, 1000, 10**9), service.forwarded.in_flight == 1)[1])
    assert len(decoded) == 1
    _answer_register(service, 1)
    assert listener.next_deadline(1000) == 1000
    listener.run({}, 1000, 10**9)
    first, second = client.recv(), client.recv()
    assert (first.opaque, first.code) == (registered, 0)
    assert (second.opaque, second.code) == (read, 17)  # this replica applied nothing
    assert len(decoded) == 1
    assert service.remoting_counts[103, 0] == 1
    assert not service.forwarded.ready


def test_a_remoting_connection_closed_with_its_answered_write_unresumed_leaves_no_answer(
        worker_listener: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # A parked write whose answer came while its connection could not be answered (over its
    # unsent replies: it waits for them to drain) is out of the listener's waiting list; if
    # the connection then closed, its answer stayed in `ready` for good, one per such close.
    from test_remoting_listener import register_cmd

    service, listener, client = worker_listener
    client.send(register_cmd(topics=("T1",)))
    wait_for(lambda: (listener.run({}, 1000, 10**9), service.forwarded.in_flight == 1)[1])
    monkeypatch.setattr(listener.policy, "may_answer", lambda unsent: False)
    (entry,) = listener.connections.values()
    entry.unsent += b"\0" * (8 << 20)  # replies the client has not read (never drained here)
    _answer_register(service, 1)
    listener.run({}, 1000, 10**9)  # resumed, but not answered: the policy says wait
    assert service.forwarded.ready
    client.close()  # with replies unread: a reset, so the listener's next send fails
    wait_for(lambda: (listener.run({}, 1000, 10**9), not listener.connections)[1])
    listener.run({}, 1000, 10**9)
    assert not service.forwarded.ready


def test_closes_of_remoting_connections_that_wrote_nothing_cost_the_state_process_nothing(
        worker_listener: tuple[Any, Any, Any]) -> None:
    # Before: every close was sent to the state process (one command per worker turn with a
    # close), so a peer opening and closing connections in a loop, or clients that only read
    # routes, made it decode and look up each one. Only a connection that forwarded a write
    # can have tied a broker; only those closes are sent now, and all of them.
    from test_remoting_listener import Client, register_cmd
    from zns.core.state import CloseConnections, decode_command

    service, listener, broker = worker_listener
    link = service.link
    for n in range(100):  # the flood: connect, maybe read a route, close
        client = Client(listener.endpoint)
        if n % 2:
            client.send(RemotingCommand(code=105, version=479, ext_fields={"topic": "T1"}))
        wait_for(lambda: (listener.run({}, 1000, 10**9), len(listener.connections) == 2)[1])
        client.close()
        wait_for(lambda: (listener.run({}, 1000, 10**9), len(listener.connections) == 1)[1])
    assert link.forwarded == []  # not one message to the state process
    # A broker's connection registers (forwarded), then closes along with a reader's: the
    # close names it, and it alone.
    reader = Client(listener.endpoint)
    broker.send(register_cmd(topics=("T1",)))
    wait_for(lambda: (listener.run({}, 1000, 10**9), service.forwarded.in_flight == 1)[1])
    [registering] = [entry.conn.conn_id for entry in listener.connections.values()
                     if entry.token is not None]  # its write, waiting for its answer
    assert len(listener.connections) == 2 and len(link.forwarded) == 1
    _answer_register(service, 1)
    listener.run({}, 1000, 10**9)
    assert broker.recv().code == 0  # registered
    reader.close()
    broker.close()
    wait_for(lambda: (listener.run({}, 1000, 10**9), not listener.connections)[1])
    assert len(link.forwarded) == 2
    assert decode_command(link.forwarded[1]) == CloseConnections(connections=[registering])


def test_a_parked_write_keeps_what_its_reply_needs_not_its_decoded_request(
        worker_router: tuple[Any, Any, zmq.Socket], ctx: zmq.Context) -> None:
    # docs/operations.md: besides the bytes the router counts, each parked write keeps at
    # most PARKED_WRITE_BYTES, whatever its size; a decoded registration of 2,000 topics
    # takes ~0.5 MB (several times its bytes), which keeping the decoded request would hold.
    import gc
    import tracemalloc

    from zns.drivers.request_router import PARKED_WRITE_BYTES

    service, requests, peer = worker_router
    service.link = _TokensOnly()  # what the channel holds is not the router's
    name = "\U0001f600" * 255  # the longest names, 4 bytes a character in memory
    fields = register_fields(cluster=name, broker_name=name, addr=".".join(["a" * 63] * 3 + ["b" * 60]) + ":1",
                             topics={f"Topic{n:05d}": {} for n in range(2_000)})
    body = schema.encode({"op": "register_broker", "id": 1, **fields})
    writers = [ctx.socket(zmq.DEALER) for _ in range(10)]
    try:
        for writer in writers:
            writer.connect("inproc://worker-router")

        def park(senders: list[zmq.Socket]) -> None:
            in_flight = service.forwarded.in_flight
            for sender in senders:
                sender.send(body)
            wait_for(lambda: (requests.run({}, 1000, 10**9),
                              service.forwarded.in_flight == in_flight + len(senders))[1])

        tracemalloc.start()  # before the first write: what it allocates is traced too
        try:
            park([peer])  # the first one: what any write allocates once (dicts, caches)
            gc.collect()
            before = tracemalloc.take_snapshot()
            park(writers)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert requests.held_requests == 11
        assert kept <= len(writers) * PARKED_WRITE_BYTES, kept
    finally:
        for writer in writers:
            writer.close(0)


class _TokensOnly:
    """A ReplicaLink that forwards nothing anywhere: a token per write, nothing kept."""

    pending = 0

    def __init__(self) -> None:
        self.sent = 0

    def forward(self, request: bytes) -> int:
        self.sent += 1
        return self.sent


def test_a_worker_that_is_stopping_refuses_a_write_busy_instead_of_forwarding_it(
        worker_router: tuple[Any, Any, zmq.Socket]) -> None:
    # Once its state process is gone (or its replica failed) a worker ends at the end of
    # its loop's pass. A write read in that pass was forwarded and never answered: its
    # client waited for its own timeout. It is refused `busy` at once now, as reads are.
    service, requests, peer = worker_router
    stopped: list[bool] = []
    service.gone = lambda: stopped.append(True)
    service.stop_serving()
    assert stopped == [True]
    peer.send(schema.encode({"op": "kv_put", "id": 7, "namespace": "ns", "key": "k",
                             "value": "v"}))
    wait_for(lambda: (requests.run({}, 1000, 10**9), peer.poll(0))[1])
    reply = schema.decode_reply(peer.recv())
    assert isinstance(reply, schema.Error) and reply.code == "busy" and reply.id == 7
    assert "stopping" in reply.message
    assert service.link.forwarded == [] and service.forwarded.in_flight == 0

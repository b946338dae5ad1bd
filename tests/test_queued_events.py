"""Events queued for subscribers that do not read: the rule (zns.core.subscriptions.QueuedEvents,
no sockets) and the bound on a real server (`--pub-max-queued-bytes`)."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from helpers import Peer, register_fields
from zns.core import schema
from zns.core.subscriptions import EVENT_OVERHEAD_BYTES, LOOK_EVERY_BYTES, QueuedEvents

pytestmark = pytest.mark.timeout(60)


def publish(queued: QueuedEvents, charged: int, size: int = 128) -> bool:
    """Events of `size` bytes charged `charged` bytes in all; whether a look came due."""
    due = False
    for _ in range(charged // (size + EVENT_OVERHEAD_BYTES)):
        due = queued.published(size) or due
    return due


def test_a_look_is_due_every_mib_published_counting_each_event_s_overhead():
    queued = QueuedEvents()
    assert EVENT_OVERHEAD_BYTES == 128
    assert not publish(queued, LOOK_EVERY_BYTES - 256)
    assert queued.published(128)
    queued.looked({})
    assert not queued.published(128)  # counted from the last look


def test_a_connection_that_acknowledged_nothing_with_bytes_waiting_is_charged_what_was_published():
    queued = QueuedEvents(total=10 * LOOK_EVERY_BYTES, hwm=1_000_000)
    publish(queued, LOOK_EVERY_BYTES)
    assert queued.looked({1: (500, 9), 2: (500, 9), 3: (500, 0)}) == []
    assert queued.held == 0  # first seen: nothing to compare with
    publish(queued, LOOK_EVERY_BYTES)
    # 1 read nothing and has bytes waiting: behind; 2 acknowledged more: reading; 3 has
    # nothing waiting: up to date.
    assert queued.looked({1: (500, 9), 2: (600, 9), 3: (500, 0)}) == []
    assert queued.held == LOOK_EVERY_BYTES
    publish(queued, LOOK_EVERY_BYTES)
    queued.looked({1: (500, 9), 2: (600, 9), 3: (500, 0)})
    assert queued.held == 2 * LOOK_EVERY_BYTES + LOOK_EVERY_BYTES  # 1 twice, 2 once
    publish(queued, LOOK_EVERY_BYTES)
    queued.looked({1: (501, 9), 2: (600, 0)})  # 1 read a byte: owes nothing any more
    assert queued.held == 0


def test_a_charge_stops_at_the_mark_the_socket_drops_at():
    queued = QueuedEvents(total=10**12, hwm=1000)  # 1,000 events of 128 + 128 bytes
    publish(queued, LOOK_EVERY_BYTES)
    queued.looked({1: (0, 1)})
    publish(queued, LOOK_EVERY_BYTES)
    queued.looked({1: (0, 1)})
    assert queued.held == 1000 * 256


def test_past_the_total_the_connections_furthest_behind_are_cut_until_the_rest_fit():
    queued = QueuedEvents(total=3 * LOOK_EVERY_BYTES, hwm=10**9)
    publish(queued, LOOK_EVERY_BYTES)
    queued.looked({1: (0, 1), 2: (0, 1), 3: (0, 1)})
    publish(queued, LOOK_EVERY_BYTES)
    assert queued.looked({1: (0, 1), 2: (0, 1), 3: (0, 1)}) == []  # 3 x 4 MiB: the total
    publish(queued, LOOK_EVERY_BYTES)
    # 4 joined late: 4 MiB behind it, none; 1, 2, 3 twice that each: 24 MiB > 12 MiB.
    cut = queued.looked({1: (0, 1), 2: (0, 1), 3: (0, 1), 4: (0, 1)})
    assert len(cut) == 2 and set(cut) <= {1, 2, 3}
    assert queued.held == 2 * LOOK_EVERY_BYTES and queued.cut == 2
    publish(queued, LOOK_EVERY_BYTES)
    (kept,) = {1, 2, 3} - set(cut)
    # The cut are forgotten: were their descriptors reused, the new ones start afresh.
    assert queued.looked({kept: (0, 1), 4: (0, 1), cut[0]: (0, 1)}) == [kept]


# --- a real server -------------------------------------------------------------------------


SUBSCRIBERS = 100
TOPICS = 20_000
ROUNDS = 4  # each registers and unregisters the broker: two events per topic


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(300)
def test_subscribers_that_do_not_read_hold_the_total_not_each_their_mark(process_server):
    # Before: non-reading SUBs subscribed to everything cost +24 MiB each while a 20,000-topic
    # broker restarted six times; 200 of them +4.8 GB.
    srv = process_server()
    ctx = zmq.Context()
    requests = Peer(srv.router, ctx=ctx)
    reader = Peer(srv.router, srv.pub, ctx=ctx)
    reader.subscribe(b"")
    reader.wait_subscribed()
    stop, read = threading.Event(), [0]

    def keep_reading() -> None:  # a subscriber that reads everything: never cut
        assert reader.sub is not None
        while not stop.is_set():
            if reader.sub.poll(100):
                reader.sub.recv_multipart()
                read[0] += 1

    idle = []
    for _ in range(SUBSCRIBERS):
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 1)
        sub.setsockopt(zmq.RCVBUF, 4096)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(srv.pub)
        idle.append(sub)
    thread = threading.Thread(target=keep_reading, daemon=True)
    try:
        for sub in idle:  # each subscribed for sure: it received something
            assert sub.poll(30_000)
        thread.start()
        before = rss_mib(srv.proc.pid)
        topics = {f"topic-{i:05d}": {} for i in range(TOPICS)}
        fields = register_fields(topics=topics, heartbeat_timeout_ms=600_000)
        for _ in range(ROUNDS):
            requests.ok("register_broker", **fields)
            assert rss_mib(srv.proc.pid) - before <= 300, srv.output()[-3000:]
            requests.ok("unregister_broker", **{k: fields[k] for k in
                                                ("cluster", "broker_name", "broker_id",
                                                 "broker_addr")})
            assert rss_mib(srv.proc.pid) - before <= 300, "RSS over the budget"
        assert "events subscriber" in srv.output() and "read none of the events" in srv.output()
        # The reader got every event (2 per topic per round), and was never cut.
        deadline = time.monotonic() + 60
        while read[0] < 2 * TOPICS * ROUNDS and time.monotonic() < deadline:
            time.sleep(0.1)
        assert read[0] >= 2 * TOPICS * ROUNDS
        grown = rss_mib(srv.proc.pid) - before  # every event published by now
        print(f"RSS +{grown:.0f} MiB; {srv.output().count('read none of the events')} cut")
        assert grown <= 300
    finally:
        stop.set()
        thread.join(10) if thread.is_alive() else None
        for sub in idle:
            sub.close(0)
        requests.close()
        reader.close()
        ctx.term()

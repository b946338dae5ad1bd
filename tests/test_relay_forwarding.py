"""What a relay subscribes to upstream (zns.core.subscriptions.Forwarding, no sockets), and a
relay under a subscriber that subscribes to more than the NameServer takes (real sockets)."""

from __future__ import annotations

import time

import pytest
import zmq

from helpers import SplitServer, ThreadedServer, register_fields, wait_for
from zns.core import schema
from zns.core.subscriptions import (
    DEFAULT_PEER_BUDGET,
    RELAY_UPSTREAM_BUDGET,
    Forwarding,
    subscription_cost,
)
from zns.drivers.event_relay import Relay

pytestmark = pytest.mark.timeout(60)


def test_each_distinct_channel_is_subscribed_upstream_once_and_unsubscribed_with_its_last():
    forwarding = Forwarding()
    assert forwarding.subscribed(1, b"route/T1") == [b"\x01route/T1"]
    assert forwarding.subscribed(2, b"route/T1") == []  # held already
    assert forwarding.subscribed(2, b"route/T1") == []  # a repeat of one subscriber
    assert forwarding.unsubscribed(1, b"route/T1") == []  # 2 still holds it
    assert forwarding.unsubscribed(1, b"route/T1") == []  # not held by 1 any more
    assert forwarding.closed(2) == [b"\x00route/T1"]
    assert forwarding.upstream == set() and forwarding.cost == 0
    assert forwarding.closed(3) == []


def test_past_the_budget_the_family_is_subscribed_instead_of_its_channels():
    cost = subscription_cost(b"route/T0")
    forwarding = Forwarding(budget=2 * cost)
    assert RELAY_UPSTREAM_BUDGET == DEFAULT_PEER_BUDGET // 2
    assert forwarding.subscribed(1, b"route/T0") == [b"\x01route/T0"]
    assert forwarding.subscribed(1, b"broker/") == [b"\x01broker/"]  # within the budget too
    # The third does not fit: its family instead, and the family's channels let go.
    assert forwarding.subscribed(1, b"route/T2") == [b"\x01route/", b"\x00route/T0"]
    assert forwarding.upstream == {b"broker/", b"route/"}
    assert forwarding.cost == subscription_cost(b"broker/")  # a family is not charged
    assert forwarding.subscribed(2, b"route/T3") == []  # covered
    assert forwarding.resubscribe() == [b"\x01broker/", b"\x01route/"]
    # A channel of no family falls back to everything.
    assert forwarding.subscribed(2, b"x" * 100) == [b"\x01", b"\x00broker/"]
    # The family goes when no subscriber holds a channel in it.
    assert forwarding.closed(1) == []  # route/T3 and the x...: still held by 2
    assert forwarding.unsubscribed(2, b"route/T3") == [b"\x00route/"]
    assert forwarding.closed(2) == [b"\x00"]
    assert forwarding.upstream == set() and forwarding.cost == 0


def test_a_channel_that_is_its_family_is_charged_until_it_becomes_the_fallback():
    forwarding = Forwarding(budget=subscription_cost(b"route/") + subscription_cost(b"route/T"))
    assert forwarding.subscribed(1, b"route/") == [b"\x01route/"]
    assert forwarding.subscribed(1, b"route/T") == [b"\x01route/T"]
    assert forwarding.subscribed(1, b"route/U") == [b"\x00route/T"]  # route/ covers them now
    assert forwarding.cost == 0
    assert forwarding.unsubscribed(1, b"route/") == []  # the family still holds route/T, U
    assert forwarding.closed(1) == [b"\x00route/"]


# --- a relay under attack ------------------------------------------------------------------


ATTACKERS = 2
SUBSCRIPTIONS = 400  # of 1 KiB each, per attacker: more than the NameServer takes from one
INTERVAL_S = 0.5


def _attacker(endpoint: str) -> zmq.Socket:
    """A subscriber holding SUBSCRIPTIONS distinct subscriptions of 1 KiB."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    for i in range(SUBSCRIPTIONS):
        sub.setsockopt(zmq.SUBSCRIBE, (b"%06d" % i) * 170 + b"0000")
    return sub


@pytest.mark.timeout(120)
@pytest.mark.single_process("reads the NameServer's events budget's cuts at once (a split server's /metrics shows them a report interval late)")
def test_subscribers_over_the_nameserver_s_budget_do_not_get_the_relay_cut(tmp_path):
    # Before: 400 subscriptions of 1 KB made the NameServer cut the relay's upstream, again at
    # every resubscription (41-64 cuts), and no relay subscriber got an `hb` for 20-30 s.
    srv = ThreadedServer(tmp_path, heartbeat_interval_s=INTERVAL_S)
    relay = Relay(srv.router, "tcp://127.0.0.1:*")
    listener = zmq.Context.instance().socket(zmq.SUB)
    listener.setsockopt(zmq.LINGER, 0)
    listener.setsockopt(zmq.SUBSCRIBE, schema.HB_CHANNEL)
    attackers: list[zmq.Socket] = []
    try:
        listener.connect(relay.endpoint)
        assert listener.poll(30_000), "no hb through the relay"
        listener.recv_multipart()
        attackers = [_attacker(relay.endpoint) for _ in range(ATTACKERS)]
        hbs = [time.monotonic()]
        while time.monotonic() - hbs[0] < 8:
            if listener.poll(int(4 * INTERVAL_S * 1000)):
                listener.recv_multipart()
            hbs.append(time.monotonic())
        gaps = [b - a for a, b in zip(hbs, hbs[1:])]
        assert max(gaps) <= 2 * INTERVAL_S, gaps
        assert srv.server.subscribers.budget.cut == 0, "the NameServer cut the relay"
        assert relay.upstream_cuts == 0
        assert relay.forwarding.cost <= RELAY_UPSTREAM_BUDGET
        # The relay counted each attacker as the NameServer would, and cut it.
        wait_for(lambda: relay.subscribers.budget.cut == ATTACKERS)
    finally:
        for sock in attackers:
            sock.close(0)
        listener.close(0)
        relay.close()
        srv.stop()


@pytest.mark.timeout(60)
@pytest.mark.single_process("cuts the relay's connection through the server's subscribers")
def test_a_relay_cut_by_the_nameserver_waits_before_it_subscribes_again(tmp_path, caplog):
    srv = ThreadedServer(tmp_path, heartbeat_interval_s=0.2)
    relay = Relay(srv.router, "tcp://127.0.0.1:*")
    listener = zmq.Context.instance().socket(zmq.SUB)
    listener.setsockopt(zmq.LINGER, 0)
    listener.setsockopt(zmq.SUBSCRIBE, schema.HB_CHANNEL)
    try:
        listener.connect(relay.endpoint)
        assert listener.poll(30_000), "no hb through the relay"
        # The NameServer cuts the relay's events connection (as it cuts one over budget).
        wait_for(lambda: srv.server.subscribers.connections)
        (fd,) = srv.server.subscribers.connections
        assert srv.server.subscribers.cut(fd, "a test")
        wait_for(lambda: relay.upstream_cuts == 1)
        assert any("the NameServer closed the events connection (1 times since start); "
                   "subscribing again in" in m for m in caplog.messages)
        while listener.poll(0):
            listener.recv_multipart()
        assert listener.poll(30_000), "the relay did not subscribe again"
    finally:
        listener.close(0)
        relay.close()
        srv.stop()


@pytest.mark.timeout(120)
def test_a_relay_s_subscribers_that_read_nothing_hold_its_total_not_each_their_mark(tmp_path):
    # As on the NameServer (tests/test_queued_events.py), with a total of 4 MiB: subscribers
    # reading nothing are cut once they hold more together; one that reads is not.
    srv = SplitServer(tmp_path, heartbeat_interval_s=0.2)
    relay = Relay(srv.router, "tcp://127.0.0.1:*", max_queued_bytes=4 * 1024 * 1024)
    ctx = zmq.Context.instance()
    idle = []
    reader = ctx.socket(zmq.SUB)
    reader.setsockopt(zmq.LINGER, 0)
    reader.setsockopt(zmq.RCVHWM, 0)  # its libzmq reads on while the test is busy elsewhere
    reader.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        reader.connect(relay.endpoint)
        for _ in range(10):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 1)
            sub.setsockopt(zmq.RCVBUF, 4096)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(relay.endpoint)
            idle.append(sub)
        for sub in idle + [reader]:
            assert sub.poll(30_000)  # subscribed: an hb came through
        requests = srv.peer()
        topics = {f"topic-{i:05d}-{'x' * 100}": {} for i in range(5000)}
        for round_ in range(4):
            requests.ok("register_broker", **register_fields(topics=topics))
            requests.ok("unregister_broker", cluster="c1", broker_name="broker-a",
                        broker_id=0, broker_addr="10.0.0.1:10911")
            while reader.poll(0):
                reader.recv_multipart()
        wait_for(lambda: relay.subscribers.queued.cut >= 1)
        assert relay.subscribers.queued.held <= 4 * 1024 * 1024
        # The reader is never cut: it still gets what happens next.
        requests.ok("register_broker", **register_fields(topics={"after": {}}))
        deadline = time.monotonic() + 30
        while reader.recv_multipart()[0] != schema.route_channel("after"):
            assert time.monotonic() < deadline, "the reader was cut"
    finally:
        for sub in idle:
            sub.close(0)
        reader.close(0)
        relay.close()
        srv.stop()

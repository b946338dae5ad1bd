"""§7 over a real PUB socket: channels, exact and prefix subscriptions, broker
changes and reasons, the prev chain, one revision per request, silence for
requests that change nothing, and `hb`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import Peer, SplitServer, register_fields
from zns.core import schema


def events_until_quiet(peer: Peer) -> list[tuple[bytes, Any]]:
    """Every event published before now: read until an `hb` sent after this call.

    The loop publishes a request's events before its next `hb`, and a PUB
    socket keeps their order, so such an `hb` closes everything sent earlier.
    """
    since_ms = time.time() * 1000
    seen = []
    while True:
        channel, event = peer.next_event()
        if channel == schema.HB_CHANNEL:
            if event.time_ms > since_ms:
                return seen
        else:
            seen.append((channel, event))


def subscriber(server: SplitServer, *prefixes: bytes) -> Peer:
    peer = server.peer()
    peer.subscribe(schema.HB_CHANNEL, *prefixes)
    peer.wait_subscribed()
    return peer


def test_exact_channel_gets_one_topic_and_prefix_gets_all(server: SplitServer):
    exact = subscriber(server, schema.route_channel("T"))
    prefix = subscriber(server, schema.ROUTE_PREFIX)
    broker_only = subscriber(server, schema.BROKER_PREFIX)
    admin = server.peer()
    admin.ok("register_broker", **register_fields(topics={"T": {}, "TT": {}, "T2": {}}))

    exact_seen = events_until_quiet(exact)
    assert [ch for ch, _ in exact_seen] == [b"route/T\0"]
    assert exact_seen[0][1].topic == "T"
    assert sorted(ch for ch, _ in events_until_quiet(prefix)) == [
        b"route/T\0", b"route/T2\0", b"route/TT\0"]
    assert [ch for ch, _ in events_until_quiet(broker_only)] == [b"broker/c1/broker-a\0"]

    admin.ok("delete_topic", topic="TT")
    assert events_until_quiet(exact) == []
    [(channel, event)] = events_until_quiet(prefix)
    assert channel == b"route/TT\0" and event.route is None


def test_route_event_carries_what_get_route_returns(server: SplitServer):
    peer = subscriber(server, schema.ROUTE_PREFIX)
    peer.ok("register_broker", **register_fields(topics={"T": {"read_queues": 3}}))
    [(_, event)] = events_until_quiet(peer)
    reply = peer.ok("get_route", topic="T")
    assert event.route == reply.route
    assert (event.revision, event.epoch) == (reply.revision, reply.epoch)


def test_broker_events_for_every_change_and_reason(server: SplitServer):
    peer = subscriber(server, schema.BROKER_PREFIX)

    def broker_events() -> list[tuple[str, str, str, int]]:
        out = []
        for channel, event in events_until_quiet(peer):
            assert channel == schema.broker_channel(event.cluster, event.broker_name)
            out.append((event.change, event.reason, event.broker_addr, event.broker_id))
        return out

    a1, a2, a3 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"
    peer.ok("register_broker", **register_fields(addr=a1))
    assert broker_events() == [("registered", "", a1, 0)]
    # The same registration again changes nothing.
    peer.ok("register_broker", **register_fields(addr=a1))
    assert broker_events() == []
    # A new HA address, then a new id for the same address: `updated`.
    peer.ok("register_broker", **register_fields(addr=a1, ha_addr="10.0.0.1:10912"))
    assert broker_events() == [("updated", "", a1, 0)]
    peer.ok("register_broker", **register_fields(addr=a1, broker_id=2,
                                                 ha_addr="10.0.0.1:10912"))
    assert broker_events() == [("updated", "", a1, 2)]
    # Another address takes id 2: the holder is displaced.
    peer.ok("register_broker", **register_fields(addr=a2, broker_id=2,
                                                 data_version={"state": 1}))
    assert sorted(broker_events()) == [("registered", "", a2, 2), ("removed", "displaced", a1, 2)]
    # A refused registration (conflict) publishes nothing.
    refused = peer.call("register_broker", **register_fields(addr=a3, broker_id=2))
    assert refused.code == "conflict"
    assert broker_events() == []
    peer.ok("unregister_broker", cluster="c1", broker_name="broker-a", broker_id=2,
            broker_addr=a2)
    assert broker_events() == [("removed", "unregistered", a2, 2)]
    peer.ok("register_broker", **register_fields(addr=a3, heartbeat_timeout_ms=1000))
    assert broker_events() == [("registered", "", a3, 0)]
    _, event = peer.next_event(lambda ch, ev: isinstance(ev, schema.BrokerEvent), timeout=15)
    assert (event.change, event.reason, event.broker_addr) == ("removed", "expired", a3)


def test_prev_chain_links_every_change_of_a_topic(server: SplitServer):
    peer = subscriber(server, schema.route_channel("T"))
    assert peer.call("get_route", topic="T").revision == 0

    steps = [
        ("register_broker", register_fields(topics={"T": {}})),
        ("register_broker", register_fields(broker_name="broker-b", addr="10.0.0.2:1",
                                            topics={"T": {}})),
        ("wipe_write_perm", {"broker_name": "broker-a"}),
        ("kv_put", {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "broker-a:4"}),
        ("delete_topic", {"topic": "T", "cluster": "c1"}),
        ("register_topic", {"topic": "T", "queues": [dict(
            broker_name="broker-b", read_queues=1, write_queues=1, perm=6, sys_flag=0)]}),
    ]
    remembered = 0
    for op, fields in steps:
        peer.ok(op, **fields)
        [(_, event)] = events_until_quiet(peer)
        assert event.prev == remembered, (op, event)
        assert event.revision > remembered
        remembered = event.revision
        reply = peer.call("get_route", topic="T")
        if event.route is None:
            assert reply.code == "not_found" and reply.revision == event.revision
        else:
            assert reply.revision == event.revision and reply.route == event.route
    assert event.route.order_conf == "broker-a:4"


def test_one_revision_per_request_shared_by_all_its_events(server: SplitServer):
    peer = subscriber(server, schema.ROUTE_PREFIX, schema.BROKER_PREFIX)
    before = peer.ok("status").revision
    peer.ok("register_broker", **register_fields(topics={f"T{i}": {} for i in range(5)}))
    events = events_until_quiet(peer)
    assert len(events) == 6  # one broker event, five route events
    assert {event.revision for _, event in events} == {before + 1}
    assert peer.ok("status").revision == before + 1

    # Removing the broker's only address: a broker event and five routes gone, one revision.
    peer.ok("unregister_broker", cluster="c1", broker_name="broker-a", broker_id=0,
            broker_addr="10.0.0.1:10911")
    events = events_until_quiet(peer)
    assert len(events) == 6
    assert {event.revision for _, event in events} == {before + 2}
    assert all(event.route is None for _, event in events if isinstance(event, schema.RouteEvent))


NO_CHANGE_REQUESTS = [
    ("heartbeat", dict(cluster="c1", broker_name="broker-a", broker_id=0,
                       broker_addr="10.0.0.1:10911")),
    ("heartbeat", dict(cluster="c1", broker_name="nobody", broker_id=0,
                       broker_addr="10.9.9.9:1")),
    ("register_broker", register_fields(topics={"T": {}})),
    ("unregister_broker", dict(cluster="c1", broker_name="nobody", broker_id=0,
                               broker_addr="10.9.9.9:1")),
    ("add_write_perm", dict(broker_name="broker-a")),
    ("wipe_write_perm", dict(broker_name="nobody")),
    ("delete_topic", dict(topic="Nope")),
    ("delete_topic", dict(topic="T", cluster="other")),
    ("register_topic", dict(topic="T", queues=[dict(
        broker_name="broker-a", read_queues=16, write_queues=16, perm=6, sys_flag=0)])),
    ("register_topic", dict(topic="T", queues=[dict(
        broker_name="nobody", read_queues=1, write_queues=1, perm=6, sys_flag=0)])),
    ("kv_put", dict(namespace="ns", key="k", value="v")),
    ("kv_delete", dict(namespace="ns", key="absent")),
    ("kv_put", dict(namespace="ORDER_TOPIC_CONFIG", key="NoSuchTopic", value="broker-a:1")),
    ("get_route", dict(topic="T")),
    ("snapshot", {}),
]


@pytest.fixture(scope="module")
def quiet_server(tmp_path_factory) -> Iterator[tuple[Peer, Peer]]:
    """One server for the no-change cases (each checks it changed nothing)."""
    srv = SplitServer(tmp_path_factory.mktemp("quiet"))
    watcher = subscriber(srv, schema.ROUTE_PREFIX, schema.BROKER_PREFIX)
    watcher.ok("register_broker", **register_fields(topics={"T": {}}))
    events_until_quiet(watcher)
    yield watcher, srv.peer()
    srv.stop()


@pytest.mark.parametrize("op, fields", NO_CHANGE_REQUESTS,
                         ids=[f"{i}-{op}" for i, (op, _) in enumerate(NO_CHANGE_REQUESTS)])
def test_requests_that_change_nothing_publish_nothing(quiet_server, op, fields):
    watcher, peer = quiet_server
    before = peer.ok("snapshot")
    peer.call(op, **fields)  # some are refused (unknown broker), which changes nothing too
    assert events_until_quiet(watcher) == []
    after = peer.ok("snapshot")
    assert after.revision == before.revision == peer.ok("status").revision
    assert (after.routes, after.brokers, after.clusters) == (
        before.routes, before.brokers, before.clusters)


@pytest.mark.timeout(30)
def test_hb_every_interval_with_current_epoch_revision_and_time(server: SplitServer):
    peer = subscriber(server)
    status = peer.ok("status")
    hbs = []
    while len(hbs) < 6:
        _, event = peer.next_event()
        hbs.append((time.time(), event))
    for received_at, hb in hbs:
        assert hb.epoch == status.epoch and hb.revision == status.revision
        assert abs(hb.time_ms / 1000 - received_at) < 5
    span_ms = hbs[-1][1].time_ms - hbs[0][1].time_ms
    assert 5 * 200 * 0.5 <= span_ms <= 5 * 200 * 5  # every 0.2 s, loosely

    peer.ok("register_broker", **register_fields())
    revision = peer.ok("status").revision
    assert revision == status.revision + 1
    since_ms = time.time() * 1000
    _, hb = peer.next_event(lambda ch, ev: ev.time_ms > since_ms)
    assert hb.revision == revision

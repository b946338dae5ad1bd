"""ClientSession (zns.core.client_session) on its own: exact actions, deadlines and defaults.

Socket-free and clock-free: every reply and event is built here and `now` is handed in.
"""

from __future__ import annotations

import logging
import random

import msgspec
import pytest

from zns.core.backoff import Backoff
from zns.core.client_session import (
    MAX_TOPIC_CHANNELS,
    ClientSession,
    FollowServer,
    ConnectEvents,
    Notify,
    SendBytes,
    Subscribe,
    Unsubscribe,
    check_topic,
)
from zns.core.errors import UsageError
from zns.core.schema import (
    HB_CHANNEL,
    ROUTE_PREFIX,
    BrokerData,
    Error,
    GetRoutes,
    GetRoutesReply,
    HbEvent,
    QueueData,
    RouteEvent,
    Status,
    StatusReply,
    TopicRoute,
    decode_reply,
    decode_request,
    encode,
    route_channel,
)

EPOCH = "e" * 16


def route(n: int) -> TopicRoute:
    return TopicRoute(topic="T", queues=[QueueData(broker_name="b", read_queues=n, write_queues=1,
                                                   perm=6, sys_flag=0)],
                      brokers=[], filter_servers={})


def status_reply(request_id: int, pub: str = "tcp://0.0.0.0:7") -> bytes:
    return encode(StatusReply(id=request_id, epoch=EPOCH, revision=0, version="x", uptime_ms=0,
                              brokers=0, topics=0, pub_endpoint=pub))


def hb(epoch: str = EPOCH) -> bytes:
    return encode(HbEvent(epoch=epoch, revision=0, time_ms=0))


def sent(actions: list) -> list:
    """The requests among `actions`, decoded."""
    return [decode_request(a.body) for a in actions if isinstance(a, SendBytes)]


def connected(endpoints: list[str] | None = None, now: int = 0, **kw) -> ClientSession:
    """A session that asked `status` and got its answer at `now` (actions drained)."""
    session = ClientSession(endpoints or ["tcp://h1:1"], **kw)
    session.start(now)
    (status,) = sent(session.actions())
    session.on_reply(status_reply(status.id), now)
    session.actions()
    return session


def test_check_topic_accepts_a_topic_and_refuses_others():
    assert check_topic("Ok_Topic-1%|") == "Ok_Topic-1%|"
    for bad in ("", "a b", "x" * 128):
        with pytest.raises(UsageError, match="is not a topic"):
            check_topic(bad)


def test_no_endpoint_is_a_usage_error():
    with pytest.raises(UsageError, match="^no NameServer endpoint$"):
        ClientSession([])


def test_start_connects_and_asks_status_with_the_first_request_id():
    endpoints = ["tcp://h1:1"]
    session = ClientSession(endpoints)
    endpoints.append("tcp://h2:1")  # the session keeps its own copy
    assert session.endpoints == ["tcp://h1:1"] and session.endpoint is None
    assert session.next_deadline() is None and not session.connected
    assert (session.switches, session.pulls) == (0, 0)
    session.start(500)
    actions = session.actions()
    assert actions[0] == FollowServer("tcp://h1:1") and session.endpoint == "tcp://h1:1"
    assert sent(actions) == [Status(id=1)] and len(actions) == 2
    assert session.actions() == []  # each action is handed out once
    assert session.next_deadline() == 500 + 3_000  # the default request timeout
    assert not session.connected  # no `status` answer yet


def test_the_start_endpoint_is_drawn_from_the_rng():
    endpoints = [f"tcp://h{i}:1" for i in range(5)]
    picks = set()
    for seed in range(30):
        session = ClientSession(endpoints, rng=random.Random(seed))
        session.start(0)
        picks.add(session.endpoint)
    assert len(picks) > 1
    for seed in range(5):
        session = ClientSession(endpoints, rng=random.Random(seed))
        session.start(0)
        assert session.endpoint == endpoints[random.Random(seed).randrange(5)]


def test_status_reply_subscribes_topics_then_channels_then_hb_and_times_silence():
    session = ClientSession(["tcp://h1:1"], heartbeat_interval_ms=400, request_timeout_ms=700,
                            channels=(b"broker/", b"x/"))
    session.start(0)
    (status,) = sent(session.actions())
    session.track("T", 10)
    session.track("U", 10)
    assert session.actions() == []  # nothing to subscribe to before `status` named the PUB
    session.on_reply(status_reply(status.id, "tcp://0.0.0.0:7"), 100)
    actions = session.actions()
    assert actions[:6] == [ConnectEvents("tcp://h1:7"), Subscribe(route_channel("T")),
                           Subscribe(route_channel("U")), Subscribe(b"broker/"), Subscribe(b"x/"),
                           Subscribe(HB_CHANNEL)]
    assert sent(actions[6:]) == [GetRoutes(id=2, topics=["T", "U"])] and len(actions) == 7
    assert session.connected and session.pub_endpoint == "tcp://h1:7" and session.pulls == 1
    # The pull times out at 800; silence would at 100 + 700 + 3 * 400.
    assert session.next_deadline() == 800
    pull = sent(actions)[0]
    session.on_reply(encode(GetRoutesReply(id=pull.id, routes={}, revisions={"T": 0, "U": 0},
                                           missing=["T", "U"], epoch=EPOCH)), 150)
    assert session.actions() == [Notify("T", None), Notify("U", None)]
    assert session.next_deadline() == 100 + 700 + 3 * 400
    session.on_timer(100 + 700 + 3 * 400 - 1)
    assert session.switches == 0
    session.on_timer(100 + 700 + 3 * 400)  # silent exactly until the deadline: gone
    assert session.switches == 1 and session.actions() == [FollowServer(None)]


def test_the_default_heartbeat_interval_sets_the_silence_deadline():
    session = connected(now=0)
    assert session.next_deadline() == 3_000 + 3 * 1_000  # default request timeout and interval
    session.on_event(hb(), 1_000)
    assert session.next_deadline() == 1_000 + 3 * 1_000


def test_events_relay_replaces_the_nameservers_own_pub():
    session = ClientSession(["tcp://h1:1"], events="tcp://relay:9")
    session.start(0)
    (status,) = sent(session.actions())
    session.on_reply(status_reply(status.id, "tcp://0.0.0.0:7"), 0)
    assert session.actions() == [ConnectEvents("tcp://relay:9"), Subscribe(HB_CHANNEL)]
    assert session.pub_endpoint == "tcp://relay:9"


def test_pull_then_event_notify_and_the_periodic_pull_uses_the_default_period():
    session = connected(now=0)
    session.track("T", 0)
    actions = session.actions()
    assert actions[0] == Subscribe(route_channel("T"))
    (pull,) = sent(actions)
    assert pull == GetRoutes(id=2, topics=["T"]) and session.pulls == 1
    session.on_reply(encode(GetRoutesReply(id=pull.id, routes={"T": route(1)}, revisions={"T": 1},
                                           missing=[], epoch=EPOCH)), 1_000)
    assert session.actions() == [Notify("T", route(1))]
    session.on_event(hb(), 1_000)  # proves the subscription: the pull is confirmed
    (again,) = sent(session.actions())
    # Pulled by revision: the revision held is sent, and the route still at it is not resent.
    assert again == GetRoutes(id=3, topics=["T"], held_epoch=EPOCH, held={"T": 1})
    assert session.pulls == 2
    session.on_reply(encode(GetRoutesReply(id=again.id, routes={}, revisions={"T": 1},
                                           missing=[], epoch=EPOCH, unchanged=["T"])), 1_000)
    assert session.actions() == []  # unchanged: nothing to notify
    assert session.cache.view("T") == route(1) and session.cache.is_current("T")
    session.on_event(encode(RouteEvent(epoch=EPOCH, revision=2, prev=1, topic="T", route=route(2))),
                     1_100)
    assert session.actions() == [Notify("T", route(2))]
    # The periodic pull: 30 s (the default) after the first pull answer.
    session.on_event(hb(), 30_000)
    session.on_timer(30_999)
    assert session.actions() == []
    session.on_event(hb(), 31_000)
    session.on_timer(31_000)
    assert sent(session.actions()) == [GetRoutes(id=4, topics=["T"], held_epoch=EPOCH,
                                                 held={"T": 2})]


def test_track_of_a_kept_topic_subscribes_once():
    session = connected()
    session.track("T", 0)
    assert session.actions()[0] == Subscribe(route_channel("T"))
    session.track("T", 0)
    assert session.actions() == []


def test_error_reply_moves_to_the_next_nameserver(caplog):
    session = connected(["tcp://h1:1", "tcp://h2:1"], rng=random.Random(0),
                        backoff=Backoff(100, 10_000, random.Random(0)))
    first = session.endpoint
    session.track("T", 0)
    (pull,) = sent(session.actions())
    with caplog.at_level(logging.WARNING, logger="zns.client"):
        session.on_reply(encode(Error(id=pull.id, code="bad_request", message="no")), 50)
    assert session.actions() == [FollowServer(None)]
    assert session.switches == 1 and session.endpoint is None and session.pub_endpoint is None
    assert not session.connected
    resume = session.next_deadline()
    other = "tcp://h2:1" if first == "tcp://h1:1" else "tcp://h1:1"
    assert caplog.messages == [f"{first} answered get_routes with bad_request: no",
                               f"NameServer {first}: get_routes refused; trying {other} "
                               f"in {resume - 50} ms"]
    assert 50 + 50 <= resume <= 50 + 100  # the first backoff: 50-100 ms
    session.on_timer(resume - 1)
    assert session.actions() == []
    session.on_timer(resume)
    actions = session.actions()
    assert actions[0] == FollowServer("tcp://h2:1" if first == "tcp://h1:1" else "tcp://h1:1")
    assert sent(actions) == [Status(id=3)]
    assert session.next_deadline() == resume + 3_000


def test_the_endpoint_index_wraps_around():
    session = ClientSession(["tcp://h1:1", "tcp://h2:1", "tcp://h3:1"], rng=random.Random(0))
    session.start(0)
    seen = [session.endpoint]
    now = 0
    for _ in range(6):
        now += 3_000
        session.on_timer(now)  # the status request timed out
        now = session.next_deadline()
        session.on_timer(now)
        seen.append(session.endpoint)
    i = session.endpoints.index(seen[0])
    assert seen == [session.endpoints[(i + k) % 3] for k in range(7)]


def test_a_request_times_out_exactly_at_its_deadline():
    session = ClientSession(["tcp://h1:1"], request_timeout_ms=1_000)
    session.start(0)
    session.actions()
    session.on_timer(999)
    assert session.switches == 0 and session.actions() == []
    session.on_timer(1_000)
    assert session.switches == 1 and session.actions() == [FollowServer(None)]


def test_the_default_backoff_doubles_up_to_ten_seconds():
    session = ClientSession(["tcp://h1:1"], request_timeout_ms=1_000, rng=random.Random(3))
    session.start(0)
    now, delays = 0, []
    for _ in range(12):
        now += 1_000
        session.on_timer(now)
        delays.append(session.next_deadline() - now)
        now = session.next_deadline()
        session.on_timer(now)
    assert 50 <= delays[0] <= 100 and 100 <= delays[1] <= 200
    assert all(5_000 <= d <= 10_000 for d in delays[-3:])


def test_unreadable_or_unexpected_input_is_ignored(caplog):
    session = connected()
    session.track("T", 0)
    session.actions()
    deadline = session.next_deadline()
    with caplog.at_level(logging.WARNING, logger="zns.client"):
        session.on_reply(b"\xc1 not msgpack", 10)
        session.on_event(b"\xc1 not msgpack", 10)
    try:
        decode_reply(b"\xc1 not msgpack")
    except msgspec.DecodeError as exc:
        why = str(exc)
    assert why and caplog.messages == [f"unreadable reply from tcp://h1:1: {why}",
                                       f"unreadable event from tcp://h1:7: {why}"]
    session.on_reply(status_reply(99), 10)  # an id never asked (or given up on)
    assert session.actions() == [] and session.next_deadline() == deadline
    assert session.switches == 0


def test_an_hb_resets_the_backoff_and_a_route_event_alone_does_not():
    backoff = Backoff(100, 10_000, random.Random(0))
    session = connected(backoff=backoff)
    for _ in range(4):
        backoff.next_delay()
    session.on_event(encode(RouteEvent(epoch=EPOCH, revision=1, prev=0, topic="T", route=None)), 0)
    assert backoff._failures == 4
    session.on_event(hb(), 0)
    assert backoff._failures == 0


def test_a_dropped_events_connection_repulls_after_the_next_hb(caplog):
    session = connected()
    session.track("T", 0)
    (pull,) = sent(session.actions())
    session.on_event(hb(), 0)
    session.on_reply(encode(GetRoutesReply(id=pull.id, routes={}, revisions={"T": 0},
                                           missing=["T"], epoch=EPOCH)), 0)
    (confirm,) = sent(session.actions())
    session.on_reply(encode(GetRoutesReply(id=confirm.id, routes={}, revisions={"T": 0},
                                           missing=["T"], epoch=EPOCH)), 0)
    session.actions()
    session.on_event(hb(), 10)
    assert sent(session.actions()) == []  # proven: an hb alone pulls nothing
    with caplog.at_level(logging.INFO, logger="zns.client"):
        session.on_events_disconnected(20)
    assert caplog.messages == [
        "events connection to tcp://h1:7 dropped: pulling again once it is back"]
    session.on_event(hb(), 30)
    assert [r.topics for r in sent(session.actions())] == [["T"]]


def test_while_waiting_to_reconnect_nothing_else_happens():
    session = connected(request_timeout_ms=1_000)
    session.track("T", 0)
    session.actions()
    session.on_timer(1_000)  # the pull timed out
    assert session.actions() == [FollowServer(None)]
    resume = session.next_deadline()
    session.track("U", resume - 1)  # not connected: no request
    session.on_timer(resume - 1)
    assert session.actions() == [] and session.switches == 1
    assert session.next_deadline() == resume  # only the reconnect, not a pending deadline


def test_next_deadline_is_the_earliest_of_pending_silence_and_the_periodic_pull():
    session = connected(heartbeat_interval_ms=10_000, request_timeout_ms=1_000, pull_period_ms=500)
    session.track("T", 0)
    (pull,) = sent(session.actions())
    assert session.next_deadline() == 1_000  # the pull's timeout
    session.on_reply(encode(GetRoutesReply(id=pull.id, routes={}, revisions={"T": 0},
                                           missing=["T"], epoch=EPOCH)), 100)
    assert session.next_deadline() == 600  # the periodic pull, before the silence deadline
    session.on_event(hb(), 200)  # proven: the confirming pull is sent, due by 1_200
    (confirm,) = sent(session.actions())
    assert session.next_deadline() == 600
    session.on_reply(encode(GetRoutesReply(id=confirm.id, routes={}, revisions={"T": 0},
                                           missing=["T"], epoch=EPOCH)), 300)
    session.on_timer(600)
    assert [r.topics for r in sent(session.actions())] == [["T"]]
    assert session.next_deadline() == 1_100  # the next periodic pull


def test_timeouts_say_why_the_session_moves_on(caplog):
    session = ClientSession(["tcp://h1:1"], request_timeout_ms=1_000, heartbeat_interval_ms=500,
                            backoff=Backoff(100, 10_000, random.Random(0)))
    session.start(0)
    (status,) = sent(session.actions())
    with caplog.at_level(logging.WARNING, logger="zns.client"):
        session.on_timer(1_000)
    resume = session.next_deadline()
    assert caplog.messages == [f"NameServer tcp://h1:1: no reply within 1000 ms; trying "
                               f"tcp://h1:1 in {resume - 1_000} ms"]
    caplog.clear()
    session.on_timer(resume)
    (status,) = sent(session.actions())
    session.on_reply(status_reply(status.id), resume)
    with caplog.at_level(logging.WARNING, logger="zns.client"):
        session.on_timer(resume + 1_000 + 3 * 500)
    again = session.next_deadline()
    assert caplog.messages == [f"NameServer tcp://h1:1: no hb event for 3 intervals; trying "
                               f"tcp://h1:1 in {again - (resume + 2_500)} ms"]


def test_the_zone_reaches_the_cache():
    session = connected(zone="Z1")
    session.track("T", 0)
    (pull,) = sent(session.actions())
    two_zones = TopicRoute(topic="T", queues=[
        QueueData(broker_name=n, read_queues=1, write_queues=1, perm=6, sys_flag=0) for n in "ab"],
        brokers=[BrokerData(cluster="c", broker_name="a", addrs={0: "h:1"}, zone="z1"),
                 BrokerData(cluster="c", broker_name="b", addrs={0: "h:2"}, zone="z2")],
        filter_servers={})
    session.on_reply(encode(GetRoutesReply(id=pull.id, routes={"T": two_zones}, revisions={"T": 1},
                                           missing=[], epoch=EPOCH)), 0)
    (notify,) = session.actions()
    assert [b.broker_name for b in notify.route.brokers] == ["a"]


def test_the_injected_rng_also_draws_the_backoff_jitter():
    def delays(seed: int) -> list[int]:
        session = ClientSession(["tcp://h1:1", "tcp://h2:1"], request_timeout_ms=1_000,
                                rng=random.Random(seed))
        session.start(0)
        now, out = 0, []
        for _ in range(8):
            now += 1_000
            session.on_timer(now)
            out.append(session.next_deadline() - now)
            now = session.next_deadline()
            session.on_timer(now)
        return out

    assert delays(7) == delays(7)  # reproducible: no hidden source of randomness


def test_past_1000_topics_a_session_subscribes_to_every_route_instead():
    # Each subscription costs the server's trie ~50 bytes per channel byte; a session that
    # follows many topics takes the route prefix and ignores the rest (issue 21 item 5).
    session = connected()
    for i in range(MAX_TOPIC_CHANNELS):
        session.track(f"T{i}", 0)
    assert Subscribe(route_channel("T999")) in session.actions()
    session.track("T1000", 0)
    actions = session.actions()
    assert actions[0] == Subscribe(ROUTE_PREFIX)  # first: no moment without coverage
    dropped = [a for a in actions if isinstance(a, Unsubscribe)]
    assert len(dropped) == MAX_TOPIC_CHANNELS and Subscribe(route_channel("T1000")) not in actions
    assert sorted(a.channel for a in dropped) == sorted(
        route_channel(f"T{i}") for i in range(MAX_TOPIC_CHANNELS))
    session.track("T1001", 0)
    session.forget("T1")
    assert not [a for a in session.actions() if isinstance(a, (Subscribe, Unsubscribe))]
    # Topics kept before `status` named the events socket: the prefix alone.
    fresh = ClientSession(["tcp://h1:1"])
    fresh.start(0)
    (status,) = sent(fresh.actions())
    for i in range(MAX_TOPIC_CHANNELS + 1):
        fresh.track(f"T{i}", 0)
    fresh.on_reply(status_reply(status.id), 0)
    subscribed = [a for a in fresh.actions() if isinstance(a, Subscribe)]
    assert subscribed == [Subscribe(ROUTE_PREFIX), Subscribe(HB_CHANNEL)]


def test_exactly_1000_topics_kept_before_status_are_subscribed_one_by_one():
    fresh = ClientSession(["tcp://h1:1"])
    fresh.start(0)
    (status,) = sent(fresh.actions())
    for i in range(MAX_TOPIC_CHANNELS):
        fresh.track(f"T{i}", 0)
    fresh.on_reply(status_reply(status.id), 0)
    subscribed = [a for a in fresh.actions() if isinstance(a, Subscribe)]
    assert Subscribe(ROUTE_PREFIX) not in subscribed
    assert len(subscribed) == MAX_TOPIC_CHANNELS + 1 and subscribed[-1] == Subscribe(HB_CHANNEL)

"""RouteClient: the sans-I/O cache and session (§7, §10) and the threaded client on real servers."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from hypothesis import given, settings, strategies as st

from helpers import LOADED_DEADLINE, examples, register_fields, wait_for
from zns.core.backoff import Backoff
from zns.core.client_session import (
    ClientSession,
    FollowServer,
    ConnectEvents,
    SendBytes,
    Subscribe,
    Unsubscribe,
)
from zns.core.errors import NameServerUnavailable, NotFound, UsageError
from zns.core import schema
from zns.core.queues import read_queues
from zns.core.route_cache import RouteCache
from zns.drivers import route_client
from zns.drivers.route_client import RouteClient
from zns.core.schema import (
    HB_CHANNEL,
    GetRoutesReply,
    HbEvent,
    QueueData,
    RouteEvent,
    StatusReply,
    TopicRoute,
    decode_request,
    encode,
    route_channel,
)

# --- a model NameServer for the sans-I/O cache ----------------------------------------


class ModelServer:
    """Topics whose route is just a version number; every change publishes one event."""

    def __init__(self, topics: list[str]) -> None:
        self.epoch_no = 0
        self.topics = topics
        self.restart()

    def restart(self) -> None:
        self.epoch_no += 1
        self.epoch = f"{self.epoch_no:016x}"
        self.revision = 0
        self.routes: dict[str, TopicRoute | None] = {t: None for t in self.topics}
        self.revs = {t: 0 for t in self.topics}
        self.history: dict[tuple[str, int], TopicRoute | None] = {}

    def change(self, topic: str, delete: bool) -> RouteEvent:
        self.revision += 1
        route = None if delete else TopicRoute(topic=topic, queues=[QueueData(
            broker_name="b", read_queues=self.revision, write_queues=1, perm=6, sys_flag=0)],
            brokers=[], filter_servers={})
        prev, self.revs[topic] = self.revs[topic], self.revision
        self.routes[topic] = route
        self.history[(topic, self.revision)] = route
        return RouteEvent(epoch=self.epoch, revision=self.revision, prev=prev, topic=topic,
                          route=route)

    def pull(self, topics: list[str]) -> tuple[str, dict, dict]:
        routes = {t: self.routes[t] for t in topics if self.routes[t] is not None}
        return self.epoch, routes, {t: self.revs[t] for t in topics}

    def hb(self) -> HbEvent:
        return HbEvent(epoch=self.epoch, revision=self.revision, time_ms=0)


TOPICS = ["A", "B", "C"]
step = st.one_of(
    st.tuples(st.just("change"), st.sampled_from(TOPICS), st.booleans(), st.booleans()),
    st.tuples(st.just("serve")),
    st.tuples(st.just("reply")),
    st.tuples(st.just("hb"), st.booleans()),
    st.tuples(st.just("effective")),
    st.tuples(st.just("restart"), st.booleans()),
)


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(step, max_size=60))
def test_cache_is_never_wrong_and_converges(steps):
    """The subscriptions reach the publisher at some unknown point (`effective`); before
    it every event and `hb` is lost, after it only some, at random (a high-water mark).
    A pull is served at one moment and its reply arrives later; the server restarts,
    and requests not yet served may reach the new one. The cache never shows a route
    other than the one the server had at the revision it claims. And once the
    subscriptions are effective, an `hb` delivered and every pull answered, it equals
    the server, without one more event: a periodic pull is allowed only when an event
    was lost after the subscriptions took effect (then nothing else can show it)."""
    server, cache = ModelServer(TOPICS), RouteCache()
    pending: list[list] = []  # [topics, the server's answer once served], in order
    effective = lost_while_effective = False
    for t in TOPICS:
        cache.track(t)

    def pull_stale() -> None:
        topics = cache.take_stale()
        if topics:
            pending.append([topics, None])

    def serve() -> None:
        unserved = next(p for p in pending if p[1] is None)
        unserved[1] = server.pull(unserved[0])

    def check_consistent() -> None:
        for t in TOPICS:
            if cache.is_current(t) and cache.epoch == server.epoch and cache.revision(t) > 0:
                assert cache.view(t) == server.history[(t, cache.revision(t))]

    pull_stale()
    for action in steps:
        match action:
            case ("change", topic, delete, lost):
                event = server.change(topic, delete)
                if effective and not lost:
                    cache.apply_event(event)
                lost_while_effective |= effective and lost
            case ("serve",) if any(p[1] is None for p in pending):
                serve()
            case ("reply",) if pending and pending[0][1] is not None:
                cache.apply_pull(*pending.pop(0)[1], now=0)
            case ("hb", delivered) if effective and delivered:
                cache.apply_event(server.hb())
            case ("effective",):
                effective = True
            case ("restart", requests_survive):
                server.restart()
                effective = False  # the new publisher has none of the subscriptions yet
                if pending and (not requests_survive or pending[0][1] is not None):
                    # Answers (or requests) die with the server: the session times out.
                    pending.clear()
                    cache.reset()
        pull_stale()
        check_consistent()
    # Settle: the subscriptions take effect and are proven; nothing else changes.
    def answer_every_pull() -> None:
        pull_stale()
        while pending:
            if pending[0][1] is None:
                serve()
            cache.apply_pull(*pending.pop(0)[1], now=0)
            pull_stale()
            check_consistent()

    cache.apply_event(server.hb())
    answer_every_pull()
    if lost_while_effective:  # the periodic pull, which comes after any answer in flight
        cache.on_timer(10**9)
        answer_every_pull()
    for t in TOPICS:
        assert cache.view(t) == server.routes[t], t
        assert cache.revision(t) == server.revs[t]


def current_cache(server: ModelServer, topics: list[str]) -> RouteCache:
    """A cache holding `topics` as `server` has them, subscriptions proven."""
    cache = RouteCache()
    for t in topics:
        cache.track(t)
    cache.apply_pull(*server.pull(cache.take_stale()), now=0)
    cache.apply_event(server.hb())
    cache.apply_pull(*server.pull(cache.take_stale()), now=0)  # the confirming pull
    assert all(cache.is_current(t) for t in topics) and cache.take_stale() == []
    return cache


def test_gap_marks_topic_stale_and_old_events_are_ignored():
    server = ModelServer(["A"])
    first = server.change("A", delete=False)
    second = server.change("A", delete=False)
    cache = current_cache(server, ["A"])
    assert cache.revision("A") == 2
    assert cache.apply_event(first) == []  # older than what we hold: ignored, not a gap
    assert cache.is_current("A") and cache.take_stale() == []
    assert cache.view("A") == second.route
    server.change("A", delete=False)  # lost
    fourth = server.change("A", delete=False)
    assert cache.apply_event(fourth) == []
    assert cache.take_stale() == ["A"]  # the gap asks for a pull


def test_event_at_the_revision_held_is_ignored_without_a_pull():
    server = ModelServer(["A"])
    held = server.change("A", delete=False)
    cache = current_cache(server, ["A"])
    assert cache.revision("A") == held.revision
    assert cache.apply_event(held) == []
    assert cache.is_current("A") and cache.take_stale() == []


def test_new_epoch_in_a_pull_reply_marks_every_other_topic_stale():
    server = ModelServer(["A", "B"])
    for _ in range(5):
        server.change("B", delete=False)
    cache = current_cache(server, ["A", "B"])
    assert cache.revision("B") == 5
    # A goes stale (a gap, say) and its pull is answered by the restarted server:
    # the reply is the first sign of the new epoch.
    server.change("A", delete=False)
    cache.apply_event(server.change("A", delete=False))
    assert cache.take_stale() == ["A"]
    server.restart()
    new_b = server.change("B", delete=False)  # revision 1 < 5 in the new epoch
    cache.apply_pull(*server.pull(["A"]), now=0)
    assert cache.epoch == server.epoch
    assert not cache.is_current("B")
    assert cache.take_stale() == ["B"]  # B is pulled, not kept from the dead epoch
    cache.apply_pull(*server.pull(["B"]), now=0)
    assert cache.view("B") == new_b.route and cache.revision("B") == 1
    # No `hb` has come through the new publisher yet: the next one repeats the pulls.
    cache.apply_event(server.hb())
    assert sorted(cache.take_stale()) == ["A", "B"]


def test_pull_in_flight_when_subscription_is_proven_is_repeated():
    server = ModelServer(["A"])
    cache = RouteCache()
    cache.track("A")
    answer = server.pull(cache.take_stale())  # served before the subscription took effect
    missed = server.change("A", delete=False)  # so its event never arrives
    cache.apply_event(server.hb())  # the subscription is proven while the pull is in flight
    cache.apply_pull(*answer, now=0)
    assert cache.take_stale() == ["A"]  # pulled again, and the missed change is seen
    cache.apply_pull(*server.pull(["A"]), now=0)
    assert cache.view("A") == missed.route and cache.is_current("A")


def test_new_epoch_in_an_hb_repeats_a_pull_in_flight_after_its_answer():
    server = ModelServer(["A"])
    cache = current_cache(server, ["A"])
    server.change("A", delete=False)  # lost
    cache.apply_event(server.change("A", delete=False))  # the gap: A is pulled
    assert cache.take_stale() == ["A"]
    server.restart()
    answer = server.pull(["A"])  # the new server answers it ...
    created = server.change("A", delete=False)  # ... before a change whose event is lost
    cache.apply_event(server.hb())  # the new epoch, seen first in an `hb`
    assert cache.take_stale() == []  # no second pull racing the one in flight
    cache.apply_pull(*answer, now=0)
    assert cache.take_stale() == ["A"]  # but repeated once it is answered
    cache.apply_pull(*server.pull(["A"]), now=0)
    assert cache.view("A") == created.route and cache.is_current("A")


def test_forget_stops_pulling_and_ignores_the_topic():
    server = ModelServer(["A", "B"])
    cache = current_cache(server, ["A", "B"])
    assert cache.forget("A") and not cache.forget("A")
    assert cache.topics() == ["B"] and not cache.known("A")
    assert cache.apply_event(server.change("A", delete=False)) == []
    cache.on_timer(10**9)
    assert cache.take_stale() == ["B"]


def test_unknown_topic_is_remembered_so_its_creation_applies():
    server, cache = ModelServer(["A"]), RouteCache()
    cache.track("A")
    cache.take_stale()
    assert cache.apply_pull(*server.pull(["A"]), now=0) == [("A", None)]
    cache.apply_event(server.hb())
    cache.take_stale()  # the confirming pull after the subscription is proven
    cache.apply_pull(*server.pull(["A"]), now=0)
    created = server.change("A", delete=False)
    assert cache.apply_event(created) == [("A", created.route)]


def test_new_epoch_in_an_event_marks_every_topic_stale():
    server, cache = ModelServer(["A", "B"]), RouteCache()
    for t in "AB":
        cache.track(t)
    cache.take_stale()
    cache.apply_pull(*server.pull(["A", "B"]), now=0)
    server.restart()
    cache.apply_event(server.hb())
    assert sorted(cache.take_stale()) == ["A", "B"]


def test_periodic_pull():
    server, cache = ModelServer(["A"]), RouteCache(pull_period_ms=30_000)
    cache.track("A")
    cache.take_stale()
    cache.apply_pull(*server.pull(["A"]), now=100_000)
    cache.apply_event(server.hb())
    cache.take_stale()
    cache.apply_pull(*server.pull(["A"]), now=100_000)
    cache.on_timer(129_999)
    assert cache.take_stale() == []
    cache.on_timer(130_000)
    assert cache.take_stale() == ["A"]


def test_zone_filter_applies_to_pulls_and_events():
    def route(zone_b: str) -> TopicRoute:
        from zns.core.schema import BrokerData

        return TopicRoute(topic="A", queues=[
            QueueData(broker_name=n, read_queues=1, write_queues=1, perm=6, sys_flag=0)
            for n in "ab"], brokers=[
            BrokerData(cluster="c", broker_name="a", addrs={0: "h:1"}, zone="z1"),
            BrokerData(cluster="c", broker_name="b", addrs={0: "h:2"}, zone=zone_b)],
            filter_servers={})

    cache = RouteCache(zone="Z1")
    cache.track("A")
    cache.take_stale()
    cache.apply_pull("e", {"A": route("z2")}, {"A": 1}, now=0)
    assert [b.broker_name for b in cache.view("A").brokers] == ["a"]
    changes = cache.apply_event(RouteEvent(epoch="e", revision=2, prev=1, topic="A", route=route("z1")))
    assert [b.broker_name for b in changes[0][1].brokers] == ["a", "b"]


# --- the session -----------------------------------------------------------------------


def status_reply(request_body: bytes, pub_endpoint: str) -> bytes:
    return encode(StatusReply(id=decode_request(request_body).id, epoch="e" * 16, revision=0,
                              version="x", uptime_ms=0, brokers=0, topics=0,
                              pub_endpoint=pub_endpoint))


def test_session_learns_pub_endpoint_and_switches_on_timeout():
    import random

    session = ClientSession(["tcp://h1:1", "tcp://h2:1"], request_timeout_ms=1_000,
                            rng=random.Random(0))
    session.start(0)
    first = session.endpoint
    actions = session.actions()
    assert actions[0] == FollowServer(first)
    session.on_reply(status_reply(actions[1].body, "tcp://0.0.0.0:7"), 100)
    host = first.split("//")[1].split(":")[0]
    assert session.actions() == [ConnectEvents(f"tcp://{host}:7"), Subscribe(HB_CHANNEL)]
    session.track("T", 200)
    acts = session.actions()
    assert acts[0] == Subscribe(route_channel("T")) and isinstance(acts[1], SendBytes)
    session.on_timer(1_300)  # the get_routes went unanswered
    assert session.actions() == [FollowServer(None)]
    assert session.endpoint is None and session.switches == 1
    session.on_timer(5_000)  # after the backoff: the other NameServer
    assert session.endpoint != first
    with pytest.raises(UsageError):
        session.track("not a topic!", 5_000)


def test_session_switches_when_hb_stops():
    session = ClientSession(["tcp://h1:1"], heartbeat_interval_ms=500, request_timeout_ms=1_000)
    session.start(0)
    session.on_reply(status_reply(session.actions()[1].body, "tcp://h1:2"), 0)
    session.on_event(encode(HbEvent(epoch="e" * 16, revision=0, time_ms=0)), 1_000)
    session.on_timer(2_400)
    assert session.switches == 0
    session.on_timer(2_600)  # 3 intervals without hb
    assert session.switches == 1


def test_hb_resets_the_reconnect_backoff():
    import random

    session = ClientSession(["tcp://h1:1", "tcp://h2:1"], heartbeat_interval_ms=500,
                            request_timeout_ms=1_000, backoff=Backoff(100, 10_000, random.Random(1)))
    now = 0
    session.start(now)
    for _ in range(5):  # five NameServers in a row do not answer: the backoff grows
        now += 1_000
        session.on_timer(now)
        now = session.next_deadline()
        session.on_timer(now)
    assert session.switches == 5 and session.backoff.next_delay() >= 1_600
    *_, ask_status = session.actions()  # the sixth try: this one answers
    session.on_reply(status_reply(ask_status.body, "tcp://h:2"), now)
    session.on_event(encode(HbEvent(epoch="e" * 16, revision=0, time_ms=0)), now)
    now += 1_500  # the followed NameServer falls silent: 3 intervals without hb
    session.on_timer(now)
    assert session.switches == 6
    assert session.next_deadline() - now <= 100  # the shortest backoff again, not ~3 s


def test_forget_unsubscribes_and_stops_pulling_the_topic():
    session = ClientSession(["tcp://h1:1"])
    session.start(0)
    session.on_reply(status_reply(session.actions()[1].body, "tcp://h1:2"), 0)
    session.track("T", 0)
    session.track("U", 0)
    session.actions()
    session.forget("T")
    assert session.actions() == [Unsubscribe(route_channel("T"))]
    session.forget("T")  # not kept: nothing to do
    assert session.actions() == [] and session.cache.topics() == ["U"]


# --- against real NameServers ------------------------------------------------------------


def has_route(client: RouteClient, topic: str) -> TopicRoute | None:
    try:
        return client.route(topic)
    except NotFound:
        return None


def client_for(*endpoints: str, **kw) -> RouteClient:
    kw.setdefault("heartbeat_interval", 0.2)
    kw.setdefault("request_timeout", 1.0)
    return RouteClient(list(endpoints), **kw)


@pytest.mark.timeout(30)
def test_push_arrives_and_matches_a_fresh_pull(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())
    changes = []
    with client_for(server.router) as client:
        client.watch("TopicA", lambda t, r: changes.append(r))
        wait_for(lambda: changes)
        pulls = client.session.pulls
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 3, "write_queues": 3}}, data_version={"counter": 1}))
        wait_for(lambda: changes[-1].queues[0].read_queues == 3)
        fresh = peer.ok("get_route", topic="TopicA").route
        assert changes[-1] == fresh == client.route("TopicA")
        assert client.session.pulls - pulls <= 1  # pushed, not pulled (at most the confirm pull)


@pytest.mark.timeout(30)
def test_lost_event_is_repaired_by_a_pull(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())
    with client_for(server.router) as client:
        client.route("TopicA")
        wait_for(lambda: client.session.cache.is_current("TopicA") and client.session.pulls >= 2)
        session = client.session
        real_on_event, dropped = session.on_event, []

        def lossy(body: bytes, now: float) -> None:
            event = msgspec.msgpack.decode(body)
            if event["op"] == "route" and not dropped:
                dropped.append(event)
                return
            real_on_event(body, now)

        session.on_event = lossy
        pulls = session.pulls
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 2}}, data_version={"counter": 1}))
        wait_for(lambda: dropped)
        assert client.route("TopicA").queues[0].read_queues == 16  # the change was lost
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 5}}, data_version={"counter": 2}))
        wait_for(lambda: client.route("TopicA").queues[0].read_queues == 5)
        assert session.pulls > pulls  # the gap was seen and pulled, not papered over
        assert client.session.cache.revision("TopicA") == peer.ok(
            "get_route", topic="TopicA").revision


@pytest.mark.timeout(30)
def test_periodic_pull_repairs_a_lost_last_event(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())
    with client_for(server.router, pull_period=0.5) as client:
        client.route("TopicA")
        session = client.session
        real_on_event = session.on_event
        session.on_event = lambda body, now: (
            None if msgspec.msgpack.decode(body)["op"] == "route" else real_on_event(body, now))
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 2}}, data_version={"counter": 1}))
        wait_for(lambda: client.route("TopicA").queues[0].read_queues == 2)


@pytest.mark.timeout(30)
def test_missing_topic_then_created(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())
    with client_for(server.router) as client:
        with pytest.raises(NotFound):
            client.route("Later")
        seen = []
        client.watch("Later", lambda t, r: seen.append(r))
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {}, "Later": {}}, data_version={"counter": 1}))
        wait_for(lambda: seen and seen[-1] is not None)
        assert seen[0] is None
        assert client.route("Later") == peer.ok("get_route", topic="Later").route


@pytest.mark.timeout(30)
def test_nameserver_restart_is_resynced(make_server, tmp_path: Path):
    first = make_server(kv_path=str(tmp_path / "kv.json"))
    # The second binds the first's ports (workers share tcp:// ports only).
    endpoints = dict(router=first.router, pub=first.pub, kv_path=str(tmp_path / "kv.json"))
    first.peer().ok("register_broker", **register_fields())
    with client_for(first.router) as client:
        epoch = client.route("TopicA") and client.session.cache.epoch
        first.stop()
        second = make_server(**endpoints)
        # A new DataVersion: the second server restored the first's table (its state dump),
        # and a registration of an unchanged version keeps the topics it holds (§4).
        second.peer().ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 7}}, data_version={"counter": 1}))
        wait_for(lambda: client.route("TopicA").queues[0].read_queues == 7)
        assert client.session.cache.epoch not in (None, epoch)


@pytest.mark.timeout(30)
def test_follows_the_other_nameserver_when_one_dies(make_server):
    servers = [make_server(), make_server()]
    for srv in servers:
        srv.peer().ok("register_broker", **register_fields())
    with client_for(*(s.router for s in servers)) as client:
        client.route("TopicA")
        followed = next(s for s in servers if s.router == client.session.endpoint)
        other = next(s for s in servers if s is not followed)
        followed.stop()
        other.peer().ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 9}}, data_version={"counter": 1}))
        wait_for(lambda: client.route("TopicA").queues[0].read_queues == 9)
        assert client.session.endpoint == other.router
        assert client.session.switches >= 1


@pytest.mark.timeout(30)
def test_zone_client_sees_its_zone_only(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(zone="east"))
    peer.ok("register_broker", **register_fields(broker_name="broker-b", addr="10.0.0.2:10911",
                                                 zone="west"))
    with client_for(server.router, zone="EAST") as client:
        assert [b.broker_name for b in client.route("TopicA").brokers] == ["broker-a"]
        assert {q.broker_name for q in client.write_queues("TopicA")} == {"broker-a"}


@pytest.mark.timeout(30)
def test_no_nameserver_answers():
    with client_for("tcp://127.0.0.1:1", timeout=0.5) as client:
        with pytest.raises(NameServerUnavailable):
            client.route("TopicA")


def test_select_queue_through_the_client(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(topics={"T": {"write_queues": 2}}))
    peer.ok("register_broker", **register_fields(broker_name="broker-b", addr="10.0.0.2:1",
                                                 topics={"T": {"write_queues": 2}}))
    with client_for(server.router) as client:
        picks = [client.select_queue("T", avoid_broker="broker-a") for _ in range(3)]
        assert {q.broker_name for q in picks} == {"broker-b"}
        assert len({client.select_queue("T") for _ in range(4)}) == 4


@pytest.mark.timeout(30)
def test_forget_stops_following_a_topic(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(topics={"TopicA": {}, "TopicB": {}}))
    seen: list = []
    with client_for(server.router) as client:
        client.watch("TopicA", lambda t, r: seen.append(r))
        client.route("TopicB")
        wait_for(lambda: seen)
        client.forget("TopicA")
        assert client.session.cache.topics() == ["TopicB"]
        count, pulls = len(seen), client.session.pulls
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 2}, "TopicB": {"read_queues": 2}},
            data_version={"counter": 1}))
        wait_for(lambda: client.route("TopicB").queues[0].read_queues == 2)
        assert len(seen) == count  # no callback for the forgotten topic
        assert "TopicA" not in client.session.cache.topics()
        assert client.session.pulls == pulls  # TopicB came by push; TopicA was not pulled
        assert client.route("TopicA").queues[0].read_queues == 2  # followed afresh ...
        marker: list = []  # callbacks run in order: once this one ran, any for TopicA did
        client.watch("TopicB", lambda t, r: marker.append(r))
        wait_for(lambda: marker)
        assert len(seen) == count  # ... without the callbacks it had before


@pytest.mark.timeout(30)
def test_unwatch_stops_the_callbacks_of_that_watch_only(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())
    removed: list = []
    kept: list = []
    with client_for(server.router) as client:
        unwatch = client.watch("TopicA", lambda t, r: removed.append(r))
        client.watch("TopicA", lambda t, r: kept.append(r))
        wait_for(lambda: removed and kept)
        unwatch()
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 2}}, data_version={"counter": 1}))
        # Callbacks run in order of registration: once the kept one saw the change, the
        # removed one would have too.
        wait_for(lambda: kept[-1].queues[0].read_queues == 2)
        assert len(removed) == 1


@pytest.mark.timeout(30)
def test_forget_drops_the_callbacks_of_the_topic_already_queued(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(topics={"TopicA": {}, "TopicB": {}}))
    release = threading.Event()
    blocked = threading.Event()
    late: list = []
    marker: list = []

    def block(topic: str, route: TopicRoute | None) -> None:
        blocked.set()
        release.wait(10)

    with client_for(server.router) as client:
        client.route("TopicA")
        client.watch("TopicB", block)
        assert blocked.wait(10)  # the client's thread is inside a callback, outside its lock
        client.watch("TopicA", lambda t, r: late.append(r))  # known: its first call is queued
        client.forget("TopicA")
        release.set()
        client.watch("TopicB", lambda t, r: marker.append(r))
        wait_for(lambda: marker)  # queued after TopicA's call: that one ran first, or never
        assert late == []


def test_a_route_client_s_defaults_are_the_documented_ones():
    before = set(threading.enumerate())
    with RouteClient("tcp://127.0.0.1:1") as client:
        assert client.timeout == 5.0 and client.selector.faults is None
        session = client.session
        assert (session.request_timeout_ms, session.heartbeat_interval_ms) == (3000, 1000)
        assert session.cache.pull_period_ms == 30_000 and session.cache.zone == ""
        assert session.events is None and session.channels == ()
        [thread] = list(set(threading.enumerate()) - before)
        assert thread.name == "zns-route-client"
        assert thread.daemon  # a client never closed does not keep the process alive
    with RouteClient("tcp://127.0.0.1:1", fault_tolerance=True, timeout=7.0) as client:
        assert client.timeout == 7.0 and client.selector.faults is not None


@pytest.mark.timeout(60)
def test_route_waits_as_long_as_its_own_timeout_says():
    with client_for("tcp://127.0.0.1:1", timeout=30) as client:
        started = time.monotonic()
        with pytest.raises(NameServerUnavailable):
            client.route("TopicA", timeout=0.3)
        assert time.monotonic() - started < 20  # its own 0.3 s, not the client's 30 s


@pytest.mark.timeout(60)
def test_close_ends_a_waiting_route_and_the_thread_at_once():
    before = set(threading.enumerate())
    client = client_for("tcp://127.0.0.1:1", timeout=15)  # nobody answers: route() waits
    [thread] = list(set(threading.enumerate()) - before)
    outcome: list[tuple[type, float]] = []

    def wait() -> None:
        try:
            client.route("TopicA")
        except Exception as exc:  # noqa: BLE001 - the test looks at which
            outcome.append((type(exc), time.monotonic()))

    waiter = threading.Thread(target=wait)
    waiter.start()
    started = time.monotonic()
    client.close()
    waiter.join(40)
    # Woken by close() (before or during its wait), not by its 15 s timeout nor by a
    # failure of the thread (whose join in close() is bounded by 5 s).
    [(kind, ended)] = outcome
    assert kind is NameServerUnavailable and ended - started < 4
    assert not thread.is_alive()


@pytest.mark.timeout(60)
def test_an_idle_client_s_loop_waits_instead_of_turning(monkeypatch):
    """Its poll waits for readable sockets only (a socket is nearly always writable: asked for
    that too, the loop would turn tens of thousands of times a second). Counted in turns, not
    CPU time, so a loaded machine cannot hide a spin; a couple of turns a second is the
    client retrying a NameServer that never answers."""
    turns = [0]

    class Counting(zmq.Poller):  # the thread makes one poller a turn
        def __init__(self) -> None:
            if threading.current_thread().name == "zns-route-client":
                turns[0] += 1
            super().__init__()

    monkeypatch.setattr(route_client.zmq, "Poller", Counting)
    with RouteClient("tcp://127.0.0.1:1", request_timeout=1.0):
        time.sleep(0.3)  # its first request is out
        before = turns[0]
        assert before > 0  # the counter sees the thread's turns
        time.sleep(1.0)  # the window measured
        assert turns[0] - before < 50


@pytest.mark.timeout(120)
def test_watch_of_a_known_topic_and_the_rest_of_the_api(server, caplog):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(topics={"TopicA": {"write_queues": 2},
                                                         "TopicB": {"write_queues": 2}}))
    seen: list = []
    broker_events: list[bytes] = []
    with client_for(server.router, channels=[schema.BROKER_PREFIX],
                    on_event=broker_events.append) as client:
        route = client.route("TopicA")
        client.watch("TopicA", lambda t, r: seen.append((t, r)))
        wait_for(lambda: seen)
        assert seen[0] == ("TopicA", route)  # a known topic: its current route at once
        assert client.read_queues("TopicA") == read_queues(route)
        # Each topic keeps its own round-robin: another topic's picks do not shift it.
        first = client.select_queue("TopicA")
        client.select_queue("TopicB")
        assert client.select_queue("TopicA") != first
        client.route("TopicB")
        client.forget("TopicB")  # followed without watchers: nothing to drop
        unwatch = client.watch("TopicB", lambda t, r: None)
        client.forget("TopicB")
        unwatch()  # after forget: nothing left to remove, no error

        def broken(topic: str, route: TopicRoute | None) -> None:
            raise RuntimeError("a bug in a callback")

        with caplog.at_level(logging.ERROR, logger="zns"):
            client.watch("TopicA", broken)
            wait_for(lambda: "route callback for TopicA failed" in caplog.messages)
        # The channels asked for are subscribed, and on_event sees their events.
        version = 1
        deadline = time.monotonic() + LOADED_DEADLINE
        while not broker_events:
            assert time.monotonic() < deadline, "no broker event reached on_event"
            version += 1
            peer.ok("register_broker", **register_fields(
                addr=f"10.0.0.{version}:1", topics={"TopicA": {"write_queues": 2}}))
            time.sleep(0.05)  # a new address each turn, until the subscription is through
        assert isinstance(schema.decode_event(broker_events[0]), schema.BrokerEvent)


@pytest.mark.timeout(120)
def test_a_watcher_follows_the_other_nameserver_without_being_asked(make_server):
    """No call into the client after the followed NameServer dies: its own timers notice."""
    servers = [make_server(), make_server()]
    for srv in servers:
        srv.peer().ok("register_broker", **register_fields())
    seen: list = []
    with client_for(*(s.router for s in servers)) as client:
        client.watch("TopicA", lambda t, r: seen.append(r))
        wait_for(lambda: seen)
        followed = next(s for s in servers if s.router == client.session.endpoint)
        other = next(s for s in servers if s is not followed)
        followed.stop()
        other.peer().ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": 9}}, data_version={"counter": 1}))
        wait_for(lambda: seen[-1] is not None and seen[-1].queues[0].read_queues == 9)

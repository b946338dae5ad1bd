"""Peer hints (§10) without sockets: the route table's suspicion and the PeerLink state machine.

Time is an injected integer clock in milliseconds, as everywhere in the core.
"""

from __future__ import annotations

import msgspec
import pytest

from helpers import feed
from zns.core.peer_link import (
    DEFAULT_PEER_INTERVAL_MS,
    MIN_SILENCE_MS,
    RETRY_MAX_MS,
    RETRY_MIN_MS,
    AskStatus,
    Hint,
    PeerLink,
    FollowEvents,
    hint_from_event,
)
from zns.core.routes import RouteTable
from zns.core.schema import decode_event, decode_reply
from zns.core.schema import (
    BrokerEvent,
    DataVersion,
    Error,
    HbEvent,
    RegisterBroker,
    RouteEvent,
    StatusReply,
    TopicConfig,
)

ADDR = "10.0.0.1:10911"
GRACE = 3000


def register(table: RouteTable, now: int, timeout_ms: int = 60_000, addr: str = ADDR,
             name: str = "broker-a", cluster: str = "c1") -> None:
    table.register_broker(RegisterBroker(
        cluster=cluster, broker_name=name, broker_id=0, broker_addr=addr,
        topics={"TopicA": TopicConfig()}, heartbeat_timeout_ms=timeout_ms,
    ), now)


def removed(events: list) -> list[BrokerEvent]:
    return [e for e in events if isinstance(e, BrokerEvent) and e.change == "removed"]


# --- the route table (routes.py) -----------------------------------------


def test_suspicion_shortens_the_deadline_to_last_heartbeat_plus_grace():
    table = RouteTable("e" * 16)
    register(table, now=1000, timeout_ms=8000)  # a quarter of it (2 s) is below the grace
    assert table.next_deadline() == 9000
    assert table.suspect("c1", ADDR, GRACE, now=1000) is True
    assert table.next_deadline() == 1000 + GRACE
    assert table.expire(1000 + GRACE) == []  # expired only once now is past the deadline
    events = table.expire(1000 + GRACE + 1)
    [event] = removed(events)
    assert (event.broker_addr, event.reason) == (ADDR, "peer_expired")
    assert table.route("TopicA") is None


def test_suspicion_never_lengthens_a_deadline():
    table = RouteTable("e" * 16)
    register(table, now=0, timeout_ms=2000)
    assert table.suspect("c1", ADDR, 5000, now=0) is False  # its own timeout is sooner
    assert table.next_deadline() == 2000
    [event] = removed(table.expire(2001))
    assert event.reason == "expired"


def test_a_second_hint_never_lengthens_the_first():
    table = RouteTable("e" * 16)
    register(table, now=0, timeout_ms=2000)
    assert table.suspect("c1", ADDR, 1000, now=0) is True
    assert table.suspect("c1", ADDR, 5000, now=0) is False
    assert table.next_deadline() == 1000
    assert table.suspect("c1", ADDR, 500, now=0) is True
    assert table.next_deadline() == 500


def test_a_heartbeat_clears_the_suspicion():
    table = RouteTable("e" * 16)
    register(table, now=0)
    table.suspect("c1", ADDR, GRACE, now=0)
    known, _ = table.heartbeat("c1", "broker-a", ADDR, DataVersion(), now=2000)
    assert known
    assert table.next_deadline() == 62_000  # its own timeout again, from the heartbeat
    assert table.expire(2000 + GRACE + 1) == []


def test_a_registration_clears_the_suspicion():
    table = RouteTable("e" * 16)
    register(table, now=0)
    table.suspect("c1", ADDR, GRACE, now=0)
    register(table, now=2000)
    assert table.next_deadline() == 62_000
    assert table.expire(10_000) == []


def test_a_hint_for_an_unknown_broker_is_ignored():
    table = RouteTable("e" * 16)
    register(table, now=0)
    revision = table.revision
    assert table.suspect("c1", "10.9.9.9:10911", GRACE, now=0) is False
    assert table.suspect("other-cluster", ADDR, GRACE, now=0) is False  # liveness is per (cluster, addr)
    assert table.next_deadline() == 60_000
    assert table.revision == revision


def test_a_hint_after_a_long_silence_expires_a_quarter_timeout_after_the_hint():
    table = RouteTable("e" * 16)
    register(table, now=0, timeout_ms=8000)
    assert table.suspect("c1", ADDR, GRACE, now=5000) is True  # the broker is silent since 0
    assert table.next_deadline() == 7000  # not 3000: the hint came later than that
    [event] = removed(table.expire(7001))
    assert event.reason == "peer_expired"


def test_own_timeout_passing_first_is_reported_as_expired():
    table = RouteTable("e" * 16)
    register(table, now=0, timeout_ms=2000)
    table.suspect("c1", ADDR, 1500, now=0)
    [event] = removed(table.expire(5000))  # the loop was late: both deadlines passed
    assert event.reason == "expired"


def test_a_stall_moves_suspicion_deadlines_too():
    table = RouteTable("e" * 16)
    register(table, now=0, timeout_ms=8000)
    table.suspect("c1", ADDR, GRACE, now=0)
    table.shift_deadlines(10_000)
    assert table.next_deadline() == 10_000 + GRACE
    assert table.expire(10_000 + GRACE) == []
    [event] = removed(table.expire(10_000 + GRACE + 1))
    assert event.reason == "peer_expired"


# --- turning a peer's event into a hint (peers.py) -------------------------


def broker_event(change: str = "removed", reason: str = "expired", epoch: str = "a" * 16,
                 addr: str = ADDR) -> BrokerEvent:
    return BrokerEvent(epoch=epoch, revision=7, cluster="c1", broker_name="broker-a",
                       broker_id=0, broker_addr=addr, change=change, reason=reason)


@pytest.mark.parametrize("reason", ["expired", "unregistered"])
def test_a_peer_removal_by_expiry_or_unregistration_is_a_hint(reason):
    assert hint_from_event("tcp://p:1", broker_event(reason=reason)) == Hint(
        "tcp://p:1", "c1", "broker-a", ADDR, reason
    )


@pytest.mark.parametrize("change,reason", [
    ("removed", "peer_expired"),  # a peer's own hint: acting on it would echo
    ("removed", "peer_something_new"),
    ("removed", "displaced"),  # another address took the id: the broker is alive
    ("removed", ""),
    ("registered", ""),
    ("updated", ""),
])
def test_other_broker_events_are_not_hints(change, reason):
    assert hint_from_event("tcp://p:1", broker_event(change, reason)) is None


def test_hb_and_route_events_are_not_hints():
    assert hint_from_event("p", HbEvent(epoch="a" * 16, revision=1, time_ms=5)) is None
    assert hint_from_event("p", RouteEvent(epoch="a" * 16, revision=1, prev=0, topic="T",
                                           route=None)) is None


def test_hints_do_not_echo_between_two_servers():
    """A expires a broker; B acts on the hint; A ignores B's peer_expired event."""
    a, b = RouteTable("a" * 16), RouteTable("b" * 16)
    register(a, now=0, timeout_ms=1000)
    register(b, now=0, timeout_ms=8_000)
    [from_a] = removed(a.expire(1001))
    hint = hint_from_event("tcp://a:1", from_a)
    assert b.suspect(hint.cluster, hint.broker_addr, GRACE, now=1000)
    [from_b] = removed(b.expire(GRACE + 1))
    assert from_b.reason == "peer_expired"
    assert hint_from_event("tcp://b:1", from_b) is None


# --- the PeerLink state machine --------------------------------------------

PEER = "tcp://10.1.2.3:9876"


def status(epoch: str = "a" * 16, pub: str = "tcp://0.0.0.0:9877", rid: int = 1) -> StatusReply:
    return StatusReply(id=rid, epoch=epoch, revision=0, version="t", uptime_ms=0, brokers=0,
                       topics=0, pub_endpoint=pub)


def hb(time_ms: int, epoch: str = "a" * 16) -> HbEvent:
    return HbEvent(epoch=epoch, revision=0, time_ms=time_ms)


def linked(now: int = 0) -> PeerLink:
    """A link that learned the peer's endpoint at `now` and got one hb."""
    link = PeerLink(PEER, now)
    assert feed(link.on_timer, now) == [AskStatus(1)]
    assert feed(link.on_reply, status(), now) == [FollowEvents("tcp://10.1.2.3:9877")]
    feed(link.on_event, hb(now), now)
    return link


def test_start_up_asks_at_once_and_retries_with_capped_backoff():
    link = PeerLink(PEER, now=0)
    assert link.next_deadline() == 0
    assert feed(link.on_timer, 0) == [AskStatus(1)]
    assert feed(link.on_timer, RETRY_MIN_MS - 1) == []  # an attempt is given time to be answered
    sent_at, waits = [], []
    now = 0
    for _ in range(12):
        now = link.next_deadline()
        actions = feed(link.on_timer, now)
        assert len(actions) == 1 and isinstance(actions[0], AskStatus)
        sent_at.append(now)
    waits = [b - a for a, b in zip(sent_at, sent_at[1:])]
    assert waits[0] == 2 * RETRY_MIN_MS
    assert all(b >= a for a, b in zip(waits, waits[1:]))  # backoff grows...
    assert waits[-1] == RETRY_MAX_MS  # ...up to the cap
    assert not link.connected and link.pub is None


def test_a_status_reply_subscribes_to_the_learned_endpoint_once():
    link = PeerLink(PEER, now=0)
    feed(link.on_timer, 0)
    assert feed(link.on_reply, status(pub="tcp://0.0.0.0:9877"), 5) == [
        FollowEvents("tcp://10.1.2.3:9877")
    ]
    assert not link.asking and link.epoch == "a" * 16
    assert feed(link.on_reply, status(pub="tcp://0.0.0.0:9877"), 6) == []  # a late duplicate
    assert not link.connected  # connected means: its hbs arrive
    feed(link.on_event, hb(100), 10)
    assert link.connected


def test_an_error_reply_keeps_asking():
    link = PeerLink(PEER, now=0)
    feed(link.on_timer, 0)
    assert feed(link.on_reply, Error(id=1, code="no_permission", message="no"), 5) == []
    assert link.asking
    assert isinstance(feed(link.on_timer, link.next_deadline())[0], AskStatus)


def test_silence_disconnects_and_renews_the_subscription():
    link = linked(now=0)
    feed(link.on_event, hb(200), 200)
    assert link.interval_ms == 200
    assert link.silence_ms == MIN_SILENCE_MS  # 3 intervals, but never below the floor
    assert feed(link.on_timer, 200 + MIN_SILENCE_MS) == []  # not yet
    assert link.next_deadline() == 200 + MIN_SILENCE_MS + 1
    actions = feed(link.on_timer, 200 + MIN_SILENCE_MS + 1)
    assert actions == [AskStatus(2)]
    assert not link.connected and link.asking
    # The peer answers again from the same endpoint: the SUB reconnects anyway.
    assert feed(link.on_reply, status(rid=2), 1500) == [FollowEvents("tcp://10.1.2.3:9877")]


def test_an_hb_after_silence_makes_renewal_unnecessary():
    link = linked(now=0)
    feed(link.on_timer, 5000)  # silent
    feed(link.on_event, hb(5100), 5100)  # ...but it was only slow
    assert link.connected
    assert feed(link.on_reply, status(rid=2), 5200) == []


def test_a_slow_peer_gets_three_of_its_own_intervals():
    link = linked(now=0)
    feed(link.on_event, hb(5000), 5000)
    assert link.interval_ms == 5000
    assert feed(link.on_timer, 5000 + 3 * 5000) == []
    assert feed(link.on_timer, 5000 + 3 * 5000 + 1) == [AskStatus(2)]


def test_default_interval_until_measured():
    link = linked(now=0)
    assert link.silence_ms == 3 * DEFAULT_PEER_INTERVAL_MS


def test_a_new_epoch_on_the_sub_means_a_restart_and_re_learns_the_endpoint():
    link = linked(now=0)
    (hint,) = feed(link.on_event, broker_event(epoch="b" * 16), 100)
    assert isinstance(hint, Hint)  # a restarted peer's report is still true
    assert link.epoch == "b" * 16 and link.asking
    assert feed(link.on_timer, 100) == [AskStatus(2)]
    # Same endpoint and its events already arrive: the subscription stays.
    assert feed(link.on_reply, status(epoch="b" * 16, rid=2), 150) == []
    # A restart on another port moves the subscription.
    feed(link.on_event, hb(300, epoch="c" * 16), 300)
    feed(link.on_timer, 300)
    assert feed(link.on_reply, status(epoch="c" * 16, pub="tcp://*:7000", rid=3), 350) == [
        FollowEvents("tcp://10.1.2.3:7000")
    ]


def test_a_restart_resets_the_interval_measure():
    link = linked(now=0)
    feed(link.on_event, hb(1_000_000, epoch="b" * 16), 100)  # the new process's first hb
    feed(link.on_event, hb(1_000_200, epoch="b" * 16), 300)
    assert link.interval_ms == 200


def test_unreadable_events_change_nothing():
    link = linked(now=0)
    assert feed(link.on_event, None, 100) == []
    assert feed(link.on_reply, None, 100) == []
    assert link.epoch == "a" * 16 and link.connected


@pytest.mark.parametrize("decode", [decode_event, lambda body: decode_reply(body, "status")])
def test_deeply_nested_peer_input_is_a_decode_error_not_a_crash(decode):
    # msgspec raises RecursionError on such input; the peer links only catch DecodeError.
    body = b"\x84\xa2op\xa2hb\xa5epoch\xa1e\xa8revision\x01\xa1x" + b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(msgspec.DecodeError):
        decode(body)


# --- found by mutation testing (tools/mutate.py) ---------------------------------------------

def test_a_bad_events_endpoint_asks_again_backing_off_until_an_event_arrives():
    link = linked(0)
    assert link.connected is True
    waits = []
    now = 0
    for _ in range(7):
        link.on_subscribe_failed(now)
        assert link.pub is None and link.asking is True
        waits.append(link._next_ask - now)
        now = link._next_ask
        assert feed(link.on_timer, now) == [AskStatus(link._request_id)]
        assert link._next_ask == now + RETRY_MIN_MS  # an unanswered ask retries as usual
        assert feed(link.on_reply, status(rid=link._request_id), now) == [FollowEvents("tcp://10.1.2.3:9877")]
    # Doubling from 2 x RETRY_MIN_MS per failure in a row, capped (a status reply resets nothing).
    assert waits == [400, 800, 1600, 3200, RETRY_MAX_MS, RETRY_MAX_MS, RETRY_MAX_MS]
    feed(link.on_event, hb(now), now)  # the subscription works: the count starts over
    link.on_subscribe_failed(now)
    assert link._next_ask == now + 2 * RETRY_MIN_MS


def test_a_status_reply_while_not_asking_changes_nothing():
    link = linked(0)
    assert feed(link.on_reply, status(pub="tcp://0.0.0.0:1111", rid=9), 5) == []
    assert link.pub == "tcp://10.1.2.3:9877" and not link.asking


@pytest.mark.parametrize(("gap", "measured"), [(0, False), (1, True), (60_000, True), (60_001, False)])
def test_hb_gaps_measured_are_positive_and_at_most_a_minute(gap, measured):
    link = linked(0)
    feed(link.on_event, hb(gap), gap)
    assert link.interval_ms == (gap if measured else DEFAULT_PEER_INTERVAL_MS)


def test_the_link_logs_connect_restart_refusal_and_silence(caplog):
    with caplog.at_level("INFO", logger="zns"):
        link = linked(0)  # a first status and hb: no restart, one connect
        feed(link.on_timer, 5000)  # silent
        feed(link.on_timer, 5000)
        feed(link.on_reply, Error(code="no_permission", message="nope", id=link._request_id), 5001)
        feed(link.on_reply, status(epoch="b" * 16, rid=link._request_id), 5002)
        feed(link.on_event, hb(5003, epoch="c" * 16), 5003)
    assert [r.getMessage() for r in caplog.records] == [
        f"peer {PEER} connected (epoch 'aaaaaaaaaaaaaaaa', events on 'tcp://10.1.2.3:9877')",
        f"peer {PEER} disconnected: no hb for 5000 ms",
        f"peer {PEER} refused status: 'no_permission' 'nope'",
        f"peer {PEER} restarted (epoch 'aaaaaaaaaaaaaaaa' -> 'bbbbbbbbbbbbbbbb')",
        f"peer {PEER} restarted (epoch 'bbbbbbbbbbbbbbbb' -> 'cccccccccccccccc'); asking for its endpoints again",
        f"peer {PEER} connected (epoch 'cccccccccccccccc', events on 'tcp://10.1.2.3:9877')",
    ]
    assert link.connected is True


def test_a_fresh_link_whose_first_subscription_fails_backs_off_from_the_first_step():
    link = PeerLink(PEER, now=0)
    feed(link.on_timer, 0)
    feed(link.on_reply, status(), 0)
    link.on_subscribe_failed(10)  # before any event of the peer arrived
    assert link.next_deadline() == 10 + 2 * RETRY_MIN_MS


def test_connected_is_a_bool_before_the_first_hb_and_after_silence():
    # The server copies it into its status reply's `peers` map, which carries booleans.
    link = PeerLink(PEER, now=0)
    assert link.connected is False
    link = linked(0)
    feed(link.on_timer, 5000)  # silent
    assert link.connected is False


def test_a_hint_names_the_peer_it_came_from():
    link = linked(0)
    assert feed(link.on_event, broker_event(), 100) == [Hint(PEER, "c1", "broker-a", ADDR, "expired")]


def test_a_restart_learned_from_a_status_reply_resets_the_interval_measure():
    link = linked(0)  # an hb at 0
    feed(link.on_timer, 5000)  # silent: asks again
    feed(link.on_reply, status(epoch="b" * 16, rid=2), 5000)
    feed(link.on_event, hb(1, epoch="b" * 16), 5100)  # 5100 ms after the old process's hb
    assert link.interval_ms == DEFAULT_PEER_INTERVAL_MS
    feed(link.on_event, hb(2, epoch="b" * 16), 5300)
    assert link.interval_ms == 200


def test_a_restart_seen_before_any_hb_keeps_the_working_subscription():
    link = PeerLink(PEER, now=0)
    feed(link.on_timer, 0)
    assert feed(link.on_reply, status(), 0) == [FollowEvents("tcp://10.1.2.3:9877")]
    assert feed(link.on_event, broker_event("registered", "", epoch="b" * 16), 100) == []
    assert feed(link.on_timer, 100) == [AskStatus(2)]
    assert feed(link.on_reply, status(epoch="b" * 16, rid=2), 150) == []  # same endpoint


def test_the_silence_clock_starts_when_the_link_subscribes():
    link = PeerLink(PEER, now=0)
    feed(link.on_timer, 0)
    feed(link.on_reply, status(), 50)
    assert link.next_deadline() == 50 + 3 * DEFAULT_PEER_INTERVAL_MS + 1
    assert feed(link.on_timer, 50 + 3 * DEFAULT_PEER_INTERVAL_MS + 1) == [AskStatus(2)]  # no hb came


def test_silence_is_logged_as_the_time_since_the_last_hb(caplog):
    link = linked(100)
    with caplog.at_level("WARNING", logger="zns"):
        feed(link.on_timer, 100 + 3 * DEFAULT_PEER_INTERVAL_MS + 1)
    assert [r.getMessage() for r in caplog.records] == [f"peer {PEER} disconnected: no hb for 3001 ms"]

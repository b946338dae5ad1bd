"""BrokerSession without sockets: replies and the time go in, actions come out (§4)."""

from __future__ import annotations

import random

import pytest

from helpers import feed
from zns.core.backoff import Backoff
from zns.core.broker_session import (
    BrokerSession,
    BrokerState,
    Connect,
    Disconnect,
    Done,
    SendRequest,
)
from zns.core.errors import UsageError
from zns.core.schema import (
    DataVersion,
    Error,
    Heartbeat,
    HeartbeatReply,
    RegisterBroker,
    RegisterBrokerReply,
    TopicConfig,
    UnregisterBroker,
    UnregisterBrokerReply,
)

PERIOD, INTERVAL, TIMEOUT = 30_000, 1_000, 3_000


def make_state(**kw) -> BrokerState:
    kw.setdefault("topics", {"T1": TopicConfig()})
    return BrokerState(cluster="c1", broker_name="bk", broker_addr="127.0.0.1:10911",
                       heartbeat_timeout_ms=5_000, **kw)


def make_session(state: BrokerState | None = None, **kw) -> BrokerSession:
    kw.setdefault("backoff", Backoff(100, 10_000, random.Random(7)))
    return BrokerSession("tcp://ns:9876", state or make_state(), **kw)


def sent(actions: list) -> object:
    """The one request among `actions`."""
    requests = [a.request for a in actions if isinstance(a, SendRequest)]
    assert len(requests) == 1, actions
    return requests[0]


def registered_at(session: BrokerSession, now: int) -> list:
    """Start `session` and answer its registration at `now`."""
    reg = sent(feed(session.start, 0))
    return feed(session.on_reply, RegisterBrokerReply(id=reg.id), now)


def test_start_connects_and_registers_everything_it_declares():
    session = make_session()
    assert session.next_deadline() is None  # not started: nothing to wake for
    actions = feed(session.start, 0)
    assert actions[0] == Connect() and len(actions) == 2
    reg = sent(actions)
    assert isinstance(reg, RegisterBroker) and reg.id > 0
    assert set(reg.topics) == {"T1"} and reg.heartbeat_timeout_ms == 5_000
    assert session.next_deadline() == TIMEOUT  # only the reply (or its timeout) is awaited
    assert not session.registered
    assert feed(session.on_reply, RegisterBrokerReply(id=reg.id), 5) == []
    assert session.registered and session.registrations == 1
    assert session.acknowledged == reg


def test_heartbeats_every_interval_once_registered():
    session = make_session()
    registered_at(session, 10)
    assert session.next_deadline() == 10 + INTERVAL
    assert feed(session.on_timer, 10 + INTERVAL - 1) == []
    hb = sent(feed(session.on_timer, 10 + INTERVAL))
    assert isinstance(hb, Heartbeat) and hb.data_version == session.broker.version
    assert feed(session.on_reply, HeartbeatReply(id=hb.id, known=True, changed=False), 20 + INTERVAL) == []
    assert session.next_deadline() == 10 + 2 * INTERVAL
    assert isinstance(sent(feed(session.on_timer, 10 + 2 * INTERVAL)), Heartbeat)


@pytest.mark.parametrize("known, changed", [(False, False), (True, True)])
def test_a_heartbeat_answered_unknown_or_changed_registers_at_once(known: bool, changed: bool):
    session = make_session()
    registered_at(session, 10)
    hb = sent(feed(session.on_timer, 10 + INTERVAL))
    reg = sent(feed(session.on_reply, HeartbeatReply(id=hb.id, known=known, changed=changed), 1_020))
    assert isinstance(reg, RegisterBroker)
    assert not session.registered  # until the NameServer confirms it


def test_a_heartbeat_refused_registers_at_once():
    session = make_session()
    registered_at(session, 10)
    hb = sent(feed(session.on_timer, 10 + INTERVAL))
    reply = Error(id=hb.id, code="bad_request", message="no")
    assert isinstance(sent(feed(session.on_reply, reply, 1_020)), RegisterBroker)


def run_answering(session: BrokerSession, until: int) -> list:
    """Drive `session` to `until`, each request answered 1 ms later; the requests sent."""
    requests = []
    actions = feed(session.start, 0)
    while True:
        for action in actions:
            if isinstance(action, SendRequest):
                requests.append(action.request)
        request = session.in_flight
        wake = session.next_deadline()
        if request is not None:
            now = wake - TIMEOUT + 1  # sent at wake - TIMEOUT
            reply = (RegisterBrokerReply(id=request.id) if isinstance(request, RegisterBroker)
                     else HeartbeatReply(id=request.id, known=True, changed=False))
            actions = feed(session.on_reply, reply, now)
        elif wake > until:
            return requests
        else:
            actions = feed(session.on_timer, wake)


def test_registers_again_every_register_period():
    session = make_session(register_period_ms=20_000)
    requests = run_answering(session, 65_000)
    registrations = [r for r in requests if isinstance(r, RegisterBroker)]
    # At 0, then every 20 s after each confirmation (1 ms after sending).
    assert len(registrations) == 4
    assert sum(isinstance(r, Heartbeat) for r in requests) > 50


@pytest.mark.parametrize("asked, used", [(1_000, 10_000), (600_000, 60_000), (25_000, 25_000)])
def test_the_register_period_is_clamped_to_10_to_60_s(asked: int, used: int):
    session = make_session(register_period_ms=asked)
    assert session.register_period_ms == used
    requests = run_answering(session, 130_000)
    registrations = sum(isinstance(r, RegisterBroker) for r in requests)
    assert registrations == 1 + 130_000 // (used + 1)


def test_every_topic_changed_while_a_registration_is_in_flight_is_registered_next():
    state = make_state()
    session = make_session(state)
    first = sent(feed(session.start, 0))
    for i in range(5):  # all while the first registration waits for its reply
        state.set_topics({**state.topics, f"X{i}": TopicConfig(read_queues=i)}, wall_ms=1_000 + i)
        assert feed(session.topics_changed, 10 + i) == []  # one request at a time
    assert state.version.counter == 5 and state.version.timestamp == 1_004
    second = sent(feed(session.on_reply, RegisterBrokerReply(id=first.id), 20))
    assert isinstance(second, RegisterBroker)
    assert set(second.topics) == {"T1", "X0", "X1", "X2", "X3", "X4"}
    assert all(second.topics[f"X{i}"].read_queues == i for i in range(5))
    assert second.data_version == state.version
    assert not session.registered  # the first confirmation was of an older version
    assert feed(session.on_reply, RegisterBrokerReply(id=second.id), 30) == []
    assert session.registered and session.acknowledged == second


def test_a_topic_change_while_idle_registers_at_once_and_while_a_heartbeat_waits_after_it():
    state = make_state()
    session = make_session(state)
    registered_at(session, 10)
    state.set_topics({"T2": TopicConfig()}, wall_ms=1)
    reg = sent(feed(session.topics_changed, 500))  # idle: at once, not at the next period
    assert set(reg.topics) == {"T2"}
    feed(session.on_reply, RegisterBrokerReply(id=reg.id), 510)
    hb = sent(feed(session.on_timer, 510 + INTERVAL))
    state.set_topics({"T3": TopicConfig()}, wall_ms=2)
    assert feed(session.topics_changed, 1_600) == []
    reg = sent(feed(session.on_reply, HeartbeatReply(id=hb.id, known=True, changed=False), 1_620))
    assert set(reg.topics) == {"T3"}


def test_a_refused_registration_is_logged_and_retried_each_period(caplog):
    session = make_session(register_period_ms=PERIOD)
    reg = sent(feed(session.start, 0))
    refused = Error(id=reg.id, code="conflict", message="id 0 is held by 10.9.9.9:1")
    assert feed(session.on_reply, refused, 10) == []
    assert "conflict" in session.last_error and not session.registered
    assert any("conflict" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    assert session.next_deadline() == 10 + PERIOD  # no retry storm, no heartbeats meanwhile
    assert feed(session.on_timer, 10 + INTERVAL) == []
    assert feed(session.on_timer, 10 + PERIOD - 1) == []
    again = sent(feed(session.on_timer, 10 + PERIOD))
    assert isinstance(again, RegisterBroker) and again.id != reg.id
    assert feed(session.on_reply, refused.__class__(id=again.id, code="conflict", message="still"),
                            20 + PERIOD) == []
    assert session.next_deadline() == 20 + 2 * PERIOD


def test_a_request_timeout_reconnects_after_a_growing_jittered_backoff_and_registers_again():
    session = make_session()
    first = sent(feed(session.start, 0))
    assert feed(session.on_timer, TIMEOUT - 1) == []
    assert feed(session.on_timer, TIMEOUT) == [Disconnect()]
    assert "no reply to register_broker" in session.last_error
    delays = [session.next_deadline() - TIMEOUT]
    assert feed(session.on_reply, RegisterBrokerReply(id=first.id), TIMEOUT + 1) == []  # too late
    assert not session.registered
    assert feed(session.on_timer, session.next_deadline() - 1) == []
    now = session.next_deadline()
    actions = feed(session.on_timer, now)
    assert actions[0] == Connect() and isinstance(sent(actions), RegisterBroker)
    for _ in range(4):  # each unanswered: the wait grows (jittered within [d/2, d])
        now += TIMEOUT
        assert feed(session.on_timer, now) == [Disconnect()]
        delays.append(session.next_deadline() - now)
        now = session.next_deadline()
        actions = feed(session.on_timer, now)
        assert actions[0] == Connect()
    assert [50 <= d <= 100 for d in delays[:1]] == [True]
    assert all(100 * 2 ** k / 2 <= d <= 100 * 2 ** k for k, d in enumerate(delays)), delays
    # An answer resets the backoff and registers.
    reg = sent(actions)
    feed(session.on_reply, RegisterBrokerReply(id=reg.id), now + 5)
    assert session.registered
    hb = sent(feed(session.on_timer, now + 5 + INTERVAL))
    assert feed(session.on_timer, now + 5 + INTERVAL + TIMEOUT) == [Disconnect()]
    assert session.next_deadline() - (now + 5 + INTERVAL + TIMEOUT) <= 100
    assert isinstance(hb, Heartbeat) and not session.registered
    # The NameServer may have dropped the broker meanwhile: reconnecting registers in full.
    actions = feed(session.on_timer, session.next_deadline())
    assert actions[0] == Connect() and isinstance(sent(actions), RegisterBroker)


def test_close_unregisters_on_a_fresh_connection_and_is_done():
    session = make_session()
    registered_at(session, 10)
    hb = sent(feed(session.on_timer, 10 + INTERVAL))
    actions = feed(session.close, 1_100, 2_000)
    assert actions[:2] == [Disconnect(), Connect()]
    unreg = sent(actions)
    assert isinstance(unreg, UnregisterBroker) and unreg.broker_name == "bk"
    assert feed(session.on_reply, HeartbeatReply(id=hb.id, known=True, changed=False), 1_150) == []
    assert feed(session.on_timer, 1_100 + INTERVAL + 500) == []  # no heartbeat once closing
    assert feed(session.on_reply, UnregisterBrokerReply(id=unreg.id, removed=True), 1_200) == [Done(True)]
    assert session.unregistered and session.done and session.next_deadline() is None
    assert feed(session.on_timer, 100_000) == [] and feed(session.close, 100_000, 1) == []


def test_close_gives_up_at_its_deadline():
    session = make_session()
    registered_at(session, 10)
    feed(session.close, 100, 2_000)
    assert session.next_deadline() == 2_100
    assert feed(session.on_timer, 2_099) == []
    assert feed(session.on_timer, 2_100) == [Done(False)]
    assert not session.unregistered and session.done


def test_registration_replies_expose_master_and_ha_addresses():
    session = make_session()
    reg = sent(feed(session.start, 0))
    feed(session.on_reply, RegisterBrokerReply(id=reg.id, master_addr="10.0.0.1:10911",
                                         ha_addr="10.0.0.1:10912"), 5)
    assert (session.master_addr, session.ha_addr) == ("10.0.0.1:10911", "10.0.0.1:10912")


def test_a_reply_of_the_wrong_kind_counts_as_a_failed_request():
    session = make_session()
    reg = sent(feed(session.start, 0))
    assert feed(session.on_reply, HeartbeatReply(id=reg.id, known=True, changed=False), 5) == \
        [Disconnect()]
    assert not session.registered


def test_shared_request_ids_stay_distinct_across_sessions():
    import itertools

    ids = itertools.count(1)
    state = make_state()
    a, b = make_session(state, request_ids=ids), make_session(state, request_ids=ids)
    ra, rb = sent(feed(a.start, 0)), sent(feed(b.start, 0))
    assert ra.id != rb.id
    assert feed(b.on_reply, RegisterBrokerReply(id=ra.id), 5) == [] and not b.registered


def test_invalid_topics_are_refused_and_change_nothing():
    state = make_state()
    before = (state.version, state.topics)
    with pytest.raises(UsageError):
        state.set_topics({"T1": TopicConfig(), "bad topic!": TopicConfig()}, wall_ms=5)
    with pytest.raises(UsageError):
        state.set_topics({"T1": {"read_queues": -1}}, wall_ms=5)
    assert (state.version, state.topics) == before
    with pytest.raises(UsageError, match="broker address"):
        BrokerState(cluster="c", broker_name="b", broker_addr="nope")


# --- what an operator and the agent read: state, replies, log lines --------------------------

ENDPOINT = "tcp://ns:9876"


@pytest.fixture(autouse=True)
def _session_log_level(caplog):
    """Every level of the session's log is captured, whatever another test set on "zns"."""
    caplog.set_level("DEBUG", logger="zns.core.broker_session")


def messages(caplog, level: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "zns.core.broker_session" and r.levelname == level]


def test_a_fresh_session_reports_nothing_yet_and_numbers_its_requests_from_1():
    session = make_session()
    assert (session.master_addr, session.ha_addr, session.last_error) == ("", "", "")
    assert session.done is False and session.unregistered is False
    assert session.registrations == 0 and session.in_flight is None
    reg = sent(feed(session.start, 0))
    assert reg.id == 1
    hb = sent(feed(session.on_reply, RegisterBrokerReply(id=reg.id), 5) + feed(session.on_timer, 5 + INTERVAL))
    assert hb.id == 2


def test_the_state_registers_every_field_it_was_given():
    version = DataVersion(state=7, timestamp=1_000, counter=3)
    state = BrokerState(cluster="c1", broker_name="bk", broker_addr="127.0.0.1:10911",
                        broker_id=2, ha_addr="127.0.0.1:10912", zone="az-1",
                        topics={"T1": {"read_queues": 4, "perm": 4}},
                        filter_servers=["127.0.0.1:7000"], heartbeat_timeout_ms=5_000,
                        version=version)
    reg = state.registration()
    assert (reg.cluster, reg.broker_name, reg.broker_id, reg.broker_addr) == \
        ("c1", "bk", 2, "127.0.0.1:10911")
    assert (reg.ha_addr, reg.zone, reg.filter_servers) == ("127.0.0.1:10912", "az-1", ["127.0.0.1:7000"])
    assert reg.data_version == version and reg.heartbeat_timeout_ms == 5_000
    assert reg.topics == {"T1": TopicConfig(read_queues=4, perm=4)}  # a mapping, completed
    # A master with no HA address and no zone unless told.
    plain = make_state().registration()
    assert (plain.broker_id, plain.ha_addr, plain.zone, plain.filter_servers) == (0, "", "", [])


def test_a_topic_change_keeps_the_version_state_and_heartbeats_carry_the_new_version():
    state = make_state(version=DataVersion(state=7, timestamp=1, counter=3))
    state.set_topics({"T2": {"write_queues": 2}}, wall_ms=5_000)
    assert state.version == DataVersion(state=7, timestamp=5_000, counter=4)
    assert state.topics == {"T2": TopicConfig(write_queues=2)}
    hb = state.heartbeat()
    assert hb.data_version == DataVersion(state=7, timestamp=5_000, counter=4)
    assert (hb.cluster, hb.broker_name, hb.broker_id, hb.broker_addr) == \
        ("c1", "bk", 0, "127.0.0.1:10911")


def test_an_invalid_topic_config_names_the_field():
    with pytest.raises(UsageError) as refused:
        make_state(topics={"T1": {"read_queues": -1}})
    assert str(refused.value) == "topic config: Expected `int` >= 0 - at `$.read_queues`"


def test_without_a_backoff_given_reconnects_wait_100_ms_doubling_up_to_10_s():
    session = BrokerSession(ENDPOINT, make_state())
    now, delays = 0, []
    feed(session.start, now)
    for _ in range(12):
        now = session.next_deadline()  # the request's deadline
        assert feed(session.on_timer, now) == [Disconnect()]
        delays.append(session.next_deadline() - now)
        now = session.next_deadline()
        assert feed(session.on_timer, now)[0] == Connect()
    assert 50 <= delays[0] <= 100 and 100 <= delays[1] <= 200
    assert all(5_000 <= d <= 10_000 for d in delays[-4:]), delays


def test_a_request_timeout_is_logged_with_the_reconnect_delay(caplog):
    session = make_session()
    feed(session.start, 0)
    assert feed(session.on_timer, TIMEOUT) == [Disconnect()]
    delay = session.next_deadline() - TIMEOUT
    assert messages(caplog, "WARNING") == [
        f"NameServer {ENDPOINT}: no reply to register_broker within {TIMEOUT} ms; "
        f"reconnecting in {delay} ms"]


def test_a_reply_of_the_wrong_kind_is_named_in_the_last_error():
    session = make_session()
    reg = sent(feed(session.start, 0))
    feed(session.on_reply, HeartbeatReply(id=reg.id, known=True, changed=False), 5)
    assert session.last_error == "answered register_broker with a HeartbeatReply"


def test_a_reply_without_an_id_is_ignored():
    session = make_session()
    feed(session.start, 0)
    assert feed(session.on_reply, object(), 5) == [] and session.in_flight is not None


def test_a_confirmed_registration_clears_the_last_error_and_counts(caplog):
    caplog.set_level("DEBUG", logger="zns.core.broker_session")
    session = make_session()
    reg = sent(feed(session.start, 0))
    feed(session.on_reply, Error(id=reg.id, code="conflict", message="held"), 5)
    assert session.last_error == "conflict: held"
    assert messages(caplog, "ERROR") == [
        f"NameServer {ENDPOINT} refused the registration of bk: conflict held"]
    reg = sent(feed(session.on_timer, 5 + session.register_period_ms))
    feed(session.on_reply, RegisterBrokerReply(id=reg.id), 30_010)
    assert session.last_error == "" and session.registrations == 1
    assert messages(caplog, "DEBUG") == [f"registered with {ENDPOINT}"]
    session.broker.set_topics({"T2": TopicConfig()}, wall_ms=1)
    reg = sent(feed(session.topics_changed, 30_020))
    feed(session.on_reply, RegisterBrokerReply(id=reg.id), 30_030)
    assert session.registrations == 2


@pytest.mark.parametrize("known, changed, why", [
    (False, False, "does not know"), (True, True, "holds another version of")])
def test_a_heartbeat_answered_unknown_or_changed_says_so_in_the_log(caplog, known, changed, why):
    caplog.set_level("INFO", logger="zns.core.broker_session")
    session = make_session()
    registered_at(session, 10)
    hb = sent(feed(session.on_timer, 10 + INTERVAL))
    feed(session.on_reply, HeartbeatReply(id=hb.id, known=known, changed=changed), 1_020)
    assert messages(caplog, "INFO") == [f"NameServer {ENDPOINT} {why} this broker: registering again"]


def test_a_heartbeat_refused_is_logged_and_kept_as_the_last_error(caplog):
    session = make_session()
    registered_at(session, 10)
    hb = sent(feed(session.on_timer, 10 + INTERVAL))
    feed(session.on_reply, Error(id=hb.id, code="bad_request", message="no"), 1_020)
    assert session.last_error == "bad_request: no"
    assert messages(caplog, "WARNING") == [
        f"NameServer {ENDPOINT} answered heartbeat with bad_request: no"]


def test_a_refused_unregistration_ends_the_session_unconfirmed(caplog):
    session = make_session()
    registered_at(session, 10)
    unreg = sent(feed(session.close, 100, 2_000))
    refused = Error(id=unreg.id, code="not_found", message="no such broker")
    assert feed(session.on_reply, refused, 150) == [Done(False)]
    assert session.done and not session.unregistered
    assert session.last_error == "not_found: no such broker"
    assert messages(caplog, "WARNING") == [
        f"NameServer {ENDPOINT} refused to unregister bk: not_found no such broker"]


def test_closing_twice_sends_one_unregistration():
    session = make_session()
    registered_at(session, 10)
    assert isinstance(sent(feed(session.close, 100, 2_000)), UnregisterBroker)
    assert feed(session.close, 200, 2_000) == []
    assert session.next_deadline() == 2_100  # the first close's deadline stands


def test_a_close_that_times_out_is_logged_and_ignores_a_late_confirmation(caplog):
    session = make_session()
    registered_at(session, 10)
    unreg = sent(feed(session.close, 100, 2_000))
    assert feed(session.on_timer, 2_100) == [Done(False)]
    assert messages(caplog, "WARNING") == [
        f"NameServer {ENDPOINT} did not confirm the unregistration of bk in time"]
    assert feed(session.on_reply, UnregisterBrokerReply(id=unreg.id, removed=True), 2_200) == []
    assert not session.unregistered and session.in_flight is None


def test_after_unregistering_the_session_holds_no_registration():
    session = make_session()
    registered_at(session, 10)
    unreg = sent(feed(session.close, 100, 2_000))
    assert feed(session.on_reply, UnregisterBrokerReply(id=unreg.id, removed=True), 150) == [Done(True)]
    assert session.registered is False and session.acknowledged is None


def test_actions_pile_up_in_order_until_handed_out():
    """A driver may feed several inputs before it asks for actions(): none is lost."""
    session = make_session()
    session.start(0)
    reg = session.in_flight
    session.on_timer(0)  # nothing due: adds nothing
    session.topics_changed(1)  # a registration is in flight: adds nothing yet
    session.on_reply(RegisterBrokerReply(id=reg.id), 2)
    session.close(3, 1_000)
    unreg = session.in_flight
    assert session.actions() == [Connect(), SendRequest(reg), Disconnect(), Connect(),
                                 SendRequest(unreg)]
    assert session.actions() == []  # each action is handed out once

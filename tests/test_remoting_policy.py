"""The remoting connection policy (zns.core.remoting.connections): no sockets, `now` injected.

What the listener decides about its connections — admission, the byte budget and what is
closed past it, back-pressure, idle and frame deadlines — pinned here; the listener's tests
(test_remoting_buffers.py, test_remoting_listener.py) run the same decisions live.
"""

from __future__ import annotations

import pytest

from zns.core.remoting.connections import (
    NEWCOMER_CONNECTIONS, Account, ConnectionPolicy,
)

pytestmark = pytest.mark.timeout(60)


def policy(**kw: int) -> ConnectionPolicy:
    settings = dict(max_connections=4096, max_per_host=1024, idle_timeout_ms=10_000,
                    high_water=100, max_unsent=1000, max_buffer_bytes=1000,
                    frame_deadline_ms=1_000)
    settings.update(kw)
    return ConnectionPolicy(**settings)


def admitted(p: ConnectionPolicy, conn_id: int, host: str = "127.0.0.1", now: int = 0) -> Account:
    account = p.admit(conn_id, host, now)
    assert isinstance(account, Account), account
    return account


def test_a_connection_closed_twice_is_counted_closed_once():
    p = policy()
    first, second = admitted(p, 1), admitted(p, 2)
    p.account(first, 30)
    assert p.closed(first) and not p.closed(first)
    assert p.per_host == {"127.0.0.1": 1} and list(p.accounts) == [second.conn_id]
    assert p.held == 0


def test_held_bytes_follow_what_each_connection_says_it_holds():
    p = policy()
    a, b = admitted(p, 1), admitted(p, 2)
    assert p.account(a, 130) == [] and p.account(b, 20) == []
    assert (a.held, p.held) == (130, 150)
    p.account(a, 80)
    assert (a.held, p.held) == (80, 100)


def test_answering_stops_at_the_high_water_mark_and_past_max_unsent_it_is_cut_off():
    p = policy(high_water=100, max_unsent=1000)
    a = admitted(p, 1)
    assert p.may_answer(99) and not p.may_answer(100)
    assert p.reply_queued(a, 1000) is None and p.cut_off == 0
    close = p.reply_queued(a, 1001)
    assert close is not None and close.account is a and close.kind == "cut_off"
    assert close.why == "cut off: 1001 bytes of replies unread" and p.cut_off == 1


def test_read_interest_follows_what_waits_and_a_paused_frame_restarts_its_deadline():
    p = policy(high_water=100, frame_deadline_ms=5_000)
    a = admitted(p, 1, now=1_000_000)
    p.read(a, 1_999_000, held=200, frame_in_progress=True)  # a frame begun
    assert not p.wants_read(a, 2_000_000, pending=False, unsent=100)  # at the mark: paused
    assert not p.wants_read(a, 2_000_000, pending=True, unsent=0)  # requests wait: paused
    assert p.on_timer(2_004_000) == []  # paused: its frame is not late
    assert p.wants_read(a, 2_000_000, pending=False, unsent=99)  # resumed: clock restarts
    assert a.frame_started == 2_000_000
    assert p.wants_read(a, 2_000_500, pending=False, unsent=0)  # read already: it runs on
    assert a.frame_started == 2_000_000
    assert p.on_timer(2_004_999) == []
    [close] = p.on_timer(2_005_000)
    assert (close.account, close.kind, close.why) == (
        a, "late", "closed: a frame begun 5 s ago is not complete")
    assert p.too_slow == 1


def test_late_frames_close_at_their_deadline_exactly_past_entries_that_no_longer_count():
    p = policy(frame_deadline_ms=1_000)
    gone, whole, later, late = (admitted(p, i) for i in range(1, 5))
    for account in (gone, whole, later, late):
        p.read(account, 0, held=10, frame_in_progress=True)
    p.closed(gone)  # its heap entry stays, stale
    p.read(whole, 500, held=0, frame_in_progress=False)  # that frame completed
    p.read(later, 500, held=0, frame_in_progress=False)
    p.read(later, 600, held=10, frame_in_progress=True)  # the next frame: its own deadline
    assert p.on_timer(999) == [] and p.too_slow == 0
    assert [c.account for c in p.on_timer(1_000)] == [late]
    assert [c.account for c in p.on_timer(1_600)] == [later] and p.too_slow == 2
    assert p.next_deadline() == 10_000  # the idle deadlines are what is left


def test_idle_connections_close_at_their_deadline_and_one_that_spoke_is_pushed_back():
    p = policy(idle_timeout_ms=10_000)
    quiet, talker, gone = admitted(p, 1), admitted(p, 2), admitted(p, 3)
    p.closed(gone)
    assert p.next_deadline() == 10_000
    p.read(talker, 4_000, held=0, frame_in_progress=False)
    assert p.on_timer(9_999) == []
    [close] = p.on_timer(10_000)
    assert (close.account, close.kind, close.why) == (quiet, "idle", "closed: idle for 10 s")
    assert p.next_deadline() == 14_000
    p.closed(quiet)
    assert p.on_timer(13_999) == []
    assert [c.account for c in p.on_timer(14_000)] == [talker]


def test_a_connection_idle_and_late_is_closed_once():
    p = policy(idle_timeout_ms=1_000, frame_deadline_ms=1_000)
    a = admitted(p, 1)
    p.read(a, 0, held=10, frame_in_progress=True)
    assert [c.kind for c in p.on_timer(1_000)] == ["idle"]


def test_connections_are_refused_past_the_limits_saying_which():
    p = policy(max_connections=2, max_per_host=1)
    admitted(p, 1)
    assert p.admit(2, "127.0.0.1", 0) == (
        "1 connections already open from it (--remoting-max-connections-per-host)")
    admitted(p, 3, host="127.0.0.2")
    assert p.admit(4, "127.0.0.3", 0) == (
        "2 connections already open (--remoting-max-connections)")
    assert p.refused == 2 and p.per_host == {"127.0.0.1": 1, "127.0.0.2": 1}


def test_four_hosts_at_the_per_host_cap_leave_slots_for_a_fifth():
    # Issue 32 item 9: 4 x 1,024 filled all 4,096 slots and a fifth host was refused.
    p = policy(max_connections=4096, max_per_host=1024)
    conn_ids = iter(range(1, 1 << 20))
    taken = {}
    for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
        while isinstance(p.admit(next(conn_ids), host, 0), Account):
            pass
        taken[host] = p.per_host[host]
    assert list(taken.values()) == [1024, 1024, 1024, 512]
    assert p.admit(next(conn_ids), "127.0.0.5", 0) == (
        "512 connections already open from it, and the last 512 of "
        "--remoting-max-connections are kept for other addresses")
    for n in range(NEWCOMER_CONNECTIONS):  # a fifth host gets its connections
        admitted(p, next(conn_ids), host="127.0.0.6")
    assert isinstance(p.admit(next(conn_ids), "127.0.0.6", 0), str)
    # 128 more hosts of four connections each fit in what is kept.
    assert p.reserved // NEWCOMER_CONNECTIONS == 128


def test_over_the_budget_the_host_holding_the_most_loses_its_stalled_frames_first():
    p = policy(max_buffer_bytes=1000)
    broker = admitted(p, 1, host="127.0.0.1")
    attackers = [admitted(p, i, host="127.0.0.2") for i in range(2, 12)]
    for now, attacker in enumerate(attackers):  # 90 each: 900 in all, stalled
        p.read(attacker, now, held=90, frame_in_progress=True)
    # The broker's frame of 300 arrives later: over by 200. It holds the most of any
    # connection, yet its host holds less: three of the attacker's oldest frames go.
    closes = p.read(broker, 100, held=300, frame_in_progress=True)
    assert [c.account for c in closes] == attackers[:3] and p.over_budget == 3
    assert all(c.kind == "over_budget" for c in closes)
    assert closes[0].why == ("closed: it holds 90 bytes and all connections 1200, more than "
                             "1000 (--remoting-max-buffer-bytes)")
    for close in closes:
        p.closed(close.account)
    assert p.held == 930


def test_within_one_host_the_longest_waiting_go_first_and_the_larger_on_a_tie():
    p = policy(max_buffer_bytes=250)
    small, big, newest = admitted(p, 1), admitted(p, 2), admitted(p, 3)
    p.read(small, 0, held=100, frame_in_progress=True)
    p.read(big, 0, held=150, frame_in_progress=True)
    assert p.read(newest, 5, held=1, frame_in_progress=True)[0].account is big
    p.closed(big)
    p.read(big := admitted(p, 4), 6, held=150, frame_in_progress=True)
    assert [c.account for c in p.read(newest, 7, held=1, frame_in_progress=True)] == [small]


def test_shedding_stops_as_soon_as_what_is_left_fits_exactly():
    p = policy(max_buffer_bytes=100_000)
    small, big = admitted(p, 1), admitted(p, 2)
    assert p.read(small, 0, held=100_000, frame_in_progress=True) == []
    [close] = p.read(big, 0, held=150_000, frame_in_progress=True)
    assert close.account is big and p.over_budget == 1

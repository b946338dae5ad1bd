"""ServerTimers without sockets: the hb schedule, expiry wake-ups and the §8 stall rule."""

from __future__ import annotations

import pytest

from zns.core import schema
from zns.core.service import NameService
from zns.core.timers import STALL_PROBE_MS, ServerTimers
from zns.drivers.kv_file import KvStore

from helpers import register_fields

pytestmark = pytest.mark.timeout(30)


def make(interval_ms: int = 1000, now: int = 0) -> tuple[NameService, ServerTimers]:
    service = NameService(KvStore(None), epoch="e" * 16, started_at_ms=now)
    return service, ServerTimers(service, heartbeat_interval_ms=interval_ms, now=now)


def register(service: NameService, now: int, timeout_ms: int = 2000, name: str = "b1",
             addr: str = "10.0.0.1:10911") -> None:
    body = schema.encode({"op": "register_broker", "id": 1,
                          **register_fields(broker_name=name, addr=addr,
                                            heartbeat_timeout_ms=timeout_ms)})
    reply = schema.decode_reply(service.respond(body, now).reply)
    assert not isinstance(reply, schema.Error), reply


def frames(batches) -> list:
    return [event for batch in batches for event in batch]


def hbs(batches) -> list[schema.HbEvent]:
    return [schema.decode_event(body) for channel, body in frames(batches)
            if channel == schema.HB_CHANNEL]


def removed(batches) -> list[schema.BrokerEvent]:
    events = [schema.decode_event(body) for _, body in frames(batches)]
    return [e for e in events if isinstance(e, schema.BrokerEvent) and e.change == "removed"]


def test_hb_is_due_at_start_then_every_interval_and_carries_the_wall_clock():
    _, timers = make(interval_ms=1000, now=0)
    assert timers.next_deadline() == 0
    timers.woke(0)
    assert [hb.time_ms for hb in hbs(timers.on_timer(0, wall_ms=5_000))] == [5_000]
    assert hbs(timers.on_timer(999, wall_ms=5_999)) == []
    assert len(hbs(timers.on_timer(1000, wall_ms=6_000))) == 1


def test_a_late_hb_is_not_repeated_to_catch_up():
    _, timers = make(interval_ms=100, now=0)
    timers.on_timer(0, 0)
    # Busy for 5 intervals (no stall: the time was spent running): one hb, then the
    # schedule restarts from now rather than firing five in a row.
    assert len(hbs(timers.on_timer(550, 550))) == 1
    assert hbs(timers.on_timer(560, 560)) == []
    assert len(hbs(timers.on_timer(650, 650))) == 1


def test_next_deadline_is_the_earliest_deadline_plus_one_but_never_beyond_the_probe():
    service, timers = make(interval_ms=10_000, now=0)
    timers.on_timer(0, 0)  # hb sent; the next is due at 10 000
    assert timers.next_deadline() == 10_000  # nothing can expire: no probe, sleep until the hb
    timers.woke(50)
    register(service, now=50, timeout_ms=1000)
    assert timers.next_deadline() == 150  # now + probe: the deadline (1 050 + 1) is later
    timers.woke(1000)
    assert timers.next_deadline() == 1051  # a broker expires once now > deadline
    assert removed(timers.on_timer(1050, 1050)) == []
    timers.woke(1051)
    assert [e.reason for e in removed(timers.on_timer(1051, 1051))] == ["expired"]


def test_a_wake_up_later_than_planned_by_more_than_the_threshold_is_a_stall():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    timers.on_timer(0, 0)  # the first hb
    planned = timers.next_deadline()
    assert planned == STALL_PROBE_MS  # a broker could expire: never planned further ahead
    # The process did not run for 5 s (SIGSTOP): every deadline moves by the lateness.
    stall = timers.woke(planned + 5_000)
    assert stall == 5_000 and timers.stalls == 1
    assert removed(timers.on_timer(planned + 5_000, 0)) == []  # not evicted for the stall
    live = service.table.live_brokers(planned + 5_000)
    assert live[0].last_heartbeat_ms == planned + 5_000  # the report stays real time
    # Silence after the stall still expires it: its deadline 2 000 moved to 7 000.
    assert removed(timers.on_timer(7_000, 0)) == []
    assert [e.reason for e in removed(timers.on_timer(7_001, 0))] == ["expired"]


def test_lateness_up_to_the_threshold_is_no_stall():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=1500)
    planned = timers.next_deadline()
    # max(1 s, 2 x interval) = 1 s: 1 s late is within it, so nothing moves.
    assert timers.woke(planned + 1000) == 0
    assert [e.reason for e in removed(timers.on_timer(1501, 0))] == ["expired"]


def test_the_threshold_is_twice_the_interval_when_that_is_longer():
    _, timers = make(interval_ms=3000, now=0)
    assert timers.stall_threshold_ms == 6000
    planned = timers.next_deadline()
    assert timers.woke(planned + 6000) == 0
    planned = timers.next_deadline()
    assert timers.woke(planned + 6001) == 6001


def test_busy_time_is_never_a_stall():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    timers.next_deadline()
    timers.woke(10)
    # 5 s of serving that was all CPU time: running, not stalled.
    assert timers.ran(wall_ms=5_000, cpu_ms=4_990) == 0
    assert timers.stalls == 0
    # The broker, silent meanwhile, expires at its deadline as usual.
    assert [e.reason for e in removed(timers.on_timer(5_010, 0))] == ["expired"]


def test_wall_time_not_spent_running_while_serving_is_a_stall():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    timers.next_deadline()
    timers.woke(10)
    # Stopped for 3 s in the middle of a batch: 3.01 s of wall time, 10 ms of CPU.
    assert timers.ran(wall_ms=3_010, cpu_ms=10) == 3_000
    assert removed(timers.on_timer(3_020, 0)) == []


def test_a_late_wake_up_while_the_process_ran_is_not_a_stall():
    # The loop thread woke 3 s late because other threads of the process held the GIL: the
    # process spent those 3 s running (2,990 ms of its CPU time), so nothing moves.
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    planned = timers.next_deadline()
    assert timers.woke(planned + 3_000, ran_ms=2_990) == 0
    assert timers.stalls == 0
    assert [e.reason for e in removed(timers.on_timer(planned + 3_000, 0))] == ["expired"]


def test_a_late_wake_up_counts_only_the_time_the_process_did_not_run():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    planned = timers.next_deadline()
    # 3 s late, of which the process ran 500 ms (then it was stopped): a 2.5 s stall.
    assert timers.woke(planned + 3_000, ran_ms=500) == 2_500
    assert removed(timers.on_timer(planned + 3_000, 0)) == []
    planned = timers.next_deadline()
    assert timers.woke(planned + 1_500, ran_ms=500) == 0  # 1 s: not over the threshold
    assert timers.stalls == 1


def test_a_stall_measured_while_serving_is_not_measured_again_at_the_next_wake_up():
    # The loop plans its next poll right after the pass in which the stand-still landed;
    # the stall that pass measured is behind the timers, not a lateness of the next plan.
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=5_000)
    timers.woke(timers.next_deadline())
    timers.on_timer(0, 0)  # the pass's timers ran first: the next hb is at 200
    assert timers.ran(wall_ms=30_010, cpu_ms=10) == 30_000
    planned = timers.next_deadline()
    assert timers.woke(max(planned, 30_010)) == 0
    assert removed(timers.on_timer(30_010, 0)) == []
    # Only the one stall moved the deadline: 5 s of silence after it still expires the broker.
    assert [e.broker_name for e in removed(timers.on_timer(35_011, 0))] == ["b1"]


def test_after_a_stall_the_hb_is_due_at_once_wherever_the_stall_was_measured():
    # Subscribers learn the server is back at the first pass after a stand-still, after its
    # expiry: whether the process stopped in its wait (woke) or while a source ran (ran).
    for stall_in_the_wait in (True, False):
        service, timers = make(interval_ms=1_000, now=0)
        register(service, now=0, timeout_ms=1_000)
        timers.woke(timers.next_deadline())
        assert len(hbs(timers.on_timer(0, 0))) == 1  # the next hb is at 1 000
        if stall_in_the_wait:
            assert timers.woke(3_500) > 0
        else:
            assert timers.ran(wall_ms=3_500, cpu_ms=10) > 0
            assert timers.woke(timers.next_deadline()) == 0
        now = max(timers.next_deadline(), 3_000)
        assert now <= 3_500, stall_in_the_wait
        batches = timers.on_timer(now, 0)
        assert removed(batches) == [] and len(hbs(batches)) == 1, stall_in_the_wait


def test_a_wake_up_is_measured_once():
    _, timers = make(interval_ms=200, now=0)
    planned = timers.next_deadline()
    assert timers.woke(planned + 2_000) == 2_000
    assert timers.woke(planned + 2_001) == 0  # no new plan in between: nothing more to measure


# --- found by mutation testing (tools/mutate.py) ---------------------------------------------

def test_a_deadline_at_the_hb_time_wakes_for_the_hb_first():
    service, timers = make(interval_ms=2000, now=0)
    timers.on_timer(0, 0)  # next hb at 2000
    register(service, now=0, timeout_ms=2000)  # expires once now > 2000: at 2001
    timers.woke(1950)
    assert timers.next_deadline() == 2000


def test_a_deadline_two_before_the_hb_is_planned_at_its_own_wake_up():
    service, timers = make(interval_ms=2000, now=0)
    timers.on_timer(0, 0)  # next hb at 2000
    register(service, now=0, timeout_ms=1998)  # expires once now > 1998: at 1999
    timers.woke(1950)
    assert timers.next_deadline() == 1999


def test_the_hb_schedule_keeps_its_phase_when_an_hb_is_a_little_late():
    _, timers = make(interval_ms=1000, now=0)
    timers.on_timer(0, 0)
    assert len(hbs(timers.on_timer(1500, 1500))) == 1  # late by half an interval
    assert hbs(timers.on_timer(1999, 1999)) == []
    assert len(hbs(timers.on_timer(2000, 2000))) == 1  # the schedule stays on 1000s


def test_an_hb_late_by_exactly_one_interval_is_not_sent_twice():
    _, timers = make(interval_ms=1000, now=0)
    timers.on_timer(0, 0)
    assert len(hbs(timers.on_timer(2000, 2000))) == 1
    assert hbs(timers.on_timer(2000, 2000)) == []
    assert len(hbs(timers.on_timer(3000, 3000))) == 1


def test_a_one_ms_interval_is_kept_and_zero_is_raised_to_one():
    _, timers = make(interval_ms=1, now=0)
    assert [len(hbs(timers.on_timer(t, t))) for t in range(3)] == [1, 1, 1]
    _, timers = make(interval_ms=0, now=0)
    assert timers.interval_ms == 1


def test_stalls_are_counted_and_logged(caplog):
    _, timers = make(interval_ms=200, now=0)
    with caplog.at_level("WARNING", logger="zns"):
        assert timers.woke(timers.next_deadline() + 3_000) == 3_000
        assert timers.woke(timers.next_deadline() + 4_000) == 4_000
    assert timers.stalls == 2
    assert [r.getMessage() for r in caplog.records] == [
        "the server stalled for 3000 ms; moving every deadline by it",
        "the server stalled for 4000 ms; moving every deadline by it",
    ]


def test_a_wake_up_before_any_plan_is_measured_from_the_start():
    _, timers = make(interval_ms=200, now=100)
    assert timers.woke(100 + 5_000) == 5_000


def test_the_loop_expecting_an_earlier_wake_up_measures_lateness_from_it():
    _, timers = make(interval_ms=200, now=0)
    timers.on_timer(0, 0)
    assert timers.next_deadline() == 200
    timers.expect(100)  # another source of the loop wants to run at 100
    assert timers.woke(100 + 3_000) == 3_000
    timers.on_timer(3_100, 0)
    assert timers.next_deadline() == 3_300
    timers.expect(50_000)  # a later wake-up than the timers' own changes nothing
    assert timers.woke(3_300) == 0


def test_a_stall_measured_while_serving_moves_the_clock_and_the_plan_by_it():
    # Started at 10 s: the stall moves the timers' time and plan forward from where they
    # were, not to the stall's length.
    for look in ("plan", "wake"):
        _, timers = make(interval_ms=200, now=10_000)
        planned = timers.next_deadline()
        assert planned >= 10_000
        timers.woke(planned)
        assert timers.ran(wall_ms=30_010, cpu_ms=10) == 30_000
        if look == "plan":  # the hb is due at once: at the time the stall moved to
            assert timers.next_deadline() == planned + 30_000
        else:  # waking at the plan moved by the stall is not late
            assert timers.woke(planned + 30_000) == 0

"""ServerTimers without sockets: the hb schedule, expiry wake-ups and the §8 stall rule."""

from __future__ import annotations

import pytest

from zns.core import schema
from zns.core.service import NameService
from zns.core.timers import STALL_PROBE_MS, ServerTimers
from zns.drivers.kv_file import KvStore

from conftest import register_fields

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


def hbs(work) -> list[schema.HbEvent]:
    return [schema.decode_event(body) for channel, body in work.events
            if channel == schema.HB_CHANNEL]


def removed(work) -> list[schema.BrokerEvent]:
    events = [schema.decode_event(body) for _, body in work.events]
    return [e for e in events if isinstance(e, schema.BrokerEvent) and e.change == "removed"]


def test_hb_is_due_at_start_then_every_interval_and_carries_the_wall_clock():
    _, timers = make(interval_ms=1000, now=0)
    assert timers.next_wake() == 0
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


def test_next_wake_is_the_earliest_deadline_plus_one_but_never_beyond_the_probe():
    service, timers = make(interval_ms=10_000, now=0)
    timers.on_timer(0, 0)  # hb sent; the next is due at 10 000
    assert timers.next_wake() == STALL_PROBE_MS  # never plans further ahead than the probe
    timers.woke(50)
    register(service, now=50, timeout_ms=1000)
    assert timers.next_wake() == 150  # now + probe: the deadline (1 050 + 1) is later
    timers.woke(1000)
    assert timers.next_wake() == 1051  # a broker expires once now > deadline
    assert removed(timers.on_timer(1050, 1050)) == []
    timers.woke(1051)
    assert [e.reason for e in removed(timers.on_timer(1051, 1051))] == ["expired"]


def test_a_wake_up_later_than_planned_by_more_than_the_threshold_is_a_stall():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    timers.on_timer(0, 0)  # the first hb
    planned = timers.next_wake()
    assert planned == STALL_PROBE_MS
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
    planned = timers.next_wake()
    # max(1 s, 2 x interval) = 1 s: 1 s late is within it, so nothing moves.
    assert timers.woke(planned + 1000) == 0
    assert [e.reason for e in removed(timers.on_timer(1501, 0))] == ["expired"]


def test_the_threshold_is_twice_the_interval_when_that_is_longer():
    _, timers = make(interval_ms=3000, now=0)
    assert timers.stall_threshold_ms == 6000
    planned = timers.next_wake()
    assert timers.woke(planned + 6000) == 0
    planned = timers.next_wake()
    assert timers.woke(planned + 6001) == 6001


def test_busy_time_is_never_a_stall():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    timers.next_wake()
    timers.woke(10)
    # 5 s of serving that was all CPU time: running, not stalled.
    assert timers.ran(wall_ms=5_000, cpu_ms=4_990) == 0
    assert timers.stalls == 0
    # The broker, silent meanwhile, expires at its deadline as usual.
    assert [e.reason for e in removed(timers.on_timer(5_010, 0))] == ["expired"]


def test_wall_time_not_spent_running_while_serving_is_a_stall():
    service, timers = make(interval_ms=200, now=0)
    register(service, now=0, timeout_ms=2000)
    timers.next_wake()
    timers.woke(10)
    # Stopped for 3 s in the middle of a batch: 3.01 s of wall time, 10 ms of CPU.
    assert timers.ran(wall_ms=3_010, cpu_ms=10) == 3_000
    assert removed(timers.on_timer(3_020, 0)) == []


def test_a_wake_up_is_measured_once():
    _, timers = make(interval_ms=200, now=0)
    planned = timers.next_wake()
    assert timers.woke(planned + 2_000) == 2_000
    assert timers.woke(planned + 2_001) == 0  # no new plan in between: nothing more to measure

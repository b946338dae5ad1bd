"""zns.core.forwarding: the writes a worker forwarded and not answered yet, without sockets."""

from __future__ import annotations

import pytest

from zns.core.errors import Busy
from zns.core.forwarding import ForwardedWrites, WriteInFlight

pytestmark = pytest.mark.timeout(10)


def test_an_answer_is_ready_once_it_comes_and_taken_once_by_the_resumed_request() -> None:
    writes = ForwardedWrites(max_in_flight=4, timeout_ms=1000)
    writes.sent(1, now=0)
    writes.sent(2, now=5)
    assert writes.in_flight == 2 and not writes.ready
    writes.answered(2, b"two")
    assert writes.ready == {2: b"two"} and writes.in_flight == 1
    assert writes.take(2) == b"two"
    assert not writes.ready
    with pytest.raises(KeyError):
        writes.take(2)  # taken once
    writes.done(2)  # nothing left to drop
    assert writes.in_flight == 1


def test_past_max_in_flight_a_write_is_refused_busy_and_admitted_again_once_one_is_answered() -> None:
    writes = ForwardedWrites(max_in_flight=2, timeout_ms=1000)
    for token in (1, 2):
        writes.admit()
        writes.sent(token, now=0)
    with pytest.raises(Busy):
        writes.admit()
    assert writes.refused == 1
    writes.answered(1, b"")
    writes.admit()  # room again


def test_a_write_whose_bytes_would_pass_what_may_wait_for_the_state_process_is_refused_busy(
) -> None:
    # What the worker holds for a stalled state process is bytes, not writes: the count
    # alone let 256 registrations of 1.1 MB each wait (tests/test_worker_writes.py).
    writes = ForwardedWrites(max_in_flight=100, timeout_ms=1000, max_queued_bytes=1000)
    writes.admit(5000, queued=0)  # alone: admitted whatever its size
    writes.admit(600, queued=400)  # exactly to the bound
    with pytest.raises(Busy, match="400 bytes of writes wait for the state process"):
        writes.admit(601, queued=400)
    assert writes.refused == 1
    # A write that timed out no longer counts against max_in_flight, but its bytes still
    # wait while the state process reads nothing: they still refuse the next one.
    writes.sent(1, now=0)
    writes.on_timer(1000)
    assert writes.in_flight == 0
    with pytest.raises(Busy):
        writes.admit(1, queued=1000)
    assert writes.refused == 2


def test_a_write_not_answered_in_time_gets_none_and_its_late_answer_is_dropped() -> None:
    writes = ForwardedWrites(max_in_flight=8, timeout_ms=1000)
    writes.sent(1, now=0)
    writes.sent(2, now=400)
    assert writes.next_deadline() == 1000
    writes.on_timer(999)
    assert not writes.ready
    writes.on_timer(1000)
    assert writes.ready == {1: None} and writes.timed_out == 1
    assert writes.next_deadline() == 1400
    writes.answered(1, b"late")  # no longer in flight: dropped
    assert writes.ready == {1: None}
    writes.on_timer(5000)
    assert writes.ready == {1: None, 2: None} and writes.next_deadline() is None


def test_deadlines_never_go_back_so_the_first_in_flight_is_the_first_due() -> None:
    writes = ForwardedWrites(max_in_flight=8, timeout_ms=1000)
    writes.sent(1, now=500)
    writes.sent(2, now=100)  # an older `now` (the router reads its clock every few requests)
    writes.on_timer(1000)
    assert writes.ready == {}
    writes.on_timer(1500)
    assert writes.ready == {1: None, 2: None}


def test_an_answer_the_parked_request_did_not_take_is_dropped() -> None:
    writes = ForwardedWrites(max_in_flight=8, timeout_ms=1000)
    writes.sent(1, now=0)
    writes.answered(1, b"one")
    writes.done(1)  # its request will never be finished (its connection closed)
    assert not writes.ready


def test_an_answer_to_a_write_nobody_waits_for_is_dropped() -> None:
    writes = ForwardedWrites()
    writes.answered(7, b"closed connections")  # never `sent`: nobody waits for it
    assert not writes.ready and writes.in_flight == 0


def test_write_in_flight_passes_every_catch_all_for_errors() -> None:
    with pytest.raises(WriteInFlight) as caught:
        try:
            raise WriteInFlight(3, lambda: "answer")
        except Exception:  # a boundary's catch-all (an `internal` reply): not taken
            pytest.fail("WriteInFlight was taken for an error")
    assert caught.value.token == 3


def test_each_boundary_left_finishes_the_resumed_request_innermost_first() -> None:
    parked = WriteInFlight(1, lambda: "outcome")
    parked.then(lambda written: f"reply to {written()}")  # the write's boundary
    parked.then(lambda written: f"frame of {written()}")  # the request's boundary
    assert parked.resume() == "frame of reply to outcome"


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ForwardedWrites(max_in_flight=0)
    with pytest.raises(ValueError):
        ForwardedWrites(timeout_ms=0)


def test_bounds_of_one_are_taken() -> None:
    writes = ForwardedWrites(max_in_flight=1, timeout_ms=1)
    writes.admit()
    writes.sent(1, now=100)
    with pytest.raises(Busy):
        writes.admit()  # one in flight: the bound
    assert writes.next_deadline() == 101
    writes.on_timer(101)
    assert writes.ready == {1: None}
    writes.admit()  # room again


def test_the_counters_start_at_zero_and_count_every_refusal_and_every_timeout() -> None:
    # They are /metrics' zns_worker_writes_refused, _timed_out and _request_pauses.
    writes = ForwardedWrites(max_in_flight=1, timeout_ms=1000)
    assert (writes.refused, writes.timed_out, writes.request_pauses) == (0, 0, 0)
    writes.sent(1, now=0)
    for _ in range(2):
        with pytest.raises(Busy):
            writes.admit()
    writes.sent(2, now=0)
    writes.on_timer(1000)
    assert (writes.refused, writes.timed_out) == (2, 2)


def test_a_refused_write_is_told_how_many_writes_are_at_the_state_process_and_to_retry() -> None:
    writes = ForwardedWrites(max_in_flight=2, timeout_ms=1000)
    writes.sent(1, now=0)
    writes.sent(2, now=0)
    with pytest.raises(Busy) as refused:
        writes.admit()
    assert str(refused.value) == "2 writes are already at the state process on this worker; retry"

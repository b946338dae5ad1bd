"""zns.core.accept_pause without sockets: when the descriptor guard stops new connections,
how often it looks while stopped, and when descriptors are free enough to let them in."""

from __future__ import annotations

import pytest

from zns.core.accept_pause import HEADROOM, RETRY_MS, AcceptPause

pytestmark = pytest.mark.timeout(10)


def test_a_guard_not_stopped_has_no_deadline_and_is_never_due() -> None:
    pause = AcceptPause(100)
    assert pause.limit == 100 and pause.exhausted == 0 and pause.paused_since is None
    assert pause.next_deadline(5) is None
    assert pause.due(10_000) is False
    assert pause.free_again(0, 10_000) is None  # nothing to let in again


def test_the_first_failure_stops_new_connections_a_second_does_not_again() -> None:
    pause = AcceptPause(100)
    assert pause.out_of_descriptors(1000) is True
    assert pause.exhausted == 1 and pause.paused_since == 1000
    assert pause.next_deadline(1000) == 1000 + RETRY_MS == 2000
    assert pause.next_deadline(9000) == 9000  # late: due now
    assert pause.out_of_descriptors(1500) is False  # shed again, no second stop
    assert pause.exhausted == 1 and pause.paused_since == 1000
    assert pause.next_deadline(1500) == 2500  # the next look moves with the last failure


def test_while_stopped_the_guard_looks_once_a_second() -> None:
    pause = AcceptPause(100)
    pause.out_of_descriptors(1000)
    assert pause.due(1000 + RETRY_MS - 1) is False
    assert pause.due(1000 + RETRY_MS) is True
    assert pause.next_deadline(2000) == 3000
    assert pause.due(2500) is False and pause.due(3000) is True


def test_new_connections_come_back_with_headroom_free_and_say_for_how_long() -> None:
    pause = AcceptPause(1000)
    pause.out_of_descriptors(1000)
    assert pause.free_again(1000 - HEADROOM + 1, 2000) is None  # one short
    assert pause.paused_since == 1000
    assert pause.free_again(1000 - HEADROOM, 3000) == 2000  # exactly enough
    assert pause.paused_since is None and pause.next_deadline(3000) is None
    assert HEADROOM == 64 and RETRY_MS == 1000


def test_a_later_failure_stops_them_again_and_counts() -> None:
    pause = AcceptPause(1000)
    pause.out_of_descriptors(1000)
    pause.free_again(0, 2000)
    assert pause.out_of_descriptors(5000) is True
    assert pause.exhausted == 2 and pause.paused_since == 5000

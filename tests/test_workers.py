"""zns.core.workers: the supervision policy alone, with an injected clock and random source."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings, strategies as st

from helpers import examples
from zns.core.workers import CLEAN_EXIT_DELAY_MS, StartWorker, StopWorker, WorkerPool


def pool(desired: int = 2, **kwargs: int) -> WorkerPool:
    return WorkerPool(desired, now=0, rng=random.Random(0), **kwargs)


def start_all(p: WorkerPool, now: int, first_pid: int) -> list[int]:
    pids = []
    for action in p.actions():
        assert isinstance(action, StartWorker)
        pids.append(first_pid + len(pids))
        p.started(action.slot, pids[-1], now)
    return pids


def test_it_starts_n_workers_at_once() -> None:
    p = pool(3)
    assert p.actions() == [StartWorker(0), StartWorker(1), StartWorker(2)]
    assert p.next_deadline() is None


def test_a_worker_that_dies_is_replaced_at_once() -> None:
    p = pool(2)
    start_all(p, 0, 100)
    p.exited(101, 50_000)
    assert p.actions() == [StartWorker(1)] and p.restarts == 1
    p.started(1, 102, 50_000)
    assert sorted(p.alive) == [100, 102]


def test_a_worker_that_keeps_dying_waits_a_growing_backoff() -> None:
    p = pool(1, first_delay_ms=100, max_delay_ms=1000, stable_ms=10_000)
    start_all(p, 0, 1)
    now, pid, delays = 0, 1, []
    for _ in range(8):
        now += 10  # dies 10 ms after its start
        p.exited(pid, now)
        actions = p.actions()
        if actions:  # the first quick death: at once
            delays.append(0)
        else:
            due = p.next_deadline()
            assert due is not None and due > now
            delays.append(due - now)
            p.on_timer(due - 1)
            assert p.actions() == []
            now = due
            p.on_timer(now)
            actions = p.actions()
        assert actions == [StartWorker(0)]
        pid += 1
        p.started(0, pid, now)
    assert delays[0] == 0 and 50 <= delays[1] <= 100
    assert max(delays) <= 1000 and delays[-1] >= 500  # doubled up to the cap (jitter: ×0.5–1)


def test_a_worker_that_lived_long_is_replaced_at_once_again() -> None:
    p = pool(1, first_delay_ms=100, stable_ms=1000)
    start_all(p, 0, 1)
    p.exited(1, 10)
    p.actions()
    p.started(0, 2, 10)
    p.exited(2, 20)  # quick again: backoff
    assert p.actions() == []
    due = p.next_deadline()
    assert due is not None
    p.on_timer(due)
    p.started(0, 3, due)
    p.actions()
    p.exited(3, due + 1000)  # lived stable_ms: at once, and the backoff starts over
    assert p.actions() == [StartWorker(0)]


def test_a_worker_killed_again_and_again_after_serving_a_while_is_replaced_at_once() -> None:
    # Issue 30 item 2: a dead worker's port answers again within 1 s. A peer that aborts
    # each replacement a second and a half after its start must not push the next start
    # into a backoff: only a worker dying within STABLE_MS of its start (crashing as it
    # starts) waits.
    p = pool(1)
    start_all(p, 0, 1)
    now = 0
    for pid in range(1, 21):
        now += 1_500
        p.exited(pid, now)
        assert p.actions() == [StartWorker(0)], f"death {pid}: not restarted at once"
        p.started(0, pid + 1, now)


def test_stop_stops_every_worker_and_starts_none() -> None:
    p = pool(2)
    pids = start_all(p, 0, 10)
    p.stop()
    assert p.actions() == [StopWorker(pids[0]), StopWorker(pids[1])]
    p.exited(pids[0], 5)
    p.on_timer(100_000)
    assert p.actions() == [] and p.next_deadline() is None


def test_a_worker_that_ended_cleanly_is_replaced_only_after_a_second() -> None:
    # systemctl stop: SIGTERM to every process at once; the state process may reap a worker
    # that ended before it handles its own signal. It waits, and its stop starts nobody.
    p = pool(2)
    pids = start_all(p, 0, 10)
    p.exited(pids[0], 50_000, clean=True)
    assert p.actions() == [] and p.next_deadline() == 50_000 + CLEAN_EXIT_DELAY_MS
    p.stop()
    p.on_timer(50_000 + CLEAN_EXIT_DELAY_MS)
    assert p.actions() == [StopWorker(pids[1])] and p.next_deadline() is None
    # Not stopped: the slot is refilled once the delay is over.
    p = pool(2)
    pids = start_all(p, 0, 10)
    p.exited(pids[1], 50_000, clean=True)
    p.on_timer(50_000 + CLEAN_EXIT_DELAY_MS - 1)
    assert p.actions() == []
    p.on_timer(50_000 + CLEAN_EXIT_DELAY_MS)
    assert p.actions() == [StartWorker(1)]


def test_a_failed_start_is_tried_again_later() -> None:
    p = pool(1, first_delay_ms=100)
    p.actions()
    p.start_failed(0, 0)
    due = p.next_deadline()
    assert due is not None and 50 <= due <= 100
    p.on_timer(due)
    assert p.actions() == [StartWorker(0)]


def test_an_unknown_pid_changes_nothing() -> None:
    p = pool(1)
    start_all(p, 0, 1)
    p.exited(999, 5)
    assert p.actions() == [] and p.alive == [1]


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError):
        WorkerPool(0, now=0)


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.integers(0, 3), st.integers(1, 20_000)),
                                   max_size=60))
def test_never_more_than_n_alive_and_every_slot_is_refilled(
        desired: int, deaths: list[tuple[int, int]]) -> None:
    p = pool(desired)
    now, next_pid = 0, 1
    starts: list[StartWorker] = []

    def carry_out() -> None:
        nonlocal next_pid
        for action in p.actions():
            assert isinstance(action, StartWorker)
            p.started(action.slot, next_pid, now)
            next_pid += 1
            assert len(p.alive) <= desired
            starts.append(action)

    carry_out()
    for victim, after in deaths:
        now += after
        p.on_timer(now)
        carry_out()
        alive = p.alive
        if alive:
            p.exited(alive[victim % len(alive)], now)
            carry_out()
    for _ in range(10):  # every delayed start comes due
        due = p.next_deadline()
        if due is None:
            break
        now = max(now, due)
        p.on_timer(now)
        carry_out()
    assert len(p.alive) == desired


def quick_deaths(p: WorkerPool, slot: int, pid: int, now: int, deaths: int) -> list[int]:
    """`deaths` workers in `slot` each dying 10 ms after its start, from `pid` at `now`:
    how long each replacement waited (0: started at once)."""
    waits = []
    p.started(slot, pid, now)
    for _ in range(deaths):
        now += 10
        p.exited(pid, now)
        due = now if p.actions() else p.next_deadline()
        assert due is not None
        if due > now:
            p.on_timer(due)
            assert p.actions() == [StartWorker(slot)]
        waits.append(due - now)
        now, pid = due, pid + 1
        p.started(slot, pid, now)
    return waits


def test_quick_deaths_are_timed_from_the_worker_s_own_start() -> None:
    p = pool(1, stable_ms=1000)
    p.actions()
    # Started long after the pool: each lives 10 ms, the second and third wait a backoff.
    waits = quick_deaths(p, 0, 1, 50_000, 3)
    assert waits[0] == 0 and all(w > 0 for w in waits[1:])


def test_the_first_quick_death_after_a_worker_that_lived_long_is_replaced_at_once() -> None:
    p = pool(1, stable_ms=1000)
    p.actions()
    quick_deaths(p, 0, 1, 0, 2)  # 1 and 2 die quickly; 3 is started
    p.exited(3, 60_000)  # lived long: at once, and its slot counts no quick death
    assert p.actions() == [StartWorker(0)]
    assert quick_deaths(p, 0, 4, 60_000, 1) == [0]


def test_a_quick_death_after_a_failed_start_waits_a_backoff() -> None:
    p = pool(1, stable_ms=1000)
    p.actions()
    p.start_failed(0, 0)
    due = p.next_deadline()
    assert due is not None
    p.on_timer(due)
    assert p.actions() == [StartWorker(0)]
    waits = quick_deaths(p, 0, 1, due, 2)  # the failed start counts as the first quick death
    assert all(w > 0 for w in waits)


def test_every_restart_is_counted() -> None:
    # /metrics' zns_worker_restarts (the state process's figures).
    p = pool(2)
    start_all(p, 0, 10)
    p.exited(10, 5_000)
    p.exited(11, 5_000)
    assert p.restarts == 2


def test_the_backoff_s_jitter_comes_from_the_random_source_given() -> None:
    p = WorkerPool(1, now=0, stable_ms=1000, first_delay_ms=1000, max_delay_ms=100_000,
                   rng=random.Random(7))
    p.actions()
    waits = quick_deaths(p, 0, 1, 0, 5)
    source = random.Random(7)
    assert waits == [0] + [int(1000 * 2 ** n * source.uniform(0.5, 1.0)) for n in range(4)]


def test_a_worker_started_after_stop_is_stopped_and_a_failed_start_after_stop_is_not_retried() -> None:
    p = pool(2)
    assert p.actions() == [StartWorker(0), StartWorker(1)]
    p.stop()  # while the driver starts them
    p.started(0, 10, 0)
    assert p.actions() == [StopWorker(10)]
    p.start_failed(1, 0)
    assert p.next_deadline() is None and p.actions() == []


def test_each_exit_and_failed_start_is_logged_with_the_worker_s_number_and_the_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    p = pool(2, first_delay_ms=100, stable_ms=1000)
    start_all(p, 1_000, 10)
    with caplog.at_level(logging.WARNING, logger="zns"):
        p.exited(11, 61_000)
        p.actions()
        p.start_failed(1, 61_000)
        due = p.next_deadline()
        assert due is not None
    messages = [r.getMessage() for r in caplog.records if r.name == "zns"]
    assert messages == [
        "worker 2 (pid 11) exited after 60000 ms; the next starts in 0 ms",
        f"worker 2 could not start; trying again in {due - 61_000} ms",
    ]
    assert due > 61_000

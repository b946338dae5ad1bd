"""The server loop (zns.drivers.loop): uniform sources, one timer, busy time measured per source."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from zns.core import schema
from zns.drivers.loop import SLICE_MS, Loop, Outbox, PollSet

from helpers import ThreadedServer, records_here, register_fields, wait_for

pytestmark = pytest.mark.timeout(60)



class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class FakePoller:
    """Returns nothing ready; a poll "sleeps" by moving the fake clock by its timeout."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.timeouts: list[float | None] = []
        self.ready: list[list[tuple[Any, int]]] = []

    def register(self, sock: Any, flags: int) -> None:
        pass

    def unregister(self, sock: Any) -> None:
        pass

    def poll(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        self.timeouts.append(timeout)
        if self.ready:
            return self.ready.pop(0)
        assert timeout is not None, "the loop would sleep for ever"
        self.clock.now += int(timeout)
        return []


class Stall:
    stall_threshold_ms = 0  # every span is measured

    def __init__(self) -> None:
        self.expected: list[int] = []
        self.spans: list[tuple[int, int]] = []  # (wall, cpu) of every source's run
        self.waits: list[int] = []  # the CPU time handed to every `woke`

    def expect(self, wake: int) -> None:
        self.expected.append(wake)

    def woke(self, now: int, ran_ms: int = 0) -> int:
        self.waits.append(ran_ms)
        return 0

    def ran(self, wall_ms: int, cpu_ms: int) -> int:
        self.spans.append((wall_ms, cpu_ms))
        return 0


class Every:
    """A source due every `period_ms` (a timer), doing `work_ms` of fake work each run."""

    what = "a timer"

    def __init__(self, clock: FakeClock, period_ms: int, work_ms: int = 0) -> None:
        self.clock, self.period, self.work = clock, period_ms, work_ms
        self.due = period_ms
        self.runs: list[tuple[int, int]] = []

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        return self.due

    def run(self, ready: Any, now: int, until: int) -> None:
        self.runs.append((now, until))
        self.clock.now += self.work
        if now >= self.due:
            self.due += self.period


def make_loop(*sources: Any, clock: FakeClock) -> tuple[Loop, FakePoller, Stall]:
    poller, stall = FakePoller(clock), Stall()
    loop = Loop(list(sources), clock=clock, stall=stall, poll=PollSet(poller),  # type: ignore[arg-type]
                cpu_clock=lambda: 0)
    return loop, poller, stall


def run_for(loop: Loop, clock: FakeClock, until_ms: int) -> None:
    loop.run(lambda: clock.now >= until_ms)


def test_with_nothing_to_do_the_loop_sleeps_exactly_until_the_earliest_deadline():
    clock = FakeClock()
    hb, rare = Every(clock, 1000), Every(clock, 2500)
    loop, poller, _ = make_loop(hb, rare, Outbox(lambda frames: None), clock=clock)
    run_for(loop, clock, 10_000)
    # One wake-up per deadline (1000, 2000, 2500, 3000, ...), each poll exactly as long as
    # the gap to the next deadline: no fixed-interval wake-ups in between.
    assert poller.timeouts[:5] == [1000, 1000, 500, 500, 1000]
    assert loop.wakeups == 10 + 2  # hb at 1..10 s; the other at 2.5 and 7.5 s (5 and 10: shared)
    assert [now for now, _ in hb.runs] == [1000 * i for i in range(1, 11)]


def test_a_source_with_no_deadline_and_nothing_ready_is_not_run():
    clock = FakeClock()
    hb = Every(clock, 1000)
    idle = Every(clock, 1)
    idle.next_deadline = lambda now: None  # type: ignore[method-assign]
    loop, _, _ = make_loop(hb, idle, clock=clock)
    run_for(loop, clock, 3000)
    assert idle.runs == []


def test_every_source_gets_a_slice_and_its_busy_time_measured_and_now_refreshed():
    clock = FakeClock()
    busy, timer = Every(clock, 100, work_ms=40), Every(clock, 100, work_ms=3)
    loop, _, stall = make_loop(busy, timer, clock=clock)
    run_for(loop, clock, 100)
    (busy_now, busy_until), (timer_now, timer_until) = busy.runs[0], timer.runs[0]
    assert busy_until - busy_now == SLICE_MS and timer_until - timer_now == SLICE_MS
    # The second source sees the clock after the first one's work, not the wake-up time.
    assert timer_now == busy_now + 40
    assert stall.spans == [(40, 0), (3, 0)]


def test_a_failing_source_is_logged_and_the_others_still_run(caplog):
    clock = FakeClock()
    broken, hb = Every(clock, 100), Every(clock, 100)

    def fail(ready: Any, now: int, until: int) -> None:
        broken.due += 100
        raise RuntimeError("injected")

    broken.run = fail  # type: ignore[method-assign]
    broken.what = "breaking"
    loop, _, _ = make_loop(broken, hb, clock=clock)
    run_for(loop, clock, 300)
    assert len(hb.runs) == 3
    assert "bug while breaking; the server carries on" in caplog.text


def test_the_outbox_sends_every_sources_events_once_per_pass_in_order():
    sent, counted = [], []
    outbox = Outbox(sent.append, counted.append)
    outbox.put([(b"a", b"1"), (b"a", b"2")])
    outbox.put([])
    assert outbox.next_deadline(5) == 5  # something to send: due now
    outbox.put([(b"b", b"3")])
    outbox.run({}, 5, 10)
    assert sent == [(b"a", b"1"), (b"a", b"2"), (b"b", b"3")] and counted == [2, 1]
    assert outbox.next_deadline(6) is None


@pytest.mark.single_process("counts the loop's wakeups")
def test_an_idle_server_wakes_for_its_deadlines_only(make_server):
    # The loop used to wake every 100 ms whatever it had to do (the remoting idle scan, the
    # descriptor guard and the heap trim ran only because of it). With a 1 s hb interval
    # and nothing registered, it wakes for the hb and little else.
    srv = make_server(heartbeat_interval_s=1.0, remoting="127.0.0.1:0")
    loop = srv.server.loop
    wait_for(lambda: loop.wakeups >= 1)
    before, started = loop.wakeups, time.monotonic()
    time.sleep(3.0)
    woke = loop.wakeups - before
    elapsed = time.monotonic() - started
    assert woke <= elapsed + 3, f"{woke} wake-ups in {elapsed:.1f} s"


def test_a_timer_due_during_a_pass_runs_before_the_next_source_not_after_the_pass():
    # Two sources that overrun their slice (one unit of work of 40 ms each: a large reply)
    # and a timer due at 30 ms. The timer runs as soon as the first one is done -- its
    # lateness is one source's run, not the whole pass -- and its events leave at once.
    clock = FakeClock()
    timer = Every(clock, 30)
    first, second = Every(clock, 10, work_ms=40), Every(clock, 10, work_ms=40)
    sent: list[Any] = []
    outbox = Outbox(sent.append)
    emit = timer.run

    def run_and_publish(ready: Any, now: int, until: int) -> None:
        emit(ready, now, until)
        outbox.put([(b"expired", now)])

    timer.run = run_and_publish  # type: ignore[method-assign]
    published_at: list[int] = []
    second_run = second.run

    def second_sees(ready: Any, now: int, until: int) -> None:
        published_at.append(len(sent))
        second_run(ready, now, until)

    second.run = second_sees  # type: ignore[method-assign]
    poller, stall = FakePoller(clock), Stall()
    loop = Loop([timer, first, second, outbox], clock=clock, stall=stall,
                poll=PollSet(poller), cpu_clock=lambda: 0,  # type: ignore[arg-type]
                urgent=[timer, outbox])
    clock.now = 10
    loop.run_pass({}, 10)  # first and second due at 10; the timer at 30
    assert timer.runs[0] == (50, 50 + SLICE_MS)  # right after `first`, not at 90; a slice
    assert published_at == [1]  # its event left before `second` ran


class Burst:
    """A source that hands back early after each unit of work (a request that made events),
    `units` times, each unit `work_ms` long and putting one event into `outbox`."""

    what = "a burst"

    def __init__(self, clock: FakeClock, outbox: Outbox, units: int, work_ms: int = 0) -> None:
        self.clock, self.outbox, self.units, self.work = clock, outbox, units, work_ms
        self.runs: list[tuple[int, int]] = []

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        return 0 if self.units else None

    def run(self, ready: Any, now: int, until: int) -> bool:
        self.runs.append((now, until))
        self.clock.now += self.work
        self.units -= 1
        self.outbox.put([(b"event", len(self.runs))])
        return self.units > 0


def test_a_source_that_hands_back_early_runs_again_in_its_slice_after_its_events_left():
    clock = FakeClock()
    sent: list[Any] = []
    outbox = Outbox(sent.append)
    burst, after = Burst(clock, outbox, units=3), Every(clock, 1)
    seen: list[int] = []
    burst_run = burst.run

    def run_and_see(ready: Any, now: int, until: int) -> bool:
        seen.append(len(sent))
        return burst_run(ready, now, until)

    burst.run = run_and_see  # type: ignore[method-assign]
    loop = Loop([burst, after, outbox], clock=clock, stall=Stall(), poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=lambda: 0, urgent=[outbox])
    clock.now = 1
    loop.run_pass({}, 1)
    # Three runs in the one pass, each after the previous one's event was sent, all within
    # the one slice; then the next source.
    assert seen == [0, 1, 2] and len(sent) == 3
    assert burst.runs == [(1, 1 + SLICE_MS)] * 3
    assert after.runs == [(1, 1 + SLICE_MS)]


def test_handing_back_early_does_not_stretch_the_slice():
    clock = FakeClock()
    outbox = Outbox(lambda frames: None)
    burst = Burst(clock, outbox, units=100, work_ms=1)
    loop = Loop([burst, outbox], clock=clock, stall=Stall(), poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=lambda: 0, urgent=[outbox])
    loop.run_pass({}, 0)
    assert [now for now, _ in burst.runs] == list(range(SLICE_MS))  # none at the slice's end
    assert {until for _, until in burst.runs} == {SLICE_MS}


def test_the_cpu_clock_is_read_only_for_a_span_that_could_hold_a_stall():
    # The CPU clock is a system call: read once a pass (before the poll), after the poll and
    # after a source only once the span since the last measurement is longer than a stall.
    # The span then measured starts at the pass (the sources before count), not at the source.
    clock = FakeClock()
    cpu_reads: list[int] = []
    cpu = iter(range(0, 10_000, 7))

    def cpu_clock() -> int:
        cpu_reads.append(clock.now)
        return next(cpu)

    short, long = Every(clock, 100, work_ms=40), Every(clock, 100, work_ms=80)
    stall = Stall()
    stall.stall_threshold_ms = 40
    loop = Loop([short, long], clock=clock, stall=stall, poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=cpu_clock)
    made = len(cpu_reads)
    run_for(loop, clock, 100)
    # One read before the poll (at 0) and one after it (a 100 ms wait); `short` (40 ms, the
    # threshold) alone cannot hold a stall; after `long` the span from the pass's start (100)
    # is 120 ms: measured, against the CPU since the poll.
    assert cpu_reads[made:] == [0, 100, 220]
    assert stall.spans == [(120, 7)]


def test_a_wait_longer_than_a_stall_hands_the_process_s_cpu_time_during_it_to_the_rule():
    # The process ran (another thread did) for 900 of the 1,000 ms the loop waited: the
    # rule is told, so it does not take the loop thread's late wake-up for a stop. A wait
    # no longer than a stall could be costs no second reading of the CPU clock.
    clock = FakeClock()
    cpu_reads: list[int] = []

    def cpu_clock() -> int:
        cpu_reads.append(clock.now)
        return 9 * clock.now // 10

    stall = Stall()
    stall.stall_threshold_ms = 500
    short, long = Every(clock, 400), Every(clock, 1000)
    loop = Loop([short], clock=clock, stall=stall, poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=cpu_clock)
    made = len(cpu_reads)
    run_for(loop, clock, 400)
    assert stall.waits == [0] and cpu_reads[made:] == [0]
    loop = Loop([long], clock=clock, stall=stall, poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=cpu_clock)
    made = len(cpu_reads)
    run_for(loop, clock, 1000)
    assert stall.waits == [0, 540] and cpu_reads[made:] == [400, 1000]


# --- pinned by mutation testing (docs/mutation-scores.md) ------------------------------------


class RecordingPoller(FakePoller):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.registered: list[Any] = []
        self.unregistered: list[Any] = []

    def register(self, sock: Any, flags: int) -> None:
        self.registered.append(sock)

    def unregister(self, sock: Any) -> None:
        self.unregistered.append(sock)


class Woken:
    """A source with no deadline: it runs only when its socket is ready."""

    what = "a socket"

    def __init__(self) -> None:
        self.runs: list[Any] = []
        self.asked: list[Any] = []

    def attach(self, poll: PollSet) -> None:
        poll.register("sock", 1, self)

    def next_deadline(self, now: int) -> int | None:
        self.asked.append(now)
        return None

    def run(self, ready: Any, now: int, until: int) -> None:
        self.runs.append(dict(ready))


def test_a_ready_socket_runs_its_owner_and_unregistering_forgets_it():
    clock = FakeClock()
    poller = RecordingPoller(clock)
    source = Woken()
    poll = PollSet(poller)  # type: ignore[arg-type]
    loop = Loop([source], clock=clock, stall=Stall(), poll=poll, cpu_clock=lambda: 0)
    assert poll.owners == {"sock": source} and poller.registered == ["sock"]
    poller.ready = [[("sock", 1)]]
    passes = []
    loop.run(lambda: bool(passes.append(1)) or len(passes) > 1)
    assert source.runs == [{"sock": 1}]
    assert poller.timeouts == [None]  # nothing due: the poll waits for the socket only
    poll.unregister("other")  # never registered: the poller is not asked
    assert poller.unregistered == []
    poll.unregister("sock")
    assert poller.unregistered == ["sock"] and poll.owners == {}
    poll.unregister("sock")  # twice: once only
    assert poller.unregistered == ["sock"]


def test_the_loop_passes_now_to_deadlines_and_the_stall_rule():
    clock = FakeClock()
    clock.now = 40
    hb = Every(clock, 1000)
    woken = Woken()
    stall = Stall()
    woke: list[int] = []
    stall.woke = lambda now, ran_ms=0: woke.append(now) or 0  # type: ignore[method-assign]
    loop = Loop([hb, woken], clock=clock, stall=stall, poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=lambda: 0)
    assert loop.last_pass_ms == 40  # a loop not yet run counts from its making (/healthz)
    assert Loop([woken], clock=clock, stall=stall).next_deadline(5) is None
    run_for(loop, clock, 3000)
    assert stall.expected[:3] == [1000, 2000, 3000]
    assert woke[:3] == [1000, 2000, 3000]
    assert all(isinstance(now, int) for now in woken.asked) and 40 in woken.asked


def test_a_deadline_already_due_polls_without_waiting():
    clock = FakeClock()
    clock.now = 500
    late = Every(clock, 100)  # due at 100, long past
    loop, poller, _ = make_loop(late, clock=clock)
    run_for(loop, clock, 600)
    assert poller.timeouts[0] == 0


def test_cpu_time_is_the_whole_process_s_in_ms(monkeypatch):
    from zns.drivers import loop as loop_module

    monkeypatch.setattr(time, "thread_time", lambda: 1.0)  # the loop thread's alone: not it
    monkeypatch.setattr(time, "process_time", lambda: 2.5)
    assert loop_module._cpu_ms() == 2500
    clock = FakeClock()
    assert Loop([], clock=clock, stall=Stall()).cpu_clock is loop_module._cpu_ms


def test_the_bug_line_names_the_source_and_nothing_else(caplog):
    clock = FakeClock()
    broken = Every(clock, 100)

    def fail(ready: Any, now: int, until: int) -> None:
        raise RuntimeError("injected")

    broken.run = fail  # type: ignore[method-assign]
    broken.what = "breaking"
    loop, _, _ = make_loop(broken, clock=clock)
    loop.run_pass({}, 100)
    (record,) = records_here(caplog)
    assert record.getMessage() == "bug while breaking; the server carries on"
    assert record.exc_info is not None


def test_a_sources_cpu_time_is_what_it_spent_not_the_clock_reading():
    clock = FakeClock()
    # Read when the loop is made, then before and after each poll (every wait is longer than
    # the threshold, 0) and after each (measured) run.
    cpu = iter([1000, 1020, 1025, 1030, 2000, 2001, 2006])
    hb = Every(clock, 100, work_ms=7)
    stall = Stall()
    loop = Loop([hb], clock=clock, stall=stall, poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=lambda: next(cpu))
    run_for(loop, clock, 200)
    assert stall.spans == [(7, 5), (7, 5)]
    assert stall.waits == [5, 1]


def test_a_source_neither_ready_nor_due_does_not_stop_the_ones_after_it():
    clock = FakeClock()
    idle, later, hb = Woken(), Every(clock, 5000), Every(clock, 100)
    loop = Loop([idle, later, hb], clock=clock, stall=Stall(), poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=lambda: 0)
    clock.now = 100
    assert loop.run_pass({}, 100) == 100
    assert idle.runs == [] and later.runs == [] and hb.runs == [(100, 100 + SLICE_MS)]
    assert loop.last_pass_ms == 100
    clock.now = 250
    assert loop.run_pass({}, 250) == 250
    assert loop.last_pass_ms == 250  # each pass records when it ended (/healthz)


class Urgent(Every):
    """A due-at-a-time source that records what it was handed as ready."""

    def __init__(self, clock: FakeClock, period_ms: int) -> None:
        super().__init__(clock, period_ms)
        self.handed: list[Any] = []

    def run(self, ready: Any, now: int, until: int) -> None:
        self.handed.append(ready)
        super().run(ready, now, until)


def test_an_urgent_source_run_between_others_is_handed_nothing_ready():
    clock = FakeClock()
    woken, timer = Woken(), Urgent(clock, 30)
    poller = FakePoller(clock)
    loop = Loop([woken, timer], clock=clock, stall=Stall(), poll=PollSet(poller),  # type: ignore[arg-type]
                cpu_clock=lambda: 0, urgent=[timer])
    clock.now = 30
    loop.run_pass({"sock": 1}, 30)
    assert woken.runs == [{"sock": 1}]
    # run right after `woken` as urgent (an empty ready map), then not again in its own place
    assert timer.handed == [{}]
    assert len(timer.runs) == 1


def test_an_urgent_source_run_in_its_own_place_does_not_end_the_pass():
    clock = FakeClock()
    timer, hb = Urgent(clock, 30), Every(clock, 30)
    loop = Loop([timer, hb], clock=clock, stall=Stall(), poll=PollSet(FakePoller(clock)),  # type: ignore[arg-type]
                cpu_clock=lambda: 0, urgent=[timer])
    clock.now = 30
    loop.run_pass({}, 30)
    assert timer.handed == [{}] and hb.runs == [(30, 30 + SLICE_MS)]


# --- the stall rule on the real loop ------------------------------------------------------


def runqueue_wait_s(thread: threading.Thread) -> float:
    """How long `thread` has waited, runnable, for a CPU (Linux's schedstat): time the machine
    kept it from running (waiting for the GIL is sleeping, not this)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as schedstat:
        return int(schedstat.read().split()[1]) / 1e9


def gil_hold_size(at_least_s: float) -> int:
    """An n for which math.factorial(n) holds the GIL (one C call) at least `at_least_s`."""
    n = 50_000
    while True:
        started = time.monotonic()
        math.factorial(n)
        if time.monotonic() - started >= at_least_s:
            return n
        n = n * 3 // 2


@pytest.mark.timeout(180)
@pytest.mark.single_process("a thread of the server's own process holds the GIL")
def test_another_thread_of_the_process_holding_the_gil_is_not_a_stall(tmp_path, caplog):
    # 3,000 metrics requests completing at once kept the loop thread from the GIL for 2-3 s:
    # its own CPU time stood still, that was read as the process stopped, every deadline
    # moved, and a silent 3 s broker expired at 5.97 s. A thread of the process holding the
    # GIL is the process running: the broker expires on time, and no stall is logged.
    hold = gil_hold_size(1.2)  # > the 1 s stall threshold (hb every 0.2 s), < the timeout
    srv = ThreadedServer(tmp_path, heartbeat_interval_s=0.2)
    peer = srv.peer()
    try:
        peer.subscribe(b"broker/", schema.HB_CHANNEL)
        peer.wait_subscribed()
        for attempt in range(3):
            caplog.clear()
            go = threading.Event()
            held: list[tuple[float, float]] = []  # (when the hold ended, its CPU share)

            def hold_the_gil() -> None:
                go.wait()
                wall, cpu = time.monotonic(), time.thread_time()
                math.factorial(hold)
                ended = time.monotonic()
                held.append((ended, (time.thread_time() - cpu) / (ended - wall)))

            holder = threading.Thread(target=hold_the_gil, daemon=True)
            holder.start()
            name = f"broker-{attempt}"
            peer.ok("register_broker", **register_fields(broker_name=name,
                                                         heartbeat_timeout_ms=4000))
            registered_at = time.monotonic()
            queued_before = runqueue_wait_s(srv.thread)
            go.set()
            _, event = peer.next_event(lambda ch, ev: isinstance(ev, schema.BrokerEvent)
                                       and ev.change == "removed" and ev.broker_name == name,
                                       timeout=30)
            expired_at = time.monotonic()
            holder.join(30)
            (ended, share), = held
            if share < 0.8 or runqueue_wait_s(srv.thread) - queued_before > 0.3:
                continue  # other processes kept this one from running: a real stall, retry
            stalls = [r.getMessage() for r in caplog.records
                      if r.thread == srv.thread.ident and "stalled" in r.getMessage()]
            assert event.reason == "expired"
            # At the deadline, or (if the hold outlasted it) as soon as the loop could run.
            due = max(registered_at + 4.0, ended)
            assert expired_at - due < 0.5, (
                f"expired {expired_at - registered_at:.2f} s after its hb, the hold ended at "
                f"{ended - registered_at:.2f} s; {stalls}")
            assert not stalls
            return
        pytest.skip("the machine was too loaded for the process to run through a hold 3 times")
    finally:
        srv.stop()

"""zns.core.pairing: when `--cpus auto` pairs the state process with worker 1 on one CPU, and
when it lets them go. No process, no clock: counters and `now` are given."""

from __future__ import annotations

import pytest

from zns.core.pairing import (
    HELD_MS, MAX_QUIET_SAMPLES, QUIET_SAMPLES, Pair, Pairing, Release, Sample,
)

pytestmark = pytest.mark.timeout(30)

SAMPLE_INTERVAL_MS = 1000  # as the state process samples
SECOND_NS = SAMPLE_INTERVAL_MS * 1_000_000


class Counters:
    """Cumulative counters advanced one sample at a time, by the share of a CPU given: the
    pair's work split over its threads (the state process's and worker 1's)."""

    def __init__(self, worker_pid: int = 100, cpus: int = 2) -> None:
        self.pid = worker_pid
        self.threads = {1: (0, 0), 100: (0, 0), 101: (0, 0)}
        self.idle = {cpu: 0 for cpu in range(cpus)}

    def next(self, run: float, wait: float = 0.0,
             idle: dict[int, float] | None = None) -> Sample:
        """`idle`: each CPU's idle share (default: all idle but for the pair's run)."""
        share = len(self.threads)
        self.threads = {
            thread: (ran + round(run * SECOND_NS / share), waited + round(wait * SECOND_NS / share))
            for thread, (ran, waited) in self.threads.items()}
        for cpu in self.idle:
            self.idle[cpu] += round((idle or {}).get(cpu, 1.0 - run) * SECOND_NS)
        return Sample(self.pid, dict(self.threads), dict(self.idle))


def feed(pairing: Pairing, counters: Counters, now: int, samples: int, run: float,
         wait: float = 0.0, idle: dict[int, float] | None = None) -> tuple[int, list[object]]:
    """`samples` samples a second apart from `now`: the time after them and what each said."""
    said = []
    for _ in range(samples):
        now += SAMPLE_INTERVAL_MS
        said.append(pairing.on_sample(counters.next(run, wait, idle), now))
    return now, said


def paired(now: int = 0) -> tuple[Pairing, Counters, int]:
    pairing, counters = Pairing(cpus=2), Counters()
    assert pairing.on_sample(counters.next(0), now) is None  # the first: a baseline
    now, said = feed(pairing, counters, now, QUIET_SAMPLES, run=0.01)
    assert said[:-1] == [None] * (QUIET_SAMPLES - 1) and isinstance(said[-1], Pair)
    return pairing, counters, now


def test_a_light_pair_is_paired_after_the_quiet_samples_on_the_idlest_cpu() -> None:
    pairing, counters = Pairing(cpus=2), Counters()
    pairing.on_sample(counters.next(0), 0)
    _, said = feed(pairing, counters, 0, QUIET_SAMPLES, run=0.05, wait=0.01,
                   idle={0: 0.2, 1: 0.9})  # CPU 0 busy with something else
    assert said == [None] * (QUIET_SAMPLES - 1) + [
        Pair(1, "5% of a CPU run, 1% waited, CPU 1 90% idle")]
    assert pairing.cpu == 1


def test_a_tie_goes_to_the_lowest_numbered_cpu() -> None:
    pairing, counters = Pairing(cpus=4), Counters(cpus=4)
    pairing.on_sample(counters.next(0), 0)
    _, said = feed(pairing, counters, 0, QUIET_SAMPLES, run=0.0,
                   idle={0: 0.5, 1: 0.9, 2: 0.9, 3: 0.2})
    assert said[-1] == Pair(1, "0% of a CPU run, 0% waited, CPU 1 90% idle")


@pytest.mark.parametrize("run, wait", [(0.61, 0.0), (0.1, 0.31)])
def test_a_pair_whose_work_no_longer_fits_is_released(run: float, wait: float) -> None:
    pairing, counters, now = paired()
    now, said = feed(pairing, counters, now, 5, run=0.5, wait=0.25)  # heavier, still fits
    assert said == [None] * 5 and pairing.cpu is not None
    _, said = feed(pairing, counters, now, 1, run=run, wait=wait)
    assert said == [Release(f"{run:.0%} of a CPU run, {wait:.0%} waited")]
    assert pairing.cpu is None and pairing.releases == 1


def test_a_busy_machine_is_not_paired_and_other_work_on_the_pairs_cpu_releases_it() -> None:
    """Pairing gains only where a CPU is idle (a woken process lands on a halted one); on a
    busy machine it could only make the two wait behind other work."""
    pairing, counters = Pairing(cpus=2), Counters()
    pairing.on_sample(counters.next(0), 0)
    now, said = feed(pairing, counters, 0, 10, run=0.01, idle={0: 0.3, 1: 0.45})
    assert said == [None] * 10 and pairing.cpu is None
    now, said = feed(pairing, counters, now, QUIET_SAMPLES, run=0.01, idle={0: 0.3, 1: 0.6})
    assert isinstance(said[-1], Pair) and pairing.cpu == 1
    # Other work takes the pair's CPU: 0.45 of it beside the pair's 0.05 still fits ...
    now, said = feed(pairing, counters, now, 1, run=0.05, idle={0: 0.0, 1: 0.5})
    assert said == [None]
    # ... 0.6 of it does not, however little the pair runs or waits.
    _, said = feed(pairing, counters, now, 1, run=0.05, idle={0: 0.0, 1: 0.35})
    assert said == [Release("5% of a CPU run, 0% waited, 60% other work")]


def test_a_load_between_light_and_released_neither_pairs_nor_keeps_counting() -> None:
    pairing, counters = Pairing(cpus=2), Counters()
    pairing.on_sample(counters.next(0), 0)
    now, said = feed(pairing, counters, 0, QUIET_SAMPLES - 1, run=0.0)
    now, said = feed(pairing, counters, now, 1, run=0.35)  # not light: the count starts again
    now, said = feed(pairing, counters, now, QUIET_SAMPLES - 1, run=0.0)
    assert said == [None] * (QUIET_SAMPLES - 1)
    _, said = feed(pairing, counters, now, 1, run=0.0)
    assert isinstance(said[0], Pair)


def test_each_release_doubles_the_quiet_time_up_to_its_cap_and_a_long_pairing_resets_it(
) -> None:
    pairing, counters, now = paired()
    quiet = QUIET_SAMPLES
    for _ in range(12):  # a load that comes and goes
        now, said = feed(pairing, counters, now, 1, run=0.9)
        assert isinstance(said[0], Release)
        quiet = min(quiet * 2, MAX_QUIET_SAMPLES)
        now, said = feed(pairing, counters, now, quiet, run=0.0)
        assert said[:-1] == [None] * (quiet - 1) and isinstance(said[-1], Pair), quiet
    assert quiet == MAX_QUIET_SAMPLES
    now, _ = feed(pairing, counters, now, HELD_MS // SAMPLE_INTERVAL_MS, run=0.0)  # held
    now, said = feed(pairing, counters, now, 1, run=0.9)
    assert isinstance(said[0], Release)
    _, said = feed(pairing, counters, now, 2 * QUIET_SAMPLES, run=0.0)
    assert isinstance(said[2 * QUIET_SAMPLES - 1], Pair)  # doubled once from the start again


def test_a_new_worker_1_is_a_baseline_and_starts_the_count_again() -> None:
    pairing, counters = Pairing(cpus=2), Counters()
    pairing.on_sample(counters.next(0), 0)
    now, said = feed(pairing, counters, 0, QUIET_SAMPLES - 1, run=0.0)
    counters.pid = 200  # worker 1 replaced: new threads, counts from its start
    counters.threads = {1: counters.threads[1], 200: (5 * SECOND_NS, 0)}
    now, said = feed(pairing, counters, now, 1, run=0.0)
    assert said == [None]  # a baseline, however much it ran before
    now, said = feed(pairing, counters, now, QUIET_SAMPLES - 1, run=0.0)
    assert said == [None] * (QUIET_SAMPLES - 1)  # the count started again
    assert isinstance(feed(pairing, counters, now, 1, run=0.0)[1][0], Pair)


def test_a_new_worker_1_keeps_a_pair_it_was_forked_into() -> None:
    pairing, counters, now = paired()
    counters.pid = 200
    counters.threads = {1: counters.threads[1], 200: (0, 0)}
    now, said = feed(pairing, counters, now, 1, run=0.95)
    assert said == [None] and pairing.cpu is not None  # a baseline
    _, said = feed(pairing, counters, now, 1, run=0.95)
    assert isinstance(said[0], Release)  # measured from its first sample


def test_no_worker_1_releases_a_pair_and_is_no_baseline() -> None:
    pairing, counters, now = paired()
    assert pairing.on_sample(None, now + 1000) == Release("worker 1 is not running")
    assert pairing.cpu is None and pairing.releases == 1
    assert pairing.on_sample(None, now + 2000) is None  # not paired: nothing to release
    now, said = feed(pairing, counters, now + 2000, 1 + 2 * QUIET_SAMPLES, run=0.0)
    assert said[0] is None  # a baseline again; then twice the quiet samples, as after any
    assert said[1:-1] == [None] * (2 * QUIET_SAMPLES - 1) and isinstance(said[-1], Pair)


def test_a_thread_that_ended_takes_its_counts_with_it() -> None:
    pairing, counters, now = paired()
    del counters.threads[101]  # its second of work (well past RELEASE_RUN) gone with it
    _, said = feed(pairing, counters, now, 1, run=0.03)
    assert said == [None]  # measured by the threads left: no count went back
    fresh, started = Pairing(cpus=2), Counters()
    started.threads = {1: (10 * SECOND_NS, 0)}
    fresh.on_sample(started.next(0), 0)
    now, _ = feed(fresh, started, 0, QUIET_SAMPLES - 1, run=0.0)
    started.threads[7] = (SECOND_NS // 2, 0)  # new since: all of its half second counts
    now, said = feed(fresh, started, now, 1, run=0.0)
    assert said == [None]  # not light: the count starts again
    _, said = feed(fresh, started, now, QUIET_SAMPLES, run=0.0)
    assert said[:-1] == [None] * (QUIET_SAMPLES - 1) and isinstance(said[-1], Pair)


def test_the_pairs_cpu_gone_releases_it() -> None:
    pairing, counters, now = paired()
    cpu = pairing.cpu
    assert cpu is not None
    counters.idle.pop(cpu)
    _, said = feed(pairing, counters, now, 1, run=0.0)
    assert said == [Release(f"CPU {cpu} is no longer one to run on")]


def test_one_cpu_is_never_paired_and_asks_for_no_sample() -> None:
    pairing, counters = Pairing(cpus=1), Counters(cpus=1)
    assert not pairing.enabled
    pairing.on_sample(counters.next(0), 0)
    assert feed(pairing, counters, 0, 10, run=0.0)[1] == [None] * 10


def test_a_refused_pairing_waits_twice_as_long_and_is_not_a_release() -> None:
    pairing, counters, now = paired()
    pairing.refused()
    assert pairing.cpu is None and pairing.releases == 0
    _, said = feed(pairing, counters, now, 2 * QUIET_SAMPLES, run=0.0)
    assert said[:-1] == [None] * (2 * QUIET_SAMPLES - 1) and isinstance(said[-1], Pair)

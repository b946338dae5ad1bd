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
    """Cumulative counters advanced one sample at a time, by the share of a CPU given."""

    def __init__(self, worker_pid: int = 100, cpus: int = 2) -> None:
        self.pid = worker_pid
        self.run = self.wait = 0
        self.idle = {cpu: 0 for cpu in range(cpus)}
        self.worker_cpu = 0

    def next(self, run: float, wait: float = 0.0,
             idle: dict[int, float] | None = None) -> Sample:
        """`idle`: each CPU's idle share (default: all idle but for the pair's run, wherever
        it ran)."""
        self.run += round(run * SECOND_NS)
        self.wait += round(wait * SECOND_NS)
        for cpu in self.idle:
            self.idle[cpu] += round((idle or {}).get(cpu, 1.0 - run) * SECOND_NS)
        return Sample(self.pid, self.run, self.wait, dict(self.idle), self.worker_cpu)


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
    assert said[-1] == Pair(1, "5% of a CPU run, 1% waited, CPU 1 90% idle")
    assert pairing.cpu == 1 and pairing.pairings == 1


def test_on_a_tie_the_pair_goes_to_worker_1s_own_cpu() -> None:
    pairing, counters = Pairing(cpus=4), Counters(cpus=4)
    counters.worker_cpu = 2
    pairing.on_sample(counters.next(0), 0)
    _, said = feed(pairing, counters, 0, QUIET_SAMPLES, run=0.0)
    assert said[-1] == Pair(2, "0% of a CPU run, 0% waited, CPU 2 100% idle")


@pytest.mark.parametrize("run, wait", [(0.61, 0.0), (0.1, 0.31)])
def test_a_pair_whose_work_no_longer_fits_is_released(run: float, wait: float) -> None:
    pairing, counters, now = paired()
    now, said = feed(pairing, counters, now, 5, run=0.5, wait=0.25)  # heavier, still fits
    assert said == [None] * 5 and pairing.cpu is not None
    _, said = feed(pairing, counters, now, 1, run=run, wait=wait)
    assert isinstance(said[0], Release) and pairing.cpu is None and pairing.releases == 1


def test_a_busy_machine_is_not_paired_and_other_work_on_the_pairs_cpu_releases_it() -> None:
    """Pairing gains only where a CPU is idle (a woken process lands on a halted one); on a
    busy machine it could only make the two wait behind other work."""
    pairing, counters = Pairing(cpus=2), Counters()
    pairing.on_sample(counters.next(0), 0)
    now, said = feed(pairing, counters, 0, 10, run=0.01, idle={0: 0.3, 1: 0.45})
    assert said == [None] * 10 and pairing.cpu is None
    now, said = feed(pairing, counters, now, QUIET_SAMPLES, run=0.01, idle={0: 0.3, 1: 0.6})
    assert isinstance(said[-1], Pair) and pairing.cpu == 1
    # Other work takes the pair's CPU: 0.5 of it beside the pair's 0.05 still fits ...
    now, said = feed(pairing, counters, now, 1, run=0.05, idle={0: 0.0, 1: 0.45})
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


def test_a_replaced_worker_1_or_counters_that_went_back_decide_nothing() -> None:
    pairing, counters, now = paired()
    counters.pid = 200  # worker 1 replaced: its threads' counts start again
    counters.run = 0
    assert pairing.on_sample(counters.next(0.95), now + SAMPLE_INTERVAL_MS) is None
    assert pairing.cpu is not None  # its replacement was forked on the pair's CPU
    now, said = feed(pairing, counters, now + SAMPLE_INTERVAL_MS, 1, run=0.95)
    assert isinstance(said[0], Release)  # compared with the replacement's first sample


def test_no_worker_1_decides_nothing_and_is_no_baseline() -> None:
    pairing, counters = Pairing(cpus=2), Counters()
    assert pairing.on_sample(counters.next(0), 0) is None
    assert pairing.on_sample(None, 1000) is None  # worker 1 down
    now, said = feed(pairing, counters, 1000, QUIET_SAMPLES, run=0.0)
    assert said[0] is None  # a baseline again
    assert isinstance(feed(pairing, counters, now, 1, run=0.0)[1][0], Pair)


def test_one_cpu_is_never_paired_and_asks_for_no_sample() -> None:
    pairing, counters = Pairing(cpus=1), Counters(cpus=1)
    assert not pairing.enabled
    pairing.on_sample(counters.next(0), 0)
    assert feed(pairing, counters, 0, 10, run=0.0)[1] == [None] * 10


def test_a_refused_pairing_counts_as_a_release() -> None:
    pairing, counters, now = paired()
    pairing.refused()
    assert pairing.cpu is None
    _, said = feed(pairing, counters, now, 2 * QUIET_SAMPLES, run=0.0)
    assert said[:-1] == [None] * (2 * QUIET_SAMPLES - 1) and isinstance(said[-1], Pair)

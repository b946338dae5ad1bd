"""`zns serve --cpus auto` (the default): the state process and worker 1 share one CPU while
their work is light, and run where the kernel puts them once it is not. Sans-I/O.

Why pair them: a forwarded write goes worker -> state process -> worker, and its event then
leaves from the worker. When the process handed to sleeps and a CPU is idle, the kernel
wakes it on the idle CPU; on a VM whose idle virtual CPUs halt (as most hosts' guests do
without halt polling), the host then takes 50-80 us to run that CPU again. Two such
wake-ups per write put one worker's push latency about +140 us over one process on the
2-core test VM; on one CPU the two hand over by a context switch, and the excess is 0-30 us
(bench/results.md). A CPU busy with other work costs less to wake on than an idle one, and
the kernel lets a process that wakes preempt a CPU hog soon, so a pair next to another
process's load answers as fast as before (measured: a hog pinned to the pair's CPU).

Why not always: paired, the two no longer run in parallel, and the kernel cannot move them
off their CPU. So they are released as soon as their work stops fitting one CPU, and
paired again only once it has been light for a while:

- Released when, over the last sample (about a second), the two ran for more than
  RELEASE_RUN of a CPU, or were runnable but waiting for a CPU for more than RELEASE_WAIT
  of it (for each other, or for whatever else runs there).
- Paired when `quiet` samples in a row were light (under LIGHT_RUN and LIGHT_WAIT), on
  the CPU that was idlest over the last one (worker 1's own CPU on a tie: nothing moves).
  `quiet` is QUIET_SAMPLES, doubled by each release up to MAX_QUIET_SAMPLES, and back to
  QUIET_SAMPLES once a pairing has held for HELD_MS: a load that comes and goes costs a
  pairing and a release, with a line each, a few times an hour at most.
- A sample whose counters went back (worker 1 was replaced: its counts start again) or
  that has no worker 1 decides nothing; it is the next sample's baseline. A paired
  worker 1 that dies is replaced on the pair's CPU (it is forked from the state process).
- With a single CPU allowed there is nothing to choose: never paired.

Inputs are cumulative counters the driver reads (zns.drivers.cpus): the nanoseconds the
pair's threads ran and waited runnable (the kernel's schedstat), and each allowed CPU's idle
time. This object takes their differences between samples and says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SAMPLE_INTERVAL_MS = 1000
RELEASE_RUN = 0.6  # of a CPU: the pair's work no longer fits beside anything else's
RELEASE_WAIT = 0.3  # of a CPU: runnable and not running, for each other or for others
LIGHT_RUN = 0.3
LIGHT_WAIT = 0.15
QUIET_SAMPLES = 3
MAX_QUIET_SAMPLES = 300  # 5 minutes
HELD_MS = 600_000  # a pairing that held this long starts the doubling again


@dataclass(frozen=True)
class Sample:
    """Cumulative counters at one moment. `run_ns`, `wait_ns`: every thread of the state
    process and of worker 1 (`worker_pid`), ran and waited runnable. `idle`: each allowed
    CPU's idle time, in any unit, the same for every CPU. `worker_cpu`: the CPU worker 1
    last ran on."""

    worker_pid: int
    run_ns: int
    wait_ns: int
    idle: Mapping[int, int]
    worker_cpu: int


@dataclass(frozen=True)
class Pair:
    """Pin every thread of the state process and of worker 1 to `cpu`."""

    cpu: int
    why: str


@dataclass(frozen=True)
class Release:
    """Let the state process and worker 1 run on every allowed CPU again."""

    why: str


class Pairing:
    def __init__(self, now: int, cpus: int) -> None:
        """`cpus`: how many CPUs the processes may run on (below 2: never paired)."""
        self.cpu: int | None = None  # the pair's CPU while paired
        self.pairings = 0
        self.releases = 0
        self._enabled = cpus >= 2
        self._due = now
        self._last: tuple[Sample, int] | None = None
        self._light = 0  # light samples in a row
        self._quiet = QUIET_SAMPLES
        self._paired_at = 0

    def next_deadline(self) -> int | None:
        return self._due if self._enabled else None

    def on_sample(self, sample: Sample | None, now: int) -> Pair | Release | None:
        """The counters as read at `now` (None: worker 1 is not running): what to do."""
        self._due = now + SAMPLE_INTERVAL_MS
        last, self._last = self._last, None if sample is None else (sample, now)
        if sample is None or last is None or not self._enabled:
            return None
        before, then = last
        elapsed_ns = (now - then) * 1_000_000
        ran, waited = sample.run_ns - before.run_ns, sample.wait_ns - before.wait_ns
        if sample.worker_pid != before.worker_pid or ran < 0 or waited < 0 or elapsed_ns <= 0:
            return None  # worker 1 replaced: these counters start here
        run, wait = ran / elapsed_ns, waited / elapsed_ns
        load = f"{run:.0%} of a CPU run, {wait:.0%} waited"
        if self.cpu is not None:
            if run <= RELEASE_RUN and wait <= RELEASE_WAIT:
                if now - self._paired_at >= HELD_MS:
                    self._quiet = QUIET_SAMPLES
                return None
            self.cpu = None
            self._light = 0
            self._quiet = min(self._quiet * 2, MAX_QUIET_SAMPLES)
            self.releases += 1
            return Release(load)
        self._light = self._light + 1 if run < LIGHT_RUN and wait < LIGHT_WAIT else 0
        if self._light < self._quiet:
            return None
        idle = {cpu: sample.idle[cpu] - before.idle.get(cpu, sample.idle[cpu])
                for cpu in sample.idle}
        if not idle:
            return None
        cpu = max(idle, key=lambda c: (idle[c], c == sample.worker_cpu, -c))
        self.cpu = cpu
        self._paired_at = now
        self.pairings += 1
        return Pair(cpu, load)

    def refused(self) -> None:
        """The kernel refused the pairing just asked (its CPU went offline, or left the
        cpuset): unpaired, as after a release."""
        self.cpu = None
        self._light = 0
        self._quiet = min(self._quiet * 2, MAX_QUIET_SAMPLES)

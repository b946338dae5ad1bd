"""`zns serve --cpus auto` (the default): the state process and worker 1 share one CPU while
their work is light, and run where the kernel puts them once it is not. Sans-I/O.

Why pair them: a forwarded write goes worker -> state process -> worker, and its event then
leaves from the worker. When the process handed to sleeps and a CPU is idle, the kernel
wakes it on the idle CPU; on a VM whose idle virtual CPUs halt (as most hosts' guests do
without halt polling), the host then takes 50-80 us to run that CPU again. Two such
wake-ups per write put one worker's push latency p50 100-180 us over one process on the
2-core test VM; on one CPU the two hand over by a context switch, and it is within +50 us
of one process, at times below it (bench/results.md, *Paired by default*). The gain is
there only while CPUs are idle: on a busy machine a woken process lands on a CPU that is
running anyway.

Why not always: paired, the two no longer run in parallel, and the kernel cannot move them
off their CPU, however busy other work makes it. So they are paired only on a quiet
machine, and let go as soon as their own work or another's stops fitting:

- Released when, over the last sample (a second), the two ran for more than RELEASE_RUN
  of a CPU; or waited runnable for more than RELEASE_WAIT of it (for each other, or for
  whatever else runs there); or other work kept their CPU busy for more than RELEASE_OTHER
  of the time (its busy time, less theirs). At worst, then, a second of sharing a CPU
  before the kernel places them again, as `--cpus off` does all the time.
- Paired when `quiet` samples in a row were light: the two ran under LIGHT_RUN and waited
  under LIGHT_WAIT, and some CPU was idle for PAIR_IDLE of the time at least. They go to
  the CPU that was idlest over the last one (the lowest-numbered of a tie).
  `quiet` is QUIET_SAMPLES, doubled by each release (and each pairing the kernel refused)
  up to MAX_QUIET_SAMPLES, and back to QUIET_SAMPLES once a pairing has held for HELD_MS:
  a load that keeps coming and going costs a pairing and a release, with a line each, at
  most 7 times in its first 11 minutes and 12 times an hour after that.
- No worker 1 (it died, and its replacement has not started) releases a pair: nothing
  measures it. The first sample of a new worker 1 is a baseline and decides nothing; so
  does the first sample. Either starts the count of light samples again. A worker 1 that
  replaces a dead one while the two are paired is forked onto the pair's CPU.
- A thread's counts are taken since the last sample (all of them for a thread new since);
  a thread that ended between two samples takes its counts with it.
- The pair's CPU gone from those the processes may run on releases it.
- With a single CPU allowed there is nothing to choose: never paired.

Inputs are cumulative counters the driver reads (zns.drivers.cpus): the nanoseconds each
of the pair's threads ran and waited runnable (the kernel's schedstat), and the nanoseconds
each allowed CPU was idle (idle and iowait: nothing ran there). This object takes their
differences between samples and says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Shares of one CPU's time over a sample.
RELEASE_RUN = 0.6  # the pair's work no longer fits beside anything else's
RELEASE_WAIT = 0.3  # runnable and not running, for each other or for others
RELEASE_OTHER = 0.5  # the pair's CPU busy with other work
LIGHT_RUN = 0.3
LIGHT_WAIT = 0.15
PAIR_IDLE = 0.5  # the idlest CPU idle at least this long: a quiet machine
QUIET_SAMPLES = 3  # a sample a second (the state process's figures' second)
MAX_QUIET_SAMPLES = 300  # 5 minutes
HELD_MS = 600_000  # a pairing that held this long starts the doubling again


@dataclass(frozen=True)
class Sample:
    """Cumulative counters at one moment. `threads`: every thread of the state process and
    of worker 1 (`worker_pid`), by thread id: (ns it ran, ns it waited runnable).
    `idle_ns`: each allowed CPU's idle time (iowait included: nothing ran there)."""

    worker_pid: int
    threads: Mapping[int, tuple[int, int]]
    idle_ns: Mapping[int, int]


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
    def __init__(self, cpus: int) -> None:
        """`cpus`: how many CPUs the processes may run on (below 2: never paired)."""
        self.cpu: int | None = None  # the pair's CPU while paired
        self.releases = 0
        self.enabled = cpus >= 2  # else no sample is worth reading
        self._last: tuple[Sample, int] | None = None
        self._light = 0  # light samples in a row
        self._quiet = QUIET_SAMPLES
        self._paired_at = 0

    def on_sample(self, sample: Sample | None, now: int) -> Pair | Release | None:
        """The counters as read at `now` (None: worker 1 is not running): what to do. The
        state process reads them once a second; any other period works alike (the shares
        are of the time between two samples), but the quiet time is counted in samples."""
        if not self.enabled:
            return None
        last, self._last = self._last, None if sample is None else (sample, now)
        if sample is None:  # worker 1 died, or restarts: nothing to measure the pair by
            self._light = 0
            return None if self.cpu is None else self._release("worker 1 is not running")
        if last is None or sample.worker_pid != last[0].worker_pid or now <= last[1]:
            self._light = 0  # the first sample, or of a new worker 1: a baseline
            return None
        before, then = last
        elapsed_ns = (now - then) * 1_000_000
        # Each thread's counts since the last sample (all of them for a thread new since):
        # a thread that ended meanwhile takes its counts with it, and no sum goes back.
        ran = waited = 0
        for thread, (run_ns, wait_ns) in sample.threads.items():
            run_before, wait_before = before.threads.get(thread, (0, 0))
            ran += max(0, run_ns - run_before)
            waited += max(0, wait_ns - wait_before)
        run, wait = ran / elapsed_ns, waited / elapsed_ns
        idle = {cpu: (sample.idle_ns[cpu] - before.idle_ns[cpu]) / elapsed_ns
                for cpu in sample.idle_ns if cpu in before.idle_ns}
        load = f"{run:.0%} of a CPU run, {wait:.0%} waited"
        if self.cpu is not None:
            if self.cpu not in idle:
                return self._release(f"CPU {self.cpu} is no longer one to run on")
            # What else kept the pair's CPU busy (its busy time, less the pair's own).
            other = 1 - idle[self.cpu] - run
            if run > RELEASE_RUN or wait > RELEASE_WAIT:
                return self._release(load)
            if other > RELEASE_OTHER:
                return self._release(f"{load}, {other:.0%} other work")
            if now - self._paired_at >= HELD_MS:
                self._quiet = QUIET_SAMPLES
            return None
        quiet = bool(idle) and max(idle.values()) >= PAIR_IDLE
        self._light = self._light + 1 if run < LIGHT_RUN and wait < LIGHT_WAIT and quiet \
            else 0
        if self._light < self._quiet:
            return None
        cpu = max(idle, key=lambda c: (idle[c], -c))  # the idlest; the lowest of a tie
        self.cpu = cpu
        self._paired_at = now
        return Pair(cpu, f"{load}, CPU {cpu} {idle[cpu]:.0%} idle")

    def refused(self) -> None:
        """The kernel refused the pairing just asked (its CPU went offline, or left the
        cpuset): not paired, and the next pairing waits twice as long, as after a
        release (not counted as one)."""
        self._unpair()

    def _release(self, why: str) -> Release:
        self._unpair()
        self.releases += 1
        return Release(why)

    def _unpair(self) -> None:
        self.cpu = None
        self._light = 0
        self._quiet = min(self._quiet * 2, MAX_QUIET_SAMPLES)

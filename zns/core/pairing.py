"""`zns serve --cpus auto` (the default): the state process and worker 1 share one CPU while
their work is light, and run where the kernel puts them once it is not. Sans-I/O.

Why pair them: a forwarded write goes worker -> state process -> worker, and its event then
leaves from the worker. When the process handed to sleeps and a CPU is idle, the kernel
wakes it on the idle CPU; on a VM whose idle virtual CPUs halt (as most hosts' guests do
without halt polling), the host then takes 50-80 us to run that CPU again. Two such
wake-ups per write put one worker's push latency about +140 us over one process on the
2-core test VM; on one CPU the two hand over by a context switch, and the excess is 0-30 us
(bench/results.md). The gain is there only while CPUs are idle: on a busy machine a woken
process lands on a CPU that is running anyway.

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
  the CPU that was idlest over the last one (worker 1's own on a tie: nothing moves).
  `quiet` is QUIET_SAMPLES, doubled by each release up to MAX_QUIET_SAMPLES, and back to
  QUIET_SAMPLES once a pairing has held for HELD_MS: a load that comes and goes costs a
  pairing and a release, with a line each, a few times an hour at most.
- A sample whose counters went back (worker 1 was replaced: its counts start again) or
  that has no worker 1 decides nothing; it is the next sample's baseline. A paired
  worker 1 that dies is replaced on the pair's CPU (it is forked from the state process).
- With a single CPU allowed there is nothing to choose: never paired.

Inputs are cumulative counters the driver reads (zns.drivers.cpus): the nanoseconds the
pair's threads ran and waited runnable (the kernel's schedstat), and the nanoseconds each
allowed CPU was idle. This object takes their differences between samples and says what to
do.
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
    """Cumulative counters at one moment. `run_ns`, `wait_ns`: every thread of the state
    process and of worker 1 (`worker_pid`), ran and waited runnable. `idle_ns`: each allowed
    CPU's idle time. `worker_cpu`: the CPU worker 1 last ran on."""

    worker_pid: int
    run_ns: int
    wait_ns: int
    idle_ns: Mapping[int, int]
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
    def __init__(self, cpus: int) -> None:
        """`cpus`: how many CPUs the processes may run on (below 2: never paired)."""
        self.cpu: int | None = None  # the pair's CPU while paired
        self.pairings = 0
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
        last, self._last = self._last, None if sample is None else (sample, now)
        if sample is None or last is None or not self.enabled:
            return None
        before, then = last
        elapsed_ns = (now - then) * 1_000_000
        ran, waited = sample.run_ns - before.run_ns, sample.wait_ns - before.wait_ns
        if sample.worker_pid != before.worker_pid or ran < 0 or waited < 0 or elapsed_ns <= 0:
            return None  # worker 1 replaced: these counters start here
        run, wait = ran / elapsed_ns, waited / elapsed_ns
        idle = {cpu: (sample.idle_ns[cpu] - before.idle_ns[cpu]) / elapsed_ns
                for cpu in sample.idle_ns if cpu in before.idle_ns}
        load = f"{run:.0%} of a CPU run, {wait:.0%} waited"
        if self.cpu is not None:
            # What else kept the pair's CPU busy (its busy time, less the pair's own).
            other = 1 - idle[self.cpu] - run if self.cpu in idle else 0.0
            if run <= RELEASE_RUN and wait <= RELEASE_WAIT and other <= RELEASE_OTHER:
                if now - self._paired_at >= HELD_MS:
                    self._quiet = QUIET_SAMPLES
                return None
            self.cpu = None
            self._light = 0
            self._quiet = min(self._quiet * 2, MAX_QUIET_SAMPLES)
            self.releases += 1
            return Release(load + (f", {other:.0%} other work" if other > RELEASE_OTHER
                                   else ""))
        quiet = bool(idle) and max(idle.values()) >= PAIR_IDLE
        self._light = self._light + 1 if run < LIGHT_RUN and wait < LIGHT_WAIT and quiet \
            else 0
        if self._light < self._quiet:
            return None
        cpu = max(idle, key=lambda c: (idle[c], c == sample.worker_cpu, -c))
        self.cpu = cpu
        self._paired_at = now
        self.pairings += 1
        return Pair(cpu, f"{load}, CPU {cpu} {idle[cpu]:.0%} idle")

    def refused(self) -> None:
        """The kernel refused the pairing just asked (its CPU went offline, or left the
        cpuset): unpaired, as after a release."""
        self.cpu = None
        self._light = 0
        self._quiet = min(self._quiet * 2, MAX_QUIET_SAMPLES)

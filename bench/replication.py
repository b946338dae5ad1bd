"""Benchmark: the replication path alone -- a primary and two forked replicas over the real
channel (zns.drivers.replication_link), opaque commands, no NameService.

    python -m bench.replication [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import math
import os
import resource
import signal
import socket
import time
from dataclasses import dataclass

from bench.harness import BenchError, percentile
from bench.report import BenchResult, Figure, RunConfig, cli
from zns.core.errors import ConnectionLost
from zns.core.replication import Primary, Replica
from zns.drivers.replication_link import PrimaryLink, ReplicaLink, WrittenSeq, fork_worker

COMMAND_BYTES = 200  # about a broker registration of a few topics
EVENT = b"e" * 120
WORKERS = 2


@dataclass(frozen=True)
class Params:
    commands: int  # pushed as fast as the primary goes
    idle_samples: int  # one command at a time, each committed before the next
    paced_s: float  # seconds at 1,000 commands/s


FULL = Params(commands=200_000, idle_samples=1000, paced_s=5.0)
QUICK = Params(commands=5_000, idle_samples=50, paced_s=0.5)

METHOD = """
The replication path without a state machine: a `Primary` in the benchmark process and
{workers} worker processes forked by `fork_worker`, each following over its socketpair
with a `Replica` whose state machine records the command and returns one {event}-byte
event (held for the fence, then counted as published). Commands are {size} bytes.

- **Throughput**: {commands:,} commands appended back to back (the primary reads the
  workers' acknowledgements every 64 appends, and waits while more than 4 windows of
  commands are uncommitted, so every command travels: no state transfer besides the
  joins); commands/s = commands / the time from the
  first append until the fence reached the last. CPU per command: the benchmark
  process's user+system CPU over that span (the primary side only) / commands, and
  each worker's (from /proc) / commands.
- **Commit latency** (the lag `Primary.take_lags` reports, here in µs): from `append`
  of a command to the primary seeing the fence pass it, i.e. both workers acknowledged
  it; the workers learn the fence one more hop later, and publish its events then.
  *Idle*: {idle} commands one at a time, each committed before the next, 2 ms apart.
  *At 1,000/s*: one command every millisecond for {paced:g} s.
"""


def _worker(sock: socket.socket, written: WrittenSeq) -> int:
    applied = [0]
    published = [0]
    link = ReplicaLink(
        sock, Replica(),
        apply=lambda seq, command, produce: (applied.__setitem__(0, seq), [EVENT] if produce else [])[1],
        load=lambda seq, dump: applied.__setitem__(0, seq),
        publish=lambda seq, events: published.__setitem__(0, published[0] + len(events)),
        written=written,
    )
    while True:
        link.wait(1000)
        try:
            link.run()
        except ConnectionLost:
            return 0


def clock_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Cluster:
    def __init__(self) -> None:
        self.link = PrimaryLink(Primary(now=clock_ms()), dump=lambda: b"",
                                execute=lambda worker, request: (None, b""))
        self.pids = [fork_worker(self.link, _worker, clock_ms())[0] for _ in range(WORKERS)]
        self.command = b"c" * COMMAND_BYTES

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.link.close()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)

    def run_until(self, seq: int, deadline_s: float = 60.0) -> None:
        end = time.monotonic() + deadline_s
        primary = self.link.primary
        while primary.fence < seq:
            if time.monotonic() > end:
                raise BenchError(f"the fence stopped at {primary.fence} of {seq}")
            self.link.wait(5)
            self.link.run(clock_ms())
        if len(primary.workers) != WORKERS:
            raise BenchError("a worker was dropped")

    def throughput(self, commands: int) -> tuple[float, float, float]:
        """(commands/s, primary CPU µs per command, a worker's CPU µs per command)."""
        self.run_until(self.link.primary.seq)
        cpu0, t0, workers0 = _cpu(), time.perf_counter(), self._workers_cpu()
        primary = self.link.primary
        for i in range(commands):
            self.link.append(self.command, clock_ms())
            if i % 64 == 63:
                self.link.run(clock_ms())
                # Held to the window and a little tail: past the tail's bound a worker
                # would get a state instead of the commands, and this would not measure them.
                while primary.seq - primary.fence > 4 * primary.window:
                    self.link.wait(5)
                    self.link.run(clock_ms())
        self.run_until(self.link.primary.seq)
        if primary.transfers != WORKERS:
            raise BenchError(f"{primary.transfers - WORKERS} state transfer(s) besides the joins")
        elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu0
        workers = (self._workers_cpu() - workers0) / WORKERS
        return commands / elapsed, cpu / commands * 1e6, workers / commands * 1e6

    def _workers_cpu(self) -> float:
        """The workers' user+system CPU seconds so far, from /proc."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks

    def idle_latency(self, samples: int) -> list[float]:
        lat = []
        for _ in range(samples):
            time.sleep(0.002)
            t0 = time.perf_counter()
            seq = self.link.append(self.command, clock_ms())
            while self.link.primary.fence < seq:
                self.link.wait(50)
                self.link.run(clock_ms())
            lat.append((time.perf_counter() - t0) * 1e6)
        return lat

    def paced_latency(self, seconds: float) -> list[float]:
        primary = self.link.primary
        sent: dict[int, float] = {}
        lat: list[float] = []
        start = time.perf_counter()
        n = 0
        while True:
            now = time.perf_counter()
            due = start + n / 1000
            if now >= due and now - start < seconds:
                sent[self.link.append(self.command, clock_ms())] = time.perf_counter()
                n += 1
            elif now - start >= seconds and not sent:
                return lat
            else:
                # poll() counts whole ms: round up, or the wait spins and starves the workers.
                self.link.wait(max(1, math.ceil((due - now) * 1000)) if now - start < seconds
                               else 5)
            self.link.run(clock_ms())
            fence, t = primary.fence, time.perf_counter()
            for seq in [s for s in sent if s <= fence]:
                lat.append((t - sent.pop(seq)) * 1e6)
            if now - start > seconds + 30:
                raise BenchError("paced commands were not committed within 30 s")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    rates, cpus, worker_cpus = [], [], []
    load = os.getloadavg()[0]
    idle50, idle99, paced50, paced99 = [], [], [], []
    for r in range(config.rounds):
        with Cluster() as cluster:
            rate, cpu, worker_cpu = cluster.throughput(p.commands)
            idle = cluster.idle_latency(p.idle_samples)
            paced = cluster.paced_latency(p.paced_s)
        rates.append(rate)
        cpus.append(cpu)
        worker_cpus.append(worker_cpu)
        idle50.append(percentile(idle, 50))
        idle99.append(percentile(idle, 99))
        paced50.append(percentile(paced, 50))
        paced99.append(percentile(paced, 99))
        config.log(f"round {r + 1}: {rate:,.0f} commands/s, {cpu:.1f} µs CPU each; commit "
                   f"idle p50 {idle50[-1]:.0f} µs p99 {idle99[-1]:.0f} µs; at 1,000/s p50 "
                   f"{paced50[-1]:.0f} µs p99 {paced99[-1]:.0f} µs")
    figures = [
        Figure(f"commands/s, primary → {WORKERS} replicas", "commands/s", rates,
               note=f"{p.commands:,} commands of {COMMAND_BYTES} bytes"),
        Figure("primary CPU per command", "µs", cpus),
        Figure("worker CPU per command", "µs", worker_cpus,
               note="each worker's, from /proc (clock-tick resolution)"),
        Figure("commit latency p50, idle", "µs", idle50),
        Figure("commit latency p99, idle", "µs", idle99),
        Figure("commit latency p50, 1,000 commands/s", "µs", paced50),
        Figure("commit latency p99, 1,000 commands/s", "µs", paced99,
               note=f"load average {load:.1f} on {os.cpu_count()} CPUs when the run began: "
                    "a p99 here measures waits for a core as much as the path"),
    ]
    method = METHOD.format(workers=WORKERS, event=len(EVENT), size=COMMAND_BYTES,
                           commands=p.commands, idle=p.idle_samples, paced=p.paced_s)
    return BenchResult("replication", "Replication path: primary to two replicas", method,
                       figures)


if __name__ == "__main__":
    raise SystemExit(cli({"replication": run}))

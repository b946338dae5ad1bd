"""`zns serve --workers N`: one state process and N worker processes, measured side by side
with one process (`--workers 0`) and the Java NameServer (issue 30 item 7).

Five benchmarks, each its own section of bench/results.md, each rerunnable alone:

- `workers_reads`: remoting GET_ROUTEINFO_BY_TOPIC and ZNS/1 `get_route` throughput with 0,
  1 and 2 workers and the Java NameServer; the CPU per read of every process, the CPU per
  write, and a projection to 4-64 cores from them;
- `workers_lag`: a write's way to the other worker (replication lag) idle and under 1,000
  registrations/s; push latency with 0, 1 and 2 workers;
- `workers_storm`: read latency while brokers register 10,000 topics each;
- `workers_memory`: the memory of every process at 1,000 brokers and 10,000 topics, with 0, 1
  and 2 workers, against the Java NameServer with the harness's small heap and with its start
  script's;
- `workers_recovery`: a worker's SIGKILL to its slot answering again; a state process's
  SIGTERM and a new start to its first route answer.

    python -m bench.workers [--quick] [--rounds N] [--out DIR] [workers_storm ...]

Not in `make bench` (it would double its time): run by hand; a run (not --quick) replaces
its sections of bench/results.md and keeps the others.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
import dataclasses
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
import zmq

from bench import push_latency
from bench.harness import (
    REPLY_TIMEOUT_S, START_TIMEOUT_S, BenchError, LoadPool, Probe, ServerProcess, Session,
    ask, broker_addr, check_reply, cpu_seconds, free_port, percentile, register_request,
    request, rss_kib, start_zns, wait_log, wait_paired, zmq_context,
)
from bench.remoting import (
    REMOTING_LINE, FakeBrokers, Generator, Params as RemotingParams, RemotingClient,
    broker_frame, java_reason, route_brokers, route_frames, rocketmq,
)
from bench.remoting import register_frame as fake_broker_frame
from bench.report import BENCH_DIR, BenchFn, BenchResult, Figure, RunConfig, Target, cli
from zns.core import schema

WORKER_LINE = re.compile(r"worker (\d+) started \(pid (\d+)")
WORKER_COUNTS = (0, 1, 2)
PROJECTED_CORES = (4, 8, 16, 64)
APART_S = 0.005  # the pause between isolated route changes (workers_lag)


@dataclass(frozen=True)
class Params:
    remoting: RemotingParams  # fake brokers and the remoting load (bench/remoting.py's shape)
    zns1_sockets: int  # DEALERs per load process
    zns1_depth: int  # get_route requests in flight per DEALER
    writes: int  # re-registrations per process-CPU-per-write measurement
    lag_samples: int  # per round, idle and loaded each
    lag_rate: float  # background registrations/s
    storm_brokers: int  # brokers registering `storm_topics` topics each, twice
    storm_topics: int
    mem_brokers: int
    mem_topics: int
    push: push_latency.Params
    kills: int  # worker SIGKILLs per round
    java: bool  # the Java NameServer's side (when a JDK is there)


FULL = Params(
    remoting=RemotingParams(brokers=10, topics=100, processes=2, conns=4, depth=16, duration=2.0,
                            warmup=0.5, rate=0, rate_duration=0, jit_warmup=8.0, kill_rounds=0),
    zns1_sockets=4, zns1_depth=16, writes=2_000, lag_samples=300, lag_rate=1_000.0,
    storm_brokers=10, storm_topics=10_000, mem_brokers=1_000, mem_topics=10_000,
    push=push_latency.Params(subscribers=(1, 10), changes=500, rtt_duration=0.5), kills=3,
    java=True)
QUICK = Params(
    remoting=RemotingParams(brokers=2, topics=5, processes=1, conns=2, depth=4, duration=0.4,
                            warmup=0.2, rate=0, rate_duration=0, jit_warmup=0.3, kill_rounds=0),
    zns1_sockets=2, zns1_depth=4, writes=50, lag_samples=10, lag_rate=100.0,
    storm_brokers=2, storm_topics=2_000, mem_brokers=20, mem_topics=100,
    push=push_latency.Params(subscribers=(1,), changes=20, rtt_duration=0.1), kills=1,
    java=False)


# --- servers and their processes -----------------------------------------------------


@dataclass
class Zns:
    """A `zns serve --workers W` (W = 0: one process) and its remoting address."""

    server: ServerProcess
    workers: int
    remoting: str

    def pids(self) -> dict[str, int]:
        """Every process by role: `server` (W = 0), or `state` and `worker K` (the live ones,
        from the log: a replacement's line comes after its predecessor's)."""
        if self.workers == 0:
            return {"server": self.server.proc.pid}
        found: dict[str, int] = {"state": self.server.proc.pid}
        for slot, pid in WORKER_LINE.findall(self.server.log_path.read_text(errors="replace")):
            found[f"worker {slot}"] = int(pid)
        return found

    def worker_pid(self, slot: int) -> int:
        return self.pids()[f"worker {slot}"]

    def wait_workers(self) -> None:
        """Until every worker answered a status (each binds its ports after its state)."""
        if self.workers == 0:
            return
        seen: set[int] = set()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(seen) < self.workers:
            if time.monotonic() > deadline:
                raise BenchError(f"only workers {sorted(seen)} answered")
            with Session(self.server.router) as session:
                seen.add(session.call("status").worker)


def start(config: RunConfig, workers: int, tag: str, *args: str) -> Zns:
    server = start_zns(config.workdir / f"{tag}-w{workers}", "--workers", str(workers),
                       "--remoting", "127.0.0.1:0", *args)
    try:
        remoting = wait_log(server, REMOTING_LINE)
        zns = Zns(server, workers, remoting)
        zns.wait_workers()
    except BaseException:
        server.stop()
        raise
    return zns


def label(workers: int) -> str:
    return "1 process (--workers 0)" if workers == 0 else f"{workers} worker" + "s" * (workers > 1)


class Cpu:
    """CPU seconds of every process of a server between `__init__` and `taken()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {role: cpu_seconds(pid) for role, pid in pids.items()}

    def taken(self) -> dict[str, float]:
        return {role: cpu_seconds(pid) - self.before[role] for role, pid in self.pids.items()}


def java_side(config: RunConfig, p: Params) -> str:
    """Why the Java NameServer is left out ("" when it runs)."""
    if not p.java:
        return "a quick run leaves the Java NameServer out"
    reason = java_reason()
    if reason and rocketmq.interop_required():
        raise BenchError(f"{reason} ({rocketmq.REQUIRE_ENV}=1 makes this a failure)")
    return reason


def start_java(config: RunConfig, stack: ExitStack, tag: str) -> tuple[str, int]:
    # A folder per benchmark: a group's folder holds its name server's config (its port).
    group = stack.enter_context(rocketmq.ProcessGroup(config.workdir / f"rocketmq-{tag}"))
    ns = group.namesrv(jvm_args=["-XX:TieredStopAtLevel=4"])  # the full JIT, as bench/remoting
    config.log(f"Java NameServer at {ns.addr} up in {ns.ready_after:.1f} s")
    return ns.addr, ns.pid


# --- ZNS/1 load: several DEALERs per process, so the kernel spreads them over workers -------


class Zns1Load(LoadPool):
    def __init__(self, processes: int) -> None:
        super().__init__(processes, _zns1_drive, zmq_context, what="a ZNS/1 load process")

    def drive(self, endpoint: str, bodies: list[bytes], sockets: int, depth: int,
              duration: float, warmup: float) -> tuple[float, int]:
        """(replies/s in the window, replies in all)."""
        start_at = time.monotonic() + warmup
        outcomes = self.run([(endpoint, bodies, sockets, depth, start_at, duration)] * len(self),
                            warmup + duration + REPLY_TIMEOUT_S + 10)
        return sum(outcome[0] for outcome in outcomes) / duration, sum(o[1] for o in outcomes)


def _zns1_drive(ctx: zmq.Context, endpoint: str, bodies: list[bytes], sockets: int, depth: int,
                start_at: float, duration: float) -> tuple[int, int]:
    socks = []
    poller = zmq.Poller()
    for _ in range(sockets):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
        poller.register(sock, zmq.POLLIN)
    n, i = len(bodies), 0
    for sock in socks:
        for _ in range(depth):
            sock.send(bodies[i % n])
            i += 1
    end_at = start_at + duration
    replies = total = 0
    clock = time.monotonic
    last = clock()
    try:
        while True:
            now = clock()
            if now >= end_at:
                break
            if now - last > REPLY_TIMEOUT_S:
                raise BenchError(f"{endpoint} answered nothing for {REPLY_TIMEOUT_S} s")
            for sock, _ in poller.poll(1000):
                while True:
                    try:
                        sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    last = at = clock()
                    total += 1
                    if start_at <= at < end_at:
                        replies += 1
                    sock.send(bodies[i % n])
                    i += 1
    finally:
        for sock in socks:
            sock.close(0)
    return replies, total


# --- remoting registrations ------------------------------------------------------------


def register_frame(b: int, topics: Sequence[str], opaque: int = 1) -> bytes:
    """REGISTER_BROKER of broker `b` (any of 65,536 addresses) hosting `topics`."""
    return broker_frame(f"wbench-broker-{b:04d}", broker_addr(b), topics, opaque)


def pipelined(clients: Sequence[RemotingClient], frames: Sequence[Sequence[bytes]]) -> None:
    """Every client sends its frames at once; then every reply is read and must be a success."""
    for client, batch in zip(clients, frames):
        client.sock.sendall(b"".join(batch))
    for client, batch in zip(clients, frames):
        for _ in batch:
            reply = client.reply()
            if reply.code != 0:
                raise BenchError(f"remoting reply {reply.code}: {reply.remark}")


# --- workers_reads: throughput, CPU per read and per write, projection ----------------------


def _per_read(cpu: dict[str, float], reads: int) -> dict[str, float]:
    return {role: seconds / reads * 1e6 for role, seconds in cpu.items()}


def run_reads(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    rp = p.remoting
    reason = java_side(config, p)
    topics = [f"BenchTopic{i:04d}" for i in range((rp.brokers + 1) // 2 * rp.topics)]
    zns1_bodies = [request("get_route", id=i + 1, topic=topics[i % len(topics)])
                   for i in range(256)]
    remoting_rate: dict[str, list[float]] = {}
    zns1_rate: dict[int, list[float]] = {w: [] for w in WORKER_COUNTS}
    cpu_read: dict[str, list[float]] = {}  # "<server>: <protocol>: <process>" -> µs per read
    cpu_write: dict[str, list[float]] = {}
    with ExitStack() as stack:
        servers = {w: stack.enter_context(_closing(start(config, w, "reads")))
                   for w in WORKER_COUNTS}
        addrs = {label(w): (z.remoting, z) for w, z in servers.items()}
        java = None
        if not reason:
            java = start_java(config, stack, "reads")
        brokers = FakeBrokers({**{k: a for k, (a, _) in addrs.items()},
                               **({"java": java[0]} if java else {})}, rp)
        stack.callback(brokers.close)
        for name, (addr, _) in addrs.items():
            got = route_brokers(addr, topics[-1])
            if not got or len(got) != 2:
                raise BenchError(f"{name}: the route of {topics[-1]} lists {got}, not 2 brokers")
        generator = Generator(rp.processes, topics)
        stack.callback(generator.close)
        zns1 = Zns1Load(rp.processes)
        stack.callback(zns1.close)
        names = list(addrs) + (["Java NameServer"] if java else [])
        for name in names:  # the JVM's JIT; every server gets the same
            addr, pid = (java if java and name == "Java NameServer" else
                         (addrs[name][0], addrs[name][1].server.proc.pid))
            generator.drive(addr, pid, conns=rp.conns, depth=rp.depth, duration=rp.jit_warmup,
                            warmup=0.0)
        for r in range(config.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                if name == "Java NameServer":
                    assert java is not None
                    load = generator.drive(*java, conns=rp.conns, depth=rp.depth,
                                           duration=rp.duration, warmup=rp.warmup)
                    remoting_rate.setdefault(name, []).append(load.rate)
                    cpu_read.setdefault(f"{name}: remoting", []).append(load.cpu_us_per_request)
                    continue
                addr, zns = addrs[name]
                cpu = Cpu(zns.pids())
                load = generator.drive(addr, zns.server.proc.pid, conns=rp.conns, depth=rp.depth,
                                       duration=rp.duration, warmup=rp.warmup)
                remoting_rate.setdefault(name, []).append(load.rate)
                for role, us in _per_read(cpu.taken(), load.total).items():
                    cpu_read.setdefault(f"{name}: remoting: {role}", []).append(us)
                cpu = Cpu(zns.pids())
                rate, total = zns1.drive(zns.server.router, zns1_bodies, p.zns1_sockets,
                                         p.zns1_depth, rp.duration, rp.warmup)
                zns1_rate[zns.workers].append(rate)
                for role, us in _per_read(cpu.taken(), total).items():
                    cpu_read.setdefault(f"{name}: ZNS/1: {role}", []).append(us)
                # Writes: every fake broker re-registers, unchanged (what a fleet sends every
                # 30 s), `writes` in all, pipelined per connection.
                mine = [c for c in brokers.clients if c.sock.getpeername()[1] ==
                        int(addr.rsplit(":", 1)[1])]
                per = max(1, p.writes // len(mine))
                frames = [[fake_broker_frame(b, rp, k + 2) for k in range(per)]
                          for b in range(len(mine))]
                cpu = Cpu(zns.pids())
                pipelined(mine, frames)
                for role, seconds in cpu.taken().items():
                    cpu_write.setdefault(f"{name}: {role}", []).append(
                        seconds / (per * len(mine)) * 1e6)
            config.log(f"round {r + 1}: remoting " + ", ".join(
                f"{n} {remoting_rate[n][-1]:,.0f}/s" for n in names) + "; ZNS/1 " + ", ".join(
                f"{label(w)} {zns1_rate[w][-1]:,.0f}/s" for w in WORKER_COUNTS))
    return reads_result(p, reason, remoting_rate, zns1_rate, cpu_read, cpu_write)


class _closing:
    """A `Zns` as a context manager (stopped on exit)."""

    def __init__(self, zns: Zns) -> None:
        self.zns = zns

    def __enter__(self) -> Zns:
        return self.zns

    def __exit__(self, *_: object) -> None:
        self.zns.server.stop()


READS_METHOD = """
Three `zns serve --remoting 127.0.0.1:0` side by side: `--workers 0` (one process), `--workers
1` and `--workers 2`, and RocketMQ 5.3.3's Java NameServer (the interop harness's JVM: serial
GC, 64–128 MB heap, full JIT). bench/remoting.py's fake brokers register the same routes with
each ({brokers} brokers, every topic on 2 of them, {topics} topics) over connections kept open.
*Remoting*: bench/remoting.py's load generator ({procs} processes × {conns} connections ×
{depth} GET_ROUTEINFO_BY_TOPIC in flight each) for a window of {duration:g} s after
{warmup:g} s, after {jit:g} s of the same load on every server first (the JVM's JIT).
*ZNS/1*: {procs} processes × {sockets} DEALERs × {zdepth} `get_route` in flight each (so the
kernel spreads the connections over the workers by their ports, as it does real clients).
Rounds alternate the order of the servers. *CPU per read*: each process's user+system CPU
from /proc/<pid>/stat over the drive (warm-up and tail included) divided by every reply of
the drive (warm-up and tail included): so the workers' figures add up to the whole, and a
worker's figure is its share of the load (the kernel's spread of the connections), not its
cost per read it answered; `state` is the state process. CPU has clock-tick resolution
(10 ms): about 0.1 µs per read at 100,000 reads. *CPU per write*: every fake broker's
connection pipelines unchanged re-registrations ({topics_each} topics each, the steady state of
a fleet), {writes} in all, and each process's CPU over them is divided by their number.
"""


def reads_result(p: Params, reason: str, remoting_rate: dict[str, list[float]],
                 zns1_rate: dict[int, list[float]], cpu_read: dict[str, list[float]],
                 cpu_write: dict[str, list[float]]) -> BenchResult:
    rp = p.remoting
    java = "Java NameServer" if "Java NameServer" in remoting_rate else ""
    figures: list[Figure] = []
    for w in WORKER_COUNTS:
        name = label(w)
        figures.append(Figure(f"remoting GET_ROUTEINFO_BY_TOPIC, {name}", "req/s",
                              remoting_rate[name], java, remoting_rate.get(java, []),
                              note="" if java else f"the Java side was skipped: {reason}"))
    if java:
        figures.append(Figure("remoting GET_ROUTEINFO_BY_TOPIC, Java NameServer", "req/s",
                              remoting_rate[java]))
    for w in WORKER_COUNTS:
        figures.append(Figure(f"ZNS/1 get_route, {label(w)}", "req/s", zns1_rate[w],
                              label(0) if w else "", zns1_rate[0] if w else []))
    for key, rounds in cpu_read.items():
        ref = f"{java}: remoting" if java and ": remoting" in key and key != f"{java}: remoting" \
            else ""
        figures.append(Figure(f"CPU per read: {key}", "µs", rounds,
                              java if ref else "", cpu_read.get(ref, []) if ref else []))
    for key, rounds in cpu_write.items():
        figures.append(Figure(f"CPU per write (remoting re-registration): {key}", "µs", rounds))
    method = READS_METHOD.format(
        brokers=rp.brokers, topics=(rp.brokers + 1) // 2 * rp.topics, procs=rp.processes,
        conns=rp.conns, depth=rp.depth, duration=rp.duration, warmup=rp.warmup,
        jit=rp.jit_warmup, sockets=p.zns1_sockets, zdepth=p.zns1_depth, 
        topics_each=rp.topics, writes=p.writes)
    method += "\n" + projection(cpu_read, cpu_write, java)
    return BenchResult("workers_reads", "Workers: reads, CPU per read and per write",
                       method, figures)


def _median(rounds: Sequence[float]) -> float:
    return statistics.median(rounds) if rounds else float("nan")


def projection(cpu_read: dict[str, list[float]], cpu_write: dict[str, list[float]],
               java: str) -> str:
    """A table of projected reads/s on C cores from the measured CPU per read and per write."""
    two = label(2)
    workers = [k for k in cpu_read if k.startswith(f"{two}: remoting: worker")]
    zworkers = [k for k in cpu_read if k.startswith(f"{two}: ZNS/1: worker")]
    if not workers or not zworkers:
        return ""
    read_us = sum(_median(cpu_read[k]) for k in workers)  # all workers' CPU per read
    zread_us = sum(_median(cpu_read[k]) for k in zworkers)
    state_read_us = _median(cpu_read.get(f"{two}: remoting: state", []))
    write_state_us = _median(cpu_write.get(f"{two}: state", []))
    apply_us = statistics.mean(
        _median(v) for k, v in cpu_write.items() if k.startswith(f"{two}: worker"))
    java_us = _median(cpu_read.get(f"{java}: remoting", [])) if java else float("nan")
    single_us = _median(cpu_read.get(f"{label(0)}: remoting: server", []))
    if not all(x > 0 for x in (read_us, zread_us, write_state_us, apply_us)):  # nan is not > 0
        return ("**Projection**: not computed: a CPU figure it needs measured 0 (clock-tick "
                "resolution: too few requests).")
    lines = [
        "**Projection** (computed from the medians above, not measured on those hosts). "
        f"Inputs: with 2 workers a remoting read costs {read_us:.1f} µs of worker CPU "
        f"(ZNS/1: {zread_us:.1f} µs) and {state_read_us:.2f} µs of the state process's; a "
        f"re-registration costs the state process {write_state_us:.0f} µs and each worker "
        f"{apply_us:.0f} µs (the writer's share of forwarding it included, averaged over both); "
        f"one process (`--workers 0`) spends {single_us:.1f} µs per remoting read"
        + (f"; the Java NameServer {java_us:.1f} µs (all its threads)." if java else "."),
        "",
        "Assumptions: on C cores zns runs C workers and the state process shares those cores; "
        "every worker applies every write, so at W writes/s each worker has 1 − W × (apply) of "
        "a core left for reads; the state process is one thread, so writes stop at "
        "1 / (its CPU per write) whatever the cores; reads spread evenly (the kernel spreads "
        "connections, not requests: a few heavy clients spread worse); CPU per read stays as "
        "measured here (no cache or memory-bandwidth effects; the clients run elsewhere); the "
        "Java NameServer scales perfectly over C cores at its measured CPU per read (its "
        "writes take a lock, reads do not); no other process on the host.",
        "",
        "| cores | zns reads/s, no writes | zns reads/s at 1,000 writes/s | "
        "zns reads/s at 10,000 writes/s | Java NameServer reads/s, no writes | "
        "zns `--workers 0` reads/s |",
        "|---|---|---|---|---|---|",
    ]
    for cores in PROJECTED_CORES:
        cells = []
        for w in (0, 1_000, 10_000):
            left = cores * (1 - w * apply_us / 1e6) - w * write_state_us / 1e6
            cells.append(f"{max(0.0, left) / read_us * 1e6:,.0f}"
                         if w * write_state_us / 1e6 < 1 else "writes saturate the state process")
        java_cell = f"{cores / java_us * 1e6:,.0f}" if java else "—"
        lines.append(f"| {cores} | " + " | ".join(cells) + f" | {java_cell} | "
                     f"{1e6 / single_us:,.0f} (one core, whatever the host) |")
    lines += ["", "1,000 writes/s is 30,000 brokers re-registering every 30 s (RocketMQ's "
              f"default period). Writes stop at about {1e6 / write_state_us:,.0f} "
              "re-registrations/s (the state process's one core) and, every worker applying "
              f"every write, at about {1e6 / apply_us:,.0f}/s for the workers, whatever the "
              "core count."]
    return "\n".join(lines)


# --- workers_lag: a write's way to the other worker; push latency -------------------------


LAG_BROKER, LAG_TOPIC = "lag-broker", "LagTopic"
BACKGROUND_BROKERS, BACKGROUND_TOPICS = 100, 10


def session_on(endpoint: str, worker: int | None) -> Session:
    """A Session whose connection the kernel gave to `worker` (None: any)."""
    for _ in range(200):
        session = Session(endpoint)
        if worker is None or session.call("status").worker == worker:
            return session
        session.close()
    raise BenchError(f"200 connections and none on worker {worker}")


def _queue_perm(reply: schema.Reply) -> int:
    if not isinstance(reply, schema.GetRouteReply):
        raise BenchError(f"get_route answered {reply}")
    route = reply.route
    if isinstance(route, msgspec.Raw):
        route = msgspec.msgpack.decode(route, type=schema.TopicRoute)
    return next(q.perm for q in route.queues if q.broker_name == LAG_BROKER)


def lag_samples(writer: Session, reader: Session, count: int) -> tuple[list[float], list[float]]:
    """`count` route changes on `writer`, each read back on `reader` at once and again until it
    shows: (write sent → its reply, write sent → the reader's first reply showing it), in s."""
    changes = [(request("wipe_write_perm", broker_name=LAG_BROKER), 4),
               (request("add_write_perm", broker_name=LAG_BROKER), 6)]
    read = request("get_route", id=1, topic=LAG_TOPIC)
    poller = zmq.Poller()
    poller.register(writer.sock, zmq.POLLIN)
    poller.register(reader.sock, zmq.POLLIN)
    replied: list[float] = []
    shown: list[float] = []
    clock = time.monotonic
    for i in range(count):
        body, perm = changes[i % 2]
        sent = clock()
        writer.sock.send(body)
        reader.sock.send(read)
        got_reply = got_shown = 0.0
        while not (got_reply and got_shown):
            ready = dict(poller.poll(int(REPLY_TIMEOUT_S * 1000)))
            if not ready:
                raise BenchError(f"no reply within {REPLY_TIMEOUT_S} s")
            if writer.sock in ready:
                check_reply(writer.sock.recv())
                got_reply = clock() - sent
            if reader.sock in ready:
                at = clock()
                if _queue_perm(schema.decode_reply(reader.sock.recv())) == perm:
                    got_shown = at - sent
                else:
                    reader.sock.send(read)
        replied.append(got_reply)
        shown.append(got_shown)
        time.sleep(0.002)
    return replied, shown


class Background:
    """A process re-registering BACKGROUND_BROKERS brokers unchanged at `rate`/s over 4
    DEALERs until stopped; `stop()` returns the registrations answered per second."""

    def __init__(self, endpoint: str, rate: float) -> None:
        mp = multiprocessing.get_context("spawn")
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(target=_background_main, args=(child, endpoint, rate),
                               daemon=True)
        self.proc.start()
        if not self.conn.poll(START_TIMEOUT_S) or self.conn.recv() != "ready":
            raise BenchError("the background registrations did not start")

    def stop(self) -> float:
        self.conn.send("stop")
        if not self.conn.poll(30):
            raise BenchError("the background registrations did not stop")
        outcome = self.conn.recv()
        self.proc.join(5)
        if isinstance(outcome, str):
            raise BenchError(outcome)
        return float(outcome)


def _background_bodies() -> list[bytes]:
    return [register_request(f"bg-{b}", broker_addr(2_000 + b),
                             [f"BgTopic{b}-{t}" for t in range(BACKGROUND_TOPICS)])
            for b in range(BACKGROUND_BROKERS)]


def _background_main(pipe: Connection, endpoint: str, rate: float) -> None:
    ctx = zmq.Context()
    socks = []
    for _ in range(4):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
    bodies = _background_bodies()
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    pipe.send("ready")
    began = time.monotonic()
    sent = answered = 0
    try:
        while not pipe.poll():
            due = int((time.monotonic() - began) * rate)
            while sent < due:
                socks[sent % 4].send(bodies[sent % len(bodies)])
                sent += 1
            wait = max(0.0, began + (sent + 1) / rate - time.monotonic())
            for sock, _ in poller.poll(int(wait * 1000) + 1):  # whole ms, rounded up: no spin
                while True:
                    try:
                        check_reply(sock.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    answered += 1
        pipe.send(answered / (time.monotonic() - began))
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        pipe.send(f"background registrations failed: {type(exc).__name__}: {exc}")
    finally:
        for sock in socks:
            sock.close(0)


def run_lag(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    samples: dict[tuple[int, str, str], list[float]] = {}  # (workers, load, what) -> per round
    rates: list[float] = []
    for w in (0, 2):
        with _closing(start(config, w, "lag")) as zns:
            with Session(zns.server.router) as session:
                session.call("register_broker", cluster="bench", broker_name=LAG_BROKER,
                             broker_id=0, broker_addr=broker_addr(1), topics={LAG_TOPIC: {}})
                session.pipeline(_background_bodies())
            writer = session_on(zns.server.router, 1 if w else None)
            reader = session_on(zns.server.router, 2 if w else None)
            try:
                for r in range(config.rounds):
                    for load in ("idle", f"{p.lag_rate:,.0f} registrations/s"):
                        background = Background(zns.server.router, p.lag_rate) \
                            if load != "idle" else None
                        try:
                            replied, shown = lag_samples(writer, reader, p.lag_samples)
                        finally:
                            if background is not None:
                                rates.append(background.stop())
                        for what, values in (("reply", replied), ("shown", shown)):
                            for q in (50, 99):
                                samples.setdefault((w, load, f"{what} p{q}"), []).append(
                                    percentile(values, q) * 1e6)
                    config.log(f"{label(w)} round {r + 1}: " + ", ".join(
                        f"{k[1]} {k[2]} {v[-1]:.0f} µs" for k, v in samples.items() if k[0] == w))
            finally:
                writer.close()
                reader.close()
    figures = []
    for (w, load, what), rounds in samples.items():
        if w == 0:
            continue
        name = {"reply": "write sent → its reply", "shown": "write sent → the other worker "
                "reads it"}[what.split()[0]]
        figures.append(Figure(f"{name} {what.split()[1]}, {load}, 2 workers", "µs", rounds,
                              "1 process", samples[(0, load, what)]))
    if rates:
        figures.append(Figure("background registrations answered", "req/s", rates,
                              note="all servers' rounds together: whether the load was met"))
    push = {w: push_latency.measure(config, p.push, "--workers", str(w)) for w in (0, 1, 2)}
    # --cpus: the state process beside worker 1 on the first CPU, worker 2 on the second.
    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    pinned = {w: push_latency.measure(config, p.push, "--workers", str(w), "--cpus", cpus)
              for w in (0, 1, 2)}
    # Changes apart, each after every process has gone to sleep: a real route change (a
    # broker dies, a permission changes) comes alone, not right behind the last one's event.
    apart = dataclasses.replace(p.push, subscribers=(1,), gap_s=APART_S)
    isolated = {w: push_latency.measure(config, apart, "--workers", str(w)) for w in (0, 1, 2)}
    # The default shape never paired (zns.core.pairing): what `--cpus auto` changes.
    unpaired = {"": push_latency.measure(config, p.push, "--workers", "1", "--cpus", "off"),
                f", changes {APART_S * 1000:g} ms apart": push_latency.measure(
                    config, apart, "--workers", "1", "--cpus", "off")}
    hops = [process_round_trips(p.push.changes) for _ in range(config.rounds)]
    for q in (50, 99):
        figures.append(Figure(
            f"bare round trip between two Python processes over a socketpair, p{q}", "µs",
            [percentile(h, q) * 1e6 for h in hops],
            note="the least a forwarded write's two hops (worker → state → worker) add"))
    for runs, cadence in ((push, ""), (isolated, f", changes {APART_S * 1000:g} ms apart")):
        for workers in (1, 2):
            for before, after in zip(runs[0], runs[workers]):
                if "max" in before.name:
                    continue
                extra = statistics.median(after.rounds) - statistics.median(before.rounds)
                figures.append(Figure(
                    f"{before.name}{cadence}, {label(workers)}", "µs",
                    after.rounds, "1 process", before.rounds,
                    note=f"{extra:+,.0f} µs against one process"
                    + (" (budget: +100 µs at p50)" if "p50" in before.name else "")
                    + (f"; {after.note}" if after.note else "")))  # not paired
        for before, after in zip(runs[0], unpaired[cadence]):
            if "max" in before.name:
                continue
            extra = statistics.median(after.rounds) - statistics.median(before.rounds)
            figures.append(Figure(
                f"{before.name}{cadence}, 1 worker, --cpus off", "µs", after.rounds,
                "1 process", before.rounds, note=f"{extra:+,.0f} µs against one process"))
    for workers in (0, 1, 2):  # pinned, against one process as it runs by default
        for before, after in zip(push[0], pinned[workers]):
            if "max" in before.name:
                continue
            extra = statistics.median(after.rounds) - statistics.median(before.rounds)
            shape = label(workers) if workers else "1 process"
            figures.append(Figure(
                f"{before.name}, {shape}, --cpus {cpus}", "µs", after.rounds,
                "1 process (not pinned)", before.rounds,
                note=f"{extra:+,.0f} µs against one process, not pinned"))
    method = LAG_METHOD.format(samples=p.lag_samples, rate=p.lag_rate,
                               brokers=BACKGROUND_BROKERS, topics=BACKGROUND_TOPICS,
                               changes=p.push.changes, apart_ms=APART_S * 1000,
                               subs=", ".join(map(str, p.push.subscribers)))
    return BenchResult("workers_lag", "Workers: replication lag and push latency", method,
                       figures)


# The other end of `process_round_trips`: echoes each byte until EOF, waiting in poll as a
# worker and the state process do.
_ECHO = """
import os, select, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
poller = select.poll()
poller.register(sock.fileno(), select.POLLIN)
while True:
    poller.poll()
    data = sock.recv(64)
    if not data:
        break
    sock.send(data)
"""


def process_round_trips(count: int, gap_s: float = 0.002) -> list[float]:
    """`count` round trips of one byte to another Python process over an AF_UNIX socketpair
    (the channel of a worker and the state process), each side waiting in poll, `gap_s`
    apart (as the push benchmark paces its changes): what two process wake-ups cost here."""
    ours, theirs = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-c", _ECHO, str(theirs.fileno())],
                            pass_fds=[theirs.fileno()])
    theirs.close()
    poller = select.poll()
    poller.register(ours.fileno(), select.POLLIN)
    times = []
    try:
        ours.send(b"x")  # the echo process started: its first answer
        poller.poll(10_000)
        ours.recv(64)
        for _ in range(count):
            time.sleep(gap_s)
            start = time.perf_counter()
            ours.send(b"x")
            poller.poll(10_000)
            if not ours.recv(64):
                raise BenchError("the echo process of process_round_trips died")
            times.append(time.perf_counter() - start)
    finally:
        ours.close()
        echo.wait(10)
    return times


LAG_METHOD = """
`zns serve --workers 2`, and `--workers 0` as the reference, one server at a time. Two ZNS/1
connections are opened until the kernel gave one to worker 1 (the *writer*: its `status` says
which worker answers) and one to worker 2 (the *reader*); with one process both are on it.
Each sample sends a route change (`wipe_write_perm` / `add_write_perm` in turn on a broker
hosting `LagTopic`) on the writer and at the same instant a `get_route` of `LagTopic` on the
reader, and resends the read as soon as its reply does not show the change yet. *Write sent →
its reply*: the writer's round trip (the state process applied it and the writer's worker can
read it). *Write sent → the other worker reads it*: the arrival of the first reader reply that
shows the change, so the replication lag (state applied → every worker applied) plus the
request's way to the state process, with a resolution of one read round trip. {samples}
samples a round, 2 ms apart. *Idle*: nothing else; *loaded*: another process re-registers
{brokers} ZNS/1 brokers ({topics} topics each, unchanged) at {rate:,.0f}/s over 4
connections meanwhile (their figure says how many were answered).

Push latency: bench/push_latency.py (its method: one SUB per subscriber socket, route
changes sent on one connection, the next only after every socket got the previous one; here
{changes} changes a round, {subs} subscribers) against `--workers 0`, `--workers 1` and
`--workers 2`; the subscribers' and the sender's connections land wherever the kernel puts them.
With workers, each server is measured once its state process and worker 1 are paired on one CPU
(`--cpus auto`, the default: they are after 3 light seconds), as it serves; one that has not
paired within 30 s (a machine never quiet) is measured unpinned, and its figures say so in a
note. The same `--workers 1` with `--cpus off` (never paired) follows each cadence's three.
Then the same three again with `--cpus` naming the machine's first two CPUs (the state process
and worker 1 pinned to the first, worker 2 to the second; one process to the first), each
against one process not pinned, as it runs by default. Then `--workers 0`, `1` and `2`
once more with 1 subscriber and the changes {apart_ms:g} ms apart: the sender waits that long
after each change's delivery, so every process has gone to sleep before the next one, as
before a real route change (a broker dies, a permission changes), which comes alone; back to
back, a change meets processes still busy with the last one. The servers run one after
another.

The *bare round trip between two Python processes* is the floor of what a forwarded write's
way adds to a push: one byte sent over an AF_UNIX socketpair to another Python process that
waits in poll and echoes it, and the answer awaited in poll the same way, {changes} times a
round, 2 ms apart (so each side has gone to sleep, as between route changes). It is all
system calls and wake-ups, no Python work: whatever runs between them in zns (decoding,
applying, encoding) comes on top.
"""


# --- workers_storm: reads while brokers register 10,000 topics ---------------------------


# The shapes the storm is run against: (name, workers, further arguments). The default
# shape is measured as it serves, paired (`--cpus auto`: zns.core.pairing), which the storm
# must make let go of its shared CPU; `--cpus off` is the same shape never paired.
STORM_SHAPES: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("1 process", 0, ()), ("1 worker (the default)", 1, ()),
    ("1 worker, --cpus off", 1, ("--cpus", "off")), ("2 workers", 2, ()))


def run_storm(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    topics = [f"StormTopic{i:05d}" for i in range(p.storm_topics)]
    storm = [register_request(f"storm-{k}", broker_addr(100 + k), topics,
                              topic_config={"read_queues": 8 - again, "write_queues": 8})
             for again in (0, 1) for k in range(p.storm_brokers)]
    names = [name for name, _, _ in STORM_SHAPES]
    p99: dict[str, list[float]] = {name: [] for name in names}
    worst: dict[str, list[float]] = {name: [] for name in names}
    took: dict[str, list[float]] = {name: [] for name in names}
    answered: dict[str, list[float]] = {name: [] for name in names}  # probe reads a second
    unpaired = {name: "" for name in names}  # a note when a round was not paired
    for r in range(config.rounds):
        for i, (name, w, args) in enumerate(STORM_SHAPES):
            if r % 2:  # rounds alternate the order
                i = len(STORM_SHAPES) - 1 - i
                name, w, args = STORM_SHAPES[i]
            # A directory of its own: a server would restore another's state (its KV file
            # and dump), whose topics would make the storm's registrations change nothing.
            with _closing(start(config, w, f"storm{r}-{i}", *args)) as zns, \
                    Session(zns.server.router) as session:
                # Every round waits for its own server's pairing; one not paired notes it.
                missed = wait_paired(zns.server, ("--workers", str(w), *args), config.quick)
                unpaired[name] = unpaired[name] or missed
                session.call("register_broker", cluster="bench", broker_name="probe-broker",
                             broker_id=0, broker_addr=broker_addr(1), topics={"ProbeTopic": {}})
                probes = [Probe(zns.server.router, "ProbeTopic") for _ in range(4)]
                for probe in probes:
                    probe.start()
                time.sleep(0.3)
                began = time.monotonic()
                session.pipeline(storm, in_flight=1)
                ended = time.monotonic()
                time.sleep(0.1)
                for probe in probes:
                    probe.stop()
                window = [rtt for probe in probes for sent, rtt in probe.samples
                          if began <= sent <= ended]
                if not window:
                    raise BenchError("the probes took no sample during the storm")
                p99[name].append(percentile(window, 99) * 1000)
                worst[name].append(max(window) * 1000)
                took[name].append(ended - began)
                answered[name].append(len(window) / (ended - began))
                config.log(f"{name} round {r + 1}: storm {took[name][-1]:.2f} s, read p99 "
                           f"{p99[name][-1]:.1f} ms, max {worst[name][-1]:.1f} ms, "
                           f"{len(window)} reads")
    figures = []
    one = names[0]
    for shape in names[1:]:
        # A round whose server was not paired (a machine never quiet) says so on every figure.
        note = unpaired[shape]
        figures += [
            Figure(f"get_route p99 during the storm, {shape}", "ms", p99[shape], one,
                   p99[one], note=note),
            Figure(f"get_route max during the storm, {shape}", "ms", worst[shape], one,
                   worst[one], note=note),
            Figure(f"the storm's registrations answered in, {shape}", "s", took[shape],
                   one, took[one], note=note),
            Figure(f"probe reads answered per second during the storm, {shape}", "reads/s",
                   answered[shape], one, answered[one],
                   note="; ".join(filter(None, [
                       "4 probes, each waiting for its reply, then 5 ms: 800/s at most",
                       note]))),
        ]
    method = STORM_METHOD.format(brokers=p.storm_brokers, topics=p.storm_topics,
                                 count=2 * p.storm_brokers)
    return BenchResult("workers_storm", "Workers: reads during a registration storm", method,
                       figures)


STORM_METHOD = """
A fresh `zns serve --workers 1` (the default) and `--workers 2`, and `--workers 0` as the
reference, each round (rounds alternate the order: 0, 1, 2 then 2, 1, 0). Four probes
(bench/harness.py's `Probe`, each its own ZNS/1 connection, wherever the kernel puts it)
send `get_route` for a one-broker topic every 5 ms and time each round trip; meanwhile one connection sends the storm: {brokers} brokers each
registering the same {topics:,} topics, then each again with other queue counts ({count}
registrations of {topics:,} topics, one in flight, as fast as they are answered). The figures
are the p99 and the longest of the probes' round trips sent while the storm lasted, how
long it lasted, and how many probe reads were answered per second of it (each probe waits
for its reply, then 5 ms: 800/s at most; reads a server holds back do not happen). Servers
of a shape that pairs begin the storm paired; one not paired within 30 s (a machine never
quiet) is measured unpinned, with a note. Rerun alone (after a change to the write path) with `.venv/bin/python -m
bench.workers workers_storm`.
"""


# --- workers_memory: the memory of every process at 1,000 brokers / 10,000 topics --------


def pss_kib(pid: int) -> int:
    """Proportional set size: each resident page divided by the processes that map it."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise BenchError(f"no Pss for pid {pid}")


PAGE_FRAME = (1 << 55) - 1  # /proc/<pid>/pagemap: bits 0-54 of an entry name the page frame
PAGE_PRESENT = 1 << 63


def resident_kib(pids: Sequence[int]) -> int:
    """The resident memory of a group of processes, each physical page counted once however
    many of them map it: the distinct page frames of their present pages
    (/proc/<pid>/pagemap; the frame numbers need CAP_SYS_ADMIN: 0 without it)."""
    frames: set[int] = set()
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for line in maps:
                low, high = (int(x, 16) for x in line.split()[0].split("-"))
                if line.rstrip().endswith("[vsyscall]"):
                    continue
                pagemap.seek(low // page * 8)
                entries = pagemap.read((high - low) // page * 8)
                for (entry,) in struct.iter_unpack("<Q", entries):
                    if entry & PAGE_PRESENT:
                        frames.add(entry & PAGE_FRAME)
    frames.discard(0)
    return len(frames) * page // 1024


def fill(addr: str, p: Params, stack: ExitStack) -> None:
    """Register p.mem_brokers brokers over connections kept open (every topic on 2 of them),
    then read every route once over 4 connections."""
    per_pair = p.mem_topics // (p.mem_brokers // 2)
    clients = []
    for b in range(p.mem_brokers):
        client = RemotingClient(addr)
        stack.callback(client.close)
        clients.append(client)
        first = b // 2 * per_pair
        reply = client.call(register_frame(b, [f"MemTopic{first + t:05d}"
                                               for t in range(per_pair)]))
        if reply.code != 0:
            raise BenchError(f"{addr} refused REGISTER_BROKER: {reply.code} {reply.remark}")
    topics = [f"MemTopic{t:05d}" for t in range(p.mem_brokers // 2 * per_pair)]
    frames = route_frames(topics, len(topics))
    readers = [RemotingClient(addr) for _ in range(4)]
    try:
        for at in range(0, len(frames), 4 * 256):
            batch = [frames[at + k * 256:at + (k + 1) * 256] for k in range(4)]
            pipelined(readers, batch)
    finally:
        for reader in readers:
            reader.close()


# RocketMQ 5.3.3's distribution/bin/runserver.sh on a JDK of 9 or later (its
# choose_gc_options; the same on any machine: the script has no rule for small ones), as
# options that override the interop harness's (tests/interop/rocketmq.py JVM_BASE and
# NAMESRV_HEAP; the last of two options wins). The harness's C1-only JIT, small stacks and
# disabled perf data are put back to the JVM's defaults, which the script keeps; its GC log
# goes to the run's folder, not /dev/shm.
STOCK_JVM = [
    "-XX:-UseSerialGC", "-XX:TieredStopAtLevel=4", "-XX:+UsePerfData", "-Xss1m",
    "-server", "-Xms4g", "-Xmx4g", "-XX:MetaspaceSize=128m", "-XX:MaxMetaspaceSize=320m",
    "-XX:+UseG1GC", "-XX:G1HeapRegionSize=16m", "-XX:G1ReservePercent=25",
    "-XX:InitiatingHeapOccupancyPercent=30", "-XX:SoftRefLRUPolicyMSPerMB=0",
    "-XX:-OmitStackTraceInFastThrow", "-XX:-UseLargePages",
]
JAVA_SMALL = "Java NameServer, the harness's JVM (64-128 MB heap, serial GC)"
JAVA_STOCK = "Java NameServer, runserver.sh's JVM (4 GB heap, G1)"


def start_stock_java(config: RunConfig, stack: ExitStack, tag: str) -> tuple[str, int]:
    """The Java NameServer as RocketMQ's start script runs it (STOCK_JVM), without the
    harness's class-data archive (made for its own options; the script has none)."""
    group = stack.enter_context(rocketmq.ProcessGroup(config.workdir / f"rocketmq-{tag}"))
    gc_log = config.workdir / f"rocketmq-{tag}" / "rmq_srv_gc_%p_%t.log"
    saved = os.environ.get(rocketmq.CDS_ENV)
    os.environ[rocketmq.CDS_ENV] = "0"
    try:
        ns = group.namesrv(jvm_args=[*STOCK_JVM, f"-Xlog:gc*:file={gc_log}:time,tags:"
                                                 "filecount=5,filesize=30M"])
    finally:
        if saved is None:
            del os.environ[rocketmq.CDS_ENV]
        else:
            os.environ[rocketmq.CDS_ENV] = saved
    config.log(f"Java NameServer (runserver.sh's JVM) at {ns.addr} up in {ns.ready_after:.1f} s")
    return ns.addr, ns.pid


def run_memory(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    reason = java_side(config, p)
    rss: dict[str, list[float]] = {}  # MiB, by "<shape>: <process>", one per round
    pss: dict[str, list[float]] = {}
    sums: dict[tuple[int, str], list[float]] = {}  # (workers, RSS|PSS|resident) -> MiB
    java: dict[str, list[float]] = {}  # JVM -> RSS, MiB
    for r in range(config.rounds):
        for w in WORKER_COUNTS:  # one at a time: none of them shares a page with another
            with ExitStack() as stack:
                zns = stack.enter_context(_closing(start(config, w, f"memory{r}")))
                fill(zns.remoting, p, stack)
                time.sleep(1.0)  # the workers' figures and any trim settle
                pids = zns.pids()
                for role, pid in pids.items():
                    rss.setdefault(f"{label(w)}: {role}", []).append(rss_kib(pid) / 1024)
                    pss.setdefault(f"{label(w)}: {role}", []).append(pss_kib(pid) / 1024)
                for what, mib in (
                        ("RSS", sum(rss_kib(pid) for pid in pids.values()) / 1024),
                        ("PSS", sum(pss_kib(pid) for pid in pids.values()) / 1024),
                        ("resident", resident_kib(list(pids.values())) / 1024)):
                    sums.setdefault((w, what), []).append(mib)
            config.log(f"round {r + 1}, {label(w)}: " + ", ".join(
                f"{what} {sums[w, what][-1]:.1f}" for what in ("RSS", "PSS", "resident"))
                + " MiB (resident: each page once)")
        if not reason:
            for name, starter, tag in ((JAVA_SMALL, start_java, f"memory{r}"),
                                       (JAVA_STOCK, start_stock_java, f"memory{r}-stock")):
                with ExitStack() as stack:
                    addr, pid = starter(config, stack, tag)
                    fill(addr, p, stack)
                    java.setdefault(name, []).append(rss_kib(pid) / 1024)
                    config.log(f"round {r + 1}, {name}: RSS {java[name][-1]:.1f} MiB")
    figures = [Figure(f"RSS: {role}", "MiB", mib) for role, mib in rss.items()]
    figures += [Figure(f"PSS: {role}", "MiB", mib) for role, mib in pss.items()]
    figures += [Figure(f"RSS: {name}", "MiB", mib) for name, mib in java.items()]
    for w in WORKER_COUNTS:
        shape = label(w) + (" (the default)" if w == 1 else "")
        figures.append(Figure(f"RSS of every process added up, {shape}", "MiB", sums[w, "RSS"]))
        figures.append(Figure(f"PSS of every process added up, {shape}", "MiB", sums[w, "PSS"]))
        for name in (JAVA_STOCK, JAVA_SMALL) if java else (JAVA_STOCK,):
            figures.append(Figure(
                f"memory of the whole (each page once), {shape}, against the {name}", "MiB",
                sums[w, "resident"], f"{name}: RSS" if java else "", java.get(name, []),
                # The budget is taken against the JVM RocketMQ's own start script runs;
                # the harness's small heap is a second reference (MEMORY_METHOD).
                Target("ratio", "<=", 0.25) if java and name == JAVA_STOCK else None,
                note="" if java else f"the Java side was skipped: {reason}"))
    method = MEMORY_METHOD.format(brokers=p.mem_brokers, topics=p.mem_topics,
                                  stock=" ".join(STOCK_JVM[4:]))
    return BenchResult("workers_memory", "Workers: memory of every process", method, figures)


MEMORY_METHOD = """
`zns serve --workers 0` (one process), `--workers 1` (the default: a state process and one
worker) and `--workers 2`, and RocketMQ 5.3.3's Java NameServer twice: with the interop
harness's JVM (tests/interop/rocketmq.py: `-Xms64m -Xmx128m`, serial GC; the full JIT, as in `workers_reads`) and with
the options RocketMQ's own start script gives it on JDK 17 (distribution/bin/runserver.sh,
`choose_gc_options` for Java 9 and later: `{stock}`, its GC log to a file; the script has no
rule for small machines, and this one has the RAM for the 4 GB heap). Each, started alone,
gets {brokers:,} brokers registered over remoting connections kept open, brokers 2k and
2k+1 hosting the same topics ({topics:,} topics, each on 2 brokers, 8 queues each), then every
route read once over remoting (so every cache is filled); 1 s later, for every process:
VmRSS (/proc/<pid>/status) and PSS (/proc/<pid>/smaps_rollup). *The whole* of zns is its
processes' resident memory with each physical page counted once, however many of them map
it (the distinct page frames of their present pages, /proc/<pid>/pagemap): the workers are
forked from the state process and share the pages neither has written since, so adding up
RSS counts those pages once per process. PSS added up counts them once too, but also splits
pages shared with programs outside zns (libc, libpython) among those, so it comes out lower.
The Java NameServer is one process: its RSS. Each round starts every server afresh, one at
a time; a ratio is the round's zns figure over the same round's JVM. Budget (issue 30): the
whole of zns under ¼ of the Java NameServer's RSS. The issue names no JVM options; the
budget is taken against the Java NameServer as RocketMQ 5.3.3 starts it (its runserver.sh),
what a fleet runs unless it tunes it. The harness's JVM, a heap of 128 MB chosen so that the
interop tests fit a small CI machine, is given beside it as a second reference, its ratios
without a budget (they are over ¼, even for one process).
"""


# --- workers_recovery: a worker's death, a state process's restart ------------------------


def run_recovery(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    per_pair = p.mem_topics // (p.mem_brokers // 2)
    registrations = [register_request(
        f"rec-{b}", broker_addr(b), [f"RecTopic{b // 2 * per_pair + t}" for t in range(per_pair)])
        for b in range(p.mem_brokers)]
    status = request("status", id=1)
    route = request("get_route", id=1, topic="RecTopic0")
    kills: list[float] = []
    answered: list[float] = []  # the kill → a new connection answered by any worker
    restarts: dict[int, list[float]] = {0: [], 2: []}
    stops: dict[int, list[float]] = {0: [], 2: []}
    for r in range(config.rounds):
        for w in ((2, 0) if r % 2 == 0 else (0, 2)):
            ports = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
            args = ["--router", ports[0], "--pub", ports[1]]
            zns = start(config, w, f"recovery{r}", *args)
            try:
                with Session(ports[0]) as session:
                    session.pipeline(registrations)
                for k in range(p.kills if w else 0):
                    slot = 1 + k % w
                    pid = zns.worker_pid(slot)
                    killed = time.monotonic()
                    os.kill(pid, signal.SIGKILL)
                    anyone = 0.0
                    while True:
                        reply = ask(ports[0], status)
                        if isinstance(reply, schema.StatusReply) and not anyone:
                            anyone = time.monotonic() - killed
                        if isinstance(reply, schema.StatusReply) and reply.worker == slot:
                            break
                        if time.monotonic() - killed > 30:
                            raise BenchError(f"worker {slot} did not come back in 30 s")
                    kills.append(time.monotonic() - killed)
                    answered.append(anyone)
                    if zns.worker_pid(slot) == pid:
                        raise BenchError(f"worker {slot} answered as pid {pid} after its kill")
                    got = ask(ports[0], route, 2000)
                    if not isinstance(got, schema.GetRouteReply):
                        raise BenchError(f"after worker {slot}'s kill get_route answered {got}")
                    config.log(f"worker {slot} killed: answering again {kills[-1]:.3f} s later")
                    time.sleep(1.0)
                stopping = time.monotonic()
                zns.server.proc.send_signal(signal.SIGTERM)
                zns.server.proc.wait(30)
                stops[w].append(time.monotonic() - stopping)
            finally:
                zns.server.stop()
            began = time.monotonic()
            first: list[float] = []
            poller = threading.Thread(target=_first_route, args=(ports[0], route, first),
                                      daemon=True)
            poller.start()
            zns = start(config, w, f"recovery{r}", *args)
            try:
                poller.join(60)
                if not first:
                    raise BenchError("no route answered within 60 s of the restart")
                restarts[w].append(first[0] - began)
            finally:
                zns.server.stop()
            config.log(f"{label(w)} round {r + 1}: SIGTERM → exit {stops[w][-1]:.2f} s, "
                       f"start → first route {restarts[w][-1]:.2f} s")
    figures = []
    if kills:
        figures.append(Figure("worker SIGKILL → its slot answers a new connection", "s",
                              kills, note=f"{len(kills)} kills in all; p99 (here the max) "
                              f"{max(kills):.3f} s"))
        figures.append(Figure("worker SIGKILL → a new connection answered (by any worker)", "s",
                              answered, note="the kernel gives new connections to the live "
                              "workers meanwhile"))
    figures += [
        Figure("state process SIGTERM + a new start → first route answered, 2 workers", "s",
               restarts[2], "1 process", restarts[0]),
        Figure("SIGTERM → the state process exited (workers stopped, dump written), 2 workers",
               "s", stops[2], "1 process", stops[0]),
    ]
    method = RECOVERY_METHOD.format(brokers=p.mem_brokers, topics=p.mem_topics, kills=p.kills)
    return BenchResult("workers_recovery", "Workers: a worker's death, a state restart",
                       method, figures)


def _first_route(endpoint: str, body: bytes, out: list[float]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = ask(endpoint, body, 100)
        if isinstance(reply, schema.GetRouteReply):
            out.append(time.monotonic())
            return
        time.sleep(0.005)


RECOVERY_METHOD = """
`zns serve --workers 2`, and `--workers 0` as the reference, on fixed loopback ports, holding
{brokers:,} ZNS/1 brokers and {topics:,} topics (each on 2 brokers). *Worker death*: {kills}
times a round, a worker (1 and 2 in turn, 1 s apart) is sent SIGKILL; from then a new ZNS/1
connection asks `status` (200 ms to answer) until one is answered by that worker's slot
(the `worker` field), i.e. its replacement took the port; then a route is read; the first
of these connections answered at all (by the other worker) is timed too. *State
restart*: SIGTERM to the state process (it stops its workers and writes its dump), then the
same command again; from its exec, a new connection every 5 ms asks `get_route` until one is
answered with the route (warm: from the dump). These connections retry a refused connect
every 5 ms. The abort of a worker by a peer (rather than
SIGKILL) is bench/abort_recovery.py's.
"""


def with_load(fn: BenchFn) -> BenchFn:
    """`fn`, its method followed by the machine's load average at its start and end: these run
    on a 2-core machine that other jobs share, and say so."""
    def run(config: RunConfig) -> BenchResult:
        before = os.getloadavg()
        result = fn(config)
        after = os.getloadavg()
        result.method += (
            f"\n\nMachine: {os.cpu_count()} cores shared with other jobs; load average "
            f"(1, 5, 15 min) {', '.join(f'{x:.2f}' for x in before)} when this began, "
            f"{', '.join(f'{x:.2f}' for x in after)} when it ended.")
        return result
    return run


BENCHMARKS: dict[str, BenchFn] = {
    "workers_reads": with_load(run_reads), "workers_lag": with_load(run_lag),
    "workers_storm": with_load(run_storm), "workers_memory": with_load(run_memory),
    "workers_recovery": with_load(run_recovery),
}


if __name__ == "__main__":
    raise SystemExit(cli(BENCHMARKS, default_out=BENCH_DIR))

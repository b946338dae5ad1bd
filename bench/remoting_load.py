"""Benchmark: the remoting listener under fleet load (issue 21 items 2, 8 and 9).

Three shapes, each against its budget:

- read flood: unprivileged connections (the listener restricted with
  `--remoting-brokers 10.0.0.0/8 --remoting-admins 10.0.0.0/8`, so loopback
  may write nothing) pipelining GET_ROUTEINFO_BY_TOPIC and GET_ALL_TOPIC_LIST
  over 5,000 topics, from two load processes. Meanwhile a ZNS/1 client asks
  `get_route` every 20 ms, a subscriber times the `hb` events, and ZNS/1
  brokers with a 3 s timeout register and fall silent: their expiry events'
  lateness is measured. The server log is searched for stalls;
- closes: N brokers each registered over their own remoting connection,
  sharing 10 topics, all connections closed at once (a network blip): the time
  until every `removed` event arrived, the longest ZNS/1 request meanwhile, and
  the server's CPU time per close for two N (it must not grow with N);
- idle connections: sequential ZNS/1 `get_route` throughput with 4,096 idle
  remoting connections open (from 8 loopback source addresses) against none,
  and how long a new ZNS/1 client waits for its first answer after they all
  close.

`BENCH_ZNS_REPO=/path/to/another/checkout` runs that checkout's server (the
"before" figures in bench/results.md).

    python -m bench.remoting_load [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import json
import multiprocessing
import re
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import zmq

from bench.harness import (
    BenchError, ServerProcess, percentile, register_request, request, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core import schema
from zns.core.remoting import RemotingCommand, body_crc32, encode_command

VERSION = 479
GET_ROUTE, GET_ALL_TOPIC_LIST, REGISTER_BROKER = 105, 206, 103
RESTRICTED = ("--remoting-brokers", "10.0.0.0/8", "--remoting-admins", "10.0.0.0/8")
REMOTING_LINE = re.compile(r"RocketMQ remoting listener on (\S+)")


@dataclass(frozen=True)
class Params:
    flood_s: float
    topics: int
    route_conns: int
    list_conns: int
    victims: int
    close_counts: tuple[int, ...]
    idle: int
    probe_s: float
    victim_timeout_ms: int  # each silent broker's heartbeat timeout
    settle_s: float  # the fixed pauses (subscriber joining, connections accepted) scale by this


FULL = Params(flood_s=20, topics=5000, route_conns=16, list_conns=14, victims=150,
              close_counts=(500, 2000), idle=4096, probe_s=3.0, victim_timeout_ms=3000,
              settle_s=1.0)
# A smoke run: every phase and figure, shorter (1 s victims in a 2.5 s flood, halved pauses).
QUICK = Params(flood_s=2.5, topics=200, route_conns=4, list_conns=2, victims=4,
               close_counts=(50, 100), idle=200, probe_s=0.3, victim_timeout_ms=1000,
               settle_s=0.5)

METHOD = """
`zns serve --remoting 127.0.0.1:0` in its own process, driven from this one and two
load processes, all on loopback.

*Read flood* ({route} connections pipelining GET_ROUTEINFO_BY_TOPIC, 32 in flight
each, and {lists} pipelining GET_ALL_TOPIC_LIST, 4 in flight each, over {topics:,} topics
registered by one ZNS/1 broker, for {flood:g} s; the listener restricted with
`--remoting-brokers 10.0.0.0/8 --remoting-admins 10.0.0.0/8`): `hb` gap is the longest
time between two `hb` events at a subscriber (interval 1 s); expiry lateness is when
the `removed` event of a silent ZNS/1 broker ({victim_s:g} s timeout, {victims} of them registered
evenly during the flood, all due before it ends) arrived after its deadline, p99
(nearest rank) and max; `get_route` is a ZNS/1 request every
20 ms; stalls are the server's "stalled" warnings.

*Closes*: N brokers register over their own remoting connection (10 shared topics),
then every connection is closed at once; "removed within" is the time until the last
`removed` event arrived, "longest request" the slowest ZNS/1 `get_route` (one every
20 ms) meanwhile, CPU per close the server's CPU time over that span divided by N.

*Idle*: {idle:,} remoting connections from 8 loopback source addresses that send nothing;
ZNS/1 throughput is sequential `get_route` requests for {probe:g} s (the reference: the mean
of the rate before they opened and after they closed); "first answer after
they close" is how long a new ZNS/1 client waited for `status` once all were closed.
"""


def start_zns_remoting(config: RunConfig, *args: str) -> tuple[ServerProcess, str]:
    zns = start_zns(config.workdir / f"zns-{time.monotonic_ns()}", "--remoting", "127.0.0.1:0",
                    *args)
    match = REMOTING_LINE.search(zns.log_path.read_text(errors="replace"))
    if not match:
        zns.stop()
        raise BenchError(f"zns logged no remoting endpoint: {zns.log_path.read_text()[-2000:]}")
    return zns, match.group(1)


def hostport(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def command(code: int, opaque: int, ext: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    return encode_command(RemotingCommand(code=code, version=VERSION, opaque=opaque,
                                          ext_fields=ext, body=body))


def register_frame(i: int, topics: list[str]) -> bytes:
    table = {t: {"topicName": t, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
             for t in topics}
    body = json.dumps({"topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 1},
        "topicConfigTable": table}, "filterServerList": []}).encode()
    addr = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:10911"
    ext = {"brokerId": "0", "bodyCrc32": str(body_crc32(body)), "clusterName": "BenchCluster",
           "brokerAddr": addr, "haServerAddr": addr, "compressed": "false",
           "brokerName": f"closing-{i}", "heartbeatTimeoutMillis": "120000"}
    return command(REGISTER_BROKER, i + 1, ext, body)


def raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- the flood's load processes ----------------------------------------------------------------


def _flood_main(addr: str, jobs: list[tuple[bytes, int]], seconds: float, out: Connection) -> None:
    """Each job is one connection: (request frame, requests in flight). Sends the count of
    replies read back through `out`."""
    raise_open_files()
    sel = selectors.DefaultSelector()
    state: dict[socket.socket, list[Any]] = {}
    for frame, depth in jobs:
        sock = socket.create_connection(hostport(addr))
        sock.setblocking(False)
        state[sock] = [frame, bytearray(), depth, bytearray(frame * depth)]
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    replies = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        for key, events in sel.select(0.1):
            sock = key.fileobj
            frame, buf, _, unsent = state[sock]
            if events & selectors.EVENT_WRITE and unsent:
                try:
                    del unsent[:sock.send(unsent)]
                except BlockingIOError:
                    pass
            if events & selectors.EVENT_READ:
                try:
                    data = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    raise BenchError("the server closed a load connection")
                buf += data
                while len(buf) >= 4:
                    size = int.from_bytes(buf[:4], "big")
                    if len(buf) < 4 + size:
                        break
                    del buf[:4 + size]
                    replies += 1
                    unsent += frame  # one more in flight for each answered
            sel.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if unsent else 0))
    out.send(replies)
    for sock in state:
        sock.close()


class Hb(threading.Thread):
    """Collects (arrival, channel, event) from the server's PUB."""

    def __init__(self, pub: str, channels: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        for channel in channels:
            self.sub.setsockopt(zmq.SUBSCRIBE, channel)
        self.sub.connect(pub)
        self.seen: list[tuple[float, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if self.sub.poll(100):
                channel, body = self.sub.recv_multipart()
                self.seen.append((time.monotonic(), schema.decode_event(body)))
        self.sub.close(0)

    def hbs(self) -> list[float]:
        return [at for at, e in self.seen if isinstance(e, schema.HbEvent)]

    def removed(self) -> dict[str, float]:
        return {e.broker_addr: at for at, e in self.seen
                if isinstance(e, schema.BrokerEvent) and e.change == "removed"}


class Prober(threading.Thread):
    """A ZNS/1 client asking `get_route` every 20 ms; latencies in ms."""

    def __init__(self, router: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.router, self.topic = router, topic
        self.latencies: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.router)
        rid = 0
        while not self.done.is_set():
            rid += 1
            started = time.monotonic()
            sock.send(request("get_route", id=rid, topic=self.topic))
            while True:  # a reply to an earlier, timed-out request is skipped
                if not sock.poll(30_000):
                    raise BenchError("no get_route reply within 30 s")
                if schema.decode_reply(sock.recv()).id == rid:
                    break
            self.latencies.append((time.monotonic() - started) * 1000)
            self.done.wait(0.02)
        sock.close(0)


def zns1_call(router: str, body: bytes, timeout_s: float = 30.0) -> Any:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(router)
    try:
        sock.send(body)
        if not sock.poll(int(timeout_s * 1000)):
            raise BenchError("no ZNS/1 reply")
        return schema.decode_reply(sock.recv())
    finally:
        sock.close(0)


# --- the three shapes ---------------------------------------------------------------------------


def flood_round(config: RunConfig, p: Params) -> dict[str, float]:
    zns, addr = start_zns_remoting(config, *RESTRICTED)
    with zns:
        topics = [f"FloodTopic{i:05d}" for i in range(p.topics)]
        zns1_call(zns.router, register_request("big", "10.9.9.9:10911", topics,
                                               heartbeat_timeout_ms=600_000, id=1))
        hb = Hb(zns.pub, [schema.HB_CHANNEL, schema.BROKER_PREFIX])
        hb.start()
        time.sleep(0.5 * p.settle_s)
        route_frame = command(GET_ROUTE, 1, {"topic": topics[0]})
        list_frame = command(GET_ALL_TOPIC_LIST, 2)
        jobs = [(route_frame, 32)] * p.route_conns + [(list_frame, 4)] * p.list_conns
        pipes, procs = [], []
        ctx = multiprocessing.get_context("fork")
        for half in (jobs[0::2], jobs[1::2]):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_flood_main, args=(addr, half, p.flood_s, theirs), daemon=True)
            proc.start()
            pipes.append(mine)
            procs.append(proc)
        prober = Prober(zns.router, topics[1])
        prober.start()
        started = time.monotonic()
        deadlines: dict[str, float] = {}
        # Silent ZNS/1 brokers registered during the flood, on a fixed schedule, all due
        # (victim_s later) before it ends: enough of them that a p99 is not just the maximum.
        victim_s = p.victim_timeout_ms / 1000
        spacing = (p.flood_s - 1.5 - victim_s) / max(1, p.victims)
        for v in range(p.victims):
            time.sleep(max(0.0, started + 0.5 + v * spacing - time.monotonic()))
            victim = f"10.8.0.{v + 1}:10911"
            zns1_call(zns.router, register_request(f"victim-{v}", victim, [f"V{v}"],
                                                   heartbeat_timeout_ms=p.victim_timeout_ms,
                                                   id=2))
            deadlines[victim] = time.monotonic() + victim_s
        replies = sum(pipe.recv() for pipe in pipes)
        elapsed = time.monotonic() - started
        for proc in procs:
            proc.join(10)
        time.sleep(p.settle_s)
        prober.done.set()
        prober.join(40)
        hb.done.set()
        hb.join(5)
        log = zns.log_path.read_text(errors="replace")
    removed = hb.removed()
    lateness = [(removed.get(a, time.monotonic() + 60) - d) * 1000 for a, d in deadlines.items()]
    beats = hb.hbs()
    gaps = [b - a for a, b in zip(beats, beats[1:])] or [float("inf")]
    return {"hb_gap_s": max(gaps), "expiry_late_p99_ms": percentile(lateness, 99),
            "expiry_late_max_ms": max(lateness),
            "get_route_p50_ms": percentile(prober.latencies, 50),
            "get_route_max_ms": max(prober.latencies),
            "stalls": float(log.count("stalled")), "remoting_rps": replies / elapsed}


def closes_round(config: RunConfig, p: Params, n: int) -> dict[str, float]:
    zns, addr = start_zns_remoting(config)
    shared = [f"Shared{i}" for i in range(10)]
    socks: list[socket.socket] = []
    with zns:
        hb = Hb(zns.pub, [schema.BROKER_PREFIX])
        hb.start()
        for i in range(n):  # from 8 source addresses: within the per-address cap
            sock = socket.socket()
            sock.bind((f"127.0.0.{2 + i % 8}", 0))
            sock.connect(hostport(addr))
            sock.sendall(register_frame(i, shared))
            socks.append(sock)
        for sock in socks:  # every registration answered
            sock.settimeout(300)
            size = int.from_bytes(_recv_exactly(sock, 4), "big")  # (timeout: 300 s)
            _recv_exactly(sock, size)
        prober = Prober(zns.router, shared[0])
        prober.start()
        time.sleep(0.5 * p.settle_s)
        cpu_before = zns.cpu_seconds()
        closed_at = time.monotonic()
        for sock in socks:
            sock.close()
        deadline = closed_at + 120
        while len(hb.removed()) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        removed = hb.removed()
        all_removed = (max(removed.values()) - closed_at) if len(removed) >= n else float("inf")
        cpu = zns.cpu_seconds() - cpu_before
        time.sleep(0.2 * p.settle_s)
        prober.done.set()
        prober.join(40)
        hb.done.set()
        hb.join(5)
    during = [lat for lat in prober.latencies]
    return {"removed_s": all_removed, "longest_ms": max(during),
            "cpu_per_close_ms": cpu * 1000 / n}


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise BenchError("the server closed a registering connection")
        data += chunk
    return bytes(data)


def _throughput(router: str, topic: str, seconds: float) -> float:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(router)
    body = request("get_route", id=1, topic=topic)
    count, stop = 0, time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < stop:
        sock.send(body)
        if not sock.poll(30_000):
            raise BenchError("no get_route reply within 30 s")
        sock.recv()
        count += 1
    rate = count / (time.monotonic() - started)
    sock.close(0)
    return rate


def idle_round(config: RunConfig, p: Params) -> dict[str, float]:
    zns, addr = start_zns_remoting(config)
    host, port = hostport(addr)
    with zns:
        zns1_call(zns.router, register_request("idle-b", "10.7.0.1:10911", ["IdleTopic"],
                                               heartbeat_timeout_ms=600_000, id=1))
        without = _throughput(zns.router, "IdleTopic", p.probe_s)
        socks = []
        for i in range(p.idle):
            sock = socket.socket()
            sock.bind((f"127.0.0.{2 + i % 8}", 0))
            sock.connect((host, port))
            socks.append(sock)
        time.sleep(2.0 * p.settle_s)  # accepted
        probe = command(GET_ROUTE, 7, {"topic": "IdleTopic"})
        socks[-1].sendall(probe)  # the last one accepted is served (so all were accepted)
        socks[-1].settimeout(30)
        _recv_exactly(socks[-1], int.from_bytes(_recv_exactly(socks[-1], 4), "big"))
        with_idle = _throughput(zns.router, "IdleTopic", p.probe_s)
        for sock in socks:
            sock.close()
        closed_at = time.monotonic()
        reply = zns1_call(zns.router, request("status", id=3), timeout_s=60)
        first_answer = time.monotonic() - closed_at
        assert isinstance(reply, schema.StatusReply), reply
        time.sleep(p.settle_s)
        after = _throughput(zns.router, "IdleTopic", p.probe_s)  # none open again
    return {"without_rps": (without + after) / 2, "with_rps": with_idle,
            "first_answer_s": first_answer}


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    raise_open_files()
    flood = [flood_round(config, p) for _ in range(config.rounds)]
    config.log(f"flood: {flood}")
    closes = {n: [closes_round(config, p, n) for _ in range(config.rounds)] for n in p.close_counts}
    config.log(f"closes: {closes}")
    idle = [idle_round(config, p) for _ in range(config.rounds)]
    config.log(f"idle: {idle}")

    def col(rounds: list[dict[str, float]], key: str) -> list[float]:
        return [r[key] for r in rounds]

    small, big = p.close_counts
    figures = [
        Figure("read flood: longest hb gap (interval 1 s)", "s", col(flood, "hb_gap_s"),
               target=Target("value", "<=", 2.0)),
        Figure(f"read flood: expiry lateness p99 of {p.victims} silent brokers", "ms",
               col(flood, "expiry_late_p99_ms"), target=Target("value", "<=", 100)),
        Figure(f"read flood: expiry lateness, max of {p.victims} silent brokers", "ms",
               col(flood, "expiry_late_max_ms")),
        Figure("read flood: ZNS/1 get_route p50", "ms", col(flood, "get_route_p50_ms"),
               target=Target("value", "<=", 50)),
        Figure("read flood: ZNS/1 get_route max", "ms", col(flood, "get_route_max_ms")),
        Figure("read flood: stalls reported", "", col(flood, "stalls"),
               target=Target("value", "<=", 0)),
        Figure("read flood: remoting replies", "req/s", col(flood, "remoting_rps")),
        Figure(f"{big:,} connections closing at once: all removed within", "s",
               col(closes[big], "removed_s"), target=Target("value", "<=", 2.0)),
        Figure(f"{big:,} connections closing at once: longest ZNS/1 request meanwhile", "ms",
               col(closes[big], "longest_ms"), target=Target("value", "<=", 300)),
        Figure(f"server CPU per close, {big:,} connections", "ms",
               col(closes[big], "cpu_per_close_ms"), f"{small:,} connections",
               col(closes[small], "cpu_per_close_ms"), target=Target("ratio", "<=", 2.0),
               note="must not grow with the number of connections"),
        Figure(f"ZNS/1 sequential get_route with {p.idle:,} idle remoting connections", "req/s",
               col(idle, "with_rps"), "none open", col(idle, "without_rps"),
               target=Target("ratio", ">=", 0.8)),
        Figure(f"first answer to a new ZNS/1 client after {p.idle:,} close", "s",
               col(idle, "first_answer_s"), target=Target("value", "<=", 1.0)),
    ]
    method = METHOD.format(route=p.route_conns, lists=p.list_conns, topics=p.topics,
                           flood=p.flood_s, victims=p.victims, victim_s=p.victim_timeout_ms / 1000,
                           idle=p.idle, probe=p.probe_s)
    return BenchResult("remoting_load", "Remoting listener under fleet load (issue 21 items 2, 8, 9)",
                       method, figures)


BENCHES: dict[str, Callable[[RunConfig], BenchResult]] = {"remoting_load": run}


if __name__ == "__main__":
    raise SystemExit(cli(BENCHES))

"""Followers (`--followers` on a NameServer's workers, `--follow` on another host): what a
read replica costs, measured on this host over loopback TCP with CURVE (issue 30's stretch).

One NameServer with 2 workers, CURVE on, feeding followers; one follower (CURVE on too, the
same keys, so that both are read alike). Per round:

- replication lag: a route change written on worker 1, read back at once and again until it
  shows, on worker 2 and on the follower (the same write for both);
- push latency: the same change's event, at a subscriber of the NameServer and at one of the
  follower;
- CPU per read: pipelined `get_route`s on worker 2 and on the follower, the CPU of each
  process over them;
- a follower's start at 1,000 brokers and 10,000 topics: from its process's start to its
  first route answer (the state transfer included), the state's size, and its memory next
  to a worker's.

    python -m bench.followers [--quick] [--rounds N] [--out DIR]

Not in `make bench`: run by hand; a run (not --quick) replaces its section of
bench/results.md and keeps the others.
"""

from __future__ import annotations

import re
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import zmq

from bench.harness import (
    LOOPBACK, BenchError, ServerProcess, Session, broker_addr, check_reply, cpu_seconds,
    percentile, request, rss_kib, start_zns, wait_log,
)
from bench.remoting import REMOTING_LINE
from bench.report import BENCH_DIR, BenchResult, Figure, RunConfig, cli
from bench.workers import (
    FULL, LAG_BROKER, LAG_TOPIC, QUICK, WORKER_LINE, fill, lag_samples, session_on,
    with_load,
)
from zns.core import schema
from zns.drivers.security import apply_client_keys, client_keys, write_keypair

_FOLLOWERS_LINE = re.compile(r"feeding followers on (\S+)")
_STATE_LINE = re.compile(r"followers: a state of (\d+) bytes .* \((\d+) steps, the longest "
                         r"([\d.]+) ms\)")
READS = 20_000  # per round and process, pipelined (QUICK: 500)
CHANGES = 300  # route changes per round for lag and push (QUICK: 20)
APART_S = 0.005
HOUR_MS = 3_600_000


class Keys:
    def __init__(self, directory: Path) -> None:
        listed, followers = directory / "listed", directory / "followers"
        self.server, self.server_secret = write_keypair(directory, "server")
        public, self.bench = write_keypair(directory, "bench")
        listed.mkdir()
        (listed / "bench.key").write_bytes(Path(public).read_bytes())
        followers.mkdir()
        self.followers = []
        for n in range(2):
            public, secret = write_keypair(directory, f"follower{n}")
            (followers / f"follower{n}.key").write_bytes(Path(public).read_bytes())
            self.followers.append(secret)
        self.listed, self.followers_dir = str(listed), str(followers)


def start_follower(config: RunConfig, keys: Keys, endpoint: str, n: int) -> ServerProcess:
    return start_zns(config.workdir / f"follower{n}-{time.monotonic_ns()}", "--follow", endpoint,
                     "--follow-server-key", keys.server, "--follow-keypair", keys.followers[n],
                     "--curve-secret", keys.server_secret, "--clients", "listed",
                     "--clients-keys", keys.listed)


def push_samples(writer: Session, subs: list[zmq.Socket], count: int) -> list[list[float]]:
    """`count` route changes on `writer`, APART_S apart: per subscriber, write sent → the
    change's event there, in s."""
    changes = [request("wipe_write_perm", broker_name=LAG_BROKER),
               request("add_write_perm", broker_name=LAG_BROKER)]
    times: list[list[float]] = [[] for _ in subs]
    poller = zmq.Poller()
    for sub in subs:
        poller.register(sub, zmq.POLLIN)
    poller.register(writer.sock, zmq.POLLIN)
    for i in range(count):
        sent = time.monotonic()
        writer.sock.send(changes[i % 2])
        waiting = set(range(len(subs)))
        replied = False
        while waiting or not replied:
            ready = dict(poller.poll(5_000))
            if not ready:
                raise BenchError(f"change {i}: nothing within 5 s (subscribers still waiting: "
                                 f"{sorted(waiting)}, replied: {replied})")
            if writer.sock in ready:
                check_reply(writer.sock.recv())
                replied = True
            for k in list(waiting):
                if subs[k] in ready:
                    channel, _ = subs[k].recv_multipart()
                    if channel.startswith(b"route/"):
                        times[k].append(time.monotonic() - sent)
                        waiting.discard(k)
        time.sleep(APART_S)
    return times


def reads_cpu(session: Session, pid: int, reads: int) -> float:
    """CPU µs per pipelined get_route of process `pid`."""
    body = request("get_route", topic=LAG_TOPIC)
    before = cpu_seconds(pid)
    session.pipeline([body] * reads)
    return (cpu_seconds(pid) - before) / reads * 1e6


def run_followers(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    reads = 500 if config.quick else READS
    changes = 20 if config.quick else CHANGES
    keys = Keys(config.workdir / "keys")
    ctx = zmq.Context.instance()  # every Session's: CURVE with the bench key from here on
    apply_client_keys(ctx, client_keys(keys.server, keys.bench))
    rounds: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rounds.setdefault(name, []).append(value)

    for r in range(config.rounds):
        with ExitStack() as stack:
            main = start_zns(config.workdir / f"main{r}", "--workers", "2", "--curve-secret",
                             keys.server_secret, "--brokers-keys", keys.listed, "--admins-keys",
                             keys.listed, "--clients", "listed", "--clients-keys", keys.listed,
                             "--followers", LOOPBACK, "--followers-keys", keys.followers_dir,
                             "--remoting", "127.0.0.1:0")
            stack.callback(main.stop)
            endpoint = wait_log(main, _FOLLOWERS_LINE)
            started = time.monotonic()
            follower = start_follower(config, keys, endpoint, 0)
            stack.callback(follower.stop)
            add("start, empty", time.monotonic() - started)
            with Session(main.router) as session:
                session.call("register_broker", cluster="bench", broker_name=LAG_BROKER,
                             broker_id=0, broker_addr=broker_addr(1), topics={LAG_TOPIC: {}},
                             heartbeat_timeout_ms=HOUR_MS)  # it sends no heartbeat
            writer = session_on(main.router, 1)
            on_worker = session_on(main.router, 2)
            on_follower = Session(follower.router)
            for session in (writer, on_worker, on_follower):
                stack.callback(session.close)
            for name, reader in (("worker 2", on_worker), ("follower", on_follower)):
                _, shown = lag_samples(writer, reader, changes)
                for q in (50, 99):
                    add(f"lag {name} p{q}", percentile(shown, q) * 1e6)
            subs = []
            for pub in (main.pub, follower.pub):
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt(zmq.SUBSCRIBE, b"route/" + LAG_TOPIC.encode())
                sub.connect(pub)
                stack.callback(sub.close)
                subs.append(sub)
            time.sleep(0.5)
            push = push_samples(writer, subs, changes)
            for name, times in zip(("NameServer", "follower"), push):
                for q in (50, 99):
                    add(f"push {name} p{q}", percentile(times, q) * 1e6)
            worker_pid = int(dict(WORKER_LINE.findall(main.log_path.read_text()))["2"])
            add("cpu worker", reads_cpu(on_worker, worker_pid, reads))
            add("cpu follower", reads_cpu(on_follower, follower.proc.pid, reads))
            # A second follower, joining a NameServer that holds the whole table.
            fill(wait_log(main, REMOTING_LINE), p, stack)
            started = time.monotonic()
            second = start_follower(config, keys, endpoint, 1)
            stack.callback(second.stop)
            with Session(second.router) as session:
                reply = session.call("get_route", topic="MemTopic00000")
                if not isinstance(reply, schema.GetRouteReply):
                    raise BenchError(f"the second follower answered {reply}")
            add("start, full", time.monotonic() - started)
            size, steps, longest = max((int(size), int(steps), float(ms)) for size, steps, ms
                                       in _STATE_LINE.findall(main.log_path.read_text()))
            add("state", size / 1024)
            add("steps", steps)
            add("dump", longest)
            add("rss follower", rss_kib(second.proc.pid) / 1024)
            add("rss worker", rss_kib(worker_pid) / 1024)
            config.log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.1f}"
                                                      for k, v in rounds.items()))
    figures = [
        Figure("route change on worker 1 → shown on the follower, p50", "µs",
               rounds["lag follower p50"], "→ shown on worker 2", rounds["lag worker 2 p50"]),
        Figure("route change on worker 1 → shown on the follower, p99", "µs",
               rounds["lag follower p99"], "→ shown on worker 2", rounds["lag worker 2 p99"]),
        Figure(f"push: route change → its event at the follower's subscriber, p50 (changes "
               f"{APART_S * 1000:g} ms apart)", "µs", rounds["push follower p50"],
               "at the NameServer's subscriber", rounds["push NameServer p50"]),
        Figure("push: route change → its event at the follower's subscriber, p99", "µs",
               rounds["push follower p99"], "at the NameServer's subscriber",
               rounds["push NameServer p99"]),
        Figure("CPU per get_route in the follower (pipelined)", "µs", rounds["cpu follower"],
               "in worker 2", rounds["cpu worker"]),
        Figure("a follower's start → serving, empty NameServer", "s", rounds["start, empty"],
               note="a whole interpreter's start included"),
        Figure(f"a follower's start → its first route answer, at {p.mem_brokers:,} brokers and "
               f"{p.mem_topics:,} topics", "s", rounds["start, full"],
               "empty", rounds["start, empty"], note="the state transfer included"),
        Figure(f"the state a follower is sent, at {p.mem_brokers:,} brokers and "
               f"{p.mem_topics:,} topics", "KiB", rounds["state"]),
        Figure("the gateway worker's longest step of that dump (it serves between them)",
               "ms", rounds["dump"], note=f"{statistics.median(rounds['steps']):.0f} steps"),
        Figure(f"RSS of the follower at {p.mem_brokers:,} brokers and {p.mem_topics:,} topics",
               "MiB", rounds["rss follower"], "a worker's", rounds["rss worker"],
               note="the worker's pages shared with the state process counted whole"),
    ]
    method = METHOD.format(changes=changes, apart=APART_S * 1000, reads=reads)
    return BenchResult("followers", "Followers: read replicas on other hosts", method, figures)


METHOD = """\
One NameServer (`--workers 2`, CURVE on, `--followers` on loopback) and one follower
(`--follow`, CURVE on with the same keys), on this host: the follower's link is TCP with
CURVE over loopback, so a real network adds its round trip to the lag and push figures.
Per round: {changes} route changes (`wipe_write_perm`/`add_write_perm`, {apart:g} ms apart for
push) written on worker 1, each read back at once and again until it shows, on worker 2
and on the follower; the same changes' events at a subscriber of each; {reads:,} pipelined
`get_route`s on worker 2 and on the follower, with each process's CPU over them; then the
NameServer is filled with fake RocketMQ brokers (bench/workers.py's memory shape) and a
second follower started: its start to its first route answer, the state it was sent (the
gateway's log line), and its RSS next to a worker's. Medians of the rounds' percentiles."""

BENCHMARKS = {"followers": with_load(run_followers)}


if __name__ == "__main__":
    raise SystemExit(cli(BENCHMARKS, default_out=BENCH_DIR))

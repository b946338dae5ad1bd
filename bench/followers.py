"""Followers (`--followers` on a NameServer's workers, `--follow` on another host): what a
read replica costs, measured on this host over loopback TCP with CURVE and over links with a
round-trip delay (issue 30's stretch).

One NameServer with 2 workers, CURVE on, feeding followers; one follower at a time (CURVE
on too, the same keys, so that both are read alike), over loopback, then through a
`DelayRelay` (bench/harness.py: a userspace TCP relay holding each chunk a set delay each
way, as this host has no `tc netem`) at each of DELAYS_MS. Per round and link:

- replication lag: a route change written on worker 1, read back at once and again until it
  shows, on the follower (and, over loopback, on worker 2: the same write for both);
- push latency: the same change's event, at a subscriber of the NameServer and at one of the
  follower;
- CPU per read (loopback only): pipelined `get_route`s on worker 2 and on the follower, the
  CPU of each process over them;
- replication throughput: a stream of route changes at the NameServer for STREAM_S, at
  1,000/s and as fast as it takes them: the rate it took them at, the follower's, how far
  behind the follower was as it ended and when it showed the last one; the fast stream
  again over WINDOW_DELAY_MS each way, where the gateway's window (1,024 unacknowledged
  per follower, so 1,024 per round trip) is below what the NameServer takes;
- a follower's start at 1,000 brokers and 10,000 topics, over each link: from its
  process's start to its first route answer (the state transfer included), the state's
  size, and (loopback) its memory next to a worker's.

    python -m bench.followers [--quick] [--rounds N] [--out DIR]

Not in `make bench`: run by hand; a run (not --quick) replaces its section of
bench/results.md and keeps the others. --quick: one link of 2 ms each way, 50 ms for the
window's, streams of 0.5 s.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from bench.harness import (
    LOOPBACK, REPLY_TIMEOUT_S, BenchError, DelayRelay, LoadPool, ServerProcess, Session,
    broker_addr, check_reply, cpu_seconds, percentile, request, rss_kib, start_zns, wait_log,
)
from bench.remoting import REMOTING_LINE
from bench.report import BENCH_DIR, BenchResult, Figure, RunConfig, cli
from bench.workers import (
    FULL, LAG_BROKER, LAG_TOPIC, QUICK, WORKER_LINE, Params, fill, lag_samples, session_on,
    with_load,
)
from zns.core import schema
from zns.core.replication import DEFAULT_WINDOW
from zns.drivers.security import apply_client_keys, client_keys, write_keypair

_FOLLOWERS_LINE = re.compile(r"feeding followers on (\S+)")
_STATE_LINE = re.compile(r"followers: a state of (\d+) bytes .* \((\d+) steps, the longest "
                         r"([\d.]+) ms\)")
READS = 20_000  # per round and process, pipelined (QUICK: 500)
CHANGES = 300  # route changes per round for lag and push (QUICK: 20)
APART_S = 0.005
HOUR_MS = 3_600_000
# One-way delays of a follower's link (DelayRelay), besides loopback: RTT 10 and 50 ms.
DELAYS_MS = (5, 25)
QUICK_DELAYS_MS = (2,)
# A link whose round trip holds a follower below what the NameServer takes: the gateway hands
# out at most its window (DEFAULT_WINDOW) of commands per round trip.
WINDOW_DELAY_MS = 250
QUICK_WINDOW_DELAY_MS = 50
STREAM_S = 5.0  # a stream of route changes (QUICK: 0.5)
QUICK_STREAM_S = 0.5
STREAM_RATES = (1_000.0, None)  # changes a second; None: as fast as the NameServer takes them
STREAM_IN_FLIGHT = 64  # per connection
# A connection each: one connection's writes all pass through one worker, and one client
# connection's pipeline is slower than the state process (about 2,000/s here, 3,700 over 4).
STREAM_BROKERS = [f"stream-broker-{n}" for n in range(1, 5)]
STREAM_TOPIC = "StreamTopic"
CATCH_UP_S = 120.0
CATCH_UP_POLL_S = 0.001


class Keys:
    def __init__(self, directory: Path) -> None:
        listed, followers = directory / "listed", directory / "followers"
        self.server, self.server_secret = write_keypair(directory, "server")
        public, self.bench = write_keypair(directory, "bench")
        listed.mkdir()
        (listed / "bench.key").write_bytes(Path(public).read_bytes())
        followers.mkdir()
        public, self.follower = write_keypair(directory, "follower")
        (followers / "follower.key").write_bytes(Path(public).read_bytes())
        self.listed, self.followers_dir = str(listed), str(followers)


def start_follower(config: RunConfig, keys: Keys, endpoint: str) -> ServerProcess:
    return start_zns(config.workdir / f"follower-{time.monotonic_ns()}", "--follow", endpoint,
                     "--follow-server-key", keys.server, "--follow-keypair", keys.follower,
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


def curve_context(server_key: str, keypair: str) -> zmq.Context:
    """A load process's context, every socket of it a CURVE client with `keypair`."""
    ctx: zmq.Context = zmq.Context.instance()
    apply_client_keys(ctx, client_keys(server_key, keypair))
    return ctx


def stream(ctx: zmq.Context, endpoint: str, brokers: list[str], rate: float | None,
           duration: float) -> tuple[int, float, float]:
    """A load process's job: route changes at `endpoint` for `duration` s, on a connection
    per broker of `brokers` (`wipe_write_perm` and `add_write_perm` of that broker in turn,
    so each changes its routes), STREAM_IN_FLIGHT at most in flight on each: `rate` a
    second in all, or as fast as they are answered (None). (changes answered, first sent,
    last answered), times by time.monotonic."""
    poller = zmq.Poller()
    socks, bodies = [], []
    for broker in brokers:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
        bodies.append([request("wipe_write_perm", broker_name=broker),
                       request("add_write_perm", broker_name=broker)])
    sent, answered = [0] * len(socks), [0] * len(socks)
    clock = time.monotonic
    start = last = clock()
    end = start + duration
    try:
        while True:
            now = clock()
            room = False
            if now < end:
                due = math.inf if rate is None else int((now - start) * rate) + 1
                for k, sock in enumerate(socks):
                    while sent[k] - answered[k] < STREAM_IN_FLIGHT and sum(sent) < due:
                        sock.send(bodies[k][sent[k] % 2])
                        sent[k] += 1
                    room = room or sent[k] - answered[k] < STREAM_IN_FLIGHT
            else:
                for k, sock in enumerate(socks):  # each broker's write permission as it
                    if sent[k] % 2:               # was: the next stream starts alike
                        sock.send(bodies[k][1])
                        sent[k] += 1
                if answered == sent:
                    break
            wait_s = REPLY_TIMEOUT_S
            if rate is not None and room:
                wait_s = max(0.0, start + sum(sent) / rate - now)
            ready = dict(poller.poll(int(wait_s * 1000) + 1))
            if not ready and wait_s >= REPLY_TIMEOUT_S:
                raise BenchError(f"no reply from {endpoint} within {REPLY_TIMEOUT_S} s")
            for k, sock in enumerate(socks):
                while sock in ready:
                    try:
                        check_reply(sock.recv(zmq.DONTWAIT))
                    except zmq.Again:
                        break
                    answered[k] += 1
                    last = clock()
    finally:
        for sock in socks:
            sock.close(0)
    return sum(answered), start, last


def run_stream(pool: LoadPool, rnd: Round, follower: ServerProcess, on_follower: Session,
               rate: float | None, duration: float) -> dict[str, float]:
    """A `stream` of route changes at the NameServer while `follower` follows it: the rate
    the NameServer took them at (its first sent → its last answered) and the follower's (its
    first sent → the follower showing the last), in changes/s; how many it was behind as the
    stream ended; how long after the last was answered the follower showed it, in s; the
    CPU the state process and the follower used meanwhile, in cores, and the machine's
    share idle."""
    main, on_worker = rnd.main, rnd.on_worker
    revision = on_worker.call("status").revision
    caught_up(on_follower, revision, 5.0)
    cpu = main.cpu_seconds(), follower.cpu_seconds()
    ticks = idle_ticks()
    answered, first, last = pool.run([(main.router, STREAM_BROKERS, rate, duration)],
                                     duration + 2 * REPLY_TIMEOUT_S)[0]
    idle = [after - before for after, before in zip(idle_ticks(), ticks)]
    cores = [(now - before) / (time.monotonic() - first)
             for now, before in zip((main.cpu_seconds(), follower.cpu_seconds()), cpu)]
    # A write answered on one connection is read at once on that one; worker 2 may take a
    # moment more for the writes other workers answered (docs/protocol.md §7: read-your-writes
    # is a connection's, and the commit fence holds events, not answers), so it is waited for.
    caught_up(on_worker, revision + answered, CATCH_UP_S)
    final = on_worker.call("status").revision
    reached = on_follower.call("status").revision
    if final - revision != answered:
        raise BenchError(f"{answered} changes answered, the revision moved {final - revision}")
    shown = caught_up(on_follower, final, CATCH_UP_S)
    return {"taken": answered / max(last - first, 1e-9), "followed": answered / (shown - first),
            "behind": final - reached, "caught up": shown - last, "state cpu": cores[0],
            "follower cpu": cores[1], "idle cpu": idle[0] / max(idle[1], 1)}


def idle_ticks() -> tuple[int, int]:
    """The machine's idle clock ticks (iowait included) and all its ticks, every CPU
    (/proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def caught_up(session: Session, revision: int, timeout: float) -> float:
    """When `session`'s server first answered `status` at `revision` or later."""
    deadline = time.monotonic() + timeout
    while True:
        reply = session.call("status")
        at = time.monotonic()
        if reply.revision >= revision:
            return at
        if at > deadline:
            raise BenchError(f"at revision {reply.revision}, not {revision}, after {timeout:g} s")
        time.sleep(CATCH_UP_POLL_S)


def reads_cpu(session: Session, pid: int, reads: int) -> float:
    """CPU µs per pipelined get_route of process `pid`."""
    body = request("get_route", topic=LAG_TOPIC)
    before = cpu_seconds(pid)
    session.pipeline([body] * reads)
    return (cpu_seconds(pid) - before) / reads * 1e6


@dataclass
class Run:
    """What every round of a run uses, and the figures measured so far (`add`)."""
    config: RunConfig
    keys: Keys
    pool: LoadPool  # the stream's process
    changes: int  # per lag and push measurement
    reads: int  # per CPU measurement
    duration: float  # of a stream, s
    rounds: dict[str, list[float]] = field(default_factory=dict)
    started: float = 0.0  # when the last follower's process was started

    def add(self, name: str, value: float) -> None:
        self.rounds.setdefault(name, []).append(value)

    def follower(self, stack: ExitStack, endpoint: str, delay_ms: float) -> ServerProcess:
        """A follower of `endpoint` (the gateways' port), through a relay delaying each way by
        `delay_ms` unless 0; both stopped with `stack`. Its start is timed from the start
        of its process (the relay's is not)."""
        if delay_ms:
            endpoint = stack.enter_context(DelayRelay(endpoint, delay_ms / 1000)).endpoint
        self.started = time.monotonic()
        follower = start_follower(self.config, self.keys, endpoint)
        stack.callback(follower.stop)
        return follower


@dataclass
class Round:
    """One round's NameServer and the connections its measurements use."""
    main: ServerProcess
    endpoint: str  # its --followers port
    writer: Session  # on worker 1
    on_worker: Session  # on worker 2
    worker_pid: int  # worker 2's


def start_round(run: Run, r: int, stack: ExitStack) -> Round:
    keys = run.keys
    main = start_zns(run.config.workdir / f"main{r}", "--workers", "2", "--curve-secret",
                     keys.server_secret, "--brokers-keys", keys.listed, "--admins-keys",
                     keys.listed, "--clients", "listed", "--clients-keys", keys.listed,
                     "--followers", LOOPBACK, "--followers-keys", keys.followers_dir,
                     "--remoting", "127.0.0.1:0")
    stack.callback(main.stop)
    with Session(main.router) as session:
        brokers = [(LAG_BROKER, LAG_TOPIC), *((b, STREAM_TOPIC) for b in STREAM_BROKERS)]
        for n, (broker, topic) in enumerate(brokers):
            session.call("register_broker", cluster="bench", broker_name=broker, broker_id=0,
                         broker_addr=broker_addr(n + 1), topics={topic: {}},
                         heartbeat_timeout_ms=HOUR_MS)  # it sends no heartbeat
    writer = stack.enter_context(session_on(main.router, 1))
    on_worker = stack.enter_context(session_on(main.router, 2))
    return Round(main, wait_log(main, _FOLLOWERS_LINE), writer, on_worker,
                 int(dict(WORKER_LINE.findall(main.log_path.read_text()))["2"]))


def measure_link(run: Run, rnd: Round, name: str, delay_ms: float) -> None:
    """Lag, push latency and streams of a follower over one link (and, over loopback, its
    start and CPU per read, and worker 2's lag)."""
    with ExitStack() as stack:
        follower = run.follower(stack, rnd.endpoint, delay_ms)
        on_follower = stack.enter_context(Session(follower.router))
        if not delay_ms:
            run.add("start, empty", time.monotonic() - run.started)
            _, shown = lag_samples(rnd.writer, rnd.on_worker, run.changes)
            for q in (50, 99):
                run.add(f"lag worker 2 p{q}", percentile(shown, q) * 1e6)
        _, shown = lag_samples(rnd.writer, on_follower, run.changes)
        for q in (50, 99):
            run.add(f"lag {name} p{q}", percentile(shown, q) * 1e6)
        subs = []
        for pub in (rnd.main.pub, follower.pub):
            sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"route/" + LAG_TOPIC.encode())
            sub.connect(pub)
            stack.callback(sub.close)
            subs.append(sub)
        time.sleep(0.5)
        push = push_samples(rnd.writer, subs, run.changes)
        for q in (50, 99):
            if not delay_ms:
                run.add(f"push NameServer p{q}", percentile(push[0], q) * 1e6)
            run.add(f"push {name} p{q}", percentile(push[1], q) * 1e6)
        if not delay_ms:
            run.add("cpu worker", reads_cpu(rnd.on_worker, rnd.worker_pid, run.reads))
            run.add("cpu follower", reads_cpu(on_follower, follower.proc.pid, run.reads))
        for rate in STREAM_RATES:
            measured = run_stream(run.pool, rnd, follower, on_follower, rate, run.duration)
            for what, value in measured.items():
                run.add(f"stream {name} {rate} {what}", value)


def measure_window(run: Run, rnd: Round, delay_ms: float) -> None:
    """The fast stream over a link whose round trip holds the follower to fewer changes a
    second than the NameServer takes (the gateway's window)."""
    with ExitStack() as stack:
        follower = run.follower(stack, rnd.endpoint, delay_ms)
        on_follower = stack.enter_context(Session(follower.router))
        for what, value in run_stream(run.pool, rnd, follower, on_follower, None,
                                      run.duration).items():
            run.add(f"stream window {what}", value)


def measure_joins(run: Run, rnd: Round, links: list[tuple[str, float]]) -> None:
    """A follower's start over each link at a NameServer holding the whole table (filled
    before); over loopback, its RSS and the gateway's state."""
    logged = len(rnd.main.log_path.read_text())
    for name, delay_ms in links:
        with ExitStack() as stack:
            follower = run.follower(stack, rnd.endpoint, delay_ms)
            with Session(follower.router) as session:
                reply = session.call("get_route", topic="MemTopic00000")
                if not isinstance(reply, schema.GetRouteReply):
                    raise BenchError(f"the follower answered {reply}")
            run.add(f"start, full, {name}", time.monotonic() - run.started)
            if not delay_ms:
                run.add("rss follower", rss_kib(follower.proc.pid) / 1024)
                run.add("rss worker", rss_kib(rnd.worker_pid) / 1024)
                # The gateway's line of that state: the first once the table was full.
                size, steps, longest = _STATE_LINE.findall(
                    rnd.main.log_path.read_text()[logged:])[0]
                run.add("state", int(size) / 1024)
                run.add("steps", int(steps))
                run.add("dump", float(longest))


def run_followers(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    delays = QUICK_DELAYS_MS if config.quick else DELAYS_MS
    window_delay = QUICK_WINDOW_DELAY_MS if config.quick else WINDOW_DELAY_MS
    keys = Keys(config.workdir / "keys")
    ctx = zmq.Context.instance()  # every Session's: CURVE with the bench key from here on
    apply_client_keys(ctx, client_keys(keys.server, keys.bench))
    links = [("loopback", 0.0), *((f"{d:g} ms", d) for d in delays)]
    with LoadPool(1, stream, curve_context, keys.server, keys.bench,
                  what="the stream of route changes") as pool:
        run = Run(config, keys, pool, changes=20 if config.quick else CHANGES,
                  reads=500 if config.quick else READS,
                  duration=QUICK_STREAM_S if config.quick else STREAM_S)
        for r in range(config.rounds):
            with ExitStack() as stack:
                rnd = start_round(run, r, stack)
                for name, delay_ms in links:
                    measure_link(run, rnd, name, delay_ms)
                measure_window(run, rnd, window_delay)
                fill(wait_log(rnd.main, REMOTING_LINE), p, stack)
                measure_joins(run, rnd, links)
                config.log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.1f}"
                                                          for k, v in run.rounds.items()))
    method = METHOD.format(
        delays=" or ".join(f"{d:g} ms" for d in delays), changes=run.changes,
        apart=APART_S * 1000, reads=run.reads, duration=run.duration,
        brokers=len(STREAM_BROKERS), in_flight=STREAM_IN_FLIGHT, window=window_delay)
    return BenchResult("followers", "Followers: read replicas on other hosts", method,
                       figures(run.rounds, p, delays, window_delay, run.duration))


def figures(rounds: dict[str, list[float]], p: Params, delays: tuple[float, ...],
            window_delay: float, duration: float) -> list[Figure]:
    at = f"at {p.mem_brokers:,} brokers and {p.mem_topics:,} topics"
    out = [
        Figure("route change on worker 1 → shown on the follower, p50", "µs",
               rounds["lag loopback p50"], "→ shown on worker 2", rounds["lag worker 2 p50"]),
        Figure("route change on worker 1 → shown on the follower, p99", "µs",
               rounds["lag loopback p99"], "→ shown on worker 2", rounds["lag worker 2 p99"]),
        Figure(f"push: route change → its event at the follower's subscriber, p50 (changes "
               f"{APART_S * 1000:g} ms apart)", "µs", rounds["push loopback p50"],
               "at the NameServer's subscriber", rounds["push NameServer p50"]),
        Figure("push: route change → its event at the follower's subscriber, p99", "µs",
               rounds["push loopback p99"], "at the NameServer's subscriber",
               rounds["push NameServer p99"]),
        Figure("CPU per get_route in the follower (pipelined)", "µs", rounds["cpu follower"],
               "in worker 2", rounds["cpu worker"]),
        Figure("a follower's start → serving, empty NameServer", "s", rounds["start, empty"],
               note="a whole interpreter's start included"),
        Figure(f"a follower's start → its first route answer, {at}", "s",
               rounds["start, full, loopback"], "empty", rounds["start, empty"],
               note="the state transfer included"),
        Figure(f"the state a follower is sent, {at}", "KiB", rounds["state"]),
        Figure("the gateway worker's longest step of that dump (it serves between them)",
               "ms", rounds["dump"], note=f"{statistics.median(rounds['steps']):.0f} steps"),
        Figure(f"RSS of the follower {at}", "MiB", rounds["rss follower"], "a worker's",
               rounds["rss worker"],
               note="the worker's pages shared with the state process counted whole"),
    ]
    for d in delays:
        over = f"over {d:g} ms each way (RTT {2 * d:g} ms)"
        out += [
            Figure(f"{over}: route change on worker 1 → shown on the follower, p{q}", "µs",
                   rounds[f"lag {d:g} ms p{q}"], "over loopback", rounds[f"lag loopback p{q}"])
            for q in (50, 99)]
        out += [
            Figure(f"{over}: push: route change → its event at the follower's subscriber, p{q}",
                   "µs", rounds[f"push {d:g} ms p{q}"], "over loopback",
                   rounds[f"push loopback p{q}"])
            for q in (50, 99)]
        out.append(Figure(f"{over}: a follower's start → its first route answer, {at}", "s",
                          rounds[f"start, full, {d:g} ms"], "over loopback",
                          rounds["start, full, loopback"], note="the state transfer included"))
    for name in ["loopback", *(f"{d:g} ms" for d in delays)]:
        over = "over loopback" if name == "loopback" else f"over {name} each way"
        fast, paced = f"stream {name} None", f"stream {name} {STREAM_RATES[0]}"
        out += [
            Figure(f"{over}: route changes for {duration:g} s, as fast as the NameServer takes "
                   f"them: the follower's rate", "changes/s", rounds[f"{fast} followed"],
                   "the NameServer's", rounds[f"{fast} taken"], note=busy(rounds, fast)),
            Figure(f"{over}: changes the follower was behind when that stream ended",
                   "changes", rounds[f"{fast} behind"]),
            Figure(f"{over}: that stream's last change answered → shown on the follower", "ms",
                   [x * 1000 for x in rounds[f"{fast} caught up"]]),
            Figure(f"{over}: route changes at {STREAM_RATES[0]:,.0f}/s for {duration:g} s: "
                   f"the last answered → shown on the follower", "ms",
                   [x * 1000 for x in rounds[f"{paced} caught up"]],
                   note=f"changes behind when it ended: "
                        f"{statistics.median(rounds[f'{paced} behind']):.0f}"),
        ]
    bound = DEFAULT_WINDOW / (2 * window_delay / 1000)
    over = f"over {window_delay:g} ms each way (RTT {2 * window_delay:g} ms)"
    note = (f"the gateway hands out at most {DEFAULT_WINDOW:,} changes unacknowledged: "
            f"{DEFAULT_WINDOW:,} per round trip, {bound:,.0f}/s at this one; "
            f"{busy(rounds, 'stream window')}")
    out += [
        Figure(f"{over}: route changes for {duration:g} s, as fast as the NameServer takes "
               f"them: the follower's rate", "changes/s", rounds["stream window followed"],
               "the NameServer's", rounds["stream window taken"], note=note),
        Figure(f"{over}: changes the follower was behind when that stream ended", "changes",
               rounds["stream window behind"]),
        Figure(f"{over}: that stream's last change answered → shown on the follower", "s",
               rounds["stream window caught up"]),
    ]
    return out


def busy(rounds: dict[str, list[float]], stream: str) -> str:
    """What the state process and the follower used of a core over a stream, and how idle
    the machine was (medians)."""
    state, follower, idle = (statistics.median(rounds[f"{stream} {who} cpu"])
                             for who in ("state", "follower", "idle"))
    return (f"CPU meanwhile: the state process {state:.0%} of a core, the follower "
            f"{follower:.0%}, the machine {idle:.0%} idle")


METHOD = """\
One NameServer (`--workers 2`, CURVE on, `--followers` on loopback) and one follower at a
time (`--follow`, CURVE on with the same keys), on this host: first over loopback TCP, then
through a relay (bench/harness.py's `DelayRelay`, its own process) that holds every chunk
{delays} each way before passing it on, so a follower's link to its gateway has that
round trip; CURVE runs end to end through it. The relay delays bytes only: each of its
sides is loopback TCP, so no loss, no bandwidth limit and no TCP congestion window across
the delay (on a real network, TCP's slow start adds round trips to a large transfer, such
as a follower's first state). Per round and link: {changes} route changes
(`wipe_write_perm`/`add_write_perm`, {apart:g} ms apart for push) written on worker 1,
each read back at once and again until it shows on the follower (over loopback, on worker
2 too); the same changes' events at a subscriber of the NameServer and of the follower;
over loopback, {reads:,} pipelined `get_route`s on worker 2 and on the follower, with
each process's CPU over them. Then a stream of route changes for {duration:g} s
(`wipe_write_perm`/`add_write_perm` of {brokers} brokers in turn, a connection each and at
most {in_flight} in flight on each), at 1,000/s and as fast as the NameServer answers
them: the NameServer's rate (its first sent → its last answered), the follower's (its
first sent → the follower answering `status` at the last one's revision), the changes it
was behind as the stream ended, and how long after the last was answered it showed it.
The fast stream again over a link of {window:g} ms each way, where the gateway's window
(1,024 commands unacknowledged) allows at most 1,024 per round trip. Then the NameServer
is filled with fake RocketMQ brokers (bench/workers.py's memory shape) and a follower
started over each link: its start to its first route answer, the state it was sent (the
gateway's log line), and (loopback) its RSS next to a worker's. Everything shares this
machine's 2 cores: the NameServer's 3 processes, the follower, the relay and the client.
Medians of the rounds' percentiles."""

BENCHMARKS = {"followers": with_load(run_followers)}


if __name__ == "__main__":
    raise SystemExit(cli(BENCHMARKS, default_out=BENCH_DIR))

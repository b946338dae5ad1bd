"""Soak: one NameServer, 1,000 simulated brokers and 50 RouteClients for a long time.

    python -m bench.soak [--duration 600] [--brokers 1000] [--clients 50] [--results FILE]

Brokers are simulated in a few processes, each driving many brokers over one
DEALER. Each broker is a `BrokerSession`, the core of BrokerAgent: a
registration with its topics at start and every 30 s, a heartbeat every
second (a `known: false` or `changed: true` reply re-registers at once), and
churn — now and then a broker changes one topic, or restarts (unregisters and
registers again with a new session). Half the brokers are masters, half
their slaves (same broker name, id 1). Clients are real `RouteClient`s, each
watching topics, plus a puller per client process sending `get_route` and
`get_routes` to measure request latency.

At the end the churn stops and it checks: every broker's last acknowledged
registration is what the server holds (no lost registration), every client
cache equals `snapshot` (no wrong or stale route), and the server's RSS after
warm-up stays flat. The p50/p99/max of request latency are reported. Results
are appended to bench/soak-results.md (the "Soak" section of the results).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import zmq

from bench.harness import (
    REPO, Session, broker_addr, cpu_seconds, percentile, request, rss_kib, start_zns,
)
from zns.core import schema
from zns.core.broker_session import BrokerSession, BrokerState, Disconnect, Done, SendRequest
from zns.core.schema import TopicConfig, request_op

CLUSTER = "soak"
RESULTS = REPO / "bench" / "soak-results.md"
RSS_GROWTH_LIMIT = 0.10  # "flat": at most 10 % above the RSS at the end of warm-up
Acked = dict[tuple[str, int], tuple[str, list[str] | None]]  # (name, id) -> (addr, topics)
HEARTBEAT_TIMEOUT_MS = 120_000  # the NameServer's default: expiry is not what a soak tests
REQUEST_TIMEOUT_MS = 30_000  # a slower reply is reported as an error (the soak fails)


@dataclass(frozen=True)
class Params:
    duration: float = 600.0  # seconds of steady load, after every broker registered
    brokers: int = 1000  # master + slave pairs: brokers // 2 broker names
    topics_per_broker: int = 100
    topic_pool: int = 10_000  # topics are drawn from this many names
    clients: int = 50
    topics_per_client: int = 100
    heartbeat: float = 1.0  # broker heartbeats, and the server's hb events
    broker_procs: int = 4
    client_procs: int = 2
    churn_per_s: float = 4.0  # topic changes per second, all brokers together
    restarts_per_min: float = 6.0  # broker restarts (unregister + register) per minute
    pulls_per_s: float = 5.0  # get_route/get_routes per second per client
    warmup: float = 0.0  # seconds; 0: a fifth of the duration, at least 20 s


# --- the brokers ------------------------------------------------------------------


def name_of(name_index: int) -> str:
    return f"broker-{name_index:04d}"


def initial_topics(name_index: int, p: Params) -> list[int]:
    # 101 * k is distinct mod 10,000 for k < 100: a broker's topics never repeat.
    return sorted({(name_index * 37 + k * 101) % p.topic_pool for k in range(p.topics_per_broker)})


def topic_name(t: int) -> str:
    return f"Soak{t:05d}"


class SimBroker:
    """One simulated broker: its registration (`BrokerState`) and its `BrokerSession`.

    The session decides everything a BrokerAgent's would (registrations, heartbeats,
    re-registration, timeouts); `broker_main` is only its driver, over a DEALER shared
    by many brokers, which tells replies apart by request id.
    """

    def __init__(self, index: int, p: Params, ids: Iterator[int]) -> None:
        self.name_index, self.broker_id = divmod(index, 2)
        self.name = name_of(self.name_index)
        self.addr = broker_addr(index)
        self.state = BrokerState(
            cluster=CLUSTER, broker_name=self.name, broker_id=self.broker_id,
            broker_addr=self.addr, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
            topics={topic_name(t): TopicConfig() for t in initial_topics(self.name_index, p)},
        )
        self._heartbeat_ms = round(p.heartbeat * 1000)
        self._ids = ids
        self.session = self.new_session()
        self.closing = False  # restarting: the unregistration is under way
        self.start_at = 0.0
        self.sent: tuple[int, str, float] | None = None  # (id, op, when) of the request in flight

    def new_session(self) -> BrokerSession:
        return BrokerSession("soak", self.state, heartbeat_interval_ms=self._heartbeat_ms,
                             request_timeout_ms=REQUEST_TIMEOUT_MS, request_ids=self._ids)

    def settled(self) -> bool:
        """Registered, nothing in flight: stop driving it and its acknowledgement is final."""
        return not self.closing and self.session.in_flight is None and self.session.registered

    def acked_topics(self) -> list[str] | None:
        acked = self.session.acknowledged
        return sorted(acked.topics) if acked is not None else None


def broker_main(conn: Connection, router: str, indices: list[int], p: Params, seed: int) -> None:
    """Drive `indices` brokers over one DEALER until told to stop; report what was acked."""
    rnd = random.Random(seed)
    ids = itertools.count(1)  # one id space on the shared DEALER: an id names its broker
    brokers = [SimBroker(i, p, ids) for i in indices]
    pairs: dict[int, list[SimBroker]] = {}
    for b in brokers:
        pairs.setdefault(b.name_index, []).append(b)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(router)
    pending: dict[int, SimBroker] = {}
    latencies = array("d")
    counts = {"registrations": 0, "heartbeats": 0, "reregistered": 0, "errors": 0,
              "restarts": 0, "churn": 0}
    share = len(pairs) / max(1, p.brokers // 2)
    churn_every = 1 / (p.churn_per_s * share) if p.churn_per_s * share > 0 else None
    restart_every = 60 / (p.restarts_per_min * share) if p.restarts_per_min * share > 0 else None
    now = time.monotonic()
    next_churn = now + (churn_every or 0) * rnd.random()
    next_restart = now + (restart_every or 0) * rnd.random()
    for b in brokers:  # spread over one heartbeat interval, so heartbeats are too
        b.start_at = now + p.heartbeat * rnd.random()
    to_start = sorted(brokers, key=lambda b: b.start_at, reverse=True)
    stopping = reported_ready = False

    def error(b: SimBroker, what: str) -> None:
        counts["errors"] += 1
        print(f"soak broker {b.name}/{b.broker_id}: {what}", file=sys.stderr)

    def carry_out(b: SimBroker) -> None:
        for action in b.session.actions():
            match action:
                case SendRequest(request=request):
                    if b.sent is not None:  # the session gave up on it: so do we
                        pending.pop(b.sent[0], None)
                    b.sent = (request.id, request_op(request), time.monotonic())
                    pending[request.id] = b
                    sock.send(schema.encode(request))
                case Disconnect() if not b.closing:  # only a timeout or a wrong reply does this
                    error(b, b.session.last_error)
                case Done(unregistered=unregistered):
                    if not unregistered:
                        error(b, f"unregistration not confirmed: {b.session.last_error}")
                    b.closing = False
                    b.session = b.new_session()  # the restart: back at once
                    b.session.start(now_ms())
                    carry_out(b)

    while True:
        now = time.monotonic()
        if conn.poll():
            message = conn.recv()
            if message == "stop":
                stopping = True
            elif message == "steady":  # the start-up burst is timed apart: its queueing
                del latencies[:]       # says nothing of the steady state
        while to_start and to_start[-1].start_at <= now and len(pending) < 200:
            b = to_start.pop()
            b.session.start(now_ms())
            carry_out(b)
        if not stopping:
            if churn_every and now >= next_churn:
                next_churn += churn_every
                pair = pairs[rnd.choice(list(pairs))]
                old = rnd.choice(sorted(pair[0].state.topics))
                new = topic_name(rnd.randrange(p.topic_pool))
                for b in pair:
                    topics = b.state.topics
                    topics.pop(old, None)
                    topics[new] = TopicConfig()
                    b.state.set_topics(topics, wall_ms=int(time.time() * 1000))
                    b.session.topics_changed(now_ms())
                    carry_out(b)
                counts["churn"] += 1
            if restart_every and now >= next_restart:
                next_restart += restart_every
                b = rnd.choice(brokers)
                if not b.closing and b not in to_start:
                    counts["restarts"] += 1
                    b.closing = True
                    b.session.close(now_ms(), REQUEST_TIMEOUT_MS)
                    carry_out(b)
        ms = now_ms()
        for b in brokers:
            wake = b.session.next_deadline()
            if wake is not None and wake <= ms and not (stopping and b.settled()):
                b.session.on_timer(ms)
                carry_out(b)
        if not reported_ready and all(b.session.acknowledged is not None for b in brokers):
            conn.send(("ready", None))
            reported_ready = True
        if stopping and not to_start and all(b.settled() for b in brokers):
            break
        wakes = [w for b in brokers if (w := b.session.next_deadline()) is not None]
        wait_ms = min(50, max(0, min(wakes, default=ms + 50) - now_ms()))
        if sock.poll(wait_ms):
            while True:
                try:
                    body = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                reply = schema.decode_reply(body)
                b = pending.pop(reply.id, None)
                if b is None or b.sent is None:
                    continue
                _, op, sent = b.sent
                b.sent = None
                latencies.append(time.monotonic() - sent)
                match reply:
                    case schema.Error(code=code, message=message):
                        error(b, f"{op}: {code} {message}")
                    case schema.RegisterBrokerReply():
                        counts["registrations"] += 1
                    case schema.HeartbeatReply(known=known, changed=changed):
                        counts["heartbeats"] += 1
                        counts["reregistered"] += not known or changed
                b.session.on_reply(reply, now_ms())
                carry_out(b)
    sock.close(0)
    acked = {(b.name, b.broker_id): (b.addr, b.acked_topics()) for b in brokers}
    conn.send(("done", (latencies.tobytes(), counts, acked)))


def now_ms() -> int:
    return int(time.monotonic() * 1000)


# --- the clients ------------------------------------------------------------------


def client_main(conn: Connection, router: str, n: int, p: Params, seed: int) -> None:
    """`n` RouteClients watching topics, and a puller; report latency and cache checks."""
    from zns.drivers.route_client import RouteClient  # in the child: a context of its own

    rnd = random.Random(seed)
    in_use = sorted({topic_name(t) for i in range(p.brokers // 2) for t in initial_topics(i, p)})
    watched = [rnd.sample(in_use, min(p.topics_per_client, len(in_use))) for _ in range(n)]
    clients = [RouteClient(router, heartbeat_interval=p.heartbeat, request_timeout=5.0)
               for _ in range(n)]
    for client, topics in zip(clients, watched):
        for topic in topics:
            client.watch(topic, lambda t, r: None)
    latencies = array("d")
    errors = [0]
    stop = threading.Event()

    def puller() -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(router)
        period = 1 / (p.pulls_per_s * n)
        next_at, rid = time.monotonic(), 0
        while not stop.is_set():
            rid += 1
            topics = rnd.choice(watched)
            if rid % 4:
                body = request("get_route", id=rid, topic=rnd.choice(topics))
            else:
                body = request("get_routes", id=rid, topics=rnd.sample(topics, 10))
            sent = time.monotonic()
            sock.send(body)
            if not sock.poll(15_000):
                errors[0] += 1
                break
            reply = schema.decode_reply(sock.recv())
            latencies.append(time.monotonic() - sent)
            if isinstance(reply, schema.Error) and reply.code != "not_found":
                errors[0] += 1
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
        sock.close(0)

    thread = threading.Thread(target=puller, daemon=True)
    thread.start()
    conn.send(("ready", None))
    assert conn.recv() == "verify"
    stop.set()
    thread.join(20)
    session = Session(router)

    def mismatches() -> tuple[int, int]:
        snap = session.call("snapshot")
        wrong = 0
        for client, topics in zip(clients, watched):
            cache = client.session.cache
            for t in topics:
                if cache.epoch != snap.epoch or not cache.is_current(t) or \
                        cache.view(t) != snap.routes.get(t):
                    wrong += 1
        return wrong, sum(len(t) for t in watched)

    deadline = time.monotonic() + 30  # events and confirm-pulls still in flight settle
    wrong, checked = mismatches()
    while wrong and time.monotonic() < deadline:
        time.sleep(0.5)
        wrong, checked = mismatches()
    stats = {"wrong_routes": wrong, "routes_checked": checked, "errors": errors[0],
             "switches": sum(c.session.switches for c in clients),
             "client_pulls": sum(c.session.pulls for c in clients)}
    session.close()
    for client in clients:
        client.close()
    conn.send(("done", (latencies.tobytes(), stats)))


# --- the run ------------------------------------------------------------------------


def split(items: list[int], parts: int) -> list[list[int]]:
    size = -(-len(items) // parts)
    size += size % 2  # keep a master and its slave in one process
    return [items[i:i + size] for i in range(0, len(items), size)]


def expect(conn: Connection, what: str, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise RuntimeError(f"a soak worker did not report {what!r} within {timeout:.0f} s")
    tag, value = conn.recv()
    if tag != what:
        raise RuntimeError(f"a soak worker reported {tag!r}, expected {what!r}")
    return value


def run(p: Params, results: Path | None) -> bool:
    mp = multiprocessing.get_context("spawn")
    warmup = p.warmup or max(20.0, p.duration / 5)
    with tempfile.TemporaryDirectory() as tmp, start_zns(
            Path(tmp), "--heartbeat-interval", str(p.heartbeat)) as server:
        pid = server.proc.pid
        start = time.monotonic()
        broker_conns, procs = [], []
        for k, indices in enumerate(split(list(range(p.brokers)), p.broker_procs)):
            mine, theirs = mp.Pipe()
            proc = mp.Process(target=broker_main, args=(theirs, server.router, indices, p, k),
                              daemon=True)
            proc.start()
            broker_conns.append(mine)
            procs.append(proc)
        for conn in broker_conns:
            expect(conn, "ready", 300)
        registered_in = time.monotonic() - start
        client_conns = []
        per_proc = split(list(range(p.clients)), p.client_procs)
        for k, share in enumerate(per_proc):
            mine, theirs = mp.Pipe()
            proc = mp.Process(target=client_main, args=(theirs, server.router, len(share), p,
                                                         100 + k), daemon=True)
            proc.start()
            client_conns.append(mine)
            procs.append(proc)
        for conn in client_conns:
            expect(conn, "ready", 300)
        print(f"soak: {p.brokers} brokers registered in {registered_in:.1f} s; "
              f"{p.clients} clients up; running {p.duration:.0f} s", flush=True)

        for conn in broker_conns:
            conn.send("steady")
        steady_start = time.monotonic()
        cpu_start = cpu_seconds(pid)
        rss: list[tuple[float, int]] = []
        while (elapsed := time.monotonic() - steady_start) < p.duration:
            rss.append((elapsed, rss_kib(pid)))
            if server.proc.poll() is not None:
                raise RuntimeError("the NameServer died")
            time.sleep(min(2.0, max(0.0, p.duration - elapsed)))
        cpu = cpu_seconds(pid) - cpu_start
        steady = time.monotonic() - steady_start
        load = os.getloadavg()
        rss.append((steady, rss_kib(pid)))

        for conn in broker_conns:
            conn.send("stop")
        broker_reports = [expect(conn, "done", 120) for conn in broker_conns]
        for conn in client_conns:
            conn.send("verify")
        client_reports = [expect(conn, "done", 120) for conn in client_conns]
        with Session(server.router) as session:
            snap = session.call("snapshot")
        for proc in procs:
            proc.join(20)

    broker_lat, client_lat = array("d"), array("d")
    counts: dict[str, int] = {}
    acked: Acked = {}
    for raw, c, a in broker_reports:
        broker_lat.frombytes(raw)
        for key, value in c.items():
            counts[key] = counts.get(key, 0) + value
        acked.update(a)
    client_stats: dict[str, int] = {}
    for raw, s in client_reports:
        client_lat.frombytes(raw)
        for key, value in s.items():
            client_stats[key] = client_stats.get(key, 0) + value
    lost = lost_registrations(snap, acked)

    after_warmup = [kib for t, kib in rss if t >= warmup] or [rss[-1][1]]
    base, end = statistics.median(after_warmup[:3]), statistics.median(after_warmup[-3:])
    growth = (end - base) / base
    all_lat = sorted(list(broker_lat) + list(client_lat))
    ok = (lost == 0 and client_stats["wrong_routes"] == 0 and growth <= RSS_GROWTH_LIMIT
          and counts["errors"] == 0 and client_stats["errors"] == 0)
    requests = len(all_lat)
    lines = [
        f"### {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC — {steady:.0f} s, "
        f"{'PASS' if ok else 'FAIL'}",
        "",
        f"- load: {p.brokers} brokers ({p.brokers // 2} names, master + slave), "
        f"{p.topics_per_broker} topics each ({len(snap.routes)} distinct topics held), heartbeat "
        f"every {p.heartbeat:g} s; churn {p.churn_per_s:g} topic changes/s and "
        f"{p.restarts_per_min:g} broker restarts/min; {p.clients} RouteClients watching "
        f"{p.topics_per_client} topics each, a puller per client process asking up to "
        f"{p.pulls_per_s:g} req/s per client, one request in flight",
        f"- all brokers registered in {registered_in:.1f} s; "
        f"{requests} requests timed in the steady phase ({requests / max(steady, 1e-9):.0f}/s); "
        f"in all {counts['registrations']} registrations, {counts['heartbeats']} heartbeats, "
        f"{counts['reregistered']} re-registrations asked by a heartbeat, "
        f"{counts['churn']} topic changes, {counts['restarts']} restarts, "
        f"{len(client_lat)} puller requests ({len(client_lat) / max(steady, 1e-9):.0f}/s), "
        f"{client_stats['client_pulls']} RouteClient pulls",
        f"- request latency (send to reply, every request of the steady phase): p50 "
        f"{percentile(all_lat, 50) * 1e3:.2f} ms, p99 {percentile(all_lat, 99) * 1e3:.2f} ms, "
        f"max {all_lat[-1] * 1e3:.1f} ms; brokers' p99 {percentile(broker_lat, 99) * 1e3:.2f} ms, "
        f"clients' p99 {percentile(client_lat, 99) * 1e3:.2f} ms",
        f"- lost registrations: {lost}; wrong or stale routes: {client_stats['wrong_routes']} of "
        f"{client_stats['routes_checked']} client cache entries checked against `snapshot`; "
        f"error replies: {counts['errors'] + client_stats['errors']}; "
        f"client NameServer switches: {client_stats['switches']}",
        f"- server RSS: {rss[0][1] / 1024:.0f} MiB at start of steady load, "
        f"{base / 1024:.1f} MiB after {warmup:.0f} s warm-up, {end / 1024:.1f} MiB at the end "
        f"({growth * 100:+.1f} %, limit +{RSS_GROWTH_LIMIT * 100:.0f} %); server CPU "
        f"{cpu / steady * 100:.0f} % of one core; machine load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores (shared)",
        "",
    ]
    print("\n".join(lines))
    if results is not None:
        if not results.exists():
            results.write_text(
                "## Soak\n\n`python -m bench.soak` (see its docstring); each run appends a "
                "section. The CI-size run is `--duration 60`.\n\n")
        with results.open("a") as f:
            f.write("\n".join(lines) + "\n")
    return ok


def lost_registrations(snap: Any, acked: Acked) -> int:
    """Acknowledged registrations the server does not hold as acknowledged."""
    lost = 0
    expected_queues: dict[str, set[str]] = {}
    for (name, broker_id), (addr, topics) in acked.items():
        data = snap.brokers.get(name)
        if topics is None or data is None or data.addrs.get(broker_id) != addr:
            lost += 1
            continue
        if broker_id == 0:  # topic data comes from the master
            for t in topics:
                expected_queues.setdefault(t, set()).add(name)
    held = {topic: {q.broker_name for q in route.queues} for topic, route in snap.routes.items()}
    for topic in set(held) | set(expected_queues):
        if held.get(topic, set()) != expected_queues.get(topic, set()):
            lost += 1
    return lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Params()
    for field, value in asdict(defaults).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="Markdown file the run's section is appended to ('-': none).")
    args = vars(parser.parse_args(argv))
    results = args.pop("results")
    ok = run(Params(**args), None if str(results) == "-" else results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

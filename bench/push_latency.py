"""Benchmark 3: push latency, from a route-changing request to each subscriber's event.

    python -m bench.push_latency [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.harness import (
    BenchError, LoadClients, Session, Subscribers, broker_addr, check_reply, percentile,
    register_request, request, start_echo, start_zns, wait_paired,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core.schema import route_channel

TOPIC = "PushTopic"
SUB_PROCESSES = 2  # one per core of the reference machine
ACK_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Params:
    subscribers: tuple[int, ...]
    changes: int  # per round
    rtt_duration: float
    gap_s: float = 0.0  # pause after each change's deliveries before the next one


FULL = Params(subscribers=(1, 10, 100), changes=1000, rtt_duration=1.0)
QUICK = Params(subscribers=(1, 4), changes=30, rtt_duration=0.1)

METHOD = """
Two brokers host `{topic}`. A sender process alternates `wipe_write_perm` and
`add_write_perm` on one of them: each request changes the route once, so zns
publishes one `route` event per request. N SUB sockets, all subscribed to
`route/{topic}\\0`, live in {procs} subscriber processes (a single one for N = 1;
on 2 cores more processes would only queue for the CPU) and take a
`time.monotonic()` stamp right after each `recv` (one system-wide clock, so stamps
compare across processes). The latency of one delivery is that stamp minus the
sender's stamp taken just before it sent the request. The sender sends the next
change only after every socket has received the previous one (the subscriber
processes report their counts over a PUSH socket), so no change queues behind
another: {changes} changes per round, each delivered N times; p50/p99/max are over
all deliveries of the round.

The reference is a raw pyzmq request round trip measured in the same round, just
before: the shared client harness against the echo server, one request in flight.
A push is one request leg plus one PUB leg, so about one round trip is its floor.
"""


@dataclass
class Round:
    first_revision: int  # the revision of this round's first change
    sent_at: list[float]
    raw_rtt: list[float]


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    method = METHOD.format(topic=TOPIC, procs=SUB_PROCESSES, changes=p.changes)
    return BenchResult("push_latency", "Push latency", method, measure(config, p))


def measure(config: RunConfig, p: Params, *server_args: str) -> list[Figure]:
    """The figures of every subscriber count against `zns serve *server_args`."""
    changes = [
        request("wipe_write_perm", broker_name="broker-0"),
        request("add_write_perm", broker_name="broker-0"),
    ]
    rtt_body = request("get_route", topic=TOPIC)
    figures = []
    with start_echo(config.workdir) as echo, start_zns(config.workdir / "zns", *server_args) as zns, \
            LoadClients(1) as clients, Session(zns.router) as session:
        session.pipeline([register_request(f"broker-{b}", broker_addr(b), [TOPIC])
                          for b in range(2)])
        unpaired = wait_paired(zns, server_args, config.quick)
        for n in p.subscribers:
            subs = Subscribers(zns.pub, [route_channel(TOPIC)], sockets=n,
                               processes=SUB_PROCESSES, ack=True)
            rounds: list[Round] = []
            lost = 0
            try:
                subs.wait_ready()
                for r in range(config.rounds):
                    raw = clients.drive(echo, [rtt_body], in_flight=1,
                                        duration=p.rtt_duration, warmup=0.1).latencies
                    rnd = Round(session.call("status").revision + 1, [], raw)
                    for i in range(p.changes):
                        rnd.sent_at.append(time.monotonic())
                        check_reply(session.call_raw(changes[i % 2]))
                        if not subs.wait_acked(len(rounds) * p.changes + i + 1, ACK_TIMEOUT_S):
                            lost += 1
                        if p.gap_s:
                            time.sleep(p.gap_s)
                    rounds.append(rnd)
            finally:
                arrivals = subs.stop()
            per_round: list[list[float]] = [[] for _ in rounds]
            for a in arrivals:
                for rnd, latencies in zip(rounds, per_round):
                    i = a.revision - rnd.first_revision
                    if 0 <= i < p.changes:
                        latencies.append(a.at - rnd.sent_at[i])
            expected = n * p.changes
            if any(len(lat) != expected for lat in per_round):
                raise BenchError(f"{n} subscribers: expected {expected} deliveries per round, "
                                 f"got {[len(lat) for lat in per_round]} ({lost} waits timed out)")
            for q, label in ((50, "p50"), (99, "p99"), (100, "max")):
                figures.append(Figure(
                    f"push latency {label}, {n} subscriber{'s' if n > 1 else ''}", "µs",
                    [percentile(lat, q) * 1e6 for lat in per_round],
                    f"raw round trip {label}",
                    [percentile(rnd.raw_rtt, q) * 1e6 for rnd in rounds],
                    Target("ratio", "<=", 3) if q == 99 else None,
                    note=unpaired,
                ))
            config.log(f"{n} subscribers: p50 {figures[-3].value:.0f} µs, "
                       f"p99 {figures[-2].value:.0f} µs (raw p99 {figures[-2].reference_value:.0f})")
    return figures


if __name__ == "__main__":
    raise SystemExit(cli({"push_latency": run}))

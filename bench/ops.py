"""Benchmark 8: what operations cost: --metrics on the hot path, and events relays.

    python -m bench.ops [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.harness import (
    BenchError, LoadClients, ServerProcess, Session, Subscribers, broker_addr,
    check_reply, percentile, register_request, request, start_zns, wait_log,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core.schema import route_channel

TOPIC = "OpsTopic"
ACK_TIMEOUT_S = 15.0  # 1,000 sockets on a loaded 2-core machine
_METRICS = re.compile(r"metrics on http://([^/\s]+)/metrics")
_RELAYED = re.compile(r"relayed on (\S+)")


@dataclass(frozen=True)
class Params:
    duration: float
    warmup: float
    in_flight: int
    subscribers: int
    sub_processes: int
    changes: int


FULL = Params(duration=1.0, warmup=0.3, in_flight=100, subscribers=1000, sub_processes=4,
              changes=200)
QUICK = Params(duration=0.1, warmup=0.1, in_flight=10, subscribers=8, sub_processes=2,
               changes=10)

METHOD = """
**Metrics.** Two `zns serve` processes, one with `--metrics 127.0.0.1:0`, are driven
in turn (the order alternating per round) by the same client process keeping
{in_flight} `get_route` requests in flight; /metrics is scraped once per round of the
metrics-on server, as Prometheus would every few seconds. Both keep the same plain
counts (they are not optional); the difference is the scrape endpoint's thread.

**Relays.** {subs} SUB sockets in {procs} processes subscribe to `route/{topic}\\0`,
either at the NameServer's PUB ("direct") or split evenly over two `zns relay`
processes in front of it. As in benchmark 3, a sender alternates `wipe_write_perm`
and `add_write_perm` ({changes} changes per round) and sends the next change only
after every socket has received the previous one; a delivery's latency is its
arrival stamp minus the send stamp.
"""


def start_relay(workdir: Path, upstream: str) -> ServerProcess:
    """`zns relay` in its own process; its `router` field is the bound events endpoint."""
    log_path = workdir / f"relay-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "zns", "relay", "--from", upstream, "--bind",
           "tcp://127.0.0.1:*"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    relay = ServerProcess(proc, "", "", log_path)
    try:
        relay.router = relay.pub = wait_log(relay, _RELAYED)
    except BenchError:
        relay.stop()
        raise
    return relay


def _metrics_rounds(config: RunConfig, p: Params) -> list[Figure]:
    body = request("get_route", topic=TOPIC)
    rates: dict[str, list[float]] = {"on": [], "off": []}
    with start_zns(config.workdir / "off") as off, \
            start_zns(config.workdir / "on", "--metrics", "127.0.0.1:0") as on, \
            LoadClients(1) as clients:
        url = f"http://{wait_log(on, _METRICS)}/metrics"
        for server in (off, on):
            with Session(server.router) as session:
                session.pipeline([register_request(f"broker-{b}", broker_addr(b), [TOPIC])
                                  for b in range(2)])
        servers = {"off": off, "on": on}
        for server in servers.values():  # connections up and caches warm before any window
            clients.drive(server, [body], in_flight=p.in_flight, processes=1,
                          duration=p.duration, warmup=p.warmup)
        for r in range(config.rounds):
            with urllib.request.urlopen(url, timeout=10) as resp:
                if b"zns_requests_total" not in resp.read():
                    raise BenchError("/metrics has no zns_requests_total")
            for name in (["on", "off"] if r % 2 else ["off", "on"]):
                load = clients.drive(servers[name], [body], in_flight=p.in_flight, processes=1,
                                     duration=p.duration, warmup=p.warmup)
                rates[name].append(load.rate)
            config.log(f"round {r + 1}: metrics on {rates['on'][-1]:,.0f}/s, "
                       f"off {rates['off'][-1]:,.0f}/s")
    return [Figure(f"get_route, {p.in_flight} in flight, --metrics on", "req/s", rates["on"],
                   "metrics off", rates["off"], Target("ratio", ">=", 0.97))]


def _push_rounds(config: RunConfig, p: Params, zns: ServerProcess, session: Session,
                 pubs: list[str]) -> list[list[float]]:
    """Per round, every delivery's latency in seconds, subscribers split over `pubs`."""
    changes = [request("wipe_write_perm", broker_name="broker-0"),
               request("add_write_perm", broker_name="broker-0")]
    groups = [Subscribers(pub, [route_channel(TOPIC)],
                          sockets=p.subscribers // len(pubs) + (i < p.subscribers % len(pubs)),
                          processes=max(1, p.sub_processes // len(pubs)), ack=True)
              for i, pub in enumerate(pubs)]
    sent: list[tuple[int, list[float]]] = []
    try:
        for subs in groups:
            subs.wait_ready(60)
        for r in range(config.rounds):
            first = session.call("status").revision + 1
            stamps: list[float] = []
            for i in range(p.changes):
                stamps.append(time.monotonic())
                check_reply(session.call_raw(changes[i % 2]))
                for subs in groups:
                    if not subs.wait_acked(r * p.changes + i + 1, ACK_TIMEOUT_S):
                        raise BenchError("a subscriber missed a change")
            sent.append((first, stamps))
    finally:
        arrivals = [a for subs in groups for a in subs.stop()]
    per_round: list[list[float]] = []
    for first, stamps in sent:
        per_round.append([a.at - stamps[a.revision - first] for a in arrivals
                          if 0 <= a.revision - first < p.changes])
        if len(per_round[-1]) != p.subscribers * p.changes:
            raise BenchError(f"expected {p.subscribers * p.changes} deliveries, "
                             f"got {len(per_round[-1])}")
    return per_round


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    figures = _metrics_rounds(config, p)
    with start_zns(config.workdir / "push") as zns, Session(zns.router) as session:
        session.pipeline([register_request(f"broker-{b}", broker_addr(b), [TOPIC])
                          for b in range(2)])
        direct = _push_rounds(config, p, zns, session, [zns.pub])
        with start_relay(config.workdir, zns.router) as r1, \
                start_relay(config.workdir, zns.router) as r2:
            relayed = _push_rounds(config, p, zns, session, [r1.pub, r2.pub])
    n = p.subscribers
    for q, label in ((50, "p50"), (99, "p99")):
        figures.append(Figure(
            f"push latency {label}, {n} subscribers, through two relays", "µs",
            [percentile(lat, q) * 1e6 for lat in relayed], f"direct {label}",
            [percentile(lat, q) * 1e6 for lat in direct]))
    config.log(f"{n} subscribers: p99 direct {figures[-1].reference_value:.0f} µs, "
               f"through two relays {figures[-1].value:.0f} µs")
    method = METHOD.format(in_flight=p.in_flight, subs=n, procs=p.sub_processes, topic=TOPIC,
                           changes=p.changes)
    return BenchResult("ops", "Operations: metrics and events relays", method, figures)


if __name__ == "__main__":
    raise SystemExit(cli({"ops": run}))

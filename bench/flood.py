"""Benchmark: timers under one client's flood of heavy requests.

    python -m bench.flood [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import multiprocessing
import time

import zmq

from bench.harness import (
    BenchError, Session, broker_addr, check_reply, percentile, register_request, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core import schema

INTERVAL_S = 1.0  # the default: the budget is relative to it
TIMEOUT_MS = 2000


def _params(quick: bool) -> tuple[int, float, int, int]:
    """(topics, flood seconds, requests in flight, silent brokers)."""
    return (2000, 3.0, 5, 5) if quick else (20_000, 20.0, 20, 20)


METHOD = """
One client process keeps {in_flight} `snapshot` requests in flight against a server
holding {topics} topics (each reply a few MB) for {seconds:g} s — the load that used
to stop `hb` for 10–20 s, because batches were counted in requests, and then had
the busy time taken for a stall. Meanwhile {brokers} brokers registered with
`heartbeat_timeout_ms` = {timeout} fall silent, one every {gap_ms:g} ms. A
subscriber records the gaps between `hb` events (interval {interval:g} s) and the
arrival of each `removed`/`expired`; lateness = arrival − (arrival of the
registration's reply + timeout). The server starts the timeout when it applies the
registration, between the request's send and its reply's arrival, so a removal can
arrive before that mark by up to the reply's way back: such a sample counts 0 ms. A
removal before (the registration's send + timeout) is a broker expired early and ends
the run as an error, with no allowance: the server stamps a request with its clock read
after it read the request (whole ms, rounded down) and expires strictly after stamp +
timeout, so never before send + timeout. (It did stamp with a clock read up to 16
requests earlier, before the send behind these snapshots: removals came up to 9 ms
early.)
Stalls = `the server stalled` lines in the server's log (busy time must never be
one).
"""


def _flood(router: str, seconds: float, in_flight: int, done: multiprocessing.Queue) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(router)
    body = schema.encode({"op": "snapshot", "id": 1})
    for _ in range(in_flight):
        sock.send(body)
    replies = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if sock.poll(100):
            sock.recv()
            replies += 1
            sock.send(body)
    sock.close(0)
    ctx.term()
    done.put(replies)


def run(config: RunConfig) -> BenchResult:
    topics, seconds, in_flight, brokers = _params(config.quick)
    gaps_max, gaps_p99, late_p99, late_max, stalls, rates = [], [], [], [], [], []
    with start_zns(config.workdir / "zns", "--heartbeat-interval", str(INTERVAL_S),
                   "--max-topics-per-request", str(max(topics, 20_000))) as zns, \
            Session(zns.router) as session:
        check_reply(session.call_raw(register_request(
            "big", broker_addr(1), [f"Flood{i:05d}" for i in range(topics)])))
        ctx = zmq.Context.instance()
        for r in range(config.rounds):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 0)
            sub.connect(zns.pub)
            sub.setsockopt(zmq.SUBSCRIBE, schema.HB_CHANNEL)
            sub.setsockopt(zmq.SUBSCRIBE, schema.BROKER_PREFIX)
            if not sub.poll(10_000):
                raise BenchError("no hb within 10 s")
            done: multiprocessing.Queue = multiprocessing.Queue()
            flood = multiprocessing.Process(target=_flood,
                                            args=(zns.router, seconds, in_flight, done))
            flood.start()
            registered: dict[str, float] = {}
            sent_at: dict[str, float] = {}
            gap_ms = seconds * 500 / brokers
            hbs: list[float] = []
            expired: dict[str, float] = {}
            end = time.monotonic() + seconds
            next_broker = time.monotonic()
            while time.monotonic() < end or len(expired) < len(registered):
                now = time.monotonic()
                if len(registered) < brokers and now >= next_broker:
                    addr = broker_addr(1000 + r * brokers + len(registered))
                    sent_at[addr] = time.monotonic()  # the mark the server's stamp is after
                    check_reply(session.call_raw(register_request(
                        f"silent-{r}-{len(registered)}", addr, [],
                        heartbeat_timeout_ms=TIMEOUT_MS)))
                    # The reply leaves right after the server registered it: its arrival
                    # stamps the start of the timeout (the send time would count the wait
                    # behind the flood as lateness).
                    registered[addr] = time.monotonic()
                    next_broker = now + gap_ms / 1000
                if now > end + TIMEOUT_MS / 1000 + 10:
                    raise BenchError(f"only {len(expired)} of {len(registered)} expired")
                if not sub.poll(10):
                    continue
                while sub.poll(0):
                    channel, body = sub.recv_multipart()
                    at = time.monotonic()
                    event = schema.decode_event(body)
                    if channel == schema.HB_CHANNEL and at < end:
                        hbs.append(at)
                    elif isinstance(event, schema.BrokerEvent) and event.change == "removed":
                        expired[event.broker_addr] = at
            flood.join(30)
            replies = done.get(timeout=10)
            sub.close(0)
            gaps = [(b - a) * 1000 for a, b in zip(hbs, hbs[1:])]
            if not gaps:
                raise BenchError("no hb during the flood")
            early = {a: round((expired[a] - sent_at[a]) * 1000 - TIMEOUT_MS, 3)
                     for a in registered if (expired[a] - sent_at[a]) * 1000 < TIMEOUT_MS}
            if early:
                raise BenchError(f"{len(early)} brokers removed before their registration's "
                                 f"send + timeout (address: ms): {dict(list(early.items())[:3])}")
            # From the reply's arrival, which is after the server started the timeout: a
            # removal that beat the reply back counts 0 (see METHOD), never negative.
            lateness = [max(0.0, (expired[a] - t) * 1000 - TIMEOUT_MS)
                        for a, t in registered.items()]
            gaps_max.append(max(gaps))
            gaps_p99.append(percentile(gaps, 99))
            late_p99.append(percentile(lateness, 99))
            late_max.append(max(lateness))
            rates.append(replies / seconds)
            stalls.append(float(zns.log_path.read_text().count("the server stalled")))
            config.log(f"round {r + 1}: {replies} snapshots, hb gap max {max(gaps):.0f} ms, "
                       f"expiry lateness max {max(lateness):.0f} ms")
    interval_ms = INTERVAL_S * 1000
    figures = [
        Figure("flood: snapshots answered", "req/s", rates),
        Figure("flood: hb gap p99", "ms", gaps_p99, "hb interval", [interval_ms] * len(gaps_p99),
               target=Target("ratio", "<=", 2.0)),
        Figure("flood: hb gap max", "ms", gaps_max, "hb interval", [interval_ms] * len(gaps_max)),
        Figure("flood: expiry lateness p99", "ms", late_p99, target=Target("value", "<=", 100)),
        Figure("flood: expiry lateness max", "ms", late_max),
        Figure("flood: stalls logged (busy time taken for a stall)", "lines", stalls,
               target=Target("value", "<=", 0)),
    ]
    method = METHOD.format(in_flight=in_flight, topics=topics, seconds=seconds, brokers=brokers,
                           timeout=TIMEOUT_MS, gap_ms=seconds * 500 / brokers, interval=INTERVAL_S)
    return BenchResult("flood", "Timers under a flood of heavy requests", method, figures)


if __name__ == "__main__":
    cli({"flood": run})

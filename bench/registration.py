"""Benchmark 2: registrations and heartbeats, against the echo limit.

    python -m bench.registration [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.harness import (
    LoadClients, Session, broker_addr, check_reply, heartbeat_request, register_request,
    request, start_echo, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core import schema

GROUP = 10  # brokers that host the same topics, as the brokers of one cluster do
# zns's wire bound on topics in one request: the 100k-topic registration is
# clamped to it (the attribute is absent while zns has no such bound).
TOPICS_CAP = getattr(schema, "MAX_TOPICS_PER_REQUEST", 100_000)


@dataclass(frozen=True)
class Params:
    brokers: int
    topics: int  # per broker
    sizes: tuple[int, ...]  # topics in one registration, for the apply time
    duration: float
    warmup: float
    in_flight: int


FULL = Params(brokers=100, topics=100, sizes=(1_000, 10_000, min(100_000, TOPICS_CAP)),
              duration=1.0,
              warmup=0.3, in_flight=100)
QUICK = Params(brokers=4, topics=10, sizes=(100, 1_000), duration=0.1, warmup=0.1,
               in_flight=10)

METHOD = """
{brokers} brokers register with zns, {topics} topics each; every group of {group}
brokers hosts the same topics (so a route lists {group} brokers, as in a cluster). The
shared client harness keeps {in_flight} requests in flight, cycling over the brokers,
against zns and against the echo server (which gets the very same bodies):

- *unchanged*: RocketMQ's periodic re-registration — same DataVersion, so topic
  data is left alone (§4 step 4);
- *new DataVersion*: topic data is re-applied, but no route changes;
- *every route changes*: each registration flips the perm of its {topics} topics,
  so zns rebuilds, re-encodes and publishes {topics} routes per request;
- *heartbeat*: the light liveness request of registered brokers.

Apply time: one registration of a new broker carrying N new topics, timed from send
to reply at the client (1 in flight), then its `unregister_broker` (which removes
the N topics again). zns runs with `--max-topics-per-request` raised to the largest N;
{cap_note}
"""


def _register_all(name_version: int, p: Params, **extra: object) -> list[bytes]:
    return [
        register_request(
            f"broker-{b}", broker_addr(b), [f"G{b % GROUP}_{j}" for j in range(p.topics)],
            data_version={"counter": name_version}, **extra,
        )
        for b in range(p.brokers)
    ]


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    unchanged = _register_all(1, p)
    modes = [
        ("re-registration, unchanged", unchanged, None),
        ("registration, new DataVersion", _register_all(2, p) + _register_all(3, p), None),
        (f"registration, every route changes ({p.topics} events)",
         _register_all(4, p, topic_config={"perm": 4}) + _register_all(5, p), None),
        ("heartbeat", [
            heartbeat_request(f"broker-{b}", broker_addr(b), data_version={"counter": 1})
            for b in range(p.brokers)
        ], Target("ratio", ">=", 0.8)),
    ]
    rate = {(s, m[0]): [] for s in ("zns", "echo") for m in modes}
    cpu = {(s, m[0]): [] for s in ("zns", "echo") for m in modes}
    big = {n: register_request(f"big-{n}", broker_addr(10_000 + n),
                               [f"Big{n}_{j}" for j in range(n)]) for n in p.sizes}
    apply_ms: dict[int, list[float]] = {n: [] for n in p.sizes}
    remove_ms: dict[int, list[float]] = {n: [] for n in p.sizes}
    # The largest registration is above zns's default --max-topics-per-request (20,000).
    limit = str(max(p.sizes))
    with start_echo(config.workdir) as echo, \
            start_zns(config.workdir / "zns", "--max-topics-per-request", limit) as zns, \
            LoadClients(1) as clients, Session(zns.router) as session:
        servers = {"zns": zns, "echo": echo}
        for r in range(config.rounds):
            order = ["zns", "echo"] if r % 2 else ["echo", "zns"]
            for name, bodies, _ in modes:
                session.pipeline(unchanged)  # every mode starts from the same state
                for body in bodies[:2]:
                    check_reply(session.call_raw(body))
                for server in order:
                    load = clients.drive(servers[server], bodies, in_flight=p.in_flight,
                                         duration=p.duration, warmup=p.warmup)
                    rate[server, name].append(load.rate)
                    cpu[server, name].append(load.cpu_us_per_request)
                config.log(f"round {r + 1}: {name}: zns {rate['zns', name][-1]:,.0f}/s, "
                           f"echo {rate['echo', name][-1]:,.0f}/s")
            for n, body in big.items():
                apply_ms[n].append(_timed_ms(session, body))
                remove_ms[n].append(_timed_ms(session, request(
                    "unregister_broker", cluster="bench", broker_name=f"big-{n}", broker_id=0,
                    broker_addr=broker_addr(10_000 + n))))
                config.log(f"round {r + 1}: {n} topics: register {apply_ms[n][-1]:,.0f} ms, "
                           f"unregister {remove_ms[n][-1]:,.0f} ms")

    figures = [
        Figure(f"{name}: {'req' if name == 'heartbeat' else 'registrations'}/s", "req/s",
               rate["zns", name], "echo", rate["echo", name], target)
        for name, _, target in modes
    ]
    figures += [
        Figure(f"server CPU per request: {name}", "µs", cpu["zns", name], "echo",
               cpu["echo", name])
        for name, _, _ in modes
    ]
    smallest = p.sizes[0]
    for n in p.sizes:
        for verb, times in (("register", apply_ms), ("unregister", remove_ms)):
            per_topic = [t * 1000 / n for t in times[n]]
            figures.append(Figure(
                f"{verb} one broker with {n:,} topics", "ms", times[n],
                note=f"{min(per_topic):.1f}–{max(per_topic):.1f} µs per topic",
                **({} if n == smallest else {
                    "reference": f"{smallest:,}-topic time × {n / smallest:g}",
                    "reference_rounds": [t * n / smallest for t in times[smallest]],
                }),
            ))
    cap_note = (f"100,000 topics is above zns's bound of {TOPICS_CAP:,} topics per request, "
                "so the largest registration is that bound." if TOPICS_CAP < 100_000 else "")
    method = METHOD.format(brokers=p.brokers, topics=p.topics, group=GROUP,
                           in_flight=p.in_flight, cap_note=cap_note)
    return BenchResult("registration", "Registration and heartbeats", method, figures)


def _timed_ms(session: Session, body: bytes) -> float:
    started = time.monotonic()
    check_reply(session.call_raw(body))
    return (time.monotonic() - started) * 1000


if __name__ == "__main__":
    raise SystemExit(cli({"registration": run}))

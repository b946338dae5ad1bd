"""Benchmark 5: get_route throughput and server memory as the cluster grows.

    python -m bench.scale [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.harness import (
    BenchError,
    LoadClients, ServerProcess, Session, broker_addr, register_request, request, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli

HOSTS_PER_TOPIC = 2  # every topic lives on two broker names: routes stay the same size


@dataclass(frozen=True)
class Params:
    topics: tuple[int, ...]
    brokers: tuple[int, ...]
    duration: float
    warmup: float
    in_flight: int


FULL = Params(topics=(10, 1_000, 10_000, 100_000), brokers=(10, 100, 1_000), duration=1.0,
              warmup=0.3, in_flight=100)
# --quick (the smoke test, on a loaded machine): a window long enough that one process
# descheduled for a moment does not leave it without a reply (a 0.3 s window once had none).
QUICK = Params(topics=(10, 300), brokers=(2, 10), duration=0.8, warmup=0.5, in_flight=10)

METHOD = """
For every pair of T topics and B broker names, a fresh `zns serve` process gets B
brokers registered; topic *i* lives on broker names *i* mod B and (*i*+1) mod B, so
there are 2T (topic, broker) queue entries and every route has the same size
(2 queues, 2 brokers) whatever the scale (brokers left without a topic register
with none). Throughput: the shared client harness keeps {in_flight} `get_route`
requests in flight for one topic; in every round the reference — a server holding
{ref_topics} topics on {ref_brokers} brokers, kept running throughout — is measured
just before or after, and the ratio is taken per round. Memory: the server's VmRSS
(`/proc/<pid>/status`) after the registrations, minus its VmRSS right after start;
per queue entry = that growth / 2T, so every per-topic structure (the cached route
and its encoding, the revision) is charged to the entries.
"""


def registrations(topics: int, brokers: int) -> list[bytes]:
    hosted: list[list[str]] = [[] for _ in range(brokers)]
    for i in range(topics):
        for k in range(HOSTS_PER_TOPIC):
            hosted[(i + k) % brokers].append(f"S{i}")
    return [register_request(f"broker-{b}", broker_addr(b), hosted[b]) for b in range(brokers)]


def start_loaded(config: RunConfig, topics: int, brokers: int,
                 tag: str = "") -> tuple[ServerProcess, int]:
    """A fresh server holding `topics` × `brokers`; (it, its RSS growth in KiB). `tag`: a
    server running beside another of the same shape needs files of its own."""
    server = start_zns(config.workdir / f"scale-{topics}-{brokers}{tag}")
    try:
        with Session(server.router) as session:
            session.call("status")
            before = server.rss_kib()
            session.pipeline(registrations(topics, brokers), in_flight=4)
            status = session.call("status")
            assert status.topics == topics and status.brokers == brokers, status
            session.call("get_route", topic=f"S{topics // 2}")
        return server, server.rss_kib() - before
    except BaseException:
        server.stop()
        raise


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    ref_t, ref_b = p.topics[0], p.brokers[0]
    figures = []
    with LoadClients(1) as clients:
        reference, _ = start_loaded(config, ref_t, ref_b, "-reference")
        ref_body = [request("get_route", topic=f"S{ref_t // 2}")]
        with reference:
            for topics in p.topics:
                for brokers in p.brokers:
                    server, grown_kib = start_loaded(config, topics, brokers)
                    body = [request("get_route", topic=f"S{topics // 2}")]
                    rate, ref_rate, cpu, ref_cpu = [], [], [], []
                    with server:
                        for r in range(config.rounds):
                            pair = [(server, body, rate, cpu), (reference, ref_body, ref_rate, ref_cpu)]
                            for srv, bodies, rates, cpus in pair[::1 if r % 2 else -1]:
                                load = clients.drive(srv, bodies, in_flight=p.in_flight,
                                                     duration=p.duration, warmup=p.warmup)
                                rates.append(load.rate)
                                cpus.append(load.cpu_us_per_request)
                    largest = topics == p.topics[-1]
                    at_scale = largest and brokers == p.brokers[-1]
                    label = f"{topics:,} topics, {brokers:,} brokers"
                    ref_label = f"{ref_t} topics, {ref_b} brokers"
                    per_entry = grown_kib * 1024 / (HOSTS_PER_TOPIC * topics)
                    figures += [
                        Figure(f"get_route: {label}", "req/s", rate, ref_label, ref_rate,
                               Target("ratio", ">=", 0.9) if at_scale else None),
                        Figure(f"server CPU per get_route: {label}", "µs", cpu, ref_label,
                               ref_cpu),
                        Figure(f"RSS growth: {label}", "KiB", [grown_kib]),
                        Figure(f"memory per queue entry: {label}", "B", [per_entry],
                               target=Target("value", "<=", 1024) if largest else None),
                    ]
                    if figures[-4].ratio is None:  # every reference window answered nothing
                        raise BenchError(f"{label}: the reference server ({ref_label}) "
                                         f"answered nothing in {ref_rate} req/s windows; "
                                         f"no ratio to report")
                    config.log(f"{label}: {figures[-4].value:,.0f} req/s "
                               f"({figures[-4].ratio:.2f}× reference), +{grown_kib:,} KiB, "
                               f"{per_entry:.0f} B per entry")
    method = METHOD.format(in_flight=p.in_flight, ref_topics=ref_t, ref_brokers=ref_b)
    return BenchResult("scale", "Scale: throughput and memory", method, figures)


if __name__ == "__main__":
    raise SystemExit(cli({"scale": run}))

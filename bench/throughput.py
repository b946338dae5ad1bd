"""Benchmark 1: get_route throughput, zns against the echo limit.

Both servers run in their own process and are driven by the very same client
processes (`harness.LoadClients`) with the very same request body; rounds
alternate which server goes first.

    python -m bench.throughput [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.harness import (
    LoadClients, Session, broker_addr, percentile, register_request, request, start_echo,
    start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli

TOPIC = "BenchTopic"
BROKERS = 2  # two broker names host every topic: a ~300-byte route of 2 queues, 2 brokers


@dataclass(frozen=True)
class Params:
    duration: float
    warmup: float
    many: int  # requests in flight in the pipelined modes
    batch: int  # topics per get_routes


FULL = Params(duration=1.0, warmup=0.3, many=100, batch=50)
QUICK = Params(duration=0.1, warmup=0.1, many=10, batch=5)

METHOD = """
zns (`zns serve`, default options) and `bench/echo_server.py` — a bare pyzmq ROUTER
with zns's loop shape and socket calls (blocking `zmq.Poller`, NOBLOCK drain frame by
frame with `copy=False`, DONTWAIT replies) that sends each request back — run in
their own processes. The same client processes
(`bench/harness.py`, a DEALER each) keep *N* `get_route` requests in flight for a
timed window after a warm-up and count replies; the echo server receives the same
`get_route` body. Two broker names host the topic, so a reply carries a ~300-byte
route. "2 client processes" splits the in-flight requests evenly between two
processes. `get_routes` asks for 50 topics per request (a ~15 KB reply); its
reference is zns's own `get_route` rate, to show what batching buys.
"""

CPU_NOTE = (
    "CPU time the server process used (/proc/<pid>/stat) divided by the requests it "
    "answered; unlike a rate it barely moves with other load on a shared machine, so "
    "its inverse ratio (echo/zns) is the steadiest estimate of the throughput ratio."
)

MULTIPART_NOTE = (
    "not a target: `bench/echo_server.py multipart`, the idiomatic echo with "
    "recv_multipart/send_multipart (the kind of server the issue's ~55-60k req/s "
    "figure describes). It asks the socket for RCVMORE after every frame; zns and the "
    "reference read Frame.more instead."
)


def setup(session: Session, topics: list[str]) -> None:
    session.pipeline([
        register_request(f"broker-{b}", broker_addr(b), topics) for b in range(BROKERS)
    ])


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    topics = [TOPIC] + [f"Topic{i:03d}" for i in range(max(p.batch, 99))]
    get_route = request("get_route", topic=TOPIC)
    get_routes = request("get_routes", topics=topics[1:p.batch + 1])
    modes = [
        ("get_route, 1 in flight", 1, 1, Target("ratio", ">=", 0.9)),
        (f"get_route, {p.many} in flight, 1 client process", p.many, 1,
         Target("ratio", ">=", 0.85)),
        (f"get_route, {p.many} in flight, 2 client processes", p.many, 2,
         Target("ratio", ">=", 0.85)),
    ]
    rate = {(s, m[0]): [] for s in ("zns", "echo") for m in modes}  # req/s per round
    cpu = {(s, m[0]): [] for s in ("zns", "echo") for m in modes}  # server µs per request
    rtt = {"zns": ([], []), "echo": ([], [])}  # p50s, p99s per round
    batch_rates: list[float] = []
    multipart_echo: tuple[list[float], list[float]] = ([], [])  # req/s, server µs per request
    with start_echo(config.workdir) as echo, start_zns(config.workdir / "zns") as zns, \
            start_echo(config.workdir, io="multipart") as echo_multipart, \
            LoadClients(2) as clients, Session(zns.router) as session:
        setup(session, topics)
        session.call_raw(get_route)
        reply = session.call("get_routes", topics=topics[1:p.batch + 1])
        assert not reply.missing and len(reply.routes) == p.batch
        servers = {"zns": zns, "echo": echo}
        for r in range(config.rounds):
            order = ["zns", "echo"] if r % 2 else ["echo", "zns"]
            for name, in_flight, procs, _ in modes:
                for server in order:
                    load = clients.drive(servers[server], [get_route], in_flight=in_flight,
                                         processes=procs, duration=p.duration, warmup=p.warmup)
                    rate[server, name].append(load.rate)
                    cpu[server, name].append(load.cpu_us_per_request)
                    if in_flight == 1:
                        rtt[server][0].append(percentile(load.latencies, 50) * 1e6)
                        rtt[server][1].append(percentile(load.latencies, 99) * 1e6)
                config.log(f"round {r + 1}: {name}: zns {rate['zns', name][-1]:,.0f}/s, "
                           f"echo {rate['echo', name][-1]:,.0f}/s")
            load = clients.drive(zns, [get_routes], in_flight=p.many, processes=1,
                                 duration=p.duration, warmup=p.warmup)
            batch_rates.append(load.rate)
            load = clients.drive(echo_multipart, [get_route], in_flight=p.many, processes=1,
                                 duration=p.duration, warmup=p.warmup)
            multipart_echo[0].append(load.rate)
            multipart_echo[1].append(load.cpu_us_per_request)

    figures = [
        Figure(name, "req/s", rate["zns", name], "echo", rate["echo", name], target)
        for name, _, _, target in modes
    ]
    figures += [
        Figure(f"server CPU per request: {name}", "µs", cpu["zns", name], "echo",
               cpu["echo", name], note="" if i else CPU_NOTE)
        for i, (name, _, _, _) in enumerate(modes)
    ]
    figures += [
        Figure("get_route round trip p50, 1 in flight", "µs", rtt["zns"][0], "echo",
               rtt["echo"][0]),
        Figure("get_route round trip p99, 1 in flight", "µs", rtt["zns"][1], "echo",
               rtt["echo"][1]),
        Figure(f"get_routes ({p.batch} topics), {p.many} in flight", "req/s", batch_rates),
        Figure(f"get_routes ({p.batch} topics): routes/s", "routes/s",
               [rate * p.batch for rate in batch_rates],
               f"get_route, {p.many} in flight", rate["zns", modes[1][0]]),
    ]
    reference = modes[1][0]
    figures += [
        Figure(f"zns against the recv_multipart echo: {reference}", "req/s",
               rate["zns", reference], "recv_multipart echo", multipart_echo[0],
               note=MULTIPART_NOTE),
        Figure(f"recv_multipart echo: server CPU per request, {p.many} in flight", "µs",
               multipart_echo[1], "echo", cpu["echo", reference]),
    ]
    return BenchResult("throughput", "get_route throughput against the echo limit",
                       METHOD, figures)


if __name__ == "__main__":
    raise SystemExit(cli({"throughput": run}))

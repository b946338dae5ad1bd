"""Benchmark 6: a network partition (mass expiry) and a restart's re-registration storm.

    python -m bench.partition [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.harness import (
    PROBE_EVERY_S, BenchError, Probe, Session, Subscribers, broker_addr, heartbeat_request,
    register_request, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core.schema import BROKER_PREFIX


@dataclass(frozen=True)
class Params:
    alone: int  # brokers with one topic each
    shared: int  # brokers sharing `shared_topics` topics
    shared_topics: int
    storm: int  # re-registering brokers
    storm_topics: int  # shared by all of them
    timeout_ms: int


FULL = Params(alone=10_000, shared=1_000, shared_topics=50, storm=1_000, storm_topics=100,
              timeout_ms=5_000)
QUICK = Params(alone=200, shared=50, shared_topics=10, storm=50, storm_topics=20,
               timeout_ms=1_000)

METHOD = """
**Partition.** A fresh server; {alone} brokers with one topic each (then, in a second
server, {shared} brokers sharing {shared_topics} topics) register with
`heartbeat_timeout_ms` = {timeout} and never heartbeat again: every one of them goes
silent at once, as in a network partition (each is sent one `heartbeat` right after
all registered, so the silences start within a few hundred ms of each other). One subscriber process counts the
`removed` events. Deadline-to-last-removed = the arrival of the last `removed` minus
(the reply to the last registration + the timeout), an upper bound of the lateness
of the last expiry. Meanwhile a probe sends `get_route` every {probe_ms:g} ms on its
own connection; its worst round trip, from the deadline until the last `removed`, is
the longest the loop was blocked (the targets: 2 s and 300 ms).

**Re-registration storm.** A fresh server (a restart) and {storm} brokers each
registering the same {storm_topics} topics, pipelined 100 in flight: the wall time
until every reply arrived (target 10 s). Every registration changes every shared
route, so each one publishes {storm_topics} route events listing every broker so far.
"""


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    alone_late, alone_block, shared_late, shared_block, storm = [], [], [], [], []
    for r in range(config.rounds):
        late, block = _partition(config, p, [[f"Alone{i}"] for i in range(p.alone)], f"a{r}")
        alone_late.append(late)
        alone_block.append(block)
        topics = [f"Shared{t}" for t in range(p.shared_topics)]
        late, block = _partition(config, p, [topics] * p.shared, f"s{r}")
        shared_late.append(late)
        shared_block.append(block)
        storm.append(_storm(config, p, r))
        config.log(f"round {r + 1}: {alone_late[-1]:.2f} s / {shared_late[-1]:.2f} s late, "
                   f"probe max {alone_block[-1]:.0f} / {shared_block[-1]:.0f} ms, "
                   f"storm {storm[-1]:.2f} s")
    figures = [
        Figure(f"{p.alone} brokers x 1 topic: deadline to last removed", "s", alone_late,
               target=Target("value", "<=", 2)),
        Figure(f"{p.alone} brokers x 1 topic: longest get_route meanwhile", "ms", alone_block,
               target=Target("value", "<=", 300)),
        Figure(f"{p.shared} brokers x {p.shared_topics} shared topics: deadline to last removed",
               "s", shared_late, target=Target("value", "<=", 2)),
        Figure(f"{p.shared} brokers x {p.shared_topics} shared topics: longest get_route "
               "meanwhile", "ms", shared_block, target=Target("value", "<=", 300)),
        Figure(f"re-registration, {p.storm} brokers x {p.storm_topics} shared topics", "s",
               storm, target=Target("value", "<=", 10)),
    ]
    method = METHOD.format(alone=p.alone, shared=p.shared, shared_topics=p.shared_topics,
                           timeout=p.timeout_ms, probe_ms=PROBE_EVERY_S * 1000, storm=p.storm,
                           storm_topics=p.storm_topics)
    return BenchResult("partition", "Partition and re-registration storm", method, figures)


def _partition(config: RunConfig, p: Params, topics: list[list[str]], tag: str) -> tuple[float, float]:
    """(seconds from the last deadline to the last `removed`, the probe's worst ms meanwhile)."""
    with start_zns(config.workdir / f"zns-{tag}") as zns, Session(zns.router) as session:
        subs = Subscribers(zns.pub, [BROKER_PREFIX], ack=True)
        # Probing from before the brokers register: a probe started only at the deadline
        # could, on a loaded machine, take its first sample after a quick run's last expiry.
        probe = Probe(zns.router, topics[0][0])
        try:
            probe.started()
            subs.wait_ready()
            bodies = [register_request(f"p-{i}", broker_addr(i), names,
                                       heartbeat_timeout_ms=p.timeout_ms)
                      for i, names in enumerate(topics)]
            session.pipeline(bodies)
            # Registering takes a while; heartbeats are quick: they make the silence begin
            # within a few hundred ms for every broker, as a partition would.
            session.pipeline([heartbeat_request(f"p-{i}", broker_addr(i))
                              for i in range(len(topics))])
            deadline = time.monotonic() + p.timeout_ms / 1000
            if not subs.wait_acked(2 * len(topics), timeout=p.timeout_ms / 1000 + 60):
                raise BenchError("not every broker expired within 60 s of its deadline")
        finally:
            probe.stop()
            arrivals = subs.stop()
    removed = [a.at for a in arrivals if a.op == "broker" and a.change == "removed"]
    if len(removed) != len(topics):
        raise BenchError(f"{len(removed)} removed events for {len(topics)} brokers")
    last = max(removed)
    return max(0.0, last - deadline), probe.worst_ms(deadline, last)


def _storm(config: RunConfig, p: Params, r: int) -> float:
    topics = [f"Storm{t}" for t in range(p.storm_topics)]
    with start_zns(config.workdir / f"zns-storm{r}") as zns, Session(zns.router) as session:
        bodies = [register_request(f"st-{i}", broker_addr(i), topics) for i in range(p.storm)]
        start = time.monotonic()
        session.pipeline(bodies)
        return time.monotonic() - start


if __name__ == "__main__":
    raise SystemExit(cli({"partition": run}))

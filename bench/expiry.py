"""Benchmark 4: how late expiry events are, and end-to-end failure detection.

    python -m bench.expiry [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import inspect
import multiprocessing
import random
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from bench.harness import (
    BenchError, Session, Subscribers, broker_addr, check_reply, percentile, register_request,
    start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core.schema import BROKER_PREFIX

TIMEOUT_MS = 1000  # the smallest heartbeat_timeout_ms ZNS/1 allows
ROCKETMQ_TIMEOUT_S = 120.0  # BROKER_CHANNEL_EXPIRED_TIME
ROCKETMQ_POLL_S = 30.0  # pollNameServerInterval


@dataclass(frozen=True)
class Params:
    brokers: int  # expiries per round
    gap_s: float  # between consecutive last heartbeats
    agents: int  # BrokerAgents killed per round
    agent_override: dict  # BrokerAgent settings; empty: its defaults


FULL = Params(brokers=300, gap_s=0.005, agents=3, agent_override={})
# A smoke run cannot wait 10 s: short agent settings, same code path.
QUICK = Params(brokers=20, gap_s=0.005, agents=1,
               agent_override={"heartbeat_interval": 0.2, "heartbeat_timeout_ms": 1000})

METHOD = """
**Expiry lateness.** One subscriber (its own process) listens on `broker/`. Per round
the orchestrator registers {brokers} brokers with `heartbeat_timeout_ms` = {timeout}
(the §3 minimum), one every {gap_ms:g} ms, and never heartbeats them again, so
their deadlines are staggered over {span:g} s. Lateness = the subscriber's arrival
stamp of the `removed`/`expired` event minus (the orchestrator's stamp just before
it sent that broker's registration + the timeout). The server takes its `now` after
the request arrives and expires at `now > deadline` in whole milliseconds, so this
is an upper bound that includes up to ~1–2 ms of rounding and the request's one-way
trip; p50/p99 per round of {brokers} expiries.

**End-to-end failure detection.** {agents} `zns.BrokerAgent`s per round, each in its
own process with {settings}, register a broker; each process is then killed with
SIGKILL (no unregister) at a random moment, and the time from the kill to the
subscriber receiving the `removed`/`expired` event is measured. Since the last
heartbeat precedes the kill by 0–1 interval, expect timeout − interval … timeout,
plus the lateness above. The computed worst case is timeout + lateness p99.
RocketMQ with its defaults: a broker is dropped after up to 120 s without a
heartbeat, and a client learns of it at its next route poll, up to 30 s later:
up to 150 s.
"""


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    lateness: list[list[float]] = []
    detection: list[list[float]] = []
    settings = _agent_settings(p)
    with start_zns(config.workdir / "zns") as zns, Session(zns.router) as session:
        subs = Subscribers(zns.pub, [BROKER_PREFIX], ack=True)
        try:
            subs.wait_ready()
            events = 0  # broker events so far: one `registered` and one `removed` per broker
            rounds = []
            for r in range(config.rounds):
                sent = _register_staggered(session, p, first=r * p.brokers)
                events += 2 * len(sent)
                if not subs.wait_acked(events, timeout=TIMEOUT_MS / 1000 + 10):
                    raise BenchError(f"round {r + 1}: not every expiry arrived within 10 s")
                rounds.append(sent)
                config.log(f"round {r + 1}: {len(sent)} expiries")
            killed = _kill_agents(zns.router, p, config.rounds, settings)
            events += 2 * len(killed)
            timeout_s = settings["heartbeat_timeout_ms"] / 1000
            if not subs.wait_acked(events, timeout=timeout_s + 15):
                raise BenchError("not every killed BrokerAgent expired in time")
        finally:
            arrivals = subs.stop()
    expired = {a.key: a.at for a in arrivals
               if a.op == "broker" and a.change == "removed" and a.reason == "expired"}
    for sent in rounds:
        lateness.append([(expired[addr] - at - TIMEOUT_MS / 1000) * 1000
                         for addr, at in sent.items()])
    for r in range(config.rounds):
        batch = killed[r * p.agents:(r + 1) * p.agents]
        detection.append([expired[addr] - at for addr, at in batch])

    p50 = [percentile(x, 50) for x in lateness]
    p99 = [percentile(x, 99) for x in lateness]
    rocketmq = ROCKETMQ_TIMEOUT_S + ROCKETMQ_POLL_S
    label = ", ".join(f"{k} {v:g}" for k, v in settings.items())
    figures = [
        Figure("expiry event lateness p50", "ms", p50),
        Figure("expiry event lateness p99", "ms", p99, target=Target("value", "<=", 100)),
        Figure("expiry event lateness max", "ms", [max(x) for x in lateness]),
        Figure(f"failure detection, BrokerAgent killed ({label}): median", "s",
               [percentile(x, 50) for x in detection], "RocketMQ defaults, worst case",
               [rocketmq]),
        Figure(f"failure detection, BrokerAgent killed ({label}): max", "s",
               [max(x) for x in detection], "RocketMQ defaults, worst case", [rocketmq]),
        Figure(f"failure detection, computed worst case ({label})", "s",
               [timeout_s + x / 1000 for x in p99], "RocketMQ defaults, worst case",
               [rocketmq], note="heartbeat_timeout_ms + expiry lateness p99"),
    ]
    method = METHOD.format(
        brokers=p.brokers, timeout=TIMEOUT_MS, gap_ms=p.gap_s * 1000,
        span=round(p.brokers * p.gap_s, 2), agents=p.agents,
        settings="its default settings (" + label + ")" if not p.agent_override
        else f"short settings ({label}; a smoke run)",
    )
    return BenchResult("expiry", "Expiry and failure detection", method, figures)


def _register_staggered(session: Session, p: Params, first: int) -> dict[str, float]:
    """Register p.brokers brokers, one every p.gap_s; {address: send stamp}."""
    sent = {}
    start = time.monotonic()
    for i in range(p.brokers):
        delay = start + i * p.gap_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        addr = broker_addr(first + i)
        body = register_request(f"exp-{first + i}", addr, [f"Exp{first + i}"],
                                heartbeat_timeout_ms=TIMEOUT_MS)
        sent[addr] = time.monotonic()
        check_reply(session.call_raw(body))
    return sent


def _agent_settings(p: Params) -> dict[str, float]:
    from zns.drivers.broker_agent import BrokerAgent

    defaults = inspect.signature(BrokerAgent).parameters
    names = ("heartbeat_interval", "heartbeat_timeout_ms")
    return {n: p.agent_override.get(n, defaults[n].default) for n in names}


def _kill_agents(router: str, p: Params, rounds: int, settings: dict[str, float]
                 ) -> list[tuple[str, float]]:
    """Start rounds × p.agents BrokerAgent processes, SIGKILL each at a random moment;
    [(its broker address, the kill stamp)]."""
    mp = multiprocessing.get_context("spawn")
    agents = []
    for i in range(rounds * p.agents):
        addr = broker_addr(1_000_000 + i)
        parent, child = mp.Pipe()
        proc = mp.Process(target=_agent_main, args=(child, router, f"agent-{i}", addr, settings),
                          daemon=True)
        proc.start()
        agents.append((proc, parent, addr))
    try:
        for proc, conn, _ in agents:
            if not conn.poll(30) or conn.recv() != "registered":
                raise BenchError("a BrokerAgent did not register")
        killed = []
        for proc, _, addr in agents:
            time.sleep(random.uniform(0, settings["heartbeat_interval"]))  # any heartbeat phase
            killed.append((addr, time.monotonic()))
            proc.kill()
        return killed
    finally:
        for proc, _, _ in agents:
            proc.kill()
            proc.join(5)


def _agent_main(conn: Connection, router: str, name: str, addr: str,
                settings: dict[str, float]) -> None:
    from zns.drivers.broker_agent import BrokerAgent

    agent = BrokerAgent(router, cluster="bench", broker_name=name, broker_addr=addr,
                        topics=[name.replace("-", "_")], **settings)
    deadline = time.monotonic() + 20
    while not agent.registered_everywhere() and time.monotonic() < deadline:
        time.sleep(0.01)
    conn.send("registered" if agent.registered_everywhere() else "failed")
    time.sleep(120)  # until killed; bounded in case the parent died


if __name__ == "__main__":
    raise SystemExit(cli({"expiry": run}))

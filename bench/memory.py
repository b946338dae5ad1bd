"""Benchmark: the memory the heaviest accepted registrations make the server hold, the
loop time they take, and whether memory comes back once topics are gone (issue 12,
Hardening II, items 9 and 10).

    python -m bench.memory [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import zmq

from bench.harness import (
    BenchError, Probe, ServerProcess, Session, check_reply, register_request,
    request, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core import schema
from zns.core.limits import Limits
from zns.core.service import NameService
from zns.drivers.kv_file import KvStore

BUDGET_MIB = 1024  # item 9: no request within the limits makes the server use more
BLOCK_MS = 1000  # item 9: ... or block the loop longer
RETURN_MIB = 64  # item 10: memory returns to within this of its start
REMOVAL_MS = 100  # item 10: a broker removal after churn (it took 444 ms when filed)
HEAVY_REPLY_TIMEOUT_MS = 120_000
PROBE_TOPIC = "ProbeNoSuchTopic"  # asking for a topic nobody registered adds no state


@dataclass(frozen=True)
class Params:
    limits: Limits  # what the server runs with (FULL: the defaults, no option given)
    churn_names: int  # topic churn: distinct topic names seen in all
    churn_window: int  # topics per registration, all new every time
    config_topics: int  # configuration churn: one broker's topics
    config_rounds: int  # ... re-registered with a new read_queues this many times
    live_names: int  # the in-process (tracemalloc) topic churn
    live_config_rounds: int  # the in-process configuration churn


FULL = Params(limits=Limits(), churn_names=1_000_000, churn_window=1_000, config_topics=10_000,
              config_rounds=200, live_names=50_000, live_config_rounds=5)
QUICK = Params(limits=Limits(max_topics_per_request=200, max_topics=2_000, max_queues=10_000),
               churn_names=2_000, churn_window=200, config_topics=200, config_rounds=5,
               live_names=1_000, live_config_rounds=3)

METHOD = """
Every figure is a fresh `zns serve` process with {limits_text}; its memory is VmRSS
from `/proc/<pid>/status` (growth = after minus right after start, once a `status`
was answered) and VmHWM (the peak since start: what the server needed on the way).
Names are as long as §3 allows, so each entry weighs its most: cluster, broker
names, zone and addresses of 255 characters, topics of 127. While the requests are
applied a probe sends `get_route` every 5 ms on its own connection (for a topic
nobody registered: it adds no state); its longest round trip is the longest the
loop was blocked.

**Item 9, one registration.** The heaviest single `register_broker` the limits
accept: {topics:,} topics (`--max-topics-per-request`) with {fs} filter servers of
255 characters, weight {topics:,} × (1 + {fs}) = {weight:,} against
`--max-queues` {max_queues:,}. Every route of the name lists every filter server,
so each costs ~260 bytes in each topic's encoded route; more filter servers on
fewer topics weigh the same. Then, with the table full, a second address of that
broker name (id 1, a slave) registers no topics and one filter server: every
route of the name would then list both, {slave_weight:,} more entries, so
`max_queues` must refuse it; the figure is the entries accepted past the limit
(0 when refused). *Five times:* the same registration sent under 5
broker names (addresses of their own) one after the other: {five_outcome}

**Item 9, the heaviest state.** What the limits let a fleet pile up: per unit of
`--max-queues` weight a queue entry (a route's QueueData plus its BrokerData: two
255-character names, a 255-character address, cluster and zone, ~1.3 KB encoded)
holds more than a filter server or an extra address (~260 bytes), so the heaviest
state is {heavy_names} broker names × {heavy_topics:,} topics (`--max-topics`) =
{heavy_entries:,} queue entries, registered as {heavy_requests} requests of
{topics:,} topics (`incremental` after each name's first). Then a sixth broker
name with one of those topics must be refused (`max_queues`), showing the table
is full. The probe's worst is over all {heavy_requests} requests.

**Item 10, topic churn.** One broker re-registers (a new `data_version` each time)
with {window:,} topics, new names every time, until {churn:,} distinct names were
seen, then registers with none. **Configuration churn**: a one-topic broker, then
one with {config_topics:,} topics re-registered {config_rounds} times with a new
`read_queues` each time (and `write_queues` different per topic: every topic's queue
data is a new value each time, {config_values:,} in all); then the one-topic broker is unregistered (the round
trip: a removal must cost what it removes, not the table size) and the big one
too. Both: RSS at the end minus RSS right after start.
**Live bytes** (in-process): the same two churns, smaller ({live_names:,} names;
{config_topics:,} topics × {live_config_rounds} rounds), run on a `NameService`
under `tracemalloc`: the bytes of live objects at the end minus at the start,
which separates what the table keeps from what the allocator keeps.
The single registrations are measured in each of the {rounds} round(s); the heavy
state and the churns (up to about a minute each at full size) once.
"""


@dataclass
class _Round:
    """What one measurement gave: RSS growth and peak (MiB), probe worst (ms), notes."""
    held_mib: float = 0.0
    peak_mib: float = 0.0
    worst_ms: float = 0.0
    seconds: float = 0.0
    past_limit: float = 0.0  # queue entries accepted past --max-queues (one_registration)
    notes: list[str] = field(default_factory=list)


# --- names as long as the schema lets them be ----------------------------------------

CLUSTER = "c" * 255
ZONE = "z" * 255


def _name(i: int) -> str:
    return f"broker{i:06d}".ljust(255, "n")


def _addr(i: int, kind: str = "a") -> str:
    """A 255-character host:port, distinct per (kind, i): four DNS labels and a port."""
    host = ".".join([f"{kind}{i:07d}".ljust(63, "h"), "b" * 63, "c" * 63, "d" * 57])
    return f"{host}:65535"


def _topic(i: int) -> str:
    return f"T{i:08d}".ljust(127, "t")


def _register(name: int, topics: list[str] | range | dict[str, dict], *, version: int = 0,
              servers: Sequence[str] = (), incremental: bool = False) -> bytes:
    """Broker `name`'s registration; `topics` as names (default configuration), indexes
    of `_topic` names, or a map of names to their configurations."""
    if isinstance(topics, range):
        topics = [_topic(t) for t in topics]
    if not isinstance(topics, dict):
        topics = {t: {} for t in topics}
    return request(
        "register_broker", cluster=CLUSTER, broker_name=_name(name), broker_id=0,
        broker_addr=_addr(name), ha_addr=_addr(name, "h"), zone=ZONE, topics=topics,
        filter_servers=list(servers), data_version={"counter": version},
        incremental=incremental)


def _server_args(limits: Limits) -> list[str]:
    if limits == Limits():
        return []  # the defaults, as a server started without options has them
    return ["--max-topics-per-request", str(limits.max_topics_per_request),
            "--max-topics", str(limits.max_topics), "--max-queues", str(limits.max_queues)]


def _mib(kib: int) -> float:
    return kib / 1024


def _refusal(body: bytes) -> schema.Error | None:
    reply = schema.decode_reply(body)
    return reply if isinstance(reply, schema.Error) else None


class _Measured:
    """A fresh server, its RSS right after start, and a probe running while the work runs."""

    def __init__(self, config: RunConfig, tag: str, limits: Limits, probe: bool = True) -> None:
        self.server: ServerProcess = start_zns(config.workdir / tag, *_server_args(limits))
        self.session = Session(self.server.router)
        # These requests are heavy by design: on a loaded machine one may take longer than
        # the harness's usual reply timeout, which would end the run rather than measure it.
        self.session.sock.setsockopt(zmq.RCVTIMEO, HEAVY_REPLY_TIMEOUT_MS)
        self.session.call("status")
        self.rss0 = self.server.rss_kib()
        self.probe = Probe(self.server.router, PROBE_TOPIC) if probe else None
        if self.probe:
            self.probe.start()
            deadline = time.monotonic() + 10
            while not self.probe.samples and time.monotonic() < deadline:
                time.sleep(0.01)
        self.started = time.monotonic()

    def finish(self) -> _Round:
        ended = time.monotonic()
        out = _Round(seconds=ended - self.started)
        if self.probe:
            time.sleep(0.2)  # a sample sent just before the end may still be waiting
            self.probe.stop()
            out.worst_ms = self.probe.worst_ms(self.started + 0.5, ended)
        self.session.call("status")
        out.held_mib = _mib(self.server.rss_kib() - self.rss0)
        out.peak_mib = _mib(self.server.peak_rss_kib() - self.rss0)
        return out

    def close(self) -> None:
        if self.probe and self.probe.is_alive():
            self.probe.stop()
        self.session.close()
        self.server.stop()


# --- item 9 -------------------------------------------------------------------------


def _shape(limits: Limits) -> tuple[int, int]:
    """(topics, filter servers) of the heaviest one registration: as many topics as one
    request may list, then as many filter servers as the weight lets through."""
    topics = limits.max_topics_per_request
    servers = min(schema.MAX_FILTER_SERVERS, limits.max_queues // topics - 1)
    if servers < 0:
        raise BenchError(f"{topics} topics alone exceed --max-queues {limits.max_queues}")
    return topics, servers


def _servers(count: int) -> list[str]:
    return [_addr(k, "f") for k in range(count)]


def one_registration(config: RunConfig, p: Params, r: int, times: int) -> _Round:
    """The heaviest one registration, sent `times` times under as many broker names;
    each is expected accepted while the weight fits and refused (max_queues) after."""
    topics, fs = _shape(p.limits)
    names = [_topic(t) for t in range(topics)]
    bodies = [_register(i, names, servers=_servers(fs)) for i in range(times)]
    weight_each = topics * (1 + fs)
    m = _Measured(config, f"one-{times}-{r}", p.limits)
    try:
        outcomes = []
        for i, body in enumerate(bodies):
            refusal = _refusal(m.session.call_raw(body))
            fits = (i + 1) * weight_each <= p.limits.max_queues
            if refusal is None and not fits:
                raise BenchError(f"registration {i + 1} was accepted; the weight "
                                 f"{(i + 1) * weight_each:,} exceeds --max-queues")
            if refusal is not None and (fits or refusal.code != "bad_request"
                                        or "limit max_queues" not in refusal.message):
                raise BenchError(f"registration {i + 1} refused: {refusal.code}: "
                                 f"{refusal.message}")
            outcomes.append("accepted" if refusal is None else
                            f"refused ({refusal.code}: {refusal.message})")
        out = m.finish()
        held = m.session.call("status").topics
        if held != topics:
            raise BenchError(f"the server holds {held} topics, not {topics}")
        out.notes = outcomes
        if times == 1:  # the table is full: nothing that adds to its routes may pass
            out.past_limit = _slave_past_limit(m.session, topics, fs)
        return out
    finally:
        m.close()


def heaviest_state(config: RunConfig, p: Params, r: int) -> _Round:
    """Queue entries up to --max-queues, with the longest names: N names × max_topics."""
    lim = p.limits
    per, total = lim.max_topics_per_request, lim.max_topics
    names = lim.max_queues // total
    m = _Measured(config, f"heavy-{r}", lim)
    try:
        version = 0
        for name in range(names):
            for first in range(0, total, per):
                version += 1
                check_reply(m.session.call_raw(_register(
                    name, range(first, min(total, first + per)), version=version,
                    incremental=first > 0)))
        out = m.finish()
        status = m.session.call("status")
        if (status.topics, status.brokers) != (total, names):
            raise BenchError(f"the server holds {status.topics} topics of {status.brokers} "
                             f"brokers, not {total} of {names}")
        refusal = _refusal(m.session.call_raw(_register(names, range(1))))
        if refusal is None or "limit max_queues" not in refusal.message:
            raise BenchError(f"one more queue entry was not refused by max_queues: {refusal}")
        return out
    finally:
        m.close()


def _slave_past_limit(session: Session, topics: int, servers: int) -> float:
    """A second address of the full broker name 0 (id 1: a slave) that registers no
    topics and one filter server. Every route of the name would then list one more
    address and one more filter server: `topics` × 2 entries past --max-queues unless
    refused. Returns the entries accepted past the limit (0 when refused)."""
    slave = register_request(
        _name(0), _addr(1_000_000), [], cluster=CLUSTER, zone=ZONE, broker_id=1,
        filter_servers=[_addr(servers, "f")])
    refusal = _refusal(session.call_raw(slave))
    if refusal is not None and "limit max_queues" not in refusal.message:
        raise BenchError(f"the slave was refused: {refusal.code}: {refusal.message}")
    return 0.0 if refusal else topics * 2.0


# --- item 10 ------------------------------------------------------------------------


def _churn_bodies(p: Params, names: int) -> Iterator[bytes]:
    """One broker's registrations: a window of new topic names each time, then none."""
    version = 0
    for first in range(0, names, p.churn_window):
        version += 1
        yield _register(0, range(first, min(names, first + p.churn_window)), version=version)
    yield _register(0, [], version=version + 1)


def _config_bodies(p: Params, rounds: int) -> Iterator[bytes]:
    """The small broker (one topic), then the big one re-registered with a new read_queues
    each time; write_queues differ per topic, so every (topic, round) is a QueueData value
    of its own: topics × rounds values pass through the table's interning."""
    yield _register(1, [_topic(p.config_topics)])
    for k in range(rounds):
        yield _register(0, {_topic(t): {"read_queues": k + 1, "write_queues": t + 1}
                            for t in range(p.config_topics)}, version=k + 1)


def _unregister(name: int) -> bytes:
    return request("unregister_broker", cluster=CLUSTER, broker_name=_name(name), broker_id=0,
                   broker_addr=_addr(name))


def topic_churn(config: RunConfig, p: Params, r: int) -> _Round:
    m = _Measured(config, f"churn-{r}", p.limits, probe=False)
    try:
        for body in _churn_bodies(p, p.churn_names):
            check_reply(m.session.call_raw(body))
        if m.session.call("status").topics != 0:
            raise BenchError("topics left after the last registration listed none")
        return m.finish()
    finally:
        m.close()


def config_churn(config: RunConfig, p: Params, r: int) -> tuple[_Round, float, float]:
    """(the round, ms to unregister the one-topic broker, ms to unregister the big one)."""
    m = _Measured(config, f"config-{r}", p.limits, probe=False)
    try:
        for body in _config_bodies(p, p.config_rounds):
            check_reply(m.session.call_raw(body))
        removals = []
        for name in (1, 0):
            # The loop publishes a request's events after its reply: a `status` round trip
            # first, so the removal's round trip is its own work only.
            m.session.call("status")
            started = time.monotonic()
            reply = check_reply(m.session.call_raw(_unregister(name)))
            removals.append((time.monotonic() - started) * 1000)
            if not reply.removed:
                raise BenchError(f"broker {name} was not removed")
        if m.session.call("status").topics != 0:
            raise BenchError("topics left after both brokers were unregistered")
        return m.finish(), removals[0], removals[1]
    finally:
        m.close()


def live_bytes(p: Params) -> tuple[float, float]:
    """In-process under tracemalloc: MiB of live objects left after each churn."""
    service = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0, limits=p.limits)
    now = 0

    def feed(bodies: Iterator[bytes]) -> None:
        nonlocal now
        for body in bodies:
            now += 1
            reply = schema.decode_reply(service.respond(body, now).reply)
            if isinstance(reply, schema.Error):
                raise BenchError(f"in-process: {reply.code}: {reply.message}")

    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        feed(_churn_bodies(p, p.live_names))
        after_topics = tracemalloc.get_traced_memory()[0] - start
        feed(_config_bodies(p, p.live_config_rounds))
        feed(iter([_unregister(1), _unregister(0)]))
        if service.table.topic_count() or service.table.broker_count():
            raise BenchError("in-process: state left after the churn")
        after_config = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return after_topics / 2**20, after_config / 2**20


# --- the benchmark ------------------------------------------------------------------


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    lim = p.limits
    topics, fs = _shape(lim)
    rounds: dict[str, list[_Round]] = {k: [] for k in ("one", "five", "heavy", "churn", "config")}
    for r in range(config.rounds):
        rounds["one"].append(one_registration(config, p, r, 1))
        rounds["five"].append(one_registration(config, p, r, 5))
        config.log(f"round {r + 1}: " + "; ".join(
            f"{k} +{v[-1].held_mib:.0f} MiB (peak +{v[-1].peak_mib:.0f}), probe "
            f"{v[-1].worst_ms:.0f} ms" for k, v in rounds.items() if v))
    # Up to about a minute each at full size, so measured once: memory barely varies between
    # rounds, and the heavy state's probe figure is already the worst of 50 requests.
    rounds["heavy"].append(heaviest_state(config, p, 0))
    rounds["churn"].append(topic_churn(config, p, 0))
    out, small, big = config_churn(config, p, 0)
    rounds["config"].append(out)
    removal_small, removal_big = [small], [big]
    lt, lc = live_bytes(p)
    live_topics, live_config = [lt], [lc]
    config.log("; ".join(f"{k} +{v[-1].held_mib:.0f} MiB (peak +{v[-1].peak_mib:.0f}), "
                         f"{v[-1].seconds:.0f} s" for k, v in rounds.items())
               + f"; removals {small:.1f} / {big:.1f} ms; live {lt:.2f} / {lc:.2f} MiB")

    def held(key: str) -> list[float]:
        return [x.held_mib for x in rounds[key]]

    def peak(key: str) -> list[float]:
        return [x.peak_mib for x in rounds[key]]

    def worst(key: str) -> list[float]:
        return [x.worst_ms for x in rounds[key]]

    mem, block, back = (Target("value", "<=", BUDGET_MIB), Target("value", "<=", BLOCK_MS),
                        Target("value", "<=", RETURN_MIB))
    heavy_names = lim.max_queues // lim.max_topics
    one = f"1 registration, {topics:,} topics × {fs} filter servers"
    five = "the same under 5 broker names"
    heavy = f"{heavy_names} names × {lim.max_topics:,} topics ({heavy_names * lim.max_topics:,} entries)"
    figures = [
        Figure(f"{one}: RSS growth", "MiB", held("one"), target=mem),
        Figure(f"{one}: RSS peak growth", "MiB", peak("one"), target=mem),
        Figure(f"{one}: longest get_route meanwhile", "ms", worst("one"), target=block),
        Figure(f"{one}, then a slave with no topics and 1 filter server: entries accepted "
               "past --max-queues", "entries", [x.past_limit for x in rounds["one"]],
               target=Target("value", "<=", 0)),
        Figure(f"{five}: RSS growth", "MiB", held("five"), target=mem),
        Figure(f"{five}: RSS peak growth", "MiB", peak("five"), target=mem),
        Figure(f"{five}: longest get_route meanwhile", "ms", worst("five"), target=block),
        Figure(f"{heavy}: RSS growth", "MiB", held("heavy"), target=mem),
        Figure(f"{heavy}: RSS peak growth", "MiB", peak("heavy"), target=mem),
        Figure(f"{heavy}: longest get_route meanwhile", "ms", worst("heavy"), target=block),
        Figure(f"{heavy}: time to register", "s", [x.seconds for x in rounds["heavy"]]),
        Figure(f"topic churn, {p.churn_names:,} names: RSS end − start", "MiB", held("churn"),
               target=back),
        Figure(f"topic churn, {p.churn_names:,} names: RSS peak growth", "MiB", peak("churn")),
        Figure(f"config churn, {p.config_topics:,} topics × {p.config_rounds}: RSS end − start",
               "MiB", held("config"), target=back),
        Figure(f"config churn, {p.config_topics:,} topics × {p.config_rounds}: RSS peak growth",
               "MiB", peak("config")),
        Figure("after config churn: unregister a 1-topic broker", "ms", removal_small,
               target=Target("value", "<=", REMOVAL_MS)),
        Figure(f"after config churn: unregister the {p.config_topics:,}-topic broker", "ms",
               removal_big),
        Figure(f"live bytes after topic churn of {p.live_names:,} names (in-process)", "MiB",
               live_topics, target=back),
        Figure(f"live bytes after config churn, {p.config_topics:,} topics × "
               f"{p.live_config_rounds} (in-process)", "MiB", live_config, target=back),
    ]
    five_notes = rounds["five"][0].notes
    accepted = sum(1 for n in five_notes if n == "accepted")
    refused = [n for n in five_notes if n != "accepted"]
    five_outcome = (f"{accepted} accepted, {len(refused)} refused"
                    + (f", each `{refused[0].removeprefix('refused (').removesuffix(')')}`"
                       if refused else "") + ".")
    limits_text = ("the default limits" if lim == Limits() else
                   f"`--max-topics-per-request` {lim.max_topics_per_request:,}, `--max-topics` "
                   f"{lim.max_topics:,}, `--max-queues` {lim.max_queues:,}")
    method = METHOD.format(
        limits_text=limits_text, topics=topics, fs=fs, weight=topics * (1 + fs),
        max_queues=lim.max_queues, five_outcome=five_outcome, heavy_names=heavy_names,
        heavy_topics=lim.max_topics, heavy_entries=heavy_names * lim.max_topics,
        heavy_requests=heavy_names * math.ceil(lim.max_topics / lim.max_topics_per_request),
        window=p.churn_window, churn=p.churn_names, config_topics=p.config_topics,
        config_rounds=p.config_rounds, live_names=p.live_names,
        live_config_rounds=p.live_config_rounds, slave_weight=2 * topics, config_values=p.config_topics * p.config_rounds,
        rounds=config.rounds)
    return BenchResult("memory", "Memory under the limits, and after churn", method, figures)


if __name__ == "__main__":
    raise SystemExit(cli({"memory": run}))

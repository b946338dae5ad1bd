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

import msgspec
import zmq

from bench.harness import (
    BenchError, Probe, ServerProcess, Session, check_reply, register_request,
    request, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core import schema
from zns.core.limits import Limits
from zns.core.weights import NAME_BYTES_PER_WEIGHT, name_weight
from zns.core.service import NameService
from zns.drivers.heap import TRIM_EVERY_MS
from zns.drivers.kv_file import KvStore

BUDGET_MIB = 1024  # item 9: no request within the limits makes the server use more
BLOCK_MS = 1000  # item 9: ... or block the loop longer
RETURN_MIB = 64  # item 10: memory returns to within this of its start
REMOVAL_MS = 100  # item 10: a broker removal after churn (it took 444 ms when filed)
HEAVY_REPLY_TIMEOUT_MS = 120_000
# Topics per get_routes when every route is read: the heaviest routes (49 filter servers)
# are ~13 KB, so a part stays well under the 64 MiB a reply may hold.
READ_PART = 1_000
PROBE_TOPIC = "ProbeNoSuchTopic"  # asking for a topic nobody registered adds no state
# The server hands free heap memory back to the OS at a calm moment, at most once per
# TRIM_EVERY_MS (zns/drivers/heap.py): the churns' end RSS is read once it had its turn.
SETTLE_S = TRIM_EVERY_MS / 1000 + 1


@dataclass(frozen=True)
class Params:
    limits: Limits  # what the server runs with (FULL: the defaults, no option given)
    churn_names: int  # topic churn: distinct topic names seen in all
    churn_window: int  # topics per registration, all new every time
    config_topics: int  # configuration churn: one broker's topics
    config_rounds: int  # ... re-registered with a new read_queues this many times
    live_names: int  # the in-process (tracemalloc) topic churn
    live_config_rounds: int  # the in-process configuration churn
    # The in-process comparison of shapes (bytes per unit of weight): a tenth of `limits`
    # or less, in the same proportions.
    shape_limits: Limits


FULL = Params(limits=Limits(), churn_names=1_000_000, churn_window=1_000, config_topics=10_000,
              config_rounds=200, live_names=50_000, live_config_rounds=5,
              shape_limits=Limits(max_topics_per_request=2_000, max_topics=20_000,
                                   max_queues=100_000))
QUICK = Params(limits=Limits(max_topics_per_request=200, max_topics=2_000, max_queues=10_000),
               churn_names=2_000, churn_window=200, config_topics=200, config_rounds=5,
               live_names=1_000, live_config_rounds=3,
               shape_limits=Limits(max_topics_per_request=20, max_topics=200,
                                   max_queues=1_000))

METHOD = """
Every figure is a fresh `zns serve` process with {limits_text}; its memory is VmRSS
from `/proc/<pid>/status` (growth = after minus right after start, once a `status`
was answered) and VmHWM (the peak since start: what the server needed on the way).
While the requests are applied a probe sends `get_route` every 5 ms on its own
connection (for a topic nobody registered: it adds no state); its longest round
trip is the longest the loop was blocked.

**Shapes.** `--max-queues` weighs each route entry (topic × broker name) as 1, plus
1 per address past the first and per filter server its routes list, plus 1 per
full {nbw} bytes of its names (`zns.core.routes.name_weight`: cluster, broker
name twice, zone and addresses); the weights below are computed with that function.
Which shape holds the most bytes per unit of weight was measured in-process
(`NameService` under `tracemalloc`, a budget of {shape_budget:,}, every route
encoded by a `snapshot`; figures "bytes per unit of --max-queues weight"):
{shape_ranking}. A queue entry whose names weigh nothing extra is the heaviest per
unit, so the names here are the longest that still weigh nothing: cluster {cl},
broker name {nl}, zone {zl} and address {al} characters ({name_bytes} bytes with the
name twice, one short of {nbw}); topics (not weighed) of 127 characters, filter
servers (each weighs 1 whatever its length) of 255. One registration lists at most
`--max-topics-per-request` topics, so it reaches the budget only with filter
servers: with these names {fs} of them per topic hold more than 255-character names
(weight {long_weight} per entry) with {long_fs}.

**Item 9, one registration.** The heaviest single `register_broker` the limits
accept: {topics:,} topics (`--max-topics-per-request`) with {fs} filter servers,
weight {topics:,} × {entry_weight} = {weight:,} against `--max-queues`
{max_queues:,}. Every route of the name lists every filter server, so each costs
~260 bytes in each topic's encoded route; more filter servers on fewer topics
weigh the same but hold less (fewer routes). After the registration every route is
read with `get_routes`, {read_part:,} topics at a time, as a client following every
topic reads them: the server encodes a route only when it is first asked for, and
keeps those bytes until the route changes, so it then holds the most its state can
hold. Then a `snapshot` (reply: {one_snapshot}). RSS is read after it. Then, with the table full, a second address
of that broker name (id 1, a slave) registers no topics and one filter server:
every route of the name would then list both, {slave_weight:,} more weight, so
`max_queues` must refuse it; the figure is the entries accepted past the limit
(0 when refused). *Five times:* the same registration sent under 5
broker names (addresses of their own) one after the other: {five_outcome}

**Item 9, the heaviest state.** What the limits let a fleet pile up: queue
entries of weight {heavy_weight} each, {heavy_names} broker names × {heavy_topics:,}
topics (`--max-topics`) = {heavy_entries:,} entries, registered as {heavy_requests}
requests of {topics:,} topics (`incremental` after each name's first), then every
route read and a `snapshot` as above (reply: {heavy_snapshot}), then RSS. Then a sixth broker name with one of
those topics must be refused (`max_queues`), showing the table is full. The
probe's worst is over all {heavy_requests} requests; that while reading (the reads
and the snapshot) is a figure of its own.

**Item 10, topic churn.** Names of 255 characters here (what they weigh does not
matter for churn). One broker re-registers (a new `data_version` each time)
with {window:,} topics, new names every time, until {churn:,} distinct names were
seen, then registers with none. **Configuration churn**: a one-topic broker, then
one with {config_topics:,} topics re-registered {config_rounds} times with a new
`read_queues` each time (and `write_queues` different per topic: every topic's queue
data is a new value each time, {config_values:,} in all); then the one-topic broker
is unregistered (the round trip: a removal must cost what it removes, not the table
size) and the big one too. Both: RSS at the end minus RSS right after start, read
{settle:g} s after the last request: the server hands free heap memory back to the OS
(glibc's `malloc_trim`) at a calm moment once many route events were published, at
most every {trim_s:g} s, so the end figure is read after it had its turn.
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
    registered_mib: float = 0.0  # RSS growth once registered, before any read
    worst_ms: float = 0.0  # while the registrations were applied
    snapshot_ms: float = 0.0  # probe worst while every route was read, and a snapshot
    snapshot_reply: str = ""
    seconds: float = 0.0
    past_limit: float = 0.0  # queue entries accepted past --max-queues (one_registration)
    notes: list[str] = field(default_factory=list)


# --- names ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Names:
    """The name fields of a broker name's route entries, each as long as given.

    Addresses are ASCII host:port: DNS labels of up to 63 characters and a port."""
    cluster_len: int
    name_len: int
    zone_len: int
    addr_len: int

    @property
    def cluster(self) -> str:
        return "c" * self.cluster_len

    @property
    def zone(self) -> str:
        return "z" * self.zone_len

    def name(self, i: int) -> str:
        return f"broker{i:06d}".ljust(self.name_len, "n")

    def addr(self, i: int, kind: str = "a") -> str:
        return _host_port(f"{kind}{i:07d}", self.addr_len)

    def entry_weight(self, addrs: Sequence[str], servers: int) -> int:
        """What one route entry of a broker name with these names, `addrs` and `servers`
        filter servers weighs against --max-queues: itself, each address past the first,
        each filter server, and its names' bytes (the server's own `name_weight`)."""
        return (len(addrs) + servers
                + name_weight(self.cluster, self.name(0), self.zone, addrs))


def _host_port(label: str, length: int) -> str:
    """A `length`-character host:port whose first DNS label starts with `label`."""
    host_len = length - len(":65535")
    labels: list[str] = []
    while (used := sum(len(x) + 1 for x in labels)) < host_len:
        size = min(63, host_len - used)
        labels.append((label if not labels else "").ljust(size, "bcdefg"[len(labels)]))
    return ".".join(labels) + ":65535"


# The longest names that weigh nothing extra: their bytes, the broker name twice, are
# NAME_BYTES_PER_WEIGHT - 1 (checked by `_check_names`). The route entries of the
# item 9 measurements use them.
SHORT = _Names(cluster_len=25, name_len=25, zone_len=25, addr_len=27)
LONG = _Names(cluster_len=255, name_len=255, zone_len=255, addr_len=255)  # §3's longest
FILTER_SERVER_LEN = 255


def _check_names() -> None:
    """SHORT's names weigh nothing extra and one byte more would; every name is valid."""
    n = SHORT
    if (n.cluster_len + 2 * n.name_len + n.zone_len + n.addr_len != NAME_BYTES_PER_WEIGHT - 1
            or n.entry_weight([n.addr(0)], 0) != 1
            or name_weight(n.cluster + "c", n.name(0), n.zone, [n.addr(0)]) != 1):
        raise BenchError("the SHORT names are not the longest that weigh nothing extra")
    for names in (SHORT, LONG):
        body = _register(0, range(1), servers=_servers(1), names=names)
        try:
            req = msgspec.msgpack.decode(body, type=schema.RegisterBroker)
        except msgspec.ValidationError as exc:
            raise BenchError(f"the bench's own registration is invalid: {exc}") from None
        if (len(req.broker_addr), len(req.filter_servers[0])) != (
                names.addr_len, FILTER_SERVER_LEN):
            raise BenchError("the bench's addresses are not as long as meant")


def _topic(i: int) -> str:
    return f"T{i:08d}".ljust(127, "t")


def _filter_server(k: int) -> str:
    return _host_port(f"f{k:07d}", FILTER_SERVER_LEN)


def _register(name: int, topics: list[str] | range | dict[str, dict], *, version: int = 0,
              servers: Sequence[str] = (), incremental: bool = False,
              names: _Names = SHORT) -> bytes:
    """Broker `name`'s registration; `topics` as names (default configuration), indexes
    of `_topic` names, or a map of names to their configurations."""
    if isinstance(topics, range):
        topics = [_topic(t) for t in topics]
    if not isinstance(topics, dict):
        topics = {t: {} for t in topics}
    return request(
        "register_broker", cluster=names.cluster, broker_name=names.name(name), broker_id=0,
        broker_addr=names.addr(name), ha_addr=names.addr(name, "h"), zone=names.zone,
        topics=topics, filter_servers=list(servers), data_version={"counter": version},
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
        self.limits = limits
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
        self.out = _Round()

    def read_everything(self, topics: Sequence[str]) -> None:
        """Ends the registration window: RSS so far. Then, on a calm loop, every route read
        with `get_routes`, READ_PART topics at a time, as a client following every topic
        reads them: the server then holds every route's bytes, the most its state can
        hold. Then a `snapshot`. The probe's worst over both is a figure of its own."""
        ended = time.monotonic()
        self.out.seconds = ended - self.started
        if self.probe:
            time.sleep(0.2)  # a sample sent just before the end may still be waiting
            # From `started`: Probe.worst_ms also counts samples sent up to 0.5 s before,
            # when the loop was idle, so a sample sent just before the first request and
            # held up by it is not missed.
            self.out.worst_ms = self.probe.worst_ms(self.started, ended)
            time.sleep(0.6)  # Probe.worst_ms looks 0.5 s before a window's start
        self.session.call("status")
        self.out.registered_mib = _mib(self.server.rss_kib() - self.rss0)
        sent = time.monotonic()
        # Never more topics than one request may list (--quick's limit is 200).
        part = min(READ_PART, self.limits.max_topics_per_request)
        for first in range(0, len(topics), part):
            # A reply the peer's byte budget cannot afford now is `busy`, but the routes
            # were read (and their bytes kept) all the same: that is what is measured.
            reply = schema.decode_reply(self.session.call_raw(request(
                "get_routes", id=8, topics=list(topics[first:first + part]))))
            if isinstance(reply, schema.Error) and reply.code != "busy":
                raise BenchError(f"get_routes: {reply.code}: {reply.message}")
        reply = schema.decode_reply(self.session.call_raw(request("snapshot", id=7)))
        done = time.monotonic()
        if isinstance(reply, schema.Error):
            if reply.code != "busy":
                raise BenchError(f"snapshot: {reply.code}: {reply.message}")
            self.out.snapshot_reply = f"`busy`: {reply.message}"
        else:
            self.out.snapshot_reply = f"{len(reply.routes):,} routes"
        if self.probe:
            time.sleep(0.2)
            self.out.snapshot_ms = self.probe.worst_ms(sent, done)

    def finish(self) -> _Round:
        if self.probe:
            self.probe.stop()
        self.session.call("status")
        self.out.held_mib = _mib(self.server.rss_kib() - self.rss0)
        self.out.peak_mib = _mib(self.server.peak_rss_kib() - self.rss0)
        return self.out

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
    bare = SHORT.entry_weight([SHORT.addr(0)], 0)
    servers = min(schema.MAX_FILTER_SERVERS, limits.max_queues // topics - bare)
    if servers < 0:
        raise BenchError(f"{topics} topics alone exceed --max-queues {limits.max_queues}")
    return topics, servers


def _servers(count: int) -> list[str]:
    return [_filter_server(k) for k in range(count)]


def one_registration(config: RunConfig, p: Params, r: int, times: int) -> _Round:
    """The heaviest one registration, sent `times` times under as many broker names;
    each is expected accepted while the weight fits and refused (max_queues) after."""
    topics, fs = _shape(p.limits)
    names = [_topic(t) for t in range(topics)]
    bodies = [_register(i, names, servers=_servers(fs)) for i in range(times)]
    m = _Measured(config, f"one-{times}-{r}", p.limits)
    try:
        outcomes = []
        weight = 0
        for i, body in enumerate(bodies):
            refusal = _refusal(m.session.call_raw(body))
            after = weight + topics * SHORT.entry_weight([SHORT.addr(i)], fs)
            fits = after <= p.limits.max_queues
            if refusal is None and not fits:
                raise BenchError(f"registration {i + 1} was accepted; the weight "
                                 f"{after:,} exceeds --max-queues")
            if refusal is not None and (fits or refusal.code != "bad_request"
                                        or "limit max_queues" not in refusal.message):
                raise BenchError(f"registration {i + 1} refused: {refusal.code}: "
                                 f"{refusal.message}")
            if refusal is None:
                weight = after
            outcomes.append("accepted" if refusal is None else
                            f"refused ({refusal.code}: {refusal.message})")
        m.read_everything(names)
        out = m.finish()
        held = m.session.call("status").topics
        if held != topics:
            raise BenchError(f"the server holds {held} topics, not {topics}")
        out.notes = outcomes
        if times == 1:  # the table is full: nothing that adds to its routes may pass
            out.past_limit = _slave_past_limit(m.session, p.limits, topics, fs)
        return out
    finally:
        m.close()


def heaviest_state(config: RunConfig, p: Params, r: int) -> _Round:
    """Queue entries up to --max-queues, of the heaviest shape: N names × max_topics."""
    lim = p.limits
    per, total = lim.max_topics_per_request, lim.max_topics
    each = SHORT.entry_weight([SHORT.addr(0)], 0)
    names = lim.max_queues // (total * each)
    m = _Measured(config, f"heavy-{r}", lim)
    try:
        version = 0
        for name in range(names):
            for first in range(0, total, per):
                version += 1
                check_reply(m.session.call_raw(_register(
                    name, range(first, min(total, first + per)), version=version,
                    incremental=first > 0)))
        m.read_everything([_topic(t) for t in range(total)])
        out = m.finish()
        status = m.session.call("status")
        if (status.topics, status.brokers) != (total, names):
            raise BenchError(f"the server holds {status.topics} topics of {status.brokers} "
                             f"brokers, not {total} of {names}")
        refusal = _refusal(m.session.call_raw(_register(names, range(1))))
        full = names * total * each + each > lim.max_queues
        if full and (refusal is None or "limit max_queues" not in refusal.message):
            raise BenchError(f"one more queue entry was not refused by max_queues: {refusal}")
        if not full and refusal is not None:
            raise BenchError(f"one more queue entry was refused: {refusal.message}")
        return out
    finally:
        m.close()


def _slave_past_limit(session: Session, lim: Limits, topics: int, servers: int) -> float:
    """A second address of the full broker name 0 (id 1: a slave) that registers no
    topics and one filter server. Every route of the name would then list one more
    address and one more filter server, past --max-queues unless refused. Returns the
    entries accepted past the limit (0 when refused)."""
    slave_addr = SHORT.addr(1_000_000)
    slave = register_request(
        SHORT.name(0), slave_addr, [], cluster=SHORT.cluster, zone=SHORT.zone, broker_id=1,
        filter_servers=[_filter_server(servers)])
    refusal = _refusal(session.call_raw(slave))
    if refusal is not None and "limit max_queues" not in refusal.message:
        raise BenchError(f"the slave was refused: {refusal.code}: {refusal.message}")
    after = topics * SHORT.entry_weight([SHORT.addr(0), slave_addr], servers + 1)
    return 0.0 if refusal else float(max(0, after - lim.max_queues))


# --- which shape holds the most per unit of weight ------------------------------------


@dataclass(frozen=True)
class _Shape:
    label: str
    names: _Names
    servers: int  # filter servers per registration; 0: as many entries as the budget lets in


def _shapes(lim: Limits) -> list[_Shape]:
    topics = lim.max_topics_per_request
    return [
        _Shape(f"names of {NAME_BYTES_PER_WEIGHT - 1} bytes, no filter servers", SHORT, 0),
        _Shape("names of 255 characters, no filter servers", LONG, 0),
        _Shape(f"names of {NAME_BYTES_PER_WEIGHT - 1} bytes, filter servers",
               SHORT, lim.max_queues // topics - SHORT.entry_weight([SHORT.addr(0)], 0)),
        _Shape("names of 255 characters, filter servers",
               LONG, lim.max_queues // topics - LONG.entry_weight([LONG.addr(0)], 0)),
    ]


def shape_bytes(lim: Limits, shape: _Shape) -> float:
    """In-process under tracemalloc: bytes of live objects per unit of --max-queues weight
    once `shape` fills the budget and a snapshot has encoded every route."""
    names, fs = shape.names, shape.servers
    if fs < 0:
        raise BenchError(f"{shape.label}: one registration of {lim.max_topics_per_request} "
                         "topics exceeds the budget")
    each = names.entry_weight([names.addr(0)], fs)
    per = lim.max_topics_per_request
    if fs:  # one registration of as many topics as fit
        layout = [(0, range(min(per, lim.max_queues // each)))]
    else:  # as many entries as fit, as few broker names as --max-topics allows
        entries = lim.max_queues // each
        topics = min(entries, lim.max_topics)
        layout = [(n, range(first, min(topics, first + per)))
                  for n in range(entries // topics) for first in range(0, topics, per)]
    service = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0, limits=lim)
    servers = _servers(fs)
    bodies = [_register(n, t, version=k + 1, servers=servers, incremental=t.start > 0,
                        names=names) for k, (n, t) in enumerate(layout)]
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for now, body in enumerate(bodies, 1):
            check_reply(service.respond(body, now).reply)
        del bodies
        check_reply(service.respond(request("snapshot", id=1), len(layout) + 1).reply)
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return held / service.table.queue_weight()


# --- item 10 ------------------------------------------------------------------------


def _churn_bodies(p: Params, names: int) -> Iterator[bytes]:
    """One broker's registrations: a window of new topic names each time, then none."""
    version = 0
    for first in range(0, names, p.churn_window):
        version += 1
        yield _register(0, range(first, min(names, first + p.churn_window)), version=version,
                        names=LONG)
    yield _register(0, [], version=version + 1, names=LONG)


def _config_bodies(p: Params, rounds: int) -> Iterator[bytes]:
    """The small broker (one topic), then the big one re-registered with a new read_queues
    each time; write_queues differ per topic, so every (topic, round) is a QueueData value
    of its own: topics × rounds values pass through the table's interning."""
    yield _register(1, [_topic(p.config_topics)], names=LONG)
    for k in range(rounds):
        yield _register(0, {_topic(t): {"read_queues": k + 1, "write_queues": t + 1}
                            for t in range(p.config_topics)}, version=k + 1, names=LONG)


def _unregister(name: int) -> bytes:
    return request("unregister_broker", cluster=LONG.cluster, broker_name=LONG.name(name),
                   broker_id=0, broker_addr=LONG.addr(name))


def topic_churn(config: RunConfig, p: Params, r: int) -> _Round:
    m = _Measured(config, f"churn-{r}", p.limits, probe=False)
    try:
        for body in _churn_bodies(p, p.churn_names):
            check_reply(m.session.call_raw(body))
        if m.session.call("status").topics != 0:
            raise BenchError("topics left after the last registration listed none")
        time.sleep(SETTLE_S)
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
        time.sleep(SETTLE_S)
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
    _check_names()
    topics, fs = _shape(lim)
    shapes = _shapes(p.shape_limits)
    per_unit = [shape_bytes(p.shape_limits, s) for s in shapes]
    config.log("bytes per unit of weight: " + "; ".join(
        f"{s.label} {b:.0f}" for s, b in zip(shapes, per_unit)))
    # The heavy state's shape must be the heaviest per unit, the single registration's the
    # heavier of the two with filter servers: else the figures would not be the worst case.
    if max(per_unit) != per_unit[0] or per_unit[2] <= per_unit[3]:
        raise BenchError("the shapes measured are not the heaviest per unit of weight")
    rounds: dict[str, list[_Round]] = {k: [] for k in ("one", "five", "heavy", "churn", "config")}
    for r in range(config.rounds):
        rounds["one"].append(one_registration(config, p, r, 1))
        rounds["five"].append(one_registration(config, p, r, 5))
        config.log(f"round {r + 1}: " + "; ".join(
            f"{k} +{v[-1].held_mib:.0f} MiB (peak +{v[-1].peak_mib:.0f}), probe "
            f"{v[-1].worst_ms:.0f} ms, snapshot {v[-1].snapshot_ms:.0f} ms"
            for k, v in rounds.items() if v))
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

    def each(key: str, what: str) -> list[float]:
        return [getattr(x, what) for x in rounds[key]]

    mem, block, back = (Target("value", "<=", BUDGET_MIB), Target("value", "<=", BLOCK_MS),
                        Target("value", "<=", RETURN_MIB))
    entry = SHORT.entry_weight([SHORT.addr(0)], 0)
    heavy_names = lim.max_queues // (lim.max_topics * entry)
    heavy_entries = heavy_names * lim.max_topics
    one = f"1 registration, {topics:,} topics × {fs} filter servers"
    five = "the same under 5 broker names"
    heavy = f"{heavy_names} names × {lim.max_topics:,} topics ({heavy_entries:,} entries)"
    figures = [Figure(f"bytes per unit of --max-queues weight, {s.label} (in-process)", "B",
                      [b]) for s, b in zip(shapes, per_unit)]
    for key, label in (("one", one), ("five", five), ("heavy", heavy)):
        figures += [
            Figure(f"{label}: RSS growth, registered (before any read)", "MiB",
                   each(key, "registered_mib")),
            Figure(f"{label}: RSS growth, every route read", "MiB", each(key, "held_mib"),
                   target=mem),
            Figure(f"{label}: RSS peak growth", "MiB", each(key, "peak_mib"), target=mem),
            Figure(f"{label}: longest get_route while registering", "ms",
                   each(key, "worst_ms"), target=block),
            Figure(f"{label}: longest get_route while every route is read", "ms",
                   each(key, "snapshot_ms"), target=block),
        ]
        if key == "one":
            figures.append(Figure(
                f"{one}, then a slave with no topics and 1 filter server: entries accepted "
                "past --max-queues", "entries", each("one", "past_limit"),
                target=Target("value", "<=", 0)))
    figures += [
        Figure(f"{heavy}: time to register", "s", each("heavy", "seconds")),
        Figure(f"topic churn, {p.churn_names:,} names: RSS end − start", "MiB",
               each("churn", "held_mib"), target=back),
        Figure(f"topic churn, {p.churn_names:,} names: RSS peak growth", "MiB",
               each("churn", "peak_mib")),
        Figure(f"config churn, {p.config_topics:,} topics × {p.config_rounds}: RSS end − start",
               "MiB", each("config", "held_mib"), target=back),
        Figure(f"config churn, {p.config_topics:,} topics × {p.config_rounds}: RSS peak growth",
               "MiB", each("config", "peak_mib")),
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
    ranking = "; ".join(f"{s.label}: {b:,.0f} B" for s, b in
                        sorted(zip(shapes, per_unit), key=lambda x: -x[1]))
    entry_one = SHORT.entry_weight([SHORT.addr(0)], fs)
    slave_after = topics * SHORT.entry_weight([SHORT.addr(0), SHORT.addr(1_000_000)], fs + 1)
    method = METHOD.format(
        limits_text=limits_text, nbw=NAME_BYTES_PER_WEIGHT,
        shape_budget=p.shape_limits.max_queues, shape_ranking=ranking,
        cl=SHORT.cluster_len, nl=SHORT.name_len, zl=SHORT.zone_len, al=SHORT.addr_len,
        name_bytes=SHORT.cluster_len + 2 * SHORT.name_len + SHORT.zone_len + SHORT.addr_len,
        long_weight=LONG.entry_weight([LONG.addr(0)], 0), long_fs=shapes[3].servers,
        topics=topics, fs=fs, entry_weight=entry_one, weight=topics * entry_one,
        max_queues=lim.max_queues, one_snapshot=rounds["one"][0].snapshot_reply,
        slave_weight=slave_after - topics * entry_one, five_outcome=five_outcome,
        heavy_weight=entry, heavy_names=heavy_names, heavy_topics=lim.max_topics,
        heavy_entries=heavy_entries,
        heavy_requests=heavy_names * math.ceil(lim.max_topics / lim.max_topics_per_request),
        heavy_snapshot=rounds["heavy"][0].snapshot_reply, read_part=READ_PART,
        window=p.churn_window, churn=p.churn_names, config_topics=p.config_topics,
        config_rounds=p.config_rounds, live_names=p.live_names,
        live_config_rounds=p.live_config_rounds, config_values=p.config_topics * p.config_rounds,
        rounds=config.rounds, settle=SETTLE_S, trim_s=TRIM_EVERY_MS / 1000)
    return BenchResult("memory", "Memory under the limits, and after churn", method, figures)


if __name__ == "__main__":
    raise SystemExit(cli({"memory": run}))

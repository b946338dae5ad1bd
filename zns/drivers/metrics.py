"""`zns serve --metrics HOST:PORT`: Prometheus text at `/metrics`, liveness at `/healthz`,
readiness at `/readyz`; any other path is 404.

The loop pays nothing for it: the core and the server keep plain integer counts
(`NameService.ok_counts`, `error_counts`, `published`, `removals`; the server's
`dropped_replies`; the timers' `stalls`; the KV store's `write_times`) and the
collector here reads them when Prometheus scrapes, from the HTTP server's own
thread. Reading an int, or the length of a dict, is atomic under the GIL; a scrape
may be one request behind, never torn. Only things that cannot change size while
being read are read (`len`, counters copied with `dict(...)` in one C call).

Under `zns serve --workers N` every worker serves this endpoint on the shared
port, and a scrape shows the whole whichever worker it reaches: the worker's
own counts, read live as above, and the last `zns.core.figures.Overview` the
state process sent it (the state process's counts, the replication, every
other worker's last report), which the loop replaces whole (one reference
assignment, atomic). Per-worker series carry a `worker` label there.

`prometheus_client` is an optional dependency (the `metrics` extra): it is
the standard implementation of the exposition format, and importing it is needed
only when `--metrics` is given.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from zns import __version__
from zns.core.addresses import parse_host_port, url_host
from zns.core.errors import ConfigError, UsageError
from zns.core.figures import Overview, StateFigures, WorkerFigures
from zns.core.latency import AGE_BOUNDS, BOUNDS, Histogram, LatencyHistogram, age_buckets
from zns.core.remoting.constants import RequestCode, ResponseCode
from zns.core.schema import FollowerStatus, tag_of
from zns.core.service import NameService
from zns.drivers.descriptors import DescriptorGuard, listen_tcp
from zns.drivers.io_errors import configured
from zns.drivers.kv_file import WRITE_BOUNDS

log = logging.getLogger("zns")

MISSING_LIBRARY = ("--metrics needs the prometheus_client package, which is not installed: "
                   "pip install prometheus_client (or pip install '.[metrics]' in a zns clone)")


def require_library() -> None:
    """ConfigError(MISSING_LIBRARY) unless prometheus_client imports: the state process asks
    before it starts a worker, which would otherwise die of it at every start."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING_LIBRARY) from None


class Observed(Protocol):
    """What the collector reads of a running server (zns.drivers.server.Server)."""

    service: NameService
    timers: Any  # .stalls
    worker: int  # 1..N under --workers N, 0 in a single process
    overview: Overview | None  # the whole's last figures under --workers N, else None
    remoting: Any  # None, or .connections and .max_connections
    subscribers: Any  # .budget.cut
    replica: Any  # a worker's zns.core.replication.Replica (.dropped_events, .resyncs), or None
    state: Any  # one process's state dump writer (.written, .failed), or None
    silent: Callable[[], int] | None  # a follower's: ms since it heard from its NameServer
    # A worker's with --followers: the followers it feeds (zns.drivers.followers.Gateway.shown)
    following: Callable[[], list[FollowerStatus]] | None

    @property
    def dropped_replies(self) -> int:
        """Replies dropped: the peer was gone or at its high-water mark."""
        ...

    def loop_age_s(self) -> float:
        """Seconds since the loop last completed a pass."""
        ...

    def ready(self) -> tuple[bool, str]:
        """/readyz: (ready, why), zns.core.readiness."""
        ...

    def now_ms(self) -> int:
        """The server's clock, in ms (the heartbeats' ages are measured with it)."""
        ...

    @property
    def request_times(self) -> LatencyHistogram:
        """How long the core took to answer each request, by kind."""
        ...


class _Collector:
    """Builds every zns metric family from the server's counts at scrape time."""

    def __init__(self, server: Observed, stuck_after_s: float = float("inf")) -> None:
        self.server = server
        self.stuck_after_s = stuck_after_s

    def healthy(self) -> bool:
        """What /healthz says: a loop pass within `stuck_after_s`."""
        return self.server.loop_age_s() <= self.stuck_after_s

    def describe(self) -> Iterable[Any]:
        return []  # no description pass: collect() is cheap and always right

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeHistogramMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        server, service = self.server, self.server.service
        table = service.table
        overview = server.overview
        own = own_figures(server)
        # One process: its figures, unlabelled. Workers: this worker's, live, and every
        # other worker's last report, each labelled with its number.
        shown: list[tuple[list[str], WorkerFigures]] = [([], own)]
        labels: list[str] = []
        if server.worker:
            labels = ["worker"]
            shown = [([str(f.worker)], f) for f in sorted(
                [own, *(r for r in (overview.reports if overview else [])
                        if r.worker != own.worker)], key=lambda f: f.worker)]
        yield InfoMetricFamily("zns", "The NameServer's version and epoch",
                               value={"version": __version__, "epoch": service.epoch})
        requests = CounterMetricFamily("zns_requests", "ZNS/1 requests answered, by op and "
                                       "outcome (ok or the error code)",
                                       labels=["op", "outcome", *labels])
        remoting = CounterMetricFamily("zns_remoting_requests", "RocketMQ remoting requests "
                                       "answered, by request code and outcome (ok or the "
                                       "response code)", labels=["code", "outcome", *labels])
        encoded = GaugeMetricFamily("zns_encoded_route_bytes", "Bytes of encoded routes kept "
                                    "for reuse until they change, by form (json: both RocketMQ "
                                    "forms, bounded)", labels=["form", *labels])
        published = CounterMetricFamily("zns_events_published", "Events published, by channel "
                                        "kind", labels=["channel_kind", *labels])
        seconds = HistogramMetricFamily(
            "zns_request_seconds", "Seconds the loop took to answer one request, by protocol "
            "(zns1, remoting) and op (ZNS/1 op or remoting request code name)",
            labels=["protocol", "op", *labels])
        per_worker = {name: (CounterMetricFamily if counter else GaugeMetricFamily)(
            name, text, labels=labels) for name, counter, text in (
                *_PER_WORKER, *(_WORKER_ONLY if server.worker else (_STALLS,)))}
        for label, figures in shown:
            for op, outcome, count in figures.requests:
                requests.add_metric([op, outcome, *label], count)
            _remoting_requests(remoting, figures.remoting_requests, label)
            encoded.add_metric(["msgpack", *label], figures.encoded_msgpack_bytes)
            encoded.add_metric(["json", *label], figures.encoded_json_bytes)
            for kind in sorted({"route", "broker", "hb", *figures.published}):
                published.add_metric([kind, *label], figures.published.get(kind, 0))
            _request_seconds(seconds, figures.request_seconds, label)
            for name, value in (
                ("zns_dropped_replies", figures.dropped_replies),
                ("zns_remoting_connections", figures.remoting_connections),
                ("zns_remoting_max_connections", figures.remoting_max_connections),
                ("zns_event_subscribers_cut", figures.subscribers_cut),
                ("zns_worker_stalls" if server.worker else "zns_stalls", figures.stalls),
                ("zns_worker_writes_refused", figures.writes_refused),
                ("zns_worker_writes_timed_out", figures.writes_timed_out),
                ("zns_worker_request_pauses", figures.request_pauses),
                ("zns_worker_events_dropped", figures.events_dropped),
                ("zns_worker_resyncs", figures.resyncs),
                ("zns_worker_followers", figures.followers),
            ):
                if name in per_worker:  # only workers forward writes and hold a replica
                    per_worker[name].add_metric(label, value)
        yield from (requests, remoting, encoded, published, seconds, *per_worker.values())
        for name, text, value in (
            ("zns_brokers", "Broker names held", table.broker_count()),
            ("zns_broker_addresses", "Live broker addresses", table.address_count()),
            ("zns_topics", "Topics with queue data", table.topic_count()),
            ("zns_queue_entries", "Queue entries (topic x broker name)", table.queue_count()),
        ):
            yield GaugeMetricFamily(name, text, value=value)
        state = overview.state if overview else None
        # The state process's counts, once, unlabelled; a single process's own.
        removals = state.removals if state else dict(service.removals)
        yield _counter_by(CounterMetricFamily, "zns_broker_removals", "Broker addresses "
                          "removed, by reason", "reason", removals, ())
        if server.worker:
            yield CounterMetricFamily("zns_stalls", "Stalls measured (§8) in the state "
                                      "process: its loop did not run",
                                      value=state.stalls if state else 0)
        if state is not None:
            counts, total = list(state.kv_write_counts), state.kv_write_seconds
        else:
            # The server's store is a KvStore; another store (a test's) has measured nothing.
            times: Histogram = (getattr(service.kv, "write_times", None)
                                or Histogram(WRITE_BOUNDS))
            counts, total = list(times.counts), times.total_seconds
        counts = counts or [0] * (len(WRITE_BOUNDS) + 1)
        yield CounterMetricFamily("zns_kv_writes", "Durable KV writes (append and fsync)",
                                  value=sum(counts))
        yield HistogramMetricFamily(
            "zns_kv_write_seconds", "Seconds one durable KV write (append and fsync) took",
            buckets=_cumulative(WRITE_BOUNDS, counts), sum_value=total)
        # The state dump's writes: the state process's under --workers N, else this one's.
        writer = server.state
        dumps, failures = ((state.dumps_written, state.dump_failures) if state is not None
                           else (writer.written, writer.failed) if writer is not None
                           else (0, 0))
        yield CounterMetricFamily("zns_state_dumps_written", "State dumps written "
                                  "(--state-path): what a restart serves its routes from",
                                  value=dumps)
        yield CounterMetricFamily("zns_state_dump_failures", "State dump writes that failed "
                                  "(a full or read-only disk); each tried again a second later",
                                  value=failures)
        if server.worker:
            yield GaugeMetricFamily("zns_answering_worker", "The worker that answered this "
                                    "scrape (the kernel spreads connections over them)",
                                    value=server.worker)
        yield GaugeMetricFamily("zns_healthy", "1 while /healthz answers 200 (the loop completes "
                                "passes), else 0", value=1 if self.healthy() else 0)
        yield GaugeMetricFamily("zns_ready", "1 once /readyz answers 200 (routes warm), else 0",
                                value=1 if server.ready()[0] else 0)
        yield from _heartbeat_ages(server, GaugeHistogramMetricFamily, GaugeMetricFamily)
        peers = GaugeMetricFamily("zns_peer_connected", "1 while the peer NameServer answers",
                                  labels=["peer"])
        for peer, up in dict(service.peers).items():
            peers.add_metric([peer], 1 if up else 0)
        yield peers
        if server.worker:
            yield from _replication(state, overview, own, CounterMetricFamily,
                                    GaugeMetricFamily)
        if server.silent is not None:
            yield GaugeMetricFamily("zns_follower_silence_seconds", "A follower's: seconds "
                                    "since it last heard from the NameServer it follows (past "
                                    "5 it answers busy)", value=server.silent() / 1000)


# Each worker's own (labelled `worker` under --workers N): name, counter?, help.
_PER_WORKER = (
    ("zns_dropped_replies", True, "Replies dropped: the peer was gone or at its high-water mark"),
    ("zns_remoting_connections", False, "Open RocketMQ remoting connections"),
    ("zns_remoting_max_connections", False, "Remoting connections allowed at once (after the "
     "open-file limit's clamp; 0 with no listener)"),
    ("zns_event_subscribers_cut", True, "Events subscribers disconnected for what their "
     "subscriptions cost"),
)
# Stalls: a single process's own; under --workers N each worker's, labelled, while
# zns_stalls is the state process's (the stalls that shift the expiry).
_STALLS = ("zns_stalls", True, "Stalls measured (§8): the loop did not run")
# Only under --workers N, each worker's: its loop's stalls, and its writes forwarded to
# the state process (zns.core.forwarding, zns.drivers.request_router).
_WORKER_ONLY = (
    ("zns_worker_stalls", True, "Stalls measured in a worker: its loop did not run"),
    ("zns_worker_writes_refused", True, "Writes the worker refused busy: as many as it "
     "holds were already at the state process, or as many bytes waited for it to read"),
    ("zns_worker_writes_timed_out", True, "Writes the worker answered busy: the state "
     "process did not answer them in time"),
    ("zns_worker_request_pauses", True, "Times the worker stopped reading ZNS/1 requests: "
     "those it held (its writes at the state process and the later requests of their "
     "connections) reached its bound, in number or in bytes"),
    ("zns_worker_events_dropped", True, "Events the worker dropped unpublished: more were held "
     "for the commit fence than its bound (64 MiB); its subscribers see a gap and pull"),
    ("zns_worker_resyncs", True, "States the worker asked the state process for: a command "
     "or a part of a state came out of order"),
    ("zns_worker_followers", False, "Followers (read replicas on other hosts, --followers) "
     "the worker feeds"),
)


def own_figures(server: Observed) -> WorkerFigures:
    """The server's own counts, read as the collector reads them (plain ints; dicts copied
    in one C call): what a worker reports, and what /metrics shows of it."""
    service = server.service
    times = server.request_times
    listener = server.remoting
    writes = service.forwarded
    replica = server.replica
    feeds = server.following() if server.following is not None else []
    return WorkerFigures(
        worker=server.worker, pid=os.getpid(),
        requests=[(tag_of(kind), "ok", n) for kind, n in dict(service.ok_counts).items()]
        + [(op, code, n) for (op, code), n in dict(service.error_counts).items()],
        remoting_requests=[(c, r, n) for (c, r), n in dict(service.remoting_counts).items()],
        request_seconds=[(label, list(histogram.counts), histogram.total_seconds)
                         for label, histogram in dict(times.labels).items()],
        encoded_msgpack_bytes=service.encoded.msgpack_bytes,
        encoded_json_bytes=service.encoded.json_bytes,
        published=dict(service.published), dropped_replies=server.dropped_replies,
        stalls=server.timers.stalls,
        remoting_connections=len(listener.connections) if listener is not None else 0,
        remoting_max_connections=listener.max_connections if listener is not None else 0,
        subscribers_cut=server.subscribers.budget.cut,
        writes_refused=writes.refused if writes is not None else 0,
        writes_timed_out=writes.timed_out if writes is not None else 0,
        request_pauses=writes.request_pauses if writes is not None else 0,
        events_dropped=replica.dropped_events if replica is not None else 0,
        followers=len(feeds), feeds=feeds,
        resyncs=replica.resyncs if replica is not None else 0,
        **process_usage(),
    )


def process_usage() -> dict[str, Any]:
    """This process's resident memory (bytes, /proc/self/statm; 0 where there is none) and
    CPU time (user and system seconds), as `rss_bytes` and `cpu_seconds`."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = 0
    times = os.times()
    return {"rss_bytes": rss, "cpu_seconds": times.user + times.system}


def _replication(state: StateFigures | None, overview: Overview | None, own: WorkerFigures,
                 counter: Callable[..., Any], gauge: Callable[..., Any]) -> Iterator[Any]:
    """The state process's view of the workers (zns.core.figures), under --workers N."""
    yield gauge("zns_replication_seq", "The last command the state process applied and "
                "replicated", value=state.seq if state else 0)
    yield gauge("zns_replication_fence", "The last command written to every live worker "
                "(each applies it before its next read)", value=state.fence if state else 0)
    applied = gauge("zns_worker_applied_seq", "The last replicated command the worker's "
                    "replica applied", labels=["worker"])
    lag = gauge("zns_worker_lag_commands", "Commands the state process applied that the "
                "worker has not", labels=["worker"])
    lag_s = gauge("zns_worker_lag_seconds", "How long ago the state process applied the "
                  "oldest command the worker has not (0: none)", labels=["worker"])
    loaded = gauge("zns_worker_loaded", "1 while the worker serves (loaded its state), 0 "
                   "while it starts or is down", labels=["worker"])
    for w in state.workers if state else []:
        applied.add_metric([str(w.worker)], w.applied)
        lag.add_metric([str(w.worker)], w.lag_commands)
        lag_s.add_metric([str(w.worker)], w.lag_ms / 1000)
        loaded.add_metric([str(w.worker)], 1 if w.state == "loaded" else 0)
    yield from (applied, lag, lag_s, loaded)
    yield counter("zns_worker_restarts", "Workers started again after one died",
                  value=state.worker_restarts if state else 0)
    yield counter("zns_replication_transfers", "State transfers sent to workers (a start, a "
                  "resync, a worker past the held commands)",
                  value=state.transfers if state else 0)
    yield gauge("zns_paired_cpu", "The CPU the state process and worker 1 share while their "
                "work is light (--cpus auto); -1 while they run where the kernel puts them",
                value=state.paired_cpu if state else -1)
    yield counter("zns_pair_releases", "Times the state process and worker 1 were let go of "
                  "their shared CPU (--cpus auto), their work no longer light",
                  value=state.pair_releases if state else 0)
    yield counter("zns_replication_workers_dropped", "Workers dropped for acknowledging "
                  "nothing in time or breaking the protocol",
                  value=state.workers_dropped if state else 0)
    memory = gauge("zns_process_resident_memory_bytes", "Resident memory of each process of "
                   "the whole (state, or a worker's number)", labels=["process"])
    cpu = counter("zns_process_cpu_seconds", "CPU time (user and system) of each process of "
                  "the whole (state, or a worker's number)", labels=["process"])
    reports = [own, *(r for r in (overview.reports if overview else [])
                      if r.worker != own.worker)]
    processes: list[tuple[str, int, float]] = []
    if state is not None:
        processes.append(("state", state.rss_bytes, state.cpu_seconds))
    processes += [(str(r.worker), r.rss_bytes, r.cpu_seconds) for r in reports]
    for name, rss, seconds in processes:
        memory.add_metric([name], rss)
        cpu.add_metric([name], seconds)
    yield from (memory, cpu)
    # At most 16 followers per worker (zns.core.followers.MAX_FOLLOWERS), so at most 16
    # series per worker; followers of one name (one key on two hosts) are one series, the
    # furthest behind.
    fed = gauge("zns_worker_follower_lag_commands", "Commands the worker applied that a "
                "follower it feeds (--followers) has not acknowledged", labels=["worker",
                                                                               "follower"])
    fed_s = gauge("zns_worker_follower_lag_seconds", "How long ago the worker applied the "
                  "oldest command a follower it feeds has not acknowledged (0: none)",
                  labels=["worker", "follower"])
    for report in reports:
        furthest: dict[str, tuple[int, int]] = {}
        for follower in report.feeds:
            furthest[follower.name] = max(furthest.get(follower.name, (0, 0)),
                                          (follower.lag_commands, follower.lag_ms))
        for name, (commands, ms) in sorted(furthest.items()):
            fed.add_metric([str(report.worker), name], commands)
            fed_s.add_metric([str(report.worker), name], ms / 1000)
    yield from (fed, fed_s)


def _cumulative(bounds: Iterable[float], counts: Iterable[int]) -> list[tuple[str, int]]:
    """Prometheus's buckets from counts per bucket (one per bound, then +Inf): each
    bucket's upper bound as text and the running total up to it."""
    running, buckets = 0, []
    for bound, count in zip([*map(str, bounds), "+Inf"], counts):
        running += count
        buckets.append((bound, running))
    return buckets


def _request_seconds(metric: Any, times: list[tuple[str, list[int], float]],
                     label: list[str]) -> None:
    """`zns_request_seconds{protocol, op}`: how long the loop took to answer one request."""
    for name, counts, total in sorted(times):
        protocol, _, op = name.partition(":")
        metric.add_metric([protocol, op or protocol, *label], _cumulative(BOUNDS, counts), total)


def _heartbeat_ages(server: Observed, histogram: Callable[..., Any],
                    gauge: Callable[..., Any]) -> Iterator[Any]:
    """The age of every live broker address's last heartbeat, as a distribution (no label per
    broker: its size is fixed whatever the number of brokers) and its largest value."""
    counts, total, largest = age_buckets(server.service.table.last_heartbeats(), server.now_ms())
    yield histogram("zns_broker_heartbeat_age_seconds", "Seconds since each live broker "
                    "address was last heard, as a distribution",
                    buckets=_cumulative(AGE_BOUNDS, counts), gsum_value=total)
    yield gauge("zns_broker_heartbeat_age_max_seconds", "Seconds since the longest-silent live "
                "broker address was last heard (0 with none)", value=largest)


REQUEST_NAMES = {int(c): c.name for c in RequestCode}
RESPONSE_NAMES = {int(c): c.name.lower() for c in ResponseCode}


def _remoting_requests(metric: Any, counts: list[tuple[int, int, int]],
                       label: list[str]) -> None:
    """`zns_remoting_requests_total{code, outcome}`: the request code's name (OTHER: one no
    NameServer answers), `ok` or the response code's name."""
    for code, response, count in sorted(counts):
        outcome = "ok" if response == ResponseCode.SUCCESS else RESPONSE_NAMES.get(
            response, str(response))
        metric.add_metric([REQUEST_NAMES.get(code, "OTHER"), outcome, *label], count)


def _counter_by(family: Callable[..., Any], name: str, text: str, label: str,
                counts: dict[str, int], always: tuple[str, ...]) -> Any:
    metric = family(name, text, labels=[label])
    for key in sorted({*always, *counts}):
        metric.add_metric([key], counts.get(key, 0))
    return metric


# The budget of the HTTP endpoint (docs/operations.md, "Metrics"): at most MAX_CONNECTIONS
# connections are served at once, each by a thread of its own that ends with it; while all
# are busy no more are accepted (the kernel queues up to MAX_CONNECTIONS more, then drops
# SYNs and the scraper retries). A request must arrive whole, head within MAX_HEAD_BYTES,
# within READ_TIMEOUT_S of the connection being accepted; one reply per connection.
MAX_CONNECTIONS = 16
READ_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 8192
PATHS = ("/metrics", "/healthz", "/readyz")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 503: "Service Unavailable"}


class MetricsServer:
    """The HTTP endpoint, in threads of its own (`close()` stops them): `/metrics`, `/healthz`
    and `/readyz`, nothing else."""

    def __init__(self, server: Observed, spec: str, *, heartbeat_interval: float,
                 descriptors: DescriptorGuard | None = None,
                 read_timeout_s: float = READ_TIMEOUT_S, reuse_port: bool = False) -> None:
        try:
            host, port = parse_host_port(spec, schemes=("http",))
        except UsageError as exc:
            raise ConfigError(f"--metrics {exc}") from None
        try:
            from prometheus_client import CollectorRegistry, ProcessCollector
        except ImportError:
            raise ConfigError(MISSING_LIBRARY) from None
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        # §healthz: a loop that has not completed a pass for two heartbeat intervals is
        # stuck (it passes at least once per interval to publish `hb`).
        self.stuck_after_s = 2 * heartbeat_interval
        self.registry.register(_Collector(server, self.stuck_after_s))
        self._server = server
        self.read_timeout_s = read_timeout_s
        with configured(f"--metrics {spec}: cannot listen: "):  # EndpointError, a ConfigError
            self.listening = listen_tcp(host, port, reuse_port=reuse_port)
        self.listening.listen(MAX_CONNECTIONS)
        self.listening.setblocking(True)
        # Inside the descriptor guard: when the process runs out of descriptors, new
        # connections here are dropped by the kernel as on the ZNS/1 and remoting ports.
        self._descriptors = descriptors
        if descriptors is not None:
            descriptors.plain.append(self.listening)
        self.host, self.port = host, self.listening.getsockname()[1]
        self._slots = threading.Semaphore(MAX_CONNECTIONS)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="zns-metrics",
                                        daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics, health on /healthz",
                 url_host(host), self.port)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            self._slots.acquire()  # all busy: accept nothing more until one ends
            try:
                conn, _ = self.listening.accept()
            except OSError as exc:
                self._slots.release()
                if self._closing.is_set():
                    return
                # EMFILE and the like: the descriptor guard sheds; do not spin meanwhile.
                log.warning("--metrics: accept failed: %s", exc)
                self._closing.wait(1.0)
                continue
            threading.Thread(target=self._serve_one, args=(conn,), name="zns-metrics-conn",
                             daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                status, content_type, body = self._answer(self._read_head(conn))
                head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}"
                        f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
                conn.settimeout(self.read_timeout_s)
                conn.sendall(head.encode() + body)
        except OSError:
            pass  # the scraper went away or stopped reading: nothing to tell it
        finally:
            self._slots.release()

    def _read_head(self, conn: socket.socket) -> bytes | None:
        """The request's head, or None when it did not arrive whole in time and in size."""
        deadline = time.monotonic() + self.read_timeout_s
        head = b""
        while b"\r\n\r\n" not in head and b"\n\n" not in head:
            left = deadline - time.monotonic()
            if left <= 0 or len(head) > MAX_HEAD_BYTES:
                return None
            conn.settimeout(left)
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                return None
            if not chunk:
                return None
            head += chunk
        return head

    def _answer(self, head: bytes | None) -> tuple[int, str, bytes]:
        if head is None:
            return 408, "text/plain", b"the request did not arrive whole in time\n"
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return 400, "text/plain", b"not an HTTP request\n"
        method, path = parts[0], parts[1].split(b"?", 1)[0].decode("latin-1")
        if path not in PATHS:
            return 404, "text/plain", f"not found: this server answers {', '.join(PATHS)}\n".encode()
        if method != b"GET":
            return 405, "text/plain", b"only GET\n"
        if path == "/healthz":
            return self._health()
        if path == "/readyz":
            ready, why = self._server.ready()
            return (200 if ready else 503), "text/plain", why.encode() + b"\n"
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def _health(self) -> tuple[int, str, bytes]:
        age = self._server.loop_age_s()
        if age <= self.stuck_after_s:
            return 200, "text/plain", b"ok\n"
        return 503, "text/plain", b"stuck: no loop pass for %.1f s\n" % age

    def connections(self) -> int:
        """Connections being served now (tests, diagnostics)."""
        return sum(1 for t in threading.enumerate() if t.name == "zns-metrics-conn")

    def close(self) -> None:
        self._closing.set()
        try:
            self.listening.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._slots.release()  # wakes an accept loop waiting for a free slot
        self._thread.join(5)
        if self._descriptors is not None and self.listening in self._descriptors.plain:
            self._descriptors.plain.remove(self.listening)
        self.listening.close()

"""`zns serve --metrics HOST:PORT`: Prometheus text at `/metrics`, liveness at `/healthz`.

The loop pays nothing for it: the core and the server keep plain integer counts
(`NameService.ok_counts`, `error_counts`, `published`, `removals`; the server's
`dropped_replies`; the timers' `stalls`; the KV store's `write_times`) and the
collector here reads them when Prometheus scrapes, from the HTTP server's own
thread. Reading an int, or the length of a dict, is atomic under the GIL; a scrape
may be one request behind, never torn. Only things that cannot change size while
being read are read (`len`, counters copied with `dict(...)` in one C call).

`prometheus_client` is an optional dependency (the `metrics` extra): it is
the standard implementation of the exposition format, and importing it is needed
only when `--metrics` is given.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from zns import __version__
from zns.core.addresses import parse_host_port, url_host
from zns.core.errors import ConfigError, UsageError
from zns.core.remoting.constants import RequestCode, ResponseCode
from zns.core.schema import tag_of
from zns.core.service import NameService
from zns.drivers.io_errors import configured
from zns.drivers.kv_file import WriteTimes

log = logging.getLogger("zns")

MISSING_LIBRARY = ("--metrics needs the prometheus_client package, which is not installed: "
                   "pip install prometheus_client (or pip install '.[metrics]' in a zns clone)")


class Observed(Protocol):
    """What the collector reads of a running server (zns.drivers.server.Server)."""

    service: NameService
    timers: Any  # .stalls
    remoting: Any  # None, or .connections

    @property
    def dropped_replies(self) -> int:
        """Replies dropped: the peer was gone or at its high-water mark."""
        ...

    def loop_age_s(self) -> float:
        """Seconds since the loop last completed a pass."""
        ...


class _Collector:
    """Builds every zns metric family from the server's counts at scrape time."""

    def __init__(self, server: Observed) -> None:
        self.server = server

    def describe(self) -> Iterable[Any]:
        return []  # no description pass: collect() is cheap and always right

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        server, service = self.server, self.server.service
        table = service.table
        yield InfoMetricFamily("zns", "The NameServer's version and epoch",
                               value={"version": __version__, "epoch": service.epoch})
        requests = CounterMetricFamily("zns_requests", "ZNS/1 requests answered, by op and "
                                       "outcome (ok or the error code)", labels=["op", "outcome"])
        # The hot path counts by request type, not by string; only a decoded request is counted.
        for kind, count in dict(service.ok_counts).items():
            requests.add_metric([tag_of(kind), "ok"], count)
        for (op, code), count in dict(service.error_counts).items():
            requests.add_metric([op, code], count)
        yield requests
        yield _remoting_requests(CounterMetricFamily, dict(service.remoting_counts))
        encoded = GaugeMetricFamily("zns_encoded_route_bytes", "Bytes of encoded routes kept "
                                    "for reuse until they change, by form (json: both RocketMQ "
                                    "forms, bounded)", labels=["form"])
        encoded.add_metric(["msgpack"], service.encoded.msgpack_bytes)
        encoded.add_metric(["json"], service.encoded.json_bytes)
        yield encoded
        for name, text, value in (
            ("zns_brokers", "Broker names held", table.broker_count()),
            ("zns_broker_addresses", "Live broker addresses", table.address_count()),
            ("zns_topics", "Topics with queue data", table.topic_count()),
            ("zns_queue_entries", "Queue entries (topic x broker name)", table.queue_count()),
            ("zns_remoting_connections", "Open RocketMQ remoting connections",
             _remoting_connections(server)),
        ):
            yield GaugeMetricFamily(name, text, value=value)
        yield _counter_by(CounterMetricFamily, "zns_events_published", "Events published, by "
                          "channel kind", "channel_kind", dict(service.published),
                          ("route", "broker", "hb"))
        yield _counter_by(CounterMetricFamily, "zns_broker_removals", "Broker addresses "
                          "removed, by reason", "reason", dict(service.removals), ())
        yield CounterMetricFamily("zns_dropped_replies", "Replies dropped: the peer was gone "
                                  "or at its high-water mark", value=server.dropped_replies)
        yield CounterMetricFamily("zns_stalls", "Stalls measured (§8): the loop did not run",
                                  value=server.timers.stalls)
        # The server's store is a KvStore; another store (a test's) has measured nothing.
        times: WriteTimes = getattr(service.kv, "write_times", None) or WriteTimes()
        counts = list(times.counts)
        yield CounterMetricFamily("zns_kv_writes", "Durable KV writes (append and fsync)",
                                  value=sum(counts))
        buckets, running = [], 0
        for bound, count in zip([*map(str, WriteTimes.BOUNDS), "+Inf"], counts):
            running += count
            buckets.append((bound, running))
        yield HistogramMetricFamily(
            "zns_kv_write_seconds", "Seconds one durable KV write (append and fsync) took",
            buckets=buckets, sum_value=times.total_seconds)
        peers = GaugeMetricFamily("zns_peer_connected", "1 while the peer NameServer answers",
                                  labels=["peer"])
        for peer, up in dict(service.peers).items():
            peers.add_metric([peer], 1 if up else 0)
        yield peers


REQUEST_NAMES = {int(c): c.name for c in RequestCode}
RESPONSE_NAMES = {int(c): c.name.lower() for c in ResponseCode}


def _remoting_requests(family: Callable[..., Any], counts: dict[tuple[int, int], int]) -> Any:
    """`zns_remoting_requests_total{code, outcome}`: the request code's name (OTHER: one no
    NameServer answers), `ok` or the response code's name."""
    metric = family("zns_remoting_requests", "RocketMQ remoting requests answered, by request "
                    "code and outcome (ok or the response code)", labels=["code", "outcome"])
    for (code, response), count in sorted(counts.items()):
        outcome = "ok" if response == ResponseCode.SUCCESS else RESPONSE_NAMES.get(
            response, str(response))
        metric.add_metric([REQUEST_NAMES.get(code, "OTHER"), outcome], count)
    return metric


def _remoting_connections(server: Observed) -> int:
    listener = server.remoting
    return len(listener.connections) if listener is not None else 0


def _counter_by(family: Callable[..., Any], name: str, text: str, label: str,
                counts: dict[str, int], always: tuple[str, ...]) -> Any:
    metric = family(name, text, labels=[label])
    for key in sorted({*always, *counts}):
        metric.add_metric([key], counts.get(key, 0))
    return metric


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds up shutdown


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6  # socketserver's family is per class: IPv4 otherwise


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # one line per scrape: too many
        pass


class MetricsServer:
    """The HTTP endpoint, in threads of its own (`close()` stops them)."""

    def __init__(self, server: Observed, spec: str, *, heartbeat_interval: float) -> None:
        try:
            host, port = parse_host_port(spec, schemes=("http",))
        except UsageError as exc:
            raise ConfigError(f"--metrics {exc}") from None
        try:
            from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
        except ImportError:
            raise ConfigError(MISSING_LIBRARY) from None
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.registry.register(_Collector(server))
        self._server = server
        # §healthz: a loop that has not completed a pass for two heartbeat intervals is
        # stuck (it passes at least once per interval to publish `hb`).
        self.stuck_after_s = 2 * heartbeat_interval
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
            if environ.get("PATH_INFO") == "/healthz":
                return self._health(start_response)
            return metrics_app(environ, start_response)

        with configured(f"--metrics {spec}: cannot listen: "):  # EndpointError, a ConfigError
            kind = _ThreadingServer6 if ":" in host else _ThreadingServer
            self._httpd = make_server(host, port, app, kind, handler_class=_Quiet)
        self.host, self.port = host, self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="zns-metrics",
                                        daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics, health on /healthz",
                 url_host(host), self.port)

    def _health(self, start_response: Callable[..., Any]) -> list[bytes]:
        age = self._server.loop_age_s()
        if age <= self.stuck_after_s:
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"stuck: no loop pass for %.1f s\n" % age]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

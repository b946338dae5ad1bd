"""`zns serve --metrics`: what /metrics says after real requests, /healthz, and the
clear error when prometheus_client is missing."""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from helpers import (
    MUTATION, Peer, SplitServer, ThreadedServer, records_here, register_fields, served, wait_for,
    zns1_ok,
)
from zns.cli import main as zns_main
from zns.core.errors import ConfigError, EndpointError
from zns.core.service import NameService
from zns.drivers.logs import JsonFormatter
from zns.core.latency import LatencyHistogram
from zns.drivers.kv_file import WRITE_BOUNDS
from zns.drivers.metrics import MetricsServer, _Collector

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(srv: SplitServer | ThreadedServer) -> Samples:
    """Every sample of /metrics as {(name, sorted labels): value}; a split server's samples
    of each worker (label `worker`) summed: the whole NameServer's."""
    status, text = get(f"http://127.0.0.1:{srv.metrics_port}/metrics")
    assert status == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "worker")))
            samples[key] = samples.get(key, 0) + s.value
    return samples


def scrape_until(srv: SplitServer | ThreadedServer, expected: Samples) -> Samples:
    """The first scrape that shows every sample of `expected`: a split server's workers
    report their counts once a second."""
    try:
        return wait_for(lambda: (m := scrape(srv)) and all(
            m.get(key) == value for key, value in expected.items()) and m)
    except AssertionError:
        m = scrape(srv)
        assert {key: m.get(key) for key in expected} == expected
        raise


@pytest.fixture
def metered(make_server):
    return make_server(metrics="127.0.0.1:0")


@pytest.mark.timeout(60)
def test_metrics_count_what_happened(metered: SplitServer):
    peer = metered.peer()
    for name in ("b1", "b2"):
        peer.ok("register_broker", **register_fields(broker_name=name,
                                                     addr=f"10.0.0.{name[-1]}:10911",
                                                     topics={"T1": {}, "T2": {}}))
    for _ in range(3):
        peer.ok("get_route", topic="T1")
    assert peer.call("get_route", topic="Nope").code == "not_found"
    peer.send_raw(b"\x93junk")
    peer.recv_raw()
    peer.ok("kv_put", namespace="ns", key="k", value="v")
    peer.ok("unregister_broker", cluster="c1", broker_name="b2", broker_id=0,
            broker_addr="10.0.0.2:10911")

    epoch = peer.ok("status").epoch
    m = scrape_until(metered, {
        ("zns_requests_total", (("op", "get_route"), ("outcome", "ok"))): 3,
        ("zns_requests_total", (("op", "get_route"), ("outcome", "not_found"))): 1,
        ("zns_requests_total", (("op", "register_broker"), ("outcome", "ok"))): 2,
        ("zns_requests_total", (("op", "unknown"), ("outcome", "bad_request"))): 1,
        ("zns_requests_total", (("op", "unregister_broker"), ("outcome", "ok"))): 1,
        ("zns_brokers", ()): 1,
        ("zns_broker_addresses", ()): 1,
        ("zns_topics", ()): 2,
        ("zns_queue_entries", ()): 2,
        ("zns_broker_removals_total", (("reason", "unregistered"),)): 1,
        ("zns_events_published_total", (("channel_kind", "broker"),)): 3,
    })
    assert m["zns_events_published_total", (("channel_kind", "route"),)] >= 4
    assert m["zns_events_published_total", (("channel_kind", "hb"),)] >= 1
    assert m["zns_kv_writes_total", ()] == 1
    assert m["zns_kv_write_seconds_count", ()] == 1
    assert m["zns_kv_write_seconds_bucket", (("le", "+Inf"),)] == 1
    assert m["zns_kv_write_seconds_sum", ()] > 0  # the fsync's own time, not a constant
    assert m["zns_dropped_replies_total", ()] == 0
    assert m["zns_stalls_total", ()] == 0
    assert m["zns_remoting_connections", ()] == 0
    assert m["zns_info", (("epoch", epoch), ("version", "0.1.0"))] == 1
    assert m["process_resident_memory_bytes", ()] > 0

    # Counters only grow, and a second scrape sees the requests made since.
    peer.ok("get_route", topic="T1")
    m = scrape_until(metered, {("zns_requests_total", (("op", "get_route"), ("outcome", "ok"))): 4})
    # Kept until T1's route changes (the unregister above dropped the earlier one).
    assert m["zns_encoded_route_bytes", (("form", "msgpack"),)] > 0


@pytest.mark.timeout(60)
def test_peer_connected_gauge(make_server):
    other = make_server()
    srv = make_server(metrics="127.0.0.1:0", peers=[other.router])
    wait_for(lambda: scrape(srv).get(("zns_peer_connected", (("peer", other.router),))) == 1)


@pytest.mark.timeout(60)
@pytest.mark.single_process("holds the loop inside a request (the service monkeypatched)")
def test_healthz_fails_while_the_loop_is_stuck(metered: ThreadedServer):
    url = f"http://127.0.0.1:{metered.server.metrics.port}/healthz"
    assert get(url)[0] == 200
    service = metered.server.service
    respond = service.respond
    entered, release = threading.Event(), threading.Event()

    def stuck(*args, **kwargs):  # holds the loop inside a request, as a bug or a stall would
        entered.set()
        release.wait(30)
        return respond(*args, **kwargs)

    service.respond = stuck
    peer = metered.peer()
    peer.send_raw(b'\x82\xa2op\xa6status\xa2id\x01')
    assert entered.wait(10)
    # 2 heartbeat intervals (0.2 s each) without a completed pass: stuck.
    status, body = wait_for(lambda: (r := get(url))[0] == 503 and r, timeout=10)
    assert "stuck" in body
    release.set()
    peer.recv_raw()
    wait_for(lambda: get(url)[0] == 200, timeout=10)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_missing_prometheus_client_is_a_clear_error(monkeypatch, tmp_path: Path, workers: str):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    result = CliRunner().invoke(zns_main, [
        "serve", "--router", "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*",
        "--kv-path", str(tmp_path / "kv.json"), "--metrics", "127.0.0.1:0",
        "--workers", workers])
    assert result.exit_code == 1, result.output
    assert "pip install prometheus_client" in result.output, result.output
    assert "zns[metrics]" not in result.output  # zns is not on a package index


@pytest.mark.parametrize("spec", ["nonsense", "127.0.0.1:", "127.0.0.1:99999", ":80"])
def test_bad_metrics_address_is_refused(spec: str, tmp_path: Path):
    result = CliRunner().invoke(zns_main, [
        "serve", "--router", "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*",
        "--kv-path", str(tmp_path / "kv.json"), "--metrics", spec])
    assert result.exit_code == 2 and "Invalid value for '--metrics'" in result.output, \
        result.output


# --- --log-format json ----------------------------------------------------------


def test_json_formatter_one_object_per_record():
    formatter = JsonFormatter()
    record = logging.LogRecord("zns", logging.WARNING, __file__, 1, "broker %s refused: %s",
                               ("b1", 'say "no"\nnow'), None)
    line = formatter.format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "WARNING" and data["logger"] == "zns"
    assert data["message"] == 'broker b1 refused: say "no"\nnow'
    assert data["time"].endswith("Z") and "exception" not in data
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("zns", logging.ERROR, __file__, 1, "bug", (), sys.exc_info())
    data = json.loads(formatter.format(record))
    assert "ValueError: boom" in data["exception"] and "Traceback" in data["exception"]


@pytest.mark.timeout(60)
def test_serve_logs_json_lines(process_server):
    srv = process_server("--log-format", "json", "--heartbeat-interval", "0.2")
    peer = Peer(srv.router)
    peer.ok("register_broker", **register_fields(broker_name="jb", addr="10.1.1.1:1"))
    peer.close()
    wait_for(lambda: "broker registered" in srv.output())
    assert srv.stop() == 0
    lines = [json.loads(line) for line in srv.output().splitlines()]
    messages = [line["message"] for line in lines]
    assert any(m.startswith("zns serving requests on") for m in messages)
    assert any(m.startswith("broker registered c1/jb") for m in messages)
    assert messages[-1] == "zns stopped"
    assert {"time", "level", "logger", "message"} <= set(lines[0])


@pytest.mark.timeout(60)
def test_broker_addresses_count_a_master_and_its_slave_apart(metered: SplitServer):
    peer = metered.peer()
    peer.ok("register_broker", **register_fields(broker_name="b1", broker_id=0, addr="10.0.0.1:1"))
    peer.ok("register_broker", **register_fields(broker_name="b1", broker_id=1, addr="10.0.0.2:1"))
    scrape_until(metered, {("zns_brokers", ()): 1, ("zns_broker_addresses", ()): 2})


class AgedLoop:
    """A server whose loop last completed a pass `age` seconds ago (what /healthz reads)."""

    age = 0.0
    readiness = (True, "ready")
    worker = 0  # a single process: no worker label, no overview
    overview = None

    def loop_age_s(self) -> float:
        return self.age

    def ready(self) -> tuple[bool, str]:
        return self.readiness


@pytest.mark.timeout(60)
def test_healthz_is_stuck_after_two_heartbeat_intervals_without_a_pass():
    loop = AgedLoop()
    metrics = MetricsServer(loop, "127.0.0.1:0", heartbeat_interval=1.5)  # type: ignore[arg-type]
    try:
        url = f"http://127.0.0.1:{metrics.port}/healthz"
        for age, status in ((0.0, 200), (2.9, 200), (3.0, 200), (3.1, 503), (5.9, 503)):
            loop.age = age
            assert get(url) == ((200, "ok\n") if status == 200 else (503, f"stuck: no loop pass "
                                                                        f"for {age:.1f} s\n")), age
    finally:
        metrics.close()


@pytest.mark.timeout(60)
def test_remoting_requests_are_counted_by_code_and_outcome(tmp_path: Path):
    # Issue 20 item 2: an operator running zns as a RocketMQ NameServer sees its traffic.
    from test_remoting_listener import Client, register_cmd
    from zns.core.remoting import RemotingCommand

    srv = served(tmp_path, metrics="127.0.0.1:0", remoting="127.0.0.1:0")
    try:
        client = Client(srv.remoting)
        assert client.call(register_cmd(topics=("T1",))).code == 0
        for _ in range(3):
            route = client.call(RemotingCommand(code=105, version=479, ext_fields={"topic": "T1"}))
            assert route.code == 0
        missing = RemotingCommand(code=105, version=479, ext_fields={"topic": "Nope"})
        assert client.call(missing).code == 17
        assert client.call(RemotingCommand(code=4242, version=479)).code == 3
        expected = {
            (("code", "REGISTER_BROKER"), ("outcome", "ok")): 1,
            (("code", "GET_ROUTEINFO_BY_TOPIC"), ("outcome", "ok")): 3,
            (("code", "GET_ROUTEINFO_BY_TOPIC"), ("outcome", "topic_not_exist")): 1,
            (("code", "OTHER"), ("outcome", "request_code_not_supported")): 1,
        }
        m = scrape_until(srv, {("zns_remoting_requests_total", labels): value
                               for labels, value in expected.items()})
        client.close()
        counted = {labels: value for (name, labels), value in m.items()
                   if name == "zns_remoting_requests_total"}
        assert counted == expected
        assert m["zns_encoded_route_bytes", (("form", "json"),)] > 0
    finally:
        srv.stop()


HELP = {
    "zns_info": "The NameServer's version and epoch",
    "zns_requests": "ZNS/1 requests answered, by op and outcome (ok or the error code)",
    "zns_remoting_requests": "RocketMQ remoting requests answered, by request code and outcome "
                             "(ok or the response code)",
    "zns_encoded_route_bytes": "Bytes of encoded routes kept for reuse until they change, by "
                               "form (json: both RocketMQ forms, bounded)",
    "zns_brokers": "Broker names held",
    "zns_broker_addresses": "Live broker addresses",
    "zns_topics": "Topics with queue data",
    "zns_queue_entries": "Queue entries (topic x broker name)",
    "zns_remoting_connections": "Open RocketMQ remoting connections",
    "zns_events_published": "Events published, by channel kind",
    "zns_broker_removals": "Broker addresses removed, by reason",
    "zns_dropped_replies": "Replies dropped: the peer was gone or at its high-water mark",
    "zns_stalls": "Stalls measured (§8): the loop did not run",
    "zns_kv_writes": "Durable KV writes (append and fsync)",
    "zns_state_dumps_written": "State dumps written (--state-path): what a restart serves its "
                               "routes from",
    "zns_state_dump_failures": "State dump writes that failed (a full or read-only disk); each "
                               "tried again a second later",
    "zns_kv_write_seconds": "Seconds one durable KV write (append and fsync) took",
    "zns_peer_connected": "1 while the peer NameServer answers",
    "zns_request_seconds": "Seconds the loop took to answer one request, by protocol (zns1, "
                           "remoting) and op (ZNS/1 op or remoting request code name)",
    **{name: "Seconds since each live broker address was last heard, as a distribution"
       for name in ("zns_broker_heartbeat_age_seconds", "zns_broker_heartbeat_age_seconds_gcount",
                    "zns_broker_heartbeat_age_seconds_gsum")},
    "zns_broker_heartbeat_age_max_seconds": "Seconds since the longest-silent live broker "
                                            "address was last heard (0 with none)",
    "zns_healthy": "1 while /healthz answers 200 (the loop completes passes), else 0",
    "zns_ready": "1 once /readyz answers 200 (routes warm), else 0",
    "zns_remoting_max_connections": "Remoting connections allowed at once (after the "
                                    "open-file limit's clamp; 0 with no listener)",
    "zns_event_subscribers_cut": "Events subscribers disconnected for what their "
                                 "subscriptions cost",
}


# What a split server (`--workers` N > 0) shows besides, or says otherwise.
SPLIT_HELP = {
    "zns_stalls": "Stalls measured (§8) in the state process: its loop did not run",
    "zns_worker_stalls": "Stalls measured in a worker: its loop did not run",
    "zns_answering_worker": "The worker that answered this scrape (the kernel spreads "
                            "connections over them)",
    "zns_replication_seq": "The last command the state process applied and replicated",
    "zns_replication_fence": "The last command written to every live worker (each applies it "
                             "before its next read)",
    "zns_worker_applied_seq": "The last replicated command the worker's replica applied",
    "zns_worker_lag_commands": "Commands the state process applied that the worker has not",
    "zns_worker_lag_seconds": "How long ago the state process applied the oldest command the "
                              "worker has not (0: none)",
    "zns_worker_loaded": "1 while the worker serves (loaded its state), 0 while it starts or "
                         "is down",
    "zns_worker_restarts": "Workers started again after one died",
    "zns_paired_cpu": "The CPU the state process and worker 1 share while their work is "
                      "light (--cpus auto); -1 while they run where the kernel puts them",
    "zns_pair_releases": "Times the state process and worker 1 were let go of their shared "
                         "CPU (--cpus auto), their work no longer light",
    "zns_replication_transfers": "State transfers sent to workers (a start, a resync, a worker "
                                 "past the held commands)",
    "zns_replication_workers_dropped": "Workers dropped for acknowledging nothing in time or "
                                       "breaking the protocol",
    "zns_process_resident_memory_bytes": "Resident memory of each process of the whole (state, "
                                         "or a worker's number)",
    "zns_process_cpu_seconds": "CPU time (user and system) of each process of the whole "
                               "(state, or a worker's number)",
    "zns_worker_writes_refused": "Writes the worker refused busy: as many as it holds were "
                                 "already at the state process, or as many bytes waited for "
                                 "it to read",
    "zns_worker_writes_timed_out": "Writes the worker answered busy: the state process did not "
                                   "answer them in time",
    "zns_worker_request_pauses": "Times the worker stopped reading ZNS/1 requests: those it "
                                 "held (its writes at the state process and the later requests "
                                 "of their connections) reached its bound, in number or in "
                                 "bytes",
    "zns_worker_events_dropped": "Events the worker dropped unpublished: more were held for the "
                                 "commit fence than its bound (64 MiB); its subscribers see a "
                                 "gap and pull",
    "zns_worker_resyncs": "States the worker asked the state process for: a command or a "
                          "part of a state came out of order",
    "zns_worker_followers": "Followers (read replicas on other hosts, --followers) the worker "
                            "feeds",
    "zns_worker_follower_lag_commands": "Commands the worker applied that a follower it feeds "
                                        "(--followers) has not acknowledged",
    "zns_worker_follower_lag_seconds": "How long ago the worker applied the oldest command a "
                                       "follower it feeds has not acknowledged (0: none)",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("expected", [
    pytest.param({**HELP, **SPLIT_HELP}, id="workers", marks=pytest.mark.skipif(
        MUTATION, reason="under mutation testing every server is a ThreadedServer")),
    pytest.param(HELP, id="one-process", marks=pytest.mark.single_process(
        "the metrics of --workers 0, which the split's replace or add to")),
])
def test_every_metric_says_what_it_counts_and_remoting_connections_are_counted(make_server,
                                                                               expected):
    from test_remoting_listener import Client

    srv = make_server(metrics="http://127.0.0.1:0", remoting="127.0.0.1:0",
                      peers=["tcp://127.0.0.1:1"])
    client = Client(srv.remoting)
    try:
        wait_for(lambda: scrape(srv)[("zns_remoting_connections", ())] == 1)
        status, text = get(f"http://127.0.0.1:{srv.metrics_port}/metrics")
        helps = {f.name: f.documentation for f in text_string_to_metric_families(text)
                 if f.name.startswith("zns")}
        assert helps == expected  # the HELP lines an operator reads, one per metric
        # A peer that does not answer is 0, not 1.
        assert scrape(srv)[("zns_peer_connected", (("peer", "tcp://127.0.0.1:1"),))] == 0
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_healthz_answers_with_the_standard_reason_phrases():
    loop = AgedLoop()
    metrics = MetricsServer(loop, "127.0.0.1:0", heartbeat_interval=1.0)  # type: ignore[arg-type]
    try:
        url = f"http://127.0.0.1:{metrics.port}/healthz"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert (resp.status, resp.reason, resp.headers["Content-Type"]) == (
                200, "OK", "text/plain")
        loop.age = 5.0
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert (refused.value.code, refused.value.reason) == (503, "Service Unavailable")
        assert refused.value.headers["Content-Type"] == "text/plain"
        assert refused.value.read() == b"stuck: no loop pass for 5.0 s\n"
    finally:
        metrics.close()
    with pytest.raises(urllib.error.URLError):  # closed: the port no longer answers
        urllib.request.urlopen(url, timeout=10)


class DictKv:
    """A KV store that is not zns's durable one: it has measured no write times."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, str]] = {}

    def get(self, namespace: str, key: str) -> str | None:
        return self.entries.get(namespace, {}).get(key)

    def list(self, namespace: str) -> dict[str, str]:
        return dict(self.entries.get(namespace, {}))

    def count(self, namespace: str | None = None) -> int:
        return len(self.entries) if namespace is None else len(self.entries.get(namespace, {}))

    def total_bytes(self) -> int:
        return sum(len(n) + len(k) + len(v) for n, kv in self.entries.items() for k, v in kv.items())

    def put(self, namespace: str, key: str, value: str) -> bool:
        changed = self.entries.setdefault(namespace, {}).get(key) != value
        self.entries[namespace][key] = value
        return changed

    def delete(self, namespace: str, key: str) -> bool:
        return self.entries.get(namespace, {}).pop(key, None) is not None


class Idle(AgedLoop):
    """What the collector reads of a server that has answered nothing yet (its loop is live)."""

    def __init__(self) -> None:
        self.service = NameService(DictKv(), epoch="e" * 16, started_at_ms=0)
        self.timers = type("Timers", (), {"stalls": 0})()
        self.remoting = None
        self.replica = None
        self.state: Any = None  # no --state-path
        self.silent: Any = None  # no follower
        self.following: Any = None  # no --followers
        self.dropped_replies = 0
        self.request_times = LatencyHistogram()
        self.clock_ms = 0
        self.subscribers = type("Subscribers", (), {"budget": type("Budget", (), {"cut": 0})()})()

    def now_ms(self) -> int:
        return self.clock_ms


def collected(server: Idle) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the collector yields, as `scrape` returns them (no HTTP in between)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(_Collector(server))  # type: ignore[arg-type]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples}


def test_a_fresh_server_shows_every_fixed_series_at_zero():
    # Prometheus' rate() needs a series to exist before its first increment: each event
    # kind, each form and every histogram bucket is there at 0 from the first scrape.
    m = collected(Idle())
    for kind in ("route", "broker", "hb"):
        assert m["zns_events_published_total", (("channel_kind", kind),)] == 0
    assert not [key for key in m if key[0] == "zns_broker_removals_total"]  # reasons as seen
    assert m["zns_encoded_route_bytes", (("form", "msgpack"),)] == 0
    assert m["zns_encoded_route_bytes", (("form", "json"),)] == 0
    assert m["zns_remoting_connections", ()] == 0
    # A store other than zns's durable one has timed no write: an empty histogram.
    buckets = {labels[0][1]: value for (name, labels), value in m.items()
               if name == "zns_kv_write_seconds_bucket"}
    assert buckets == {**{str(b): 0 for b in WRITE_BOUNDS}, "+Inf": 0}
    assert (m["zns_kv_writes_total", ()], m["zns_kv_write_seconds_count", ()],
            m["zns_kv_write_seconds_sum", ()]) == (0, 0, 0.0)
    assert (m["zns_state_dumps_written_total", ()],
            m["zns_state_dump_failures_total", ()]) == (0, 0)


def test_the_state_dumps_written_and_failed_are_counted_for_an_alert():
    # A full disk fails each write of the dump a restart serves from; the log alone (one
    # ERROR line a second) gives no alert: monitoring/zns-alerts.yml's ZnsStateDumpFailing.
    server = Idle()
    server.state = type("Writer", (), {"written": 3, "failed": 2})()
    m = collected(server)
    assert (m["zns_state_dumps_written_total", ()],
            m["zns_state_dump_failures_total", ()]) == (3, 2)


def test_a_follower_shows_how_long_its_nameserver_has_been_silent():
    # monitoring/zns-alerts.yml's ZnsFollowerSilent: past 5 s a follower answers busy.
    server = Idle()
    assert not any(name == "zns_follower_silence_seconds" for name, _ in collected(server))
    server.silent = lambda: 7250  # ms, as zns.drivers.followers.NetworkChannel.silent_ms
    assert collected(server)["zns_follower_silence_seconds", ()] == 7.25


def test_a_response_code_without_a_name_is_counted_by_its_number():
    server = Idle()
    server.service.remoting_counts[105, 9999] = 2  # GET_ROUTEINFO_BY_TOPIC, answered 9999
    m = collected(server)
    assert m["zns_remoting_requests_total", (("code", "GET_ROUTEINFO_BY_TOPIC"),
                                             ("outcome", "9999"))] == 2


@pytest.mark.timeout(60)
def test_an_address_that_cannot_be_listened_on_is_the_configurations_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EndpointError) as refused:  # a ConfigError: zns serve exits 1
            MetricsServer(Idle(), f"127.0.0.1:{port}", heartbeat_interval=1.0)  # type: ignore[arg-type]
        assert str(refused.value).startswith(f"--metrics 127.0.0.1:{port}: cannot listen: ")
    with pytest.raises(ConfigError) as refused:
        MetricsServer(Idle(), "nonsense", heartbeat_interval=1.0)  # type: ignore[arg-type]
    assert str(refused.value).startswith("--metrics 'nonsense': "), refused.value


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec, shown", [("127.0.0.1:0", "127.0.0.1"), ("[::1]:0", "[::1]")])
def test_the_endpoint_is_logged_once_as_a_url(spec: str, shown: str, caplog):
    caplog.set_level(logging.INFO, logger="zns")
    metrics = MetricsServer(Idle(), spec, heartbeat_interval=1.0)  # type: ignore[arg-type]
    try:
        assert [r.getMessage() for r in records_here(caplog)] == [
            f"metrics on http://{shown}:{metrics.port}/metrics, health on /healthz"]
    finally:
        metrics.close()


@pytest.mark.timeout(60)
def test_a_scraper_that_sends_nothing_holds_up_no_other_and_no_line_is_printed(capsys):
    metrics = MetricsServer(Idle(), "127.0.0.1:0", heartbeat_interval=1.0)  # type: ignore[arg-type]
    try:
        # Served in threads of its own: a connection that never sends its request does not
        # hold up the next scrape (one thread for all would wait on it forever).
        with socket.create_connection(("127.0.0.1", metrics.port), timeout=10):
            assert get(f"http://127.0.0.1:{metrics.port}/healthz") == (200, "ok\n")
            assert get(f"http://127.0.0.1:{metrics.port}/metrics")[0] == 200
        # The threads are daemons and named: a server never closed does not keep its
        # process alive, and a thread dump says what it is.
        (serving,) = [t for t in threading.enumerate() if t.name == "zns-metrics"]
        assert serving.daemon
        # No access-log line per scrape on stderr (wsgiref's default): once every request's
        # thread has ended, whatever it would have printed has been printed.
        wait_for(lambda: metrics.connections() == 0)
        assert capsys.readouterr().err == ""
    finally:
        metrics.close()


@pytest.mark.timeout(60)
def test_only_metrics_healthz_and_readyz_answer():
    server = Idle()
    metrics = MetricsServer(server, "127.0.0.1:0", heartbeat_interval=1.0)  # type: ignore[arg-type]
    try:
        base = f"http://127.0.0.1:{metrics.port}"
        assert get(base + "/")[0] == 404
        assert get(base + "/metricsx")[0] == 404
        assert get(base + "/metrics?name[]=zns_stalls_total")[0] == 200
        request = urllib.request.Request(base + "/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 405
        assert get(base + "/readyz") == (200, "ready\n")
        server.readiness = (False, "warming: 1 of 2 brokers")
        assert get(base + "/readyz") == (503, "warming: 1 of 2 brokers\n")
    finally:
        metrics.close()


def _open_idle(port: int, count: int) -> list[socket.socket]:
    """`count` connections that never send a request (those the kernel does not queue fail)."""
    opened = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(0.2)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        opened.append(sock)
    return opened


@pytest.mark.timeout(120)
def test_idle_connections_hold_at_most_sixteen_threads_and_time_out():
    # Issue 32 item 6: 3,000 idle connections made 3,004 threads. Now at most MAX_CONNECTIONS
    # are served at once, and each is closed when its request has not come within the read
    # timeout; then a scrape gets in.
    from zns.drivers.metrics import MAX_CONNECTIONS

    before = threading.active_count()
    metrics = MetricsServer(Idle(), "127.0.0.1:0", heartbeat_interval=1.0,  # type: ignore[arg-type]
                            read_timeout_s=1.0)
    idle = _open_idle(metrics.port, 200)
    try:
        assert len(idle) >= MAX_CONNECTIONS  # the test did reach the bound
        wait_for(lambda: metrics.connections() == MAX_CONNECTIONS)
        peak = threading.active_count()
        assert peak <= before + 1 + MAX_CONNECTIONS
        # The idle ones are answered 408 and closed after the read timeout; a scrape gets in.
        wait_for(lambda: get(f"http://127.0.0.1:{metrics.port}/healthz") == (200, "ok\n"))
        timed_out = idle[0]
        timed_out.settimeout(10)
        assert timed_out.recv(100).startswith(b"HTTP/1.1 408 Request Timeout")
    finally:
        for sock in idle:
            sock.close()
        metrics.close()
    wait_for(lambda: threading.active_count() <= before)


@pytest.mark.timeout(60)
def test_a_request_trickled_byte_by_byte_is_cut_at_the_read_timeout():
    metrics = MetricsServer(Idle(), "127.0.0.1:0", heartbeat_interval=1.0,  # type: ignore[arg-type]
                            read_timeout_s=1.0)
    try:
        with socket.create_connection(("127.0.0.1", metrics.port), timeout=10) as sock:
            answer = b""
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.05)
                sock.setblocking(False)
                try:
                    answer += sock.recv(100)
                except BlockingIOError:
                    pass
                sock.setblocking(True)
                if answer:
                    break
            assert answer.startswith(b"HTTP/1.1 408"), answer
    finally:
        metrics.close()


@pytest.mark.timeout(60)
def test_out_of_descriptors_the_metrics_port_drops_new_connections_too():
    from zns.core.accept_pause import RETRY_MS
    from zns.drivers.descriptors import DescriptorGuard

    guard = DescriptorGuard(1 << 20)
    metrics = MetricsServer(Idle(), "127.0.0.1:0", heartbeat_interval=1.0,  # type: ignore[arg-type]
                            descriptors=guard)
    try:
        assert metrics.listening in guard.plain
        guard.out_of_descriptors(metrics.listening, now=0)
        with pytest.raises(OSError):  # the kernel drops the SYN: no answer
            socket.create_connection(("127.0.0.1", metrics.port), timeout=0.5).close()
        guard.tick(RETRY_MS)  # descriptors free again: the filter comes off
        assert get(f"http://127.0.0.1:{metrics.port}/healthz") == (200, "ok\n")
    finally:
        metrics.close()
        guard.close()
    assert not guard.plain  # closed: no longer guarded


@pytest.mark.timeout(60)
def test_request_latency_is_a_histogram_by_protocol_and_op(make_server):
    from test_remoting_listener import Client
    from zns.core.remoting import RemotingCommand

    srv = make_server(metrics="http://127.0.0.1:0", remoting="127.0.0.1:0")
    peer = srv.peer()
    for _ in range(3):
        peer.ok("status")
    peer.call("no_such_op")  # an op no one knows: one label, "unknown"
    client = Client(srv.remoting)
    try:
        client.call(RemotingCommand(code=106))  # GET_BROKER_CLUSTER_INFO
        m = wait_for(lambda: (m := scrape(srv)).get(
            ("zns_request_seconds_count", (("op", "GET_BROKER_CLUSTER_INFO"),
                                           ("protocol", "remoting")))) and m)
        assert m["zns_request_seconds_count", (("op", "status"), ("protocol", "zns1"))] == 3
        assert m["zns_request_seconds_bucket", (("le", "+Inf"), ("op", "status"),
                                                ("protocol", "zns1"))] == 3
        assert ("zns_request_seconds_count", (("op", "unknown"), ("protocol", "zns1"))) in m
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.single_process("reads the server's own request_times")
def test_requests_are_not_timed_without_metrics(make_server):
    # The timing costs about 1 µs a request; without --metrics no one could read it.
    from test_remoting_listener import Client
    from zns.core.remoting import RemotingCommand

    srv = make_server(remoting="127.0.0.1:0")
    srv.peer().ok("status")
    client = Client(srv.remoting)
    try:
        assert client.call(RemotingCommand(code=106)).code == 0  # GET_BROKER_CLUSTER_INFO
    finally:
        client.close()
    assert srv.server.request_times.labels == {}


def test_request_labels_are_bounded():
    from zns.core.latency import MAX_LABELS

    times = LatencyHistogram()
    for n in range(MAX_LABELS + 50):
        times.observe(f"zns1:op{n}", 0.001)
    assert len(times.labels) == MAX_LABELS + 1 and sum(times.labels["other"].counts) == 50


def test_heartbeat_ages_are_a_distribution_and_a_maximum_without_a_label_per_broker():
    server = Idle()
    for n, heard_at in enumerate((1_000, 5_000, 9_500)):
        zns1_ok(server.service, "register_broker", now=heard_at,
                **register_fields(broker_name=f"b{n}", addr=f"10.0.0.{n}:10911"))
    server.clock_ms = 10_000
    m = collected(server)
    buckets = {labels[0][1]: value for (name, labels), value in m.items()
               if name == "zns_broker_heartbeat_age_seconds_bucket"}
    assert (buckets["1.0"], buckets["5.0"], buckets["10.0"], buckets["+Inf"]) == (1, 2, 3, 3)
    assert m["zns_broker_heartbeat_age_max_seconds", ()] == 9.0
    assert m["zns_broker_heartbeat_age_seconds_gsum", ()] == 9.0 + 5.0 + 0.5


def test_health_readiness_and_the_remoting_limit_are_series_for_alerts():
    server = Idle()
    m = collected(server)
    assert (m["zns_healthy", ()], m["zns_ready", ()]) == (1, 1)
    assert m["zns_remoting_max_connections", ()] == 0  # no listener
    assert m["zns_event_subscribers_cut_total", ()] == 0
    server.readiness = (False, "warming")
    server.remoting = type("Listener", (), {"connections": {}, "max_connections": 77})()
    m = collected(server)
    assert (m["zns_ready", ()], m["zns_remoting_max_connections", ()]) == (0, 77)

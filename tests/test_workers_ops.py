"""Operating `zns serve --workers N`: one /metrics, /healthz and /readyz for the whole on
the workers' shared port, `status` listing every worker, log lines naming the worker."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from helpers import Peer, ProcessServer, ThreadedServer, free_port, register_fields, wait_for
from test_metrics import get
from zns.core.config import ServerConfig
from zns.core.errors import EndpointError
from zns.drivers import port_lock, state_process
from zns.drivers.security import write_keypair
from zns.drivers.server import Server
from zns.drivers.worker import name_worker_lines

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]





def metrics_port(server: ProcessServer) -> int:
    return int(re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", server.output())[0])


def scrape(server: ProcessServer) -> Samples:
    """One scrape on a new connection (the kernel picks the worker)."""
    status, text = get(f"http://127.0.0.1:{metrics_port(server)}/metrics")
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def worker_pids(server: ProcessServer) -> dict[int, int]:
    """The live pid of each worker, from its last start line."""
    found = re.findall(r"worker (\d+): loaded the state at seq \d+ \(pid (\d+)\)", server.output())
    return {int(w): int(p) for w, p in found}


def peer_on_worker(server: ProcessServer, worker: int, ctx: zmq.Context) -> Peer:
    for _ in range(200):
        peer = Peer(server.router, server.pub, ctx)
        if peer.ok("status").worker == worker:
            return peer
        peer.close()
    raise AssertionError(f"no connection landed on worker {worker}")


def both_loaded(samples: Samples) -> bool:
    return all(samples.get(("zns_worker_loaded", (("worker", w),))) == 1 for w in ("1", "2"))


def test_every_scrape_on_any_worker_shows_both_workers_and_the_state_process(
        tmp_path: Path, ctx: Any) -> None:
    server = ProcessServer(tmp_path, "--workers", "2", "--metrics", "127.0.0.1:0")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        one, two = peer_on_worker(server, 1, ctx), peer_on_worker(server, 2, ctx)
        one.ok("register_broker", **register_fields(topics={"T": {}}))
        one.ok("kv_put", namespace="ns", key="k", value="v")
        for _ in range(3):
            two.ok("get_route", topic="T")
        reads = ("zns_requests_total", (("op", "get_route"), ("outcome", "ok"), ("worker", "2")))
        writes = ("zns_requests_total",
                  (("op", "register_broker"), ("outcome", "ok"), ("worker", "1")))
        # Each worker's counts reach the other within two report periods: wait until a
        # scrape answered by each worker shows both (later wholes are only newer).
        seen: set[float] = set()

        def both_counted() -> bool:
            m = scrape(server)
            # ... and the state process's dump of the change (the state file beside the KV
            # file), written within a second: its count is the state process's too.
            if m.get(reads) == 3 and m.get(writes) == 1 \
                    and m.get(("zns_state_dumps_written_total", ()), 0) >= 1:
                seen.add(m["zns_answering_worker", ()])
            return seen == {1, 2}

        wait_for(both_counted, timeout=30, interval=0.1)
        answered: set[float] = set()
        scrapes = 0
        while scrapes < 12 or answered != {1, 2}:  # one worker 12 times: about 1 in 2,000
            assert scrapes < 100, f"100 scrapes all landed on worker {answered}"
            scrapes += 1
            m = scrape(server)
            answered.add(m["zns_answering_worker", ()])
            assert m[reads] == 3 and m[writes] == 1, m
            for worker in ("1", "2"):  # every worker's own series, labelled
                assert ("zns_dropped_replies_total", (("worker", worker),)) in m
                assert m["zns_events_published_total",
                         (("channel_kind", "hb"), ("worker", worker))] >= 1
                assert m["zns_worker_loaded", (("worker", worker),)] == 1
                assert m["zns_worker_applied_seq", (("worker", worker),)] >= 2
                assert m["zns_worker_lag_commands", (("worker", worker),)] >= 0
                assert m["zns_process_resident_memory_bytes", (("process", worker),)] > 0
            # The whole's figures: once, unlabelled; the state process's own.
            assert m["zns_brokers", ()] == 1 and m["zns_topics", ()] == 1
            assert m["zns_kv_writes_total", ()] == 1  # the KV file is the state process's
            assert m["zns_state_dumps_written_total", ()] >= 1
            assert m["zns_state_dump_failures_total", ()] == 0
            assert m["zns_replication_seq", ()] >= 2
            assert m["zns_worker_restarts_total", ()] == 0
            assert m["zns_process_resident_memory_bytes", (("process", "state"),)] > 0
            assert m["zns_ready", ()] == 1
        for path in ("/healthz", "/readyz"):
            assert get(f"http://127.0.0.1:{metrics_port(server)}{path}")[0] == 200
    finally:
        assert server.stop() == 0


def test_a_killed_worker_is_counted_as_restarted_and_status_lists_every_worker(
        tmp_path: Path, ctx: Any) -> None:
    server = ProcessServer(tmp_path, "--workers", "2", "--metrics", "127.0.0.1:0")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        wait_for(lambda: both_loaded(scrape(server)), timeout=30, interval=0.2)
        pids = worker_pids(server)
        peer = Peer(server.router, server.pub, ctx)
        peer.ok("register_broker", **register_fields())

        def listed(reply: Any) -> dict[int, tuple[int, str]]:
            return {w.worker: (w.pid, w.state) for w in reply.workers}

        # Any worker answers with every worker, as the state process sees them.
        for worker in (1, 2):
            on_it = peer_on_worker(server, worker, ctx)
            wait_for(lambda: listed(on_it.ok("status")) ==
                     {w: (pid, "loaded") for w, pid in pids.items()})
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda: worker_pids(server)[1] != pids[1])
        m = wait_for(lambda: (m := scrape(server))["zns_worker_restarts_total", ()] == 1
                     and both_loaded(m) and m, timeout=30, interval=0.2)
        assert m["zns_brokers", ()] == 1
        new = worker_pids(server)
        reply = wait_for(lambda: (r := Peer(server.router, None, ctx).ok("status")) and
                         listed(r) == {w: (pid, "loaded") for w, pid in new.items()} and r,
                         timeout=30)
        for w in reply.workers:
            assert w.applied == reply.workers[0].applied and w.lag_commands >= 0
    finally:
        assert server.stop() == 0


def test_status_uptime_is_the_nameservers_not_the_answering_workers(
        tmp_path: Path, ctx: Any) -> None:
    server = ProcessServer(tmp_path, "--workers", "1")
    serving = time.monotonic()  # the state process started before this
    try:
        wait_for(lambda: worker_pids(server))
        old = worker_pids(server)[1]
        time.sleep(2.0)  # the replacement is born at least this long after the NameServer
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: worker_pids(server)[1] != old)
        peer = Peer(server.router, None, ctx)
        wait_for(lambda: [w.pid for w in peer.ok("status").workers] == [worker_pids(server)[1]])
        asked = time.monotonic()
        reply = peer.ok("status")
        # Before: the replacement's own uptime, under (asked - the kill) < (asked - serving - 2 s).
        assert reply.uptime_ms >= (asked - serving) * 1000, reply
    finally:
        assert server.stop() == 0


def test_every_line_a_worker_logs_names_it_whatever_its_logger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    name_worker_lines(3)
    logging.getLogger("zns").warning("from zns")
    logging.getLogger("zns.zap").warning("from a child logger")
    logging.getLogger("zns").warning("worker 3: already named")
    assert stream.getvalue().splitlines() == [
        "worker 3: from zns", "worker 3: from a child logger", "worker 3: already named"]


def test_every_line_of_a_traceback_a_worker_logs_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    handlers = [logging.StreamHandler(stream), logging.StreamHandler(stream)]  # named once
    monkeypatch.setattr(logging.getLogger(), "handlers", handlers)
    name_worker_lines(3)
    try:
        raise RuntimeError("made to fail")
    except RuntimeError:
        logging.getLogger("zns.zap").exception("caught")
    logging.getLogger("zns").warning("where", stack_info=True)
    lines = stream.getvalue().splitlines()
    assert lines.count("worker 3: RuntimeError: made to fail") == 2, lines
    assert sum("Stack (most recent call last)" in line for line in lines) == 2, lines
    assert all(line.startswith("worker 3: ") for line in lines), lines


def test_a_workers_json_line_carries_its_number_as_a_field_and_its_traceback_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/operations.md: with --log-format json the worker is the field `worker`, the
    # message carries no prefix, and a traceback is the `exception` field of its one line.
    import json

    from zns.drivers.logs import JsonFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    name_worker_lines(3)
    logging.getLogger("zns").warning("from zns")
    try:
        raise RuntimeError("made to fail")
    except RuntimeError:
        logging.getLogger("zns.zap").exception("caught")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["worker"], line["message"]) for line in lines] == [
        (3, "from zns"), (3, "caught")]
    assert "exception" not in lines[0]
    assert lines[1]["exception"].startswith("Traceback (most recent call last)")
    assert lines[1]["exception"].endswith("RuntimeError: made to fail")
    assert "worker 3: " not in lines[1]["exception"]


# A worker that raises as it starts (its Server cannot be made), and so every replacement.
_BROKEN_WORKER = """
import sys
from zns.drivers import worker
def broken(*args, **kwargs):
    raise RuntimeError("made to fail")
worker.WorkerServer.__init__ = broken
from zns.cli import main
sys.argv[0] = "zns"
main(prog_name="zns")
"""


def test_a_worker_that_raises_logs_its_traceback_every_line_naming_it(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BROKEN_WORKER, "serve", "--workers", "1", "--router",
             "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*", "--kv-path",
             str(tmp_path / "kv")], stdout=log, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("ZNS_")})
        try:
            wait_for(lambda: log_path.read_text().count("RuntimeError: made to fail") >= 2,
                     timeout=60)  # the first worker's and its replacement's
        finally:
            proc.terminate()
            assert proc.wait(15) == 0
    lines = log_path.read_text().splitlines()
    # The state process's lines and the workers' log lines start with their time; the rest
    # are the lines of a worker's traceback. Before, those were printed, naming no worker.
    untimed = [line for line in lines if not re.match(r"\d{4}-\d\d-\d\dT", line)]
    assert untimed and all(line.startswith("worker 1: ") for line in untimed), lines
    assert sum("CRITICAL zns: worker 1: stopped by an uncaught error" in line
               for line in lines) >= 2, lines


def test_a_worker_that_cannot_read_its_key_file_says_so_in_one_line_each_start(
        tmp_path: Path) -> None:
    """A key file read at start by the first worker, gone when a replacement starts: each
    start fails, again after the backoff, until it is back. Each says why in one line
    (as one process refuses it at start), not with a traceback of 30 lines."""
    public, secret = write_keypair(str(tmp_path / "keys"), "server")
    server = ProcessServer(tmp_path, "--workers", "1", "--curve-secret", secret)
    try:
        first = worker_pids(server)[1]
        os.rename(secret, f"{secret}.moved")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: server.output().count("worker 1: cannot start: ") >= 2
                 or server.output().count("stopped by an uncaught error") >= 2)
        output = server.output()
        assert "Traceback" not in output and "uncaught error" not in output, output
        line = server.line("worker 1: cannot start: ")
        assert line.endswith(f"cannot read certificate {secret}: Invalid certificate file: "
                             f"{secret}"), line
        os.rename(f"{secret}.moved", secret)  # back: the next start serves
        wait_for(lambda: server.output().count("serving requests on") == 2)
    finally:
        assert server.stop() == 0


def test_sighup_to_the_state_process_reloads_every_worker_and_ends_nothing(
        tmp_path: Path, ctx: Any) -> None:
    # `systemctl reload zns` sends SIGHUP to the main process: the state process.
    server = ProcessServer(tmp_path, "--workers", "2")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        pids = worker_pids(server)
        os.kill(server.proc.pid, signal.SIGHUP)
        wait_for(lambda: all(f"worker {w}: SIGHUP: CURVE is off" in server.output()
                             for w in (1, 2)))
        assert server.proc.poll() is None and worker_pids(server) == pids
        assert Peer(server.router, None, ctx).ok("status").workers
    finally:
        assert server.stop() == 0


def test_a_stop_signal_to_every_process_at_once_starts_no_worker(tmp_path: Path) -> None:
    # What `systemctl stop` does (KillMode=control-group): SIGTERM to the state process and
    # to every worker at the same moment. The workers that end are not replaced.
    server = ProcessServer(tmp_path, "--workers", "2")
    wait_for(lambda: server.output().count("serving requests on") == 2)
    for pid in worker_pids(server).values():
        os.kill(pid, signal.SIGTERM)
    assert server.stop() == 0
    # A worker's exit may be reaped before the state process's own SIGTERM arrives: its
    # slot is then due again 1 s later (a clean exit), and the stop comes first.
    assert server.output().count(" started (pid") == 2, server.output()


def test_a_worker_that_does_not_stop_is_killed_after_the_grace_and_the_state_still_written(
        tmp_path: Path, ctx: Any) -> None:
    # docs/operations.md: SIGTERM to the state process stops its workers (SIGTERM, SIGKILL
    # after STOP_GRACE_S), writes the state dump and exits 0. A stopped worker (SIGSTOP)
    # handles no SIGTERM.
    from zns.drivers.state_process import STOP_GRACE_S

    server = ProcessServer(tmp_path, "--workers", "1")
    wait_for(lambda: "serving requests on" in server.output())
    Peer(server.router, None, ctx).ok("register_broker", **register_fields())
    (pid,) = worker_pids(server).values()
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    assert server.stop() == 0
    assert STOP_GRACE_S <= time.monotonic() - started < STOP_GRACE_S + 5
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, and reaped by the state process
    assert (tmp_path / "kv.json.state").exists()
    assert server.output().rstrip().endswith("zns stopped"), server.output()


def test_a_metrics_port_in_use_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--workers", "2", "--router",
             "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*", "--kv-path",
             str(tmp_path / "kv"), "--metrics", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    # As one process says it (zns.drivers.metrics).
    assert len(lines) == 1 and f"--metrics 127.0.0.1:{port}: cannot listen: " in lines[0], lines


def test_readyz_on_any_worker_waits_for_the_brokers_the_state_process_restored(
        tmp_path: Path, ctx: Any) -> None:
    first = ProcessServer(tmp_path, "--workers", "2")
    try:
        wait_for(lambda: first.output().count("serving requests on") == 2)
        Peer(first.router, None, ctx).ok("register_broker", **register_fields())
    finally:
        assert first.stop() == 0  # writes the state dump
    server = ProcessServer(tmp_path, "--workers", "2", "--metrics", "127.0.0.1:0")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        url = f"http://127.0.0.1:{metrics_port(server)}/readyz"
        for _ in range(8):  # whichever worker answers: the state process's rule
            status, text = get(url)
            assert status == 503 and ("warming: 1 of 1 brokers" in text
                                      or "no word from the state process" in text), text
        Peer(server.router, None, ctx).ok("register_broker", **register_fields())
        wait_for(lambda: all(get(url)[0] == 200 for _ in range(4)), interval=0.2)
        assert get(f"http://127.0.0.1:{metrics_port(server)}/healthz")[0] == 200
    finally:
        assert server.stop() == 0


def test_status_shows_a_stopped_worker_falling_behind_and_catching_up(
        tmp_path: Path, ctx: Any) -> None:
    server = ProcessServer(tmp_path, "--workers", "2")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        one = peer_on_worker(server, 1, ctx)
        wait_for(lambda: len(one.ok("status").workers) == 2)
        pids = worker_pids(server)

        def worker_two() -> Any:
            return {w.worker: w for w in one.ok("status").workers}[2]

        os.kill(pids[2], signal.SIGSTOP)
        try:
            for n in range(3):  # answered by worker 1 alone: the fence does not wait for them
                one.ok("register_broker", **register_fields(topics={f"T{n}": {}}))
            behind = wait_for(lambda: (w := worker_two()).lag_commands >= 3 and w.lag_ms > 0
                              and w, timeout=8)  # under the 10 s that gets it replaced
            assert behind.state == "loaded" and behind.pid == pids[2]
        finally:
            os.kill(pids[2], signal.SIGCONT)
        caught_up = wait_for(lambda: (w := worker_two()).lag_commands == 0 and w)
        assert caught_up.lag_ms == 0 and caught_up.applied >= behind.applied + 3
        assert worker_pids(server) == pids
    finally:
        assert server.stop() == 0


def test_a_worker_that_acknowledges_nothing_for_10_s_is_killed_and_replaced(
        tmp_path: Path, ctx: Any) -> None:
    # docs/operations.md: a worker that acknowledges no replicated command for 10 s
    # (DEFAULT_ACK_TIMEOUT_MS) is killed (SIGKILL) and replaced; not before.
    from zns.core.replication import DEFAULT_ACK_TIMEOUT_MS

    server = ProcessServer(tmp_path, "--workers", "2")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        one = peer_on_worker(server, 1, ctx)
        pids = worker_pids(server)
        os.kill(pids[2], signal.SIGSTOP)  # it reads nothing and acknowledges nothing
        one.ok("register_broker", **register_fields())
        written = time.monotonic()
        wait_for(lambda: worker_pids(server)[2] != pids[2],
                 timeout=DEFAULT_ACK_TIMEOUT_MS / 1000 + 10)
        assert time.monotonic() - written >= DEFAULT_ACK_TIMEOUT_MS / 1000 - 0.5
        assert re.search(r"worker channel \d+ dropped: no acknowledgement for \d+ ms",
                         server.output()), server.output()
        assert "worker 2 (pid %d) died (signal 9)" % pids[2] in server.output()
        with pytest.raises(ProcessLookupError):
            os.kill(pids[2], 0)
        assert worker_pids(server)[1] == pids[1]
        assert peer_on_worker(server, 2, ctx).ok("get_route", topic="TopicA").route.brokers
    finally:
        assert server.stop() == 0


def test_a_peer_churning_brokers_writes_at_most_the_repeat_filters_lines_in_the_state_process(
        tmp_path: Path, ctx: Any) -> None:
    # With workers the state process logs each broker change (a worker logs none: it would
    # be once per worker). A peer that registers and unregisters brokers as fast as it can
    # must not make it write a line per change: every process holds its lines to the repeat
    # filter's 20 per template per 10 s (docs/operations.md, *log lines*). Before, the
    # filter was installed by `Server` only, which the state process never makes: 100
    # registrations wrote 100 `broker registered` lines within a second.
    server = ProcessServer(tmp_path, "--workers", "1")
    try:
        wait_for(lambda: "serving requests on" in server.output())
        peer = Peer(server.router, None, ctx)
        for n in range(100):
            peer.ok("register_broker", **register_fields(
                broker_name=f"broker-{n}", addr=f"10.0.0.{n + 1}:10911"))
        # Every registration is applied and replicated (its reply came from the replica).
        assert peer.ok("status").brokers == 100
        lines = [line for line in server.output().splitlines()
                 if "broker registered c1/broker-" in line]
        assert 1 <= len(lines) <= 20, len(lines)
        assert not any(line.split("zns: ", 1)[1].startswith("worker ") for line in lines)
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("shared", ["--router", "--pub"])
@pytest.mark.parametrize("workers", ["2", "0"])
def test_a_second_zns_on_a_port_a_running_one_serves_is_refused_in_one_line(
        tmp_path: Path, shared: str, workers: str) -> None:
    # Every worker binds with SO_REUSEPORT: a second instance that did too would share the
    # port, the kernel splitting connections between two NameServers (reserve_port).
    first = ProcessServer(tmp_path, "--workers", "2")
    # A directory of its own: the state dump beside the KV file is not the first's either.
    second_kv = tmp_path / "second" / "kv.json"
    second_kv.parent.mkdir()
    try:
        wait_for(lambda: first.output().count("serving requests on") == 2)
        taken = first.router if shared == "--router" else first.pub
        endpoints = {"--router": "tcp://127.0.0.1:*", "--pub": "tcp://127.0.0.1:*", shared: taken}
        result = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--workers", workers,
             *(word for option in endpoints.items() for word in option),
             "--kv-path", str(second_kv)],
            capture_output=True, text=True, timeout=30)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and taken in lines[0] and "in use" in lines[0], lines
        assert not second_kv.exists()
    finally:
        assert first.stop() == 0


@pytest.mark.parametrize("workers", ["1", "0"])
@pytest.mark.parametrize("named", ["127.0.0.1", "localhost"])
def test_a_second_zns_on_a_port_held_while_none_of_its_holders_workers_listens_is_refused(
        tmp_path: Path, named: str, workers: str) -> None:
    # Two reservations that never listen, both with SO_REUSEADDR, bind one port: two zns
    # started at the same moment (or a second one while the first one's only worker was
    # being replaced) both started, and the kernel split connections between their workers.
    # The first here is this test's reservation, held as a state process holds it before
    # its workers listen; the second names the port by another name of the same address.
    # A single process (`--workers 0`) listens at once, and the kernel let it bind beside
    # the reservation too: it then served the port, and the first one's workers could never
    # bind it; it takes the port's lock before binding, and is refused the same way.
    port = free_port()
    _, held = state_process.reserve_port(f"tcp://127.0.0.1:{port}")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--workers", workers, "--router",
             f"tcp://{named}:{port}", "--pub", "tcp://127.0.0.1:*",
             "--kv-path", str(tmp_path / "kv.json")],
            capture_output=True, text=True, timeout=30)
    finally:
        held.close()
    assert result.returncode == 1 and not result.stdout, result
    [line] = result.stderr.strip().splitlines()
    assert line == (f"Error: cannot bind tcp://{named}:{port}: [Errno 98] Address already in "
                    "use (another zns holds the port, none of its workers listening on it now: "
                    f"pid {os.getpid()})")
    assert not (tmp_path / "kv.json").exists()


@pytest.mark.parametrize("option, spec, refused", [
    ("--remoting", "127.0.0.1:{port}", "--remoting 127.0.0.1:{port}"),
    ("--metrics", "127.0.0.1:{port}", "--metrics 127.0.0.1:{port}: cannot listen"),
])
def test_a_single_process_is_refused_every_port_whose_lock_another_process_holds(
        tmp_path: Path, option: str, spec: str, refused: str) -> None:
    # The lock alone (no reservation: nothing is bound on the port), held here: the one
    # line names this process, once the lock is still held 2 s after the first try.
    port = free_port()
    lock, why = port_lock.lock_port(f"127.0.0.1:{port}")
    assert lock is not None, why
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--workers", "0", "--router",
             "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*", option, spec.format(port=port),
             "--kv-path", str(tmp_path / "kv.json")],
            capture_output=True, text=True, timeout=30)
    finally:
        lock.close()
    assert result.returncode == 1 and not result.stdout, result
    line = result.stderr.strip().splitlines()[-1]
    assert line == (f"Error: {refused.format(port=port)}: [Errno 98] Address already in use "
                    "(another zns holds the port, none of its workers listening on it now: "
                    f"pid {os.getpid()})")
    assert time.monotonic() - started >= port_lock.PORT_FREED_WAIT_S


def test_a_single_process_holds_its_ports_locks_until_it_stops(tmp_path: Path) -> None:
    # A fixed port locked before it is bound, one of `*` once the kernel chose it; all free
    # again once it stops, and a restart on the same fixed ports right after starts.
    port = free_port()
    first = ProcessServer(tmp_path, "--workers", "0", "--router", f"tcp://127.0.0.1:{port}",
                          "--remoting", "127.0.0.1:0")
    remoting = "tcp://" + first.line("RocketMQ remoting listener on").rsplit(" ", 1)[1]
    try:
        for endpoint in (first.router, first.pub, remoting):
            assert lock_of(endpoint) is None, f"{endpoint}'s lock is not held"
    finally:
        assert first.stop() == 0
    for endpoint in (first.router, first.pub, remoting):
        lock = lock_of(endpoint)
        assert lock is not None, f"{endpoint}'s lock outlived the server"
        lock.close()
    again = ProcessServer(tmp_path, "--workers", "0", "--router", first.router,
                          "--pub", first.pub, kv_path=tmp_path / "again-kv.json")
    assert again.stop() == 0


@pytest.mark.single_process("servers in the test's own process: their locks are its own")
def test_in_process_servers_release_their_locks_on_stop_and_refuse_each_others_ports(
        tmp_path: Path) -> None:
    port = free_port()
    router = f"tcp://127.0.0.1:{port}"
    one = ThreadedServer(tmp_path / "one", router=router)
    other = ThreadedServer(tmp_path / "other")  # another one on other ports: both serve
    try:
        assert lock_of(router) is None
        # A third on the first one's port: this process's own lock is not waited for, and
        # not "another zns": refused at once, as the kernel refuses a second listener.
        started = time.monotonic()
        with pytest.raises(EndpointError) as refused:
            Server(ServerConfig(router=router, pub="tcp://127.0.0.1:*", kv_path=None))
        assert str(refused.value) == f"cannot bind {router}: [Errno 98] Address already in use"
        assert time.monotonic() - started < port_lock.PORT_FREED_WAIT_S
    finally:
        one.stop()
        other.stop()
    again = ThreadedServer(tmp_path / "again", router=router)  # right after stop: free
    again.stop()
    lock = lock_of(router)
    assert lock is not None, "the lock outlived the restarted server"
    lock.close()


def test_where_ports_cannot_be_locked_the_state_process_says_so_and_starts(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(port_lock, "PORT_LOCKS", False)  # not Linux
    config = ServerConfig(router="tcp://127.0.0.1:*", pub="tcp://127.0.0.1:*", kv_path=None)
    with caplog.at_level(logging.WARNING, logger="zns"):
        process = state_process.StateProcess(config)
    process.close()
    assert [r.getMessage() for r in caplog.records] == [
        "ports not locked (abstract Unix socket names are Linux's): a second zns started on "
        "them while none of this one's workers listens is not refused"]


@pytest.mark.parametrize("workers", ["1", "0"])
@pytest.mark.parametrize("first, second, refused", [
    ("--router tcp://127.0.0.1:{port}", "--pub tcp://localhost:{port}",
     "cannot bind tcp://localhost:{port}"),
    # A wildcard and a specific address: two locks, but one port a connection could reach
    # either way (one process's second listen fails; two reservations both bind).
    ("--router tcp://0.0.0.0:{port}", "--remoting 127.0.0.1:{port}",
     "--remoting 127.0.0.1:{port}"),
    ("--router tcp://127.0.0.1:{port}", "--remoting 0.0.0.0:{port}",
     "--remoting 0.0.0.0:{port}"),
])
def test_two_endpoints_of_one_zns_on_one_port_are_refused_at_once_in_one_line(
        tmp_path: Path, workers: str, first: str, second: str, refused: str) -> None:
    # Its own lock: not "another zns", and nothing to wait for (as one process says it).
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "zns", "serve", "--workers", workers,
         *first.format(port=port).split(), *second.format(port=port).split(),
         "--kv-path", str(tmp_path / "kv.json")],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and not result.stdout, result
    line = result.stderr.strip().splitlines()[-1]  # after the warning of a wildcard, if any
    assert line == f"Error: {refused.format(port=port)}: [Errno 98] Address already in use"


@pytest.mark.parametrize("v6only", [0, 1])
def test_ipv6s_wildcard_overlaps_an_ipv4_address_only_where_it_takes_ipv4(v6only: int) -> None:
    # A socket on [::] takes IPv4 unless IPV6_V6ONLY is set on it (net.ipv6.bindv6only=1 sets
    # it by default): then 127.0.0.1 on the same port is no address it could be reached by,
    # and one process listens on both.
    port = free_port()
    wildcard = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    address = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        wildcard.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        for sock, host in ((wildcard, "::"), (address, "127.0.0.1")):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        one, other = (state_process.Reservation(sock, name, None, "")
                      for sock, name in ((wildcard, f"[::]:{port}"), (address, f"127.0.0.1:{port}")))
        assert one.overlaps(other) is other.overlaps(one) is (not v6only)
        loopback = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        with loopback:  # an IPv6 address: the wildcard takes it either way
            loopback.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            loopback.bind(("::1", port))
            assert one.overlaps(state_process.Reservation(loopback, f"[::1]:{port}", None, ""))
        wildcard.listen()
        if v6only:
            address.listen()  # one process listens on both: the kernel agrees
        else:
            with pytest.raises(OSError) as refused:
                address.listen()
            assert refused.value.errno == errno.EADDRINUSE
    finally:
        wildcard.close()
        address.close()


def test_a_locks_holder_is_found_by_its_descriptor_and_nobody_holds_a_free_one() -> None:
    port = free_port()
    lock, why = port_lock.lock_port(f"127.0.0.1:{port}")
    assert lock is not None, why
    try:
        assert port_lock.lock_holder(f"127.0.0.1:{port}") == os.getpid()
    finally:
        lock.close()
    assert port_lock.lock_holder(f"127.0.0.1:{port}") is None


def lock_of(endpoint: str) -> socket.socket | None:
    """The lock of `endpoint`'s port taken here, or None when another process holds it."""
    try:
        lock, why = port_lock.lock_port(f"127.0.0.1:{endpoint.rpartition(':')[2]}")
    except port_lock.PortLocked:
        return None
    assert lock is not None, why
    return lock


def test_a_restart_on_the_ports_of_a_killed_state_process_waits_for_its_last_worker(
        tmp_path: Path) -> None:
    # Its workers leave once they read the end of its channel; a worker that has not yet
    # (here: stopped) still listens, and the restart waits for it instead of refusing.
    first = ProcessServer(tmp_path, "--workers", "1")
    (pid,) = worker_pids(first).values()
    try:
        assert lock_of(first.router) is None and lock_of(first.pub) is None  # held: running
        os.kill(pid, signal.SIGSTOP)
        first.proc.kill()
        first.proc.wait(15)
        # The locks were the state process's alone: free at once, though its worker listens.
        for endpoint in (first.router, first.pub):
            lock = lock_of(endpoint)
            assert lock is not None, f"{endpoint}'s lock outlived the state process"
            lock.close()
        restart = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--workers", "1", "--router", first.router,
             "--pub", first.pub, "--kv-path", str(tmp_path / "b-kv.json")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.5)  # the restart is trying the port meanwhile
            assert restart.poll() is None
            os.kill(pid, signal.SIGKILL)  # the last worker gone: the port is free
            pid = 0
            peer = Peer(first.router, None)
            try:
                assert peer.ok("status").brokers == 0  # the restart serves
            finally:
                peer.close()
        finally:
            restart.terminate()
            assert restart.wait(15) == 0, restart.stderr.read() if restart.stderr else ""
    finally:
        first.proc.kill()
        first.proc.wait(15)
        first.log.close()
        if pid:  # the test failed before its kill (it may be stopped)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

"""Test helpers, once: a NameServer on ephemeral ports (in a thread or a subprocess), a raw
ZNS/1 peer, waiting for a condition, and requests to a NameService without sockets.

Fixtures stay in conftest.py; test modules import what they use from here.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import zmq
from hypothesis import settings

from zns.core import schema
from zns.core.routes import RouteTable
from zns.core.config import settings as config_settings
from zns.core.service import NameService
from zns.drivers.server import Server, ServerConfig

# Under mutation testing (tools/mutate.py sets ZNS_MUTATION=1) every test runs once per mutant:
# hypothesis uses few, derandomized examples and tests that start a server are deselected.
MUTATION = os.environ.get("ZNS_MUTATION") == "1"
settings.register_profile("mutation", max_examples=25, derandomize=True, database=None, deadline=None)
if MUTATION:
    settings.load_profile("mutation")


def examples(n: int) -> int:
    """A test's own hypothesis `max_examples`, cut to the mutation profile's under mutation testing."""
    return min(n, settings.get_profile("mutation").max_examples) if MUTATION else n


# How long a condition may take on a loaded 2-core machine before a test calls it broken. A
# deadline, not a measurement: a test that passes never waits for it, so it can be generous
# (under load 27, a reply, a subprocess start or a failover took over 10 s).
LOADED_DEADLINE = 30.0


def records_here(caplog: Any, name: str = "zns") -> list[logging.LogRecord]:
    """`name`'s records logged by this thread: caplog also catches what a thread another
    test left running logs meanwhile (a server's stall warning under load, say)."""
    here = threading.get_ident()
    return [r for r in caplog.records if r.name == name and r.thread == here]


def wait_for(condition: Callable[[], Any], timeout: float = LOADED_DEADLINE,
             interval: float = 0.01) -> Any:
    """Poll `condition` until it is truthy; fail after `timeout` seconds (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


# The kernel's range of ephemeral ports (the source ports of connections).
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED_PORT = 10_000


def free_port() -> int:
    """A loopback TCP port nothing listens on now: for a server that must keep its port
    across restarts, or a peer that is down at start. Below the kernel's ephemeral range: a
    client that connects again and again to a port of that range where nothing listens yet
    (a peer link started before its peer) can be given that very port as its own source
    port and connect to itself (TCP's simultaneous open), holding the port the server then
    cannot bind (7 interop tests erred so, `Address already in use`, on 2026-12-05)."""
    low = int(_EPHEMERAL.read_text().split()[0]) if _EPHEMERAL.exists() else 32768
    for _ in range(200):
        port = random.randrange(LOWEST_PICKED_PORT, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port between {LOWEST_PICKED_PORT} and {low}")


class Peer:
    """A raw ZNS/1 peer: a DEALER for requests and a SUB for events."""

    def __init__(self, router: str, pub: str | None = None, ctx: zmq.Context | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(router)
        self.pub = pub
        self.sub: zmq.Socket | None = None
        self._next_id = 1

    def send_raw(self, *frames: bytes) -> None:
        self.dealer.send_multipart(list(frames))

    def recv_raw(self, timeout: float = LOADED_DEADLINE) -> list[bytes]:
        if not self.dealer.poll(int(timeout * 1000)):
            raise AssertionError("no reply within timeout")
        return self.dealer.recv_multipart()

    def call(self, op: str, timeout: float = LOADED_DEADLINE, **fields: Any) -> Any:
        """Send one request and return the decoded reply (an `Error` is returned, not raised)."""
        fields.setdefault("id", self._next_id)
        self._next_id += 1
        self.send_raw(schema.encode({"op": op, **fields}))
        reply = schema.decode_reply(self.recv_raw(timeout)[-1])
        assert reply.id == fields["id"]
        return reply

    def ok(self, op: str, **fields: Any) -> Any:
        reply = self.call(op, **fields)
        assert not isinstance(reply, schema.Error), reply
        return reply

    def subscribe(self, *prefixes: bytes) -> zmq.Socket:
        if self.sub is None:
            assert self.pub is not None
            self.sub = self.ctx.socket(zmq.SUB)
            self.sub.setsockopt(zmq.LINGER, 0)
            self.sub.connect(self.pub)
        for prefix in prefixes:
            self.sub.setsockopt(zmq.SUBSCRIBE, prefix)
        return self.sub

    def wait_subscribed(self) -> None:
        """Subscriptions are asynchronous: wait until an `hb` arrives (needs `hb\\0`)."""
        self.next_event(lambda ch, ev: ch == schema.HB_CHANNEL)

    def next_event(
        self, match: Callable[[bytes, Any], bool] = lambda ch, ev: True,
        timeout: float = LOADED_DEADLINE,
    ) -> tuple[bytes, Any]:
        assert self.sub is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sub.poll(int(left * 1000)):
                raise AssertionError("expected event did not arrive")
            channel, body = self.sub.recv_multipart()
            event = schema.decode_event(body)
            if match(channel, event):
                return channel, event

    def close(self) -> None:
        self.dealer.close(0)
        if self.sub is not None:
            self.sub.close(0)


# Why the running test may build a ThreadedServer: its `single_process` marker's reason, set
# by conftest before each test's fixtures. Every other test runs against `zns serve` as
# shipped (SplitServer): a state process and its default workers.
SINGLE_PROCESS_REASON: str | None = None


class _PeeredServer:
    """What both in-test servers share: raw ZNS/1 peers on their endpoints, closed at stop."""

    router: str
    pub: str
    peers: list[Peer]

    def peer(self) -> Peer:
        peer = Peer(self.router, self.pub)
        self.peers.append(peer)
        return peer

    def close_peers(self) -> None:
        for peer in self.peers:
            peer.close()


class ThreadedServer(_PeeredServer):
    """`zns.drivers.server.Server` (`--workers 0`) in a thread of the test process: for the
    tests that read its internals or inject its clock, each marked
    `@pytest.mark.single_process("why")` (docs/development.md, Testing)."""

    def __init__(self, tmp_path: Path, *, server_kwargs: dict[str, Any] | None = None,
                 **overrides: Any) -> None:
        """`overrides` set ServerConfig fields; `server_kwargs` go to Server (e.g. clock)."""
        if not (SINGLE_PROCESS_REASON or MUTATION):
            raise AssertionError("a ThreadedServer runs one process, not zns serve's workers: "
                                 "use SplitServer, or mark the test "
                                 "@pytest.mark.single_process(\"why\")")
        config = ServerConfig(
            router="tcp://127.0.0.1:*", pub="tcp://127.0.0.1:*",
            kv_path=str(tmp_path / "kv.json"), heartbeat_interval_s=0.2,
        )
        for key, value in overrides.items():
            setattr(config, key, value)
        # What the 'zns' logger says while it runs, for output() (the log of SplitServer).
        self._log = _Lines()
        self._logger = logging.getLogger("zns")
        self._logger.addHandler(self._log)
        _raise_to_info(self._logger, self._log)
        try:
            self.server = Server(config, **(server_kwargs or {}))
        except BaseException:
            self._logger.removeHandler(self._log)
            _put_back_level(self._logger, self._log)
            raise
        self.router = self.server.router_endpoint
        self.pub = self.server.pub_endpoint
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.peers: list[Peer] = []

    def never_crashed(self) -> bool:
        return self.thread.is_alive()

    def output(self) -> str:
        """What the 'zns' logger said since this server was made (any thread's lines)."""
        return "".join(f"{line}\n" for line in self._log.lines)

    @property
    def remoting(self) -> str:
        assert self.server.remoting is not None, "made without remoting="
        return self.server.remoting.endpoint

    @property
    def metrics_port(self) -> int:
        assert self.server.metrics is not None, "made without metrics="
        return self.server.metrics.port

    def stop(self) -> None:
        self.close_peers()
        self.server.stop()
        self.thread.join(10)
        self._logger.removeHandler(self._log)
        _put_back_level(self._logger, self._log)
        assert not self.thread.is_alive()


# The 'zns' logger's level before the first of the ThreadedServers running now raised it to
# INFO, put back when the last of them stops, whatever order they stop in (each keeping its
# own would leave INFO behind when they stop in the order they started, and a later test of
# the worker would capture INFO lines it does not expect).
_level_before: list[int] = []
_LEVEL_HOLDERS: set[logging.Handler] = set()  # the running servers' line collectors


def _raise_to_info(logger: logging.Logger, holder: logging.Handler) -> None:
    if not _LEVEL_HOLDERS:
        _level_before[:] = [logger.level]
        if not logger.isEnabledFor(logging.INFO):
            logger.setLevel(logging.INFO)
    _LEVEL_HOLDERS.add(holder)


def _put_back_level(logger: logging.Logger, holder: logging.Handler) -> None:
    """Once for each holder, however often it is stopped."""
    if holder in _LEVEL_HOLDERS:
        _LEVEL_HOLDERS.discard(holder)
        if not _LEVEL_HOLDERS:
            logger.setLevel(_level_before[0])


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def served(tmp_path: Path, **overrides: Any) -> SplitServer | ThreadedServer:
    """`zns serve` with its default workers (SplitServer); under mutation testing a
    ThreadedServer instead: mutmut credits a test only with what runs in its own process."""
    if MUTATION:
        return ThreadedServer(tmp_path, **overrides)
    return SplitServer(tmp_path, **overrides)


def metric_sum(srv: Any, name: str) -> float:
    """`name`'s samples on the /metrics of `srv` (made with `metrics=`), summed over their
    labels (a split server labels some by worker)."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


def serve_options(overrides: dict[str, Any]) -> list[str]:
    """ServerConfig field values as `zns serve` options: `heartbeat_interval_s=0.5` ->
    `--heartbeat-interval 0.5`, a list as the option repeated, a flag as --x/--no-x."""
    by_attr = {setting.attr: setting for setting in config_settings(ServerConfig)}
    options: list[str] = []
    for attr, value in overrides.items():
        setting = by_attr[attr]
        if setting.is_flag:
            options.append(setting.option if value else f"--no-{setting.option[2:]}")
        elif setting.is_list:
            for each in value:
                options += [setting.option, str(each)]
        else:
            options += [setting.option, "" if value is None else str(value)]
    return options


class SplitServer(_PeeredServer):
    """`zns serve` as shipped, with its default workers (a state process and worker
    processes), on ephemeral ports: ThreadedServer's interface for the tests that only speak
    to its endpoints. `overrides` are ServerConfig fields, given as options."""

    def __init__(self, tmp_path: Path, **overrides: Any) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        overrides = {"heartbeat_interval_s": 0.2, **overrides}
        kv_path = overrides.pop("kv_path", tmp_path / "kv.json")
        if kv_path is None:
            overrides["kv_path"] = None
        self.process = ProcessServer(tmp_path, *serve_options(overrides),
                                     kv_path=None if kv_path is None else Path(kv_path))
        self.router, self.pub = self.process.router, self.process.pub
        self.kv_path = self.process.kv_path
        self.peers: list[Peer] = []

    @property
    def remoting(self) -> str:
        """The remoting listener's HOST:PORT (the server was made with `remoting=`), from the
        state process's first line; a host `*` named 0.0.0.0, as `status` names it."""
        line = self.process.line("RocketMQ remoting on ")
        assert line is not None
        remoting = line.rsplit(" ", 1)[1]
        assert remoting != "none", "made without remoting="
        return "0.0.0.0" + remoting[1:] if remoting.startswith("*:") else remoting

    @property
    def metrics_port(self) -> int:
        """The port of /metrics (the server was made with `metrics=`): as a worker logs it."""
        line = wait_for(lambda: self.process.line("metrics on http://", required=False))
        return int(line.split("metrics on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

    def output(self) -> str:
        return self.process.output()

    def never_crashed(self) -> bool:
        """The state process runs and has started no worker to replace one."""
        starts = sum(" started (pid " in line and "worker " in line
                     for line in self.output().splitlines())
        return self.process.proc.poll() is None and starts == self.workers

    @property
    def workers(self) -> int:
        line = self.process.line("zns state process (pid ")
        assert line is not None
        return int(line.split("): ", 1)[1].split()[0])

    def stop(self) -> None:
        self.close_peers()
        code = self.process.stop()
        assert code == 0, f"zns serve exited {code}: {self.process.output()}"


class ProcessServer:
    """`zns serve` in a subprocess, for signals and kill -9. Endpoints read from its log."""

    def __init__(self, tmp_path: Path, *args: str, kv_path: Path | None = None) -> None:
        self.kv_path = kv_path or tmp_path / "kv.json"
        self.log_path = tmp_path / f"server-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "w")
        cmd = [
            sys.executable, "-m", "zns", "serve", "--router", "tcp://127.0.0.1:*",
            "--pub", "tcp://127.0.0.1:*", "--kv-path", str(self.kv_path), *args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            line = wait_for(self._serving_line, timeout=3 * LOADED_DEADLINE)  # a whole interpreter
        except BaseException:  # a start that failed or timed out leaves no server running
            self.proc.kill()  # the state process; its workers stop when their channel closes
            self.proc.wait(15)
            self.log.close()
            raise
        words = line.split()
        self.router = words[words.index("on") + 1].rstrip(",")
        self.pub = words[words.index("events") + 2]

    def _serving_line(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited: {self.log_path.read_text()}")
        for line in self.log_path.read_text().splitlines():
            if "serving requests on" in line:
                return line
        return None

    def output(self) -> str:
        return self.log_path.read_text()

    def line(self, text: str, required: bool = True) -> str | None:
        """The first line of the server's log that holds `text`."""
        found = next((line for line in self.output().splitlines() if text in line), None)
        assert found is not None or not required, f"no {text!r} in: {self.output()}"
        return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(15)
        self.log.close()
        return code


def register_fields(
    broker_name: str = "broker-a", broker_id: int = 0, addr: str = "10.0.0.1:10911",
    cluster: str = "c1", topics: dict[str, dict] | None = None, **extra: Any,
) -> dict[str, Any]:
    fields = dict(
        cluster=cluster, broker_name=broker_name, broker_id=broker_id, broker_addr=addr,
        topics={"TopicA": {}} if topics is None else topics,
    )
    fields.update(extra)
    return fields


def register_until(stop: threading.Event, router: str, pub: str, acknowledged: list[str],
                   prefix: str, reads: Sequence[str] = (), pause_s: float = 0.0) -> None:
    """Load across a worker's death, until `stop`: registrations one after the other of
    broker and topic `{prefix}{n}`, each on a new connection (either worker), each followed
    by a get_route of the next of `reads` (if any), then `pause_s`. A connection that gets
    no answer (its worker died) is dropped for a new one; a registration refused or a read
    answered without a route fails (AssertionError); each answered one appends its topic to
    `acknowledged`."""
    load_ctx = zmq.Context()
    n = 0
    try:
        while not stop.is_set():
            peer = Peer(router, pub, load_ctx)
            try:
                reply = peer.call("register_broker", timeout=2.0, **register_fields(
                    broker_name=f"{prefix}{n}", addr=f"10.1.{n // 250}.{n % 250}:10911",
                    topics={f"{prefix}{n}": {}}))
                read = (peer.call("get_route", timeout=2.0, topic=reads[n % len(reads)])
                        if reads else None)
            except AssertionError:  # no reply: its worker died
                continue
            finally:
                peer.close()
            assert not isinstance(reply, schema.Error), reply
            assert read is None or isinstance(read, schema.GetRouteReply), read
            acknowledged.append(f"{prefix}{n}")
            n += 1
            if pause_s:
                time.sleep(pause_s)
    finally:
        load_ctx.destroy(linger=0)


# --- a NameService without sockets -------------------------------------------------------------


def zns1(service: NameService, op: str, now: int = 1000, **fields: Any) -> Any:
    """`op` through `NameService.respond`; the decoded reply (an `Error` is returned)."""
    return schema.decode_reply(service.respond(schema.encode({"op": op, **fields}), now).reply)


def zns1_ok(service: NameService, op: str, now: int = 1000, **fields: Any) -> Any:
    reply = zns1(service, op, now, **fields)
    assert not isinstance(reply, schema.Error), reply
    return reply


def zns1_events(service: NameService, op: str, now: int = 1000,
                **fields: Any) -> tuple[Any, list[tuple[bytes, Any]]]:
    """`zns1`, and the events the request published, decoded: (channel, event)."""
    response = service.respond(schema.encode({"op": op, **fields}), now)
    return schema.decode_reply(response.reply), [
        (channel, schema.decode_event(body)) for channel, body in response.events]


def zns1_ok_events(service: NameService, op: str, now: int = 1000,
                   **fields: Any) -> tuple[Any, list[tuple[bytes, Any]]]:
    reply, events = zns1_events(service, op, now, **fields)
    assert not isinstance(reply, schema.Error), reply
    return reply, events


def observable(service: NameService, namespaces: Iterable[str] = ("ns",)) -> bytes:
    """Everything a request could have changed, as bytes: the snapshot (routes, brokers,
    revision), the liveness report and the KV entries of `namespaces`. A refused request
    leaves it equal."""
    return schema.encode((
        msgspec.structs.replace(zns1(service, "snapshot"), id=0),
        msgspec.structs.replace(zns1(service, "get_cluster_info", now=1), id=0),
        [service.kv.list(ns) for ns in namespaces],
    ))


def table_state(table: RouteTable, now: int = 0) -> bytes:
    """Everything a client can see of a RouteTable, by value, through its queries (never its
    private fields): a refused request leaves it equal."""
    routes = table.routes()
    return msgspec.msgpack.encode([
        table.revision, sorted(routes.items()), table.broker_table(), table.cluster_table(),
        table.live_brokers(now), table.next_deadline(),
        sorted((t, table.topic_revision(t)) for t in routes),
    ])


def peer_state(peer: Peer, namespaces: Iterable[str] = ("ns",)) -> tuple[Any, ...]:
    """`observable` of a live server, through a peer."""
    replies = [peer.ok("snapshot"), *(peer.ok("kv_list", namespace=ns) for ns in namespaces)]
    return (*(msgspec.structs.replace(r, id=0) for r in replies), peer.ok("status").revision)


def feed(input_: Callable[..., None], *args: Any) -> list[Any]:
    """Call one input of a session or peer link (`feed(session.on_timer, now)`) and return the
    actions it produced: what its driver would carry out next (`session.actions()`)."""
    input_(*args)
    actions: list[Any] = input_.__self__.actions()  # type: ignore[attr-defined]
    return actions

"""Benchmark 6: zns's RocketMQ remoting listener against RocketMQ's own Java NameServer.

Both servers run side by side on this machine with the same routes, registered by
fake brokers (REGISTER_BROKER frames built with zns's codec, over connections that
stay open for the whole run: both servers drop a broker whose registering
connection closes). The same load generator processes send both of them the very
same pipelined GET_ROUTEINFO_BY_TOPIC frames; a bare Python TCP echo of those frames
shows what the generator itself can drive. Then a real RocketMQ broker, registered
with both servers, is SIGKILLed: a Java producer of the Java NameServer and a ZNS/1
watcher of zns time when they see it gone.

Needs a JDK and the RocketMQ jars (tests/interop/README.md); without them the Java
side is skipped and only zns and the echo are measured.

    python -m bench.remoting [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import json
import multiprocessing
import re
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import zmq

from bench.harness import (
    REPO, START_TIMEOUT_S, BenchError, LoadPool, cpu_seconds, percentile, rss_kib, start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, Target, cli
from zns.core import schema
from zns.core.remoting import FrameDecoder, RemotingCommand, body_crc32, encode_command

sys.path.insert(0, str(REPO / "tests" / "interop"))
import rocketmq  # noqa: E402  (tests/interop/rocketmq.py: the real RocketMQ processes)

VERSION = 479  # RocketMQ 5.3.3's version ordinal, as its clients send it
GET_ROUTE, REGISTER_BROKER = 105, 103
CLUSTER = "BenchCluster"
KILL_TOPIC = "BenchKillTopic"
FRAMES = 8192  # distinct request frames (opaques) every load process cycles through
REREGISTER_S = 20.0  # fake brokers re-register this often: both servers expire at 120 s
_LENGTH = struct.Struct(">i")
_OPAQUE = re.compile(rb'"opaque":(-?\d+)')
REMOTING_LINE = re.compile(r"RocketMQ remoting listener on (\S+)")


@dataclass(frozen=True)
class Params:
    brokers: int  # fake brokers; brokers 2k and 2k+1 host the same `topics` topics
    topics: int
    processes: int  # load generator processes
    conns: int  # connections per process
    depth: int  # requests in flight per connection at saturation
    duration: float
    warmup: float
    rate: float  # the fixed request rate for latency, requests/s in all
    rate_duration: float
    jit_warmup: float  # seconds of load before the first round (the JVM compiles hot code)
    kill_rounds: int


FULL = Params(brokers=10, topics=100, processes=2, conns=4, depth=16, duration=2.0, warmup=0.5,
              rate=2000, rate_duration=3.0, jit_warmup=8.0, kill_rounds=1)
# A cold C1-only JVM on a busy machine can stall for a few hundred ms: windows long enough
# that a smoke run still sees replies from it.
QUICK = Params(brokers=2, topics=5, processes=1, conns=2, depth=4, duration=0.6, warmup=0.3,
               rate=200, rate_duration=0.5, jit_warmup=1.5, kill_rounds=0)

METHOD = """
RocketMQ 5.3.3's own NameServer (`NamesrvStartup`, the interop harness's small JVM:
serial GC, 64–128 MB heap, but with the full JIT — `-XX:TieredStopAtLevel=4` overrides
the harness's C1-only flag, which is for start-up speed, not for a throughput
comparison) and `zns serve --remoting 127.0.0.1:0` run side by side on this machine.
Fake brokers register the same routes with both — *B* brokers in one cluster, brokers
2k and 2k+1 hosting the same *T* topics (so every route lists 2 brokers and 2 queue
datas, ~400 bytes), REGISTER_BROKER frames built with `zns.core.remoting` over
connections that stay open for the run and re-register every 20 s.

The load generator (`bench/remoting.py`, *P* processes × *C* connections, plain
sockets and epoll) keeps *D* GET_ROUTEINFO_BY_TOPIC frames (version 479, JSON header,
topics in turn) in flight per connection for a timed window after a warm-up, and
counts replies; both servers get the very same frames, and so does a bare Python TCP
echo (`_echo_main`: reads and writes back the same bytes), which shows what the
generator can drive at all. The JVM is warmed up with a few seconds of this load
first. Latency is measured open-loop at a fixed rate both servers sustain: requests
are sent on a schedule over the same connections and each round trip counts from its
send to its reply (matched by opaque). Rounds alternate which server
goes first. Server CPU per request is from /proc/<pid>/stat (all the JVM's threads).
RSS is VmRSS of each server process after the load.

Kill → seen: one real RocketMQ broker registers with both servers
(`namesrvAddr=java;zns`) and hosts a topic that one fake broker also hosts (a route
that becomes empty is never replaced in a RocketMQ client's table, so the topic needs
a survivor). It is SIGKILLed; the time until (a) a `DefaultMQProducer` of the Java
NameServer, default 30 s `pollNameServerInterval`, no longer lists it in its
topic table (`ZnsInteropClient watch-route`, read every 10 ms), (b) the Java
NameServer itself stops returning it (polled every 10 ms from Python), and (c) a
ZNS/1 watcher of zns (SUB, `broker/` prefix) receives `removed` / `disconnected`.
Wall-clock times in one machine.
"""

LIMITS = """
What limits zns here: its remoting path is Python on one core — per GET_ROUTEINFO_BY_TOPIC
about 3 µs to frame and decode the JSON header, 2 µs to answer (the route's JSON is
encoded once per change and cached) and 2 µs to encode the reply header, measured
in-process without sockets; the rest of its ~15 µs of CPU per request is the loop and
the socket calls (one recv and one send per connection per pass, ~16 requests each at
this depth). The Java NameServer spreads its work over Netty and executor threads but
spends more CPU per request (fastjson encodes each route anew); on 2 cores shared with
the load generator neither gets a core to itself. The generator is not the bound: the
echo takes 3–9× more requests from it than zns does. A killed broker's removal is bounded
below by the kernel: its sockets close only while the JVM is torn down, which the reap
time shows; zns then publishes within a poll pass.
"""

NO_JAVA_NOTE = "the Java side was skipped: {reason}"


# --- frames ----------------------------------------------------------------------------


def topic_name(i: int) -> str:
    return f"BenchTopic{i:04d}"


def broker_topics(b: int, p: Params) -> list[str]:
    """Brokers 2k and 2k+1 share topics k*T .. k*T+T-1."""
    first = b // 2 * p.topics
    topics = [topic_name(first + i) for i in range(p.topics)]
    return topics + [KILL_TOPIC] if b == 0 else topics


def all_topics(p: Params) -> list[str]:
    return [topic_name(i) for i in range((p.brokers + 1) // 2 * p.topics)]


def route_frames(topics: Sequence[str], count: int = FRAMES) -> list[bytes]:
    """GET_ROUTEINFO_BY_TOPIC frames with opaques 1..count, topics in turn."""
    return [encode_command(RemotingCommand(code=GET_ROUTE, version=VERSION, opaque=i + 1,
                                           ext_fields={"topic": topics[i % len(topics)]}))
            for i in range(count)]


def register_frame(b: int, p: Params, opaque: int) -> bytes:
    return broker_frame(f"bench-broker-{b:02d}", f"10.0.0.{b + 1}:10911", broker_topics(b, p),
                        opaque)


def broker_frame(name: str, addr: str, topics: Sequence[str], opaque: int) -> bytes:
    """REGISTER_BROKER of master `name` at `addr` hosting `topics` (8 queues each, perm 6)."""
    table = {t: {"topicName": t, "readQueueNums": 8, "writeQueueNums": 8, "perm": 6}
             for t in topics}
    body = json.dumps({"topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 1},
        "topicConfigTable": table}, "filterServerList": []}).encode()
    ext = {"brokerId": "0", "bodyCrc32": str(body_crc32(body)), "clusterName": CLUSTER,
           "brokerAddr": addr, "haServerAddr": addr, "compressed": "false", "brokerName": name,
           "heartbeatTimeoutMillis": "120000"}
    return encode_command(RemotingCommand(code=REGISTER_BROKER, version=VERSION, opaque=opaque,
                                          ext_fields=ext, body=body))


def parse_hostport(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


class RemotingClient:
    """One blocking remoting connection: call() sends a frame and decodes its reply."""

    def __init__(self, addr: str, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(parse_hostport(addr), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(64 << 20)
        self.pending: list[RemotingCommand] = []

    def call(self, frame: bytes) -> RemotingCommand:
        self.sock.sendall(frame)
        return self.reply()

    def reply(self) -> RemotingCommand:
        """The next reply on this connection (the frames sent before are the caller's)."""
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise BenchError("the server closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def close(self) -> None:
        self.sock.close()


def route_brokers(addr: str, topic: str) -> set[str] | None:
    """Broker names in the topic's route (None: no route), over a fresh connection."""
    client = RemotingClient(addr)
    try:
        reply = client.call(route_frames([topic], 1)[0])
    finally:
        client.close()
    if reply.code != 0:
        return None
    return set(re.findall(r'"brokerName":"([^"]+)"', reply.body.decode()))


class FakeBrokers:
    """Registers `p.brokers` brokers with each server over connections kept open; a thread
    re-registers them every REREGISTER_S so that no idle or expiry timer drops them."""

    def __init__(self, servers: dict[str, str], p: Params) -> None:
        self.p = p
        self.clients: list[RemotingClient] = []
        self._stop = threading.Event()
        self._error: str | None = None
        for addr in servers.values():
            for b in range(p.brokers):
                client = RemotingClient(addr)
                self.clients.append(client)
                reply = client.call(register_frame(b, p, 1))
                if reply.code != 0:
                    raise BenchError(f"{addr} refused REGISTER_BROKER: {reply.code} {reply.remark}")
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        opaque = 1
        while not self._stop.wait(REREGISTER_S):
            opaque += 1
            for i, client in enumerate(self.clients):
                try:
                    client.call(register_frame(i % self.p.brokers, self.p, opaque))
                except (OSError, BenchError) as exc:
                    self._error = f"re-registration failed: {exc}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)
        for client in self.clients:
            client.close()
        if self._error:
            raise BenchError(self._error)


# --- load generator --------------------------------------------------------------------


@dataclass
class Drive:
    rate: float  # replies/s in the window, all processes
    total: int
    latencies: list[float]  # seconds, fixed-rate mode only
    server_cpu: float
    sent: int = 0  # fixed rate: requests sent in the window (the generator may fall behind)

    @property
    def cpu_us_per_request(self) -> float:
        return self.server_cpu / self.total * 1e6 if self.total else float("nan")


class Generator(LoadPool):
    """Load processes, spawned once and reused for every server."""

    def __init__(self, processes: int, topics: Sequence[str]) -> None:
        super().__init__(processes, _run_load, route_frames, list(topics))

    def drive(self, addr: str, pid: int, *, conns: int, depth: int = 0, rate: float = 0.0,
              duration: float, warmup: float) -> Drive:
        """Saturation (`depth` in flight per connection) or a fixed `rate` in all."""
        start_at = time.monotonic() + warmup
        share = rate / len(self)
        before = cpu_seconds(pid)
        outcomes = self.run([(addr, conns, depth, share, start_at, duration)] * len(self),
                            warmup + duration + 30)
        latencies = [latency for outcome in outcomes for latency in outcome[2]]
        return Drive(sum(outcome[0] for outcome in outcomes) / duration,
                     sum(outcome[1] for outcome in outcomes), latencies,
                     cpu_seconds(pid) - before, sum(outcome[3] for outcome in outcomes))


def _run_load(frames: list[bytes], addr: str, nconns: int, depth: int, rate: float,
              start_at: float, duration: float) -> tuple[int, int, list[float], int]:
    """Drive one server; (replies in the window, replies in all, latencies, requests sent in
    the window at a fixed rate)."""
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(nconns):
        sock = socket.create_connection(parse_hostport(addr), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(sock)
    state = {sock.fileno(): (sock, bytearray()) for sock in socks}
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ)
    n = len(frames)
    nxt = 0
    clock = time.monotonic
    end_at = start_at + duration
    replies = total = in_window = 0
    latencies: list[float] = []
    sent_at: dict[int, float] = {}
    try:
        if depth:  # saturation: every reply is answered by the next frame at once
            for i, sock in enumerate(socks):
                batch = [frames[(nxt + k) % n] for k in range(depth)]
                nxt = (nxt + depth) % n
                sock.sendall(b"".join(batch))
        else:  # fixed rate: frame k is due at start_at - warm-up share + k / rate
            period = 1.0 / rate
            begin = clock()
            due = 0
            rr = 0
        last_reply = clock()
        while True:
            now = clock()
            if now >= end_at and (depth or not sent_at or now > end_at + 5):
                break  # at a fixed rate, the replies to requests already sent are awaited
            if not depth and now < end_at:
                late = int((min(now, end_at) - begin) / period) + 1  # frames due by now
                while due < late:
                    sock = socks[rr % nconns]
                    rr += 1
                    sent_at[due % n + 1] = at_send = clock()
                    in_window += start_at <= at_send < end_at
                    sock.sendall(frames[due % n])
                    due += 1
                timeout = max(0.0, min(begin + due * period, end_at) - clock())
            elif not depth:
                timeout = 0.1
            else:
                timeout = 1.0
            for key, _ in sel.select(timeout):
                sock, buf = state[key.fd]
                data = sock.recv(1 << 18)
                if not data:
                    raise BenchError(f"{addr} closed a load connection")
                buf += data
                at = clock()
                pos = got = 0
                size = len(buf)
                while size - pos >= 4:
                    (length,) = _LENGTH.unpack_from(buf, pos)
                    if size - pos - 4 < length:
                        break
                    if not depth:
                        match = _OPAQUE.search(buf, pos + 8, pos + 4 + length)
                        sent = sent_at.pop(int(match.group(1)), None) if match else None
                        if sent is not None and start_at <= sent < end_at:
                            latencies.append(at - sent)
                    pos += 4 + length
                    got += 1
                del buf[:pos]
                if got:
                    last_reply = at
                    total += got
                    if start_at <= at < end_at:
                        replies += got
                    if depth:
                        batch = [frames[(nxt + k) % n] for k in range(got)]
                        nxt = (nxt + got) % n
                        sock.sendall(b"".join(batch))
            if clock() - last_reply > 15:
                raise BenchError(f"{addr} answered nothing for 15 s")
    finally:
        for sock in socks:
            sock.close()
        sel.close()
    return replies, total, latencies, in_window


def _echo_main(port_pipe: Connection) -> None:
    """A bare Python TCP echo: every byte read is written back (the generator's ceiling)."""
    listening = socket.create_server(("127.0.0.1", 0))
    listening.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listening, selectors.EVENT_READ)
    port_pipe.send(listening.getsockname()[1])
    while True:
        for key, _ in sel.select(1.0):
            if key.fileobj is listening:
                try:
                    sock, _ = listening.accept()
                except BlockingIOError:
                    continue
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(sock, selectors.EVENT_READ)
                continue
            sock = key.fileobj
            try:
                data = sock.recv(1 << 18)
            except OSError:
                data = b""
            if not data:
                sel.unregister(sock)
                sock.close()
                continue
            sock.sendall(data)


# --- servers ---------------------------------------------------------------------------


def start_zns_remoting(config: RunConfig, stack: ExitStack) -> tuple[Any, str]:
    zns = stack.enter_context(start_zns(config.workdir / "zns", "--remoting", "127.0.0.1:0"))
    match = REMOTING_LINE.search(zns.log_path.read_text(errors="replace"))
    if not match:
        raise BenchError(f"zns logged no remoting endpoint: {zns.log_path.read_text()[-2000:]}")
    return zns, match.group(1)


def start_echo(stack: ExitStack) -> tuple[int, int]:
    mp = multiprocessing.get_context("spawn")
    parent, child = mp.Pipe()
    proc = mp.Process(target=_echo_main, args=(child,), daemon=True)
    proc.start()
    stack.callback(lambda: (proc.kill(), proc.join(5)))
    if not parent.poll(START_TIMEOUT_S):
        raise BenchError("the echo server did not start")
    return proc.pid, parent.recv()


def java_reason() -> str:
    """Why the Java side cannot run here ("" when it can)."""
    try:
        rocketmq.ensure_jars()
        rocketmq.client_classes()
    except (rocketmq.InteropUnavailable, rocketmq.InteropError) as exc:
        return str(exc).splitlines()[0]
    return ""


# --- kill -> seen ----------------------------------------------------------------------


def watch_zns_removal(pub: str, broker_addr: str, ready: threading.Event,
                      out: dict[str, float]) -> Callable[[], None]:
    """A ZNS/1 watcher thread: SUB `broker/`, the wall time `removed` for broker_addr arrives."""
    stop = threading.Event()

    def run() -> None:
        sock = zmq.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"broker/")
        sock.setsockopt(zmq.SUBSCRIBE, schema.HB_CHANNEL)
        sock.connect(pub)
        try:
            while not stop.is_set():
                if not sock.poll(100):
                    continue
                channel, body = sock.recv_multipart()
                at = time.time()
                if channel == schema.HB_CHANNEL:
                    ready.set()
                    continue
                event = schema.decode_event(body)
                if getattr(event, "broker_addr", None) == broker_addr and event.change == "removed":
                    out["zns"] = at
                    out["zns_reason"] = event.reason  # type: ignore[assignment]
                    return
        finally:
            sock.close(0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join(timeout: float = 10.0) -> None:
        thread.join(timeout)
        stop.set()
    return join


def poll_java_removal(addr: str, topic: str, broker: str, out: dict[str, float]) -> Callable[[], None]:
    """Ask the Java NameServer for the route every 10 ms: the wall time it stops listing `broker`."""
    stop = threading.Event()

    def run() -> None:
        client = RemotingClient(addr)
        frame = route_frames([topic], 1)[0]
        try:
            while not stop.is_set():
                reply = client.call(frame)
                at = time.time()
                if reply.code != 0 or f'"brokerName":"{broker}"'.encode() not in reply.body:
                    out["java_server"] = at
                    return
                time.sleep(0.01)
        finally:
            client.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join(timeout: float = 10.0) -> None:
        thread.join(timeout)
        stop.set()
    return join


def kill_round(config: RunConfig, group: Any, java_addr: str, zns_remoting: str, zns_pub: str,
               index: int) -> dict[str, float]:
    """One real broker, registered with both; SIGKILL; seconds until each observer saw it gone."""
    name = f"bench-kill-{index}"
    broker = group.broker(f"{java_addr};{zns_remoting}", name, cluster=CLUSTER)
    config.log(f"kill round {index + 1}: broker {name} at {broker.addr} up in "
               f"{broker.ready_after:.1f} s")
    res = rocketmq.mqadmin(["updateTopic", "-b", broker.addr, "-t", KILL_TOPIC, "-r", "4", "-w", "4"],
                           java_addr, workdir=config.workdir)
    if "success" not in res.stdout:
        raise BenchError(f"mqadmin updateTopic failed: {res.stdout[-500:]} {res.stderr[-500:]}")
    deadline = time.monotonic() + 30
    while name not in (route_brokers(java_addr, KILL_TOPIC) or set()):
        if time.monotonic() > deadline:
            raise BenchError(f"the Java NameServer never listed {name} for {KILL_TOPIC}")
        time.sleep(0.1)
    # The Java producer: RocketMQ's default 30 s route poll.
    home = config.workdir / f"watch-{index}"
    home.mkdir(parents=True, exist_ok=True)
    cmd = [*rocketmq._client_cmd(home), rocketmq.CLIENT_MAIN, "watch-route", "--namesrv", java_addr,
           "--topic", KILL_TOPIC, "--broker", name, "--poll-ms", "30000", "--timeout", "120"]
    watcher = rocketmq._spawn(cmd, cwd=home, stdout=subprocess.PIPE,
                              stderr=open(home / "stderr.log", "wb"))
    lines: list[dict[str, Any]] = []
    listed = threading.Event()

    def read() -> None:
        assert watcher.stdout is not None
        for raw in watcher.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            lines.append(obj)
            if obj.get("event") == "listed":
                listed.set()
        listed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not listed.wait(60) or not any(x.get("event") == "listed" for x in lines):
            raise BenchError(f"the Java producer never listed {name}: {lines}")
        seen: dict[str, float] = {}
        ready = threading.Event()
        join_zns = watch_zns_removal(zns_pub, broker.addr, ready, seen)
        if not ready.wait(20):
            raise BenchError("the ZNS/1 watcher saw no hb")
        join_java = poll_java_removal(java_addr, KILL_TOPIC, name, seen)
        killed_at = time.time()
        broker.kill()  # SIGKILL, then waits for the process to be reaped
        reaped_at = time.time()
        join_zns(10)
        join_java(10)
        watcher.wait(90)
        reader.join(10)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(10)
        rocketmq._forget(watcher)
    gone = [x for x in lines if x.get("event") == "gone"]
    if "zns" not in seen or "java_server" not in seen or not gone:
        raise BenchError(f"not every observer saw {name} go: {seen}, producer said {lines[-1:]}")
    if seen.get("zns_reason") != "disconnected":
        raise BenchError(f"zns removed {name} for {seen.get('zns_reason')!r}, not 'disconnected'")
    out = {"zns": seen["zns"] - killed_at, "java_server": seen["java_server"] - killed_at,
           "java_client": gone[0]["wall_ms"] / 1000 - killed_at, "reaped": reaped_at - killed_at}
    config.log(f"kill round {index + 1}: ZNS/1 watcher {out['zns'] * 1000:.1f} ms, Java NameServer "
               f"{out['java_server'] * 1000:.0f} ms, Java producer {out['java_client']:.1f} s")
    return out


# --- the benchmark ---------------------------------------------------------------------


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    reason = java_reason()
    java_on = not reason
    if not java_on and rocketmq.interop_required():
        raise BenchError(f"{reason} ({rocketmq.REQUIRE_ENV}=1 makes this a failure)")
    if not java_on:
        config.log(NO_JAVA_NOTE.format(reason=reason))
    topics = all_topics(p)
    names = ["zns", "java", "echo"] if java_on else ["zns", "echo"]
    sat = {s: [] for s in names}  # req/s per round
    cpu = {s: [] for s in names}  # server µs per request per round
    p50 = {s: [] for s in names if s != "echo"}
    p99 = {s: [] for s in names if s != "echo"}
    rss: dict[str, list[float]] = {s: [] for s in names if s != "echo"}
    kills: dict[str, list[float]] = {"zns": [], "java_server": [], "java_client": [], "reaped": []}
    with ExitStack() as stack:
        zns, zns_remoting = start_zns_remoting(config, stack)
        servers = {"zns": (zns_remoting, zns.proc.pid)}
        group = None
        if java_on:
            group = stack.enter_context(rocketmq.ProcessGroup(config.workdir / "rocketmq"))
            # The full JIT for a measurement; a smoke run keeps the harness's quick-starting C1.
            ns = group.namesrv(jvm_args=[] if config.quick else ["-XX:TieredStopAtLevel=4"])
            servers["java"] = (ns.addr, ns.pid)
            config.log(f"Java NameServer at {ns.addr} up in {ns.ready_after:.1f} s")
        echo_pid, echo_port = start_echo(stack)
        servers["echo"] = (f"127.0.0.1:{echo_port}", echo_pid)
        brokers = FakeBrokers({s: a for s, (a, _) in servers.items() if s != "echo"}, p)
        stack.callback(brokers.close)
        for s in names:
            if s != "echo":
                got = route_brokers(servers[s][0], topics[-1])
                if not got or len(got) != 2:
                    raise BenchError(f"{s}: the route of {topics[-1]} lists {got}, not 2 brokers")
        generator = Generator(p.processes, topics)
        stack.callback(generator.close)
        for s in names:  # the JVM compiles its hot paths; zns and the echo get the same
            generator.drive(*servers[s], conns=p.conns, depth=p.depth, duration=p.jit_warmup,
                            warmup=0.0)
        for r in range(config.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for s in order:
                load = generator.drive(*servers[s], conns=p.conns, depth=p.depth,
                                       duration=p.duration, warmup=p.warmup)
                sat[s].append(load.rate)
                cpu[s].append(load.cpu_us_per_request)
            for s in order:
                if s == "echo":
                    continue
                load = generator.drive(*servers[s], conns=p.conns, rate=p.rate,
                                       duration=p.rate_duration, warmup=p.warmup)
                expected = p.rate * p.rate_duration
                # Two different failures: the server not answering what was sent, and the
                # generator (on the same loaded cores) not sending at the rate asked.
                if len(load.latencies) < 0.9 * load.sent:
                    raise BenchError(f"{s} did not sustain {p.rate:g} req/s: "
                                     f"{len(load.latencies)} replies to {load.sent} requests")
                if load.sent < 0.9 * expected:
                    message = (f"the generator sent {load.sent} of {expected:.0f} requests at "
                               f"{p.rate:g} req/s to {s}: the machine is too loaded")
                    if not config.quick:
                        raise BenchError(message)
                    config.log(f"{message}; --quick goes on with them")
                p50[s].append(percentile(load.latencies, 50) * 1e6)
                p99[s].append(percentile(load.latencies, 99) * 1e6)
            config.log(f"round {r + 1}: " + ", ".join(
                f"{s} {sat[s][-1]:,.0f} req/s ({cpu[s][-1]:.0f} µs CPU/req)" for s in names)
                + "; p50/p99 " + ", ".join(f"{s} {p50[s][-1]:.0f}/{p99[s][-1]:.0f} µs" for s in p50))
        for s in rss:
            rss[s].append(rss_kib(servers[s][1]) / 1024)
        if java_on and group is not None:
            for i in range(p.kill_rounds):
                out = kill_round(config, group, servers["java"][0], zns_remoting, zns.pub, i)
                for key, value in out.items():
                    kills[key].append(value)

    return result(p, java_on, reason, sat, cpu, p50, p99, rss, kills)


def result(p: Params, java_on: bool, reason: str, sat: dict[str, list[float]],
           cpu: dict[str, list[float]], p50: dict[str, list[float]], p99: dict[str, list[float]],
           rss: dict[str, list[float]], kills: dict[str, list[float]]) -> BenchResult:
    load = f"{p.processes}×{p.conns} connections, {p.depth} in flight each"
    ref = "Java NameServer" if java_on else ""

    def against(name: str, unit: str, zns_rounds: list[float], java_rounds: list[float],
                target: Target | None = None, note: str = "") -> Figure:
        if java_on:
            return Figure(name, unit, zns_rounds, ref, java_rounds, target, note)
        return Figure(name, unit, zns_rounds, note=NO_JAVA_NOTE.format(reason=reason))

    figures = [
        against(f"GET_ROUTEINFO_BY_TOPIC at saturation ({load})", "req/s", sat["zns"],
                sat.get("java", []), Target("ratio", ">=", 1.0)),
        Figure("the same load against a bare Python TCP echo", "req/s", sat["echo"],
               "zns", sat["zns"], note="what one generator can drive: if it is well above both "
               "servers' rates, the generator is not what limits them"),
        against("server CPU per request at saturation", "µs", cpu["zns"], cpu.get("java", []),
                note="CPU time of the server process (all threads) / requests answered"),
        against(f"round trip p50 at {p.rate:g} req/s", "µs", p50["zns"], p50.get("java", [])),
        against(f"round trip p99 at {p.rate:g} req/s", "µs", p99["zns"], p99.get("java", [])),
        against("server RSS after the load", "MiB", rss["zns"], rss.get("java", []),
                Target("ratio", "<=", 0.25)),
    ]
    if java_on:
        figures.append(Figure("Java NameServer: GET_ROUTEINFO_BY_TOPIC at saturation", "req/s",
                              sat["java"], "echo", sat["echo"]))
    if kills["zns"]:
        ms = {k: [x * 1000 for x in v] for k, v in kills.items()}
        figures += [
            Figure("broker SIGKILL → ZNS/1 watcher of zns sees `removed`", "ms", ms["zns"],
                   "Java producer of the Java NameServer", ms["java_client"],
                   Target("value", "<=", 100.0)),
            Figure("broker SIGKILL → the Java NameServer stops listing it", "ms",
                   ms["java_server"], note="the server itself (polled every 10 ms): what a "
                   "client polling it could learn at best; RocketMQ's clients poll every 30 s"),
            Figure("broker SIGKILL → Java producer's route drops it", "ms", ms["java_client"],
                   note="default pollNameServerInterval 30 s: anywhere in 0–30 s by the phase "
                   "of the poll"),
            Figure("broker SIGKILL → its process is reaped", "ms", ms["reaped"],
                   note="the floor under both servers' figures: the kernel closes a killed "
                   "process's sockets only while it tears the process down (a JVM's large "
                   "mappings first), and the reap comes right after"),
        ]
    params = (f"Parameters: B = {p.brokers} brokers, T = {p.topics} topics per pair "
              f"({len(all_topics(p))} topics), P = {p.processes} processes × C = {p.conns} "
              f"connections × D = {p.depth} in flight; windows of {p.duration:g} s after "
              f"{p.warmup:g} s; fixed rate {p.rate:g} req/s for {p.rate_duration:g} s; "
              f"{p.jit_warmup:g} s of load per server before the first round; "
              f"{p.kill_rounds} kill round(s).")
    return BenchResult("remoting", "RocketMQ remoting: zns against the Java NameServer",
                       METHOD + "\n" + params + "\n" + LIMITS, figures)


if __name__ == "__main__":
    raise SystemExit(cli({"remoting": run}))

"""The zns-agent side of the interop harness: the jar, an application to attach it to, a zns.

- :func:`agent_jar` builds ``agent/`` once per source version (``agent/build.py``, cache
  outside git) or raises :class:`rocketmq.InteropUnavailable` saying why.
- :class:`Probe` runs ``tests/interop/java/AgentProbe.java`` — an ordinary RocketMQ
  producer and/or consumer with RocketMQ's defaults — with or without ``-javaagent``, and
  collects its JSON lines: when its publish info or its assigned queues change, each send.
- :class:`Zns` is ``zns serve --remoting`` on ports chosen up front, so it can be killed
  and started again on the same addresses (the "zns restarts" scenario).
- :class:`RouteWatcher` is a ZNS/1 subscriber that timestamps route events (wall clock),
  the moment zns published a change, from which the application's delay is measured.
- :class:`HostileEndpoint` is an events endpoint that speaks ZMTP 3.0 itself, on raw TCP,
  honest (an ``hb`` every interval, route events on demand) or hostile (huge frames, a
  frame header claiming 1.5 GB, a message that never ends, rising revisions, new epochs).

Used by ``tests/interop/test_agent.py`` and ``bench/agent.py``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import zmq

import rocketmq
from rocketmq import InteropError, InteropUnavailable

REPO = rocketmq.REPO
PROBE_SOURCE = Path(__file__).resolve().parent / "java" / "AgentProbe.java"
PROBE_MAIN = "AgentProbe"

_spec = importlib.util.spec_from_file_location("zns_agent_build", REPO / "agent" / "build.py")
assert _spec is not None and _spec.loader is not None
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

_jar_error: str | None = None


def agent_jar() -> Path:
    """The built zns-agent.jar (built now when the sources changed); InteropUnavailable if impossible."""
    global _jar_error
    if _jar_error is not None:
        raise InteropUnavailable(_jar_error)
    ok, reason = rocketmq.java_available()
    if not ok:
        raise InteropUnavailable(reason)
    try:
        return build.ensure(log=lambda msg: print(msg, file=sys.stderr))
    except (build.BuildError, subprocess.TimeoutExpired, OSError) as exc:
        _jar_error = f"zns-agent.jar cannot be built: {exc}"
        raise InteropUnavailable(_jar_error) from exc


_probe_classes: Path | None = None


def probe_classes() -> Path:
    """Compile AgentProbe.java (Java 8 source level) into the jar cache, once per source."""
    global _probe_classes
    if _probe_classes is not None:
        return _probe_classes
    cache = rocketmq.ensure_jars()
    digest = hashlib.sha256(PROBE_SOURCE.read_bytes() + rocketmq.fetch._pom_digest().encode()).hexdigest()[:16]
    out = cache / "classes" / f"probe-{digest}"
    if not (out / f"{PROBE_MAIN}.class").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".probe-{digest}.", dir=out.parent))
        try:
            proc = subprocess.run(
                ["javac", "-nowarn", "--release", "8", "-encoding", "UTF-8", "-cp", rocketmq.classpath("client"),
                 "-d", str(staging), str(PROBE_SOURCE)],
                capture_output=True, text=True, timeout=180,
            )
            if proc.returncode != 0:
                raise InteropError(f"javac {PROBE_SOURCE.name} failed:\n{proc.stdout}{proc.stderr}")
            try:
                staging.rename(out)
            except OSError:
                if not (out / f"{PROBE_MAIN}.class").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    _probe_classes = out
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Zns:
    """`zns serve --remoting` in a subprocess on fixed loopback ports (restartable in place)."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.router = f"tcp://127.0.0.1:{free_port()}"
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        self.remoting_port = free_port()
        self.addr = f"127.0.0.1:{self.remoting_port}"  # what namesrvAddr takes
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> Zns:
        self.starts += 1
        # A cold start: the routes come back through the brokers' registrations, whose route
        # events the tests wait for. (A warm start restores them from the state dump zns
        # writes beside its KV file, and announces nothing.)
        (self.workdir / "kv.json.state").unlink(missing_ok=True)
        log = open(self.workdir / f"zns-{self.starts}.log", "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
        cmd = [sys.executable, "-m", "zns", "serve", "--router", self.router, "--pub", self.pub,
               "--remoting", self.addr, "--kv-path", str(self.workdir / "kv.json"), *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.close()
        rocketmq.wait_until(lambda: "RocketMQ remoting listener on" in self.log() or self.proc.poll() is not None,
                            30, "zns's remoting listener")
        if self.proc.poll() is not None:
            raise InteropError(f"zns exited: {self.log()}")
        return self

    def log(self) -> str:
        return (self.workdir / f"zns-{self.starts}.log").read_text()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class RouteWatcher:
    """A ZNS/1 SUB on `route/` (and `hb`), timestamping every route event with time.time()."""

    def __init__(self, pub: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.subscribe(b"route/")
        self.sub.subscribe(b"hb\0")
        self.sub.connect(pub)
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._hb = threading.Event()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._hb.wait(15):
            raise InteropError(f"no hb from {pub} within 15 s")

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sub.poll(100):
                continue
            _channel, body = self.sub.recv_multipart()
            at = time.time()
            event = msgspec.msgpack.decode(body)
            if event.get("op") == "hb":
                self._hb.set()
                continue
            with self._cond:
                self.events.append((at, event))
                self._cond.notify_all()

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float, what: str,
                 since: float = 0.0) -> float:
        """The wall-clock arrival of the first route event since `since` that matches."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for at, ev in self.events:
                    if at >= since and match(ev):
                        return at
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no route event within {timeout:.0f} s: {what}")
                self._cond.wait(min(left, 0.5))

    def wait_current(self, topic: str, match: Callable[[dict[str, Any]], bool], timeout: float, what: str,
                     since: float = 0.0) -> None:
        """Until the latest route event of `topic` (arrived at or after `since`) matches."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                latest = next((ev for at, ev in reversed(self.events) if ev["topic"] == topic and at >= since), None)
                if latest is not None and match(latest):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"not within {timeout:.0f} s: {what} (latest: {latest})")
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sub.close(0)
        self.ctx.term()


def create_topic(topic: str, broker_addr: str | None, namesrv: str, attempts: int = 3, cluster: str = "") -> None:
    """mqadmin updateTopic on one broker (or, with `cluster`, on every master of that cluster
    in one JVM), tried again when a loaded machine times it out."""
    where = ["-c", cluster] if cluster else ["-b", str(broker_addr)]
    for attempt in range(attempts):
        res = rocketmq.mqadmin(["updateTopic", *where, "-t", topic, "-r", "4", "-w", "4"], namesrv)
        if "success" in res.stdout:
            return
    raise InteropError(f"updateTopic {topic} on {where} failed {attempts} times: {res}")


def route_brokers(event: dict[str, Any], writable: bool = False) -> set[str]:
    """The broker names of a route event's queues (only writable ones with `writable`)."""
    route = event.get("route") or {}
    return {q["broker_name"] for q in route.get("queues", []) if not writable or q["perm"] & 2}


class Probe:
    """AgentProbe in a JVM, with the agent attached when `agent` is set; lines collected as they come.

    Every line gets ``at`` (time.time() on arrival). Stop it with :meth:`stop` (closes its
    stdin; it prints a summary and halts) or :meth:`kill`.
    """

    def __init__(self, workdir: Path, namesrv: str, topic: str, *, agent: Path | None, agent_args: str = "",
                 jvm_args: Sequence[str] = (), java_tool_options: str | None = None,
                 version: str = rocketmq.DEFAULT_VERSION, java: str = "java", **options: Any) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="probe-", dir=workdir))
        argv = ["--namesrv", namesrv, "--topic", topic]
        for key, value in options.items():
            if value is not None:
                argv += [f"--{key.replace('_', '-')}", str(value)]
        agent_opt = [f"-javaagent:{agent}" + (f"={agent_args}" if agent_args else "")] if agent else []
        env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
        if java_tool_options is not None:  # the README's recipe: the JVM reads it from the environment
            env["JAVA_TOOL_OPTIONS"] = java_tool_options
        rocketmq.ensure_jars(version)  # AgentProbe uses only what 4.9.x and 5.x both have
        cmd = rocketmq._java_cmd(
            "client", rocketmq.CLIENT_HEAP, self.workdir / "home", extra_cp=str(probe_classes()),
            jvm_args=["-Drocketmq.client.localIP=127.0.0.1", *agent_opt, *jvm_args], version=version,
        )
        self.cmd = [java, *cmd[1:], PROBE_MAIN, *argv]  # `java`: another JDK's launcher
        (self.workdir / "cmdline.txt").write_text(" ".join(self.cmd) + "\n")
        self.stderr_path = self.workdir / "stderr.log"
        self.lines: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None
        self._cond = threading.Condition()
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.cmd, cwd=self.workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=env, preexec_fn=rocketmq._die_with_parent)
        with rocketmq._live_lock:
            rocketmq._live.add(self.proc)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            obj["at"] = time.time()
            with self._cond:
                if obj.get("summary"):
                    self.summary = obj
                else:
                    self.lines.append(obj)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def stderr(self) -> str:
        return self.stderr_path.read_text("utf-8", "replace")

    def agent_lines(self) -> list[str]:
        return [ln for ln in self.stderr().splitlines() if "zns-agent:" in ln]

    def events(self, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [ln for ln in self.lines if ln.get("event") == kind]

    def wait_for(self, kind: str, match: Callable[[dict[str, Any]], bool], timeout: float, what: str,
                 since: float = 0.0) -> dict[str, Any]:
        """The first `kind` line whose wall_ms is at or after `since` (s) and that matches."""
        def first() -> dict[str, Any] | None:
            return next((ln for ln in self.lines if ln.get("event") == kind
                         and ln["wall_ms"] >= since * 1000 and match(ln)), None)
        return self._wait_until(first, timeout, what)

    def wait_current(self, kind: str, match: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> None:
        """Until the latest `kind` line matches (what the client believes now)."""
        def latest_matches() -> bool:
            latest = next((ln for ln in reversed(self.lines) if ln.get("event") == kind), None)
            return latest is not None and match(latest)
        self._wait_until(latest_matches, timeout, what)

    def _wait_until(self, found: Callable[[], Any], timeout: float, what: str) -> Any:
        """`found()`'s first truthy answer, asked under the lock each time a line arrives."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = found()
                if result:
                    return result
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise self._fail(f"exited before: {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(f"not within {timeout:.0f} s: {what}")
                self._cond.wait(min(left, 0.5))

    def brokers_now(self, kind: str) -> set[str] | None:
        found = self.events(kind)
        return set(found[-1]["brokers"]) if found else None

    def wait_agent_line(self, text: str, timeout: float, count: int = 1) -> str:
        """The `count`-th agent log line containing `text`."""
        return rocketmq.wait_until(
            lambda: (lambda hits: hits[count - 1] if len(hits) >= count else None)(
                [ln for ln in self.agent_lines() if text in ln]),
            timeout, f"agent line {text!r} #{count} in {self.stderr_path}")

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self._fail("did not stop in time") from None
        self._reader.join(10)
        self._forget()
        if self.summary is None:
            raise self._fail(f"no summary (exit {self.proc.returncode})")
        return self.summary

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._forget()

    def _forget(self) -> None:
        with rocketmq._live_lock:
            rocketmq._live.discard(self.proc)

    def _fail(self, what: str) -> InteropError:
        with self._cond:
            last = self.lines[-5:]
        return InteropError(f"AgentProbe {what}\nlast lines: {last}\n--- stderr tail ({self.stderr_path}) ---\n"
                            f"{rocketmq._tail(self.stderr_path)}")


def thread_cpu_ms(pid: int, name_prefix: str) -> float:
    """CPU time (ms) of the threads of `pid` whose name starts with `name_prefix` (the whole
    name when it ends with "$"): the scheduler's nanosecond count (schedstat), else
    user + system time in clock ticks (10 ms steps). CPU time, not wall clock: a loaded
    machine delays a thread but does not make it use more of it."""
    exact = name_prefix.endswith("$")
    name_prefix = name_prefix.rstrip("$")
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            if comm != name_prefix if exact else not comm.startswith(name_prefix):
                continue
            try:
                total += int((task / "schedstat").read_text().split()[0]) / 1e6
                continue
            except (OSError, IndexError, ValueError):
                pass
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) * 1000.0 / tick  # utime, stime (fields 14 and 15 of stat)
    return total


def thread_names(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue
    return names


def rss_mib(pid: int) -> float:
    """The resident set size of `pid` (MiB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise InteropError(f"no VmRSS for {pid}")


class HostileEndpoint:
    """A zns events endpoint on 127.0.0.1 (an ephemeral port) that speaks ZMTP 3.0 itself on
    raw TCP, so that it can send what no ZeroMQ library would. Every connection gets the
    greeting and a READY of a PUB socket, then what `mode` says, switchable at any time:

    - ``honest``: an ``hb`` every `hb_ms` (and route events through :meth:`route`);
    - ``huge``: ``hb``s as honest, plus 10 MB frames on ``hb\\0`` at 20 a second;
    - ``liar``: one 9-byte frame header claiming a 1.5 GB frame, then a byte a second;
    - ``endless``: one message of 200 KB frames flagged MORE that never ends;
    - ``revisions`` / ``epochs``: route events of `topic` as fast as the socket takes them,
      each with a higher revision / each of a new epoch (and ``hb``s as honest).

    Like a PUB, it sends ``hb``, route events and the huge ``hb`` frames only to connections
    subscribed to their channel (it reads the subscriber's ZMTP 3.0 subscription messages);
    the liar and the endless message go to every connection.
    """

    HUGE_FRAME = 10_000_000
    CLAIMED = 1_500_000_000

    def __init__(self, topic: str = "", hb_ms: int = 300) -> None:
        self.topic = topic
        self.hb_ms = hb_ms
        self.mode = "honest"
        self.epoch = "e1e1e1e1e1e1e1e1"
        self.revision = 1
        self.sent: dict[str, int] = {}
        self.last_flood_ms = 0.0  # wall clock (ms, floored) just before the last route event of `revisions`/`epochs` was sent
        self.trace: list[str] = []  # what each connection did, for a failing test's message
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._subs: dict[socket.socket, set[bytes]] = {}
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._huge = b"\x02" + self.HUGE_FRAME.to_bytes(8, "big") + bytes(self.HUGE_FRAME)
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
        flags = (1 if more else 0) | (4 if command else 0)
        if len(body) > 255:
            return bytes([flags | 2]) + len(body).to_bytes(8, "big") + body
        return bytes([flags, len(body)]) + body

    def event(self, channel: bytes, body: dict[str, Any]) -> bytes:
        return self.frame(channel, more=True) + self.frame(msgspec.msgpack.encode(body))

    def hb(self) -> bytes:
        return self.event(b"hb\0", {"op": "hb", "epoch": self.epoch, "revision": self.revision,
                                     "time_ms": int(time.time() * 1000)})

    def route(self, revision: int, epoch: str | None = None) -> bytes:
        return self.event(f"route/{self.topic}\0".encode(), {
            "op": "route", "epoch": epoch or self.epoch, "revision": revision, "prev": revision - 1,
            "topic": self.topic, "route": None})

    def wants(self, conn: socket.socket, channel: bytes) -> bool:
        with self._lock:
            return any(channel.startswith(prefix) for prefix in self._subs.get(conn, ()))

    def send_route(self, revision: int) -> None:
        """One route event of `topic` to every connection subscribed to it (an honest change)."""
        self.revision = max(self.revision, revision)
        data = self.route(revision)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            if self.wants(conn, f"route/{self.topic}\0".encode()):
                try:
                    conn.sendall(data)
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _trace(self, conn: socket.socket, what: str) -> None:
        try:
            peer = conn.getpeername()[1]
        except OSError:
            peer = "?"
        with self._lock:
            if len(self.trace) < 200:
                self.trace.append(f"{time.monotonic():.3f} conn {peer}: {what}")

    def _count(self, what: str) -> None:
        with self._lock:
            self.sent[what] = self.sent.get(what, 0) + 1

    def _serve(self, conn: socket.socket) -> None:
        greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)
        ready = self.frame(b"\x05READY\x0bSocket-Type" + (3).to_bytes(4, "big") + b"PUB", command=True)
        threading.Thread(target=self._drain, args=(conn,), daemon=True).start()
        with self._lock:
            self._conns.append(conn)
            self._subs.setdefault(conn, set())
        route_channel = f"route/{self.topic}\0".encode()
        self._trace(conn, "accepted")
        try:
            conn.sendall(greeting + ready)
            next_hb = 0.0
            hbs = 0
            while not self._stop.is_set():
                mode = self.mode
                now = time.monotonic()
                if mode in ("honest", "huge", "revisions", "epochs") and now >= next_hb \
                        and self.wants(conn, b"hb\0"):  # the first as soon as it is subscribed
                    next_hb = now + self.hb_ms / 1000
                    conn.sendall(self.hb())
                    hbs += 1
                    if hbs == 1:
                        self._trace(conn, "first hb sent")
                if mode == "honest":
                    time.sleep(0.01)
                elif mode == "huge":
                    if self.wants(conn, b"hb\0"):
                        self._count("huge")  # counted first: the subscriber may close half-way
                        conn.sendall(self._huge)
                    time.sleep(0.05)
                elif mode == "liar":
                    self._count("liar")
                    conn.sendall(b"\x02" + self.CLAIMED.to_bytes(8, "big"))
                    while self.mode == "liar" and not self._stop.wait(1):
                        conn.sendall(b"\0")  # trickled, never complete
                    return
                elif mode == "endless":
                    self._count("endless")
                    conn.sendall(self.frame(b"hb\0", more=True))
                    part = self.frame(bytes(200_000), more=True)
                    while self.mode == "endless" and not self._stop.is_set():
                        conn.sendall(part)
                    return
                elif mode in ("revisions", "epochs"):
                    if not self.wants(conn, route_channel):
                        time.sleep(0.01)
                        continue
                    with self._lock:
                        self.revision += 1
                        revision = self.revision
                    epoch = f"{revision:016x}" if mode == "epochs" else None
                    # taken before the send, floored as Java's currentTimeMillis is: a pull that
                    # covers this event prints a wall_ms at least this (taken after the send, a
                    # descheduled thread could stamp it after the agent already pulled)
                    sent_ms = float(int(time.time() * 1000))
                    conn.sendall(self.route(revision, epoch))
                    self.last_flood_ms = sent_ms
                    self._count(mode)
                    time.sleep(0.001)  # about 500 a second on this machine: far more than the bound
        except OSError as e:
            self._trace(conn, f"ended: {e!r}")  # the subscriber closed it: it reconnects, or it is done
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
                self._subs.pop(conn, None)
            conn.close()

    def _drain(self, conn: socket.socket) -> None:
        """Reads the subscriber's frames; keeps its subscriptions (ZMTP 3.0 messages
        starting with 1 or 0, or 3.1's SUBSCRIBE and CANCEL commands)."""
        data = b""
        greeting_left = 64
        try:
            while chunk := conn.recv(65536):
                data += chunk
                if greeting_left:
                    skip = min(greeting_left, len(data))
                    data, greeting_left = data[skip:], greeting_left - skip
                while len(data) >= 2:
                    flags = data[0]
                    head = 9 if flags & 2 else 2
                    if len(data) < head:
                        break
                    size = int.from_bytes(data[1:head], "big")
                    if len(data) < head + size:
                        break
                    body, data = data[head:head + size], data[head + size:]
                    if flags & 4:
                        for name, on in ((b"\x09SUBSCRIBE", True), (b"\x06CANCEL", False)):
                            if body.startswith(name):
                                self._subscribe(conn, body[len(name):], on)
                    elif body[:1] in (b"\x01", b"\x00"):
                        self._subscribe(conn, body[1:], body[:1] == b"\x01")
        except OSError:
            pass

    def _subscribe(self, conn: socket.socket, prefix: bytes, on: bool) -> None:
        self._trace(conn, f"{'subscribed' if on else 'cancelled'} {prefix!r}")
        with self._lock:
            subs = self._subs.setdefault(conn, set())
            if on:
                subs.add(prefix)
            else:
                subs.discard(prefix)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

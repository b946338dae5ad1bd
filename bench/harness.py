"""The one client harness every benchmark uses.

- `start_zns` / `start_echo`: a server in its own process, endpoints read from its log line.
- `Session`: the orchestrator's own DEALER, to set state up and check replies.
- `LoadPool`: load processes, spawned once and reused, each running a job per drive;
  `LoadClients`, the pool whose processes keep N requests in flight on a DEALER against an
  endpoint for a timed window — the same code drives zns and the echo server, so their
  ratio compares servers, not clients.
- `run_in_group`: a benchmark as a subprocess in a process group of its own, ended as a
  whole on timeout or interrupt, so no server it started outlives it.
- `Subscribers`: SUB sockets spread over a few processes that timestamp every
  event as it arrives (time.monotonic is one system-wide clock on Linux, so
  timestamps taken in different processes compare).

Every loop here is bounded in time; every address is loopback.
"""

from __future__ import annotations

import collections
import math
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import zmq

from zns.core import schema

LOOPBACK = "tcp://127.0.0.1:*"
REPLY_TIMEOUT_S = 15.0  # a server that answers nothing for this long has failed
START_TIMEOUT_S = 30.0
PAIR_WAIT_S = 30.0  # a fresh server pairs after 3 quiet seconds
QUICK_PAIR_WAIT_S = 6.0
REPO = Path(__file__).resolve().parent.parent
PROBE_EVERY_S = 0.005  # Probe
_SERVING = re.compile(r"serving requests on (\S+), events on (\S+)")


class BenchError(RuntimeError):
    """The benchmark could not measure what it meant to (an error reply, a timeout)."""


# --- servers ---------------------------------------------------------------


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    router: str
    pub: str
    log_path: Path

    def rss_kib(self) -> int:
        return rss_kib(self.proc.pid)

    def peak_rss_kib(self) -> int:
        return rss_kib(self.proc.pid, "VmHWM")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_zns(workdir: Path, *args: str) -> ServerProcess:
    """`zns serve` on ephemeral loopback ports, its KV file in `workdir`: one process unless
    `args` give `--workers` (the benchmarks read the CPU and memory of the process they
    started; bench/workers.py measures the split)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "zns", "serve", "--router", LOOPBACK, "--pub", LOOPBACK,
        "--kv-path", str(workdir / "kv.json"), *args,
    ]
    # By the environment, which a checkout from before workers (BENCH_ZNS_REPO) ignores
    return _start(cmd, workdir / f"zns-{time.monotonic_ns()}.log",
                  {} if "--workers" in args else {"ZNS_WORKERS": "0"})


def wait_log(server: ServerProcess, pattern: re.Pattern[str],
             timeout: float = START_TIMEOUT_S) -> str:
    """The first group of `pattern`'s first match in `server`'s log, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = pattern.search(server.log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        time.sleep(0.02)
    raise BenchError(f"no {pattern.pattern!r} in {server.log_path}: "
                     f"{server.log_path.read_text(errors='replace')[-2000:]}")


def wait_paired(server: ServerProcess, args: Sequence[str], quick: bool = False) -> str:
    """Once `zns serve *args` pairs the state process with worker 1 (`--cpus auto`, the
    default with workers: zns.core.pairing), which it does after 3 light seconds on a quiet
    machine: a figure of the default shape is of the shape as it serves, not as it starts.

    Returns "" when paired (or when `args` do not pair), else a note for the figures: a
    machine that is never quiet (a loaded CI runner) is measured as the kernel places the
    processes, as zns itself would serve there, instead of failing the benchmark."""
    if "--cpus" in args or "--workers" not in args \
            or args[list(args).index("--workers") + 1] == "0":
        return ""
    timeout = QUICK_PAIR_WAIT_S if quick else PAIR_WAIT_S
    try:
        wait_log(server, re.compile(r"share CPU (\d+) while their work is light"), timeout)
    except BenchError:
        print(f"{server.log_path.name}: not paired within {timeout:g} s", file=sys.stderr)
        return f"not paired within {timeout:g} s (the machine was not quiet): unpinned"
    return ""


def start_echo(workdir: Path, io: str = "frames") -> ServerProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.echo_server", LOOPBACK, io]
    return _start(cmd, workdir / f"echo-{time.monotonic_ns()}.log")


def _start(cmd: list[str], log_path: Path, zns_env: dict[str, str] | None = None) -> ServerProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")} | (zns_env or {})
    # BENCH_ZNS_REPO: the servers of another checkout (a "before" figure), same clients.
    repo = Path(os.environ.get("BENCH_ZNS_REPO") or REPO)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = _SERVING.search(log_path.read_text(errors="replace"))
        if match:
            return ServerProcess(proc, match.group(1), match.group(2), log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    proc.wait(10)
    raise BenchError(f"{' '.join(cmd)} did not start: {log_path.read_text(errors='replace')}")


def run_in_group(cmd: Sequence[str], *, timeout: float, grace: float = 5.0,
                 **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run `cmd` (a benchmark) in a process group of its own and end the whole group —
    the servers it started too — on timeout, on an interrupt, and after it exits.

    `subprocess.run(timeout=...)` kills only the process it started: a benchmark killed
    that way leaves its `zns serve` children running. Here the group gets SIGTERM first
    (the benchmark stops its servers and removes its folder), SIGKILL after `grace` s.
    """
    proc = subprocess.Popen(list(cmd), start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:
        end_group(proc.pid, grace)
        out, err = proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        raise
    end_group(proc.pid, 0)  # anything it left behind (a crash skips its cleanup)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def end_group(pgid: int, grace: float) -> None:
    """SIGTERM to every process of group `pgid`, SIGKILL to those left after `grace` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return  # the group is empty
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _group_running(pgid):
                return
            time.sleep(0.05)


def _group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. A zombie does not count: the leader,
    our own child, stays one until we read its status, which would make every wait last
    its whole grace."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (/proc/<pid>/stat, clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of a process, from /proc/<pid>/status (VmRSS, in KiB); VmHWM is
    its peak since the process started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise BenchError(f"no {field} for pid {pid}")


# --- requests --------------------------------------------------------------


def request(op: str, **fields: Any) -> bytes:
    return schema.encode({"op": op, **fields})


def register_request(
    broker_name: str, broker_addr: str, topics: Iterable[str] = (), *,
    cluster: str = "bench", broker_id: int = 0, **extra: Any,
) -> bytes:
    """A full registration; every topic with the default TopicConfig unless `topic_config`."""
    config = extra.pop("topic_config", {})
    return request(
        "register_broker", cluster=cluster, broker_name=broker_name, broker_id=broker_id,
        broker_addr=broker_addr, topics={t: config for t in topics}, **extra,
    )


def heartbeat_request(broker_name: str, broker_addr: str, *, cluster: str = "bench",
                      broker_id: int = 0, **extra: Any) -> bytes:
    return request("heartbeat", cluster=cluster, broker_name=broker_name, broker_id=broker_id,
                   broker_addr=broker_addr, **extra)


def broker_addr(i: int) -> str:
    """A distinct, valid broker address per index (never dialled: only a name here)."""
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:10911"


def check_reply(body: bytes) -> Any:
    reply = schema.decode_reply(body)
    if isinstance(reply, schema.Error):
        raise BenchError(f"the server answered {reply.code}: {reply.message}")
    return reply


def free_port() -> int:
    """A loopback TCP port free now (for a server that must keep its port across restarts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ask(endpoint: str, body: bytes, timeout_ms: int = 200) -> schema.Reply | None:
    """One request on a fresh connection (a new connection, so the kernel places it anew)."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # A refused connection is retried after 5 ms, not libzmq's 100: times to a server's
    # first answer would otherwise come in steps of 100 ms while no process listens.
    sock.setsockopt(zmq.RECONNECT_IVL, 5)
    sock.connect(endpoint)
    try:
        sock.send(body)
        if not sock.poll(timeout_ms):
            return None
        return schema.decode_reply(sock.recv())
    finally:
        sock.close(0)


class Session:
    """The orchestrator's connection: sets state up, one request or a pipeline at a time."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, int(REPLY_TIMEOUT_S * 1000))
        self.sock.connect(endpoint)

    def call_raw(self, body: bytes) -> bytes:
        self.sock.send(body)
        try:
            return self.sock.recv()
        except zmq.Again:
            raise BenchError(f"no reply within {REPLY_TIMEOUT_S} s") from None

    def call(self, op: str, **fields: Any) -> Any:
        """One request; its decoded reply, or BenchError for an `error` reply."""
        return check_reply(self.call_raw(request(op, **fields)))

    def pipeline(self, bodies: Sequence[bytes], in_flight: int = 100) -> None:
        """Send every body with up to `in_flight` outstanding; every reply must be a success."""
        sent = 0
        for received in range(len(bodies)):
            while sent < len(bodies) and sent - received < in_flight:
                self.sock.send(bodies[sent])
                sent += 1
            try:
                check_reply(self.sock.recv())
            except zmq.Again:
                raise BenchError(f"no reply within {REPLY_TIMEOUT_S} s") from None

    def close(self) -> None:
        self.sock.close(0)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Probe(threading.Thread):
    """get_route every PROBE_EVERY_S on its own connection; (sent, round trip) of each: the
    longest round trip in a window is the longest the server's loop was blocked then."""

    def __init__(self, endpoint: str, topic: str) -> None:
        super().__init__(daemon=True)
        self._endpoint, self._body = endpoint, request("get_route", id=1, topic=topic)
        self._halt = threading.Event()
        self.samples: list[tuple[float, float]] = []

    def run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._endpoint)
        try:
            while not self._halt.is_set():
                sent = time.monotonic()
                sock.send(self._body)
                if not sock.poll(60_000):
                    raise BenchError("the probe got no reply within 60 s")
                sock.recv()
                self.samples.append((sent, time.monotonic() - sent))
                self._halt.wait(PROBE_EVERY_S)
        finally:
            sock.close(0)

    def started(self, timeout: float = 30.0) -> Probe:
        """Start it, and return once it has its first round trip (a thread on a loaded
        machine can start late enough to miss a short window)."""
        self.start()
        deadline = time.monotonic() + timeout
        while not self.samples:
            if not self.is_alive() or time.monotonic() > deadline:
                raise BenchError(f"the probe had no round trip within {timeout:g} s")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self._halt.set()
        if self.ident is not None:  # started
            self.join(70)

    def worst_ms(self, start: float, end: float) -> float:
        window = [rtt for sent, rtt in self.samples if start - 0.5 <= sent <= end]
        if not window:
            raise BenchError("the probe took no sample in the window")
        return max(window) * 1000


# --- load ------------------------------------------------------------------


@dataclass
class Load:
    rate: float  # replies per second received in the window, all client processes
    replies: int
    total: int  # replies received at all, warm-up and tail included
    latencies: list[float]  # seconds per round trip; only when one request is in flight
    server_cpu: float  # seconds of CPU the server used while driven (all `total` replies)

    @property
    def cpu_us_per_request(self) -> float:
        """Server CPU per request: unlike a rate, barely moved by other load on the machine."""
        return self.server_cpu / self.total * 1e6 if self.total else float("nan")


class LoadPool:
    """Load processes, spawned once (a timed window must not include a process start) and
    reused by every server a benchmark drives. Each runs `setup(*setup_args)` once (its
    sockets' context, the frames it will send), then `job(what setup made, *args)` for each
    `run`, and sends back the job's outcome, or one line saying why the job failed. `job`
    and `setup` are module-level functions: the processes are spawned, not forked, so
    they inherit no socket of the benchmark's."""

    def __init__(self, processes: int, job: Callable[..., Any], setup: Callable[..., Any],
                 *setup_args: Any, what: str = "a load process") -> None:
        mp = multiprocessing.get_context("spawn")
        self.what = what
        self._conns: list[Connection] = []
        self._procs = []
        for _ in range(processes):
            parent, child = mp.Pipe()
            proc = mp.Process(target=_pool_main, args=(child, setup, setup_args, job),
                              daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        for conn in self._conns:
            if not conn.poll(START_TIMEOUT_S) or conn.recv() != "ready":
                raise BenchError(f"{what} did not start")

    def __len__(self) -> int:
        return len(self._conns)

    def run(self, jobs: Sequence[tuple[Any, ...]], timeout: float) -> list[Any]:
        """Job i's arguments to process i, all sent before any outcome is awaited (fewer
        jobs than processes: the first ones); their outcomes, in order."""
        if len(jobs) > len(self._conns):
            raise ValueError(f"only {len(self._conns)} load processes")
        for conn, args in zip(self._conns, jobs):
            conn.send(args)
        outcomes = []
        for conn in self._conns[:len(jobs)]:
            if not conn.poll(timeout):
                raise BenchError(f"{self.what} did not report")
            outcome = conn.recv()
            if isinstance(outcome, str):
                raise BenchError(f"{self.what} failed: {outcome}")
            outcomes.append(outcome)
        return outcomes

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()

    def __enter__(self) -> LoadPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _pool_main(conn: Connection, setup: Callable[..., Any], setup_args: tuple[Any, ...],
               job: Callable[..., Any]) -> None:
    made = setup(*setup_args)
    conn.send("ready")
    while True:
        try:
            args = conn.recv()
        except EOFError:
            return
        try:
            conn.send(job(made, *args))
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator (outcomes are never str)
            conn.send(f"{type(exc).__name__}: {exc}")


def zmq_context() -> zmq.Context:
    """A load process's sockets' context (`LoadPool`'s `setup` for ZeroMQ load)."""
    return zmq.Context.instance()


class LoadClients(LoadPool):
    """Client processes, spawned once and reused: each keeps requests in flight on a DEALER."""

    def __init__(self, processes: int = 2) -> None:
        super().__init__(processes, _drive, zmq_context, what="a client process")

    def drive(
        self, server: ServerProcess, bodies: Sequence[bytes], *, in_flight: int, duration: float,
        processes: int = 1, warmup: float = 0.3,
    ) -> Load:
        """Keep `in_flight` requests outstanding in total, split over `processes`, cycling
        through `bodies`; count the replies that arrive during `duration` after `warmup`."""
        start_at = time.monotonic() + warmup
        shares = [in_flight // processes + (i < in_flight % processes) for i in range(processes)]
        record = in_flight == processes  # one request in flight per process: latency counts
        cpu_before = server.cpu_seconds()
        outcomes = self.run([(server.router, list(bodies), share, start_at, duration, record)
                             for share in shares], warmup + duration + REPLY_TIMEOUT_S + 10)
        server_cpu = server.cpu_seconds() - cpu_before
        replies = sum(outcome[0] for outcome in outcomes)
        total = sum(outcome[1] for outcome in outcomes)
        latencies = [latency for outcome in outcomes for latency in outcome[2]]
        return Load(replies / duration, replies, total, latencies, server_cpu)


def _drive(
    ctx: zmq.Context, endpoint: str, bodies: list[bytes], in_flight: int, start_at: float,
    duration: float, record: bool,
) -> tuple[int, int, list[float]]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(REPLY_TIMEOUT_S * 1000))
    sock.connect(endpoint)
    send, recv, clock = sock.send, sock.recv, time.monotonic
    end_at = start_at + duration
    count = len(bodies)
    sent_at: collections.deque[float] = collections.deque()
    replies, latencies = 0, []
    total = 0
    try:
        for i in range(in_flight):
            sent_at.append(clock())
            send(bodies[i % count])
        i = in_flight
        # The hot loop: one reply in, one request out; timestamps only when measuring latency.
        while True:
            recv()
            now = clock()
            total += 1
            if record:
                started = sent_at.popleft()
            if now >= start_at:
                # A latency run ends with at least one sample: on a loaded machine the whole
                # window can pass before the first reply (percentile has nothing to rank).
                if now >= end_at and (latencies or not record):
                    break
                replies += 1
                if record:
                    latencies.append(now - started)
            if record:
                sent_at.append(clock())
            send(bodies[i % count])
            i += 1
    except zmq.Again:  # RCVTIMEO passed
        raise BenchError(f"no reply from {endpoint} within {REPLY_TIMEOUT_S} s") from None
    finally:
        sock.close(0)
    return replies, total, latencies


# --- a delayed link ------------------------------------------------------------


RELAY_CHUNK_BYTES = 256 * 1024  # read at once from one side
RELAY_HELD_CHUNKS = 256  # held per direction and connection; past it, TCP pushes back


class DelayRelay:
    """A TCP relay on a loopback port with a one-way delay of `delay` s each way: the bench's
    stand-in for a network's round trip (no `tc netem` here). For each connection it takes,
    it connects to `target` (tcp://HOST:PORT) and forwards bytes both ways, each chunk
    released `delay` s after it was read, in order. It only moves bytes, so CURVE runs end
    to end through it. Its own process (spawned), so the benchmark's loop does not time it:
    its cost is Python's, a chunk's extra delay one turn of its loop; no other bound on
    throughput than that, and RELAY_HELD_CHUNKS held per direction (bounded buffering)."""

    def __init__(self, target: str, delay: float) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        mp = multiprocessing.get_context("spawn")
        parent, child = mp.Pipe()
        self._proc = mp.Process(target=_relay_main, args=(child, host, int(port), delay),
                                daemon=True)
        self._proc.start()
        child.close()  # so that its death is an EOF here
        try:
            if not parent.poll(START_TIMEOUT_S):
                raise EOFError
            self.endpoint = f"tcp://127.0.0.1:{parent.recv()}"
        except EOFError:
            self.close()
            raise BenchError(f"the relay to {target} did not start") from None
        self.delay = delay

    def close(self) -> None:
        self._proc.terminate()  # its connections close with it
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    def __enter__(self) -> DelayRelay:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _relay_main(conn: Connection, host: str, port: int, delay: float) -> None:
    import asyncio

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(RELAY_HELD_CHUNKS)

        async def release() -> None:
            broken = False
            while True:
                at, data = await held.get()
                if not data:  # the other side's EOF
                    break
                if broken:
                    continue  # read on to the EOF, which the closes below bring
                if at > loop.time():
                    await asyncio.sleep(at - loop.time())
                try:
                    writer.write(data)
                    await writer.drain()
                except OSError:
                    broken = True
                    writer.close()
            writer.close()  # one way closed: the connection goes, as ZeroMQ's do

        releasing = asyncio.create_task(release())
        try:
            while data := await reader.read(RELAY_CHUNK_BYTES):
                await held.put((loop.time() + delay, data))
        except OSError:
            pass
        await held.put((loop.time() + delay, b""))
        await releasing

    async def accepted(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(forward(client_r, server_w), forward(server_r, client_w))

    async def main() -> None:
        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        conn.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


# --- subscribers -------------------------------------------------------------


@dataclass
class Arrival:
    socket: int  # which subscriber socket, 0..sockets-1
    at: float  # time.monotonic() right after recv
    revision: int
    op: str
    key: str  # route: the topic; broker: the broker address
    change: str = ""
    reason: str = ""


class Subscribers:
    """`sockets` SUB sockets spread over `processes` processes, each subscribed to
    `prefixes`. With `ack`, each process reports over PUSH how many events every one of
    its sockets has received, so a sender can pace itself (`wait_acked`)."""

    def __init__(self, pub: str, prefixes: Sequence[bytes], *, sockets: int = 1,
                 processes: int = 1, ack: bool = False) -> None:
        processes = max(1, min(processes, sockets))
        self._acks = None
        ack_endpoint = None
        if ack:
            self._acks = zmq.Context.instance().socket(zmq.PULL)
            self._acks.setsockopt(zmq.LINGER, 0)
            self._acks.bind(LOOPBACK)
            ack_endpoint = self._acks.getsockopt_string(zmq.LAST_ENDPOINT)
        self._acked = [0] * processes
        mp = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs = []
        first = 0
        for p in range(processes):
            n = sockets // processes + (p < sockets % processes)
            parent, child = mp.Pipe()
            proc = mp.Process(target=_subscriber_main, daemon=True,
                              args=(child, pub, list(prefixes), first, n, p, ack_endpoint))
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
            first += n

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Subscriptions are asynchronous: each socket must have received an `hb` first."""
        deadline = time.monotonic() + timeout
        for conn in self._conns:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise BenchError("subscribers did not see an hb event in time")
            if conn.recv() != "ready":
                raise BenchError("a subscriber process failed")

    def wait_acked(self, count: int, timeout: float) -> bool:
        """Until every socket has received `count` events; False on timeout."""
        assert self._acks is not None
        deadline = time.monotonic() + timeout
        while min(self._acked) < count:
            left = deadline - time.monotonic()
            if left <= 0 or not self._acks.poll(int(left * 1000) + 1):
                return False
            process, received = self._acks.recv_multipart()
            index = int(process)
            self._acked[index] = max(self._acked[index], int(received))
        return True

    def stop(self) -> list[Arrival]:
        """Stop every process; every event each socket received, with its arrival time."""
        arrivals: list[Arrival] = []
        for conn in self._conns:
            conn.send("stop")
        for conn, proc in zip(self._conns, self._procs):
            if not conn.poll(60):
                raise BenchError("a subscriber process did not report")
            arrivals.extend(conn.recv())
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        if self._acks is not None:
            self._acks.close(0)
        return arrivals


def _subscriber_main(conn: Connection, pub: str, prefixes: list[bytes], first: int, n: int,
                     process: int, ack_endpoint: str | None) -> None:
    ctx = zmq.Context.instance()
    socks = []
    poller = zmq.Poller()
    for _ in range(n):
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1_000_000)  # a timing run must not lose events here
        for prefix in [*prefixes, schema.HB_CHANNEL]:
            sock.setsockopt(zmq.SUBSCRIBE, prefix)
        sock.connect(pub)
        socks.append(sock)
        poller.register(sock, zmq.POLLIN)
    poller.register(conn.fileno(), zmq.POLLIN)
    push = None
    if ack_endpoint:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(ack_endpoint)
    index = {sock: i for i, sock in enumerate(socks)}
    seen_hb = [False] * n
    counts = [0] * n
    acked = 0
    raw: list[tuple[int, float, bytes]] = []
    clock = time.monotonic
    ready = False
    while True:
        ready_socks = poller.poll(1000)
        for sock, _ in ready_socks:
            if sock == conn.fileno():
                continue
            i = index[sock]
            while True:
                try:
                    channel, body = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                at = clock()
                if channel == schema.HB_CHANNEL:
                    seen_hb[i] = True
                elif ready:
                    raw.append((i, at, body))
                    counts[i] += 1
        if not ready and all(seen_hb):
            ready = True
            conn.send("ready")
        if push is not None and ready and min(counts) > acked:
            acked = min(counts)
            push.send_multipart([b"%d" % process, b"%d" % acked])
        if conn.poll():
            conn.recv()
            break
    conn.send([_arrival(first + i, at, body) for i, at, body in raw])
    for sock in socks:
        sock.close(0)
    if push is not None:
        push.close(0)


def _arrival(socket: int, at: float, body: bytes) -> Arrival:
    event = schema.decode_event(body)
    if isinstance(event, schema.RouteEvent):
        return Arrival(socket, at, event.revision, "route", event.topic)
    return Arrival(socket, at, event.revision, "broker", event.broker_addr, event.change,
                   event.reason)


# --- statistics --------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    if not values:
        raise BenchError("no samples")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]

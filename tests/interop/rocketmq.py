"""Run the real Apache RocketMQ 5.3.3 Java components from tests.

Everything here takes the NameServer address as a parameter (``"127.0.0.1:PORT"``, or
several joined by ``;``), so the same brokers, clients and ``mqadmin`` calls can be
pointed at RocketMQ's own Java NameServer or at zns.

- :func:`java_available`, :func:`ensure_jars`, :func:`client_classes` prepare the JDK
  side: jars in a cache outside git (``tools/rocketmq/fetch.py``) and the test client
  ``tests/interop/java/ZnsInteropClient.java`` compiled into that cache.
- :class:`JavaNameServer` and :class:`Broker` are long-lived JVMs; :class:`ProcessGroup`
  starts them and kills whatever is left at teardown.
- :func:`mqadmin`, :func:`produce`, :func:`consume`, :func:`route` run one-shot JVMs;
  :class:`ProduceLoop` is a producer that keeps sending while a test does something.

Every JVM binds to 127.0.0.1 (the broker's HA listener is the exception: RocketMQ binds
it to the wildcard address and offers no setting), logs to a file in its own work
folder, has ``user.home`` pointed into that folder, dies with the test process
(``PR_SET_PDEATHSIG``) and is waited for with a deadline whose failure message carries
the tail of its log.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[2]
CLIENT_SOURCE = Path(__file__).resolve().parent / "java" / "ZnsInteropClient.java"
REQUIRE_ENV = "ZNS_REQUIRE_INTEROP"

_spec = importlib.util.spec_from_file_location("zns_rocketmq_fetch", REPO / "tools" / "rocketmq" / "fetch.py")
assert _spec is not None and _spec.loader is not None
fetch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch)

VERSION: str = fetch.VERSION  # the default version: brokers, clients and mqadmin run it
DEFAULT_VERSION: str = fetch.VERSION
VERSIONS: tuple[str, ...] = fetch.VERSIONS
# MQVersion.Version ordinals: what each version's NameServer announces in its replies.
VERSION_ORDINALS = {"4.9.7": 407, "5.3.3": 479, "5.5.0": 513}


def version_ordinal(version: str) -> int:
    return VERSION_ORDINALS[version]

# Small, quick-starting JVMs: 2 cores, several JVMs at once. C1 only and the serial GC
# start noticeably faster than the defaults; none of these processes runs long.
JVM_BASE = [
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Xss512k",
    "-Djava.net.preferIPv4Stack=true",
    "-Dfile.encoding=UTF-8",
]
NAMESRV_HEAP = ["-Xms64m", "-Xmx128m"]
BROKER_HEAP = ["-Xms128m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m"]
CLIENT_HEAP = ["-Xms32m", "-Xmx128m"]

NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"
CLIENT_MAIN = "ZnsInteropClient"

NAMESRV_READY = re.compile(r"The Name Server boot success\. serializeType=\w+, address ([\d.]+):(\d+)")
BROKER_READY = re.compile(r"The broker\[([^,\]]+), ([\d.]+:\d+)\] boot success")


class InteropError(AssertionError):
    """A RocketMQ process did not do what the harness waited for (message has its log tail)."""


class InteropUnavailable(RuntimeError):
    """No JDK, no Maven or no jars: the interop tests cannot run on this machine."""


# ---- waiting and naming, for the test modules ---------------------------------------------

def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """`check()`'s first truthy value, polled until `timeout` s; else an AssertionError saying what."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"not within {timeout:.0f} s: {what} (last: {last!r})")


class Phases:
    """Prints how long each step took (visible with -s or in a failure report)."""

    def __init__(self, name: str = "") -> None:
        self.prefix = f"[{name}] " if name else ""
        self.start = self.t = time.monotonic()

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        print(f"  {self.prefix}{now - self.t:6.2f} s  {what}")
        self.t = now

    def total(self) -> None:
        print(f"  {self.prefix}total {time.monotonic() - self.start:.2f} s")


# Sends a producer loop makes after a broker's SIGKILL before a test stops it: enough for
# check_sends_left_the_killed_broker's 30 after the first half second and its last 20.
SENDS_AFTER_KILL = 50


def sent_after(killed_at: float, survivors: set[str]) -> Callable[[list[dict[str, Any]]], bool]:
    """For ProduceLoop.wait_until: SENDS_AFTER_KILL sends, ok or not, half a second after the
    kill, and one sent ok to each survivor (the loop's duration leaves room for this wait).
    RocketMQ's producer keeps off a broker whose send was slow for up to 30 s (its latency
    fault strategy: a first send to a broker's cold JVM on a loaded machine can take
    seconds), so the sends after the kill may all go to one survivor for a while: seen with
    the Java NameServer, 68 sends to broker-a and none to broker-c."""
    def enough(sends: list[dict[str, Any]]) -> bool:
        after = [s for s in sends if s["at"] > killed_at + 0.5]
        return len(after) >= SENDS_AFTER_KILL and {s["broker"] for s in after if s["ok"]} >= survivors
    return enough


def check_sends_left_the_killed_broker(sends: list[dict[str, Any]], killed_at: float,
                                       survivors: set[str], summary: Any) -> list[dict[str, Any]]:
    """A producer's sends after a broker's SIGKILL: they keep succeeding, on the survivors.

    The producer retries a failed send on another broker and then avoids the dead one;
    a send in flight at the kill may have failed. Returns the sends after the kill.
    """
    after = [s for s in sends if s["at"] > killed_at + 0.5]
    assert len(after) >= 30, (len(after), summary)
    ok_after = [s for s in after if s["ok"]]
    assert len(ok_after) >= len(after) - 2, [s for s in after if not s["ok"]][:5]
    assert {s["broker"] for s in ok_after} == survivors, summary
    assert all(s["ok"] for s in sends[-20:]), sends[-20:]
    return after


def unique_topic(prefix: str) -> str:
    """A topic no earlier run (the brokers' stores live on) has used."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


# ---- prerequisites ----------------------------------------------------------------------

_java_cache: tuple[bool, str] | None = None
_java_version = ""  # `java -version`'s text: a class-data archive is only valid for the JVM that wrote it


def java_available() -> tuple[bool, str]:
    """(True, "") when java and javac (9+) are on PATH, and mvn too unless the jars are cached."""
    global _java_cache, _java_version
    if _java_cache is not None:
        return _java_cache
    missing = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
    if shutil.which("mvn") is None and not fetch.all_ready():
        missing.append("mvn")
    if missing:
        _java_cache = (False, f"no JDK/Maven: {', '.join(missing)} not found on PATH")
        return _java_cache
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        _java_cache = (False, f"no JDK/Maven: java -version failed: {exc}")
        return _java_cache
    _java_version = out
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):
        major = int(m.group(2))
    if major < 9:
        _java_cache = (False, f"no JDK/Maven: need Java 9 or later, found {out.strip().splitlines()[:1]}")
        return _java_cache
    _java_cache = (True, "")
    return _java_cache


def interop_required() -> bool:
    """True when ``ZNS_REQUIRE_INTEROP=1``: a missing JDK/Maven/jar fails instead of skipping."""
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0", "false", "no")


@contextlib.contextmanager
def unavailable_skips() -> Iterator[None]:
    """Around what needs a JDK, Maven or jars: InteropUnavailable skips the test with its
    reason, or fails it under ``ZNS_REQUIRE_INTEROP=1`` (so CI cannot go green by skipping)."""
    import pytest  # here, not at the top: the benchmarks use this harness without pytest

    try:
        yield
    except InteropUnavailable as exc:
        if interop_required():
            pytest.fail(f"{exc} ({REQUIRE_ENV}=1 makes this a failure)", pytrace=False)
        pytest.skip(str(exc))


_jars_error: str | None = None


_jars_errors: dict[str, str] = {}


def ensure_jars(version: str = DEFAULT_VERSION) -> Path:
    """Fetch one version's jars once (no-op when cached); return its cache folder.

    Raises InteropUnavailable with the reason when that is impossible; a failure is
    remembered so that a test session tries Maven only once per version.
    """
    global _jars_error
    ok, reason = java_available()
    if not ok:
        raise InteropUnavailable(reason)
    if version == DEFAULT_VERSION and _jars_error is not None:
        raise InteropUnavailable(_jars_error)
    if version in _jars_errors:
        raise InteropUnavailable(_jars_errors[version])
    try:
        return fetch.ensure(fetch.cache_dir(version))
    except (fetch.FetchError, subprocess.TimeoutExpired, OSError) as exc:
        _jars_errors[version] = f"RocketMQ {version} jars unavailable: {exc}"
        if version == DEFAULT_VERSION:
            _jars_error = _jars_errors[version]
        raise InteropUnavailable(_jars_errors[version]) from exc


def classpath(kind: str, version: str = DEFAULT_VERSION) -> str:
    return fetch.classpath(kind, fetch.cache_dir(version))


_classes: dict[str, Path] = {}


def client_classes(version: str = DEFAULT_VERSION) -> Path:
    """Compile ZnsInteropClient.java against `version`'s client jars into that version's
    cache (only when the source changed): each version's producer and consumer run their own
    client code, so a route an old client cannot parse fails there."""
    if version in _classes:
        return _classes[version]
    cache = ensure_jars(version)
    digest = hashlib.sha256(CLIENT_SOURCE.read_bytes() + fetch._pom_digest().encode()).hexdigest()[:16]
    out = cache / "classes" / digest
    if (out / f"{CLIENT_MAIN}.class").is_file():
        _classes[version] = out
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=out.parent))
    try:
        proc = subprocess.run(
            ["javac", "-nowarn", "-encoding", "UTF-8", "-cp", classpath("client", version), "-d", str(staging),
             str(CLIENT_SOURCE)],
            capture_output=True, text=True, timeout=180,
        )
        if proc.returncode != 0:
            raise InteropError(f"javac {CLIENT_SOURCE.name} ({version}) failed:\n{proc.stdout}{proc.stderr}")
        try:
            staging.rename(out)
        except OSError:
            if not (out / f"{CLIENT_MAIN}.class").is_file():  # a concurrent compile did not win either
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _classes[version] = out
    return out


def client_jar(version: str = DEFAULT_VERSION) -> Path:
    """client_classes(version) as a jar: class-data sharing archives classes from jars only.

    Made once, next to the classes folder; a concurrent maker's copy is left alone (its
    modification time is part of what an archive was built against)."""
    out = client_classes(version)
    jar = out.parent / f"{out.name}.jar"
    if jar.is_file():
        return jar
    tmp = out.parent / f".{out.name}.{os.getpid()}.jar"
    with zipfile.ZipFile(tmp, "w") as zf:
        for cls in sorted(out.rglob("*.class")):
            zf.write(cls, cls.relative_to(out).as_posix())
    try:
        os.link(tmp, jar)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return jar


# ---- class-data sharing -------------------------------------------------------------------
#
# Most of a RocketMQ JVM's start-up is reading, parsing and verifying classes from its jars.
# A dynamic CDS archive (JDK 13+), written at the exit of one run with the same JVM, options
# and classpath, maps those classes in ready-made: measured on this harness's JVMs (JDK 17),
# CPU to the ready line or to the end of a one-shot command down by ~20 % (NameServer,
# broker) to ~30 % (mqadmin, the test client). build_archives makes them (`make
# rocketmq-jars` calls it) under <cache>/rocketmq-VERSION/cds/, one per process kind, named
# by a hash of the JVM, the options and every classpath jar's size and time; nothing
# builds them during a test. A JVM is given its archive only when the stamp next to it
# names the archive's size (a truncated archive crashes a JDK 17 at start); an archive the
# JVM still finds unusable is ignored by its default -Xshare:auto, and -Xlog:cds*=off keeps
# its one-line warning out of the output the harness reads. ZNS_ROCKETMQ_CDS=0 turns them off.

CDS_ENV = "ZNS_ROCKETMQ_CDS"
CDS_KINDS = ("namesrv", "broker", "client", "tools")


def _cds_enabled() -> bool:
    return os.environ.get(CDS_ENV, "1").strip() not in ("0", "false", "no")


_cds_keys: dict[tuple[str, str, str, tuple[str, ...]], Path] = {}


def _cds_archive(kind: str, version: str, cp: str, heap: Sequence[str]) -> Path:
    """Where the archive for this JVM, options and classpath lives (whether or not it exists)."""
    memo = (kind, version, cp, tuple(heap))
    if memo not in _cds_keys:
        java_available()
        java = shutil.which("java") or "java"
        parts = [_java_version, os.path.realpath(java), kind, cp, *JVM_BASE, *heap]
        for entry in cp.split(os.pathsep):
            paths = sorted(Path(entry[:-1]).iterdir()) if entry.endswith("*") else [Path(entry)]
            for path in paths:
                st = path.stat()
                parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
        key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
        _cds_keys[memo] = fetch.cache_dir(version) / "cds" / f"{kind}-{key}.jsa"
    return _cds_keys[memo]


def _cds_args(kind: str, version: str, cp: str, heap: Sequence[str]) -> list[str]:
    if not _cds_enabled():
        return []
    try:
        jsa = _cds_archive(kind, version, cp, heap)
        if int(jsa.with_suffix(".size").read_text()) != jsa.stat().st_size:
            return []
    except (OSError, ValueError):
        return []
    return [f"-XX:SharedArchiveFile={jsa}", "-Xlog:cds*=off"]


def _cds_plan(version: str) -> dict[str, tuple[str, list[str]]]:
    """kind -> (classpath, heap), as the launchers above build them."""
    return {
        "namesrv": (classpath("namesrv", version), NAMESRV_HEAP),
        "broker": (classpath("broker", version), BROKER_HEAP),
        "client": (f"{client_jar(version)}{os.pathsep}{classpath('client', version)}", CLIENT_HEAP),
        "tools": (classpath("tools", version), CLIENT_HEAP),
    }


def _cds_install(kind: str, dump: Path, jsa: Path, cp: str, heap: Sequence[str]) -> str:
    """Check a freshly written archive with the JVM itself, then put it in place."""
    if not dump.is_file():
        return f"{kind}: no archive written"
    check = subprocess.run(
        ["java", *JVM_BASE, *heap, f"-XX:SharedArchiveFile={dump}", "-XX:+PrintSharedArchiveAndExit",
         "-cp", cp, "-version"], capture_output=True, text=True, timeout=120)
    if check.returncode != 0 or "archive is valid" not in check.stdout + check.stderr:
        dump.unlink()
        return f"{kind}: the JVM rejects its archive"
    for old in jsa.parent.glob(f"{kind}-*"):  # an older JVM's or jar set's
        old.unlink()
    size = dump.stat().st_size
    os.replace(dump, jsa)
    stamp = jsa.with_suffix(".size.tmp")
    stamp.write_text(f"{size}\n")
    os.replace(stamp, jsa.with_suffix(".size"))
    return f"{kind}: {size >> 20} MiB"


def build_archives(version: str = DEFAULT_VERSION) -> str:
    """Make the missing class-data archives of one version (a summary line).

    One training run per kind, each with ``-XX:ArchiveClassesAtExit``: a NameServer and a
    broker up to their ready lines (then SIGTERM, a normal exit), and ``clusterList``
    against them through the test client and through stock mqadmin. A file lock keeps
    concurrent builds apart. Failures only leave the archive out."""
    if not _cds_enabled():
        return f"{version}: class-data sharing off ({CDS_ENV}=0)"
    ensure_jars(version)
    plan = _cds_plan(version)
    folder = fetch.cache_dir(version) / "cds"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [kind for kind in CDS_KINDS if not _cds_args(kind, version, *plan[kind])]
        if not missing:
            return f"{version}: archives up to date"
        dumps = {kind: folder / f".{kind}.{os.getpid()}.jsa" for kind in missing}
        # On stderr (`make rocketmq-jars` hides stdout): the first run is minutes of silence.
        print(f"rocketmq-jars: building class-data archives for RocketMQ {version} "
              f"({', '.join(missing)}): a training run, about half a minute, once",
              file=sys.stderr, flush=True)

        def dump(kind: str) -> list[str]:
            return [f"-XX:ArchiveClassesAtExit={dumps[kind]}"] if kind in dumps else []

        work = Path(tempfile.mkdtemp(prefix="zns-cds-"))
        group = ProcessGroup(work)
        notes = []
        try:
            old = version.startswith("4.")
            ns = JavaNameServer(work / "namesrv", version=version, jvm_args=dump("namesrv")).start(wait=False)
            group.procs.append(ns)
            ns.wait_for_log(NAMESRV_READY_4X if old else NAMESRV_READY, 120)
            broker = Broker(work / "broker", ns.addr, version=version, jvm_args=dump("broker"))
            group.procs.append(broker)
            broker.start(timeout=120, registered=False)
            for kind, stock in (("client", False), ("tools", True)):
                if kind in dumps:
                    mqadmin(["clusterList"], ns.addr, stock=stock, workdir=work, version=version,
                            jvm_args=dump(kind), timeout=120)
            broker.stop(60)
            ns.stop(60)
        except (InteropError, OSError, subprocess.SubprocessError) as exc:
            notes.append(f"training run failed: {str(exc).splitlines()[0]}")
        finally:
            group.close()
        try:
            for kind in missing:
                notes.append(_cds_install(kind, dumps[kind], _cds_archive(kind, version, *plan[kind]), *plan[kind]))
        except (OSError, subprocess.SubprocessError) as exc:
            notes.append(f"install failed: {exc}")
        finally:
            for path in dumps.values():
                path.unlink(missing_ok=True)
            shutil.rmtree(work, ignore_errors=True)
        return f"{version}: " + "; ".join(notes)


# ---- processes ---------------------------------------------------------------------------

_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()


def _die_with_parent() -> None:
    """preexec_fn: the JVM gets SIGKILL when the test process goes away, however it goes.

    Linux ties this to the thread that started the child: start long-lived JVMs from the
    main thread (:func:`in_parallel` is for one-shot JVMs that end before their thread).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _spawn(cmd: Sequence[str], *, cwd: Path, stdout: Any, stderr: Any, env: dict[str, str] | None = None,
           stdin: Any = subprocess.DEVNULL) -> subprocess.Popen:
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, stdout=stdout, stderr=stderr, stdin=stdin,
        env=env, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    with _live_lock:
        _live.add(proc)
    return proc


def _forget(proc: subprocess.Popen) -> None:
    with _live_lock:
        _live.discard(proc)


def kill_all() -> None:
    """SIGKILL every JVM this module started that is still running (last-resort cleanup)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _forget(proc)


def live_pids() -> list[int]:
    with _live_lock:
        return [p.pid for p in _live if p.poll() is None]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-16384:].decode("utf-8", "replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


def _java_cmd(kind: str, heap: list[str], home: Path, *, extra_cp: str | None = None, jvm_args: Iterable[str] = (),
              version: str = DEFAULT_VERSION, cds: bool = False) -> list[str]:
    """The java command line up to the main class; `cds`: with this kind's class-data
    archive when one was built (see build_archives)."""
    cp = classpath(kind, version) if extra_cp is None else f"{extra_cp}{os.pathsep}{classpath(kind, version)}"
    return [
        "java", *JVM_BASE, *heap, *jvm_args, *(_cds_args(kind, version, cp, heap) if cds else ()),
        f"-Duser.home={home}",
        f"-Drocketmq.home.dir={home}",
        "-cp", cp,
    ]


class JavaProcess:
    """A long-lived RocketMQ JVM whose stdout and stderr go to ``workdir/console.log``."""

    kind = "java"

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.home = self.workdir / "home"
        self.console = self.workdir / "console.log"
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_after: float | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_dir(self) -> Path:
        """RocketMQ's own logs (broker.log, namesrv.log, ...)."""
        return self.home / "logs" / "rocketmqlogs"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _launch(self, cmd: list[str]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.workdir / "cmdline.txt").write_text(" ".join(cmd) + "\n")
        with open(self.console, "ab") as log:
            self.started_at = time.monotonic()
            self.proc = _spawn(cmd, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)

    def log_tail(self, lines: int = 40, log: str | None = None) -> str:
        path = self.console if log is None else self.log_dir / log
        return _tail(path, lines)

    def describe(self) -> str:
        return f"{self.kind} pid={self.pid} workdir={self.workdir}"

    def fail(self, what: str, log: str | None = None) -> InteropError:
        state = "running" if self.alive() else f"exited with {self.proc.returncode if self.proc else None}"
        return InteropError(f"{self.describe()} ({state}): {what}\n--- {log or 'console.log'} tail ---\n{self.log_tail(log=log)}")

    def wait_for_log(self, pattern: str | re.Pattern, timeout: float, log: str | None = None) -> re.Match:
        """Wait until a line of the console (or of a RocketMQ log file) matches; fail with the tail."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        path = self.console if log is None else self.log_dir / log
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = path.read_text("utf-8", "replace")
            except FileNotFoundError:
                text = ""
            m = rx.search(text)
            if m:
                return m
            if log is None and not self.alive():
                raise self.fail(f"exited before {rx.pattern!r} appeared", log)
            if time.monotonic() > deadline:
                raise self.fail(f"{rx.pattern!r} did not appear within {timeout:.0f} s", log)
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, no goodbye: the NameServer only learns from the closed connections."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        _forget(self.proc)

    def terminate(self) -> None:
        """SIGTERM: RocketMQ's shutdown hook runs (a broker unregisters first); returns at once."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM, wait up to `timeout` for the exit, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        self.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        _forget(self.proc)
        return self.proc.returncode


# RocketMQ 4.x reads its logging setup from $ROCKETMQ_HOME/conf/logback_<kind>.xml and exits
# without one (5.x ships rmq.<kind>.logback.xml inside its jars): a small file-only setup.
LOGBACK_4X = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${{user.home}}/logs/rocketmqlogs/{log}.log</file>
    <encoder><pattern>%d{{yyy-MM-dd HH:mm:ss,SSS}} %p %t - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""
NAMESRV_READY_4X = re.compile(r"The Name Server boot success\. serializeType=\w+")


class JavaNameServer(JavaProcess):
    """RocketMQ's own NameServer on 127.0.0.1 and a port the OS picks (``listenPort=0``).

    `version` picks the jars (tools/rocketmq/fetch.py's VERSIONS). A 4.x NameServer does
    not print its port, so it gets a free port chosen here, and a logback file of its own.
    """

    kind = "namesrv"

    def __init__(self, workdir: Path, *, port: int = 0, config: dict[str, Any] | None = None,
                 jvm_args: Iterable[str] = (), version: str = DEFAULT_VERSION) -> None:
        super().__init__(workdir)
        self.port = port
        self.config = dict(config or {})
        self.jvm_args = list(jvm_args)
        self.version = version

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0, wait: bool = True) -> JavaNameServer:
        """Launch; with `wait`, wait for the ready line. Without, the port is chosen here, so
        that `addr` is known at once (brokers can start while it boots; see wait_ready)."""
        ensure_jars(self.version)
        old = self.version.startswith("4.")
        if (old or not wait) and not self.port:
            self.port = pick_broker_port()  # a free port below the ephemeral range
        conf = {"listenPort": self.port, "bindAddress": "127.0.0.1", **self.config}
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf_path = self.workdir / "namesrv.conf"
        conf_path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        if old:
            (self.home / "conf").mkdir(parents=True, exist_ok=True)
            (self.home / "conf" / "logback_namesrv.xml").write_text(LOGBACK_4X.format(log="namesrv"))
        cmd = _java_cmd("namesrv", NAMESRV_HEAP, self.home, jvm_args=self.jvm_args, version=self.version, cds=True)
        self._launch([*cmd, NAMESRV_MAIN, "-c", str(conf_path)])
        return self.wait_ready(timeout) if wait else self

    def wait_ready(self, timeout: float = 60.0) -> JavaNameServer:
        """The ready line, then a first request answered (see :meth:`wait_serving`)."""
        deadline = time.monotonic() + timeout
        m = self.wait_for_log(NAMESRV_READY_4X if self.version.startswith("4.") else NAMESRV_READY, timeout)
        if not self.version.startswith("4."):
            self.port = int(m.group(2))
        self.wait_serving(max(deadline - time.monotonic(), 10.0))
        self.ready_after = time.monotonic() - self.started_at
        return self

    def wait_serving(self, timeout: float) -> None:
        """Until the NameServer has answered a request over remoting (GET_NAMESRV_CONFIG).

        The ready line comes before the first request was ever served, and a fresh
        NameServer's first answer costs it most of its request path's set-up (class
        loading, fastjson's generated codecs): on a loaded 2-core machine over 5 s, measured,
        which is all of a stock mqadmin command's RPC budget (DefaultMQAdminExt: 5 s from
        before its own connect). So the first answer is waited for here, with a deadline
        of its own, and no client's budget pays for it.
        """
        from differential import RemotingConnection, request  # the remoting codec (zns's), lazily

        try:
            conn = RemotingConnection(self.addr, timeout=timeout)
        except OSError as exc:
            raise self.fail(f"no remoting connection: {exc}") from exc
        try:
            reply = conn.call(request(319))
        except OSError as exc:
            raise self.fail(f"no answer to GET_NAMESRV_CONFIG within {timeout:.0f} s: {exc}") from exc
        finally:
            conn.close()
        if reply.code != 0:
            raise self.fail(f"GET_NAMESRV_CONFIG answered {reply.code} {reply.remark}")


def _port_free(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_port_lock = threading.Lock()
_ports_handed_out: set[int] = set()


def pick_broker_port(low: int = 20000, high: int = 32000) -> int:
    """A listenPort whose fast port (listenPort-2) and HA port (listenPort+1) are free too.

    Chosen below Linux's ephemeral range so that outgoing connections do not take them
    between the check and the broker's bind; ports already handed out are not reused.
    """
    with _port_lock:
        for _ in range(500):
            p = random.randrange(low + 2, high - 1)
            trio = (p - 2, p, p + 1)
            if any(q in _ports_handed_out for q in (p - 2, p - 1, p, p + 1)):
                continue
            if all(_port_free(q, "127.0.0.1") for q in trio) and _port_free(p + 1, "0.0.0.0"):
                _ports_handed_out.update(trio)
                return p
    raise InteropError("no free port trio for a broker")


class Broker(JavaProcess):
    """A RocketMQ 5.3.3 broker (master) with a small store, registered with `namesrv`.

    `namesrv` may list several NameServers, ``"a:1;b:2"``. `config` adds or overrides
    broker.conf lines (e.g. ``{"registerNameServerPeriod": 10000}``).
    """

    kind = "broker"

    def __init__(self, workdir: Path, namesrv: str, *, name: str = "broker-a", cluster: str = "DefaultCluster",
                 broker_id: int = 0, port: int | None = None, config: dict[str, Any] | None = None,
                 jvm_args: Iterable[str] = (), version: str = DEFAULT_VERSION) -> None:
        super().__init__(workdir)
        self.version = version
        self.namesrv = namesrv
        self.name = name
        self.cluster = cluster
        self.broker_id = broker_id
        self.port = port
        self.config = dict(config or {})
        self.jvm_args = list(jvm_args)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def fast_port(self) -> int:
        assert self.port is not None
        return self.port - 2

    @property
    def ha_port(self) -> int:
        assert self.port is not None
        return self.port + 1

    def describe(self) -> str:
        return f"broker {self.name} ({self.addr}) pid={self.pid} workdir={self.workdir}"

    def broker_conf(self) -> dict[str, Any]:
        store = self.workdir / "store"
        return {
            "brokerClusterName": self.cluster,
            "brokerName": self.name,
            "brokerId": self.broker_id,
            "namesrvAddr": self.namesrv,
            "brokerIP1": "127.0.0.1",
            "brokerIP2": "127.0.0.1",
            "bindAddress": "127.0.0.1",
            "listenPort": self.port,
            "haListenPort": self.ha_port,
            "storePathRootDir": store,
            "storePathCommitLog": store / "commitlog",
            "autoCreateTopicEnable": "true",
            # A small store: 64 MiB commit log files, small consume queues and index.
            "mappedFileSizeCommitLog": 64 * 1024 * 1024,
            "mappedFileSizeConsumeQueue": 600000,
            "maxHashSlotNum": 50000,
            "maxIndexNum": 200000,
            "diskSpaceWarningLevelRatio": 95,
            # A busy 2-core machine must not turn sends into "broker busy" rejections.
            "waitTimeMillsInSendQueue": 3000,
            # The broker's client (5.x) registers only with NameServers a background scan has
            # connected to, and that scan runs every connectTimeoutMillis (3 s by default),
            # first before the NameServer list is set: the registration at start then often
            # finds none, and the first one is the periodic one, 10 s later (2 starts in 3
            # on a quiet machine). A scan every 0.5 s connects in time (1 s still missed 1 in
            # 3); a loopback connect needs far less than its timeout.
            "connectTimeoutMillis": 500,
            **self.config,
        }

    def start(self, timeout: float = 90.0, wait: bool = True, registered: bool = True) -> Broker:
        """Launch; with `wait`, wait for the ready line and (with `registered`) for a completed
        registration with every NameServer in `namesrv` (see :meth:`wait_registered`)."""
        ensure_jars(self.version)
        if self.version.startswith("4."):  # 4.x reads its logging setup from ROCKETMQ_HOME/conf
            (self.home / "conf").mkdir(parents=True, exist_ok=True)
            (self.home / "conf" / "logback_broker.xml").write_text(LOGBACK_4X.format(log="broker"))
        for attempt in range(3):
            if self.port is None or attempt > 0:
                self.port = pick_broker_port()
            self.workdir.mkdir(parents=True, exist_ok=True)
            conf_path = self.workdir / "broker.conf"
            conf_path.write_text("".join(f"{k}={v}\n" for k, v in self.broker_conf().items()))
            cmd = _java_cmd("broker", BROKER_HEAP, self.home, jvm_args=self.jvm_args, version=self.version,
                           cds=True)
            self._launch([*cmd, BROKER_MAIN, "-c", str(conf_path)])
            if not wait:
                return self
            try:
                self.wait_ready(timeout, registered=registered)
                return self
            except InteropError:
                if self.alive() or "Address already in use" not in self.log_tail(200):
                    raise
                self.kill()  # lost a port race; pick another trio
        raise self.fail("could not bind a free port trio in 3 attempts")

    def wait_ready(self, timeout: float = 90.0, registered: bool = True) -> Broker:
        self.wait_for_log(BROKER_READY, timeout)
        self.ready_after = time.monotonic() - self.started_at
        if registered:
            self.wait_registered(timeout=30.0)
        return self

    def wait_registered(self, namesrv: str | None = None, timeout: float = 30.0, count: int = 1) -> None:
        """Wait until `count` registrations with each NameServer (default: all of `namesrv`) completed.

        The ready line does not prove a registration: the broker registers at start only
        with the NameServers its client has already connected to (a background scan), so
        on a busy machine the first registration can be the periodic one, 10 s later.
        A registration that the NameServer refuses is logged as a failure, not counted.
        """
        addrs = [a.strip() for a in (namesrv or self.namesrv).split(";") if a.strip()]
        deadline = time.monotonic() + timeout
        for addr in addrs:
            if self.version.startswith("4."):  # BrokerOuterAPI's line in 4.x
                rx = re.compile(r"register broker\[\d+\]to name server " + re.escape(addr) + r" OK")
            else:
                rx = re.compile(r"Registering current broker to name server completed\. TargetHost="
                                + re.escape(addr) + r"\b")
            while True:
                try:
                    text = (self.log_dir / "broker.log").read_text("utf-8", "replace")
                except FileNotFoundError:
                    text = ""
                if len(rx.findall(text)) >= count:
                    break
                if not self.alive():
                    raise self.fail(f"exited before registering with {addr}", "broker.log")
                if time.monotonic() > deadline:
                    raise self.fail(f"no completed registration with {addr} within {timeout:.0f} s", "broker.log")
                time.sleep(0.1)

    def wait_unregistered(self, namesrv: str | None = None, timeout: float = 15.0) -> None:
        """After SIGTERM: wait until the broker has unregistered from each NameServer.

        The shutdown hook sends UNREGISTER_BROKER to the NameServers one after the other,
        first thing; a refused or failed one is logged and fails this wait at once.
        """
        addrs = [a.strip() for a in (namesrv or self.namesrv).split(";") if a.strip()]
        deadline = time.monotonic() + timeout
        for addr in addrs:
            ok = re.compile(r"unregisterBroker OK, NamesrvAddr: " + re.escape(addr) + r"\b")
            bad = re.compile(r"unregisterBroker Exception, NamesrvAddr: " + re.escape(addr) + r"\b")
            while True:
                try:
                    text = (self.log_dir / "broker.log").read_text("utf-8", "replace")
                except FileNotFoundError:
                    text = ""
                if ok.search(text):
                    break
                if bad.search(text):
                    raise self.fail(f"unregistering from {addr} failed", "broker.log")
                if time.monotonic() > deadline:
                    raise self.fail(f"did not unregister from {addr} within {timeout:.0f} s", "broker.log")
                time.sleep(0.05)

    def shutdown(self, timeout: float = 30.0, wait_exit: bool = False) -> int | None:
        """Graceful stop (SIGTERM). The broker unregisters from every NameServer within a
        fraction of a second, then spends 10-20 s stopping its services. Waits for the
        unregistrations, or with `wait_exit` for the exit (SIGKILL after `timeout`)."""
        if wait_exit:
            return self.stop(timeout)
        self.terminate()
        self.wait_unregistered(timeout=timeout)
        return None


class ProcessGroup:
    """Starts NameServers and brokers under one folder; close() kills whatever is left.

    Use one per test or per module (see tests/interop/conftest.py).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.procs: list[JavaProcess] = []
        self._n = 0

    def _dir(self, label: str) -> Path:
        self._n += 1
        return self.root / f"{self._n:02d}-{label}"

    def namesrv(self, *, wait: bool = True, **kw: Any) -> JavaNameServer:
        ns = JavaNameServer(self._dir("namesrv"), **kw)
        self.procs.append(ns)
        return ns.start(wait=wait)

    def broker(self, namesrv: str, name: str = "broker-a", *, wait: bool = True, registered: bool = True,
               **kw: Any) -> Broker:
        b = Broker(self._dir(name), namesrv, name=name, **kw)
        self.procs.append(b)
        return b.start(wait=wait, registered=registered)

    def brokers(self, namesrv: str, names: Sequence[str], *, registered: bool = True, **kw: Any) -> list[Broker]:
        """Start several brokers in parallel (their JVM start-ups overlap) and wait for all."""
        started = [self.broker(namesrv, name, wait=False, **kw) for name in names]
        for b in started:
            b.wait_ready(registered=registered)
        return started

    def close(self) -> None:
        for p in reversed(self.procs):
            p.kill()
        self.procs.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- one-shot JVMs --------------------------------------------------------------------------

class Result(NamedTuple):
    rc: int
    stdout: str
    stderr: str


_scratch: Path | None = None


def set_scratch_dir(path: Path) -> None:
    """Where one-shot JVMs (mqadmin, produce, ...) keep their logs when no workdir is given."""
    global _scratch
    _scratch = Path(path)
    _scratch.mkdir(parents=True, exist_ok=True)


def _scratch_dir() -> Path:
    global _scratch
    if _scratch is None:
        _scratch = Path(tempfile.mkdtemp(prefix="zns-interop-"))
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


def _run_oneshot(cmd: list[str], workdir: Path | None, label: str, timeout: float) -> Result:
    workdir = Path(workdir) if workdir else _scratch_dir()
    run_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=workdir))
    (run_dir / "cmdline.txt").write_text(" ".join(cmd) + "\n")
    out_path, err_path = run_dir / "stdout.log", run_dir / "stderr.log"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = _spawn(cmd, cwd=run_dir, stdout=out, stderr=err)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
            raise InteropError(f"{label} did not finish within {timeout:.0f} s ({run_dir})\n--- stdout tail ---\n"
                               f"{_tail(out_path)}\n--- stderr tail ---\n{_tail(err_path)}") from None
        finally:
            _forget(proc)
    return Result(rc, out_path.read_text("utf-8", "replace"), err_path.read_text("utf-8", "replace"))


def _client_cmd(home: Path, jvm_args: Iterable[str] = (), version: str = DEFAULT_VERSION) -> list[str]:
    return _java_cmd(
        "client", CLIENT_HEAP, home, extra_cp=str(client_jar(version)), version=version, cds=True,
        jvm_args=[
            # The push consumer rebalances every 20 s by default; tests cannot wait that long.
            "-Drocketmq.client.rebalance.waitInterval=1000",
            "-Drocketmq.client.localIP=127.0.0.1",
            *jvm_args,
        ],
    )


def mqadmin(args: Sequence[str], namesrv: str | None, *, timeout: float = 60.0, stock: bool = False,
            workdir: Path | None = None, version: str = DEFAULT_VERSION, jvm_args: Iterable[str] = ()) -> Result:
    """Run an mqadmin subcommand, e.g. ``mqadmin(["clusterList"], ns.addr)``; adds ``-n namesrv``.

    By default `version`'s stock MQAdminStartup command runs inside ZnsInteropClient
    (compiled for that version), which first waits until each NameServer of ``-n`` has
    answered it once (see awaitNameServers there) and halts the JVM once the command
    returns: the stock launcher lingers ~3 s in Netty's graceful shutdown. ``stock=True``
    runs ``MQAdminStartup`` itself as the main class, on the tools classpath. mqadmin's
    exit code is 0 even for most failures: check the output.
    """
    argv = list(args)
    if namesrv is not None:
        argv += ["-n", namesrv]
    workdir = Path(workdir) if workdir else _scratch_dir()
    home = workdir / "mqadmin-home"
    ensure_jars(version)
    if version.startswith("4."):  # 4.x reads its logging setup from ROCKETMQ_HOME/conf
        (home / "conf").mkdir(parents=True, exist_ok=True)
        (home / "conf" / "logback_tools.xml").write_text(LOGBACK_4X.format(log="tools"))
    if stock:
        cmd = [*_java_cmd("tools", CLIENT_HEAP, home, version=version, jvm_args=jvm_args, cds=True), MQADMIN_MAIN, *argv]
    else:  # that version's own command classes (its client classpath holds rocketmq-tools)
        cmd = [*_client_cmd(home, jvm_args, version=version), CLIENT_MAIN, "mqadmin", *argv]
    return _run_oneshot(cmd, workdir, f"mqadmin-{argv[0] if argv else 'help'}", timeout)


def run_client(mode: str, namesrv: str, topic: str, *, process_timeout: float = 120.0, workdir: Path | None = None,
               version: str = DEFAULT_VERSION, **options: Any) -> tuple[Result, dict[str, Any]]:
    """Run one ZnsInteropClient mode on `version`'s client jars; returns the raw result and its
    last JSON line.

    `options` become ``--name value`` arguments (``run_id`` -> ``--run-id``): group,
    run_id, send_timeout, retries, poll_ms, heartbeat_ms, api_timeout, body_size, ...
    """
    workdir = Path(workdir) if workdir else _scratch_dir()
    argv = [mode, "--namesrv", namesrv, "--topic", topic]
    for key, value in options.items():
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    cmd = [*_client_cmd(workdir / "client-home", version=version), CLIENT_MAIN, *argv]
    res = _run_oneshot(cmd, workdir, f"client-{mode}", process_timeout)
    summary: dict[str, Any] = {}
    for line in reversed(res.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            summary = json.loads(line)
            break
    if not summary:
        raise InteropError(f"client {mode} printed no JSON (rc={res.rc})\n--- stdout ---\n{res.stdout[-3000:]}"
                           f"\n--- stderr ---\n{res.stderr[-3000:]}")
    return res, summary


def produce(namesrv: str, topic: str, count: int, **kw: Any) -> dict[str, Any]:
    """Send `count` messages synchronously; the summary has sent, failed, brokers, errors, run_id."""
    kw.setdefault("process_timeout", 60 + count * 0.1)
    return run_client("produce", namesrv, topic, count=count, **kw)[1]


def consume(namesrv: str, topic: str, count: int, timeout: float = 30.0, **kw: Any) -> dict[str, Any]:
    """Push-consume until `count` distinct keys arrived or `timeout`; pass run_id= to count only one run."""
    kw.setdefault("process_timeout", timeout + 60)
    return run_client("consume", namesrv, topic, count=count, timeout=timeout, **kw)[1]


def route(namesrv: str, topic: str, **kw: Any) -> dict[str, Any]:
    """The topic's TopicRouteData as plain JSON ({"ok": false, "code": 17, ...} when absent)."""
    return run_client("route", namesrv, topic, **kw)[1]


def in_parallel(*calls: Callable[[], Any]) -> list[Any]:
    """Run one-shot helpers (mqadmin, route, produce, ...) side by side; results in order.

    Their JVMs mostly wait (start-up I/O, Netty's shutdown poll), so two or three at once
    cost little more than one. The first exception is raised after all have finished.
    """
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for exc in errors:
        if exc is not None:
            raise exc
    return results


class ProduceLoop:
    """A producer JVM sending at `rate` per second for `duration` seconds (or until :meth:`stop`),
    one JSON line per send.

    ``lines`` fills as the sends happen (each with ``seq``, ``t_ms``, ``ok``, ``broker``,
    ``error``, plus ``at``: the harness's monotonic clock when the line arrived).
    """

    def __init__(self, namesrv: str, topic: str, *, duration: float, rate: float = 20.0,
                 workdir: Path | None = None, **options: Any) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="produce-loop-", dir=workdir or _scratch_dir()))
        argv = ["produce-loop", "--namesrv", namesrv, "--topic", topic, "--duration", str(duration), "--rate", str(rate)]
        for key, value in options.items():
            if value is not None:
                argv += [f"--{key.replace('_', '-')}", str(value)]
        self.cmd = [*_client_cmd(self.workdir / "home"), CLIENT_MAIN, *argv]
        self.duration = duration
        self.lines: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None
        self._cond = threading.Condition()
        self._stderr = self.workdir / "stderr.log"
        self._stdout_copy = self.workdir / "stdout.log"
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> ProduceLoop:
        (self.workdir / "cmdline.txt").write_text(" ".join(self.cmd) + "\n")
        with open(self._stderr, "wb") as err:
            self.proc = _spawn(self.cmd, cwd=self.workdir, stdout=subprocess.PIPE, stderr=err,
                               stdin=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self._stdout_copy, "wb") as copy:
            for raw in self.proc.stdout:
                copy.write(raw)
                copy.flush()
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                obj["at"] = time.monotonic()
                with self._cond:
                    if obj.get("summary"):
                        self.summary = obj
                    elif "seq" in obj:
                        self.lines.append(obj)
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def sends(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self.lines)

    def wait_until(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.lines):
                if self.proc is not None and self.proc.poll() is not None and (self._reader is None or not self._reader.is_alive()):
                    raise self._fail(f"exited before: {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(f"not within {timeout:.0f} s: {what}")
                self._cond.wait(min(left, 0.5))

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the loop to end by itself; return its summary line."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout if timeout is not None else self.duration + 60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self._fail("did not finish in time") from None
        if self._reader:
            self._reader.join(timeout=10)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        _forget(self.proc)
        if self.summary is None:
            raise self._fail(f"no summary line (exit {self.proc.returncode})")
        return self.summary

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        """End the loop now (a "stop" line on its stdin) instead of at its duration; its summary."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it ended by itself: wait() reports how
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            _forget(self.proc)

    def _fail(self, what: str) -> InteropError:
        last = self.lines[-5:]
        return InteropError(f"produce-loop {what}\nlast sends: {last}\n--- stderr tail ({self._stderr}) ---\n"
                            f"{_tail(self._stderr)}")

    def __enter__(self) -> ProduceLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


if __name__ == "__main__":  # `make rocketmq-jars`: the class-data archives of every version
    for v in sys.argv[1:] or VERSIONS:
        try:
            print(build_archives(v))
        except InteropUnavailable as exc:
            print(f"{v}: no archives: {exc}")

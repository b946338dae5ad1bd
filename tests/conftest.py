"""Shared fixtures: a NameServer on ephemeral ports, in a thread or a subprocess.

The helpers they use, and that tests import, are in tests/helpers.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import helpers
from zns.drivers.logs import RepeatFilter
from helpers import (  # noqa: F401  (re-exported for modules that import them from here)
    LOADED_DEADLINE, MUTATION, Peer, ProcessServer, SplitServer, ThreadedServer, examples,
    register_fields, wait_for,
)

SERVER_FIXTURES = {"server", "make_server", "process_server", "rocketmq_env", "rmq", "rmq_module"}


# The test files that take longest (JVMs, subprocesses, fuzz budgets), longest first, from
# per-file times of a full run (redone after test_worker_attacks grew to about 70-90 s: it was
# not listed, so it was handed out last and ran alone for its last ~70 s, three workers idle;
# worth redoing when a file's time changes much). `make test` runs files whole on four workers
# (--dist loadfile, --no-loadscope-reorder): a long file handed out last keeps one worker busy
# while the others idle, and xdist's own order (most tests first) handed these out last, since
# most have one to seven tests. The list only orders the run; a file missing from it runs after
# these.
LONGEST_FIRST = [
    "test_bench_smoke.py", "interop/test_agent.py", "interop/test_java_nameserver.py",
    "interop/test_zns_nameserver.py", "test_peers.py", "test_worker_attacks.py",
    "interop/test_differential.py", "interop/test_warm_restart_rocketmq.py",
    "test_server_hardening.py", "interop/test_agent_events.py", "interop/test_fidelity_brokers.py",
    "test_workers_ops.py", "test_remoting_listener.py", "test_workers_differential.py",
    "interop/test_version_matrix.py", "test_workers_serve.py", "test_peer_resets.py",
    "test_idle_cpu.py", "test_followers.py", "test_broker_agent.py", "test_peers_hostile.py", "test_faults.py",
    "test_server.py", "test_metrics.py", "test_doc_blocks.py", "test_events.py", "test_demos.py",
    "test_relay_forwarding.py", "test_loop.py", "test_soak_smoke.py", "interop/test_operator.py",
    "interop/test_audit_mqadmin.py", "test_fuzz.py", "test_remoting_fuzz.py",
]


def longest_first(items: list[pytest.Item]) -> None:
    """LONGEST_FIRST's files first, then the rest by number of tests (xdist's own order); the
    sort is stable, so each file's tests keep their order."""
    tests_dir = Path(__file__).resolve().parent
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    files = [item.path.relative_to(tests_dir).as_posix() if item.path.is_relative_to(tests_dir)
             else str(item.path) for item in items]
    count: dict[str, int] = {}
    for name in files:
        count[name] = count.get(name, 0) + 1
    order = {id(item): (rank.get(name, len(rank)), -count[name])
             for item, name in zip(items, files)}
    items.sort(key=lambda item: order[id(item)])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    longest_first(items)
    # A module of zns/drivers or zns/cli is mutated with its socket tests (tools/mutate.py).
    if not MUTATION or os.environ.get("ZNS_MUTATION_SOCKETS") == "1":
        return
    deselected = [item for item in items if SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.fixture(autouse=True)
def _forget_repeated_log_lines() -> None:
    """Each test starts without the 'zns' logger's repeat filter: a server made by an earlier
    test in the same worker installed one, and its counts would suppress this test's lines,
    or add a 'more warnings like' summary to them (zns.drivers.logs). A server made in this
    test installs a fresh one."""
    logger = logging.getLogger("zns")
    for existing in list(logger.filters):
        if isinstance(existing, RepeatFilter):
            logger.removeFilter(existing)


@pytest.fixture
def serve_in_process(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[Any, Any]]:
    """`run(*ARGS, env=ENV)` runs `zns serve ARGS` in process with env ENV and no other ZNS_
    variable, its server (Server, or StateProcess for --workers 1 or more) replaced by one
    that only keeps its configuration: (click's result, the ServerConfig it was given, or
    None when the command refused before making a server)."""
    import zns.cli.serve
    from click.testing import CliRunner
    from zns.cli import main as zns_main

    for name in [n for n in os.environ if n.startswith("ZNS_")]:
        monkeypatch.delenv(name)
    configs: list[Any] = []

    class Captured:
        def __init__(self, config: Any) -> None:
            configs.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr(zns.cli.serve, "Server", Captured)
    monkeypatch.setattr(zns.cli.serve, "StateProcess", Captured)

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[Any, Any]:
        configs.clear()
        result = CliRunner().invoke(zns_main, ["serve", *args], env=env or {})
        assert len(configs) <= 1, configs
        return result, (configs[0] if configs else None)

    return run


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context of the test's own, destroyed after it with whatever sockets it left."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "single_process(why): the test's servers are "
                            "ThreadedServers (one process, in a thread: internals readable, clock "
                            "injectable), not zns serve with its default workers; say why")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures (a module's too): may it build a ThreadedServer, and why."""
    marker = item.get_closest_marker("single_process")
    helpers.SINGLE_PROCESS_REASON = marker.args[0] if marker else None
    if marker is not None:
        assert marker.args and marker.args[0], "single_process needs its reason"


Server = SplitServer | ThreadedServer


def _make(request: pytest.FixtureRequest, tmp_path: Path, **overrides: Any) -> Server:
    """`zns serve` with its default workers; a ThreadedServer for a test marked
    single_process (server_kwargs, such as an injected clock, need one), and under mutation
    testing (helpers.served)."""
    if request.node.get_closest_marker("single_process") or MUTATION:
        return ThreadedServer(tmp_path, **overrides)
    return SplitServer(tmp_path, **overrides)


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    srv = _make(request, tmp_path)
    yield srv
    srv.stop()


@pytest.fixture
def make_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    servers: list[Server] = []

    def make(**overrides: Any) -> Server:
        srv = _make(request, tmp_path / f"s{len(servers)}", **overrides)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def process_server(tmp_path: Path) -> Iterator[Callable[..., ProcessServer]]:
    started: list[ProcessServer] = []

    def start(*args: str, kv_path: Path | None = None) -> ProcessServer:
        # Each running NameServer has a KV file and a state dump of its own (one zns per
        # file: the second would be refused, zns.drivers.file_lock), in a directory of its
        # own; a restarted one takes its predecessor's.
        default = tmp_path / "kv.json"
        if kv_path is None and any(s.kv_path == default and s.proc.poll() is None
                                   for s in started):
            kv_path = tmp_path / f"server-{len(started)}" / "kv.json"
            kv_path.parent.mkdir()
        srv = ProcessServer(tmp_path, *args, kv_path=kv_path)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        try:
            # SIGTERM first: a --supervise parent killed outright leaves its serving child
            # running (a test that failed left one behind); SIGKILL if it does not stop.
            srv.stop()
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait(15)
            srv.log.close()


# ---- interop: the real Apache RocketMQ 5.3.3 JVMs (see tests/interop/README.md) ----------------
# The fixtures live here, not in a tests/interop/conftest.py: a second conftest module would
# shadow this one (test modules import their helpers with `from helpers import ...`). The
# harness is imported under one name, `rocketmq`, by these fixtures and by the tests alike.
sys.path.insert(0, str(Path(__file__).resolve().parent / "interop"))
import rocketmq  # noqa: E402


@pytest.fixture(scope="session")
def rocketmq_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The jars are cached and ZnsInteropClient is compiled; at session end no JVM is left.

    Skips (reason "no JDK/Maven: ...") when that is impossible; with ZNS_REQUIRE_INTEROP=1
    (CI sets it) it fails instead.
    """
    rocketmq.set_scratch_dir(tmp_path_factory.mktemp("rmq-oneshot"))
    with rocketmq.unavailable_skips():
        rocketmq.ensure_jars()
        rocketmq.client_classes()
    yield
    rocketmq.kill_all()


@pytest.fixture(scope="module")
def rmq_module(rocketmq_env: None, tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[rocketmq.ProcessGroup]:
    """NameServers and brokers shared by one test module; all killed after its last test."""
    group = rocketmq.ProcessGroup(tmp_path_factory.mktemp(f"rmq-{request.module.__name__}"))
    yield group
    group.close()


@pytest.fixture
def rmq(rocketmq_env: None, tmp_path: Path) -> Iterator[rocketmq.ProcessGroup]:
    """NameServers and brokers for one test; all killed when it ends."""
    group = rocketmq.ProcessGroup(tmp_path / "rmq")
    yield group
    group.close()

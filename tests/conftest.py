"""Shared fixtures: a NameServer on ephemeral ports, in a thread or a subprocess.

The helpers they use, and that tests import, are in tests/helpers.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import (  # noqa: F401  (re-exported for modules that import them from here)
    LOADED_DEADLINE, MUTATION, Peer, ProcessServer, ThreadedServer, examples, register_fields,
    wait_for,
)

SERVER_FIXTURES = {"server", "make_server", "process_server", "rocketmq_env", "rmq", "rmq_module"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A module of zns/drivers or zns/cli is mutated with its socket tests (tools/mutate.py).
    if not MUTATION or os.environ.get("ZNS_MUTATION_SOCKETS") == "1":
        return
    deselected = [item for item in items if SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadedServer]:
    srv = ThreadedServer(tmp_path)
    yield srv
    srv.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., ThreadedServer]]:
    servers: list[ThreadedServer] = []

    def make(**overrides: Any) -> ThreadedServer:
        srv = ThreadedServer(tmp_path / f"s{len(servers)}", **overrides)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def process_server(tmp_path: Path) -> Iterator[Callable[..., ProcessServer]]:
    started: list[ProcessServer] = []

    def start(*args: str, kv_path: Path | None = None) -> ProcessServer:
        srv = ProcessServer(tmp_path, *args, kv_path=kv_path)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        if srv.proc.poll() is None:
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

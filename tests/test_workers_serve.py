"""`zns serve --workers N`: one state process, N worker processes (zns.drivers.state_process,
zns.drivers.worker), driven over real sockets."""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from zns.core import schema
from helpers import LOADED_DEADLINE, Peer, ProcessServer, register_fields, wait_for

pytestmark = pytest.mark.timeout(120)


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def listening_inodes() -> set[str]:
    """Socket inodes of every listening TCP socket on the host (state 0A)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                found.add(fields[9])
    return found


def socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if m := re.fullmatch(r"socket:\[(\d+)\]", target):
            found.add(m.group(1))
    return found


def peer_on_worker(server: ProcessServer, worker: int, ctx: zmq.Context, tries: int = 200) -> Peer:
    """A Peer whose request connection landed on worker `worker` (status says which)."""
    for _ in range(tries):
        peer = Peer(server.router, server.pub, ctx)
        if peer.ok("status").worker == worker:
            return peer
        peer.close()
    raise AssertionError(f"no connection landed on worker {worker} in {tries} tries")


@pytest.fixture
def ctx() -> Any:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_the_state_process_listens_nowhere_and_its_workers_answer(tmp_path: Path, ctx: Any) -> None:
    server = ProcessServer(tmp_path, "--workers", "2", "--heartbeat-interval", "0.2")
    try:
        wait_for(lambda: len(children(server.proc.pid)) == 2 and
                 server.output().count("serving requests on") == 2)
        listening = listening_inodes()
        assert not socket_inodes(server.proc.pid) & listening  # the state process: no port
        for pid in children(server.proc.pid):
            assert socket_inodes(pid) & listening  # each worker listens
        workers = set()
        for _ in range(60):
            peer = Peer(server.router, server.pub, ctx)
            workers.add(peer.ok("status").worker)
            peer.close()
        assert workers == {1, 2}
        a, b = peer_on_worker(server, 1, ctx), peer_on_worker(server, 2, ctx)
        a.ok("register_broker", **register_fields(topics={"T": {}}))
        # Read-your-writes on the writer's worker, and the other worker has it once it
        # saw the event.
        assert a.ok("get_route", topic="T").route.brokers[0].broker_name == "broker-a"
        b.subscribe(b"route\0")
        wait_for(lambda: not isinstance(b.call("get_route", topic="T"), schema.Error))
    finally:
        assert server.stop() == 0
    assert not [pid for pid in children_or_none(server.proc.pid)]


def children_or_none(pid: int) -> list[int]:
    try:
        return children(pid)
    except OSError:
        return []

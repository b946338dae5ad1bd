"""`zns serve --workers N`: one state process, N worker processes (zns.drivers.state_process,
zns.drivers.worker), driven over real sockets."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from zns.core import schema
from zns.core.config import MAX_CPU, ServerConfig
from zns.core.pairing import MAX_QUIET_SAMPLES, QUIET_SAMPLES
from zns.drivers import cpus
from helpers import (
    LOADED_DEADLINE, Peer, ProcessServer, register_fields, register_until, wait_for,
)

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


def worker_pid(server: ProcessServer, worker: int) -> int:
    """The pid of the live worker `worker` (its last start line in the log)."""
    pids = re.findall(rf"worker {worker}: loaded the state at seq \d+ \(pid (\d+)\)",
                      server.output())
    return int(pids[-1])


def sub_on_worker(server: ProcessServer, worker: int, ctx: zmq.Context, tries: int = 50) -> Peer:
    """A Peer whose events connection landed on worker `worker`: with every other worker
    stopped (SIGSTOP), its `hb` events still arrive."""
    others = [worker_pid(server, w) for w in range(1, 3) if w != worker]
    for _ in range(tries):
        peer = Peer(server.router, server.pub, ctx)
        peer.subscribe(schema.HB_CHANNEL)
        peer.wait_subscribed()
        if hears_with_others_stopped(peer, others):
            return peer
        peer.close()
    raise AssertionError(f"no events connection landed on worker {worker} in {tries} tries")


def hears_with_others_stopped(peer: Peer, others: list[int]) -> bool:
    """Whether `peer`'s events connection is on the worker left running: with the workers
    `others` stopped (SIGSTOP), `hb` events still arrive (it subscribed to them)."""
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert peer.sub is not None
        while peer.sub.poll(0):
            peer.sub.recv_multipart()
        return bool(peer.sub.poll(1000))
    finally:
        for pid in others:
            os.kill(pid, signal.SIGCONT)



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
        b.subscribe(b"route/")
        wait_for(lambda: not isinstance(b.call("get_route", topic="T"), schema.Error))
        # An admin write's audit line is logged once, by the worker that has the sender.
        a.ok("kv_put", namespace="ns", key="k", value="v")
        wait_for(lambda: "audit:" in server.output())
        audits = [line for line in server.output().splitlines() if "audit:" in line]
        assert len(audits) == 1 and "worker 1: audit: " in audits[0], audits
        assert " by '127.0.0.1': " in audits[0]  # the sender's address, as one process says
        # Said once, as a single process says it (`make run` shows where the store is).
        assert server.output().count(f"KV store in {server.kv_path}, kept across restarts") == 1
    finally:
        assert server.stop() == 0
    assert not [pid for pid in children_or_none(server.proc.pid)]


def open_files(pid: int) -> set[str]:
    """What each descriptor of `pid` names (a path, socket:[inode], ...)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue  # closed meanwhile
    return found


def test_a_worker_holds_no_descriptor_of_the_kv_file(tmp_path: Path, ctx: Any) -> None:
    """The KV log is the state process's to write: a worker forked after it was opened
    must not keep it (and so the log a compaction replaced) open for as long as it lives."""
    server = ProcessServer(tmp_path, "--workers", "1", kv_path=tmp_path / "kv.log")
    try:
        peer = Peer(server.router, server.pub, ctx)
        peer.ok("kv_put", namespace="ns", key="k", value="v")
        peer.close()
        kv_file = str(server.kv_path)
        assert kv_file in open_files(server.proc.pid)  # the state process appends to it
        first = worker_pid(server, 1)
        os.kill(first, signal.SIGKILL)  # its replacement is forked with the log open
        wait_for(lambda: worker_pid(server, 1) != first, timeout=LOADED_DEADLINE)
        assert kv_file not in open_files(worker_pid(server, 1))
        peer = Peer(server.router, server.pub, ctx)  # its entries came with the fork
        assert peer.ok("kv_get", namespace="ns", key="k").value == "v"
        peer.ok("kv_put", namespace="ns", key="k2", value="v2")  # the state process writes
        peer.close()
    finally:
        assert server.stop() == 0


def children_or_none(pid: int) -> list[int]:
    try:
        return children(pid)
    except OSError:
        return []


# --- (a) the same operations into one process and into two workers: the differential is in
# test_workers_differential.py (ZNS/1 and remoting interleaved), which compares replies so:


def without_epoch(value: Any) -> Any:
    """A reply or event without its `epoch` (each server draws its own)."""
    plain = msgspec.to_builtins(value)
    if isinstance(plain, dict):
        plain.pop("epoch", None)
    return plain


# --- (b) a worker killed under load ---------------------------------------------------------


def test_a_worker_killed_under_load_loses_no_route_and_is_replaced(tmp_path: Path, ctx: Any) -> None:
    server = ProcessServer(tmp_path, "--workers", "2", "--heartbeat-interval", "0.2")
    acknowledged: list[str] = []
    stop = threading.Event()
    try:
        wait_for(lambda: len(children(server.proc.pid)) == 2
                 and server.output().count("serving requests on") == 2)
        survivor_peer = peer_on_worker(server, 2, ctx)
        before = survivor_peer.ok("status")
        survivor_sub = sub_on_worker(server, 2, ctx)
        survivor_sub.subscribe(b"route/")
        load = threading.Thread(target=register_until, args=(
            stop, server.router, server.pub, acknowledged, "T"))
        load.start()
        wait_for(lambda: len(acknowledged) >= 30)
        victim = worker_pid(server, 1)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        # The port answers at once (the survivor); the replacement answers soon after.
        wait_for(lambda: victim not in children(server.proc.pid)
                 and len(children(server.proc.pid)) == 2)
        replacement = peer_on_worker(server, 1, ctx)
        replaced_s = time.monotonic() - killed_at
        count = len(acknowledged)
        wait_for(lambda: len(acknowledged) >= count + 30)
        stop.set()
        load.join(30)
        for peer in (survivor_peer, replacement):
            status = peer.ok("status")
            assert status.epoch == before.epoch
            assert status.revision >= len(acknowledged)
            routes = peer.ok("snapshot").routes
            assert set(acknowledged) <= set(routes), set(acknowledged) - set(routes)
        # The survivor's subscriber saw every revision in order, no epoch change.
        seen: list[int] = []
        last = acknowledged[-1]
        while True:
            channel, event = survivor_sub.next_event()
            assert event.epoch == before.epoch
            if channel != schema.HB_CHANNEL:
                seen.append(event.revision)
                if event.topic == last:
                    break
        assert seen == list(range(seen[0], seen[0] + len(seen)))  # no gap
        assert len(seen) >= len(acknowledged)
        assert f"worker 1 (pid {victim}) died (signal 9)" in server.output()
        assert replaced_s < LOADED_DEADLINE
    finally:
        stop.set()
        assert server.stop() == 0


# --- (c) no client goes back in time --------------------------------------------------------


def test_a_pull_after_an_event_never_answers_an_older_revision_on_any_worker(
        tmp_path: Path, ctx: Any) -> None:
    server = ProcessServer(tmp_path, "--workers", "2", "--heartbeat-interval", "0.2")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        writer = peer_on_worker(server, 1, ctx)
        readers = [peer_on_worker(server, 1, ctx), peer_on_worker(server, 2, ctx)]
        subs = [Peer(server.router, server.pub, ctx) for _ in range(8)]
        for sub in subs:
            sub.subscribe(b"route/", schema.HB_CHANNEL)
            sub.wait_subscribed()
            assert sub.sub is not None
            sub.sub.setsockopt(zmq.UNSUBSCRIBE, schema.HB_CHANNEL)

        def events(timeout_ms: int) -> list[Any]:
            found = []
            for sub in subs:
                assert sub.sub is not None
                if sub.sub.poll(timeout_ms if not found else 0):
                    while sub.sub.poll(0):
                        channel, body = sub.sub.recv_multipart()
                        if channel != schema.HB_CHANNEL:
                            found.append(schema.decode_event(body))
            return found

        # The fence, seen directly: with worker 2 stopped, its channel still takes the write's
        # command, so the event is published at once (no worker has to say it applied it);
        # a pull sent to the stopped worker is answered once it runs again, at that revision
        # or later: it applies what was written to it before it answers a read.
        resume = threading.Timer(1.0, os.kill, (worker_pid(server, 2), signal.SIGCONT))
        os.kill(worker_pid(server, 2), signal.SIGSTOP)
        try:
            writer.ok("register_broker", **register_fields(topics={"Held": {}}))
            assert writer.ok("get_route", topic="Held").revision >= 1
            held = wait_for(lambda: events(100))
            resume.start()
            assert readers[1].ok("get_route", topic="Held").revision >= held[0].revision
        finally:
            resume.cancel()
            os.kill(worker_pid(server, 2), signal.SIGCONT)

        # Under a stream of writes: every event, pulled at once on both workers.
        for n in range(200):
            writer.ok("register_broker", **register_fields(
                broker_name=f"b{n}", addr=f"10.2.0.{n}:10911", topics={f"T{n % 7}": {}}))
            for event in events(0):
                for reader in readers:
                    reply = reader.call("get_route", topic=event.topic)
                    revision = reply.revision
                    assert revision >= event.revision, (event.topic, revision, event.revision)
    finally:
        assert server.stop() == 0


def test_an_hb_carries_no_revision_another_worker_cannot_answer_yet(
        tmp_path: Path, ctx: Any) -> None:
    # An `hb` is an event: a pull after it answers no older revision (§7). Worker 2 stopped
    # with a registration larger than its channel's buffer unwritten to it: worker 1 applied
    # it, but a pull at worker 2 would answer the revision before it until the rest is
    # written. Before, worker 1's `hb` carried its own table's revision, the newer one.
    server = ProcessServer(tmp_path, "--workers", "2", "--heartbeat-interval", "0.1")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        writer = peer_on_worker(server, 1, ctx)
        writer.ok("register_broker", **register_fields(topics={"Small": {}}))
        before = writer.ok("get_route", topic="Small").revision
        sub = sub_on_worker(server, 1, ctx)
        assert sub.sub is not None
        os.kill(worker_pid(server, 2), signal.SIGSTOP)
        try:
            big = {f"BigTopic{i:05d}": {} for i in range(20_000)}  # about 1 MB: not written whole
            writer.ok("register_broker", **register_fields(broker_name="big", addr="10.9.0.1:1",
                                                           topics=big))
            after = writer.ok("get_route", topic="BigTopic00000").revision
            assert after > before
            while sub.sub.poll(0):
                sub.sub.recv_multipart()  # the hbs sent before the write
            seen = set()
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                if sub.sub.poll(100):
                    seen.add(schema.decode_event(sub.sub.recv_multipart()[1]).revision)
            assert seen == {before}, (seen, before, after)
        finally:
            os.kill(worker_pid(server, 2), signal.SIGCONT)
        # Once worker 2 took it all in, the fence passes it, and so does the hb.
        def hb_revision() -> int:
            assert sub.sub is not None
            sub.sub.poll(1000)
            return int(schema.decode_event(sub.sub.recv_multipart()[1]).revision)

        wait_for(lambda: hb_revision() == after, timeout=30)
    finally:
        assert server.stop() == 0


# --- the state process's life ----------------------------------------------------------------


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_workers_stop_when_their_state_process_dies(tmp_path: Path) -> None:
    server = ProcessServer(tmp_path, "--workers", "2")
    wait_for(lambda: server.output().count("serving requests on") == 2)
    workers = [worker_pid(server, 1), worker_pid(server, 2)]
    server.proc.kill()
    server.stop()
    wait_for(lambda: not any(alive(pid) for pid in workers))
    assert server.output().count("the state process is gone") == 2


def test_a_restarted_state_process_gives_its_workers_the_routes_it_held(
        tmp_path: Path, ctx: Any) -> None:
    first = ProcessServer(tmp_path, "--workers", "2")
    try:
        wait_for(lambda: first.output().count("serving requests on") == 2)
        peer = Peer(first.router, first.pub, ctx)
        peer.ok("register_broker", **register_fields(topics={"Kept": {}}))
        peer.close()
    finally:
        assert first.stop() == 0
    second = ProcessServer(tmp_path, "--workers", "2", kv_path=first.kv_path)
    try:
        wait_for(lambda: second.output().count("serving requests on") == 2)
        for worker in (1, 2):
            route = peer_on_worker(second, worker, ctx).ok("get_route", topic="Kept").route
            assert route.brokers[0].broker_name == "broker-a"
    finally:
        assert second.stop() == 0


@pytest.mark.parametrize("option", [["--router", "ipc:///tmp/zns-x"]])
def test_what_workers_do_not_serve_yet_is_refused_in_one_line(tmp_path: Path,
                                                              option: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "zns", "serve", "--workers", "2", "--kv-path",
         str(tmp_path / "kv"), *option], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_supervise_with_workers_is_what_the_state_process_does_and_says_so(
        tmp_path: Path, ctx: Any) -> None:
    # Ports of `*` are fine: the state process holds them for every worker it starts.
    server = ProcessServer(tmp_path, "--workers", "1", "--supervise")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 1)
        lines = [line for line in server.output().splitlines() if "--supervise" in line]
        assert len(lines) == 1 and "nothing restarts the state process itself" in lines[0]
        assert len(children(server.proc.pid)) == 1  # the worker: no supervised child between
        first = worker_pid(server, 1)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: server.output().count("serving requests on") == 2)
        assert worker_pid(server, 1) != first
        assert Peer(server.router, server.pub, ctx).ok("status").worker == 1
    finally:
        assert server.stop() == 0


# --- peer hints (§10) in the workers --------------------------------------------------------


def test_peer_hints_run_in_every_worker_and_each_changes_the_state_once(
        tmp_path: Path, ctx: Any) -> None:
    """Both NameServers have two workers: B's workers each follow A (whose events come from
    A's workers), a broker A expires leaves B as `peer_expired`, suspected once, and a
    worker that dies is replaced by one that follows A again."""
    addr = "10.0.0.1:10911"
    a = ProcessServer(tmp_path, "--workers", "2", "--heartbeat-interval", "0.2")
    try:
        b = ProcessServer(tmp_path, "--workers", "2", "--heartbeat-interval", "0.2",
                          "--peer", a.router, "--peer-grace", "1", kv_path=tmp_path / "kv-b")
    except BaseException:  # B did not start: A is stopped all the same
        a.stop()
        raise
    try:
        wait_for(lambda: all(s.output().count("serving requests on") == 2 for s in (a, b)))
        on_b = [peer_on_worker(b, worker, ctx) for worker in (1, 2)]
        for peer in on_b:  # every worker has its own link, and says so in `status`
            wait_for(lambda: peer.ok("status").peers == {a.router: True}, timeout=30)
        watcher = on_b[0]
        watcher.subscribe(schema.BROKER_PREFIX, schema.HB_CHANNEL)
        watcher.wait_subscribed()
        on_a = Peer(a.router, None, ctx)
        on_a.ok("register_broker", **register_fields(addr=addr, heartbeat_timeout_ms=1000))
        # On B, 12 s: a hint removes it a quarter of that after it came (§10), its own expiry
        # 12 s after it registered (that would say `expired`).
        watcher.ok("register_broker", **register_fields(addr=addr, heartbeat_timeout_ms=12_000))
        _, event = watcher.next_event(
            lambda ch, ev: isinstance(ev, schema.BrokerEvent) and ev.change == "removed", 30)
        assert event.reason == "peer_expired"
        for peer in on_b:
            assert addr not in {x.broker_addr for x in peer.ok("get_cluster_info").live}
        hinted = [line for line in b.output().splitlines() if " suspected here" in line]
        assert len(hinted) == 1, hinted  # the other worker's copy shortened nothing
        assert f"zns: peer hint: broker c1 at {addr} suspected here" in hinted[0]  # the state's
        # A worker's death costs its own links: its replacement links up afresh.
        dead = worker_pid(b, 2)
        os.kill(dead, signal.SIGKILL)
        wait_for(lambda: worker_pid(b, 2) != dead)
        replacement = peer_on_worker(b, 2, ctx)
        wait_for(lambda: replacement.ok("status").peers == {a.router: True}, timeout=30)
    finally:
        assert a.stop() == 0
        assert b.stop() == 0


# --- remoting in the workers ----------------------------------------------------------------


def holder_of(client_port: int, server_port: int, pids: list[int]) -> int:
    """The pid whose socket is the server side of the TCP connection from client_port
    (once a worker has accepted it)."""
    return wait_for(lambda: _holder(client_port, server_port, pids))


def _holder(client_port: int, server_port: int, pids: list[int]) -> int | None:
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inode = fields[9]
    found = [pid for pid in pids if inode in socket_inodes(pid)]
    return found[0] if found else None


def server_side_open(client_port: int, server_port: int) -> bool:
    """The server's side of the connection from client_port is not closed yet (any state
    but LAST_ACK, or gone)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (int(fields[1].split(":")[1], 16) == server_port
                and int(fields[2].split(":")[1], 16) == client_port and fields[3] != "09"):
            return True
    return False


def test_a_dead_workers_remoting_brokers_stay_until_they_register_again(
        tmp_path: Path, ctx: Any) -> None:
    from test_remoting_listener import Client, register_cmd

    server = ProcessServer(tmp_path, "--workers", "2", "--remoting", "127.0.0.1:0")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        endpoint = re.findall(r"RocketMQ remoting on (\S+)", server.output())[0]
        port = int(endpoint.rsplit(":", 1)[1])
        broker = Client(endpoint)
        assert broker.call(register_cmd(topics=("Remote",))).code == 0
        workers = {w: worker_pid(server, w) for w in (1, 2)}
        holder = holder_of(broker.sock.getsockname()[1], port, list(workers.values()))
        dead = next(w for w, pid in workers.items() if pid == holder)
        survivor = peer_on_worker(server, 3 - dead, ctx)
        # The other worker's first remoting connection closes: its id is not the broker's
        # connection's (each worker numbers its own), so the broker stays.
        same_worker: list[Any] = []
        while True:
            other = Client(endpoint)
            other_port = other.sock.getsockname()[1]
            if holder_of(other_port, port, list(workers.values())) != holder:
                break
            same_worker.append(other)
        assert other.call(register_cmd(name="broker-x", addr="127.0.0.9:1",
                                       topics=("X",))).code == 0
        other.close()
        wait_for(lambda: not server_side_open(other_port, port))
        assert survivor.ok("get_route", topic="Remote").route.brokers[0].broker_name == "broker-a"
        assert isinstance(survivor.call("get_route", topic="X"), schema.Error)
        for client in same_worker:
            client.close()
        os.kill(holder, signal.SIGKILL)
        wait_for(lambda: worker_pid(server, dead) != holder)
        peer_on_worker(server, dead, ctx)  # the replacement answers
        # Its connection is gone with it, but the broker is not removed as disconnected.
        for peer in (survivor, peer_on_worker(server, dead, ctx)):
            assert peer.ok("get_route", topic="Remote").route.brokers[0].broker_name == "broker-a"
        assert "broker-a id 0 at 127.0.0.1:10911 (disconnected)" not in server.output()
        broker.close()
        # Registered again over a new connection (on either worker), it is tied to that one:
        # closing it removes the broker, as a single process does.
        again = Client(endpoint)
        assert again.call(register_cmd(topics=("Remote",))).code == 0
        again.close()
        wait_for(lambda: isinstance(survivor.call("get_route", topic="Remote"), schema.Error))
        assert "broker-a id 0 at 127.0.0.1:10911 (disconnected)" in server.output()
    finally:
        assert server.stop() == 0


def test_a_replacement_worker_numbers_its_remoting_connections_apart_from_the_dead_ones(
        tmp_path: Path, ctx: Any) -> None:
    """The replacement keeps the dead worker's number, not its connection ids: its first
    connection closing must not remove a broker tied to the dead worker's first
    connection (docs/protocol.md §12: such a broker stays until it registers again)."""
    from test_remoting_listener import Client, register_cmd

    server = ProcessServer(tmp_path, "--workers", "1", "--remoting", "127.0.0.1:0")
    try:
        wait_for(lambda: "serving requests on" in server.output())
        endpoint = re.findall(r"RocketMQ remoting on (\S+)", server.output())[0]
        broker = Client(endpoint)  # the worker's first remoting connection
        assert broker.call(register_cmd(topics=("Remote",))).code == 0
        dead = worker_pid(server, 1)
        os.kill(dead, signal.SIGKILL)
        wait_for(lambda: worker_pid(server, 1) != dead)
        peer = peer_on_worker(server, 1, ctx)  # the replacement serves
        other = Client(endpoint)  # the replacement's first remoting connection
        assert other.call(register_cmd(name="broker-x", addr="127.0.0.9:1",
                                       topics=("X",))).code == 0
        other.close()
        # broker-x goes with its connection; a write after it is answered once applied.
        wait_for(lambda: "broker-x id 0 at 127.0.0.9:1 (disconnected)" in server.output())
        peer.ok("kv_put", namespace="ns", key="k", value="v")
        assert peer.ok("get_route", topic="Remote").route.brokers[0].broker_name == "broker-a"
        assert "broker-a id 0 at 127.0.0.1:10911 (disconnected)" not in server.output()
        broker.close()
    finally:
        assert server.stop() == 0


def test_connection_ranges_are_the_first_workers_numbers_then_new_ones_and_fit_msgpack() -> None:
    from zns.drivers.worker import CONNECTION_ID_BITS, CONNECTION_RANGES, connection_range

    assert [connection_range(n) for n in (1, 2, 64, 65)] == [1, 2, 64, 65]
    assert connection_range(CONNECTION_RANGES - 1) == CONNECTION_RANGES - 1
    assert connection_range(CONNECTION_RANGES) == 1  # round again, never range 0
    last = ((CONNECTION_RANGES - 1) << CONNECTION_ID_BITS) + (1 << CONNECTION_ID_BITS) - 1
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(last)) == last < 2 ** 63


def cpus_of_threads(pid: int) -> set[str]:
    """The CPUs each thread of `pid` may run on (/proc's Cpus_allowed_list), as a set."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.add(line.split()[1])
    return found


def test_cpus_pin_the_state_process_beside_worker_1_and_each_worker_to_its_cpu(
        tmp_path: Path, ctx: Any) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    first, last = allowed[-1], allowed[0]  # the same CPU on a machine that gives us one
    server = ProcessServer(tmp_path, "--workers", "2", "--cpus", f"{first},{last}",
                           "--metrics", "127.0.0.1:0")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        state, one, two = server.proc.pid, worker_pid(server, 1), worker_pid(server, 2)
        assert cpus_of_threads(state) == {str(first)}
        # Every thread of a worker: libzmq's I/O threads and the metrics server's too.
        assert len(list(Path(f"/proc/{one}/task").iterdir())) > 2
        assert cpus_of_threads(one) == {str(first)} and cpus_of_threads(two) == {str(last)}
        assert f"the state process pinned to CPU {first} (--cpus)" in server.output()
        assert f"worker 2: pinned to CPU {last} (--cpus)" in server.output()
        peer = Peer(server.router, server.pub, ctx)
        peer.ok("register_broker", **register_fields(topics={"T": {}}))
        peer.close()
        os.kill(two, signal.SIGKILL)  # its replacement takes its CPU
        wait_for(lambda: worker_pid(server, 2) != two, timeout=LOADED_DEADLINE)
        assert cpus_of_threads(worker_pid(server, 2)) == {str(last)}
    finally:
        assert server.stop() == 0


def test_a_cpu_this_process_may_not_run_on_is_refused_in_one_line(tmp_path: Path) -> None:
    outside = max(os.sched_getaffinity(0)) + 1
    for workers in ("0", "1"):
        done = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--workers", workers, "--cpus", f"0,{outside}",
             "--router", "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*",
             "--kv-path", str(tmp_path / "kv.json")],
            capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("ZNS_")})
        assert done.returncode == 1 and not done.stdout, done
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"Error: cpus: CPU {outside}: not one this process may run "
                               f"on ("), line


def test_a_worker_whose_cpu_is_gone_since_the_start_serves_unpinned(tmp_path: Path) -> None:
    """`zns serve` checks --cpus once, as it starts; a CPU can go offline (or leave the
    cpuset) later. A worker started after that (in place of a dead one) cannot take its
    slot's CPU: it serves unpinned and says so, instead of dying at every start, its slot
    (with one worker, the whole NameServer) never serving again. Here the check passes (as
    it did before the CPU went: patched out) and worker 2's CPU is one this host lacks."""
    first = min(os.sched_getaffinity(0))
    script = ("from zns.drivers import cpus; cpus.check = lambda listed: None; "
              "from zns.cli import main; main(prog_name='zns')")
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, "serve", "--router", "tcp://127.0.0.1:*",
             "--pub", "tcp://127.0.0.1:*", "--kv-path", str(tmp_path / "kv.log"),
             "--workers", "2", "--cpus", f"{first},{MAX_CPU}"],
            stdout=log, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("ZNS_")})
    try:
        wait_for(lambda: log_path.read_text().count("serving requests on") == 2
                 or proc.poll() is not None, timeout=3 * LOADED_DEADLINE)
        output = log_path.read_text()
        assert output.count("serving requests on") == 2, output
        assert f"worker 2: not pinned to CPU {MAX_CPU} (--cpus)" in output, output
        assert "uncaught error" not in output, output
        two = int(re.findall(r"worker 2: loaded the state at seq \d+ \(pid (\d+)\)",
                             output)[-1])
        allowed = cpus._ranges(sorted(os.sched_getaffinity(0)))
        assert cpus_of_threads(two) == {allowed}  # where the kernel places it
        assert f"worker 1: pinned to CPU {first} (--cpus)" in output
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_pin_leaves_a_process_as_it_was_when_the_kernel_refuses_its_cpu() -> None:
    before = os.sched_getaffinity(0)
    assert cpus.pin(MAX_CPU) is False  # no host here has CPU 8191 online
    assert os.sched_getaffinity(0) == before


PAIRED = re.compile(r"the state process and worker 1 share CPU (\d+) while their work is light")
RELEASED = "the state process and worker 1 run where the kernel puts them again"


class QuietWatch:
    """Whether this machine gave `--cpus auto` a chance to pair: the longest run of seconds,
    read from /proc/stat, in which some CPU was at least 60 % idle (the pairing asks for 3
    of them at 50 %, on seconds not aligned with these)."""

    def __init__(self) -> None:
        self.longest = self._run = 0
        self._last = self._read()
        self._at = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() - self._at < 1.0:
            return
        now, idle = time.monotonic(), self._read()
        elapsed_ticks = (now - self._at) * os.sysconf("SC_CLK_TCK")
        quiet = any((idle[c] - self._last.get(c, idle[c])) / elapsed_ticks >= 0.6 for c in idle)
        self._run = self._run + 1 if quiet else 0
        self.longest = max(self.longest, self._run)
        self._last, self._at = idle, now

    @staticmethod
    def _read() -> dict[int, int]:
        allowed, idle = os.sched_getaffinity(0), {}
        for line in Path("/proc/stat").read_text().splitlines():
            name, *ticks = line.split()
            if name.startswith("cpu") and name[3:] and int(name[3:]) in allowed:
                idle[int(name[3:])] = int(ticks[3]) + int(ticks[4])
        return idle


def wait_paired(server: ProcessServer, after: int, until: float) -> int:
    """The number of pairing lines once there are more than `after`; skips (not fails) when
    the machine never had the quiet seconds in a row the pairing asks for meanwhile (tests
    beside it, JVMs): QUIET_SAMPLES, doubled by each release (zns.core.pairing), counted
    from the last release."""
    watch, releases = QuietWatch(), server.output().count(RELEASED)
    while (count := len(PAIRED.findall(output := server.output()))) <= after:
        if output.count(RELEASED) != releases:
            watch, releases = QuietWatch(), output.count(RELEASED)
        need = min(QUIET_SAMPLES * 2 ** releases, MAX_QUIET_SAMPLES) + 1
        watch.tick()
        if time.monotonic() > until:
            if watch.longest >= need:
                raise AssertionError(f"not paired though {watch.longest} quiet seconds in a "
                                     f"row passed: {output}")
            pytest.skip(f"the machine was never quiet long enough to pair (at most "
                        f"{watch.longest} s in a row with a CPU 60 % idle, {need} needed)")
        time.sleep(0.05)
    return count


def paired_cpu(server: ProcessServer) -> str | None:
    """The pair's CPU if the last pairing line has no release after it."""
    output = server.output()
    pairings = list(PAIRED.finditer(output))
    if not pairings or RELEASED in output[pairings[-1].end():]:
        return None
    return pairings[-1].group(1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to pair")
@pytest.mark.timeout(240)
def test_by_default_the_state_process_and_worker_1_share_a_cpu_until_their_work_is_heavy(
        tmp_path: Path, ctx: Any) -> None:
    """`--cpus auto` (zns.core.pairing) as `zns serve` carries it out: every thread of the
    state process and worker 1 on the CPU its line names; a worker 2 forked while they are
    paired lets itself go; large registrations through worker 1 (the pair's work past what
    one CPU gives it) release them, every thread. On a machine kept busy by other tests
    the pair may be released (or never paired) by their load instead: what was checked
    while it was paired counts only if no release came meanwhile, else it is tried again."""
    allowed = {cpus._ranges(sorted(os.sched_getaffinity(0)))}
    server = ProcessServer(tmp_path, "--workers", "2", "--metrics", "127.0.0.1:0")
    until = time.monotonic() + 150
    peer = None
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        pairings, checked = 0, False
        while not checked:
            pairings = wait_paired(server, pairings, until)
            cpu = paired_cpu(server)
            if cpu is None:
                continue  # released already (the machine's load)
            state, one, two = server.proc.pid, worker_pid(server, 1), worker_pid(server, 2)
            seen = cpus_of_threads(state), cpus_of_threads(one)
            os.kill(two, signal.SIGKILL)  # replaced by a worker forked from the paired process
            wait_for(lambda: worker_pid(server, 2) != two, timeout=LOADED_DEADLINE)
            replaced = cpus_of_threads(worker_pid(server, 2))
            if paired_cpu(server) != cpu or len(PAIRED.findall(server.output())) != pairings:
                continue  # released meanwhile (the machine's load): what was seen proves little
            assert seen == ({cpu}, {cpu}), (seen, cpu)
            assert len(list(Path(f"/proc/{one}/task").iterdir())) > 2  # libzmq's threads too
            assert replaced == allowed  # forked onto the pair's CPU, it let itself go
            checked = True
        # On worker 1: the registrations it decodes are the pair's work too (on worker 2
        # they could leave the pair within what its CPU gives it, and rightly paired).
        peer = peer_on_worker(server, 1, ctx)
        n = 0
        while paired_cpu(server) is not None:  # heavy: decoded, executed, applied again
            assert time.monotonic() < until + 60, server.output()
            n += 1
            peer.ok("register_broker", **register_fields(topics={
                f"Heavy{t}": {"read_queues": 1 + n % 8} for t in range(3000)}))
        # Paired again only after 6 light seconds: checked well before.
        state, one = server.proc.pid, worker_pid(server, 1)
        assert cpus_of_threads(state) == allowed and cpus_of_threads(one) == allowed
    finally:
        if peer is not None:
            peer.close()
        assert server.stop() == 0


def test_cpus_off_pairs_nothing_and_a_list_pins_for_good() -> None:
    assert ServerConfig().pairs and ServerConfig(cpus="auto", workers=2).pairs
    assert not ServerConfig(cpus="off").pairs and not ServerConfig(cpus="0,1").pairs
    assert not ServerConfig(workers=0).pairs  # one process: no hand-off to keep on a CPU
    assert ServerConfig(cpus="off").cpu_of(1) is None and ServerConfig().cpu_of(1) is None


def test_cpus_pin_one_process_to_the_first(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    server = ProcessServer(tmp_path, "--workers", "0", "--cpus", f"{cpu},0")
    try:
        assert cpus_of_threads(server.proc.pid) == {str(cpu)}
        assert f"the server pinned to CPU {cpu} (--cpus)" in server.output()
    finally:
        assert server.stop() == 0

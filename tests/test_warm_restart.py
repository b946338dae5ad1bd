"""Warm restarts of real `zns serve` processes: a server killed with SIGKILL or stopped
serves its routes again at once after a restart, with a new epoch; a restored broker
that does not register again is removed as `not_confirmed`; a damaged dump never stops a
start, a newer one or a file that is no dump does, in one line; a namespace emptied over
remoting stays emptied."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from zns.cli import main
from zns.core import schema, warm
from zns.core.remoting import RemotingCommand
from zns.drivers.kv_file import KvStore

from helpers import LOADED_DEADLINE, Peer, register_fields, wait_for
from test_remoting_listener import Client
from test_remoting_service import register_cmd

pytestmark = pytest.mark.timeout(120)


def dump_holds(path: Path, topic: str) -> bool:
    try:
        state = warm.decode_dump(path.read_bytes())
    except (FileNotFoundError, warm.CorruptDump):
        return False
    return any(t == topic for t, _ in state.table.topics)


def register(srv, name: str, addr: str, topic: str, timeout_ms: int = 120_000) -> None:
    peer = Peer(srv.router)
    try:
        peer.ok("register_broker", heartbeat_timeout_ms=timeout_ms,
                **register_fields(name, 0, addr, topics={topic: {}}))
    finally:
        peer.close()


def test_a_server_killed_with_sigkill_serves_its_routes_at_once_after_a_restart(
        process_server, tmp_path: Path):
    kv_path = tmp_path / "kv.log"
    srv = process_server(kv_path=kv_path)
    register(srv, "broker-a", "10.0.0.1:10911", "TopicA")
    peer = Peer(srv.router)
    old_epoch = peer.ok("status").epoch
    peer.close()
    wait_for(lambda: dump_holds(tmp_path / "kv.log.state", "TopicA"))  # debounced: ≤ 1 s
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(15)

    again = process_server(kv_path=kv_path)
    peer = Peer(again.router)
    try:
        route = peer.ok("get_route", topic="TopicA")  # the first request: no registration
        assert [b.broker_name for b in route.route.brokers] == ["broker-a"]
        assert route.epoch != old_epoch  # clients resync, as after any restart (§7)
        assert "restored 1 broker names and 1 topics" in again.output()
    finally:
        peer.close()


def test_a_restored_broker_that_does_not_register_again_is_removed_as_not_confirmed(
        process_server, tmp_path: Path):
    kv_path = tmp_path / "kv.log"
    srv = process_server(kv_path=kv_path)
    register(srv, "broker-a", "10.0.0.1:10911", "TopicA", timeout_ms=2_000)
    register(srv, "broker-b", "10.0.0.2:10911", "TopicB")
    assert srv.stop() == 0  # a clean stop writes the dump too
    assert dump_holds(tmp_path / "kv.log.state", "TopicB")

    again = process_server(kv_path=kv_path)
    peer = Peer(again.router, again.pub)
    try:
        peer.subscribe(schema.HB_CHANNEL, schema.BROKER_PREFIX)
        peer.wait_subscribed()
        assert peer.ok("get_route", topic="TopicA").route.brokers[0].broker_name == "broker-a"
        register(again, "broker-b", "10.0.0.2:10911", "TopicB")  # confirmed
        _, event = peer.next_event(lambda ch, ev: ch.startswith(schema.BROKER_PREFIX),
                                   timeout=LOADED_DEADLINE + 2)
        assert (event.broker_name, event.change, event.reason) == (
            "broker-a", "removed", "not_confirmed")
        assert peer.call("get_route", topic="TopicA").code == "not_found"
        assert peer.ok("get_route", topic="TopicB").route.brokers[0].broker_name == "broker-b"
        wait_for(lambda: "(not_confirmed)" in again.output())
    finally:
        peer.close()


def test_a_corrupt_dump_is_logged_and_the_server_starts_empty(process_server, tmp_path: Path):
    path = tmp_path / "kv.log.state"
    path.write_bytes(warm.MAGIC + b"\x00\x01" + b"\x00" * 4 + b"not msgpack")
    srv = process_server("--state-path", str(path))
    peer = Peer(srv.router)
    try:
        assert peer.ok("status").brokers == 0
    finally:
        peer.close()
    lines = [line for line in srv.output().splitlines() if "state dump" in line]
    assert len(lines) == 1 and "ignored, starting with no routes" in lines[0]


def test_a_dump_of_a_newer_zns_stops_the_start_in_one_line(tmp_path: Path):
    path = tmp_path / "state.dump"
    path.write_bytes(warm.MAGIC + (warm.FORMAT + 1).to_bytes(2, "big") + b"\x00" * 4 + b"x")
    result = CliRunner().invoke(main, ["serve", "--router", "tcp://127.0.0.1:*", "--pub",
                                       "tcp://127.0.0.1:*", "--kv-path", str(tmp_path / "kv.log"),
                                       "--state-path", str(path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: state dump {path} was written by a newer zns (state format "
                           f"{warm.FORMAT + 1}")
    assert path.read_bytes().endswith(b"x")  # left as it was


def test_an_unusable_state_path_stops_the_start_in_one_line(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(main, ["serve", "--router", "tcp://127.0.0.1:*", "--pub",
                                       "tcp://127.0.0.1:*", "--kv-path", str(tmp_path / "kv.log"),
                                       "--state-path", str(blocker / "state.dump")])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: state dump {blocker}/state.dump cannot be written: {blocker} is a file, not a "
        "directory (--state-path)"]



def test_a_state_path_that_is_the_kv_file_stops_the_start_in_one_line(tmp_path: Path):
    # Before: the server started, and its first dump replaced the KV log (every KV write
    # acknowledged before it lost, the next start refused the KV file as corrupt).
    kv_path = tmp_path / "kv.log"
    kv = KvStore(str(kv_path))
    kv.put("ns", "k", "v")
    kv.close()
    before = kv_path.read_bytes()
    result = CliRunner().invoke(main, ["serve", "--router", "tcp://127.0.0.1:*", "--pub",
                                       "tcp://127.0.0.1:*", "--kv-path", str(kv_path),
                                       "--state-path", str(kv_path)])
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: state dump {kv_path} is the KV file")
    assert kv_path.read_bytes() == before


def remoting_calls(srv, *requests: tuple[int, dict[str, str]]) -> list[tuple[int, bytes]]:
    """Each request over one remoting connection to `srv`: its reply's code and body."""
    line = wait_for(lambda: next((ln for ln in srv.output().splitlines()
                                  if "RocketMQ remoting listener on" in ln), None))
    client = Client(line.rsplit(" on ", 1)[1].split()[0])
    try:
        return [(reply.code, reply.body) for reply in (
            client.call(RemotingCommand(code=code, version=479, ext_fields=ext))
            for code, ext in requests)]
    finally:
        client.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_namespace_emptied_over_remoting_is_still_emptied_after_a_kill_and_restart(
        process_server, tmp_path: Path, workers: int):
    # Before the dump carried them (format 2), the restarted server answered 22 (never used).
    # With workers, the state process restores the dump and its workers load their state
    # from it. The restarted server's remoting port is a new one: the killed server's
    # workers, until they stop, cannot answer in its place.
    kv_path, dump = tmp_path / "kv.log", tmp_path / "kv.log.state"
    kv_list = (219, {"namespace": "ns"})  # GET_KVLIST_BY_NAMESPACE
    args = ["--remoting", "127.0.0.1:0", "--workers", str(workers)]  # 0 given: the default is 1
    first = process_server(*args, kv_path=kv_path)
    put, delete, before = remoting_calls(
        first, (100, {"namespace": "ns", "key": "k", "value": "v"}),
        (102, {"namespace": "ns", "key": "k"}), kv_list)
    assert (put[0], delete[0], before) == (0, 0, (0, b'{"table":{}}'))  # as Java
    wait_for(lambda: dump.exists() and warm.decode_dump(dump.read_bytes()).emptied == ["ns"])
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(15)

    again = process_server(*args, kv_path=kv_path)
    assert remoting_calls(again, kv_list) == [before]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_restored_rocketmq_broker_not_heard_since_keeps_its_period_through_a_second_restart(
        process_server, tmp_path: Path, workers: int):
    # Before: a dump written after a restart listed as registered over remoting only the
    # addresses tied to a connection, and a restored one is tied to none until it registers
    # again: a RocketMQ broker that died while zns was down, with a change and a second
    # restart in its 40 s (a crash loop under --supervise), was given its own 120 s timeout.
    kv_path, dump = tmp_path / "kv.log", tmp_path / "kv.log.state"
    args = ["--remoting", "127.0.0.1:0", "--workers", str(workers)]
    rocketmq = ("DefaultCluster", "10.0.0.9:10911")
    first = process_server(*args, kv_path=kv_path)
    line = wait_for(lambda: first.line("RocketMQ remoting listener on", required=False))
    client = Client(line.rsplit(" on ", 1)[1].split()[0])
    try:  # the connection stays open: its close would remove the broker (disconnected)
        assert client.call(register_cmd(0, rocketmq[1], {"TopicR": {}}, name="broker-r")).code == 0
        wait_for(lambda: dump_holds(dump, "TopicR")
                 and rocketmq in warm.decode_dump(dump.read_bytes()).remoting)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(15)
    finally:
        client.close()

    again = process_server(*args, kv_path=kv_path)  # broker-r never registers again
    register(again, "broker-z", "10.0.0.2:10911", "TopicZ")  # a change: a new dump
    wait_for(lambda: dump_holds(dump, "TopicZ"))
    state = warm.decode_dump(dump.read_bytes())
    assert any(t == "TopicR" for t, _ in state.table.topics)  # not yet removed
    assert state.remoting == [rocketmq]

"""A forked worker serves the state machine its fork copied: the state process's
PrimaryLink sends a worker it just forked a first state transfer without a dump, at the
seq of the fork, and ReplicaService.load takes the copy when the seq is the fork's (a dump
otherwise)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from helpers import register_fields, wait_for, zns1_ok
from zns.core.errors import Internal
from zns.core.replication import Primary, State, decode_to_worker
from zns.core.service import NameService
from zns.drivers.kv_file import KvStore
from zns.drivers.replication_link import Channel, PrimaryLink, fork_worker
from zns.drivers.sockets import Waker, handle_signals
from zns.drivers.worker import Forked, ReplicaService


def primary(tmp_path: Path) -> NameService:
    service = NameService(KvStore(str(tmp_path / "kv.log")), epoch="e1", started_at_ms=0)
    zns1_ok(service, "register_broker", **register_fields(topics={"T": {}}))
    zns1_ok(service, "kv_put", namespace="ns", key="k", value="v")
    return service


def test_the_forked_machine_is_served_without_decoding_the_dump(tmp_path: Path) -> None:
    service = primary(tmp_path)
    replica = ReplicaService(1, forked=Forked(7, service.state), started_at_ms=0)
    replica.load(7, b"not a dump: never decoded")
    assert replica.state is service.state and replica.epoch == "e1"
    assert zns1_ok(replica, "get_route", topic="T").route.brokers[0].broker_name == "broker-a"
    # Its KV is its own, in memory: the state process's file is not the worker's to write.
    assert zns1_ok(replica, "kv_get", namespace="ns", key="k").value == "v"
    assert replica.state.kv is not service.kv and replica.state.kv.list("ns") == {"k": "v"}


def test_a_transfer_at_another_seq_is_loaded_from_its_dump(tmp_path: Path) -> None:
    service = primary(tmp_path)
    dump = service.state.dump()
    forked = NameService(KvStore(None), epoch="old", started_at_ms=0)
    replica = ReplicaService(1, forked=Forked(7, forked.state), started_at_ms=0)
    replica.load(8, dump)
    assert replica.state is not forked.state and replica.epoch == "e1"
    assert zns1_ok(replica, "get_route", topic="T").route.brokers[0].broker_name == "broker-a"
    # Only the first transfer can be the fork's: a later one is always its dump.
    replica.load(7, dump)
    assert replica.state is not forked.state


def first_state(link: PrimaryLink, sock: socket.socket) -> State:
    link.flush(0)
    channel = Channel(sock)
    frames = wait_for(channel.receive)
    message = decode_to_worker(frames[0])
    assert isinstance(message, State)
    return message


def test_a_forked_workers_first_state_carries_no_dump_and_a_later_one_does() -> None:
    service = NameService(KvStore(None), epoch="e1", started_at_ms=0)
    link = PrimaryLink(Primary(now=0), dump=service.state.dump,
                       execute=lambda worker, request: (None, b""))
    link.append(b"a command", 0)
    for forked in (True, False):
        ours, theirs = socket.socketpair()
        link.add(ours, 0, forked=forked)
        state = first_state(link, theirs)
        assert state.seq == 1 and (state.dump == b"") is forked, state
        theirs.close()
    link.close()


def test_a_state_without_a_dump_and_no_copy_at_its_seq_ends_the_worker() -> None:
    replica = ReplicaService(1, forked=None, started_at_ms=0)
    with pytest.raises(Internal):
        replica.load(3, b"")


def test_a_sighup_sent_while_a_worker_starts_reaches_the_handler_it_installs() -> None:
    """A key reload (SIGHUP) that reaches a worker between its fork and its Server's handler
    is held, not lost (nor run by the state process's copied handler, nor, here, the test
    process's default action, which ends the process): it is handled once the worker
    installs its own."""
    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""))
    go_read, go_write = os.pipe()

    def main(sock: object, written: object) -> int:
        os.read(go_read, 1)  # the SIGHUP was sent meanwhile
        handled: list[int] = []
        waker = Waker()
        restore_wakeup, restore_handlers = handle_signals(
            {signal.SIGHUP: lambda: handled.append(1)}, waker)
        deadline = time.monotonic() + 10
        while not handled and time.monotonic() < deadline:
            time.sleep(0.01)  # Python runs the handler between two bytecodes
        restore_wakeup()
        restore_handlers()
        return 0 if handled == [1] else 3

    try:
        pid, _ = fork_worker(link, main, 0)
        assert not signal.pthread_sigmask(signal.SIG_BLOCK, set()) & {signal.SIGHUP}, \
            "the state process's own mask is restored after the fork"
        os.kill(pid, signal.SIGHUP)
        os.write(go_write, b"g")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, \
            f"the worker's SIGHUP was not handled (status {os.waitstatus_to_exitcode(status)})"
    finally:
        link.close()
        os.close(go_read)
        os.close(go_write)


def test_a_disowned_copy_of_the_kv_store_reads_from_memory_and_writes_nothing(
        tmp_path: Path) -> None:
    """What a worker does with the state process's store the fork copied: its descriptors
    closed, its entries still read (Forked.adopt copies them), and no write through it (a
    second writer of the file)."""
    store = KvStore(str(tmp_path / "kv.log"))
    store.put("ns", "k", "v")
    on_disk = (tmp_path / "kv.log").read_bytes()
    store.disown()
    assert store.list("ns") == {"k": "v"}
    with pytest.raises(Internal):
        store.put("ns", "k2", "v2")
    assert (tmp_path / "kv.log").read_bytes() == on_disk


def test_a_stop_signal_that_reaches_a_worker_as_it_is_forked_stops_it(monkeypatch) -> None:
    """SIGTERM sent to a worker between its fork and the reset of the state process's
    handlers (the state process stopping as it forks: it signals every worker at once)
    must stop it, not run the state process's handler copied into it and be lost: the
    worker would start serving and the state process wait its 5 s grace to SIGKILL it.
    The signal is sent at the first reset, the earliest moment the child runs code."""
    from zns.drivers import replication_link

    stops: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stops.append(signum))
    real_signal = signal.signal
    parent = os.getpid()

    def signal_at_the_reset(sig: int, handler: object) -> object:
        if os.getpid() != parent and not stops:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # Python runs a handler between two bytecodes
                pass
        return real_signal(sig, handler)

    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""))
    try:
        monkeypatch.setattr(replication_link.signal, "signal", signal_at_the_reset)
        pid, _ = fork_worker(link, lambda sock, written: 0, 0)
        monkeypatch.undo()
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, \
            f"the worker went on (exit status {os.waitstatus_to_exitcode(status)})"
    finally:
        signal.signal(signal.SIGTERM, previous)
        link.close()


def test_an_hbs_revision_is_the_last_the_fence_passed_and_what_it_keeps_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import msgspec

    from zns.core.schema import decode_event, decode_request
    from zns.core.state import Write
    from zns.drivers import worker as worker_module

    service = primary(tmp_path)
    replica = ReplicaService(1, forked=Forked(7, service.state), started_at_ms=0)
    replica.load(7, b"")
    start = replica.table.revision
    fence = SimpleNamespace(fence=0)
    replica.link = SimpleNamespace(replica=fence)  # type: ignore[assignment]

    def hb() -> int:
        return int(decode_event(replica.heartbeat_event(0)[1]).revision)

    def register(seq: int) -> None:
        request = decode_request(msgspec.msgpack.encode(
            {"op": "register_broker", "id": seq, **register_fields(
                broker_name=f"b{seq}", addr=f"10.3.0.{seq % 250}:{seq}", topics={"T": {}})}))
        replica.apply_command(seq, msgspec.msgpack.encode(
            Write(request=request, now=1000, connection=None)), produce=False)

    assert hb() == 0  # the state at seq 7: not passed by the fence yet
    fence.fence = 7
    assert hb() == start
    for seq in (8, 9, 10):
        register(seq)
    assert replica.table.revision == start + 3 and hb() == start  # none passed yet
    fence.fence = 9
    assert hb() == start + 2
    fence.fence = 10
    assert hb() == start + 3
    # A fence that stays behind (another worker reading nothing): at most this many kept,
    # the oldest taken as passed past it.
    monkeypatch.setattr(worker_module, "MAX_UNFENCED_REVISIONS", 4)
    for seq in range(11, 21):
        register(seq)
    assert hb() == start + 3 + 10 - 4  # the 6 oldest of 10 taken as passed

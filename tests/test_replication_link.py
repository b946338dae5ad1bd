"""zns.drivers.replication_link with real processes: a primary here, forked workers, opaque
commands and dumps. Each worker writes what it did, one line each, into its own file."""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zns.core.errors import Busy, ConnectionLost
from zns.core.replication import Apply, Primary, Replica, encode
from zns.drivers.replication_link import (
    HEADER, MAX_FRAME_BYTES, Channel, PrimaryLink, ReplicaLink, WrittenSeq, fork_worker,
)

from helpers import LOADED_DEADLINE, wait_for


def clock() -> int:
    return time.monotonic_ns() // 1_000_000


def worker_main(path: Path, forward: bool = False,
                runs: bool = False) -> Callable[[socket.socket, WrittenSeq], int]:
    def main(sock: socket.socket, written: WrittenSeq) -> int:
        faulthandler.disable()  # pytest's, inherited by the fork
        out = open(path, "a", buffering=1)
        link = ReplicaLink(
            sock, Replica(),
            apply=lambda seq, command, produce: (out.write(f"apply {seq} {command.decode()}\n"),
                                        [b"e%d" % seq])[1],
            load=lambda seq, dump: out.write(f"load {seq} {dump.decode()}\n") and None,
            publish=lambda seq, events: out.write(f"publish {seq}\n") and None,
            reply=lambda token, reply: out.write(f"reply {token} {reply.decode()}\n") and None,
            written=written,
        )
        forwarded = not forward
        while True:
            link.wait(1000)
            if runs:
                out.write("run\n")  # each pass: what one run() did is between two of these
            try:
                link.run()
                if not forwarded and link.replica.loaded:
                    link.forward(b"write")
                    forwarded = True
            except ConnectionLost:
                return 0

    return main


class Harness:
    def __init__(self, tmp_path: Path, *, dump: Callable[[], bytes] | None = None,
                 dump_in_steps: Callable[[], Iterator[bytes | None]] | None = None,
                 **primary: int) -> None:
        self.tmp_path = tmp_path
        self.state = 0  # the opaque state machine: how many commands it applied
        self.dropped: list[tuple[int, str]] = []
        self.link = PrimaryLink(
            Primary(now=clock(), **primary),
            dump=dump or (lambda: b"dump-at-%d" % self.state),
            dump_in_steps=dump_in_steps,
            execute=self.execute,
            dropped=lambda worker, reason: self.dropped.append((worker, reason)),
        )
        self.pids: dict[int, int] = {}  # worker -> pid

    def execute(self, worker: int, request: bytes) -> tuple[bytes | None, bytes]:
        self.state += 1
        return b"c%d-%s" % (self.state, request), b"done-%d" % self.state

    def fork(self, name: str, forward: bool = False, runs: bool = False) -> int:
        pid, worker = fork_worker(self.link, worker_main(self.tmp_path / name, forward, runs),
                                  clock())
        self.pids[worker] = pid
        return worker

    def append(self, pad: int = 0) -> int:
        self.state += 1
        return self.link.append(b"c%d" % self.state + b"." * pad, clock())

    def serve_until(self, done: Callable[[], bool], deadline_s: float = LOADED_DEADLINE) -> float:
        started = time.monotonic()
        while not done():
            assert time.monotonic() - started < deadline_s, "not within the deadline"
            self.link.wait(20)
            self.link.run(clock())
        return time.monotonic() - started

    def lines(self, name: str) -> list[str]:
        path = self.tmp_path / name
        return path.read_text().splitlines() if path.exists() else []

    def close(self) -> None:
        self.link.close()  # each worker reads EOF and exits
        for pid in self.pids.values():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


@pytest.fixture
def harness(tmp_path: Path):
    h = Harness(tmp_path, ack_timeout_ms=60_000)
    yield h
    for pid in h.pids.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    h.close()


@pytest.mark.timeout(120)
def test_commands_reach_every_worker_in_order_and_events_wait_for_the_fence(harness) -> None:
    a, b = harness.fork("a"), harness.fork("b")
    for _ in range(2000):
        harness.append()
    primary = harness.link.primary
    harness.serve_until(lambda: primary.fence == 2000)
    harness.serve_until(lambda: all(
        harness.lines(n)[-1:] == ["publish 2000"] for n in ("a", "b")))
    for name in ("a", "b"):
        lines = harness.lines(name)
        assert lines[0] == "load 0 dump-at-0"
        assert [x for x in lines if x.startswith("apply")] == [
            f"apply {s} c{s}" for s in range(1, 2001)]
        published = [int(x.split()[1]) for x in lines if x.startswith("publish")]
        assert published == list(range(1, 2001))
        # Each event was published after its own command was applied, never before.
        assert lines.index("publish 1") > lines.index("apply 1 c1")
    assert primary.workers == [a, b] and harness.dropped == []


@pytest.mark.timeout(120)
def test_a_lone_worker_publishes_as_it_applies_without_waiting_for_a_fence(harness) -> None:
    a = harness.fork("a", runs=True)
    harness.serve_until(lambda: "load 0 dump-at-0" in harness.lines("a"))
    harness.append()  # the command goes out at once; the primary reads nothing after this
    assert all(channel.pending == 0 for channel in harness.link.channels.values())
    deadline = time.monotonic() + LOADED_DEADLINE
    while "publish 1" not in harness.lines("a"):
        assert time.monotonic() < deadline, harness.lines("a")
        time.sleep(0.01)
    assert harness.link.primary.fence == 1 and harness.link.primary.applied(a) == 0, \
        "the fence moved once the command was written, with no Ack read"
    lines = harness.lines("a")
    assert "run" not in lines[lines.index("apply 1 c1"):lines.index("publish 1")], \
        "published in the pass that applied it, not at the worker's next wake-up"


@pytest.mark.timeout(120)
def test_a_worker_killed_with_sigkill_leaves_the_fence_at_once(harness) -> None:
    a, b = harness.fork("a"), harness.fork("b")
    primary = harness.link.primary
    harness.serve_until(lambda: primary.applied(a) == 0 and len(harness.lines("b")) > 0)
    os.kill(harness.pids[b], signal.SIGSTOP)  # b reads nothing more: its socket fills up
    while primary.fence == harness.state:  # then the fence waits
        assert harness.state < 1000, "b's socket never filled up"
        harness.append(pad=16 * 1024)
    seq = harness.state
    harness.serve_until(lambda: primary.applied(a) == seq)
    fence = primary.fence
    assert fence < seq
    killed = time.monotonic()
    os.kill(harness.pids[b], signal.SIGKILL)
    # Seen by the channel's EOF, not the ack timeout (60 s here).
    took = harness.serve_until(lambda: primary.fence == seq, deadline_s=10)
    assert primary.workers == [a] and harness.dropped[0][0] == b
    harness.serve_until(lambda: harness.lines("a")[-1:] == [f"publish {seq}"])
    assert time.monotonic() - killed < 10 and took < 10


@pytest.mark.timeout(120)
def test_a_new_worker_joins_by_a_state_transfer_and_follows(harness) -> None:
    harness.fork("a")
    for _ in range(50):
        harness.append()
    primary = harness.link.primary
    harness.serve_until(lambda: primary.fence == 50)
    c = harness.fork("c")
    assert primary.fence == 50  # a new worker counts at the seq of its state
    for _ in range(10):
        harness.append()
    harness.serve_until(lambda: primary.applied(c) == 60 and primary.fence == 60
                        and len(harness.lines("c")) >= 11)  # acknowledged before applied
    lines = harness.lines("c")
    assert lines[0] == "load 50 dump-at-50"
    assert [x for x in lines if x.startswith("apply")] == [
        f"apply {s} c{s}" for s in range(51, 61)]


@pytest.mark.timeout(120)
def test_a_forwarded_write_is_answered_after_its_worker_applied_it(harness) -> None:
    harness.fork("a")
    harness.fork("w", forward=True)
    harness.serve_until(lambda: any(x.startswith("reply") for x in harness.lines("w")))
    lines = harness.lines("w")
    assert lines.index("reply 1 done-1") > lines.index("apply 1 c1-write")


@pytest.mark.timeout(120)
def test_a_worker_that_never_reads_holds_a_bounded_buffer_then_is_dropped(tmp_path) -> None:
    h = Harness(tmp_path, ack_timeout_ms=500, window=16)
    try:
        a, b = h.fork("a"), h.fork("b")
        primary = h.link.primary
        h.serve_until(lambda: primary.applied(a) == 0 and len(h.lines("b")) > 0)
        os.kill(h.pids[b], signal.SIGSTOP)
        for _ in range(5000):
            h.append()
            h.link.run(clock())
            # At most a window of commands and the small fence messages are in its channel.
            assert h.link.channels[b].pending < 16 * 64 + 4096 if b in h.link.channels else True
        h.serve_until(lambda: b not in primary.workers and primary.fence == 5000)
        assert "no acknowledgement" in h.dropped[0][1]
        assert primary.tail[0] <= primary.max_tail_commands
    finally:
        for pid in h.pids.values():
            os.kill(pid, signal.SIGKILL)
        h.close()


def test_the_state_process_has_no_named_endpoint(harness) -> None:
    harness.fork("a")
    for channel in harness.link.channels.values():
        sock = channel.sock
        assert sock.family == socket.AF_UNIX
        # An unnamed socketpair: no path, no abstract name; nothing else can connect to it.
        assert sock.getsockname() in ("", b"") and sock.getpeername() in ("", b"")
        assert stat.S_ISSOCK(os.fstat(sock.fileno()).st_mode)
    listening = [name for name in os.listdir(f"/proc/{os.getpid()}/fd")
                 if _is_listening(int(name))]
    assert listening == []


def _is_listening(fd: int) -> bool:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    finally:
        sock.close()


def test_a_frame_over_the_bound_ends_the_channel() -> None:
    left, right = socket.socketpair()
    sender, receiver = Channel(left), Channel(right, max_frame_bytes=10)
    try:
        sender.send(b"x" * 11)
        sender.flush()
        with pytest.raises(ConnectionLost):
            receiver.receive()
    finally:
        sender.close()
        receiver.close()


def test_a_channel_refuses_to_hold_more_than_its_bound() -> None:
    left, right = socket.socketpair()
    sender = Channel(left, max_pending_bytes=1 << 20)
    try:
        with pytest.raises(ConnectionLost):
            for _ in range(10_000):  # nobody reads `right`
                sender.send(b"x" * 1024)
                sender.flush()
        assert sender.pending <= 1 << 20
    finally:
        sender.close()
        right.close()


@pytest.mark.timeout(30)
def test_frames_survive_being_split_and_batched() -> None:
    left, right = socket.socketpair()
    sender, receiver = Channel(left), Channel(right)
    try:
        bodies = [bytes([i]) * (i * 997) for i in range(40)]
        for body in bodies:
            sender.send(body)
        got: list[bytes] = []
        sender.flush()
        first = receiver.receive(budget=5000)
        assert sum(len(b) + 4 for b in first) <= 5000  # one pass reads no more than its budget
        got += first
        while len(got) < len(bodies):
            sender.flush()  # more than the socket's buffer holds
            got += receiver.receive(budget=5000)  # frames cut across reads
        assert got == bodies
        sender.close()
        with pytest.raises(ConnectionLost):
            receiver.receive()
    finally:
        receiver.close()


@pytest.mark.timeout(120)
def test_a_worker_sees_its_channel_close_whatever_was_forked_after_it(harness) -> None:
    a = harness.fork("a")
    harness.fork("b")  # b must not hold a copy of the state process's end of a's channel
    harness.serve_until(lambda: len(harness.lines("a")) > 0 and len(harness.lines("b")) > 0)
    harness.link.channels.pop(a).close()  # as when the state process dies
    pid = harness.pids.pop(a)
    started = time.monotonic()
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        assert time.monotonic() - started < 10, "worker a never saw its channel close"
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_a_large_state_reaches_a_new_worker_in_parts_and_its_channel_holds_a_window_of_it(
        tmp_path: Path) -> None:
    from zns.core.replication import DEFAULT_CHUNK_BYTES, DEFAULT_TRANSFER_WINDOW_BYTES

    size = 8 << 20
    harness = Harness(tmp_path, ack_timeout_ms=60_000,
                      dump=lambda: b"dump-at-%d-" % harness.state + b"x" * size)
    try:
        c = harness.fork("c")
        primary = harness.link.primary
        for _ in range(10):  # while the state is on its way: they follow it
            harness.append()
        most = 0
        started = time.monotonic()
        while primary.applied(c) != 10:
            assert time.monotonic() - started < LOADED_DEADLINE, "not within the deadline"
            harness.link.wait(20)
            harness.link.run(clock())
            most = max(most, harness.link.channels[c].pending)
        # Before, the whole dump waited in the channel's buffer at once.
        assert most <= DEFAULT_TRANSFER_WINDOW_BYTES + DEFAULT_CHUNK_BYTES, most
        # Acknowledged as received, before applied (zns.core.replication): wait for them.
        harness.serve_until(lambda: len(harness.lines("c")) >= 11)
        lines = harness.lines("c")
        assert lines[0] == "load 0 dump-at-0-" + "x" * size
        assert lines[1:11] == [f"apply {s} c{s}" for s in range(1, 11)]
        assert primary.transfer_bytes == 0  # the dump is let go once its last part is out
    finally:
        for pid in harness.pids.values():
            os.kill(pid, signal.SIGKILL)
        harness.close()


@pytest.mark.timeout(120)
def test_a_state_made_in_steps_is_as_of_its_last_step_and_serves_every_worker_that_asked(
        tmp_path: Path) -> None:
    def steps() -> Iterator[bytes | None]:  # three steps, commands coming between them
        for _ in range(3):
            yield None
        yield b"dump-at-%d" % harness.state

    harness = Harness(tmp_path, ack_timeout_ms=60_000, dump_in_steps=steps)
    try:
        a = harness.fork("a")
        b = harness.fork("b")  # asks while the dump for `a` is being made: the same dump
        assert harness.link.dumping
        harness.append()
        harness.link.run(clock())
        harness.append()
        harness.serve_until(lambda: not harness.link.dumping)
        harness.append()
        primary = harness.link.primary
        harness.serve_until(lambda: primary.applied(a) == primary.applied(b) == 3
                            and all(len(harness.lines(n)) >= 2 for n in "ab"))
        for name in ("a", "b"):
            lines = harness.lines(name)
            assert lines[0] == "load 2 dump-at-2"  # the commands before its last step
            assert lines[1] == "apply 3 c3"  # and only those after it
        assert primary.transfers == 2
    finally:
        for pid in harness.pids.values():
            os.kill(pid, signal.SIGKILL)
        harness.close()


def test_a_read_first_applies_what_was_written_to_its_worker() -> None:
    # The fence passes a command once it is in every worker's socket (zns.core.replication):
    # before a read, a worker applies whatever its counter says was written to it.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    written = WrittenSeq()
    primary = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""))
    primary.add(ours, 0, written=written)
    applied: list[bytes] = []
    replica = ReplicaLink(theirs, Replica(), apply=lambda seq, c, produce: applied.append(c) or [],
                          load=lambda seq, dump: None, publish=lambda seq, events: None,
                          written=written)
    primary.flush(0)
    replica.wait(5000)
    replica.run()  # the first state
    for n in range(3):
        primary.append(b"c%d" % n, 0)
    assert written.get() == 3 and primary.primary.fence == 3
    assert replica.replica.applied == 0 and applied == []  # it has read nothing yet
    replica.catch_up()
    assert replica.replica.applied == 3 and applied == [b"c0", b"c1", b"c2"]
    replica.catch_up()  # nothing written since: nothing to do
    # A replica that must wait for a state cannot catch up: the read is refused, not answered
    # from a state that misses what the fence passed.
    body = encode(Apply(seq=9, command=b"c9"))  # a gap: 4 to 8 never came
    primary.channels[1].sock.sendall(HEADER.pack(len(body)) + body)
    written.set(9)
    with pytest.raises(Busy):
        replica.catch_up()
    assert replica.replica.awaiting_state
    primary.close()
    replica.channel.close()


def test_a_read_refused_when_what_was_written_does_not_arrive_within_the_catch_up_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/protocol.md §7: a worker that has not applied what was written to it within
    # CATCH_UP_TIMEOUT_MS of starting to answers `busy` (here its counter names a seq whose
    # bytes never come: a broken state process), and does not give up before.
    import zns.drivers.replication_link as replication_link

    monkeypatch.setattr(replication_link, "CATCH_UP_TIMEOUT_MS", 300)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    written = WrittenSeq()
    primary = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""))
    primary.add(ours, 0, written=written)
    replica = ReplicaLink(theirs, Replica(), apply=lambda seq, c, produce: [],
                          load=lambda seq, dump: None, publish=lambda seq, events: None,
                          written=written)
    primary.flush(0)
    replica.wait(5000)
    replica.run()  # the first state
    written.set(1)  # said written, never sent
    started = time.monotonic()
    with pytest.raises(Busy, match="behind seq 1 for 300 ms"):
        replica.catch_up()
    assert 0.3 <= time.monotonic() - started < 0.3 + LOADED_DEADLINE
    assert not replica.replica.awaiting_state
    primary.close()
    replica.channel.close()


def test_the_writers_apply_carries_the_fence_the_other_workers_writes_made() -> None:
    # A forwarded write's worker is written to last: its Apply then says the other workers
    # have the command already, so it publishes the write's events as it reads them,
    # without waiting for the Fence that the others get after its own write.
    from zns.core.replication import Answer, Fence, Forward, decode_to_worker

    socks = {name: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for name in "ab"}
    link: PrimaryLink

    def execute(worker: int, request: bytes) -> tuple[bytes | None, bytes]:
        link.append(b"c-" + request, 0)  # as the state machine's apply does
        return None, b"ok"

    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=execute)
    workers = {name: link.add(socks[name][0], 0) for name in "ab"}
    link.flush(0)

    def frames(name: str) -> list[object]:
        channel = Channel(socks[name][1])
        return [decode_to_worker(body) for body in channel.receive()]

    assert all(frames(name) for name in "ab")  # the first states
    body = encode(Forward(7, b"w"))
    socks["a"][1].sendall(HEADER.pack(len(body)) + body)
    link.wait(5000)
    link.run(0)
    assert frames("a") == [Apply(1, b"c-w", 1), Answer(7, 1, b"ok")]  # and no Fence of 1
    assert frames("b") == [Apply(1, b"c-w", 0), Fence(1)]
    link.close()


def test_what_was_held_for_the_writer_goes_out_even_when_its_write_fails() -> None:
    # A write's worker is written to last (its messages are held meanwhile): a write whose
    # execution raises (a bug) must still let them out, in order, to that worker.
    from zns.core.replication import Forward, decode_to_worker

    socks = {name: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for name in "ab"}
    link: PrimaryLink

    def execute(worker: int, request: bytes) -> tuple[bytes | None, bytes]:
        link.append(b"c-" + request, 0)
        raise RuntimeError("a bug after the command was applied")

    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=execute)
    for name in "ab":
        link.add(socks[name][0], 0)
    link.flush(0)
    received = {name: Channel(socks[name][1]) for name in "ab"}
    for channel in received.values():
        assert channel.receive()  # the first states
    body = encode(Forward(7, b"w"))
    socks["a"][1].sendall(HEADER.pack(len(body)) + body)
    link.wait(5000)
    with pytest.raises(RuntimeError):
        link.run(0)
    for name in "ab":
        assert [m for m in map(decode_to_worker, received[name].receive())
                if isinstance(m, Apply)] == [Apply(1, b"c-w", 1 if name == "a" else 0)]
    link.close()


def test_the_state_process_executes_the_writes_it_read_within_the_slice_each_worker_in_turn(
) -> None:
    # The loop gives each source a slice (zns.drivers.loop) and runs the timers between
    # them. The state process executed every write it had read in one turn, 256 per worker
    # at most: 10 unregisterings of brokers of 20,000 topics (126 bytes each) held it
    # 1.2 s, expiry and every other worker's writes waiting behind the whole batch. Now a
    # write that ends past the slice ends the turn; the next starts with the next worker.
    import select

    from zns.core.replication import Forward
    from zns.drivers.loop import PollSet
    from zns.drivers.state_process import _Links

    socks = {name: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for name in "ab"}
    executed: list[bytes] = []

    def execute(worker: int, request: bytes) -> tuple[bytes | None, bytes]:
        executed.append(request)
        return None, b"ok"

    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=execute)
    for name in "ab":
        link.add(socks[name][0], 0)
    link.flush(0)
    for name in "ab":
        assert Channel(socks[name][1]).receive()  # the first states
        socks[name][1].sendall(b"".join(
            HEADER.pack(len(body)) + body
            for body in (encode(Forward(n, b"%s%d" % (name.encode(), n))) for n in range(10))))
    links = _Links(link)
    links.attach(PollSet())
    ours = [socks[name][0] for name in "ab"]
    wait_for(lambda: select.select(ours, [], [], 0)[0] == ours)  # both batches are here
    now = int(time.monotonic() * 1000)
    links.run({}, now, now)  # a slice over already: one write, and the turn ends
    assert executed == [b"a0"]
    assert links.next_deadline(now) == now  # the rest is due at once
    for _ in range(40):
        if len(executed) == 20:
            break
        links.run({}, now, now)
    assert executed == [b"%s%d" % (name, n) for n in range(10) for name in (b"a", b"b")]
    assert links.next_deadline(now) != now
    link.close()
    for name in "ab":
        socks[name][1].close()


def test_a_worker_that_sends_garbage_or_an_oversized_frame_is_dropped_and_costs_no_more(
) -> None:
    # What the module's docstring promises of a worker that misbehaves on its channel: an
    # unreadable message, or a frame announced past max_frame_bytes (read no further),
    # ends that worker's channel and takes it out of the fence; the other goes on.
    import select

    socks = {name: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for name in "abc"}
    dropped: list[tuple[int, str]] = []
    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""),
                       dropped=lambda worker, reason: dropped.append((worker, reason)))
    workers = {name: link.add(socks[name][0], 0) for name in "abc"}
    link.flush(0)
    for name in "abc":
        assert Channel(socks[name][1]).receive()  # the first states
    socks["a"][1].sendall(HEADER.pack(8) + b"\x00garbage")
    socks["b"][1].sendall(HEADER.pack(MAX_FRAME_BYTES + 1) + b"x" * 1024)
    ours = [socks[name][0] for name in "ab"]
    wait_for(lambda: select.select(ours, [], [], 0)[0] == ours)
    link.run(0)
    assert sorted(worker for worker, _ in dropped) == [workers["a"], workers["b"]]
    reasons = dict(dropped)
    assert "unreadable" in reasons[workers["a"]] and "frame of" in reasons[workers["b"]]
    assert sorted(link.channels) == [workers["c"]] == link.primary.workers
    link.close()
    for name in "abc":
        socks[name][1].close()


def test_a_fork_that_fails_leaves_sighup_unblocked(monkeypatch) -> None:
    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""))

    def no_fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    with pytest.raises(OSError):
        fork_worker(link, lambda sock, written: 0, 0)
    assert signal.SIGHUP not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert link.channels == {}


def test_a_dump_in_steps_that_raises_drops_the_workers_it_was_for_instead_of_spinning(
        caplog) -> None:
    # A step of the dump that raises (a bug) left the finished generator in place: `dumping`
    # stayed true, so the state process's loop ran the link at once, every pass, forever,
    # and each run raised (StopIteration, once the generator was done) before its timer and
    # its flush: a loop at full CPU that logged a bug every pass, writes waiting for the
    # next command, and the workers that waited for the state never dropped. Now the
    # dump is given up and each worker it was for is dropped (the pool forks another).
    from zns.core.replication import decode_to_worker

    def steps() -> Iterator[bytes | None]:
        yield None
        raise RuntimeError("a bug while dumping")

    dropped: list[int] = []
    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""),
                       dump_in_steps=steps, dropped=lambda worker, reason: dropped.append(worker))
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    forked = link.add(pairs[0][0], 0, forked=True)  # the fork's copy: needs no dump
    a, b = (link.add(pair[0], 0) for pair in pairs[1:])
    assert link.dumping
    link.run(0)  # the first step
    with caplog.at_level("ERROR", logger="zns"):
        link.run(0)  # the step that raises: logged, not raised
    assert "a bug while dumping" in caplog.text
    assert not link.dumping and sorted(dropped) == [a, b]
    assert link.primary.workers == [forked] and list(link.channels) == [forked]
    link.run(0)  # and the link serves on
    for pair in pairs[1:]:  # each dropped worker reads the end of its channel
        pair[1].settimeout(5)
        assert pair[1].recv(1 << 16) == b""
    link.append(b"c1", 0)  # the worker left is written to, as before
    forked_end = Channel(pairs[0][1])
    deadline = time.monotonic() + LOADED_DEADLINE
    received: list[object] = []
    while Apply(1, b"c1", 1) not in received:
        assert time.monotonic() < deadline, received
        received += [decode_to_worker(body) for body in forked_end.receive()]
    link.close()
    for pair in pairs:
        pair[1].close()

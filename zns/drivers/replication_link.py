"""The state process <-> worker channel: a socketpair per worker, made before the fork.

What to send and when is decided by `zns.core.replication` (`Primary` in the
state process, `Replica` in a worker); this module moves its messages. Each
worker gets one end of a `socket.socketpair()` (AF_UNIX, SOCK_STREAM) created
by the state process just before it forks the worker (`fork_worker`). The pair
has no name in any namespace: nothing outside these two processes can connect
to it, so the state process has no endpoint an outside peer can reach, and no
ZMTP (hence none of libzmq's aborts) between them. A message is a 4-byte
big-endian length and a msgpack body (`zns.core.replication.encode`).

Beside each socketpair, 8 bytes of memory shared across the fork (`WrittenSeq`)
hold the highest seq whose `Apply` (or last part of a state) the kernel has
taken into that worker's socket. The state process sets it as soon as a write
completes, before it tells the primary (`Primary.written`), hence before any
worker may publish that seq's events; a worker compares it with what it applied
before each read (`ReplicaLink.catch_up`) and reads its channel first if it is
behind: the bytes are there already. This is what lets the commit fence move
without any worker saying it applied anything (zns.core.replication).

What each end does when the other end misbehaves:

- **dies** (SIGKILL, an abort): the kernel closes its end; the other end reads
  EOF (or gets ECONNRESET/EPIPE) at once and drops the channel: the state
  process calls `Primary.leave`, so the fence moves on; a worker whose state
  process died exits (it has nothing to follow).
- **never reads**: the core keeps at most `window` commands unacknowledged
  per worker and drops a worker that acknowledges nothing for
  `ack_timeout_ms`; on top of that, a channel refuses to buffer more than
  `max_pending_bytes` (`ConnectionLost`: the worker is dropped).
- **floods**: one `run` reads at most `read_budget` bytes per channel, and a
  frame longer than `max_frame_bytes` ends the channel. The state process
  executes the writes it read within the loop's slice (`run`'s `until`): what is
  left waits for its next turn, taken from the next channel first, so a batch of
  writes that are small to send and long to apply (unregistering brokers of
  20,000 topics: 126 bytes and 0.1 s each) holds neither the timers nor the other
  workers' writes behind the whole batch.

Every socket error of the channel becomes `ConnectionLost` here
(`WORKER_CHANNEL`): the other process is gone or broken, never the caller's bug.
"""

from __future__ import annotations

import gc
import logging
import mmap
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import msgspec

from zns.core.errors import Busy, ConnectionLost
from zns.core.replication import (
    Apply, ApplyCommand, Deliver, Drop, Execute, Forward, Joined, LoadState, Primary, Publish,
    Replica,
    Reply,
    Report, SendState, SendToPrimary, State, ToWorker, Whole, decode_to_primary,
    decode_to_worker, encode,
)
from zns.drivers.io_errors import map_exceptions

log = logging.getLogger("zns")

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024  # the largest message (a state transfer of a big table)
MAX_PENDING_BYTES = 512 * 1024 * 1024  # written to a channel and not yet read by the other end
READ_BUDGET = 4 * 1024 * 1024  # bytes read from one channel per `run`
# One `recv` reads at most this much, into a buffer of the channel's own: a `recv` of a
# larger size allocates (and the kernel maps) that much for every call, even for the few
# hundred bytes a route change is (15 us a call here at 256 KiB, 1.3 us at 64 KiB).
CHUNK = 64 * 1024

# A read from or a write to the other process's end: whatever the kernel refuses (reset,
# broken pipe) means that process is gone.
WORKER_CHANNEL = map_exceptions([(OSError, None, ConnectionLost)])
# A worker behind what was written to it reads its channel before a read: the bytes are in
# its socket, so this bound is only met when the state process is gone or broken.
CATCH_UP_TIMEOUT_MS = 1_000
WAIT_SLICE_MS = 100


class WrittenSeq:
    """The highest seq written into one worker's channel, in 8 bytes of memory the state
    process and that worker share (an anonymous shared mapping made before the fork). Only
    the state process sets it; an aligned 8-byte store and load are whole on the machines
    CPython runs on, and the system calls between the store and any read that depends on
    it (the event's way to a client and the client's request) order them."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 8)
        self._view = memoryview(self._map).cast("q")

    def get(self) -> int:
        return self._view[0]

    def set(self, seq: int) -> None:
        self._view[0] = seq

    def close(self) -> None:
        self._view.release()
        self._map.close()


class Channel:
    """One end of a socketpair: non-blocking, length-prefixed frames, bounded buffers."""

    def __init__(self, sock: socket.socket, *, max_frame_bytes: int = MAX_FRAME_BYTES,
                 max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.max_frame_bytes = max_frame_bytes
        self.max_pending_bytes = max_pending_bytes
        self._in = bytearray()
        self._out = bytearray()
        self._scratch = memoryview(bytearray(CHUNK))
        self._queued = 0  # bytes ever queued (those the kernel took: less `pending`)
        self._marks: deque[tuple[int, int]] = deque()  # (end, seq) of frames marked by `send`
        self._written: int | None = None  # the last marked seq taken whole, not yet asked for

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def pending(self) -> int:
        """Bytes written and not yet taken by the kernel."""
        return len(self._out)

    def send(self, body: bytes, mark: int | None = None) -> None:
        """Queue one frame; `flush` writes it (one system call for a whole batch). `mark`:
        a seq that `take_written` returns once the kernel has taken the whole frame."""
        if len(self._out) + len(body) > self.max_pending_bytes:
            raise ConnectionLost(f"the other end reads nothing: {len(self._out)} bytes pending")
        self._out += HEADER.pack(len(body))
        self._out += body
        self._queued += HEADER.size + len(body)
        if mark is not None:
            self._marks.append((self._queued, mark))

    def take_written(self) -> int | None:
        """The seq of the last marked frame the kernel has taken whole since the last call
        (None: none)."""
        written, self._written = self._written, None
        return written

    def flush(self) -> bool:
        """Write what the socket takes; True when nothing is left pending."""
        try:
            while self._out:
                try:
                    with WORKER_CHANNEL:
                        sent = self.sock.send(self._out)
                except (BlockingIOError, InterruptedError):
                    return False
                del self._out[:sent]
            return True
        finally:
            marks, taken = self._marks, self._queued - len(self._out)
            while marks and marks[0][0] <= taken:
                self._written = marks.popleft()[1]

    def receive(self, budget: int = READ_BUDGET) -> list[bytes]:
        """The whole frames readable now (reading at most `budget` bytes)."""
        read = 0
        while read < budget:
            asked = min(CHUNK, budget - read)
            try:
                with WORKER_CHANNEL:
                    size = self.sock.recv_into(self._scratch, asked)
            except (BlockingIOError, InterruptedError):
                break
            if not size:
                raise ConnectionLost("the other end closed the channel")
            self._in += self._scratch[:size]
            read += size
            if size < asked:
                break  # all there was: another recv would only fail (a system call per hop)
        frames = []
        start = 0
        while len(self._in) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(self._in, start)
            if size > self.max_frame_bytes:
                raise ConnectionLost(f"a frame of {size} bytes (the bound is "
                                     f"{self.max_frame_bytes})")
            if len(self._in) - start - HEADER.size < size:
                break
            frames.append(bytes(self._in[start + HEADER.size:start + HEADER.size + size]))
            start += HEADER.size + size
        del self._in[:start]
        return frames

    def wait(self, timeout_ms: int | None) -> None:
        """Until the other end wrote something, or (with bytes pending) can take more."""
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN | (select.POLLOUT if self._out else 0))
        poller.poll(timeout_ms)

    def close(self) -> None:
        self.sock.close()


class FrameChannel(Protocol):
    """What a `ReplicaLink` reads and writes: a `Channel`, or a follower's link over the
    network (zns.drivers.followers.NetworkChannel)."""

    @property
    def pending(self) -> int: ...
    def fileno(self) -> Any: ...
    def send(self, body: bytes, mark: int | None = None) -> None: ...
    def flush(self) -> bool: ...
    def receive(self, budget: int = READ_BUDGET) -> list[bytes]: ...
    def wait(self, timeout_ms: int | None) -> None: ...
    def close(self) -> None: ...


class Downstream(Protocol):
    """What a worker's replica passes on to the followers it serves
    (zns.drivers.followers.Gateway): each command as applied, each state as loaded, the
    figures of the whole, and the answers to the writes it forwarded for them."""

    def applied(self, seq: int, command: bytes, events: list[bytes] | None) -> None: ...
    def loaded(self, seq: int) -> None: ...
    def whole(self, body: bytes) -> None: ...
    def answered(self, token: int, reply: bytes) -> bool: ...


def written_mark(message: ToWorker) -> int | None:
    """The seq a message completes in the worker's channel: an `Apply`'s, or the last part
    of a state's (None for any other)."""
    if type(message) is Apply:
        return message.seq
    if type(message) is State and (message.total < 0
                                   or message.offset + len(message.dump) >= message.total):
        return message.seq
    return None


class PrimaryLink:
    """The state process's side: a `Primary` and one `Channel` per worker.

    `dump()` returns the state as of the current seq (a `SendState`); with
    `dump_in_steps()` given instead, the state is made in steps, one per `run` (None after
    each, then the dump as of the seq when its last step ran), and one dump serves every
    worker that asked for a state before it ended;
    `execute(worker, request)` executes a forwarded write and returns the command it
    made (None: it changed nothing) and its reply bytes. `dropped(worker, reason)` is
    told of each worker that left the fence (its channel is already closed).
    `reported(worker, body)` gets each worker's figures (zns.core.figures), which are
    no replication business.
    """

    def __init__(
        self,
        primary: Primary,
        *,
        dump: Callable[[], bytes],
        execute: Callable[[int, bytes], tuple[bytes | None, bytes]],
        dump_in_steps: Callable[[], Iterator[bytes | None]] | None = None,
        dropped: Callable[[int, str], None] = lambda worker, reason: None,
        reported: Callable[[int, bytes], None] = lambda worker, body: None,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        clock: Callable[[], int] = lambda: int(time.monotonic() * 1000),
    ) -> None:
        self.primary = primary
        self._clock = clock  # the clock of `run`'s `now` and `until`
        self._reported = reported
        self._dump = dump
        self._dump_in_steps = dump_in_steps
        self._steps: Iterator[bytes | None] | None = None  # a dump being made
        self._awaiting_dump: list[int] = []  # the workers it is for
        self._forked: set[int] = set()  # workers whose first state is the fork's copy
        self._execute = execute
        self._executing = False  # in `execute`: `append` leaves the writing to its answer
        # The worker whose forwarded write is being carried out, and what is sent to it
        # meanwhile: written after every other worker's channel (`flush`).
        self._writer: int | None = None
        self._to_writer: list[ToWorker] = []
        self._dropped = dropped
        self._max_pending = max_pending_bytes
        self.channels: dict[int, Channel] = {}
        self._written: dict[int, WrittenSeq] = {}
        # Frames read from each channel and not yet acted on (a slice ended first); the
        # channel is read again only once its own are done, so at most a read's worth.
        self._inbox: dict[int, deque[bytes]] = {}
        self._first = 0  # where the next `run` starts among the channels (after a cut one)

    def add(self, sock: socket.socket, now: int, *, forked: bool = False,
            written: WrittenSeq | None = None) -> int:
        """A new worker at the other end of `sock`: it joins by a state transfer. `forked`:
        the worker was forked from this process just now, so it holds the state as of the
        current seq already (the fork's copy): its first transfer names that seq and
        carries no dump (zns.drivers.worker.ReplicaService.load). `written`: the counter
        shared with the worker (`WrittenSeq`; a worker given none reads no counter)."""
        worker = self.primary.join(now)
        self.channels[worker] = Channel(sock, max_pending_bytes=self._max_pending)
        self._written[worker] = written if written is not None else WrittenSeq()
        self._written[worker].set(self.primary.seq)
        if forked:
            self._forked.add(worker)
        self._carry_out(now)
        return worker

    def append(self, command: bytes, now: int, events: list[bytes] | None = None) -> int:
        """The state machine applied `command`, which made `events` (shipped in its `Apply`:
        zns.core.replication.shipped_events): replicate it; returns its seq. What it sends
        is written at once; during a forwarded write's `execute`, once its answer is queued
        after it (one write, one wake-up of the worker for both)."""
        seq = self.primary.append(command, now, events)
        self._carry_out(now)
        if not self._executing:
            self.flush(now)
        return seq

    @property
    def behind(self) -> bool:
        """Frames read and not yet acted on (a slice ended first): `run` is due again."""
        return any(self._inbox.values())

    def run(self, now: int, until: int | None = None) -> None:
        """Read what every worker sent, act on it, write what is pending, run the timer.
        With `until` (the loop's slice, on `clock`), no forwarded write is executed once
        the clock has passed it: the frames left wait for the next `run` (`behind`), which
        starts with the channel after the one cut, so each worker's writes get their turn."""
        workers = list(self.channels)
        start = self._first % len(workers) if workers else 0
        for index, worker in enumerate(workers[start:] + workers[:start]):
            if not self._act_on(worker, now, until):
                self._first = start + index + 1  # the next run starts after this one
                break
        if self._steps is not None:
            self._step_dump(now)
        deadline = self.primary.next_deadline()
        if deadline is not None and deadline <= now:
            self.primary.on_timer(now)
            self._carry_out(now)
        self.flush(now)

    def _act_on(self, worker: int, now: int, until: int | None) -> bool:
        """Act on what `worker` sent (read first if nothing of it is left); False when the
        slice ended with frames of it left."""
        channel = self.channels.get(worker)
        if channel is None:  # dropped while another worker's messages were acted on
            return True
        inbox = self._inbox.setdefault(worker, deque())
        if not inbox:
            try:
                inbox.extend(channel.receive())
            except ConnectionLost as exc:
                self._lose(worker, str(exc), now)
                return True
        while inbox:
            body = inbox.popleft()
            try:
                message = decode_to_primary(body)
            except msgspec.DecodeError as exc:
                self._lose(worker, f"sent something unreadable: {exc}", now)
                return True
            if type(message) is Report:
                self._reported(worker, message.body)
                continue
            self.primary.on_message(worker, message, now)
            if type(message) is Forward:
                self._carry_out(now)  # executed now: the slice is measured after it
                if worker not in self.channels:
                    return True  # lost meanwhile (its channel refused what it was sent)
                if until is not None and inbox and self._clock() >= until:
                    return False
        self._carry_out(now)
        return True

    def broadcast(self, body: bytes, now: int) -> None:
        """Queue the figures of the whole (zns.core.figures) for every worker."""
        message = encode(Whole(body))
        for worker in list(self.channels):
            self._send(worker, message, now)

    @property
    def dumping(self) -> bool:
        """A dump is being made in steps: `run` is due again at once."""
        return self._steps is not None

    def _step_dump(self, now: int) -> None:
        assert self._steps is not None
        try:
            dump = next(self._steps)
        except Exception as exc:
            # A bug in the dump: the generator is finished, and left in place it would keep
            # `dumping` true and raise on every `run` from then on (before its timer and its
            # flush). No state is coming for the workers it was for: each is dropped (the
            # pool forks another, which serves the fork's copy and needs no dump).
            log.exception("the state could not be dumped for a state transfer")
            self._steps = None
            workers, self._awaiting_dump = self._awaiting_dump, []
            for worker in dict.fromkeys(workers):
                self._lose(worker, f"no state for it: {exc!r}", now)
            return
        if dump is None:
            return
        self._steps = None
        workers, self._awaiting_dump = self._awaiting_dump, []
        for worker in workers:
            self.primary.dumped(worker, self.primary.seq, dump)
        self._carry_out(now)

    def flush(self, now: int) -> None:
        """Write what is queued for every worker (what its socket takes now); each seq
        written whole goes to the worker's shared counter, then to the primary, and the
        fence that moves with it is written too. The worker whose forwarded write was just
        carried out comes last: its `Apply` then carries the fence as the other workers'
        writes made it, so it publishes the write's events as it reads it, without waiting
        for a `Fence` (it is often still running when the others are written to)."""
        writer, self._writer = self._writer, None
        self._flush_all(now)
        if writer is None:
            return
        messages, self._to_writer = self._to_writer, []
        for message in messages:
            if type(message) is Apply:
                fence = max(message.fence, self.primary.tell_fence(writer, message.seq))
                message = msgspec.structs.replace(message, fence=fence)
            self._send(writer, encode(message), now, written_mark(message))
        self._flush_all(now)

    def _flush_all(self, now: int) -> None:
        while True:
            moved = False
            for worker, channel in list(self.channels.items()):
                try:
                    channel.flush()
                except ConnectionLost as exc:
                    self._lose(worker, str(exc), now)
                    continue
                seq = channel.take_written()
                if seq is not None:
                    self._written[worker].set(seq)  # first: see the module's docstring
                    self.primary.written(worker, seq)
                    moved = True
            if not moved:
                return
            self._carry_out(now)

    def wait(self, timeout_ms: int | None) -> None:
        """Block until a channel is readable (or writable with bytes pending), or the timeout."""
        poller = select.poll()
        for channel in self.channels.values():
            poller.register(channel.fileno(),
                            select.POLLIN | (select.POLLOUT if channel.pending else 0))
        poller.poll(timeout_ms)

    def next_deadline(self) -> int | None:
        return self.primary.next_deadline()

    def close(self) -> None:
        for worker in list(self.channels):
            self._close(worker)

    def _close(self, worker: int) -> Channel | None:
        self._inbox.pop(worker, None)
        channel = self.channels.pop(worker, None)
        if channel is not None:
            channel.close()
            self._written.pop(worker).close()
        return channel

    def _lose(self, worker: int, reason: str, now: int) -> None:
        if self._close(worker) is None:
            return
        self.primary.leave(worker)
        log.warning("worker channel %d closed (%s): out of the fence", worker, reason)
        self._dropped(worker, reason)
        self._carry_out(now)

    def _carry_out(self, now: int) -> None:
        for action in self.primary.actions():
            match action:
                case Deliver(worker=worker, message=message):
                    if worker == self._writer:
                        self._to_writer.append(message)  # after the others: `flush`
                        continue
                    self._send(worker, encode(message), now, written_mark(message))
                case SendState(worker=worker, seq=seq):
                    if worker in self._forked:  # join's, at the seq of the fork: no dump
                        self._forked.discard(worker)
                        self.primary.dumped(worker, seq, b"")
                        self._carry_out(now)
                        continue
                    if self._dump_in_steps is None:
                        self.primary.dumped(worker, seq, self._dump())  # sent in parts:
                        self._carry_out(now)
                        continue
                    self._awaiting_dump.append(worker)
                    if self._steps is None:
                        self._steps = self._dump_in_steps()
                case Execute(worker=worker, token=token, request=request):
                    self._executing = True
                    if len(self.channels) > 1:  # else no other worker to write to first
                        self._writer = worker
                    try:
                        command, reply = self._execute(worker, request)
                        self._executing = False
                        seq = self.primary.seq if command is None \
                            else self.primary.append(command, now)
                        self.primary.answer(worker, token, seq, reply)
                        self._carry_out(now)
                    finally:
                        self._executing = False
                        # Its command and its answer, sent as soon as decided; and whatever
                        # was held for the writer goes out, in order, whatever was raised.
                        self.flush(now)
                case Drop(worker=worker, reason=reason):
                    if self._close(worker) is not None:
                        log.warning("worker channel %d dropped: %s", worker, reason)
                        self._dropped(worker, reason)

    def _send(self, worker: int, body: bytes, now: int, mark: int | None = None) -> None:
        channel = self.channels.get(worker)
        if channel is None:
            return
        try:
            channel.send(body, mark)
        except ConnectionLost as exc:
            self._lose(worker, str(exc), now)


class ReplicaLink:
    """A worker's side: a `Replica` fed from its channel.

    `apply(seq, command, produce)` applies a command to the worker's state machine and
    returns the events it made if `produce` (else they came with the command: none);
    `load(seq, dump)` replaces its state; `publish(seq, events)` hands events to the
    worker's subscribers; `reply(token, reply)` answers a
    forwarded write; `whole(body)` gets the state process's figures of the whole
    (zns.core.figures). `run()` raises `ConnectionLost` when the state process is gone,
    and msgspec.DecodeError on a message it cannot read (the state process's bug): either
    way the worker exits, and the state process starts another. `written`: the counter
    the state process sets (`WrittenSeq`), which `catch_up` reads.
    """

    def __init__(
        self,
        sock: socket.socket | FrameChannel,
        replica: Replica,
        *,
        apply: Callable[[int, bytes, bool], list[bytes]],
        load: Callable[[int, bytes], None],
        publish: Callable[[int, list[bytes]], None],
        reply: Callable[[int, bytes], None] = lambda token, reply: None,
        whole: Callable[[bytes], None] = lambda body: None,
        written: WrittenSeq | None = None,
        joined: Callable[[int], None] | None = None,
    ) -> None:
        """`sock`: the worker's end of its socketpair, or a follower's channel over the
        network; `joined`: a follower's, told its first remoting connection id."""
        self.channel: FrameChannel = Channel(sock) if isinstance(sock, socket.socket) else sock
        self.written = written
        self.replica = replica
        self.downstream: Downstream | None = None  # set when this worker serves followers
        self._whole, self._joined = whole, joined
        self._apply_command, self._load_state = apply, load
        self._publish_events, self._answer = publish, reply

    def run(self) -> None:
        """Apply what arrived, publish what the fence released, acknowledge (once for
        the whole batch read), write."""
        for body in self.channel.receive():
            message = decode_to_worker(body)
            if type(message) is Whole:
                self._whole(message.body)
                if self.downstream is not None:
                    self.downstream.whole(message.body)
            elif type(message) is Joined:
                if self._joined is not None:
                    self._joined(message.first_connection_id)
            else:
                self.replica.on_message(message)
        self._carry_out()
        self.channel.flush()

    def catch_up(self) -> None:
        """Before a read: apply every command the state process has written to this worker
        (its counter says which; the bytes are in the socket already), so that no read
        answers older than an event some worker may have published (the commit fence:
        zns.core.replication). Raises `Busy` when that cannot be done: the replica waits for
        a state, or nothing came for CATCH_UP_TIMEOUT_MS; `ConnectionLost`, msgspec's
        DecodeError or a bug of the replica's as `run` does."""
        written = self.written
        if written is None:
            return
        target = written.get()
        if target <= self.replica.applied:
            return
        give_up = time.monotonic() + CATCH_UP_TIMEOUT_MS / 1000
        while True:
            self.run()
            if self.replica.applied >= target:
                return
            if self.replica.awaiting_state:
                raise Busy("this worker is loading a new state; retry")
            left = give_up - time.monotonic()
            if left <= 0:
                raise Busy(f"this worker's replica is behind seq {target} for "
                           f"{CATCH_UP_TIMEOUT_MS} ms; retry")
            self.wait(min(WAIT_SLICE_MS, max(1, round(left * 1000))))

    @property
    def pending(self) -> int:
        """Bytes sent to the state process that its socket has not taken yet (it reads
        nothing, or slower than they come)."""
        return self.channel.pending

    def forward(self, request: bytes) -> int:
        """Send a write to the state process; `reply` gets its answer with this token."""
        token = self.replica.forward(request)
        self._carry_out()
        self.channel.flush()
        return token

    def report(self, body: bytes) -> None:
        """Send this worker's figures (zns.core.figures) to the state process."""
        self.channel.send(encode(Report(body)))
        self.channel.flush()

    def wait(self, timeout_ms: int | None) -> None:
        self.channel.wait(timeout_ms)

    def _carry_out(self) -> None:
        # Until none is left: applying a command whose events were not shipped releases them
        # as a new action, to be published now, not when the next message happens to arrive.
        # The acknowledgement comes last; the fence waits for none (zns.core.replication).
        while actions := self.replica.actions():
            for action in actions:
                match action:
                    case ApplyCommand(seq=seq, command=command, produce=produce):
                        events = self._apply_command(seq, command, produce)
                        if produce:
                            self.replica.produced(seq, events)
                        if self.downstream is not None:
                            self.downstream.applied(seq, command, action.events)
                    case LoadState(seq=seq, dump=dump):
                        self._load_state(seq, dump)
                        if self.downstream is not None:
                            self.downstream.loaded(seq)
                    case Publish(seq=seq, events=events):
                        self._publish_events(seq, events)
                    case Reply(token=token, reply=reply):
                        if self.downstream is None or not self.downstream.answered(token, reply):
                            self._answer(token, reply)
                    case SendToPrimary(message=message):
                        self.channel.send(encode(message))  # written by the caller


_STOPS = (signal.SIGINT, signal.SIGTERM)


def fork_worker(link: PrimaryLink, main: Callable[[socket.socket, WrittenSeq], int], now: int,
                *, forked: bool = False) -> tuple[int, int]:
    """Fork a worker that runs `main(its end of a new socketpair, the counter of what is
    written to it)` and exits with what it returns, with SIGHUP blocked until it installs
    its handler; returns (pid, worker id). `forked`: `main` serves the state its fork
    copied, so the worker's first state transfer carries no dump (`PrimaryLink.add`). The
    child first closes the state process's end of every other worker's channel, so that
    each worker reads EOF as soon as the state process dies (not only once every worker
    forked after it died too). The caller must have no threads but the state dump's
    writer, whose open descriptors the child closes (zns.drivers.state_file)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    written = WrittenSeq()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every object alive now (the modules, the state as forked) leaves the collected
    # generations for good, in both processes: no collection writes to their headers
    # again, so the pages that hold them stay shared instead of being copied by the first
    # full collection on either side (CPython's gc.freeze, meant for this). A frozen object
    # is never freed as part of a cycle; the state makes none (tests/test_workers_memory.py).
    gc.freeze()
    # The child starts with SIGHUP blocked, until the code it runs installs a handler of its
    # own (zns.drivers.sockets.handle_signals unblocks it): a SIGHUP that comes meanwhile (a
    # key reload while a worker starts) waits for that handler instead of running the
    # state process's copied one, or being lost while the worker reads the old keys.
    # SIGTERM and SIGINT wait too, until the child has reset them: one that came before
    # would run the state process's handler copied into the child, and be lost there (the
    # state process stopping as it forks signals the new worker at once: it would serve
    # until the grace's SIGKILL). The parent takes its own as soon as the fork returns.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP, *_STOPS})
    try:
        pid = os.fork()
    except BaseException:  # no child: this process's reloads, sockets and counter as before
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        ours.close()
        theirs.close()
        written.close()
        raise
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pid == 0:
        code = 1
        try:
            for sig in _STOPS:  # not the state process's handlers
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # one sent since: ends it now
            ours.close()
            for channel in link.channels.values():
                channel.sock.close()
            code = main(theirs, written)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    theirs.close()
    return pid, link.add(ours, now, forked=forked, written=written)

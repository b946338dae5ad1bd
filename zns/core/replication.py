"""Replication, sans-I/O: one writer's numbered commands carried to N read replicas, and
the commit fence that keeps every client from going back in time.

The state process (the only writer) numbers each state-changing command it
applies (`Primary.append` returns its `seq`); every worker process holds a
replica fed those commands in order (`Replica`). Commands and state dumps are
opaque bytes here: what they mean is the state machine's business, and these
objects are tested without one. Neither object touches a socket or a clock:
inputs come in with a `now` (integer ms), `actions()` hands out what to do, and
the primary's `next_deadline()` says when `on_timer` is due. The channel that
carries the messages is `zns.drivers.replication_link`.

The primary, per worker:

- sends each command once, in seq order, keeping at most `window` commands
  sent and not acknowledged (the channel to a worker therefore holds at most
  `window` commands, plus `transfer_window_bytes` of a state transfer and the
  small fence and answer messages: a worker that never reads cannot make the
  state process hold more);
- keeps the *tail*, the commands some worker has not been sent yet, bounded by
  `max_tail_commands` and `max_tail_bytes`. A worker whose next command has
  left the tail gets a state transfer instead (`SendState`: a dump at the
  current seq), once its window opens;
- drops a worker that left (`leave`), and one that holds an unacknowledged
  command for longer than `ack_timeout_ms` (`Drop`): neither holds the fence
  back a moment longer;
- admits a new worker (`join`) with a state transfer at the current seq.

A state transfer: `SendState` asks the driver for a dump; the driver may make
it in steps (the state machine's `dump_in_steps`, the loop serving between
them) and hands it over with the seq it is at (`dumped`: the seq asked, or a
later one when commands came during the steps). It is sent in parts of
`chunk_bytes`, at most `transfer_window_bytes` of them not yet acknowledged
(`Received`, which the replica sends once per batch, as `Ack`); the dump is
held only until its last part is handed out. Meanwhile the worker's commands
wait in the tail (within its bounds: past them the worker gets another
transfer) and follow the last part. The replica assembles the parts in order;
one that does not follow the part before ends the assembly and asks for a
state.

The commit fence is the lowest seq the primary has *written* to every live
worker (the current seq when there is none): the driver tells it (`written`)
once the kernel has taken every byte of a command's `Apply` (or of the last part
of a state) into that worker's channel. Whenever the fence moves, it is
announced to every worker. A worker holds the events of seq S until the fence
reaches S, and only then publishes them. A worker answers no read while a
command written to it is not applied: before each read it compares what its
channel was written (a counter the state process sets, in memory shared across
the fork, before it tells the primary) with what its replica applied, and reads
its channel until it has applied it all (the bytes are in its socket already).
So when any client has seen the event of S, S was written to every live worker,
and a pull made afterwards, on whatever worker, answers at S or later, though no
worker had to say it applied S: an event waits for no other process's turn. A
worker joins at the current seq (which the fence never exceeds) and must answer
nothing before its first state is loaded, so the fence never passes a worker
that can answer reads. The fence never moves back.

A worker is one thread that carries out every message of a batch (`actions()`,
until none is left) in one turn of its loop, serving no read in between. So the
replica publishes the events the fence already passed *before* the batch's
commands are applied: no read sees the state before them after that anyway. It
acknowledges the batch once applied (`Ack`: it opens the worker's window and
measures the replication lag; the fence needs none). The events come with the
command: the primary's state machine made
them when it executed it, and `Apply` carries them encoded (`shipped_events`:
up to MAX_SHIPPED_EVENT_BYTES, and the state process ships none of a command
that made more than MAX_SHIPPED_EVENTS; the replica of a command whose events
were not shipped produces its own as it applies it, and its events and every
later command's wait for that). A replica's state machine is deterministic (the same
commands give the same events): the events shipped are the ones it would make.

A lone worker need not wait for the `Fence`: each `Apply` carries the fence as
it will be once it is written, as far as the primary knows when sending it: the
lowest seq written to every *other* worker, capped at the command's own seq.
With one worker that is the command's seq, so the worker publishes the event as
it receives the command (before applying it, in the same turn). With several,
the `Fence` follows the `Apply`s as soon as the driver has written them all,
usually before the workers wake to read them. A worker that joins later counts
at once at the seq of its state, so every command sent after the join carries a
fence no higher than that seq until it is written to the new worker too.

Read-your-writes: a worker forwards a write (`Replica.forward`); the primary
executes it (`Execute`) and returns the reply with the seq of the command it
made (`Primary.answer`); the replica hands the reply out only once it has
applied that seq.

Acknowledgements are batched: the replica acknowledges at most once per batch
of messages the driver drained (the driver feeds them all, then calls
`actions()` until it returns nothing; only the first call after a batch has a
seq to acknowledge), with the highest seq received, never on a timer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

# Defaults, sized for route-table commands of at most a few KiB.
DEFAULT_WINDOW = 1024  # commands sent to one worker and not yet acknowledged
DEFAULT_MAX_TAIL_COMMANDS = 65_536  # commands held for workers not yet sent them
DEFAULT_MAX_TAIL_BYTES = 64 * 1024 * 1024
DEFAULT_ACK_TIMEOUT_MS = 10_000  # a worker silent this long with a command unacknowledged is dead
DEFAULT_MAX_HELD_BYTES = 64 * 1024 * 1024  # events a replica holds for the fence
DEFAULT_CHUNK_BYTES = 256 * 1024  # one part of a state transfer
DEFAULT_TRANSFER_WINDOW_BYTES = 1024 * 1024  # of it handed out and not yet received
MAX_LAG_SAMPLES = 65_536  # append times kept for the lag measurement
# A command's events travel in its `Apply` up to this size (a route change: a few hundred
# bytes); past it the replica makes its own, once applied. It bounds what the primary
# encodes in vain and what each `Apply` adds to the tail (counted in its bytes).
MAX_SHIPPED_EVENT_BYTES = 64 * 1024
# ... and of at most this many events: the primary makes no frames of a larger step's
# (a registration of thousands of topics), which would only be thrown away.
MAX_SHIPPED_EVENTS = 256


# --- the channel's messages ---------------------------------------------------------------


class Apply(msgspec.Struct, tag="apply", frozen=True):
    """Primary -> worker: the command numbered `seq`. `fence`: what the fence is once this
    is written, as far as the primary knew when it was written (the lowest seq written to
    every other worker, and `seq` itself: `seq` when this worker is the only one), so that
    a worker publishes an event without waiting for a `Fence` when it can. `events`: the
    events the command made in the primary, as frames [channel, body, ...]
    (`shipped_events`); None when they were too large to ship (the replica publishes its
    own)."""

    seq: int
    command: bytes
    fence: int = 0
    events: list[bytes] | None = None


class State(msgspec.Struct, tag="state", frozen=True):
    """Primary -> worker: the state as of `seq` (a state transfer), or the part of it from
    byte `offset` of `total` (-1: `dump` is the whole) of the primary's transfer number
    `transfer`."""

    seq: int
    dump: bytes
    offset: int = 0
    total: int = -1
    transfer: int = 0


class Fence(msgspec.Struct, tag="fence", frozen=True):
    """Primary -> worker: `seq` is written to every live worker; publish events up to it."""

    seq: int


class Answer(msgspec.Struct, tag="answer", frozen=True):
    """Primary -> worker: the reply to forwarded write `token`, readable once `seq` is applied."""

    token: int
    seq: int
    reply: bytes


class Joined(msgspec.Struct, tag="joined", frozen=True):
    """Follower gateway -> follower (a read replica on another host: zns.drivers.followers),
    before its state: admitted; its remoting connections are numbered from
    `first_connection_id`, in a range of the gateway worker's own, so that the state
    process's broker ties never name two connections with one id. A primary of a worker's
    channel sends none."""

    first_connection_id: int


class Ack(msgspec.Struct, tag="ack", frozen=True):
    """Worker -> primary: my replica has applied every command up to `seq`."""

    seq: int


class Forward(msgspec.Struct, tag="forward", frozen=True):
    """Worker -> primary: execute this write and answer `token`."""

    token: int
    request: bytes


class Received(msgspec.Struct, tag="received", frozen=True):
    """Worker -> primary: of state transfer number `transfer`, I have the first `size`
    bytes."""

    transfer: int
    size: int


class Resync(msgspec.Struct, tag="resync", frozen=True):
    """Worker -> primary: my replica saw a gap or a duplicate after `applied`; send a state."""

    applied: int


class Report(msgspec.Struct, tag="report", frozen=True):
    """Worker -> primary: the worker's own figures (zns.core.figures), opaque here; the
    links hand it on, past the replication objects."""

    body: bytes


class Whole(msgspec.Struct, tag="whole", frozen=True):
    """Primary -> worker: the figures of the whole (zns.core.figures), opaque here; the
    links hand it on, past the replication objects."""

    body: bytes


ToWorker = Apply | State | Fence | Answer | Whole | Joined
ToPrimary = Ack | Forward | Received | Resync | Report

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_to_primary = msgspec.msgpack.Decoder(ToPrimary)


def encode(message: ToWorker | ToPrimary) -> bytes:
    return _encoder.encode(message)


def decode_to_worker(body: bytes) -> ToWorker:
    """A primary's message; raises msgspec.DecodeError on anything else."""
    return _to_worker.decode(body)


def decode_to_primary(body: bytes) -> ToPrimary:
    """A worker's message; raises msgspec.DecodeError on anything else."""
    return _to_primary.decode(body)


def shipped_events(frames: Iterable[tuple[bytes, bytes]],
                   limit: int = MAX_SHIPPED_EVENT_BYTES) -> list[bytes] | None:
    """A command's event frames (channel, body) as `Apply.events`, or None once they pass
    `limit` bytes (read no further: each frame may be encoded only as it is read)."""
    events: list[bytes] = []
    size = 0
    for channel, body in frames:
        size += len(channel) + len(body)
        if size > limit:
            return None
        events += (channel, body)
    return events


# --- the primary's actions ----------------------------------------------------------------


@dataclass(frozen=True)
class Deliver:
    """Send `message` to worker `worker`."""

    worker: int
    message: ToWorker


@dataclass(frozen=True)
class SendState:
    """Dump the state for worker `worker` and hand it to `Primary.dumped` with the seq it
    is at: `seq` (the current seq) if dumped before the next `append`, or later if made
    in steps meanwhile. `dumped` sends it in parts (`State`, `chunk_bytes` each)."""

    worker: int
    seq: int


@dataclass(frozen=True)
class Execute:
    """Execute the write worker `worker` forwarded, then call `Primary.answer` with `token`."""

    worker: int
    token: int
    request: bytes


@dataclass(frozen=True)
class Drop:
    """Worker `worker` is out of the fence for good (`reason`): close its channel, stop it."""

    worker: int
    reason: str


PrimaryAction = Deliver | SendState | Execute | Drop


@dataclass
class _Transfer:
    """A state transfer under way: the dump (None until `dumped`), the bytes handed out
    and the bytes the worker said it received."""

    number: int  # the primary's count of transfers: each has its own
    seq: int
    dump: bytes | None = None
    sent: int = 0
    received: int = 0


@dataclass
class _Follower:
    applied: int  # the highest seq it acknowledged (its transfer's seq when it joined)
    sent: int  # the highest seq handed out for it (as a command or a state)
    written: int  # the highest seq in its channel (`Primary.written`; the join's seq at first)
    told: int = 0  # the highest fence it was sent (in a `Fence`, or with an `Apply`)
    waiting_since: int | None = None  # when it last had nothing unacknowledged, or last acked
    transfer: _Transfer | None = None  # its commands wait (in the tail) until it is sent


class Primary:
    """The state process's side: numbers commands, feeds workers, computes the fence."""

    def __init__(
        self,
        *,
        now: int,
        window: int = DEFAULT_WINDOW,
        max_tail_commands: int = DEFAULT_MAX_TAIL_COMMANDS,
        max_tail_bytes: int = DEFAULT_MAX_TAIL_BYTES,
        ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        transfer_window_bytes: int = DEFAULT_TRANSFER_WINDOW_BYTES,
        seq: int = 0,
    ) -> None:
        if min(window, max_tail_commands, max_tail_bytes, ack_timeout_ms, chunk_bytes,
               transfer_window_bytes) < 1:
            raise ValueError("window, tail bounds, ack timeout and transfer sizes must be "
                             "positive")
        self.window = window
        self.chunk_bytes = chunk_bytes
        self.transfer_window_bytes = transfer_window_bytes
        self.max_tail_commands = max_tail_commands
        self.max_tail_bytes = max_tail_bytes
        self.ack_timeout_ms = ack_timeout_ms
        self.seq = seq
        self.transfers = 0  # states sent (joins, resyncs, workers past the tail)
        self.dropped = 0  # workers dropped for silence or a protocol violation
        self._now = now
        self._workers: dict[int, _Follower] = {}
        self._next_id = 1
        # (seq, command, its events), seqs consecutive
        self._tail: deque[tuple[int, bytes, list[bytes] | None]] = deque()
        self._tail_bytes = 0
        self._announced = seq  # the fence last announced
        self._appended_at: deque[tuple[int, int]] = deque()  # (seq, now) not yet committed
        self._lags: list[int] = []
        self._actions: list[PrimaryAction] = []
        self._executes: list[PrimaryAction] = []  # handed out last: see `actions`

    # --- inputs ---------------------------------------------------------

    def append(self, command: bytes, now: int, events: list[bytes] | None = None) -> int:
        """The state machine applied `command`, which made `events` (`shipped_events`; None:
        too large to ship): number it and send it on; returns its seq."""
        self._now = max(self._now, now)
        self.seq += 1
        self._tail.append((self.seq, command, events))
        self._tail_bytes += _size(command, events)
        if len(self._appended_at) >= MAX_LAG_SAMPLES:
            self._appended_at.popleft()
        self._appended_at.append((self.seq, self._now))
        for worker in self._workers:
            self._pump(worker)
        self._trim()
        return self.seq

    def join(self, now: int) -> int:
        """Admit a new worker; returns its id. It is sent the state at the current seq and
        counts in the fence at once, as having applied that seq: it must answer nothing
        before that state is loaded."""
        self._now = max(self._now, now)
        worker = self._next_id
        self._next_id += 1
        self._workers[worker] = _Follower(applied=self.seq, sent=self.seq, written=self.seq)
        self._transfer(worker)
        return worker

    def leave(self, worker: int) -> None:
        """Worker `worker`'s channel closed (it died): out of the fence at once."""
        self._workers.pop(worker, None)
        self._trim()

    def on_message(self, worker: int, message: ToPrimary, now: int) -> None:
        """A decoded message from `worker`."""
        self._now = max(self._now, now)
        follower = self._workers.get(worker)
        if follower is None:
            return  # from a worker already dropped: its channel is closing
        match message:
            case Ack(seq=seq):
                if seq < follower.applied or seq > follower.sent:
                    self._drop(worker, f"acknowledged seq {seq} outside "
                                       f"{follower.applied}..{follower.sent}")
                    return
                follower.applied = seq
                follower.waiting_since = self._now if seq < follower.sent else None
                self._pump(worker)
                self._trim()
            case Resync():
                self._transfer(worker)
            case Received(transfer=number, size=size):
                transfer = follower.transfer
                if transfer is None or transfer.number != number \
                        or not transfer.received < size <= transfer.sent:
                    return  # of a transfer replaced by another, or nothing new
                transfer.received = size
                follower.waiting_since = self._now
                self._send_parts(worker)
            case Forward(token=token, request=request):
                self._executes.append(Execute(worker, token, request))

    def written(self, worker: int, seq: int) -> None:
        """The kernel took every byte of the `Apply` of `seq` into `worker`'s channel (or of
        the last part of its state at `seq`), and so of everything handed out for it before:
        the worker will apply it before it answers another read (see the module's
        docstring). The fence may pass it."""
        follower = self._workers.get(worker)
        if follower is None or seq <= follower.written:
            return  # dropped meanwhile, or said already
        if seq > follower.sent:
            raise ValueError(f"seq {seq} written to worker {worker}, past what was handed "
                             f"out for it ({follower.sent})")
        follower.written = seq

    def dumped(self, worker: int, seq: int, dump: bytes) -> None:
        """The dump a `SendState` asked for, as of `seq` (the state's seq when the dump
        was made: its seq or later, when it was made in steps while commands came): it
        is sent in parts of `chunk_bytes`, at most `transfer_window_bytes` of them
        unacknowledged (`Received`), and then the commands after `seq`."""
        follower = self._workers.get(worker)
        transfer = None if follower is None else follower.transfer
        if follower is None or transfer is None or seq < transfer.seq \
                or transfer.dump is not None:
            return  # dropped meanwhile, or asked for another state since
        if seq > self.seq:
            raise ValueError(f"a dump at seq {seq}, past the last command ({self.seq})")
        transfer.seq = follower.sent = seq
        transfer.dump = dump
        self._send_parts(worker)

    def answer(self, worker: int, token: int, seq: int, reply: bytes) -> None:
        """The reply to `worker`'s forwarded write `token`, whose command got `seq` (the
        current seq if the write changed nothing)."""
        if worker in self._workers:
            self._actions.append(Deliver(worker, Answer(token, seq, reply)))

    def on_timer(self, now: int) -> None:
        """Drop every worker that held a command unacknowledged past the ack timeout."""
        self._now = max(self._now, now)
        for worker, follower in list(self._workers.items()):
            since = follower.waiting_since
            if since is not None and now - since > self.ack_timeout_ms:
                self._drop(worker, f"no acknowledgement for {now - since} ms")

    # --- outputs --------------------------------------------------------

    @property
    def fence(self) -> int:
        """The lowest seq written to every live worker (the current seq with no worker)."""
        return min((f.written for f in self._workers.values()), default=self.seq)

    def tell_fence(self, worker: int, seq: int) -> int:
        """The fence an `Apply` of `seq` carries to `worker`, recorded as told to it (so it
        is sent no `Fence` of that; a lone worker is sent none): what the fence will be once
        that is written, as far as known now (the lowest seq written to every other worker,
        capped at `seq`). A driver that writes the other workers' channels first may tell
        it again just before it writes this one's (zns.drivers.replication_link)."""
        fence = min(seq, min((f.written for w, f in self._workers.items() if w != worker),
                             default=seq))
        follower = self._workers.get(worker)
        if follower is not None:
            follower.told = max(follower.told, fence)
        return fence

    def applied(self, worker: int) -> int | None:
        follower = self._workers.get(worker)
        return None if follower is None else follower.applied

    @property
    def workers(self) -> list[int]:
        return list(self._workers)

    def unapplied_since(self, worker: int) -> int | None:
        """When the first command `worker` has not applied was appended (`now` as `append`
        saw it); None when it applied every command or is no worker. Past MAX_LAG_SAMPLES
        commands behind, the oldest time kept (so a lag from it is a lower bound)."""
        follower = self._workers.get(worker)
        if follower is None or follower.applied >= self.seq or not self._appended_at:
            return None
        index = follower.applied + 1 - self._appended_at[0][0]
        return self._appended_at[max(0, min(index, len(self._appended_at) - 1))][1]

    @property
    def transfer_bytes(self) -> int:
        """Bytes of dumps held for state transfers under way (each until its last part is
        handed out)."""
        return sum(len(f.transfer.dump) for f in self._workers.values()
                   if f.transfer is not None and f.transfer.dump is not None)

    @property
    def tail(self) -> tuple[int, int]:
        """The tail held: (commands, bytes)."""
        return len(self._tail), self._tail_bytes

    def actions(self) -> list[PrimaryAction]:
        """What to do now, in order; each action is handed out once. A fence that moved
        since the last call is announced to every worker; `Execute`s come last, so every
        `SendState` of the batch is carried out (dumped at its seq) before an executed
        write appends a command."""
        fence = self.fence
        if fence > self._announced:
            self._announced = fence
            for worker, follower in self._workers.items():
                if follower.told < fence:
                    follower.told = fence
                    self._actions.append(Deliver(worker, Fence(fence)))
        applied = min((f.applied for f in self._workers.values()), default=self.seq)
        while self._appended_at and self._appended_at[0][0] <= applied:
            _, at = self._appended_at.popleft()
            if len(self._lags) < MAX_LAG_SAMPLES:
                self._lags.append(self._now - at)
        actions, self._actions, self._executes = self._actions + self._executes, [], []
        return actions

    def take_lags(self) -> list[int]:
        """Replication lag of each command every live worker applied since the last call, in
        ms: from its `append` to the last worker's `Ack` of it, as `now` saw it (at most
        MAX_LAG_SAMPLES kept between calls)."""
        lags, self._lags = self._lags, []
        return lags

    def next_deadline(self) -> int | None:
        """When `on_timer` must next run (None: only an input can change anything)."""
        waits = [f.waiting_since for f in self._workers.values() if f.waiting_since is not None]
        return min(waits) + self.ack_timeout_ms + 1 if waits else None

    # --- internals ------------------------------------------------------

    def _pump(self, worker: int) -> None:
        """Hand out the commands `worker`'s window has room for (a state if the tail lost
        the next one); none while a state is being sent to it."""
        follower = self._workers[worker]
        if follower.transfer is not None:
            return
        while follower.sent < self.seq and follower.sent - follower.applied < self.window:
            first = self._tail[0][0] if self._tail else self.seq + 1
            if follower.sent + 1 < first:
                self._transfer(worker)
                return
            seq, command, events = self._tail[follower.sent + 1 - first]
            self._actions.append(Deliver(worker, Apply(seq, command, self.tell_fence(worker, seq),
                                                       events)))
            if follower.sent == follower.applied:
                follower.waiting_since = self._now
            follower.sent = seq

    def _transfer(self, worker: int) -> None:
        follower = self._workers[worker]
        self.transfers += 1
        self._actions.append(SendState(worker, self.seq))
        if follower.waiting_since is None:
            follower.waiting_since = self._now  # a state does not restart a running clock
        follower.sent = self.seq
        # Replaces one under way: its parts stop, and what the worker says of it is ignored.
        follower.transfer = _Transfer(self.transfers, self.seq)

    def _send_parts(self, worker: int) -> None:
        """Hand out the parts of `worker`'s state its transfer window has room for; once
        the last is handed out, the dump is let go and its commands flow again."""
        follower = self._workers[worker]
        transfer = follower.transfer
        assert transfer is not None and transfer.dump is not None
        dump, total = transfer.dump, len(transfer.dump)
        if not total:  # an empty dump is one empty part
            self._actions.append(Deliver(worker, State(transfer.seq, b"", 0, 0,
                                                       transfer.number)))
        while transfer.sent < total and \
                transfer.sent - transfer.received < self.transfer_window_bytes:
            part = dump[transfer.sent:transfer.sent + self.chunk_bytes]
            self._actions.append(Deliver(worker, State(transfer.seq, part, transfer.sent, total,
                                                       transfer.number)))
            transfer.sent += len(part)
        if transfer.sent >= total:
            follower.transfer = None
            if follower.applied >= follower.sent:
                follower.waiting_since = None  # joined at this seq: nothing unacknowledged
            self._pump(worker)

    def _trim(self) -> None:
        """Forget commands every worker was sent; then hold the tail to its bounds (a worker
        that needed what is forgotten gets a state instead)."""
        lowest = min((f.sent for f in self._workers.values()), default=self.seq)
        while self._tail and self._tail[0][0] <= lowest:
            self._tail_bytes -= _size(*self._tail.popleft()[1:])
        while self._tail and (len(self._tail) > self.max_tail_commands
                              or self._tail_bytes > self.max_tail_bytes):
            self._tail_bytes -= _size(*self._tail.popleft()[1:])

    def _drop(self, worker: int, reason: str) -> None:
        self.dropped += 1
        self._workers.pop(worker, None)
        self._actions.append(Drop(worker, reason))
        self._trim()


def _size(command: bytes, events: list[bytes] | None) -> int:
    """What a command and its shipped events count in the tail's bytes."""
    return len(command) + (sum(map(len, events)) if events else 0)


# --- the replica ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyCommand:
    """Apply `command` (seq `seq`) to the replica's state machine; if `produce`, then call
    `Replica.produced(seq, events)` with the events it made (else they came with the
    command, and need not even be encoded). `events`: those that came with it (None when
    `produce`), for a follower gateway to pass on (zns.drivers.followers)."""

    seq: int
    command: bytes
    produce: bool = True
    events: list[bytes] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LoadState:
    """Replace the replica's state with `dump`, the state as of `seq`."""

    seq: int
    dump: bytes


@dataclass(frozen=True)
class Publish:
    """Publish these events (made by the command `seq`) to this worker's subscribers."""

    seq: int
    events: list[bytes]


@dataclass(frozen=True)
class Reply:
    """Answer the forwarded write `token` with `reply`: the replica can read it now."""

    token: int
    reply: bytes


@dataclass(frozen=True)
class SendToPrimary:
    message: ToPrimary


ReplicaAction = ApplyCommand | LoadState | Publish | Reply | SendToPrimary


class Replica:
    """A worker's side: applies in order, holds events for the fence and replies for its
    replica. Until its first state arrives it applies nothing (and its worker answers
    nothing); a gap or a duplicate makes it ask for a state and ignore commands until
    one arrives. Each `actions()` hands out first what need not wait for the batch's
    commands to be applied (the events the fence passed: see the module's docstring),
    then the rest in order, the acknowledgement last.

    Events held for the fence are bounded by `max_held_bytes`: past it the oldest are
    dropped (counted in `dropped_events`); their subscribers see a gap in revisions
    and pull, as after any lost event.
    """

    def __init__(self, *, max_held_bytes: int = DEFAULT_MAX_HELD_BYTES) -> None:
        # The last seq handed out to apply (its ApplyCommand, or the state of a LoadState):
        # applied as the module's docstring means it, since the driver carries it out
        # before it serves anything else, though after `on_message` returns.
        self.applied = 0
        self.fence = 0
        self.loaded = False  # a state arrived: the worker may answer reads
        self.awaiting_state = True
        self.resyncs = 0
        self.dropped_events = 0
        self.max_held_bytes = max_held_bytes
        self._acked = 0
        # (seq, its events) in seq order; None: to be produced by its replica (not shipped)
        self._held: deque[tuple[int, list[bytes] | None]] = deque()
        self._held_bytes = 0
        self._ahead: list[ReplicaAction] = []  # carried out before this batch's commands
        self._answers: deque[tuple[int, int, bytes]] = deque()  # (seq, token, reply)
        self._next_token = 1
        self._actions: list[ReplicaAction] = []
        # The transfer being assembled: (its number, seq, total, what came so far).
        self._parts: tuple[int, int, int, bytearray] | None = None
        self._received: tuple[int, int] | None = None  # to acknowledge: (transfer, bytes)

    # --- inputs ---------------------------------------------------------

    def on_message(self, message: ToWorker) -> None:
        match message:
            case Apply(seq=seq, command=command, fence=fence, events=events):
                if self.awaiting_state or seq != self.applied + 1:
                    # Not applied (stale: a state is on its way; or a gap or a duplicate),
                    # but read, so written to this worker: the fence it carries holds, and
                    # the primary sends no Fence of what it told so (`Primary.tell_fence`).
                    if self._raise_fence(min(fence, seq)):
                        self._release_events(self._ahead)
                    if not self.awaiting_state:
                        self._ask_state()
                    return
                self.applied = seq
                if events is None:
                    self._held.append((seq, None))
                elif events:
                    self._hold(seq, events)
                self._actions.append(ApplyCommand(seq, command, events is None, events))
                self._release_answers()
                self._raise_fence(min(fence, seq))
                self._release_events(self._ahead)  # this command's own too, if passed
            case State(seq=seq, dump=dump, offset=offset, total=total, transfer=number):
                if total >= 0:  # a part
                    whole = self._assemble(number, seq, dump, offset, total)
                    if whole is None:
                        return
                    dump = whole
                if seq < self.applied:
                    self._ask_state()
                    return
                self.applied = seq
                self.loaded = True
                self.awaiting_state = False
                self._actions.append(LoadState(seq, dump))
                self._release_answers()
            case Fence(seq=seq):
                if self._raise_fence(seq):
                    self._release_events(self._ahead)
            case Answer(token=token, seq=seq, reply=reply):
                self._answers.append((seq, token, reply))
                self._release_answers()

    def produced(self, seq: int, events: list[bytes]) -> None:
        """The command `seq` (just applied, its events not shipped) made `events`: held until
        the fence passes it, and the events of the commands before it were handed out."""
        for index, (held, waited) in enumerate(self._held):
            if held == seq and waited is None:
                del self._held[index]
                if events:
                    self._held.insert(index, (seq, events))
                    self._held_bytes += sum(map(len, events))
                    self._drop_oldest()
                break
        else:  # its place was dropped (past `max_held_bytes`) while it was being applied
            self.dropped_events += len(events) // 2  # frames: a channel and a body each
        self._release_events(self._actions)

    def forward(self, request: bytes) -> int:
        """Send a write to the primary; returns the token its `Reply` will carry."""
        token = self._next_token
        self._next_token += 1
        self._actions.append(SendToPrimary(Forward(token, request)))
        return token

    # --- outputs --------------------------------------------------------

    @property
    def held(self) -> tuple[int, int]:
        """Events held for the fence: (commands, bytes)."""
        return len(self._held), self._held_bytes

    def actions(self) -> list[ReplicaAction]:
        """What to do now, in order; each action is handed out once. It starts with the
        events the fence passed (publish them before applying: see the module's docstring)
        and ends with one acknowledgement of the highest seq received, if that moved (sent
        once the batch is applied); call it once per batch of messages, after feeding them
        all, and again until it returns nothing."""
        if self._received is not None:
            self._actions.append(SendToPrimary(Received(*self._received)))
            self._received = None
        if self.applied > self._acked and not self.awaiting_state:
            self._acked = self.applied
            self._actions.append(SendToPrimary(Ack(self.applied)))
        actions = self._ahead + self._actions
        self._ahead, self._actions = [], []
        return actions

    # --- internals ------------------------------------------------------

    def _assemble(self, number: int, seq: int, part: bytes, offset: int,
                  total: int) -> bytes | None:
        """Add a part of transfer `number` (the state at `seq`); the whole once its last
        part is here. Parts
        come in order (a transfer that replaces another starts again at offset 0); one
        that does not follow the part before ends the assembly and asks for a state (once:
        until one is loaded, the primary's ack timeout is what ends a worker that
        gets no whole state)."""
        if offset == 0:
            self._parts = (number, seq, total, bytearray())
        elif self._parts is None:
            return None  # the rest of an assembly already given up
        if self._parts[:3] != (number, seq, total) or len(self._parts[3]) != offset \
                or offset + len(part) > total:
            self._parts, self._received = None, None
            if not self.awaiting_state:
                self._ask_state()
            return None
        buffer = self._parts[3]
        buffer += part
        self._received = (number, len(buffer))
        if len(buffer) < total:
            return None
        self._parts = None
        return bytes(buffer)

    def _raise_fence(self, seq: int) -> bool:
        """Move the fence up to `seq` (never down); whether it moved."""
        if seq <= self.fence:
            return False
        self.fence = seq
        return True

    def _ask_state(self) -> None:
        self.awaiting_state = True
        self.resyncs += 1
        self._actions.append(SendToPrimary(Resync(self.applied)))

    def _hold(self, seq: int, events: list[bytes]) -> None:
        self._held.append((seq, events))
        self._held_bytes += sum(map(len, events))
        self._drop_oldest()

    def _drop_oldest(self) -> None:
        while self._held_bytes > self.max_held_bytes and self._held:
            _, dropped = self._held.popleft()
            if dropped is not None:  # else its events are dropped as they are produced
                self._held_bytes -= sum(map(len, dropped))
                self.dropped_events += len(dropped) // 2  # a channel and a body each

    def _release_events(self, into: list[ReplicaAction]) -> None:
        """Hand out the events the fence passed, in seq order: up to the first still to be
        produced by its replica."""
        held = self._held
        while held and held[0][0] <= self.fence and (events := held[0][1]) is not None:
            seq = held.popleft()[0]
            self._held_bytes -= sum(map(len, events))
            into.append(Publish(seq, events))

    def _release_answers(self) -> None:
        while self._answers and self._answers[0][0] <= self.applied and not self.awaiting_state:
            _, token, reply = self._answers.popleft()
            self._actions.append(Reply(token, reply))

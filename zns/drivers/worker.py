"""A worker process of `zns serve --workers N`: ZNS/1 served from a read replica.

The state process (zns.drivers.state_process) forks each worker with one end of
a socketpair (zns.drivers.replication_link). The worker waits for its first
state transfer, then builds an ordinary `Server` around a `ReplicaService`,
binding the public request and events ports (and the remoting port) with
SO_REUSEPORT beside the other workers. Its replica is fed the state process's commands in order
(`ReplicaLink`, a source of the loop):

- a **read** is answered from the replica, as a single process answers it;
- a **write** is forwarded to the state process, which applies it and answers
  with its outcome; the worker replies only once its replica has applied that
  write's command (read-your-writes). It does not wait: the request is parked
  (`WriteInFlight`, zns.core.forwarding) and the worker goes on serving;
  the driver that read it finishes it once the answer is here, from what
  its one decode kept (`WriteInFlight.resume`). Right after the forward it
  takes in what the state process wrote to it already, as before a read (the
  state process may have run while the worker sent: on its core, it does). A
  connection's later requests wait behind its write, so each connection is
  answered in order. At most `ForwardedWrites.max_in_flight` writes are out
  at once, and `max_queued_bytes` of them wait for the state process to read
  them (past either: `busy`), each for at most WRITE_TIMEOUT_MS (then: `busy`);
- **events** come with each command, made by the state process (the replica
  makes its own only for a command whose events were too many to ship), and
  are published to this worker's subscribers only once the commit fence has
  passed that command (every live worker applied it: zns.core.replication),
  usually as the command arrives, before the replica applies it in the same
  turn;
- the **remoting listener** (when configured) shares its port too; its
  connection ids start at `connection_range << CONNECTION_ID_BITS`, a range of
  its own that the state process gives each worker it starts (a replacement
  gets a new one), and the connections that close are forwarded as one
  `CloseConnections` command, those that forwarded a write only (one that
  wrote nothing tied no broker: its close changes nothing);
- **expiry and stalls** are the state process's: the replica applies the
  expiry steps it is sent and runs none itself. Each worker publishes its own
  `hb`, with the last revision the commit fence passed (`committed_revision`);
- **peer hints** (§10): every worker runs its own peer links (they connect
  out, which the state process never does) and forwards each hint as a
  `Suspect`; the state process replicates only one that shortened a deadline,
  so a hint every worker took changes the state once.

A worker whose state process is gone stops (nothing to follow); systemd or the
caller restarts the whole. A worker whose replica fails to apply a command
stops too (it acknowledged the command already), and the state process starts
another in its place.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass
from collections.abc import Callable, Sequence

import msgspec
import zmq

from zns import __version__
from zns.core.config import ServerConfig
from zns.core.errors import (
    Busy, ConfigError, ConnectionLost, ErrorReply, Internal, NoPermission, from_reply,
)
from zns.core.figures import REPORT_INTERVAL_MS, Overview, decode_overview, with_followers
from zns.core.followers import FollowerIds
from zns.core.figures import encode as encode_figures
from zns.core.forwarding import ForwardedWrites, WriteInFlight
from zns.core.remoting import DEFAULT_MAX_FRAME_BYTES
from zns.core.replication import Replica
from zns.core.schema import AnyRequest, Error, Reply, Status, StatusReply, decode_reply
from zns.core.service import Frames, NameService, log_change
from zns.core.state import (
    AnyCommand, CloseConnections, Outcome, StateMachine, Suspect, Write, decode_command,
)
from zns.drivers import cpus
from zns.drivers.followers import (
    HELLO_MS, SILENCE_MS, Gateway, NetworkChannel, check_fresh, connect,
)
from zns.drivers.kv_file import KvStore
from zns.drivers.loop import PollSet, Ready, Source
from zns.drivers.metrics import own_figures
from zns.drivers.replication_link import WAIT_SLICE_MS, ReplicaLink, WrittenSeq
from zns.drivers.request_router import peer_address
from zns.drivers.server import Server

log = logging.getLogger("zns")

# A forwarded write not answered within this long is answered `busy` (the state process
# drops a worker that acknowledges nothing for 10 s; this is the same bound the other way).
WRITE_TIMEOUT_MS = 30_000
# Revisions past the commit fence kept for the `hb` (ReplicaService.committed_revision):
# about 2 MiB at most; the events held for the fence are bounded too (64 MiB).
MAX_UNFENCED_REVISIONS = 16_384
# A worker's remoting connection ids carry its range in the bits above these: the state
# process ties each broker to the connection that registered it, whatever worker holds it.
# Each worker started gets a range of its own, a replacement too: the ties to a dead
# worker's connections stay until their brokers register again (docs/protocol.md §12), and
# the replacement's connections closing must not remove those brokers as `disconnected`.
CONNECTION_ID_BITS = 40
# Ranges 1..CONNECTION_RANGES - 1, taken in turn (range 0 is one process's): the ids stay
# under 2**62, within msgpack's integers. A range comes round again only after that many
# starts, long after the ties to its old connections were renewed or expired.
CONNECTION_RANGES = 1 << 22


def connection_range(start: int) -> int:
    """The range of remoting connection ids of the `start`th worker started (1, 2, ...):
    the first N workers' ranges are their numbers."""
    return (start - 1) % (CONNECTION_RANGES - 1) + 1


class WriteAnswer(msgspec.Struct, frozen=True):
    """State process -> worker: what a forwarded write did (its outcome, events left out)
    or why it was refused."""

    outcome: Outcome | None = None  # its `reply` and `events` left out: `reply` is
    reply: bytes = b""  # the reply, encoded (zns.core.schema.encode)
    error: Error | None = None


_answer_decoder = msgspec.msgpack.Decoder(WriteAnswer)


@dataclass
class Follows:
    """A follower's side of its ReplicaService (zns.drivers.followers): the NameServer
    endpoint it follows, its link (whose silence it answers `busy` past SILENCE_MS), the ids
    its remoting connections write under, and why it refuses every write (None: it passes
    them on, --follow-writes)."""

    endpoint: str
    channel: NetworkChannel
    ids: FollowerIds
    read_only: str | None


class ReplicaService(NameService):
    """A worker's NameService: reads from the replica, writes through the state process."""

    forwarded: ForwardedWrites
    logs_broker_changes = False  # the state process logs each once

    def __init__(self, worker: int, *, forked: Forked | None = None, **kwargs: object) -> None:
        super().__init__(KvStore(None), epoch="", **kwargs)  # type: ignore[arg-type]
        self.worker = worker  # 1..N, shown by `status`
        self._forked = forked
        self.overview: Overview | None = None  # the whole's last figures (`status`)
        self.link: ReplicaLink | None = None
        self.gone: Callable[[], None] = lambda: None  # ends the loop (Server.stop)
        self.stopping = False  # `stop_serving` was called: no write is forwarded any more
        # Applies what the state process wrote to this worker (ReplicaSource.catch_up, set
        # once it serves): `catch_up` runs it before each read and after each forward.
        self.take_in_written: Callable[[], None] = lambda: None
        self.follows: Follows | None = None  # a follower's (zns.drivers.followers)
        self.feeds_followers = False  # --followers: `status` lists each worker's followers
        self.forwarded = ForwardedWrites(timeout_ms=WRITE_TIMEOUT_MS)
        # The open remoting connections that forwarded a write: only their closes go to the
        # state process (`apply`).
        self._wrote: set[int] = set()
        # The revisions this replica reached that the commit fence has not passed yet, as
        # (seq, revision) in seq order, and the last one it passed: an `hb` carries that one,
        # not the table's own, which a pull at another worker may not answer at yet (§7: a
        # pull after any event, an `hb` too, answers no older revision).
        self._unfenced: deque[tuple[int, int]] = deque()
        self._fenced_revision = 0

    # --- the replica's side (ReplicaLink's callbacks) ---------------------

    def apply_command(self, seq: int, command: bytes, produce: bool) -> list[bytes]:
        """Apply the state process's command `seq`; if `produce`, its events as [channel,
        body, ...] (else the state process shipped them: their frames are not made here,
        though their routes' lists are still encoded, by `NameService._publish`)."""
        _, frames = NameService.apply(self, decode_command(command))
        self._reached(seq)
        return [part for frame in frames for part in frame] if produce else []

    def load(self, seq: int, dump: bytes) -> None:
        """The state transfer at `seq`. A worker's first one is at the seq it was forked at,
        and the fork copied the state process's machine at that seq: serving that copy skips
        decoding and loading the dump (about 80 ms of CPU at 10,000 topics), the largest
        part of a replacement's start."""
        forked, self._forked = self._forked, None
        if forked is not None and forked.seq == seq:
            self.use_state(forked.adopt())
            log.info("took the state at seq %d from the fork's copy", seq)
        elif not dump:  # the state process sends none only to a worker it just forked
            raise Internal(f"a state transfer at seq {seq} without a dump, and no copy "
                           f"of the state at that seq")
        else:
            self.load_state(dump, KvStore(None))
        self._unfenced.clear()  # a state replaces every revision the commands before it made
        self._reached(seq)

    def _reached(self, seq: int) -> None:
        revision = self.table.revision
        last = self._unfenced[-1][1] if self._unfenced else self._fenced_revision
        if revision != last:
            self._unfenced.append((seq, revision))
            if len(self._unfenced) > MAX_UNFENCED_REVISIONS:
                # The fence far behind (another worker not reading): the oldest is taken as
                # passed, as the oldest held events are dropped past their bound.
                self._fenced_revision = self._unfenced.popleft()[1]

    def committed_revision(self) -> int:
        link = self.link
        fence = link.replica.fence if link is not None else None
        if fence is None:
            return self.table.revision
        unfenced = self._unfenced
        while unfenced and unfenced[0][0] <= fence:
            self._fenced_revision = unfenced.popleft()[1]
        return self._fenced_revision

    def answered(self, token: int, reply: bytes) -> None:
        self.forwarded.answered(token, reply)

    # --- what the state process decides -----------------------------------

    def apply(self, command: AnyCommand) -> tuple[Outcome, Sequence[Frames]]:
        """A write, closed remoting connections or a peer's hint: applied by the state
        process. A write is forwarded and leaves as WriteInFlight, whose `resume` returns
        its answer once here (and this replica applied it); the boundaries around it
        (NameService.write logs the audit line with the sender known here) finish the
        request from that, without decoding it again. The events come from the replica,
        once committed."""
        if type(command) is CloseConnections:
            # Only a connection that forwarded a write can have tied a broker (a write is the
            # only command that ties one, and a connection's id is this worker's own), so
            # only those closes are sent: a peer opening and closing connections in a loop,
            # or clients that only read routes, cost the state process nothing. One tied in
            # this replica is sent too, whatever this worker remembers (it costs a lookup).
            # A follower's connections wrote under the ids its gateway gave (FollowerIds).
            follows = self.follows
            told = follows.ids.closed(command.connections) if follows is not None else [
                connection for connection in command.connections
                if connection in self._wrote or self.state.ties_any((connection,))]
            self._wrote.difference_update(command.connections)
            if not told:
                return Outcome(), []
            try:  # nobody waits for its answer: `answered` drops it
                self._send(CloseConnections(connections=told))
            except Busy as exc:
                log.error("remoting connections %s closed, not told to the state process: %s",
                          told, exc)
            return Outcome(), []
        if type(command) is Suspect:
            return self._suspect(command), []
        if type(command) is not Write:
            raise Internal(f"a worker applies no {type(command).__name__} of its own")
        follows = self.follows
        if follows is not None:
            if follows.read_only is not None:
                raise NoPermission(follows.read_only)
            check_fresh(follows.channel)
        if self.stopping:
            # Its answer would never come (the channel is gone, or this worker ends at the
            # end of the loop's pass): refused now, the client retries elsewhere at once
            # instead of waiting for its own timeout.
            raise Busy("this worker is stopping; retry")
        if command.connection is not None and follows is not None:
            command = msgspec.structs.replace(
                command, connection=follows.ids.passed_on(command.connection))
        writes = self.forwarded
        body = msgspec.msgpack.encode(command)
        link = self.link
        assert link is not None  # set before anything is served
        # Refused while what waits for the state process to read it would pass the bound:
        # its bytes, not the writes' count, are what a stalled state process leaves here.
        writes.admit(len(body), link.pending)
        if command.connection is not None and follows is None:
            self._wrote.add(command.connection)  # its close is sent, whatever this write does
        token = self._forward(body)
        writes.sent(token, command.now)
        # What the state process wrote to this worker already is taken in now, as before a
        # read: when it ran while this worker was sending (on this core, as under --cpus, it
        # does), the write's events leave and its answer is here before this worker goes on
        # with anything else: push p50 with one pinned worker +34 instead of +82 us over one
        # process (bench/results.md). Else there is nothing yet, and this costs a comparison.
        try:
            self.take_in_written()
        except Busy:
            pass  # a refusal is a read's; this write is at the state process either way
        raise WriteInFlight(token, lambda: self._answer(token))

    def _answer(self, token: int) -> tuple[Outcome, Sequence[Frames]]:
        """What forwarded write `token` did, from the state process's answer."""
        body = self.forwarded.take(token)
        if body is None:
            raise Busy("the state process did not answer this write in time; retry")
        answer = _answer_decoder.decode(body)
        if answer.error is not None:
            raise from_reply(answer.error)
        outcome = answer.outcome
        assert outcome is not None
        outcome.reply = decode_reply(answer.reply)
        return outcome, []

    def _suspect(self, command: Suspect) -> Outcome:
        """A peer's hint (§10) this worker's peer links took, sent to the state process,
        which applies it (and logs and replicates it only when it shortened a deadline, so
        the same hint taken by every worker changes the state once). Nobody waits for its
        answer: `answered` drops it, so the outcome here says nothing was shortened by this
        process. One about an address this replica does not hold is not sent, so a peer
        flooding hints about unknown brokers costs no message to the state process (a broker
        registered within the last replication round trip is held there and not here yet:
        a hint about it is missed, as a hint that came before its registration would be).
        Nor is one sent while `max_queued_bytes` wait for the state process to read them."""
        if (self.follows is not None and self.follows.read_only is not None) \
                or self.table.liveness(command.cluster, command.addr) is None:
            return Outcome()
        link = self.link
        assert link is not None  # set before anything is served
        if link.pending >= self.forwarded.max_queued_bytes:
            # The state process reads nothing (stalled): a peer's hints would pile up here
            # past the bound the writes keep to. One lost is an early warning missed (the
            # broker still expires by its own silence), as when libzmq drops it.
            log.debug("a peer hint about %s/%s dropped: the state process reads nothing",
                      command.cluster, command.addr)
            return Outcome()
        try:
            self._send(command)
        except Busy as exc:
            log.warning("a peer hint about %s/%s was not passed on: %s", command.cluster,
                        command.addr, exc)
        return Outcome()

    def _send(self, command: CloseConnections | Suspect) -> int:
        """Send `command` to the state process; the token its answer will carry."""
        return self._forward(msgspec.msgpack.encode(command))

    def _forward(self, body: bytes) -> int:
        """Send an encoded command to the state process; the token its answer will carry."""
        link = self.link
        assert link is not None  # set before anything is served
        try:
            return link.forward(body)
        except ConnectionLost:
            self.stop_serving()
            raise Busy("the state process is gone; retry at another NameServer") from None

    def admitted(self, first_connection_id: int) -> None:
        """A follower's: its gateway admitted it (again), and numbers its connections from
        `first_connection_id`. Once admitted again, the writes it forwarded before will never
        be answered (they went to another worker, or were sent before the gateway's new
        state): `busy` at once, not after WRITE_TIMEOUT_MS."""
        assert self.follows is not None
        ids = self.follows.ids
        if ids.first is not None:
            self.forwarded.lose_all()
            log.warning("admitted again by the NameServer it follows; writes in flight "
                        "answered busy")
        ids.rebase(first_connection_id)

    def stop_serving(self) -> None:
        """The state process is gone, or this replica failed: end the worker. The rest of
        the loop's pass forwards no write (`apply`) and answers no read (ReplicaSource)."""
        self.stopping = True
        self.gone()

    def expire(self, now: int) -> Sequence[Frames]:
        return []

    def next_deadline(self) -> int | None:
        return None

    def shift_deadlines(self, stall_ms: int) -> None:
        pass

    def catch_up(self) -> None:
        """Before a read: what was written to this worker taken in; a follower's refused
        (Busy) once its NameServer has been silent too long, not answered from old routes."""
        if self.follows is not None:
            check_fresh(self.follows.channel)
        self.take_in_written()

    def read(self, request: AnyRequest, now: int) -> Reply:
        follows = self.follows
        if follows is None or type(request) is not Status:
            # A follower answers `status` however long its NameServer has been silent: it
            # says how long (every other read is refused `busy` past SILENCE_MS).
            self.catch_up()  # the remoting listener's reads caught up already
        reply = super().read(request, now)
        if type(request) is Status and follows is not None:
            assert isinstance(reply, StatusReply)
            return msgspec.structs.replace(reply, follows=follows.endpoint,
                                           silent_ms=follows.channel.silent_ms())
        if type(request) is Status and self.worker:  # a follower's is a single process's
            assert isinstance(reply, StatusReply)
            overview = self.overview
            workers = list(overview.state.workers) if overview is not None else []
            if self.feeds_followers:
                workers = with_followers(workers, overview.reports if overview is not None
                                         else [])
            reply = msgspec.structs.replace(reply, worker=self.worker, workers=workers)
        return reply


_READ, _READ_WRITE = int(zmq.POLLIN), int(zmq.POLLIN | zmq.POLLOUT)


class ReplicaSource:
    """The replication channel as a source of the worker's loop, and the deadlines of the
    writes it forwarded."""

    what = "applying replicated commands"

    def __init__(self, link: ReplicaLink, writes: ForwardedWrites, stop: Callable[[], None],
                 stopping: Callable[[], bool] = lambda: False) -> None:
        """`stop` ends the worker (ReplicaService.stop_serving); `stopping` says whether it
        was (by this source or another: the worker serves on until its loop's pass ends)."""
        self._link, self._writes, self._stop, self._stopping = link, writes, stop, stopping
        self.failed = False  # its replica failed to apply a command (then it stops)
        self._poll: PollSet | None = None
        self._flags = 0  # what the channel is polled for

    def attach(self, poll: PollSet) -> None:
        self._poll = poll
        self._watch()

    def next_deadline(self, now: int) -> int | None:
        self._watch()
        return self._writes.next_deadline()

    def _watch(self) -> None:
        """Poll the channel for reading, and for writing while bytes are pending: a
        forwarded write larger than the socket's buffer (a registration of thousands of
        topics) goes on as the state process reads it. Polled for reading only, its rest
        waited for the next message from the state process (up to a second: its expiry
        step or the figures), which made a 10,000-topic registration take 0.5 s."""
        poll = self._poll
        if poll is None:  # not in a loop (yet)
            return
        flags = _READ_WRITE if self._link.channel.pending else _READ  # ints: once per pass
        if flags != self._flags:
            fd = self._link.channel.fileno()
            poll.unregister(fd)
            poll.register(fd, flags, self)
            self._flags = flags

    def run(self, ready: Ready, now: int, until: int) -> None:
        self._follow(self._link.run)
        self._writes.on_timer(now)

    def catch_up(self) -> None:
        """Before a read: apply what the state process wrote to this worker
        (`ReplicaLink.catch_up`); `Busy` if that cannot be done, and the worker stops if the
        state process is gone or its replica failed."""
        if not self._follow(self._link.catch_up):
            raise Busy("this worker is stopping; retry")

    def _follow(self, step: Callable[[], None]) -> bool:
        """Run a step of the replica's; False when the worker is stopping (ended by this step,
        before it, or elsewhere: a lost channel, the reporter)."""
        if self._stopping():
            # Refused, not stepped: the replica's `applied` may count commands that were
            # handed out and never applied (the failure, or a message that could not be
            # decoded, cut the batch short), so a catch-up would find nothing to take in and
            # a read would be answered from a state without them until the loop ends.
            return False
        try:
            step()
        except (ConnectionLost, msgspec.DecodeError) as exc:
            log.error("the state process is gone (%s); stopping", exc)
            self._stop()
            return False
        except Busy:
            raise
        except Exception:
            # A replica that failed to apply a command must not answer from a state
            # without it, nor hold every later event behind one never produced. Another
            # worker, started from a state transfer, takes its place.
            log.exception("a bug while applying the state process's commands; stopping")
            self.failed = True  # the worker exits with code 1: replaced at once
            self._stop()
            return False
        return True


class WorkerServer(Server):
    """A worker's `Server`: /readyz and /metrics show the whole (`overview`)."""

    def __init__(self, config: ServerConfig, worker: int, **kwargs: object) -> None:
        self.worker = worker
        self.overview = None
        super().__init__(config, **kwargs)  # type: ignore[arg-type]

    def ready(self) -> tuple[bool, str]:
        """Ready once the state process is (its own rule, /readyz as in one process) and
        this worker serves (it does: it loaded its state before it was made); a follower
        only while it hears from its NameServer."""
        if self.silent is not None and (silent := self.silent()) > SILENCE_MS:
            return False, f"this follower has heard nothing from its NameServer for {silent} ms"
        overview = self.overview
        if overview is None:
            who = f"worker {self.worker}" if self.worker else "this follower"
            return False, f"starting: {who} has no word from the state process yet"
        return overview.state.ready, overview.state.ready_why


class _Reporter:
    """Sends this worker's own counts to the state process once a second, the first at once."""

    what = "reporting figures"

    def __init__(self, link: ReplicaLink, gone: Callable[[], None]) -> None:
        self._link, self._gone = link, gone
        self.server: Server | None = None
        self._due = 0

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        return self._due if self.server is not None else None

    def run(self, ready: Ready, now: int, until: int) -> None:
        if self.server is None or now < self._due:
            return
        self._due = now + REPORT_INTERVAL_MS
        try:
            self._link.report(encode_figures(own_figures(self.server)))
        except ConnectionLost as exc:
            log.error("the state process is gone (%s); stopping", exc)
            self._gone()


class Forked:
    """The state process's state machine as the fork copied it into the worker, at `seq`."""

    def __init__(self, seq: int, machine: StateMachine) -> None:
        self.seq, self._machine = seq, machine

    def adopt(self) -> StateMachine:
        """The copy, over a KV store of its own in memory (the state process's is its file)."""
        self._machine.move_kv(KvStore(None))
        return self._machine


def worker_main(config: ServerConfig, worker: int, channel: socket.socket,
                written: WrittenSeq | None = None, *, started_at_ms: int,
                forked: Forked | None = None, connections: int | None = None) -> int:
    """A forked worker's life: load the first state, bind, serve until the state process
    goes or a signal stops it. Returns the exit code. `started_at_ms`: when the state
    process started (time.monotonic, one clock for every process of the host): `status`
    answers the NameServer's uptime, whichever worker answers and however young it is.
    An uncaught error is logged (so its every line names the worker) and ends it.
    `forked`: the state machine the fork copied, served instead of the first state
    transfer's dump when that is at the same seq. `connections`: the range of its remoting
    connection ids (`connection_range`; default: its number)."""
    name_worker_lines(worker)
    try:
        cpu = config.cpu_of(worker)
        if cpu is not None:  # before this worker starts a thread (checked by `zns serve`)
            cpus.pin(cpu)  # its lines name the worker
        elif config.pairs and worker != 1:  # forked from a state process paired with worker 1
            cpus.release([os.getpid()])
        return _serve(config, worker, channel, written, started_at_ms, forked,
                      worker if connections is None else connections)
    except ConfigError as exc:
        # A setting that held at start and fails now (a CURVE key file moved or damaged
        # since): one line, as one process refuses it, not a traceback at every start the
        # state process tries again (up to one every 5 s for as long as it stays so).
        log.critical("cannot start: %s", exc)
        return 1
    except Exception:
        log.critical("stopped by an uncaught error", exc_info=True)
        return 1


def _serve(config: ServerConfig, worker: int, channel: socket.socket | NetworkChannel,
           written: WrittenSeq | None, started_at_ms: int, forked: Forked | None,
           connections: int | None) -> int:
    """Serve as worker `worker`, or as a follower (`channel` a NetworkChannel, `connections`
    None: its gateway hands it its connection ids)."""
    service = ReplicaService(worker, forked=forked, started_at_ms=started_at_ms,
                             address_of=peer_address,
                             version=__version__, limits=config.limits)
    server: Server | None = None
    held: list[Sequence[Frames]] = []  # events released before the server exists

    def publish(seq: int, events: list[bytes]) -> None:
        frames = list(zip(events[::2], events[1::2]))
        if server is None:
            held.append(frames)
        else:  # sent now: usually before the command is applied (zns.core.replication)
            server.outbox.put(frames)
            server.outbox.run({}, 0, 0)
            # libzmq's I/O thread sends them on. Let it (and the subscribers, on this host)
            # have the core now, before this thread applies the command: with fewer cores
            # than runnable threads the kernel would otherwise run this thread on, and the
            # event would wait for it (about 75 us of push latency on 2 cores; bench/).
            os.sched_yield()

    def whole(body: bytes) -> None:
        try:
            overview = decode_overview(body)
        except msgspec.DecodeError as exc:  # the state process's bug: keep the last one
            log.error("unreadable figures from the state process: %s", exc)
            return
        service.overview = overview  # one reference each: the metrics thread reads them
        if server is not None:
            server.overview = overview

    follower = isinstance(channel, NetworkChannel)
    if isinstance(channel, NetworkChannel):
        service.follows = Follows(config.follow or "", channel, FollowerIds(), None if
                                  config.follow_writes else
                                  f"this NameServer is a read replica of {config.follow} (a "
                                  f"follower without --follow-writes): send writes there")
    link = ReplicaLink(channel, Replica(), apply=service.apply_command, load=service.load,
                       publish=publish, reply=service.answered, whole=whole, written=written,
                       joined=service.admitted if follower else None)
    service.link = link
    try:
        hello, warn = 0.0, time.monotonic() + SILENCE_MS / 1000
        while not link.replica.loaded or (service.follows is not None
                                          and service.follows.ids.first is None):
            if follower and time.monotonic() >= hello:  # admits it (zns.drivers.followers)
                hello = time.monotonic() + HELLO_MS / 1000
                link.report(b"")
            if follower and time.monotonic() >= warn:
                warn = time.monotonic() + 60
                log.warning("no state from %s yet: is it reachable, is its --followers this "
                            "endpoint, and is this follower's key in its --followers-keys? "
                            "(waiting)", config.follow)
            link.wait(WAIT_SLICE_MS)
            link.run()
    except (ConnectionLost, msgspec.DecodeError) as exc:
        log.error("no state from the state process (%s)", exc)  # named by the filter
        return 1
    reporter = _Reporter(link, service.stop_serving)
    replicating = ReplicaSource(link, service.forwarded, service.stop_serving,
                                lambda: service.stopping)
    sources: list[Source] = [replicating, reporter]
    ctx = zmq.Context()
    gateway = None
    if config.followers and not follower:
        gateway = Gateway(ctx, link, lambda: service.state.dump_in_steps(),
                          connections or worker,
                          CONNECTION_ID_BITS, _refusal, _audit,
                          max_request_bytes=max(config.max_message_bytes,
                                                DEFAULT_MAX_FRAME_BYTES))
        sources.append(gateway)
    # A follower's remoting connection ids are its own (FollowerIds gives the ones passed on).
    first = 1 if follower else ((connections or worker) << CONNECTION_ID_BITS) + 1
    server = WorkerServer(config, worker, context=ctx, service=service,
                          reuse_port=not follower, first_connection_id=first,
                          extra_sources=sources)
    server.overview = service.overview
    server.replica = link.replica
    reporter.server = server
    service.gone = server.stop
    if service.follows is not None:
        server.silent = service.follows.channel.silent_ms
    service.take_in_written = replicating.catch_up
    if gateway is not None:
        assert server.security is not None and config.followers  # both checked by ServerConfig
        try:
            bound = gateway.bind(server.security, server.descriptors, config.followers)
        except (OSError, zmq.ZMQError) as exc:
            server.close()
            raise ConfigError(f"cannot bind {config.followers}: {exc}") from exc
        link.downstream = gateway
        server.following = lambda: gateway.shown
        service.feeds_followers = True
        log.info("feeding followers on %s", bound)
    for frames in held:
        server.outbox.put(frames)
    log.info("loaded the state at seq %d (pid %d)", link.replica.applied, os.getpid())
    server.run()
    return 1 if replicating.failed else 0


def _refusal(error: ErrorReply) -> bytes:
    """A forwarded write's answer that refuses it with `error`."""
    return msgspec.msgpack.encode(WriteAnswer(error=error.reply(0)))


def _audit(body: bytes, by: str) -> None:
    """The audit line of a follower's write this worker forwarded, once answered (the
    follower logs its own, naming its client)."""
    outcome = _answer_decoder.decode(body).outcome
    if outcome is not None and outcome.change is not None:
        log_change(outcome.change, by)


def follow_main(config: ServerConfig) -> int:
    """`zns serve --follow`: serve as a follower of another host's NameServer (a read replica:
    zns.drivers.followers) until a signal stops it. Returns the exit code."""
    ctx = zmq.Context()
    assert config.follow and config.follow_server_key and config.follow_keypair  # ServerConfig
    sock = connect(ctx, config.follow, config.follow_server_key, config.follow_keypair)
    log.info("following %s", config.follow)
    started = int(time.monotonic() * 1000)
    try:
        # Worker 0: its /metrics and `status` are a single process's, not the NameServer's
        # workers' (its own figures unlabelled; `status` names no worker).
        return _serve(config, 0, NetworkChannel(sock), None, started, None, None)
    finally:
        sock.close(linger=0)


def name_worker_lines(worker: int) -> None:
    """Every line this process logs says `worker N: ` first: a filter on each handler of
    the root logger (a logger's own filter would miss its children's records, such as
    zns.zap's CURVE decisions), or on the zns logger when the root has none."""
    targets: list[logging.Filterer] = [*logging.getLogger().handlers] or [log]
    for target in targets:
        target.addFilter(_NamedWorker(worker))


class _NamedWorker(logging.Filter):
    """Every line a worker logs names it: `worker 2: ...`, each line of a traceback too."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker
        self.prefix = f"worker {worker}: "

    def filter(self, record: logging.LogRecord) -> bool:
        record.zns_worker = self.worker  # JSON lines carry it as a field of its own (logs.py)
        if isinstance(record.msg, str) and not record.msg.startswith(self.prefix):
            record.msg = self.prefix + record.msg
        # Formatted here, once, as a formatter would (it keeps a set exc_text as it is).
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        record.exc_text = record.exc_text and self._named(record.exc_text)
        record.stack_info = record.stack_info and self._named(record.stack_info)
        return True

    def _named(self, text: str) -> str:
        if text.startswith(self.prefix):  # named by another handler's filter
            return text
        return "\n".join(self.prefix + line for line in text.splitlines())


_FORMATTER = logging.Formatter()

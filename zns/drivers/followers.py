"""Followers: read replicas on other hosts, fed by the workers over TCP with CURVE.

`zns serve --workers N --followers tcp://*:PORT` makes each worker bind that port
too (SO_REUSEPORT, as its other ports) with a ROUTER that only the CURVE keys of
`--followers-keys` get into (a ZAP domain of its own). `zns serve --follow
tcp://HOST:PORT` on another host is a *follower*: one process that is a worker in
every way but its link, a DEALER to that port instead of a socketpair to a state
process (`NetworkChannel`). It answers reads from its replica, forwards writes,
publishes events to its own subscribers and binds its own ports; it holds no
KV file and no state dump.

The worker a follower's connection lands on is its *gateway* (`Gateway`): it
runs a `Primary` of its own (zns.core.replication: the same window, tail, state
transfers, acknowledgements and ack timeout as the state process's), fed with
every command its replica applies, at the same seq. So a follower follows the
state process one hop further down, as a Redis replica of a replica does; the
state process knows nothing of followers, and still has no endpoint an outside
peer can reach. A follower's write goes to its gateway, which forwards it to
the state process as one of its own, and answers the follower once its replica
applied it, with the seq the follower must apply before it replies
(read-your-writes for the follower's clients).

The rules this module keeps:

- **A follower is a consistency domain of its own.** The commit fence
  (zns.core.replication) spans the workers of one host: the state process
  knows when a command is in every worker's socket. It cannot know that of a
  follower behind a network, so a follower is outside it. Within a follower
  the rule of §7 holds as in a lone worker (it publishes an event before it
  applies the command, in the same turn, and answers no read in between); a
  client whose connections reach a follower *and* the NameServer's own workers
  can see an event on one and pull older routes on the other. Hence a
  follower is one process (`--follow` refuses `--workers` above 1), and a
  client must use one address for its requests and its events.
- **A follower that hears nothing refuses to answer.** Its gateway passes on
  the state process's figures once a second (`Whole`); a follower that heard
  nothing for SILENCE_MS refuses reads and writes with `busy` and is not
  ready (/readyz), rather than serving routes the state process may have
  expired since. Its DEALER reconnects by itself (libzmq), possibly to another
  worker: its next message (the figures it sends once a second, `Report`)
  makes that worker admit it, with a state transfer at its seq.
- **Bounded at the gateway.** At most MAX_FOLLOWERS joined at once per
  worker (another is not admitted, logged, and not heard again for
  READMIT_MS). Toward each, libzmq queues at most QUEUED_MESSAGES messages,
  and the `Primary` hands out at most its window of commands and transfer
  window of a state unacknowledged; a follower that reads nothing is dropped
  when that queue is full or at the ack timeout (10 s), whichever comes first.
  The dump of a transfer under way is held until its last part is handed out
  (the size of the state: 655 KiB at 1,000 brokers and 10,000 topics,
  bench/followers.py), one per follower at most. From each, libzmq queues RECEIVED_MESSAGES messages of at most this
  NameServer's largest request (FORWARD_MARGIN_BYTES more); a longer one ends
  the connection, one that cannot be decoded drops the follower, and so does
  asking for a state (each one a dump of the whole) more than
  STATES_PER_WINDOW times within STATE_WINDOW_MS. At most MAX_FORWARDED of
  the followers' writes wait for the state process at once (past it: `busy`).
  A dropped follower is admitted again, with a new state, once READMIT_MS have
  passed and it speaks again (it does every second).
- **Remoting connection ids stay unique.** The state process ties each
  RocketMQ broker to the connection id that registered it. A follower numbers
  its own connections as it likes, and passes on under another id
  (`FollowerIds`) each connection that writes: one of a range its gateway
  hands it (`Joined`), carved out of the gateway's own (the upper half of the
  worker's range, FOLLOWER_ID_BITS of ids per admission, FOLLOWER_SLOTS
  admissions per worker), so no other follower or worker is ever given it.
  The gateway passes on nothing over, and no close of, an id outside the
  range it handed that follower (a write over one is refused `busy`). Admitted again
  (by another worker, or after a new state), a follower gets a new range and
  forgets the ids it gave its connections: each is given a new one when it
  next writes (a registration then ties its broker to it), and the close of
  one that has not written since is not passed on (its broker stays tied to
  the old id until it registers again or expires, as after a worker's death).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import msgspec
import zmq

from zns.core.errors import Busy, ConnectionLost, ErrorReply, NoPermission
from zns.core.remoting import DEFAULT_MAX_FRAME_BYTES
from zns.core.schema import ADMIN_OPS, RegisterBroker, request_op
from zns.core.state import CloseConnections, Write, decode_command
from zns.core.replication import (
    Ack, Deliver, Drop, Execute, Joined, Primary, Resync, SendState, Whole, decode_to_primary,
    encode,
)
from zns.drivers.descriptors import DescriptorGuard
from zns.drivers.loop import PollSet, Ready
from zns.drivers.replication_link import READ_BUDGET, ReplicaLink, written_mark
from zns.drivers.request_router import TCP_TIMEOUT_MS
from zns.drivers.security import FOLLOWERS_DOMAIN, Security, curve_client
from zns.drivers.sockets import set_keepalive

log = logging.getLogger("zns")

MAX_FOLLOWERS = 16  # joined at once, per worker
MAX_FORWARDED = 1024  # writes forwarded for followers and not yet answered, per worker
# Messages queued by libzmq for one follower (its window of commands, the parts of a state in
# its transfer window, fences, answers and the figures): past it the follower is dropped.
QUEUED_MESSAGES = 4096
READMIT_MS = 5_000  # a dropped follower is not admitted again before this
MESSAGES_PER_TURN = 1000  # read from the followers per turn of the loop
# A message from the gateway: a command (a registration of thousands of topics, with its
# events) or a part of a state (256 KiB). From a follower: a forwarded write, which a
# follower takes up to its own --max-message-bytes (ZNS/1) or 16 MiB (a remoting frame).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
FORWARD_MARGIN_BYTES = 64 * 1024  # a forwarded write's own fields, around the request
RECEIVED_MESSAGES = 64  # queued by libzmq per follower before it stops reading (TCP pushes back)
STATES_PER_WINDOW = 3  # states a follower may ask for (Resync) per STATE_WINDOW_MS ...
STATE_WINDOW_MS = 10_000  # ... past which it is dropped (each costs a dump of the whole state)
SILENCE_MS = 5_000  # a follower that heard nothing this long answers `busy`
HELLO_MS = 1_000  # a follower not yet admitted says so this often
# The connection ids of followers: the upper half of the gateway worker's range
# (zns.drivers.worker.CONNECTION_ID_BITS), FOLLOWER_ID_BITS of them per admission.
FOLLOWER_ID_BITS = 30  # about a billion connections per follower
FOLLOWER_SLOTS = (1 << 9) - 1  # followers admitted over a worker's life
FOLLOWER_IDS = 1 << FOLLOWER_ID_BITS  # an admission's ids: first .. first + FOLLOWER_IDS - 2


class FollowerIds:
    """A follower's remoting connection ids as its gateway sees them: each of its own that
    writes is given one of the range of the follower's current admission."""

    def __init__(self) -> None:
        self.first: int | None = None  # none before the first admission
        self._next = 0
        self._ids: dict[int, int] = {}  # its own id -> the id passed on

    def rebase(self, first: int) -> None:
        """Admitted (again): ids from `first` on, the ones given so far forgotten."""
        self.first, self._next = first, first
        self._ids.clear()

    def passed_on(self, connection: int) -> int:
        """The id connection `connection` writes under; Busy when the range is used up."""
        given = self._ids.get(connection)
        if given is None:
            assert self.first is not None  # a follower serves once admitted
            if self._next >= self.first + FOLLOWER_IDS - 1:
                raise Busy("this follower has given every connection id of its range; it "
                           "gets a new one when its NameServer admits it again (a restart)")
            given = self._ids[connection] = self._next
            self._next += 1
        return given

    def closed(self, connections: list[int]) -> list[int]:
        """The ids passed on of these closed connections (those that wrote since the last
        admission), forgotten."""
        return [given for connection in connections
                if (given := self._ids.pop(connection, None)) is not None]


def follower_ids(worker_range: int, slot: int, id_bits: int) -> int:
    """The first remoting connection id of a follower admitted in `slot` (1..FOLLOWER_SLOTS) by
    the worker whose range is `worker_range` (its ids have `id_bits` bits)."""
    return (worker_range << id_bits) | (1 << (id_bits - 1)) | (slot << FOLLOWER_ID_BITS) | 1


class NetworkChannel:
    """A follower's link to its gateway: a DEALER, one ZeroMQ message per frame. What libzmq
    will not take now (no connection: the gateway restarting, the network gone) waits here,
    up to MAX_MESSAGE_BYTES; past that it is dropped: it was meant for an admission that
    ended (the next gateway takes a first message as a hello, and the follower answers the
    writes it had forwarded `busy` once admitted again)."""

    def __init__(self, sock: zmq.Socket, clock: Callable[[], float] = time.monotonic) -> None:
        self.sock = sock
        self._clock = clock
        self._out: deque[bytes] = deque()
        self._pending = 0
        self.heard = clock()  # when the gateway last sent anything

    @property
    def pending(self) -> int:
        return self._pending

    def fileno(self) -> zmq.Socket:
        return self.sock  # the loop polls the zmq socket itself

    def send(self, body: bytes, mark: int | None = None) -> None:
        if self._pending + len(body) > MAX_MESSAGE_BYTES:
            log.warning("%d bytes for the NameServer dropped: none reached it", self._pending)
            self._out.clear()
            self._pending = 0
        self._out.append(body)
        self._pending += len(body)

    def flush(self) -> bool:
        while self._out:
            try:
                self.sock.send(self._out[0], zmq.DONTWAIT)
            except zmq.Again:
                return False
            self._pending -= len(self._out.popleft())
        return True

    def receive(self, budget: int = READ_BUDGET) -> list[bytes]:
        frames: list[bytes] = []
        read = 0
        while read < budget:
            try:
                body = self.sock.recv(zmq.DONTWAIT)
            except zmq.Again:
                break
            frames.append(body)
            read += len(body)
        if frames:
            self.heard = self._clock()
        return frames

    def wait(self, timeout_ms: int | None) -> None:
        self.sock.poll(timeout_ms, zmq.POLLIN | (zmq.POLLOUT if self._out else 0))

    def silent_ms(self) -> int:
        """How long the gateway has sent nothing."""
        return int((self._clock() - self.heard) * 1000)

    def close(self) -> None:
        self.sock.close(linger=0)


def connect(ctx: zmq.Context, endpoint: str, server_key: str, keypair: str) -> zmq.Socket:
    """A follower's DEALER to a NameServer's --followers endpoint, a CURVE client with
    `keypair`. Raises KeyFileError on a bad key."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    # Messages wait for a completed connection, not for one being made: a send to a gateway
    # that is gone is refused (and kept by NetworkChannel) instead of vanishing into the
    # queue of a connection that will never complete.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    # A gateway whose host vanished: the connection closed by the kernel (no ZMTP heartbeat:
    # zns.drivers.sockets.set_keepalive), and libzmq connects again, maybe to another worker.
    set_keepalive(sock)
    sock.setsockopt(zmq.TCP_MAXRT, TCP_TIMEOUT_MS)
    curve_client(sock, server_key, keypair)
    sock.connect(endpoint)
    return sock


class _Follower:
    """A joined follower: its ROUTER identity, its CURVE key, the first of its connection ids,
    and when it last asked for states."""

    def __init__(self, identity: bytes, key: str | None, first_id: int) -> None:
        self.identity, self.key, self.first_id = identity, key, first_id
        self.resyncs: deque[int] = deque(maxlen=STATES_PER_WINDOW)

    def owns(self, connection: int) -> bool:
        """Whether remoting connection id `connection` is in this follower's range."""
        return self.first_id <= connection < self.first_id + FOLLOWER_IDS - 1


class Gateway:
    """A worker's followers: a ROUTER (bound by `bind` once the server exists) and a `Primary`
    fed with what this worker's replica applies; a source of the worker's loop, and the
    replica link's `Downstream`.

    `refuse(text)`: a forwarded write's answer refusing it (`busy`)."""

    what = "feeding followers"

    def __init__(self, ctx: zmq.Context, link: ReplicaLink, dump: Callable[[], bytes],
                 worker_range: int, id_bits: int, refuse: Callable[[ErrorReply], bytes],
                 audit: Callable[[bytes, str], None],
                 clock: Callable[[], float] = time.monotonic, *,
                 max_request_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        """`refuse(error)`: a forwarded write's answer refusing it; `audit(answer, by)`: the
        audit line of a forwarded write's answer, if its change is one (`by`: the follower);
        `max_request_bytes`: the largest request a follower may forward (this NameServer's
        own bound: the larger of --max-message-bytes and a remoting frame's)."""
        self.sock = sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a follower gone raises
        sock.setsockopt(zmq.SNDHWM, QUEUED_MESSAGES)
        sock.setsockopt(zmq.RCVHWM, RECEIVED_MESSAGES)
        sock.setsockopt(zmq.MAXMSGSIZE, max_request_bytes + FORWARD_MARGIN_BYTES)
        # A follower whose host vanished: its connection closed by the kernel, not by a ZMTP
        # heartbeat (which can abort libzmq 4.3.5: zns.drivers.sockets.set_keepalive).
        set_keepalive(sock)
        sock.setsockopt(zmq.TCP_MAXRT, TCP_TIMEOUT_MS)
        self._link, self._dump, self._refuse, self._clock = link, dump, refuse, clock
        self._audit = audit
        self._security: Security | None = None  # set by `bind`
        self._worker_range, self._id_bits = worker_range, id_bits
        self.primary = Primary(now=self._now(), seq=link.replica.applied)
        self._followers: dict[int, _Follower] = {}  # by the primary's id for it
        self._by_identity: dict[bytes, int] = {}
        self._slots: dict[bytes, int] = {}  # every identity admitted, and its slot
        self._refused: dict[bytes, int] = {}  # dropped: not admitted before then
        # our token -> (follower, its token, whom an audit line names: None for a broker write)
        self._forwarded: dict[int, tuple[int, int, str | None]] = {}
        self.admitted = 0  # admissions, for the log and tests

    def bind(self, security: Security, descriptors: DescriptorGuard, endpoint: str) -> str:
        """Bind `endpoint` (SO_REUSEPORT, beside the other workers) as a CURVE server of the
        followers' ZAP domain; returns the endpoint bound."""
        security.apply(self.sock, FOLLOWERS_DOMAIN)
        self._security = security
        return descriptors.bind(self.sock, endpoint, reuse_port=True).endpoint

    def _now(self) -> int:
        return int(self._clock() * 1000)

    # --- the loop's source -----------------------------------------------

    def attach(self, poll: PollSet) -> None:
        poll.register(self.sock, zmq.POLLIN, self)

    def next_deadline(self, now: int) -> int | None:
        return self.primary.next_deadline()

    def run(self, ready: Ready, now: int, until: int) -> None:
        for _ in range(MESSAGES_PER_TURN):
            try:
                frames = self.sock.recv_multipart(zmq.DONTWAIT, copy=False)
            except zmq.Again:
                break
            if len(frames) != 2:  # a DEALER sends two; nothing else gets in
                continue
            identity, body = frames[0].bytes, frames[1]
            follower = self._by_identity.get(identity)
            if follower is None:
                # Its first message only asks to be admitted: whatever it says was meant for
                # another admission (the follower sent it before it was told of this one).
                self._admit(identity, _user_id(body), now)
                continue
            try:
                message = decode_to_primary(body.bytes)
            except msgspec.DecodeError as exc:
                self._lose(follower, f"an unreadable message ({exc})")
                continue
            if type(message) is Ack and message.seq < (self.primary.applied(follower) or 0):
                continue  # sent before it was admitted again (its last state is later)
            if type(message) is Resync:
                resyncs = self._followers[follower].resyncs
                if len(resyncs) == STATES_PER_WINDOW and now - resyncs[0] < STATE_WINDOW_MS:
                    self._lose(follower, f"asked for {STATES_PER_WINDOW + 1} states within "
                                         f"{STATE_WINDOW_MS} ms")
                    continue
                resyncs.append(now)
            self.primary.on_message(follower, message, now)
        self.primary.on_timer(now)
        self._carry_out()

    # --- the replica's Downstream ---------------------------------------

    def applied(self, seq: int, command: bytes, events: list[bytes] | None) -> None:
        if self.primary.append(command, self._now(), events) != seq:
            # Not the next seq (cannot happen: a replica applies in order, and a state it
            # loads resets this): start again from the replica.
            log.error("followers: command seq %d after %d; admitting them again", seq,
                      self.primary.seq - 1)
            self.loaded(seq)
            return
        self._carry_out()

    def loaded(self, seq: int) -> None:
        """This worker's replica loaded a state at `seq`: its followers are admitted again,
        each with that state."""
        self.primary = Primary(now=self._now(), seq=seq)
        followers, self._followers, self._by_identity = self._followers, {}, {}
        self._forwarded.clear()  # the state process answers them to this worker anyway
        for follower in followers.values():
            self._join(follower.identity, follower.key, self._slots[follower.identity])
        self._carry_out()

    def whole(self, body: bytes) -> None:
        message = encode(Whole(body))
        for follower in list(self._followers):
            self._send(follower, message)

    def answered(self, token: int, reply: bytes) -> bool:
        forwarded = self._forwarded.pop(token, None)
        if forwarded is None:
            return False
        follower, theirs, by = forwarded
        if by is not None:
            self._audit(reply, by)
        # This worker's replica applied the write's command (the reply is released only
        # then), and the primary numbered it as it did: its current seq covers it.
        self.primary.answer(follower, theirs, self.primary.seq, reply)
        self._carry_out()
        return True

    # --- internals ------------------------------------------------------

    def _admit(self, identity: bytes, key: str | None, now: int) -> int | None:
        if now < self._refused.get(identity, 0):
            return None
        if len(self._followers) >= MAX_FOLLOWERS:
            log.warning("followers: a %d-th follower not admitted (%d at most per worker)",
                        len(self._followers) + 1, MAX_FOLLOWERS)
            self._refused[identity] = now + READMIT_MS
            return None
        slot = self._slots.get(identity)
        if slot is None:
            if len(self._slots) >= FOLLOWER_SLOTS:
                log.error("followers: this worker admitted %d followers, all it can number; "
                          "another reaches a newer worker", FOLLOWER_SLOTS)
                self._refused[identity] = now + READMIT_MS
                return None
            slot = len(self._slots) + 1
            self._slots[identity] = slot
        self.admitted += 1
        log.info("followers: admitted one (%d following this worker)", len(self._followers) + 1)
        return self._join(identity, key, slot)

    def _join(self, identity: bytes, key: str | None, slot: int) -> int:
        follower = self.primary.join(self._now())
        state = _Follower(identity, key, follower_ids(self._worker_range, slot, self._id_bits))
        self._followers[follower] = state
        self._by_identity[identity] = follower
        self._send(follower, encode(Joined(state.first_id)))
        return follower

    def _carry_out(self) -> None:
        while actions := self.primary.actions():
            for action in actions:
                match action:
                    case Deliver(worker=follower, message=message):
                        if self._send(follower, encode(message)):
                            mark = written_mark(message)
                            if mark is not None:
                                self.primary.written(follower, mark)
                    case SendState(worker=follower) if follower in self._followers:
                        began = time.perf_counter()
                        dump = self._dump()  # in one step: this worker serves nothing meanwhile
                        log.info("followers: a state of %d bytes at seq %d for one (dumped in "
                                 "%.1f ms)", len(dump), self.primary.seq,
                                 (time.perf_counter() - began) * 1000)
                        self.primary.dumped(follower, self.primary.seq, dump)
                    case Execute(worker=follower, token=theirs, request=request):
                        self._execute(follower, theirs, request)
                    case Drop(worker=follower, reason=reason):
                        self._forget(follower, reason)

    def _execute(self, follower: int, theirs: int, request: bytes) -> None:
        state = self._followers.get(follower)
        if state is None:
            return  # dropped meanwhile
        try:
            command = decode_command(request)
        except msgspec.DecodeError as exc:
            self._lose(follower, f"an unreadable forwarded command ({exc})")
            return
        by = None
        match command:
            case Write(request=write, connection=connection):
                if connection is not None and not state.owns(connection):
                    # Named before this admission (or another's: never passed on).
                    self._answer(follower, theirs, self._refuse(Busy(
                        f"connection id {connection} is not of this follower's admission; "
                        f"retry")))
                    return
                # Only what its own key may do here: a follower's key stolen, or a follower
                # misconfigured (its clients checked against other keys), writes no more.
                try:
                    if self._security is None:
                        raise NoPermission("followers' writes are checked by CURVE keys")
                    self._security.policy.check(state.key, write)
                except NoPermission as exc:
                    self._answer(follower, theirs, self._refuse(NoPermission(
                        f"this NameServer refused its follower's write: {exc}")))
                    return
                if request_op(write) in ADMIN_OPS or type(write) is RegisterBroker:
                    by = f"follower {self._known_as(state.key)}"  # an audit line may name it
            case CloseConnections(connections=connections):
                # Only its own: one named before this admission is not passed on (its broker
                # stays tied to it until it registers again or expires), nor another's.
                owned = [connection for connection in connections if state.owns(connection)]
                if not owned:
                    return  # nobody waits for a close's answer
                if len(owned) < len(connections):
                    request = msgspec.msgpack.encode(CloseConnections(connections=owned))
            case _:  # a peer's hint: a follower's are its own business
                self._answer(follower, theirs, self._refuse(NoPermission(
                    f"a follower forwards no {type(command).__name__}")))
                return
        if len(self._forwarded) >= MAX_FORWARDED:
            self._answer(follower, theirs, self._refuse(Busy(
                f"{MAX_FORWARDED} followers' writes wait for the state process; retry")))
            return
        try:
            ours = self._link.forward(request)
        except ConnectionLost:  # this worker stops (its own next step says so)
            self._answer(follower, theirs, self._refuse(Busy("the state process is gone; "
                                                             "retry")))
            return
        self._forwarded[ours] = (follower, theirs, by)

    def _answer(self, follower: int, theirs: int, answer: bytes) -> None:
        self.primary.answer(follower, theirs, self.primary.seq, answer)

    def _known_as(self, key: str | None) -> str:
        name = None if key is None or self._security is None \
            else self._security.follower_name(key)
        return name or f"key {key}"

    def _send(self, follower: int, body: bytes) -> bool:
        """Send to `follower`; False (and the follower dropped) when libzmq will not take it:
        it is gone (ROUTER_MANDATORY), or it reads nothing and its queue is full."""
        state = self._followers.get(follower)
        if state is None:
            return False
        try:
            self.sock.send_multipart((state.identity, body), zmq.DONTWAIT)
        except zmq.ZMQError as exc:
            self.primary.leave(follower)
            self._forget(follower, "gone" if exc.errno == zmq.EHOSTUNREACH
                         else f"{QUEUED_MESSAGES} messages queued and unread")
            return False
        return True

    def _lose(self, follower: int, reason: str) -> None:
        self.primary.leave(follower)
        self._forget(follower, reason)

    def _forget(self, follower: int, reason: str) -> None:
        state = self._followers.pop(follower, None)
        if state is None:
            return
        del self._by_identity[state.identity]
        self._refused[state.identity] = self._now() + READMIT_MS
        if len(self._refused) > 4 * FOLLOWER_SLOTS:  # bounded: the oldest first
            for identity in list(self._refused)[:FOLLOWER_SLOTS]:
                del self._refused[identity]
        for ours, (owner, _, _) in list(self._forwarded.items()):
            if owner == follower:
                del self._forwarded[ours]
        log.warning("followers: one dropped: %s", reason)

    def close(self) -> None:
        self.sock.close(linger=0)


def _user_id(frame: zmq.Frame) -> str | None:
    """The CURVE key ZAP gave a message's sender (None without CURVE: tests in one process)."""
    try:
        key = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return key if isinstance(key, str) and key else None


def check_fresh(channel: NetworkChannel) -> None:
    """Before a follower answers: Busy when its gateway has said nothing for SILENCE_MS."""
    silent = channel.silent_ms()
    if silent > SILENCE_MS:
        raise Busy(f"this follower has heard nothing from its NameServer for {silent} ms; "
                   f"retry at another")


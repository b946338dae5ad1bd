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
- **Bounded at the gateway.** Who is admitted and what a follower may pass on
  is decided by `zns.core.followers.Admissions` (its bounds: MAX_FOLLOWERS at
  once, a state asked for at most STATES_PER_WINDOW times per
  STATE_WINDOW_MS, MAX_FORWARDED writes at once; each follower's range of
  remoting connection ids, which `FollowerIds` numbers on the follower's
  side). Here: toward each follower libzmq queues at most QUEUED_MESSAGES
  messages, and the `Primary` hands out at most its window of commands and
  transfer window of a state unacknowledged; a follower that reads nothing is
  dropped when that queue is full or at the ack timeout (10 s), whichever
  comes first. A transfer's dump is made in steps, one per turn of the loop
  (the longest 3.7 to 3.8 ms at 1,000 brokers and 10,000 topics, bench/followers.py),
  one dump for every follower that asked meanwhile, and held until its last
  part is handed out (the size of the state: 655 to 676 KiB there), at most one per
  follower. From each follower, libzmq queues RECEIVED_MESSAGES messages of
  at most this NameServer's largest request (FORWARD_MARGIN_BYTES more); a
  longer one ends the connection, one that cannot be decoded drops the
  follower. A dropped follower is admitted again, with a new state, once
  READMIT_MS have passed and it speaks again (it does every second).
- **A follower admitted again starts again.** Admitted by another worker (its
  gateway died), or sent a new state by its gateway, a follower answers the
  writes it had forwarded `busy` at once (their answers will not come), takes
  the new range of ids, and gives its connections new ones as they next
  write (a registration then ties its broker to the new id; the close of one
  that has not written since is not passed on, and its broker stays tied to
  the old id until it registers again or expires, as after a worker's death).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator

import msgspec
import zmq

from zns.core.errors import Busy, ConnectionLost, ErrorReply
from zns.core.figures import REPORT_INTERVAL_MS, follower_status
from zns.core.followers import (
    STATE_WINDOW_MS, STATES_PER_WINDOW, Admissions, Ignore, Lose, Pass, Refuse,
)
from zns.core.remoting import DEFAULT_MAX_FRAME_BYTES
from zns.core.replication import (
    Ack, Deliver, Drop, Execute, Joined, Primary, Resync, SendState, Whole, decode_to_primary,
    encode,
)
from zns.core.schema import FollowerStatus
from zns.drivers.descriptors import DescriptorGuard
from zns.drivers.loop import PollSet, Ready
from zns.drivers.replication_link import READ_BUDGET, ReplicaLink, written_mark
from zns.drivers.request_router import user_id
from zns.drivers.security import FOLLOWERS_DOMAIN, Security, curve_client
from zns.drivers.sockets import close_dead_peers

log = logging.getLogger("zns")

# Messages queued by libzmq for one follower (its window of commands, the parts of a state in
# its transfer window, fences, answers and the figures): past it the follower is dropped.
QUEUED_MESSAGES = 4096
MESSAGES_PER_TURN = 1000  # read from the followers per turn of the loop
# A message from the gateway: a command (a registration of thousands of topics, with its
# events) or a part of a state (256 KiB). From a follower: a forwarded write, which a
# follower takes up to its own --max-message-bytes (ZNS/1) or 16 MiB (a remoting frame).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
FORWARD_MARGIN_BYTES = 64 * 1024  # a forwarded write's own fields, around the request
# libzmq holds a CURVE message's own framing against MAXMSGSIZE (the MESSAGE command's name,
# nonce, flags and MAC): the option is that much larger than the longest message it lets in.
CURVE_MESSAGE_BYTES = 33
RECEIVED_MESSAGES = 64  # queued by libzmq per follower before it stops reading (TCP pushes back)
SILENCE_MS = 5_000  # a follower that heard nothing this long answers `busy`
HELLO_MS = 1_000  # a follower not yet admitted says so this often


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
    # A gateway whose host vanished: the connection closed by the kernel, and libzmq
    # connects again, maybe to another worker.
    close_dead_peers(sock)
    curve_client(sock, server_key, keypair)
    sock.connect(endpoint)
    return sock


class Gateway:
    """A worker's followers: a ROUTER (bound by `bind` once the server exists) and a `Primary`
    fed with what this worker's replica applies; a source of the worker's loop, and the
    replica link's `Downstream`. Who is admitted and what a follower may pass on is
    decided by `zns.core.followers.Admissions`."""

    what = "feeding followers"

    def __init__(self, ctx: zmq.Context, link: ReplicaLink,
                 dump_in_steps: Callable[[], Iterator[bytes | None]],
                 worker_range: int, id_bits: int, refuse: Callable[[ErrorReply], bytes],
                 audit: Callable[[bytes, str], None],
                 clock: Callable[[], float] = time.monotonic, *,
                 max_request_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        """`dump_in_steps()`: this worker's state made in steps (None after each, then the
        dump: zns.core.state.StateMachine.dump_in_steps), one step per turn of the loop, so
        that a state transfer holds no read back for long; one dump serves every follower
        that asked before it ended.
        `refuse(error)`: a forwarded write's answer refusing it; `audit(answer, by)`: the
        audit line of a forwarded write's answer, if its change is one (`by`: the follower);
        `max_request_bytes`: the largest request a follower may forward (this NameServer's
        own bound: the larger of --max-message-bytes and a remoting frame's)."""
        self.sock = sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a follower gone raises
        sock.setsockopt(zmq.SNDHWM, QUEUED_MESSAGES)
        sock.setsockopt(zmq.RCVHWM, RECEIVED_MESSAGES)
        sock.setsockopt(zmq.MAXMSGSIZE, max_request_bytes + FORWARD_MARGIN_BYTES
                        + CURVE_MESSAGE_BYTES)
        close_dead_peers(sock)  # a follower whose host vanished, or that reads nothing
        self._link, self._dump_in_steps, self._refuse, self._clock = (
            link, dump_in_steps, refuse, clock)
        self._steps: Iterator[bytes | None] | None = None  # a dump being made
        self._awaiting_dump: list[int] = []  # the followers it is for
        self._dump_steps, self._dump_longest = 0, 0.0  # of the dump under way
        self._audit = audit
        self._security: Security | None = None  # set by `bind`
        self.admissions = Admissions(worker_range, id_bits)
        self.primary = Primary(now=self._now(), seq=link.replica.applied)
        self._identities: dict[int, bytes] = {}  # the primary's id for a follower -> identity
        self._by_identity: dict[bytes, int] = {}
        # our token -> (follower, its token, whom an audit line names: None for a broker write)
        self._forwarded: dict[int, tuple[int, int, str | None]] = {}
        # Each follower as `status` and /metrics show it: made on the loop's thread at an
        # admission, a drop, and once a REPORT_INTERVAL_MS while any is fed (the gateway's
        # deadline: a follower that stopped sends nothing to wake it), and replaced whole,
        # never changed: the metrics thread reads it.
        self.shown: list[FollowerStatus] = []
        self._show_due = 0

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
        if self._steps is not None:
            return now
        due = self.primary.next_deadline()
        if self._identities:  # `shown` remade once a second, a follower that says nothing too
            due = self._show_due if due is None else min(due, self._show_due)
        return due

    def run(self, ready: Ready, now: int, until: int) -> None:
        if self._steps is not None:
            self._step_dump()
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
                self._admit(identity, _sender_key(body), now)
                continue
            try:
                message = decode_to_primary(body.bytes)
            except msgspec.DecodeError as exc:
                self._lose(follower, f"an unreadable message ({exc})")
                continue
            if type(message) is Ack and message.seq < (self.primary.applied(follower) or 0):
                continue  # sent before it was admitted again (its last state is later)
            if type(message) is Resync and not self.admissions.state_asked(
                    self.admissions.joined[identity], now):
                self._lose(follower, f"asked for {STATES_PER_WINDOW + 1} states within "
                                     f"{STATE_WINDOW_MS} ms")
                continue
            self.primary.on_message(follower, message, now)
        self.primary.on_timer(now)
        self._carry_out()
        if now >= self._show_due:
            self._show(now)

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
        """This worker's replica loaded a state at `seq`: its followers join again, each
        sent that state (their admissions and ranges stay)."""
        self.primary = Primary(now=self._now(), seq=seq)
        identities, self._identities, self._by_identity = self._identities, {}, {}
        self._forwarded.clear()  # the state process answers them to this worker anyway
        # A dump under way reads the state machine this one replaced, for followers the old
        # primary numbered: it is given up, and the joins below ask for a new one.
        self._steps = None
        self._awaiting_dump.clear()
        for identity in identities.values():
            self._join(identity)
        self._carry_out()

    def whole(self, body: bytes) -> None:
        message = encode(Whole(body))
        for follower in list(self._identities):
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
        self._answer(follower, theirs, reply)
        self._carry_out()
        return True

    # --- internals ------------------------------------------------------

    def _admit(self, identity: bytes, key: str | None, now: int) -> None:
        security = self._security
        name = (security.follower_name(key) if key is not None and security is not None
                else None) or f"key {key}"
        admitted = self.admissions.admit(identity, key, name, now)
        if isinstance(admitted, str):
            if admitted:
                log.warning("followers: one not admitted: %s", admitted)
            return
        log.info("followers: admitted %s (%d following this worker)", name,
                 len(self.admissions.joined))
        self._join(identity)
        self._show(now)

    def _join(self, identity: bytes) -> None:
        follower = self.primary.join(self._now())
        self._identities[follower] = identity
        self._by_identity[identity] = follower
        self._send(follower, encode(Joined(self.admissions.joined[identity].first_id)))

    def _carry_out(self) -> None:
        while actions := self.primary.actions():
            for action in actions:
                match action:
                    case Deliver(worker=follower, message=message):
                        if self._send(follower, encode(message)):
                            mark = written_mark(message)
                            if mark is not None:
                                self.primary.written(follower, mark)
                    case SendState(worker=follower) if follower in self._identities:
                        self._awaiting_dump.append(follower)
                        if self._steps is None:
                            self._steps = self._dump_in_steps()
                            self._dump_steps, self._dump_longest = 0, 0.0
                    case Execute(worker=follower, token=theirs, request=request):
                        self._execute(follower, theirs, request)
                    case Drop(worker=follower, reason=reason):
                        self._forget(follower, reason)

    def _step_dump(self) -> None:
        """One step of the dump under way; once it is made, it goes to every follower it is
        for (as of the seq this worker's replica is at: the steps started over if the state
        changed between them)."""
        assert self._steps is not None
        began = time.perf_counter()
        try:
            dump = next(self._steps)
        except Exception:
            # A bug in the dump: no state is coming for the followers it was for.
            log.exception("followers: the state could not be dumped for a state transfer")
            self._steps = None
            for follower in dict.fromkeys(self._awaiting_dump):
                self._lose(follower, "no state for it")
            self._awaiting_dump.clear()
            return
        took = time.perf_counter() - began
        self._dump_steps += 1
        self._dump_longest = max(self._dump_longest, took)
        if dump is None:
            return
        self._steps = None
        followers, self._awaiting_dump = self._awaiting_dump, []
        log.info("followers: a state of %d bytes at seq %d for %d (%d steps, the longest "
                 "%.1f ms)", len(dump), self.primary.seq, len(followers), self._dump_steps,
                 self._dump_longest * 1000)
        for follower in followers:
            self.primary.dumped(follower, self.primary.seq, dump)
        self._carry_out()

    def _execute(self, follower: int, theirs: int, request: bytes) -> None:
        identity = self._identities.get(follower)
        if identity is None:
            return  # dropped meanwhile
        security = self._security
        verdict = self.admissions.vet(self.admissions.joined[identity], request,
                                      security.policy if security is not None else None,
                                      len(self._forwarded))
        match verdict:
            case Pass(request=passed, audited_as=by):
                try:
                    ours = self._link.forward(passed)
                except ConnectionLost:  # this worker stops (its own next step says so)
                    self._answer(follower, theirs, self._refuse(Busy(
                        "the state process is gone; retry")))
                    return
                self._forwarded[ours] = (follower, theirs, by)
            case Refuse(error=error):
                self._answer(follower, theirs, self._refuse(error))
            case Lose(reason=reason):
                self._lose(follower, reason)
            case Ignore():
                pass  # nobody waits for a close's answer

    def _answer(self, follower: int, theirs: int, answer: bytes) -> None:
        self.primary.answer(follower, theirs, self.primary.seq, answer)

    def _send(self, follower: int, body: bytes) -> bool:
        """Send to `follower`; False (and the follower dropped) when libzmq will not take it:
        it is gone (ROUTER_MANDATORY), or it reads nothing and its queue is full."""
        identity = self._identities.get(follower)
        if identity is None:
            return False
        try:
            self.sock.send_multipart((identity, body), zmq.DONTWAIT)
        except zmq.ZMQError as exc:
            self._lose(follower, "gone" if exc.errno == zmq.EHOSTUNREACH
                       else f"{QUEUED_MESSAGES} messages queued and unread")
            return False
        return True

    def _lose(self, follower: int, reason: str) -> None:
        self.primary.leave(follower)
        self._forget(follower, reason)

    def _forget(self, follower: int, reason: str) -> None:
        identity = self._identities.pop(follower, None)
        if identity is None:
            return
        del self._by_identity[identity]
        self.admissions.drop(identity, self._now())
        for ours, (owner, _, _) in list(self._forwarded.items()):
            if owner == follower:
                del self._forwarded[ours]
        log.warning("followers: one dropped: %s", reason)
        self._show(self._now())

    def _show(self, now: int) -> None:
        """Make `shown` again: each follower fed, in the order of their admissions."""
        primary, joined = self.primary, self.admissions.joined
        self.shown = [
            follower_status(admitted.name, admitted.key, admitted.admitted_at,
                            applied=primary.applied(follower), seq=primary.seq,
                            oldest_unapplied_at=primary.unapplied_since(follower), now=now)
            for follower, identity in self._identities.items()
            if (admitted := joined.get(identity)) is not None]
        self._show_due = now + REPORT_INTERVAL_MS

    def close(self) -> None:
        self.sock.close(linger=0)


def _sender_key(frame: zmq.Frame) -> str | None:
    """The CURVE key ZAP gave a message's sender; None without CURVE (a gateway bound in one
    process, by tests): the frame then has no metadata to read."""
    try:
        return user_id(frame)
    except zmq.ZMQError:
        return None


def check_fresh(channel: NetworkChannel) -> None:
    """Before a follower answers: Busy when its gateway has said nothing for SILENCE_MS."""
    silent = channel.silent_ms()
    if silent > SILENCE_MS:
        raise Busy(f"this follower has heard nothing from its NameServer for {silent} ms; "
                   f"retry at another")


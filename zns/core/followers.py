"""Followers as their gateway sees them, sans-I/O: who is admitted, what each may pass on.

A follower (`zns serve --follow`, zns.drivers.followers) is a read replica on another host;
the worker its connection reaches is its gateway. The gateway feeds it with a
`zns.core.replication.Primary`; what it decides besides is here, without a socket or a
clock (each input comes with its `now`, in ms):

- **Admission** (`Admissions.admit`): at most `max_followers` at once; a follower dropped
  is not admitted again for READMIT_MS; each admission of a new follower takes a *slot*, and
  the slot gives it a range of remoting connection ids (`follower_ids`): the upper half of
  the gateway worker's own range, FOLLOWER_ID_BITS of ids per slot, FOLLOWER_SLOTS slots
  per worker's life. A follower that comes back to the same worker after it was dropped
  gets its slot, and so its range, again.
- **States asked** (`state_asked`): each is a dump of the whole state, made in steps
  by the gateway; more than STATES_PER_WINDOW within STATE_WINDOW_MS drops the follower.
- **What it passes on** (`vet`): a follower's key is not the state process's trust, so
  each command it forwards is decoded and checked here. A write goes on only if the
  follower's own key may make it at this NameServer (its roles there: `KeyPolicy.check`),
  over a connection id of its range (one named before this admission is refused `busy`:
  the follower names it again once it is told its new range); the closes of its own
  connections only (the others are left out); nothing else (a peer's hint is the
  follower's own business). At most MAX_FORWARDED writes at once (then `busy`).

The follower's side of the ids is `FollowerIds`: it numbers its own connections as it
likes and passes each that writes on under an id of its current range.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

from zns.core.errors import Busy, ErrorReply, NoPermission
from zns.core.keys import KeyPolicy
from zns.core.schema import ADMIN_OPS, RegisterBroker, request_op
from zns.core.state import CloseConnections, Write, decode_command

MAX_FOLLOWERS = 16  # joined at once, per worker
MAX_FORWARDED = 1024  # writes forwarded for followers and not yet answered, per worker
READMIT_MS = 5_000  # a dropped follower is not admitted again before this
STATES_PER_WINDOW = 3  # states a follower may ask for (Resync) per STATE_WINDOW_MS ...
STATE_WINDOW_MS = 10_000  # ... past which it is dropped (each costs a dump of the whole state)
FOLLOWER_ID_BITS = 30  # about a billion connection ids per admission
FOLLOWER_SLOTS = (1 << 9) - 1  # followers admitted over a worker's life
FOLLOWER_IDS = 1 << FOLLOWER_ID_BITS  # an admission's ids: first .. first + FOLLOWER_IDS - 2


def follower_ids(worker_range: int, slot: int, id_bits: int) -> int:
    """The first remoting connection id of a follower admitted in `slot` (1..FOLLOWER_SLOTS) by
    the worker whose range is `worker_range` (its ids have `id_bits` bits)."""
    return (worker_range << id_bits) | (1 << (id_bits - 1)) | (slot << FOLLOWER_ID_BITS) | 1


@dataclass
class Follower:
    """An admitted follower: its CURVE key (None without CURVE: tests), the name an audit line
    gives it, the first id of its range, and when it was admitted (this admission)."""

    key: str | None
    name: str
    first_id: int
    admitted_at: int
    resyncs: deque[int] = field(default_factory=lambda: deque(maxlen=STATES_PER_WINDOW))

    def owns(self, connection: int) -> bool:
        return self.first_id <= connection < self.first_id + FOLLOWER_IDS - 1


@dataclass(frozen=True)
class Pass:
    """Forward `request` to the state process; `audited_as`: the sender an audit line of its
    answer names (None: a write no audit line names)."""

    request: bytes
    audited_as: str | None = None


@dataclass(frozen=True)
class Refuse:
    """Answer it with `error`, forwarding nothing."""

    error: ErrorReply


@dataclass(frozen=True)
class Ignore:
    """Forward nothing, answer nothing (a close of nothing of its own: nobody waits)."""


@dataclass(frozen=True)
class Lose:
    """Drop the follower: it broke the protocol."""

    reason: str


Verdict = Pass | Refuse | Ignore | Lose


class Admissions:
    """A gateway's followers by their ROUTER identity (opaque bytes here)."""

    def __init__(self, worker_range: int, id_bits: int, *,
                 max_followers: int = MAX_FOLLOWERS) -> None:
        self.worker_range, self.id_bits = worker_range, id_bits
        self.max_followers = max_followers
        self.joined: dict[bytes, Follower] = {}
        self._slots: dict[bytes, int] = {}  # every identity admitted, and its slot
        self._refused: dict[bytes, int] = {}  # dropped, or turned away: not before then

    def admit(self, identity: bytes, key: str | None, name: str, now: int) -> Follower | str:
        """Admit a follower that spoke for the first time; else why not ("" when it was
        turned away within the last READMIT_MS: said already)."""
        if now < self._refused.get(identity, 0):
            return ""
        if len(self.joined) >= self.max_followers:
            self._refuse(identity, now)
            return f"a {len(self.joined) + 1}th follower ({self.max_followers} at most)"
        slot = self._slots.get(identity)
        if slot is None:
            if len(self._slots) >= FOLLOWER_SLOTS:
                self._refuse(identity, now)
                return (f"this worker admitted {FOLLOWER_SLOTS} followers, all it can number; "
                        f"another reaches a younger worker")
            slot = self._slots[identity] = len(self._slots) + 1
        follower = Follower(key, name, follower_ids(self.worker_range, slot, self.id_bits),
                            now)
        self.joined[identity] = follower
        return follower

    def drop(self, identity: bytes, now: int) -> Follower | None:
        """It is out (gone, broke the protocol, read nothing): not admitted again for
        READMIT_MS."""
        self._refuse(identity, now)
        return self.joined.pop(identity, None)

    def state_asked(self, follower: Follower, now: int) -> bool:
        """It asked for a state: False when that is one too many (drop it)."""
        asked = follower.resyncs
        if len(asked) == STATES_PER_WINDOW and now - asked[0] < STATE_WINDOW_MS:
            return False
        asked.append(now)
        return True

    def vet(self, follower: Follower, request: bytes, policy: KeyPolicy | None,
            in_flight: int) -> Verdict:
        """What to do with a command `follower` forwarded (`in_flight`: the followers' writes
        forwarded and not answered yet); `policy`: this NameServer's keys (None: none, and
        then no write goes on)."""
        try:
            command = decode_command(request)
        except msgspec.DecodeError as exc:
            return Lose(f"an unreadable forwarded command ({exc})")
        match command:
            case Write(request=write, connection=connection):
                if connection is not None and not follower.owns(connection):
                    return Refuse(Busy(f"connection id {connection} is not of this follower's "
                                       f"admission; retry"))
                try:
                    if policy is None:
                        raise NoPermission("followers' writes are checked by CURVE keys")
                    policy.check(follower.key, write)
                except NoPermission as exc:
                    return Refuse(NoPermission(f"this NameServer refused its follower's "
                                               f"write: {exc}"))
                if in_flight >= MAX_FORWARDED:
                    return Refuse(Busy(f"{MAX_FORWARDED} followers' writes wait for the state "
                                       f"process; retry"))
                audited = request_op(write) in ADMIN_OPS or type(write) is RegisterBroker
                return Pass(request, f"follower {follower.name}" if audited else None)
            case CloseConnections(connections=connections):
                owned = [connection for connection in connections if follower.owns(connection)]
                if not owned:
                    return Ignore()
                if len(owned) < len(connections):
                    request = msgspec.msgpack.encode(CloseConnections(connections=owned))
                return Pass(request)
            case _:
                return Refuse(NoPermission(f"a follower forwards no {type(command).__name__}"))

    def _refuse(self, identity: bytes, now: int) -> None:
        self._refused[identity] = now + READMIT_MS
        if len(self._refused) > 4 * FOLLOWER_SLOTS:  # bounded: the oldest first
            for stale in list(self._refused)[:FOLLOWER_SLOTS]:
                del self._refused[stale]


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
            if self.first is None:
                raise Busy("this follower is not admitted yet; retry")
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

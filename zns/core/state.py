"""The NameServer's state machine: every change of state is one command, through `apply`.

`StateMachine` owns the state and nothing else: the route table (brokers,
topics, liveness, revisions), which remoting connection registered each broker
(the ties of §12), the KV writes (through the KV backend it is handed), and the
namespaces a remoting delete emptied (Java keeps an emptied namespace's table, so
they change replies: they are state). Decoding, authorization, encoding, error
replies, the route encodings, the counters and the process status are the
boundary's (zns.core.service.NameService), which reads this machine and feeds it.

Rules a contributor keeps here (they are what lets replicas be fed the same
commands in the same order and hold the same state, as Redis feeds its replicas):

- **One way in.** Every change goes through `apply(command) -> Outcome`. A
  command is a tagged msgspec Struct (`Write`, `Renew`, `Expire`,
  `CloseConnections`, `ShiftDeadlines`, `Suspect`, `Restore`), so a log of them
  encodes, decodes and replays. A warm restart's dump comes in as `Restore` too
  (zns.core.warm), not through the table.
  Nothing else may change the route table, the ties, the KV entries or the
  emptied namespaces; the read methods and the `table` attribute are for reading.
- **No clock, no randomness, no I/O of its own.** Time is the command's `now`;
  the KV backend is the one thing it writes through, and a backend that cannot
  write raises before anything changed.
- **Deterministic.** The outcome and the state after a command depend only on
  the state before it and the command: never on hash seeds (iterate insertion
  orders or sorted keys, never a set), object ids or the time it runs.
  tests/test_state.py applies a seeded log of thousands of commands to two
  machines and compares every outcome and the dumps.
- **A command carries everything it depends on**: a write its request, its
  `now` and the remoting connection it came over (None: ZNS/1); the expiry step
  its `now`; a peer's suspicion the broker, the grace and `now`. Decisions made
  from anything else (the time, the process status, who is subscribed) are the
  boundary's, taken before the command is made.
- **All or nothing.** A refused command raises an `ErrorReply` and changes
  nothing; a replica applying the same command is refused the same way.
- **The outcome carries what a reply needs.** A writer never reads around its
  write: what the remoting replies need of the state at the same step (the
  DataVersion a heartbeat replaced, the count Java's perm writes answer, the order
  configurations a registration is answered with) is in the `Outcome`.
- **A replica may be fed a smaller command with the same effect, never another
  effect.** A registration that changes nothing but its address's liveness (when
  it was heard, its timeout, its DataVersion, its tie: `RouteTable.renews_only`)
  carries in its outcome the `Renew` that stands for it (`Outcome.renewal`), and
  the state process replicates that instead of the whole registration: applied
  to the same state it leaves the same state (the same dump) and the same
  outcome, in time independent of the topics it listed (a remoting one's
  outcome still copies the ORDER_TOPIC_CONFIG entries). Whoever changes what a
  registration may change keeps `renews_only` and `RouteTable.renew` exact:
  tests/test_state.py feeds one
  machine the registrations and another their renewals and compares every
  outcome and the dumps.
- **The whole state dumps and loads** (`dump`, `load`: zns.core.state_dump): a
  machine loaded from another's dump answers every later command as that one does.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from typing import Union, get_args

import msgspec
from msgspec import Struct

from zns.core.errors import Internal, UsageError
from zns.core.kv import KvBackend
from zns.core.limits import LIMITED_REQUESTS, Limits
from zns.core.routes import DUMP_STEP_WORK, Event, RouteTable
from zns.core.schema import (
    ORDER_TOPIC_CONFIG,
    AddWritePerm,
    AddWritePermReply,
    BrokerEvent,
    DataVersion,
    DeleteTopic,
    DeleteTopicReply,
    Heartbeat,
    HeartbeatReply,
    KvDelete,
    KvDeleteReply,
    KvPut,
    KvPutReply,
    RegisterBroker,
    RegisterBrokerReply,
    RegisterTopic,
    RegisterTopicReply,
    Reply,
    UnregisterBroker,
    UnregisterBrokerReply,
    WipeWritePerm,
    WipeWritePermReply,
)
from zns.core.state_dump import EncodedList, StateDump, TableDump
from zns.core.table_state import TableState

TieKey = tuple[str, str, str]  # (cluster, broker address, broker name) registered over remoting

# The requests that change state, whichever listener they came from.
WriteRequest = Union[RegisterBroker, Heartbeat, UnregisterBroker, WipeWritePerm, AddWritePerm,
                     DeleteTopic, RegisterTopic, KvPut, KvDelete]
WRITE_REQUESTS: frozenset[type] = frozenset(get_args(WriteRequest))


class Command(Struct, tag_field="command", frozen=True, kw_only=True):
    """One input that may change the state."""


class Write(Command, tag="write", frozen=True):
    """A write request, as decoded and authorized; `connection`: the remoting connection it
    came over (None: ZNS/1). A registration over one ties its broker to it, one over ZNS/1
    unties it; a heartbeat over one refreshes only a tied broker; a KV delete over one that
    empties a namespace remembers it (§12)."""

    request: WriteRequest
    now: int
    connection: int | None = None


class Expire(Command, tag="expire", frozen=True):
    """One expiry step (§8) at `now`: the brokers due go, reason `expired` or `peer_expired`."""

    now: int


class CloseConnections(Command, tag="close", frozen=True):
    """Remoting connections that closed together: what each registered goes, reason
    `disconnected`, as one step (§12)."""

    connections: list[int]


class ShiftDeadlines(Command, tag="shift", frozen=True):
    """The process stalled this long (§8): no broker is charged for it."""

    stall_ms: int


class Suspect(Command, tag="suspect", frozen=True):
    """A peer NameServer saw this broker leave (§10): shorten its deadline."""

    cluster: str
    addr: str
    grace_ms: int
    now: int


class Renew(Command, tag="renew", frozen=True):
    """A remoting or ZNS/1 registration that changed nothing but its address's liveness
    (`RouteTable.renews_only`), as the state process replicates it (`Outcome.renewal`):
    the address heard at `now` with this timeout and DataVersion, tied to `connection`
    (None: untied) as the registration ties it. It leaves the state as the registration
    left it and has the same outcome, in a few dictionary operations however many topics
    the registration listed (over remoting, plus a copy of the ORDER_TOPIC_CONFIG entries
    its outcome carries). Made by a machine, never sent by a peer: one that does not
    hold the address at this id raises UsageError, having changed nothing."""

    id: int  # the registration's request id, for the same reply
    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    heartbeat_timeout_ms: int
    data_version: DataVersion
    now: int
    connection: int | None = None


class Restore(Command, tag="restore", frozen=True):
    """A warm restart (zns.core.warm): take a dumped table into this machine, which holds
    no broker yet, as one revision and no events. Each of `table.addresses` is alive from
    `now` and removed as `not_confirmed` after its entry of `confirm_within_ms` (same
    order) unless it registers or heartbeats first; the order configurations are the KV
    store's, not the dump's. `emptied`: namespaces a remoting delete emptied, oldest
    first, remembered as if emptied in that order (so at most `max_kv_namespaces`, the
    latest). A table that does not hold together (`check_state`), or a window list of
    another length, raises ValueError, having changed nothing."""

    table: TableState
    confirm_within_ms: list[int]
    now: int
    emptied: list[str] = []


AnyCommand = Union[Write, Renew, Expire, CloseConnections, ShiftDeadlines, Suspect, Restore]


class Change(Struct, frozen=True):
    """An admin write's effect, for the audit trail (docs/operations.md): `what` was done to
    `target`, and its value before and after (None: none held)."""

    what: str  # the request's op: wipe_write_perm, add_write_perm, delete_topic, kv_put, ...
    target: str  # a broker name, a topic, "namespace/key", "cluster/name id N"
    before: str | int | None
    after: str | int | None


class Outcome(Struct):
    """What one command did: the events it caused and what its reply needs."""

    events: list[Event] = []
    # An admin write (or a registration that displaced another address): what it changed,
    # for the boundary's audit line. None for every other command, an ordinary
    # (re-)registration included.
    change: Change | None = None
    reply: Reply | None = None  # a Write's ZNS/1 reply
    # A Heartbeat over remoting: the DataVersion stored for its address before it (None:
    # none held); QUERY_DATA_VERSION answers it.
    data_version: DataVersion | None = None
    # WipeWritePerm and AddWritePerm: the broker name's topics with queue data after it,
    # changed or not: the count Java answers.
    broker_topics: int = 0
    # A RegisterBroker over remoting: the ORDER_TOPIC_CONFIG entries Java answers with
    # (None: Java would hold no such table, and answers no body).
    order_conf: dict[str, str] | None = None
    shortened: bool = False  # Suspect: the deadline was shortened
    # A RegisterBroker that changed nothing but liveness, and a Renew: the `Renew` a
    # replica applies instead of the command, to the same state and the same outcome.
    # None: the command itself.
    renewal: Renew | None = None


_command_decoder = msgspec.msgpack.Decoder(AnyCommand)
_dump_decoder = msgspec.msgpack.Decoder(StateDump)
# A state transfer's dump started over this many times for changes between its steps is
# then made in one step (StateMachine.dump_in_steps).
MAX_DUMP_RESTARTS = 2


def decode_command(data: bytes) -> AnyCommand:
    """A command as `msgspec.msgpack.encode(command)` wrote it (a replication log's entry)."""
    return _command_decoder.decode(data)


class StateMachine:
    def __init__(self, kv: KvBackend, *, epoch: str, limits: Limits | None = None) -> None:
        """A machine over `kv`, whose ORDER_TOPIC_CONFIG entries the routes carry from the
        start; `epoch`: the events' epoch (§7)."""
        self.table = RouteTable(epoch)  # read it; change it only through `apply`
        self.kv = kv  # likewise
        self.limits = limits or Limits()
        self._tie: dict[TieKey, int] = {}
        self._tied: dict[int, set[TieKey]] = {}
        # Namespaces a remoting DELETE_KV_CONFIG left empty, oldest first (bounded by
        # max_kv_namespaces): Java keeps an emptied namespace's table, so
        # GET_KVLIST_BY_NAMESPACE answers it with {"table":{}}.
        self._emptied: dict[str, None] = {}
        self._emptied_changes = 0  # see `changes`
        for topic, value in kv.list(ORDER_TOPIC_CONFIG).items():
            self.table.set_order_conf(topic, value)

    # --- the one way in ----------------------------------------------------------

    def apply(self, command: AnyCommand) -> Outcome:
        """Carry out one command; raises an ErrorReply on refusal, having changed nothing."""
        if type(command) is Write:
            return self._write(command.request, command.now, command.connection)
        match command:
            case Renew():
                return self._renew(command)
            case Expire(now=now):
                return Outcome(events=self._settled(self.table.expire(now)))
            case CloseConnections(connections=connections):
                return Outcome(events=self._close(connections))
            case ShiftDeadlines(stall_ms=stall_ms):
                self.table.shift_deadlines(stall_ms)
                return Outcome()
            case Suspect(cluster=cluster, addr=addr, grace_ms=grace_ms, now=now):
                return Outcome(shortened=self.table.suspect(cluster, addr, grace_ms, now))
            case Restore(table=table, confirm_within_ms=windows, now=now, emptied=emptied):
                self._restore(table, windows, now, emptied)
                return Outcome()
        raise Internal(f"no command {type(command).__name__}")

    # --- reads ---------------------------------------------------------------------

    def tied_connection(self, cluster: str, addr: str, name: str) -> int | None:
        """The remoting connection that registered this broker address under this name
        (None: registered over ZNS/1, or not held)."""
        return self._tie.get((cluster, addr, name))

    def ties_any(self, connections: Iterable[int]) -> bool:
        """Whether any of these remoting connections registered a broker still tied to it
        (else closing them changes nothing)."""
        tied = self._tied
        return any(connection in tied for connection in connections)

    def emptied(self, namespace: str) -> bool:
        """Whether a remoting delete emptied this namespace (and it is remembered)."""
        return namespace in self._emptied

    def emptied_namespaces(self) -> list[str]:
        """The namespaces a remoting delete emptied that are remembered, oldest first."""
        return list(self._emptied)

    @property
    def changes(self) -> int:
        """Moves with every change of what a warm restart's dump holds (zns.core.warm):
        the table's (`RouteTable.changes`) and the emptied namespaces'."""
        return self.table.changes + self._emptied_changes

    # --- the whole state -------------------------------------------------------------

    def dump(self, table: TableDump | None = None) -> bytes:
        """The whole state (zns.core.state_dump), encoded. `table`: the route table's, made in
        steps (`dump_in_steps`; None: read now)."""
        kv = self.kv
        return msgspec.msgpack.encode(StateDump(
            table=self.table.exact_dump() if table is None else table,
            ties=[(connection, *key) for key, connection in self._tie.items()],
            kv=[(ns, list(kv.list(ns).items())) for ns in kv.namespaces()],
            emptied=list(self._emptied)))

    def dump_in_steps(self, work: int = DUMP_STEP_WORK,
                      max_restarts: int = MAX_DUMP_RESTARTS) -> Iterator[bytes | None]:
        """`dump()` made in steps, so that the loop serves between them: None after each
        step, then the dump (the same bytes), as of the state when its last step ran.
        Each step reads `work` queue entries and `work` topics' revisions, and encodes
        what it read; the last also reads and encodes the rest (the other records, the
        times, ties, KV) and joins the pieces. The steps read the
        table as it is when each runs: a change of what they read between two steps
        (`RouteTable.changes`) starts them over, at most `max_restarts` times: the next
        change makes the dump in one step, so that a steady stream of changes cannot keep
        it from ending."""
        for _ in range(max_restarts + 1):
            dump = yield from self._dump_steps(work)
            if dump is not None:
                yield dump
                return
        yield self.dump()

    def _dump_steps(self, work: int) -> Generator[None, None, bytes | None]:
        """One try of `dump_in_steps`: None after each step but the last, which returns
        the dump; returns None at once when the table changed between two steps."""
        table = self.table
        changes = table.changes
        values, topics, revisions = EncodedList(), EncodedList(), EncodedList()
        # As many revisions a step as queue entries: a step reads at most `work` topics,
        # so the revisions are all read by the last step (the loop after it is a guard).
        revision_steps = table.topic_revisions_in_steps(work)
        for new_values, new_topics, more in table.queue_data_in_steps(work):
            values.extend(new_values)
            topics.extend(new_topics)
            revisions.extend(next(revision_steps, []))
            if more:
                yield None
                if table.changes != changes:
                    return None
        for step in revision_steps:
            revisions.extend(step)
        state = table.records(values.raw(), topics.raw())
        return self.dump(table.exact_dump(state, revisions.raw()))

    @classmethod
    def load(cls, data: bytes, kv: KvBackend, *, limits: Limits | None = None) -> StateMachine:
        """A machine holding what `dump` wrote, over `kv` (empty: the dump's KV entries are
        written to it). Raises msgspec.DecodeError or ValueError for a dump that is not one."""
        dump = _dump_decoder.decode(data)
        if kv.count():
            raise UsageError("load() writes the dump's KV entries into an empty store")
        machine = cls.__new__(cls)
        machine.table = RouteTable.from_exact_dump(dump.table)
        machine.kv = kv
        machine.limits = limits or Limits()
        machine._tie, machine._tied = {}, {}
        for connection, cluster, addr, name in dump.ties:
            machine._tie_to((cluster, addr, name), connection)
        for namespace, entries in dump.kv:
            for key, value in entries:
                kv.put(namespace, key, value)
        machine._emptied, machine._emptied_changes = {}, 0
        for namespace in dump.emptied:  # within this machine's bound, as the live path keeps them
            machine._remember_emptied(namespace)
        machine._emptied_changes = 0  # a load is not a change (`changes`)
        return machine

    def move_kv(self, kv: KvBackend) -> None:
        """Hold the KV entries in `kv` (empty) from now on: a forked worker's copy of the
        state process's machine, whose store is the state process's file."""
        if kv.count():
            raise UsageError("move_kv() copies the entries into an empty store")
        for namespace in self.kv.namespaces():
            for key, value in self.kv.list(namespace).items():
                kv.put(namespace, key, value)
        self.kv = kv

    def _restore(self, table: TableState, windows: list[int], now: int,
                 emptied: list[str]) -> None:
        if len(windows) != len(table.addresses):
            raise ValueError(f"{len(windows)} confirmation windows for "
                             f"{len(table.addresses)} addresses")
        window = {(a.cluster, a.addr): ms for a, ms in zip(table.addresses, windows)}
        self.table.restore(table, now, lambda cluster, addr, timeout: window[(cluster, addr)],
                           order_conf=self.kv.list(ORDER_TOPIC_CONFIG))
        for namespace in emptied:  # after the one step that can refuse: all or nothing
            self._remember_emptied(namespace)

    # --- writes ----------------------------------------------------------------------

    def _write(self, request: WriteRequest, now: int, connection: int | None) -> Outcome:
        table, rid = self.table, request.id
        if type(request) in LIMITED_REQUESTS:
            self.limits.check(request, table, self.kv)
        match request:
            case Heartbeat(cluster=c, broker_name=n, broker_addr=a, data_version=v):
                before = None
                if connection is not None:
                    live = table.liveness(c, a)
                    before = None if live is None else live.data_version
                    if (c, a, n) not in self._tie:
                        # Registered over ZNS/1 (or not at all): only its own channel
                        # keeps it alive.
                        return Outcome(reply=HeartbeatReply(id=rid, known=False, changed=True),
                                       data_version=before)
                known, changed = table.heartbeat(c, n, a, v, now)
                return Outcome(reply=HeartbeatReply(id=rid, known=known, changed=changed),
                               data_version=before)
            case RegisterBroker():
                renews = table.renews_only(request)  # asked before: it reads the state
                registered = table.register_broker(request, now)
                events = self._settled(registered.events)
                change = _displacement(request, events) if events else None
                self._tie_to((request.cluster, request.broker_addr, request.broker_name),
                             connection)
                renewal = Renew(id=rid, cluster=request.cluster,
                                broker_name=request.broker_name, broker_id=request.broker_id,
                                broker_addr=request.broker_addr,
                                heartbeat_timeout_ms=request.heartbeat_timeout_ms,
                                data_version=request.data_version, now=now,
                                connection=connection) if renews else None
                return Outcome(events=events, order_conf=self._order_conf_reply(connection),
                               change=change, renewal=renewal, reply=RegisterBrokerReply(
                    id=rid, master_addr=registered.master_addr, ha_addr=registered.ha_addr))
            case UnregisterBroker(cluster=c, broker_name=n, broker_addr=a):
                removed, events = table.unregister_broker(c, n, a)
                return Outcome(events=self._settled(events),
                               reply=UnregisterBrokerReply(id=rid, removed=removed))
            case WipeWritePerm(broker_name=name):
                # before/after: how many of the name's topics are writable
                before_writable = table.writable_topic_count(name)
                count, events = table.wipe_write_perm(name)
                return Outcome(events=events, broker_topics=table.broker_topic_count(name),
                               reply=WipeWritePermReply(id=rid, changed=count),
                               change=Change(what="wipe_write_perm", target=name,
                                             before=before_writable,
                                             after=table.writable_topic_count(name)))
            case AddWritePerm(broker_name=name):
                before_writable = table.writable_topic_count(name)
                count, events = table.add_write_perm(name)
                return Outcome(events=events, broker_topics=table.broker_topic_count(name),
                               reply=AddWritePermReply(id=rid, changed=count),
                               change=Change(what="add_write_perm", target=name,
                                             before=before_writable,
                                             after=table.writable_topic_count(name)))
            case DeleteTopic(topic=topic, cluster=cluster):
                # before/after: how many broker names hold queues of the topic
                queues = table.topic_queue_table()
                before_held = len(queues.get(topic, ()))
                removed, events = table.delete_topic(topic, cluster)
                target = f"{topic} in {cluster}" if cluster else topic
                return Outcome(events=events, reply=DeleteTopicReply(id=rid, removed=removed),
                               change=Change(what="delete_topic", target=target,
                                             before=before_held,
                                             after=len(queues.get(topic, ()))))
            case RegisterTopic(topic=topic, queues=queues):
                return Outcome(events=table.register_topic(topic, queues),
                               reply=RegisterTopicReply(id=rid))
            case KvPut(namespace=ns, key=key, value=value):
                # The durable write first: it is the step that can fail (`internal`, nothing
                # changed); set_order_conf refuses nothing, so the route change cannot fail
                # after it. In the other order a failed write would leave a revision bumped
                # and an event published for a value that is not stored.
                old = self.kv.get(ns, key)
                self.kv.put(ns, key, value)
                events = table.set_order_conf(key, value) if ns == ORDER_TOPIC_CONFIG else []
                return Outcome(events=events, reply=KvPutReply(id=rid), change=Change(
                    what="kv_put", target=f"{ns}/{key}", before=old, after=value))
            case KvDelete(namespace=ns, key=key):
                had = connection is not None and self.kv.count(ns) > 0
                old = self.kv.get(ns, key)
                removed = self.kv.delete(ns, key)
                events = table.set_order_conf(key, None) if ns == ORDER_TOPIC_CONFIG else []
                if had and not self.kv.count(ns):
                    self._remember_emptied(ns)
                return Outcome(events=events, reply=KvDeleteReply(id=rid, removed=removed),
                               change=Change(what="kv_delete", target=f"{ns}/{key}",
                                             before=old, after=None))
        raise Internal(f"no write {type(request).__name__}")

    def _renew(self, renew: Renew) -> Outcome:
        """What the registration `renew` stands for did (`RouteTable.renews_only`)."""
        master_addr, ha_addr = self.table.renew(
            renew.cluster, renew.broker_name, renew.broker_addr, renew.broker_id, renew.now,
            renew.heartbeat_timeout_ms, renew.data_version)
        self._tie_to((renew.cluster, renew.broker_addr, renew.broker_name), renew.connection)
        return Outcome(order_conf=self._order_conf_reply(renew.connection), renewal=renew,
                       reply=RegisterBrokerReply(id=renew.id, master_addr=master_addr,
                                                 ha_addr=ha_addr))

    def _order_conf_reply(self, connection: int | None) -> dict[str, str] | None:
        """The ORDER_TOPIC_CONFIG entries a registration over remoting is answered with
        (None: over ZNS/1, or Java would hold no such table and answers no body)."""
        if connection is None:
            return None
        entries = self.kv.list(ORDER_TOPIC_CONFIG)
        return entries if entries or ORDER_TOPIC_CONFIG in self._emptied else None

    def _remember_emptied(self, namespace: str) -> None:
        self._emptied_changes += 1
        self._emptied.pop(namespace, None)
        self._emptied[namespace] = None
        if len(self._emptied) > self.limits.max_kv_namespaces:
            del self._emptied[next(iter(self._emptied))]

    # --- the remoting ties (§12) -------------------------------------------------------

    def _close(self, connections: list[int]) -> list[Event]:
        """What these connections registered goes, reason `disconnected`: only the (cluster,
        address, name) entries each registered and nothing registered since (over another
        connection or ZNS/1); never a name another channel registered at the same address."""
        gone: list[tuple[str, str, str]] = []
        for connection in connections:
            for key in sorted(self._tied.pop(connection, ())):
                del self._tie[key]
                cluster, addr, name = key
                gone.append((cluster, name, addr))
        if not gone:
            return []
        return self._settled(self.table.unregister_brokers(gone, reason="disconnected"))

    def _settled(self, events: list[Event]) -> list[Event]:
        """`events`, after untying every broker they remove, whatever removed it."""
        for event in events:
            if type(event) is BrokerEvent and event.change == "removed":
                key = (event.cluster, event.broker_addr, event.broker_name)
                if (connection := self._tie.pop(key, None)) is not None:
                    self._untie(connection, key)
        return events

    def _tie_to(self, key: TieKey, connection: int | None) -> None:
        old = self._tie.pop(key, None)
        if old is not None:
            self._untie(old, key)
        if connection is not None:
            self._tie[key] = connection
            self._tied.setdefault(connection, set()).add(key)

    def _untie(self, connection: int, key: TieKey) -> None:
        keys = self._tied[connection]
        keys.discard(key)
        if not keys:
            del self._tied[connection]


def _displacement(request: RegisterBroker, events: list[Event]) -> Change | None:
    """The change a registration made by displacing another address (§4 steps 2 and 3: the
    id was held by another address, or this address moved cluster); None when it displaced
    none, as an ordinary (re-)registration."""
    displaced = [e for e in events if type(e) is BrokerEvent and e.reason == "displaced"]
    if not displaced:
        return None
    return Change(what="register_broker",
                  target=f"{request.cluster}/{request.broker_name} id {request.broker_id}",
                  before=", ".join(f"{e.cluster}/{e.broker_name} id {e.broker_id} at "
                                   f"{e.broker_addr}" for e in displaced),
                  after=request.broker_addr)

"""The NameServer as bytes in, bytes out: decode, dispatch, encode — still no I/O.

`NameService.respond` takes one request body and returns the reply body and
the events to publish, as frames. The server loop only moves those frames
between sockets; fuzzers and tests drive this class directly. Errors are
mapped to `error` replies here, at one boundary.

`NameService` is the boundary around the state machine (zns.core.state): it
decodes, authorizes, answers reads, turns writes, expiry steps, closes, stalls
and hints into commands for `StateMachine.apply`, encodes replies and events,
and keeps what is not state -- the route encodings and the snapshot cache, the
counters, and the process status the server sets (`pub_endpoint`, `peers`,
`remoting_endpoint`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
from msgspec import Raw

from zns.core.encoded_routes import EncodedRoutes
from zns.core.errors import BadRequest, Busy, ErrorReply, Internal, NotFound, UnknownOp
from zns.core.forwarding import ForwardedWrites, WriteInFlight
from zns.core.kv import KvBackend
from zns.core.limits import LIMITED_REQUESTS, Limits
from zns.core.routes import filter_zone
from zns.core.state import (
    WRITE_REQUESTS,
    AnyCommand,
    Change,
    CloseConnections,
    Expire,
    Outcome,
    ShiftDeadlines,
    StateMachine,
    Suspect,
    Write,
    WriteRequest,
)
from zns.core.text import quote
from zns.core.schema import (
    KNOWN_OPS,
    AnyRequest,
    BrokerData,
    BrokerEvent,
    DataVersion,
    GetClusterInfo,
    GetClusterInfoReply,
    GetRoute,
    GetRouteReply,
    GetRoutes,
    GetRoutesReply,
    GetTopics,
    GetTopicsReply,
    HbEvent,
    KvGet,
    KvGetReply,
    KvList,
    KvListReply,
    RegisterBroker,
    QueueData,
    Reply,
    RouteEvent,
    Snapshot,
    SnapshotReply,
    Status,
    StatusReply,
    TopicRoute,
    decode_request,
    describe_decode_error,
    encode,
    encoder,
    event_channel,
    read_envelope,
    request_op,
)

log = logging.getLogger("zns")

Frames = tuple[bytes, bytes]  # (channel, body) of one event
# MessagePack's longest map and string headers (map 32, str 16: a topic name is at most
# 255 characters, 1,020 bytes): with them a route map's size is never underestimated.
MAP_HEADER_BYTES, STR_HEADER_BYTES = 5, 3
# Who sent a write, for its audit line: called only when the write changed something an
# audit line names (zns.core.state.Change), so that reads and broker writes never pay for it.
Sender = Callable[[], str]
# Decides whether the peer with this CURVE key (None: no CURVE) may send this
# request; raises NoPermission when not (§9).
Authorizer = Callable[[str | None, AnyRequest], None]


class EventFrames(Sequence[Frames]):
    """The frames of one step's events, each event encoded only when it is read.

    A registration of 20,000 topics with many filter servers publishes 20,000 route
    events of 13 KB each: encoded all at once they were 264 MB held together, in
    memory new to the process. Read one at a time, as the server sends them, each is
    freed before the next is made and the same memory serves them all (figures in
    bench/results.md, "Changes measured"). Each is encoded once per read: read
    them once.
    """

    __slots__ = ("_events", "_encode")

    def __init__(self, events: list[RouteEvent | BrokerEvent],
                 encode: Callable[[object], bytes]) -> None:
        self._events, self._encode = events, encode

    def __len__(self) -> int:
        return len(self._events)

    # No slices (Sequence's signature has them): the loop only iterates.
    def __getitem__(self, index: int) -> Frames:  # type: ignore[override]
        event = self._events[index]  # IndexError ends iteration
        return event_channel(event), self._encode(event)


class Response:
    """One reply body and the events it publishes (a plain class: it is on the hot path)."""

    __slots__ = ("reply", "events", "request_id", "op")

    def __init__(self, reply: bytes, request_id: int, events: Sequence[Frames] = (),
                 op: str = "unknown") -> None:
        self.reply = reply
        self.request_id = request_id  # for a `busy` sent instead of a reply too large to afford
        self.events = events
        # The op answered, one of KNOWN_OPS or "unknown" (as the error counts name it): the
        # request timer's label, so that it need not decode the body a second time.
        self.op = op


class NameService:
    # Writes applied elsewhere and answered later (a worker's: zns.drivers.worker); None
    # here, where every write is applied and answered at once.
    forwarded: ForwardedWrites | None = None
    # Whether each broker change is logged here (one line each): a worker's replica leaves
    # it to the state process, which applies every change once, whatever the workers.
    logs_broker_changes = True
    # Up to how many events of a step are encoded as frames (None: all); past it they are
    # only counted. Here the frames are published; the state process of `--workers N`
    # publishes none: it encodes only a step whose events are few enough to travel with its
    # command (zns.core.replication.MAX_SHIPPED_EVENTS); its workers' replicas make the others.
    max_encoded_events: int | None = None

    def __init__(
        self,
        kv: KvBackend,
        *,
        epoch: str,
        started_at_ms: int,
        version: str = "",
        pub_endpoint: str = "",
        authorize: Authorizer | None = None,
        limits: Limits | None = None,
        max_reply_bytes: int | None = None,
        key_name: Callable[[str], str | None] | None = None,
        address_of: Callable[[Any], str] = str,
    ) -> None:
        """`key_name`: the name of a CURVE key (None: not named), for audit lines;
        `address_of`: the address of the `peer` `respond` is handed (the request router's
        message), asked only for an audit line.
        `version`: the server's release, which `status` shows (the core does not import
        the package above it to learn it). `max_reply_bytes`: the largest reply the server ever sends (its reply byte
        budget's per-peer burst). A `snapshot` or `get_routes` whose routes alone exceed
        it is refused `busy` as soon as that is known, before its reply is built."""
        self.state = StateMachine(kv, epoch=epoch, limits=limits)
        # Read them; every change goes through `apply` (zns.core.state's one way in).
        self.table = self.state.table
        self.kv = kv
        self.epoch = epoch
        self.version = version  # the server's release, shown by `status`
        self.started_at_ms = started_at_ms
        self.pub_endpoint = pub_endpoint
        self.remoting_endpoint = ""  # the remoting listener as bound, shown by `status`
        self.authorize = authorize
        self.key_name = key_name
        self.address_of = address_of
        self.max_reply_bytes = max_reply_bytes
        self.peers: dict[str, bool] = {}  # peer endpoint -> connected (§10, set by the server)
        # Each route encoded once per change, in each form when first asked for (a restart
        # storm changes shared routes faster than anyone can ask; the events carry them anyway).
        self.encoded = EncodedRoutes(self.table.route, lambda route: self._exact(route))
        self._snapshot_routes: tuple[int, Raw] = (-1, Raw(b""))  # (revision, encoded map)
        self._scratch = bytearray()  # see _exact
        # Plain counts for metrics, read (never reset) by a scrape in another thread: an
        # increment is all the hot path pays. Answered requests by request type; refused
        # ones by (op, error code), op "unknown" for one that is not an op at all.
        self.ok_counts: defaultdict[type, int] = defaultdict(int)
        self.error_counts: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.published: defaultdict[str, int] = defaultdict(int)  # events by channel kind
        self.removals: defaultdict[str, int] = defaultdict(int)  # broker addresses, by reason
        # RocketMQ remoting requests by (request code, -1 for one no NameServer answers;
        # response code): zns.core.remoting.handler counts them, metrics names them.
        self.remoting_counts: defaultdict[tuple[int, int], int] = defaultdict(int)

    @property
    def limits(self) -> Limits:
        """The state machine's limits (the reads' too: get_routes)."""
        return self.state.limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        self.state.limits = limits

    # --- the boundary ---------------------------------------------------

    def respond(self, body: bytes, now: int, peer_key: str | None = None,
                peer: Any = None) -> Response:
        """Answer one ZNS/1 request body. `peer_key`: the peer's CURVE key (None: no CURVE);
        `peer`: what `address_of` takes to name the peer (only an audit line asks: a read
        pays for passing a reference, nothing more)."""
        try:
            request = decode_request(body)
        except (msgspec.DecodeError, RecursionError) as exc:  # deep nesting: RecursionError
            request_id, op = read_envelope(body)
            if op is not None and op not in KNOWN_OPS:
                error: ErrorReply = UnknownOp(f"unknown op {op[:100]!r}")
            else:
                error = BadRequest(describe_decode_error(exc))
            label = op if op in KNOWN_OPS else "unknown"
            self.error_counts[label, error.code] += 1
            return Response(encode(error.reply(request_id)), request_id, (), label)
        try:
            if self.authorize is not None:
                self.authorize(peer_key, request)
            # execute's branch, inline: a read pays no call more than before the audit trail.
            if type(request) in WRITE_REQUESTS:
                return self._respond_write(request, now, peer_key, peer)  # type: ignore[arg-type]
            reply = self.read(request, now)
            # Inside the try: a bug while encoding must not escape to the socket loop.
            response = Response(encode(reply), request.id, (), request_op(request))
            self.ok_counts[type(request)] += 1
            return response
        except Exception as exc:
            return self._refused(request.id, request_op(request), type(request), exc,
                                 lambda: quote(request, 300))

    def _respond_write(self, request: WriteRequest, now: int, peer_key: str | None,
                       peer: Any) -> Response:
        """`respond` for a decoded, authorized write. Forwarded (WriteInFlight), the request
        is finished from its id and op alone once the answer is here: the decoded request
        is not kept (a registration's takes several times its bytes)."""
        request_id, op, kind = request.id, request_op(request), type(request)
        named: str | None = None

        def sender() -> str:
            return named if named is not None else self._zns1_sender(peer_key, peer)

        try:
            return self._write_response(
                request_id, op, kind, lambda: self.write(request, now, None, sender), request)
        except WriteInFlight as parked:
            # The peer named now: the parked write keeps its name, not its message.
            named, peer = sender(), None
            parked.then(lambda written: self._write_response(request_id, op, kind, written))
            raise

    def _write_response(self, request_id: int, op: str, kind: type,
                        written: Callable[[], tuple[Outcome, Sequence[Frames]]],
                        request: AnyRequest | None = None) -> Response:
        """The response to a write: `written()` makes it, or returns what a forwarded one
        did. `request`: quoted if a bug is logged (None: it was not kept)."""
        try:
            outcome, frames = written()
            reply = outcome.reply
            assert reply is not None  # a Write's outcome always has one
            response = Response(encode(reply), request_id, frames, op)
            self.ok_counts[kind] += 1
            return response
        except Exception as exc:
            return self._refused(
                request_id, op, kind, exc,
                lambda: quote(request, 300) if request is not None
                else f"{kind.__name__}(id={request_id}) once its write was answered")

    def _refused(self, request_id: int, op: str, kind: type, exc: Exception,
                 named: Callable[[], str]) -> Response:
        """The response to a decoded request that `exc` ended: an ErrorReply is its reply;
        anything else is a bug, logged with the request as `named()` says and answered
        `internal`. Either is counted by op and code."""
        if isinstance(exc, ErrorReply):
            if isinstance(exc, Internal):
                log.error("internal error on %s: %s", kind.__name__, exc)
            error = exc
        else:
            log.error("bug while handling %s", named(), exc_info=exc)
            error = Internal("internal error; see the server log")
        self.error_counts[op, error.code] += 1
        return Response(encode(error.reply(request_id)), request_id, (), op)

    def execute(self, request: AnyRequest, now: int,
                connection: int | None = None) -> tuple[Reply, Sequence[Frames]]:
        """Answer one decoded, authorized request: a read here, a write by the state machine
        (`write`); the reply and the events as frames.

        Raises an ErrorReply on refusal, having changed nothing. `respond` does the same
        for ZNS/1, naming the peer for an audit line; `connection`: the remoting connection
        a request came over (None: ZNS/1).
        """
        if type(request) in WRITE_REQUESTS:
            outcome, frames = self.write(request, now, connection)  # type: ignore[arg-type]
            assert outcome.reply is not None  # a Write's outcome always has one
            return outcome.reply, frames
        return self.read(request, now), []

    def write(self, request: WriteRequest, now: int, connection: int | None = None,
              sender: Sender | None = None) -> tuple[Outcome, Sequence[Frames]]:
        """One write request as a command for the state machine: its outcome (the reply and
        what a remoting reply needs of the same step) and its events as frames. The remoting
        listener's writers call it with the request their request corresponds to, so both
        listeners get the same checks and the same events. `connection`: see
        zns.core.state.Write. `sender`: who sent it, for the audit line of a write that
        changed what one names (docs/operations.md, "The audit trail")."""
        # What the lines below need of the request, and all that a forwarded write keeps
        # of it (WriteInFlight): not its topics.
        broker = (request.cluster, request.broker_name, request.broker_id,
                  request.broker_addr) if type(request) is RegisterBroker else None
        try:
            return self._written(
                lambda: self.apply(Write(request=request, now=now, connection=connection)),
                broker, sender)
        except WriteInFlight as parked:
            parked.then(lambda applied: self._written(applied, broker, sender))
            raise

    @staticmethod
    def _written(applied: Callable[[], tuple[Outcome, Sequence[Frames]]],
                 broker: tuple[str, str, int, str] | None,
                 sender: Sender | None) -> tuple[Outcome, Sequence[Frames]]:
        """`write`'s lines around `applied()` (the state machine's outcome, or a forwarded
        write's answer): the audit line of a change, the warning of a refused broker."""
        try:
            outcome, frames = applied()
        except ErrorReply as exc:
            if broker is not None:
                log.warning("broker %s/%s id %d at %s refused: %s", *broker, exc)
            raise
        if outcome.change is not None:
            log_change(outcome.change, sender() if sender is not None else "unknown")
        return outcome, frames

    def apply(self, command: AnyCommand) -> tuple[Outcome, Sequence[Frames]]:
        """Feed one command to the state machine: its outcome, and its events as frames."""
        outcome = self.state.apply(command)
        events = outcome.events
        if not events:
            return outcome, []
        limit = self.max_encoded_events
        if limit is not None and len(events) > limit:
            self._count(events)
            return outcome, []
        return outcome, self._publish(events)

    def _zns1_sender(self, peer_key: str | None, peer: Any) -> str:
        """A ZNS/1 peer as its audit line names it: its CURVE key's name, else its key and
        address, else its address."""
        address = self.address_of(peer) if peer is not None else "unknown"
        if peer_key is None:
            return address
        name = self.key_name(peer_key) if self.key_name is not None else None
        return f"key {name}" if name else f"key {peer_key} at {address}"

    def connection_closed(self, connection: int) -> Sequence[Frames]:
        """A remoting connection closed: what it registered goes, reason `disconnected` (§12)."""
        return self.connections_closed([connection])

    def connections_closed(self, connections: Iterable[int]) -> Sequence[Frames]:
        """`connection_closed` for many connections at once, as one step (one revision, each
        affected route rebuilt once: 2,000 brokers sharing topics closing together cost
        2,000 rebuilds of routes of up to 2,000 brokers each, one at a time)."""
        return self.apply(CloseConnections(connections=list(connections)))[1]

    def load_state(self, dump: bytes, kv: KvBackend) -> None:
        """Replace the whole state with `dump` (StateMachine.dump), over the empty `kv`: a
        worker's replica loading a state transfer. The epoch becomes the dump's; the route
        encodings and the snapshot cache start empty."""
        self.use_state(StateMachine.load(dump, kv, limits=self.state.limits))

    def use_state(self, machine: StateMachine) -> None:
        """Serve `machine` from now on (as `load_state`, without a dump to decode)."""
        self.state = machine
        self.table, self.kv, self.epoch = machine.table, machine.kv, machine.table.epoch
        # A cache of the new table's routes, made by the same encoders within the same bound
        # (the JSON encoder is the remoting listener's, set once when it was made).
        held = self.encoded
        self.encoded = EncodedRoutes(self.table.route, lambda route: self._exact(route),
                                     held.max_json_bytes, held.json_encoder)
        self._snapshot_routes = (-1, Raw(b""))

    def tied_connection(self, cluster: str, addr: str, name: str) -> int | None:
        """The remoting connection that registered this broker address under this name
        (None: registered over ZNS/1, or not held)."""
        return self.state.tied_connection(cluster, addr, name)

    # --- reads for the remoting listener, and the timers' and peers' way in -------

    def route_json(self, topic: str, legacy: bool) -> bytes | None:
        """TopicRouteData of the topic in fastjson's legacy or standard form (None: no route),
        encoded once per change."""
        return self.encoded.json(topic, legacy)

    def zone_route(self, topic: str, zone: str) -> TopicRoute | None:
        """The topic's route filtered to a zone (§5); None if it has none."""
        route = self.table.route(topic)
        return None if route is None else filter_zone(route, zone)

    def broker_table(self) -> dict[str, BrokerData]:
        return self.table.broker_table()

    @property
    def revision(self) -> int:
        """The route table's revision (§7): moves with every change."""
        return self.table.revision

    def topic_queue_table(self) -> dict[str, dict[str, QueueData]]:
        """topic -> broker name -> QueueData, in insertion order (read only; Java's order)."""
        return self.table.topic_queue_table()

    def broker_names(self) -> list[str]:
        """Broker names in the order they were first registered."""
        return self.table.broker_names()

    def cluster_members(self) -> dict[str, dict[str, None]]:
        """cluster -> broker names, in the order they joined (read only)."""
        return self.table.cluster_members()

    def cluster_table(self) -> dict[str, list[str]]:
        return self.table.cluster_table()

    def topics(self, cluster: str = "", sys_flag: int = 0) -> list[str]:
        """Topics with queue data, sorted: of one cluster's brokers, with these flags (§5)."""
        return self.table.topics(cluster, sys_flag)

    def broker_topic_count(self, name: str) -> int:
        """Topics with queue data of this broker name."""
        return self.table.broker_topic_count(name)

    def data_version(self, cluster: str, addr: str) -> DataVersion | None:
        """The DataVersion last registered for this broker address (None: not held)."""
        live = self.table.liveness(cluster, addr)
        return None if live is None else live.data_version

    def next_deadline(self) -> int | None:
        """The earliest liveness deadline (§8): the timers' next expiry step is due after it."""
        return self.table.next_deadline()

    def shift_deadlines(self, stall_ms: int) -> None:
        """The process stalled this long (§8): no broker is charged for it."""
        self.apply(ShiftDeadlines(stall_ms=stall_ms))

    def suspect(self, cluster: str, addr: str, grace_ms: int, now: int) -> bool:
        """A peer NameServer saw this broker leave (§10): shorten its deadline."""
        command = Suspect(cluster=cluster, addr=addr, grace_ms=grace_ms, now=now)
        return self.apply(command)[0].shortened

    @staticmethod
    def busy_reply(request_id: int) -> bytes:
        """What a peer gets instead of a large reply its byte budget cannot afford now."""
        return encode(Busy("the reply is larger than this peer's budget of unread replies "
                           "allows now; read the replies already sent and retry later")
                      .reply(request_id))

    def expire(self, now: int) -> Sequence[Frames]:
        """One expiry step (§8)."""
        return self.apply(Expire(now=now))[1]

    def heartbeat_event(self, time_ms: int) -> Frames:
        event = HbEvent(epoch=self.epoch, revision=self.committed_revision(), time_ms=time_ms)
        self.published["hb"] += 1
        return event_channel(event), encode(event)

    def committed_revision(self) -> int:
        """The revision an `hb` carries: one every read answers at or after, whatever
        worker it reaches (§7). One process: its table's."""
        return self.table.revision

    # --- reads -----------------------------------------------------------

    def catch_up(self) -> None:
        """Called before each read, over either protocol: a worker's replica first applies
        what the state process has written to it (zns.drivers.worker.ReplicaService); one
        process has nothing to do."""

    def read(self, request: AnyRequest, now: int) -> Reply:
        """Answer one read request from the state; raises an ErrorReply on refusal."""
        t, rid = self.table, request.id
        if type(request) in LIMITED_REQUESTS:
            self.limits.check(request, t, self.kv)
        match request:
            case GetRoute():
                return self._get_route(request)
            case GetRoutes(topics=topics, held_epoch=held_epoch, held=held):
                return self._get_routes(rid, topics, held if held_epoch == self.epoch else {})
            case GetClusterInfo():
                return GetClusterInfoReply(id=rid, brokers=t.broker_table(),
                                           clusters=t.cluster_table(), live=t.live_brokers(now))
            case GetTopics(cluster=cluster, sys_flag=sys_flag):
                return GetTopicsReply(id=rid, topics=t.topics(cluster, sys_flag))
            case Snapshot():
                return self._snapshot(rid)
            case Status():
                return self._status(rid, now)
            case KvGet(namespace=ns, key=key):
                return KvGetReply(id=rid, value=self._kv_get(ns, key))
            case KvList(namespace=ns):
                return KvListReply(id=rid, entries=self.kv.list(ns))
        raise Internal(f"no handler for {type(request).__name__}")

    # --- the ops that take more than a line -------------------------------------

    def _get_route(self, request: GetRoute) -> GetRouteReply:
        table, topic = self.table, request.topic
        route: TopicRoute | Raw | None = self._route_raw(topic)
        if request.zone:
            held = table.route(topic)
            route = None if held is None else filter_zone(held, request.zone)
        if route is None:
            raise NotFound(f"no route for topic {topic!r}", table.topic_revision(topic))
        return GetRouteReply(id=request.id, route=route, revision=table.topic_revision(topic),
                             epoch=self.epoch)

    def _get_routes(self, rid: int, topics: list[str], held: dict[str, int]) -> GetRoutesReply:
        """`held`: revisions the client holds (of this epoch); a route still at one is not sent."""
        routes: dict[str, TopicRoute | Raw] = {}
        revisions: dict[str, int] = {}
        missing: list[str] = []
        unchanged: list[str] = []
        size, limit = 0, self.max_reply_bytes
        for topic in topics:
            revision = revisions[topic] = self.table.topic_revision(topic)
            if held.get(topic) == revision:
                unchanged.append(topic)
                continue
            route = self._route_raw(topic)
            if route is None:
                missing.append(topic)
                continue
            routes[topic] = route
            size += len(route)
            if limit is not None and size > limit:
                raise Busy(f"the routes asked for are larger than {limit:,} bytes, the most "
                           "one reply may hold; ask for fewer topics at a time")
        return GetRoutesReply(id=rid, routes=routes, revisions=revisions, missing=missing,
                              epoch=self.epoch, unchanged=unchanged)

    def _snapshot(self, rid: int) -> SnapshotReply:
        """One consistent cut; its route map is encoded once per revision, however often asked."""
        table = self.table
        if self._snapshot_routes[0] != table.revision:
            self._snapshot_routes = (table.revision, self._route_map(table.routes()))
        return SnapshotReply(
            id=rid, epoch=self.epoch, revision=table.revision, routes=self._snapshot_routes[1],
            brokers=table.broker_table(), clusters=table.cluster_table(),
        )

    def _route_map(self, table_routes: dict[str, TopicRoute]) -> Raw:
        """Every route, sorted by topic, as one encoded map, or Busy as soon as it would be
        larger than any reply may be (a table that large is read with get_routes, in parts)."""
        routes: dict[str, Raw] = {}
        size, limit = MAP_HEADER_BYTES, self.max_reply_bytes
        msgpack = self.encoded.msgpack
        for topic in sorted(table_routes):
            route = msgpack(topic, table_routes[topic])
            assert route is not None  # the route given is encoded, never looked up
            routes[topic] = route
            size += len(route) + len(topic.encode()) + STR_HEADER_BYTES
            if limit is not None and size > limit:
                raise Busy(f"the snapshot is larger than {limit:,} bytes, the most one reply "
                           "may hold; read the routes with get_routes, a part of the topics "
                           "at a time")
        # Into a buffer of (at least) the final size: no growing copies of a map that can
        # be hundreds of MiB, and no exact-size copy after.
        buffer = bytearray(size)
        encoder.encode_into(routes, buffer)
        return Raw(buffer)

    def _route_raw(self, topic: str) -> Raw | None:
        """The topic's route encoded, once per change however often it is read; None if it has none."""
        return self.encoded.msgpack(topic)

    def _exact(self, value: object) -> bytes:
        """`value` encoded, in bytes of exactly its size.

        msgspec's `encode` grows its output buffer ahead of need, copying as it grows,
        and hands it over as it is: a cached route's bytes could take half as much again
        as their length. Encoding into one scratch buffer and copying that once avoids
        both (figures in bench/results.md, "Changes measured").
        """
        encoder.encode_into(value, self._scratch)
        return bytes(self._scratch)

    def _status(self, rid: int, now: int) -> StatusReply:
        table = self.table
        return StatusReply(
            id=rid, epoch=self.epoch, revision=table.revision, version=self.version,
            uptime_ms=max(0, now - self.started_at_ms), brokers=table.broker_count(),
            topics=table.topic_count(), pub_endpoint=self.pub_endpoint, peers=dict(self.peers),
            remoting=self.remoting_endpoint,
        )

    def _kv_get(self, ns: str, key: str) -> str:
        value = self.kv.get(ns, key)
        if value is None:
            raise NotFound(f"no KV entry {key!r} in namespace {ns!r}")
        return value

    # --- internals --------------------------------------------------------

    def _count(self, events: list[RouteEvent | BrokerEvent]) -> None:
        """What every step's events leave besides their frames: the counts, and a line per
        broker change."""
        published = self.published
        for event in events:
            if isinstance(event, RouteEvent):
                published["route"] += 1
            else:
                published["broker"] += 1
                if event.change == "removed":
                    self.removals[event.reason] += 1
                if self.logs_broker_changes:
                    _log_broker_event(event)

    def _publish(self, events: list[RouteEvent | BrokerEvent]) -> EventFrames:
        self._count(events)
        # Routes of one step share their queue and broker lists and filter servers
        # (RouteTable._build_route): encode each once; they are alive (held by the
        # routes) while we do.
        encoded: dict[int, Raw] = {}
        for event in events:
            if isinstance(event, RouteEvent):
                self.encoded.forget(event.topic)
                route = event.route
                if isinstance(route, TopicRoute):  # from the table: never encoded yet
                    queues, brokers, servers = route.queues, route.brokers, route.filter_servers
                    if (raw_q := encoded.get(id(queues))) is None:
                        raw_q = encoded[id(queues)] = Raw(encode(queues))
                    if (raw_b := encoded.get(id(brokers))) is None:
                        raw_b = encoded[id(brokers)] = Raw(encode(brokers))
                    if servers and (raw_f := encoded.get(id(servers))) is None:
                        raw_f = encoded[id(servers)] = Raw(encode(servers))
                    # Encoded as part of the event only: one copy of the lists per topic.
                    event.route = msgspec.structs.replace(
                        route, queues=raw_q, brokers=raw_b,
                        filter_servers=raw_f if servers else servers)
        return EventFrames(events, self._exact)


def _log_broker_event(event: BrokerEvent) -> None:
    reason = f" ({event.reason})" if event.reason else ""
    log.info("broker %s %s/%s id %d at %s%s", event.change, event.cluster, event.broker_name,
             event.broker_id, event.broker_addr, reason)


# An audit line's value: a peer chose it (a KV value up to 64 KiB), so it is quoted and cut.
AUDIT_VALUE_LIMIT = 200


def log_change(change: Change, sender: str) -> None:
    """One INFO line per admin write, its fields also on the record (`audit`) for the JSON
    log format; the repeat filter bounds them (zns.drivers.logs)."""
    log.info("audit: %s %s by %s: %s -> %s", change.what, _shown(change.target),
             _shown(sender), _shown(change.before), _shown(change.after),
             extra={"audit": {"op": change.what, "target": _cut(change.target),
                              "by": _cut(sender), "before": _cut(change.before),
                              "after": _cut(change.after)}})


def _shown(value: str | int | None) -> str:
    """An audit value in the text line: a quoted literal cut at AUDIT_VALUE_LIMIT."""
    if value is None:
        return "none"
    return str(value) if isinstance(value, int) else quote(value, AUDIT_VALUE_LIMIT)


def _cut(value: str | int | None) -> str | int | None:
    """An audit value as a JSON field: a string cut at AUDIT_VALUE_LIMIT characters."""
    return value[:AUDIT_VALUE_LIMIT] if isinstance(value, str) else value

"""The NameServer as bytes in, bytes out: decode, dispatch, encode — still no I/O.

`NameService.respond` takes one request body and returns the reply body and
the events to publish, as frames. The server loop only moves those frames
between sockets; fuzzers and tests drive this class directly. Errors are
mapped to `error` replies here, at one boundary.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

import msgspec
from msgspec import Raw

from zns import __version__
from zns.core.errors import BadRequest, Busy, ErrorReply, Internal, NotFound, UnknownOp
from zns.core.kv import KvBackend
from zns.core.limits import LIMITED_REQUESTS, Limits
from zns.core.routes import RouteTable, filter_zone
from zns.core.text import quote
from zns.core.schema import (
    KNOWN_OPS,
    ORDER_TOPIC_CONFIG,
    AddWritePerm,
    AddWritePermReply,
    AnyRequest,
    BrokerEvent,
    DeleteTopic,
    DeleteTopicReply,
    GetClusterInfo,
    GetClusterInfoReply,
    GetRoute,
    GetRouteReply,
    GetRoutes,
    GetRoutesReply,
    GetTopics,
    GetTopicsReply,
    HbEvent,
    Heartbeat,
    HeartbeatReply,
    KvDelete,
    KvDeleteReply,
    KvGet,
    KvGetReply,
    KvList,
    KvListReply,
    KvPut,
    KvPutReply,
    RegisterBroker,
    RegisterBrokerReply,
    RegisterTopic,
    RegisterTopicReply,
    Reply,
    RouteEvent,
    Snapshot,
    SnapshotReply,
    Status,
    StatusReply,
    UnregisterBroker,
    UnregisterBrokerReply,
    WipeWritePerm,
    WipeWritePermReply,
    decode_request,
    describe_decode_error,
    encode,
    event_channel,
    read_envelope,
    request_op,
)

log = logging.getLogger("zns")

Frames = tuple[bytes, bytes]  # (channel, body) of one event
# Decides whether the peer with this CURVE key (None: no CURVE) may send this
# request; raises NoPermission when not (§9).
Authorizer = Callable[[str | None, AnyRequest], None]


class Response:
    """One reply body and the events it publishes (a plain class: it is on the hot path)."""

    __slots__ = ("reply", "events", "request_id")

    def __init__(self, reply: bytes, events: list[Frames] | tuple[()] = (),
                 request_id: int = 0) -> None:
        self.reply = reply
        self.events = events
        self.request_id = request_id  # for a `busy` sent instead of a reply too large to afford


class NameService:
    def __init__(
        self,
        kv: KvBackend,
        *,
        epoch: str,
        started_at_ms: int,
        pub_endpoint: str = "",
        authorize: Authorizer | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.table = RouteTable(epoch)
        self.kv = kv
        self.epoch = epoch
        self.started_at_ms = started_at_ms
        self.pub_endpoint = pub_endpoint
        self.authorize = authorize
        self.limits = limits or Limits()
        self.peers: dict[str, bool] = {}  # peer endpoint -> connected (§10, set by the server)
        self._route_bytes: dict[str, Raw] = {}  # each route encoded once per change
        # Plain counts for metrics, read (never reset) by a scrape in another thread: an
        # increment is all the hot path pays. Answered requests by request type; refused
        # ones by (op, error code), op "unknown" for one that is not an op at all.
        self.ok_counts: defaultdict[type, int] = defaultdict(int)
        self.error_counts: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.published: defaultdict[str, int] = defaultdict(int)  # events by channel kind
        self.removals: defaultdict[str, int] = defaultdict(int)  # broker addresses, by reason
        for topic, value in kv.list(ORDER_TOPIC_CONFIG).items():
            self.table.set_order_conf(topic, value)

    # --- the boundary ---------------------------------------------------

    def respond(self, body: bytes, now: int, peer_key: str | None = None) -> Response:
        try:
            request = decode_request(body)
        except (msgspec.DecodeError, RecursionError) as exc:  # deep nesting: RecursionError
            request_id, op = read_envelope(body)
            if op is not None and op not in KNOWN_OPS:
                error: ErrorReply = UnknownOp(f"unknown op {op[:100]!r}")
            else:
                error = BadRequest(describe_decode_error(exc))
            self.error_counts[op if op in KNOWN_OPS else "unknown", error.code] += 1
            return Response(encode(error.reply(request_id)))
        try:
            if self.authorize is not None:
                self.authorize(peer_key, request)
            reply, frames = self.execute(request, now)
            # Inside the try: a bug while encoding must not escape to the socket loop.
            response = Response(encode(reply), frames, request.id)
            self.ok_counts[type(request)] += 1
            return response
        except ErrorReply as exc:
            if isinstance(exc, Internal):
                log.error("internal error on %s: %s", type(request).__name__, exc)
            self.error_counts[request_op(request), exc.code] += 1
            return Response(encode(exc.reply(request.id)))
        except Exception:
            log.exception("bug while handling %s", quote(request, 300))
            self.error_counts[request_op(request), Internal.code] += 1
            return Response(encode(Internal("internal error; see the server log").reply(request.id)))

    def execute(self, request: AnyRequest, now: int) -> tuple[Reply, list[Frames]]:
        """Apply one decoded, authorized request: limits, then the op, then its events as frames.

        Raises an ErrorReply on refusal, having changed nothing. `respond` calls it
        for ZNS/1; the RocketMQ remoting listener calls it for the op each of its
        requests corresponds to, so both get the same checks and the same events.
        """
        if type(request) in LIMITED_REQUESTS:
            self.limits.check(request, self.table, self.kv)
        reply, events = self.handle(request, now)
        return reply, self._publish(events) if events else []

    def remove_disconnected(self, cluster: str, broker_name: str, broker_addr: str) -> list[Frames]:
        """Unregister an address whose RocketMQ remoting connection closed (§12, reason `disconnected`)."""
        _, events = self.table.unregister_broker(cluster, broker_name, broker_addr,
                                                 reason="disconnected")
        return self._publish(events) if events else []

    @staticmethod
    def busy_reply(request_id: int) -> bytes:
        """What a peer gets instead of a large reply its byte budget cannot afford now."""
        return encode(Busy("the reply is larger than this peer's budget of unread replies "
                           "allows now; read the replies already sent and retry later")
                      .reply(request_id))

    def expire(self, now: int) -> list[Frames]:
        return self._publish(self.table.expire(now))

    def heartbeat_event(self, time_ms: int) -> Frames:
        event = HbEvent(epoch=self.epoch, revision=self.table.revision, time_ms=time_ms)
        self.published["hb"] += 1
        return event_channel(event), encode(event)

    # --- dispatch -------------------------------------------------------

    def handle(self, request: AnyRequest, now: int) -> tuple[Reply, list[RouteEvent | BrokerEvent]]:
        """Apply one validated request; raises an ErrorReply on refusal."""
        table = self.table
        rid = request.id
        match request:
            case GetRoute(topic=topic, zone=zone):
                route = self._route_bytes.get(topic)
                if route is None:
                    raise NotFound(f"no route for topic {topic!r}", table.topic_revision(topic))
                if zone:
                    route = filter_zone(table.route(topic), zone)
                return GetRouteReply(
                    id=rid, route=route, revision=table.topic_revision(topic), epoch=self.epoch
                ), []
            case Heartbeat(cluster=c, broker_name=n, broker_addr=a, data_version=v):
                known, changed = table.heartbeat(c, n, a, v, now)
                return HeartbeatReply(id=rid, known=known, changed=changed), []
            case RegisterBroker():
                try:
                    outcome = table.register_broker(request, now)
                except ErrorReply as exc:
                    log.warning("broker %s/%s id %d at %s refused: %s", request.cluster,
                                request.broker_name, request.broker_id, request.broker_addr, exc)
                    raise
                reply = RegisterBrokerReply(
                    id=rid, master_addr=outcome.master_addr, ha_addr=outcome.ha_addr
                )
                return reply, outcome.events
            case UnregisterBroker(cluster=c, broker_name=n, broker_addr=a):
                removed, events = table.unregister_broker(c, n, a)
                return UnregisterBrokerReply(id=rid, removed=removed), events
            case GetRoutes(topics=topics):
                routes, revisions, missing = {}, {}, []
                for topic in topics:
                    revisions[topic] = table.topic_revision(topic)
                    route = self._route_bytes.get(topic)
                    if route is None:
                        missing.append(topic)
                    else:
                        routes[topic] = route
                return GetRoutesReply(
                    id=rid, routes=routes, revisions=revisions, missing=missing, epoch=self.epoch
                ), []
            case GetClusterInfo():
                return GetClusterInfoReply(
                    id=rid, brokers=table.broker_table(), clusters=table.cluster_table(),
                    live=table.live_brokers(now),
                ), []
            case GetTopics(cluster=cluster, sys_flag=sys_flag):
                return GetTopicsReply(id=rid, topics=table.topics(cluster, sys_flag)), []
            case Snapshot():
                return SnapshotReply(
                    id=rid, epoch=self.epoch, revision=table.revision,
                    routes={t: self._route_bytes.get(t) for t in sorted(table.routes())},
                    brokers=table.broker_table(), clusters=table.cluster_table(),
                ), []
            case Status():
                return StatusReply(
                    id=rid, epoch=self.epoch, revision=table.revision, version=__version__,
                    uptime_ms=max(0, now - self.started_at_ms), brokers=table.broker_count(),
                    topics=table.topic_count(), pub_endpoint=self.pub_endpoint,
                    peers=dict(self.peers),
                ), []
            case WipeWritePerm(broker_name=name):
                changed, events = table.wipe_write_perm(name)
                return WipeWritePermReply(id=rid, changed=changed), events
            case AddWritePerm(broker_name=name):
                changed, events = table.add_write_perm(name)
                return AddWritePermReply(id=rid, changed=changed), events
            case DeleteTopic(topic=topic, cluster=cluster):
                removed, events = table.delete_topic(topic, cluster)
                return DeleteTopicReply(id=rid, removed=removed), events
            case RegisterTopic(topic=topic, queues=queues):
                return RegisterTopicReply(id=rid), table.register_topic(topic, queues)
            case KvPut(namespace=ns, key=key, value=value):
                # The durable write first: it is the step that can fail (`internal`, nothing
                # changed). set_order_conf refuses nothing, so the route change cannot fail
                # after it; in the other order a failed write would leave a revision bumped
                # and an event published for a value that is not stored.
                self._kv_write(self.kv.put, ns, key, value)
                events = table.set_order_conf(key, value) if ns == ORDER_TOPIC_CONFIG else []
                return KvPutReply(id=rid), events
            case KvGet(namespace=ns, key=key):
                value = self.kv.get(ns, key)
                if value is None:
                    raise NotFound(f"no KV entry {key!r} in namespace {ns!r}")
                return KvGetReply(id=rid, value=value), []
            case KvDelete(namespace=ns, key=key):
                removed = self._kv_write(self.kv.delete, ns, key)
                events = table.set_order_conf(key, None) if ns == ORDER_TOPIC_CONFIG else []
                return KvDeleteReply(id=rid, removed=removed), events
            case KvList(namespace=ns):
                return KvListReply(id=rid, entries=self.kv.list(ns)), []
        raise Internal(f"no handler for {type(request).__name__}")

    # --- internals --------------------------------------------------------

    def _kv_write(self, write: Callable[..., bool], *args: str) -> bool:
        try:
            return write(*args)
        except OSError as exc:
            raise Internal(f"the KV store could not be written durably: {exc}") from exc

    def _publish(self, events: list[RouteEvent | BrokerEvent]) -> list[Frames]:
        frames = []
        published = self.published
        for event in events:
            if isinstance(event, RouteEvent):
                published["route"] += 1
                if event.route is None:
                    self._route_bytes.pop(event.topic, None)
                else:
                    raw = Raw(encode(event.route))
                    self._route_bytes[event.topic] = raw
                    event.route = raw
            else:
                published["broker"] += 1
                if event.change == "removed":
                    self.removals[event.reason or "unregistered"] += 1
                _log_broker_event(event)
            frames.append((event_channel(event), encode(event)))
        return frames


def _log_broker_event(event: BrokerEvent) -> None:
    reason = f" ({event.reason})" if event.reason else ""
    log.info("broker %s %s/%s id %d at %s%s", event.change, event.cluster, event.broker_name,
             event.broker_id, event.broker_addr, reason)

"""The ZNS/1 wire schema: every request, reply and event as a tagged msgspec Struct.

This module is the single definition of the contract that ``docs/protocol.md`` describes.
Every bound of §3 is expressed here as a type, so the one typed decoder
(`decode_request`) is the only validation there is. Everything else in zns
imports from here; this module imports nothing of zns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Union, get_args

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

# --- §3 names and bounds -------------------------------------------------

# RocketMQ's TopicValidator: letters, digits and `_%|-`.
Topic = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_%|-]{1,127}$")]
# 1–255 characters, no control characters (C0, DEL, C1) and no `/`.
Name = Annotated[str, Meta(pattern=r"^[^\x00-\x1f\x7f-\x9f/]{1,255}$")]
OptionalName = Annotated[str, Meta(pattern=r"^[^\x00-\x1f\x7f-\x9f/]{0,255}$")]
Zone = Annotated[str, Meta(pattern=r"^[^\x00-\x1f\x7f-\x9f]{0,255}$")]

_PORT = r"(?:6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3})"
_DNS = r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
_IPV6 = r"\[[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_.-]+)?\]"
# host:port with a DNS name, an IPv4 address (which the DNS form covers) or [IPv6].
BrokerAddr = Annotated[
    str, Meta(pattern=rf"^(?:{_DNS}|{_IPV6}):{_PORT}$", max_length=255)
]
HaAddr = Annotated[
    str, Meta(pattern=rf"^(?:(?:{_DNS}|{_IPV6}):{_PORT})?$", max_length=255)
]

BrokerId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
QueueCount = Annotated[int, Meta(ge=0, le=65535)]
Perm = Annotated[int, Meta(ge=0, le=15)]
SysFlag = Annotated[int, Meta(ge=0, le=2**31 - 1)]
HeartbeatTimeoutMs = Annotated[int, Meta(ge=1000, le=3_600_000)]
RequestId = Annotated[int, Meta(ge=0)]
KvValue = Annotated[str, Meta(max_length=65_536)]  # characters; bytes checked in KvPut

MAX_KV_VALUE_BYTES = 65_536
# Collection sizes (zns bounds; §3 has none). msgspec checks a length at its header,
# before decoding any element: without them one 16 MiB list of "a:1" costs ~10 s of
# regex checks. zns.core.limits applies lower, configurable limits after decoding.
MAX_TOPICS_PER_REQUEST = 65_536
MAX_FILTER_SERVERS = 1_024
# One QueueData per broker name, so no more than the broker names a server may hold
# (zns.core.limits.Limits.max_brokers applies the configured, lower, bound).
MAX_QUEUES_PER_TOPIC = 65_536
TopicMap = Annotated[dict[Topic, "TopicConfig"], Meta(max_length=MAX_TOPICS_PER_REQUEST)]
TopicList = Annotated[list[Topic], Meta(max_length=MAX_TOPICS_PER_REQUEST)]

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

MASTER_ID = 0
DEFAULT_ROUTER = "tcp://127.0.0.1:9876"  # §1 default endpoints
DEFAULT_PUB = "tcp://127.0.0.1:9877"
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"

# --- §3 shared structures ------------------------------------------------


class DataVersion(Struct, frozen=True):
    state: int = 0
    timestamp: int = 0
    counter: int = 0


class TopicConfig(Struct, frozen=True):
    read_queues: QueueCount = 16
    write_queues: QueueCount = 16
    perm: Perm = 6
    sys_flag: SysFlag = 0
    order: bool = False


class QueueData(Struct, frozen=True):
    broker_name: Name
    read_queues: QueueCount
    write_queues: QueueCount
    perm: Perm
    sys_flag: SysFlag


class BrokerData(Struct):
    cluster: str
    broker_name: str
    addrs: dict[int, str]
    zone: str = ""


class TopicRoute(Struct):
    topic: str
    queues: list[QueueData]
    brokers: list[BrokerData]
    filter_servers: dict[str, list[str]]
    order_conf: str = ""


class LiveBroker(Struct):
    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    last_heartbeat_ms: int
    timeout_ms: int
    data_version: DataVersion


# --- requests (§4–§6) ----------------------------------------------------


class Request(Struct, tag_field="op", kw_only=True, frozen=True):
    id: RequestId = 0


class RegisterBroker(Request, tag="register_broker", frozen=True):
    cluster: Name
    broker_name: Name
    broker_id: BrokerId
    broker_addr: BrokerAddr
    ha_addr: HaAddr = ""
    zone: Zone = ""
    data_version: DataVersion = DataVersion()
    topics: TopicMap = {}
    filter_servers: Annotated[list[BrokerAddr], Meta(max_length=MAX_FILTER_SERVERS)] = []
    heartbeat_timeout_ms: HeartbeatTimeoutMs = 120_000
    incremental: bool = False


class Heartbeat(Request, tag="heartbeat", frozen=True):
    cluster: Name
    broker_name: Name
    broker_id: BrokerId
    broker_addr: BrokerAddr
    data_version: DataVersion = DataVersion()


class UnregisterBroker(Request, tag="unregister_broker", frozen=True):
    cluster: Name
    broker_name: Name
    broker_id: BrokerId
    broker_addr: BrokerAddr


class GetRoute(Request, tag="get_route", frozen=True):
    topic: Topic
    zone: Zone = ""


class GetRoutes(Request, tag="get_routes", frozen=True):
    topics: TopicList
    # The revisions the client holds, of epoch `held_epoch`: a topic still at its held
    # revision is answered in `unchanged`, without its route (a pull by revision).
    held_epoch: Annotated[str, Meta(max_length=64)] = ""
    held: Annotated[dict[Topic, Annotated[int, Meta(ge=0)]],
                    Meta(max_length=MAX_TOPICS_PER_REQUEST)] = msgspec.field(default_factory=dict)


class GetClusterInfo(Request, tag="get_cluster_info", frozen=True):
    pass


class GetTopics(Request, tag="get_topics", frozen=True):
    cluster: OptionalName = ""
    sys_flag: SysFlag = 0


class Snapshot(Request, tag="snapshot", frozen=True):
    pass


class Status(Request, tag="status", frozen=True):
    pass


class WipeWritePerm(Request, tag="wipe_write_perm", frozen=True):
    broker_name: Name


class AddWritePerm(Request, tag="add_write_perm", frozen=True):
    broker_name: Name


class DeleteTopic(Request, tag="delete_topic", frozen=True):
    topic: Topic
    cluster: OptionalName = ""


class RegisterTopic(Request, tag="register_topic", frozen=True):
    topic: Topic
    queues: Annotated[list[QueueData], Meta(max_length=MAX_QUEUES_PER_TOPIC)]


class KvPut(Request, tag="kv_put", frozen=True):
    namespace: Name
    key: Name
    value: KvValue

    def __post_init__(self) -> None:
        if len(self.value.encode()) > MAX_KV_VALUE_BYTES:
            raise ValueError(
                f"Expected `str` of at most {MAX_KV_VALUE_BYTES} UTF-8 bytes - at `$.value`"
            )


class KvGet(Request, tag="kv_get", frozen=True):
    namespace: Name
    key: Name


class KvDelete(Request, tag="kv_delete", frozen=True):
    namespace: Name
    key: Name


class KvList(Request, tag="kv_list", frozen=True):
    namespace: Name


BrokerRequest = Union[RegisterBroker, Heartbeat, UnregisterBroker]
ClientRequest = Union[GetRoute, GetRoutes, GetClusterInfo, GetTopics, Snapshot, Status]
AdminRequest = Union[
    WipeWritePerm, AddWritePerm, DeleteTopic, RegisterTopic, KvPut, KvGet, KvDelete, KvList
]
AnyRequest = Union[BrokerRequest, ClientRequest, AdminRequest]



def tag_of(cls: type[Struct]) -> str:
    """The op a tagged Struct stands for (every tag here is a string)."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str), cls
    return tag


BROKER_OPS = frozenset(tag_of(c) for c in get_args(BrokerRequest))
CLIENT_OPS = frozenset(tag_of(c) for c in get_args(ClientRequest))
ADMIN_OPS = frozenset(tag_of(c) for c in get_args(AdminRequest))
KNOWN_OPS = BROKER_OPS | CLIENT_OPS | ADMIN_OPS

# --- replies -------------------------------------------------------------


class Reply(Struct, tag_field="op", kw_only=True):
    id: int = 0


class RegisterBrokerReply(Reply, tag="register_broker"):
    master_addr: str = ""
    ha_addr: str = ""


class HeartbeatReply(Reply, tag="heartbeat"):
    known: bool
    changed: bool


class UnregisterBrokerReply(Reply, tag="unregister_broker"):
    removed: bool


class GetRouteReply(Reply, tag="get_route"):
    # Raw: the route is encoded once per change and spliced into every reply.
    route: TopicRoute | Raw
    revision: int
    epoch: str


class GetRoutesReply(Reply, tag="get_routes"):
    routes: dict[str, TopicRoute | Raw]
    revisions: dict[str, int]
    missing: list[str]
    epoch: str
    unchanged: list[str] = msgspec.field(default_factory=list)  # at the revision held


class GetClusterInfoReply(Reply, tag="get_cluster_info"):
    brokers: dict[str, BrokerData]
    clusters: dict[str, list[str]]
    live: list[LiveBroker]


class GetTopicsReply(Reply, tag="get_topics"):
    topics: list[str]


class SnapshotReply(Reply, tag="snapshot"):
    epoch: str
    revision: int
    # The server sends the map pre-encoded (Raw, once per revision); a client decodes it.
    routes: dict[str, TopicRoute | Raw] | Raw
    brokers: dict[str, BrokerData]
    clusters: dict[str, list[str]]


class FollowerStatus(Struct, frozen=True, kw_only=True):
    """A follower (`zns serve --follow`) a worker feeds, as that worker (its gateway) sees it."""

    # its key's file name in --followers-keys, one line (control characters and bytes not
    # UTF-8 as "?"), cut to 64 bytes ("key KEY" if none)
    name: str
    key: str  # its CURVE public key (Z85)
    admitted_ms: int  # how long ago this worker admitted it
    applied: int  # the last replicated command it acknowledged
    lag_commands: int  # commands this worker applied that it has not acknowledged
    lag_ms: int  # how long ago this worker applied the oldest of those (0: none)


class WorkerStatus(Struct, frozen=True, kw_only=True):
    """A worker process of `zns serve --workers N`, as the state process sees it."""

    worker: int  # 1..N
    pid: int  # 0 while none runs (a replacement waits its backoff)
    state: str  # "starting" (forked, not serving yet), "loaded" (serving) or "down"
    applied: int  # the last replicated command its replica applied
    lag_commands: int  # commands the state process applied that it has not
    lag_ms: int  # how long ago the oldest of those was applied (0: none)
    # zns extension (optional field): under --followers, the followers it feeds (at most
    # 16), as it last reported them (zns.core.figures); UNSET otherwise.
    followers: list[FollowerStatus] | UnsetType = UNSET


class StatusReply(Reply, tag="status"):
    epoch: str
    revision: int
    version: str
    uptime_ms: int
    brokers: int
    topics: int
    pub_endpoint: str
    # zns extension (optional field): the peers of §10 and whether each is connected.
    peers: dict[str, bool] = {}
    # zns extension (optional field): the RocketMQ remoting listener as bound ("" when off).
    remoting: str = ""
    # zns extension (optional field): the worker process that answered (1..N under
    # `zns serve --workers N`); UNSET (not encoded) from a single process.
    worker: int | UnsetType = UNSET
    # zns extension (optional field): every worker under `zns serve --workers N`, as the
    # state process saw them at most a second ago (zns.core.figures); UNSET otherwise.
    workers: list[WorkerStatus] | UnsetType = UNSET
    # zns extension (optional fields): a follower's (`zns serve --follow`): the NameServer
    # endpoint it follows, and how long ago it last heard from it (ms); UNSET otherwise.
    follows: str | UnsetType = UNSET
    silent_ms: int | UnsetType = UNSET


class WipeWritePermReply(Reply, tag="wipe_write_perm"):
    changed: int


class AddWritePermReply(Reply, tag="add_write_perm"):
    changed: int


class DeleteTopicReply(Reply, tag="delete_topic"):
    removed: bool


class RegisterTopicReply(Reply, tag="register_topic"):
    pass


class KvPutReply(Reply, tag="kv_put"):
    pass


class KvGetReply(Reply, tag="kv_get"):
    value: str


class KvDeleteReply(Reply, tag="kv_delete"):
    removed: bool


class KvListReply(Reply, tag="kv_list"):
    entries: dict[str, str]


class Error(Reply, tag="error"):
    code: str
    message: str
    # Only a `not_found` from get_route carries it (§5); UNSET fields are not encoded.
    revision: int | UnsetType = UNSET


REPLY_TYPES: dict[str, type[Reply]] = {
    tag_of(c): c
    for c in (
        RegisterBrokerReply, HeartbeatReply, UnregisterBrokerReply, GetRouteReply,
        GetRoutesReply, GetClusterInfoReply, GetTopicsReply, SnapshotReply, StatusReply,
        WipeWritePermReply, AddWritePermReply, DeleteTopicReply, RegisterTopicReply,
        KvPutReply, KvGetReply, KvDeleteReply, KvListReply,
    )
}

# --- events (§7) ---------------------------------------------------------


class Event(Struct, tag_field="op", kw_only=True):
    epoch: str
    revision: int


class RouteEvent(Event, tag="route"):
    prev: int
    topic: str
    route: TopicRoute | Raw | None


class BrokerEvent(Event, tag="broker"):
    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    change: str  # registered | updated | removed
    reason: str = ""  # "" for registered and updated; a removal reason (protocol §7) else


class HbEvent(Event, tag="hb"):
    time_ms: int


AnyEvent = Union[RouteEvent, BrokerEvent, HbEvent]


def route_channel(topic: str) -> bytes:
    return f"route/{topic}\0".encode()


def broker_channel(cluster: str, broker_name: str) -> bytes:
    return f"broker/{cluster}/{broker_name}\0".encode()


HB_CHANNEL = b"hb\0"
ROUTE_PREFIX = b"route/"
BROKER_PREFIX = b"broker/"


def event_channel(event: RouteEvent | BrokerEvent | HbEvent) -> bytes:
    match event:
        case RouteEvent(topic=topic):
            return route_channel(topic)
        case BrokerEvent(cluster=cluster, broker_name=name):
            return broker_channel(cluster, name)
        case HbEvent():
            return HB_CHANNEL
    raise TypeError(f"not an event: {event!r}")


# --- codecs --------------------------------------------------------------

encoder = msgspec.msgpack.Encoder()
encode = encoder.encode
_request_decoder = msgspec.msgpack.Decoder(AnyRequest)
_event_decoder = msgspec.msgpack.Decoder(AnyEvent)
_reply_decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {
    op: msgspec.msgpack.Decoder(Union[cls, Error]) for op, cls in REPLY_TYPES.items()
}
_any_reply_decoder = msgspec.msgpack.Decoder(Union[tuple(REPLY_TYPES.values()) + (Error,)])


class _Envelope(Struct):
    """What can be read of a body that failed validation: enough to answer it."""

    op: Any = None
    id: Any = 0


_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)


# Decode and validate one request body; raises msgspec.DecodeError (or its
# subclass ValidationError). The bound method itself: it runs once per request.
decode_request: Callable[[bytes], AnyRequest] = _request_decoder.decode


# What each §3 pattern means, so an error names the rule instead of quoting a regex.
_PATTERN_TEXT: dict[Any, str] = {
    Topic: "a topic: 1-127 characters of [A-Za-z0-9_%|-]",
    Name: "a name: 1-255 characters, no control characters, no '/'",
    OptionalName: "a name: 0-255 characters, no control characters, no '/'",
    Zone: "a zone: 0-255 characters, no control characters",
    BrokerAddr: "a broker address host:port (DNS name, IPv4 or [IPv6]; port 1-65535)",
    HaAddr: "an HA address host:port, or empty",
}
_PATTERN_NAMES = {
    f"`str` matching regex {get_args(t)[1].pattern!r}": text for t, text in _PATTERN_TEXT.items()
}


def describe_decode_error(exc: msgspec.DecodeError | RecursionError) -> str:
    """msgspec's message (which names the field path), with §3 patterns in words."""
    message = str(exc)
    for quoted, text in _PATTERN_NAMES.items():
        if quoted in message:
            return message.replace(quoted, text)
    return message


def read_envelope(body: bytes) -> tuple[int, str | None]:
    """The `id` and `op` of a body that did not validate, as far as they can be read."""
    try:
        env = _envelope_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError):  # msgspec raises RecursionError on deep nesting
        return 0, None
    # A msgpack integer is below 2**64 already; only a negative one cannot be echoed.
    rid = env.id if type(env.id) is int and env.id >= 0 else 0
    return rid, env.op if isinstance(env.op, str) else None


def decode_reply(body: bytes, op: str | None = None) -> Reply:
    """Decode a reply; with `op`, only that op's reply or an `error` is accepted."""
    decoder = _any_reply_decoder if op is None else _reply_decoders[op]
    return _decode_bounded(decoder, body)


def decode_event(body: bytes) -> RouteEvent | BrokerEvent | HbEvent:
    return _decode_bounded(_event_decoder, body)


def _decode_bounded(decoder: msgspec.msgpack.Decoder[Any], body: bytes) -> Any:
    """msgspec raises RecursionError on very deep nesting; callers expect a DecodeError."""
    try:
        return decoder.decode(body)
    except RecursionError:
        raise msgspec.DecodeError("MessagePack data is nested too deeply") from None


def decoded_route(route: TopicRoute | Raw | None) -> TopicRoute | None:
    """A route as a client holds it: decoded. Only the server's own replies and events carry
    a pre-encoded Raw route; one in a decoded message is a bug, named as such."""
    if isinstance(route, Raw):
        raise TypeError("a pre-encoded (Raw) route where a decoded TopicRoute was expected")
    return route


# Each request type's op by its type: a dict lookup is ~3× faster than tag_of's attribute
# lookup and assert, and `NameService.respond` asks for the op of every request.
REQUEST_OPS: dict[type[Struct], str] = {c: tag_of(c) for c in get_args(AnyRequest)}


def request_op(request: Request) -> str:
    return REQUEST_OPS[type(request)]

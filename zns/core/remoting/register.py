"""The REGISTER_BROKER (103) body, in both forms a broker may send, and its CRC.

Plain form (every 5.x broker): fastjson JSON of RegisterBrokerBody, read
leniently because static-topic maps use unquoted integer keys. A broker
older than 3.0.11 (version ordinal < 37) sends the TopicConfigSerializeWrapper
alone; an empty body means no topics and a zero DataVersion.

Compressed form (4.x brokers with ``compressedRegister=true``, header
``compressed=true``): a zlib stream inflating to big-endian sections::

    int32 len + DataVersion JSON
    int32 topic count, then per topic:
        int32 len + "<name> <readQ> <writeQ> <perm> <filterType> <attributes JSON>"
    int32 len + filterServerList JSON
    only for brokers of version >= 413 (5.0.0):
        int32 count, then per entry int32 len + TopicQueueMappingInfo JSON

Both decode into the same `RegisterBrokerBody`. Inflation is capped
(`max_inflated_bytes`, by default the frame limit) so a zip bomb costs at
most that much memory, and every length and count is checked against the
bytes actually present before anything is allocated.

What decoding may build is bounded by `max_topics` (the server's
--max-topics-per-request) before any of it is built: the compressed form's
topic and mapping counts are read first, and either form may hold at most
`VALUES_PER_TOPIC` JSON values per topic (`fastjson.count_values`, a count of
bytes). Without that, a few KB of zlib or megabytes of plain JSON cost seconds
of CPU and hundreds of MiB before the limit refused them (figures in
bench/results.md, "Changes measured").
"""

from __future__ import annotations

import struct
import zlib

import msgspec
from msgspec import Struct

from zns.core.errors import RemotingBodyError
from zns.core.text import quote

from .bodies import DataVersion
from .constants import (
    DEFAULT_MAX_FRAME_BYTES, MAPPING_SECTION_MIN_VERSION, QUOTE_CHARS, VERSION_3_0_11,
)
from .ext import ExtFields, parse_long
from .fastjson import MAX_UNQUOTED_KEYS, check_values, loads_lenient, quote_integer_keys

# A 5.x broker writes 21 JSON values per topic (the key, the TopicConfig object and
# its 8 fields, "attributes":{}); this leaves room for a few attributes and for the
# wrapper, and bounds the values a body can make us build to ~0.5 M at the default
# --max-topics-per-request (20,000). A static topic's mapping details are kept raw.
VALUES_PER_TOPIC = 24
VALUES_SLACK = 16_384
DEFAULT_MAX_TOPICS = 20_000  # --max-topics-per-request's default (zns.core.limits)


def max_body_values(max_topics: int) -> int:
    """The most JSON values a register body for `max_topics` topics may hold."""
    return VALUES_PER_TOPIC * max_topics + VALUES_SLACK


class TopicConfig(Struct, rename="camel"):
    """One topic as a broker registers it (Java TopicConfig; defaults are Java's)."""

    topic_name: str | None = None
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] | None = None


class TopicQueueMappingInfo(Struct, rename="camel"):
    """A static topic's queue mapping as a broker reports it; zns only passes it through."""

    topic: str | None = None
    scope: str | None = None
    total_queues: int = 0
    bname: str | None = None
    epoch: int = 0
    dirty: bool = False
    curr_id_map: dict[int, int] | None = None


class TopicConfigSerializeWrapper(Struct, rename="camel"):
    """The broker's topic table and its version."""

    data_version: DataVersion = msgspec.field(default_factory=DataVersion)
    topic_config_table: dict[str, TopicConfig] = {}
    mapping_data_version: DataVersion | None = None
    topic_queue_mapping_info_map: dict[str, TopicQueueMappingInfo] = {}
    # Per-queue details of static topics: kept raw (never built), zns does not interpret them.
    topic_queue_mapping_detail_map: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class RegisterBrokerBody(Struct, rename="camel"):
    """What a REGISTER_BROKER body says, whichever form it came in."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = msgspec.field(
        default_factory=TopicConfigSerializeWrapper
    )
    filter_server_list: list[str] = []


def body_crc32(body: bytes) -> int:
    """RocketMQ's body checksum: CRC-32 with the sign bit cleared (``UtilAll.crc32``)."""
    return zlib.crc32(body) & 0x7FFFFFFF


def check_body_crc32(body: bytes, ext: ExtFields) -> None:
    """Check the ``bodyCrc32`` ext field against `body` as sent (before inflating).

    0 or absent means "not checked", as in Java. A mismatch is a body error
    with Java's remark, "crc32 not match".
    """
    expected = parse_long(ext, "bodyCrc32", required=False)
    if expected and body_crc32(body) != expected:
        raise RemotingBodyError("crc32 not match")


def may_serve_topics(ext: ExtFields, broker_id: int) -> bool:
    """Whether this registration's topics may reach the routes: a master's may, and a
    slave's only from a broker that sends ``enableActingMaster`` (any value: 5.x). Java
    takes a broker without that field for a 4.x one, whose slaves never serve topics,
    while a 5.x slave with the lowest id serves them when no master is registered (§4)."""
    return broker_id == 0 or "enableActingMaster" in (ext or {})


# --- compressed form -------------------------------------------------------------------

_INT32 = struct.Struct(">i")
_FILTER_TYPES = frozenset({"SINGLE_TAG", "MULTI_TAG"})
_ATTRIBUTES = msgspec.json.Decoder(dict[str, str])
_FILTER_LIST = msgspec.json.Decoder(list[str])


class _Reader:
    """Bounds-checked reads over the inflated bytes; running out is a body error."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def int32(self, what: str) -> int:
        if self.left < 4:
            raise RemotingBodyError(f"compressed register body ends early: no room for {what}")
        (value,) = _INT32.unpack_from(self.data, self.pos)
        self.pos += 4
        return value

    def chunk(self, what: str) -> bytes:
        length = self.int32(f"the length of {what}")
        if length < 0 or length > self.left:
            raise RemotingBodyError(
                f"compressed register body: {what} claims {length} bytes, {self.left} are left"
            )
        start = self.pos
        self.pos += length
        return self.data[start : self.pos]

    def count(self, what: str) -> int:
        n = self.int32(what)
        # Java loops zero times on a negative count; every entry needs at least its 4-byte length.
        if n > self.left // 4:
            raise RemotingBodyError(f"compressed register body: {what} {n} exceeds what {self.left} bytes can hold")
        return max(n, 0)


def _parse_java_int(text: str, what: str) -> int:
    try:
        if not text.lstrip("+-").isdigit() or not text.isascii() or len(text) > 11:
            raise ValueError
        value = int(text)
    except ValueError:
        raise RemotingBodyError(f"compressed register body: {what} is not an integer: {quote(text, 24)}") from None
    if not -(2**31) <= value < 2**31:
        raise RemotingBodyError(f"compressed register body: {what} is out of range: {text}")
    return value


def _decode_topic_line(line: bytes) -> TopicConfig:
    # TopicConfig.decode: String.split(" ") (trailing empty strings dropped),
    # at least 5 fields; a 6th that is not JSON (attributes may hold spaces)
    # is ignored and the attributes stay empty.
    parts = line.decode("utf-8", "replace").split(" ")
    while parts and parts[-1] == "":
        parts.pop()
    if len(parts) < 5:
        raise RemotingBodyError(f"compressed register body: topic entry has {len(parts)} fields, not 5: {quote(line, QUOTE_CHARS)}")
    if parts[4] not in _FILTER_TYPES:
        raise RemotingBodyError(f"compressed register body: unknown topic filter type {quote(parts[4], 24)}")
    attributes: dict[str, str] = {}
    if len(parts) >= 6:
        try:
            attributes = _ATTRIBUTES.decode(parts[5])
        except (msgspec.DecodeError, RecursionError):
            pass
    return TopicConfig(
        topic_name=parts[0],
        read_queue_nums=_parse_java_int(parts[1], "readQueueNums"),
        write_queue_nums=_parse_java_int(parts[2], "writeQueueNums"),
        perm=_parse_java_int(parts[3], "perm"),
        topic_filter_type=parts[4],
        attributes=attributes,
    )


def inflate_bounded(data: bytes, max_bytes: int) -> bytes:
    """zlib-inflate `data`, refusing (body error) to produce more than `max_bytes`."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise RemotingBodyError(f"compressed register body is not a valid zlib stream: {exc}") from None
    if len(out) > max_bytes:
        raise RemotingBodyError(f"compressed register body inflates past {max_bytes} bytes")
    if not inflater.eof:  # Java's InflaterInputStream: "Unexpected end of ZLIB input stream"
        raise RemotingBodyError("compressed register body is a truncated zlib stream")
    return out


_MAPPINGS = msgspec.json.Decoder(list[TopicQueueMappingInfo])
_MAPPING = msgspec.json.Decoder(TopicQueueMappingInfo)


def _decode_mappings(chunks: list[bytes]) -> list[TopicQueueMappingInfo]:
    """The mappings' JSON, decoded as one array: one pass, not one (failing, then
    rewritten) decode each. A bad one is decoded alone again, for its own message."""
    try:
        infos = _MAPPINGS.decode(quote_integer_keys(b"[" + b",".join(chunks) + b"]", MAX_UNQUOTED_KEYS))
        if len(infos) == len(chunks):  # else a chunk held more than one value
            return infos
    except (msgspec.DecodeError, RecursionError, RemotingBodyError):
        pass
    infos = []
    for chunk in chunks:
        try:
            infos.append(_MAPPING.decode(quote_integer_keys(chunk, MAX_UNQUOTED_KEYS)))
        except (msgspec.DecodeError, RecursionError, RemotingBodyError):
            # Raises the body error with this mapping's own message.
            infos.append(loads_lenient(chunk, TopicQueueMappingInfo, what="TopicQueueMappingInfo"))
    return infos


def _check_count(count: int, what: str, max_topics: int) -> int:
    if count > max_topics:
        raise RemotingBodyError(f"compressed register body: {what} {count} is more than the "
                                f"{max_topics} topics --max-topics-per-request allows; refused "
                                f"before decoding")
    return count


def _decode_compressed(body: bytes, version: int, max_inflated_bytes: int,
                       max_topics: int) -> RegisterBrokerBody:
    inflated = inflate_bounded(body, max_inflated_bytes)
    check_values(inflated, max_body_values(max_topics), "compressed register body",
                 f"a body of {max_topics} topics may hold (--max-topics-per-request)")
    r = _Reader(inflated)
    data_version = loads_lenient(r.chunk("the DataVersion"), DataVersion, what="compressed register body DataVersion")
    topics: dict[str, TopicConfig] = {}
    for _ in range(_check_count(r.count("topic count"), "topic count", max_topics)):
        tc = _decode_topic_line(r.chunk("a topic entry"))
        topics[tc.topic_name or ""] = tc
    filter_json = r.chunk("the filter server list")
    try:
        filter_servers = _FILTER_LIST.decode(filter_json)
    except (msgspec.DecodeError, RecursionError):
        filter_servers = []  # Java logs the failure and goes on with an empty list
    mappings: dict[str, TopicQueueMappingInfo] = {}
    if version >= MAPPING_SECTION_MIN_VERSION:
        # A mapping is a static topic's: at most one per topic.
        count = _check_count(r.count("topic queue mapping count"), "topic queue mapping count", max_topics)
        for info in _decode_mappings([r.chunk("a topic queue mapping") for _ in range(count)]):
            mappings[info.topic or ""] = info
    # Bytes after the last section are ignored, as Java ignores them.
    return RegisterBrokerBody(
        topic_config_serialize_wrapper=TopicConfigSerializeWrapper(
            data_version=data_version, topic_config_table=topics, topic_queue_mapping_info_map=mappings
        ),
        filter_server_list=filter_servers,
    )


def decode_register_broker_body(
    body: bytes,
    *,
    compressed: bool,
    version: int,
    max_inflated_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_topics: int = DEFAULT_MAX_TOPICS,
) -> RegisterBrokerBody:
    """Decode a REGISTER_BROKER body.

    `compressed` is the request's ``compressed`` ext field (parse it with
    `parse_bool`), `version` the request header's version ordinal. Check the
    CRC first (`check_body_crc32`): Java checks it over the body as sent.
    A body that may hold more than `max_topics` topics' worth of values is
    refused before anything is built (the limit itself is checked on the
    decoded topics, by the route table). Raises `RemotingBodyError` for
    anything that cannot be read.
    """
    if not body:
        # Java: no body -> a zero DataVersion and no topics.
        return RegisterBrokerBody()
    if compressed and version >= VERSION_3_0_11:
        return _decode_compressed(body, version, max_inflated_bytes, max_topics)
    what = "register body (topic config wrapper)" if version < VERSION_3_0_11 else "register body"
    check_values(body, max_body_values(max_topics), what,
                 f"a body of {max_topics} topics may hold (--max-topics-per-request)")
    if version < VERSION_3_0_11:
        wrapper = loads_lenient(body, TopicConfigSerializeWrapper, what=what)
        return RegisterBrokerBody(topic_config_serialize_wrapper=wrapper)
    return loads_lenient(body, RegisterBrokerBody, what=what)


__all__ = [
    "TopicConfig",
    "TopicQueueMappingInfo",
    "TopicConfigSerializeWrapper",
    "RegisterBrokerBody",
    "body_crc32",
    "check_body_crc32",
    "inflate_bounded",
    "decode_register_broker_body",
]

"""Numbers of the RocketMQ remoting protocol that the NameServer front end needs.

Request and response codes are `IntEnum`s so a log line can name them, but
every API accepts plain ints: a peer may send codes this table does not know.
"""

from __future__ import annotations

from enum import IntEnum

# --- frames ----------------------------------------------------------------

SERIALIZE_JSON = 0      # header is fastjson JSON
SERIALIZE_ROCKETMQ = 1  # header is RocketMQ's compact binary layout
SERIALIZE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}

# The Java server's default frame limit (com.rocketmq.remoting.frameMaxLength),
# counting the 4-byte length field itself.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024

# How much of a peer's text a frame or body error quotes (`zns.core.text.quote`): a
# hostile peer cannot make the server log or echo megabytes.
QUOTE_CHARS = 64

FLAG_RESPONSE = 1 << 0  # bit 0: this command is a reply
FLAG_ONEWAY = 1 << 1    # bit 1: the sender wants no reply

# --- versions (MQVersion.Version ordinals) ---------------------------------

VERSION_3_0_11 = 37    # first broker sending the RegisterBrokerBody wrapper (older: the topic table alone)
VERSION_4_0_0 = 213
VERSION_4_9_4 = 401    # clients from here on get TopicRouteData as standard JSON
VERSION_5_0_0 = 413    # compressed registrations carry the topic-queue-mapping section
VERSION_5_3_0 = 473
VERSION_5_3_3 = 479    # what zns announces in its replies, as a 5.3.3 NameServer does
STANDARD_JSON_MIN_VERSION = VERSION_4_9_4
MAPPING_SECTION_MIN_VERSION = VERSION_5_0_0

# --- languages ---------------------------------------------------------------

# LanguageCode: enum name <-> the byte of the ROCKETMQ header.
LANGUAGE_CODES: dict[str, int] = {
    "JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "DELPHI": 4, "ERLANG": 5, "RUBY": 6,
    "OTHER": 7, "HTTP": 8, "GO": 9, "PHP": 10, "OMS": 11, "RUST": 12, "NODE_JS": 13,
}
LANGUAGE_NAMES: dict[int, str] = {code: name for name, code in LANGUAGE_CODES.items()}


class ResponseCode(IntEnum):
    """Response codes a NameServer sends (RemotingSysResponseCode / ResponseCode)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    QUERY_NOT_FOUND = 22
    GO_AWAY = 1500


class RequestCode(IntEnum):
    """Request codes the RocketMQ 5.3.3 NameServer handles (plus HEART_BEAT, which it refuses)."""

    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    HEART_BEAT = 34  # a broker code, not a NameServer one: answered REQUEST_CODE_NOT_SUPPORTED
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_NAMESRV = 216
    REGISTER_TOPIC_IN_NAMESRV = 217
    GET_KVLIST_BY_NAMESPACE = 219
    GET_TOPICS_BY_CLUSTER = 224
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_UNIT_TOPIC_LIST = 311
    GET_HAS_UNIT_SUB_TOPIC_LIST = 312
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    QUERY_DATA_VERSION = 322
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_BROKER_MEMBER_GROUP = 901
    BROKER_HEARTBEAT = 904


# Codes a NameServer answers (everything else: REQUEST_CODE_NOT_SUPPORTED).
NAMESERVER_REQUEST_CODES: frozenset[int] = frozenset(
    int(c) for c in RequestCode if c is not RequestCode.HEART_BEAT
)

# --- topic bits --------------------------------------------------------------

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
SYS_FLAG_UNIT = 1      # TopicSysFlag.FLAG_UNIT
SYS_FLAG_UNIT_SUB = 2  # TopicSysFlag.FLAG_UNIT_SUB

# --- ext field names with a meaning of their own -----------------------------

EXT_ZONE_NAME = "__ZONE_NAME"
EXT_ZONE_MODE = "__ZONE_MODE"
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"

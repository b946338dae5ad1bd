"""RocketMQ remoting protocol: the codec and the translation to ZNS/1 ops (sans-I/O).

This package lets zns speak the remoting protocol of Apache RocketMQ 5.3.3 so
that unmodified brokers, clients and ``mqadmin`` can use zns as their
NameServer. It does no I/O: a listener feeds it bytes and writes back what it
returns. Modules:

* `constants` -- request/response codes, languages, version ordinals, flags.
* `RemotingFrameError` (close the connection) and `RemotingBodyError`
  (answer SYSTEM_ERROR, keep the connection) live in the one error tree,
  `zns.core.errors`, and are re-exported here.
* `command` -- `RemotingCommand`, both header serializations, `FrameDecoder`
  and `encode_command`.
* `fastjson` -- fastjson's two string escapings, Java HashMap order,
  `loads_lenient` for JSON with unquoted integer keys.
* `bodies` -- TopicRouteData, ClusterInfo, TopicList, KVTable, DataVersion,
  broker member group: byte-exact encoders and the decoders zns needs.
* `register` -- the REGISTER_BROKER body (plain and zlib-compressed) and its CRC.
* `ext` -- Java-style parsing of ext fields (parseInt/parseLong/parseBoolean).

The names below are the public API; import them from here.
"""

from .bodies import (
    BrokerData,
    DataVersion,
    QueueData,
    TopicRouteData,
    decode_data_version,
    decode_topic_route_data,
    encode_broker_member_group,
    encode_cluster_info,
    encode_data_version,
    encode_kv_table,
    encode_topic_list,
    encode_topic_route,
    wants_standard_json,
)
from .command import (
    MAX_EXT_FIELDS,
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    decode_json_header,
    decode_rocketmq_header,
    encode_command,
    encode_json_header,
    encode_rocketmq_header,
)
from .constants import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_CODES,
    LANGUAGE_NAMES,
    MAPPING_SECTION_MIN_VERSION,
    NAMESERVER_REQUEST_CODES,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    STANDARD_JSON_MIN_VERSION,
    VERSION_3_0_11,
    VERSION_5_3_3,
    RequestCode,
    ResponseCode,
)
from zns.core.errors import RemotingBodyError, RemotingError, RemotingFrameError
from .ext import optional, parse_bool, parse_int, parse_long, require
from .fastjson import escape_legacy, escape_standard, java_hashmap_order, loads_lenient, quote_integer_keys
from .register import (
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicQueueMappingInfo,
    body_crc32,
    check_body_crc32,
    decode_register_broker_body,
)

__all__ = [
    "BrokerData", "DataVersion", "QueueData", "TopicRouteData",
    "decode_data_version", "decode_topic_route_data", "encode_broker_member_group",
    "encode_cluster_info", "encode_data_version", "encode_kv_table", "encode_topic_list",
    "encode_topic_route", "wants_standard_json",
    "MAX_EXT_FIELDS", "FrameDecoder", "RemotingCommand", "decode_frame", "decode_json_header",
    "decode_rocketmq_header", "encode_command", "encode_json_header", "encode_rocketmq_header",
    "DEFAULT_MAX_FRAME_BYTES", "FLAG_ONEWAY", "FLAG_RESPONSE", "LANGUAGE_CODES", "LANGUAGE_NAMES",
    "MAPPING_SECTION_MIN_VERSION", "NAMESERVER_REQUEST_CODES", "SERIALIZE_JSON", "SERIALIZE_ROCKETMQ",
    "STANDARD_JSON_MIN_VERSION", "VERSION_3_0_11", "VERSION_5_3_3", "RequestCode", "ResponseCode",
    "RemotingBodyError", "RemotingError", "RemotingFrameError",
    "optional", "parse_bool", "parse_int", "parse_long", "require",
    "escape_legacy", "escape_standard", "java_hashmap_order", "loads_lenient", "quote_integer_keys",
    "RegisterBrokerBody", "TopicConfig", "TopicConfigSerializeWrapper", "TopicQueueMappingInfo",
    "body_crc32", "check_body_crc32", "decode_register_broker_body",
]

"""JSON bodies the NameServer sends and reads, in fastjson's two forms.

Replies (`encode_*`) are written byte for byte as fastjson 1.2.83 writes
them for RocketMQ 5.3.3: bean fields sorted by name, nulls left out, and
either the **legacy** form (unquoted integer map keys, minimal escaping) or
the **standard** form (every key quoted, ``/`` and non-ASCII escaped). Only
``TopicRouteData`` is ever sent in the standard form; every other body is
legacy, as in Java. `encode_topic_route` is meant to run once per route
change: the two results are plain bytes a GET_ROUTEINFO_BY_TOPIC reply can
reuse as its body.

Map and list order. fastjson writes a ``HashMap`` or ``ConcurrentHashMap`` in its
iteration order, a function of the keys' hash codes, the table's capacity and the
insertion order within a bucket (zns.core.remoting.javaorder computes it). The
encoders write lists and string-keyed maps in the order they are given -- the
handler gives Java's -- except where Java sorts: the standard form's maps
(``MapSortField``). Broker-id maps (``brokerAddrs``) are written in a Long-keyed
HashMap's order in the legacy form (ascending for ids below 16) and sorted in the
standard one.

Inputs are duck-typed: `encode_topic_route` takes zns's own route shape
(``zns.core.schema.TopicRoute``) or this module's `TopicRouteData`, which mirrors
it attribute for attribute and is also what `decode_topic_route_data` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import msgspec
from msgspec import Struct

from .constants import STANDARD_JSON_MIN_VERSION
from zns.core.errors import RemotingBodyError
from zns.core.schema import TopicRoute
from .javaorder import hashmap_order, route_in_java_order
from .fastjson import (
    LEGACY_SPECIAL, STANDARD_SPECIAL, check_values, escape_legacy, escape_standard, loads_lenient, to_utf8,
)

# --- shapes (wire names via rename; Python names match zns.core.schema) ---------------


class DataVersion(Struct, rename="camel"):
    """A broker's topic-table version; equal when all three fields are."""

    counter: int = 0
    state_version: int = 0
    timestamp: int = 0


class QueueData(Struct, rename={"broker_name": "brokerName", "read_queues": "readQueueNums", "write_queues": "writeQueueNums", "sys_flag": "topicSysFlag"}):
    """One broker's queues of a topic (Java QueueData)."""

    broker_name: str
    read_queues: int = 0
    write_queues: int = 0
    perm: int = 0
    sys_flag: int = 0


class BrokerData(Struct, rename={"broker_name": "brokerName", "addrs": "brokerAddrs", "zone": "zoneName", "enable_acting_master": "enableActingMaster"}):
    """A broker name's addresses by broker id (Java BrokerData)."""

    broker_name: str
    cluster: str = ""
    addrs: dict[int, str] = {}
    zone: str = ""
    enable_acting_master: bool = False


class TopicRouteData(Struct, rename={"queues": "queueDatas", "brokers": "brokerDatas", "filter_servers": "filterServerTable", "order_conf": "orderTopicConf"}):
    """A topic's route (Java TopicRouteData); `topic` is not on the wire."""

    queues: list[QueueData] = []
    brokers: list[BrokerData] = []
    filter_servers: dict[str, list[str]] = {}
    order_conf: str = ""
    topic: str = ""


# Read-only members (properties): a Struct's list and dict fields then match the protocol's
# Sequence and Mapping (a mutable protocol attribute must match its type exactly).
class QueueLike(Protocol):
    @property
    def broker_name(self) -> str: ...
    @property
    def read_queues(self) -> int: ...
    @property
    def write_queues(self) -> int: ...
    @property
    def perm(self) -> int: ...
    @property
    def sys_flag(self) -> int: ...


class BrokerLike(Protocol):
    @property
    def cluster(self) -> str: ...
    @property
    def broker_name(self) -> str: ...
    @property
    def addrs(self) -> Mapping[int, str]: ...
    @property
    def zone(self) -> str: ...


class RouteLike(Protocol):
    @property
    def queues(self) -> Sequence[QueueLike]: ...
    @property
    def brokers(self) -> Sequence[BrokerLike]: ...
    @property
    def filter_servers(self) -> Mapping[str, Sequence[str]]: ...
    @property
    def order_conf(self) -> str: ...


# --- emitters -----------------------------------------------------------------------


def _plain(s: str) -> str:
    # For strings already known to need no escaping in the chosen form.
    return f'"{s}"'


def _escaper(strings: Iterable[str], legacy: bool) -> Callable[[str], str]:
    """The escape function for a document whose strings are `strings`.

    One regex scan over all of them (in C) usually shows that nothing needs
    escaping -- names and addresses are plain ASCII -- and then every string
    is written as is, instead of paying a Python-level check per string.
    """
    special = LEGACY_SPECIAL if legacy else STANDARD_SPECIAL
    if special.search("".join(strings)) is None:
        return _plain
    return escape_legacy if legacy else escape_standard


def _broker_json(b: BrokerLike, legacy: bool, esc: Callable[[str], str]) -> str:
    # brokerAddrs keys are Java Longs: bare numbers in the legacy form, quoted in the standard one.
    if legacy:
        ids = b.addrs if len(b.addrs) <= 1 else hashmap_order(sorted(b.addrs))
        addrs = ",".join([f"{bid}:{esc(b.addrs[bid])}" for bid in ids])
    else:
        addrs = ",".join([f'"{bid}":{esc(addr)}' for bid, addr in sorted(b.addrs.items())])
    acting = "true" if getattr(b, "enable_acting_master", False) else "false"
    zone = f',"zoneName":{esc(b.zone)}' if b.zone else ""  # Java: null unless the broker has a zone
    return (
        f'{{"brokerAddrs":{{{addrs}}},"brokerName":{esc(b.broker_name)},"cluster":{esc(b.cluster)},'
        f'"enableActingMaster":{acting}{zone}}}'
    )


def _utf16_key(s: str) -> bytes:
    # Java compares strings by UTF-16 unit; that differs from code-point order
    # only around surrogates, but TreeMap's order is the one to match.
    return s.encode("utf-16-be", "surrogatepass")


def encode_topic_route(route: RouteLike, legacy: bool) -> bytes:
    """TopicRouteData for GET_ROUTEINFO_BY_TOPIC, in the legacy or standard form.

    `route` has zns's shape: ``queues`` (broker_name, read_queues,
    write_queues, perm, sys_flag), ``brokers`` (cluster, broker_name, addrs
    ``{id: "host:port"}``, zone, optionally enable_acting_master),
    ``filter_servers`` and ``order_conf``. ``zoneName`` is written only for a
    non-empty zone and ``orderTopicConf`` only when set, as Java leaves nulls
    out. Call it once per route change and keep both results.
    """
    strings = [q.broker_name for q in route.queues]
    for b in route.brokers:
        strings += (b.broker_name, b.cluster, b.zone, *b.addrs.values())
    for addr, servers in route.filter_servers.items():
        strings += (addr, *servers)
    strings.append(route.order_conf)
    esc = _escaper(strings, legacy)
    brokers = ",".join([_broker_json(b, legacy, esc) for b in route.brokers])
    items = route.filter_servers.items()  # legacy: the map's own order (Java's, given)
    filters = ",".join(
        f'{esc(addr)}:[{",".join(esc(s) for s in servers)}]'
        for addr, servers in (items if legacy else sorted(items, key=lambda kv: _utf16_key(kv[0])))
    )
    order = f',"orderTopicConf":{esc(route.order_conf)}' if route.order_conf else ""
    queues = ",".join([
        f'{{"brokerName":{esc(q.broker_name)},"perm":{q.perm},"readQueueNums":{q.read_queues},'
        f'"topicSysFlag":{q.sys_flag},"writeQueueNums":{q.write_queues}}}'
        for q in route.queues
    ])
    text = f'{{"brokerDatas":[{brokers}],"filterServerTable":{{{filters}}}{order},"queueDatas":[{queues}]}}'
    # The standard form is pure ASCII (so UTF-8 is ASCII); the legacy form keeps non-ASCII as UTF-8.
    return to_utf8(text)


class JavaRouteJson:
    """A route (of the table, or zone-filtered) as the Java NameServer writes its TopicRouteData:
    the encoder the route cache (zns.core.encoded_routes) is given for its JSON forms.

    `queue_names(topic)`: the topic's broker names in the order their queue data went in
    (None: the route's own order), for the lists' Java order. `order_conf`: Java's
    ``orderMessageEnable``; only then does a route carry ``orderTopicConf``.
    """

    __slots__ = ("queue_names", "order_conf")

    def __init__(self, queue_names: Callable[[str], Sequence[str]] | None = None, *,
                 order_conf: bool = False) -> None:
        self.queue_names = queue_names
        self.order_conf = order_conf

    def __call__(self, route: TopicRoute, legacy: bool, *, reparsed_sorted: bool = False) -> bytes:
        """`reparsed_sorted`: the filter servers in the order of a HashMap filled from the
        sorted map of the standard form -- what Java's zone filter writes for a requester of
        version 4.9.4 or later: it parses the reply it made (maps sorted) and encodes it again."""
        if route.order_conf and not self.order_conf:
            route = msgspec.structs.replace(route, order_conf="")
        if self.queue_names is not None and (len(route.queues) > 1 or route.filter_servers):
            route = route_in_java_order(route, self.queue_names(route.topic))
        if reparsed_sorted and len(route.filter_servers) > 1:
            servers = route.filter_servers
            route = msgspec.structs.replace(
                route, filter_servers={a: servers[a] for a in hashmap_order(sorted(servers))})
        return encode_topic_route(route, legacy)


def wants_standard_json(version: int, ext_fields: Mapping[str, str] | None) -> bool:
    """Whether a GET_ROUTEINFO_BY_TOPIC request gets the standard form.

    True for a requester of version >= 4.9.4 (ordinal 401) or one that sends
    ``acceptStandardJsonOnly=true`` (any case, as Java's parseBoolean).
    """
    if version >= STANDARD_JSON_MIN_VERSION:
        return True
    flag = (ext_fields or {}).get("acceptStandardJsonOnly")
    return flag is not None and flag.lower() == "true"


def encode_cluster_info(brokers: Mapping[str, BrokerLike], clusters: Mapping[str, Iterable[str]]) -> bytes:
    """ClusterInfo for GET_BROKER_CLUSTER_INFO (always the legacy form, as Java sends it).

    `brokers` maps broker name to its BrokerData, `clusters` cluster name to
    its broker names (zns's get_cluster_info shape); both are written in the
    order given.
    """
    table = ",".join(
        f"{escape_legacy(name)}:{_broker_json(b, True, escape_legacy)}"
        for name, b in brokers.items()
    )
    cl = ",".join(
        f'{escape_legacy(c)}:[{",".join(escape_legacy(n) for n in names)}]'
        for c, names in clusters.items()
    )
    return to_utf8(f'{{"brokerAddrTable":{{{table}}},"clusterAddrTable":{{{cl}}}}}')


def encode_broker_member_group(cluster: str | None, broker_name: str | None,
                               addrs: Mapping[int, str]) -> bytes:
    """GetBrokerMemberGroupResponseBody for GET_BROKER_MEMBER_GROUP (legacy form); a None
    name is left out, as fastjson leaves out a null field."""
    a = ",".join(f"{bid}:{escape_legacy(addrs[bid])}" for bid in hashmap_order(sorted(addrs)))
    name = "" if broker_name is None else f',"brokerName":{escape_legacy(broker_name)}'
    of = "" if cluster is None else f',"cluster":{escape_legacy(cluster)}'
    return to_utf8(f'{{"brokerMemberGroup":{{"brokerAddrs":{{{a}}}{name}{of}}}}}')


def encode_topic_list(topics: Iterable[str], broker_addr: str | None = None) -> bytes:
    """TopicList: ``{"topicList":[...]}``, with ``brokerAddr`` first when given (304).

    Topics are written in the order given (Java's is its set's hash order).
    """
    items = ",".join(escape_legacy(t) for t in topics)
    addr = f'"brokerAddr":{escape_legacy(broker_addr)},' if broker_addr is not None else ""
    return to_utf8(f'{{{addr}"topicList":[{items}]}}')


def encode_kv_table(table: Mapping[str, str]) -> bytes:
    """KVTable: ``{"table":{key: value}}`` (GET_KVLIST_BY_NAMESPACE, the REGISTER_BROKER reply),
    entries in the order given."""
    items = ",".join(f"{escape_legacy(k)}:{escape_legacy(v)}" for k, v in table.items())
    return to_utf8(f'{{"table":{{{items}}}}}')


_DV_ENCODER = msgspec.json.Encoder()


def encode_data_version(dv: DataVersion) -> bytes:
    """DataVersion JSON (the QUERY_DATA_VERSION reply body); msgspec writes it exactly."""
    return _DV_ENCODER.encode(dv)


def decode_data_version(body: bytes) -> DataVersion:
    """The DataVersion a broker sends with QUERY_DATA_VERSION (body error if malformed)."""
    return loads_lenient(body, DataVersion, what="DataVersion body")


# A route names each broker name once in its queue data and once in its broker data
# (with an address map): ~30 JSON values per broker name.
ROUTE_VALUES_PER_BROKER = 32


def decode_topic_route_data(body: bytes, *, max_brokers: int = 10_000) -> TopicRouteData:
    """TopicRouteData as REGISTER_TOPIC_IN_NAMESRV sends it (either form; only queues matter).

    A body that may hold more values than a route of `max_brokers` broker names
    (the server's --max-brokers) is refused before anything is built.
    """
    if not body:
        raise RemotingBodyError("REGISTER_TOPIC body is empty: a TopicRouteData is required")
    check_values(body, ROUTE_VALUES_PER_BROKER * max_brokers + 1024, "TopicRouteData body",
                 f"a route of {max_brokers} broker names may hold (--max-brokers)")
    return loads_lenient(body, TopicRouteData, what="TopicRouteData body")


__all__ = [
    "DataVersion",
    "QueueData",
    "BrokerData",
    "TopicRouteData",
    "encode_topic_route",
    "wants_standard_json",
    "encode_cluster_info",
    "encode_broker_member_group",
    "encode_topic_list",
    "encode_kv_table",
    "encode_data_version",
    "decode_data_version",
    "decode_topic_route_data",
]

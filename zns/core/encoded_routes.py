"""Every route's encodings, for both listeners: ZNS/1 MessagePack and RocketMQ's two JSON forms.

One cache, so one rule decides when an encoding is made and when it goes:

- **Lazily, once per change.** A form of a topic's route is encoded the first
  time it is asked for and reused until the route changes (`forget`, called
  for every route event): a restart storm changes shared routes faster than
  anyone asks for them, and most topics are only ever read in one form.
- **MessagePack** encodings are kept while their route lasts. What they hold
  is bounded by the route table's own limits (--max-queues counts every entry
  a route carries) and measured in docs/operations.md.
- **JSON** encodings (GET_ROUTEINFO_BY_TOPIC) are bounded by bytes:
  `max_json_bytes` of them at most, the oldest dropped first. Each is made by
  a request, so without a bound one read of every topic would keep two more
  copies of the whole table (100,000 topics once read both ways held 75 MiB
  more); with it, a hot set larger than the bound costs re-encoding, never
  memory.

The JSON forms list queues and brokers in the Java NameServer's HashMap order
(zns.core.remoting.javaorder), not ZNS/1's sorted order. They carry `orderTopicConf` only when `json_order_conf` is set (Java's
``orderMessageEnable``, the remoting listener's setting; see
zns.core.remoting.handler).

Sans-I/O; counts are plain ints a metrics scrape may read from another thread.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from msgspec import Raw

from zns.core.remoting.bodies import encode_topic_route
from zns.core.remoting.javaorder import hashmap_order, route_in_java_order
from zns.core.schema import TopicRoute

# What one cached encoding costs beyond its bytes: the bytes object's header and its
# slot in the dict (the topic string is the route table's own).
ENTRY_OVERHEAD_BYTES = 100
DEFAULT_MAX_JSON_BYTES = 64 << 20


class EncodedRoutes:
    __slots__ = ("_route", "_msgpack", "_encode", "_json", "max_json_bytes", "msgpack_bytes",
                 "json_bytes", "_json_order_conf", "_queue_names")

    def __init__(self, route: Callable[[str], TopicRoute | None],
                 encode_msgpack: Callable[[object], bytes],
                 max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
                 queue_names: Callable[[str], list[str]] | None = None) -> None:
        """`route`: the route table's current route of a topic; `encode_msgpack`: ZNS/1's
        encoder (bytes of exactly the encoding's size); `queue_names`: a topic's broker
        names in the order their queue data went in, for the JSON forms' Java order
        (None: the route's own order)."""
        self._route = route
        self._queue_names = queue_names
        self._encode = encode_msgpack
        self._msgpack: dict[str, Raw] = {}
        # legacy (True) and standard (False) JSON, each oldest first
        self._json: dict[bool, dict[str, bytes]] = {True: {}, False: {}}
        self.max_json_bytes = max_json_bytes
        self.msgpack_bytes = 0  # what the MessagePack encodings held weigh
        self.json_bytes = 0  # ... and the JSON ones (never above max_json_bytes)
        self._json_order_conf = False

    def msgpack(self, topic: str, route: TopicRoute | None = None) -> Raw | None:
        """The topic's route as ZNS/1 MessagePack; None if it has none. `route`: the
        topic's current route when the caller holds it already."""
        raw = self._msgpack.get(topic)
        if raw is None:
            if route is None and (route := self._route(topic)) is None:
                return None
            raw = self._msgpack[topic] = Raw(self._encode(route))
            self.msgpack_bytes += len(raw) + ENTRY_OVERHEAD_BYTES
        return raw

    def json(self, topic: str, legacy: bool) -> bytes | None:
        """The topic's route as TopicRouteData in fastjson's legacy or standard form; None
        if it has none."""
        held = self._json[legacy]
        body = held.get(topic)
        if body is None:
            if (route := self._route(topic)) is None:
                return None
            body = self.encode_json(route, legacy)
            cost = len(body) + ENTRY_OVERHEAD_BYTES
            if cost > self.max_json_bytes:
                return body  # larger than the whole bound: served, never kept
            while self.json_bytes + cost > self.max_json_bytes:
                self._evict_oldest_json()
            held[topic] = body
            self.json_bytes += cost
        return body

    @property
    def json_order_conf(self) -> bool:
        return self._json_order_conf

    @json_order_conf.setter
    def json_order_conf(self, value: bool) -> None:
        """Set once, at start; a change drops the JSON forms made under the other rule."""
        if value != self._json_order_conf:
            self._json_order_conf = value
            for held in self._json.values():
                held.clear()
            self.json_bytes = 0

    def encode_json(self, route: TopicRoute, legacy: bool, *, reparsed_sorted: bool = False) -> bytes:
        """`route` (of the table, or zone-filtered) as TopicRouteData, as every JSON form is made.

        `reparsed_sorted`: the filter servers in the order of a HashMap filled from the sorted
        map of the standard form -- what Java's zone filter writes for a requester of version
        4.9.4 or later: it parses the reply it made (maps sorted) and encodes it again."""
        if route.order_conf and not self._json_order_conf:
            route = msgspec.structs.replace(route, order_conf="")
        if self._queue_names is not None and (len(route.queues) > 1 or route.filter_servers):
            route = route_in_java_order(route, self._queue_names(route.topic))
        if reparsed_sorted and len(route.filter_servers) > 1:
            servers = route.filter_servers
            route = msgspec.structs.replace(
                route, filter_servers={a: servers[a] for a in hashmap_order(sorted(servers))})
        return encode_topic_route(route, legacy)

    def forget(self, topic: str) -> None:
        """The topic's route changed or went: its encodings are stale."""
        raw = self._msgpack.pop(topic, None)
        if raw is not None:
            self.msgpack_bytes -= len(raw) + ENTRY_OVERHEAD_BYTES
        for held in self._json.values():
            body = held.pop(topic, None)
            if body is not None:
                self.json_bytes -= len(body) + ENTRY_OVERHEAD_BYTES

    def __len__(self) -> int:
        """Encodings held, all forms."""
        return len(self._msgpack) + sum(map(len, self._json.values()))

    def _evict_oldest_json(self) -> None:
        legacy, standard = self._json[True], self._json[False]
        held = legacy if len(legacy) >= len(standard) else standard
        body = held.pop(next(iter(held)))
        self.json_bytes -= len(body) + ENTRY_OVERHEAD_BYTES

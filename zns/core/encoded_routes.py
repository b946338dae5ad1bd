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

The cache knows no wire format but its own: it is handed its encoders. The
JSON one (`json_encoder`) is the remoting listener's
(zns.core.remoting.bodies.JavaRouteJson: the Java NameServer's HashMap order,
``orderTopicConf`` only with Java's ``orderMessageEnable``), set when the
listener is made; so imports point from remoting to the core, never back.

Sans-I/O; counts are plain ints a metrics scrape may read from another thread.
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec import Raw

from zns.core.schema import TopicRoute

# What one cached encoding costs beyond its bytes: the bytes object's header and its
# slot in the dict (the topic string is the route table's own).
ENTRY_OVERHEAD_BYTES = 100
DEFAULT_MAX_JSON_BYTES = 64 << 20
# A route in RocketMQ's legacy (True) or standard (False) JSON form.
JsonEncoder = Callable[[TopicRoute, bool], bytes]


def _no_json_encoder(route: TopicRoute, legacy: bool) -> bytes:
    raise RuntimeError("no JSON encoder: the remoting listener sets one (EncodedRoutes.json_encoder)")


class EncodedRoutes:
    __slots__ = ("_route", "_msgpack", "_encode", "_json", "max_json_bytes", "msgpack_bytes",
                 "json_bytes", "_json_encoder")

    def __init__(self, route: Callable[[str], TopicRoute | None],
                 encode_msgpack: Callable[[object], bytes],
                 max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
                 json_encoder: JsonEncoder = _no_json_encoder) -> None:
        """`route`: the route table's current route of a topic; `encode_msgpack`: ZNS/1's
        encoder (bytes of exactly the encoding's size); `json_encoder`: the JSON forms'
        (settable later, see `json_encoder`)."""
        self._route = route
        self._encode = encode_msgpack
        self._json_encoder = json_encoder
        self._msgpack: dict[str, Raw] = {}
        # legacy (True) and standard (False) JSON, each oldest first
        self._json: dict[bool, dict[str, bytes]] = {True: {}, False: {}}
        self.max_json_bytes = max_json_bytes
        self.msgpack_bytes = 0  # what the MessagePack encodings held weigh
        self.json_bytes = 0  # ... and the JSON ones (never above max_json_bytes)

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
            body = self._json_encoder(route, legacy)
            cost = len(body) + ENTRY_OVERHEAD_BYTES
            if cost > self.max_json_bytes:
                return body  # larger than the whole bound: served, never kept
            while self.json_bytes + cost > self.max_json_bytes:
                self._evict_oldest_json()
            held[topic] = body
            self.json_bytes += cost
        return body

    @property
    def json_encoder(self) -> JsonEncoder:
        return self._json_encoder

    @json_encoder.setter
    def json_encoder(self, encoder: JsonEncoder) -> None:
        """Set once, at start; the JSON forms made by the encoder before are dropped."""
        self._json_encoder = encoder
        for held in self._json.values():
            held.clear()
        self.json_bytes = 0

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

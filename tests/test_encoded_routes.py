"""The one cache of route encodings (zns.core.encoded_routes): lazy, once per change, JSON bounded."""

from __future__ import annotations

import msgspec
import pytest

from zns.core.encoded_routes import ENTRY_OVERHEAD_BYTES, EncodedRoutes
from zns.core.remoting.bodies import encode_topic_route
from zns.core.schema import BrokerData, QueueData, TopicRoute, encode

pytestmark = pytest.mark.timeout(60)


def route_of(topic: str, perm: int = 6, order_conf: str = "") -> TopicRoute:
    return TopicRoute(
        topic=topic, queues=[QueueData("broker-a", 4, 4, perm, 0)],
        brokers=[BrokerData(cluster="c1", broker_name="broker-a", addrs={0: "10.0.0.1:10911"})],
        filter_servers={}, order_conf=order_conf)


class Table:
    """Routes by topic, and how often each was looked up."""

    def __init__(self, topics: int) -> None:
        self.routes = {f"T{i:05d}": route_of(f"T{i:05d}") for i in range(topics)}
        self.lookups: list[str] = []

    def route(self, topic: str) -> TopicRoute | None:
        self.lookups.append(topic)
        return self.routes.get(topic)


def new_cache(table: Table, max_json_bytes: int = 1 << 20) -> tuple[EncodedRoutes, list]:
    made: list = []

    def msgpack(value: object) -> bytes:
        made.append(value)
        return encode(value)

    return EncodedRoutes(table.route, msgpack, max_json_bytes), made


def test_each_form_is_made_when_first_asked_for_and_once_per_change():
    table = Table(2)
    cache, made = new_cache(table)
    assert len(cache) == 0 and cache.msgpack_bytes == cache.json_bytes == 0
    for _ in range(3):
        assert msgspec.msgpack.decode(cache.msgpack("T00000")) == msgspec.to_builtins(
            table.routes["T00000"])
        assert cache.json("T00000", True) == encode_topic_route(table.routes["T00000"], True)
    assert len(made) == 1 and len(cache) == 2  # the standard form was never asked for
    assert cache.json("T00000", False) == encode_topic_route(table.routes["T00000"], False)
    assert len(cache) == 3 and table.lookups == ["T00000", "T00000", "T00000"]
    table.routes["T00000"] = route_of("T00000", perm=4)
    cache.forget("T00000")
    assert len(cache) == 0 and cache.msgpack_bytes == cache.json_bytes == 0
    assert b'"perm":4' in cache.json("T00000", False)
    assert msgspec.msgpack.decode(cache.msgpack("T00000"))["queues"][0]["perm"] == 4
    assert len(made) == 2
    assert cache.msgpack("nope") is None and cache.json("nope", True) is None
    assert len(cache) == 2  # nothing kept for a topic with no route


def test_the_msgpack_form_is_counted_and_a_held_route_needs_no_lookup():
    table = Table(1)
    cache, _ = new_cache(table)
    raw = cache.msgpack("T00000", table.routes["T00000"])
    assert table.lookups == []
    assert cache.msgpack_bytes == len(raw) + ENTRY_OVERHEAD_BYTES


def test_the_json_forms_never_hold_more_than_their_bound_and_answer_the_same():
    # Issue 21 item 10: one read of every topic kept both JSON forms of every route.
    table = Table(500)
    one = len(encode_topic_route(table.routes["T00000"], True)) + ENTRY_OVERHEAD_BYTES
    bound = 40 * one
    cache, _ = new_cache(table, max_json_bytes=bound)
    for topic, route in table.routes.items():
        for legacy in (True, False):
            assert cache.json(topic, legacy) == encode_topic_route(route, legacy)
            assert cache.json_bytes <= bound
    assert cache.json_bytes > bound - 2 * one  # it is used, not emptied
    assert len(cache) < 45
    # The newest are kept: reading the last topic again makes nothing.
    table.lookups.clear()
    cache.json("T00499", True)
    cache.json("T00499", False)
    assert table.lookups == []


def test_a_route_larger_than_the_whole_bound_is_served_and_not_kept():
    table = Table(1)
    cache, _ = new_cache(table, max_json_bytes=10)
    assert cache.json("T00000", True) == encode_topic_route(table.routes["T00000"], True)
    assert cache.json_bytes == 0 and len(cache) == 0


def test_order_conf_is_in_the_json_forms_only_when_asked_and_a_change_of_rule_drops_them():
    table = Table(0)
    table.routes["O"] = route_of("O", order_conf="broker-a:4")
    cache, _ = new_cache(table)
    assert b"orderTopicConf" not in cache.json("O", True)
    assert msgspec.msgpack.decode(cache.msgpack("O"))["order_conf"] == "broker-a:4"
    cache.json_order_conf = True
    assert cache.json_bytes == 0
    assert b'"orderTopicConf":"broker-a:4"' in cache.json("O", True)
    assert cache.msgpack_bytes > 0  # the ZNS/1 form does not depend on the rule

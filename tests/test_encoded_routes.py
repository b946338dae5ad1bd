"""The one cache of route encodings (zns.core.encoded_routes): lazy, once per change, JSON bounded."""

from __future__ import annotations

import msgspec
import pytest

from zns.core.encoded_routes import ENTRY_OVERHEAD_BYTES, EncodedRoutes
from zns.core.remoting.bodies import JavaRouteJson, encode_topic_route
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

    return EncodedRoutes(table.route, msgpack, max_json_bytes, JavaRouteJson()), made


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
    cache.json_encoder = JavaRouteJson(order_conf=True)
    assert cache.json_bytes == 0
    assert b'"orderTopicConf":"broker-a:4"' in cache.json("O", True)
    assert cache.msgpack_bytes > 0  # the ZNS/1 form does not depend on the rule


# --- found by mutation testing (tools/mutate.py) ---------------------------------------------


def two_broker_route(topic: str = "T", servers: dict[str, list[str]] | None = None) -> TopicRoute:
    """broker-a and broker-b, in ZNS/1's sorted order (Java's HashMap puts broker-b first)."""
    return TopicRoute(
        topic=topic,
        queues=[QueueData("broker-a", 4, 4, 6, 0), QueueData("broker-b", 4, 4, 6, 0)],
        brokers=[BrokerData(cluster="c1", broker_name="broker-a", addrs={0: "10.0.0.1:10911"}),
                 BrokerData(cluster="c1", broker_name="broker-b", addrs={0: "10.0.0.2:10911"})],
        filter_servers=servers or {}, order_conf="")


def test_two_queues_take_the_java_order_and_without_insertion_order_their_own():
    route = two_broker_route()
    in_java = EncodedRoutes(lambda t: route, encode,
                            json_encoder=JavaRouteJson(lambda t: ["broker-a", "broker-b"]))
    body = in_java.json("T", False)
    assert body.index(b'"brokerName":"broker-b"') < body.index(b'"brokerName":"broker-a"')
    own = EncodedRoutes(lambda t: route, encode, json_encoder=JavaRouteJson())  # no order known
    assert own.json("T", False) == encode_topic_route(route, False)


def test_the_filter_servers_are_sorted_and_rehashed_only_for_a_reparsed_reply():
    # The HashMap order of the sorted addresses is .1 before .2; the route lists .2 first, and
    # the legacy form writes the map in its order (the standard form sorts it).
    servers = {"10.0.0.2:10911": ["10.0.0.2:30000"], "10.0.0.1:10911": ["10.0.0.1:30000"]}
    route = two_broker_route(servers=servers)
    java = JavaRouteJson()
    cache = EncodedRoutes(lambda t: route, encode, json_encoder=java)
    plain = cache.json("T", True)
    assert plain.index(b'"10.0.0.2:30000"') < plain.index(b'"10.0.0.1:30000"')
    assert java(route, True) == plain
    reparsed = java(route, True, reparsed_sorted=True)
    assert reparsed.index(b'"10.0.0.1:30000"') < reparsed.index(b'"10.0.0.2:30000"')


def test_the_bytes_held_add_up_and_a_route_of_exactly_the_bound_is_kept():
    table = Table(2)
    cache, _ = new_cache(table)
    sizes = [len(cache.msgpack(topic)) + ENTRY_OVERHEAD_BYTES for topic in ("T00000", "T00001")]
    assert cache.msgpack_bytes == sum(sizes)
    cost = len(encode_topic_route(table.routes["T00000"], True)) + ENTRY_OVERHEAD_BYTES
    exact, _ = new_cache(table, max_json_bytes=2 * cost)
    exact.json("T00000", True)
    exact.json("T00001", True)  # the two together fill the bound exactly: both kept
    assert len(exact) == 2 and exact.json_bytes == 2 * cost
    one, _ = new_cache(table, max_json_bytes=cost)
    one.json("T00000", True)
    assert len(one) == 1 and one.json_bytes == cost


def test_with_as_many_of_each_form_the_legacy_one_goes_first():
    table = Table(2)
    cost = len(encode_topic_route(table.routes["T00000"], True)) + ENTRY_OVERHEAD_BYTES
    cache, _ = new_cache(table, max_json_bytes=3 * cost)
    legacy = cache.json("T00000", True)
    cache.json("T00000", False)
    assert len(cache) == 2
    cache.json("T00001", False)  # no room for a third: one of each held, the legacy one goes
    lookups = len(table.lookups)
    assert cache.json("T00000", False) and len(table.lookups) == lookups  # still held
    assert cache.json("T00000", True) == legacy and len(table.lookups) == lookups + 1  # made again


def test_the_order_conf_rule_starts_off_and_a_cache_has_no_json_form_until_given_an_encoder():
    assert JavaRouteJson().order_conf is False
    table = Table(1)
    bare = EncodedRoutes(table.route, encode)  # the core knows no JSON form of its own
    with pytest.raises(RuntimeError, match="no JSON encoder"):
        bare.json("T00000", True)
    cache, _ = new_cache(table)
    cache.json("T00000", True)
    assert len(cache) == 1 and cache.json_bytes > 0
    cache.json_encoder = JavaRouteJson()  # another encoder: what the old one made goes
    assert len(cache) == 0 and cache.json_bytes == 0

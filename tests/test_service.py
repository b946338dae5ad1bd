"""`NameService.respond` as bytes in, bytes out: the §2 envelope, every §3 bound, §5–§7 replies.

No sockets: a reply is decoded as a raw MessagePack map, so a missing field
(a default the encoder left out) is caught, not filled in by a decoder.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import helpers

from zns.drivers.kv_file import KvStore
from zns.core.schema import (
    ORDER_TOPIC_CONFIG,
    REPLY_TYPES,
    decode_request,
    encode,
)
from zns.core.service import NameService

EPOCH = "0123456789abcdef"
MASTER = "10.0.0.1:10911"
OTHER = "10.0.0.2:10911"
REQUEST_ID = 42


@pytest.fixture
def svc() -> NameService:
    service = NameService(KvStore(None), epoch=EPOCH, started_at_ms=0, pub_endpoint="tcp://x:1",
                          version="1.2.3")
    call(service, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={"TopicA": {}})
    call(service, "kv_put", namespace="ns", key="k", value="v")
    return service


def respond(service: NameService, body: bytes, now: int = 0) -> tuple[dict[str, Any], list]:
    response = service.respond(body, now)
    reply = msgspec.msgpack.decode(response.reply)
    assert isinstance(reply, dict)
    # The id the server would put in a `busy` sent instead of this reply.
    assert response.request_id == reply.get("id", 0)
    return reply, [(ch, msgspec.msgpack.decode(b)) for ch, b in response.events]


def call(service: NameService, op: str, now: int = 0, **fields: Any) -> dict[str, Any]:
    return call_events(service, op, now, **fields)[0]


def call_events(service: NameService, op: str, now: int = 0, **fields: Any):
    reply, events = respond(service, encode({"op": op, "id": REQUEST_ID, **fields}), now)
    if "id" not in fields:  # every reply, answer or refusal, carries its request's id
        assert reply["id"] == REQUEST_ID
    return reply, events


def over_remoting(service: NameService, request_map: dict[str, Any], connection: int,
                  now: int = 0) -> Any:
    """A request executed as the remoting listener executes it, over `connection`."""
    request = decode_request(encode({**request_map, "id": REQUEST_ID}))
    return service.execute(request, now, connection)[0]


def send(service: NameService, request_map: dict[str, Any], now: int = 0) -> dict[str, Any]:
    """A request given as one map, `op` included."""
    reply = respond(service, encode({**request_map, "id": REQUEST_ID}), now)[0]
    assert reply["id"] == REQUEST_ID
    return reply


def observable(service: NameService) -> bytes:
    """Everything a request could have changed (helpers.observable), with the longest namespace."""
    return helpers.observable(service, ("ns", "n" * 255))


def reply_keys(op: str) -> set[str]:
    return {"op", *(f.name for f in msgspec.structs.fields(REPLY_TYPES[op]))}


# --- §2 the envelope ------------------------------------------------------------------


@pytest.mark.parametrize("request_id", [0, 1, 2**32, 2**64 - 1])
def test_reply_echoes_id_and_op(svc, request_id):
    reply, _ = respond(svc, encode({"op": "status", "id": request_id}))
    assert (reply["op"], reply["id"]) == ("status", request_id)


def test_id_defaults_to_zero(svc):
    reply, _ = respond(svc, encode({"op": "get_topics"}))
    assert (reply["op"], reply["id"]) == ("get_topics", 0)


@pytest.mark.parametrize("body", [
    b"\xc1",  # never-used MessagePack byte
    b"\x92\x01",  # truncated array
    b"",
    encode({"op": "status", "id": 7}) + b"\x00",  # trailing bytes
], ids=["malformed", "truncated", "empty", "trailing"])
def test_unreadable_body_is_bad_request_with_id_zero(svc, body):
    reply, events = respond(svc, body)
    assert (reply["op"], reply["code"], reply["id"]) == ("error", "bad_request", 0)
    assert reply["message"] and events == []


@pytest.mark.parametrize("value", [[1, 2], 5, "status", None], ids=["array", "int", "str", "nil"])
def test_not_a_map_is_bad_request(svc, value):
    reply, _ = respond(svc, encode(value))
    assert (reply["op"], reply["code"], reply["id"]) == ("error", "bad_request", 0)
    assert "object" in reply["message"]


def test_missing_op_is_bad_request_with_the_id(svc):
    reply, _ = respond(svc, encode({"id": 7, "topic": "TopicA"}))
    assert (reply["code"], reply["id"]) == ("bad_request", 7)
    assert "`op`" in reply["message"]


@pytest.mark.parametrize("op", [5, None, ["status"], b"status"])
def test_op_not_a_string_is_bad_request(svc, op):
    reply, _ = respond(svc, encode({"op": op, "id": 7}))
    assert (reply["code"], reply["id"]) == ("bad_request", 7)
    assert "$.op" in reply["message"]


@pytest.mark.parametrize("request_id", [-1, -(2**63), "7", True, 1.5, None])
def test_unreadable_id_is_answered_with_id_zero(svc, request_id):
    reply, _ = respond(svc, encode({"op": "status", "id": request_id}))
    assert (reply["code"], reply["id"]) == ("bad_request", 0)
    assert "$.id" in reply["message"]


@pytest.mark.parametrize("op", ["bogus", "error", "update_namesrv_config", "route", ""])
def test_unknown_op(svc, op):
    reply, _ = respond(svc, encode({"op": op, "id": 9, "topic": "TopicA"}))
    assert (reply["op"], reply["code"], reply["id"]) == ("error", "unknown_op", 9)
    assert repr(op) in reply["message"]


def test_a_response_names_its_op_as_the_error_counts_do(svc):
    """The request timer labels a request by `Response.op` (it does not decode the body again):
    the op of a request answered or refused, and of one whose fields are out of bounds;
    "unknown" for an op no one knows or a body with none."""
    ops = [svc.respond(encode(request), 0).op for request in (
        {"op": "status", "id": 1},
        {"op": "kv_get", "id": 2, "namespace": "ns", "key": "absent"},  # not_found
        {"op": "get_route", "id": 3, "topic": "bad topic!"},  # bad_request, a known op
        {"op": "no_such_op", "id": 4},
        {"id": 5},
    )]
    assert ops == ["status", "kv_get", "get_route", "unknown", "unknown"]
    assert svc.respond(b"\xc1", 0).op == "unknown"  # not MessagePack


def test_unknown_fields_are_ignored(svc):
    reply = call(svc, "get_route", topic="TopicA", future_field={"x": 1})
    assert reply["op"] == "get_route"


def test_error_reply_carries_exactly_its_fields(svc):
    reply = call(svc, "kv_get", namespace="ns", key="missing")
    assert set(reply) == {"op", "id", "code", "message"}
    assert reply["code"] == "not_found"


# --- §3 every bound: a bad field is bad_request naming its path, and nothing is applied ----

REGISTER = dict(op="register_broker", cluster="c2", broker_name="broker-b", broker_id=0,
                broker_addr=OTHER, topics={"TopicB": {}})
HEARTBEAT = dict(op="heartbeat", cluster="c1", broker_name="broker-a", broker_id=0,
                 broker_addr=MASTER)
QUEUE = dict(broker_name="broker-a", read_queues=4, write_queues=4, perm=6, sys_flag=0)
REGISTER_TOPIC = dict(op="register_topic", topic="TopicR", queues=[QUEUE])
KV_PUT = dict(op="kv_put", namespace="ns", key="k2", value="x")
LONG_HOST = "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "."  # DNS labels are at most 63


def case(base: dict, path: str | None, id: str, **override: Any):
    """`path` None: the value is within bounds and must be accepted."""
    return pytest.param({**base, **override}, path, id=id)


def topic_cfg(**cfg: Any) -> dict:
    return {"TopicB": cfg}


BOUNDS = [
    # topic: 1-127 of [A-Za-z0-9_%|-]
    case(REGISTER, None, "topic-127", topics={"T" * 127: {}}),
    case(REGISTER, None, "topic-all-chars", topics={"Az09_%|-": {}}),
    case(REGISTER, "`key` in `$.topics`", "topic-128", topics={"T" * 128: {}}),
    case(REGISTER, "`key` in `$.topics`", "topic-empty", topics={"": {}}),
    case(REGISTER, "`key` in `$.topics`", "topic-dot", topics={"a.b": {}}),
    case(REGISTER_TOPIC, None, "register-topic-127", topic="R" * 127),
    case(REGISTER_TOPIC, "`$.topic`", "register-topic-128", topic="R" * 128),
    case(REGISTER_TOPIC, "`$.topic`", "register-topic-slash", topic="a/b"),
    case(dict(op="delete_topic", topic="TopicA"), "`$.topic`", "delete-topic-space",
         topic="Topic A"),
    case(dict(op="get_route", topic="TopicA"), "`$.topic`", "get-route-128", topic="A" * 128),
    case(dict(op="get_routes", topics=["TopicA"]), "`$.topics[1]`", "get-routes-item",
         topics=["TopicA", "bad topic"]),
    # cluster, broker_name, KV namespace and key: 1-255, no control characters, no '/'
    case(REGISTER, None, "cluster-255", cluster="c" * 255),
    case(REGISTER, "`$.cluster`", "cluster-256", cluster="c" * 256),
    case(REGISTER, "`$.cluster`", "cluster-empty", cluster=""),
    case(REGISTER, None, "name-unicode-space", broker_name="brøker b"),
    case(REGISTER, None, "name-255", broker_name="b" * 255),
    case(REGISTER, "`$.broker_name`", "name-256", broker_name="b" * 256),
    case(REGISTER, "`$.broker_name`", "name-slash", broker_name="broker/b"),
    case(REGISTER, "`$.broker_name`", "name-nul", broker_name="broker\x00b"),
    case(REGISTER, "`$.broker_name`", "name-newline", broker_name="broker\nb"),
    case(REGISTER, "`$.broker_name`", "name-del", broker_name="broker\x7fb"),
    case(REGISTER, "`$.broker_name`", "name-c1-control", broker_name="broker\x85b"),
    case(KV_PUT, None, "namespace-255", namespace="n" * 255),
    case(KV_PUT, "`$.namespace`", "namespace-256", namespace="n" * 256),
    case(KV_PUT, "`$.namespace`", "namespace-slash", namespace="a/b"),
    case(KV_PUT, "`$.key`", "key-control", key="k\tk"),
    case(KV_PUT, "`$.key`", "key-empty", key=""),
    case(dict(op="get_topics"), "`$.cluster`", "get-topics-cluster-slash", cluster="c/1"),
    # zone: 0-255, no control characters ('/' allowed)
    case(REGISTER, None, "zone-255-with-slash", zone="z/" + "z" * 253),
    case(REGISTER, "`$.zone`", "zone-256", zone="z" * 256),
    case(REGISTER, "`$.zone`", "zone-control", zone="zone\r"),
    case(dict(op="get_route", topic="TopicA"), "`$.zone`", "get-route-zone-256", zone="z" * 256),
    # broker addresses: host:port, DNS / IPv4 / [IPv6], port 1-65535, at most 255 characters
    case(REGISTER, None, "addr-dns", broker_addr="broker-b.example.com:10911"),
    case(REGISTER, None, "addr-port-1", broker_addr="10.0.0.2:1"),
    case(REGISTER, None, "addr-port-65535", broker_addr="10.0.0.2:65535"),
    case(REGISTER, None, "addr-ipv6", broker_addr="[2001:db8::1]:10911"),
    case(REGISTER, None, "addr-ipv6-loopback", broker_addr="[::1]:10911"),
    case(REGISTER, None, "addr-255", broker_addr=LONG_HOST + "d" * 57 + ":10911"),
    case(REGISTER, "`$.broker_addr`", "addr-256", broker_addr=LONG_HOST + "d" * 58 + ":10911"),
    case(REGISTER, "`$.broker_addr`", "addr-port-0", broker_addr="10.0.0.2:0"),
    case(REGISTER, "`$.broker_addr`", "addr-port-65536", broker_addr="10.0.0.2:65536"),
    case(REGISTER, "`$.broker_addr`", "addr-no-port", broker_addr="10.0.0.2"),
    case(REGISTER, "`$.broker_addr`", "addr-no-host", broker_addr=":10911"),
    case(REGISTER, "`$.broker_addr`", "addr-bare-ipv6", broker_addr="::1:10911"),
    case(REGISTER, "`$.broker_addr`", "addr-port-text", broker_addr="host:http"),
    case(REGISTER, "`$.broker_addr`", "addr-url", broker_addr="tcp://10.0.0.2:10911"),
    case(REGISTER, None, "ha-addr-empty", ha_addr=""),
    case(REGISTER, None, "ha-addr-ipv6", ha_addr="[fe80::1]:10912"),
    case(REGISTER, "`$.ha_addr`", "ha-addr-port-0", ha_addr="10.0.0.2:0"),
    case(REGISTER, "`$.filter_servers[1]`", "filter-server-65536",
         filter_servers=["10.0.0.7:1", "10.0.0.7:65536"]),
    case(HEARTBEAT, "`$.broker_addr`", "heartbeat-addr", broker_addr="nohost"),
    # broker_id: 0 - 2^31-1
    case(REGISTER, None, "broker-id-max", broker_id=2**31 - 1),
    case(REGISTER, "`$.broker_id`", "broker-id-negative", broker_id=-1),
    case(REGISTER, "`$.broker_id`", "broker-id-2^31", broker_id=2**31),
    case(REGISTER, "`$.broker_id`", "broker-id-str", broker_id="0"),
    case(dict(op="unregister_broker", cluster="c1", broker_name="broker-a", broker_id=0,
              broker_addr=MASTER), "`$.broker_id`", "unregister-broker-id", broker_id=2**31),
    # queue counts 0-65535, perm 0-15, sys_flag 0 - 2^31-1
    case(REGISTER, None, "queues-0", topics=topic_cfg(read_queues=0, write_queues=0)),
    case(REGISTER, None, "queues-65535", topics=topic_cfg(read_queues=65535, write_queues=65535)),
    case(REGISTER, "`$.topics[...].read_queues`", "read-queues-65536",
         topics=topic_cfg(read_queues=65536)),
    case(REGISTER, "`$.topics[...].write_queues`", "write-queues-negative",
         topics=topic_cfg(write_queues=-1)),
    case(REGISTER_TOPIC, "`$.queues[0].read_queues`", "register-topic-queues-65536",
         queues=[{**QUEUE, "read_queues": 65536}]),
    case(REGISTER, None, "perm-15", topics=topic_cfg(perm=15)),
    case(REGISTER, "`$.topics[...].perm`", "perm-16", topics=topic_cfg(perm=16)),
    case(REGISTER, "`$.topics[...].perm`", "perm-negative", topics=topic_cfg(perm=-1)),
    case(REGISTER_TOPIC, "`$.queues[0].perm`", "register-topic-perm-16",
         queues=[{**QUEUE, "perm": 16}]),
    case(REGISTER, None, "sys-flag-max", topics=topic_cfg(sys_flag=2**31 - 1)),
    case(REGISTER, "`$.topics[...].sys_flag`", "sys-flag-2^31", topics=topic_cfg(sys_flag=2**31)),
    case(dict(op="get_topics"), "`$.sys_flag`", "get-topics-sys-flag-negative", sys_flag=-1),
    case(REGISTER_TOPIC, "`$.queues[0].broker_name`", "register-topic-queue-name",
         queues=[{**QUEUE, "broker_name": "a/b"}]),
    case(REGISTER_TOPIC, "`broker_name`", "register-topic-queue-missing-field",
         queues=[{k: v for k, v in QUEUE.items() if k != "broker_name"}]),
    # heartbeat_timeout_ms: 1000-3600000
    case(REGISTER, "`$.heartbeat_timeout_ms`", "timeout-999", heartbeat_timeout_ms=999),
    case(REGISTER, None, "timeout-1000", heartbeat_timeout_ms=1000),
    case(REGISTER, None, "timeout-3600000", heartbeat_timeout_ms=3_600_000),
    case(REGISTER, "`$.heartbeat_timeout_ms`", "timeout-3600001", heartbeat_timeout_ms=3_600_001),
    # KV value: at most 65,536 UTF-8 bytes
    case(KV_PUT, None, "value-65536-ascii", value="a" * 65_536),
    case(KV_PUT, "`$.value`", "value-65537-ascii", value="a" * 65_537),
    case(KV_PUT, None, "value-65536-bytes-2-byte-chars", value="é" * 32_768),
    case(KV_PUT, "`$.value`", "value-65537-bytes-2-byte-chars", value="é" * 32_768 + "a"),
    case(KV_PUT, None, "value-65536-bytes-3-byte-chars", value="€" * 21_845 + "a"),
    case(KV_PUT, "`$.value`", "value-65538-bytes-3-byte-chars", value="€" * 21_846),
    case(KV_PUT, None, "value-65536-bytes-4-byte-chars", value="😀" * 16_384),
    case(KV_PUT, "`$.value`", "value-65537-bytes-4-byte-chars", value="😀" * 16_384 + "a"),
    case(KV_PUT, "`$.value`", "value-not-str", value=5),
    # types and required fields
    case(REGISTER, "`$.topics`", "topics-as-list", topics=["TopicB"]),
    case(REGISTER, "`$.incremental`", "incremental-str", incremental="yes"),
    case(REGISTER, "`$.data_version.state`", "data-version-state-str",
         data_version={"state": "x"}),
    case(HEARTBEAT, "`$.data_version`", "heartbeat-data-version-list", data_version=[1, 2, 3]),
    case({k: v for k, v in REGISTER.items() if k != "broker_addr"}, "`broker_addr`",
         "missing-broker-addr"),
    case(dict(op="kv_get", namespace="ns"), "`key`", "kv-get-missing-key"),
]


@pytest.mark.parametrize("request_map, path", BOUNDS)
def test_bounds_of_section_3(svc, request_map, path):
    before = observable(svc)
    reply, events = respond(svc, encode({**request_map, "id": REQUEST_ID}), now=1)
    assert reply["id"] == REQUEST_ID
    if path is None:
        assert reply["op"] == request_map["op"], reply
        return
    assert (reply["op"], reply["code"]) == ("error", "bad_request"), reply
    assert path in reply["message"], reply["message"]
    assert events == []
    assert observable(svc) == before


def test_bound_messages_explain_the_rule(svc):
    reply = send(svc, {**REGISTER, "broker_addr": "h:0"})
    assert "port 1-65535" in reply["message"]
    reply = call(svc, "get_route", topic="a b")
    assert "[A-Za-z0-9_%|-]" in reply["message"]


# --- §4 broker ops through the service ------------------------------------------------


def test_register_reply_and_events(svc):
    reply, events = call_events(svc, "register_broker", cluster="c1", broker_name="broker-a",
                                broker_id=1, broker_addr=OTHER, ha_addr="10.0.0.2:10912")
    assert reply == {"op": "register_broker", "id": REQUEST_ID, "master_addr": MASTER,
                     "ha_addr": ""}
    channels = [ch for ch, _ in events]
    assert channels == [b"broker/c1/broker-a\0", b"route/TopicA\0"]
    broker, route = (body for _, body in events)
    assert broker == {"op": "broker", "epoch": EPOCH, "revision": 2, "cluster": "c1",
                      "broker_name": "broker-a", "broker_id": 1, "broker_addr": OTHER,
                      "change": "registered", "reason": ""}
    assert (route["op"], route["revision"], route["prev"], route["topic"]) == (
        "route", 2, 1, "TopicA")
    assert set(route) == {"op", "epoch", "revision", "prev", "topic", "route"}


def test_conflict_reply_changes_nothing(svc):
    call(svc, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={"TopicA": {}}, data_version={"state": 3})
    before = observable(svc)
    reply, events = call_events(svc, "register_broker", cluster="c1", broker_name="broker-a",
                                broker_id=0, broker_addr=OTHER, data_version={"state": 2})
    assert (reply["op"], reply["code"], reply["id"]) == ("error", "conflict", REQUEST_ID)
    assert events == [] and observable(svc) == before


def test_heartbeat_reply(svc):
    reply, events = respond(svc, encode({**HEARTBEAT, "id": REQUEST_ID}))
    assert reply == {"op": "heartbeat", "id": REQUEST_ID, "known": True, "changed": False}
    assert events == []
    reply = send(svc, {**HEARTBEAT, "broker_name": "other"})
    assert (reply["known"], reply["changed"]) == (False, True)


def test_unregister_reply_and_removal_event(svc):
    reply, events = call_events(svc, "unregister_broker", cluster="c1", broker_name="broker-a",
                                broker_id=0, broker_addr=MASTER)
    assert reply == {"op": "unregister_broker", "id": REQUEST_ID, "removed": True}
    bodies = {ch: body for ch, body in events}
    assert bodies[b"broker/c1/broker-a\0"]["reason"] == "unregistered"
    assert bodies[b"route/TopicA\0"]["route"] is None  # nil, and the key is present
    again = call(svc, "unregister_broker", cluster="c1", broker_name="broker-a", broker_id=0,
                 broker_addr=MASTER)
    assert again["removed"] is False


# --- §5 client ops --------------------------------------------------------------------


def test_get_route_reply_carries_every_field(svc):
    reply = call(svc, "get_route", topic="TopicA")
    assert set(reply) == reply_keys("get_route")
    assert (reply["revision"], reply["epoch"]) == (1, EPOCH)
    route = reply["route"]
    assert set(route) == {"topic", "queues", "brokers", "filter_servers", "order_conf"}
    assert route["order_conf"] == "" and route["filter_servers"] == {}
    assert route["queues"] == [{"broker_name": "broker-a", "read_queues": 16, "write_queues": 16,
                                "perm": 6, "sys_flag": 0}]
    assert route["brokers"] == [{"cluster": "c1", "broker_name": "broker-a", "addrs": {0: MASTER},
                                 "zone": ""}]


def test_get_route_equals_the_published_route(svc):
    _, events = call_events(svc, "register_broker", cluster="c1", broker_name="broker-b",
                            broker_id=0, broker_addr=OTHER, topics={"TopicA": {}})
    published = next(body for ch, body in events if ch == b"route/TopicA\0")
    reply = call(svc, "get_route", topic="TopicA")
    assert reply["route"] == published["route"]
    assert reply["revision"] == published["revision"]


def test_get_route_not_found_carries_revision(svc):
    reply = call(svc, "get_route", topic="NeverSeen")
    assert (reply["op"], reply["code"], reply["id"], reply["revision"]) == (
        "error", "not_found", REQUEST_ID, 0)
    _, events = call_events(svc, "delete_topic", topic="TopicA")
    removed_at = events[0][1]["revision"]
    reply = call(svc, "get_route", topic="TopicA")
    assert (reply["code"], reply["revision"]) == ("not_found", removed_at)
    assert set(reply) == {"op", "id", "code", "message", "revision"}


def test_zone_filter_follows_the_not_found_check(svc):
    call(svc, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={"TopicA": {}}, zone="Zone-1")
    reply = call(svc, "get_route", topic="TopicA", zone="zone-1")
    assert [b["broker_name"] for b in reply["route"]["brokers"]] == ["broker-a"]
    reply = call(svc, "get_route", topic="TopicA", zone="elsewhere")
    assert reply["op"] == "get_route"  # not not_found: the route exists, the zone is empty
    route = reply["route"]
    assert (route["queues"], route["brokers"], route["filter_servers"]) == ([], [], {})
    assert call(svc, "get_route", topic="Missing", zone="zone-1")["code"] == "not_found"


def test_get_routes(svc):
    call(svc, "delete_topic", topic="TopicA")
    removed_at = call(svc, "status")["revision"]
    call(svc, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={"TopicB": {}}, data_version={"counter": 1})
    reply = call(svc, "get_routes", topics=["TopicB", "TopicA", "Never"])
    assert set(reply) == reply_keys("get_routes")
    assert set(reply["routes"]) == {"TopicB"}
    assert reply["routes"]["TopicB"] == call(svc, "get_route", topic="TopicB")["route"]
    assert reply["revisions"] == {"TopicB": removed_at + 1, "TopicA": removed_at, "Never": 0}
    assert reply["missing"] == ["TopicA", "Never"]
    assert reply["epoch"] == EPOCH
    empty = call(svc, "get_routes", topics=[])
    assert (empty["routes"], empty["revisions"], empty["missing"]) == ({}, {}, [])


def test_get_cluster_info(svc):
    call(svc, "register_broker", now=2_000, cluster="c0", broker_name="broker-b", broker_id=0,
         broker_addr=OTHER, heartbeat_timeout_ms=5_000, data_version={"state": 1, "counter": 2})
    reply = call(svc, "get_cluster_info", now=3_500)
    assert set(reply) == reply_keys("get_cluster_info")
    assert reply["clusters"] == {"c0": ["broker-b"], "c1": ["broker-a"]}
    assert reply["brokers"]["broker-b"] == {"cluster": "c0", "broker_name": "broker-b",
                                            "addrs": {0: OTHER}, "zone": ""}
    assert reply["live"] == [
        {"cluster": "c0", "broker_addr": OTHER, "broker_name": "broker-b", "broker_id": 0,
         "last_heartbeat_ms": 1_500, "timeout_ms": 5_000,
         "data_version": {"state": 1, "timestamp": 0, "counter": 2}},
        {"cluster": "c1", "broker_addr": MASTER, "broker_name": "broker-a", "broker_id": 0,
         "last_heartbeat_ms": 3_500, "timeout_ms": 120_000,
         "data_version": {"state": 0, "timestamp": 0, "counter": 0}},
    ]


def test_get_topics(svc):
    call(svc, "register_broker", cluster="c2", broker_name="broker-b", broker_id=0,
         broker_addr=OTHER, topics={"Sys": {"sys_flag": 1}, "TopicA": {}})
    assert call(svc, "get_topics")["topics"] == ["Sys", "TopicA"]
    assert call(svc, "get_topics", cluster="c2")["topics"] == ["Sys", "TopicA"]
    assert call(svc, "get_topics", cluster="c1")["topics"] == ["TopicA"]
    assert call(svc, "get_topics", sys_flag=1)["topics"] == ["Sys"]
    assert call(svc, "get_topics", cluster="c1", sys_flag=1)["topics"] == []
    assert set(call(svc, "get_topics", cluster="none")) == reply_keys("get_topics")


def test_snapshot_is_one_cut(svc):
    call(svc, "register_broker", cluster="c2", broker_name="broker-b", broker_id=0,
         broker_addr=OTHER, topics={"TopicB": {}, "TopicA": {}})
    reply = call(svc, "snapshot")
    assert set(reply) == reply_keys("snapshot")
    assert (reply["epoch"], reply["revision"]) == (EPOCH, 2)
    assert list(reply["routes"]) == ["TopicA", "TopicB"]
    for topic, route in reply["routes"].items():
        assert route == call(svc, "get_route", topic=topic)["route"]
    info = call(svc, "get_cluster_info")
    assert (reply["brokers"], reply["clusters"]) == (info["brokers"], info["clusters"])


def _reply_cap_service(topics: int) -> tuple[NameService, int]:
    """A service holding `topics` one-broker routes whose route bytes add up to exactly
    the cap it is given (so one route more, or a cap one byte less, would exceed it)."""
    service = NameService(KvStore(None), epoch=EPOCH, started_at_ms=0)
    call(service, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={f"T{i:03d}": {} for i in range(topics)})
    routes = call(service, "get_routes", topics=[f"T{i:03d}" for i in range(topics)])["routes"]
    return service, sum(len(encode(route)) for route in routes.values())


def test_get_routes_larger_than_any_reply_may_be_is_busy_before_it_is_built():
    service, size = _reply_cap_service(20)
    topics = [f"T{i:03d}" for i in range(20)]
    service.max_reply_bytes = size
    assert len(call(service, "get_routes", topics=topics)["routes"]) == 20
    service.max_reply_bytes = size - 1
    reply = call(service, "get_routes", topics=topics)
    assert (reply["op"], reply["code"]) == ("error", "busy")
    assert reply["message"] == (f"the routes asked for are larger than {size - 1:,} bytes, "
                                "the most one reply may hold; ask for fewer topics at a time")
    assert len(call(service, "get_routes", topics=topics[:19])["routes"]) == 19


def test_a_snapshot_larger_than_any_reply_may_be_is_busy_and_builds_no_map():
    service, size = _reply_cap_service(20)
    # The route map counted with MessagePack's longest headers: 5 for the map, 3 a key.
    counted = size + 5 + sum(len(f"T{i:03d}") + 3 for i in range(20))
    service.max_reply_bytes = counted
    assert list(call(service, "snapshot")["routes"]) == [f"T{i:03d}" for i in range(20)]
    call(service, "register_broker", cluster="c1", broker_name="broker-b", broker_id=0,
         broker_addr=OTHER, topics={})  # a new revision: the next snapshot builds anew
    service.max_reply_bytes = counted - 1
    reply = call(service, "snapshot")
    assert (reply["op"], reply["code"]) == ("error", "busy")
    assert reply["message"] == (
        f"the snapshot is larger than {counted - 1:,} bytes, the most one reply may hold; "
        "read the routes with get_routes, a part of the topics at a time")
    # Every route here counts the same: with room for 10, the 11th is the last one read.
    per_route = (counted - 5) // 20
    service.max_reply_bytes = 5 + 10 * per_route
    asked: list[str] = []

    class ReadsCounted:
        def __init__(self, encoded):
            self.encoded = encoded

        def msgpack(self, topic, route=None):
            asked.append(topic)
            return self.encoded.msgpack(topic, route)

    service.encoded = ReadsCounted(service.encoded)
    assert call(service, "snapshot")["code"] == "busy"
    assert asked == [f"T{i:03d}" for i in range(11)]
    # Without a cap (a NameService on its own), any size is answered.
    service.max_reply_bytes = None
    assert len(call(service, "snapshot")["routes"]) == 20


def test_status(svc):
    svc.started_at_ms = 1_000
    reply = call(svc, "status", now=6_000)
    # `worker` and `workers` are answered only by a worker process (zns serve --workers N),
    # `follows` and `silent_ms` only by a follower (zns serve --follow).
    assert set(reply) == reply_keys("status") - {"worker", "workers", "follows", "silent_ms"}
    assert reply["epoch"] == EPOCH
    assert (reply["revision"], reply["brokers"], reply["topics"]) == (1, 1, 1)
    assert (reply["uptime_ms"], reply["pub_endpoint"]) == (5_000, "tcp://x:1")
    assert isinstance(reply["version"], str) and reply["version"]


# --- §6 admin ops ---------------------------------------------------------------------


def test_write_perm_replies(svc):
    reply, events = call_events(svc, "wipe_write_perm", broker_name="broker-a")
    assert reply == {"op": "wipe_write_perm", "id": REQUEST_ID, "changed": 1}
    assert events[0][1]["route"]["queues"][0]["perm"] == 4
    assert call(svc, "wipe_write_perm", broker_name="broker-a")["changed"] == 0
    assert call(svc, "add_write_perm", broker_name="broker-a") == {
        "op": "add_write_perm", "id": REQUEST_ID, "changed": 1}
    assert call(svc, "add_write_perm", broker_name="unknown")["changed"] == 0


def test_delete_topic_reply(svc):
    assert call(svc, "delete_topic", topic="TopicA", cluster="other") == {
        "op": "delete_topic", "id": REQUEST_ID, "removed": False}
    assert call(svc, "delete_topic", topic="TopicA")["removed"] is True
    assert call(svc, "get_route", topic="TopicA")["code"] == "not_found"


def test_register_topic_unknown_broker_applies_nothing(svc):
    before = observable(svc)
    reply, events = call_events(svc, "register_topic", topic="TopicR",
                                queues=[QUEUE, {**QUEUE, "broker_name": "ghost"}])
    assert (reply["code"], reply["id"]) == ("bad_request", REQUEST_ID)
    assert "ghost" in reply["message"] and "$.queues" in reply["message"]
    assert events == [] and observable(svc) == before
    reply = call(svc, "register_topic", topic="TopicR", queues=[QUEUE])
    assert reply == {"op": "register_topic", "id": REQUEST_ID}
    assert call(svc, "get_route", topic="TopicR")["route"]["queues"] == [QUEUE]


def test_kv_ops(svc):
    assert call(svc, "kv_put", namespace="ns", key="k2", value="v2") == {
        "op": "kv_put", "id": REQUEST_ID}
    assert call(svc, "kv_get", namespace="ns", key="k2") == {
        "op": "kv_get", "id": REQUEST_ID, "value": "v2"}
    assert call(svc, "kv_list", namespace="ns")["entries"] == {"k": "v", "k2": "v2"}
    assert call(svc, "kv_list", namespace="empty") == {
        "op": "kv_list", "id": REQUEST_ID, "entries": {}}
    assert call(svc, "kv_delete", namespace="ns", key="k2") == {
        "op": "kv_delete", "id": REQUEST_ID, "removed": True}
    assert call(svc, "kv_delete", namespace="ns", key="k2")["removed"] is False
    reply = call(svc, "kv_get", namespace="ns", key="k2")
    assert (reply["code"], reply["id"]) == ("not_found", REQUEST_ID)
    assert "revision" not in reply  # only get_route's not_found carries it


def test_kv_does_not_advance_revision(svc):
    revision = call(svc, "status")["revision"]
    call(svc, "kv_put", namespace="other", key="x", value="y")
    call(svc, "kv_delete", namespace="other", key="x")
    assert call(svc, "status")["revision"] == revision


def test_order_topic_config_reaches_the_route(svc):
    reply, events = call_events(svc, "kv_put", namespace=ORDER_TOPIC_CONFIG, key="TopicA",
                                value="broker-a:4")
    assert reply["op"] == "kv_put"
    ((channel, event),) = events
    assert channel == b"route/TopicA\0"
    assert event["route"]["order_conf"] == "broker-a:4"
    assert call(svc, "get_route", topic="TopicA")["route"]["order_conf"] == "broker-a:4"
    _, events = call_events(svc, "kv_delete", namespace=ORDER_TOPIC_CONFIG, key="TopicA")
    assert events[0][1]["route"]["order_conf"] == ""


def test_order_topic_config_loaded_at_start():
    kv = KvStore(None)
    kv.put(ORDER_TOPIC_CONFIG, "TopicA", "broker-a:8")
    service = NameService(kv, epoch=EPOCH, started_at_ms=0)
    call(service, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={"TopicA": {}})
    assert call(service, "get_route", topic="TopicA")["route"]["order_conf"] == "broker-a:8"


# --- §2 internal errors -----------------------------------------------------------------


def test_unexpected_exception_is_internal_and_service_keeps_serving(svc, monkeypatch, caplog):
    def boom(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(svc.table, "topics", boom)
    reply, events = call_events(svc, "get_topics")
    assert (reply["op"], reply["code"], reply["id"]) == ("error", "internal", REQUEST_ID)
    assert events == []
    assert "simulated bug" in caplog.text  # logged with its traceback
    assert "Traceback" in caplog.text or any(r.exc_info for r in caplog.records)
    assert call(svc, "get_route", topic="TopicA")["op"] == "get_route"
    monkeypatch.undo()
    assert call(svc, "get_topics")["topics"] == ["TopicA"]


def test_exception_in_a_mutating_handler_is_internal(svc, monkeypatch):
    monkeypatch.setattr(svc.table, "register_broker", lambda *a: 1 / 0)
    reply = send(svc, REGISTER)
    assert (reply["code"], reply["id"]) == ("internal", REQUEST_ID)
    assert call(svc, "status")["op"] == "status"


# --- §7 events ----------------------------------------------------------------------------


def test_one_revision_per_request_and_prev_chain(svc):
    _, events = call_events(svc, "register_broker", cluster="c1", broker_name="broker-a",
                            broker_id=0, broker_addr=MASTER, data_version={"counter": 1},
                            topics={"TopicA": {"perm": 4}, "TopicB": {}, "TopicC": {}})
    assert {body["revision"] for _, body in events} == {2}
    prevs = {body["topic"]: body["prev"] for _, body in events}
    assert prevs == {"TopicA": 1, "TopicB": 0, "TopicC": 0}
    _, events = call_events(svc, "register_broker", cluster="c1", broker_name="broker-a",
                            broker_id=0, broker_addr=MASTER, data_version={"counter": 1},
                            topics={"TopicA": {"perm": 4}, "TopicB": {}, "TopicC": {}})
    assert events == []  # periodic re-registration with the same data: nothing
    assert call(svc, "status")["revision"] == 2


def test_expire_publishes_frames(svc):
    frames = svc.expire(120_001)
    channels = sorted(ch for ch, _ in frames)
    assert channels == [b"broker/c1/broker-a\0", b"route/TopicA\0"]
    bodies = {ch: msgspec.msgpack.decode(body) for ch, body in frames}
    assert bodies[b"broker/c1/broker-a\0"]["reason"] == "expired"
    assert bodies[b"route/TopicA\0"]["route"] is None
    assert call(svc, "get_route", topic="TopicA")["code"] == "not_found"


def test_hb_event(svc):
    channel, body = svc.heartbeat_event(1234)
    assert channel == b"hb\0"
    assert msgspec.msgpack.decode(body) == {"op": "hb", "epoch": EPOCH, "revision": 1,
                                            "time_ms": 1234}


def test_every_reply_type_is_covered():
    covered = {"register_broker", "heartbeat", "unregister_broker", "get_route", "get_routes",
               "get_cluster_info", "get_topics", "snapshot", "status", "wipe_write_perm",
               "add_write_perm", "delete_topic", "register_topic", "kv_put", "kv_get",
               "kv_delete", "kv_list"}
    assert set(REPLY_TYPES) == covered


# --- what the server counts and logs (metrics, operators) -------------------------------


def test_answered_and_refused_requests_are_counted_by_op_and_code(svc, monkeypatch):
    from zns.core.schema import KvPut, RegisterBroker, Status

    # The fixture's registration and put were answered.
    assert dict(svc.ok_counts) == {RegisterBroker: 1, KvPut: 1}
    assert dict(svc.error_counts) == {}
    call(svc, "status")
    call(svc, "status")
    respond(svc, encode({"op": "no_such_op", "id": 1}))
    respond(svc, b"\xc1")  # not MessagePack at all
    call(svc, "get_route")  # a known op, malformed: no topic
    call(svc, "get_route", topic="Nowhere")
    monkeypatch.setattr(svc.table, "topics", lambda *a: 1 / 0)
    call(svc, "get_topics")
    assert svc.ok_counts[Status] == 2
    assert dict(svc.error_counts) == {
        ("unknown", "unknown_op"): 1, ("unknown", "bad_request"): 1,
        ("get_route", "bad_request"): 1, ("get_route", "not_found"): 1,
        ("get_topics", "internal"): 1}
    # Counts add up, they are not flags.
    respond(svc, encode({"op": "no_such_op", "id": 1}))
    call(svc, "get_route")
    call(svc, "get_route", topic="Nowhere")
    call(svc, "get_topics")
    assert dict(svc.error_counts) == {
        ("unknown", "unknown_op"): 2, ("unknown", "bad_request"): 1,
        ("get_route", "bad_request"): 2, ("get_route", "not_found"): 2,
        ("get_topics", "internal"): 2}


def test_an_unknown_op_is_named_in_the_reply_cut_to_100_characters(svc):
    reply, _ = respond(svc, encode({"op": "x" * 300, "id": 5}))
    assert (reply["code"], reply["id"]) == ("unknown_op", 5)
    assert reply["message"] == f"unknown op {'x' * 100!r}"


def test_a_kv_write_that_fails_is_internal_logged_and_counted(svc, monkeypatch, caplog):
    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(svc.kv, "_append", fail)  # the KV file's own boundary maps it
    with caplog.at_level("ERROR", logger="zns"):
        reply = call(svc, "kv_put", namespace="ns", key="k2", value="v2")
    assert (reply["code"], reply["id"]) == ("internal", REQUEST_ID)
    assert reply["message"] == ("the KV store could not be written durably: "
                                "[Errno 28] No space left on device")
    assert [r.getMessage() for r in caplog.records] == [
        "internal error on KvPut: the KV store could not be written durably: "
        "[Errno 28] No space left on device"]
    assert svc.error_counts[("kv_put", "internal")] == 1


def test_a_bug_is_logged_with_the_request_quoted(svc, monkeypatch, caplog):
    from zns.core.schema import GetRoutes
    from zns.core.text import quote

    monkeypatch.setattr(svc.table, "topics", lambda *a: 1 / 0)
    with caplog.at_level("ERROR", logger="zns"):
        reply = call(svc, "get_topics", cluster="c1")
    assert (reply["code"], reply["message"]) == ("internal", "internal error; see the server log")
    (record,) = caplog.records
    assert record.getMessage().startswith("bug while handling GetTopics(")
    assert "cluster='c1'" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError
    # A long request is quoted up to 300 characters, not the default cut.
    caplog.clear()
    monkeypatch.setattr(svc.table, "topic_revision", lambda *a: 1 / 0)
    with caplog.at_level("ERROR", logger="zns"):
        call(svc, "get_routes", topics=["t" * 100, "u" * 100, "v" * 100])
    request = GetRoutes(id=REQUEST_ID, topics=["t" * 100, "u" * 100, "v" * 100])
    assert len(repr(request)) > 301
    assert caplog.records[0].getMessage() == f"bug while handling {quote(request, 300)}"


def test_events_are_counted_by_kind_and_removals_by_reason(svc):
    assert dict(svc.published) == {"broker": 1, "route": 1}  # the fixture's registration
    send(svc, REGISTER)  # broker-b with TopicB
    assert dict(svc.published) == {"broker": 2, "route": 2}
    call(svc, "unregister_broker", cluster="c2", broker_name="broker-b", broker_id=0,
         broker_addr=OTHER)
    assert dict(svc.removals) == {"unregistered": 1}
    over_remoting(svc, REGISTER, connection=7)
    svc.connection_closed(7)
    assert svc.connection_closed(7) == []  # gone already
    svc.expire(10**9)  # broker-a
    assert dict(svc.removals) == {"unregistered": 1, "disconnected": 1, "expired": 1}
    assert dict(svc.published) == {"broker": 6, "route": 6}
    send(svc, REGISTER)
    call(svc, "unregister_broker", cluster="c2", broker_name="broker-b", broker_id=0,
         broker_addr=OTHER)
    assert svc.removals["unregistered"] == 2
    svc.heartbeat_event(1)
    svc.heartbeat_event(2)
    assert svc.published["hb"] == 2


def test_broker_events_are_logged_one_line_each_with_the_reason(svc, caplog):
    with caplog.at_level("INFO", logger="zns"):
        over_remoting(svc, REGISTER, connection=7)
        frames = svc.connection_closed(7)
    assert [r.getMessage() for r in caplog.records] == [
        f"broker registered c2/broker-b id 0 at {OTHER}",
        f"broker removed c2/broker-b id 0 at {OTHER} (disconnected)"]
    assert {level for level in (r.levelname for r in caplog.records)} == {"INFO"}
    bodies = [msgspec.msgpack.decode(body) for _, body in frames]
    assert [(b["op"], b.get("reason")) for b in bodies if b["op"] == "broker"] == [
        ("broker", "disconnected")]


def test_a_refused_registration_is_logged_as_a_warning(svc, caplog):
    call(svc, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={"TopicA": {}}, data_version={"state": 3})
    with caplog.at_level("WARNING", logger="zns"):
        reply = call(svc, "register_broker", cluster="c1", broker_name="broker-a",
                     broker_id=0, broker_addr=OTHER, data_version={"state": 2})
    assert reply["code"] == "conflict"
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert record.getMessage() == f"broker c1/broker-a id 0 at {OTHER} refused: {reply['message']}"


def test_busy_reply_names_the_request_and_says_what_to_do():
    reply = msgspec.msgpack.decode(NameService.busy_reply(77))
    assert reply == {"op": "error", "id": 77, "code": "busy", "message": (
        "the reply is larger than this peer's budget of unread replies allows now; "
        "read the replies already sent and retry later")}


def test_status_uptime_is_never_negative_and_peers_are_a_copy(svc):
    svc.started_at_ms = 10_000
    svc.peers["tcp://peer:1"] = True
    reply = call(svc, "status", now=4_000)  # a clock that stepped back
    assert reply["uptime_ms"] == 0
    assert reply["peers"] == {"tcp://peer:1": True}
    status = svc._status(1, 4_000)
    svc.peers["tcp://peer:1"] = False
    assert status.peers == {"tcp://peer:1": True}


def test_published_routes_are_the_routes_get_route_returns_whatever_they_share(svc):
    # Topics of one registration share their queue and broker lists; a filter server
    # list is encoded only when there is one. Every event must still carry its own
    # topic's whole route, exactly as get_route returns it.
    _, events = call_events(svc, "register_broker", cluster="c1", broker_name="broker-a",
                            broker_id=0, broker_addr=MASTER, data_version={"counter": 2},
                            filter_servers=["10.0.0.9:1", "10.0.0.9:2"],
                            topics={"TopicA": {"perm": 4}, "TopicB": {}, "TopicC": {}})
    routes = {body["topic"]: body["route"] for _, body in events if body["op"] == "route"}
    assert sorted(routes) == ["TopicA", "TopicB", "TopicC"]
    for topic, route in routes.items():
        assert route == call(svc, "get_route", topic=topic)["route"]
        assert route["filter_servers"] == {MASTER: ["10.0.0.9:1", "10.0.0.9:2"]}
    assert routes["TopicA"]["queues"][0]["perm"] == 4 and routes["TopicB"]["queues"][0]["perm"] == 6
    _, events = call_events(svc, "register_broker", cluster="c1", broker_name="broker-a",
                            broker_id=0, broker_addr=MASTER, data_version={"counter": 3},
                            topics={"TopicA": {}})
    route = next(body["route"] for _, body in events if body.get("topic") == "TopicA")
    assert route == call(svc, "get_route", topic="TopicA")["route"]
    assert route["filter_servers"] == {}


def test_not_found_replies_name_what_was_missing(svc):
    reply = call(svc, "get_route", topic="Nowhere")
    assert (reply["code"], reply["message"]) == ("not_found", "no route for topic 'Nowhere'")
    reply = call(svc, "kv_get", namespace="ns", key="nothing")
    assert (reply["code"], reply["message"]) == ("not_found",
                                                 "no KV entry 'nothing' in namespace 'ns'")


def test_a_kv_key_named_like_a_topic_touches_routes_only_in_the_order_namespace(svc):
    route = call(svc, "get_route", topic="TopicA")
    reply, events = call_events(svc, "kv_put", namespace="ns", key="TopicA", value="brokerA:4")
    assert reply["op"] == "kv_put" and events == []
    assert call(svc, "get_route", topic="TopicA") == route
    _, events = call_events(svc, "kv_put", namespace=ORDER_TOPIC_CONFIG, key="TopicA",
                            value="broker-a:4")
    assert [body["topic"] for _, body in events] == ["TopicA"]


def test_every_request_is_authorized_with_its_peer_before_anything_is_done():
    from zns.core.errors import NoPermission
    from zns.core.schema import GetRoute, RegisterBroker

    seen: list[tuple[str | None, type]] = []

    def authorize(peer_key, request):
        seen.append((peer_key, type(request)))
        if isinstance(request, RegisterBroker):
            raise NoPermission("this key may not register brokers")

    service = NameService(KvStore(None), epoch=EPOCH, started_at_ms=0, authorize=authorize)
    response = service.respond(encode({"op": "register_broker", "id": 7, "cluster": "c1",
                                       "broker_name": "b", "broker_id": 0,
                                       "broker_addr": MASTER, "topics": {"T": {}}}),
                               0, peer_key="KEY")
    reply = msgspec.msgpack.decode(response.reply)
    assert (reply["code"], reply["message"], reply["id"]) == (
        "no_permission", "this key may not register brokers", 7)
    assert list(response.events) == [] and service.table.route("T") is None
    service.respond(encode({"op": "get_route", "id": 8, "topic": "T"}), 0, peer_key=None)
    assert seen == [("KEY", RegisterBroker), (None, GetRoute)]


def test_status_names_no_events_endpoint_unless_given():
    service = NameService(KvStore(None), epoch=EPOCH, started_at_ms=0)
    assert call(service, "status")["pub_endpoint"] == ""


def test_a_request_no_op_handles_is_an_internal_error_naming_its_type(svc):
    from zns.core.errors import Internal

    class Unheard:
        id = 1

    with pytest.raises(Internal, match="^no handler for Unheard$"):
        svc.read(Unheard(), 0)  # type: ignore[arg-type]


def test_a_route_is_encoded_once_per_change_however_often_it_is_read(svc, monkeypatch):
    from zns.core.schema import TopicRoute

    encoded: list[object] = []
    exact = svc._exact
    monkeypatch.setattr(svc, "_exact", lambda value: (
        encoded.append(value) if isinstance(value, TopicRoute) else None) or exact(value))
    route_map = svc._route_map
    maps: list[int] = []
    monkeypatch.setattr(svc, "_route_map", lambda routes: maps.append(1) or route_map(routes))
    for _ in range(3):
        call(svc, "get_route", topic="TopicA")
        call(svc, "get_routes", topics=["TopicA"])
        call(svc, "snapshot")
    assert len(encoded) == 1 and len(maps) == 1
    call(svc, "wipe_write_perm", broker_name="broker-a")  # TopicA changes
    for _ in range(2):
        call(svc, "snapshot")
        call(svc, "get_route", topic="TopicA")
    assert len(encoded) == 2 and len(maps) == 2


def test_the_topics_of_one_step_share_one_encoding_of_their_lists():
    # A 20,000-topic registration's events each carry the same queue, broker and filter
    # server lists: encoded once, held once, until the events are read.
    from zns.core.schema import decode_request

    service = NameService(KvStore(None), epoch=EPOCH, started_at_ms=0)
    request = decode_request(encode({
        "op": "register_broker", "id": 1, "cluster": "c1", "broker_name": "broker-a",
        "broker_id": 0, "broker_addr": MASTER, "filter_servers": ["10.0.0.9:1"],
        "topics": {"TopicA": {}, "TopicB": {}, "TopicC": {"perm": 4}}}))
    _, frames = service.execute(request, 0)
    routes = {event.topic: event.route for event in frames._events if hasattr(event, "route")}
    for field in ("queues", "brokers", "filter_servers"):
        a, b, c = (getattr(routes[topic], field) for topic in ("TopicA", "TopicB", "TopicC"))
        assert all(isinstance(raw, msgspec.Raw) for raw in (a, b, c)), field
        assert a is b and a is not c, field


def test_the_reply_size_limit_is_taken_from_the_constructor():
    service = NameService(KvStore(None), epoch=EPOCH, started_at_ms=0, max_reply_bytes=10)
    call(service, "register_broker", cluster="c1", broker_name="broker-a", broker_id=0,
         broker_addr=MASTER, topics={"TopicA": {}})
    assert call(service, "get_routes", topics=["TopicA"])["code"] == "busy"
    assert call(service, "snapshot")["code"] == "busy"


def test_a_tie_goes_with_its_broker_and_a_zns1_registration_takes_it_over(svc):
    # §12: REGISTER_BROKER over a remoting connection ties (cluster, address, name) to it.
    over_remoting(svc, REGISTER, connection=7)
    assert svc.tied_connection("c2", OTHER, "broker-b") == 7
    over_remoting(svc, REGISTER, connection=8)  # registered again elsewhere: the tie moves
    assert svc.tied_connection("c2", OTHER, "broker-b") == 8
    assert svc.connection_closed(7) == []
    svc.expire(10**9)  # both brokers expire: the tie must not outlive its broker
    assert svc.tied_connection("c2", OTHER, "broker-b") is None
    send(svc, REGISTER, now=10**9)  # the same entry, now over ZNS/1
    assert svc.connection_closed(8) == []
    assert svc.tied_connection("c2", OTHER, "broker-b") is None
    over_remoting(svc, REGISTER, connection=9, now=10**9)
    send(svc, REGISTER, now=10**9)  # a ZNS/1 registration unties it
    assert svc.connection_closed(9) == []
    assert call(svc, "get_route", topic="TopicB", now=10**9)["route"]["topic"] == "TopicB"


def test_a_remoting_heartbeat_refreshes_only_a_tied_broker(svc):
    heartbeat = dict(op="heartbeat", cluster="c2", broker_name="broker-b", broker_id=0,
                     broker_addr=OTHER)
    send(svc, REGISTER, now=1_000)
    reply = over_remoting(svc, heartbeat, connection=7, now=5_000)
    assert (reply.id, reply.known, reply.changed) == (REQUEST_ID, False, True)
    assert svc.table.liveness("c2", OTHER).last_heartbeat == 1_000
    over_remoting(svc, REGISTER, connection=7, now=6_000)
    assert over_remoting(svc, heartbeat, connection=8, now=7_000).known
    assert svc.table.liveness("c2", OTHER).last_heartbeat == 7_000
    assert svc.tied_connection("c2", OTHER, "broker-b") == 7  # never moved by a heartbeat


def test_status_shows_the_remoting_listener_as_bound(svc):
    assert call(svc, "status")["remoting"] == ""  # none bound
    svc.remoting_endpoint = "0.0.0.0:9876"
    assert call(svc, "status")["remoting"] == "0.0.0.0:9876"


def test_the_table_queries_a_driver_makes_pass_through(svc):
    send(svc, REGISTER, now=1_000)
    send(svc, dict(REGISTER, cluster="c3", broker_name="broker-c", broker_addr="10.0.0.3:10911",
                   topics={"TopicC": {"sys_flag": 1}, "TopicB": {}}), now=1_000)
    assert svc.topics() == ["TopicA", "TopicB", "TopicC"]
    assert svc.topics("c2") == ["TopicB"]
    assert svc.topics("c3", 1) == ["TopicC"]
    assert list(svc.topic_queue_table()["TopicB"]) == ["broker-b", "broker-c"]
    assert list(svc.topic_queue_table().get("nowhere", ())) == []
    # A stall gives every broker its time back; a peer's hint then shortens the deadline.
    deadline = svc.table.next_deadline()
    svc.shift_deadlines(500)
    assert svc.table.next_deadline() == deadline + 500
    assert svc.table.liveness("c2", OTHER).suspect_deadline is None
    assert svc.suspect("c2", OTHER, 10, now=2_000) is True
    live = svc.table.liveness("c2", OTHER)
    assert live.suspect_deadline == max(live.silent_since + 10, 2_000 + live.timeout_ms // 4)
    assert svc.suspect("c2", "10.9.9.9:1", 10, now=2_000) is False


def test_get_routes_by_revision_sends_only_what_changed_since_the_revisions_held(svc):
    call(svc, "register_broker", cluster="c1", broker_name="broker-b", broker_id=0,
         broker_addr="10.0.0.9:10911", topics={"TopicB": {}})
    first = call(svc, "get_routes", topics=["TopicA", "TopicB", "Never"])
    held = first["revisions"]
    # Nothing changed: no route is sent again, every topic is unchanged (missing included).
    again = call(svc, "get_routes", topics=["TopicA", "TopicB", "Never"], held_epoch=EPOCH,
                 held=held)
    assert again["routes"] == {} and again["missing"] == []
    assert again["unchanged"] == ["TopicA", "TopicB", "Never"] and again["revisions"] == held
    # TopicB changed: only its route comes, at its new revision.
    call(svc, "register_broker", cluster="c1", broker_name="broker-b", broker_id=0,
         broker_addr="10.0.0.9:10911", topics={"TopicB": {"read_queues": 2}},
         data_version={"counter": 2})
    changed = call(svc, "get_routes", topics=["TopicA", "TopicB"], held_epoch=EPOCH, held=held)
    assert set(changed["routes"]) == {"TopicB"} and changed["unchanged"] == ["TopicA"]
    assert changed["revisions"]["TopicB"] > held["TopicB"]
    # Revisions of another epoch compare with nothing: everything is sent.
    other = call(svc, "get_routes", topics=["TopicA", "TopicB"], held_epoch="another", held=held)
    assert set(other["routes"]) == {"TopicA", "TopicB"} and other["unchanged"] == []

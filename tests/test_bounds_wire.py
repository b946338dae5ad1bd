"""Each bound of §3 once over the wire: a clear `bad_request` that names the
field, and nothing applied. (The service-level tests cover every bound in depth.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from helpers import Peer, peer_state, register_fields, served
from zns.core import schema

A = "10.0.0.1:10911"
BROKER = dict(cluster="c1", broker_name="broker-a", broker_id=0, broker_addr=A)
QUEUE = dict(broker_name="broker-a", read_queues=1, write_queues=1, perm=6, sys_flag=0)


def reg(**extra: Any) -> dict[str, Any]:
    return register_fields(addr=A, **extra)


def reg_topic(**config: Any) -> dict[str, Any]:
    return reg(topics={"T": config})


def without(fields: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != key}


# (op, fields, text the error message must contain)
BAD = [
    # topic: 1-127 characters of [A-Za-z0-9_%|-]
    ("get_route", dict(topic="has space"), "`$.topic`"),
    ("get_route", dict(topic="T" * 128), "`$.topic`"),
    ("get_route", dict(topic=""), "`$.topic`"),
    ("get_routes", dict(topics=["ok", "b/ad"]), "`$.topics[1]`"),
    ("register_broker", reg(topics={"bad.topic": {}}), "`$.topics`"),
    ("delete_topic", dict(topic="T\x00"), "`$.topic`"),
    # cluster, broker_name, KV namespace and key: 1-255, no control characters, no '/'
    ("register_broker", reg(cluster="c" * 256), "`$.cluster`"),
    ("register_broker", reg(cluster=""), "`$.cluster`"),
    ("heartbeat", {**BROKER, "broker_name": "a/b"}, "`$.broker_name`"),
    ("unregister_broker", {**BROKER, "broker_name": "a\x01b"}, "`$.broker_name`"),
    ("wipe_write_perm", dict(broker_name="x\x7f"), "`$.broker_name`"),
    ("kv_put", dict(namespace="n/s", key="k", value="v"), "`$.namespace`"),
    ("kv_put", dict(namespace="ns", key="k" * 256, value="v"), "`$.key`"),
    ("kv_get", dict(namespace="ns", key=""), "`$.key`"),
    ("kv_list", dict(namespace="\n"), "`$.namespace`"),
    ("get_topics", dict(cluster="a/b"), "`$.cluster`"),
    # zone: 0-255 characters, no control characters
    ("register_broker", reg(zone="z" * 256), "`$.zone`"),
    ("get_route", dict(topic="T", zone="z\tz"), "`$.zone`"),
    # broker address: host:port, DNS name / IPv4 / [IPv6], port 1-65535, <= 255 characters
    ("register_broker", reg(broker_addr="10.0.0.1"), "`$.broker_addr`"),
    ("register_broker", reg(broker_addr="10.0.0.1:0"), "`$.broker_addr`"),
    ("register_broker", reg(broker_addr="10.0.0.1:65536"), "`$.broker_addr`"),
    ("register_broker", reg(broker_addr="::1:10911"), "`$.broker_addr`"),
    ("register_broker", reg(broker_addr="bad host:1"), "`$.broker_addr`"),
    ("register_broker", reg(broker_addr="a." * 126 + "bb:1"), "`$.broker_addr`"),
    ("register_broker", reg(ha_addr="nope"), "`$.ha_addr`"),
    ("register_broker", reg(filter_servers=["10.0.0.1:1", "x:"]), "`$.filter_servers[1]`"),
    ("heartbeat", {**BROKER, "broker_addr": ""}, "`$.broker_addr`"),
    # broker_id: 0 - 2^31-1
    ("register_broker", reg(broker_id=-1), "`$.broker_id`"),
    ("unregister_broker", {**BROKER, "broker_id": 2**31}, "`$.broker_id`"),
    # queue counts 0-65535, perm 0-15, sys_flag 0 - 2^31-1
    ("register_broker", reg_topic(read_queues=65536), "read_queues"),
    ("register_broker", reg_topic(write_queues=-1), "write_queues"),
    ("register_broker", reg_topic(perm=16), "perm"),
    ("register_broker", reg_topic(sys_flag=2**31), "sys_flag"),
    ("register_topic", dict(topic="T", queues=[{**QUEUE, "perm": -1}]), "`$.queues[0].perm`"),
    ("register_topic", dict(topic="T", queues=[{**QUEUE, "read_queues": 70000}]),
     "`$.queues[0].read_queues`"),
    ("get_topics", dict(sys_flag=-1), "`$.sys_flag`"),
    # heartbeat_timeout_ms: 1000 - 3600000
    ("register_broker", reg(heartbeat_timeout_ms=999), "`$.heartbeat_timeout_ms`"),
    ("register_broker", reg(heartbeat_timeout_ms=3_600_001), "`$.heartbeat_timeout_ms`"),
    # a KV value: at most 65,536 UTF-8 bytes
    ("kv_put", dict(namespace="ns", key="k", value="v" * 65_537), "`$.value`"),
    ("kv_put", dict(namespace="ns", key="k", value="é" * 32_769), "`$.value`"),
    # types and presence
    ("register_broker", without(reg(), "broker_addr"), "broker_addr"),
    ("register_broker", reg(broker_id="0"), "`$.broker_id`"),
    ("register_broker", reg(data_version={"state": "x"}), "`$.data_version.state`"),
    ("register_broker", reg(incremental="yes"), "`$.incremental`"),
    ("register_topic", dict(topic="T", queues=[without(QUEUE, "perm")]), "perm"),
    ("kv_put", dict(namespace="ns", key="k", value=5), "`$.value`"),
]

GOOD = [
    ("get_route", dict(topic="A-b_c%d|e" + "x" * 118)),
    ("register_broker", reg(cluster="c" * 255, broker_name="b" * 255, zone="z" * 255,
                            broker_id=2**31 - 1, heartbeat_timeout_ms=3_600_000,
                            topics={"T": dict(read_queues=65535, write_queues=0, perm=15,
                                              sys_flag=2**31 - 1)})),
    ("register_broker", reg(broker_addr="[::1]:65535", ha_addr="",
                            heartbeat_timeout_ms=1000, filter_servers=["host-1.example:1"])),
    ("kv_put", dict(namespace="n" * 255, key="k" * 255, value="é" * 32_768)),
]


@pytest.fixture(scope="module")
def wire(tmp_path_factory) -> Iterator[Peer]:
    srv = served(tmp_path_factory.mktemp("bounds"))
    peer = srv.peer()
    peer.ok("register_broker", **reg(topics={"T": {}, "U": {"perm": 4}}))
    peer.ok("kv_put", namespace="ns", key="k", value="before")
    yield peer
    srv.stop()


state = peer_state


@pytest.mark.parametrize("op, fields, field_text", BAD,
                         ids=[f"{i}-{op}-{text.strip('`$.')}" for i, (op, _, text) in
                              enumerate(BAD)])
def test_out_of_bounds_is_bad_request_naming_the_field(wire: Peer, op, fields, field_text):
    before = state(wire)
    reply = wire.call(op, id=4242, **fields)
    assert isinstance(reply, schema.Error), reply
    assert reply.code == "bad_request" and reply.id == 4242
    assert field_text in reply.message, reply.message
    assert state(wire) == before


@pytest.mark.parametrize("op, fields", GOOD, ids=[f"{i}-{op}" for i, (op, _) in enumerate(GOOD)])
def test_values_at_the_bounds_are_accepted(make_server, op, fields):
    peer = make_server().peer()
    reply = peer.call(op, **fields)
    assert not isinstance(reply, schema.Error) or reply.code == "not_found", reply


def test_negative_id_cannot_be_echoed(wire: Peer):
    wire.send_raw(schema.encode({"op": "status", "id": -5}))
    reply = schema.decode_reply(wire.recv_raw()[-1])
    assert (reply.code, reply.id) == ("bad_request", 0) and "`$.id`" in reply.message

"""`RemotingService` without sockets: RocketMQ remoting requests against a real `NameService`.

Replies are compared byte for byte with what the Java 5.3.3 NameServer sent
(tests/data/remoting-vectors.txt); state changes are compared with the same
op over ZNS/1 (same table, same events, same revisions, same refusals).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
import pytest

from test_remoting_codec import FRAMES, INLINE, frame
from zns.core import schema
from zns.core.limits import Limits
from zns.core.remoting import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    RemotingCommand,
    body_crc32,
    decode_frame,
    encode_command,
    encode_json_header,
    loads_lenient,
)
from zns.core.addresses import LOOPBACK as LOOPBACK_NETWORKS
from zns.core.addresses import parse_networks
from zns.core.remoting.handler import (
    Connection,
    RemotingService,
    describe_access,
    remoting_access,
)
from zns.core.schema import ORDER_TOPIC_CONFIG, encode
from zns.core.service import NameService
from zns.drivers.kv_file import KvStore

import helpers

pytestmark = pytest.mark.timeout(60)

EPOCH = "0123456789abcdef"
MASTER, SLAVE = "127.0.0.1:10911", "127.0.0.1:10921"
LOCAL = Connection(1, "127.0.0.1")

REGISTER_VECTOR = "REGISTER_BROKER request"
REGISTER_REPLY = "REGISTER_BROKER response (null haServerAddr/masterAddr, no body)"
ROUTE_REPLY = "GET_ROUTEINFO_BY_TOPIC response JSON (version sysprop 479)"


def new_service(limits: Limits | None = None) -> NameService:
    return NameService(KvStore(None), epoch=EPOCH, started_at_ms=0, limits=limits)


@pytest.fixture
def svc() -> NameService:
    return new_service()


@pytest.fixture
def rs(svc: NameService) -> RemotingService:
    # The vectors were recorded from a Java NameServer with orderMessageEnable=true.
    return RemotingService(svc, properties={"router": "tcp://127.0.0.1:9876", "remoting": "x"},
                           order_message_enable=True)


def req(code: int, ext: dict[str, str] | None = None, body: bytes = b"", *, opaque: int = 1,
        version: int = 479, flag: int = 0) -> RemotingCommand:
    return RemotingCommand(code=code, version=version, opaque=opaque, flag=flag, ext_fields=ext,
                           body=body)


def call(rs: RemotingService, cmd: RemotingCommand, conn: Connection = LOCAL,
         now: int = 1000) -> RemotingCommand:
    reply, _ = rs.handle(cmd, conn, now)
    assert reply is not None
    assert reply.opaque == cmd.opaque and reply.flag == FLAG_RESPONSE
    return reply


def ok(rs: RemotingService, cmd: RemotingCommand, conn: Connection = LOCAL,
       now: int = 1000) -> RemotingCommand:
    reply = call(rs, cmd, conn, now)
    assert reply.code == 0, reply.remark
    return reply


def vector_register() -> RemotingCommand:
    return decode_frame(frame(REGISTER_VECTOR)[4:])


def register_cmd(broker_id: int = 0, addr: str = MASTER, topics: dict[str, dict] | None = None,
                 *, name: str = "broker-a", cluster: str = "DefaultCluster", counter: int = 3,
                 state: int = 0, ha: str = "127.0.0.1:10912", extra: dict[str, str] | None = None,
                 opaque: int = 11) -> RemotingCommand:
    """A REGISTER_BROKER as a 5.3.3 broker sends it (plain body, CRC set)."""
    topics = {"TopicTest": {}} if topics is None else topics
    table = {
        t: {"attributes": {}, "order": False, "perm": c.get("perm", 6),
            "readQueueNums": c.get("read", 4), "topicFilterType": "SINGLE_TAG", "topicName": t,
            "topicSysFlag": c.get("sys_flag", 0), "writeQueueNums": c.get("write", 4)}
        for t, c in topics.items()
    }
    body = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": counter, "stateVersion": state, "timestamp": 1700000000000},
        "topicConfigTable": table}}).encode()
    ext = {"brokerId": str(broker_id), "bodyCrc32": str(body_crc32(body)), "clusterName": cluster,
           "brokerAddr": addr, "enableActingMaster": "false", "haServerAddr": ha,
           "compressed": "false", "brokerName": name, **(extra or {})}
    return req(103, ext, body, opaque=opaque)


def register_pair(rs: RemotingService) -> None:
    """broker-a: master 127.0.0.1:10911 with TopicTest (4/4, perm 6) and slave 127.0.0.1:10921."""
    ok(rs, register_cmd())
    ok(rs, register_cmd(1, SLAVE, ha="127.0.0.1:10922"))


def zns1_map(svc: NameService, op: str, now: int = 1000, **fields: Any) -> dict[str, Any]:
    """`op` through NameService.respond; the reply as the plain map the wire carries."""
    reply = msgspec.msgpack.decode(svc.respond(encode({"op": op, "id": 1, **fields}), now).reply)
    assert isinstance(reply, dict)
    return reply


def observable(svc: NameService) -> bytes:
    return helpers.observable(svc, (ORDER_TOPIC_CONFIG, "ns"))


def decode_events(frames: list) -> list[Any]:
    return [schema.decode_event(body) for _, body in frames]


def header_json(reply: RemotingCommand) -> str:
    return encode_json_header(reply).decode()


# --- byte-exact replies ------------------------------------------------------------------


def test_register_broker_reply_is_the_java_frame(rs, svc):
    reply = ok(rs, vector_register())
    assert encode_command(reply) == frame(REGISTER_REPLY)
    assert svc.table.route("TopicTest") is not None  # a single-topic first registration


def test_topic_not_exist_is_the_java_frame(rs):
    reply = call(rs, req(105, {"topic": "X"}, opaque=8))
    assert encode_command(reply) == frame("TOPIC_NOT_EXIST response")


def route_setup(rs: RemotingService) -> None:
    register_pair(rs)
    ok(rs, req(100, {"namespace": ORDER_TOPIC_CONFIG, "key": "TopicTest", "value": "broker-a:4"}))


def test_route_reply_legacy_is_the_java_frame(rs):
    route_setup(rs)
    reply = ok(rs, req(105, {"topic": "TopicTest"}, opaque=7, version=317))
    assert encode_command(reply) == frame(ROUTE_REPLY)


@pytest.mark.parametrize("version, ext", [
    (479, {}), (401, {}), (317, {"acceptStandardJsonOnly": "true"}),
    (317, {"acceptStandardJsonOnly": "TRUE"}),
])
def test_route_reply_standard_form(rs, version, ext):
    route_setup(rs)
    reply = ok(rs, req(105, {"topic": "TopicTest", **ext}, opaque=7, version=version))
    assert reply.body.decode() == INLINE["TopicRouteData standard w/ orderTopicConf"]


@pytest.mark.parametrize("version, ext", [(400, {}), (37, {"acceptStandardJsonOnly": "false"})])
def test_route_reply_legacy_below_401(rs, version, ext):
    route_setup(rs)
    reply = ok(rs, req(105, {"topic": "TopicTest", **ext}, opaque=7, version=version))
    assert reply.body.decode() == FRAMES[ROUTE_REPLY]["body"]


@pytest.mark.parametrize("version", [317, 479])
def test_order_topic_conf_only_with_order_message_enable(svc, version):
    # Java's default (orderMessageEnable=false): the KV entry is kept and sent to brokers at
    # registration, but routes leave orderTopicConf out, zone mode included.
    rs = RemotingService(svc)
    route_setup(rs)
    for ext in ({}, {"__ZONE_MODE": "true", "__ZONE_NAME": "z"}):
        reply = ok(rs, req(105, {"topic": "TopicTest", **ext}, version=version))
        assert b"orderTopicConf" not in reply.body and b"queueDatas" in reply.body
    reply = ok(rs, register_cmd(counter=4))
    assert json.loads(reply.body) == {"table": {"TopicTest": "broker-a:4"}}
    enabled = RemotingService(svc, order_message_enable=True)
    reply = ok(enabled, req(105, {"topic": "TopicTest", "__ZONE_MODE": "true", "__ZONE_NAME": "z"},
                            version=version))
    assert b'"orderTopicConf":"broker-a:4"' in reply.body


def test_route_request_in_rocketmq_header_is_answered_in_json(rs):
    route_setup(rs)
    request = decode_frame(frame("GET_ROUTEINFO_BY_TOPIC request ROCKETMQ")[4:])
    assert request.serialize_type == 1
    reply = ok(rs, request)
    assert reply.serialize_type == SERIALIZE_JSON
    assert reply.body.decode() == INLINE["TopicRouteData standard w/ orderTopicConf"]
    wire = encode_command(reply)
    assert wire[4] == 0  # the type byte: the Java NameServer answers in its own type, JSON


def test_query_data_version_reply_header(rs):
    ok(rs, vector_register())
    body = INLINE["DataVersion"].encode()  # counter 3, stateVersion 0, as registered
    ext = {"brokerName": "broker-a", "brokerAddr": MASTER, "clusterName": "DefaultCluster",
           "brokerId": "0"}
    reply = ok(rs, req(322, ext, body, opaque=5))
    assert header_json(reply) == INLINE["QUERY_DATA_VERSION response header"]
    assert reply.body.decode() == INLINE["DataVersion"]
    changed = dict(json.loads(INLINE["DataVersion"]), counter=4)
    reply = ok(rs, req(322, ext, json.dumps(changed).encode(), opaque=5))
    assert reply.ext_fields == {"changed": "true"}


def test_get_kv_config_reply_header(rs):
    ok(rs, req(100, {"namespace": "ns", "key": "k", "value": "v1"}))
    reply = ok(rs, req(101, {"namespace": "ns", "key": "k"}, opaque=6))
    assert header_json(reply) == INLINE["GET_KV_CONFIG response header"]


# --- every request code ---------------------------------------------------------------------


def test_kv_codes(rs, svc):
    ok(rs, req(100, {"namespace": "ns", "key": "k", "value": "v"}))
    assert svc.kv.get("ns", "k") == "v"
    assert ok(rs, req(101, {"namespace": "ns", "key": "k"})).ext_fields == {"value": "v"}
    table = ok(rs, req(219, {"namespace": "ns"})).body
    assert table == b'{"table":{"k":"v"}}'
    ok(rs, req(102, {"namespace": "ns", "key": "k"}))
    missing = call(rs, req(101, {"namespace": "ns", "key": "k"}))
    assert missing.code == 22 and "k" in missing.remark and missing.ext_fields == {}
    assert call(rs, req(219, {"namespace": "never-used"})).code == 22
    assert call(rs, req(100, {"namespace": "ns", "key": "k"})).code == 1  # value is required


def test_kv_table_vector(rs):
    ok(rs, req(100, {"namespace": "n", "key": "TopicTest", "value": "broker-a:4"}))
    assert ok(rs, req(219, {"namespace": "n"})).body.decode() == INLINE["KVTable"]


def test_register_reply_for_a_slave_names_master_and_ha(rs):
    ok(rs, register_cmd())
    reply = ok(rs, register_cmd(1, SLAVE, ha="127.0.0.1:10922"))
    assert reply.ext_fields == {"masterAddr": MASTER, "haServerAddr": "127.0.0.1:10912"}
    assert reply.body == b""


def test_register_reply_carries_order_topic_config(rs):
    ok(rs, req(100, {"namespace": ORDER_TOPIC_CONFIG, "key": "TopicTest", "value": "broker-a:4"}))
    reply = ok(rs, vector_register())
    assert reply.body.decode() == INLINE["KVTable"]


def test_cluster_info_is_the_java_body(rs):
    register_pair(rs)
    assert ok(rs, req(106)).body.decode() == INLINE["ClusterInfo"]


def test_unregister_broker(rs, svc):
    register_pair(rs)
    ok(rs, req(104, {"brokerName": "broker-a", "brokerAddr": SLAVE,
                     "clusterName": "DefaultCluster", "brokerId": "1"}))
    assert svc.table.broker_table()["broker-a"].addrs == {0: MASTER}
    assert call(rs, req(104, {"brokerName": "broker-a"})).code == 1  # required fields


def test_write_perm_counts(rs, svc):
    ok(rs, register_cmd(topics={"T1": {}, "T2": {}}))
    reply = ok(rs, req(205, {"brokerName": "broker-a"}))
    assert reply.ext_fields == {"wipeTopicCount": "2"}
    assert svc.table.route("T1").queues[0].perm == 4
    reply = ok(rs, req(327, {"brokerName": "broker-a"}))
    assert reply.ext_fields == {"addTopicCount": "2"}
    assert svc.table.route("T1").queues[0].perm == 6
    assert ok(rs, req(205, {"brokerName": "nobody"})).ext_fields == {"wipeTopicCount": "0"}


def test_write_perm_counts_every_topic_of_the_broker_as_java(rs, svc):
    """Java's 205/327 count every QueueData of the broker, changed or not (seen with mqadmin
    wipeWritePerm against a real broker: one topic was already read-only)."""
    ok(rs, register_cmd(topics={"T1": {}, "T2": {"perm": 4}}))
    assert ok(rs, req(205, {"brokerName": "broker-a"})).ext_fields == {"wipeTopicCount": "2"}
    assert ok(rs, req(205, {"brokerName": "broker-a"})).ext_fields == {"wipeTopicCount": "2"}
    assert ok(rs, req(327, {"brokerName": "broker-a"})).ext_fields == {"addTopicCount": "2"}
    assert ok(rs, req(327, {"brokerName": "broker-a"})).ext_fields == {"addTopicCount": "2"}


def topic_list(reply: RemotingCommand) -> dict[str, Any]:
    return json.loads(reply.body)


def test_topic_lists(rs):
    ok(rs, register_cmd(topics={"T1": {}, "U1": {"sys_flag": 1}, "U2": {"sys_flag": 2},
                                "U3": {"sys_flag": 3}}))
    ok(rs, register_cmd(0, "127.0.0.1:20911", {"Other": {}}, name="broker-b", cluster="c2"))
    everything = {"T1", "U1", "U2", "U3", "Other"}
    assert set(topic_list(ok(rs, req(206)))["topicList"]) == everything
    assert set(topic_list(ok(rs, req(224, {"cluster": "c2"})))["topicList"]) == {"Other"}
    assert topic_list(ok(rs, req(224, {"cluster": "nope"}))) == {"topicList": []}
    assert set(topic_list(ok(rs, req(311)))["topicList"]) == {"U1", "U3"}
    assert set(topic_list(ok(rs, req(312)))["topicList"]) == {"U2", "U3"}
    assert set(topic_list(ok(rs, req(313)))["topicList"]) == {"U2"}
    system = topic_list(ok(rs, req(304)))
    assert set(system["topicList"]) == {"DefaultCluster", "broker-a", "c2", "broker-b"}
    assert system["brokerAddr"] in (MASTER, "127.0.0.1:20911")


def test_system_topic_list_shape(rs):
    ok(rs, vector_register())
    body = ok(rs, req(304)).body.decode()
    # The order of a ConcurrentHashMap key set holding both names (what a 5.3.3 NameServer sends).
    assert body == '{"brokerAddr":"127.0.0.1:10911","topicList":["broker-a","DefaultCluster"]}'


def test_delete_topic(rs, svc):
    ok(rs, register_cmd(topics={"T1": {}, "T2": {}}))
    ok(rs, req(216, {"topic": "T1"}))
    assert call(rs, req(105, {"topic": "T1"})).code == 17
    ok(rs, req(216, {"topic": "T2", "clusterName": "other"}))  # not in that cluster: kept
    assert svc.table.route("T2") is not None


def test_register_topic(rs, svc):
    ok(rs, vector_register())
    body = INLINE["TopicRouteData plain encode()"].encode()  # legacy JSON: unquoted keys
    ok(rs, req(217, {"topic": "NewTopic"}, body))
    [queue] = svc.table.route("NewTopic").queues
    assert (queue.broker_name, queue.read_queues, queue.perm) == ("broker-a", 4, 6)


def test_register_topic_unknown_broker_applies_nothing(rs, svc):
    ok(rs, vector_register())
    before = observable(svc)
    body = json.dumps({"queueDatas": [
        {"brokerName": "broker-a", "perm": 6, "readQueueNums": 4, "writeQueueNums": 4,
         "topicSysFlag": 0},
        {"brokerName": "ghost", "perm": 6, "readQueueNums": 4, "writeQueueNums": 4,
         "topicSysFlag": 0}]}).encode()
    reply = call(rs, req(217, {"topic": "NewTopic"}, body))
    assert reply.code == 1 and "ghost" in reply.remark
    assert observable(svc) == before


def test_update_namesrv_config_refused(rs):
    reply = call(rs, req(318, None, b"a=b\n"))
    assert reply.code == 16 and "configuration" in reply.remark


def test_get_namesrv_config(rs):
    assert ok(rs, req(319)).body == b"router=tcp://127.0.0.1:9876\nremoting=x\n"


def test_kv_list_of_an_emptied_namespace_is_an_empty_table_as_java(rs):
    assert call(rs, req(219, {"namespace": "ns"})).code == 22  # never used
    ok(rs, req(102, {"namespace": "ns", "key": "k"}))  # deleting nothing creates nothing
    assert call(rs, req(219, {"namespace": "ns"})).code == 22
    ok(rs, req(100, {"namespace": "ns", "key": "k", "value": "v"}))
    ok(rs, req(102, {"namespace": "ns", "key": "k"}))
    reply = ok(rs, req(219, {"namespace": "ns"}))
    assert reply.body == b'{"table":{}}' and reply.remark is None
    ok(rs, req(100, {"namespace": "ns", "key": "k2", "value": "v"}))
    assert ok(rs, req(219, {"namespace": "ns"})).body == b'{"table":{"k2":"v"}}'
    # The REGISTER_BROKER reply's ORDER_TOPIC_CONFIG table: none while never used, {} once emptied.
    assert ok(rs, register_cmd()).body == b""
    ok(rs, req(100, {"namespace": ORDER_TOPIC_CONFIG, "key": "TopicTest", "value": "broker-a:4"}))
    ok(rs, req(102, {"namespace": ORDER_TOPIC_CONFIG, "key": "TopicTest"}))
    assert ok(rs, register_cmd(counter=5)).body == b'{"table":{}}'


def test_broker_member_group(rs):
    ok(rs, vector_register())
    reply = ok(rs, req(901, {"clusterName": "DefaultCluster", "brokerName": "broker-a"}))
    assert reply.body.decode() == INLINE["GetBrokerMemberGroupResponseBody"]
    empty = ok(rs, req(901, {"clusterName": "DefaultCluster", "brokerName": "nobody"}))
    assert json.loads(empty.body)["brokerMemberGroup"]["brokerAddrs"] == {}
    # As the Java NameServer (5.3.3): code 0 with the remark its fresh reply starts with.
    assert reply.remark == empty.remark == "not set any response code"
    assert reply.ext_fields is None


def test_broker_heartbeat(rs, svc):
    ok(rs, vector_register(), now=1000)
    ext = {"clusterName": "DefaultCluster", "brokerAddr": MASTER, "brokerName": "broker-a"}
    reply = ok(rs, req(904, ext), now=5000)  # without brokerId
    assert reply.ext_fields is None
    assert svc.table.liveness("DefaultCluster", MASTER).last_heartbeat == 5000
    # one-way, as brokers send it: refreshed, nothing answered
    reply, _ = rs.handle(req(904, ext, flag=FLAG_ONEWAY), LOCAL, 7000)
    assert reply is None
    assert svc.table.liveness("DefaultCluster", MASTER).last_heartbeat == 7000


def test_unknown_code(rs):
    reply = call(rs, req(34, opaque=3))
    assert (reply.code, reply.remark) == (3, " request type 34 not supported")
    assert call(rs, req(9999)).remark == " request type 9999 not supported"


def test_oneway_request_is_never_answered(rs, svc):
    for cmd in (req(34), req(101, {}), req(103, {"brokerName": "x"}), req(318)):
        cmd.flag = FLAG_ONEWAY
        assert rs.handle(cmd, LOCAL, 1000) == (None, [])


def test_response_is_ignored(rs, svc):
    before = observable(svc)
    cmd = vector_register()
    cmd.flag = FLAG_RESPONSE
    assert rs.handle(cmd, LOCAL, 1000) == (None, [])
    assert observable(svc) == before


def test_missing_or_bad_ext_fields_are_system_errors(rs, svc):
    before = observable(svc)
    cmd = vector_register()
    del cmd.ext_fields["brokerAddr"]
    reply = call(rs, cmd)
    assert reply.code == 1 and "brokerAddr" in reply.remark
    cmd = vector_register()
    cmd.ext_fields["brokerId"] = "zero"
    reply = call(rs, cmd)
    assert reply.code == 1 and "brokerId" in reply.remark
    reply = call(rs, req(104, {"brokerName": "broker-a"}))  # reads answer as Java instead (below)
    assert reply.code == 1 and "clusterName" in reply.remark
    assert observable(svc) == before


# --- ZNS/1 parity ----------------------------------------------------------------------------


def test_registration_is_the_zns1_register_broker(svc):
    rs = RemotingService(svc)
    other = new_service()
    revision = svc.table.revision
    reply, frames = rs.handle(vector_register(), LOCAL, 1000)
    assert reply.code == 0
    zns1_frames = other.respond(encode({
        "op": "register_broker", "id": 1, "cluster": "DefaultCluster",
        "broker_name": "broker-a", "broker_id": 0, "broker_addr": MASTER,
        "ha_addr": "127.0.0.1:10912", "incremental": True,
        "data_version": {"state": 0, "timestamp": 1700000000000, "counter": 3},
        "topics": {"TopicTest": {"read_queues": 4, "write_queues": 4, "perm": 6}},
    }), 1000).events
    assert list(frames) == list(zns1_frames)  # the same events, byte for byte
    events = decode_events(frames)
    assert {type(e).__name__ for e in events} == {"BrokerEvent", "RouteEvent"}
    assert [e.change for e in events if isinstance(e, schema.BrokerEvent)] == ["registered"]
    assert {e.revision for e in events} == {revision + 1} == {svc.table.revision}
    assert zns1_map(svc, "snapshot")["routes"] == zns1_map(other, "snapshot")["routes"]
    assert zns1_map(svc, "get_cluster_info")["brokers"] == {"broker-a": {
        "cluster": "DefaultCluster", "broker_name": "broker-a", "addrs": {0: MASTER},
        "zone": ""}}
    route = zns1_map(svc, "get_route", topic="TopicTest")["route"]
    assert route["queues"] == [{"broker_name": "broker-a", "read_queues": 4, "write_queues": 4,
                                "perm": 6, "sys_flag": 0}]


def test_compressed_body_registers_the_same_topics(svc):
    rs = RemotingService(svc)
    cmd = vector_register()
    cmd.body = bytes.fromhex(INLINE["RegisterBrokerBody compressed hex"])
    cmd.ext_fields.update(compressed="true", bodyCrc32=str(body_crc32(cmd.body)))
    ok(rs, cmd)
    plain = new_service()
    ok(RemotingService(plain), vector_register())
    assert zns1_map(svc, "snapshot")["routes"] == zns1_map(plain, "snapshot")["routes"]
    assert svc.table.route("TopicTest").queues[0].read_queues == 4


@pytest.mark.parametrize("cut", [1, 4, 5, 20])
def test_truncated_compressed_body_applies_nothing(rs, svc, cut):
    before = observable(svc)
    cmd = vector_register()
    cmd.body = bytes.fromhex(INLINE["RegisterBrokerBody compressed hex"])[:-cut]
    cmd.ext_fields.update(compressed="true", bodyCrc32="0")
    reply = call(rs, cmd)
    assert reply.code == 1 and "zlib" in reply.remark, reply.remark
    assert observable(svc) == before


def test_wrong_crc_applies_nothing(rs, svc):
    before = observable(svc)
    cmd = vector_register()
    cmd.ext_fields["bodyCrc32"] = "12345"
    reply = call(rs, cmd)
    assert (reply.code, reply.remark) == (1, "crc32 not match")
    assert reply.ext_fields == {}  # Java's reply carries its empty response header (issue 33)
    assert observable(svc) == before
    cmd.ext_fields["bodyCrc32"] = "0"  # 0: not checked
    ok(rs, cmd)


@pytest.mark.parametrize("header, serves", [(None, False), ("false", True), ("true", True)])
def test_a_slave_serves_topics_only_when_it_sends_enable_acting_master(rs, header, serves):
    # Issue 33 item 1: Java takes a registration without enableActingMaster for a 4.x broker,
    # whose slaves never serve topics, even with no master registered; a 5.x broker's slave
    # with the lowest id does. A master's topics count either way.
    slave = register_cmd(1, SLAVE, {"TopicSlave": {}})
    if header is None:
        del slave.ext_fields["enableActingMaster"]
        slave.ext_fields["bodyCrc32"] = "0"
    else:
        slave.ext_fields["enableActingMaster"] = header
    ok(rs, slave)
    assert call(rs, req(105, {"topic": "TopicSlave"})).code == (0 if serves else 17)
    master = register_cmd(0, MASTER, {"TopicMaster": {}})
    del master.ext_fields["enableActingMaster"]
    ok(rs, master)
    assert call(rs, req(105, {"topic": "TopicMaster"})).code == 0


def zns1_error(svc: NameService, **fields: Any) -> str:
    reply = zns1_map(svc, "register_broker", **fields)
    assert reply["op"] == "error", reply
    return reply["message"]


@pytest.mark.parametrize("topics, zns1_topics", [
    ({"bad topic": {}}, {"bad topic": {}}),
    ({"T": {"read": 70000}}, {"T": {"read_queues": 70000}}),
])
def test_refused_values_are_system_errors_with_the_zns1_message(rs, svc, topics, zns1_topics):
    ok(rs, vector_register())
    before = observable(svc)
    reply = call(rs, register_cmd(topics=topics, counter=9))
    message = zns1_error(svc, cluster="DefaultCluster", broker_name="broker-a", broker_id=0,
                         broker_addr=MASTER, topics=zns1_topics)
    assert reply.code == 1
    assert message.split(" - at ")[0] in reply.remark, (reply.remark, message)
    assert observable(svc) == before


def test_limit_is_a_system_error_with_the_zns1_message():
    svc = new_service(Limits(max_topics=2))
    rs = RemotingService(svc)
    ok(rs, register_cmd(topics={"T1": {}}))
    before = observable(svc)
    reply = call(rs, register_cmd(topics={"T2": {}, "T3": {}}, counter=4))
    message = zns1_error(svc, cluster="DefaultCluster", broker_name="broker-a", broker_id=0,
                         broker_addr=MASTER, topics={"T2": {}, "T3": {}}, incremental=True)
    assert reply.code == 1 and message in reply.remark and "max_topics" in reply.remark
    assert observable(svc) == before


def test_conflict_is_a_system_error_with_the_zns1_message(rs, svc):
    ok(rs, register_cmd(state=5))
    before = observable(svc)
    reply = call(rs, register_cmd(addr="127.0.0.1:30911", state=1))
    message = zns1_error(svc, cluster="DefaultCluster", broker_name="broker-a", broker_id=0,
                         broker_addr="127.0.0.1:30911", data_version={"state": 1})
    assert reply.code == 1 and message in reply.remark and "held by" in reply.remark
    assert observable(svc) == before


def test_registration_is_incremental(rs, svc):
    ok(rs, register_cmd(topics={"T1": {}}, counter=1))
    ok(rs, register_cmd(topics={"T2": {}}, counter=2))  # a broker's new topic, alone
    assert svc.table.topics() == ["T1", "T2"]


def test_heartbeat_timeout_and_zone(rs, svc):
    ok(rs, register_cmd(extra={"heartbeatTimeoutMillis": "10000", "__ZONE_NAME": "z1"}))
    assert svc.table.liveness("DefaultCluster", MASTER).timeout_ms == 10000
    assert svc.table.broker_table()["broker-a"].zone == "z1"
    body = ok(rs, req(105, {"topic": "TopicTest", "__ZONE_MODE": "true", "__ZONE_NAME": "z1"},
                      version=479)).body
    # Java's zone filter (an RPC hook) encodes the filtered route again in the legacy form,
    # whatever the requester's version: unquoted broker ids, even for a 5.3.3 client.
    assert loads_lenient(body, dict)["brokerDatas"][0]["zoneName"] == "z1"
    assert b'{0:"127.0.0.1:10911"}' in body
    body = ok(rs, req(105, {"topic": "TopicTest", "__ZONE_MODE": "true", "__ZONE_NAME": "z2"},
                      version=479)).body
    assert json.loads(body)["brokerDatas"] == []
    legacy = ok(rs, req(105, {"topic": "TopicTest", "__ZONE_MODE": "true", "__ZONE_NAME": "z1"},
                        version=317)).body
    assert legacy == ok(rs, req(105, {"topic": "TopicTest", "__ZONE_MODE": "true",
                                      "__ZONE_NAME": "z1"}, version=479)).body
    blank = ok(rs, req(105, {"topic": "TopicTest", "__ZONE_MODE": "true", "__ZONE_NAME": " "},
                       version=479)).body
    assert b'"0":"127.0.0.1:10911"' in blank  # a blank zone name: no filter, the usual form
    unnamed = ok(rs, req(105, {"topic": "TopicTest", "__ZONE_MODE": "true"}, version=479)).body
    assert unnamed == blank  # no zone name at all: no filter either


# --- who may write ---------------------------------------------------------------------------

BROKER_REQUESTS = {
    103: lambda: register_cmd(),
    104: lambda: req(104, {"brokerName": "broker-a", "brokerAddr": MASTER,
                           "clusterName": "DefaultCluster", "brokerId": "0"}),
    322: lambda: req(322, {"brokerName": "broker-a", "brokerAddr": MASTER,
                           "clusterName": "DefaultCluster", "brokerId": "0"}),
    904: lambda: req(904, {"brokerName": "broker-a", "brokerAddr": MASTER,
                           "clusterName": "DefaultCluster"}),
    217: lambda: req(217, {"topic": "TopicTest"}, INLINE["TopicRouteData plain encode()"].encode()),
}
ADMIN_REQUESTS = {
    100: lambda: req(100, {"namespace": "ns", "key": "k", "value": "v"}),
    102: lambda: req(102, {"namespace": "ns", "key": "k"}),
    205: lambda: req(205, {"brokerName": "broker-a"}),
    216: lambda: req(216, {"topic": "TopicTest"}),
    327: lambda: req(327, {"brokerName": "broker-a"}),
}


@pytest.mark.parametrize("code", sorted(BROKER_REQUESTS))
def test_broker_codes_only_from_broker_networks(svc, code, caplog):
    rs = RemotingService(svc, brokers=parse_networks(["10.0.0.0/8"]))
    ok(rs, register_cmd(), Connection(9, "10.1.2.3"))
    ok(rs, req(100, {"namespace": "ns", "key": "k", "value": "v"}))
    before = observable(svc)
    for host in ("192.168.1.5", "::ffff:192.168.1.5", "::1", "not-an-address"):
        with caplog.at_level(logging.WARNING, logger="zns"):
            reply = call(rs, BROKER_REQUESTS[code](), Connection(2, host))
        assert reply.code == 16 and "--remoting-brokers" in reply.remark, (host, reply.remark)
        assert "--remoting-brokers" in caplog.text
        assert observable(svc) == before
    for host in ("10.1.2.3", "::ffff:10.1.2.3"):
        assert call(rs, BROKER_REQUESTS[code](), Connection(3, host)).code == 0


@pytest.mark.parametrize("code", sorted(ADMIN_REQUESTS))
def test_admin_codes_only_from_loopback_by_default(rs, svc, code):
    ok(rs, register_cmd())
    ok(rs, req(100, {"namespace": "ns", "key": "k", "value": "v"}))
    before = observable(svc)
    for host in ("10.1.2.3", "::ffff:10.1.2.3", "fe80::1%eth0"):
        reply = call(rs, ADMIN_REQUESTS[code](), Connection(2, host))
        assert reply.code == 16 and "--remoting-admins" in reply.remark, (host, reply.remark)
    assert observable(svc) == before
    for host in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert call(rs, ADMIN_REQUESTS[code](), Connection(3, host)).code == 0


def test_under_curve_no_unlisted_network_gets_more_than_an_unlisted_zns1_key(svc, caplog):
    # Issue 21 item 6: with CURVE on, the listener (which has no keys) defaults broker codes
    # to loopback, makes KV reads admin codes, and with --clients listed limits reads too.
    access, narrowed = remoting_access([], [], [], curve=True, clients_listed=False)
    assert narrowed == ("CURVE is on but the remoting listener has no keys: it accepts broker "
                        "requests (--remoting-brokers CIDR) from loopback only; name the "
                        "networks to allow more")
    rs = RemotingService(svc, **access)
    outside, inside = Connection(2, "10.1.2.3"), Connection(3, "127.0.0.1")
    ok(rs, req(100, {"namespace": "ns", "key": "k", "value": "v"}), inside)
    with caplog.at_level(logging.WARNING, logger="zns"):
        assert call(rs, register_cmd(), outside).code == 16
        assert call(rs, req(101, {"namespace": "ns", "key": "k"}), outside).code == 16
        assert call(rs, req(219, {"namespace": "ns"}), outside).code == 16
    assert "--remoting-brokers" in call(rs, register_cmd(), outside).remark
    assert "--remoting-admins" in call(rs, req(101, {"namespace": "ns", "key": "k"}), outside).remark
    assert ok(rs, req(101, {"namespace": "ns", "key": "k"}), inside).ext_fields == {"value": "v"}
    ok(rs, register_cmd(), inside)
    assert ok(rs, req(105, {"topic": "TopicTest"}), outside).body  # reads, as --clients any
    access, narrowed = remoting_access([], [], [], curve=True, clients_listed=True)
    assert "reads (--remoting-clients CIDR)" in narrowed
    rs = RemotingService(svc, **access)
    reply = call(rs, req(105, {"topic": "TopicTest"}), outside)
    assert reply.code == 16 and "--remoting-clients" in reply.remark
    assert call(rs, req(106), outside).code == 16
    assert ok(rs, req(105, {"topic": "TopicTest"}), inside).body


def test_named_networks_are_the_operators_say_so_and_curve_off_changes_nothing(svc):
    access, narrowed = remoting_access(["10.0.0.0/8"], ["10.1.0.0/16"], ["0.0.0.0/0"],
                                       curve=True, clients_listed=True)
    assert narrowed is None
    assert access == {"brokers": parse_networks(["10.0.0.0/8"]),
                      "admins": parse_networks(["10.1.0.0/16"]),
                      "readers": parse_networks(["0.0.0.0/0"]), "kv_reads_admin": True}
    access, narrowed = remoting_access([], [], [], curve=False, clients_listed=False)
    assert narrowed is None
    assert access == {"brokers": None, "admins": LOOPBACK_NETWORKS, "readers": None,
                      "kv_reads_admin": False}
    rs = RemotingService(svc, **access)
    ok(rs, req(100, {"namespace": "ns", "key": "k", "value": "v"}))
    assert ok(rs, req(101, {"namespace": "ns", "key": "k"}), Connection(2, "10.1.2.3"))
    assert describe_access(None, LOOPBACK_NETWORKS, None) == (
        "reads from any address (--remoting-clients), broker requests from any address "
        "(--remoting-brokers), admin requests from 127.0.0.0/8, ::1/128 (--remoting-admins)")


def test_admin_networks_replace_the_default(svc):
    rs = RemotingService(svc, admins=parse_networks(["10.0.0.0/8"]))
    assert call(rs, ADMIN_REQUESTS[100](), Connection(1, "10.9.9.9")).code == 0
    assert call(rs, ADMIN_REQUESTS[100](), Connection(1, "127.0.0.1")).code == 16


def test_reads_are_open(svc):
    rs = RemotingService(svc, brokers=parse_networks(["10.0.0.0/8"]))
    ok(rs, register_cmd(), Connection(1, "10.0.0.1"))
    stranger = Connection(2, "203.0.113.9")
    for cmd in (req(105, {"topic": "TopicTest"}), req(106), req(206), req(319), req(311),
                req(224, {"cluster": "DefaultCluster"}),
                req(901, {"clusterName": "DefaultCluster", "brokerName": "broker-a"})):
        assert call(rs, cmd, stranger).code == 0, cmd.code


def test_parse_networks():
    assert [str(n) for n in parse_networks(["10.1.2.3/8", "::1", " 192.168.0.0/16 "])] == [
        "10.0.0.0/8", "::1/128", "192.168.0.0/16"]
    with pytest.raises(ValueError, match="not a network"):
        parse_networks(["10.0.0.0/33"])


# --- disconnected ----------------------------------------------------------------------------

C1, C2 = Connection(1, "127.0.0.1"), Connection(2, "127.0.0.1")
HB_EXT = {"clusterName": "DefaultCluster", "brokerAddr": MASTER, "brokerName": "broker-a",
          "brokerId": "0"}


def removed_events(frames: list) -> list[schema.BrokerEvent]:
    return [e for e in decode_events(frames)
            if isinstance(e, schema.BrokerEvent) and e.change == "removed"]


def test_closing_the_registering_connection_removes_the_address(rs, svc):
    ok(rs, register_cmd(), C1, now=1000)
    ok(rs, register_cmd(1, SLAVE), C2, now=1000)
    assert rs.connection_closed(2) and rs.connection_closed(2) == []
    [event] = removed_events(rs.connection_closed(1))
    assert (event.broker_addr, event.reason, event.broker_id) == (MASTER, "disconnected", 0)
    assert svc.table.liveness("DefaultCluster", MASTER) is None
    assert "broker-a" not in svc.table.broker_table()
    assert call(rs, req(105, {"topic": "TopicTest"})).code == 17


@pytest.mark.parametrize("code", [904, 322])
def test_a_heartbeat_over_another_connection_never_moves_the_tie(rs, svc, code):
    # Issue 21 item 7 (a): the Java NameServer only refreshes the timestamp.
    ok(rs, register_cmd(), C1, now=1000)
    ok(rs, req(code, HB_EXT, INLINE["DataVersion"].encode() if code == 322 else b""), C2,
       now=1500)
    assert svc.table.liveness("DefaultCluster", MASTER).last_heartbeat == 1500  # refreshed
    assert rs.connection_closed(2) == []
    assert svc.table.liveness("DefaultCluster", MASTER) is not None
    [event] = removed_events(rs.connection_closed(1))
    assert event.reason == "disconnected"


def test_heard_over_zns1_since_is_still_removed_and_registered_since_is_kept(rs, svc):
    ok(rs, register_cmd(), C1, now=1000)
    assert zns1_map(svc, "heartbeat", now=1500, cluster="DefaultCluster", broker_name="broker-a",
                broker_id=0, broker_addr=MASTER)["known"] is True
    assert removed_events(rs.connection_closed(1))  # a heartbeat ties nothing
    ok(rs, register_cmd(), C1, now=3000)
    zns1_map(svc, "register_broker", now=3500, cluster="DefaultCluster", broker_name="broker-a",
         broker_id=0, broker_addr=MASTER, topics={"TopicTest": {}})
    assert rs.connection_closed(1) == []  # registered over ZNS/1 since: its own now
    assert svc.table.liveness("DefaultCluster", MASTER) is not None


def test_zns1_broker_heartbeating_over_remoting_is_not_tied_to_the_connection(rs, svc):
    zns1_map(svc, "register_broker", now=1000, cluster="DefaultCluster", broker_name="broker-a",
         broker_id=0, broker_addr=MASTER, topics={"TopicTest": {}})
    ok(rs, req(904, HB_EXT), C2, now=1500)
    assert rs.connection_closed(2) == []
    assert svc.table.liveness("DefaultCluster", MASTER) is not None


def test_a_close_removes_only_the_name_its_connection_registered_at_a_shared_address(rs, svc):
    # Issue 21 item 7 (b): broker-a over ZNS/1, broker-b over remoting, one address.
    zns1_map(svc, "register_broker", now=1000, cluster="DefaultCluster", broker_name="broker-a",
         broker_id=0, broker_addr=MASTER, topics={"TopicA": {}})
    ok(rs, register_cmd(name="broker-b", topics={"TopicB": {}}), C2, now=1500)
    [event] = removed_events(rs.connection_closed(2))
    assert (event.broker_name, event.broker_addr, event.reason) == (
        "broker-b", MASTER, "disconnected")
    assert svc.table.liveness("DefaultCluster", MASTER).names == {"broker-a"}
    assert svc.table.route("TopicA") is not None and svc.table.route("TopicB") is None


@pytest.mark.parametrize("code", [904, 322])
def test_remoting_heartbeats_never_keep_a_zns1_broker_alive(rs, svc, code):
    # Issue 21 item 7 (c): a ZNS/1 broker with a 2 s timeout that went silent.
    zns1_map(svc, "register_broker", now=1000, cluster="DefaultCluster", broker_name="broker-a",
         broker_id=0, broker_addr=MASTER, topics={"TopicA": {}}, heartbeat_timeout_ms=2000)
    body = INLINE["DataVersion"].encode() if code == 322 else b""
    for now in (1500, 2500, 3500, 4500):
        reply = ok(rs, req(code, HB_EXT, body), C2, now=now)
        if code == 322:  # not known over remoting: the broker re-registers over it
            assert reply.ext_fields["changed"] == "true"
    assert svc.table.liveness("DefaultCluster", MASTER).last_heartbeat == 1000
    [event] = [e for e in decode_events(svc.expire(5000)) if isinstance(e, schema.BrokerEvent)]
    assert (event.broker_name, event.reason) == ("broker-a", "expired")
    assert rs.connection_closed(2) == []


def test_reregistered_over_another_connection_keeps_it(rs, svc):
    ok(rs, register_cmd(), C1, now=1000)
    ok(rs, register_cmd(), C2, now=1500)
    assert rs.connection_closed(1) == []
    assert removed_events(rs.connection_closed(2))


def test_heartbeat_over_the_same_connection_still_removes(rs, svc):
    ok(rs, register_cmd(), C1, now=1000)
    ok(rs, req(904, HB_EXT), C1, now=1500)
    assert removed_events(rs.connection_closed(1))


def test_unknown_heartbeat_does_not_claim_the_address(rs, svc):
    ok(rs, register_cmd(), C1, now=1000)
    ext = dict(HB_EXT, brokerName="other")  # not a name this address registered
    ok(rs, req(904, ext), C2, now=1500)
    assert removed_events(rs.connection_closed(1))


# --- route cache -----------------------------------------------------------------------------


def test_route_cache_follows_changes(rs, svc):
    register_pair(rs)
    both = lambda: [ok(rs, req(105, {"topic": "TopicTest"}, version=v)).body for v in (317, 479)]
    assert both() == [INLINE["TopicRouteData plain encode()"].encode(),
                      INLINE["TopicRouteData standard"].encode()]
    ok(rs, req(205, {"brokerName": "broker-a"}))
    legacy, standard = both()
    assert b'"perm":4' in legacy and b'"perm":4' in standard
    assert loads_lenient(legacy, dict) == json.loads(standard)
    ok(rs, req(100, {"namespace": ORDER_TOPIC_CONFIG, "key": "TopicTest", "value": "broker-a:4"}))
    ok(rs, req(327, {"brokerName": "broker-a"}))
    assert both() == [FRAMES[ROUTE_REPLY]["body"].encode(),
                      INLINE["TopicRouteData standard w/ orderTopicConf"].encode()]
    ok(rs, req(216, {"topic": "TopicTest"}))
    assert call(rs, req(105, {"topic": "TopicTest"})).code == 17
    ok(rs, register_cmd(counter=7))  # back again
    assert both()[1] == INLINE["TopicRouteData standard w/ orderTopicConf"].encode()


@pytest.mark.parametrize("topic", ["bad topic", "T" * 128, "", "Topic/x"])
def test_route_request_for_a_malformed_topic_is_refused_before_and_after_caching(rs, topic):
    # Answers are cached per topic and the cache is consulted before the name is checked;
    # a name that fails the schema must be refused whether or not good names are cached.
    register_pair(rs)
    for _ in range(2):
        reply = call(rs, req(105, {"topic": topic}))
        assert reply.code == 1 and "topic" in reply.remark, reply
        assert ok(rs, req(105, {"topic": "TopicTest"})).body


# --- what an operator reads: refusals and log lines word for word; replies of every path ---------


@pytest.fixture
def zns_log(caplog, monkeypatch):
    """caplog for the "zns" logger, without the repeat filter a server test may have installed
    (it would drop a message another test already logged) and at a level that shows warnings."""
    monkeypatch.setattr(logging.getLogger("zns"), "filters", [])
    caplog.set_level(logging.WARNING, logger="zns")
    return caplog


def zns_messages(caplog, level: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "zns" and r.levelname == level]


def test_a_bug_is_logged_with_its_traceback_and_answered_system_error(rs, svc, monkeypatch, caplog, zns_log):
    def broken(topic: str, legacy: bool) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(svc, "route_json", broken)
    reply = call(rs, req(105, {"topic": "T"}, opaque=42))
    assert (reply.code, reply.remark, reply.body) == (1, "internal error; see the server log", b"")
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == "bug while handling remoting request 105 from 127.0.0.1"
    assert record.exc_info is not None and "boom" in caplog.text


def test_update_namesrv_config_refusal_word_for_word(rs, caplog, zns_log):
    reply = call(rs, req(318, None, b"a=b\n"))
    assert reply.remark == ("zns changes no configuration at run time: UPDATE_NAMESRV_CONFIG is refused; "
                            "use the command line or the config file")
    assert zns_messages(caplog, "WARNING") == [
        "refused UPDATE_NAMESRV_CONFIG from 127.0.0.1: zns changes no configuration at run time"]


@pytest.mark.parametrize("code, option", [(103, "--remoting-brokers"), (100, "--remoting-admins"),
                                          (106, "--remoting-clients")])
def test_a_refused_network_is_told_which_option_lists_the_networks(svc, caplog, zns_log, code, option):
    rs = RemotingService(svc, brokers=parse_networks(["10.0.0.0/8"]), admins=parse_networks(["10.0.0.0/8"]),
                         readers=parse_networks(["10.0.0.0/8"]))
    reply = call(rs, req(code, {}), Connection(2, "192.0.2.7"))
    assert (reply.code, reply.remark) == (16, f"request code {code} is not allowed from 192.0.2.7: "
                                              f"the server's {option} lists the networks that may send it")
    assert zns_messages(caplog, "WARNING") == [f"remoting request {code} from 192.0.2.7 refused: not in {option}"]


def test_a_bad_network_option_is_quoted():
    with pytest.raises(ValueError) as refused:
        parse_networks(["10.0.0.0/8", " bogus"])
    assert str(refused.value).startswith("' bogus' is not a network (CIDR like 10.0.0.0/8): ")


def test_an_empty_kv_namespace_is_query_not_found_naming_it(rs):
    reply = call(rs, req(219, {"namespace": "ns"}))  # GET_KVLIST_BY_NAMESPACE
    assert (reply.code, reply.remark) == (22, "No config item, Namespace: ns")


def test_an_ok_reply_without_a_body_has_an_empty_one(rs):
    ok(rs, register_cmd())
    reply = ok(rs, req(104, {"clusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": "0",
                             "brokerAddr": MASTER}))
    assert reply.body == b"" and reply.remark is None


def test_broker_heartbeat_without_a_broker_id_is_the_master_s(rs, svc):
    ok(rs, register_cmd())
    hb = {"clusterName": "DefaultCluster", "brokerName": "broker-a", "brokerAddr": MASTER}
    assert ok(rs, req(904, hb), now=5_000).body == b""
    assert svc.table.liveness("DefaultCluster", MASTER).last_heartbeat == 5_000
    # From an address nobody registered: answered, nothing registered.
    ok(rs, req(904, {**hb, "brokerAddr": "127.0.0.1:1"}), now=6_000)
    assert svc.table.liveness("DefaultCluster", "127.0.0.1:1") is None


def test_query_data_version_answers_the_stored_version_in_full_or_nothing(rs):
    query = {"clusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": "0", "brokerAddr": MASTER}
    unknown = ok(rs, req(322, query))
    assert (unknown.body, unknown.ext_fields) == (b"", {"changed": "true"})
    ok(rs, register_cmd(counter=7, state=5))
    known = ok(rs, req(322, query))
    assert json.loads(known.body) == {"counter": 7, "stateVersion": 5, "timestamp": 1700000000000}


def test_registration_carries_perm_filter_servers_and_the_default_heartbeat_timeout(rs, svc):
    ok(rs, register_cmd(topics={"T": {"perm": 4}}))
    [queue] = svc.table.route("T").queues
    assert queue.perm == 4
    assert svc.table.liveness("DefaultCluster", MASTER).timeout_ms == 120_000
    body = json.dumps({"filterServerList": ["127.0.0.1:7000"], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1}, "topicConfigTable": {}}}).encode()
    cmd = register_cmd(addr=SLAVE, broker_id=1)
    cmd.body = body
    cmd.ext_fields = {**cmd.ext_fields, "bodyCrc32": str(body_crc32(body)),
                      "heartbeatTimeoutMillis": "30000"}
    ok(rs, cmd)
    assert svc.table.route("T").filter_servers == {SLAVE: ["127.0.0.1:7000"]}
    assert svc.table.liveness("DefaultCluster", SLAVE).timeout_ms == 30_000


def test_register_topic_without_a_body_registers_nothing(rs, svc):
    ok(rs, vector_register())
    assert ok(rs, req(217, {"topic": "NewTopic"})).body == b""
    assert svc.table.route("NewTopic") is None


def test_a_zone_query_for_an_unknown_topic_is_topic_not_exist(rs):
    reply = call(rs, req(105, {"topic": "Nope", "__ZONE_MODE": "true", "__ZONE_NAME": "z1"}))
    assert (reply.code, reply.remark) == (17, "No topic route info in name server for the topic: Nope")


def test_refused_names_say_which_field(rs):
    reply = call(rs, req(105, {"topic": "bad topic"}))
    assert reply.code == 1 and reply.remark.startswith("topic: Expected a topic: ")
    reply = call(rs, req(104, {"clusterName": "c", "brokerName": "b/x", "brokerId": "0", "brokerAddr": MASTER}))
    assert reply.code == 1 and reply.remark.startswith("unregister_broker: Expected a name: "), reply.remark


def test_system_topics_name_the_master_address_or_none(rs):
    assert ok(rs, req(304)).body == b'{"topicList":[]}'
    ok(rs, register_cmd(1, SLAVE, ha="127.0.0.1:10922"))
    assert ok(rs, req(304)).body.startswith(b'{"brokerAddr":"127.0.0.1:10921",')  # no master: a slave
    ok(rs, register_cmd())
    assert ok(rs, req(304)).body.startswith(b'{"brokerAddr":"127.0.0.1:10911",')  # the master first


def test_routes_are_encoded_once_per_change(rs, monkeypatch):
    from zns.core.remoting import bodies

    encoded = []
    real = bodies.encode_topic_route

    def counting(route, legacy):
        encoded.append(legacy)
        return real(route, legacy)

    monkeypatch.setattr(bodies, "encode_topic_route", counting)
    ok(rs, register_cmd())
    for version in (479, 300, 479):  # standard, legacy, standard: both forms made once
        ok(rs, req(105, {"topic": "TopicTest"}, version=version))
    assert sorted(encoded) == [False, True]
    ok(rs, register_cmd(topics={"TopicTest": {"perm": 4}}, counter=4))
    ok(rs, req(105, {"topic": "TopicTest"}))
    assert encoded[2:] == [False]  # the route changed: encoded again, in the form asked for only


def test_closing_a_connection_removes_each_address_it_still_carries(rs, svc):
    ok(rs, register_cmd(), conn=LOCAL, now=1_000)
    ok(rs, register_cmd(1, SLAVE, ha="127.0.0.1:10922"), conn=LOCAL, now=1_000)
    # The master registered over ZNS/1 since: closing the connection must keep it.
    zns1_map(svc, "register_broker", now=2_000, cluster="DefaultCluster", broker_name="broker-a",
         broker_id=0, broker_addr=MASTER, topics={"TopicTest": {}},
         data_version={"counter": 3, "timestamp": 1700000000000})
    rs.connection_closed(LOCAL.conn_id)
    assert svc.table.liveness("DefaultCluster", MASTER) is not None
    assert svc.table.liveness("DefaultCluster", SLAVE) is None


def test_a_broker_heartbeat_with_a_malformed_broker_id_is_refused(rs):
    ok(rs, register_cmd())
    reply = call(rs, req(904, {"clusterName": "DefaultCluster", "brokerName": "broker-a",
                               "brokerAddr": MASTER, "brokerId": "x"}))
    assert (reply.code, reply.remark) == (1, "the custom field <brokerId> is not an integer: 'x'")


def test_forgetting_expired_connections_keeps_the_live_ones():
    # More registrations over remoting than the connection map keeps (2 * max_brokers + 1024):
    # the addresses gone since are forgotten, the live one still leaves with its connection.
    svc = new_service(Limits(max_brokers=1))
    rs = RemotingService(svc)
    for i in range(1, 1027):
        addr = f"10.0.{i // 256}.{i % 256}:10911"
        ok(rs, register_cmd(addr=addr, ha="", opaque=i), conn=Connection(i, "127.0.0.1"))
        ok(rs, req(104, {"clusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": "0",
                         "brokerAddr": addr}))
    ok(rs, register_cmd(), conn=Connection(5000, "127.0.0.1"))  # past the bound: the map is pruned
    rs.connection_closed(5000)
    assert svc.table.liveness("DefaultCluster", MASTER) is None


def test_bodies_follow_the_java_nameservers_hash_order(rs):
    # A 5.3.3 NameServer's HashMap of broker names iterates broker-d, broker-b, broker-c,
    # broker-a (tests/test_javaorder.py); mqadmin prints the first. ZNS/1 stays sorted.
    for i, name in enumerate(["broker-a", "broker-b", "broker-c", "broker-d"]):
        ok(rs, register_cmd(addr=f"127.0.0.1:{10911 + 10 * i}", name=name))
    for version in (317, 479):
        route = loads_lenient(ok(rs, req(105, {"topic": "TopicTest"}, version=version)).body, dict)
        assert [q["brokerName"] for q in route["queueDatas"]] == ["broker-d", "broker-b", "broker-c", "broker-a"]
        assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-d", "broker-b", "broker-c", "broker-a"]
    info = loads_lenient(ok(rs, req(106)).body, dict)
    assert list(info["clusterAddrTable"]["DefaultCluster"]) == ["broker-d", "broker-b", "broker-c", "broker-a"]
    zns1_route = zns1_map(rs.service, "get_route", topic="TopicTest")["route"]
    assert [q["broker_name"] for q in zns1_route["queues"]] == ["broker-a", "broker-b", "broker-c", "broker-d"]


def test_bodies_walk_each_table_with_its_own_java_bucket_count(rs):
    # RouteInfoManager's maps have 256 buckets for broker names, 64 for clusters, 2048 for
    # topics: these pairs iterate the other way round in a map of the default 16.
    ok(rs, register_cmd(addr="127.0.0.1:10911", name="broker-0", cluster="cluster-0",
                        topics={"Topic10": {}, "Topic8": {}}))
    ok(rs, register_cmd(addr="127.0.0.1:10921", name="broker-4", cluster="cluster-3", topics={}))
    info = loads_lenient(ok(rs, req(106)).body, dict)
    assert list(info["brokerAddrTable"]) == ["broker-0", "broker-4"]
    assert list(info["clusterAddrTable"]) == ["cluster-3", "cluster-0"]
    assert topic_list(ok(rs, req(304)))["brokerAddr"] == "127.0.0.1:10911"  # broker-0's
    assert topic_list(ok(rs, req(206)))["topicList"] == ["Topic8", "Topic10"]


def test_flagged_topic_lists_read_the_first_name_of_the_topics_hashmap(rs):
    # A topic's QueueData HashMap iterates broker-b before broker-a: its flags decide.
    ok(rs, register_cmd(topics={"U": {"sys_flag": 0}, "V": {"sys_flag": 1}}))
    ok(rs, register_cmd(addr="127.0.0.1:10931", name="broker-b",
                        topics={"U": {"sys_flag": 1}, "V": {"sys_flag": 0}}))
    assert topic_list(ok(rs, req(311)))["topicList"] == ["U"]


@pytest.mark.parametrize("ext", [None, {}])
def test_reads_missing_their_ext_fields_answer_as_java(rs, ext):
    # What a 5.3.3 NameServer answers (the differential suite compares them too): a route
    # of a null topic does not exist; a null cluster has no topics; null KV keys find nothing.
    reply = call(rs, req(105, ext))
    assert (reply.code, reply.remark) == (17, "No topic route info in name server for the topic: null")
    assert ok(rs, req(224, ext)).body == b'{"topicList":[]}'
    reply = call(rs, req(101, ext))
    assert (reply.code, reply.remark, reply.ext_fields) == (
        22, "No config item, Namespace: null Key: null", {})
    reply = call(rs, req(101, {"namespace": "ns"}))
    assert (reply.code, reply.remark) == (22, "No config item, Namespace: ns Key: null")
    reply = call(rs, req(219, ext))
    assert (reply.code, reply.remark) == (22, "No config item, Namespace: null")
    reply = ok(rs, req(901, ext))
    assert (reply.remark, reply.body) == ("not set any response code", b'{"brokerMemberGroup":{"brokerAddrs":{}}}')
    # Writes missing a field stay refused with the field named (Java does nothing and answers
    # 0, or fails with a NullPointerException's text).
    for code in (100, 102, 103, 104, 205, 216, 322):
        reply = call(rs, req(code, ext))
        assert reply.code == 1 and reply.remark.startswith("the custom field <"), (code, reply)


def test_the_cost_of_a_close_does_not_grow_with_the_addresses_registered(svc):
    # Issue 21 item 8: every close scanned every remoting-registered address (3,000 closes
    # with 10,000 addresses: 0.5 ms each against 0.05 ms with 10). A ratio of two costs
    # measured alike in one process, far from the quadratic one (over 100x here).
    import gc
    import time

    def cost_per_close(addresses: int) -> float:
        rs = RemotingService(new_service(), properties={})
        for i in range(addresses):
            ok(rs, register_cmd(addr=f"10.{i // 62500}.{i // 250 % 250}.{i % 250}:10911",
                                name=f"b{i}", topics={f"T{i}": {}}),
               Connection(100 + i, "127.0.0.1"), now=1000)
        best = float("inf")
        for _ in range(3):  # this thread's CPU time: wall time counts other processes too
            gc.disable()  # a full collection would land in one measurement, not the other
            try:
                started = time.thread_time()
                for conn_id in range(10**6, 10**6 + 2000):  # connections that registered nothing
                    rs.connection_closed(conn_id)
                best = min(best, (time.thread_time() - started) / 2000)
            finally:
                gc.enable()
        return best

    few, many = cost_per_close(10), cost_per_close(3000)
    assert many < 5 * few + 2e-6, f"{few * 1e6:.2f} us with 10 addresses, {many * 1e6:.2f} with 3000"


def test_topic_lists_are_encoded_once_per_table_revision(rs, monkeypatch):
    from zns.core.remoting import handler as remoting_handler

    encoded = []
    real = remoting_handler.encode_topic_list
    monkeypatch.setattr(remoting_handler, "encode_topic_list",
                        lambda topics, *a: encoded.append(list(topics)) or real(topics, *a))
    ok(rs, register_cmd())
    first = ok(rs, req(206)).body
    assert ok(rs, req(206)).body == first and len(encoded) == 1  # the same revision: reused
    ok(rs, register_cmd(topics={"TopicTest": {}, "Another": {}}, counter=4))
    assert b"Another" in ok(rs, req(206)).body and len(encoded) == 2  # a change: encoded anew


def test_connections_that_close_together_are_removed_in_one_step(rs, svc):
    # Issue 21 item 8: one close at a time rebuilt a route its N brokers share N times
    # (2,000 brokers on 10 topics: N² work, 55 s). Together: one revision, each route once.
    shared = {"S1": {}, "S2": {}, "S3": {}}
    for i in range(50):
        ok(rs, register_cmd(addr=f"10.0.1.{i}:10911", name=f"b{i}", topics=shared),
           Connection(100 + i, "127.0.0.1"), now=1000)
    before = svc.revision
    events = decode_events(rs.connections_closed(range(100, 150)))
    assert svc.revision == before + 1
    assert sorted(e.topic for e in events if isinstance(e, schema.RouteEvent)) == ["S1", "S2", "S3"]
    assert sum(isinstance(e, schema.BrokerEvent) and e.reason == "disconnected"
               for e in events) == 50
    assert svc.table.broker_count() == 0
    svc.table.check_invariants()


def test_zone_route_filter_servers_in_the_order_javas_zone_filter_writes(rs):
    # Found by the differential suite (seed 1285): Java's zone filter parses the reply it made
    # -- for a 4.9.4+ requester the standard form, maps sorted -- into a HashMap and encodes it
    # again. These names and addresses gave the Java NameServer 5.3.3 this order.
    from differential import Slot, register_request
    topics = {"s1285xT1": {"read": 4, "write": 4, "perm": 6, "sys_flag": 0},
              "s1285xT2": {"read": 4, "write": 4, "perm": 6, "sys_flag": 0}}
    for name, broker_id, addr, cluster, zone in (
            ("s1285xbC", 1, "127.1.36.6:10911", "s1285xc2", ""),
            ("s1285xbB", 0, "127.1.36.3:10911", "s1285xc1", "s1285xz1"),
            ("s1285xbB", 1, "127.1.36.4:10911", "s1285xc1", "s1285xz1")):
        slot = Slot(name, broker_id, addr, cluster, counter=1, timestamp=1)
        ok(rs, register_request(slot, topics, cluster, zone, ["127.0.0.1:40001"], 479))
    zone = {"topic": "s1285xT1", "__ZONE_MODE": "true", "__ZONE_NAME": "s1285xz1"}
    standard = loads_lenient(ok(rs, req(105, zone, version=479)).body, dict)
    assert list(standard["filterServerTable"]) == ["127.1.36.4:10911", "127.1.36.3:10911", "127.1.36.6:10911"]
    assert [b["brokerName"] for b in standard["brokerDatas"]] == ["s1285xbC", "s1285xbB"]


def test_an_unregistration_is_applied_before_its_reply(rs):
    # Java 5.x applies it later on a thread of its own (docs/protocol.md §15); zns at once, so
    # an unregistration that finds nothing can never remove a registration made after it.
    unregister = {"brokerName": "broker-a", "brokerAddr": MASTER, "clusterName": "DefaultCluster",
                  "brokerId": "0"}
    ok(rs, req(104, unregister))  # nothing to remove
    ok(rs, register_cmd())
    query = req(322, unregister, b'{"counter":3,"stateVersion":0,"timestamp":1700000000000}')
    assert ok(rs, query).ext_fields == {"changed": "false"}
    ok(rs, req(104, unregister))
    assert b"broker-a" not in ok(rs, req(106)).body


def test_curve_narrowing_both_defaults_says_both_in_one_line():
    _, narrowed = remoting_access([], [], [], curve=True, clients_listed=True)
    assert narrowed == ("CURVE is on but the remoting listener has no keys: it accepts broker "
                        "requests (--remoting-brokers CIDR) and reads (--remoting-clients CIDR) "
                        "from loopback only; name the networks to allow more")


def test_describe_access_names_each_option_and_its_networks():
    assert describe_access(None, (), parse_networks(["10.0.0.0/8", "::1"])) == (
        "reads from 10.0.0.0/8, ::1/128 (--remoting-clients), broker requests from any address "
        "(--remoting-brokers), admin requests from nowhere (--remoting-admins)")
    assert describe_access(parse_networks(["10.1.0.0/16"]), parse_networks(["127.0.0.1"]),
                           None) == (
        "reads from any address (--remoting-clients), broker requests from 10.1.0.0/16 "
        "(--remoting-brokers), admin requests from 127.0.0.1/32 (--remoting-admins)")


def test_each_request_is_counted_once_by_its_code_and_its_reply_code(rs, svc):
    ok(rs, req(106))
    ok(rs, req(106))
    unknown = call(rs, req(9999))
    missing = call(rs, req(105, {"topic": "Nowhere"}))
    assert dict(svc.remoting_counts) == {(106, 0): 2, (-1, unknown.code): 1, (105, missing.code): 1}


def test_emptied_namespaces_are_remembered_up_to_the_namespace_bound_latest_kept():
    rs = RemotingService(new_service(Limits(max_kv_namespaces=2)))

    def empty(namespace: str) -> None:
        ok(rs, req(100, {"namespace": namespace, "key": "k", "value": "v"}))
        ok(rs, req(102, {"namespace": namespace, "key": "k"}))

    def remembered() -> set[str]:
        return {ns for ns in ("a", "b", "c") if call(rs, req(219, {"namespace": ns})).code == 0}

    empty("a")
    empty("b")
    assert remembered() == {"a", "b"}
    empty("a")  # emptied again: now the latest
    empty("c")  # one over the bound: the oldest, b, is forgotten
    assert remembered() == {"a", "c"}


def test_the_topic_list_asked_first_at_revision_1_is_the_tables(svc, rs):
    ok(rs, register_cmd())
    assert svc.revision == 1
    assert b"TopicTest" in ok(rs, req(206)).body


def test_deleting_nothing_remembers_no_emptied_namespace_whatever_other_namespaces_hold(rs):
    ok(rs, req(100, {"namespace": "other", "key": "k", "value": "v"}))
    ok(rs, req(102, {"namespace": "ns", "key": "k"}))  # ns never held anything
    assert call(rs, req(219, {"namespace": "ns"})).code == 22


def test_by_default_kv_reads_come_from_anywhere_and_order_conf_is_off(svc):
    rs = RemotingService(svc)
    assert (rs.route_json.order_conf, svc.encoded.json_encoder.order_conf) == (False, False)
    anywhere = Connection(2, "10.1.2.3")
    assert call(rs, req(101, {"namespace": "ns", "key": "k"}), anywhere).code == 22  # not 16
    assert RemotingService(svc, order_message_enable=True).route_json.order_conf is True


def test_register_bodies_are_bounded_by_the_services_limits():
    svc = new_service(Limits(max_topics_per_request=1, max_brokers=1))
    rs = RemotingService(svc)
    body = json.dumps({"filterServerList": ["f"] * 20_000, "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 1},
        "topicConfigTable": {}}}).encode()
    cmd = register_cmd()
    cmd = req(103, {**cmd.ext_fields, "bodyCrc32": str(body_crc32(body))}, body)
    reply = call(rs, cmd)
    assert reply.code != 0 and "a body of 1 topics may hold" in reply.remark
    route_body = json.dumps({"queueDatas": [], "brokerDatas": [], "x": [1] * 2_000}).encode()
    reply = call(rs, req(217, {"topic": "T"}, route_body))
    assert reply.code != 0 and "a route of 1 broker names may hold" in reply.remark


def test_a_route_read_after_a_state_load_is_encoded_by_the_listener_s_json_encoder():
    """A worker's replica loads a state transfer (NameService.load_state) while its remoting
    listener serves: the route cache made afresh for the loaded table keeps the listener's
    JSON encoder and its bound (before: GET_ROUTEINFO_BY_TOPIC answered "internal error")."""
    replica = new_service()
    rs = RemotingService(replica, order_message_enable=True)
    replica.encoded.max_json_bytes = 12_345
    primary = new_service()
    primary_rs = RemotingService(primary, order_message_enable=True)
    register_pair(primary_rs)
    replica.load_state(primary.state.dump(), KvStore(None))
    route = req(105, {"topic": "TopicTest"})
    assert ok(rs, route).body == ok(primary_rs, route).body != b""
    assert replica.encoded.json_encoder is rs.route_json
    assert replica.encoded.max_json_bytes == 12_345

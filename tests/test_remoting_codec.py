"""The remoting codec against the golden vectors of RocketMQ 5.3.3 + fastjson 1.2.83, and its edges."""

from __future__ import annotations

import json
import struct
import tracemalloc
import zlib
from pathlib import Path

import msgspec
import pytest

from zns.core import remoting as rm
from zns.core.remoting import (
    BrokerData,
    FrameDecoder,
    QueueData,
    RemotingBodyError,
    RemotingCommand,
    RemotingFrameError,
    TopicRouteData,
)

VECTORS = Path(__file__).parent / "data" / "remoting-vectors.txt"


def _load_vectors() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Sections with frames (title -> {frame, header, body}) and one-line values (title -> text)."""
    frames: dict[str, dict[str, str]] = {}
    inline: dict[str, str] = {}
    current: dict[str, str] | None = None
    for line in VECTORS.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            title = line[4:]
            if ": " in title and not title.endswith(")"):
                name, _, value = title.partition(": ")
                inline[name] = value
                current = None
                if name.startswith("RegisterBrokerBody compressed hex") or name.startswith("crc32"):
                    pass
                continue
            current = frames.setdefault(title, {})
        elif current is not None and line.startswith("frame hex: "):
            current["frame"] = line[len("frame hex: "):]
        elif current is not None and line.startswith("header json: "):
            current["header"] = line[len("header json: "):]
        elif current is not None and line.startswith("body: "):
            current["body"] = line[len("body: "):]
    return frames, inline


FRAMES, INLINE = _load_vectors()


def frame(title: str) -> bytes:
    return bytes.fromhex(FRAMES[title]["frame"])


def test_vectors_file_parsed():
    assert len(FRAMES) == 7, sorted(FRAMES)
    assert "TopicRouteData plain encode()" in INLINE
    assert "RegisterBrokerBody compressed hex" in INLINE


# --- frames and headers ------------------------------------------------------------


@pytest.mark.parametrize("title", sorted(FRAMES))
def test_every_vector_frame_decodes_and_reencodes_byte_exactly(title):
    data = frame(title)
    [cmd] = FrameDecoder().feed(data)
    info = FRAMES[title]
    if "header" in info:
        h = json.loads(info["header"])
        assert cmd.code == h["code"] and cmd.opaque == h["opaque"] and cmd.flag == h["flag"]
        assert cmd.version == h["version"] and cmd.language == h["language"]
        assert cmd.remark == h.get("remark")
        assert cmd.ext_fields == h.get("extFields")
        assert list((cmd.ext_fields or {}).keys()) == list(h.get("extFields", {}).keys())
    if "body" in info:
        assert cmd.body == info["body"].encode()
    # Responses (and requests, whose ext order is Java's HashMap order) re-encode exactly.
    assert rm.encode_command(cmd, cmd.serialize_type) == data


def test_json_request_fields():
    [cmd] = FrameDecoder().feed(frame("GET_ROUTEINFO_BY_TOPIC request JSON"))
    assert cmd == RemotingCommand(code=105, language="JAVA", version=479, opaque=7, flag=0,
                                  ext_fields={"topic": "TopicTest"}, serialize_type=0)
    assert not cmd.is_response and not cmd.is_oneway


def test_rocketmq_request_decodes_like_the_json_one():
    [cmd] = FrameDecoder().feed(frame("GET_ROUTEINFO_BY_TOPIC request ROCKETMQ"))
    assert cmd.serialize_type == rm.SERIALIZE_ROCKETMQ
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields) == (
        105, "JAVA", 479, 7, 0, None, {"topic": "TopicTest"})
    assert rm.encode_command(cmd, rm.SERIALIZE_ROCKETMQ) == frame("GET_ROUTEINFO_BY_TOPIC request ROCKETMQ")


def test_oneway_request_has_no_ext_fields():
    [cmd] = FrameDecoder().feed(frame("oneway request (no header)"))
    assert cmd.is_oneway and cmd.ext_fields is None and cmd.code == 904


def test_responses_built_like_java_match_vectors():
    req = RemotingCommand(code=105, opaque=7, version=479)
    route = rm.encode_topic_route(_vector_route(order_conf="broker-a:4"), legacy=True)
    ok = req.make_response(0, body=route)
    assert rm.encode_command(ok) == frame("GET_ROUTEINFO_BY_TOPIC response JSON (version sysprop 479)")
    miss = RemotingCommand(code=105, opaque=8).make_response(17, "No topic route info in name server for the topic: X")
    assert rm.encode_command(miss) == frame("TOPIC_NOT_EXIST response")
    # A reply built from a response header class with every field null: "extFields":{}.
    reg = RemotingCommand(code=103, opaque=11).make_response(0, ext_fields={})
    assert rm.encode_command(reg) == frame("REGISTER_BROKER response (null haServerAddr/masterAddr, no body)")
    qdv = RemotingCommand(code=322, opaque=5).make_response(0, ext_fields={"changed": "false"})
    assert rm.encode_json_header(qdv) == INLINE["QUERY_DATA_VERSION response header"].encode()
    kv = RemotingCommand(code=101, opaque=6).make_response(0, ext_fields={"value": "v1"})
    assert rm.encode_json_header(kv) == INLINE["GET_KV_CONFIG response header"].encode()


def test_ext_fields_written_in_java_hashmap_order():
    # Field declaration order of RegisterBrokerRequestHeader, as Java inserts them.
    ext = {"brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911", "clusterName": "DefaultCluster",
           "haServerAddr": "127.0.0.1:10912", "brokerId": "0", "enableActingMaster": "false",
           "compressed": "false", "bodyCrc32": "700810413"}
    cmd = RemotingCommand(code=103, version=479, opaque=11, ext_fields=ext)
    expected = FRAMES["REGISTER_BROKER request"]["header"].encode()
    assert rm.encode_json_header(cmd) == expected
    assert rm.java_hashmap_order(["a"] * 0) == []
    many = [f"k{i}" for i in range(40)]  # past two resizes: still a permutation
    assert sorted(rm.java_hashmap_order(many)) == sorted(many)


@pytest.mark.parametrize("stype", [rm.SERIALIZE_JSON, rm.SERIALIZE_ROCKETMQ])
@pytest.mark.parametrize("cmd", [
    RemotingCommand(code=103, language="GO", version=317, opaque=-5, flag=3, remark="bé/\"x\"\n\u2028",
                    ext_fields={"a": "1", "é": "ü/\\", "brokerName": "b"}, body=b"\x00\xff body"),
    RemotingCommand(code=0, language="CPP", version=0, opaque=2**31 - 1, flag=1),
    RemotingCommand(code=-1, language="NODE_JS", version=-2, opaque=-(2**31), flag=0, remark="r",
                    ext_fields={"k": "v" * 70000}),
])
def test_header_round_trip(stype, cmd):
    data = rm.encode_command(cmd, stype)
    [back] = FrameDecoder().feed(data)
    assert back.serialize_type == stype
    back.serialize_type = cmd.serialize_type
    assert back == cmd
    assert rm.encode_command(back, stype) == data


def test_json_header_coerces_ext_values_and_rejects_structures():
    hdr = b'{"code":"105","extFields":{"a":1,"b":true,"c":null,"d":"x","e":1.50},"opaque":3,"language":"KLINGON"}'
    cmd = rm.decode_json_header(hdr)
    assert cmd.code == 105 and cmd.ext_fields == {"a": "1", "b": "true", "d": "x", "e": "1.50"}
    assert cmd.language is None  # unknown language: Java reads null
    assert rm.decode_json_header(b"{}").language == "JAVA"  # Java's default
    for bad in (b'{"extFields":[1]}', b'{"extFields":"x"}', b'{"extFields":{"a":{"b":1}}}',
                b'{"extFields":{"a":[1]}}', b'[]', b'null', b'{"code":2147483648}', b'{"code":1.5', b'\xff'):
        with pytest.raises(RemotingFrameError):
            rm.decode_json_header(bad)


def test_too_many_ext_fields_is_a_frame_error():
    ext = {f"k{i}": "v" for i in range(rm.MAX_EXT_FIELDS + 1)}
    for stype in (0, 1):
        data = rm.encode_command(RemotingCommand(code=1, ext_fields=ext), stype)
        with pytest.raises(RemotingFrameError, match="ext fields"):
            FrameDecoder().feed(data)


def test_language_table():
    assert rm.LANGUAGE_CODES["JAVA"] == 0 and rm.LANGUAGE_CODES["NODE_JS"] == 13
    assert rm.LANGUAGE_NAMES[9] == "GO" and len(rm.LANGUAGE_NAMES) == 14


# --- the frame decoder ----------------------------------------------------------------


def test_one_byte_at_a_time_and_many_frames_per_chunk():
    stream = b"".join(frame(t) for t in sorted(FRAMES))
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert [c.opaque for c in got] == [c.opaque for c in FrameDecoder().feed(stream)]
    assert len(got) == len(FRAMES) and dec.buffered == 0
    dec2 = FrameDecoder()
    assert len(dec2.feed(stream * 3)) == 3 * len(FRAMES)


def test_partial_frame_waits():
    data = frame("TOPIC_NOT_EXIST response")
    dec = FrameDecoder()
    assert dec.feed(data[:10]) == [] and dec.buffered == 10
    assert [c.code for c in dec.feed(data[10:] + data[:3])] == [17]
    assert dec.buffered == 3


def test_one_byte_feeding_is_linear():
    # 200 KiB body fed a byte at a time: quadratic copying would take minutes.
    big = rm.encode_command(RemotingCommand(code=1, body=b"x" * 200_000))
    dec = FrameDecoder()
    out = []
    for i in range(len(big)):
        out += dec.feed(big[i : i + 1])
    assert len(out) == 1 and len(out[0].body) == 200_000


def test_a_frame_gets_one_buffer_of_its_exact_length_and_the_chunks_are_not_kept():
    # What the listener counts against --remoting-max-buffer-bytes is what is allocated:
    # one buffer of the announced length, made once the head is in, never grown; and the
    # chunks fed may be a reused scratch buffer (overwritten here after every feed).
    small = rm.encode_command(RemotingCommand(code=105, opaque=1, ext_fields={"topic": "T"}))
    big = rm.encode_command(RemotingCommand(code=103, opaque=2, body=b"y" * 300_000))
    made: list[int] = []

    def allocate(length: int) -> bytearray:
        made.append(length)
        return bytearray(length)

    dec = FrameDecoder(allocate=allocate)
    scratch = bytearray(4096)
    out = []
    stream = small + big + small
    for i in range(0, len(stream), 4096):
        chunk = stream[i:i + 4096]
        scratch[:len(chunk)] = chunk
        out += dec.feed(memoryview(scratch)[:len(chunk)])
        scratch[:] = b"\xee" * len(scratch)
        if i == 4096:  # the big frame began in the first chunk
            assert dec.allocated == len(big) - 4 and dec.buffered == 8192 - len(small)
    assert [(c.opaque, len(c.body)) for c in out] == [(1, 0), (2, 300_000), (1, 0)]
    assert out[1].body == b"y" * 300_000 and out[0].ext_fields == {"topic": "T"}
    # The big frame only: the small ones arrived whole within a chunk (decoded in place)
    # but for the last, split across two chunks, which got a buffer of its length too.
    assert made[0] == len(big) - 4 and set(made[1:]) <= {len(small) - 4}
    assert dec.allocated == 0 and dec.buffered == 0


def test_frame_limit_refused_from_the_length_field_alone():
    dec = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(RemotingFrameError, match="exceeds the limit"):
        dec.feed(struct.pack(">i", 997))  # 4 + 997 > 1000
    with pytest.raises(RemotingFrameError):  # dead afterwards
        dec.feed(b"")
    ok = rm.encode_command(RemotingCommand(code=1, body=b"x" * (1000 - 8 - 93)))
    assert len(ok) <= 1000
    assert len(FrameDecoder(max_frame_bytes=len(ok)).feed(ok)) == 1
    with pytest.raises(RemotingFrameError):
        FrameDecoder(max_frame_bytes=len(ok) - 1).feed(ok[:4])


@pytest.mark.parametrize("head,reason", [
    (struct.pack(">ii", 8, 5), "header length 5 exceeds the 4 bytes after it$"),
    (struct.pack(">ii", 4, 1), "header length 1 exceeds the 0 bytes after it$"),
    (struct.pack(">ii", 100, 0x7FFFFF), "header length"),          # far beyond the frame
    (struct.pack(">i", -1), "below the minimum"),                  # negative length
    (struct.pack(">i", 0), "below the minimum"),                   # zero length
    (struct.pack(">i", 3), "below the minimum"),                   # no room for the type/length word
    (struct.pack(">ii", 4, 2 << 24), "unknown serialize type 2"),
    (struct.pack(">iI", 4, 0xFF << 24), "unknown serialize type 255"),
    (struct.pack(">ii", 4, 0), "JSON header cannot be decoded"),   # empty JSON header
    (struct.pack(">ii", 4, 1 << 24), "shorter than the 21-byte"),  # empty ROCKETMQ header
])
def test_lying_frames_are_frame_errors(head, reason):
    good = frame("oneway request (no header)")
    with pytest.raises(RemotingFrameError, match=reason) as info:
        FrameDecoder().feed(good + head + b"\x00" * 100)
    assert len(info.value.commands) == 1  # the good frame before it is handed over


def test_rocketmq_header_lengths_checked():
    base = bytes.fromhex(FRAMES["GET_ROUTEINFO_BY_TOPIC request ROCKETMQ"]["frame"])[8:]
    for pos, value, fmt in [(13, 10**6, ">i"), (13, -1, ">i"), (17, 1000, ">i"), (17, -5, ">i"),
                            (21, -1, ">h"), (21, 30000, ">h"), (28, 10**6, ">i")]:
        hdr = bytearray(base)
        struct.pack_into(fmt, hdr, pos, value)
        with pytest.raises(RemotingFrameError):
            rm.decode_rocketmq_header(bytes(hdr))
    with pytest.raises(RemotingFrameError):
        rm.decode_rocketmq_header(base[:20])


# --- bodies ---------------------------------------------------------------------------------


def _vector_route(order_conf: str = "") -> TopicRouteData:
    return TopicRouteData(
        topic="TopicTest",
        queues=[QueueData(broker_name="broker-a", read_queues=4, write_queues=4, perm=6, sys_flag=0)],
        brokers=[BrokerData(cluster="DefaultCluster", broker_name="broker-a",
                            addrs={1: "127.0.0.1:10921", 0: "127.0.0.1:10911"})],
        order_conf=order_conf,
    )


def test_topic_route_both_forms():
    r = _vector_route()
    assert rm.encode_topic_route(r, legacy=True) == INLINE["TopicRouteData plain encode()"].encode()
    assert rm.encode_topic_route(r, legacy=False) == INLINE["TopicRouteData standard"].encode()
    r2 = _vector_route("broker-a:4")
    assert rm.encode_topic_route(r2, legacy=False) == INLINE["TopicRouteData standard w/ orderTopicConf"].encode()


def test_topic_route_escaping():
    r = TopicRouteData(queues=[QueueData(broker_name="bé/x")])
    assert rm.encode_topic_route(r, legacy=True) == INLINE["non-ascii plain"].encode()
    assert rm.encode_topic_route(r, legacy=False) == INLINE["non-ascii standard"].encode()
    assert b"b\\u00E9\\/x" in rm.encode_topic_route(r, legacy=False)
    assert rm.escape_standard("\U0001F600\x7f\x01\t\"\\") == '"\\uD83D\\uDE00\\u007F\\u0001\\t\\"\\\\"'
    assert rm.escape_legacy("\U0001F600\x7f\x01\x0b\t\"\\/\u2028") == '"\U0001F600\\u007F\\u0001\\u000B\\t\\"\\\\/\\u2028"'


def test_topic_route_zone_filters_and_zns_shape():
    from zns.core import schema

    route = schema.TopicRoute(
        topic="T",
        queues=[schema.QueueData(broker_name="b", read_queues=8, write_queues=8, perm=6, sys_flag=1)],
        brokers=[schema.BrokerData(cluster="c", broker_name="b", addrs={0: "h:1", 1: "h:2"}, zone="z1")],
        filter_servers={"h:1": ["f:1", "f:2"]},
        order_conf="",
    )
    legacy = rm.encode_topic_route(route, legacy=True)
    std = rm.encode_topic_route(route, legacy=False)
    assert b'{0:"h:1",1:"h:2"}' in legacy and b'"zoneName":"z1"' in legacy
    assert b'"filterServerTable":{"h:1":["f:1","f:2"]}' in std and b"orderTopicConf" not in std
    decoded = json.loads(std)
    assert decoded["brokerDatas"][0]["brokerAddrs"] == {"0": "h:1", "1": "h:2"}
    # The lenient reader reads the legacy form back into the same route.
    back = rm.decode_topic_route_data(legacy)
    assert back.brokers[0].addrs == {0: "h:1", 1: "h:2"} and back.queues[0].sys_flag == 1
    assert rm.encode_topic_route(back, legacy=True) == legacy


def test_other_bodies():
    b = BrokerData(cluster="DefaultCluster", broker_name="broker-a", addrs={0: "127.0.0.1:10911", 1: "127.0.0.1:10921"})
    assert rm.encode_cluster_info({"broker-a": b}, {"DefaultCluster": ["broker-a"]}) == INLINE["ClusterInfo"].encode()
    assert rm.encode_topic_list(["TopicTest", "DefaultCluster"]) == INLINE["TopicList"].encode()
    assert rm.encode_topic_list(["TopicTest", "DefaultCluster"], "127.0.0.1:10911") == INLINE["TopicList w/ brokerAddr"].encode()
    assert rm.encode_kv_table({"TopicTest": "broker-a:4"}) == INLINE["KVTable"].encode()
    dv = rm.DataVersion(counter=3, state_version=0, timestamp=1700000000000)
    assert rm.encode_data_version(dv) == INLINE["DataVersion"].encode()
    assert rm.decode_data_version(INLINE["DataVersion"].encode()) == dv
    assert rm.encode_broker_member_group("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"}) == \
        INLINE["GetBrokerMemberGroupResponseBody"].encode()


def test_wants_standard_json():
    assert rm.wants_standard_json(401, None) and not rm.wants_standard_json(400, None)
    assert rm.wants_standard_json(317, {"acceptStandardJsonOnly": "TRUE"})
    assert not rm.wants_standard_json(317, {"acceptStandardJsonOnly": "yes"})


# --- lenient JSON -------------------------------------------------------------------------


def test_lenient_reads_unquoted_keys_only_outside_strings():
    assert rm.loads_lenient(b'{0:"a", -3 :"b",\n12\t: "c"}', dict[int, str]) == {0: "a", -3: "b", 12: "c"}
    tricky = b'{"s":"{0:\\"x\\", 1:2}","m":{7:"{8:9}"}}'
    assert rm.loads_lenient(tricky) == {"s": '{0:"x", 1:2}', "m": {"7": "{8:9}"}}
    assert rm.quote_integer_keys(b'{"a\\\\":{1:2}}') == b'{"a\\\\":{"1":2}}'
    for bad in (b'{0:}', b'{"a":1', b'nope', b'{a:1}', b'', b'{0:"unterminated'):
        with pytest.raises(RemotingBodyError):
            rm.loads_lenient(bad)
    with pytest.raises(RemotingBodyError):  # the wrong type is not retried
        rm.loads_lenient(b'{"counter":"x"}', rm.DataVersion)


def test_lenient_deep_json_is_a_body_error():
    for deep in (b"[" * 100_000 + b"]" * 100_000, b"{0:" * 50_000 + b"1" + b"}" * 50_000,
                 b'{"topicConfigSerializeWrapper":{"topicQueueMappingDetailMap":{"t":' + b"[" * 100_000 + b"]" * 100_000 + b"}}}"):
        with pytest.raises(RemotingBodyError, match="nested too deeply|malformed"):
            rm.loads_lenient(deep)
        with pytest.raises(RemotingBodyError):
            rm.decode_register_broker_body(deep, compressed=False, version=479)


def test_lenient_is_linear_on_hostile_input():
    import time

    for hostile in (b'"\\' * 500_000, b"{" + b",1" * 500_000, b'{"a":"' + b"\\\"" * 500_000):
        t = time.perf_counter()
        with pytest.raises(RemotingBodyError):
            rm.loads_lenient(hostile)
        assert time.perf_counter() - t < 2.0


# --- REGISTER_BROKER ------------------------------------------------------------------------


def _register_request() -> RemotingCommand:
    [cmd] = FrameDecoder().feed(frame("REGISTER_BROKER request"))
    return cmd


def test_register_body_plain_and_compressed_agree():
    cmd = _register_request()
    rm.check_body_crc32(cmd.body, cmd.ext_fields)
    assert rm.body_crc32(cmd.body) == int(INLINE["crc32 masked of uncompressed"])
    assert not rm.parse_bool(cmd.ext_fields, "compressed")
    plain = rm.decode_register_broker_body(cmd.body, compressed=False, version=cmd.version)
    packed = rm.decode_register_broker_body(bytes.fromhex(INLINE["RegisterBrokerBody compressed hex"]),
                                            compressed=True, version=479)
    for b in (plain, packed):
        w = b.topic_config_serialize_wrapper
        assert w.data_version == rm.DataVersion(counter=3, state_version=0, timestamp=1700000000000)
        assert b.filter_server_list == []
        assert list(w.topic_config_table) == ["TopicTest"]
    tp, tc = plain.topic_config_serialize_wrapper.topic_config_table["TopicTest"], \
        packed.topic_config_serialize_wrapper.topic_config_table["TopicTest"]
    assert tp == tc == rm.TopicConfig(topic_name="TopicTest", read_queue_nums=4, write_queue_nums=4, perm=6,
                                       topic_filter_type="SINGLE_TAG", topic_sys_flag=0, order=False, attributes={})
    assert plain.topic_config_serialize_wrapper.mapping_data_version.timestamp == 1796086643321
    assert INLINE["TopicConfig.encode()"] == "TopicTest 4 4 6 SINGLE_TAG {}"


def _compress(dv: bytes, topics: list[bytes], filters: bytes, mappings: list[bytes] | None) -> bytes:
    def chunk(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b
    raw = chunk(dv) + struct.pack(">i", len(topics)) + b"".join(chunk(t) for t in topics) + chunk(filters)
    if mappings is not None:
        raw += struct.pack(">i", len(mappings)) + b"".join(chunk(m) for m in mappings)
    return zlib.compress(raw)


def test_register_body_compressed_details():
    dv = b'{"counter":1,"stateVersion":2,"timestamp":3}'
    body = _compress(dv, [b"A 8 8 6 MULTI_TAG {\"+k\":\"v\"}", b"B 1 2 4 SINGLE_TAG {not json}", b"C 1 1 6 SINGLE_TAG"],
                     b'["f:1"]', [b'{"topic":"A","bname":"b","currIdMap":{0:1}}'])
    r = rm.decode_register_broker_body(body, compressed=True, version=413)
    w = r.topic_config_serialize_wrapper
    assert w.data_version.state_version == 2 and r.filter_server_list == ["f:1"]
    assert w.topic_config_table["A"].attributes == {"+k": "v"} and w.topic_config_table["A"].topic_filter_type == "MULTI_TAG"
    assert w.topic_config_table["B"].attributes == {}  # unparsable attributes are ignored, as Java does
    assert w.topic_queue_mapping_info_map["A"].curr_id_map == {0: 1}
    # Before 5.0.0 there is no mapping section (trailing bytes are ignored).
    r2 = rm.decode_register_broker_body(body, compressed=True, version=412)
    assert r2.topic_config_serialize_wrapper.topic_queue_mapping_info_map == {}
    for bad_topics in ([b"A 8 8"], [b"A x 8 6 SINGLE_TAG"], [b"A 8 8 6 NO_TAG"], [b"A 99999999999 8 6 SINGLE_TAG"]):
        with pytest.raises(RemotingBodyError):
            rm.decode_register_broker_body(_compress(dv, bad_topics, b"[]", []), compressed=True, version=479)
    # Missing mapping section for a 5.x broker: ends early.
    with pytest.raises(RemotingBodyError, match="ends early"):
        rm.decode_register_broker_body(_compress(dv, [], b"[]", None), compressed=True, version=479)
    # A count larger than the bytes could hold is refused before looping.
    raw = struct.pack(">i", len(dv)) + dv + struct.pack(">i", 2**31 - 1)
    with pytest.raises(RemotingBodyError, match="exceeds"):
        rm.decode_register_broker_body(zlib.compress(raw), compressed=True, version=479)


def test_register_body_edge_forms():
    empty = rm.decode_register_broker_body(b"", compressed=False, version=479)
    assert empty.topic_config_serialize_wrapper.topic_config_table == {}
    assert empty.topic_config_serialize_wrapper.data_version == rm.DataVersion()
    wrapper = b'{"dataVersion":{"counter":5,"timestamp":9},"topicConfigTable":{"T":{"topicName":"T","perm":7}}}'
    old = rm.decode_register_broker_body(wrapper, compressed=False, version=36)
    assert old.topic_config_serialize_wrapper.topic_config_table["T"].perm == 7
    assert old.topic_config_serialize_wrapper.topic_config_table["T"].read_queue_nums == 16
    lenient = b'{"topicConfigSerializeWrapper":{"topicQueueMappingInfoMap":{"T":{"topic":"T","currIdMap":{0:3,1:4}}}}}'
    r = rm.decode_register_broker_body(lenient, compressed=False, version=479)
    assert r.topic_config_serialize_wrapper.topic_queue_mapping_info_map["T"].curr_id_map == {0: 3, 1: 4}
    for bad in (b"not json", b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"x"}}}}'):
        with pytest.raises(RemotingBodyError):
            rm.decode_register_broker_body(bad, compressed=False, version=479)


def test_bad_zlib_and_zip_bomb():
    with pytest.raises(RemotingBodyError, match="zlib"):
        rm.decode_register_broker_body(b"\x78\xda garbage", compressed=True, version=479)
    with pytest.raises(RemotingBodyError, match="truncated zlib stream"):
        rm.decode_register_broker_body(zlib.compress(b"\x00\x00")[:-3], compressed=True, version=479)
    bomb = zlib.compress(b"\x00" * (64 * 1024 * 1024), 9)  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(RemotingBodyError, match="inflates past"):
            rm.decode_register_broker_body(bomb, compressed=True, version=479, max_inflated_bytes=1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, f"inflating the bomb allocated {peak} bytes"
    with pytest.raises(RemotingBodyError, match="inflates past"):
        rm.decode_register_broker_body(bomb, compressed=True, version=479)  # default: the 16 MiB frame limit


def test_crc_mismatch():
    cmd = _register_request()
    rm.check_body_crc32(cmd.body, cmd.ext_fields)
    with pytest.raises(RemotingBodyError, match="crc32 not match"):
        rm.check_body_crc32(cmd.body + b" ", cmd.ext_fields)
    rm.check_body_crc32(b"anything", {**cmd.ext_fields, "bodyCrc32": "0"})  # 0: not checked
    rm.check_body_crc32(b"anything", None)
    with pytest.raises(RemotingBodyError, match="bodyCrc32"):
        rm.check_body_crc32(b"x", {"bodyCrc32": "12ab"})


# --- ext fields -------------------------------------------------------------------------


def test_ext_field_parsing():
    ext = {"n": "42", "neg": "-7", "plus": "+3", "big": "2147483648", "bad": "4 2", "t": "TrUe", "f": "yes"}
    assert rm.parse_int(ext, "n") == 42 and rm.parse_int(ext, "neg") == -7 and rm.parse_int(ext, "plus") == 3
    assert rm.parse_long(ext, "big") == 2**31
    with pytest.raises(RemotingBodyError, match="<big>"):
        rm.parse_int(ext, "big")
    with pytest.raises(RemotingBodyError, match="<bad>"):
        rm.parse_int(ext, "bad")
    for odd in ("", " 1", "1_0", "0x1", "١", "1.0"):
        with pytest.raises(RemotingBodyError):
            rm.parse_long({"v": odd}, "v")
    with pytest.raises(RemotingBodyError, match="the custom field <missing> is null"):
        rm.parse_int(ext, "missing")
    with pytest.raises(RemotingBodyError, match="<topic>"):
        rm.require(None, "topic")
    assert rm.parse_int(ext, "missing", required=False, default=5) == 5
    assert rm.parse_bool(ext, "t") and not rm.parse_bool(ext, "f") and not rm.parse_bool(ext, "missing")
    assert rm.optional(ext, "missing", "d") == "d" and rm.require(ext, "n") == "42"


def test_constants():
    assert rm.RequestCode.GET_ROUTEINFO_BY_TOPIC == 105 and rm.ResponseCode.TOPIC_NOT_EXIST == 17
    assert 34 not in rm.NAMESERVER_REQUEST_CODES and 904 in rm.NAMESERVER_REQUEST_CODES
    assert rm.STANDARD_JSON_MIN_VERSION == 401 and rm.MAPPING_SECTION_MIN_VERSION == 413
    assert len(rm.NAMESERVER_REQUEST_CODES) == 23


def test_error_messages_are_bounded():
    huge = "x" * 1_000_000
    with pytest.raises(RemotingBodyError) as info:
        rm.parse_int({"v": huge}, "v")
    assert len(str(info.value)) < 200
    with pytest.raises(RemotingBodyError) as info2:
        rm.decode_register_broker_body(_compress(b"{}", [b"A" * 100_000], b"[]", []), compressed=True, version=479)
    assert len(str(info2.value)) < 300
    with pytest.raises(RemotingFrameError) as info3:
        rm.decode_json_header(b'{"extFields":{"' + b"k" * 100_000 + b'":{}}}')
    assert len(str(info3.value)) < 300


@pytest.mark.parametrize("field", ["code", "version", "opaque", "flag"])
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_json_header_refuses_numbers_java_ints_cannot_hold(field, value):
    # A caller's bug, not a peer's: fastjson would read such a header back as garbage.
    cmd = RemotingCommand(**{"code": 0, field: value})
    with pytest.raises(ValueError, match=f"{field} {value} does not fit a Java int"):
        rm.encode_command(cmd)
    cmd = RemotingCommand(**{"code": 0, field: value - 1 if value > 0 else value + 1})
    assert rm.encode_command(cmd)


# --- exact bounds and messages of the framing (what a peer's log line says) -----------------


def _rmq_header(ext: bytes = b"", remark: bytes = b"", ext_len: int | None = None,
                remark_len: int | None = None) -> bytes:
    """A type-1 header around a raw ext section (lengths as given, or the true ones)."""
    return (struct.pack(">hbhiii", 105, 0, 479, 7, 0, len(remark) if remark_len is None else remark_len)
            + remark + struct.pack(">i", len(ext) if ext_len is None else ext_len) + ext)


def _entry(key: bytes, value: bytes, klen: int | None = None, vlen: int | None = None) -> bytes:
    return (struct.pack(">h", len(key) if klen is None else klen) + key
            + struct.pack(">i", len(value) if vlen is None else vlen) + value)


def test_rocketmq_header_text_is_utf8_with_bad_bytes_replaced_as_java_does():
    cmd = rm.decode_rocketmq_header(_rmq_header(_entry(b"k\xfe", b"v\xff"), remark=b"r\xff"))
    assert cmd.remark == "r\ufffd" and cmd.ext_fields == {"k\ufffd": "v\ufffd"}


def test_rocketmq_header_empty_keys_and_values_are_java_nulls():
    # The last entry (empty value) fills the ext section to its last byte.
    ext = _entry(b"", b"x") + _entry(b"b", b"1") + _entry(b"a", b"")
    assert rm.decode_rocketmq_header(_rmq_header(ext)).ext_fields == {"b": "1"}
    assert rm.decode_rocketmq_header(_rmq_header(_entry(b"a", b"") + _entry(b"", b"x"))).ext_fields is None
    assert rm.decode_rocketmq_header(_rmq_header()).ext_fields is None


@pytest.mark.parametrize("header, message", [
    (_rmq_header()[:20], "ROCKETMQ header of 20 bytes is shorter than the 21-byte minimum"),
    (_rmq_header(remark=b"abc", remark_len=4), "ROCKETMQ header remark length 4 does not fit its 24-byte header"),
    (_rmq_header(_entry(b"a", b"b"), ext_len=9), "ROCKETMQ header ext length 9 does not fit its 29-byte header"),
    (_rmq_header(b"\x00", ext_len=1), "ROCKETMQ header ext entry cut short (key length)"),
    (_rmq_header(b"\x00\x00"), "ROCKETMQ header ext key length 0 overruns the ext section"),
    (_rmq_header(_entry(b"ab", b"", klen=3)), "ROCKETMQ header ext key length 3 overruns the ext section"),
    (_rmq_header(_entry(b"a", b"x", vlen=2)), "ROCKETMQ header ext value length 2 overruns the ext section"),
])
def test_rocketmq_header_lengths_refused_word_for_word(header, message):
    with pytest.raises(RemotingFrameError) as refused:
        rm.decode_rocketmq_header(header)
    assert str(refused.value) == message


@pytest.mark.parametrize("stype", [rm.SERIALIZE_JSON, rm.SERIALIZE_ROCKETMQ])
def test_the_ext_field_bound_is_exact_and_applies_through_the_decoder(stype):
    two = rm.encode_command(RemotingCommand(code=1, ext_fields={"a": "1", "b": "2"}), stype)
    three = rm.encode_command(RemotingCommand(code=1, ext_fields={"a": "1", "b": "2", "c": "3"}), stype)
    assert FrameDecoder(max_ext_fields=2).feed(two)[0].ext_fields == {"a": "1", "b": "2"}
    assert len(FrameDecoder().feed(three)) == 1
    with pytest.raises(RemotingFrameError) as refused:
        FrameDecoder(max_ext_fields=2).feed(three)
    assert str(refused.value) == ("header has 3 ext fields, more than 2" if stype == rm.SERIALIZE_JSON
                                  else "header has more than 2 ext fields")


@pytest.mark.parametrize("header, message", [
    (b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON header nested too deeply"),
    (b'{"code":1.5}', "JSON header cannot be decoded: Expected `int`, got `float` - at `$.code`"),
    (b'{"extFields":{"k":"\xff"}}', "ext field 'k' is not valid UTF-8"),
    (b'{"extFields":{"k":{}}}', "ext field 'k' is not a string but a JSON object"),
    (b'{"extFields":{"k":[]}}', "ext field 'k' is not a string but a JSON array"),
    (b'{"extFields":{"' + b"k" * 70 + b'":[]}}',
     f"ext field '{'k' * 64}'... (70 in all) is not a string but a JSON array"),
    (b'{"extFields":{"' + b"k" * 70 + b'":"\xff"}}',
     f"ext field '{'k' * 64}'... (70 in all) is not valid UTF-8"),
])
def test_json_header_refusals_word_for_word(header, message):
    with pytest.raises(RemotingFrameError) as refused:
        rm.decode_json_header(header)
    assert str(refused.value) == message


def test_an_unknown_language_is_omitted_from_json_and_written_as_other_in_rocketmq():
    cmd = RemotingCommand(code=1, language=None)
    assert rm.encode_json_header(cmd) == b'{"code":1,"flag":0,"opaque":0,"serializeTypeCurrentRPC":"JSON","version":0}'
    for language in (None, "KLINGON"):
        data = rm.encode_rocketmq_header(RemotingCommand(code=1, language=language))
        assert data[2] == rm.LANGUAGE_CODES["OTHER"]
        assert rm.decode_rocketmq_header(data).language == "OTHER"


@pytest.mark.parametrize("field", ["code", "version"])
def test_rocketmq_header_code_and_version_are_int16(field):
    for value in (-(2**15), 2**15 - 1):
        data = rm.encode_rocketmq_header(RemotingCommand(**{"code": 0, field: value}))
        assert getattr(rm.decode_rocketmq_header(data), field) == value
    for value in (2**15, -(2**15) - 1):
        with pytest.raises(ValueError) as refused:
            rm.encode_rocketmq_header(RemotingCommand(**{"code": 0, field: value}))
        assert str(refused.value) == f"{field} {value} does not fit the int16 of a ROCKETMQ header"


@pytest.mark.parametrize("field", ["opaque", "flag"])
def test_rocketmq_header_opaque_and_flag_are_int32(field):
    with pytest.raises(ValueError) as refused:
        rm.encode_command(RemotingCommand(**{"code": 0, field: 2**31}), rm.SERIALIZE_ROCKETMQ)
    assert str(refused.value) == f"{field} 2147483648 does not fit a Java int"


def test_encode_command_bounds():
    from zns.core.remoting.command import MAX_HEADER_BYTES

    with pytest.raises(ValueError) as refused:
        rm.encode_command(RemotingCommand(code=1), 2)
    assert str(refused.value) == "unknown serialize type 2"
    overhead = len(rm.encode_json_header(RemotingCommand(code=0, remark="")))
    largest = RemotingCommand(code=0, remark="x" * (MAX_HEADER_BYTES - overhead))
    data = rm.encode_command(largest)
    assert struct.unpack_from(">i", data, 4)[0] == MAX_HEADER_BYTES  # type 0, the full 24 bits
    with pytest.raises(ValueError) as refused:
        rm.encode_command(RemotingCommand(code=0, remark="x" * (MAX_HEADER_BYTES - overhead + 1)))
    assert str(refused.value) == f"header of {MAX_HEADER_BYTES + 1} bytes does not fit the 24-bit length field"


def test_a_frame_without_its_type_word_is_refused_word_for_word():
    with pytest.raises(RemotingFrameError) as refused:
        rm.decode_frame(b"\x00\x00")
    assert str(refused.value) == "frame of 2 bytes has no header length field"


def test_the_smallest_frame_limit_is_8_bytes():
    assert FrameDecoder(max_frame_bytes=8).max_frame_bytes == 8
    with pytest.raises(ValueError) as refused:
        FrameDecoder(max_frame_bytes=7)
    assert str(refused.value) == "max_frame_bytes must allow at least the 8 bytes of an empty frame"


def test_a_failed_decoder_drops_its_bytes_and_repeats_why_it_failed():
    dec = FrameDecoder(max_frame_bytes=1000)
    assert dec.feed(b"\x00") == [] and dec.buffered == 1
    with pytest.raises(RemotingFrameError) as refused:
        dec.feed(struct.pack(">i", 997)[1:] + b"more bytes after it")
    assert dec.buffered == 0  # nothing of a broken stream is kept
    assert str(refused.value) == "frame of 1001 bytes (length field included) exceeds the limit of 1000"
    with pytest.raises(RemotingFrameError) as again:
        dec.feed(frame("oneway request (no header)"))
    assert str(again.value) == f"connection already failed: {refused.value}"


def test_a_second_frame_cut_short_waits_for_its_last_byte():
    a, b = frame("TOPIC_NOT_EXIST response"), frame("oneway request (no header)")
    dec = FrameDecoder()
    assert [c.code for c in dec.feed(a + b[:-1])] == [17]
    assert dec.buffered == len(b) - 1
    assert [c.code for c in dec.feed(b[-1:])] == [904] and dec.buffered == 0


def test_the_buffer_is_compacted_while_every_chunk_ends_inside_a_frame():
    one = rm.encode_command(RemotingCommand(code=1, body=b"x" * 10_000))
    stream = one * 600  # 6 MB, fed in chunks that each end in the middle of a frame
    half = len(one) // 2
    dec = FrameDecoder()
    tracemalloc.start()
    try:
        assert len(dec.feed(stream[:half])) == 0
        for start in range(half, len(stream) - len(one), len(one)):
            assert len(dec.feed(stream[start : start + len(one)])) == 1
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1_000_000, f"the decoder holds {held} bytes for less than one frame"


def test_a_reply_keeps_the_request_s_serialize_type():
    request = RemotingCommand(code=105, opaque=9, serialize_type=rm.SERIALIZE_ROCKETMQ)
    reply = request.make_response(0)
    assert reply.serialize_type == rm.SERIALIZE_ROCKETMQ and reply.opaque == 9 and reply.is_response


# --- fastjson details: Java's hashes and HashMap order, the escapes at their edges --------------
# The expected values below were printed by Java 17 (String.hashCode, HashMap.keySet).


@pytest.mark.parametrize("text, java_hash", [
    ("hello", 99162322),
    ("polygenelubricants", 2**31),  # Integer.MIN_VALUE, unsigned
    ("\u00e9", 233),
    ("h\u00e9llo w\u00f6rld, \u00e7a va tr\u00e8s bien", 2657159307),
    ("\U0001F600", 1772899),  # two UTF-16 units
    ("\ud800", 55296),  # a lone surrogate is one unit too
    ("a\ud800b", 1807491),
])
def test_java_string_hash_matches_java(text, java_hash):
    from zns.core.remoting.fastjson import java_string_hash

    assert java_string_hash(text) == java_hash


JAVA_HASHMAP_ORDER = {
    12: "key1,key2,key0,key5,key6,key3,key4,key9,key7,key8,key11,key10",
    13: "key1,key2,key0,key5,key6,key3,key4,key9,key7,key8,key11,key10,key12",
    25: "key1,key2,key0,key5,key6,key3,key4,key9,key7,key8,key22,key21,key20,key15,key14,key13,key12,"
        "key19,key18,key17,key16,key11,key10,key24,key23",
    49: "key1,key2,key0,key5,key6,key3,key4,key9,key40,key7,key8,key44,key43,key42,key41,key37,key36,"
        "key35,key34,key39,key38,key11,key10,key48,key47,key46,key45,key22,key21,key20,key15,key14,"
        "key13,key12,key19,key18,key17,key16,key33,key32,key31,key30,key26,key25,key24,key23,key29,"
        "key28,key27",
}


@pytest.mark.parametrize("n", sorted(JAVA_HASHMAP_ORDER))
def test_java_hashmap_order_matches_java_across_resizes(n):
    keys = [f"key{i}" for i in range(n)]
    assert ",".join(rm.java_hashmap_order(keys)) == JAVA_HASHMAP_ORDER[n]


FIELDS = ["brokerName", "brokerAddr", "clusterName", "haServerAddr", "brokerId", "enableActingMaster",
          "compressed", "bodyCrc32", "topic", "consumerGroup", "queueId", "timeout"]


@pytest.mark.parametrize("n, java_order", [
    (10, "brokerId,bodyCrc32,clusterName,brokerAddr,enableActingMaster,topic,haServerAddr,compressed,"
         "brokerName,consumerGroup"),
    (12, "queueId,brokerId,bodyCrc32,clusterName,brokerAddr,enableActingMaster,topic,haServerAddr,"
         "compressed,brokerName,consumerGroup,timeout"),
])
def test_java_hashmap_order_keeps_16_buckets_up_to_12_keys(n, java_order):
    # These keys iterate differently in 32 buckets: a table resized too early would show.
    assert ",".join(rm.java_hashmap_order(FIELDS[:n])) == java_order


def test_standard_escape_at_the_edge_of_the_basic_plane():
    assert rm.escape_standard("\uffff") == '"\\uFFFF"'
    assert rm.escape_standard("\U00010000") == '"\\uD800\\uDC00"'


def test_to_utf8_writes_a_lone_surrogate_as_a_question_mark_as_java_does():
    from zns.core.remoting.fastjson import to_utf8

    assert to_utf8("a\ud800b\u00e9") == b"a?b\xc3\xa9"


def _nested_type(depth: int):
    t = int
    for _ in range(depth):
        t = list[t]
    return t


def _nested_wrong(depth: int, wide_levels: int):
    """A value of _nested_type(depth) but for one str at the bottom; the outer `wide_levels` lists hold it at index 10."""
    value = "x"
    for level in range(depth):
        value = [[]] * 10 + [value] if level >= depth - wide_levels else [value]
    return value


@pytest.mark.parametrize("wide_levels, length", [(0, 199), (1, 200), (2, 201), (20, 219)])
def test_body_error_reasons_are_cut_after_200_characters(wide_levels, length):
    data = json.dumps(_nested_wrong(55, wide_levels)).encode()
    with pytest.raises(RemotingBodyError) as refused:
        rm.loads_lenient(data, _nested_type(55))
    reason = str(refused.value).removeprefix("body: ")
    full = "Expected `int`, got `str` - at `$" + "[10]" * wide_levels + "[0]" * (55 - wide_levels) + "`"
    assert len(full) == length
    assert reason == (full if length <= 200 else full[:200] + "...")


@pytest.mark.parametrize("data, message", [
    (b'{"counter":"x"}', "DataVersion body: Expected `int`, got `str` - at `$.counter`"),
    (b'{"counter":1', "DataVersion body: Input data was truncated"),  # nothing to rewrite
    (b'{0:1', "DataVersion body: Input data was truncated"),  # rewritten, still broken
    (b'{0:"x"}', "DataVersion body: Expected `int`, got `str` - at `$[...]`"),  # rewritten, wrong type
])
def test_lenient_decoding_names_what_and_why(data, message):
    with pytest.raises(RemotingBodyError) as refused:
        rm.loads_lenient(data, dict[str, int] if data.startswith(b"{0") else rm.DataVersion,
                         what="DataVersion body")
    assert str(refused.value) == message


# --- bodies with more than one of everything: separators, Java's sort orders ----------------

# U+1F600 sorts before U+FF01 in Java (UTF-16 units: D83D < FF01), after it by code point.
EMOJI, FULLWIDTH = "\U0001F600", "\uff01"


def _two_broker_route() -> TopicRouteData:
    return TopicRouteData(
        queues=[QueueData(broker_name="b1", read_queues=1, write_queues=2, perm=6, sys_flag=0),
                QueueData(broker_name="b2", read_queues=3, write_queues=4, perm=4, sys_flag=0)],
        brokers=[BrokerData(broker_name="b1", cluster="c", addrs={1: "h:2", 0: "h:1"}, enable_acting_master=True),
                 BrokerData(broker_name="b2", cluster="c", addrs={0: "h:3"}, zone="z")],
        filter_servers={"h:9": ["f0"], FULLWIDTH: ["f1", "f2"], EMOJI: ["f3"]},
    )


def test_a_route_with_two_of_everything_in_both_forms():
    brokers = ('{{"brokerAddrs":{{{a0}:"h:1",{a1}:"h:2"}},"brokerName":"b1","cluster":"c","enableActingMaster":true}},'
               '{{"brokerAddrs":{{{a0}:"h:3"}},"brokerName":"b2","cluster":"c","enableActingMaster":false,"zoneName":"z"}}')
    queues = ('{"brokerName":"b1","perm":6,"readQueueNums":1,"topicSysFlag":0,"writeQueueNums":2},'
              '{"brokerName":"b2","perm":4,"readQueueNums":3,"topicSysFlag":0,"writeQueueNums":4}')
    standard = ('{"brokerDatas":[' + brokers.format(a0='"0"', a1='"1"') + '],'
                '"filterServerTable":{"h:9":["f0"],"\\uD83D\\uDE00":["f3"],"\\uFF01":["f1","f2"]},'
                '"queueDatas":[' + queues + ']}')
    # The legacy form keeps the filter-server map's own order (the caller's: Java's HashMap
    # order, see javaorder); the standard form sorts it (fastjson's MapSortField).
    legacy = ('{"brokerDatas":[' + brokers.format(a0="0", a1="1") + '],'
              f'"filterServerTable":{{"h:9":["f0"],"{FULLWIDTH}":["f1","f2"],"{EMOJI}":["f3"]}},'
              '"queueDatas":[' + queues + ']}')
    assert rm.encode_topic_route(_two_broker_route(), legacy=False) == standard.encode("ascii")
    assert rm.encode_topic_route(_two_broker_route(), legacy=True) == legacy.encode("utf-8")


def test_a_legacy_route_escapes_only_what_fastjson_escapes_by_default():
    route = TopicRouteData(queues=[QueueData(broker_name='b/\u00e9"', perm=6)])
    assert rm.encode_topic_route(route, legacy=True) == (
        '{"brokerDatas":[],"filterServerTable":{},"queueDatas":[{"brokerName":"b/\u00e9\\"","perm":6,'
        '"readQueueNums":0,"topicSysFlag":0,"writeQueueNums":0}]}').encode("utf-8")


def test_cluster_info_and_kv_table_keep_the_order_given():
    # The handler passes Java's iteration order (javaorder); the encoders keep it.
    b1 = BrokerData(broker_name=FULLWIDTH, cluster="c2", addrs={0: "h:1"})
    b2 = BrokerData(broker_name=EMOJI, cluster="c1", addrs={1: "h:3", 0: "h:2"})
    body = rm.encode_cluster_info({FULLWIDTH: b1, EMOJI: b2, "a": b1},
                                  {"c2": [FULLWIDTH, "a"], "c1": [EMOJI], FULLWIDTH: [FULLWIDTH, EMOJI], EMOJI: ["a"]})
    broker = ('{{"brokerAddrs":{{{addrs}}},"brokerName":"{name}","cluster":"{cluster}",'
              '"enableActingMaster":false}}')
    one = broker.format(addrs='0:"h:1"', name=FULLWIDTH, cluster="c2")
    two = broker.format(addrs='0:"h:2",1:"h:3"', name=EMOJI, cluster="c1")  # a Long HashMap's order
    assert body == (
        f'{{"brokerAddrTable":{{"{FULLWIDTH}":{one},"{EMOJI}":{two},"a":{one}}},'
        f'"clusterAddrTable":{{"c2":["{FULLWIDTH}","a"],"c1":["{EMOJI}"],"{FULLWIDTH}":["{FULLWIDTH}","{EMOJI}"],"{EMOJI}":["a"]}}}}'
    ).encode("utf-8")
    table = {FULLWIDTH: "a", "k": "z", EMOJI: "b", "\ud800": "lone"}
    assert rm.encode_kv_table(table) == (
        f'{{"table":{{"{FULLWIDTH}":"a","k":"z","{EMOJI}":"b","?":"lone"}}}}').encode("utf-8")


def test_member_group_in_a_long_hashmaps_order():
    assert rm.encode_broker_member_group("c", "b", {1: "h:2", 0: "h:1"}) == \
        b'{"brokerMemberGroup":{"brokerAddrs":{0:"h:1",1:"h:2"},"brokerName":"b","cluster":"c"}}'
    # ids 0 and 16 share bucket 0 of 16 buckets (Long.hashCode): 16 comes before 1
    assert rm.encode_broker_member_group("c", "b", {16: "h:3", 1: "h:2", 0: "h:1"}) == \
        b'{"brokerMemberGroup":{"brokerAddrs":{0:"h:1",16:"h:3",1:"h:2"},"brokerName":"b","cluster":"c"}}'
    assert rm.encode_broker_member_group("c", "b", {17: "h:3", 2: "h:2"}) == \
        b'{"brokerMemberGroup":{"brokerAddrs":{17:"h:3",2:"h:2"},"brokerName":"b","cluster":"c"}}'


def test_body_decoders_name_the_body_in_their_errors():
    with pytest.raises(RemotingBodyError) as refused:
        rm.decode_data_version(b'{"counter":"x"}')
    assert str(refused.value) == "DataVersion body: Expected `int`, got `str` - at `$.counter`"
    with pytest.raises(RemotingBodyError) as refused:
        rm.decode_topic_route_data(b'{"queueDatas":1}')
    assert str(refused.value) == "TopicRouteData body: Expected `array`, got `int` - at `$.queueDatas`"
    with pytest.raises(RemotingBodyError) as refused:
        rm.decode_topic_route_data(b"")
    assert str(refused.value) == "REGISTER_TOPIC body is empty: a TopicRouteData is required"


# --- ext fields at their bounds, and how peer input is quoted in messages ---------------------


@pytest.mark.parametrize("parse, bits", [(rm.parse_int, 32), (rm.parse_long, 64)])
def test_integer_ext_fields_take_exactly_javas_range(parse, bits):
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    assert parse({"v": str(low)}, "v") == low and parse({"v": str(high)}, "v") == high
    for outside in (low - 1, high + 1):
        with pytest.raises(RemotingBodyError) as refused:
            parse({"v": str(outside)}, "v")
        assert str(refused.value) == f"the custom field <v> is out of range for a {bits}-bit integer: {outside}"


def test_integer_ext_fields_are_read_up_to_24_characters():
    padded = "-" + "0" * 22 + "1"  # Java's parseLong reads it as -1
    assert len(padded) == 24 and rm.parse_long({"v": padded}, "v") == -1
    with pytest.raises(RemotingBodyError) as refused:
        rm.parse_long({"v": "-" + "0" * 23 + "1"}, "v")
    assert str(refused.value) == f"the custom field <v> is not an integer: '-{'0' * 23}'... (25 in all)"
    with pytest.raises(RemotingBodyError) as refused:
        rm.parse_int({"v": "x" * 30}, "v")
    assert str(refused.value) == f"the custom field <v> is not an integer: '{'x' * 24}'... (30 in all)"


def test_required_fields_of_every_kind_refuse_absence():
    for parse in (rm.parse_long, lambda ext, name: rm.parse_bool(ext, name, required=True)):
        with pytest.raises(RemotingBodyError) as refused:
            parse({"other": "1"}, "v")
        assert str(refused.value) == "the custom field <v> is null"
    assert rm.parse_bool({"v": "TRUE"}, "v", required=True) is True




def test_a_frame_error_without_commands_has_an_empty_list():
    assert RemotingFrameError("broken").commands == []
    assert RemotingFrameError("broken", [1]).commands == [1]


# --- the compressed REGISTER_BROKER body: every refusal word for word, Java's int parsing ----------

DV = b'{"counter":1,"stateVersion":2,"timestamp":3}'


def _chunk(b: bytes, length: int | None = None) -> bytes:
    return struct.pack(">i", len(b) if length is None else length) + b


def _inflated(raw: bytes, version: int = 479) -> rm.RegisterBrokerBody:
    return rm.decode_register_broker_body(zlib.compress(raw), compressed=True, version=version)


def _one_topic(line: bytes) -> rm.TopicConfig:
    body = _compress(DV, [line], b"[]", [])
    [(name, config)] = rm.decode_register_broker_body(
        body, compressed=True, version=479).topic_config_serialize_wrapper.topic_config_table.items()
    assert name == config.topic_name
    return config


@pytest.mark.parametrize("raw, message", [
    (_chunk(b"{}", 100), "the DataVersion claims 100 bytes, 2 are left"),
    (_chunk(b"{}", -1), "the DataVersion claims -1 bytes, 2 are left"),
    (_chunk(DV), "ends early: no room for topic count"),
    (_chunk(DV) + struct.pack(">i", 1) + _chunk(b"x", 50), "a topic entry claims 50 bytes, 1 are left"),
    (_chunk(DV) + struct.pack(">i", 2) + _chunk(b"") + _chunk(b""), "topic entry has 0 fields, not 5: b''"),
    (_chunk(DV) + struct.pack(">i", 3) + _chunk(b"") + _chunk(b""),
     "topic count 3 exceeds what 8 bytes can hold"),
    (_chunk(DV) + struct.pack(">i", 0), "ends early: no room for the length of the filter server list"),
    (_chunk(DV) + struct.pack(">i", 0) + _chunk(b"[]"), "ends early: no room for topic queue mapping count"),
    (_chunk(DV) + struct.pack(">i", 0) + _chunk(b"[]") + struct.pack(">i", 1) + _chunk(b"", 99),
     "a topic queue mapping claims 99 bytes, 0 are left"),
])
def test_compressed_register_body_refusals_word_for_word(raw, message):
    with pytest.raises(RemotingBodyError) as refused:
        _inflated(raw)
    assert str(refused.value) == "compressed register body" + (" " if message.startswith("ends") else ": ") + message


@pytest.mark.parametrize("dv, mapping, message", [
    (b'{"counter":"x"}', b"{}",
     "compressed register body DataVersion: Expected `int`, got `str` - at `$.counter`"),
    (DV, b'{"epoch":"x"}', "TopicQueueMappingInfo: Expected `int`, got `str` - at `$.epoch`"),
])
def test_compressed_register_body_json_sections_are_named(dv, mapping, message):
    with pytest.raises(RemotingBodyError) as refused:
        rm.decode_register_broker_body(_compress(dv, [], b"[]", [mapping]), compressed=True, version=479)
    assert str(refused.value) == message


@pytest.mark.parametrize("line, message", [
    (b"A 8 8", "topic entry has 3 fields, not 5: b'A 8 8'"),
    (b"A 8 8 6 ", "topic entry has 4 fields, not 5: b'A 8 8 6 '"),  # trailing empty fields dropped
    (b"T" * 70, f"topic entry has 1 fields, not 5: b'{'T' * 64}'... (70 in all)"),
    (b"A 8 8 6 NO_TAG", "unknown topic filter type 'NO_TAG'"),
    (b"A 8 8 6 " + b"T" * 30, f"unknown topic filter type '{'T' * 24}'... (30 in all)"),
    (b"A  8 8 SINGLE_TAG", "readQueueNums is not an integer: ''"),  # split on each single space
    (b"A 8 x 6 SINGLE_TAG", "writeQueueNums is not an integer: 'x'"),
    (b"A 8 8 x SINGLE_TAG", "perm is not an integer: 'x'"),
    (b"A " + b"9" * 30 + b" 8 6 SINGLE_TAG", f"readQueueNums is not an integer: '{'9' * 24}'... (30 in all)"),
    (b"A 000000000001 8 6 SINGLE_TAG", "readQueueNums is not an integer: '000000000001'"),  # 12 characters
    ("A \u0661 8 6 SINGLE_TAG".encode(), "readQueueNums is not an integer: '\u0661'"),  # not an ASCII digit
    (b"A 2147483648 8 6 SINGLE_TAG", "readQueueNums is out of range: 2147483648"),
    (b"A -2147483649 8 6 SINGLE_TAG", "readQueueNums is out of range: -2147483649"),
])
def test_compressed_topic_lines_refused_word_for_word(line, message):
    with pytest.raises(RemotingBodyError) as refused:
        rm.decode_register_broker_body(_compress(DV, [line], b"[]", []), compressed=True, version=479)
    assert str(refused.value) == f"compressed register body: {message}"


def test_compressed_topic_lines_read_as_java_reads_them():
    assert _one_topic(b"A -2147483648 2147483647 4 SINGLE_TAG") == rm.TopicConfig(
        topic_name="A", read_queue_nums=-(2**31), write_queue_nums=2**31 - 1, perm=4, attributes={})
    assert _one_topic(b"A +1 -0000000001 6 SINGLE_TAG").write_queue_nums == -1  # 11 characters
    assert _one_topic(b"\xff 1 1 6 SINGLE_TAG").topic_name == "\ufffd"  # bad UTF-8 replaced
    assert _one_topic(b" 1 1 6 SINGLE_TAG").topic_name == ""


def test_compressed_sections_java_tolerates():
    raw = (_chunk(DV) + struct.pack(">i", 0) + _chunk(b"") + struct.pack(">i", 1) + _chunk(b'{"bname":"b"}'))
    body = _inflated(raw)
    assert body.filter_server_list == []  # an empty (unparsable) filter list is an empty list
    assert list(body.topic_config_serialize_wrapper.topic_queue_mapping_info_map) == [""]
    assert _inflated(_chunk(DV) + struct.pack(">i", 0) + _chunk(b"not json") + struct.pack(">i", 0)) \
        .filter_server_list == []


def test_register_body_forms_switch_at_version_37_and_name_the_form_in_errors():
    plain = b'{"topicConfigSerializeWrapper":{"dataVersion":{"counter":4}}}'
    assert rm.decode_register_broker_body(plain, compressed=False, version=37) \
        .topic_config_serialize_wrapper.data_version.counter == 4
    wrapper = b'{"dataVersion":{"counter":5}}'
    assert rm.decode_register_broker_body(wrapper, compressed=False, version=36) \
        .topic_config_serialize_wrapper.data_version.counter == 5
    bad = b'{"dataVersion":1}'
    with pytest.raises(RemotingBodyError) as refused:
        rm.decode_register_broker_body(bad, compressed=False, version=36)
    assert str(refused.value) == \
        "register body (topic config wrapper): Expected `object`, got `int` - at `$.dataVersion`"
    with pytest.raises(RemotingBodyError) as refused:
        rm.decode_register_broker_body(b'{"filterServerList":1}', compressed=False, version=37)
    assert str(refused.value) == "register body: Expected `array`, got `int` - at `$.filterServerList`"


def test_inflation_stops_at_exactly_the_limit():
    from zns.core.remoting.register import inflate_bounded

    data = zlib.compress(b"x" * 100)
    assert inflate_bounded(data, 100) == b"x" * 100
    with pytest.raises(RemotingBodyError) as refused:
        inflate_bounded(data, 99)
    assert str(refused.value) == "compressed register body inflates past 99 bytes"
    with pytest.raises(RemotingBodyError) as refused:
        inflate_bounded(data[:-3], 1000)
    assert str(refused.value) == "compressed register body is a truncated zlib stream"


def test_quote_integer_keys_counts_every_key_against_its_bound():
    from zns.core.errors import RemotingBodyError
    from zns.core.remoting.fastjson import quote_integer_keys

    three = b'{0:1,1:2,2:3}'
    assert quote_integer_keys(three, 3) == b'{"0":1,"1":2,"2":3}'  # exactly the bound
    with pytest.raises(RemotingBodyError, match=r"^more than 2 unquoted integer map keys$"):
        quote_integer_keys(three, 2)
    assert quote_integer_keys(memoryview(b'{"a":1}')) == b'{"a":1}'


def test_count_values_is_an_upper_bound_from_commas_brackets_and_quote_pairs():
    from zns.core.errors import RemotingBodyError
    from zns.core.remoting.fastjson import check_values, count_values

    body = b'{"a":[1,2],"b":{"c":"d"}}'  # 2 commas, 2 braces, 1 bracket, 8 quotes
    assert count_values(body) == 2 + 2 + 1 + 4 + 1
    assert count_values(bytearray(body)) == count_values(memoryview(body)) == 10
    assert count_values(b'"x"') == 2 and count_values(b'"') == 1 and count_values(b"") == 1
    check_values(body, 10, "the body", "allowed")  # exactly the bound: accepted
    with pytest.raises(RemotingBodyError, match=r"^the body holds up to 10 JSON values, more than "
                                                r"the 9 allowed; refused before decoding$"):
        check_values(body, 9, "the body", "allowed")


def test_loads_lenient_refuses_more_unquoted_keys_than_its_bound(monkeypatch):
    from zns.core.errors import RemotingBodyError
    from zns.core.remoting import fastjson

    monkeypatch.setattr(fastjson, "MAX_UNQUOTED_KEYS", 2)
    assert fastjson.loads_lenient(b'{0:1,1:2}') == {"0": 1, "1": 2}
    with pytest.raises(RemotingBodyError, match=r"^route: more than 2 unquoted integer map keys; "
                                                r"refused$"):
        fastjson.loads_lenient(b'{0:1,1:2,2:3}', what="route")


def test_register_bodies_are_bounded_per_topic_with_slack():
    from zns.core.remoting.register import VALUES_PER_TOPIC, VALUES_SLACK, max_body_values

    assert max_body_values(10) == 10 * VALUES_PER_TOPIC + VALUES_SLACK
    assert max_body_values(0) == VALUES_SLACK


def test_a_topic_route_body_is_bounded_by_the_broker_names_a_route_may_hold():
    from zns.core.errors import RemotingBodyError
    from zns.core.remoting.bodies import ROUTE_VALUES_PER_BROKER, decode_topic_route_data
    from zns.core.remoting.fastjson import count_values

    bound = ROUTE_VALUES_PER_BROKER * 2 + 1024
    filler = b'{"queueDatas":[],"brokerDatas":[],"x":['
    at_bound = filler + b"1," * (bound - count_values(filler + b"1]}")) + b"1]}"
    assert count_values(at_bound) == bound
    decode_topic_route_data(at_bound, max_brokers=2)  # exactly the bound: decoded
    over = at_bound[:-3] + b",1]}"
    with pytest.raises(RemotingBodyError, match=rf"^TopicRouteData body holds up to {bound + 1} "
                                                rf"JSON values, more than the {bound} a route of 2 "
                                                rf"broker names may hold \(--max-brokers\); "
                                                rf"refused before decoding$"):
        decode_topic_route_data(over, max_brokers=2)
    with pytest.raises(RemotingBodyError, match=r"more than the 321024 a route of 10000 broker"):
        decode_topic_route_data(b"[" * 321_024 + b"]")


def test_compressed_register_counts_are_bounded_by_max_topics_exactly():
    from zns.core.errors import RemotingBodyError

    two = _compress(DV, [b"A 1 1 6 SINGLE_TAG", b"B 1 1 6 SINGLE_TAG"], b"[]", [])
    body = rm.decode_register_broker_body(two, compressed=True, version=479, max_topics=2)
    assert len(body.topic_config_serialize_wrapper.topic_config_table) == 2  # exactly the bound
    with pytest.raises(RemotingBodyError, match=r"^compressed register body: topic count 2 is more "
                                                r"than the 1 topics --max-topics-per-request "
                                                r"allows; refused before decoding$"):
        rm.decode_register_broker_body(two, compressed=True, version=479, max_topics=1)
    mappings = _compress(DV, [], b"[]", [b"{}", b"{}"])
    with pytest.raises(RemotingBodyError, match=r"^compressed register body: topic queue mapping "
                                                r"count 2 is more than the 1 topics "):
        rm.decode_register_broker_body(mappings, compressed=True, version=479, max_topics=1)


def test_the_first_version_sending_the_wrapper_may_compress_it():
    body = _compress(DV, [b"A 1 1 6 SINGLE_TAG"], b"[]", None)
    from zns.core.remoting.constants import VERSION_3_0_11

    decoded = rm.decode_register_broker_body(body, compressed=True, version=VERSION_3_0_11)
    assert list(decoded.topic_config_serialize_wrapper.topic_config_table) == ["A"]


@pytest.mark.parametrize("compressed, version, what", [
    (True, 479, "compressed register body"),
    (False, 479, "register body"),
    (False, 36, "register body (topic config wrapper)"),
])
def test_a_register_body_with_too_many_values_says_which_and_why(compressed, version, what):
    from zns.core.errors import RemotingBodyError
    import re

    from zns.core.remoting.register import VALUES_SLACK

    values = b"[" + b"1," * VALUES_SLACK + b"1]"
    body = _compress(DV, [], values, None) if compressed else values
    with pytest.raises(RemotingBodyError, match=rf"^{re.escape(what)} holds up to \d+ JSON values, "
                                                rf"more than the {VALUES_SLACK} a body of 0 topics "
                                                rf"may hold \(--max-topics-per-request\); refused "
                                                rf"before decoding$"):
        rm.decode_register_broker_body(body, compressed=compressed, version=version, max_topics=0)


def test_the_java_string_order_key_takes_a_lone_surrogate():
    from zns.core.remoting.bodies import _utf16_key

    assert _utf16_key("\ud800") == b"\xd8\x00"  # Java strings may hold one; no error here
    assert sorted(["\uffff", "\U00010000"], key=_utf16_key) == ["\U00010000", "\uffff"]


def test_a_mapping_chunk_is_one_mapping_with_at_most_the_unquoted_key_bound():
    from zns.core.errors import RemotingBodyError
    from zns.core.remoting.fastjson import MAX_UNQUOTED_KEYS

    def decode(mappings: list[bytes]) -> None:
        rm.decode_register_broker_body(_compress(DV, [], b"[]", mappings), compressed=True,
                                       version=479)

    with pytest.raises(RemotingBodyError, match=r"^TopicQueueMappingInfo: "):
        decode([b'{"topic":"T"},{"topic":"U"}'])  # two values in one chunk
    keys = b",".join(b"%d:1" % i for i in range(MAX_UNQUOTED_KEYS + 1))
    with pytest.raises(RemotingBodyError, match=rf"^TopicQueueMappingInfo: more than "
                                                rf"{MAX_UNQUOTED_KEYS} unquoted integer map keys; "
                                                rf"refused$"):
        decode([b'{"topic":"T","currIdMap":{' + keys + b"}}"])


def test_every_split_of_a_frame_stream_decodes_the_same_commands():
    stream = frame("GET_ROUTEINFO_BY_TOPIC request JSON") + frame("TOPIC_NOT_EXIST response")
    whole = [(c.code, c.opaque) for c in FrameDecoder().feed(stream)]
    assert len(whole) == 2
    for k in range(1, len(stream)):
        dec = FrameDecoder()
        got = dec.feed(stream[:k]) + dec.feed(stream[k:])
        assert [(c.code, c.opaque) for c in got] == whole, k
        assert dec.buffered == 0


@pytest.mark.parametrize("pieces", [1, 3])  # the head whole in the first piece, or assembled
def test_a_header_length_over_the_bound_is_refused_before_the_frame_is_waited_for(pieces):
    from zns.core.remoting.command import MAX_DECODED_HEADER_BYTES

    def start(header_length: int) -> bytes:  # a frame announced long, its header length given
        return struct.pack(">ii", header_length + 100, header_length)

    for ok_length in (MAX_DECODED_HEADER_BYTES, 5):
        dec, data = FrameDecoder(), start(ok_length)
        for i in range(pieces):
            assert dec.feed(data[i * 8 // pieces:(i + 1) * 8 // pieces]) == []
    dec, data = FrameDecoder(), start(MAX_DECODED_HEADER_BYTES + 1)
    with pytest.raises(RemotingFrameError, match=rf"^header of {MAX_DECODED_HEADER_BYTES + 1} bytes "
                                                 rf"is longer than the {MAX_DECODED_HEADER_BYTES} "
                                                 rf"bytes any request needs$"):
        for i in range(pieces):
            dec.feed(data[i * 8 // pieces:(i + 1) * 8 // pieces])


def test_a_large_body_arriving_in_pieces_is_not_taken_for_a_long_header():
    from zns.core.remoting.command import encode_command

    cmd = RemotingCommand(code=10, opaque=3, body=b"x" * 300_000)
    data = encode_command(cmd)
    dec, got = FrameDecoder(), []
    for i in range(0, len(data), 7):
        got += dec.feed(data[i:i + 7])
    assert [(c.code, c.opaque, len(c.body)) for c in got] == [(10, 3, 300_000)]


def test_a_frame_completed_in_pieces_keeps_the_ext_field_bound():
    from zns.core.remoting.command import encode_command

    cmd = RemotingCommand(code=10, opaque=3, ext_fields={"a": "1", "b": "2", "c": "3"})
    data = encode_command(cmd)
    with pytest.raises(RemotingFrameError):
        FrameDecoder(max_ext_fields=2).feed(data)
    dec = FrameDecoder(max_ext_fields=2)
    dec.feed(data[:9])
    with pytest.raises(RemotingFrameError):
        dec.feed(data[9:])


def test_a_complete_frame_is_judged_by_decode_frame_and_a_begun_one_by_its_header_length():
    from zns.core.remoting.command import MAX_DECODED_HEADER_BYTES as MAX

    # Whole in one chunk: decode_frame's own order (the serialize type first).
    whole = struct.pack(">ii", 4 + MAX + 1, (5 << 24) | (MAX + 1)) + bytes(MAX + 1)
    with pytest.raises(RemotingFrameError, match=r"^unknown serialize type 5$"):
        FrameDecoder().feed(whole)
    # An 8-byte frame (no room for a header) assembled from pieces: decode_frame says so.
    dec = FrameDecoder()
    dec.feed(struct.pack(">i", 4))
    with pytest.raises(RemotingFrameError, match=rf"^header length {MAX + 1} exceeds the 0 bytes"):
        dec.feed(struct.pack(">i", MAX + 1))
    # One byte more to come: the long header length is refused at once.
    dec = FrameDecoder()
    dec.feed(struct.pack(">i", 5))
    with pytest.raises(RemotingFrameError, match=rf"^header of {MAX + 1} bytes is longer"):
        dec.feed(struct.pack(">i", MAX + 1))

"""Decoding a remoting frame is bounded before anything is built (issue 21 item 3).

Any frame within the frame limit costs at most ~100 ms of CPU and 64 MiB of
transient memory before it is refused or served: counts (topics, mappings, ext
fields, JSON values, header length) are checked first. The hostile shapes below
each cost 1-3.5 s of CPU (and up to +166 MiB) before, and a compressed one was
even accepted. CPU time is measured with generous bounds (a loaded machine
slows wall time, not this process's CPU time much).
"""

from __future__ import annotations

import functools
import struct
import time
import zlib
from collections.abc import Callable

import pytest

from test_remoting_service import LOCAL, register_cmd, req
from zns.core.errors import RemotingBodyError, RemotingFrameError
from zns.core.remoting import RemotingCommand
from zns.core.remoting.command import MAX_DECODED_HEADER_BYTES, FrameDecoder, decode_frame
from zns.core.remoting.fastjson import MAX_UNQUOTED_KEYS, loads_lenient
from zns.core.remoting.handler import RemotingService
from zns.core.remoting.register import body_crc32, decode_register_broker_body, max_body_values
from test_remoting_service import new_service

pytestmark = pytest.mark.timeout(120)

CPU_BOUND_S = 0.5  # the budget is 0.1 s; before the bounds these took 1.0-3.5 s
DATA_VERSION = b'{"counter":1,"stateVersion":0,"timestamp":1}'


def _i32(n: int) -> bytes:
    return struct.pack(">i", n)


def _cpu(step: Callable[[], object]) -> float:
    start = time.process_time()
    step()
    return time.process_time() - start


def _refused(error: type[Exception], step: Callable[[], object], match: str) -> float:
    """Run `step`, expect `error`; return the CPU seconds it took."""
    start = time.process_time()
    with pytest.raises(error, match=match):
        step()
    return time.process_time() - start


@functools.cache
def _compressed(topic_line: bytes, topics: int, mapping: bytes, mappings: int) -> bytes:
    """A compressed register body of `topics` copies of one line, `mappings` of one mapping."""
    raw = [_i32(len(DATA_VERSION)), DATA_VERSION, _i32(topics),
           (_i32(len(topic_line)) + topic_line) * topics, _i32(2), b"[]", _i32(mappings),
           (_i32(len(mapping)) + mapping) * mappings]
    return zlib.compress(b"".join(raw))


def test_a_compressed_body_of_762_591_copies_of_one_topic_is_refused_by_its_count():
    # 40 KB on the wire; all one topic, so the table's own limits never saw more than one.
    body = _compressed(b"T 8 8 6 SINGLE_TAG", 762_591, b"", 0)
    assert len(body) < 64 * 1024
    cpu = _refused(RemotingBodyError, lambda: decode_register_broker_body(
        body, compressed=True, version=413), "topic count 762591 is more than the 20000")
    assert cpu < CPU_BOUND_S


def test_a_compressed_body_of_2_8_million_mappings_is_refused_before_decoding():
    body = _compressed(b"", 0, b"{}", 2_790_000)
    assert len(body) < 64 * 1024
    cpu = _refused(RemotingBodyError, lambda: decode_register_broker_body(
        body, compressed=True, version=413), "JSON values, more than the")
    assert cpu < CPU_BOUND_S
    # Under the values bound, the count itself is the limit: one mapping per topic.
    body = _compressed(b"", 0, b"{}", 20_001)
    _refused(RemotingBodyError, lambda: decode_register_broker_body(
        body, compressed=True, version=413), "mapping count 20001 is more than the 20000")


def test_a_plain_body_of_1_28_million_topics_is_refused_before_decoding():
    body = (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{' + b'"T":{},' * 1_279_999
            + b'"T":{}}}}')
    assert len(body) > 8_000_000
    cpu = _refused(RemotingBodyError, lambda: decode_register_broker_body(
        body, compressed=False, version=413), "more than the 496384")
    assert cpu < CPU_BOUND_S
    # The old brokers' form (the wrapper alone) is bounded the same way.
    wrapper = b'{"topicConfigTable":{' + b'"T":{},' * 1_279_999 + b'"T":{}}}'
    _refused(RemotingBodyError, lambda: decode_register_broker_body(
        wrapper, compressed=False, version=1), "topic config wrapper")


def test_the_values_bound_follows_max_topics_per_request():
    body = (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{'
            + b",".join(b'"T%d":{}' % i for i in range(10_000)) + b"}}}")
    decode_register_broker_body(body, compressed=False, version=413)  # default: 20,000 topics
    with pytest.raises(RemotingBodyError, match="a body of 100 topics"):
        decode_register_broker_body(body, compressed=False, version=413, max_topics=100)
    assert max_body_values(20_000) < 500_000  # ~60 MiB at the worst 130 bytes per value


def test_unquoted_integer_keys_are_bounded_and_cheap():
    # The lenient rewrite costs Python work per unquoted key, not per string.
    keys = ",".join(f"{i + 1000}:{i}" for i in range(MAX_UNQUOTED_KEYS + 1)).encode()
    body = b'{"topicConfigSerializeWrapper":{"topicQueueMappingInfoMap":{"T":{"currIdMap":{' + keys + b"}}}}}"
    cpu = _refused(RemotingBodyError, lambda: decode_register_broker_body(
        body, compressed=False, version=413), f"more than {MAX_UNQUOTED_KEYS} unquoted")
    assert cpu < CPU_BOUND_S
    strings = b'{"a":[' + b",".join(b'"s%d"' % i for i in range(200_000)) + b'],"m":{0:1}}'
    assert loads_lenient(strings)["m"] == {"0": 1}
    assert _cpu(lambda: loads_lenient(strings)) < CPU_BOUND_S


def test_a_16_mib_header_of_1_19_million_ext_fields_is_refused_unread():
    header = b'{"code":103,"extFields":{' + b'"k":"v",' * 1_189_999 + b'"k":"v"}}'
    frame = _i32(len(header)) + header
    cpu = _refused(RemotingFrameError, lambda: decode_frame(frame), "longer than the 262144")
    assert cpu < 0.05
    # The stream decoder refuses it once the header length is in, before buffering the rest.
    decoder = FrameDecoder()
    with pytest.raises(RemotingFrameError, match="longer than"):
        decoder.feed(_i32(4 + len(header)) + frame[:4096])
    # A header at the bound still decodes (a KV value of 64 KiB fits with room to spare).
    value = "v" * (64 * 1024)
    small = b'{"code":100,"extFields":{"namespace":"n","key":"k","value":"' + value.encode() + b'"}}'
    assert len(small) < MAX_DECODED_HEADER_BYTES
    assert decode_frame(_i32(len(small)) + small).ext_fields["value"] == value


def test_a_refused_bomb_registers_nothing_through_the_handler():
    svc = new_service()
    rs = RemotingService(svc, properties={})
    body = _compressed(b"T 8 8 6 SINGLE_TAG", 762_591, b"", 0)
    cmd = register_cmd(name="bomb")
    cmd = RemotingCommand(code=cmd.code, version=413, opaque=cmd.opaque, body=body,
                          ext_fields={**cmd.ext_fields, "compressed": "true",
                                      "bodyCrc32": str(body_crc32(body))})
    reply, events = rs.handle(cmd, LOCAL, 1000)
    assert reply is not None and reply.code != 0
    assert "topic count 762591" in reply.remark
    assert events == [] and svc.table.topics() == []


def test_a_register_topic_body_is_bounded_by_max_brokers():
    svc = new_service()
    rs = RemotingService(svc, properties={})
    queues = b",".join([b'{"brokerName":"b","perm":6,"readQueueNums":1,"writeQueueNums":1}'] * 100_000)
    cmd = req(217, {"topic": "T"}, b'{"queueDatas":[' + queues + b"]}")
    reply, _ = rs.handle(cmd, LOCAL, 1000)
    assert reply is not None and reply.code != 0
    assert "--max-brokers" in reply.remark

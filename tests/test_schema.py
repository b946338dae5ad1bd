"""The wire codec without a server: events, replies, the envelope of a refused body."""

from __future__ import annotations

import msgspec
import pytest

from zns.core.schema import (
    BrokerEvent,
    Error,
    HbEvent,
    HeartbeatReply,
    RegisterBrokerReply,
    decode_event,
    decode_reply,
    encode,
    event_channel,
    read_envelope,
)


def nested(tag: str, depth: int) -> bytes:
    """A map {op: tag, x: [[[...]]]} nested `depth` arrays deep."""
    pack = msgspec.msgpack.encode
    return b"\x82" + pack("op") + pack(tag) + pack("x") + b"\x91" * depth + b"\xc0"


def test_events_decode_as_sent():
    hb = HbEvent(epoch="e1", revision=7, time_ms=123)
    broker = BrokerEvent(epoch="e1", revision=8, cluster="c", broker_name="b", broker_id=0,
                         broker_addr="10.0.0.1:10911", change="removed", reason="expired")
    assert decode_event(encode(hb)) == hb
    assert decode_event(encode(broker)) == broker
    with pytest.raises(msgspec.ValidationError):
        decode_event(encode(HeartbeatReply(id=1, known=True, changed=False)))


def test_a_reply_decoded_for_an_op_must_answer_that_op_or_be_an_error():
    hb_reply = encode(HeartbeatReply(id=1, known=True, changed=False))
    assert decode_reply(hb_reply) == HeartbeatReply(id=1, known=True, changed=False)
    assert decode_reply(hb_reply, "heartbeat") == HeartbeatReply(id=1, known=True, changed=False)
    with pytest.raises(msgspec.ValidationError):
        decode_reply(hb_reply, "register_broker")
    error = Error(id=1, code="busy", message="later")
    assert decode_reply(encode(error), "register_broker") == error
    assert decode_reply(encode(RegisterBrokerReply(id=2)), "register_broker") == RegisterBrokerReply(id=2)


@pytest.mark.parametrize("decode, tag", [(decode_event, "hb"), (decode_reply, "error")])
def test_data_nested_too_deeply_is_a_decode_error_that_says_so(decode, tag):
    with pytest.raises(msgspec.DecodeError) as refused:
        decode(nested(tag, 100_000))
    assert str(refused.value) == "MessagePack data is nested too deeply"


@pytest.mark.parametrize("fields, envelope", [
    ({"op": "get_route", "id": 5}, (5, "get_route")),
    ({"op": "get_route", "id": 2**64 - 1}, (2**64 - 1, "get_route")),
    ({"op": "get_route", "id": -1}, (0, "get_route")),   # cannot be echoed: answered with 0
    ({"op": 3, "id": True}, (0, None)),
    ({"id": 9}, (9, None)),
])
def test_the_envelope_of_a_refused_body_keeps_what_can_be_echoed(fields, envelope):
    assert read_envelope(msgspec.msgpack.encode(fields)) == envelope


def test_the_envelope_of_garbage_or_deep_nesting_is_empty():
    assert read_envelope(b"\xc1") == (0, None)
    assert read_envelope(b"\x91" * 100_000 + b"\xc0") == (0, None)


def test_only_an_event_has_a_channel():
    assert event_channel(HbEvent(epoch="e", revision=1, time_ms=2)) == b"hb\0"
    with pytest.raises(TypeError, match="not an event: 'hb'"):
        event_channel("hb")  # type: ignore[arg-type]


def test_a_raw_route_where_a_decoded_one_is_expected_is_named_as_the_bug_it_is():
    from zns.core.schema import Raw, decoded_route

    assert decoded_route(None) is None
    with pytest.raises(TypeError, match=r"^a pre-encoded \(Raw\) route where a decoded TopicRoute "
                                        r"was expected$"):
        decoded_route(Raw(b"\x80"))

"""The remoting port's answer to a ZeroMQ client (zns.core.remoting.zmtp), bytes in and out.

A ZNS/1 client pointed at the remoting port is greeted as ZMTP 3.0 and every request it sends
gets a `bad_request` error naming the ZNS/1 endpoint. No sockets here: the listener's tests
(tests/test_remoting_listener.py, tests/test_remoting_buffers.py) run the same code live.
"""

from __future__ import annotations

import msgspec
import pytest

from zns.core.errors import RemotingFrameError
from zns.core.remoting.zmtp import GREETING, MAX_FRAME_BYTES, READY, ZmtpRedirect, _command, looks_like_zmtp
from zns.core.schema import Error, encode

pytestmark = pytest.mark.timeout(60)


def test_the_zmtp_redirect_takes_its_input_in_any_pieces_and_refuses_non_zmtp():
    request = encode({"op": "status", "id": 77})
    big = encode({"op": "get_route", "id": 78, "topic": "T" * 300})
    client = (GREETING + bytes([0x04, 0x05]) + b"\x05READY"  # a READY without properties
              + bytes([0x01, 0]) + bytes([0, len(request)]) + request  # [empty, request]
              + bytes([0x02]) + len(big).to_bytes(8, "big") + big)  # one long frame
    redirect = ZmtpRedirect("go elsewhere")
    assert looks_like_zmtp(client) and not looks_like_zmtp(b"\x00\x00\x00\x10")
    out = redirect.start() + b"".join(redirect.feed(client[i:i + 7])
                                      for i in range(0, len(client), 7))
    assert out.startswith(GREETING + READY)
    replies, rest = [], out[len(GREETING + READY):]
    while rest:
        size = rest[1]
        replies.append(msgspec.msgpack.decode(rest[2:2 + size]))
        rest = rest[2 + size:]
    assert replies == [{"op": "error", "id": 77, "code": "bad_request", "message": "go elsewhere"},
                       {"op": "error", "id": 78, "code": "bad_request", "message": "go elsewhere"}]
    with pytest.raises(RemotingFrameError, match="not a ZMTP greeting"):
        ZmtpRedirect("x").feed(b"\xff" + b"\x00" * 63)
    with pytest.raises(RemotingFrameError, match="ZMTP frame of"):
        ZmtpRedirect("x").feed(GREETING + bytes([0x02]) + (1 << 40).to_bytes(8, "big"))


def _frames(out: bytes) -> list[tuple[int, bytes]]:
    """The (flags, body) of every frame in what the redirect sent after its greeting."""
    frames = []
    while out:
        if out[0] & 0x02:
            size, head = int.from_bytes(out[1:9], "big"), 9
        else:
            size, head = out[1], 2
        frames.append((out[0], out[head:head + size]))
        out = out[head + size:]
    return frames


def _greeted(message: str = "elsewhere") -> ZmtpRedirect:
    redirect = ZmtpRedirect(message)
    assert redirect.feed(GREETING) == READY
    return redirect


def test_ready_is_the_rfc_23_command_with_each_property_length_prefixed():
    assert READY == b"\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER"
    assert _command(b"X", {b"a": b"1", b"bb": b"22"}) == (
        b"\x04\x12\x01X" + b"\x01a\x00\x00\x00\x011" + b"\x02bb\x00\x00\x00\x0222")


def test_everything_fed_at_once_is_answered_at_once():
    first, second = encode({"op": "status", "id": 5}), encode({"op": "status", "id": 6})
    redirect = ZmtpRedirect("elsewhere")
    out = redirect.feed(GREETING + READY + bytes([0x04, 0x05]) + b"\x04PING"
                        + bytes([0, len(first)]) + first + bytes([0, len(second)]) + second)
    assert out.startswith(READY)
    replies = [msgspec.msgpack.decode(body) for _, body in _frames(out[len(READY):])]
    assert [reply["id"] for reply in replies] == [5, 6]


def test_a_reply_of_256_bytes_or_more_takes_the_long_frame():
    def reply(message: str) -> bytes:
        return encode(Error(id=0, code="bad_request", message=message))

    short = next(n for n in range(200, 300) if len(reply("m" * n)) == 255)
    for n, flags, size in ((short, 0x00, 255), (short + 1, 0x02, 256), (1000, 0x02, len(reply("m" * 1000)))):
        out = _greeted("m" * n).feed(bytes([0, 1]) + b"\xc0")  # msgpack nil: no id
        [(got_flags, body)] = _frames(out)
        assert (got_flags, len(body)) == (flags, size)
        assert out[:2 if flags == 0 else 9] == (bytes([0, size]) if flags == 0
                                                else bytes([0x02]) + size.to_bytes(8, "big"))
        assert msgspec.msgpack.decode(body)["message"] == "m" * n


def test_an_empty_frame_is_a_request_too():
    out = _greeted().feed(b"\x00\x00")
    [(flags, body)] = _frames(out)
    assert flags == 0 and msgspec.msgpack.decode(body)["id"] == 0


@pytest.mark.parametrize("request_bytes, expected_id", [
    (encode({"op": "status", "id": (1 << 64) - 1}), (1 << 64) - 1),
    (encode({"op": "status"}), 0),  # no id
    (msgspec.msgpack.encode([1, 2]), 0),  # not a map
    (b"\xc1", 0),  # not MessagePack
    (encode({"op": "status", "id": -3}), 0),
    (encode({"op": "status", "id": "7"}), 0),
    (encode({"op": "status", "id": 1.5}), 0),
])
def test_the_reply_carries_the_requests_id_only_when_it_is_one(request_bytes, expected_id):
    out = _greeted().feed(bytes([0, len(request_bytes)]) + request_bytes)
    [(_, body)] = _frames(out)
    reply = msgspec.msgpack.decode(body)
    assert reply["id"] == expected_id and type(reply["id"]) is int


def test_the_largest_frame_is_taken_and_one_byte_more_is_refused():
    big = bytes(MAX_FRAME_BYTES)
    out = _greeted().feed(bytes([0x02]) + len(big).to_bytes(8, "big") + big)
    assert msgspec.msgpack.decode(_frames(out)[0][1])["id"] == 0
    with pytest.raises(RemotingFrameError, match=rf"^ZMTP frame of {MAX_FRAME_BYTES + 1} bytes on the remoting port$"):
        _greeted().feed(bytes([0x02]) + (MAX_FRAME_BYTES + 1).to_bytes(8, "big"))
    with pytest.raises(RemotingFrameError, match=rf"^ZMTP frame of {1 << 63} bytes"):
        _greeted().feed(bytes([0x02]) + (1 << 63).to_bytes(8, "big"))  # not a negative size


def test_a_greeting_is_refused_with_what_is_wrong_in_it():
    with pytest.raises(RemotingFrameError, match="^not a ZMTP greeting$"):
        ZmtpRedirect("x").feed(GREETING[:9] + b"\x00" + GREETING[10:])
    with pytest.raises(RemotingFrameError, match="^ZMTP version 2 is too old$"):
        ZmtpRedirect("x").feed(GREETING[:10] + b"\x02\x01" + GREETING[12:])
    assert ZmtpRedirect("x").feed(GREETING[:-1]) == b""  # not all of it yet


def test_a_message_of_32_frames_and_64_kib_is_answered_and_one_more_is_refused():
    from zns.core.remoting.zmtp import MAX_MESSAGE_BYTES, MAX_MESSAGE_FRAMES

    part = bytes(MAX_MESSAGE_BYTES // MAX_MESSAGE_FRAMES)
    more = bytes([0x03]) + len(part).to_bytes(8, "big") + part  # LONG | MORE
    last = bytes([0x02]) + len(part).to_bytes(8, "big") + part
    redirect = _greeted()
    out = redirect.feed(more * (MAX_MESSAGE_FRAMES - 1) + last)
    assert len(_frames(out)) == 1 and redirect.buffered == 0 and not redirect.receiving
    with pytest.raises(RemotingFrameError, match=rf"^ZMTP message of more than "
                                                 rf"{MAX_MESSAGE_FRAMES} frames or "
                                                 rf"{MAX_MESSAGE_BYTES} bytes"):
        _greeted().feed(bytes([0x01, 0]) * MAX_MESSAGE_FRAMES + bytes([0, 0]))  # 33 frames
    with pytest.raises(RemotingFrameError, match="^ZMTP message of more than"):
        _greeted().feed(more * MAX_MESSAGE_FRAMES + bytes([0, 1]) + b"x")  # 64 KiB + 1


def test_what_the_redirect_holds_is_its_unparsed_input_only():
    # The parts of a message before its last were kept whole (issue 32 item 1: +2.1 GiB from
    # one connection sending 60 KB MORE frames); now they are counted, never kept.
    redirect = _greeted()
    part = bytes(1000)
    redirect.feed(bytes([0x03]) + len(part).to_bytes(8, "big") + part)
    assert redirect.buffered == 0 and redirect.receiving
    redirect.feed(bytes([0x02]) + len(part).to_bytes(8, "big") + part[:10])
    assert redirect.buffered == 9 + 10 and redirect.receiving

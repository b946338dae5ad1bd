"""Remoting commands, their two header serializations, and the framing.

A frame on the wire is::

    int32 length      4 + header length + body length (big-endian, signed)
    int32 type|hlen   serialize type in the high byte, header length in the low 24 bits
    header            hlen bytes, JSON (type 0) or ROCKETMQ binary (type 1)
    body              the rest, possibly empty

`FrameDecoder` turns a byte stream into `RemotingCommand`s incrementally;
`encode_command` does the reverse. Both header forms are encoded byte for
byte as RocketMQ 5.3.3 does (fastjson's sorted keys, omitted nulls, and ext
fields in Java HashMap order), so a reply zns builds is indistinguishable
from the Java NameServer's.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import msgspec
from msgspec import Meta, Raw, Struct

from zns.core.errors import RemotingFrameError
from zns.core.text import quote

from .constants import (
    QUOTE_CHARS,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_CODES,
    LANGUAGE_NAMES,
    SERIALIZE_JSON,
    SERIALIZE_NAMES,
    SERIALIZE_ROCKETMQ,
    VERSION_5_3_3,
)
from .fastjson import escape_legacy, java_hashmap_order, to_utf8

if TYPE_CHECKING:
    from mmap import mmap

    FrameBuffer = bytearray | mmap  # what `FrameDecoder(allocate=...)` may hand out

# A header may carry at most this many ext fields (Java has no bound; real
# peers send fewer than 20). Without it a 16 MiB header of tiny entries would
# cost seconds of Python per frame.
MAX_EXT_FIELDS = 1024
# The header length field has 24 bits.
MAX_HEADER_BYTES = 0xFFFFFF
# The longest header zns decodes. Real headers are a few hundred bytes; the longest
# legitimate one is a PUT_KV_CONFIG carrying a KV value (at most 64 KiB) in an ext
# field, which escaping can lengthen. A longer header closes the connection before
# it is decoded: a 16 MiB header of 1.19 M ext fields cost 1.0 s of CPU and +120 MiB
# to decode before the ext-field count refused it.
MAX_DECODED_HEADER_BYTES = 256 * 1024

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class RemotingCommand(Struct, kw_only=True):
    """One request or reply, whichever header serialization it travelled in.

    `ext_fields` distinguishes ``None`` (the command has no custom header:
    JSON omits ``extFields``) from ``{}`` (a custom header whose fields are all
    null: JSON writes ``"extFields":{}``). Values are always strings, as in
    Java. `language` is ``None`` when the peer named a language this table
    does not know (Java reads it as null too). `serialize_type` records how a
    decoded command arrived; it is informational, `encode_command` is told
    which type to write.
    """

    code: int
    language: str | None = "JAVA"
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] | None = None
    body: bytes = b""
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        """Flag bit 0: this is a reply (matched to its request by `opaque`)."""
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """Flag bit 1: the sender expects no reply, not even an error."""
        return bool(self.flag & FLAG_ONEWAY)

    def make_response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
        version: int = VERSION_5_3_3,
    ) -> RemotingCommand:
        """A reply to this request: same `opaque`, response flag set, language JAVA.

        Pass ``ext_fields={}`` where Java builds the reply from a response
        header class (``createResponseCommand(code, remark, SomeHeader.class)``):
        fastjson then writes ``"extFields":{}`` even if no field is set. Leave
        it ``None`` for replies Java builds without one.
        """
        return RemotingCommand(
            code=code,
            language="JAVA",
            version=version,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext_fields,
            body=body,
            serialize_type=self.serialize_type,
        )


# --- JSON header (type 0) ---------------------------------------------------------

Int32 = Annotated[int, Meta(ge=_INT32_MIN, le=_INT32_MAX)]


class _JsonHeader(Struct):
    # The fields fastjson reads into RemotingCommand; unknown keys are ignored
    # as fastjson ignores them. Defaults are Java's field initializers.
    code: Int32 = 0
    language: str | None = "JAVA"
    version: Int32 = 0
    opaque: Int32 = 0
    flag: Int32 = 0
    remark: str | None = None
    extFields: dict[str, Raw] | None = None


# strict=False: fastjson also reads "105" into an int field.
_JSON_HEADER_DECODER = msgspec.json.Decoder(_JsonHeader, strict=False)
_STR_DECODER = msgspec.json.Decoder(str)


def decode_json_header(data: bytes | memoryview, *, max_ext_fields: int = MAX_EXT_FIELDS) -> RemotingCommand:
    """Decode a type-0 header (the body is left empty).

    Ext values must be strings; numbers and booleans are accepted as their
    literal text (fastjson converts them the same way), a ``null`` value is
    dropped (Java treats it as absent). A non-object ``extFields`` or an
    object/array value is a framing error: Java cannot decode such a header
    and closes the connection, and so does zns.
    """
    try:
        h = _JSON_HEADER_DECODER.decode(data)
    except RecursionError:
        raise RemotingFrameError("JSON header nested too deeply") from None
    except msgspec.DecodeError as exc:
        raise RemotingFrameError(f"JSON header cannot be decoded: {str(exc)[:200]}") from None
    ext: dict[str, str] | None = None
    if h.extFields is not None:
        if len(h.extFields) > max_ext_fields:
            raise RemotingFrameError(f"header has {len(h.extFields)} ext fields, more than {max_ext_fields}")
        ext = {}
        for key, raw in h.extFields.items():
            text = bytes(raw)
            first = text[:1]
            if first == b'"':
                try:
                    ext[key] = _STR_DECODER.decode(text)
                except msgspec.DecodeError:  # msgspec checks UTF-8 inside a Raw only now
                    raise RemotingFrameError(f"ext field {quote(key, QUOTE_CHARS)} is not valid UTF-8") from None
            elif first == b"n":  # null
                continue
            elif first in (b"{", b"["):
                raise RemotingFrameError(f"ext field {quote(key, QUOTE_CHARS)} is not a string but a JSON {'object' if first == b'{' else 'array'}")
            else:  # number, true, false: their JSON text, which is ASCII
                ext[key] = text.decode("ascii")
    language = h.language if h.language in LANGUAGE_CODES else None
    return RemotingCommand(
        code=h.code,
        language=language,
        version=h.version,
        opaque=h.opaque,
        flag=h.flag,
        remark=h.remark,
        ext_fields=ext,
        serialize_type=SERIALIZE_JSON,
    )


def _check_int32(name: str, value: int) -> None:
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{name} {value} does not fit a Java int")


def encode_json_header(cmd: RemotingCommand) -> bytes:
    """The type-0 header fastjson writes for `cmd`, byte for byte.

    Keys in fastjson's sorted order, ``remark``/``language`` omitted when
    ``None``, ``extFields`` omitted when ``None`` and written in Java HashMap
    order otherwise, and ``serializeTypeCurrentRPC`` = ``"JSON"``.
    Hand-written because msgspec can neither order the ext map Java's way nor
    escape like fastjson.
    """
    code, version, opaque, flag = cmd.code, cmd.version, cmd.opaque, cmd.flag
    if not (_INT32_MIN <= code <= _INT32_MAX and _INT32_MIN <= version <= _INT32_MAX
            and _INT32_MIN <= opaque <= _INT32_MAX and _INT32_MIN <= flag <= _INT32_MAX):
        for name in ("code", "version", "opaque", "flag"):
            _check_int32(name, getattr(cmd, name))
    # One format call: this runs for every reply, GET_ROUTEINFO_BY_TOPIC's included.
    ext = cmd.ext_fields
    ext_part = "" if ext is None else ',"extFields":{' + ",".join(
        f"{escape_legacy(k)}:{escape_legacy(ext[k])}" for k in java_hashmap_order(ext)) + "}"
    language = "" if cmd.language is None else f',"language":"{cmd.language}"'
    remark = "" if cmd.remark is None else ',"remark":' + escape_legacy(cmd.remark)
    return to_utf8(f'{{"code":{int(code)}{ext_part},"flag":{int(flag)}{language},"opaque":{int(opaque)}'
                   f'{remark},"serializeTypeCurrentRPC":"JSON","version":{int(version)}}}')


# --- ROCKETMQ header (type 1) --------------------------------------------------------

# int16 code | int8 language | int16 version | int32 opaque | int32 flag | int32 remark length
_RMQ_FIXED = struct.Struct(">hbhiii")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


def decode_rocketmq_header(data: bytes | memoryview, *, max_ext_fields: int = MAX_EXT_FIELDS) -> RemotingCommand:
    """Decode a type-1 (binary) header, checking every length against the bytes present.

    As in Java, a zero-length remark, key or value is null: the remark
    becomes ``None`` and such an ext entry is dropped (Java would skip it when
    writing and treat it as absent when reading). An ext length of 0 means no
    ext fields (``None``). Text is UTF-8 with bad bytes replaced, as Java
    decodes it. Bytes after the ext section are ignored, as in Java.
    """
    mv = memoryview(data)
    n = len(mv)
    if n < _RMQ_FIXED.size + 4:
        raise RemotingFrameError(f"ROCKETMQ header of {n} bytes is shorter than the 21-byte minimum")
    code, lang, version, opaque, flag, remark_len = _RMQ_FIXED.unpack_from(mv, 0)
    pos = _RMQ_FIXED.size
    if remark_len < 0 or remark_len > n - pos - 4:
        raise RemotingFrameError(f"ROCKETMQ header remark length {remark_len} does not fit its {n}-byte header")
    remark = str(mv[pos : pos + remark_len], "utf-8", "replace") if remark_len else None
    pos += remark_len
    (ext_len,) = _INT32.unpack_from(mv, pos)
    pos += 4
    ext: dict[str, str] | None = None
    if ext_len != 0:
        if ext_len < 0 or ext_len > n - pos:
            raise RemotingFrameError(f"ROCKETMQ header ext length {ext_len} does not fit its {n}-byte header")
        end = pos + ext_len
        ext = {}
        count = 0
        while pos < end:
            count += 1
            if count > max_ext_fields:
                raise RemotingFrameError(f"header has more than {max_ext_fields} ext fields")
            if end - pos < 2:
                raise RemotingFrameError("ROCKETMQ header ext entry cut short (key length)")
            (klen,) = _INT16.unpack_from(mv, pos)
            pos += 2
            if klen < 0 or klen > end - pos - 4:
                raise RemotingFrameError(f"ROCKETMQ header ext key length {klen} overruns the ext section")
            key = str(mv[pos : pos + klen], "utf-8", "replace")
            pos += klen
            (vlen,) = _INT32.unpack_from(mv, pos)
            pos += 4
            if vlen < 0 or vlen > end - pos:
                raise RemotingFrameError(f"ROCKETMQ header ext value length {vlen} overruns the ext section")
            value = str(mv[pos : pos + vlen], "utf-8", "replace")
            pos += vlen
            if klen and vlen:
                ext[key] = value
        if not ext:
            ext = None  # Java's map would hold only nulls: absent for every lookup
    return RemotingCommand(
        code=code,
        language=LANGUAGE_NAMES.get(lang),
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        serialize_type=SERIALIZE_ROCKETMQ,
    )


def encode_rocketmq_header(cmd: RemotingCommand) -> bytes:
    """The type-1 header RocketMQ writes for `cmd`, byte for byte.

    `code` and `version` travel as int16, so they must fit one (ValueError
    otherwise: that is a bug of the caller, not of a peer). An empty remark
    and an empty or ``None`` ext map are both written as length 0; a language
    of ``None`` is written as OTHER (7).
    """
    for name in ("code", "version"):
        value = getattr(cmd, name)
        if not -(2**15) <= value < 2**15:
            raise ValueError(f"{name} {value} does not fit the int16 of a ROCKETMQ header")
    _check_int32("opaque", cmd.opaque)
    _check_int32("flag", cmd.flag)
    remark = to_utf8(cmd.remark) if cmd.remark else b""
    ext_parts: list[bytes] = []
    if cmd.ext_fields:
        for key in java_hashmap_order(cmd.ext_fields):
            k = to_utf8(key)
            v = to_utf8(cmd.ext_fields[key])
            ext_parts += [_INT16.pack(len(k)), k, _INT32.pack(len(v)), v]
    ext = b"".join(ext_parts)
    language = LANGUAGE_CODES.get(cmd.language or "OTHER", LANGUAGE_CODES["OTHER"])
    return b"".join(
        [
            _RMQ_FIXED.pack(cmd.code, language, cmd.version, cmd.opaque, cmd.flag, len(remark)),
            remark,
            _INT32.pack(len(ext)),
            ext,
        ]
    )


# --- frames ---------------------------------------------------------------------------

_FRAME_HEAD = struct.Struct(">ii")


def encode_command(cmd: RemotingCommand, serialize_type: int = SERIALIZE_JSON) -> bytes:
    """The whole frame for `cmd` (length field included), with its header in `serialize_type`.

    The Java NameServer answers in its own configured type (JSON), not the
    request's; pass ``cmd.serialize_type`` to answer in kind instead.
    """
    if serialize_type == SERIALIZE_JSON:
        header = encode_json_header(cmd)
    elif serialize_type == SERIALIZE_ROCKETMQ:
        header = encode_rocketmq_header(cmd)
    else:
        raise ValueError(f"unknown serialize type {serialize_type}")
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {len(header)} bytes does not fit the 24-bit length field")
    body = cmd.body or b""
    return b"".join(
        [_FRAME_HEAD.pack(4 + len(header) + len(body), serialize_type << 24 | len(header)), header, body]
    )


def _check_header_length(hlen: int) -> None:
    if hlen > MAX_DECODED_HEADER_BYTES:
        raise RemotingFrameError(f"header of {hlen} bytes is longer than the {MAX_DECODED_HEADER_BYTES} "
                                 f"bytes any request needs")


def decode_frame(frame: bytes | bytearray | memoryview, *, max_ext_fields: int = MAX_EXT_FIELDS) -> RemotingCommand:
    """Decode one frame *without* its leading length field (what that field counts).

    Raises `RemotingFrameError` for a frame shorter than its type/length
    word, a header length beyond the frame, an unknown serialize type or a
    header that cannot be decoded.
    """
    mv = memoryview(frame)
    if len(mv) < 4:
        raise RemotingFrameError(f"frame of {len(mv)} bytes has no header length field")
    (word,) = _INT32.unpack_from(mv, 0)
    stype = (word >> 24) & 0xFF
    hlen = word & 0xFFFFFF
    if stype not in SERIALIZE_NAMES:
        raise RemotingFrameError(f"unknown serialize type {stype}")
    if hlen > len(mv) - 4:
        raise RemotingFrameError(f"header length {hlen} exceeds the {len(mv) - 4} bytes after it")
    _check_header_length(hlen)
    header = mv[4 : 4 + hlen]
    if stype == SERIALIZE_JSON:
        cmd = decode_json_header(header, max_ext_fields=max_ext_fields)
    else:
        cmd = decode_rocketmq_header(header, max_ext_fields=max_ext_fields)
    cmd.body = bytes(mv[4 + hlen :])
    return cmd


class FrameDecoder:
    """Incremental, bounded frame decoder for one connection (sans-I/O).

    Feed it whatever the socket returned; it returns every command completed
    so far. Memory stays bounded and is known exactly (`allocated`): a length
    field announcing more than `max_frame_bytes` (counting the 4-byte field
    itself, as the Java server does) is refused as soon as those 4 bytes are
    in. A frame that arrives whole within one chunk is decoded straight from
    it; one that does not gets one buffer of exactly its announced length,
    made by `allocate` once its 8-byte head is in (the driver may hand out
    memory the OS takes back at once on close, e.g. an anonymous mmap), and
    filled in place: no growing buffer, no over-allocation, no copy of the
    chunk kept beyond `feed`, so `data` may be a view of a buffer the caller
    reuses.

    After a `RemotingFrameError` the decoder is dead: every later `feed`
    raises again. Close the connection.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *,
                 max_ext_fields: int = MAX_EXT_FIELDS,
                 allocate: Callable[[int], FrameBuffer] = bytearray) -> None:
        if max_frame_bytes < 8:
            raise ValueError("max_frame_bytes must allow at least the 8 bytes of an empty frame")
        self.max_frame_bytes = max_frame_bytes
        self.max_ext_fields = max_ext_fields
        self._allocate = allocate
        self._head = bytearray()  # up to 8 bytes of a frame's start: length, header word
        self._frame: FrameBuffer | None = None  # the frame being read (length field excluded)
        self._filled = 0
        self._error: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a returned command."""
        return len(self._head) + (4 + self._filled if self._frame is not None else 0)

    @property
    def remaining(self) -> int:
        """Bytes still to come of the frame being read (0: none is)."""
        return len(self._frame) - self._filled if self._frame is not None else 0

    @property
    def allocated(self) -> int:
        """Bytes this decoder holds for them: the whole buffer of a frame begun."""
        return len(self._head) + (len(self._frame) if self._frame is not None else 0)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Add received bytes; return the commands they complete, in order.

        Raises `RemotingFrameError` (with the commands completed before the
        bad frame in its ``commands``) when the stream cannot be framed.
        """
        if self._error is not None:
            raise RemotingFrameError(f"connection already failed: {self._error}")
        out: list[RemotingCommand] = []
        try:
            with memoryview(data) as mv:
                self._consume(mv, out)
        except RemotingFrameError as exc:
            self._error = str(exc)
            self._head, self._frame, self._filled = bytearray(), None, 0
            raise RemotingFrameError(str(exc), out) from None
        return out

    def _consume(self, mv: memoryview, out: list[RemotingCommand]) -> None:
        i, n = 0, len(mv)
        while i < n:
            frame = self._frame
            if frame is not None:  # the rest of a frame begun: copied in place
                take = min(len(frame) - self._filled, n - i)
                frame[self._filled:self._filled + take] = mv[i:i + take]
                self._filled += take
                i += take
                self._complete(out)
                continue
            head = self._head
            if not head and n - i >= 8:  # a frame's head is here whole: no copy of it
                (length,) = _INT32.unpack_from(mv, i)
                self._check_length(length)
                if n - i - 4 >= length:
                    with mv[i + 4:i + 4 + length] as whole:
                        out.append(decode_frame(whole, max_ext_fields=self.max_ext_fields))
                    i += 4 + length
                else:  # the header length is in: refuse a long one before waiting for it
                    _check_header_length(_INT32.unpack_from(mv, i + 4)[0] & 0xFFFFFF)
                    self._begin(length)
                    i += 4  # its bytes are copied in above
                continue
            take = min(8 - len(head), n - i)
            head += mv[i:i + take]
            i += take
            if len(head) >= 4:
                self._check_length(_INT32.unpack_from(head, 0)[0])  # before any more is kept
            if len(head) == 8:
                (length,) = _INT32.unpack_from(head, 0)
                if length > 4:  # more to wait for: refuse a long header first
                    _check_header_length(_INT32.unpack_from(head, 4)[0] & 0xFFFFFF)
                self._begin(length)
                assert self._frame is not None
                self._frame[0:4] = head[4:8]
                self._filled = 4
                head.clear()
                self._complete(out)

    def _check_length(self, length: int) -> None:
        if length < 4:
            raise RemotingFrameError(f"frame length field {length} is below the minimum of 4")
        if length > self.max_frame_bytes - 4:
            raise RemotingFrameError(
                f"frame of {length + 4} bytes (length field included) exceeds the limit of {self.max_frame_bytes}"
            )

    def _begin(self, length: int) -> None:
        self._frame = self._allocate(length)
        self._filled = 0

    def _complete(self, out: list[RemotingCommand]) -> None:
        frame = self._frame
        if frame is not None and self._filled == len(frame):
            self._frame, self._filled = None, 0
            with memoryview(frame) as whole:
                out.append(decode_frame(whole, max_ext_fields=self.max_ext_fields))



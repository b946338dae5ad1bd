"""Fuzz the remoting codec: whatever a peer sends, only the two documented errors escape.

A seeded random driver (reproducible; the seed is printed) feeds 20,000 inputs
(ZNS_FUZZ_INPUTS for more) through the frame decoder and, for every frame that decodes,
through the body and ext-field decoders a listener would call: random bytes,
truncated and mutated golden frames, lying length fields, huge ext maps, deep
JSON and broken or bomb-like zlib bodies. Anything but `RemotingFrameError` /
`RemotingBodyError` (IndexError, struct.error, UnicodeDecodeError,
RecursionError, MemoryError, ...) fails the test. A hypothesis property
covers the same ground with shrinking.
"""

from __future__ import annotations

import os
import random
import struct
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zns.core import remoting as rm
from zns.core.remoting import FrameDecoder, RemotingBodyError, RemotingCommand, RemotingFrameError

VECTORS = Path(__file__).parent / "data" / "remoting-vectors.txt"
GOLDEN = [
    bytes.fromhex(line.split("frame hex: ", 1)[1])
    for line in VECTORS.read_text(encoding="utf-8").splitlines()
    if line.startswith("frame hex: ")
]
COMPRESSED = bytes.fromhex(
    next(line for line in VECTORS.read_text(encoding="utf-8").splitlines()
         if line.startswith("### RegisterBrokerBody compressed hex: ")).split(": ", 1)[1]
)
MAX_FRAME = 1 << 20
# Built once: a stream inflating to twice the limit, and the huge-ext-map frames.
BOMB = zlib.compress(b"\x00" * (2 * MAX_FRAME), 9)
_EXT_FRAMES: dict[tuple[int, int], bytes] = {}
_DEEP: dict[tuple[int, int], bytes] = {}


def consume(cmd: RemotingCommand) -> None:
    """Run a decoded command through what a listener would do with it."""
    ext = cmd.ext_fields
    for name in ("brokerId", "bodyCrc32", "heartbeatTimeoutMillis", "topic"):
        try:
            rm.parse_long(ext, name, required=False)
        except RemotingBodyError:
            pass
    rm.parse_bool(ext, "compressed")
    rm.wants_standard_json(cmd.version, ext)
    for step in (
        lambda: rm.check_body_crc32(cmd.body, ext),
        lambda: rm.decode_register_broker_body(
            cmd.body, compressed=rm.parse_bool(ext, "compressed") or cmd.body[:1] == b"\x78",
            version=cmd.version, max_inflated_bytes=MAX_FRAME),
        lambda: rm.decode_topic_route_data(cmd.body),
        lambda: rm.decode_data_version(cmd.body),
        lambda: rm.loads_lenient(cmd.body),
    ):
        try:
            step()
        except RemotingBodyError:
            pass
    # Whatever decoded must encode again in both header forms (ValueError is
    # allowed only for values a ROCKETMQ header cannot carry).
    rm.encode_command(cmd, rm.SERIALIZE_JSON)
    try:
        rm.encode_command(cmd, rm.SERIALIZE_ROCKETMQ)
    except ValueError:
        assert not (-(2**15) <= cmd.code < 2**15 and -(2**15) <= cmd.version < 2**15)


def drive(data: bytes, rnd: random.Random | None = None) -> int:
    """Feed `data` (in random chunks when `rnd` is given); return the number of commands."""
    dec = FrameDecoder(max_frame_bytes=MAX_FRAME)
    n = 0
    try:
        if rnd is None:
            chunks = [data]
        else:
            cuts = sorted(rnd.sample(range(len(data) + 1), min(len(data), rnd.randint(0, 4))))
            chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        for chunk in chunks:
            for cmd in dec.feed(chunk):
                n += 1
                consume(cmd)
    except RemotingFrameError as exc:
        for cmd in exc.commands:
            consume(cmd)
        assert len(str(exc)) < 400
    return n


def frame_with(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), stype << 24 | len(header)) + header + body


def deep_json(rnd: random.Random) -> bytes:
    key = (rnd.choice([50, 500, 3000, 20000]), rnd.randrange(3))
    if key not in _DEEP:
        opener, closer = [(b"[", b"]"), (b'{"a":', b"}"), (b"{0:", b"}")][key[1]]
        _DEEP[key] = opener * key[0] + b"1" + closer * key[0]
    return _DEEP[key]


def mutate(data: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(1, 8)):
        op = rnd.random()
        if not b:
            b.append(rnd.randrange(256))
        elif op < 0.5:
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        elif op < 0.7:
            del b[rnd.randrange(len(b))]
        elif op < 0.9:
            b.insert(rnd.randrange(len(b) + 1), rnd.randrange(256))
        else:
            i = rnd.randrange(len(b))
            b[i:i] = b[i : i + rnd.randint(1, 16)]
    return bytes(b)


def gen_input(rnd: random.Random) -> bytes:
    # The big inputs (deep JSON, huge ext maps) are rarer so the run stays short.
    kind = rnd.choices(range(10), weights=[12, 12, 14, 12, 10, 10, 3, 10, 3, 14])[0]
    if kind == 0:  # random bytes, sometimes behind a plausible length
        raw = rnd.randbytes(rnd.randint(0, 300))
        return struct.pack(">i", len(raw)) + raw if rnd.random() < 0.5 else raw
    if kind == 1:  # truncated golden frames
        g = rnd.choice(GOLDEN)
        return g[: rnd.randint(0, len(g))]
    if kind == 2:  # mutated golden frames, several in a row
        return b"".join(mutate(rnd.choice(GOLDEN), rnd) for _ in range(rnd.randint(1, 3)))
    if kind == 3:  # lying length / header-length / type words
        g = bytearray(rnd.choice(GOLDEN))
        if rnd.random() < 0.5:
            struct.pack_into(">i", g, 0, rnd.choice([-1, 0, 1, 3, 4, 5, len(g), 2**31 - 1, -(2**31), rnd.randint(-10, 2000)]))
        else:
            struct.pack_into(">I", g, 4, rnd.randrange(2**32))
        return bytes(g)
    if kind == 4:  # ROCKETMQ headers with lying inner lengths
        g = bytearray(GOLDEN[1])
        pos = rnd.choice([8 + 13, 8 + 17, 8 + 21, 8 + 23, 8 + 28])
        fmt = ">h" if pos == 8 + 21 else ">i"
        lim = 2**15 if fmt == ">h" else 2**31
        struct.pack_into(fmt, g, pos, rnd.randint(-lim, lim - 1) if rnd.random() < 0.5 else rnd.randint(-2, 60))
        return bytes(g)
    if kind == 5:  # REGISTER_BROKER with a mutated or bomb-like compressed body
        body = rnd.choice([
            mutate(COMPRESSED, rnd),
            COMPRESSED[: rnd.randint(0, len(COMPRESSED))],
            zlib.compress(b"\x00\x00\x00\x05" + rnd.randbytes(rnd.randint(0, 64))),
            zlib.compress(b"\x7f\xff\xff\xff" * rnd.randint(1, 64)),
            BOMB if rnd.random() < 0.5 else BOMB[: rnd.randint(10, len(BOMB))],
            b"\x78\xda" + rnd.randbytes(rnd.randint(0, 50)),
        ])
        ext = {"compressed": "true", "bodyCrc32": rnd.choice(["0", str(rm.body_crc32(body)), "123", "x"])}
        hdr = rm.encode_json_header(RemotingCommand(code=103, version=rnd.choice([36, 400, 413, 479]), ext_fields=ext))
        return frame_with(hdr, body)
    if kind == 6:  # deep JSON in the body (and now and then in the header)
        if rnd.random() < 0.2:
            return frame_with(b'{"code":1,"x":' + deep_json(rnd) + b"}")
        hdr = rm.encode_json_header(RemotingCommand(code=rnd.choice([103, 217, 322]), version=479, ext_fields={}))
        return frame_with(hdr, deep_json(rnd))
    if kind == 7:  # plain JSON bodies, mutated
        hdr = rm.encode_json_header(RemotingCommand(code=103, version=479, ext_fields={"compressed": "false"}))
        g = GOLDEN[-1] if rnd.random() < 0.5 else GOLDEN[5]
        return frame_with(hdr, mutate(g[8 + struct.unpack(">i", g[4:8])[0] & 0xFFFFFF :], rnd))
    if kind == 8:  # huge ext maps, either header type, now and then over the bound
        key = (rnd.choice([10, 500, rm.MAX_EXT_FIELDS, rm.MAX_EXT_FIELDS + 1, 5000]), rnd.randrange(2))
        if key not in _EXT_FRAMES:
            ext = {f"k{i}": "v" * (i % 4) for i in range(key[0])}
            _EXT_FRAMES[key] = rm.encode_command(RemotingCommand(code=103, ext_fields=ext), key[1])
        data = _EXT_FRAMES[key]
        return mutate(data, rnd) if rnd.random() < 0.3 else data
    # kind 9: random JSON-ish headers
    alphabet = b'{}[]":,0123456789-truefalsn extFieldscodeversion\\u00'
    hdr = bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 80)))
    return frame_with(hdr, rnd.randbytes(rnd.randint(0, 20)), stype=rnd.randrange(2))


@pytest.mark.timeout(300)
def test_random_fuzz_only_documented_errors_escape(capsys):
    seed = int(os.environ.get("ZNS_FUZZ_SEED", "20261201"))
    count = int(os.environ.get("ZNS_FUZZ_INPUTS", "20000"))
    rnd = random.Random(seed)
    start = time.perf_counter()
    decoded = 0
    slowest = 0.0
    for _ in range(count):
        data = gen_input(rnd)
        t = time.perf_counter()
        decoded += drive(data, rnd if rnd.random() < 0.3 else None)
        slowest = max(slowest, time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nremoting fuzz: {count} inputs (seed {seed}), {decoded} commands decoded, "
              f"{elapsed:.1f} s, slowest input {slowest * 1000:.0f} ms")
    # The codec alone; tests/test_remoting_live_fuzz.py drives 12,000 more inputs (by
    # default) through the codec and a live listener together.
    assert count >= 20_000
    # No input may take long (work is linear in its size); generous for a loaded CI machine.
    assert slowest < 5.0


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    golden=st.sampled_from(GOLDEN),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.binary(max_size=6)), max_size=5),
    cut=st.integers(0, 10_000),
    chunk=st.integers(1, 64),
)
def test_hypothesis_mutated_frames(golden, edits, cut, chunk):
    data = bytearray(golden)
    for pos, repl in edits:
        p = pos % (len(data) + 1)
        data[p : p + len(repl)] = repl
    data = bytes(data[: max(cut, 8)])
    dec = FrameDecoder(max_frame_bytes=MAX_FRAME)
    try:
        for i in range(0, len(data), chunk):
            for cmd in dec.feed(data[i : i + chunk]):
                consume(cmd)
    except RemotingFrameError:
        pass

"""Fuzz the real decode + dispatch path (`NameService.respond`) and a live server.

Inputs: random bytes, truncated and bit-flipped MessagePack, huge length
headers, deep nesting, huge maps, wrong types and oversized strings in every
field, splices of valid requests, many frames per message. Every input must
get a well-formed reply that is never `internal` (or, over the socket, a
disconnect for an oversized message), and nothing may change what `snapshot`
returns. Structurally valid writes cannot promise that (a mutated
registration may well be a valid one), so they go to a scratch service
instead, where they must succeed or fail cleanly, all-or-nothing.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import Peer, observable, register_fields
from zns.core import schema
from zns.drivers.kv_file import KvStore
from zns.drivers.server import MAX_ENVELOPE_FRAMES
from zns.core.service import NameService

CODES = {"bad_request", "unknown_op", "not_found", "no_permission", "conflict", "busy"}
READ_OPS = schema.CLIENT_OPS | {"kv_get", "kv_list"}
NOW = 10_000_000

QUEUE = dict(broker_name="broker-a", read_queues=4, write_queues=4, perm=6, sys_flag=0)
SEEDS: list[dict[str, Any]] = [
    {"op": "register_broker", "id": 7, **register_fields(topics={
        "TopicA": {}, "TopicB": {"read_queues": 8, "perm": 7, "order": True}}),
     "ha_addr": "10.0.0.1:10912", "zone": "z1", "filter_servers": ["10.0.0.9:1"],
     "data_version": {"state": 1, "timestamp": 2, "counter": 3}, "heartbeat_timeout_ms": 5000},
    {"op": "heartbeat", "id": 1, **register_fields(), "data_version": {"state": 1}},
    {"op": "unregister_broker", "id": 2, **register_fields()},
    {"op": "get_route", "id": 3, "topic": "TopicA", "zone": "z1"},
    {"op": "get_routes", "id": 4, "topics": ["TopicA", "Nope", "TopicB"]},
    {"op": "get_cluster_info", "id": 5},
    {"op": "get_topics", "id": 6, "cluster": "c1", "sys_flag": 1},
    {"op": "snapshot", "id": 8},
    {"op": "status", "id": 9},
    {"op": "wipe_write_perm", "id": 10, "broker_name": "broker-a"},
    {"op": "add_write_perm", "id": 11, "broker_name": "broker-a"},
    {"op": "delete_topic", "id": 12, "topic": "TopicA", "cluster": "c1"},
    {"op": "register_topic", "id": 13, "topic": "TopicC", "queues": [QUEUE]},
    {"op": "kv_put", "id": 14, "namespace": "ns", "key": "k", "value": "v"},
    {"op": "kv_get", "id": 15, "namespace": "ns", "key": "k"},
    {"op": "kv_delete", "id": 16, "namespace": "ns", "key": "k"},
    {"op": "kv_list", "id": 17, "namespace": "ns"},
]
SEED_BODIES = [schema.encode(s) for s in SEEDS]

# MessagePack headers that announce far more than follows: arrays, maps, str, bin, ext.
HUGE_HEADERS = [
    b"\xdc\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xde\xff\xff", b"\xdf\xff\xff\xff\xff",
    b"\xd9\xff", b"\xda\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc4\xff", b"\xc5\xff\xff",
    b"\xc6\xff\xff\xff\xff", b"\xc7\xff\x01", b"\xc8\xff\xff\x01", b"\xc9\xff\xff\xff\xff\x01",
    b"\xcf" + b"\xff" * 8, b"\xd3\x80" + b"\0" * 7, b"\xcb\x7f\xf8" + b"\0" * 6, b"\xc1",
    b"\xd4\x00\x00", b"\xd6\xff\x00\x00\x00\x00",  # fixext, including the timestamp ext type
]
WRONG_VALUES: list[Any] = [
    None, True, -1, 0, 2**31, 2**63 - 1, 2**64 - 1, -(2**63), 1.5, float("nan"), "", "x" * 300,
    "é" * 40_000, "a/b", "a\x00b", "\x85", [], {}, [[[[[]]]]], {"op": "status"}, b"\x00\xff",
    msgspec.msgpack.Ext(1, b"x"), list(range(300)), {str(i): i for i in range(300)},
]


class Fuzzer:
    """Cheap seeded generators; each call returns one request body."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        # Weights: the costly kinds (deep, huge) are rarer so 100k inputs fit in seconds.
        weighted = {
            self.random_bytes: 2, self.truncated: 2, self.flipped: 3, self.huge_header: 2,
            self.spliced: 2, self.wrong_field: 4, self.dropped_field: 1, self.odd_op: 1,
            self.deep: 0.2, self.huge_map: 0.03,
        }
        self.kinds = list(weighted)
        self._cum_weights = list(itertools.accumulate(weighted.values()))
        self._huge: list[bytes] = []

    def __call__(self) -> bytes:
        return self.rnd.choices(self.kinds, cum_weights=self._cum_weights)[0]()

    def seed_body(self) -> bytes:
        return self.rnd.choice(SEED_BODIES)

    def random_bytes(self) -> bytes:
        return self.rnd.randbytes(self.rnd.choice((0, 1, 2, 5, 16, 64, 300)))

    def truncated(self) -> bytes:
        body = self.seed_body()
        return body[: self.rnd.randrange(len(body))]

    def flipped(self) -> bytes:
        body = bytearray(self.seed_body())
        for _ in range(self.rnd.randint(1, 6)):
            body[self.rnd.randrange(len(body))] = self.rnd.randrange(256)
        return bytes(body)

    def huge_header(self) -> bytes:
        body = self.seed_body()
        at = self.rnd.randrange(len(body) + 1)
        return body[:at] + self.rnd.choice(HUGE_HEADERS) + body[at + self.rnd.randint(0, 3):]

    def spliced(self) -> bytes:
        a, b = self.seed_body(), self.seed_body()
        return a[: self.rnd.randrange(len(a) + 1)] + b[self.rnd.randrange(len(b) + 1):]

    def fields(self) -> dict[str, Any]:
        return dict(self.rnd.choice(SEEDS))

    def wrong_field(self) -> bytes:
        fields = self.fields()
        names = [k for k in fields if k != "op"] or ["id"]
        name = self.rnd.choice(names + ["topics", "data_version", "queues", "value"])
        fields[name] = self.rnd.choice(WRONG_VALUES)
        if self.rnd.random() < 0.3 and isinstance(fields.get("topics"), dict):
            fields["topics"] = {**fields["topics"],
                                self.rnd.choice(["", "x" * 200, "a b", "T"]): self.rnd.choice(
                                    [{}, {"perm": 99}, {"read_queues": -1}, None, []])}
        return schema.encode(fields)

    def dropped_field(self) -> bytes:
        fields = self.fields()
        fields.pop(self.rnd.choice(list(fields)))
        fields[self.rnd.choice(["extra", "x" * 100, "ID", "Op"])] = self.rnd.choice(WRONG_VALUES)
        return schema.encode(fields)

    def odd_op(self) -> bytes:
        fields = self.fields()
        fields["op"] = self.rnd.choice(
            ["", "STATUS", "status\x00", "error", "route", "hb", "x" * 1000, None, 1, ["status"]]
        )
        return schema.encode(fields)

    def deep(self) -> bytes:
        depth = self.rnd.choice((50, 1_000, 5_000))
        nest = self.rnd.choice((b"\x91", b"\x81\xa1x")) * depth + b"\xc0"
        where = self.rnd.choice(("op", "id", "extra", "top"))
        if where == "top":
            return nest
        if where == "extra":  # an unknown field the decoder must skip
            return b"\x83\xa2op\xa6status\xa2id\x01\xa5extra" + nest
        return b"\x81" + schema.encode(where) + nest

    def huge_map(self) -> bytes:
        """Tens of thousands of entries the decoder must walk, with one bad entry at the
        end (a valid 20k-topic registration is a benchmark, not a fuzz input)."""
        if not self._huge:
            fields = dict(SEEDS[0])
            n = 20_000
            self._huge = [
                schema.encode({**fields, "topics": {**{f"T{i}": {} for i in range(n)},
                                                    "bad topic": {}}}),
                schema.encode({**fields, "filter_servers": ["10.0.0.1:1"] * n + ["no port"]}),
                schema.encode({**SEEDS[12], "queues": [QUEUE] * n + [{**QUEUE, "perm": 16}]}),
                schema.encode({**SEEDS[8], "extra": {str(i): [i] for i in range(n)}}),
            ]
        body = bytearray(self.rnd.choice(self._huge))
        body[self.rnd.randrange(len(body))] = self.rnd.randrange(256)
        return bytes(body)


def seeded_service() -> NameService:
    service = NameService(KvStore(None), epoch="f" * 16, started_at_ms=0)
    for body in (
        {"op": "register_broker", **register_fields(topics={"TopicA": {}, "TopicB": {}})},
        {"op": "register_broker", **register_fields("broker-b", addr="10.0.0.2:1",
                                                    topics={"TopicB": {}})},
        {"op": "kv_put", "namespace": "ns", "key": "k", "value": "v"},
    ):
        reply = schema.decode_reply(service.respond(schema.encode(body), NOW).reply)
        assert not isinstance(reply, schema.Error), reply
    return service


def is_valid_write(body: bytes) -> bool:
    try:
        request = schema.decode_request(body)
    except (msgspec.DecodeError, RecursionError):
        return False
    return schema.request_op(request) not in READ_OPS


def check_reply(body: bytes, reply_body: bytes, counts: Counter) -> None:
    reply = schema.decode_reply(reply_body)  # must be a well-formed reply of ZNS/1
    if isinstance(reply, schema.Error):
        assert reply.code in CODES, (body[:200], reply)
        counts["error"] += 1
        return
    request = schema.decode_request(body)  # a success only for a valid request, same op and id
    assert reply.__struct_config__.tag == schema.request_op(request)
    assert reply.id == request.id
    counts["ok"] += 1


def run_inputs(fuzz, n: int, service: NameService, scratch: NameService) -> Counter:
    counts: Counter = Counter()
    for _ in range(n):
        body = fuzz()
        if is_valid_write(body):
            revision, kv = scratch.table.revision, scratch.kv.list("ns")
            response = scratch.respond(body, NOW)
            before = counts["error"]
            check_reply(body, response.reply, counts)
            if counts["error"] > before:  # a refusal applies nothing
                assert scratch.table.revision == revision and scratch.kv.list("ns") == kv
                assert not response.events
            counts["valid writes (scratch)"] += 1
        else:
            check_reply(body, service.respond(body, NOW).reply, counts)
    return counts


def report(capsys, what: str, n: int, counts: Counter, seconds: float) -> None:
    with capsys.disabled():
        print(f"\nfuzz: {n} inputs ({what}), {counts['error']} errors, {counts['ok']} ok "
              f"({counts['valid writes (scratch)']} of them valid writes on a scratch service), "
              f"{counts['disconnect']} disconnects, {seconds:.1f} s")


# Work bounded by count; the timeout only guards against a hang (37 s at load 40).
@pytest.mark.timeout(600)
def test_fuzz_respond(capsys):
    service, scratch = seeded_service(), seeded_service()
    before = observable(service)
    # With the live server's 30,000 and the structured 500: the at least 100,000 inputs a run
    # that issue 5 asks for (120,000 here until the suite's time asked for less).
    n = 70_000
    start = time.monotonic()
    counts = run_inputs(Fuzzer(seed=20261130), n, service, scratch)
    assert observable(service) == before
    # What zns.core.limits relies on (the weight ledger, counts, indexes) stayed exact
    # through thousands of valid writes.
    scratch.table.check_invariants()
    assert counts["error"] > n // 2 and counts["ok"] > 0
    report(capsys, "random and mutated, NameService.respond", n, counts, time.monotonic() - start)


def msgpack_values() -> st.SearchStrategy[Any]:
    scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
               | st.text(max_size=40) | st.binary(max_size=20))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                        | st.dictionaries(st.text(max_size=10), inner, max_size=5), max_leaves=10)


FIELD_NAMES = sorted({name for seed in SEEDS for name in seed} | {"extra"})
# Built once: hypothesis validates a recursive strategy when it is first drawn from, and a
# new one per draw cost ~0.2 s an example (nearly all of this test's time).
MSGPACK_VALUES = msgpack_values()


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A seed request with one or two fields (its own or another op's) set to any value."""
    fields = dict(draw(st.sampled_from(SEEDS)))
    for name in draw(st.lists(st.sampled_from(FIELD_NAMES), min_size=1, max_size=2)):
        fields[name] = draw(MSGPACK_VALUES)
    return fields


@pytest.mark.timeout(600)  # as test_fuzz_respond (70 s at load 40)
def test_fuzz_respond_structured(capsys):
    """hypothesis for structure: every op with every field of any MessagePack type."""
    service, scratch = seeded_service(), seeded_service()
    before = observable(service)
    counts: Counter = Counter()
    bodies = iter(())

    @settings(max_examples=500, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(requests())
    def run(fields: dict[str, Any]) -> None:
        nonlocal bodies
        bodies = iter([schema.encode(fields)])
        counts.update(run_inputs(lambda: next(bodies), 1, service, scratch))
        counts["inputs"] += 1

    start = time.monotonic()
    run()
    assert observable(service) == before
    report(capsys, "hypothesis structures, NameService.respond", counts["inputs"], counts,
           time.monotonic() - start)


def frames_for(fuzz: Fuzzer, rnd: random.Random) -> list[bytes]:
    """One message as a DEALER sends it: the body last, sometimes after many frames."""
    while True:
        body = fuzz()
        if not is_valid_write(body):
            break
    roll = rnd.random()
    if roll < 0.05:
        return [b""] * rnd.randint(1, 100) + [body]
    if roll < 0.1:
        return [rnd.randbytes(rnd.randint(0, 50)) for _ in range(rnd.randint(1, 20))] + [body]
    return [body]


@pytest.mark.timeout(120)
def test_fuzz_live_server(make_server, capsys):
    srv = make_server(max_message_bytes=4 << 20)
    admin = srv.peer()
    admin.ok("register_broker", **register_fields(topics={"TopicA": {}, "TopicB": {}}))
    admin.ok("kv_put", namespace="ns", key="k", value="v")
    before = admin.ok("snapshot")
    kv_before = admin.ok("kv_list", namespace="ns").entries
    fuzz, rnd = Fuzzer(seed=7), random.Random(8)
    counts: Counter = Counter()
    n, batch = 30_000, 500
    dealers = [Peer(srv.router) for _ in range(4)]
    start = time.monotonic()
    try:
        sent = 0
        while sent < n:
            for peer in dealers:
                msgs = [frames_for(fuzz, rnd) for _ in range(batch)]
                for frames in msgs:
                    peer.dealer.send_multipart(frames)
                for frames in msgs:
                    if len(frames) - 1 > MAX_ENVELOPE_FRAMES:
                        # §1: dropped unanswered; the next reply on this DEALER must be
                        # the next message's (checked by its envelope below).
                        counts["dropped"] += 1
                        continue
                    reply = peer.recv_raw(timeout=30)  # the server neither crashes nor hangs
                    assert reply[:-1] == frames[:-1]  # the envelope comes back unchanged
                    check_reply(frames[-1], reply[-1], counts)
                sent += batch
        # Oversized: the socket drops the peer (no reply); it reconnects and is served.
        big = Peer(srv.router)
        dealers.append(big)
        big.send_raw(b"\x81\xa2op" + b"\xdb" + (5 << 20).to_bytes(4, "big") + b"x" * (5 << 20))
        assert not big.dealer.poll(300)
        counts["disconnect"] += 1
        assert big.ok("status").epoch == before.epoch
    finally:
        for peer in dealers:
            peer.close()
    assert srv.never_crashed()
    after = admin.ok("snapshot")
    assert (after.revision, after.routes, after.brokers, after.clusters) == (
        before.revision, before.routes, before.brokers, before.clusters)
    assert admin.ok("kv_list", namespace="ns").entries == kv_before
    report(capsys, "random and mutated, live server", n + 1, counts, time.monotonic() - start)

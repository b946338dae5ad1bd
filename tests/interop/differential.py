"""Differential testing: the same remoting requests into the Java NameServer and into zns.

A seeded generator (:class:`Generator`) writes sequences of steps -- full and
single-topic registrations with the same or a new data version, several broker
names, masters and slaves, two clusters, two addresses for one (name, id), zones
(non-ASCII ones too), filter servers, registrations with and without their optional
headers (enableActingMaster, compressed, bodyCrc32), with compressed bodies, binary
headers and wrong CRCs, registrations over a second connection while the first stays
open, unregistrations, closes of either connection, one broker expiry per sequence
(5.x), heartbeats (904) and data-version queries (322), topic deletion (with and
without a cluster), wipe/add write perm, REGISTER_TOPIC, KV writes -- and
:class:`Differential` sends every step to both servers over remoting (a client built
on ``zns.core.remoting``'s codec), then sends both the same reads -- 105 (standard
and legacy form, zone mode for five zones), 106, 206, 224 per cluster, 304, 311-313,
101 per key, 219 per namespace, 901 per broker name, 322 per broker address -- and
compares the replies: code, remark, ext fields, body bytes, flag, language and
serialize type.

Normalized, with the reason (docs/protocol.md §15 pins each with a test):

- the reply header's ``version``: zns announces the version whose NameServer it
  implements (5.3.3, 479); a Java oracle of another version announces its own.
  Both are checked against those constants, not against each other.
- against a 4.x oracle only: BrokerData's ``enableActingMaster`` and DataVersion's
  ``stateVersion`` (both added in 5.0; the generator's state versions are 0) are
  removed from zns's bodies; the generator sends no 5.0 codes, no binary header
  and registers masters only.
- against a 5.5.0 oracle only: its JSON bodies carry non-ASCII characters (the
  generator's zone names) as UTF-8 where 5.3.3 and zns write ``\\uXXXX`` escapes in
  some bodies (the standard route form); escapes of non-ASCII characters are read
  as UTF-8 in both bodies before comparing (the same JSON text).
- TOPIC_NOT_EXIST's remark: Java appends ``FAQ_SUFFIX`` (a link to its FAQ, which
  differs by version); zns's remark is the wire contract's, without it. Only that
  suffix of a code-17 remark is removed from Java's reply before comparing.

Nothing else is normalized. Timing: a Java 5.x NameServer applies UNREGISTER_BROKER
and a closed connection's removal on a background thread (BatchUnregistrationService),
so after those steps the reads are repeated until both servers agree or a deadline
passes (and so after the step that follows them: both servers may agree at once on
what they held before, then apply it); after an expiry step nothing is sent until
neither lists the address; every other step is compared once.

Differences zns keeps (docs/protocol.md §15, each pinned by
test_known_differences_are_as_documented) are generated only with ``explore``
(bench/differential.py --explore finds them again): registrations into the other
cluster, one address under two broker names on one connection, unregistrations
naming the wrong cluster, name or address, the 322 and same-version registration of
an address another address took the id of. Never generated: a single-topic
registration of a broker id the name does not hold (Java refuses it, zns applies
it), REGISTER_TOPIC naming an unknown broker name, enableActingMaster=true (§11).

Used by tests/interop/test_differential.py (a few thousand steps in ``make test``) and
bench/differential.py (long runs).
"""

from __future__ import annotations

import itertools
import json
import random
import re
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from zns.core.remoting import (  # noqa: E402
    SERIALIZE_JSON, SERIALIZE_ROCKETMQ, FrameDecoder, RemotingCommand, encode_command,
)

ZNS_VERSION = 479  # the MQVersion ordinal zns announces (a 5.3.3 NameServer's)
# How long asynchronous removals may take in the Java NameServer (a closed connection reaches
# its route table through Netty's event loop and a batch unregistration thread). A deadline,
# not a wait: a step that agrees at once costs nothing. 5 s was too short at load 30 (seen
# once: a closed broker still listed by Java 5.3.3 when zns had already dropped it).
SETTLE_S = 20.0
# The Java NameServer's scanNotActiveBrokerInterval for the expiry steps (5.x; 4.x scans every
# 10 s with a fixed 120 s timeout, so its differential has no expiry step).
EXPIRY_SCAN_MS = 200
JAVA_CONFIG = {"scanNotActiveBrokerInterval": EXPIRY_SCAN_MS}  # a 4.x NameServer ignores it


class RemotingConnection:
    """One TCP connection speaking RocketMQ remoting; requests may be pipelined."""

    def __init__(self, addr: str, timeout: float = 15.0) -> None:
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder()
        self._opaque = itertools.count(1)

    def call_many(self, requests: list[RemotingCommand]) -> list[RemotingCommand]:
        """Send all, then collect each reply by its opaque; replies in request order."""
        return self.collect(self.send(requests))

    def send(self, requests: list[RemotingCommand]) -> dict[int, int]:
        """Send all without waiting; pass the result to :meth:`collect` (requests to other
        connections may be sent in between, so that the servers work at the same time)."""
        want: dict[int, int] = {}
        frames = []
        for i, cmd in enumerate(requests):
            cmd.opaque = next(self._opaque)
            want[cmd.opaque] = i
            frames.append(encode_command(cmd, cmd.serialize_type))
        self.sock.sendall(b"".join(frames))
        return want

    def collect(self, want: dict[int, int]) -> list[RemotingCommand]:
        out: list[RemotingCommand | None] = [None] * len(want)
        left = len(want)
        while left:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed the connection")
            for reply in self.decoder.feed(data):
                i = want.pop(reply.opaque, None)
                if i is not None and reply.is_response:
                    out[i] = reply
                    left -= 1
        return out  # type: ignore[return-value]

    def call(self, cmd: RemotingCommand) -> RemotingCommand:
        return self.call_many([cmd])[0]

    def close(self) -> None:
        self.sock.close()


class ZnsProcess:
    """`zns serve --remoting 127.0.0.1:0` in a subprocess (ZNS/1 sockets on ephemeral ports)."""

    def __init__(self, workdir: Path, *args: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"zns-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "zns", "serve", "--router", "tcp://127.0.0.1:*",
               "--pub", "tcp://127.0.0.1:*", "--kv-path", str(workdir / "kv.json"),
               "--remoting", "127.0.0.1:0", *args]
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ZNS_")}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + 90  # a loaded machine (Python's start-up under nice 19 beside JVMs)
        self.addr = ""
        while not self.addr:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zns exited: {self.log_path.read_text()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"zns did not start: {self.log_path.read_text()}")
            time.sleep(0.05)
            for line in self.log_path.read_text().splitlines():
                if "RocketMQ remoting listener on" in line:
                    self.addr = line.rsplit(" ", 1)[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.log.close()


# ---- requests -----------------------------------------------------------------------------

def request(code: int, ext: dict[str, str] | None = None, body: bytes = b"", version: int = 479,
            binary: bool = False) -> RemotingCommand:
    """`binary`: the header in RocketMQ's binary layout (ROCKETMQ) instead of JSON."""
    return RemotingCommand(code=code, version=version, ext_fields=ext, body=body,
                           serialize_type=SERIALIZE_ROCKETMQ if binary else SERIALIZE_JSON)


@dataclass
class Slot:
    """One broker process: a broker name, id and address, with its own connection to each server."""

    name: str
    broker_id: int
    addr: str
    cluster: str
    zone: str = ""
    counter: int = 0  # its data version's counter (timestamp fixed per slot)
    timestamp: int = 0
    topics: dict[str, dict[str, int]] = field(default_factory=dict)  # what it last registered

    def data_version(self) -> dict[str, int]:
        return {"counter": self.counter, "stateVersion": 0, "timestamp": self.timestamp}


@dataclass
class Headers:
    """How a REGISTER_BROKER is sent: which optional ext fields, which body form, which header."""

    acting_master: bool = True  # send enableActingMaster=false (a 5.x broker); absent: a 4.x one
    compressed: bool = False  # the zlib form of a 4.x broker with compressedRegister=true
    compressed_field: bool = True  # send compressed=false when not compressed (absent otherwise)
    crc: str = "right"  # "right", "zero" (not checked), "absent" or "wrong"
    binary: bool = False  # a ROCKETMQ (binary) header
    timeout_ms: int | None = None  # heartbeatTimeoutMillis (absent: Java's and zns's 120 s)


def register_request(slot: Slot, topics: dict[str, dict[str, int]], cluster: str, zone: str,
                     filter_servers: list[str], version: int,
                     headers: Headers | None = None) -> RemotingCommand:
    """REGISTER_BROKER as a broker sends it; by default as a 5.x broker does (a plain
    RegisterBrokerBody, its CRC32 in ext, enableActingMaster=false, a JSON header)."""
    h = headers or Headers()
    if h.compressed:
        body = _compressed_body(slot.data_version(), topics, filter_servers, version)
    else:
        table = {
            t: {"attributes": {}, "order": False, "perm": c["perm"], "readQueueNums": c["read"],
                "topicFilterType": "SINGLE_TAG", "topicName": t, "topicSysFlag": c["sys_flag"],
                "writeQueueNums": c["write"]}
            for t, c in topics.items()
        }
        body = json.dumps({"filterServerList": filter_servers, "topicConfigSerializeWrapper": {
            "dataVersion": slot.data_version(), "topicConfigTable": table}},
            separators=(",", ":")).encode()
    crc = {"right": str(_crc(body)), "zero": "0", "absent": None,
           "wrong": str((_crc(body) + 1) & 0x7FFFFFFF)}[h.crc]
    ext = {"brokerId": str(slot.broker_id), "bodyCrc32": crc, "clusterName": cluster,
           "brokerAddr": slot.addr, "enableActingMaster": "false" if h.acting_master else None,
           "haServerAddr": _ha(slot.addr),
           "compressed": "true" if h.compressed else ("false" if h.compressed_field else None),
           "brokerName": slot.name,
           "heartbeatTimeoutMillis": None if h.timeout_ms is None else str(h.timeout_ms)}
    if zone:
        ext["__ZONE_NAME"] = zone
    return request(103, {k: v for k, v in ext.items() if v is not None}, body, version, h.binary)


def _compressed_body(data_version: dict[str, int], topics: dict[str, dict[str, int]],
                     filter_servers: list[str], version: int) -> bytes:
    """RegisterBrokerBody.encode(true): zlib over length-prefixed sections (a topic line has
    no sys flag: it arrives as 0). The mapping count only from brokers of 5.0 (413) on."""
    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    out = chunk(json.dumps(data_version, separators=(",", ":")).encode())
    out += struct.pack(">i", len(topics))
    for t, c in topics.items():
        out += chunk(f"{t} {c['read']} {c['write']} {c['perm']} SINGLE_TAG ".encode())
    out += chunk(json.dumps(filter_servers, separators=(",", ":")).encode())
    if version >= 413:
        out += struct.pack(">i", 0)
    return zlib.compress(out, 9)


def _crc(body: bytes) -> int:
    # RocketMQ's UtilAll.crc32: java.util.zip.CRC32 & 0x7FFFFFFF.
    return zlib.crc32(body) & 0x7FFFFFFF


def _ha(addr: str) -> str:
    host, port = addr.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


# ---- the generator ------------------------------------------------------------------------

# The zones brokers register (5.x) and the zones a zone-mode route asks for: Java compares
# them with String.equalsIgnoreCase, one character at a time with one-character case mappings
# (ß has none in upper case, the Turkish dotless ı upper-cases to I, Deseret is outside the BMP).
ZONES = ["Straße", "ı", "\U00010400"]
ASKED_ZONES = ["STRASSE", "STRAßE", "I", "i", "\U00010428"]
LEAVING_S = 5.0  # the longest wait for a server to apply a close (`_await_leaving`)
SHORT_TIMEOUT_MS = 1000  # the expiry step's heartbeatTimeoutMillis (zns's lowest)


@dataclass
class Step:
    """One write: requests over a connection (a slot's, or the admin one), or a close."""

    what: str
    kind: str  # what the generator meant, for coverage (Generator.made)
    slot: Slot | None = None  # whose connection carries it; None: the admin connection
    conn: str | None = None  # that connection's key (Side.conns); None: the admin connection
    requests: list[RemotingCommand] = field(default_factory=list)
    close: bool = False  # close that connection instead
    settle: bool = False  # the Java NameServer applies it asynchronously
    expires: str = ""  # an address both servers must drop by expiry (nothing sent meanwhile)
    leaves: str = ""  # the address of the broker whose connection it closes (`_await_leaving`)


@dataclass
class Observed:
    """What the servers agreed on after the last step (read from the 106 reply)."""

    addrs: dict[str, dict[int, str]] = field(default_factory=dict)  # broker name -> id -> addr
    clusters: dict[str, list[str]] = field(default_factory=dict)

    def holder(self, name: str, broker_id: int) -> str | None:
        return self.addrs.get(name, {}).get(broker_id)

    def listed(self, addr: str) -> bool:
        return any(addr in ids.values() for ids in self.addrs.values())


class Generator:
    """Random steps over a small universe of names (fresh per sequence: `prefix`).

    Three broker names in two clusters, ids 0 and 1 (5.x), a second address for name A's
    id 0 (a replaced host), each address on connections of its own. A registration varies
    its headers (enableActingMaster present or absent, compressed or plain body,
    `compressed` absent, bodyCrc32 right, 0, absent or wrong, a binary header), may go over
    a new connection while the old one stays open (a broker that reconnected), and a close
    may close either. `explore` adds what docs/protocol.md §15 lists as differences zns
    keeps, so that a long run (bench/differential.py --explore) finds each again:
    registrations into the other cluster, one address under two broker names on one
    connection, unregistrations naming the wrong cluster, name or address, and what a
    displaced address still does in Java (queries, same-version registrations).
    `expiry` (5.x with a short scanNotActiveBrokerInterval): a registration with a 1 s
    heartbeat timeout, then nothing until both servers dropped it.
    """

    def __init__(self, rng: random.Random, prefix: str, net: int, *, v4: bool = False,
                 version: int = 479, explore: bool = False, expiry: bool = False) -> None:
        """`v4` (a 4.x oracle): no 904, 217, 901 nor zones, which came with 5.0, masters
        only (a 4.x NameServer never takes topics from a slave) and JSON headers only."""
        self.rng = rng
        self.explore = explore
        # Each expiry step costs the 1 s timeout and Java's scan: one per sequence.
        self.expiries_left = 1 if expiry and not v4 else 0
        self.prefix = prefix
        self.version = version
        self.v4 = v4
        self.heartbeat_904 = not v4
        self.clusters = [f"{prefix}c1", f"{prefix}c2"]
        self.zones = [""] if v4 else ["", f"{prefix}z1", *ZONES]
        self.asked_zones = [] if v4 else [f"{prefix}Z1", *ASKED_ZONES]
        self.topics = [f"{prefix}T{i}" for i in range(1, 6)]
        self.names = [f"{prefix}b{c}" for c in "ABC"]
        self.namespaces = [f"{prefix}ns", "ORDER_TOPIC_CONFIG"]
        self.kv_keys = [self.topics[0], self.topics[1], f"{prefix}k"]
        self.slots: list[Slot] = []
        self.made: dict[str, int] = {}  # step kinds written, for the coverage test
        # Connections: each address's current one is f"{addr}#{n}"; older ones stay open
        # until a close step closes them.
        self.current: dict[str, int] = {}
        self.older: dict[str, list[str]] = {}
        # Addresses another address took the (name, id) of: Java keeps their liveness (their
        # 322 and a same-version registration answer from it), zns forgets them (§15).
        self.lingering: set[str] = set()
        # Addresses closed, unregistered or expiring since they last registered: `seen` may
        # still list them (both servers remove them a moment later), so no single-topic
        # registration for them (Java refuses one from an id the name does not hold).
        self.leaving: set[str] = set()
        ts = 1_700_000_000_000 + rng.randrange(1_000_000)
        base = f"127.{net // 250}.{net % 250}"
        for i, name in enumerate(self.names):
            home = self.clusters[0] if i < 2 else self.clusters[1]
            for j, broker_id in enumerate((0,) if v4 else (0, 1)):
                self.slots.append(Slot(name, broker_id, f"{base}.{1 + 2 * i + j}:10911", home,
                                       timestamp=ts + 10 * i + j))
        # A second host for name A's master (a replaced broker whose old host lingers).
        self.slots.append(Slot(self.names[0], 0, f"{base}.7:10911", self.clusters[0], timestamp=ts + 7))
        if explore and not v4:
            # Name C's id 1 at name B's slave address: one address under two names, one connection.
            self.slots.append(Slot(self.names[2], 1, self.slots[3].addr, self.clusters[0],
                                   timestamp=ts + 3))

    def conn_key(self, slot: Slot) -> str:
        return f"{slot.addr}#{self.current.get(slot.addr, 0)}"

    def _made(self, kind: str) -> str:
        self.made[kind] = self.made.get(kind, 0) + 1
        return kind

    def topic_config(self) -> dict[str, int]:
        r = self.rng
        return {"read": r.choice((1, 4, 8)), "write": r.choice((1, 4, 8)), "perm": r.choice((6, 6, 6, 4, 2, 7)),
                "sys_flag": r.choice((0, 0, 0, 1, 2, 3))}

    def headers(self) -> Headers:
        r = self.rng
        h = Headers(acting_master=r.random() < 0.8, compressed=r.random() < 0.15,
                    compressed_field=r.random() < 0.8,
                    crc=r.choice(("right",) * 6 + ("zero", "absent")),
                    binary=not self.v4 and r.random() < 0.15)
        for kind, on in (("no enableActingMaster", not h.acting_master), ("compressed", h.compressed),
                         ("binary header", h.binary), (f"crc {h.crc}", True)):
            if on:
                self._made(kind)
        return h

    def step(self, seen: Observed) -> Step:
        r = self.rng
        kinds = ["register"] * 6 + ["incremental"] * 3 + ["unregister", "close", "heartbeat", "query",
                 "delete_topic", "wipe", "add", "register_topic", "kv_put", "kv_put", "kv_delete",
                 "bad_crc"]
        if self.expiries_left:
            kinds.append("expire")
        kind = r.choice(kinds)
        slot = r.choice(self.slots)
        if kind in ("register", "expire", "bad_crc"):
            return self._register(slot, seen, kind)
        if kind == "incremental":
            # What `updateTopic -b` makes a broker send: one topic, a new data version. Only
            # for an id the name holds already (otherwise Java refuses it; see the docstring).
            if seen.holder(slot.name, slot.broker_id) != slot.addr or slot.addr in self.leaving:
                return self.step(seen)
            topic = r.choice(self.topics)
            slot.topics[topic] = self.topic_config()
            if r.random() < 0.8 or self.v4:
                slot.counter += 1
            return Step(f"incremental {slot.name}/{slot.broker_id} v{slot.counter} {topic}",
                        self._made("incremental"), slot, self.conn_key(slot),
                        [register_request(slot, {topic: slot.topics[topic]}, slot.cluster, slot.zone, [],
                                          self.version)])
        if kind == "unregister":
            return self._unregister(slot, seen)
        if kind == "close":
            older = self.older.get(slot.addr, [])
            if older and r.random() < 0.5:  # an older connection: the address re-registered since
                key = older.pop(0)
                return Step(f"close an older connection of {slot.addr} ({key})",
                            self._made("close an older connection"), slot, key, close=True, settle=True)
            key = self.conn_key(slot)
            self.current[slot.addr] = self.current.get(slot.addr, 0) + 1
            self.leaving.add(slot.addr)
            return Step(f"close the connection of {slot.addr}", self._made("close"), slot, key,
                        close=True, settle=True, leaves=slot.addr)
        if kind in ("heartbeat", "query") and slot.addr in self.lingering and not self.explore:
            return self.step(seen)
        binary = not self.v4 and r.random() < 0.15
        if kind == "heartbeat" and self.heartbeat_904:
            return Step(f"heartbeat 904 {slot.addr}", self._made("904"), slot, self.conn_key(slot), [request(904, {
                "brokerName": slot.name, "brokerAddr": slot.addr, "clusterName": slot.cluster,
                "brokerId": str(slot.broker_id)}, version=self.version, binary=binary)])
        if kind in ("heartbeat", "query"):
            dv = slot.data_version() if r.random() < 0.7 else {**slot.data_version(), "counter": slot.counter + 99}
            return Step(f"query 322 {slot.addr} {dv['counter']}", self._made("322"), slot, self.conn_key(slot),
                        [request(322, {"brokerName": slot.name, "brokerAddr": slot.addr,
                                       "clusterName": slot.cluster, "brokerId": str(slot.broker_id)},
                                 json.dumps(dv).encode(), version=self.version, binary=binary)])
        topic = r.choice(self.topics)
        if kind == "delete_topic":
            ext = {"topic": topic}
            if r.random() < 0.5:
                ext["clusterName"] = r.choice(self.clusters)
            return Step(f"delete topic {ext}", self._made("delete topic"), None, None, [request(216, ext)])
        if kind in ("wipe", "add"):
            return Step(f"{kind} write perm of {slot.name}", self._made(kind), None, None,
                        [request(205 if kind == "wipe" else 327, {"brokerName": slot.name})])
        if kind == "register_topic" and self.heartbeat_904:
            known = sorted(seen.addrs)
            if not known:
                return self.step(seen)
            names = r.sample(known, r.randint(1, len(known)))
            queues = [{"brokerName": n, "perm": c["perm"], "readQueueNums": c["read"],
                       "topicSysFlag": c["sys_flag"], "writeQueueNums": c["write"]}
                      for n, c in ((n, self.topic_config()) for n in names)]
            body = json.dumps({"brokerDatas": [], "filterServerTable": {}, "queueDatas": queues}).encode()
            return Step(f"register topic {topic} on {names}", self._made("register topic"), None, None,
                        [request(217, {"topic": topic}, body)])
        ns = r.choice(self.namespaces)
        key = r.choice(self.kv_keys)
        if kind == "kv_put":
            value = r.choice(("v1", "v2", f"{r.choice(self.names)}:4", f"{self.names[0]}:4;{self.names[1]}:8"))
            return Step(f"kv put {ns} {key}={value}", self._made("kv put"), None, None,
                        [request(100, {"namespace": ns, "key": key, "value": value})])
        return Step(f"kv delete {ns} {key}", self._made("kv delete"), None, None,
                    [request(102, {"namespace": ns, "key": key})])

    def _register(self, slot: Slot, seen: Observed, kind: str) -> Step:
        r = self.rng
        cluster = slot.cluster
        if self.explore and r.random() < 0.1:
            cluster = r.choice(self.clusters)
        zone = slot.zone
        if r.random() < 0.05 or (zone and r.random() < 0.05):
            zone = slot.zone = r.choice(self.zones)
        holder = seen.holder(slot.name, slot.broker_id)
        held = holder == slot.addr and slot.addr not in self.leaving
        # A 4.x NameServer applies no topic of a registration whose data version it holds;
        # 5.x (and zns) restore the topics it lacks of that broker (docs/protocol.md §15). Java
        # remembers a displaced address's data version, zns does not (§15): a new one then.
        renew = self.v4 or (slot.addr in self.lingering and not self.explore)
        if r.random() < 0.6 or not slot.topics or renew:
            slot.counter += 1
            if r.random() < 0.5 or not slot.topics:
                # One topic from an id the name does not hold: Java refuses it, zns applies it
                # (a known, documented difference): such a table has two topics or more.
                chosen = r.sample(self.topics, r.randint(1 if held else 2, len(self.topics)))
                slot.topics = {t: slot.topics.get(t) or self.topic_config() for t in chosen}
                for t in r.sample(chosen, r.randint(0, len(chosen))):
                    slot.topics[t] = self.topic_config()
        if not held and len(slot.topics) < 2:
            extra = next(t for t in self.topics if t not in slot.topics)
            slot.topics[extra] = self.topic_config()
        fs = [] if r.random() < 0.85 else [f"127.0.0.1:{r.choice((40001, 40002))}"]
        h = self.headers()
        if kind == "bad_crc":
            h.crc = "wrong"
        if kind == "expire":
            h.timeout_ms = SHORT_TIMEOUT_MS
            self.expiries_left -= 1
        what = (f"{slot.name}/{slot.broker_id} {slot.addr} in {cluster} zone={zone!r} v{slot.counter} "
                f"topics={sorted(slot.topics)} fs={fs} {h}")
        if kind == "bad_crc":  # refused: changes nothing (`leaving` included)
            return Step(f"register with a wrong bodyCrc32 {what}", self._made("wrong crc"), slot,
                        self.conn_key(slot), [register_request(slot, slot.topics, cluster, zone, fs,
                                                               self.version, h)])
        if cluster != slot.cluster:
            self._made("into the other cluster")
        if holder not in (None, slot.addr):
            self.lingering.add(holder)
            self._made("a second address takes the id")
        if slot.addr in self.lingering:
            self._made("a displaced address registers again")
        self.lingering.discard(slot.addr)
        self.leaving.discard(slot.addr)
        if any(s.addr == slot.addr and s.name != slot.name for s in self.slots):
            self._made("one address under two names")
        if r.random() < 0.1:  # over a new connection; the old one stays open
            self.older.setdefault(slot.addr, []).append(self.conn_key(slot))
            self.current[slot.addr] = self.current.get(slot.addr, 0) + 1
            self._made("register over a second connection")
            what = f"{what} over a new connection"
        step = Step(f"register {what}", self._made("register"), slot, self.conn_key(slot),
                    [register_request(slot, slot.topics, cluster, zone, fs, self.version, h)])
        if kind == "expire":
            step.what = f"register (expiring in {SHORT_TIMEOUT_MS} ms) {what}"
            step.kind = self._made("expiry")
            step.expires = slot.addr
            self.leaving.add(slot.addr)
            # Java closes an expired broker's connection: the next request opens a new one.
            self.current[slot.addr] = self.current.get(slot.addr, 0) + 1
        return step

    def _unregister(self, slot: Slot, seen: Observed) -> Step:
        # Only what is registered: Java applies an unregistration later, on a thread of its
        # own, so one that finds nothing could still remove a registration of the same
        # address made right after it (docs/protocol.md §15); zns applies it at once. With
        # `explore`, also the wrong cluster, the wrong name, or an address the id is not at.
        r = self.rng
        cluster, name, addr, kind = slot.cluster, slot.name, slot.addr, "unregister"
        if self.explore and r.random() < 0.5:
            wrong = r.choice(("cluster", "name", "address"))
            kind = f"unregister naming the wrong {wrong}"
            if wrong == "cluster":
                cluster = next(c for c in self.clusters if c != slot.cluster)
            elif wrong == "name":
                name = next(n for n in self.names if n != slot.name)
            else:
                addr = next(s.addr for s in self.slots if s.addr != slot.addr)
        if kind == "unregister" and (seen.holder(slot.name, slot.broker_id) != slot.addr
                                     or slot.addr in self.leaving):
            return self.step(seen)
        if kind == "unregister":
            self.leaving.add(slot.addr)
        return Step(f"{kind} {name}/{slot.broker_id} {addr} in {cluster}", self._made(kind), slot,
                    self.conn_key(slot), [request(104, {
                        "brokerName": name, "brokerAddr": addr, "clusterName": cluster,
                        "brokerId": str(slot.broker_id)}, version=self.version)], settle=True)

    def reads(self) -> list[tuple[str, Slot | None, RemotingCommand]]:
        """Every read, keyed by a label; 322s go over their slot's connection (as brokers send them)."""
        out: list[tuple[str, Slot | None, RemotingCommand]] = []
        for t in self.topics:
            out.append((f"105 {t}", None, request(105, {"topic": t})))
            out.append((f"105 {t} legacy", None, request(105, {"topic": t}, version=317)))
        for zone in self.asked_zones:
            out.append((f"105 {self.topics[0]} zone {zone}", None, request(105, {
                "topic": self.topics[0], "__ZONE_MODE": "true", "__ZONE_NAME": zone})))
        for code in (106, 206, 304, 311, 312, 313):
            out.append((str(code), None, request(code)))
        # Reads missing their ext fields: Java answers each in its own way (§15).
        for code in (105, 224, 101, 219, *(() if self.v4 else (901,))):
            out.append((f"{code} without ext fields", None, request(code)))
        for c in [*self.clusters, f"{self.prefix}none"]:
            out.append((f"224 {c}", None, request(224, {"cluster": c})))
        for ns in self.namespaces:
            out.append((f"219 {ns}", None, request(219, {"namespace": ns})))
            for key in self.kv_keys:
                out.append((f"101 {ns} {key}", None, request(101, {"namespace": ns, "key": key})))
        for c in self.clusters if self.heartbeat_904 else ():
            for n in self.names:
                out.append((f"901 {c} {n}", None, request(901, {"clusterName": c, "brokerName": n})))
        for s in self.slots:
            out.append((f"322 {s.name}/{s.broker_id} {s.addr}", s, request(322, {
                "brokerName": s.name, "brokerAddr": s.addr, "clusterName": s.cluster,
                "brokerId": str(s.broker_id)}, json.dumps(s.data_version()).encode())))
        return out


# ---- comparing ----------------------------------------------------------------------------

# FAQUrl.suggestTodo's tip: 5.x links https://rocketmq.apache.org/docs/bestPractice/06FAQ,
# 4.9.x http://rocketmq.apache.org/docs/faq/.
FAQ_SUFFIX = re.compile(r"\nSee https?://rocketmq\.apache\.org/docs/\S+ for further details\.\Z")


ACTING_MASTER = re.compile(rb',"enableActingMaster":(?:true|false)')


# The first version that writes the non-ASCII characters of every JSON body as UTF-8; 4.9.7
# and 5.3.3, and zns, write them as \uXXXX escapes in some bodies (the standard route form).
RAW_UTF8_VERSION = 513  # 5.5.0
ESCAPES = re.compile(rb"\\u(D[89AB][0-9A-F]{2})\\u(D[C-F][0-9A-F]{2})|\\u([0-9A-F]{4})", re.IGNORECASE)


def _unescape_non_ascii(m: re.Match[bytes]) -> bytes:
    if m[1]:  # a surrogate pair: one character outside the BMP
        high, low = int(m[1], 16), int(m[2], 16)
        return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)).encode()
    code = int(m[3], 16)
    return chr(code).encode() if code >= 0x80 else m[0]


def view(reply: RemotingCommand, v4: bool = False, utf8: bool = False) -> tuple:
    """What is compared of a reply (everything but `opaque` and `version`, see the docstring);
    `v4`: zns's reply, compared with a 4.x oracle (BrokerData without enableActingMaster);
    `utf8`: compared with a 5.5.0 oracle (escaped non-ASCII characters read as UTF-8)."""
    remark = reply.remark
    if reply.code == 17 and remark is not None:
        remark = FAQ_SUFFIX.sub("", remark)
    body = bytes(reply.body)
    if v4:
        body = ACTING_MASTER.sub(b"", body).replace(b',"stateVersion":0,', b",")
    if utf8:
        body = ESCAPES.sub(_unescape_non_ascii, body)
    return (reply.code, remark, reply.ext_fields, body, reply.flag, reply.language,
            reply.serialize_type)


@dataclass
class Difference:
    seed: int
    step_no: int
    step: str
    read: str
    java: tuple
    zns: tuple
    history: list[str]

    def __str__(self) -> str:
        steps = "\n    ".join(self.history[-12:])
        return (f"seed {self.seed} step {self.step_no} ({self.step}): {self.read}\n  java: {self.java}\n"
                f"  zns:  {self.zns}\n  last steps:\n    {steps}")


class Side:
    """One server: an admin/reader connection and the broker connections, by key
    (``addr#n``: an address may hold several, see Generator)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.admin = RemotingConnection(addr)
        self.conns: dict[str, RemotingConnection] = {}

    def conn(self, key: str | None) -> RemotingConnection:
        if key is None:
            return self.admin
        c = self.conns.get(key)
        if c is None:
            c = self.conns[key] = RemotingConnection(self.addr)
        return c

    def drop(self, key: str) -> None:
        c = self.conns.pop(key, None)
        if c is not None:
            c.close()

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()
        self.admin.close()

    def lists(self, addr: str) -> bool:
        """Whether 106 lists this address under any broker name."""
        return f'"{addr}"'.encode() in self.admin.call(request(106)).body

    def send_reads(self, reads: list[tuple[str, Slot | None, RemotingCommand]],
                   key_of: Callable[[Slot], str | None]) -> list[Any]:
        """Send every read (one pipelined batch per connection); :meth:`collect_reads` the
        replies. A slot's read goes over its connection `key_of` names, only when that is open
        (opening one just to ask would tie nothing but is not what a broker does)."""
        groups: dict[str | None, list[int]] = {}
        for i, (_, slot, _) in enumerate(reads):
            key = None if slot is None else key_of(slot)
            if slot is not None and key not in self.conns:
                continue
            groups.setdefault(key, []).append(i)
        pending = []
        for key, idx in groups.items():
            conn = self.conn(key)
            pending.append((conn, [reads[i][0] for i in idx], conn.send([_copy(reads[i][2]) for i in idx])))
        return pending

    @staticmethod
    def collect_reads(pending: list[Any]) -> dict[str, RemotingCommand]:
        out: dict[str, RemotingCommand] = {}
        for conn, labels, want in pending:
            for label, reply in zip(labels, conn.collect(want)):
                out[label] = reply
        return out

    def reset(self, gen: Generator) -> bool:
        """Empty this server of the sequence's names (by its own view); False if that failed.

        Unregisters every address under the cluster its BrokerData names, deletes every
        topic, deletes the sequence's KV keys, then waits (removals may be asynchronous)
        until 106 and 206 list nothing of the sequence.
        """
        for c in self.conns.values():
            c.close()
        self.conns.clear()
        info = json.loads(_lenient(self.admin.call(request(106)).body) or b"{}")
        for name, data in (info.get("brokerAddrTable") or {}).items():
            for broker_id, addr in data["brokerAddrs"].items():
                self.admin.call(request(104, {"brokerName": name, "brokerAddr": addr,
                                              "clusterName": data["cluster"], "brokerId": str(broker_id)}))
        topics = json.loads(self.admin.call(request(206)).body or b"{}").get("topicList", [])
        self.admin.call_many([request(216, {"topic": t}) for t in topics]
                             + [request(102, {"namespace": ns, "key": k})
                                for ns in gen.namespaces for k in gen.kv_keys])
        deadline = time.monotonic() + SETTLE_S
        while True:
            listed = self.admin.call(request(106)).body + self.admin.call(request(206)).body
            if gen.prefix.encode() not in listed:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _copy(cmd: RemotingCommand) -> RemotingCommand:
    return RemotingCommand(code=cmd.code, version=cmd.version, ext_fields=dict(cmd.ext_fields or {}) or None,
                           body=cmd.body, serialize_type=cmd.serialize_type)


def _lenient(body: bytes) -> bytes:
    from zns.core.remoting.fastjson import quote_integer_keys
    return quote_integer_keys(body)


def observed(reply: RemotingCommand | None) -> Observed:
    seen = Observed()
    if reply is None or reply.code != 0 or not reply.body:
        return seen
    info = json.loads(_lenient(reply.body))
    for name, data in (info.get("brokerAddrTable") or {}).items():
        seen.addrs[name] = {int(k): v for k, v in data["brokerAddrs"].items()}
    seen.clusters = {c: list(n) for c, n in (info.get("clusterAddrTable") or {}).items()}
    return seen


@dataclass
class RunStats:
    steps: int = 0
    sequences: int = 0
    reads: int = 0
    settle_waits: int = 0
    expiries: int = 0
    made: dict[str, int] = field(default_factory=dict)  # step kinds written (Generator.made)
    differences: list[Difference] = field(default_factory=list)
    seconds: float = 0.0


class Differential:
    """Drive both servers with generated sequences; collect differences (one per sequence at most)."""

    def __init__(self, java_addr: str, zns_addr: str, *, java_version: int = 479,
                 v4: bool = False, restart: Any = None, explore: bool = False,
                 expiry: bool = False) -> None:
        """`restart`: restarts both servers afresh (empty tables, empty KV) and returns their
        new addresses (java, zns); used when a reset cannot empty one (what a difference
        left behind), so that the next sequence starts from equal states. `explore` and
        `expiry`: see Generator (`expiry` needs a Java NameServer that scans often:
        scanNotActiveBrokerInterval=EXPIRY_SCAN_MS)."""
        self.java = Side(java_addr)
        self.zns = Side(zns_addr)
        self.restart = restart
        self.restarts = 0
        self.explore = explore
        self.expiry = expiry
        self.java_version = java_version
        self.v4 = v4
        self.raw_utf8 = java_version >= RAW_UTF8_VERSION
        self._net = itertools.count(1)
        self._last: dict[str, RemotingCommand] = {}

    def close(self) -> None:
        self.java.close()
        self.zns.close()

    def _compare(self, gen: Generator, reads: list, seed: int, step_no: int, step: str,
                 history: list[str], settle: bool) -> Difference | None:
        deadline = time.monotonic() + (SETTLE_S if settle else 0)

        def key_of(slot: Slot) -> str | None:
            # A displaced address's 322 answers from the liveness Java keeps for it (§15).
            return None if slot.addr in gen.lingering and not gen.explore else gen.conn_key(slot)

        while True:
            # Both servers answer at the same time: all reads go out before any reply is read.
            pending_java, pending_zns = self.java.send_reads(reads, key_of), self.zns.send_reads(reads, key_of)
            java, zns = Side.collect_reads(pending_java), Side.collect_reads(pending_zns)
            diff = None
            for label, _, _ in reads:
                j, z = java.get(label), zns.get(label)
                if (j is None) != (z is None):
                    diff = Difference(seed, step_no, step, label, view(j) if j else (), view(z) if z else (), history)
                    break
                if j is None or z is None:
                    continue
                if z.version != ZNS_VERSION or j.version != self.java_version:
                    diff = Difference(seed, step_no, step, f"{label} header version", (j.version,), (z.version,), history)
                    break
                if view(j, utf8=self.raw_utf8) != view(z, self.v4, self.raw_utf8):
                    diff = Difference(seed, step_no, step, label, view(j, utf8=self.raw_utf8),
                                      view(z, self.v4, self.raw_utf8), history)
                    break
            if diff is None or time.monotonic() >= deadline:
                self._last = java
                return diff
            time.sleep(0.05)

    def _await_expiry(self, addr: str) -> bool:
        """Send nothing (a read over its connection would refresh it) until neither server
        lists `addr`; False if one still does after the deadline."""
        deadline = time.monotonic() + SHORT_TIMEOUT_MS / 1000 + SETTLE_S
        while self.java.lists(addr) or self.zns.lists(addr):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _await_leaving(self, addr: str) -> None:
        """After a close of the connection `addr` registered over: until one server no longer
        lists `addr`, for LEAVING_S at most. Both apply a close asynchronously (the Java
        NameServer in its unregistration service, a zns worker once the state process's
        command is back), so right after it both may still list the broker and agree: the
        next step (the address registering again) would then race the Java NameServer's
        queued removal, which removes it even after that registration. The settling compare
        that follows waits for the other server to agree."""
        deadline = time.monotonic() + LEAVING_S
        while self.java.lists(addr) and self.zns.lists(addr) and time.monotonic() < deadline:
            time.sleep(0.05)

    def run_sequence(self, seed: int, steps: int, stats: RunStats) -> Difference | None:
        rng = random.Random(seed)
        gen = Generator(rng, f"s{seed}x", next(self._net), v4=self.v4,
                        version=self.java_version, explore=self.explore, expiry=self.expiry)
        reads = gen.reads()
        history: list[str] = []
        diff: Difference | None = None
        seen = Observed()
        lagging = False  # the last step was applied asynchronously (both may still show it)
        try:
            for n in range(1, steps + 1):
                step = gen.step(seen)
                history.append(step.what)
                replies: list[tuple] = []
                if step.close:
                    assert step.conn is not None
                    for side in (self.java, self.zns):
                        side.drop(step.conn)
                        replies.append(())
                else:  # sent to both before either reply is read: the servers work side by side
                    sent = [(side, side.conn(step.conn).send([_copy(c) for c in step.requests]))
                            for side in (self.java, self.zns)]
                    for side, want in sent:
                        replies.append(tuple(view(r, self.v4 and side is self.zns, self.raw_utf8)
                                             for r in side.conn(step.conn).collect(want)))
                stats.steps += 1
                if replies[0] != replies[1]:
                    diff = Difference(seed, n, step.what, "the step's own reply", replies[0], replies[1], history)
                    break
                if step.leaves:
                    self._await_leaving(step.leaves)
                if step.expires:
                    stats.expiries += 1
                    if not self._await_expiry(step.expires):
                        diff = Difference(seed, n, step.what, "expiry", (self.java.lists(step.expires),),
                                          (self.zns.lists(step.expires),), history)
                        break
                    for side in (self.java, self.zns):  # Java closed it when it expired the broker
                        assert step.conn is not None
                        side.drop(step.conn)
                stats.settle_waits += step.settle or bool(step.expires)
                # After an asynchronous step both servers may agree at once on what they held
                # before it, and differ a moment later: the next step settles too.
                settle = step.settle or bool(step.expires)
                diff = self._compare(gen, reads, seed, n, step.what, history, settle or lagging)
                lagging = settle
                stats.reads += 2 * len(reads)
                if diff is not None:
                    break
                seen = observed(self._last.get("106"))
        finally:
            self._reset(gen, diff is not None)
            stats.sequences += 1
            for kind, count in gen.made.items():
                stats.made[kind] = stats.made.get(kind, 0) + count
        if diff is None:  # after the reset both must be empty of this sequence's names again
            diff = self._compare(gen, reads, seed, steps + 1, "reset", history, True)
        if diff is not None:
            stats.differences.append(diff)
        return diff

    def _reset(self, gen: Generator, diverged: bool) -> None:
        emptied = [side.reset(gen) for side in (self.java, self.zns)]
        if all(emptied) and not diverged:
            return
        if self.restart is None:
            if not all(emptied):
                raise AssertionError(f"a server still lists names of {gen.prefix} after the reset")
            return
        # After a difference the KV stores or hidden state (liveness, emptied namespaces) may
        # differ too: both start again from nothing.
        self.java.close()
        self.zns.close()
        self.restarts += 1
        java_addr, zns_addr = self.restart()
        self.java, self.zns = Side(java_addr), Side(zns_addr)

    def run(self, seeds: Iterator[int] | list[int], steps_per_sequence: int, total_steps: int) -> RunStats:
        stats = RunStats()
        started = time.monotonic()
        for seed in seeds:
            if stats.steps >= total_steps:
                break
            self.run_sequence(seed, min(steps_per_sequence, total_steps - stats.steps), stats)
        stats.seconds = time.monotonic() - started
        return stats

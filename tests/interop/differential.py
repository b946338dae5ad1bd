"""Differential testing: the same remoting requests into the Java NameServer and into zns.

A seeded generator (:class:`Generator`) writes sequences of steps -- full and
single-topic registrations with the same or a new data version, several broker
names, masters and slaves, two clusters, zones, filter servers, unregistrations,
connection closes, heartbeats (904) and data-version queries (322), topic deletion
(with and without a cluster), wipe/add write perm, REGISTER_TOPIC, KV writes -- and
:class:`Differential` sends every step to both servers over remoting (a client built
on ``zns.core.remoting``'s codec), then sends both the same reads -- 105 (standard
and legacy form, zone mode), 106, 206, 224 per cluster, 304, 311-313, 101 per key,
219 per namespace, 901 per broker name, 322 per broker address -- and compares the
replies: code, remark, ext fields, body bytes, flag, language and serialize type.

Normalized, with the reason (docs/protocol.md §15 pins each with a test):

- the reply header's ``version``: zns announces the version whose NameServer it
  implements (5.3.3, 479); a Java oracle of another version announces its own.
  Both are checked against those constants, not against each other.
- against a 4.x oracle only: BrokerData's ``enableActingMaster`` and DataVersion's
  ``stateVersion`` (both added in 5.0; the generator's state versions are 0) are
  removed from zns's bodies; the generator sends no 5.0 codes and registers masters
  only.
- TOPIC_NOT_EXIST's remark: Java appends ``FAQ_SUFFIX`` (a link to its FAQ, which
  differs by version); zns's remark is the wire contract's, without it. Only that
  suffix of a code-17 remark is removed from Java's reply before comparing.

Nothing else is normalized. Timing: a Java 5.x NameServer applies UNREGISTER_BROKER
and a closed connection's removal on a background thread (BatchUnregistrationService),
so after those steps the reads are repeated until both servers agree or a deadline
passes; every other step is compared once.

Known differences are not generated (each is documented in docs/protocol.md §15 and
pinned by a test): a single-topic registration of a broker id the name does not hold
(Java refuses it, zns applies it), REGISTER_TOPIC naming an unknown broker name.

Used by tests/interop/test_differential.py (a few thousand steps in ``make test``) and
bench/differential.py (long runs).
"""

from __future__ import annotations

import itertools
import json
import random
import re
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from zns.core.remoting import FrameDecoder, RemotingCommand, encode_command  # noqa: E402

ZNS_VERSION = 479  # the MQVersion ordinal zns announces (a 5.3.3 NameServer's)
# How long asynchronous removals may take in the Java NameServer (a closed connection reaches
# its route table through Netty's event loop and a batch unregistration thread). A deadline,
# not a wait: a step that agrees at once costs nothing. 5 s was too short at load 30 (seen
# once: a closed broker still listed by Java 5.3.3 when zns had already dropped it).
SETTLE_S = 20.0


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
            frames.append(encode_command(cmd))
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

def request(code: int, ext: dict[str, str] | None = None, body: bytes = b"", version: int = 479) -> RemotingCommand:
    return RemotingCommand(code=code, version=version, ext_fields=ext, body=body)


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


def register_request(slot: Slot, topics: dict[str, dict[str, int]], cluster: str, zone: str,
                     filter_servers: list[str], version: int) -> RemotingCommand:
    """REGISTER_BROKER as a 5.x broker sends it: a plain RegisterBrokerBody, its CRC32 in ext."""
    table = {
        t: {"attributes": {}, "order": False, "perm": c["perm"], "readQueueNums": c["read"],
            "topicFilterType": "SINGLE_TAG", "topicName": t, "topicSysFlag": c["sys_flag"],
            "writeQueueNums": c["write"]}
        for t, c in topics.items()
    }
    body = json.dumps({"filterServerList": filter_servers, "topicConfigSerializeWrapper": {
        "dataVersion": slot.data_version(), "topicConfigTable": table}},
        separators=(",", ":")).encode()
    ext = {"brokerId": str(slot.broker_id), "bodyCrc32": str(_crc(body)),
           "clusterName": cluster, "brokerAddr": slot.addr, "enableActingMaster": "false",
           "haServerAddr": _ha(slot.addr), "compressed": "false", "brokerName": slot.name}
    if zone:
        ext["__ZONE_NAME"] = zone
    return request(103, ext, body, version)


def _crc(body: bytes) -> int:
    # RocketMQ's UtilAll.crc32: java.util.zip.CRC32 & 0x7FFFFFFF.
    return zlib.crc32(body) & 0x7FFFFFFF


def _ha(addr: str) -> str:
    host, port = addr.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


# ---- the generator ------------------------------------------------------------------------

@dataclass
class Step:
    """One write: requests over a broker slot's connection (or the admin connection), or a close."""

    what: str
    slot: Slot | None = None  # whose connection carries it; None: the admin connection
    requests: list[RemotingCommand] = field(default_factory=list)
    close: bool = False  # close the slot's connection instead
    settle: bool = False  # the Java NameServer applies it asynchronously


@dataclass
class Observed:
    """What the servers agreed on after the last step (read from the 106 reply)."""

    addrs: dict[str, dict[int, str]] = field(default_factory=dict)  # broker name -> id -> addr
    clusters: dict[str, list[str]] = field(default_factory=dict)


class Generator:
    """Random steps over a small universe of names (fresh per sequence: `prefix`)."""

    def __init__(self, rng: random.Random, prefix: str, net: int, *, v4: bool = False,
                 version: int = 479, cross_cluster: float = 0.0) -> None:
        """`v4` (a 4.x oracle): no 904, 217, 901 nor zones, which came with 5.0, and masters
        only (a 4.x NameServer never takes topics from a slave; 5.x from the lowest id when
        no master is registered).
        `cross_cluster`: how often a broker registers in a cluster other than its own (a
        known difference, docs/protocol.md §15: off unless exploring it)."""
        self.rng = rng
        self.cross_cluster = cross_cluster
        self.prefix = prefix
        self.version = version
        self.v4 = v4
        self.heartbeat_904 = not v4
        self.clusters = [f"{prefix}c1", f"{prefix}c2"]
        self.zones = [""] if v4 else ["", f"{prefix}z1"]
        self.topics = [f"{prefix}T{i}" for i in range(1, 6)]
        self.names = [f"{prefix}b{c}" for c in "ABC"]
        self.namespaces = [f"{prefix}ns", "ORDER_TOPIC_CONFIG"]
        self.kv_keys = [self.topics[0], self.topics[1], f"{prefix}k"]
        self.slots: list[Slot] = []
        ts = 1_700_000_000_000 + rng.randrange(1_000_000)
        for i, name in enumerate(self.names):
            home = self.clusters[0] if i < 2 else self.clusters[1]
            for j, broker_id in enumerate((0,) if v4 else (0, 1)):
                addr = f"127.{net // 250}.{net % 250}.{1 + 2 * i + j}:10911"
                self.slots.append(Slot(name, broker_id, addr, home, timestamp=ts + 10 * i + j))

    def topic_config(self) -> dict[str, int]:
        r = self.rng
        return {"read": r.choice((1, 4, 8)), "write": r.choice((1, 4, 8)), "perm": r.choice((6, 6, 6, 4, 2, 7)),
                "sys_flag": r.choice((0, 0, 0, 1, 2, 3))}

    def step(self, seen: Observed) -> Step:
        r = self.rng
        kinds = ["register"] * 6 + ["incremental"] * 3 + ["unregister", "close", "heartbeat", "query",
                 "delete_topic", "wipe", "add", "register_topic", "kv_put", "kv_put", "kv_delete"]
        kind = r.choice(kinds)
        slot = r.choice(self.slots)
        if kind == "register":
            cluster = r.choice(self.clusters) if r.random() < self.cross_cluster else slot.cluster
            zone = slot.zone
            if r.random() < 0.05:
                zone = slot.zone = r.choice(self.zones)
            # A 4.x NameServer applies no topic of a registration whose data version it holds;
            # 5.x (and zns) restore the topics it lacks of that broker (docs/protocol.md §15).
            if r.random() < 0.6 or not slot.topics or self.v4:
                slot.counter += 1
                if r.random() < 0.5 or not slot.topics:
                    # One topic from an id the name does not hold: Java refuses it, zns applies it
                    # (a known, documented difference): such a table has two topics or more.
                    held = seen.addrs.get(slot.name, {}).get(slot.broker_id) is not None
                    chosen = r.sample(self.topics, r.randint(1 if held else 2, len(self.topics)))
                    slot.topics = {t: slot.topics.get(t) or self.topic_config() for t in chosen}
                    for t in r.sample(chosen, r.randint(0, len(chosen))):
                        slot.topics[t] = self.topic_config()
            held = seen.addrs.get(slot.name, {}).get(slot.broker_id) is not None
            if not held and len(slot.topics) < 2:
                extra = next(t for t in self.topics if t not in slot.topics)
                slot.topics[extra] = self.topic_config()
            fs = [] if r.random() < 0.85 else [f"127.0.0.1:{r.choice((40001, 40002))}"]
            return Step(f"register {slot.name}/{slot.broker_id} {slot.addr} in {cluster} zone={zone!r} "
                        f"v{slot.counter} topics={sorted(slot.topics)} fs={fs}", slot,
                        [register_request(slot, slot.topics, cluster, zone, fs, self.version)])
        if kind == "incremental":
            # What `updateTopic -b` makes a broker send: one topic, a new data version. Only
            # for an id the name holds already (otherwise Java refuses it; see the docstring).
            if seen.addrs.get(slot.name, {}).get(slot.broker_id) != slot.addr:
                return self.step(seen)
            topic = r.choice(self.topics)
            slot.topics[topic] = self.topic_config()
            if r.random() < 0.8 or self.v4:
                slot.counter += 1
            return Step(f"incremental {slot.name}/{slot.broker_id} v{slot.counter} {topic}", slot,
                        [register_request(slot, {topic: slot.topics[topic]}, slot.cluster, slot.zone, [],
                                          self.version)])
        if kind == "unregister":
            # Only what is registered: Java applies an unregistration later, on a thread of its
            # own, so one that finds nothing could still remove a registration of the same
            # address made right after it (docs/protocol.md §15); zns applies it at once.
            if seen.addrs.get(slot.name, {}).get(slot.broker_id) != slot.addr:
                return self.step(seen)
            return Step(f"unregister {slot.name}/{slot.broker_id} {slot.addr}", slot, [request(104, {
                "brokerName": slot.name, "brokerAddr": slot.addr, "clusterName": slot.cluster,
                "brokerId": str(slot.broker_id)}, version=self.version)], settle=True)
        if kind == "close":
            return Step(f"close the connection of {slot.addr}", slot, close=True, settle=True)
        if kind == "heartbeat" and self.heartbeat_904:
            return Step(f"heartbeat 904 {slot.addr}", slot, [request(904, {
                "brokerName": slot.name, "brokerAddr": slot.addr, "clusterName": slot.cluster,
                "brokerId": str(slot.broker_id)}, version=self.version)])
        if kind in ("heartbeat", "query"):
            dv = slot.data_version() if r.random() < 0.7 else {**slot.data_version(), "counter": slot.counter + 99}
            return Step(f"query 322 {slot.addr} {dv['counter']}", slot, [request(322, {
                "brokerName": slot.name, "brokerAddr": slot.addr, "clusterName": slot.cluster,
                "brokerId": str(slot.broker_id)}, json.dumps(dv).encode(), version=self.version)])
        topic = r.choice(self.topics)
        if kind == "delete_topic":
            ext = {"topic": topic}
            if r.random() < 0.5:
                ext["clusterName"] = r.choice(self.clusters)
            return Step(f"delete topic {ext}", None, [request(216, ext)])
        if kind in ("wipe", "add"):
            return Step(f"{kind} write perm of {slot.name}", None,
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
            return Step(f"register topic {topic} on {names}", None, [request(217, {"topic": topic}, body)])
        ns = r.choice(self.namespaces)
        key = r.choice(self.kv_keys)
        if kind == "kv_put":
            value = r.choice(("v1", "v2", f"{r.choice(self.names)}:4", f"{self.names[0]}:4;{self.names[1]}:8"))
            return Step(f"kv put {ns} {key}={value}", None, [request(100, {"namespace": ns, "key": key,
                                                                           "value": value})])
        return Step(f"kv delete {ns} {key}", None, [request(102, {"namespace": ns, "key": key})])

    def reads(self) -> list[tuple[str, Slot | None, RemotingCommand]]:
        """Every read, keyed by a label; 322s go over their slot's connection (as brokers send them)."""
        out: list[tuple[str, Slot | None, RemotingCommand]] = []
        for t in self.topics:
            out.append((f"105 {t}", None, request(105, {"topic": t})))
            out.append((f"105 {t} legacy", None, request(105, {"topic": t}, version=317)))
        if len(self.zones) > 1:
            out.append((f"105 {self.topics[0]} zone", None, request(105, {
                "topic": self.topics[0], "__ZONE_MODE": "true", "__ZONE_NAME": self.zones[1]})))
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
            out.append((f"322 {s.addr}", s, request(322, {
                "brokerName": s.name, "brokerAddr": s.addr, "clusterName": s.cluster,
                "brokerId": str(s.broker_id)}, json.dumps(s.data_version()).encode())))
        return out


# ---- comparing ----------------------------------------------------------------------------

# FAQUrl.suggestTodo's tip: 5.x links https://rocketmq.apache.org/docs/bestPractice/06FAQ,
# 4.9.x http://rocketmq.apache.org/docs/faq/.
FAQ_SUFFIX = re.compile(r"\nSee https?://rocketmq\.apache\.org/docs/\S+ for further details\.\Z")


ACTING_MASTER = re.compile(rb',"enableActingMaster":(?:true|false)')


def view(reply: RemotingCommand, v4: bool = False) -> tuple:
    """What is compared of a reply (everything but `opaque` and `version`, see the docstring);
    `v4`: zns's reply, compared with a 4.x oracle (BrokerData without enableActingMaster)."""
    remark = reply.remark
    if reply.code == 17 and remark is not None:
        remark = FAQ_SUFFIX.sub("", remark)
    body = bytes(reply.body)
    if v4:
        body = ACTING_MASTER.sub(b"", body).replace(b',"stateVersion":0,', b",")
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
    """One server: an admin/reader connection and one connection per broker slot."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.admin = RemotingConnection(addr)
        self.conns: dict[str, RemotingConnection] = {}

    def conn(self, slot: Slot | None) -> RemotingConnection:
        if slot is None:
            return self.admin
        c = self.conns.get(slot.addr)
        if c is None:
            c = self.conns[slot.addr] = RemotingConnection(self.addr)
        return c

    def drop(self, slot: Slot) -> None:
        c = self.conns.pop(slot.addr, None)
        if c is not None:
            c.close()

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()
        self.admin.close()

    def read_all(self, reads: list[tuple[str, Slot | None, RemotingCommand]]) -> dict[str, RemotingCommand]:
        return self.collect_reads(self.send_reads(reads))

    def send_reads(self, reads: list[tuple[str, Slot | None, RemotingCommand]]) -> list[Any]:
        """Send every read (one pipelined batch per connection); :meth:`collect_reads` the replies."""
        groups: dict[str | None, list[int]] = {}
        for i, (_, slot, _) in enumerate(reads):
            groups.setdefault(slot.addr if slot else None, []).append(i)
        pending = []
        for key, idx in groups.items():
            slot = reads[idx[0]][1]
            # A 322 is a broker's request: over the slot's connection only when it is open
            # (opening one just to ask would tie nothing but is not what a broker does).
            if slot is not None and slot.addr not in self.conns:
                continue
            conn = self.conn(slot)
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
                           body=cmd.body)


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
    differences: list[Difference] = field(default_factory=list)
    seconds: float = 0.0


class Differential:
    """Drive both servers with generated sequences; collect differences (one per sequence at most)."""

    def __init__(self, java_addr: str, zns_addr: str, *, java_version: int = 479,
                 v4: bool = False, restart: Any = None, cross_cluster: float = 0.0) -> None:
        """`restart`: restarts both servers afresh (empty tables, empty KV) and returns their
        new addresses (java, zns); used when a reset cannot empty one (what a difference
        left behind), so that the next sequence starts from equal states."""
        self.java = Side(java_addr)
        self.zns = Side(zns_addr)
        self.restart = restart
        self.restarts = 0
        self.cross_cluster = cross_cluster
        self.java_version = java_version
        self.v4 = v4
        self._net = itertools.count(1)

    def close(self) -> None:
        self.java.close()
        self.zns.close()

    def _compare(self, reads: list, seed: int, step_no: int, step: str, history: list[str],
                 settle: bool) -> Difference | None:
        deadline = time.monotonic() + (SETTLE_S if settle else 0)
        while True:
            # Both servers answer at the same time: all reads go out before any reply is read.
            pending_java, pending_zns = self.java.send_reads(reads), self.zns.send_reads(reads)
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
                if view(j) != view(z, self.v4):
                    diff = Difference(seed, step_no, step, label, view(j), view(z, self.v4), history)
                    break
            if diff is None or time.monotonic() >= deadline:
                self._last = java
                return diff
            time.sleep(0.05)

    def run_sequence(self, seed: int, steps: int, stats: RunStats) -> Difference | None:
        rng = random.Random(seed)
        gen = Generator(rng, f"s{seed}x", next(self._net), v4=self.v4,
                        version=self.java_version, cross_cluster=self.cross_cluster)
        reads = gen.reads()
        history: list[str] = []
        diff: Difference | None = None
        seen = Observed()
        try:
            for n in range(1, steps + 1):
                step = gen.step(seen)
                history.append(step.what)
                replies: list[tuple] = []
                if step.close:
                    assert step.slot is not None
                    for side in (self.java, self.zns):
                        side.drop(step.slot)
                        replies.append(())
                else:  # sent to both before either reply is read: the servers work side by side
                    sent = [(side, side.conn(step.slot).send([_copy(c) for c in step.requests]))
                            for side in (self.java, self.zns)]
                    for side, want in sent:
                        replies.append(tuple(view(r, self.v4 and side is self.zns)
                                             for r in side.conn(step.slot).collect(want)))
                stats.steps += 1
                if replies[0] != replies[1]:
                    diff = Difference(seed, n, step.what, "the step's own reply", replies[0], replies[1], history)
                    break
                stats.settle_waits += step.settle
                diff = self._compare(reads, seed, n, step.what, history, step.settle)
                stats.reads += 2 * len(reads)
                if diff is not None:
                    break
                seen = observed(self._last.get("106"))
        finally:
            self._reset(gen, diff is not None)
            stats.sequences += 1
        if diff is None:  # after the reset both must be empty of this sequence's names again
            diff = self._compare(reads, seed, steps + 1, "reset", history, True)
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

"""The same random operations, over ZNS/1 and RocketMQ remoting interleaved, into
`zns serve --workers 0` (the oracle: one process) and `zns serve --workers 2`; every reply
and every event compared.

The remoting steps come from tests/interop/differential.py's Generator (the one run against
the Java NameServer, here with `explore` and `expiry`): registrations of every form,
unregistrations, closes of broker connections, heartbeats, data-version queries, topic
deletion, write perms, REGISTER_TOPIC, KV; the ZNS/1 steps (`zns1_operation`) write and
read the same broker names, addresses, clusters, topics and KV keys, every write and read
op of the schema with its optional fields (`status` too, alike but for the fields that
name the answering worker), pulls by held revision, and once per sequence a registration
whose events are too many to ship with its command (each worker's replica makes its own).
Once a run, a peer hint (§10: both follow a third NameServer, which expires a broker they
hold). Never drawn: stalls (`ShiftDeadlines`),
warm restarts (`Restore`), a worker's death and its replacement's state transfer, and
connections closing at once (below). Each side holds its
connections on both workers deliberately: ZNS/1 DEALERs and SUBs pinned to each worker,
remoting connections placed on the workers in turn (`PlacedSide`).

What is compared: every reply (remoting: code, remark, ext fields, body bytes, flag,
language, serialize type, version, and its opaque, by which each reply is matched; ZNS/1:
the reply as sent, every field and the order of every map, with each server's `epoch`
masked, which each draws at random, and get_cluster_info's `last_heartbeat_ms`, an age,
compared within the time the requests took instead of exactly); after every step a sample
of remoting reads (106 always, the rest of Generator.reads() at random, over random
connections, so on either worker) and after every sequence all of them; every event, in
order, as each worker's subscriber saw it: its channel and its body byte for byte (the
epoch masked, and checked to be the server's); once,
GET_NAMESRV_CONFIG (each server's own endpoints and `workers` checked, not compared),
UPDATE_NAMESRV_CONFIG and an unserved code on each worker.

One sync, and why: a write is answered once the answering worker can read it
(read-your-writes per connection, docs/protocol.md §7); another worker may answer the read
that follows on another connection from before the write for a moment. After each write
the test therefore sends one more write (`BARRIER`, an unregistration of a broker nobody
registered) to each worker and waits for both answers: a worker answers a write only once
it applied every change the state process made before it, so both workers then read the
first write. The one-process side gets the same barrier, and its replies are compared too.
A connection's close is waited for until the server side closed it, then the barrier.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
import zmq

import differential as rd  # tests/interop (conftest puts it on sys.path)
from helpers import LOADED_DEADLINE, Peer, ProcessServer, wait_for
from test_workers_serve import (
    hears_with_others_stopped, holder_of, server_side_open, worker_pid,
)
from zns.core import schema
from zns.core.replication import DEFAULT_WINDOW, MAX_SHIPPED_EVENTS
from zns.core.state import WriteRequest

SEEDS = [int(s) for s in os.environ.get("ZNS_WORKERS_DIFFERENTIAL_SEEDS", "1,2,3,4").split(",")]
STEPS = int(os.environ.get("ZNS_WORKERS_DIFFERENTIAL_STEPS", "500"))  # per seed
SAMPLED_READS = 6  # remoting reads after each step, besides 106
BARRIER = {"op": "unregister_broker", "cluster": "barrier", "broker_name": "barrier",
           "broker_id": 0, "broker_addr": "10.255.255.1:1"}
SHORT_TIMEOUT_MS = 1000  # the ZNS/1 expiry step's heartbeat timeout (zns's lowest)
WRITE_OPS = frozenset(schema.tag_of(c) for c in get_args(WriteRequest))
OWN_EPOCH = "(its own)"  # a held_epoch each server is sent as its own epoch
EPOCH_MASK = b"e" * 16  # in place of each server's epoch (16 hex digits: new_epoch)
# Milliseconds a heartbeat age may differ by beyond the spans measured (each server rounds
# its clock to ms twice: when it heard the broker and when it answers).
AGE_ROUNDING_MS = 5

pytestmark = pytest.mark.timeout(600)


class PlacedSide(rd.Side):
    """Remoting connections of one server; with `pids` (its workers), each new connection
    lands on the next worker in turn (opened again until the kernel puts it there)."""

    def __init__(self, addr: str, pids: list[int] | None) -> None:
        self.pids = pids
        self.turn = 0
        self.used: set[int] = set()  # the pids connections were placed on
        super().__init__(addr)
        self.admin.close()
        self.admin = self.placed()

    def conn(self, key: str | None) -> rd.RemotingConnection:
        if key is not None and key not in self.conns:
            self.conns[key] = self.placed()
        return super().conn(key)

    def placed(self, worker: int | None = None) -> rd.RemotingConnection:
        """A new connection on `worker` (1..N), or on the next worker in turn."""
        if self.pids is None:
            return rd.RemotingConnection(self.addr)
        if worker is None:
            wanted = self.pids[self.turn % len(self.pids)]
            self.turn += 1
        else:
            wanted = self.pids[worker - 1]
        self.used.add(wanted)
        port = int(self.addr.rsplit(":", 1)[1])
        for _ in range(64):
            conn = rd.RemotingConnection(self.addr)
            if holder_of(conn.sock.getsockname()[1], port, self.pids) == wanted:
                return conn
            conn.close()
        raise AssertionError(f"no remoting connection landed on pid {wanted} in 64 tries")


class Server:
    """One `zns serve --remoting` under test: its ZNS/1 DEALERs and SUBs (one per worker for
    the split), its remoting connections, and every event each SUB saw."""

    def __init__(self, tmp_path: Path, ctx: zmq.Context, workers: int,
                 peer: str | None = None) -> None:
        """`peer`: another NameServer's router, followed for hints (§10)."""
        args = ["--remoting", "127.0.0.1:0", "--heartbeat-interval", "0.1", "--workers",
                str(workers)]  # 0 given: the default is workers
        if peer is not None:
            args += ["--peer", peer, "--peer-grace", "1"]
        # A directory of its own: its KV file and the state dump beside it are its own.
        kv_path = tmp_path / f"workers-{workers}" / "kv.json"
        kv_path.parent.mkdir()
        self.proc = ProcessServer(tmp_path, *args, kv_path=kv_path)
        wait_for(lambda: self.proc.output().count("serving requests on") == max(workers, 1))
        self.workers = workers
        self.remoting = re.findall(r"RocketMQ remoting listener on (\S+)", self.proc.output())[0]
        self.ctx = ctx
        self.pids = [worker_pid(self.proc, w) for w in range(1, workers + 1)] or None
        if workers:  # two DEALERs on each worker, in the order 1, 2, 1, 2
            self.peers = [self.peer_on_worker(w) for w in (1, 2, 1, 2)]
            self.subs = [self.events_on_worker(w) for w in (1, 2)]
        else:
            self.peers = [Peer(self.proc.router, self.proc.pub, ctx) for _ in range(4)]
            self.subs = [self.subscriber()]
        self.events: list[list[Any]] = [[] for _ in self.subs]
        self.side = PlacedSide(self.remoting, self.pids)
        if peer is not None:  # every worker's own link is up (`status` compares them)
            for each in self.peers:
                wait_for(lambda: each.ok("status").peers == {peer: True})
        # Its epoch, masked out of what is compared: the same from every worker.
        epochs = {peer.ok("status").epoch for peer in self.peers}
        assert len(epochs) == 1, epochs
        self.epoch = epochs.pop().encode()
        assert len(self.epoch) == len(EPOCH_MASK), self.epoch

    def peer_on_worker(self, worker: int) -> Peer:
        for _ in range(200):
            peer = Peer(self.proc.router, self.proc.pub, self.ctx)
            if peer.ok("status").worker == worker:
                return peer
            peer.close()
        raise AssertionError(f"no connection landed on worker {worker}")

    def subscriber(self) -> Peer:
        peer = Peer(self.proc.router, self.proc.pub, self.ctx)
        peer.subscribe(b"route/", b"broker/", schema.HB_CHANNEL)
        peer.wait_subscribed()  # the hb subscription went last: all three are in force
        return peer

    def events_on_worker(self, worker: int) -> Peer:
        """A SUB whose connection landed on `worker`: with the other worker stopped
        (SIGSTOP), its `hb` events still arrive."""
        assert self.pids is not None
        other = self.pids[2 - worker]
        for _ in range(50):
            peer = self.subscriber()
            if hears_with_others_stopped(peer, [other]):
                return peer
            peer.close()
        raise AssertionError(f"no events connection landed on worker {worker}")

    def drain(self) -> None:
        """Every event each SUB has, as compared: its channel and its body byte for byte
        (the epoch masked; checked to be this server's), beside the decoded fields."""
        for sub, seen in zip(self.subs, self.events):
            assert sub.sub is not None
            while sub.sub.poll(0):
                channel, body = sub.sub.recv_multipart()
                if channel != schema.HB_CHANNEL:
                    event = msgspec.to_builtins(schema.decode_event(body))
                    assert event.pop("epoch").encode() == self.epoch, event
                    event["frame"] = (channel, body.replace(self.epoch, EPOCH_MASK))
                    seen.append(event)

    def send(self, index: int, fields: dict[str, Any]) -> None:
        peer = self.peers[index]
        if fields.get("held_epoch") == OWN_EPOCH:
            fields = {**fields, "held_epoch": self.epoch.decode()}
        peer.send_raw(schema.encode(fields))

    def recv(self, index: int) -> tuple[Any, list[int]]:
        return comparable(self.peers[index].recv_raw()[-1], self.epoch)

    def close(self) -> None:
        self.side.close()
        for peer in [*self.peers, *self.subs]:
            peer.close()
        assert self.proc.stop() == 0


def comparable(body: bytes, epoch: bytes) -> tuple[Any, list[int]]:
    """A ZNS/1 reply as compared: as sent (msgpack decoded without a schema, so every field
    and the order of every map count), but for what each server has of its own: its
    `epoch` (masked, wherever it appears) and get_cluster_info's `last_heartbeat_ms` (an
    age, measured when it answers: returned apart, compared within the time the requests
    took; `Run.ages_agree`)."""
    schema.decode_reply(body)  # a reply by the schema, too
    plain = msgspec.msgpack.decode(body.replace(epoch, EPOCH_MASK))
    ages = []
    for live in plain.get("live") or [] if isinstance(plain, dict) else []:
        ages.append(live["last_heartbeat_ms"])
        live["last_heartbeat_ms"] = "(an age)"
    return plain, ages


class Run:
    """The two servers driven side by side; the first difference fails the test, with the
    steps that led to it."""

    def __init__(self, single: Server, split: Server, hints: Peer | None = None) -> None:
        self.servers = [single, split]
        self.hints = hints  # a DEALER to the NameServer both follow for hints (§10)
        self.history: list[str] = []
        self.request_id = 0
        self.steps = 0
        self.made: dict[str, int] = {}  # what was done, for the coverage assertion
        # The longest a write (or a 322, which refreshes a broker too) took from its first
        # request sent to its last reply read: each server heard a broker within that span
        # of the same instant (the clocks are the host's one monotonic clock).
        self.write_span_s = 0.0
        self.revisions: dict[str, int] = {}  # each topic's last revision read, for `held`

    def fail(self, what: str, one: Any, two: Any) -> None:
        steps = "\n    ".join(self.history[-15:])
        raise AssertionError(f"{what}\n  --workers 0: {one}\n  --workers 2: {two}\n"
                             f"  last steps:\n    {steps}")

    # --- ZNS/1 ------------------------------------------------------------------------------

    def zns1(self, index: int, fields: dict[str, Any]) -> Any:
        """`fields` sent to both over their DEALER `index` (the same worker order on the
        split); the replies compared; the one-process side's returned."""
        self.request_id += 1
        started = time.monotonic()
        for server in self.servers:
            server.send(index, {**fields, "id": self.request_id})
        (one, one_ages), (two, two_ages) = (server.recv(index) for server in self.servers)
        span = time.monotonic() - started
        if msgspec.msgpack.encode(one) != msgspec.msgpack.encode(two):
            self.fail(f"ZNS/1 reply to {fields} (DEALER {index})", one, two)
        if fields["op"] in WRITE_OPS:
            self.wrote(span)
        self.ages_agree(one_ages, two_ages, span, fields)
        return one

    def peer_hint(self, gen: rd.Generator, seed: int, index: int) -> None:
        """A broker registered on both with an 8 s timeout, and on the NameServer both
        follow with 1 s: that one expires it and both remove it as `peer_expired` about
        2 s later (a quarter of its timeout after the hint), each taking the hint its own
        way (under --workers, every worker's links forward it to the state process, which
        applies and replicates one `Suspect`). Nothing else is sent meanwhile."""
        assert self.hints is not None
        hinted = {"cluster": gen.clusters[0], "broker_name": f"{gen.prefix}hinted",
                  "broker_id": 0, "broker_addr": f"10.8.{seed % 250}.1:10911"}
        self.zns1(index, {"op": "register_broker", **hinted, "topics": {gen.topics[1]: {}},
                          "heartbeat_timeout_ms": 8_000})
        self.barrier()
        self.hints.ok("register_broker", **hinted, heartbeat_timeout_ms=SHORT_TIMEOUT_MS)

        def removals() -> list[Any] | None:
            found = []
            for server in self.servers:
                server.drain()
                for seen in server.events:
                    found += [e for e in seen if e.get("broker_name") == hinted["broker_name"]
                              and e.get("change") == "removed"]
            return found if len(found) == 3 else None  # one per SUB: 1 + 2 workers
        reasons = [e["reason"] for e in wait_for(removals)]
        if reasons != ["peer_expired"] * 3:
            self.fail("the hinted broker's removal", reasons[:1], reasons[1:])
        self.made["peer hint"] = self.made.get("peer hint", 0) + 1
        self.barrier()

    def status(self, index: int) -> None:
        """`status` over DEALER `index` of both: alike but for what is each server's or
        worker's own (its uptime, endpoints, and under --workers which worker answered
        and the list of workers), each checked as such."""
        self.request_id += 1
        for server in self.servers:
            server.send(index, {"op": "status", "id": self.request_id})
        plain = []
        for server in self.servers:
            reply, _ = server.recv(index)
            assert reply.pop("uptime_ms") >= 0
            assert reply.pop("pub_endpoint") == server.proc.pub
            assert reply.pop("remoting") == server.remoting
            if server.workers:  # DEALERs on workers 1, 2, 1, 2
                assert reply.pop("worker") == (1, 2, 1, 2)[index], reply
                assert [w["worker"] for w in reply.pop("workers")] == [1, 2], reply
            else:
                assert "worker" not in reply and "workers" not in reply, reply
            plain.append(reply)
        if msgspec.msgpack.encode(plain[0]) != msgspec.msgpack.encode(plain[1]):
            self.fail(f"ZNS/1 status (DEALER {index})", plain[0], plain[1])

    def wrote(self, span_s: float) -> None:
        self.write_span_s = max(self.write_span_s, span_s)

    def ages_agree(self, one: list[int], two: list[int], span_s: float, what: Any) -> None:
        """get_cluster_info's `last_heartbeat_ms` of each live broker (the same brokers on
        both: compared) differ by no more than the spans in which each server could have
        heard the broker and answered. A replica that applied a broker's liveness at
        another time than its command's `now` (its own clock, or none) differs by more."""
        bound_ms = (self.write_span_s + span_s) * 1000 + AGE_ROUNDING_MS
        for a, b in zip(one, two):
            if abs(a - b) > bound_ms:
                self.fail(f"last_heartbeat_ms of the reply to {what}, apart by more than "
                          f"{bound_ms:.0f} ms", one, two)

    def barrier(self) -> None:
        """Both of the split's workers have applied every write answered so far."""
        self.request_id += 1
        for server in self.servers:
            for index in (0, 1):
                server.send(index, {**BARRIER, "id": self.request_id})
        replies = [[msgspec.msgpack.encode(server.recv(index)[0]) for index in (0, 1)]
                   for server in self.servers]
        if replies[0] != replies[1]:
            self.fail("the barrier's replies", replies[0], replies[1])

    # --- remoting ---------------------------------------------------------------------------

    def close(self, key: str) -> None:
        """Close remoting connection `key` on both; return once both servers applied it.
        One at a time: connections that close in one turn of a listener go as one step
        (one revision), so closes at once would group by timing (and by worker)."""
        for server in self.servers:
            conn = server.side.conns.get(key)
            if conn is not None:
                local = conn.sock.getsockname()[1]
                server.side.drop(key)
                port = int(server.remoting.rsplit(":", 1)[1])
                wait_for(lambda: not server_side_open(local, port), interval=0.001)
        self.barrier()

    def remoting_step(self, step: rd.Step) -> None:
        if step.close:
            assert step.conn is not None
            self.close(step.conn)
            return
        started = time.monotonic()
        sent = [(server, server.side.conn(step.conn).send([rd._copy(c) for c in step.requests]))
                for server in self.servers]
        replies = [[(r.version, *rd.view(r)) for r in server.side.conn(step.conn).collect(want)]
                   for server, want in sent]
        self.wrote(time.monotonic() - started)
        if replies[0] != replies[1]:
            self.fail(f"remoting reply to {step.what}", replies[0], replies[1])
        if step.expires:
            deadline = time.monotonic() + SHORT_TIMEOUT_MS / 1000 + LOADED_DEADLINE
            while any(server.side.lists(step.expires) for server in self.servers):
                assert time.monotonic() < deadline, f"{step.expires} did not expire"
                time.sleep(0.05)
            for server in self.servers:  # the generator moved to a new connection (Java
                assert step.conn is not None  # closes an expired broker's)
                server.side.drop(step.conn)
        self.barrier()

    def reads(self, gen: rd.Generator, reads: list, rnd: random.Random,
              every: bool) -> rd.RemotingCommand:
        """Remoting reads (all, or 106 and a sample) sent to both at once, each over a
        connection chosen at random (the same key on both); compared. The 106 reply."""
        chosen = reads if every else [r for r in reads if r[0] == "106"] + rnd.sample(
            reads, SAMPLED_READS)
        keys = sorted(self.servers[0].side.conns)
        routed: list[tuple[str, str | None, rd.RemotingCommand]] = []
        for label, slot, cmd in chosen:
            if slot is not None:  # a 322 goes over its broker's connection, when it is open
                key: str | None = gen.conn_key(slot)
                if key not in keys:
                    continue
            else:
                key = rnd.choice([None, *keys])
            routed.append((label, key, cmd))
        # The 322s (a broker's liveness: written) first, the rest side by side.
        started = time.monotonic()
        self.compare_reads([r for r in routed if r[0].startswith("322")])
        self.wrote(time.monotonic() - started)
        return self.compare_reads([r for r in routed if not r[0].startswith("322")])["106"]

    def compare_reads(self, batch: list[tuple[str, str | None, rd.RemotingCommand]]
                      ) -> dict[str, rd.RemotingCommand]:
        """`batch` sent to both servers (pipelined per connection) before any reply is read;
        the replies compared; the one-process side's returned by label."""
        pending = []
        for server in self.servers:
            by_key: dict[str | None, list[int]] = {}
            for i, (_, key, _) in enumerate(batch):
                by_key.setdefault(key, []).append(i)
            pending.append([(server.side.conn(key), idx,
                             server.side.conn(key).send([rd._copy(batch[i][2]) for i in idx]))
                            for key, idx in by_key.items()])
        answers: list[dict[str, rd.RemotingCommand]] = []
        for server_pending in pending:
            got: dict[str, rd.RemotingCommand] = {}
            for conn, idx, want in server_pending:
                for i, reply in zip(idx, conn.collect(want)):
                    got[batch[i][0]] = reply
            answers.append(got)
        for label, key, _ in batch:
            one, two = ((r.version, *rd.view(r)) for r in (answers[0][label], answers[1][label]))
            if one != two:
                self.fail(f"remoting read {label} over {key or 'admin'}", one, two)
        return answers[0]

    def configuration(self) -> None:
        """UPDATE_NAMESRV_CONFIG (refused), GET_NAMESRV_CONFIG and a code zns does not serve,
        over a connection on each worker: alike, but for GET_NAMESRV_CONFIG's lines that
        are each server's own settings (its endpoints and `workers`), checked as such."""
        def normalised(server: Server, reply: rd.RemotingCommand) -> tuple:
            own = {"router": server.proc.router, "pub": server.proc.pub,
                   "remoting": server.remoting, "workers": str(server.workers)}
            lines = []
            for line in bytes(reply.body).decode().splitlines():
                key, _, value = line.partition("=")
                if key in own:
                    assert value == own[key], (line, own[key])
                    value = "(its own)"
                lines.append(f"{key}={value}")
            return (reply.version, *rd.view(reply)[:3], "\n".join(lines), *rd.view(reply)[4:])

        for worker in (1, 2):
            conns = [server.side.placed(worker) for server in self.servers]
            try:
                for code in (318, 319, 34):
                    one, two = (normalised(server, conn.call(rd.request(code)))
                                for server, conn in zip(self.servers, conns))
                    if one != two:
                        self.fail(f"remoting code {code} on worker {worker}", one, two)
            finally:
                for conn in conns:
                    conn.close()

    def reset(self, gen: rd.Generator) -> None:
        """Empty both of the sequence's names over ZNS/1 (each write compared): every live
        (cluster, address), every topic, the KV keys. Read and written over one DEALER:
        its reads see its writes (another worker's might not yet, docs/protocol.md §7)."""
        for live in self.zns1(1, {"op": "get_cluster_info"})["live"]:
            self.zns1(1, {"op": "unregister_broker", **{k: live[k] for k in (
                "cluster", "broker_name", "broker_id", "broker_addr")}})
        for topic in self.zns1(1, {"op": "get_topics"})["topics"]:
            self.zns1(1, {"op": "delete_topic", "topic": topic})
        for ns in gen.namespaces:
            for key in gen.kv_keys:
                self.zns1(1, {"op": "kv_delete", "namespace": ns, "key": key})
        self.barrier()
        for server in self.servers:
            listed = server.side.admin.call(rd.request(106)).body + \
                server.side.admin.call(rd.request(206)).body
            assert gen.prefix.encode() not in listed, listed

    def events_agree(self) -> None:
        """Every SUB of both servers saw the same events in the same order."""
        def settled() -> bool:
            for server in self.servers:
                server.drain()
            counts = {len(seen) for server in self.servers for seen in server.events}
            return len(counts) == 1
        try:
            wait_for(settled)
        except AssertionError:
            pass  # compared below: the difference says more than a timeout
        reference = self.servers[0].events[0]
        for worker, seen in enumerate(self.servers[1].events, 1):
            if seen != reference:
                at = next((i for i, (a, b) in enumerate(zip(reference, seen)) if a != b),
                          min(len(reference), len(seen)))
                self.fail(f"events seen on worker {worker}, from event {at} "
                          f"({len(reference)} vs {len(seen)})", reference[at:at + 3], seen[at:at + 3])


def zns1_operation(rnd: random.Random, gen: rd.Generator) -> dict[str, Any]:
    """A ZNS/1 request over the generator's names: its brokers (at their remoting addresses
    or a ZNS/1 one of their own), clusters, topics and KV keys, with the optional fields of
    each request drawn too. `large_register` and `held` are placeholders `run_sequence`
    fills in; `status` is compared but for what names its worker."""
    slot = rnd.choice(gen.slots)
    addr = slot.addr if rnd.random() < 0.5 else slot.addr.replace(":10911", ":20911")
    broker = {"cluster": slot.cluster if rnd.random() < 0.9 else rnd.choice(gen.clusters),
              "broker_name": slot.name, "broker_id": slot.broker_id, "broker_addr": addr}
    topics, names = gen.topics, gen.names
    roll = rnd.random()
    if roll < 0.15:
        chosen = rnd.sample(topics, rnd.randint(0, 3))
        extra: dict[str, Any] = {}
        if rnd.random() < 0.3:  # what a ZNS/1 broker may add (docs/protocol.md §4)
            extra = {"ha_addr": rnd.choice(["", addr.replace(":10911", ":10912")]),
                     "filter_servers": rnd.sample(["127.0.0.1:40001", "127.0.0.1:40002"],
                                                  rnd.randint(0, 2)),
                     "incremental": rnd.random() < 0.5}
        return {"op": "register_broker", **broker, "zone": rnd.choice(["", gen.zones[-1]]),
                "topics": {t: {"read_queues": rnd.randint(1, 8), "write_queues": rnd.randint(1, 8),
                               "perm": rnd.choice([2, 4, 6]), "sys_flag": rnd.choice([0, 0, 1, 3]),
                               "order": rnd.random() < 0.2} for t in chosen},
                "heartbeat_timeout_ms": 120_000,
                "data_version": {"state": rnd.randint(0, 2), "counter": rnd.randint(0, 3)},
                **extra}
    if roll < 0.22:
        return {"op": "heartbeat", **broker,
                "data_version": {"state": rnd.randint(0, 2), "counter": 1}}
    if roll < 0.27:
        return {"op": "unregister_broker", **broker}
    if roll < 0.31:
        return {"op": rnd.choice(["wipe_write_perm", "add_write_perm"]),
                "broker_name": rnd.choice(names)}
    if roll < 0.34:
        return {"op": "delete_topic", "topic": rnd.choice(topics),
                "cluster": rnd.choice(["", "", *gen.clusters])}
    if roll < 0.38:
        return {"op": "register_topic", "topic": rnd.choice(topics),
                "queues": [{"broker_name": rnd.choice(names), "read_queues": rnd.randint(1, 8),
                            "write_queues": 4, "perm": rnd.choice([2, 6]),
                            "sys_flag": rnd.choice([0, 1])}
                           for _ in range(rnd.randint(1, 2))]}
    ns, key = rnd.choice(gen.namespaces), rnd.choice(gen.kv_keys)
    if roll < 0.42:
        return {"op": "kv_put", "namespace": ns, "key": key,
                "value": rnd.choice([f"{names[0]}:4", f"{names[1]}:8", "v"])}
    if roll < 0.45:
        return {"op": "kv_delete", "namespace": ns, "key": key}
    if roll < 0.47:
        return {"op": "expiry"}
    if roll < 0.48:
        return {"op": "large_register", **broker}
    if roll < 0.6:
        return {"op": "get_route", "topic": rnd.choice(topics),
                "zone": rnd.choice(["", "", *gen.zones[1:], *gen.asked_zones])}
    if roll < 0.67:
        return {"op": "get_routes", "topics": rnd.sample(topics, 3), "held": rnd.random() < 0.5}
    if roll < 0.74:
        return {"op": "get_cluster_info"}
    if roll < 0.8:
        return {"op": "get_topics", "cluster": rnd.choice(["", *gen.clusters]),
                "sys_flag": rnd.choice([0, 0, 1, 2])}
    if roll < 0.85:
        return {"op": "snapshot"}
    if roll < 0.87:
        return {"op": "status"}
    if roll < 0.94:
        return {"op": "kv_list", "namespace": ns}
    return {"op": "kv_get", "namespace": ns, "key": key}


def large_topics(rnd: random.Random, gen: rd.Generator) -> dict[str, Any]:
    """A registration's topics whose events are not shipped with its command
    (zns.core.replication: past MAX_SHIPPED_EVENTS events, or past MAX_SHIPPED_EVENT_BYTES
    of them), so each worker's replica makes its own: 300 topics, or 200 of long names."""
    if rnd.random() < 0.5:
        assert 300 > MAX_SHIPPED_EVENTS
        return {f"{gen.prefix}L{i}": {} for i in range(300)}
    assert 200 <= MAX_SHIPPED_EVENTS
    return {f"{gen.prefix}N{i}_{'n' * 110}": {"read_queues": 8} for i in range(200)}


def run_sequence(run: Run, seed: int, steps: int) -> None:
    rnd = random.Random(seed)
    gen = rd.Generator(random.Random(seed), f"w{seed}x", seed, explore=True, expiry=True)
    reads = gen.reads()
    seen = rd.Observed()
    expiries = 1
    large = 1  # registrations whose events are too many to ship (each costs its reads)
    for n in range(steps):
        run.steps += 1
        if n == steps // 2 and run.hints is not None and not run.made.get("peer hint"):
            run.history.append(f"{seed}/{n} a peer hint")  # once a run: it costs 2-3 s
            run.peer_hint(gen, seed, rnd.randrange(4))
        if rnd.random() < 0.5:
            step = gen.step(seen)
            run.history.append(f"{seed}/{n} remoting: {step.what}")
            run.remoting_step(step)
        else:
            fields = zns1_operation(rnd, gen)
            index = rnd.randrange(4)
            run.history.append(f"{seed}/{n} ZNS/1 over DEALER {index}: {fields}")
            if fields["op"] == "expiry":
                if not expiries:
                    continue
                expiries -= 1
                run.made["ZNS/1 expiry"] = run.made.get("ZNS/1 expiry", 0) + 1
                short = {"cluster": gen.clusters[0], "broker_name": f"{gen.prefix}short",
                         "broker_id": 0, "broker_addr": f"10.3.{seed % 250}.1:10911"}
                run.zns1(index, {"op": "register_broker", **short, "topics": {gen.topics[0]: {}},
                                 "heartbeat_timeout_ms": SHORT_TIMEOUT_MS})

                def gone() -> bool:
                    for server in run.servers:
                        server.drain()
                    return all(any(e.get("broker_name") == short["broker_name"]
                                   and e.get("change") == "removed" for e in seen_events)
                               for server in run.servers for seen_events in server.events)
                wait_for(gone)
                run.barrier()
            elif fields["op"] == "large_register":
                if not large:
                    continue
                large -= 1
                run.made["large registration"] = run.made.get("large registration", 0) + 1
                fields = {**fields, "op": "register_broker", "topics": large_topics(rnd, gen)}
                run.history[-1] = f"{seed}/{n} ZNS/1 over DEALER {index}: large registration " \
                    f"of {fields['broker_name']} at {fields['broker_addr']}, " \
                    f"{len(fields['topics'])} topics"
                run.zns1(index, fields)
                run.barrier()
            elif fields["op"] == "status":
                run.status(index)
            elif fields["op"] == "get_routes":
                if fields.pop("held"):  # a pull by revision: what was read last, or older
                    fields["held"] = {t: max(0, run.revisions.get(t, 0) - rnd.choice([0, 0, 1]))
                                      for t in fields["topics"]}
                    fields["held_epoch"] = OWN_EPOCH if rnd.random() < 0.8 else "0" * 16
                    run.history[-1] = f"{seed}/{n} ZNS/1 over DEALER {index}: {fields}"
                    run.made["get_routes held"] = run.made.get("get_routes held", 0) + 1
                run.revisions.update(run.zns1(index, fields)["revisions"])
            elif fields["op"] == "get_route":
                reply = run.zns1(index, fields)
                if "revision" in reply:
                    run.revisions[fields["topic"]] = reply["revision"]
            elif fields["op"] in ("get_cluster_info", "get_topics", "snapshot", "kv_list",
                                  "kv_get"):
                run.zns1(index, fields)
            else:
                run.zns1(index, fields)
                run.barrier()
        last = run.reads(gen, reads, rnd, every=n % 50 == 49)
        seen = rd.observed(last)
    run.reads(gen, reads, rnd, every=True)
    run.events_agree()
    for key in sorted(run.servers[0].side.conns):
        run.close(key)
    run.reset(gen)
    run.reads(gen, reads, rnd, every=True)
    for kind, count in gen.made.items():
        run.made[kind] = run.made.get(kind, 0) + count



def test_zns1_and_remoting_into_one_process_and_two_workers_answer_alike(
        tmp_path: Path, ctx: Any) -> None:
    servers: list[Server] = []
    source = ProcessServer(tmp_path, "--heartbeat-interval", "0.1",
                           kv_path=tmp_path / "hints" / "kv.json")
    hints = Peer(source.router, None, ctx)
    try:
        servers.append(Server(tmp_path, ctx, 0, peer=source.router))
        servers.append(Server(tmp_path, ctx, 2, peer=source.router))
        run = Run(*servers, hints=hints)
        run.configuration()
        started = time.monotonic()
        for seed in SEEDS:
            run_sequence(run, seed, STEPS)
        run.events_agree()
        assert run.steps == len(SEEDS) * STEPS
        assert len(servers[0].events[0]) > 100
        for kind in ("register", "close", "close an older connection", "expiry", "ZNS/1 expiry",
                     "unregister", "904", "322", "register topic", "kv put", "kv delete",
                     "large registration", "get_routes held", "peer hint"):
            assert run.made.get(kind), (kind, run.made)
        assert servers[1].pids is not None and servers[1].side.used == set(servers[1].pids)
        print(f"{run.steps} steps in {time.monotonic() - started:.1f} s: {run.made}")
    finally:
        for server in servers:
            server.close()
        hints.close()
        assert source.stop() == 0


# --- no client goes back in time, over remoting -------------------------------------------


def route_brokers(reply: rd.RemotingCommand) -> set[str]:
    """The broker names of a GET_ROUTEINFO_BY_TOPIC reply (none for TOPIC_NOT_EXIST)."""
    if reply.code == 17:
        return set()
    assert reply.code == 0, reply
    return {b["brokerName"] for b in json.loads(rd._lenient(reply.body))["brokerDatas"]}


def test_a_remoting_pull_after_an_event_never_answers_an_older_route(
        tmp_path: Path, ctx: Any) -> None:
    """An application's remoting connection and its subscriber (the agent's SUB) on
    different workers: once the subscriber saw a route event, a GET_ROUTEINFO_BY_TOPIC over
    the application's connection answers that route or a later one. Routes only grow here
    (each write adds a broker name to one topic), so "that route or a later one" is "every
    broker name the event's route lists, at least"."""
    server = Server(tmp_path, ctx, 2)
    try:
        assert server.pids is not None
        apps = {w: server.side.placed(w) for w in (1, 2)}  # the applications' connections
        brokers = {w: server.side.placed(w) for w in (1, 2)}  # writers: brokers, over remoting
        writers = {1: server.peers[0], 2: server.peers[1]}  # and ZNS/1 DEALERs
        subs = {1: server.subs[0], 2: server.subs[1]}

        def register(n: int, worker: int, remoting: bool) -> None:
            name, addr, topic = f"b{n}", f"10.4.{n // 250}.{n % 250}:10911", f"T{n % 7}"
            if remoting:
                slot = rd.Slot(name, 0, addr, "c1", counter=1)
                reply = brokers[worker].call(rd.register_request(
                    slot, {topic: {"read": 4, "write": 4, "perm": 6, "sys_flag": 0}}, "c1", "",
                    [], 479))
                assert reply.code == 0, reply
            else:
                writers[worker].ok("register_broker", cluster="c1", broker_name=name,
                                   broker_id=0, broker_addr=addr, topics={topic: {}})

        def events(worker: int, timeout_ms: int) -> list[Any]:
            """The route events `worker`'s subscriber has, or receives within `timeout_ms`
            (its `hb`s, every 0.1 s, do not end the wait)."""
            sub = subs[worker].sub
            assert sub is not None
            found = []
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                while sub.poll(0):
                    channel, body = sub.recv_multipart()
                    if channel.startswith(b"route/"):
                        found.append(schema.decode_event(body))
                left = deadline - time.monotonic()
                if found or left <= 0:
                    return found
                sub.poll(int(left * 1000) + 1)

        def pull_after(event: Any, worker: int) -> None:
            reply = apps[worker].call(rd.request(105, {"topic": event.topic}))
            seen = {b.broker_name for b in event.route.brokers}
            assert route_brokers(reply) >= seen, (event.topic, event.revision, worker)

        # The fence, seen directly: with the other worker stopped, a broker's registration
        # over remoting is answered by its worker, and its event published at once (the
        # stopped worker's channel took the command); a remoting read sent to the stopped
        # worker is answered once it runs again, with the new route: it applies what was
        # written to it before it answers.
        n = 0
        for writer_worker in (1, 2):
            other = 3 - writer_worker
            resume = threading.Timer(1.0, os.kill, (server.pids[other - 1], signal.SIGCONT))
            os.kill(server.pids[other - 1], signal.SIGSTOP)
            try:
                register(n, writer_worker, remoting=True)
                assert route_brokers(apps[writer_worker].call(
                    rd.request(105, {"topic": f"T{n % 7}"}))) >= {f"b{n}"}
                held = wait_for(lambda: events(writer_worker, 100))
                resume.start()
                pull_after(held[0], other)
            finally:
                resume.cancel()
                os.kill(server.pids[other - 1], signal.SIGCONT)
            for sub_worker in (1, 2):  # the other subscriber's copy, out of the way
                if sub_worker != writer_worker:
                    wait_for(lambda: events(sub_worker, 100))
            n += 1

        # Under a stream of writes (over both protocols, through both workers): every route
        # event either worker's subscriber sees, pulled at once over remoting on the other
        # worker (and on its own).
        pulls = 0
        for n in range(n, n + 300):
            register(n, 1 + n % 2, remoting=n % 3 != 0)
            for sub_worker in (1, 2):
                for event in events(sub_worker, 0):
                    for app_worker in (3 - sub_worker, sub_worker):
                        pull_after(event, app_worker)
                        pulls += 1
        assert pulls > 100
    finally:
        server.close()


# Registrations whose commands hold, in their topic names alone, four times the send buffer
# of a stopped worker's channel (a socketpair's, as this host makes them: 208 KiB by
# default): the last ones wait in the state process, not written to that worker.
FENCE_WRITES = 16
FENCE_TOPIC_BYTES = 120  # the length of each bulk topic's name
# The state process drops a worker that acknowledges nothing for 10 s
# (zns.core.replication.DEFAULT_ACK_TIMEOUT_MS): the stopped one is resumed well before.
FENCE_STOP_S = 4.0


def test_an_event_waits_until_its_command_is_written_to_every_worker_and_no_pull_goes_back(
        tmp_path: Path, ctx: Any) -> None:
    """The commit fence itself (zns.core.replication), which the tests above never reach:
    with worker 2 stopped (SIGSTOP) its channel still takes a command or two, so an event
    its write made is published at once and worker 2 catches up before a read; only a
    channel that cannot take the command makes the fence hold an event. Here worker 2's
    channel is filled by large registrations through worker 1, so the later ones are not
    written to worker 2 while it is stopped: worker 1 must not publish their events. Every
    route event worker 1's subscriber saw meanwhile is then pulled on worker 2, over ZNS/1
    and over remoting (the pulls sent while it is stopped, answered as it resumes): never
    older than the event. Without the fence (events published as applied) the last
    registrations' events are seen and those pulls answer `not_found`."""
    server = Server(tmp_path, ctx, 2)
    try:
        assert server.pids is not None
        writer, reader, sub = server.peers[0], server.peers[1], server.subs[0]  # 1, 2, 1
        app = server.side.placed(2)  # an application's remoting connection on worker 2
        assert sub.sub is not None
        pair = socket.socketpair()  # as the state process makes each channel
        buffer = pair[0].getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        for end in pair:
            end.close()
        per_write = max(100, -(-4 * buffer // (FENCE_WRITES * FENCE_TOPIC_BYTES)))

        def route_events(timeout_ms: int) -> list[Any]:
            """The route events of the `P` topics worker 1's subscriber gets within
            `timeout_ms` (its `hb`s, every 0.1 s, left out)."""
            found = []
            deadline = time.monotonic() + timeout_ms / 1000
            while sub.sub.poll(max(0, round((deadline - time.monotonic()) * 1000))):
                channel, body = sub.sub.recv_multipart()
                if channel.startswith(b"route/P"):
                    found.append(schema.decode_event(body))
            return found

        route_events(0)
        stopped, state_process = server.pids[1], server.proc.proc.pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            started = time.monotonic()
            written = 0
            while written < FENCE_WRITES and time.monotonic() - started < FENCE_STOP_S:
                n = written
                topics: dict[str, Any] = {f"P{n}": {}}
                topics.update({f"B{n}_{i:05}_".ljust(FENCE_TOPIC_BYTES, "x"): {}
                               for i in range(per_write)})
                writer.ok("register_broker", cluster="c1", broker_name=f"b{n}", broker_id=0,
                          broker_addr=f"10.6.0.{n + 1}:10911", topics=topics)
                written += 1
            seen = route_events(300)
            # Pulls of every topic whose event was seen, sent to the stopped worker (queued in
            # its sockets), over ZNS/1 and over remoting ...
            for event in seen:
                reader.send_raw(schema.encode({"op": "get_route", "topic": event.topic,
                                               "id": event.revision}))
            pulled = app.send([rd.request(105, {"topic": event.topic}) for event in seen])
            # ... answered with the state process stopped: the worker has only what was
            # written to it (else it may be written the rest before it reads the pulls).
            os.kill(state_process, signal.SIGSTOP)
            try:
                os.kill(stopped, signal.SIGCONT)
                zns1 = [schema.decode_reply(reader.recv_raw()[-1]) for _ in seen]
                remoting = app.collect(pulled)
            finally:
                os.kill(state_process, signal.SIGCONT)
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert written == FENCE_WRITES, f"only {written} registrations in {FENCE_STOP_S} s"
        older = [("ZNS/1", event.topic, event.revision, reply) for event, reply in zip(seen, zns1)
                 if isinstance(reply, schema.Error) or reply.revision < event.revision]
        older += [("remoting", event.topic, event.revision, reply.code, reply.remark)
                  for event, reply in zip(seen, remoting)
                  if not route_brokers(reply) >= {b.broker_name for b in event.route.brokers}]
        by = {p: [o[1:] for o in older if o[0] == p] for p in ("ZNS/1", "remoting")}
        assert not older, {p: (len(found), found[:2]) for p, found in by.items()}
        # The fence held what was not written to worker 2 ...
        seen_topics = {event.topic for event in seen}
        assert f"P{written - 1}" not in seen_topics, (written, sorted(seen_topics))
        # ... and lets it go once it is: every registration's event.
        def all_seen() -> bool:
            seen_topics.update(e.topic for e in route_events(100))
            return seen_topics >= {f"P{n}" for n in range(written)}
        wait_for(all_seen)
    finally:
        server.close()


# Writes through worker 2 while worker 1 is stopped: past two windows of commands
# (zns.core.replication.DEFAULT_WINDOW, 1024 sent and unacknowledged per worker), so that
# when worker 1 resumes, has applied what its channel holds and forwards a write, that
# write's command is still outside its window: its `Answer` reaches it before its `Apply`.
RYW_WRITES = 2 * DEFAULT_WINDOW + 512
RYW_WRITERS = 8  # connections on worker 2, each with its writes pipelined
RYW_RESUME_S = 1.0  # worker 1 runs alone this long (see the test)


def test_a_write_answered_before_its_command_arrives_is_replied_once_applied(
        tmp_path: Path, ctx: Any) -> None:
    """Read-your-writes where it is not free: the state process sends a worker at most a
    window of commands unacknowledged, but the answer to a write it forwarded at once, so
    a worker far behind gets a write's answer before the write's command; it must reply
    only once its replica applied that command (`Replica._release_answers`), or a read
    behind the write on the same connection answers without it. The differential never
    gets there (its workers are never a window behind), nor do the tests above."""
    server = Server(tmp_path, ctx, 2)
    try:
        assert server.pids is not None
        own = server.peers[0]  # on worker 1
        writers = [server.peer_on_worker(2) for _ in range(RYW_WRITERS)]
        stopped, state_process = server.pids[0], server.proc.proc.pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            started = time.monotonic()
            for n in range(RYW_WRITES):
                writers[n % RYW_WRITERS].send_raw(schema.encode({
                    "op": "kv_put", "namespace": "ryw", "key": f"k{n}", "value": "v", "id": n}))
            for n in range(RYW_WRITES):
                reply = schema.decode_reply(writers[n % RYW_WRITERS].recv_raw()[-1])
                assert isinstance(reply, schema.KvPutReply), reply
            took = time.monotonic() - started
            # A write and a read of it, pipelined over worker 1's connection, read by it
            # as it resumes.
            own.send_raw(schema.encode({"op": "kv_put", "namespace": "ryw", "key": "mine",
                                        "value": "written", "id": 1}))
            own.send_raw(schema.encode({"op": "kv_get", "namespace": "ryw", "key": "mine",
                                        "id": 2}))
            # Worker 1 resumes with the state process stopped: it applies what its channel
            # holds (a window at most), acknowledges it and forwards the write, and the
            # state process then reads both at once, so the window it slides is still
            # short of the write's command. (Were worker 1 slower than this, the state
            # process would only send it more first: a weaker test, never a false failure.)
            os.kill(state_process, signal.SIGSTOP)
            try:
                os.kill(stopped, signal.SIGCONT)
                time.sleep(RYW_RESUME_S)
            finally:
                os.kill(state_process, signal.SIGCONT)
        finally:
            os.kill(stopped, signal.SIGCONT)
        # Worker 1 was stopped for less than the state process's ack timeout (10 s), so it
        # is still the worker that answers (not a replacement that loaded a new state).
        assert took < 6, f"{RYW_WRITES} writes took {took:.1f} s"
        written = schema.decode_reply(own.recv_raw()[-1])
        assert isinstance(written, schema.KvPutReply), written
        read = schema.decode_reply(own.recv_raw()[-1])
        assert isinstance(read, schema.KvGetReply) and read.value == "written", read
        assert worker_pid(server.proc, 1) == stopped
    finally:
        server.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_connections_closing_at_once_on_two_workers_go_as_two_steps(
        tmp_path: Path, ctx: Any, workers: int) -> None:
    """The one documented difference the differential steps around (it closes one connection
    at a time): a listener removes what the connections that closed in one turn of its loop
    registered as one step (one revision), and each worker has its own listener. Two broker
    connections closed while the server was stopped (SIGSTOP), so that it finds both closed
    in one turn: one revision for a single process, one per worker for two workers
    (docs/protocol.md §12)."""
    server = Server(tmp_path, ctx, workers)
    try:
        conns = {w: server.side.placed(w) for w in (1, 2)}
        for w, conn in conns.items():
            slot = rd.Slot(f"b{w}", 0, f"10.5.0.{w}:10911", "c1", counter=1)
            topics = {"Closing": {"read": 4, "write": 4, "perm": 6, "sys_flag": 0}}
            assert conn.call(rd.register_request(slot, topics, "c1", "", [], 479)).code == 0
        stopped = server.pids or [server.proc.proc.pid]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            for conn in conns.values():
                conn.close()
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)

        def removed() -> list[Any]:
            server.drain()
            return [e for e in server.events[0] if e.get("reason") == "disconnected"]
        wait_for(lambda: len(removed()) == 2)
        first, second = removed()
        assert {first["broker_name"], second["broker_name"]} == {"b1", "b2"}
        assert second["revision"] - first["revision"] == (1 if workers else 0)
    finally:
        server.close()

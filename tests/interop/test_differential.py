"""zns against the Java NameServer as the oracle: generated request sequences, every read compared.

One Java NameServer and one `zns serve --remoting` per RocketMQ version of the matrix
(tools/rocketmq/fetch.py VERSIONS); tests/interop/differential.py generates the steps
and compares the replies byte for byte (its docstring lists the few documented
normalizations). 5.3.3, the version zns follows, runs in depth; the others run a
smaller count. ``ZNS_DIFFERENTIAL_STEPS`` changes the 5.3.3 count; bench/differential.py
makes long runs. `test_known_differences_are_as_documented` pins each difference that
docs/protocol.md §15 keeps, so that a change on either side shows up here.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

import differential
import rocketmq
from differential import Differential, RemotingConnection, Slot, ZnsProcess, register_request, request

pytestmark = pytest.mark.interop

DEEP_VERSION = rocketmq.DEFAULT_VERSION
STEPS = {DEEP_VERSION: int(os.environ.get("ZNS_DIFFERENTIAL_STEPS", "2000"))}
OTHER_STEPS = 400
PER_SEQUENCE = 200


class Servers:
    def __init__(self, version: str, java: rocketmq.JavaNameServer, zns: ZnsProcess) -> None:
        self.version, self.java, self.zns = version, java, zns


@pytest.fixture(scope="module")
def booting(rocketmq_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every version's Java NameServer launched at once (their JVM start-ups overlap); each
    `servers` below waits for its own. Versions without jars are left out (skipped there)."""
    root = tmp_path_factory.mktemp("differential")
    group = rocketmq.ProcessGroup(root / "java")
    started: dict[str, Any] = {}
    try:
        for version in rocketmq.VERSIONS:
            try:
                rocketmq.ensure_jars(version)
            except rocketmq.InteropUnavailable:
                continue
            started[version] = group.namesrv(version=version, wait=False,
                                             config=differential.JAVA_CONFIG)
        yield started
    finally:
        group.close()


@pytest.fixture(scope="module", params=rocketmq.VERSIONS)
def servers(request: pytest.FixtureRequest, booting: dict[str, Any],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    version = request.param
    with rocketmq.unavailable_skips():
        rocketmq.ensure_jars(version)  # raises the remembered reason when booting left it out
    zns = ZnsProcess(tmp_path_factory.mktemp(f"differential-zns-{version}"))
    try:
        yield Servers(version, booting[version].wait_ready(), zns)
    finally:
        zns.stop()
        booting[version].kill()  # done with it: its JVM leaves the machine to the next


@pytest.mark.timeout(400)
def test_generated_sequences_answer_as_the_java_nameserver(servers: Servers) -> None:
    steps = STEPS.get(servers.version, OTHER_STEPS)
    v4 = servers.version.startswith("4.")
    diff = Differential(servers.java.addr, servers.zns.addr,
                        java_version=rocketmq.version_ordinal(servers.version), v4=v4, expiry=True)
    started = time.monotonic()
    try:
        stats = diff.run(iter(range(1, 1_000_000)), PER_SEQUENCE, steps)
    finally:
        diff.close()
    print(f"  RocketMQ {servers.version}: {stats.steps} steps, {stats.sequences} sequences, "
          f"{stats.reads} reads compared, {stats.expiries} expiries, "
          f"{time.monotonic() - started:.1f} s")
    assert stats.steps >= steps
    assert not stats.differences, "\n\n".join(str(d) for d in stats.differences)
    assert stats.expiries >= (0 if v4 else stats.sequences)  # one per sequence against 5.x
    wanted = {"no enableActingMaster", "compressed", "crc zero", "crc absent", "wrong crc",
              "a second address takes the id", "a displaced address registers again",
              "register over a second connection", "close an older connection",
              *(() if v4 else ("binary header",))}
    assert wanted <= stats.made.keys(), wanted - stats.made.keys()


# What the exploring generator must write: issue 33's sequences, each a difference zns keeps
# (docs/protocol.md §15) or had.
EXPLORED = {"no enableActingMaster", "a second address takes the id", "one address under two names",
            "unregister naming the wrong cluster", "unregister naming the wrong name",
            "unregister naming the wrong address", "wrong crc", "binary header",
            "into the other cluster", "close", "close an older connection", "compressed"}


@pytest.mark.timeout(120)
def test_the_exploring_generator_writes_every_kept_difference(tmp_path: Any) -> None:
    """`explore` (bench/differential.py --explore) writes each sequence of issue 33; driven
    against zns alone (what it registered decides the next steps), so no JVM is needed."""
    zns = ZnsProcess(tmp_path)
    side = differential.Side(zns.addr)
    made: dict[str, int] = {}
    try:
        for seed in range(1, 4):
            gen = differential.Generator(random.Random(seed), f"e{seed}x", seed, explore=True)
            seen = differential.Observed()
            for _ in range(200):
                step = gen.step(seen)
                if step.close:
                    assert step.conn is not None
                    side.drop(step.conn)
                else:
                    side.conn(step.conn).call_many([differential._copy(c) for c in step.requests])
                seen = differential.observed(side.admin.call(request(106)))
            for kind, n in gen.made.items():
                made[kind] = made.get(kind, 0) + n
            assert side.reset(gen)
    finally:
        side.close()
        zns.stop()
    assert EXPLORED <= made.keys(), EXPLORED - made.keys()


def test_reset_leaves_nothing_of_a_sequence(servers: Servers) -> None:
    """The harness itself: a sequence's names are gone from both servers after it."""
    diff = Differential(servers.java.addr, servers.zns.addr,
                        java_version=rocketmq.version_ordinal(servers.version),
                        v4=servers.version.startswith("4."))
    try:
        stats = differential.RunStats()
        assert diff.run_sequence(987654, 30, stats) is None, stats.differences
        for side in (diff.java, diff.zns):
            listed = side.admin.call(request(106)).body + side.admin.call(request(206)).body
            assert b"s987654x" not in listed
            topics = json.loads(side.admin.call(request(206)).body)["topicList"]
            assert not [t for t in topics if t.startswith("s987654x")]
    finally:
        diff.close()


def _both(servers: Servers, conn_java: RemotingConnection, conn_zns: RemotingConnection,
          cmd: Any) -> tuple[Any, Any]:
    copy = differential._copy
    return conn_java.call(copy(cmd)), conn_zns.call(copy(cmd))


class Broker:
    """One broker's connections to both servers (the Java NameServer, zns)."""

    def __init__(self, servers: Servers) -> None:
        self.java = RemotingConnection(servers.java.addr)
        self.zns = RemotingConnection(servers.zns.addr)

    def both(self, cmd: Any) -> tuple[Any, Any]:
        copy = differential._copy
        return self.java.call(copy(cmd)), self.zns.call(copy(cmd))

    def register(self, slot: Slot, topics: list[str], *, cluster: str = "",
                 fs: list[str] | None = None) -> tuple[Any, Any]:
        config = {"read": 4, "write": 4, "perm": 6, "sys_flag": 0}
        j, z = self.both(register_request(slot, {t: config for t in topics}, cluster or slot.cluster,
                                          "", fs or [], 479))
        assert j.code == z.code == 0, (j, z)
        return j, z

    def close(self) -> None:
        self.java.close()
        self.zns.close()


def _eventually(check: Any, what: str, timeout: float = differential.SETTLE_S) -> None:
    """Wait for the Java NameServer's asynchronous removals (BatchUnregistrationService)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _route_code(conn: RemotingConnection, topic: str) -> int:
    return conn.call(request(105, {"topic": topic})).code


def _unregister(slot: Slot, *, name: str = "", cluster: str = "", addr: str = "") -> Any:
    return request(104, {"brokerName": name or slot.name, "brokerAddr": addr or slot.addr,
                         "clusterName": cluster or slot.cluster, "brokerId": str(slot.broker_id)})


def _kept_differences_5x(servers: Servers, tag: str, java: RemotingConnection,
                         zns: RemotingConnection) -> None:
    """Issue 33's items 2-5 and 9, as docs/protocol.md §15 describes them (5.x)."""
    def slot(name: str, broker_id: int, host: int, cluster: str = "c") -> Slot:
        return Slot(f"{tag}{name}", broker_id, f"127.0.253.{host}:10911", f"{tag}{cluster}",
                    counter=1, timestamp=1)

    brokers: list[Broker] = []

    def broker() -> Broker:
        brokers.append(Broker(servers))
        return brokers[-1]

    try:
        # Item 2: a second address takes (name, id): both keep the name's topics; Java keeps
        # the old address's liveness (its 322 answers changed=false), zns dropped it.
        old, new = slot("r", 0, 1), slot("r", 0, 2)
        old_conn = broker()
        old_conn.register(old, [f"{tag}R1", f"{tag}R5"])
        broker().register(new, [f"{tag}R2"])
        for conn in (java, zns):
            assert _route_code(conn, f"{tag}R1") == 0
        j, z = old_conn.both(request(322, {"brokerName": old.name, "brokerAddr": old.addr,
                                           "clusterName": old.cluster, "brokerId": "0"},
                                     json.dumps(old.data_version()).encode()))
        assert (j.ext_fields, z.ext_fields) == ({"changed": "false"}, {"changed": "true"})

        # Item 3: one address under two names on one connection, closed: Java takes it off
        # one name only (the first in its table), zns off both.
        two = broker()
        first, second = slot("p", 2, 3), slot("q", 2, 3)
        two.register(first, [f"{tag}P1", f"{tag}P2"])
        two.register(second, [f"{tag}Q1", f"{tag}Q2"])
        two.close()
        _eventually(lambda: [_route_code(java, f"{tag}{n}1") for n in "PQ"].count(17) == 1,
                    "Java removed the closed address from one broker name")
        _eventually(lambda: [_route_code(zns, f"{tag}{n}1") for n in "PQ"] == [17, 17],
                    "zns removed the closed address from both names")

        # Item 4: UNREGISTER naming another cluster: Java removes the name's topics, zns nothing.
        wrong_cluster = slot("u", 0, 4)
        broker().register(wrong_cluster, [f"{tag}U1", f"{tag}U2"])
        j, z = _both(servers, java, zns, _unregister(wrong_cluster, cluster=f"{tag}elsewhere"))
        assert j.code == z.code == 0
        _eventually(lambda: _route_code(java, f"{tag}U1") == 17, "Java removed the name")
        assert _route_code(zns, f"{tag}U1") == 0

        # Item 5: UNREGISTER naming another broker name: Java drops the address's liveness
        # (a slave of its name is told no master), zns changes nothing.
        master, slave = slot("m", 0, 5), slot("m", 1, 6)
        master_conn = broker()
        master_conn.register(master, [f"{tag}M1", f"{tag}M2"])
        j, z = _both(servers, java, zns, _unregister(master, name=f"{tag}other"))
        assert j.code == z.code == 0
        query = request(322, {"brokerName": master.name, "brokerAddr": master.addr,
                              "clusterName": master.cluster, "brokerId": "0"},
                        json.dumps(master.data_version()).encode())
        _eventually(lambda: master_conn.java.call(differential._copy(query)).ext_fields
                    == {"changed": "true"}, "Java dropped the master's liveness")
        assert master_conn.zns.call(differential._copy(query)).ext_fields == {"changed": "false"}
        j, z = broker().register(slave, [f"{tag}M1", f"{tag}M2"])
        assert "masterAddr" not in (j.ext_fields or {})
        assert (z.ext_fields or {}).get("masterAddr") == master.addr

        # Item 9: a name in two clusters. Java looks filter servers up under BrokerData.cluster
        # (the address's own cluster is another: none shown), and never removes an address of
        # the other cluster when its connection closes; zns shows them and removes it.
        home, away = slot("f", 1, 7), slot("f", 0, 8, cluster="c2")
        broker().register(home, [f"{tag}F1", f"{tag}F2"])
        away_conn, witness_conn = broker(), broker()
        away_conn.register(away, [f"{tag}F1", f"{tag}F2"], fs=["127.0.0.1:40001"])
        j, z = _both(servers, java, zns, request(105, {"topic": f"{tag}F1"}))
        assert b"40001" not in j.body and b'"127.0.0.1:40001"' in z.body
        witness = slot("w", 0, 9)
        witness_conn.register(witness, [f"{tag}W1", f"{tag}W2"])
        away_conn.close()
        witness_conn.close()  # the same removal path: once it went, the other close was handled
        _eventually(lambda: _route_code(java, f"{tag}W1") == 17, "Java handled the closes")
        _eventually(lambda: away.addr.encode() not in zns.call(request(106)).body,
                    "zns removed the closed address")
        assert away.addr.encode() in java.call(request(106)).body
    finally:
        for b in brokers:
            b.close()


def _kept_differences_4x(servers: Servers, tag: str, java: RemotingConnection,
                         zns: RemotingConnection) -> None:
    """Issue 33's item 7: a 4.9.7 NameServer answers a binary header in kind, and an
    UNREGISTER naming an address that does not hold the id removes the id's address."""
    j, z = _both(servers, java, zns, request(105, {"topic": f"{tag}none"}, binary=True))
    assert (j.code, z.code) == (17, 17)
    assert (j.serialize_type, z.serialize_type) == (differential.SERIALIZE_ROCKETMQ,
                                                    differential.SERIALIZE_JSON)
    held = Slot(f"{tag}s", 0, "127.0.253.11:10911", f"{tag}c", counter=1, timestamp=1)
    conn = Broker(servers)
    try:
        conn.register(held, [f"{tag}S1", f"{tag}S2"])
        j, z = _both(servers, java, zns, _unregister(held, addr="127.0.253.12:10911"))
        assert j.code == z.code == 0
        _eventually(lambda: _route_code(java, f"{tag}S1") == 17, "4.9.7 removed the id")
        assert _route_code(zns, f"{tag}S1") == 0
    finally:
        conn.close()


@pytest.mark.timeout(180)
def test_known_differences_are_as_documented(servers: Servers) -> None:
    """Each difference docs/protocol.md §15 keeps, exactly as documented (both sides).

    Runs last on its servers: what it registers differs between them on purpose."""
    java, zns = RemotingConnection(servers.java.addr), RemotingConnection(servers.zns.addr)
    v4 = servers.version.startswith("4.")
    tag = f"k{random.randrange(1 << 30)}"
    try:
        # The reply header's version: each announces its own.
        j, z = _both(servers, java, zns, request(105, {"topic": f"{tag}T"}))
        assert (j.version, z.version) == (rocketmq.version_ordinal(servers.version), 479)
        # TOPIC_NOT_EXIST: Java's remark adds a link to its FAQ.
        assert j.code == z.code == 17
        assert z.remark == f"No topic route info in name server for the topic: {tag}T"
        assert j.remark.startswith(z.remark + "\nSee http") and j.remark.endswith(" for further details.")

        # One topic from a broker id the name does not hold: Java refuses, zns applies it.
        slot = Slot(f"{tag}b", 0, "127.0.254.1:10911", f"{tag}c", counter=1, timestamp=1)
        one = register_request(slot, {f"{tag}T": {"read": 4, "write": 4, "perm": 6, "sys_flag": 0}},
                               slot.cluster, "", [], 479)
        j, z = _both(servers, java, zns, one)
        if not v4:  # 4.x has no such check: it applies the topic too
            assert (j.code, j.remark) == (1, "register broker failed")
        assert z.code == 0

        if v4:
            # Codes that came with 5.0: a 4.x NameServer sends no reply at all to them (its
            # processor returns null for a code it does not know); zns answers them.
            for code, ext in ((904, {"brokerName": slot.name, "brokerAddr": slot.addr,
                                     "clusterName": slot.cluster, "brokerId": "0"}),
                              (901, {"clusterName": slot.cluster, "brokerName": slot.name})):
                assert zns.call(request(code, ext)).code == 0
                silent = RemotingConnection(servers.java.addr, timeout=2.0)
                try:
                    with pytest.raises(TimeoutError):
                        silent.call(request(code, ext))
                finally:
                    silent.close()
        else:
            # A slave registering its name in a second cluster: Java looks its master up in that
            # cluster's liveness and finds none (no masterAddr); zns names the master.
            topics = {f"{tag}U": {"read": 4, "write": 4, "perm": 6, "sys_flag": 0},
                      f"{tag}V": {"read": 4, "write": 4, "perm": 6, "sys_flag": 0}}
            master = Slot(f"{tag}m", 0, "127.0.254.2:10911", f"{tag}c", counter=1, timestamp=1)
            slave = Slot(f"{tag}m", 1, "127.0.254.3:10911", f"{tag}c", counter=1, timestamp=1)
            for who in (master, slave):
                j, z = _both(servers, java, zns, register_request(who, topics, who.cluster, "", [], 479))
                assert j.code == z.code == 0
            j, z = _both(servers, java, zns, register_request(slave, topics, f"{tag}c2", "", [], 479))
            assert j.code == z.code == 0
            assert "masterAddr" not in (j.ext_fields or {})
            assert z.ext_fields == {"haServerAddr": "127.0.254.2:10912", "masterAddr": master.addr}
        (_kept_differences_4x if v4 else _kept_differences_5x)(servers, tag, java, zns)
    finally:
        java.close()
        zns.close()

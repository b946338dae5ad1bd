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
OTHER_STEPS = 200
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
            started[version] = group.namesrv(version=version, wait=False)
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
    diff = Differential(servers.java.addr, servers.zns.addr,
                        java_version=rocketmq.version_ordinal(servers.version),
                        v4=servers.version.startswith("4."))
    started = time.monotonic()
    try:
        stats = diff.run(iter(range(1, 1_000_000)), PER_SEQUENCE, steps)
    finally:
        diff.close()
    print(f"  RocketMQ {servers.version}: {stats.steps} steps, {stats.sequences} sequences, "
          f"{stats.reads} reads compared, {time.monotonic() - started:.1f} s")
    assert stats.steps >= steps
    assert not stats.differences, "\n\n".join(str(d) for d in stats.differences)


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


@pytest.mark.timeout(120)
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
    finally:
        java.close()
        zns.close()

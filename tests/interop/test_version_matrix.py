"""The version matrix: RocketMQ 4.9.7 and 5.5.0 brokers, mqadmin and clients with zns (5.3.3
runs in depth in test_zns_nameserver.py).

For each version: a broker of that version registers with zns and with the Java
NameServer of the same version at once; that version's own stock mqadmin lists the
broker and creates a topic through both; that version's own producer sends N messages
through zns and its own push consumer receives every one of them; the topic's route
as that version's client parses it (tests/interop/java/ZnsInteropClient.java, compiled
against each version's client jars) is the same from zns as from the Java NameServer;
and the route read raw from zns is the one the Java NameServer answers, byte for byte
(apart from the differences docs/protocol.md §15 documents for a 4.x NameServer,
removed by tests/interop/differential.view). The differential suite
(test_differential.py) covers the request space against the same three NameServer
versions.

Both versions' JVMs start side by side in one module fixture: their start-ups overlap.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rocketmq
from differential import RemotingConnection, ZnsProcess, request, view
from rocketmq import Phases, ProcessGroup, unique_topic, wait_until

pytestmark = pytest.mark.interop

OTHER_VERSIONS = [v for v in rocketmq.VERSIONS if v != rocketmq.DEFAULT_VERSION]
MESSAGES = 40


class Env:
    def __init__(self, version: str, java: rocketmq.JavaNameServer, zns: ZnsProcess,
                 broker: rocketmq.Broker | None = None) -> None:
        self.version, self.java, self.zns, self.broker = version, java, zns, broker


@pytest.fixture(scope="module")
def envs(rocketmq_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Env]]:
    with rocketmq.unavailable_skips():
        for version in OTHER_VERSIONS:
            rocketmq.ensure_jars(version)
            rocketmq.client_classes(version)
    root = tmp_path_factory.mktemp("matrix")
    group = ProcessGroup(root / "java")
    out: dict[str, Env] = {}
    try:
        for version in OTHER_VERSIONS:
            java = group.namesrv(version=version, wait=False)
            out[version] = Env(version, java, ZnsProcess(root / f"zns-{version}"))
        for env in out.values():
            env.java.wait_ready()
        for env in out.values():
            env.broker = group.broker(f"{env.zns.addr};{env.java.addr}", "broker-a", version=env.version,
                                      wait=False)
        for env in out.values():
            assert env.broker is not None
            env.broker.wait_ready()
        yield out
    finally:
        for env in out.values():
            env.zns.stop()
        group.close()


def read(addr: str, code: int, ext: dict[str, str] | None = None, version: int = 479):
    conn = RemotingConnection(addr)
    try:
        return conn.call(request(code, ext, version=version))
    finally:
        conn.close()


@pytest.mark.timeout(600)  # the first one includes the module's four JVM start-ups
@pytest.mark.parametrize("version", OTHER_VERSIONS)
def test_a_broker_mqadmin_and_clients_of_this_version_with_zns(envs: dict[str, Env], version: str) -> None:
    env = envs[version]
    broker = env.broker
    assert broker is not None
    v4 = version.startswith("4.")
    phase = Phases(f"matrix {version}")
    both = f"{env.zns.addr};{env.java.addr}"
    topic = unique_topic("matrix")
    listed, created = rocketmq.in_parallel(
        lambda: rocketmq.mqadmin(["clusterList"], env.zns.addr, version=version),
        lambda: rocketmq.mqadmin(["updateTopic", "-b", broker.addr, "-t", topic, "-r", "4", "-w", "4"], both,
                                 version=version))
    rows = [line.split() for line in listed.stdout.splitlines() if line.startswith("DefaultCluster")]
    assert any(r[1] == "broker-a" and r[3] == broker.addr for r in rows), listed
    assert "success" in created.stdout, created
    phase("its mqadmin: clusterList lists broker-a; updateTopic through both")

    wait_until(lambda: read(env.zns.addr, 105, {"topic": topic}).code == 0
               and read(env.java.addr, 105, {"topic": topic}).code == 0, 30, "the topic routed by both")
    for wire in (317, 479):  # the legacy and the standard form
        java = read(env.java.addr, 105, {"topic": topic}, wire)
        zns = read(env.zns.addr, 105, {"topic": topic}, wire)
        assert view(zns, v4) == view(java), (java, zns)
    phase("the raw route from zns is the Java NameServer's")

    # This version's own client code: its route as it parses it from each server, and its
    # producer and push consumer through zns (the consumer starts with the producer; a new
    # group reads from the first offset). A send's timeout is long enough for a loaded
    # machine, so every message is acknowledged once: the count is exact.
    # Requests to a NameServer get 15 s too (3 s by default), for the same reason.
    run_id = unique_topic("run")
    slow = {"version": version, "api_timeout": 15000}
    from_zns, from_java, sent, got = rocketmq.in_parallel(
        lambda: rocketmq.route(env.zns.addr, topic, **slow),
        lambda: rocketmq.route(env.java.addr, topic, **slow),
        lambda: rocketmq.produce(env.zns.addr, topic, MESSAGES, run_id=run_id, send_timeout=15000, **slow),
        lambda: rocketmq.consume(env.zns.addr, topic, MESSAGES, timeout=90, run_id=run_id, group=f"cg_{topic}",
                                 **slow))
    assert from_zns["ok"], from_zns
    assert from_zns == from_java
    assert [b["brokerAddrs"] for b in from_zns["brokerDatas"]] == [{"0": broker.addr}], from_zns
    assert ("zoneName" in from_zns["brokerDatas"][0]) is not v4, from_zns  # the client's own BrokerData
    assert (sent["sent"], sent["failed"], sent["brokers"]) == (MESSAGES, 0, {"broker-a": MESSAGES}), sent
    assert (got["unique"], got["timed_out"]) == (MESSAGES, False), got
    phase(f"its client: the route it parses from zns is the Java NameServer's; {MESSAGES} messages "
          "produced and all consumed through zns")

    info_zns, info_java = read(env.zns.addr, 106), read(env.java.addr, 106)
    assert view(info_zns, v4) == view(info_java)
    phase.total()

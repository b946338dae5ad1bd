"""The version matrix: RocketMQ 4.9.7 and 5.5.0 brokers and mqadmin with zns (5.3.3 runs in depth
in test_zns_nameserver.py).

For each version: a broker of that version registers with zns and with the Java
NameServer of the same version at once; that version's own stock mqadmin lists the
broker and creates a topic through both; the 5.3.3 producer and push consumer move
messages through zns; and the topic's route read from zns is the one the Java
NameServer answers, byte for byte (apart from the differences docs/protocol.md §15
documents for a 4.x NameServer, removed by tests/interop/differential.view).
The differential suite (test_differential.py) covers the request space against the
same three NameServer versions.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rocketmq
from differential import RemotingConnection, ZnsProcess, request, view
from rocketmq import Phases, ProcessGroup, unique_topic, wait_until

pytestmark = pytest.mark.interop

OTHER_VERSIONS = [v for v in rocketmq.VERSIONS if v != rocketmq.DEFAULT_VERSION]


class Env:
    def __init__(self, version: str, java: rocketmq.JavaNameServer, zns: ZnsProcess,
                 broker: rocketmq.Broker) -> None:
        self.version, self.java, self.zns, self.broker = version, java, zns, broker


@pytest.fixture(scope="module", params=OTHER_VERSIONS)
def env(request: pytest.FixtureRequest, rocketmq_env: None,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    version = request.param
    with rocketmq.unavailable_skips():
        rocketmq.ensure_jars(version)
    root = tmp_path_factory.mktemp(f"matrix-{version}")
    group = ProcessGroup(root / "java")
    zns = ZnsProcess(root / "zns")
    try:
        java = group.namesrv(version=version)
        broker = group.broker(f"{zns.addr};{java.addr}", "broker-a", version=version)
        yield Env(version, java, zns, broker)
    finally:
        zns.stop()
        group.close()


def read(addr: str, code: int, ext: dict[str, str] | None = None, version: int = 479):
    conn = RemotingConnection(addr)
    try:
        return conn.call(request(code, ext, version=version))
    finally:
        conn.close()


@pytest.mark.timeout(300)
def test_a_broker_and_mqadmin_of_this_version_with_zns(env: Env) -> None:
    phase = Phases(f"matrix {env.version}")
    both = f"{env.zns.addr};{env.java.addr}"
    listed = rocketmq.mqadmin(["clusterList"], env.zns.addr, version=env.version)
    rows = [line.split() for line in listed.stdout.splitlines() if line.startswith("DefaultCluster")]
    assert any(r[1] == "broker-a" and r[3] == env.broker.addr for r in rows), listed
    phase("its mqadmin clusterList lists broker-a")

    topic = unique_topic("matrix")
    res = rocketmq.mqadmin(["updateTopic", "-b", env.broker.addr, "-t", topic, "-r", "4", "-w", "4"], both,
                           version=env.version)
    assert "success" in res.stdout, res
    wait_until(lambda: read(env.zns.addr, 105, {"topic": topic}).code == 0
               and read(env.java.addr, 105, {"topic": topic}).code == 0, 30, "the topic routed by both")
    for version in (317, 479):  # the legacy and the standard form
        java = read(env.java.addr, 105, {"topic": topic}, version)
        zns = read(env.zns.addr, 105, {"topic": topic}, version)
        assert view(zns, env.version.startswith("4.")) == view(java), (java, zns)
    phase("the route from zns is the Java NameServer's")

    sent = rocketmq.produce(env.zns.addr, topic, 50)
    # A send may time out on a loaded machine (3 s); every one that went, went to broker-a.
    assert sent["sent"] >= 47 and set(sent["brokers"]) == {"broker-a"}, sent
    got = rocketmq.consume(env.zns.addr, topic, sent["sent"], timeout=60, run_id=sent["run_id"],
                           group=f"cg_{topic}")
    # A send that timed out may still have been stored: at least every acknowledged one arrives.
    assert got["unique"] >= sent["sent"], got
    phase("50 messages through zns (5.3.3 producer and push consumer)")
    info_zns, info_java = read(env.zns.addr, 106), read(env.java.addr, 106)
    assert view(info_zns, env.version.startswith("4.")) == view(info_java)
    phase.total()

"""The harness against RocketMQ's own Java NameServer: real brokers, clients and mqadmin.

These prove the harness (tests/interop/rocketmq.py); the same scenarios pointed at zns
show that zns is a drop-in NameServer. One NameServer and one broker serve the whole
module; tests that need more start and kill their own brokers.
"""

from __future__ import annotations

import time

import pytest

import rocketmq
from rocketmq import Broker, JavaNameServer, Phases, ProcessGroup, unique_topic, wait_until

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def namesrv(rmq_module: ProcessGroup) -> JavaNameServer:
    return rmq_module.namesrv()


@pytest.fixture(scope="module")
def broker_a(rmq_module: ProcessGroup, namesrv: JavaNameServer) -> Broker:
    return rmq_module.broker(namesrv.addr, "broker-a")


@pytest.mark.timeout(120)
def test_broker_registers_and_mqadmin_sees_it(namesrv: JavaNameServer, broker_a: Broker) -> None:
    cluster, topic_route, route = rocketmq.in_parallel(
        # The stock launcher once, to prove the harness runs mqadmin as shipped too.
        lambda: rocketmq.mqadmin(["clusterList"], namesrv.addr, stock=True),
        lambda: rocketmq.mqadmin(["topicRoute", "-t", "TBW102"], namesrv.addr),
        lambda: rocketmq.route(namesrv.addr, "TBW102"),
    )
    assert cluster.rc == 0, cluster
    rows = [line.split() for line in cluster.stdout.splitlines() if line.startswith("DefaultCluster")]
    assert any(row[1] == "broker-a" and row[2] == "0" and row[3] == broker_a.addr for row in rows), cluster.stdout

    assert topic_route.rc == 0, topic_route
    assert '"brokerName":"broker-a"' in topic_route.stdout and broker_a.addr in topic_route.stdout, topic_route

    assert route["ok"], route
    assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": broker_a.addr}]
    assert route["queueDatas"][0]["brokerName"] == "broker-a"


@pytest.mark.timeout(150)
def test_thousand_messages_to_an_auto_created_topic(namesrv: JavaNameServer, broker_a: Broker) -> None:
    topic = unique_topic("interop_auto")
    absent = rocketmq.route(namesrv.addr, topic)
    assert not absent["ok"] and absent["code"] == 17, absent  # TOPIC_NOT_EXIST

    sent = rocketmq.produce(namesrv.addr, topic, 1000)
    assert sent["sent"] == 1000 and sent["failed"] == 0, sent
    assert sent["brokers"] == {"broker-a": 1000}, sent

    # The broker registered the auto-created topic on the first send: its route is read while
    # the consumer runs (one JVM start less on the critical path).
    got, route = rocketmq.in_parallel(
        lambda: rocketmq.consume(namesrv.addr, topic, 1000, timeout=60, run_id=sent["run_id"], group=f"cg_{topic}"),
        lambda: rocketmq.route(namesrv.addr, topic),
    )
    assert got["unique"] == 1000 and not got["timed_out"], got
    assert route["ok"] and [q["brokerName"] for q in route["queueDatas"]] == ["broker-a"], route


@pytest.mark.timeout(180)
def test_sigkill_one_broker_producer_keeps_sending_sigterm_unregisters(
        namesrv: JavaNameServer, broker_a: Broker, rmq: ProcessGroup) -> None:
    phase = Phases()
    broker_b, broker_c = rmq.brokers(namesrv.addr, ["broker-b", "broker-c"])
    phase("two more brokers started and registered")
    topic = unique_topic("interop_failover")
    # Created on every broker of the cluster; each broker registers the topic before replying.
    res = rocketmq.mqadmin(["updateTopic", "-c", "DefaultCluster", "-t", topic, "-r", "4", "-w", "4"], namesrv.addr)
    assert res.stdout.count("success") == 3, res
    phase("mqadmin updateTopic on the cluster")
    everyone = {"broker-a", "broker-b", "broker-c"}

    def route_brokers() -> set[str]:
        r = rocketmq.route(namesrv.addr, topic)
        return {q["brokerName"] for q in r["queueDatas"]} if r["ok"] else set()


    # Stopped once it has sent enough after the kill; 90 s only bounds it: its waits, 30 s to
    # reach every broker and 60 after the kill (the loop ending first cut the second short).
    with rocketmq.ProduceLoop(namesrv.addr, topic, duration=90, rate=25) as loop:
        loop.wait_until(lambda sends: {s.get("broker") for s in sends if s["ok"]} == everyone,
                        30, "sends reached every broker")
        phase("producer loop reached every broker")
        broker_b.kill()  # SIGKILL: no unregistration, only the closed connection tells
        killed_at = time.monotonic()
        loop.wait_until(rocketmq.sent_after(killed_at, {"broker-a", "broker-c"}), 60,
                        f"{rocketmq.SENDS_AFTER_KILL} sends after the kill, to each survivor")
        summary = loop.stop()
    phase("producer loop ended")
    sends = loop.sends()
    after = rocketmq.check_sends_left_the_killed_broker(sends, killed_at, {"broker-a", "broker-c"},
                                                        summary)

    # SIGTERM: the shutdown hook unregisters first; the JVM itself takes many more seconds.
    broker_c.shutdown()
    phase("broker-c unregistered after SIGTERM")

    def listed() -> set[str]:
        out = rocketmq.mqadmin(["clusterList"], namesrv.addr).stdout
        return {row.split()[1] for row in out.splitlines() if row.startswith("DefaultCluster")}

    # The Java NameServer drops a killed broker as soon as its connection closes.
    wait_until(lambda: rocketmq.in_parallel(listed, route_brokers) == [{"broker-a"}, {"broker-a"}], 20,
               "clusterList and the topic's route list only broker-a")
    phase("clusterList and route list only broker-a")
    failed = [s for s in sends if not s["ok"]]
    print(f"  sends: {len(sends)}, failed: {len(failed)}, after the kill: {len(after)}, "
          f"max latency after the kill: {max(s['latency_ms'] for s in after)} ms")


@pytest.mark.timeout(120)
def test_kv_and_namesrv_config_through_mqadmin(namesrv: JavaNameServer) -> None:
    topic = unique_topic("interop_kv")

    def kv_round_trip() -> None:
        res = rocketmq.mqadmin(["updateKvConfig", "-s", "ORDER_TOPIC_CONFIG", "-k", topic, "-v", "broker-a:4"],
                               namesrv.addr)
        assert "success" in res.stdout, res
        # updateOrderConf -m get reads the KV back (namespace ORDER_TOPIC_CONFIG, key = topic).
        res = rocketmq.mqadmin(["updateOrderConf", "-t", topic, "-m", "get"], namesrv.addr)
        assert "orderConf=[broker-a:4]" in res.stdout, res
        res = rocketmq.mqadmin(["deleteKvConfig", "-s", "ORDER_TOPIC_CONFIG", "-k", topic], namesrv.addr)
        assert "success" in res.stdout, res

    _, res = rocketmq.in_parallel(kv_round_trip, lambda: rocketmq.mqadmin(["getNamesrvConfig"], namesrv.addr))
    assert res.rc == 0 and f"============{namesrv.addr}============" in res.stdout, res
    config = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in res.stdout.splitlines()[1:]) if k.strip()
    )
    assert config.get("listenPort") == str(namesrv.port), config

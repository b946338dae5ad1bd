"""The harness against RocketMQ's own Java NameServer: real brokers, clients and mqadmin.

These prove the harness (tests/interop/rocketmq.py); the same scenarios pointed at zns
show that zns is a drop-in NameServer. One NameServer and one broker serve the whole
module; tests that need more start and kill their own brokers.
"""

from __future__ import annotations

import time
import uuid

import pytest

import rocketmq
from rocketmq import Broker, JavaNameServer, ProcessGroup

pytestmark = pytest.mark.interop


def wait_until(check, timeout: float, what: str, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"not within {timeout:.0f} s: {what} (last: {last!r})")


def unique_topic(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def namesrv(rmq_module: ProcessGroup) -> JavaNameServer:
    return rmq_module.namesrv()


@pytest.fixture(scope="module")
def broker_a(rmq_module: ProcessGroup, namesrv: JavaNameServer) -> Broker:
    return rmq_module.broker(namesrv.addr, "broker-a")


@pytest.mark.timeout(120)
def test_broker_registers_and_mqadmin_sees_it(namesrv: JavaNameServer, broker_a: Broker) -> None:
    # The stock launcher, to prove it works as shipped.
    res = rocketmq.mqadmin(["clusterList"], namesrv.addr, stock=True)
    assert res.rc == 0, res
    rows = [line.split() for line in res.stdout.splitlines() if line.startswith("DefaultCluster")]
    assert any(row[1] == "broker-a" and row[2] == "0" and row[3] == broker_a.addr for row in rows), res.stdout

    res = rocketmq.mqadmin(["topicRoute", "-t", "TBW102"], namesrv.addr)
    assert res.rc == 0, res
    assert '"brokerName":"broker-a"' in res.stdout and broker_a.addr in res.stdout, res.stdout

    route = rocketmq.route(namesrv.addr, "TBW102")
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

    got = rocketmq.consume(namesrv.addr, topic, 1000, timeout=60, run_id=sent["run_id"], group=f"cg_{topic}")
    assert got["unique"] == 1000 and not got["timed_out"], got

    route = rocketmq.route(namesrv.addr, topic)  # the broker registered the auto-created topic
    assert route["ok"] and [q["brokerName"] for q in route["queueDatas"]] == ["broker-a"], route


@pytest.mark.timeout(150)
def test_sigkill_one_of_two_brokers_producer_keeps_sending(namesrv: JavaNameServer, broker_a: Broker,
                                                          rmq: ProcessGroup) -> None:
    broker_b = rmq.broker(namesrv.addr, "broker-b")
    topic = unique_topic("interop_failover")
    res = rocketmq.mqadmin(["updateTopic", "-c", "DefaultCluster", "-t", topic, "-r", "4", "-w", "4"], namesrv.addr)
    assert res.stdout.count("success") == 2, res

    def both_brokers() -> bool:
        r = rocketmq.route(namesrv.addr, topic)
        return r["ok"] and {q["brokerName"] for q in r["queueDatas"]} == {"broker-a", "broker-b"}

    wait_until(both_brokers, 15, "the topic's route lists both brokers")

    with rocketmq.ProduceLoop(namesrv.addr, topic, duration=10, rate=25) as loop:
        loop.wait_until(lambda sends: {s.get("broker") for s in sends if s["ok"]} >= {"broker-a", "broker-b"},
                        30, "sends reached both brokers")
        broker_b.kill()
        killed_at = time.monotonic()
        summary = loop.wait()
    sends = loop.sends()
    after = [s for s in sends if s["at"] > killed_at + 0.5]
    assert len(after) >= 50, (len(after), summary)
    ok_after = [s for s in after if s["ok"]]
    # Every send after the kill made it, through broker-a (the producer retries elsewhere and
    # then avoids the dead broker); a send in flight at the kill may have failed.
    assert len(ok_after) >= len(after) - 2, [s for s in after if not s["ok"]][:5]
    assert {s["broker"] for s in ok_after} == {"broker-a"}, summary
    assert all(s["ok"] for s in sends[-20:]), sends[-20:]

    # The Java NameServer drops a broker as soon as its connection closes.
    wait_until(lambda: "broker-b" not in rocketmq.mqadmin(["clusterList"], namesrv.addr).stdout, 20,
               "clusterList no longer lists broker-b")


@pytest.mark.timeout(120)
def test_kv_and_namesrv_config_through_mqadmin(namesrv: JavaNameServer) -> None:
    topic = unique_topic("interop_kv")
    res = rocketmq.mqadmin(["updateKvConfig", "-s", "ORDER_TOPIC_CONFIG", "-k", topic, "-v", "broker-a:4"], namesrv.addr)
    assert "success" in res.stdout, res
    res = rocketmq.mqadmin(["updateOrderConf", "-t", topic, "-m", "get"], namesrv.addr)
    assert f"orderConf=[broker-a:4]" in res.stdout, res
    res = rocketmq.mqadmin(["deleteKvConfig", "-s", "ORDER_TOPIC_CONFIG", "-k", topic], namesrv.addr)
    assert "success" in res.stdout, res

    res = rocketmq.mqadmin(["getNamesrvConfig"], namesrv.addr)
    assert res.rc == 0 and f"============{namesrv.addr}============" in res.stdout, res
    config = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in res.stdout.splitlines()[1:]) if k.strip()
    )
    assert config.get("listenPort") == str(namesrv.port), config

"""Unit tests of the sans-I/O route table: every rule of docs/protocol.md §4–§8, with an injected clock.

Scenarios ported from Apache RocketMQ's RouteInfoManager tests
(namesrv/src/test/java/org/apache/rocketmq/namesrv/routeinfo/) say so in a
`# ported:` comment; `# zns differs:` marks a case where ZNS/1 deliberately
departs from RocketMQ.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import msgspec
import pytest

from helpers import table_state
from zns.core.errors import BadRequest, Conflict
from zns.core.routes import RouteTable, filter_zone
from zns.core.schema import (
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    BrokerEvent,
    DataVersion,
    QueueData,
    RegisterBroker,
    RouteEvent,
    TopicConfig,
    TopicRoute,
)

EPOCH = "0123456789abcdef"
TIMEOUT = 120_000
MASTER = "10.0.0.1:10911"
SLAVE = "10.0.0.2:10911"
OTHER = "10.0.0.9:10911"
V1 = DataVersion(state=0, timestamp=100, counter=1)
V2 = DataVersion(state=0, timestamp=200, counter=2)


@pytest.fixture
def table() -> Iterator[RouteTable]:
    table = RouteTable(EPOCH)
    yield table
    table.check_invariants()  # whatever a test did, the table still keeps its own rules


def req(
    name: str = "broker-a", broker_id: int = 0, addr: str = MASTER, cluster: str = "c1",
    topics: Iterable[str] | dict[str, TopicConfig] = ("TopicA",), version: DataVersion = V1,
    **extra,
) -> RegisterBroker:
    if not isinstance(topics, dict):
        topics = {t: TopicConfig() for t in topics}
    return RegisterBroker(
        cluster=cluster, broker_name=name, broker_id=broker_id, broker_addr=addr,
        topics=topics, data_version=version, **extra,
    )


def register(table: RouteTable, now: int = 0, **kw):
    return table.register_broker(req(**kw), now)


def route_events(events) -> dict[str, RouteEvent]:
    return {e.topic: e for e in events if isinstance(e, RouteEvent)}


def broker_events(events) -> list[BrokerEvent]:
    return [e for e in events if isinstance(e, BrokerEvent)]


def addrs_of(table: RouteTable, topic: str, broker_name: str = "broker-a") -> dict[int, str]:
    route = table.route(topic)
    assert route is not None, f"no route for {topic}"
    return next(b.addrs for b in route.brokers if b.broker_name == broker_name)


def perm_of(table: RouteTable, topic: str, broker_name: str = "broker-a") -> int:
    return next(q.perm for q in table.route(topic).queues if q.broker_name == broker_name)




# --- §4 register_broker ------------------------------------------------------


def test_register_creates_broker_cluster_route_and_liveness(table):
    # ported: RouteInfoManagerNewTest.pickupTopicRouteData
    outcome = register(table, topics={"TopicA": TopicConfig(read_queues=8, write_queues=8)})
    route = table.route("TopicA")
    assert route == TopicRoute(
        topic="TopicA",
        queues=[QueueData("broker-a", 8, 8, 6, 0)],
        brokers=[BrokerData(cluster="c1", broker_name="broker-a", addrs={0: MASTER})],
        filter_servers={},
    )
    assert table.cluster_table() == {"c1": ["broker-a"]}
    assert table.broker_table()["broker-a"].addrs == {0: MASTER}
    assert [(lb.cluster, lb.broker_addr, lb.broker_name, lb.broker_id)
            for lb in table.live_brokers(0)] == [("c1", MASTER, "broker-a", 0)]
    (registered,) = broker_events(outcome.events)
    assert (registered.change, registered.reason, registered.broker_id) == ("registered", "", 0)
    assert (registered.cluster, registered.broker_name, registered.broker_addr) == (
        "c1", "broker-a", MASTER)


def test_second_broker_name_joins_route_sorted(table):
    # ported: RouteInfoManagerNewTest.pickupTopicRouteData (two broker names, one topic)
    register(table, name="broker-b", addr=OTHER)
    register(table, name="broker-a")
    route = table.route("TopicA")
    assert [q.broker_name for q in route.queues] == ["broker-a", "broker-b"]
    assert [b.broker_name for b in route.brokers] == ["broker-a", "broker-b"]


def test_get_all_cluster_info_lists_every_cluster(table):
    # ported: RouteInfoManagerNewTest.getAllClusterInfo
    register(table, cluster="Default_Cluster", name="Default_Broker", topics=["TestTopic"])
    register(table, cluster="AnotherCluster", name="AnotherBroker", addr=OTHER,
             topics=["TestTopic1"])
    assert table.cluster_table() == {
        "AnotherCluster": ["AnotherBroker"], "Default_Cluster": ["Default_Broker"]}
    brokers = table.broker_table()
    assert {brokers["Default_Broker"].addrs[0], brokers["AnotherBroker"].addrs[0]} == {
        MASTER, OTHER}
    assert brokers["AnotherBroker"].cluster == "AnotherCluster"


def test_zone_is_overwritten_and_published(table):
    register(table, zone="zone-1")
    outcome = register(table, zone="zone-2")  # same version: topics untouched, zone still moves
    assert table.broker_table()["broker-a"].zone == "zone-2"
    assert table.route("TopicA").brokers[0].zone == "zone-2"
    assert "TopicA" in route_events(outcome.events)


def test_single_topic_first_registration_is_accepted(table):
    # zns differs: RocketMQ rejects a single-topic first registration; ZNS/1 accepts it.
    register(table, topics=["OnlyTopic"])
    assert table.route("OnlyTopic").queues[0].broker_name == "broker-a"


def test_registration_without_topics_registers_the_broker(table):
    outcome = register(table, topics=[])
    assert table.routes() == {}
    assert table.cluster_table() == {"c1": ["broker-a"]}
    assert table.revision == 1
    assert broker_events(outcome.events)[0].change == "registered"


def test_slave_reply_carries_master_and_ha_addr(table):
    # ported: RouteInfoManagerNewTest.registerBroker
    master = register(table, ha_addr="10.0.0.1:20911")
    assert (master.master_addr, master.ha_addr) == ("", "")
    slave = register(table, broker_id=1, addr=SLAVE, ha_addr="10.0.0.2:40911")
    assert (slave.master_addr, slave.ha_addr) == (MASTER, "10.0.0.1:20911")


def test_slave_without_master_gets_empty_master_addr(table):
    outcome = register(table, broker_id=1, addr=SLAVE)
    assert (outcome.master_addr, outcome.ha_addr) == ("", "")


def test_slave_joins_broker_data_of_every_topic(table):
    # ported: RouteInfoManagerNewTest.registerSlaveBroker and .createNewTopic
    register(table, topics=["TestTopic"])
    assert addrs_of(table, "TestTopic") == {0: MASTER}
    register(table, broker_id=1, addr=SLAVE, topics=["TestTopic"])
    assert addrs_of(table, "TestTopic") == {0: MASTER, 1: SLAVE}
    register(table, topics=["TestTopic", "TestTopic1"], version=V2)
    assert addrs_of(table, "TestTopic1") == {0: MASTER, 1: SLAVE}


def test_same_addr_under_another_id_is_moved(table):
    # Step 2: a slave promoted to master keeps one entry, under its new id.
    register(table, broker_id=1, addr=SLAVE)
    outcome = register(table, broker_id=0, addr=SLAVE, version=V2)
    assert table.broker_table()["broker-a"].addrs == {0: SLAVE}
    (updated,) = broker_events(outcome.events)
    assert (updated.change, updated.broker_id, updated.broker_addr) == ("updated", 0, SLAVE)


def test_switch_broker_role(table):
    # ported: RouteInfoManagerNewTest.switchBrokerRole
    register(table, topics=["TestTopic"])
    register(table, broker_id=1, addr=SLAVE, topics=["TestTopic"])
    table.unregister_broker("c1", "broker-a", MASTER)  # master down
    assert addrs_of(table, "TestTopic") == {1: SLAVE}
    register(table, broker_id=0, addr=SLAVE, topics=["TestTopic"], version=V2)  # slave -> master
    assert addrs_of(table, "TestTopic") == {0: SLAVE}
    register(table, broker_id=1, addr=MASTER, topics=["TestTopic"], version=V2)  # old master -> slave
    assert addrs_of(table, "TestTopic") == {0: SLAVE, 1: MASTER}


def test_master_change_from_slave_displaces_old_master(table):
    # ported: RouteInfoManagerBrokerRegisterTest.testMasterChangeFromSlave
    register(table)
    register(table, broker_id=1, addr=SLAVE)
    outcome = register(table, broker_id=0, addr=SLAVE)  # same state: the new address wins
    assert addrs_of(table, "TopicA") == {0: SLAVE}
    events = broker_events(outcome.events)
    removed = [e for e in events if e.change == "removed"]
    assert [(e.broker_addr, e.broker_id, e.reason) for e in removed] == [(MASTER, 0, "displaced")]
    assert [e.change for e in events if e.broker_addr == SLAVE] == ["updated"]
    # The displaced address lost its liveness, as by unregister_broker.
    assert table.heartbeat("c1", "broker-a", MASTER, V1, 1) == (False, True)
    assert [lb.broker_addr for lb in table.live_brokers(0)] == [SLAVE]


def test_an_address_taking_the_only_address_s_id_keeps_the_names_topics(table):
    # Issue 33 item 2: a broker replaced by a new host while the old host's registration
    # lingers. The old address goes (displaced); the name's queue data stays, now served by
    # the new address, as in Java. Before, the name went with its only address and kept only
    # what the new registration listed.
    register(table, topics=["T1", "T5", "T7"])
    outcome = register(table, addr=OTHER, topics=["T2", "T7"], incremental=True)
    for topic in ("T1", "T2", "T5", "T7"):
        assert addrs_of(table, topic) == {0: OTHER}, topic
    events = broker_events(outcome.events)
    assert [(e.change, e.reason, e.broker_addr) for e in events] == [
        ("removed", "displaced", MASTER), ("registered", "", OTHER)]
    assert set(route_events(outcome.events)) == {"T1", "T2", "T5", "T7"}
    assert table.heartbeat("c1", "broker-a", MASTER, V1, 1) == (False, True)


def test_an_address_moving_cluster_keeps_the_names_topics(table):
    # The same rule when the name's only address registers in another cluster: the name
    # moves with it (BrokerData.cluster too: the first cluster no longer lists it).
    register(table, topics=["T1", "T2"])
    register(table, cluster="c2", topics=["T3"], incremental=True)
    route = table.route("T1")
    assert route is not None and [(b.cluster, b.addrs) for b in route.brokers] == [("c2", {0: MASTER})]
    assert table.has_topic("T2") and table.has_topic("T3")
    assert table.cluster_table() == {"c2": ["broker-a"]}


@pytest.mark.parametrize("new_state", [5, 6])
def test_id_taken_over_when_state_not_older(table, new_state):
    register(table, version=DataVersion(state=5))
    register(table, addr=OTHER, version=DataVersion(state=new_state))
    assert table.broker_table()["broker-a"].addrs == {0: OTHER}


def test_conflict_on_newer_state_leaves_state_unchanged(table):
    # zns differs: RocketMQ lets the newest registration win; ZNS/1 refuses a stale one.
    register(table, now=10, version=DataVersion(state=5))
    register(table, now=10, broker_id=1, addr=SLAVE, version=DataVersion(state=5))
    before = table_state(table, 50)
    with pytest.raises(Conflict) as err:
        register(table, now=50, addr=OTHER, version=DataVersion(state=4),
                 topics=["Other"], zone="z", filter_servers=["10.9.9.9:1"])
    assert MASTER in str(err.value)
    assert table_state(table, 50) == before
    # A refused address is not live and a refused registration refreshes nothing.
    assert table.heartbeat("c1", "broker-a", OTHER, V1, 60) == (False, True)
    assert table.live_brokers(50)[0].last_heartbeat_ms == 40


def test_conflict_check_precedes_the_address_move(table):
    # Step 2 must not happen when step 3 refuses: the slave stays under id 1.
    register(table, version=DataVersion(state=5))
    register(table, broker_id=1, addr=SLAVE, version=DataVersion(state=1))
    before = table_state(table)
    with pytest.raises(Conflict):
        register(table, broker_id=0, addr=SLAVE, version=DataVersion(state=1))
    assert table_state(table) == before
    assert table.broker_table()["broker-a"].addrs == {0: MASTER, 1: SLAVE}


def test_topic_data_only_from_master(table):
    register(table, topics=["TopicA"])
    outcome = register(table, broker_id=1, addr=SLAVE, topics=["TopicB"], version=V2)
    assert set(table.routes()) == {"TopicA"}
    assert "TopicB" not in route_events(outcome.events)


def test_topic_data_from_lowest_id_while_no_master(table):
    # ported: RouteInfoManagerNewTest.registerOnlySlaveBroker (case 1)
    # zns differs: no acting master (§11), so the slave's queues keep their WRITE bit.
    register(table, broker_id=2, addr=OTHER, topics=["FromTwo"])
    assert perm_of(table, "FromTwo") == 6
    assert addrs_of(table, "FromTwo") == {2: OTHER}
    register(table, broker_id=1, addr=SLAVE, topics=["FromOne"])  # now the lowest id
    assert set(table.routes()) == {"FromOne"}
    register(table, broker_id=2, addr=OTHER, topics=["FromTwo"], version=V2)  # no longer lowest
    assert set(table.routes()) == {"FromOne"}
    register(table, broker_id=0, addr=MASTER, topics=["FromMaster"])
    assert set(table.routes()) == {"FromMaster"}


def test_master_recovers_after_slave_only_period(table):
    # ported: RouteInfoManagerNewTest.registerOnlySlaveBroker (case 2)
    register(table, topics=["TestTopic"])
    register(table, broker_id=1, addr=SLAVE, topics=["TestTopic"])
    table.unregister_broker("c1", "broker-a", MASTER)
    assert addrs_of(table, "TestTopic") == {1: SLAVE}
    assert perm_of(table, "TestTopic") & PERM_WRITE  # zns differs: perm never lowered (§11)
    register(table, topics=["TestTopic"])
    assert addrs_of(table, "TestTopic") == {0: MASTER, 1: SLAVE}
    assert perm_of(table, "TestTopic") & PERM_WRITE


def test_authoritative_registration_removes_unlisted_topics(table):
    # ported: RouteInfoManagerNewTest.deleteTopicWithBrokerRegistration
    # zns differs: this is always on (RocketMQ: deleteTopicWithBrokerRegistration=true only).
    register(table, topics=["TestTopic", "TestTopic1"])
    outcome = register(table, topics=["TestTopic1"], version=V2)
    assert table.route("TestTopic") is None
    assert table.route("TestTopic1") is not None
    gone = route_events(outcome.events)["TestTopic"]
    assert gone.route is None


def test_authoritative_registration_keeps_other_brokers_queues(table):
    # ported: RouteInfoManagerNewTest.deleteTopicWithBrokerRegistration2
    register(table, topics=["TestTopic", "TestTopic1"])
    register(table, name="broker-b", addr=OTHER, topics=["TestTopic", "TestTopic1"])
    register(table, topics=["TestTopic1"], version=V2)
    assert [b.broker_name for b in table.route("TestTopic").brokers] == ["broker-b"]
    assert len(table.route("TestTopic1").brokers) == 2
    register(table, name="broker-b", addr=OTHER, topics=["TestTopic1"], version=V2)
    assert table.route("TestTopic") is None
    assert len(table.route("TestTopic1").brokers) == 2


def test_keep_topic_is_not_zns_behaviour(table):
    # ported: RouteInfoManagerNewTest.keepTopicWithBrokerRegistration, inverted:
    # zns differs: RocketMQ keeps TestTopic by default; zns makes the broker the source of truth.
    register(table, topics=["TestTopic", "TestTopic1"])
    register(table, topics=["TestTopic1"], version=V2)
    assert table.route("TestTopic") is None


def test_incremental_registration_touches_only_listed_topics(table):
    register(table, topics=["TopicA", "TopicB"])
    register(table, topics={"TopicB": TopicConfig(read_queues=4, write_queues=4)},
             version=V2, incremental=True)
    register(table, topics=["TopicC"], version=DataVersion(counter=3), incremental=True)
    assert set(table.routes()) == {"TopicA", "TopicB", "TopicC"}
    assert table.route("TopicB").queues[0].read_queues == 4


def test_register_single_topic_with_broker_registration(table):
    # ported: RouteInfoManagerNewTest.registerSingleTopicWithBrokerRegistration
    queue = QueueData("broker-a", 8, 8, 6, 0)
    with pytest.raises(BadRequest):  # no broker yet: nothing applied
        table.register_topic("TestTopic", [queue])
    assert table.route("TestTopic") is None
    register(table, topics=["TestTopic"])
    table.register_topic("TestTopic1", [queue])
    assert table.route("TestTopic1") is not None
    register(table, topics=["TestTopic", "TestTopic1"], version=V2)
    register(table, topics=["TestTopic"], version=DataVersion(counter=3))
    assert table.route("TestTopic1") is None
    table.register_topic("TestTopic1", [queue])
    table.unregister_broker("c1", "broker-a", MASTER)
    assert table.routes() == {}


def test_periodic_reregistration_same_version_leaves_topics_alone(table):
    # §4 step 4: an admin's wipe_write_perm lasts until the broker's own configuration changes.
    register(table, topics=["TopicA", "TopicB"])
    table.wipe_write_perm("broker-a")
    revision = table.revision
    outcome = register(table, now=30_000, topics=["TopicA", "TopicB"])
    assert outcome.events == []
    assert table.revision == revision
    assert perm_of(table, "TopicA") == PERM_READ
    register(table, now=60_000, topics=["TopicA", "TopicB"], version=V2)
    assert perm_of(table, "TopicA") == 6


def test_same_version_reregistration_keeps_held_topics_as_they_are(table):
    register(table, topics=["TopicA", "TopicB"])
    table.wipe_write_perm("broker-a")
    register(table, topics=["TopicA"])  # same version: not a new configuration
    assert set(table.routes()) == {"TopicA", "TopicB"}  # nothing removed
    assert perm_of(table, "TopicA") == 4  # the wipe lasts


def test_same_version_reregistration_restores_topics_the_name_lacks(table):
    """RocketMQ's isTopicConfigChanged: a topic with no queue data of this broker name is
    applied whatever the data version (an incremental registration first after a restart,
    or an admin's delete_topic, would otherwise lose it until the version changes)."""
    register(table, topics=["TopicA"], incremental=True)  # e.g. updateTopic -b after a restart
    outcome = register(table, topics=["TopicA", "TopicB", "TopicC"])  # the periodic one, same V1
    assert set(table.routes()) == {"TopicA", "TopicB", "TopicC"}
    assert set(route_events(outcome.events)) == {"TopicB", "TopicC"}
    table.delete_topic("TopicB")
    register(table, topics=["TopicA", "TopicB", "TopicC"])
    assert set(table.routes()) == {"TopicA", "TopicB", "TopicC"}


def test_same_version_reregistration_of_a_slave_restores_nothing(table):
    register(table, topics=["TopicA"])
    register(table, broker_id=1, addr=OTHER, topics=["TopicA", "TopicB"])
    register(table, broker_id=1, addr=OTHER, topics=["TopicA", "TopicB"])
    assert set(table.routes()) == {"TopicA"}


def test_new_address_applies_topics_even_with_same_version(table):
    register(table, topics=["TopicA"])
    table.wipe_write_perm("broker-a")
    register(table, addr=OTHER, topics=["TopicA", "TopicB"])  # replaces the master, same V1
    assert set(table.routes()) == {"TopicA", "TopicB"}
    assert perm_of(table, "TopicA") == 6


def test_liveness_records_time_timeout_version(table):
    register(table, now=1_000, heartbeat_timeout_ms=30_000, version=V2)
    (live,) = table.live_brokers(now=4_500)
    assert (live.last_heartbeat_ms, live.timeout_ms, live.data_version) == (3_500, 30_000, V2)
    assert table.next_deadline() == 31_000


def test_reregistration_refreshes_liveness(table):
    register(table, now=0)
    register(table, now=50_000, heartbeat_timeout_ms=10_000)
    assert table.next_deadline() == 60_000
    assert table.expire(60_000) == []
    assert table.route("TopicA") is not None


def test_ha_addr_change_is_an_update(table):
    register(table, ha_addr="10.0.0.1:20911")
    outcome = register(table, ha_addr="10.0.0.1:20912")
    (updated,) = broker_events(outcome.events)
    assert updated.change == "updated"
    slave = register(table, broker_id=1, addr=SLAVE)
    assert slave.ha_addr == "10.0.0.1:20912"


def test_filter_servers_replace_and_clear(table):
    register(table, filter_servers=["10.1.1.1:1", "10.1.1.2:1"])
    assert table.route("TopicA").filter_servers == {MASTER: ["10.1.1.1:1", "10.1.1.2:1"]}
    outcome = register(table, filter_servers=["10.1.1.3:1"])
    assert table.route("TopicA").filter_servers == {MASTER: ["10.1.1.3:1"]}
    assert "TopicA" in route_events(outcome.events)
    register(table, filter_servers=[])
    assert table.route("TopicA").filter_servers == {}


def test_filter_servers_of_a_broker_without_topics_change_no_revision(table):
    # The list shows only in routes: with none to show it in, nothing visible changed.
    register(table, topics=())
    revision = table.revision
    outcome = register(table, now=30_000, topics=(), filter_servers=["10.1.1.1:1"])
    assert outcome.events == []
    assert table.revision == revision


def test_filter_servers_only_for_addresses_in_the_route(table):
    register(table, topics=["TopicA"], filter_servers=["10.1.1.1:1"])
    register(table, name="broker-b", addr=OTHER, topics=["TopicB"], filter_servers=["10.1.1.2:1"])
    assert table.route("TopicA").filter_servers == {MASTER: ["10.1.1.1:1"]}
    assert table.route("TopicB").filter_servers == {OTHER: ["10.1.1.2:1"]}


def test_same_address_in_two_clusters_has_two_livenesses(table):
    # ported: RouteInfoManagerTest.testQueryBrokerTopicConfig
    register(table, cluster="default-cluster", name="default-broker", version=V1)
    register(table, cluster="default-cluster-1", name="default-broker-1", version=V2)
    versions = {(lb.cluster, lb.broker_name): lb.data_version for lb in table.live_brokers(0)}
    assert versions == {("default-cluster", "default-broker"): V1,
                        ("default-cluster-1", "default-broker-1"): V2}
    table.unregister_broker("default-cluster-1", "default-broker-1", MASTER)
    assert [(lb.cluster, lb.broker_addr) for lb in table.live_brokers(0)] == [
        ("default-cluster", MASTER)]


# --- §4 heartbeat --------------------------------------------------------------


def test_heartbeat_known_and_changed(table):
    # ported: RouteInfoManagerNewTest.isBrokerTopicConfigChanged
    register(table, version=V1)
    assert table.heartbeat("c1", "broker-a", MASTER, V1, 10) == (True, False)
    for other in (DataVersion(0, 999, 1), DataVersion(0, 100, 2), DataVersion(1, 100, 1)):
        assert table.heartbeat("c1", "broker-a", MASTER, other, 10) == (True, True)


def test_heartbeat_stores_only_the_time(table):
    register(table, now=0, version=V1)
    revision = table.revision
    assert table.heartbeat("c1", "broker-a", MASTER, V2, 5_000) == (True, True)
    assert table.heartbeat("c1", "broker-a", MASTER, V2, 6_000) == (True, True)  # V2 not stored
    (live,) = table.live_brokers(7_000)
    assert (live.data_version, live.last_heartbeat_ms) == (V1, 1_000)
    assert table.revision == revision
    assert table.next_deadline() == 6_000 + TIMEOUT


def test_heartbeat_with_wrong_broker_name_or_cluster_is_unknown(table):
    register(table, now=0)
    assert table.heartbeat("c1", "broker-z", MASTER, V1, 5_000) == (False, True)
    assert table.heartbeat("c2", "broker-a", MASTER, V1, 5_000) == (False, True)
    assert table.live_brokers(5_000)[0].last_heartbeat_ms == 5_000  # not refreshed


def test_heartbeat_after_restart_is_unknown(table):
    register(table)
    restarted = RouteTable("fedcba9876543210")
    assert restarted.heartbeat("c1", "broker-a", MASTER, V1, 0) == (False, True)
    assert restarted.live_brokers(0) == []


def test_heartbeat_after_unregister_is_unknown(table):
    register(table)
    table.unregister_broker("c1", "broker-a", MASTER)
    assert table.heartbeat("c1", "broker-a", MASTER, V1, 0) == (False, True)


# --- §4 unregister_broker --------------------------------------------------------


def test_unregister_last_address_removes_broker_cluster_and_topics(table):
    # ported: RouteInfoManagerNewTest.unregisterBroker
    register(table, topics=["TestTopic", "TestTopic1", "TestTopic2"], filter_servers=["10.1.1.1:1"])
    removed, events = table.unregister_broker("c1", "broker-a", MASTER)
    assert removed
    assert table.routes() == {} and table.broker_table() == {} and table.cluster_table() == {}
    assert table.live_brokers(0) == [] and table.next_deadline() is None
    (gone,) = broker_events(events)
    assert (gone.change, gone.reason, gone.cluster, gone.broker_name, gone.broker_addr,
            gone.broker_id) == ("removed", "unregistered", "c1", "broker-a", MASTER, 0)
    assert {t: e.route for t, e in route_events(events).items()} == {
        "TestTopic": None, "TestTopic1": None, "TestTopic2": None}


def test_unregister_keeps_topics_of_other_brokers_and_non_empty_cluster(table):
    # ported: RouteInfoManagerNewTest.submitMultiUnRegisterRequests / deleteTopic setup
    register(table, topics=["Shared", "OnlyA"])
    register(table, name="broker-b", addr=OTHER, topics=["Shared"])
    table.unregister_broker("c1", "broker-a", MASTER)
    assert set(table.routes()) == {"Shared"}
    assert [b.broker_name for b in table.route("Shared").brokers] == ["broker-b"]
    assert table.cluster_table() == {"c1": ["broker-b"]}
    table.unregister_broker("c1", "broker-b", OTHER)
    assert table.routes() == {} and table.cluster_table() == {}


def test_unregister_slave_keeps_master(table):
    # ported: RouteInfoManagerNewTest.unRegisterSlaveBroker
    # and RouteInfoManagerBrokerRegisterTest.testUnregisterBroker
    register(table, topics=["TestTopic"])
    register(table, broker_id=1, addr=SLAVE, topics=["TestTopic"])
    removed, events = table.unregister_broker("c1", "broker-a", SLAVE)
    assert removed
    assert addrs_of(table, "TestTopic") == {0: MASTER}
    assert [e.broker_id for e in broker_events(events)] == [1]


def test_unregister_master_keeps_slave_without_acting_master(table):
    # ported: RouteInfoManagerNewTest.unRegisterMasterBrokerOldVersion
    # (zns differs from unRegisterMasterBroker: no acting master, perm not lowered, §11)
    register(table, topics=["TestTopic"])
    register(table, broker_id=1, addr=SLAVE, topics=["TestTopic"])
    table.unregister_broker("c1", "broker-a", MASTER)
    assert addrs_of(table, "TestTopic") == {1: SLAVE}
    assert perm_of(table, "TestTopic") == PERM_READ | PERM_WRITE


def test_unregister_is_idempotent(table):
    register(table)
    assert table.unregister_broker("c1", "broker-a", MASTER)[0]
    revision = table.revision
    assert table.unregister_broker("c1", "broker-a", MASTER) == (False, [])
    assert table.revision == revision


@pytest.mark.parametrize("cluster, name, addr", [
    ("c2", "broker-a", MASTER),  # wrong cluster
    ("c1", "broker-b", MASTER),  # wrong broker name
    ("c1", "broker-a", OTHER),  # address not listed
])
def test_unregister_mismatch_changes_nothing(table, cluster, name, addr):
    register(table)
    before = table_state(table)
    assert table.unregister_broker(cluster, name, addr) == (False, [])
    assert table_state(table) == before


def test_unregister_removes_filter_servers(table):
    register(table, filter_servers=["10.1.1.1:1"])
    register(table, broker_id=1, addr=SLAVE, filter_servers=["10.1.1.2:1"])
    _, events = table.unregister_broker("c1", "broker-a", SLAVE)
    assert table.route("TopicA").filter_servers == {MASTER: ["10.1.1.1:1"]}
    assert "TopicA" in route_events(events)
    register(table, broker_id=1, addr=SLAVE)  # re-registers without filter servers
    assert table.route("TopicA").filter_servers == {MASTER: ["10.1.1.1:1"]}


# --- §5 get_route and queries --------------------------------------------------------


def test_route_of_unknown_topic_is_none_with_revision_zero(table):
    # ported: RouteInfoManagerTest.testPickupTopicRouteData
    assert table.route("unit_test") is None
    assert table.topic_revision("unit_test") == 0


def test_removed_topic_keeps_the_revision_of_its_removal(table):
    register(table, topics=["TopicA", "TopicB"])
    _, events = table.delete_topic("TopicA")
    assert table.route("TopicA") is None
    assert table.topic_revision("TopicA") == events[0].revision == table.revision


def test_topic_revision_is_the_last_change_of_that_topic(table):
    register(table, topics=["TopicA"])
    first = table.revision
    register(table, name="broker-b", addr=OTHER, topics=["TopicB"])
    assert table.topic_revision("TopicA") == first
    assert table.topic_revision("TopicB") == table.revision > first


def test_topics_all_by_cluster_and_sys_flag(table):
    # ported: RouteInfoManagerNewTest.getAllTopicList, RouteInfoManagerTest.testGetTopicsByCluster
    assert table.topics() == []
    register(table, cluster="c1", topics={
        "T1": TopicConfig(sys_flag=0b01), "T2": TopicConfig(sys_flag=0b11), "Shared": TopicConfig()})
    register(table, cluster="c2", name="broker-b", addr=OTHER, topics={
        "T3": TopicConfig(sys_flag=0b11), "Shared": TopicConfig(sys_flag=0b11)})
    assert table.topics() == ["Shared", "T1", "T2", "T3"]
    assert table.topics(cluster="c2") == ["Shared", "T3"]
    assert table.topics(cluster="nope") == []
    assert table.topics(sys_flag=0b01) == ["T1", "T2", "T3"]  # Shared: broker-a's first, flag 0
    assert table.topics(sys_flag=0b11) == ["T2", "T3"]
    assert table.topics(cluster="c1", sys_flag=0b10) == ["T2"]


def test_live_brokers_sorted_by_cluster_then_address(table):
    register(table, now=0, cluster="c2", name="b3", addr="10.0.0.3:1")
    register(table, now=0, cluster="c1", name="b2", addr="10.0.0.2:1")
    register(table, now=0, cluster="c2", name="b1", addr="10.0.0.1:1")
    register(table, now=500, cluster="c1", name="b0", addr="10.0.0.9:1")
    live = table.live_brokers(1_000)
    assert [(lb.cluster, lb.broker_addr) for lb in live] == [
        ("c1", "10.0.0.2:1"), ("c1", "10.0.0.9:1"), ("c2", "10.0.0.1:1"), ("c2", "10.0.0.3:1")]
    assert [lb.last_heartbeat_ms for lb in live] == [1_000, 500, 1_000, 1_000]


def test_cluster_and_broker_tables_sorted(table):
    register(table, cluster="zc", name="zb", addr="10.0.0.3:1")
    register(table, cluster="ac", name="yb", addr="10.0.0.2:1")
    register(table, cluster="ac", name="xb", addr="10.0.0.1:1")
    assert list(table.cluster_table().items()) == [("ac", ["xb", "yb"]), ("zc", ["zb"])]
    assert list(table.broker_table()) == ["xb", "yb", "zb"]


# --- §5 zone filter --------------------------------------------------------------------


def _zoned_route() -> TopicRoute:
    def broker(name, zone, addrs):
        return BrokerData(cluster="c1", broker_name=name, addrs=addrs, zone=zone)
    return TopicRoute(
        topic="T",
        queues=[QueueData(n, 4, 4, 6, 0) for n in ("a", "b", "c", "d")],
        brokers=[broker("a", "Zone-1", {0: "h:1"}), broker("b", "zone-2", {0: "h:2"}),
                 broker("c", "zone-2", {1: "h:3"}), broker("d", "", {0: "h:4", 1: "h:5"})],
        filter_servers={"h:1": ["f:1"], "h:2": ["f:2"], "h:3": ["f:3"]},
        order_conf="a:4",
    )


def test_zone_filter_case_insensitive_and_keeps_masterless(table):
    route = filter_zone(_zoned_route(), "ZONE-1")
    assert [b.broker_name for b in route.brokers] == ["a", "c"]  # c: no master, kept
    assert [q.broker_name for q in route.queues] == ["a", "c"]
    assert route.filter_servers == {"h:1": ["f:1"], "h:3": ["f:3"]}
    assert (route.topic, route.order_conf) == ("T", "a:4")


@pytest.mark.parametrize(("zone", "asked", "kept"), [
    # What Java 17's String.equalsIgnoreCase answers for each pair (checked with a JVM;
    # tests/interop/test_differential.py asks the Java NameServer itself).
    ("Straße", "STRASSE", False),  # ß has no one-character upper case (casefold: equal)
    ("Straße", "strasse", False),
    ("Straße", "STRAßE", True),
    ("ı", "I", True), ("ı", "i", True), ("İ", "i", True),  # Turkish dotless and dotted i
    ("\U00010400", "\U00010428", True),  # Deseret 𐐀/𐐨, outside the BMP: one character each
    ("\U00010400", "\U00010401", False),
    ("ᾳ", "ᾼ", True),  # a simple upper case that is not the full one (ΑΙ)
    ("ﬀ", "FF", False),  # a ligature: no one-character upper case
    ("\u212a", "k", True),  # the Kelvin sign lower-cases to k
    ("Zone-1", "ZONE-1", True), ("zone-1", "zone-12", False),
])
def test_zone_filter_compares_as_java_equals_ignore_case(zone, asked, kept):
    route = _zoned_route()
    route.brokers[0].zone = zone
    assert [b.broker_name for b in filter_zone(route, asked).brokers][:1] == (
        ["a"] if kept else ["c"])


def test_zone_filter_with_no_broker_in_zone_leaves_empty_lists():
    route = _zoned_route()
    route.brokers = [b for b in route.brokers if b.broker_name in ("a", "b")]
    route.queues = route.queues[:2]
    filtered = filter_zone(route, "elsewhere")
    assert (filtered.brokers, filtered.queues, filtered.filter_servers) == ([], [], {})


def test_zone_filter_does_not_mutate_the_stored_route(table):
    register(table, zone="z1", topics=["T"])
    register(table, name="broker-b", addr=OTHER, zone="z2", topics=["T"])
    filtered = filter_zone(table.route("T"), "z2")
    assert [b.broker_name for b in filtered.brokers] == ["broker-b"]
    assert len(table.route("T").brokers) == 2


# --- §6 admin ops ---------------------------------------------------------------------


def test_wipe_and_add_write_perm_count_actual_changes(table):
    # ported: RouteInfoManagerTest.testWipeWritePermOfBrokerByLock / testAddWritePermOfBrokerByLock
    # and RouteInfoManagerNewTest.wipeWritePermOfBrokerByLock
    register(table, topics={"T1": TopicConfig(perm=6), "T2": TopicConfig(perm=4),
                            "T3": TopicConfig(perm=7)})
    changed, events = table.wipe_write_perm("broker-a")
    assert changed == 2
    assert {t: perm_of(table, t) for t in ("T1", "T2", "T3")} == {"T1": 4, "T2": 4, "T3": 5}
    assert set(route_events(events)) == {"T1", "T3"}
    assert {e.revision for e in events} == {table.revision}
    assert table.wipe_write_perm("broker-a") == (0, [])
    changed, _ = table.add_write_perm("broker-a")
    assert changed == 3
    # Java's operateWritePermOfBroker: perm = READ|WRITE, the inherit bit of T3 goes too.
    assert {t: perm_of(table, t) for t in ("T1", "T2", "T3")} == {"T1": 6, "T2": 6, "T3": 6}


def test_add_write_perm_sets_read_too(table):
    register(table, topics={"T": TopicConfig(perm=PERM_WRITE), "P": TopicConfig(perm=15),
                            "RW": TopicConfig(perm=6)})
    assert table.add_write_perm("broker-a")[0] == 2  # RW is READ|WRITE already
    assert perm_of(table, "T") == perm_of(table, "P") == PERM_READ | PERM_WRITE


def test_write_perm_ops_on_unknown_broker(table):
    # ported: RouteInfoManagerIPV6Test.testWipeWritePermOfBrokerByLock
    register(table)
    revision = table.revision
    assert table.wipe_write_perm("nobody") == (0, [])
    assert table.add_write_perm("nobody") == (0, [])
    assert table.revision == revision


def test_wipe_touches_only_that_broker(table):
    register(table, topics=["T"])
    register(table, name="broker-b", addr=OTHER, topics=["T"])
    table.wipe_write_perm("broker-b")
    assert perm_of(table, "T", "broker-a") == 6
    assert perm_of(table, "T", "broker-b") == 4


def test_delete_topic_everywhere_and_by_cluster(table):
    # ported: RouteInfoManagerNewTest.deleteTopic
    register(table, cluster="Default_Cluster", topics=["TestTopic"])
    removed, events = table.delete_topic("TestTopic")
    assert removed and table.route("TestTopic") is None
    assert route_events(events)["TestTopic"].route is None
    register(table, cluster="Default_Cluster", topics=["TestTopic"], version=V2)
    register(table, cluster="AnotherCluster", name="AnotherBroker", addr=OTHER,
             topics=["TestTopic"])
    assert len(table.route("TestTopic").brokers) == 2
    assert table.delete_topic("TestTopic", "Default_Cluster")[0]
    assert [b.broker_name for b in table.route("TestTopic").brokers] == ["AnotherBroker"]
    assert table.delete_topic("TestTopic", "Default_Cluster") == (False, [])
    assert table.delete_topic("TestTopic", "AnotherCluster")[0]
    assert table.route("TestTopic") is None and table.topics() == []


def test_delete_unknown_topic_changes_nothing(table):
    register(table)
    before = table_state(table)
    assert table.delete_topic("Nope") == (False, [])
    assert table.delete_topic("TopicA", "unknown-cluster") == (False, [])
    assert table_state(table) == before


def test_register_topic_adds_and_replaces(table):
    register(table, topics=["TopicA"])
    register(table, name="broker-b", addr=OTHER, topics=[])
    events = table.register_topic("TopicA", [QueueData("broker-a", 2, 2, 4, 0),
                                             QueueData("broker-b", 3, 3, 6, 0)])
    route = table.route("TopicA")
    assert route.queues == [QueueData("broker-a", 2, 2, 4, 0), QueueData("broker-b", 3, 3, 6, 0)]
    assert [b.broker_name for b in route.brokers] == ["broker-a", "broker-b"]
    assert [e.topic for e in events] == ["TopicA"]
    assert table.register_topic("TopicA", [QueueData("broker-a", 2, 2, 4, 0)]) == []


def test_register_topic_with_unknown_broker_applies_nothing(table):
    register(table, topics=["TopicA"])
    before = table_state(table)
    with pytest.raises(BadRequest) as err:
        table.register_topic("TopicB", [QueueData("broker-a", 1, 1, 6, 0),
                                        QueueData("ghost", 1, 1, 6, 0)])
    assert "ghost" in str(err.value)
    assert table_state(table) == before
    assert "TopicB" not in table.topics()


def test_order_conf_is_part_of_the_route(table):
    register(table, topics=["TopicA"])
    events = table.set_order_conf("TopicA", "broker-a:4")
    assert table.route("TopicA").order_conf == "broker-a:4"
    assert route_events(events)["TopicA"].route.order_conf == "broker-a:4"
    assert table.set_order_conf("TopicA", "broker-a:4") == []  # unchanged: no revision
    table.set_order_conf("TopicA", None)
    assert table.route("TopicA").order_conf == ""


def test_order_conf_of_absent_topic_waits_for_it(table):
    revision = table.revision
    assert table.set_order_conf("Later", "broker-a:8") == []
    assert table.revision == revision
    register(table, topics=["Later"])
    assert table.route("Later").order_conf == "broker-a:8"


# --- §7 revision and prev -------------------------------------------------------------


def test_one_revision_per_request_shared_by_all_its_events(table):
    outcome = register(table, topics=["T1", "T2", "T3"])
    assert table.revision == 1
    assert {e.revision for e in outcome.events} == {1}
    assert {e.epoch for e in outcome.events} == {EPOCH}
    assert set(route_events(outcome.events)) == {"T1", "T2", "T3"}
    register(table, broker_id=1, addr=SLAVE)
    _, events = table.unregister_broker("c1", "broker-a", MASTER)
    assert table.revision == 3
    assert {e.revision for e in events} == {3}


def test_prev_is_the_revision_of_the_topics_previous_event(table):
    register(table, topics=["T1"])  # rev 1
    register(table, name="broker-b", addr=OTHER, topics=["T2"])  # rev 2: T1 untouched
    _, events = table.wipe_write_perm("broker-a")  # rev 3
    (ev,) = events
    assert (ev.topic, ev.revision, ev.prev) == ("T1", 3, 1)
    _, events = table.delete_topic("T1")  # rev 4
    assert (events[0].prev, events[0].route) == (3, None)
    register(table, topics=["T1"], version=V2)  # rev 5: re-created, prev is its removal
    assert table.route("T1") is not None
    assert table.topic_revision("T1") == 5


def test_first_event_of_a_topic_has_prev_zero(table):
    outcome = register(table, topics=["Fresh"])
    assert route_events(outcome.events)["Fresh"].prev == 0


def test_noop_requests_do_not_advance_revision(table):
    register(table, now=0, topics=["TopicA"])
    register(table, now=0, broker_id=1, addr=SLAVE, topics=["TopicA"])
    revision = table.revision
    assert register(table, now=30_000, topics=["TopicA"]).events == []
    assert register(table, now=30_000, broker_id=1, addr=SLAVE, version=V2).events == []
    table.heartbeat("c1", "broker-a", MASTER, V1, 31_000)
    assert table.expire(31_000) == []
    assert table.register_topic("TopicA", []) == []
    assert table.revision == revision


def test_snapshot_change_without_events_advances_revision(table):
    # §7: the revision counts every change of what `snapshot` returns, published or not.
    register(table, topics=[], zone="z1")
    outcome = register(table, topics=[], zone="z2")  # BrokerData changes, no route, no event
    assert outcome.events == []
    assert table.revision == 2


def test_broker_change_without_topics_advances_revision(table):
    register(table, topics=[])
    outcome = register(table, broker_id=1, addr=SLAVE, topics=[])
    assert table.revision == 2
    assert [e.change for e in broker_events(outcome.events)] == ["registered"]


# --- §8 expiry -------------------------------------------------------------------------


def test_scan_not_active_broker_removes_exactly_the_silent_one(table):
    # ported: RouteInfoManagerBrokerRegisterTest.testScanNotActiveBroker, on its
    # RouteInfoManagerTestBase.registerCluster layout: 3 broker names x 3 ids x 10 topics.
    topics = [f"topic-{i}" for i in range(10)]
    members = [(f"broker-{j}", i, f"cluster-broker-{j}:{i + 1}") for j in range(3) for i in range(3)]
    for name, broker_id, addr in members:
        register(table, now=0, cluster="cluster", name=name, broker_id=broker_id, addr=addr,
                 topics=topics)
    now = 0
    for silent, (name, broker_id, addr) in enumerate(members):
        now += TIMEOUT
        for other_name, _, other_addr in members[silent + 1:]:
            assert table.heartbeat("cluster", other_name, other_addr, V1, now)[0]
        events = table.expire(now + 1)
        assert [(e.broker_name, e.broker_addr, e.reason) for e in broker_events(events)] == [
            (name, addr, "expired")]
    assert table.routes() == {} and table.cluster_table() == {}


def test_expiry_exactly_at_the_boundary(table):
    register(table, now=1_000, heartbeat_timeout_ms=10_000)
    assert table.next_deadline() == 11_000
    assert table.expire(11_000) == []  # not past: now == last + timeout
    assert table.route("TopicA") is not None
    events = table.expire(11_001)
    (gone,) = broker_events(events)
    assert (gone.change, gone.reason, gone.broker_addr) == ("removed", "expired", MASTER)
    assert route_events(events)["TopicA"].route is None
    assert table.routes() == {} and table.cluster_table() == {} and table.next_deadline() is None
    assert {e.revision for e in events} == {table.revision}


def test_heartbeat_just_before_expiry_keeps_the_broker(table):
    # §8 re-check (RocketMQ issue 11043): the decision is taken on the current liveness.
    register(table, now=0, heartbeat_timeout_ms=10_000)
    table.heartbeat("c1", "broker-a", MASTER, V1, 9_999)
    assert table.expire(10_001) == []
    assert table.next_deadline() == 19_999
    assert table.route("TopicA") is not None
    assert table.expire(20_000)  # and it does expire once silent long enough


def test_reregistration_just_before_expiry_keeps_the_broker(table):
    register(table, now=0, heartbeat_timeout_ms=10_000)
    register(table, now=10_000, heartbeat_timeout_ms=10_000)
    assert table.expire(10_001) == []


def test_expiry_keeps_other_members_of_the_group(table):
    register(table, now=0, heartbeat_timeout_ms=5_000)
    register(table, now=4_000, broker_id=1, addr=SLAVE, heartbeat_timeout_ms=5_000)
    events = table.expire(5_001)
    assert [(e.broker_addr, e.reason) for e in broker_events(events)] == [(MASTER, "expired")]
    assert addrs_of(table, "TopicA") == {1: SLAVE}
    assert table.next_deadline() == 9_000


def test_expire_removes_every_overdue_broker_in_deadline_order(table):
    register(table, now=0, name="b1", addr="10.0.0.1:1", heartbeat_timeout_ms=3_000)
    register(table, now=0, name="b2", addr="10.0.0.2:1", heartbeat_timeout_ms=1_000)
    register(table, now=0, name="b3", addr="10.0.0.3:1", heartbeat_timeout_ms=9_000)
    assert table.next_deadline() == 1_000
    events = table.expire(5_000)
    assert [e.broker_name for e in broker_events(events)] == ["b2", "b1"]
    assert table.cluster_table() == {"c1": ["b3"]}
    assert table.next_deadline() == 9_000


def test_expiry_of_address_listed_under_two_names(table):
    register(table, now=0, name="broker-a", topics=["TA"])
    register(table, now=0, name="broker-b", topics=["TB"])  # same address, same cluster
    events = table.expire(TIMEOUT + 1)
    assert sorted(e.broker_name for e in broker_events(events)) == ["broker-a", "broker-b"]
    assert table.routes() == {} and table.live_brokers(TIMEOUT + 1) == []


def test_next_deadline_empty_and_after_heartbeat(table):
    assert table.next_deadline() is None
    register(table, now=0)
    assert table.next_deadline() == TIMEOUT
    table.heartbeat("c1", "broker-a", MASTER, V1, 1_000)
    assert table.next_deadline() == 1_000 + TIMEOUT


def test_a_stall_moves_deadlines_but_not_the_reported_time_since_the_heartbeat(table):
    register(table, now=0, heartbeat_timeout_ms=10_000)
    table.shift_deadlines(60_000)
    assert table.next_deadline() == 70_000
    assert table.live_brokers(65_000)[0].last_heartbeat_ms == 65_000  # real time since
    table.heartbeat("c1", "broker-a", MASTER, V1, 66_000)
    assert table.next_deadline() == 76_000  # the credit ends with the next heartbeat


def test_shift_deadlines_moves_every_deadline(table):
    register(table, now=0, name="b1", addr="10.0.0.1:1", heartbeat_timeout_ms=10_000)
    register(table, now=0, name="b2", addr="10.0.0.2:1", heartbeat_timeout_ms=8_000)
    table.suspect("c1", "10.0.0.2:1", grace_ms=3_000, now=0)
    table.shift_deadlines(60_000)
    assert table.next_deadline() == 63_000  # b2's peer-hint deadline, moved too
    assert table.expire(63_000) == []
    assert [e.broker_name for e in broker_events(table.expire(70_001))] == ["b2", "b1"]


# --- §10 peer hints (suspect) ----------------------------------------------------------


def test_suspect_shortens_the_deadline_and_expires_as_peer_expired(table):
    register(table, now=1_000, heartbeat_timeout_ms=8_000)
    assert table.suspect("c1", MASTER, grace_ms=3_000, now=1_000)
    assert table.next_deadline() == 4_000
    assert table.expire(4_000) == []
    events = table.expire(4_001)
    (gone,) = broker_events(events)
    assert (gone.change, gone.reason) == ("removed", "peer_expired")
    assert table.routes() == {}


def test_suspect_never_lengthens(table):
    register(table, now=0, heartbeat_timeout_ms=2_000)
    assert not table.suspect("c1", MASTER, grace_ms=3_000, now=0)
    assert table.next_deadline() == 2_000
    assert table.suspect("c1", MASTER, grace_ms=1_000, now=0)
    assert not table.suspect("c1", MASTER, grace_ms=1_500, now=0)
    assert table.next_deadline() == 1_000


def test_heartbeat_clears_suspicion(table):
    register(table, now=0)
    table.suspect("c1", MASTER, grace_ms=3_000, now=0)
    table.heartbeat("c1", "broker-a", MASTER, V1, 2_000)
    assert table.next_deadline() == 2_000 + TIMEOUT
    assert table.expire(10_000) == []


def test_registration_clears_suspicion(table):
    register(table, now=0)
    table.suspect("c1", MASTER, grace_ms=3_000, now=0)
    register(table, now=2_000)
    assert table.next_deadline() == 2_000 + TIMEOUT


def test_suspect_unknown_broker_is_ignored(table):
    register(table)
    before = table_state(table)
    assert not table.suspect("c1", OTHER, grace_ms=1, now=0)
    assert not table.suspect("c2", MASTER, grace_ms=1, now=0)
    assert table_state(table) == before


# --- regressions found by the property tests ----------------------------------------------


def test_filter_servers_of_a_shared_address_reach_every_broker_names_route(table):
    # Filter servers are keyed by (cluster, addr) (§8 liveness key): when two broker names
    # list one address, a change through either one is a change of both routes.
    register(table, name="broker-b", topics=["TB"])
    outcome = register(table, name="broker-a", topics=[], filter_servers=["10.1.1.1:1"])
    assert table.route("TB").filter_servers == {MASTER: ["10.1.1.1:1"]}
    assert "TB" in route_events(outcome.events)


def test_broker_data_cluster_names_a_cluster_that_lists_the_broker(table):
    register(table, cluster="c1", topics=[])
    register(table, cluster="c2", topics=[])  # the only address moves to cluster c2
    assert table.cluster_table() == {"c2": ["broker-a"]}
    assert table.broker_table()["broker-a"].cluster == "c2"
    register(table, cluster="c3", broker_id=1, addr=SLAVE, topics=[])
    table.unregister_broker("c2", "broker-a", MASTER)
    assert table.cluster_table() == {"c3": ["broker-a"]}
    assert table.broker_table()["broker-a"].cluster == "c3"


@pytest.mark.parametrize("corrupt, rule", [
    (lambda t: setattr(t._weights, "weight", t._weights.weight + 1), "weight ledger"),
    (lambda t: setattr(t._weights, "count", t._weights.count - 1), "queue entry count"),
    (lambda t: t._broker_topics["broker-a"].add("Ghost"), "stale index"),
    (lambda t: t._live._deadlines.clear(), "no heap entry"),
    (lambda t: t.liveness("c1", MASTER).names.add("broker-z"), "do not list them"),
    (lambda t: t._order_conf.__setitem__("TopicA", "broker-a:4"), "differs from its records"),
    (lambda t: t._revisions._topic_revision.pop("TopicA"), "a route without a revision"),
    (lambda t: t._builder._broker_data.__setitem__("broker-a", BrokerData(
        cluster="c9", broker_name="broker-a", addrs={})), "stale BrokerData"),
])
def test_check_invariants_names_the_rule_a_corrupted_table_breaks(corrupt, rule):
    table = RouteTable(EPOCH)
    register(table, topics=("TopicA", "TopicB"), filter_servers=["10.9.0.1:1"])
    table.check_invariants()
    corrupt(table)
    with pytest.raises(AssertionError, match=rule):
        table.check_invariants()


# --- the liveness schedule on its own (zns.core.liveness; found by mutation testing) --------


def _schedule_of(timeout_ms: int = 4_000):
    from zns.core.liveness import LivenessSchedule

    schedule = LivenessSchedule()
    live = schedule.record("c", "10.0.0.1:10911", 0, timeout_ms, V1, "", "broker-a")
    return schedule, live


def test_a_suspicion_waits_a_whole_quarter_of_an_odd_timeout():
    schedule, live = _schedule_of(timeout_ms=10_003)
    assert schedule.suspect("c", "10.0.0.1:10911", grace_ms=0, now=1)
    assert live.deadline == 1 + 2_500 and isinstance(live.deadline, int)


def test_a_suspicion_that_would_not_come_sooner_changes_nothing():
    schedule, live = _schedule_of(timeout_ms=4_000)
    assert not schedule.suspect("c", "10.0.0.1:10911", grace_ms=4_000, now=0)  # 4,000: as it was
    assert live.suspect_deadline is None


def test_an_address_taken_off_the_schedule_and_heard_again_is_scheduled_again():
    schedule, live = _schedule_of(timeout_ms=4_000)
    assert schedule.pop_due(4_001) is live and live.scheduled is None
    schedule.heard(live, 5_000)
    assert schedule.next_deadline() == 9_000
    schedule.check_invariants()


def test_the_invariant_check_finds_a_heap_out_of_order():
    schedule, _ = _schedule_of(timeout_ms=4_000)
    schedule.record("c", "10.0.0.2:10911", 0, 1_000, V1, "", "broker-b")
    schedule._deadlines.sort(reverse=True)  # the later deadline on top
    with pytest.raises(AssertionError, match="^next_deadline is not the earliest deadline$"):
        schedule.check_invariants()


# --- the revisions' and builder's own checks (zns.core.revisions; found by mutation testing) --


def _revisions_holding_one_route():
    from zns.core.revisions import RouteRevisions

    route = TopicRoute(topic="T", queues=[QueueData("broker-a", 4, 4, 6, 0)],
                       brokers=[BrokerData(cluster="c", broker_name="broker-a", addrs={0: MASTER})],
                       filter_servers={}, order_conf="")
    revisions = RouteRevisions(EPOCH)
    revisions.revision = 1
    revisions.routes()["T"] = route
    revisions._topic_revision["T"] = 1
    revisions.check_invariants()  # consistent as built
    return revisions, route


@pytest.mark.parametrize("break_it, message", [
    (lambda r, route: r._topic_revision.pop("T"), "a route without a revision"),
    (lambda r, route: r._topic_revision.update(T=0), "a topic revision outside 1..revision"),
    (lambda r, route: r._removed_revision.update(T=1), "a held topic also remembered as removed"),
    (lambda r, route: r.routes().update(T=msgspec.structs.replace(route, queues=[], brokers=[])),
     "T: queues not one per name"),
])
def test_the_revisions_check_names_the_rule_broken(break_it, message):
    revisions, route = _revisions_holding_one_route()
    break_it(revisions, route)
    with pytest.raises(AssertionError, match=f"^{re.escape(message)}$"):
        revisions.check_invariants()


def test_the_revisions_check_allows_exactly_the_removed_topics_remembered():
    from zns.core.revisions import REMEMBERED_REMOVED_TOPICS

    revisions, _ = _revisions_holding_one_route()
    revisions._removed_revision.update({f"R{i}": 1 for i in range(REMEMBERED_REMOVED_TOPICS)})
    revisions.check_invariants()
    revisions._removed_revision["one more"] = 1
    with pytest.raises(AssertionError):
        revisions.check_invariants()


def test_the_builder_check_finds_a_route_that_differs_from_its_records(table):
    register(table)
    held = table.route("TopicA")
    table._revisions.routes()["TopicA"] = msgspec.structs.replace(held, order_conf="x")
    with pytest.raises(AssertionError, match="^a route differs from its records$"):
        table._builder.check_invariants()
    table._revisions.routes()["TopicA"] = held  # the fixture checks the table afterwards


def test_same_route_compares_lists_by_value_when_they_are_not_shared():
    from zns.core.revisions import same_route

    route = route_for_same_route_test()
    copy = msgspec.structs.replace(route, queues=list(route.queues), brokers=list(route.brokers))
    assert same_route(copy, route) and same_route(route, route)
    assert not same_route(msgspec.structs.replace(route, queues=[]), route)
    assert not same_route(None, route) and same_route(None, None)


def route_for_same_route_test() -> TopicRoute:
    return TopicRoute(topic="T", queues=[QueueData("broker-a", 4, 4, 6, 0)],
                      brokers=[BrokerData(cluster="c1", broker_name="broker-a", addrs={0: MASTER})],
                      filter_servers={}, order_conf="")


def test_a_changed_ha_address_is_a_broker_event_and_no_route_event(table):
    register(table, ha_addr="10.0.0.1:10912")
    events = register(table, ha_addr="10.0.0.1:10913").events  # BrokerData built again, equal
    assert [e.change for e in broker_events(events)] == ["updated"]
    assert route_events(events) == {}


def test_every_route_of_a_broker_shares_its_one_broker_data(table):
    register(table, topics=("TopicA",))
    data = table.broker_table()["broker-a"]
    register(table, topics=("TopicA", "TopicB"))
    assert table.route("TopicA").brokers[0] is data and table.route("TopicB").brokers[0] is data


def _copy_queue(t: RouteTable, topic: str, name: str, **changes) -> None:
    t._queues[topic][name] = msgspec.structs.replace(t._queues[topic][name], **changes)


@pytest.mark.parametrize("corrupt, message", [
    (lambda t: _copy_queue(t, "TopicA", "broker-a", broker_name="broker-z"), "TopicA: broker-a"),
    (lambda t: t._broker_topics.__setitem__("ghost", set()), "topic index and brokers differ"),
    (lambda t: _copy_queue(t, "TopicA", "broker-a"), "a queue value not interned"),
    (lambda t: t._queue_values.__setitem__(*next(
        (q, (v, n + 1)) for q, (v, n) in t._queue_values.items())), "interning counts"),
    (lambda t: setattr(t._weights, "weight", t._weights.weight + 1), "weight ledger"),
    (lambda t: setattr(t._weights, "count", t._weights.count - 1), "queue entry count"),
    (lambda t: (t.liveness("c1", MASTER).names.discard("broker-a"),
                t.liveness("c1", MASTER).names.add("broker-z")), f"{MASTER} of broker-a not live"),
    (lambda t: t.liveness("c1", MASTER).names.add("broker-z"),
     "live addresses list names that do not list them"),
    (lambda t: t._clusters.__setitem__("c9", {}), "empty cluster kept"),
    (lambda t: t._filter_servers.__setitem__(("c9", OTHER), ["10.9.0.2:1"]),
     "filter servers of no address"),
])
def test_check_invariants_says_exactly_which_rule_is_broken(corrupt, message):
    table = RouteTable(EPOCH)
    register(table, topics=("TopicA", "TopicB"), filter_servers=["10.9.0.1:1"])
    table.check_invariants()
    corrupt(table)
    with pytest.raises(AssertionError, match=f"^{re.escape(message)}$"):
        table.check_invariants()


def test_held_counts_each_kind_of_record_under_its_name(table):
    register(table, topics=("TopicA", "TopicB"))
    assert table.held() == {"brokers": 1, "addresses": 1, "topics": 2, "queue_entries": 2,
                            "queue_values": 1, "broker_data": 1, "topic_revisions": 2,
                            "removed_topic_revisions": 0}


def test_register_topic_names_every_unknown_broker(table):
    register(table, topics=[])
    queues = [QueueData(broker_name=n, read_queues=1, write_queues=1, perm=6, sys_flag=0)
              for n in ("broker-y", "broker-a", "broker-x")]
    with pytest.raises(BadRequest, match=r"^unknown broker name\(s\) broker-x, broker-y - at "
                                         r"`\$\.queues`$"):
        table.register_topic("T", queues)


def test_a_broker_heard_just_now_was_heard_0_ms_ago(table):
    register(table, now=5_000, topics=[])
    assert [b.last_heartbeat_ms for b in table.live_brokers(5_000)] == [0]
    assert [b.last_heartbeat_ms for b in table.live_brokers(4_000)] == [0]  # never negative
    assert [b.last_heartbeat_ms for b in table.live_brokers(5_007)] == [7]


def test_an_expiry_step_takes_addresses_until_their_work_reaches_its_bound(table):
    # Three silent brokers with no topics: each costs 1 unit of work.
    for i in range(3):
        register(table, name=f"b{i}", addr=f"10.0.1.{i}:1", topics=[], heartbeat_timeout_ms=1_000)
    now = 10_000
    assert len(broker_events(table.expire(now, work=2))) == 2
    assert len(broker_events(table.expire(now, work=2))) == 1
    assert table.broker_count() == 0


def test_a_broker_gone_at_its_own_deadline_exactly_was_expired_by_a_peer_hint(table):
    register(table, now=0, topics=[], heartbeat_timeout_ms=10_000)
    live = table.liveness("c1", MASTER)
    assert table.suspect("c1", MASTER, 100, now=1_000) is True
    assert live.suspect_deadline == max(live.silent_since + 100, 1_000 + 10_000 // 4)
    own = live.own_deadline
    events = table.expire(own)  # past the hint, not past its own deadline
    assert [e.reason for e in broker_events(events)] == ["peer_expired"]


def test_a_restored_topic_takes_its_queue_data_from_the_registration(table):
    register(table, topics=["TopicA"], incremental=True)
    cfg = TopicConfig(read_queues=3, write_queues=5, perm=4, sys_flag=1)
    register(table, topics={"TopicA": TopicConfig(), "TopicB": cfg})  # same V1: restores TopicB
    assert table.route("TopicB").queues == [QueueData(
        broker_name="broker-a", read_queues=3, write_queues=5, perm=4, sys_flag=1)]


def test_cluster_members_list_names_as_a_set_of_keys(table):
    register(table, topics=[])
    assert table.cluster_members() == {"c1": {"broker-a": None}}


def test_held_id_refuses_an_address_the_name_does_not_hold(table):
    register(table, topics=[])
    rec = table._brokers["broker-a"]
    assert rec.held_id(MASTER) == 0
    with pytest.raises(KeyError) as caught:
        rec.held_id(OTHER)
    assert caught.value.args == (OTHER,)


@pytest.mark.parametrize("slave_cluster", ["c1", "c" * 250])
def test_queue_weight_after_a_slave_registers_is_the_weight_it_then_has(table, slave_cluster):
    # The master's filter servers and the name's cluster (its name's length) count in the
    # slave's prediction.
    register(table, topics=("TopicA", "TopicB"), filter_servers=["10.9.0.1:1", "10.9.0.2:1"])
    slave = req(broker_id=1, addr=SLAVE, cluster=slave_cluster, topics=("TopicA", "TopicB"))
    predicted = table.queue_weight_after(slave)
    table.register_broker(slave, 0)
    assert table.queue_weight() == predicted


def test_a_name_left_in_another_cluster_is_weighed_there(table):
    far = "c" * 250  # a long cluster name weighs more in every route entry of the name
    register(table, cluster="c2", topics=("TopicA", "TopicB"))
    register(table, cluster=far, broker_id=1, addr=SLAVE, topics=("TopicA", "TopicB"))
    table.unregister_broker("c2", "broker-a", MASTER)
    assert table.broker_table()["broker-a"].cluster == far
    table.check_invariants()  # the weight ledger follows the name to its cluster


def test_unregistering_many_at_once_is_one_step_skipping_what_is_not_held(table):
    register(table, name="broker-b", addr=OTHER, topics=["TopicA"])
    register(table, topics=["TopicA"])
    register(table, broker_id=1, addr=SLAVE, topics=["TopicA"])
    assert table.broker_names() == ["broker-b", "broker-a"]  # in the order first registered
    before = table.revision
    events = table.unregister_brokers(
        [("c1", "broker-a", MASTER), ("c9", "broker-a", SLAVE), ("c1", "broker-z", MASTER),
         ("c1", "broker-b", OTHER)], reason="disconnected")
    assert table.revision == before + 1
    assert sorted((e.broker_name, e.broker_addr, e.change, e.reason)
                  for e in broker_events(events)) == [
        ("broker-a", MASTER, "removed", "disconnected"),
        ("broker-b", OTHER, "removed", "disconnected")]
    assert {e.revision for e in events} == {before + 1}
    assert table.broker_names() == ["broker-a"]
    assert addrs_of(table, "TopicA") == {1: SLAVE}
    assert table.unregister_brokers([("c1", "broker-a", MASTER)], reason="disconnected") == []
    assert table.revision == before + 1  # nothing held: no step

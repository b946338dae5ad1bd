"""Stateful property tests of the route table (hypothesis RuleBasedStateMachine).

Random sequences of broker, admin and clock operations, drawn from small pools
of names and addresses so that ids, addresses, clusters and topics collide.
After every step the table must be internally consistent, a client that
replays every route event from an empty cache must hold exactly `routes()`,
with an unbroken `prev` chain (docs/protocol.md §7), and the table must show
what a reference model (`Model`, plain dicts updated by each rule as §4, §6
and §8 say) holds: `routes()`, `broker_table()`, `cluster_table()` and every
address's liveness deadline.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from helpers import examples, table_state

from zns.core.errors import BadRequest, Conflict
from zns.core.routes import RouteTable
from zns.core.weights import name_weight
from zns.core.schema import (
    MASTER_ID,
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

CLUSTERS = ["c1", "c2", "c" * 100]  # a long one: names weigh by their bytes (name_weight)
NAMES = ["broker-a", "broker-b", "broker-c"]
ADDRS = ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"]
TOPICS = ["T1", "T2", "T3", "T4"]
ZONES = ["", "z1", "Z1", "z" * 130]
FILTER_SERVERS = ["10.9.0.1:1", "10.9.0.2:1"]

clusters = st.sampled_from(CLUSTERS)
names = st.sampled_from(NAMES)
addrs = st.sampled_from(ADDRS)
topics = st.sampled_from(TOPICS)
broker_ids = st.sampled_from([0, 0, 1, 2])
versions = st.builds(DataVersion, state=st.integers(0, 2), timestamp=st.just(0),
                     counter=st.integers(0, 2))
topic_configs = st.builds(TopicConfig, read_queues=st.sampled_from([1, 4]),
                          write_queues=st.sampled_from([1, 4]), perm=st.sampled_from([2, 4, 6, 7]),
                          sys_flag=st.sampled_from([0, 1]))
queue_datas = st.builds(QueueData, broker_name=st.sampled_from(NAMES + ["ghost"]),
                        read_queues=st.sampled_from([1, 2]), write_queues=st.sampled_from([1, 2]),
                        perm=st.sampled_from([4, 6]), sys_flag=st.just(0))

EPOCH = "0123456789abcdef"


def snapshot_part(table: RouteTable) -> bytes:
    """What `snapshot` returns (§5): a change of it must advance the revision (§7)."""
    return msgspec.msgpack.encode([
        sorted(table.routes().items()), table.broker_table(), table.cluster_table()])


def deadlines(table: RouteTable) -> dict[tuple[str, str], int]:
    """Each live address's deadline, read through the table's public API."""
    keys = {(live.cluster, live.broker_addr) for live in table.live_brokers(0)}
    return {key: table.liveness(*key).deadline for key in keys}


class Model:
    """The route table as plain dicts, each rule written out as the protocol states it.

    `addrs`: broker name -> address -> (its cluster, its broker id); the id is None
    only inside `register`, while an address moves to another id (the table keeps
    the address's cluster meanwhile, so the name stays in that cluster). `queues`:
    broker name -> topic -> its QueueData. `live`: (cluster, address) -> what its
    liveness deadline is made of.
    """

    def __init__(self) -> None:
        self.addrs: dict[str, dict[str, tuple[str, int | None]]] = {}
        self.home: dict[str, str] = {}  # BrokerData.cluster
        self.zone: dict[str, str] = {}
        self.queues: dict[str, dict[str, QueueData]] = {}
        self.live: dict[tuple[str, str], dict] = {}
        self.filter_servers: dict[tuple[str, str], list[str]] = {}
        self.order_conf: dict[str, str] = {}

    # --- what the rules change --------------------------------------------------

    def listing(self, key: tuple[str, str]) -> list[str]:
        """Broker names that list this (cluster, address)."""
        return sorted(n for n, by_addr in self.addrs.items()
                      if by_addr.get(key[1], (None,))[0] == key[0])

    def conflict(self, req: RegisterBroker) -> bool:
        """§4 step 3's refusal: another address holds the id with a newer state version."""
        for addr, (cluster, broker_id) in self.addrs.get(req.broker_name, {}).items():
            if broker_id == req.broker_id and addr != req.broker_addr:
                live = self.live.get((cluster, addr))
                return live is not None and live["version"].state > req.data_version.state
        return False

    def register(self, req: RegisterBroker, now: int) -> None:
        name, cluster, addr, broker_id = req.broker_name, req.cluster, req.broker_addr, req.broker_id
        key = (cluster, addr)
        held_before = self.addrs.get(name, {}).get(addr) == (cluster, broker_id)
        stored_version = self.live[key]["version"] if key in self.live else None
        if name in self.addrs:
            self.zone[name] = req.zone
        entry = self.addrs.get(name, {}).get(addr)
        # Neither removal takes the name's queue data: this address serves them now.
        if entry is not None and entry[0] != cluster:  # moved to another cluster
            self.remove_addr(name, addr, keep_name=True)
        elif entry is not None and entry[1] != broker_id:  # a promotion or demotion
            self.addrs[name][addr] = (cluster, None)
        for other, (_, held_id) in list(self.addrs.get(name, {}).items()):
            if held_id == broker_id and other != addr:  # the id's holder is displaced
                self.remove_addr(name, other, keep_name=True)
        if name not in self.addrs:  # new
            self.addrs[name], self.home[name], self.zone[name] = {}, cluster, req.zone
            self.queues[name] = {}
        elif all(i is None for _, i in self.addrs[name].values()):  # no address held now
            self.home[name] = cluster
        self.addrs[name][addr] = (cluster, broker_id)
        self.live[key] = {"last": now, "stall": 0, "suspect": None,
                          "timeout": req.heartbeat_timeout_ms, "version": req.data_version}
        ids = [i for _, i in self.addrs[name].values() if i is not None]
        source = broker_id == MASTER_ID or (MASTER_ID not in ids and broker_id == min(ids))
        if source:
            held = self.queues[name]
            replace = not held_before or stored_version != req.data_version
            if replace and not req.incremental:
                for topic in [t for t in held if t not in req.topics]:
                    del held[topic]
            for topic, cfg in req.topics.items():
                if replace or topic not in held:  # the same version restores missing ones
                    held[topic] = QueueData(name, cfg.read_queues, cfg.write_queues, cfg.perm,
                                            cfg.sys_flag)
        if req.filter_servers:
            self.filter_servers[key] = list(req.filter_servers)
        else:
            self.filter_servers.pop(key, None)

    def remove_addr(self, name: str, addr: str, keep_name: bool = False) -> None:
        cluster, _ = self.addrs[name].pop(addr)
        key = (cluster, addr)
        if not self.listing(key):  # no name lists it any more: it is not alive either
            self.live.pop(key, None)
            self.filter_servers.pop(key, None)
        clusters = {c for c, _ in self.addrs[name].values()}
        if cluster not in clusters and self.home[name] == cluster and clusters:
            self.home[name] = min(clusters)
        if not keep_name and all(i is None for _, i in self.addrs[name].values()):  # gone
            del self.addrs[name], self.home[name], self.zone[name], self.queues[name]

    def heard(self, cluster: str, name: str, addr: str, now: int) -> bool:
        key = (cluster, addr)
        if key not in self.live or name not in self.listing(key):
            return False
        self.live[key].update(last=now, stall=0, suspect=None)
        return True

    def deadline(self, key: tuple[str, str]) -> int:
        live = self.live[key]
        own = live["last"] + live["stall"] + live["timeout"]
        return own if live["suspect"] is None else min(own, live["suspect"])

    def expire(self, now: int) -> None:
        for key in [k for k in self.live if self.deadline(k) < now]:
            for name in self.listing(key):
                self.remove_addr(name, key[1])
            self.live.pop(key, None)

    def suspect(self, cluster: str, addr: str, grace: int, now: int) -> None:
        live = self.live.get((cluster, addr))
        if live is not None:
            hinted = max(live["last"] + live["stall"] + grace, now + live["timeout"] // 4)
            if hinted < self.deadline((cluster, addr)):
                live["suspect"] = hinted

    def stall(self, ms: int) -> None:
        for live in self.live.values():
            live["stall"] += ms
            if live["suspect"] is not None:
                live["suspect"] += ms

    def write_perm(self, name: str, wipe: bool) -> None:
        held = self.queues.get(name, {})
        for topic, q in held.items():
            perm = q.perm & ~PERM_WRITE if wipe else PERM_READ | PERM_WRITE  # as Java: exactly RW
            held[topic] = QueueData(name, q.read_queues, q.write_queues, perm, q.sys_flag)

    def delete_topic(self, topic: str, cluster: str) -> None:
        for name, held in self.queues.items():
            if cluster and cluster not in {c for c, _ in self.addrs[name].values()}:
                continue
            held.pop(topic, None)

    def register_topic(self, topic: str, queues: list[QueueData]) -> None:
        for q in queues:
            self.queues[q.broker_name][topic] = q

    # --- what a client sees ----------------------------------------------------------

    def broker_table(self) -> dict[str, BrokerData]:
        return {name: BrokerData(cluster=self.home[name], broker_name=name, zone=self.zone[name],
                                 addrs=dict(sorted((i, a) for a, (_, i) in by_addr.items())))
                for name, by_addr in sorted(self.addrs.items())}

    def cluster_table(self) -> dict[str, list[str]]:
        clusters: dict[str, list[str]] = {}
        for name, by_addr in sorted(self.addrs.items()):
            for cluster in sorted({c for c, _ in by_addr.values()}):
                clusters.setdefault(cluster, []).append(name)
        return dict(sorted(clusters.items()))

    def routes(self) -> dict[str, TopicRoute]:
        brokers = self.broker_table()
        routes = {}
        for topic in sorted({t for held in self.queues.values() for t in held}):
            names = sorted(n for n, held in self.queues.items() if topic in held)
            routes[topic] = TopicRoute(
                topic=topic, queues=[self.queues[n][topic] for n in names],
                brokers=[brokers[n] for n in names],
                filter_servers={a: self.filter_servers[(c, a)] for n in names
                                for a, (c, _) in self.addrs[n].items()
                                if (c, a) in self.filter_servers},
                order_conf=self.order_conf.get(topic, ""))
        return routes

    def deadlines(self) -> dict[tuple[str, str], int]:
        return {key: self.deadline(key) for key in self.live}


class RouteTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = RouteTable(EPOCH)
        self.now = 0
        self.cache: dict[str, TopicRoute] = {}  # a client's view, built from events only
        self.last_event_revision: dict[str, int] = {}  # topic -> revision of its last event
        self.last_revision = 0
        self.model = Model()

    # --- bookkeeping shared by every step ------------------------------------

    def step(self, action, *, expiry: bool = False):
        """Run one request (or expiry step), check §7 numbering and replay its events."""
        before = snapshot_part(self.table)
        revision_before = self.table.revision
        result = action()
        events = result if isinstance(result, list) else _events_of(result)
        revisions = [e.revision for e in events]
        if expiry:
            # One revision per expired broker: consecutive, each batch contiguous.
            distinct = sorted(set(revisions))
            assert revisions == sorted(revisions)
            assert distinct == list(range(revision_before + 1, revision_before + 1 + len(distinct)))
            assert self.table.revision == revision_before + len(distinct)
        else:
            assert len(set(revisions)) <= 1, "all events of one request share one revision"
            changed = snapshot_part(self.table) != before
            if events or changed:
                assert self.table.revision == revision_before + 1
                assert not events or revisions[0] == self.table.revision
            else:
                assert self.table.revision == revision_before
        for event in events:
            assert event.epoch == EPOCH
            assert event.revision > self.last_revision or (
                event.revision == self.last_revision and event.revision > revision_before)
            self.last_revision = event.revision
            if isinstance(event, RouteEvent):
                assert event.prev == self.last_event_revision.get(event.topic, 0)
                assert event.revision > event.prev
                self.last_event_revision[event.topic] = event.revision
                if event.route is None:
                    assert event.topic in self.cache, "removal of a route never published"
                    del self.cache[event.topic]
                else:
                    assert event.route.topic == event.topic
                    self.cache[event.topic] = event.route
            else:
                assert isinstance(event, BrokerEvent)
                assert event.change in ("registered", "updated", "removed")
                allowed = {"removed": {"unregistered", "expired", "displaced", "peer_expired"}}
                assert event.reason in allowed.get(event.change, {""})
        return result

    def refused(self, action, error: type[Exception]) -> bool:
        before = table_state(self.table, self.now)
        try:
            self.step(action)
        except error:
            assert table_state(self.table, self.now) == before, "a refused request left a trace"
            return True
        return False

    # --- rules ------------------------------------------------------------------

    @rule(cluster=clusters, name=names, broker_id=broker_ids, addr=addrs,
          topic_map=st.one_of(st.just({}), st.dictionaries(topics, topic_configs, max_size=3)),
          version=versions,
          incremental=st.booleans(), zone=st.sampled_from(ZONES),
          filter_servers=st.lists(st.sampled_from(FILTER_SERVERS), max_size=2, unique=True),
          ha_addr=st.sampled_from(["", "10.8.0.1:1"]), timeout=st.sampled_from([1_000, 5_000]))
    def register(self, cluster, name, broker_id, addr, topic_map, version, incremental, zone,
                 filter_servers, ha_addr, timeout):
        request = RegisterBroker(
            cluster=cluster, broker_name=name, broker_id=broker_id, broker_addr=addr,
            ha_addr=ha_addr, zone=zone, data_version=version, topics=topic_map,
            filter_servers=filter_servers, heartbeat_timeout_ms=timeout, incremental=incremental,
        )
        conflict = self.model.conflict(request)
        if self.refused(lambda: self.table.register_broker(request, self.now), Conflict):
            assert conflict
            return
        assert not conflict
        self.model.register(request, self.now)
        assert self.table.broker_table()[name].addrs[broker_id] == addr
        live = self.table.liveness(cluster, addr)
        assert (live.last_heartbeat, live.timeout_ms, live.data_version) == (
            self.now, timeout, version)
        assert self.table.heartbeat(cluster, name, addr, version, self.now) == (True, False)

    @rule(cluster=clusters, name=names, addr=addrs, version=versions)
    def heartbeat(self, cluster, name, addr, version):
        before = snapshot_part(self.table)
        revision = self.table.revision
        known, changed = self.table.heartbeat(cluster, name, addr, version, self.now)
        assert known == self.model.heard(cluster, name, addr, self.now)
        live = self.table.liveness(cluster, addr)
        assert known == (live is not None and name in live.names)
        assert changed == (not known or live.data_version != version)
        if known:
            assert live.last_heartbeat == self.now
        assert (snapshot_part(self.table), self.table.revision) == (before, revision)

    @rule(cluster=clusters, name=names, addr=addrs)
    def unregister(self, cluster, name, addr):
        listed = any((live.cluster, live.broker_addr, live.broker_name) == (cluster, addr, name)
                     for live in self.table.live_brokers(self.now))
        removed, _ = self.step(lambda: self.table.unregister_broker(cluster, name, addr))
        assert removed == listed
        if self.model.addrs.get(name, {}).get(addr, (None,))[0] == cluster:
            self.model.remove_addr(name, addr)
        if removed:
            data = self.table.broker_table().get(name)
            assert data is None or addr not in data.addrs.values()

    @rule(ms=st.sampled_from([0, 1, 499, 1_000, 3_000, 6_000]))
    def advance_and_expire(self, ms):
        self.now += ms
        self.step(lambda: self.table.expire(self.now), expiry=True)
        self.model.expire(self.now)
        deadline = self.table.next_deadline()
        assert deadline is None or deadline >= self.now

    @rule(name=st.sampled_from(NAMES + ["ghost"]), wipe=st.booleans())
    def write_perm(self, name, wipe):
        op = self.table.wipe_write_perm if wipe else self.table.add_write_perm
        changed, events = self.step(lambda: op(name))
        self.model.write_perm(name, wipe)
        assert changed == len([e for e in events if isinstance(e, RouteEvent)])

    @rule(topic=topics, cluster=st.sampled_from([""] + CLUSTERS))
    def delete_topic(self, topic, cluster):
        removed, events = self.step(lambda: self.table.delete_topic(topic, cluster))
        self.model.delete_topic(topic, cluster)
        assert removed == bool(events)

    @rule(topic=topics, queues=st.lists(queue_datas, max_size=3))
    def register_topic(self, topic, queues):
        unknown = {q.broker_name for q in queues} - self.table.broker_table().keys()
        refused = self.refused(lambda: self.table.register_topic(topic, queues), BadRequest)
        assert refused == bool(unknown)
        if not refused:
            self.model.register_topic(topic, queues)

    @rule(topic=topics, value=st.sampled_from([None, "broker-a:4", "broker-b:8"]))
    def order_conf(self, topic, value):
        self.step(lambda: self.table.set_order_conf(topic, value))
        if value is None:
            self.model.order_conf.pop(topic, None)
        else:
            self.model.order_conf[topic] = value

    @rule(cluster=clusters, addr=addrs, grace=st.sampled_from([0, 500, 3_000]))
    def suspect(self, cluster, addr, grace):
        live = self.table.liveness(cluster, addr)
        old_deadline = live.deadline if live else None
        shortened = self.table.suspect(cluster, addr, grace, now=self.now)
        self.model.suspect(cluster, addr, grace, self.now)
        if live is not None:  # §10: the later of the grace and a quarter timeout from now
            hinted = max(live.silent_since + grace, self.now + live.timeout_ms // 4)
            assert shortened == (hinted < old_deadline)
            assert live.deadline == min(old_deadline, hinted)
        else:
            assert not shortened

    @rule(stall=st.sampled_from([1, 2_000, 10_000]))
    def stall(self, stall):
        before = deadlines(self.table)
        self.table.shift_deadlines(stall)
        self.model.stall(stall)
        assert deadlines(self.table) == {k: d + stall for k, d in before.items()}
        self.now += stall

    # --- invariants ---------------------------------------------------------------

    @invariant()
    def the_table_shows_what_the_model_holds(self):
        t, m = self.table, self.model
        assert t.broker_table() == m.broker_table()
        assert t.cluster_table() == m.cluster_table()
        assert t.routes() == m.routes()
        assert deadlines(t) == m.deadlines()
        assert t.next_deadline() == min(m.deadlines().values(), default=None)

    @invariant()
    def the_table_keeps_its_own_rules(self):
        # The topic index, the weight ledger (recomputed from what each name's routes
        # list), interning, cluster and broker tables, liveness, the heap, every route.
        self.table.check_invariants()

    @invariant()
    def queue_weight_is_what_the_routes_carry(self):
        # Recomputed from the routes a client reads, independently of zns.core.weights:
        # each entry weighs one, plus its name's addresses past the first, filter servers
        # and names by their bytes.
        t = self.table
        brokers, routes = t.broker_table(), t.routes().values()
        clusters = {(live.broker_name, live.broker_addr): live.cluster
                    for live in t.live_brokers(self.now)}
        expected = 0
        for route in routes:
            for data in route.brokers:
                # A route lists filter servers by address alone; they are kept per
                # (cluster, address), and only the name's own address cluster counts.
                servers = sum(t.filter_servers_of(clusters[data.broker_name, a], a)
                              for a in data.addrs.values())
                expected += len(data.addrs) + servers + name_weight(
                    data.cluster, data.broker_name, data.zone, data.addrs.values())
                assert brokers[data.broker_name] == data
        assert t.queue_weight() == expected
        assert t.queue_count() == sum(len(route.queues) for route in routes)

    @invariant()
    def cluster_and_broker_tables_agree(self):
        clusters, brokers = self.table.cluster_table(), self.table.broker_table()
        assert {n for members in clusters.values() for n in members} == set(brokers)
        for name, data in brokers.items():
            assert name in clusters[data.cluster], "BrokerData.cluster does not list it"

    @invariant()
    def replaying_events_reproduces_routes(self):
        assert self.cache == self.table.routes()
        for topic, revision in self.last_event_revision.items():
            assert self.table.topic_revision(topic) == revision
        for topic in self.table.routes():
            assert topic in self.last_event_revision


def _events_of(result) -> list:
    if hasattr(result, "events"):  # RegisterOutcome
        return result.events
    return result[1]  # (value, events)


RouteTableMachine.TestCase.settings = settings(
    max_examples=examples(200), stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRouteTable = pytest.mark.timeout(120)(RouteTableMachine.TestCase)

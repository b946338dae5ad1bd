"""Route materialization and revisions (§5, §7): what `get_route` answers, and the events.

`RouteBuilder` materializes a topic's route from the route table's records (and
caches the BrokerData every route of a broker shares); `RouteRevisions` holds the
routes, numbers changes and makes the events.

A change to the route table is collected in a `Changes` (the topics touched, the
broker events, whether the broker or cluster tables changed); `RouteRevisions.commit`
builds each touched topic's route once, keeps those that differ from the route held,
numbers everything with one new revision and returns the §7 events. A topic's revision
is the revision of its last change; a removed topic's is remembered for a while, so a
client's `prev` still matches (REMEMBERED_REMOVED_TOPICS). Routes of one commit share
their lists (`SharedLists`): one registration of a broker sharing T topics builds one
queue list and one broker list for all of them. Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import Protocol, TypeVar, cast

from zns.core.schema import BrokerData, BrokerEvent, QueueData, RouteEvent, TopicRoute

Event = RouteEvent | BrokerEvent
T = TypeVar("T")

# Removed topics whose last revision is still remembered (the oldest is forgotten
# first). Forgetting is safe for the §7 recipe: a client that remembered a removed
# topic's revision R sees the topic's next creation with `prev` 0 != R and pulls
# again; a client that asks after the revision was forgotten gets `not_found` with
# revision 0 and then rightly applies a creation event whose `prev` is 0 (it
# carries the whole route). Either way no change is missed; at worst one extra pull.
REMEMBERED_REMOVED_TOPICS = 10_000


class Changes:
    """What one request or expiry step touched; turned into events by `RouteRevisions.commit`."""

    def __init__(self) -> None:
        self.topics: set[str] = set()
        self.broker_events: list[BrokerEvent] = []
        self.structural = False  # brokers or clusters changed (visible in snapshot)
        self.stale_brokers: set[str] = set()  # broker names whose BrokerData must be rebuilt
        # topic -> broker names whose queue data was set or removed (see SharedLists), and
        # the topics where a name joined or left (their broker list changes shape).
        self.edited: dict[str, set[str]] = {}
        self.reshaped: set[str] = set()


class RouteRevisions:
    """The routes a client reads, the revision, and each topic's last revision."""

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self.revision = 0
        self._routes: dict[str, TopicRoute] = {}  # what get_route answers, per topic
        self._topic_revision: dict[str, int] = {}  # last change of each topic with a route
        # The last revision of recently removed topics, oldest first (bounded: see above).
        self._removed_revision: dict[str, int] = {}

    def route(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    def routes(self) -> dict[str, TopicRoute]:
        return self._routes

    def topic_revision(self, topic: str) -> int:
        """The revision of the topic's last change; 0 when unknown or forgotten (§7)."""
        revision = self._topic_revision.get(topic)
        if revision is None:
            return self._removed_revision.get(topic, 0)
        return revision

    def commit(self, ch: Changes,
               build: Callable[[str, Changes, SharedLists], TopicRoute | None]) -> list[Event]:
        """Build the touched topics' routes (`build`: a topic's route after `ch`, None when it
        has none), number what changed with one new revision and return it as events."""
        route_changes = []
        lists = SharedLists()
        routes = self._routes
        for topic in sorted(ch.topics):
            route = build(topic, ch, lists)
            if not same_route(route, routes.get(topic)):
                route_changes.append((topic, route))
        del lists  # the old lists it kept alive may go once their routes are replaced
        if not (route_changes or ch.broker_events or ch.structural):
            return []
        self.revision += 1
        revision = self.revision
        events: list[Event] = []
        for event in ch.broker_events:
            event.revision = revision
            events.append(event)
        for topic, route in route_changes:
            if route is None:
                del routes[topic]
                prev = self._topic_revision.pop(topic)
                self._removed_revision[topic] = revision
                if len(self._removed_revision) > REMEMBERED_REMOVED_TOPICS:
                    del self._removed_revision[next(iter(self._removed_revision))]
            else:
                routes[topic] = route
                if topic in self._topic_revision:
                    prev = self._topic_revision[topic]
                else:
                    prev = self._removed_revision.pop(topic, 0)
                self._topic_revision[topic] = revision
            events.append(RouteEvent(
                epoch=self.epoch, revision=revision, prev=prev, topic=topic, route=route
            ))
        return events

    def remembered(self) -> tuple[int, int]:
        """(topics with a revision, removed topics whose revision is remembered)."""
        return len(self._topic_revision), len(self._removed_revision)

    def dump(self, held: bool = True) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
        """(revision, each held topic's last revision, each remembered removed topic's),
        in their orders (zns.core.state_dump). `held` False: the held topics' are read in
        steps instead (`topic_revisions_in_steps`), and not listed here."""
        return (self.revision, list(self._topic_revision.items()) if held else [],
                list(self._removed_revision.items()))

    def topic_revisions_in_steps(self, work: int) -> Iterator[list[tuple[str, int]]]:
        """`dump`'s topic revisions, `work` a step (the last may be empty): the caller makes
        sure they did not change between steps."""
        held = iter(self._topic_revision.items())
        while True:
            step = list(islice(held, work))
            yield step
            if len(step) < work:
                return

    def load(self, revision: int, topic_revisions: list[tuple[str, int]],
             removed_revisions: list[tuple[str, int]],
             build: Callable[[str], TopicRoute | None]) -> None:
        """Take what `dump` gave into these empty revisions; `build(topic)`: the topic's
        route made from the loaded records (the routes are derived, never dumped)."""
        self.revision = revision
        for topic, topic_revision in topic_revisions:
            route = build(topic)
            if route is None:
                raise ValueError(f"topic {topic!r} has a revision and no queue data")
            self._routes[topic] = route
            self._topic_revision[topic] = topic_revision
        self._removed_revision.update(removed_revisions)

    def check_invariants(self) -> None:
        """Raise AssertionError if the routes and revisions contradict each other."""
        assert self._topic_revision.keys() == self._routes.keys(), "a route without a revision"
        assert all(0 < r <= self.revision for r in self._topic_revision.values()), (
            "a topic revision outside 1..revision")
        assert self._routes.keys().isdisjoint(self._removed_revision), (
            "a held topic also remembered as removed")
        assert len(self._removed_revision) <= REMEMBERED_REMOVED_TOPICS
        for topic, route in self._routes.items():
            assert route.topic == topic, f"{topic} holds the route of {route.topic}"
            names = [q.broker_name for q in route.queues]
            assert names and names == sorted(set(names)), f"{topic}: queues not one per name"
            assert [b.broker_name for b in route.brokers] == names, f"{topic}: brokers differ"
            addrs = {a for b in route.brokers for a in b.addrs.values()}
            assert set(route.filter_servers) <= addrs, f"{topic}: filter servers of no broker"


class BrokerRecordLike(Protocol):
    """What the builder reads of a broker name's record (zns.core.routes.BrokerRecord)."""

    cluster: str
    zone: str
    addrs: dict[int, str]
    addr_cluster: dict[str, str]


class RouteBuilder:
    """Routes materialized from the route table's records, and the BrokerData they share.

    It reads the table's own dicts (never copies): queue data by topic and name, broker
    records, filter servers by (cluster, address), order configurations, and the names
    whose routes carry extra weight (only those can list filter servers).
    """

    def __init__(self, queues: Mapping[str, Mapping[str, QueueData]],
                 brokers: Mapping[str, BrokerRecordLike],
                 filter_servers: Mapping[tuple[str, str], list[str]],
                 order_conf: Mapping[str, str], heavy_names: Mapping[str, int],
                 revisions: RouteRevisions) -> None:
        self._queues, self._brokers, self._filter_servers = queues, brokers, filter_servers
        self._order_conf, self._heavy, self._revisions = order_conf, heavy_names, revisions
        self._broker_data: dict[str, BrokerData] = {}  # shared by every route of a broker

    def __len__(self) -> int:
        """BrokerData held."""
        return len(self._broker_data)

    def broker_data(self, name: str) -> BrokerData:
        data = self._broker_data.get(name)
        if data is None:
            rec = self._brokers[name]
            data = self._broker_data[name] = BrokerData(
                cluster=rec.cluster, broker_name=name, addrs=dict(sorted(rec.addrs.items())),
                zone=rec.zone,
            )
        return data

    def forget(self, name: str) -> None:
        """The name's BrokerData changed: built again when next needed."""
        self._broker_data.pop(name, None)

    def refresh(self, names: set[str]) -> None:
        """Build each changed BrokerData once, before the routes that share it."""
        for name in names:
            if name in self._brokers:
                self.broker_data(name)

    def build(self, topic: str, ch: Changes, lists: SharedLists) -> TopicRoute | None:
        """The route of `topic` after this commit's changes.

        A registration of one broker changes every topic it shares, and a shared topic
        lists every broker: rebuilding each route from scratch makes a restart of N
        brokers sharing T topics cost T x N^2. Routes are built from the route they
        replace instead, and topics whose old lists and edits are the same share the
        new lists (`SharedLists`): one registration builds one queue list and one
        broker list for all T topics, and NameService encodes each list once.
        """
        by_broker = self._queues.get(topic)
        if not by_broker:
            return None
        old = self._revisions.route(topic)
        queues = lists.queues(old.queues if old is not None else None,
                              ch.edited.get(topic), by_broker)
        stale = ch.stale_brokers
        if old is not None and topic not in ch.reshaped and not any(n in by_broker for n in stale):
            brokers = old.brokers  # the same names and none of their BrokerData changed
        else:
            brokers = lists.derived("brokers", queues, self._broker_list)
        filter_servers = lists.derived("filter_servers", queues, self._filter_servers_of_route)
        return TopicRoute(
            topic=topic, queues=queues, brokers=brokers,
            filter_servers=filter_servers, order_conf=self._order_conf.get(topic, ""),
        )

    def _broker_list(self, queues: list[QueueData]) -> list[BrokerData]:
        broker_data = self._broker_data
        return [broker_data[q.broker_name] for q in queues]

    def _filter_servers_of_route(self, queues: list[QueueData]) -> dict[str, list[str]]:
        """The filter servers a route of these brokers lists, by broker address."""
        filter_servers: dict[str, list[str]] = {}
        fs_names = self._heavy  # names with filter servers (or other extra weight)
        if not fs_names:
            return filter_servers
        if len(fs_names) < len(queues):
            in_route = {q.broker_name for q in queues}
            with_servers = sorted(n for n in fs_names if n in in_route)
        else:
            with_servers = [q.broker_name for q in queues if q.broker_name in fs_names]
        for n in with_servers:
            rec = self._brokers[n]
            for addr in rec.addrs.values():
                servers = self._filter_servers.get((rec.addr_cluster[addr], addr))
                if servers:
                    filter_servers[addr] = servers
        return filter_servers

    def fresh(self, topic: str) -> TopicRoute:
        """The topic's route built from the records alone, as §3 defines it (no sharing)."""
        by_broker = self._queues[topic]
        names = sorted(by_broker)
        brokers, filter_servers = [], {}
        for name in names:
            rec = self._brokers[name]
            brokers.append(BrokerData(cluster=rec.cluster, broker_name=name,
                                      addrs=dict(sorted(rec.addrs.items())), zone=rec.zone))
            for addr in rec.addrs.values():
                servers = self._filter_servers.get((rec.addr_cluster[addr], addr))
                if servers:
                    filter_servers[addr] = list(servers)
        return TopicRoute(topic=topic, queues=[by_broker[n] for n in names], brokers=brokers,
                          filter_servers=filter_servers, order_conf=self._order_conf.get(topic, ""))

    def check_invariants(self) -> None:
        """Raise AssertionError if a cached BrokerData or a route differs from the records."""
        for name, data in self._broker_data.items():
            rec = self._brokers[name]
            assert data == BrokerData(cluster=rec.cluster, broker_name=name,
                                      addrs=dict(sorted(rec.addrs.items())), zone=rec.zone), (
                f"{name}: stale BrokerData")
        expected = {topic: self.fresh(topic) for topic in self._queues}
        assert self._revisions.routes() == expected, "a route differs from its records"


class SharedLists:
    """The queue and broker lists built during one commit, shared by the topics that agree.

    A topic's new queue list depends only on its old list and on the queue data of
    the names edited in this commit, so topics with the same old list (the same
    object: lists are shared, never mutated) and the same edits get the same new
    list. Keys hold ids, so each entry also holds the objects whose ids it uses:
    an id stays unique while its object is alive.
    """

    def __init__(self) -> None:
        self._queues: dict[tuple, tuple[list[QueueData] | None, list[QueueData]]] = {}
        # (what, id of a queue list) -> (the list, what was derived from it)
        self._derived: dict[tuple[str, int], tuple[list[QueueData], object]] = {}

    def queues(self, old: list[QueueData] | None, edited: set[str] | None,
               by_broker: Mapping[str, QueueData]) -> list[QueueData]:
        if old is not None and not edited:
            return old
        # Queue data are interned (RouteTable._intern): equal data, one object, one id.
        edits = tuple(sorted((n, id(by_broker.get(n))) for n in edited)) if edited else ()
        key = (id(old), edits)
        entry = self._queues.get(key)
        if entry is None:
            queues = list(map(by_broker.__getitem__, sorted(by_broker)))
            entry = self._queues[key] = (old, queues)
        return entry[1]

    def derived(self, what: str, queues: list[QueueData],
                build: Callable[[list[QueueData]], T]) -> T:
        """`build(queues)`, once per queue list: the same brokers give the same broker
        list and filter servers."""
        key = (what, id(queues))
        entry = self._derived.get(key)
        if entry is None:
            entry = self._derived[key] = (queues, build(queues))
        # One `what` is always built by the same function: its entries hold a T.
        return cast(T, entry[1])


def same_route(new: TopicRoute | None, old: TopicRoute | None) -> bool:
    """`new == old`, without comparing shared lists element by element."""
    if new is None or old is None:
        return new is old
    return ((new.queues is old.queues or new.queues == old.queues)
            and (new.brokers is old.brokers or new.brokers == old.brokers)
            and new.filter_servers == old.filter_servers and new.order_conf == old.order_conf)

"""The route table: RocketMQ's RouteInfoManager as a sans-I/O state machine.

No sockets, no clock, no encoding. Every method that changes state takes `now`
(milliseconds on any monotonic scale) and returns the §7 events it caused,
already numbered with one new revision. A request that is refused raises
before anything is touched, so a failure leaves no trace (§2).

This module holds the records (broker names, their addresses and clusters, queue
data per topic, filter servers, order configurations) and the rules of §4 and §6
that change them. Three parts it delegates to, each a module of its own:

- `zns.core.liveness`: each address's deadline in a lazy heap (§8, §10);
- `zns.core.weights`: what the routes carry in queue entries (--max-queues), one
  formula for the ledger and for `queue_weight_after`, which zns.core.limits asks;
- `zns.core.revisions`: the materialized routes, revisions and events (§5, §7).

`check_invariants()` recomputes everything kept incrementally; tests call it
rather than reading the records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from zns.core.errors import BadRequest, Conflict, UsageError
from zns.core.liveness import LiveKey, Liveness, LivenessSchedule
from zns.core.revisions import Changes, RouteBuilder, RouteRevisions, SharedLists
from zns.core.state_dump import TableDump
from zns.core.table_state import AddressState, BrokerState, QueueValue, TableState, check_state
from zns.core.weights import WeightLedger, entry_weight
from zns.core.schema import (
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    BrokerEvent,
    DataVersion,
    LiveBroker,
    QueueData,
    RegisterBroker,
    RouteEvent,
    TopicRoute,
)

Event = RouteEvent | BrokerEvent

# One expiry step stops taking addresses once it has touched this many
# (address, topic) pairs, so a partition is expired in slices between which the
# loop serves requests (§8); the next step is due at once.
EXPIRY_STEP_WORK = 2_000
# One step of a dump (zns.core.warm) takes this many queue entries: about 1 ms on the
# machine of bench/results.md, well inside the loop's 5 ms slice.
DUMP_STEP_WORK = 2_000


@dataclass
class BrokerRecord:
    cluster: str  # the cluster it was created in: BrokerData.cluster on the wire
    name: str
    zone: str
    addrs: dict[int, str] = field(default_factory=dict)
    addr_cluster: dict[str, str] = field(default_factory=dict)  # address -> its liveness cluster

    def id_of(self, addr: str) -> int | None:
        for broker_id, a in self.addrs.items():
            if a == addr:
                return broker_id
        return None

    def held_id(self, addr: str) -> int:
        """The id of an address this name holds (KeyError for one it does not)."""
        broker_id = self.id_of(addr)
        if broker_id is None:
            raise KeyError(addr)
        return broker_id


@dataclass
class RegisterOutcome:
    master_addr: str
    ha_addr: str
    events: list[Event]


class RouteTable:
    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self._queues: dict[str, dict[str, QueueData]] = {}  # topic -> broker name -> queues
        self._broker_topics: dict[str, set[str]] = {}  # broker name -> topics (index)
        # Queue entries and what the routes carry, in queue entries (zns.core.weights).
        self._weights = WeightLedger()
        self._brokers: dict[str, BrokerRecord] = {}
        # cluster -> its broker names, in the order they joined (the order Java's HashSet
        # keeps within a bucket: see zns.core.remoting.javaorder)
        self._clusters: dict[str, dict[str, None]] = {}
        self._live = LivenessSchedule()
        self._filter_servers: dict[LiveKey, list[str]] = {}
        self._order_conf: dict[str, str] = {}
        # Interned QueueData -> [the shared object, how many queue entries use it]: a
        # broker's topics mostly share one configuration. Counted, so a value leaves
        # with its last use and a removal costs what it removes, not the table size.
        self._queue_values: dict[QueueData, list] = {}
        # What get_route answers, the revisions and events (zns.core.revisions).
        self._revisions = RouteRevisions(epoch)
        self._builder = RouteBuilder(self._queues, self._brokers, self._filter_servers,
                                     self._order_conf, self._weights.extra, self._revisions)
        # Moves with every change of what `dump` holds (a revision, a timeout, a
        # DataVersion or HA address, filter servers, an order configuration), and only
        # then: a broker's periodic registration that changes nothing leaves it alone.
        self.changes = 0

    # --- broker ops (§4) --------------------------------------------------

    def register_broker(self, req: RegisterBroker, now: int) -> RegisterOutcome:
        """§4 `register_broker`, all-or-nothing: the one refusal is checked before any change."""
        self._refuse_conflict(req)
        ch = Changes()
        key = (req.cluster, req.broker_addr)
        before = self._live.get(*key)  # what the table held of this address before the request
        same_version = self.holds_same_version(req)
        rec = self._join_cluster(req, ch)                                     # step 1
        old_id = self._move_address(rec, req, ch)                             # steps 2 and 3
        self._record_address(rec, req, old_id, before, ch)
        live = self._record_liveness(req, now)                                # step 5
        if self._is_topic_source(rec, req.broker_id):                         # step 4
            if same_version:
                self._restore_missing_topics(req.broker_name, req, ch)
            else:
                self._apply_topics(req.broker_name, req, ch)
        self._set_filter_servers(key, req.filter_servers, live, ch)           # step 6
        master_addr, ha_addr = self._master_of(rec, req.broker_id)
        return RegisterOutcome(master_addr, ha_addr, self._commit(ch))

    # --- the steps of register_broker, in order -----------------------------

    def _refuse_conflict(self, req: RegisterBroker) -> None:
        """Step 3's refusal: another address holds this id with a newer state version."""
        rec = self._brokers.get(req.broker_name)
        if rec is None:
            return
        holder = rec.addrs.get(req.broker_id)
        if holder is None or holder == req.broker_addr:
            return
        holder_live = self._live.get(rec.addr_cluster[holder], holder)
        if holder_live and holder_live.data_version.state > req.data_version.state:
            raise Conflict(
                f"broker {req.broker_name!r} id {req.broker_id} is held by {holder} with "
                f"data_version.state {holder_live.data_version.state} > "
                f"{req.data_version.state}"
            )

    def _join_cluster(self, req: RegisterBroker, ch: Changes) -> BrokerRecord:
        """Step 1: the broker name's record, created if absent; its zone is overwritten."""
        rec = self._brokers.get(req.broker_name)
        if rec is None:
            rec = self._brokers[req.broker_name] = BrokerRecord(
                req.cluster, req.broker_name, req.zone)
            self._broker_topics[req.broker_name] = set()
            ch.structural = True
        elif rec.zone != req.zone:
            rec.zone = req.zone
            self._touch_broker(rec, ch, structural=True)
        return rec

    def _move_address(self, rec: BrokerRecord, req: RegisterBroker, ch: Changes) -> int | None:
        """Steps 2 and 3: free the id and the address; returns the id the address had (None: new)."""
        name, cluster, addr, broker_id = req.broker_name, req.cluster, req.broker_addr, req.broker_id
        # Step 2: the same address under another id (a promotion or demotion).
        # Neither removal below drops the name's queue data, even when it takes the name's
        # only address: this registration's address serves them from now on (as in Java,
        # which replaces the address in place and keeps the name's topics).
        old_id = rec.id_of(addr)
        if old_id is not None and rec.addr_cluster[addr] != cluster:
            self._remove_addr(rec, addr, "displaced", ch, keep_name=True)  # moved cluster
            old_id = None
        if old_id is not None and old_id != broker_id:
            del rec.addrs[old_id]
        # Step 3: another address holding this id (the conflict check passed already).
        holder = rec.addrs.get(broker_id)
        if holder is not None and holder != addr:
            self._remove_addr(rec, holder, "displaced", ch, keep_name=True)
        if not rec.addrs:  # BrokerData.cluster: the cluster the name is now in
            rec.cluster = cluster
            self._reweigh(name)
        return old_id

    def _record_address(self, rec: BrokerRecord, req: RegisterBroker, old_id: int | None,
                        before: Liveness | None, ch: Changes) -> None:
        """The address takes its id in its cluster; `registered` or `updated` when that is news."""
        name, cluster, addr, broker_id = req.broker_name, req.cluster, req.broker_addr, req.broker_id
        rec.addrs[broker_id] = addr
        rec.addr_cluster[addr] = cluster
        members = self._clusters.setdefault(cluster, {})
        if name not in members:
            members[name] = None
            ch.structural = True
        if old_id is None:
            change = "registered"
        elif old_id != broker_id or (before is not None and before.ha_addr != req.ha_addr):
            change = "updated"
        else:
            return
        self._touch_broker(rec, ch, structural=True)
        ch.broker_events.append(self._broker_event(rec, broker_id, addr, cluster, change, ""))

    def _record_liveness(self, req: RegisterBroker, now: int) -> Liveness:
        """Step 5: alive now, with the broker's timeout, DataVersion and HA address."""
        return self._heard_registration(req.cluster, req.broker_addr, req.broker_name, now,
                                        req.heartbeat_timeout_ms, req.data_version, req.ha_addr)

    def _heard_registration(self, cluster: str, addr: str, name: str, now: int,
                            timeout_ms: int, data_version: DataVersion,
                            ha_addr: str) -> Liveness:
        held = self._live.get(cluster, addr)
        if held is None or (held.timeout_ms, held.data_version, held.ha_addr) != (
                timeout_ms, data_version, ha_addr):
            self.changes += 1
        return self._live.record(cluster, addr, now, timeout_ms, data_version, ha_addr, name)

    @staticmethod
    def _is_topic_source(rec: BrokerRecord, broker_id: int) -> bool:
        """Step 4's source: the master, or the lowest id while no master is registered."""
        return broker_id == MASTER_ID or (MASTER_ID not in rec.addrs and broker_id == min(rec.addrs))

    def _set_filter_servers(self, key: LiveKey, servers: list[str], live: Liveness,
                            ch: Changes) -> None:
        """Step 6: the address's filter servers are replaced (an empty list removes them)."""
        if self._filter_servers.get(key, []) == servers:
            return
        self.changes += 1
        if servers:
            self._filter_servers[key] = list(servers)
        else:
            del self._filter_servers[key]
        # The list is keyed by (cluster, addr): every broker name listing it shows it.
        for listing in live.names:
            self._touch_broker(self._brokers[listing], ch)

    def _master_of(self, rec: BrokerRecord, broker_id: int) -> tuple[str, str]:
        """The reply: a slave learns its master's address and HA address, when registered."""
        if broker_id == MASTER_ID or MASTER_ID not in rec.addrs:
            return "", ""
        master_addr = rec.addrs[MASTER_ID]
        master_live = self._live.get(rec.addr_cluster[master_addr], master_addr)
        return master_addr, master_live.ha_addr if master_live else ""

    # --- a registration that changes nothing but liveness (zns.core.state.Renew) ---

    def renews_only(self, req: RegisterBroker) -> bool:
        """Whether `register_broker(req, now)` would change nothing but its address's
        liveness: when it was heard (and what hearing clears: stall credit, a peer's
        suspicion, a restored address's pending confirmation), its timeout and its
        DataVersion. That holds when the name holds this address at this id in this
        cluster, with the same zone, HA address and filter servers, and, when the
        registration is the name's topic source (step 4), its topics change no queue data:
        with an unchanged DataVersion every listed topic is held already; with another,
        every listed topic holds exactly the listed queue data and, unless incremental, no
        other. Then the registration makes no revision and no event, and `renew` does
        exactly what it does."""
        name, addr = req.broker_name, req.broker_addr
        held_at = self._held_at(req.cluster, name, addr, req.broker_id)
        if held_at is None:
            return False
        rec, live = held_at
        if (rec.zone != req.zone or live.ha_addr != req.ha_addr
                or self._filter_servers.get((req.cluster, addr), []) != req.filter_servers):
            return False
        if not self._is_topic_source(rec, req.broker_id):
            return True
        held = self._broker_topics[name]
        if live.data_version == req.data_version:
            return held.issuperset(req.topics)
        if not req.incremental and len(held) != len(req.topics):
            return False
        queues = self._queues
        return all(topic in held and queues[topic][name] == QueueData(
            name, cfg.read_queues, cfg.write_queues, cfg.perm, cfg.sys_flag)
            for topic, cfg in req.topics.items())

    def renew(self, cluster: str, name: str, addr: str, broker_id: int, now: int,
              timeout_ms: int, data_version: DataVersion) -> tuple[str, str]:
        """What `register_broker` does for a registration `renews_only` accepted: the
        address heard at `now` with this timeout and DataVersion. Returns the reply's
        (master address, its HA address). UsageError for an address the name does not hold
        at this id (a registration `renews_only` could not have accepted), changing
        nothing."""
        held_at = self._held_at(cluster, name, addr, broker_id)
        if held_at is None:
            raise UsageError(f"no renewal of {cluster}/{name} id {broker_id} at {addr}: "
                             f"not held so")
        rec, live = held_at
        self._heard_registration(cluster, addr, name, now, timeout_ms, data_version,
                                 live.ha_addr)
        return self._master_of(rec, broker_id)

    def _held_at(self, cluster: str, name: str, addr: str,
                 broker_id: int) -> tuple[BrokerRecord, Liveness] | None:
        """The name's record and the address's liveness when the name holds `addr` at
        `broker_id` in `cluster` and the address is alive for it (None: not so)."""
        rec = self._brokers.get(name)
        live = self._live.get(cluster, addr)
        if (rec is None or live is None or name not in live.names
                or rec.addrs.get(broker_id) != addr or rec.addr_cluster.get(addr) != cluster):
            return None
        return rec, live

    def heartbeat(
        self, cluster: str, name: str, addr: str, data_version: DataVersion, now: int
    ) -> tuple[bool, bool]:
        """(known, changed) per §4; stores nothing but the time."""
        live = self._live.get(cluster, addr)
        if live is not None and name in live.names:
            self._live.heard(live, now)
            return True, live.data_version != data_version
        return False, True

    def unregister_broker(
        self, cluster: str, name: str, addr: str, reason: str = "unregistered"
    ) -> tuple[bool, list[Event]]:
        """§4 unregister_broker; `reason` is `disconnected` when a remoting connection closed (§12)."""
        rec = self._brokers.get(name)
        if rec is None or rec.addr_cluster.get(addr) != cluster:
            return False, []
        ch = Changes()
        self._remove_addr(rec, addr, reason, ch)
        return True, self._commit(ch)

    def unregister_brokers(
        self, entries: Iterable[tuple[str, str, str]], reason: str
    ) -> list[Event]:
        """Many (cluster, name, addr) unregistrations as one step: one revision, each
        affected route rebuilt once (remoting connections closing together: one at a time,
        a route N brokers share was rebuilt N times, N² in all). Entries not held are skipped."""
        ch = Changes()
        for cluster, name, addr in entries:
            rec = self._brokers.get(name)
            if rec is not None and rec.addr_cluster.get(addr) == cluster:
                self._remove_addr(rec, addr, reason, ch)
        return self._commit(ch)

    def liveness(self, cluster: str, addr: str) -> Liveness | None:
        """What the table holds about a broker address's liveness (read it, never change it)."""
        return self._live.get(cluster, addr)

    # --- liveness (§8, §10) -----------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest liveness deadline; a broker expires once `now` is past it."""
        return self._live.next_deadline()

    def expire(self, now: int, work: int = EXPIRY_STEP_WORK) -> list[Event]:
        """One expiry step (§8): remove the addresses due at `now`, as one revision.

        Each affected route is rebuilt once, however many of its brokers go. The
        step stops taking addresses once they serve `work` (address, topic) pairs
        between them (it always takes one), so a partition is removed in slices;
        `next_deadline()` is then still past `now` and the caller runs another
        step once it has served what waits. The decision is re-checked here.
        """
        ch = Changes()
        done = 0
        while done < work and (live := self._live.pop_due(now)) is not None:
            if live.confirm_by is not None and now > live.confirm_by:
                reason = "not_confirmed"  # restored from a dump, never heard since
            elif now > live.own_deadline:
                reason = "expired"
            else:
                reason = "peer_expired"
            done += 1 + sum(len(self._broker_topics.get(n, ())) for n in live.names)
            self._drop_liveness(live, reason, ch)
        return self._commit(ch)

    def suspect(self, cluster: str, addr: str, grace_ms: int, now: int) -> bool:
        """A peer saw this broker leave at `now`: shorten its deadline (§10; see
        LivenessSchedule.suspect)."""
        return self._live.suspect(cluster, addr, grace_ms, now)

    def shift_deadlines(self, stall_ms: int) -> None:
        """The process itself was stalled: give every broker that time back."""
        self._live.shift(stall_ms)

    # --- admin ops (§6) ---------------------------------------------------

    def wipe_write_perm(self, name: str) -> tuple[int, list[Event]]:
        return self._change_perm(name, lambda perm: perm & ~PERM_WRITE)

    def add_write_perm(self, name: str) -> tuple[int, list[Event]]:
        # RocketMQ's operateWritePermOfBroker: perm becomes READ|WRITE exactly (the
        # priority and inherit bits go), not perm | READ | WRITE.
        return self._change_perm(name, lambda perm: PERM_READ | PERM_WRITE)

    def delete_topic(self, topic: str, cluster: str = "") -> tuple[bool, list[Event]]:
        by_broker = self._queues.get(topic, {})
        if cluster:
            names = [n for n in by_broker if n in self._clusters.get(cluster, ())]
        else:
            names = list(by_broker)
        if not names:
            return False, []
        ch = Changes()
        for name in names:
            self._remove_queue(topic, name, ch)
        return True, self._commit(ch)

    def register_topic(self, topic: str, queues: list[QueueData]) -> list[Event]:
        unknown = sorted({q.broker_name for q in queues} - self._brokers.keys())
        if unknown:
            raise BadRequest(f"unknown broker name(s) {', '.join(unknown)} - at `$.queues`")
        ch = Changes()
        for q in queues:
            self._set_queue(topic, q, ch)
        return self._commit(ch)

    def set_order_conf(self, topic: str, value: str | None) -> list[Event]:
        """The ORDER_TOPIC_CONFIG KV entry of `topic` changed (None: deleted)."""
        if self._order_conf.get(topic) != value:
            self.changes += 1
        if value is None:
            self._order_conf.pop(topic, None)
        else:
            self._order_conf[topic] = value
        ch = Changes()
        ch.topics.add(topic)
        return self._commit(ch)

    # --- queries (§5) -----------------------------------------------------

    @property
    def revision(self) -> int:
        """The revision of the table's last change (§7)."""
        return self._revisions.revision

    def route(self, topic: str) -> TopicRoute | None:
        return self._revisions.route(topic)

    def topic_revision(self, topic: str) -> int:
        """The revision of the topic's last change; 0 when unknown or forgotten (§7)."""
        return self._revisions.topic_revision(topic)

    # Insertion orders, which Java's hash tables keep within a bucket (the remoting
    # listener writes its bodies in Java's order: zns.core.remoting.javaorder). Read only.
    def topic_queue_table(self) -> dict[str, dict[str, QueueData]]:
        """topic -> broker name -> QueueData; topics and names in the order they came."""
        return self._queues

    def broker_names(self) -> list[str]:
        """Broker names in the order they were first registered (since last held)."""
        return list(self._brokers)

    def cluster_members(self) -> dict[str, dict[str, None]]:
        """cluster -> its broker names, both in the order they joined."""
        return self._clusters

    def routes(self) -> dict[str, TopicRoute]:
        return self._revisions.routes()

    def broker_table(self) -> dict[str, BrokerData]:
        return {name: self._builder.broker_data(name) for name in sorted(self._brokers)}

    def cluster_table(self) -> dict[str, list[str]]:
        return {c: sorted(names) for c, names in sorted(self._clusters.items())}

    def live_brokers(self, now: int) -> list[LiveBroker]:
        out = []
        for live in sorted(self._live, key=lambda live: (live.cluster, live.addr)):
            cluster, addr = live.cluster, live.addr
            for name in sorted(live.names):
                out.append(LiveBroker(
                    cluster=cluster,
                    broker_addr=addr,
                    broker_name=name,
                    broker_id=self._brokers[name].held_id(addr),
                    last_heartbeat_ms=max(0, now - live.last_heartbeat),
                    timeout_ms=live.timeout_ms,
                    data_version=live.data_version,
                ))
        return out

    def topics(self, cluster: str = "", sys_flag: int = 0) -> list[str]:
        in_cluster = self._clusters.get(cluster, {}).keys() if cluster else None
        out = []
        for topic, by_broker in self._queues.items():
            if in_cluster is not None and in_cluster.isdisjoint(by_broker):
                continue
            if sys_flag and (by_broker[min(by_broker)].sys_flag & sys_flag) != sys_flag:
                continue
            out.append(topic)
        out.sort()
        return out

    # --- the state across restarts (zns.core.warm) --------------------------

    def dump(self) -> TableState:
        """Everything the table decides from, in its own orders (zns.core.table_state)."""
        for state in self.dump_in_steps():
            if state is not None:
                return state
        raise AssertionError("dump_in_steps ended without a state")  # pragma: no cover

    def dump_in_steps(self, work: int = DUMP_STEP_WORK) -> Iterator[TableState | None]:
        """`dump()` made in steps, so the loop serves between them: None after each `work`
        queue entries, then the state.

        The steps read the table as it is when each runs: the state is the table's
        only if `changes` is the same after the last step as before the first (the
        caller checks before each step, and drops the steps when it moved).
        """
        changes = self.changes
        values: list[QueueValue] = []
        topics: list[tuple[str, list[int]]] = []
        for new_values, new_topics, more in self.queue_data_in_steps(work):
            values += new_values
            topics += new_topics
            if more:
                yield None
                if self.changes != changes:
                    raise RuntimeError("the table changed during a dump")
        yield self.records(values, topics)

    def queue_data_in_steps(self, work: int = DUMP_STEP_WORK) -> Iterator[
            tuple[list[QueueValue], list[tuple[str, list[int]]], bool]]:
        """The queue data as `dump` lists them, read in steps of `work` queue entries: each
        step's distinct values not listed before and its topics (indexes into all the
        values listed so far), and whether more steps follow. The caller checks `changes`
        between steps, as `dump_in_steps` does. The queue data are interned (`_intern`):
        equal values are one object, numbered once."""
        index: dict[int, int] = {}
        values: list[QueueValue] = []
        topics: list[tuple[str, list[int]]] = []
        done = 0
        for topic, by_broker in self._queues.items():
            numbers = []
            for queue in by_broker.values():
                number = index.get(id(queue))
                if number is None:
                    number = index[id(queue)] = len(index)
                    values.append((queue.broker_name, queue.read_queues, queue.write_queues,
                                   queue.perm, queue.sys_flag))
                numbers.append(number)
            topics.append((topic, numbers))
            done += len(numbers)
            if done >= work:
                done = 0
                yield values, topics, True
                values, topics = [], []
        yield values, topics, False

    def records(self, queue_values: list[QueueValue],
                topics: list[tuple[str, list[int]]]) -> TableState:
        """The table's state with these queue data (`queue_data_in_steps`'s, all steps
        joined): the rest of the records are read now."""
        filter_servers = self._filter_servers
        return TableState(
            clusters=[(cluster, list(names)) for cluster, names in self._clusters.items()],
            brokers=[BrokerState(rec.name, rec.cluster, rec.zone,
                                 [(i, a, rec.addr_cluster[a]) for i, a in rec.addrs.items()])
                     for rec in self._brokers.values()],
            addresses=[AddressState(live.cluster, live.addr, live.timeout_ms, live.data_version,
                                    live.ha_addr, sorted(live.names),
                                    list(filter_servers.get((live.cluster, live.addr), ())))
                       for live in self._live],
            queue_values=queue_values, topics=topics, order_conf=list(self._order_conf.items()),
        )

    def restore(self, state: TableState, now: int, confirm_within_ms: Callable[[str, str, int], int],
                order_conf: Mapping[str, str] | None = None) -> None:
        """Take a dumped state into this empty table as one revision (no events: nobody
        can be listening yet).

        Each address is alive from `now` but not yet confirmed: it is removed as
        `not_confirmed` `confirm_within_ms(cluster, addr, its timeout)` after `now` unless
        it registers or heartbeats first. `order_conf`: the order configurations to hold
        instead of the dump's (the KV store's, which is written before any dump).
        Checked whole first (`check_state`: ValueError), so a dump that does not hold
        together changes nothing.
        """
        if self._brokers or self._queues or self._revisions.revision:
            raise UsageError("restore() takes an empty table")
        check_state(state)
        for a in state.addresses:
            self._live.restore(a.cluster, a.addr, now, a.timeout_ms, a.data_version, a.ha_addr,
                               a.names, confirm_within_ms(a.cluster, a.addr, a.timeout_ms))
        ch = self._take_records(state, dict(state.order_conf) if order_conf is None else order_conf)
        ch.structural = True
        self._commit(ch)

    def _take_records(self, state: TableState, order_conf: Mapping[str, str]) -> Changes:
        """The records of `state` into this empty table whose addresses are already live
        (`restore`, `from_exact_dump`): the changes made, every broker's BrokerData stale."""
        for cluster, names in state.clusters:
            self._clusters[cluster] = dict.fromkeys(names)
        for broker in state.brokers:
            rec = self._brokers[broker.name] = BrokerRecord(broker.cluster, broker.name, broker.zone)
            for broker_id, addr, cluster in broker.addrs:
                rec.addrs[broker_id] = addr
                rec.addr_cluster[addr] = cluster
            self._broker_topics[broker.name] = set()
        for a in state.addresses:
            if a.filter_servers:
                self._filter_servers[(a.cluster, a.addr)] = list(a.filter_servers)
        self._order_conf.clear()
        self._order_conf.update(order_conf)
        for name in self._brokers:
            self._reweigh(name)
        ch = Changes()
        ch.stale_brokers.update(self._brokers)
        queues = [QueueData(*value) for value in state.queue_values]
        for topic, numbers in state.topics:
            for number in numbers:
                self._set_queue(topic, queues[number], ch)
        return ch

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first rule the table's records break.

        Everything kept incrementally is recomputed from the records it derives from:
        the topic index, the weight ledger, the interned queue values, the cached
        BrokerData and every route. Tests call it after each step; it costs a full
        pass over the table.
        """
        self._live.check_invariants()
        self._revisions.check_invariants()
        queues, brokers = self._queues, self._brokers
        for topic, by_broker in queues.items():
            assert by_broker, f"{topic} kept with no queue data"
            for name, queue in by_broker.items():
                assert name in brokers and queue.broker_name == name, f"{topic}: {name}"
                assert topic in self._broker_topics[name], f"{topic} not indexed under {name}"
        assert self._broker_topics.keys() == brokers.keys(), "topic index and brokers differ"
        for name, indexed in self._broker_topics.items():
            assert all(name in queues.get(topic, ()) for topic in indexed), f"{name}: stale index"
        uses: dict[QueueData, int] = {}
        for by_broker in queues.values():
            for queue in by_broker.values():
                uses[queue] = uses.get(queue, 0) + 1
                assert self._queue_values[queue][0] is queue, "a queue value not interned"
        assert {q: n for q, (_, n) in self._queue_values.items()} == uses, "interning counts"
        weight, extra = 0, {}
        for name, rec in brokers.items():
            entry = entry_weight(rec.cluster, name, rec.zone, rec.addr_cluster,
                                 lambda key: self.filter_servers_of(*key))
            weight += len(self._broker_topics[name]) * entry
            if entry > 1:
                extra[name] = entry - 1
        assert (self._weights.weight, self._weights.extra) == (weight, extra), "weight ledger"
        assert self._weights.count == sum(map(len, queues.values())), "queue entry count"
        listed = set()
        for name, rec in brokers.items():
            assert rec.addrs, f"{name} kept with no address"
            assert set(rec.addr_cluster) == set(rec.addrs.values()), f"{name}: address clusters"
            member_of = {c for c, members in self._clusters.items() if name in members}
            assert member_of == set(rec.addr_cluster.values()), f"{name}: cluster membership"
            assert rec.cluster in member_of, f"{name}: BrokerData.cluster does not list it"
            for addr in rec.addrs.values():
                live = self._live.get(rec.addr_cluster[addr], addr)
                assert live is not None and name in live.names, f"{addr} of {name} not live"
                listed.add((rec.addr_cluster[addr], addr, name))
        assert {(live.cluster, live.addr, n) for live in self._live for n in live.names} == (
            listed), "live addresses list names that do not list them"
        assert all(members for members in self._clusters.values()), "empty cluster kept"
        assert all(key in self._live for key in self._filter_servers), "filter servers of no address"
        self._builder.check_invariants()

    def held(self) -> dict[str, int]:
        """How many of each kind of record the table holds (diagnostics and tests)."""
        topics, removed = self._revisions.remembered()
        return {"brokers": len(self._brokers), "addresses": len(self._live),
                "topics": len(self._queues), "queue_entries": self._weights.count,
                "queue_values": len(self._queue_values), "broker_data": len(self._builder),
                "topic_revisions": topics, "removed_topic_revisions": removed}

    # --- a replica's state (zns.core.state_dump) ----------------------------

    def exact_dump(self, state: TableState | None = None,
                   topic_revisions: list[tuple[str, int]] | None = None) -> TableDump:
        """Everything the table decides from, exactly: its state as `dump` gives it (a warm
        restart keeps only that), with the epoch, the revisions and each address's times.
        `state`: the last of `dump_in_steps` (or made of `queue_data_in_steps`'s), and
        `topic_revisions`: `topic_revisions_in_steps`'s joined, each with the table
        unchanged since its first step (None: read now)."""
        state = self.dump() if state is None else state
        revision, held, removed_revisions = self._revisions.dump(held=topic_revisions is None)
        return TableDump(state=state, epoch=self.epoch, revision=revision,
                         clocks=self._live.clocks(),
                         topic_revisions=held if topic_revisions is None else topic_revisions,
                         removed_revisions=removed_revisions)

    def topic_revisions_in_steps(self, work: int = DUMP_STEP_WORK) -> Iterator[
            list[tuple[str, int]]]:
        """Each topic's last revision, as `exact_dump` lists them, `work` topics a step (the
        last step may have none). The caller checks `changes` between steps, as
        `dump_in_steps` does: a revision changes only with it."""
        return self._revisions.topic_revisions_in_steps(work)

    @classmethod
    def from_exact_dump(cls, dump: TableDump) -> RouteTable:
        """A table holding exactly what `exact_dump` gave: it answers every later call as the
        dumped table does. Routes, weights, interned queue data, the topic index and the
        BrokerData are rebuilt from the records."""
        table = cls(dump.epoch)
        table._live.load(dump.state.addresses, dump.clocks)
        ch = table._take_records(dump.state, dict(dump.state.order_conf))
        table._builder.refresh(ch.stale_brokers)
        lists = SharedLists()
        table._revisions.load(dump.revision, dump.topic_revisions, dump.removed_revisions,
                              lambda topic: table._builder.build(topic, ch, lists))
        return table

    def broker_count(self) -> int:
        return len(self._brokers)

    def topic_count(self) -> int:
        return len(self._queues)

    # What zns.core.limits needs to know before a request grows the table.
    def address_count(self) -> int:
        return len(self._live)

    def has_address(self, cluster: str, addr: str) -> bool:
        return (cluster, addr) in self._live

    def has_broker(self, name: str) -> bool:
        return name in self._brokers

    def has_topic(self, topic: str) -> bool:
        return topic in self._queues

    def last_heartbeats(self) -> list[int]:
        """When each live address was last heard (ms), for /metrics: `list()` of a dict's
        values runs in one C call, so another thread reads it whole while the loop runs."""
        return [live.last_heartbeat for live in list(self._live)]

    def queue_count(self) -> int:
        """QueueData held, all topics: what memory grows with."""
        return self._weights.count

    def queue_weight(self) -> int:
        """Queue entries, each filter server, extra address and long name a route carries
        counted as more (zns.core.weights)."""
        return self._weights.weight

    def queue_weight_after(self, req: RegisterBroker) -> int:
        """`queue_weight` once `req` is applied, with the ledger's one formula.

        Conservative: an address the request displaces is still counted, and a
        registration that keeps the name's held topics (a slave's, an incremental
        one, one with an unchanged data_version) is counted with them.
        """
        name, key = req.broker_name, (req.cluster, req.broker_addr)
        held = self.broker_topic_count(name)
        if not req.incremental and not self.holds_same_version(req):
            topics = max(len(req.topics), held)
        else:
            topics = held + sum(not self.broker_has_topic(name, topic) for topic in req.topics)

        def servers(of: LiveKey) -> int:
            return len(req.filter_servers) if of == key else self.filter_servers_of(*of)

        rec = self._brokers.get(name)
        addrs = dict(rec.addr_cluster) if rec is not None else {}
        addrs[req.broker_addr] = req.cluster
        cluster = rec.cluster if rec is not None else req.cluster
        ledger = self._weights
        after = ledger.weight - ledger.of_name(name, held) + topics * entry_weight(
            cluster, name, req.zone, addrs, servers)
        # Other names listing the address show its new filter servers in their routes.
        for other in self.names_of(*key) - {name}:
            o = self._brokers[other]
            after += self.broker_topic_count(other) * (
                entry_weight(o.cluster, other, o.zone, o.addr_cluster, servers)
                - ledger.entry(other))
        return after

    def queue_weight_after_topic(self, topic: str, queues: list[QueueData]) -> int:
        """`queue_weight` once register_topic(topic, queues) is applied: each name that gets
        its first queue data in the route adds one entry as heavy as its others."""
        names = {q.broker_name for q in queues}
        return self._weights.weight + sum(self._weights.entry(name) for name in names
                                          if not self.broker_has_topic(name, topic))

    def names_of(self, cluster: str, addr: str) -> set[str]:
        """Broker names that list this address."""
        live = self._live.get(cluster, addr)
        return live.names if live is not None else set()

    def filter_servers_of(self, cluster: str, addr: str) -> int:
        return len(self._filter_servers.get((cluster, addr), ()))

    def holds_same_version(self, req: RegisterBroker) -> bool:
        """Whether `req`'s address already holds its id in its cluster with the same
        data_version: then step 4 only restores the listed topics the name lacks."""
        rec = self._brokers.get(req.broker_name)
        live = self._live.get(req.cluster, req.broker_addr)
        return (rec is not None and live is not None
                and rec.addrs.get(req.broker_id) == req.broker_addr
                and rec.addr_cluster.get(req.broker_addr) == req.cluster
                and live.data_version == req.data_version)

    def broker_topic_count(self, name: str) -> int:
        return len(self._broker_topics.get(name, ()))

    def writable_topic_count(self, name: str) -> int:
        """Topics whose queue data of this broker name has the write permission."""
        return sum(1 for topic in self._broker_topics.get(name, ())
                   if self._queues[topic][name].perm & PERM_WRITE)

    def broker_has_topic(self, name: str, topic: str) -> bool:
        """Whether this broker name has queue data in the topic's route."""
        return topic in self._broker_topics.get(name, ())

    # --- internals ----------------------------------------------------------

    def _apply_topics(self, name: str, req: RegisterBroker, ch: Changes) -> None:
        if not req.incremental:
            for topic in self._broker_topics[name] - req.topics.keys():
                self._remove_queue(topic, name, ch)
        for topic, cfg in req.topics.items():
            queue = QueueData(name, cfg.read_queues, cfg.write_queues, cfg.perm, cfg.sys_flag)
            self._set_queue(topic, queue, ch)

    def _restore_missing_topics(self, name: str, req: RegisterBroker, ch: Changes) -> None:
        """Step 4 for an unchanged data_version: only listed topics the name has no queue
        data in are applied (RocketMQ's isTopicConfigChanged). Those held stay as they are,
        so an admin's wipe_write_perm lasts; those missing, because an incremental
        registration created the name after a restart or an admin deleted the topic, come
        back at the broker's next periodic registration instead of never."""
        held = self._broker_topics[name]
        for topic, cfg in req.topics.items():
            if topic not in held:
                queue = QueueData(name, cfg.read_queues, cfg.write_queues, cfg.perm, cfg.sys_flag)
                self._set_queue(topic, queue, ch)

    def _set_queue(self, topic: str, queue: QueueData, ch: Changes) -> None:
        by_broker = self._queues.setdefault(topic, {})
        name = queue.broker_name
        old = by_broker.get(name)
        if old != queue:
            if old is None:
                self._weights.added(name)
                ch.reshaped.add(topic)
            else:
                self._release(old)
            by_broker[name] = self._intern(queue)
            self._broker_topics[name].add(topic)
            ch.topics.add(topic)
            ch.edited.setdefault(topic, set()).add(name)

    def _remove_queue(self, topic: str, name: str, ch: Changes) -> None:
        by_broker = self._queues[topic]
        self._release(by_broker.pop(name))
        self._weights.removed(name)
        if not by_broker:
            del self._queues[topic]
        self._broker_topics[name].discard(topic)
        ch.topics.add(topic)
        ch.edited.setdefault(topic, set()).add(name)
        ch.reshaped.add(topic)

    def _intern(self, queue: QueueData) -> QueueData:
        entry = self._queue_values.get(queue)
        if entry is None:
            self._queue_values[queue] = [queue, 1]
            return queue
        entry[1] += 1
        return entry[0]

    def _release(self, queue: QueueData) -> None:
        entry = self._queue_values[queue]
        entry[1] -= 1
        if entry[1] == 0:
            del self._queue_values[queue]

    def _reweigh(self, name: str) -> None:
        """Recount what one route entry of this broker name weighs (zns.core.weights): its
        addresses, names and filter servers are in every route of the name, so --max-queues
        bounds what the routes hold whatever the shape of the registrations."""
        rec = self._brokers.get(name)
        entry = 1
        if rec is not None and rec.addr_cluster:
            entry = entry_weight(rec.cluster, name, rec.zone, rec.addr_cluster,
                                 lambda key: self.filter_servers_of(*key))
        self._weights.reweigh(name, entry, len(self._broker_topics.get(name, ())))

    def _change_perm(self, name: str, new_perm) -> tuple[int, list[Event]]:
        ch = Changes()
        for topic in self._broker_topics.get(name, ()):
            queue = self._queues[topic][name]
            perm = new_perm(queue.perm)
            if perm != queue.perm:
                self._set_queue(topic, QueueData(
                    name, queue.read_queues, queue.write_queues, perm, queue.sys_flag
                ), ch)
        return len(ch.topics), self._commit(ch)

    def _remove_addr(self, rec: BrokerRecord, addr: str, reason: str, ch: Changes,
                     keep_name: bool = False) -> None:
        """Take one address off one broker name, as `unregister_broker` does; `keep_name`:
        a name left with no address keeps its record and queue data (another address is
        about to take the id: step 3)."""
        broker_id = rec.held_id(addr)
        cluster = rec.addr_cluster.pop(addr)
        del rec.addrs[broker_id]
        self._touch_broker(rec, ch, structural=True)
        ch.broker_events.append(self._broker_event(rec, broker_id, addr, cluster, "removed", reason))
        key = (cluster, addr)
        live = self._live.get(cluster, addr)
        if live is not None:
            live.names.discard(rec.name)
            if not live.names:
                self._live.remove(cluster, addr)
                if self._filter_servers.pop(key, None) is not None:
                    self._touch_broker(rec, ch)
        if cluster not in rec.addr_cluster.values():
            members = self._clusters[cluster]
            members.pop(rec.name, None)
            if not members:
                del self._clusters[cluster]
            if rec.cluster == cluster and rec.addr_cluster:
                # BrokerData.cluster must name a cluster that still lists this broker.
                rec.cluster = min(rec.addr_cluster.values())
                self._reweigh(rec.name)  # its name weight changed with it
            ch.structural = True
        if not rec.addrs and not keep_name:
            for topic in list(self._broker_topics[rec.name]):
                self._remove_queue(topic, rec.name, ch)
            del self._brokers[rec.name], self._broker_topics[rec.name]
            ch.structural = True  # (its cached BrokerData went with _touch_broker above)

    def _drop_liveness(self, live: Liveness, reason: str, ch: Changes) -> None:
        """Expiry: the address leaves every broker name that lists it."""
        for name in sorted(live.names):
            self._remove_addr(self._brokers[name], live.addr, reason, ch)
        self._live.remove(live.cluster, live.addr)

    def _touch_broker(self, rec: BrokerRecord, ch: Changes, structural: bool = False) -> None:
        """Every route of this broker may have changed; `structural`: its BrokerData did."""
        if structural:
            self._builder.forget(rec.name)
            ch.stale_brokers.add(rec.name)
            ch.structural = True
        self._reweigh(rec.name)
        ch.topics.update(self._broker_topics.get(rec.name, ()))

    def _broker_event(
        self, rec: BrokerRecord, broker_id: int, addr: str, cluster: str, change: str, reason: str
    ) -> BrokerEvent:
        return BrokerEvent(
            epoch=self.epoch, revision=0, cluster=cluster, broker_name=rec.name,
            broker_id=broker_id, broker_addr=addr, change=change, reason=reason,
        )

    def _build_route(self, topic: str, ch: Changes, lists: SharedLists) -> TopicRoute | None:
        return self._builder.build(topic, ch, lists)

    def _commit(self, ch: Changes) -> list[Event]:
        """Number the changes with one new revision and turn them into events."""
        self._builder.refresh(ch.stale_brokers)
        events = self._revisions.commit(ch, self._build_route)
        if events or ch.structural:
            self.changes += 1
        return events


def filter_zone(route: TopicRoute, zone: str) -> TopicRoute:
    """RocketMQ's zone mode (§5): brokers of `zone` (any case, as Java compares it:
    `java_equals_ignore_case`) and brokers with no master."""
    brokers = [
        b for b in route.brokers
        if java_equals_ignore_case(b.zone, zone) or MASTER_ID not in b.addrs
    ]
    names = {b.broker_name for b in brokers}
    addrs = {a for b in brokers for a in b.addrs.values()}
    return TopicRoute(
        topic=route.topic,
        queues=[q for q in route.queues if q.broker_name in names],
        brokers=brokers,
        filter_servers={a: s for a, s in route.filter_servers.items() if a in addrs},
        order_conf=route.order_conf,
    )


def java_equals_ignore_case(a: str, b: str) -> bool:
    """Java's `String.equalsIgnoreCase` (commons-lang's `StringUtils.equalsIgnoreCase`, which
    Java's zone filter calls, hands two Strings to it): as many UTF-16 chars, then character
    by character (Java 16 and later take a surrogate pair as its one character) each pair
    equal, or equal once both are upper-cased, or once those are lower-cased again -- with
    Java's one-character case mappings. So `Straße` is not `STRASSE` (ß has no one-character
    upper case), the Turkish dotless ı equals `I` and `i`, and Deseret 𐐀 equals 𐐨. Python's
    `casefold` compares whole strings with multi-character mappings and says otherwise."""
    if len(a.encode("utf-16-le")) != len(b.encode("utf-16-le")) or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        upper_x, upper_y = _java_upper(x), _java_upper(y)
        if upper_x != upper_y and _java_lower(upper_x) != _java_lower(upper_y):
            return False
    return True


def _java_upper(char: str) -> str:
    """`Character.toUpperCase`: the one-character (simple) upper case, else the character.
    Python's `upper` is the full mapping; where that is longer than one character, the
    simple one is the title case when that is one character (the Greek letters with iota
    subscript: ᾳ -> ᾼ), otherwise there is none (ß, ŉ, ǰ, the ligatures ﬀ-ﬆ)."""
    for mapped in (char.upper(), char.title()):
        if len(mapped) == 1:
            return mapped
    return char


def _java_lower(char: str) -> str:
    """`Character.toLowerCase`: the simple lower case. Only İ (U+0130) has a full lower
    case longer than one character (i and a combining dot); its simple one is `i`."""
    return char.lower()[0]

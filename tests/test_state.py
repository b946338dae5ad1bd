"""The state machine (zns.core.state): one way in, deterministic, its whole state dumped and loaded.

A seeded log of thousands of commands -- every write request with its `now` and
connection, expiry steps, connection closes, stall shifts, peer suspicions -- is
applied to machines that must agree on every outcome (the reply, the events, what a
remoting reply needs) and on their dumps: two fresh machines; a machine fed the log
through msgspec (as a replica would be); a machine loaded from another's dump midway;
and processes with other hash seeds.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from zns.core.errors import ErrorReply, UsageError
from zns.core.limits import Limits
from zns.core.schema import (
    ORDER_TOPIC_CONFIG, AddWritePerm, DataVersion, Heartbeat, KvDelete, KvPut, RegisterBroker,
    TopicConfig, WipeWritePerm, tag_of,
)
from zns.core.state import (
    WRITE_REQUESTS,
    AnyCommand,
    CloseConnections,
    Expire,
    Outcome,
    Restore,
    ShiftDeadlines,
    StateMachine,
    Suspect,
    Write,
    decode_command,
)
from zns.core.state_dump import StateDump
from zns.drivers.kv_file import KvStore

pytestmark = pytest.mark.timeout(120)

EPOCH = "0123456789abcdef"
CLUSTERS = ["c1", "c2"]
NAMES = ["broker-a", "broker-b", "broker-c", "broker-d"]
ADDRS = [f"10.0.0.{i}:10911" for i in range(1, 7)]
TOPICS = [f"T{i}" for i in range(24)]
# Small limits, so that refusals are in the log too.
LIMITS = Limits(max_topics=20, max_kv_entries=4, max_kv_namespaces=3, max_queues=60)


def random_log(seed: int, steps: int) -> list[AnyCommand]:
    """`steps` commands, `now` moving forward, over a few brokers, topics and connections."""
    rnd = random.Random(seed)
    now = 1_000
    log: list[AnyCommand] = []

    def broker() -> dict[str, Any]:
        return {"cluster": rnd.choice(CLUSTERS), "broker_name": rnd.choice(NAMES),
                "broker_id": rnd.choice([0, 0, 1, 2]), "broker_addr": rnd.choice(ADDRS)}

    def connection() -> int | None:
        return rnd.choice([None, None, 1, 2, 3, 4])

    def write(fields: dict[str, Any]) -> Write:
        kind = next(k for k in WRITE_REQUESTS if tag_of(k) == fields["op"])
        request = msgspec.convert({k: v for k, v in fields.items() if k != "op"}, kind)
        return Write(request=request, now=now, connection=connection())

    for step in range(steps):
        now += rnd.choice([0, 1, 50, 1_000, 7_000])
        roll = rnd.random()
        if roll < 0.25:
            topics = {t: {"read_queues": rnd.randint(1, 8), "write_queues": rnd.randint(1, 8),
                          "perm": rnd.choice([2, 4, 6]), "sys_flag": rnd.choice([0, 0, 1, 2])}
                      for t in rnd.sample(TOPICS, rnd.randint(0, 5))}
            command: AnyCommand = write({
                "op": "register_broker", **broker(), "topics": topics,
                "ha_addr": rnd.choice(["", "10.0.0.9:10912"]), "zone": rnd.choice(["", "z1"]),
                "data_version": {"state": rnd.randint(0, 2), "counter": rnd.randint(0, 3)},
                "filter_servers": rnd.sample(["10.0.1.1:1", "10.0.1.2:1"], rnd.randint(0, 2)),
                "heartbeat_timeout_ms": rnd.choice([5_000, 30_000, 120_000]),
                "incremental": rnd.random() < 0.3, "id": step})
        elif roll < 0.45:
            command = write({"op": "heartbeat", **broker(), "id": step,
                             "data_version": {"state": rnd.randint(0, 2),
                                              "counter": rnd.randint(0, 3)}})
        elif roll < 0.5:
            command = write({"op": "unregister_broker", **broker(), "id": step})
        elif roll < 0.54:
            command = write({"op": rnd.choice(["wipe_write_perm", "add_write_perm"]),
                             "broker_name": rnd.choice(NAMES), "id": step})
        elif roll < 0.58:
            command = write({"op": "delete_topic", "topic": rnd.choice(TOPICS),
                             "cluster": rnd.choice(["", *CLUSTERS]), "id": step})
        elif roll < 0.62:
            command = write({"op": "register_topic", "topic": rnd.choice(TOPICS), "id": step,
                             "queues": [{"broker_name": n, "read_queues": 4, "write_queues": 4,
                                         "perm": 6, "sys_flag": 0}
                                        for n in rnd.sample(NAMES, rnd.randint(1, 2))]})
        elif roll < 0.7:
            namespace = rnd.choice([ORDER_TOPIC_CONFIG, "ns1", "ns2", "ns3", "ns4"])
            key = rnd.choice(TOPICS[:4] if namespace == ORDER_TOPIC_CONFIG else ["k1", "k2"])
            if rnd.random() < 0.5:
                command = write({"op": "kv_put", "namespace": namespace, "key": key,
                                 "value": rnd.choice(["broker-a:4", "broker-b:8", "v"]),
                                 "id": step})
            else:
                command = write({"op": "kv_delete", "namespace": namespace, "key": key,
                                 "id": step})
        elif roll < 0.82:
            command = Expire(now=now)
        elif roll < 0.9:
            command = CloseConnections(connections=rnd.sample([1, 2, 3, 4, 5], rnd.randint(1, 2)))
        elif roll < 0.95:
            command = ShiftDeadlines(stall_ms=rnd.choice([10, 2_000]))
        else:
            command = Suspect(cluster=rnd.choice(CLUSTERS), addr=rnd.choice(ADDRS),
                              grace_ms=rnd.choice([0, 1_000]), now=now)
        log.append(command)
    return log


def fresh() -> StateMachine:
    return StateMachine(KvStore(None), epoch=EPOCH, limits=LIMITS)


def apply(machine: StateMachine, command: AnyCommand) -> Outcome | tuple[str, str]:
    """The outcome, or the refusal as (its type, its message): both must agree."""
    try:
        return machine.apply(command)
    except ErrorReply as exc:
        return type(exc).__name__, str(exc)


def test_two_machines_fed_one_log_agree_on_every_outcome_and_on_their_dumps():
    log = random_log(seed=7, steps=4_000)
    a, b = fresh(), fresh()
    outcomes = []
    for command in log:
        outcome = apply(a, command)
        assert outcome == apply(b, command)
        outcomes.append(outcome)
    a.table.check_invariants()
    assert a.dump() == b.dump()
    # The log exercised what it is meant to: events, refusals, ties, removals of each kind.
    kinds = {type(o) for o in outcomes}
    assert Outcome in kinds and tuple in kinds
    reasons = {e.reason for o in outcomes if isinstance(o, Outcome) for e in o.events
               if getattr(e, "change", "") == "removed"}
    assert {"expired", "disconnected", "unregistered", "displaced"} <= reasons
    assert any(isinstance(o, Outcome) and o.order_conf for o in outcomes)
    assert any(isinstance(o, Outcome) and o.shortened for o in outcomes)
    assert a.table.revision > 500


def test_a_log_replays_through_msgspec_as_a_replica_would_take_it():
    log = random_log(seed=11, steps=2_000)
    a, replica = fresh(), fresh()
    for command in log:
        entry = msgspec.msgpack.encode(command)
        assert apply(a, command) == apply(replica, decode_command(entry))
    assert a.dump() == replica.dump()


@pytest.mark.parametrize("seed", [3, 5])
def test_a_machine_loaded_from_a_dump_midway_answers_the_rest_of_the_log_alike(seed):
    log = random_log(seed=seed, steps=4_000)
    a = fresh()
    for command in log[:2_500]:
        apply(a, command)
    # A stall and a peer's hint just before the dump: the dump carries stall credit and
    # suspicions, not only what a registration sets.
    a.apply(ShiftDeadlines(stall_ms=300))
    now = max(getattr(command, "now", 0) for command in log[:2_500])
    for cluster in CLUSTERS:
        for addr in ADDRS:
            if a.table.liveness(cluster, addr) is not None:
                a.apply(Suspect(cluster=cluster, addr=addr, grace_ms=0, now=now))
    dumped = msgspec.msgpack.decode(a.dump(), type=StateDump)
    assert any(x.stall_credit for x in dumped.table.clocks)
    assert any(x.suspect_deadline is not None for x in dumped.table.clocks)
    assert dumped.ties and dumped.emptied and dumped.table.removed_revisions
    # Made in steps of a few entries, the dump is the same bytes, every record encoded
    # over several steps.
    assert list(a.dump_in_steps(work=5))[-1] == a.dump()
    b = StateMachine.load(a.dump(), KvStore(None), limits=LIMITS)
    assert b.dump() == a.dump()
    b.table.check_invariants()
    for command in log[2_500:]:
        assert apply(a, command) == apply(b, command)
    assert a.dump() == b.dump()
    # Insertion orders came across: the remoting bodies are written from them.
    assert [list(v) for v in a.table.topic_queue_table().values()] == [
        list(v) for v in b.table.topic_queue_table().values()]
    assert list(a.table.topic_queue_table()) == list(b.table.topic_queue_table())
    assert a.table.broker_names() == b.table.broker_names()
    assert {c: list(n) for c, n in a.table.cluster_members().items()} == {
        c: list(n) for c, n in b.table.cluster_members().items()}


def test_load_takes_only_an_empty_kv_store_and_refuses_what_is_not_a_dump():
    a = fresh()
    kv = KvStore(None)
    kv.put("ns", "k", "v")
    with pytest.raises(UsageError, match="empty store"):
        StateMachine.load(a.dump(), kv)
    with pytest.raises(msgspec.DecodeError):
        StateMachine.load(b"not a dump", KvStore(None))


def test_the_order_configurations_held_at_start_are_in_the_routes_and_the_dump():
    kv = KvStore(None)
    kv.put(ORDER_TOPIC_CONFIG, "T1", "broker-a:4")
    machine = StateMachine(kv, epoch=EPOCH)
    dump = msgspec.msgpack.decode(machine.dump(), type=StateDump)
    assert dump.table.state.order_conf == [("T1", "broker-a:4")]
    assert dump.kv == [(ORDER_TOPIC_CONFIG, [("T1", "broker-a:4")])]


_DIGEST = """
import hashlib, sys
sys.path.insert(0, {tests!r})
import test_state
machine = test_state.fresh()
outcomes = [repr(test_state.apply(machine, c)) for c in test_state.random_log(13, 1_500)]
print(hashlib.sha256(machine.dump() + repr(outcomes).encode()).hexdigest())
"""


@pytest.mark.timeout(120)
def test_outcomes_and_dumps_do_not_depend_on_the_hash_seed():
    code = _DIGEST.format(tests=str(Path(__file__).parent))
    digests = set()
    for seed in ("1", "2", "3"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=100, env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1
    assert len(hashlib.sha256().hexdigest()) == len(digests.pop())


def test_a_warm_restored_table_dumps_its_confirmation_deadlines_exactly():
    a = fresh()
    for command in random_log(seed=17, steps=300):
        apply(a, command)
    assert a.table.held()["addresses"] > 0
    restored = fresh()
    state = a.table.dump()
    apply(restored, Restore(table=state, confirm_within_ms=[5_000] * len(state.addresses),
                            now=50_000))
    b = StateMachine.load(restored.dump(), KvStore(None), limits=LIMITS)
    assert b.dump() == restored.dump()
    outcomes = [apply(m, Expire(now=56_000)) for m in (restored, b)]
    assert outcomes[0] == outcomes[1]
    assert {e.reason for e in outcomes[0].events if getattr(e, "change", "") == "removed"} == {
        "not_confirmed"}


def test_a_restore_is_a_command_a_replica_replays_and_a_bad_one_changes_nothing():
    a = fresh()
    for command in random_log(seed=23, steps=300):
        apply(a, command)
    state = a.table.dump()
    windows = [1_000 * (i + 1) for i in range(len(state.addresses))]
    restore = Restore(table=state, confirm_within_ms=windows, now=7_000)
    primary, replica = fresh(), fresh()
    assert apply(primary, restore) == Outcome()
    apply(replica, decode_command(msgspec.msgpack.encode(restore)))
    assert primary.dump() == replica.dump()
    # The order configurations are the KV store's (empty here), not the dump's.
    assert primary.table.dump() == msgspec.structs.replace(state, order_conf=[])
    # Each address gets its own window, in the dump's order.
    first, last = state.addresses[0], state.addresses[-1]
    assert primary.table.liveness(first.cluster, first.addr).confirm_by == 8_000
    assert primary.table.liveness(last.cluster, last.addr).confirm_by == 7_000 + windows[-1]
    empty = fresh().dump()
    for bad in (Restore(table=state, confirm_within_ms=windows[:-1], now=7_000),
                Restore(table=msgspec.structs.replace(state, topics=state.topics * 2),
                        confirm_within_ms=windows, now=7_000)):
        machine = fresh()
        with pytest.raises(ValueError):
            machine.apply(bad)
        assert machine.dump() == empty


def test_a_machine_loaded_from_a_dump_remembers_at_most_its_bound_of_emptied_namespaces():
    # A dump made under a larger bound (another configuration) holds more emptied
    # namespaces than the loader's bound: the loader keeps the latest, as the live path
    # (StateMachine._remember_emptied) and a warm restore do. Before, it kept them all.
    larger = StateMachine(KvStore(None), epoch=EPOCH, limits=Limits(max_kv_namespaces=5))
    for namespace in ["a", "b", "c", "a"]:  # a emptied again: the latest
        for request in (KvPut(id=1, namespace=namespace, key="k", value="v"),
                        KvDelete(id=1, namespace=namespace, key="k")):
            larger.apply(Write(request=request, now=1_000, connection=1))
    assert larger.emptied_namespaces() == ["b", "c", "a"]
    smaller = StateMachine.load(larger.dump(), KvStore(None), limits=Limits(max_kv_namespaces=2))
    assert smaller.emptied_namespaces() == ["c", "a"]  # the oldest, b, forgotten
    assert not smaller.emptied("b")


def fleet_log(seed: int, steps: int) -> list[AnyCommand]:
    """A fleet re-registering mostly unchanged (what `Renew` stands for), with each field a
    registration carries changed now and then, and everything else that moves liveness,
    ties and routes in between: the random log's commands."""
    rnd = random.Random(seed)
    others = random_log(seed, steps)
    now = 1_000
    # Per broker address: its registration's fields, changed by the steps below.
    fleet: dict[tuple[str, str], dict[str, Any]] = {}
    for i, addr in enumerate(ADDRS):
        name = NAMES[i % len(NAMES)]
        fleet[(CLUSTERS[i % 2], addr)] = {
            "cluster": CLUSTERS[i % 2], "broker_name": name, "broker_id": i // len(NAMES),
            "broker_addr": addr, "ha_addr": "", "zone": "", "filter_servers": [],
            "data_version": {"state": 0, "counter": 0}, "heartbeat_timeout_ms": 30_000,
            "incremental": False,
            "topics": {t: {"read_queues": 4, "write_queues": 4, "perm": 6, "sys_flag": 0}
                       for t in rnd.sample(TOPICS, rnd.randint(0, 5))}}
    connections = {key: rnd.choice([None, 1, 2]) for key in fleet}
    log: list[AnyCommand] = []
    for step in range(steps):
        now += rnd.choice([0, 1, 1_000, 7_000])
        key = rnd.choice(list(fleet))
        fields = fleet[key]
        roll = rnd.random()
        if roll < 0.2:  # anything else, from the random log
            other = others[step]
            log.append(msgspec.structs.replace(other, now=now)
                       if hasattr(other, "now") else other)
            continue
        if roll < 0.4:  # one field changed, for good
            what = rnd.choice(["zone", "ha_addr", "filter_servers", "version", "version_topics",
                               "timeout", "topic_perm", "topics", "connection", "broker_id"])
            if what == "zone":
                fields["zone"] = rnd.choice(["", "z1"])
            elif what == "ha_addr":
                fields["ha_addr"] = rnd.choice(["", "10.0.0.9:10912"])
            elif what == "filter_servers":
                fields["filter_servers"] = rnd.sample(["10.0.1.1:1", "10.0.1.2:1"],
                                                      rnd.randint(0, 2))
            elif what in ("version", "version_topics"):
                fields["data_version"] = {"state": rnd.randint(0, 1),
                                          "counter": rnd.randint(0, 3)}
                if what == "version_topics":
                    fields["topics"] = {t: {"read_queues": 4, "write_queues": 4, "perm": 6,
                                            "sys_flag": 0}
                                        for t in rnd.sample(TOPICS, rnd.randint(0, 5))}
            elif what == "timeout":
                fields["heartbeat_timeout_ms"] = rnd.choice([5_000, 30_000])
            elif what == "topic_perm" and fields["topics"]:
                topic = rnd.choice(list(fields["topics"]))
                fields["topics"][topic] = {**fields["topics"][topic], "perm": rnd.choice([4, 6])}
            elif what == "topics":
                fields["topics"][rnd.choice(TOPICS)] = {"read_queues": 8, "write_queues": 8,
                                                        "perm": 6, "sys_flag": 0}
            elif what == "connection":
                connections[key] = rnd.choice([None, 1, 2, 3])
            else:
                fields["broker_id"] = rnd.choice([0, 1])
        if roll < 0.85:
            request = msgspec.convert({**fields, "id": step,
                                       "incremental": rnd.random() < 0.1}, RegisterBroker)
            log.append(Write(request=request, now=now, connection=connections[key]))
        else:
            log.append(Write(request=Heartbeat(
                id=step, cluster=fields["cluster"], broker_name=fields["broker_name"],
                broker_id=fields["broker_id"], broker_addr=fields["broker_addr"],
                data_version=msgspec.convert(fields["data_version"], DataVersion)),
                now=now, connection=connections[key]))
    return log


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_replica_fed_the_renewals_instead_of_the_registrations_holds_the_same_state(seed):
    # The state process replicates a registration that changed nothing but liveness as
    # the `Renew` its outcome carries. One machine applies the log; the other applies each
    # registration's renewal instead, through msgspec as a replica takes it: after every
    # step the outcomes (reply, events, what a remoting reply needs) and the dumps agree.
    primary, replica = fresh(), fresh()
    renewals = registrations = 0
    kinds: set[tuple[bool, bool, bool]] = set()
    for command in fleet_log(seed, 3_000):
        before = primary.table.revision
        outcome = apply(primary, command)
        renewal = outcome.renewal if isinstance(outcome, Outcome) else None
        if type(command) is Write and type(command.request) is RegisterBroker:
            registrations += 1
        if renewal is not None:
            renewals += 1
            assert not outcome.events and primary.table.revision == before
            assert len(msgspec.msgpack.encode(renewal)) < 200
            live = replica.table.liveness(renewal.cluster, renewal.broker_addr)
            kinds.add((live.data_version != renewal.data_version, renewal.broker_id != 0,
                       renewal.connection is not None))
            command = decode_command(msgspec.msgpack.encode(renewal))
        assert apply(replica, command) == outcome
        assert replica.dump() == primary.dump()
        assert replica.changes == primary.changes
    replica.table.check_invariants()
    # Many registrations were renewals, and so were ones of each kind: with another
    # DataVersion, of a slave, over remoting.
    assert renewals > registrations // 3
    assert {k[0] for k in kinds} == {k[1] for k in kinds} == {k[2] for k in kinds} == {
        False, True}


def test_a_registration_that_changes_anything_else_is_replicated_whole():
    machine = fresh()
    fields: dict[str, Any] = {
        "cluster": "c1", "broker_name": "broker-a", "broker_id": 0, "broker_addr": ADDRS[0],
        "topics": {"T1": {"read_queues": 4, "write_queues": 4, "perm": 6, "sys_flag": 0}}}

    def register(connection: int | None = 1, **changed: Any) -> Outcome:
        request = msgspec.convert({**fields, **changed, "id": 1}, RegisterBroker)
        return machine.apply(Write(request=request, now=1_000, connection=connection))

    assert register().renewal is None  # new
    renewal = register().renewal
    assert renewal is not None and renewal.connection == 1
    assert register(connection=None).renewal is not None  # a tie moved: liveness
    assert register(data_version={"state": 0, "counter": 1}).renewal is not None
    for changed in ({"zone": "z1"}, {"ha_addr": "10.0.0.9:1"},
                    {"filter_servers": ["10.0.1.1:1"]},
                    {"topics": {"T2": fields["topics"]["T1"]}}):
        assert register(**changed).renewal is None, changed
        register()  # back as it was
    # An admin's wipe lasts through a registration with the same DataVersion (a renewal),
    # not through one with another (it rewrites the queue data).
    machine.apply(Write(request=WipeWritePerm(id=2, broker_name="broker-a"), now=1_000))
    assert register().renewal is not None
    assert register(data_version={"state": 0, "counter": 2}).renewal is None
    # A renewal of what the machine does not hold is refused, changing nothing.
    dump = machine.dump()
    with pytest.raises(UsageError):
        machine.apply(msgspec.structs.replace(renewal, broker_addr=ADDRS[1]))
    assert machine.dump() == dump


def test_a_forked_copy_moves_its_kv_entries_into_a_store_of_its_own():
    # A forked worker's machine (zns.drivers.worker.Forked): the KV store the fork copied is
    # the state process's file; from the move on, the copy reads and writes its own.
    machine = fresh()
    for command in random_log(4, 300):
        apply(machine, command)
    shared = machine.kv
    before = machine.dump()
    assert shared.count() > 0
    own = KvStore(None)
    machine.move_kv(own)
    assert machine.kv is own and machine.dump() == before
    assert [(ns, own.list(ns)) for ns in own.namespaces()] == [
        (ns, shared.list(ns)) for ns in shared.namespaces()]
    namespace, key = next((ns, k) for ns in own.namespaces() for k in own.list(ns))
    machine.apply(Write(request=KvPut(id=1, namespace=namespace, key=key, value="moved"), now=0))
    assert own.get(namespace, key) == "moved" != shared.get(namespace, key)
    with pytest.raises(UsageError, match="empty store"):
        machine.move_kv(own)  # not empty


def registration(connection: int | None, **fields: Any) -> Write:
    request = RegisterBroker(id=1, cluster="c1", broker_name="broker-a", broker_id=0,
                             broker_addr=ADDRS[0], topics={"T1": TopicConfig(4, 4, 6, 0)},
                             data_version=DataVersion(1, 2, 3))
    return Write(request=msgspec.structs.replace(request, **fields), now=1_000,
                 connection=connection)


def test_a_remoting_heartbeat_of_a_broker_registered_over_zns1_reports_its_data_version():
    # QUERY_DATA_VERSION answers from it, though the heartbeat keeps nothing alive.
    machine = fresh()
    machine.apply(registration(None))
    heartbeat = Heartbeat(id=2, cluster="c1", broker_name="broker-a", broker_id=0,
                          broker_addr=ADDRS[0], data_version=DataVersion(9, 9, 9))
    outcome = machine.apply(Write(request=heartbeat, now=2_000, connection=7))
    assert outcome.data_version == DataVersion(1, 2, 3)
    assert machine.apply(Write(request=heartbeat, now=2_000)).data_version is None  # ZNS/1


def test_giving_back_write_perm_makes_the_route_events():
    machine = fresh()
    machine.apply(registration(None))
    wiped = machine.apply(Write(request=WipeWritePerm(id=2, broker_name="broker-a"), now=1_000))
    added = machine.apply(Write(request=AddWritePerm(id=3, broker_name="broker-a"), now=1_000))
    assert wiped.events and added.events
    assert [type(e) for e in added.events] == [type(e) for e in wiped.events]


def test_deleting_a_key_of_another_namespace_leaves_the_order_configuration_of_its_topic():
    machine = fresh()
    machine.apply(registration(None))
    machine.apply(Write(request=KvPut(id=2, namespace=ORDER_TOPIC_CONFIG, key="T1",
                                      value="broker-a:4"), now=1_000))
    machine.apply(Write(request=KvPut(id=3, namespace="ns1", key="T1", value="v"), now=1_000))
    before = machine.table.exact_dump()
    outcome = machine.apply(Write(request=KvDelete(id=4, namespace="ns1", key="T1"), now=1_000))
    assert outcome.events == [] and machine.table.exact_dump() == before


def test_a_change_and_then_an_emptied_namespace_never_bring_the_change_count_back():
    # The warm restart's dump is written again whenever the count differs from the one it was
    # written at (zns.core.warm.DumpSchedule): a count that came back would lose both changes.
    machine = fresh()
    machine.apply(registration(None))
    machine.apply(Write(request=KvPut(id=2, namespace="ns1", key="k", value="v"), now=1_000))
    written = machine.changes
    machine.apply(registration(None, topics={"T1": TopicConfig(4, 4, 6, 0),
                                             "T2": TopicConfig(4, 4, 6, 0)}))
    machine.apply(Write(request=KvDelete(id=3, namespace="ns1", key="k"), now=1_000,
                        connection=7))  # over remoting: "ns1" is remembered emptied
    assert machine.emptied("ns1") and machine.changes != written

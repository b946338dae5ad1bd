"""Warm restarts, without sockets: the state dump's round trip, the confirmation period of
restored brokers, unusable dumps, the write schedule and the file driver
(zns.core.warm, zns.core.table_state, zns.drivers.state_file)."""

from __future__ import annotations

import logging
import os
import random
import threading
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_remoting_service import register_cmd, req
from zns.core import warm
from zns.core.errors import ConfigError
from zns.core.limits import Limits
from zns.core.remoting.handler import Connection, RemotingService
from zns.core.routes import RouteTable
from zns.core.schema import ORDER_TOPIC_CONFIG, DataVersion, RegisterBroker, TopicConfig
from zns.core.service import NameService
from zns.core.state import MAX_DUMP_RESTARTS
from zns.core.table_state import TableState
from zns.drivers import state_file
from zns.drivers.kv_file import KvStore

from helpers import examples, records_here, register_fields, zns1, zns1_events, zns1_ok

EPOCH = "0123456789abcdef"
GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO = 105, 106
GET_ALL_TOPIC_LIST, GET_TOPICS_BY_CLUSTER = 206, 224
CONFIRM_MS = warm.ROCKETMQ_REGISTER_PERIOD_MS + warm.REMOTING_CONFIRM_MARGIN_MS


def new_service(kv: KvStore | None = None, epoch: str = EPOCH) -> NameService:
    return NameService(kv or KvStore(None), epoch=epoch, started_at_ms=0)


def remoting(service: NameService) -> RemotingService:
    return RemotingService(service, order_message_enable=True)


def random_service(seed: int, steps: int = 400) -> tuple[NameService, KvStore]:
    """A table built by random requests over both protocols: names and topics from pools
    large enough for Java hash buckets to collide (the bodies' orders depend on insertion
    order there), addresses that move between ids and clusters, zones, filter servers,
    order configurations, removals and write permissions."""
    rng = random.Random(seed)
    kv = KvStore(None)
    service = new_service(kv)
    rs = remoting(service)
    names = [f"broker-{i}" for i in range(40)]
    topics = [f"Topic{i}" for i in range(120)]
    addrs = [f"10.0.{i // 50}.{i % 50}:10911" for i in range(60)]
    clusters = ["DefaultCluster", "c2", "c3"]
    for step in range(steps):
        now = 1000 + step
        name, addr, cluster = rng.choice(names), rng.choice(addrs), rng.choice(clusters)
        broker_id = rng.choice([0, 0, 0, 1, 2, 16])
        chosen = {t: {"read": rng.choice([4, 8]), "write": rng.choice([4, 8]),
                      "perm": rng.choice([6, 6, 2])} for t in rng.sample(topics, rng.randint(0, 12))}
        op = rng.random()
        if op < 0.35:
            rs.handle(register_cmd(broker_id, addr, chosen, name=name, cluster=cluster,
                                   counter=rng.randint(0, 3)), Connection(rng.randint(1, 30), "10.0.0.9"), now)
        elif op < 0.65:
            fields = register_fields(name, broker_id, addr, cluster, topics={
                t: {"read_queues": c["read"], "write_queues": c["write"], "perm": c["perm"]}
                for t, c in chosen.items()})
            fields.update(zone=rng.choice(["", "z1", "Z2"]), ha_addr=rng.choice(["", "10.1.0.1:1"]),
                          filter_servers=rng.choice([[], [], ["10.9.0.1:1", "10.9.0.2:1"]]),
                          heartbeat_timeout_ms=rng.choice([10_000, 60_000, 120_000]),
                          data_version={"state": 0, "timestamp": 0, "counter": rng.randint(0, 3)})
            zns1(service, "register_broker", now, id=1, **fields)
        elif op < 0.72:
            zns1(service, "unregister_broker", now, id=1, cluster=cluster, broker_name=name,
                 broker_id=broker_id, broker_addr=addr)
        elif op < 0.78:
            zns1(service, "delete_topic", now, id=1, topic=rng.choice(topics))
        elif op < 0.82:
            zns1(service, "wipe_write_perm", now, id=1, broker_name=name)
        elif op < 0.85:
            zns1(service, "add_write_perm", now, id=1, broker_name=name)
        elif op < 0.92:
            zns1(service, "kv_put", now, id=1, namespace=ORDER_TOPIC_CONFIG,
                 key=rng.choice(topics), value=f"{name}:{rng.randint(1, 8)}")
        elif op < 0.95:
            zns1(service, "kv_delete", now, id=1, namespace=ORDER_TOPIC_CONFIG,
                 key=rng.choice(topics))
        else:
            held = service.broker_names()
            if held:
                zns1(service, "register_topic", now, id=1, topic=rng.choice(topics), queues=[
                    {"broker_name": n, "read_queues": 4, "write_queues": 4, "perm": 6,
                     "sys_flag": 0} for n in rng.sample(held, min(len(held), 3))])
    return service, kv


def round_trip(service: NameService, kv: KvStore, now: int = 50_000) -> NameService:
    """What a restarted server holds: the dump through its bytes into a new service that
    shares the (durable) KV store."""
    data = warm.encode_dump(warm.dump(service, written_ms=123))
    restored = new_service(kv, epoch="fedcba9876543210")
    warm.restore(restored, warm.decode_dump(data), now)
    return restored


def body(service: NameService, code: int, ext: dict[str, str] | None = None,
         version: int = 479) -> bytes:
    reply, _ = remoting(service).handle(req(code, ext, version=version),
                                        Connection(99, "127.0.0.1"), 60_000)
    assert reply is not None
    return msgspec.msgpack.encode([reply.code, reply.remark, reply.body])


def remoting_bodies(service: NameService) -> list[bytes]:
    out = [body(service, GET_BROKER_CLUSTER_INFO), body(service, GET_ALL_TOPIC_LIST)]
    for cluster in ("DefaultCluster", "c2", "c3"):
        out.append(body(service, GET_TOPICS_BY_CLUSTER, {"cluster": cluster}))
    for topic in sorted(service.table.routes()):
        for version in (479, 200):  # the standard and the legacy JSON forms
            out.append(body(service, GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, version))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_restored_table_is_the_dumped_one_field_by_field_and_byte_by_byte(seed):
    service, kv = random_service(seed)
    assert service.table.topic_count() > 10 and service.table.broker_count() > 5
    restored = round_trip(service, kv)
    restored.table.check_invariants()
    assert restored.table.dump() == service.table.dump()  # every field, in every order
    assert restored.table.routes() == service.table.routes()
    assert restored.broker_table() == service.broker_table()
    assert restored.cluster_table() == service.cluster_table()
    for live in service.table.live_brokers(0):
        held = restored.table.liveness(live.cluster, live.broker_addr)
        assert held is not None and held.data_version == live.data_version
        assert held.timeout_ms == live.timeout_ms
        assert held.ha_addr == service.table.liveness(live.cluster, live.broker_addr).ha_addr
    assert remoting_bodies(restored) == remoting_bodies(service)
    assert restored.epoch != service.epoch and restored.revision == 1


@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 250))
def test_any_table_survives_the_round_trip(seed, steps):
    service, kv = random_service(seed, steps)
    restored = round_trip(service, kv)
    restored.table.check_invariants()
    assert restored.table.dump() == service.table.dump()
    assert restored.table.routes() == service.table.routes()


def test_the_order_configurations_restored_are_the_kv_stores():
    """The KV store is written before any dump: a value changed after the last dump wins."""
    service, kv = random_service(1)
    state = warm.dump(service, written_ms=0)
    topic = next(iter(service.table.routes()))
    kv.put(ORDER_TOPIC_CONFIG, topic, "after-the-dump:4")
    restored = new_service(kv)
    warm.restore(restored, state, 5_000)
    assert restored.table.route(topic).order_conf == "after-the-dump:4"


def register_both(service: NameService) -> None:
    """broker-r registered over remoting (120 s timeout), broker-z over ZNS/1 (10 s)."""
    remoting(service).handle(register_cmd(0, "10.0.0.1:10911", {"TopicR": {}}, name="broker-r"),
                             Connection(1, "10.0.0.1"), 1000)
    zns1_ok(service, "register_broker", 1000, id=1, heartbeat_timeout_ms=10_000,
            **register_fields("broker-z", 0, "10.0.0.2:10911", "DefaultCluster",
                              topics={"TopicZ": {}}))


def removals(frames: Any) -> list[tuple[str, str]]:
    from zns.core.schema import BrokerEvent, decode_event
    events = [decode_event(body) for _, body in frames]
    return [(e.broker_name, e.reason) for e in events if isinstance(e, BrokerEvent)]


def test_unconfirmed_brokers_are_removed_after_their_registration_period():
    service = new_service()
    register_both(service)
    restored = round_trip(service, service.kv, now=100_000)
    table = restored.table
    # ZNS/1: its own heartbeat timeout; RocketMQ: 30 s + the margin (under its 120 s).
    assert table.liveness("DefaultCluster", "10.0.0.2:10911").deadline == 100_000 + 10_000
    assert table.liveness("DefaultCluster", "10.0.0.1:10911").deadline == 100_000 + CONFIRM_MS
    assert removals(restored.expire(110_000)) == []
    assert removals(restored.expire(110_001)) == [("broker-z", "not_confirmed")]
    assert removals(restored.expire(100_000 + CONFIRM_MS)) == []
    assert removals(restored.expire(100_001 + CONFIRM_MS)) == [("broker-r", "not_confirmed")]
    assert restored.table.topic_count() == 0 and restored.removals["not_confirmed"] == 2


def test_a_second_restart_gives_a_rocketmq_broker_not_heard_since_its_period_again():
    # Tied to no connection after the first restart, broker-r was dumped as a ZNS/1 broker
    # and given its own 120 s timeout by the second (test_warm_restart.py, end to end).
    service = new_service()
    register_both(service)
    first = warm.dump(service, written_ms=0)
    once = new_service(service.kv, epoch="fedcba9876543210")
    warm.restore(once, warm.decode_dump(warm.encode_dump(first)), 100_000)
    second = warm.dump(once, written_ms=0, restored_remoting=first.remoting)
    assert second.remoting == first.remoting == [("DefaultCluster", "10.0.0.1:10911")]
    twice = new_service(service.kv, epoch="0011223344556677")
    warm.restore(twice, warm.decode_dump(warm.encode_dump(second)), 200_000)
    assert twice.table.liveness("DefaultCluster", "10.0.0.1:10911").deadline == (
        200_000 + CONFIRM_MS)
    # Heard since (here a ZNS/1 registration of the address), it is what it is now: untied.
    zns1_ok(once, "register_broker", 150_000, id=1, **register_fields(
        "broker-r", 0, "10.0.0.1:10911", "DefaultCluster", topics={"TopicR": {}}))
    assert warm.dump(once, written_ms=0, restored_remoting=first.remoting).remoting == []


def test_a_registration_or_a_zns1_heartbeat_confirms_a_restored_broker():
    service = new_service()
    register_both(service)
    restored = round_trip(service, service.kv, now=100_000)
    reply, _ = zns1_events(restored, "heartbeat", 105_000, id=1, cluster="DefaultCluster",
                           broker_name="broker-z", broker_id=0, broker_addr="10.0.0.2:10911")
    assert reply.known
    conn = Connection(7, "10.0.0.1")
    remoting(restored).handle(register_cmd(0, "10.0.0.1:10911", {"TopicR": {}}, name="broker-r"),
                              conn, 120_000)
    # Confirmed: each now lives by its own timeout, and expires as `expired`.
    assert removals(restored.expire(115_001)) == [("broker-z", "expired")]
    assert removals(restored.expire(100_001 + CONFIRM_MS)) == []
    assert restored.tied_connection("DefaultCluster", "10.0.0.1:10911", "broker-r") == 7
    assert removals(restored.expire(240_001)) == [("broker-r", "expired")]


def test_a_remoting_heartbeat_does_not_confirm_an_untied_restored_broker():
    """Connections are not restored: a broker is tied again by its next registration only."""
    service = new_service()
    register_both(service)
    restored = round_trip(service, service.kv, now=100_000)
    reply, _ = remoting(restored).handle(req(904, {
        "clusterName": "DefaultCluster", "brokerName": "broker-r", "brokerAddr": "10.0.0.1:10911",
        "brokerId": "0"}), Connection(3, "10.0.0.1"), 105_000)
    assert ("broker-r", "not_confirmed") in removals(restored.expire(100_001 + CONFIRM_MS))


def test_a_stall_moves_the_confirmation_deadline_like_every_other():
    service = new_service()
    register_both(service)
    restored = round_trip(service, service.kv, now=100_000)
    restored.shift_deadlines(5_000)
    assert restored.table.liveness("DefaultCluster", "10.0.0.1:10911").deadline == (
        105_000 + CONFIRM_MS)


def test_a_remoting_brokers_own_shorter_timeout_is_kept():
    assert warm.confirm_within_ms(20_000, over_remoting=True) == 20_000
    assert warm.confirm_within_ms(120_000, over_remoting=True) == CONFIRM_MS
    assert warm.confirm_within_ms(120_000, over_remoting=False) == 120_000


def kv_list(service: NameService, namespace: str) -> bytes:
    """GET_KVLIST_BY_NAMESPACE's reply (code, remark, body) as bytes."""
    return body(service, 219, {"namespace": namespace})


def empty_over_remoting(service: NameService, *namespaces: str) -> None:
    """Put one key into each namespace and delete it, over remoting: each is emptied."""
    rs = remoting(service)
    for namespace in namespaces:
        for code, ext in ((100, {"namespace": namespace, "key": "k", "value": "v"}),
                          (102, {"namespace": namespace, "key": "k"})):
            reply, _ = rs.handle(req(code, ext), Connection(99, "127.0.0.1"), 2000)
            assert reply is not None and reply.code == 0, reply


def test_a_restart_keeps_the_emptied_namespaces_and_so_the_remoting_replies():
    # Before format 2: after the restart GET_KVLIST_BY_NAMESPACE answered 22 (never used)
    # and the REGISTER_BROKER reply carried no ORDER_TOPIC_CONFIG table.
    service, kv = random_service(11, steps=100)
    for key in list(kv.list(ORDER_TOPIC_CONFIG)):
        zns1_ok(service, "kv_delete", 2000, id=1, namespace=ORDER_TOPIC_CONFIG, key=key)
    empty_over_remoting(service, "ns", ORDER_TOPIC_CONFIG)
    zns1_ok(service, "kv_put", 2000, id=1, namespace="refilled", key="k", value="v")
    empty_over_remoting(service, "refilled")
    zns1_ok(service, "kv_put", 2000, id=1, namespace="refilled", key="k2", value="v2")

    def replies(of: NameService) -> list[bytes]:
        register, _ = remoting(of).handle(register_cmd(), Connection(98, "127.0.0.1"), 60_000)
        assert register is not None
        return [kv_list(of, "ns"), kv_list(of, ORDER_TOPIC_CONFIG), kv_list(of, "refilled"),
                kv_list(of, "never"), register.body or b""]

    before = replies(service)
    assert before[:2] == [msgspec.msgpack.encode([0, None, b'{"table":{}}'])] * 2
    assert before[4] == b'{"table":{}}'
    restored = round_trip(service, kv)
    assert replies(restored) == before
    assert restored.state.emptied_namespaces() == ["ns", ORDER_TOPIC_CONFIG, "refilled"]


def test_the_emptied_namespaces_restored_are_bounded_as_the_state_bounds_them():
    kv = KvStore(None)
    service = new_service(kv)
    empty_over_remoting(service, "a", "b", "c", "a")  # a emptied again: the latest
    state = warm.decode_dump(warm.encode_dump(warm.dump(service, written_ms=0)))
    assert state.emptied == ["b", "c", "a"]
    smaller = NameService(kv, epoch=EPOCH, started_at_ms=0, limits=Limits(max_kv_namespaces=2))
    warm.restore(smaller, state, 0)
    assert smaller.state.emptied_namespaces() == ["c", "a"]  # the oldest, b, forgotten
    codes = [msgspec.msgpack.decode(kv_list(smaller, ns))[0] for ns in "abc"]
    assert codes == [0, 22, 0]


# --- unusable dumps ----------------------------------------------------------------------


def good_dump() -> bytes:
    service, _ = random_service(2, steps=100)
    return warm.encode_dump(warm.dump(service, written_ms=0))


@pytest.mark.parametrize("damage", [
    lambda d: d[: len(d) // 2],  # truncated
    lambda d: d[:warm.HEADER_BYTES - 1],  # not even a header
    lambda d: d[:-1] + bytes([d[-1] ^ 1]),  # one bit flipped in the body
    lambda d: b"garbage" * 10,
    lambda d: b"",
])
def test_a_damaged_dump_is_corrupt(damage):
    with pytest.raises(warm.CorruptDump):
        warm.decode_dump(damage(good_dump()))


def with_header(body: bytes) -> bytes:
    return warm.MAGIC + warm.FORMAT.to_bytes(2, "big") + zlib.crc32(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(("data", "says"), [
    (b"garbage", "not a zns state dump (7 bytes, no header)"),
    (with_header(b"\x93\x01")[:-1] + b"\x02", "its checksum does not match (2 bytes of body: "
                                                "truncated or altered)"),
    (with_header(b"\x93\x01"), "it does not decode: "),
    (with_header(b""), "it does not decode: "),  # a header and nothing else
])
def test_a_corrupt_dump_says_what_is_wrong_with_it(data, says):
    # The server logs it as it starts empty: the line must say why.
    with pytest.raises(warm.CorruptDump) as corrupt:
        warm.decode_dump(data)
    assert str(corrupt.value).startswith(says)


def test_a_dump_of_a_newer_format_is_refused():
    data = good_dump()
    newer = warm.MAGIC + (warm.FORMAT + 1).to_bytes(2, "big") + data[len(warm.MAGIC) + 2:]
    with pytest.raises(warm.NewerDump, match="newer zns"):
        warm.decode_dump(newer)


def test_a_dump_of_format_1_restores_its_table_with_no_emptied_namespace():
    # Format 1 (before the emptied namespaces): [written_ms, table, remoting], as it wrote.
    service, kv = random_service(12, steps=150)
    empty_over_remoting(service, "ns")
    state = warm.dump(service, written_ms=123)
    body_v1 = msgspec.msgpack.encode([state.written_ms, state.table, state.remoting])
    data = warm.MAGIC + (1).to_bytes(2, "big") + zlib.crc32(body_v1).to_bytes(4, "big") + body_v1
    old = warm.decode_dump(data)
    assert (old.written_ms, old.table, old.remoting, old.emptied) == (
        123, state.table, state.remoting, [])
    restored = new_service(kv, epoch="fedcba9876543210")
    warm.restore(restored, old, 50_000)
    assert restored.table.dump() == service.table.dump()
    assert restored.state.emptied_namespaces() == []
    assert msgspec.msgpack.decode(kv_list(restored, "ns"))[0] == 22  # as before the upgrade
    assert warm.encode_dump(state)[len(warm.MAGIC):len(warm.MAGIC) + 2] == b"\x00\x02"


def with_table(state: warm.StateDump, **changes: Any) -> warm.StateDump:
    return msgspec.structs.replace(state, table=msgspec.structs.replace(state.table, **changes))


@pytest.mark.parametrize("break_it", [
    lambda t: {"brokers": t.brokers[1:]},  # a broker name gone that topics and addresses list
    lambda t: {"topics": t.topics + [("Ghost", [len(t.queue_values)])]},  # no such queue value
    lambda t: {"clusters": t.clusters + [("empty", [])]},
    # a name no broker holds: GET_BROKER_CLUSTER_INFO listed it in clusterAddrTable, absent
    # from brokerAddrTable, until the cluster emptied (never, with it in it)
    lambda t: {"clusters": t.clusters + [("ghosts", ["ghost"])]},
    lambda t: {"clusters": [(t.clusters[0][0], t.clusters[0][1] + ["ghost"]), *t.clusters[1:]]},
    lambda t: {"addresses": t.addresses[:-1]},
    lambda t: {"topics": t.topics + t.topics[:1]},
])
def test_a_dump_that_does_not_hold_together_is_corrupt_and_changes_nothing(break_it):
    service, kv = random_service(3, steps=150)
    state = warm.dump(service, written_ms=0)
    broken = warm.decode_dump(warm.encode_dump(with_table(state, **break_it(state.table))))
    fresh = new_service(kv)
    before = fresh.table.dump()
    with pytest.raises(warm.CorruptDump, match="does not hold together"):
        warm.restore(fresh, broken, 1000)
    assert fresh.table.dump() == before and fresh.revision == 0


def test_restore_takes_only_an_empty_table():
    service, kv = random_service(4, steps=50)
    with pytest.raises(ValueError):
        service.table.restore(service.table.dump(), 0, lambda *_: 1)


# --- when dumps are made -----------------------------------------------------------------


def test_changes_count_what_a_dump_holds_and_nothing_else():
    table = RouteTable(EPOCH)
    req_ = RegisterBroker(cluster="c", broker_name="b", broker_id=0, broker_addr="10.0.0.1:1",
                          topics={"T": TopicConfig()}, data_version=DataVersion(counter=1))
    table.register_broker(req_, 1000)
    before = table.changes
    table.register_broker(req_, 2000)  # the periodic re-registration: nothing new
    table.heartbeat("c", "b", "10.0.0.1:1", DataVersion(counter=1), 3000)
    assert table.changes == before
    changed = [
        msgspec.structs.replace(req_, data_version=DataVersion(counter=2)),  # no route change
        msgspec.structs.replace(req_, data_version=DataVersion(counter=2), heartbeat_timeout_ms=5),
        msgspec.structs.replace(req_, data_version=DataVersion(counter=2), heartbeat_timeout_ms=5,
                                filter_servers=["10.9.0.1:1"]),
    ]
    for step in changed:
        table.register_broker(step, 4000)
        assert table.changes > before
        before = table.changes
    table.set_order_conf("no-route-topic", "b:4")  # no revision: no route shows it
    assert table.changes > before


def test_the_schedule_writes_at_most_once_per_interval_and_never_twice_at_once():
    schedule = warm.DumpSchedule(interval_ms=1000, written=5)
    assert schedule.next_deadline(5, 0) is None  # nothing new
    assert schedule.next_deadline(6, 100) == 100  # the first change: at once
    schedule.started(6, 100)
    assert schedule.next_deadline(9, 150) is None  # one write at a time
    schedule.finished(True)
    assert schedule.next_deadline(6, 200) is None
    assert schedule.next_deadline(9, 200) == 1100  # a second write waits for the interval
    schedule.started(9, 1100)
    schedule.finished(False)  # failed: the same changes are due again after the interval
    assert schedule.next_deadline(9, 1200) == 2100


def test_dump_steps_are_bounded_and_give_the_one_pass_dump():
    service, _ = random_service(5)
    table = service.table
    steps = list(table.dump_in_steps(work=50))
    assert len(steps) > 3 and all(s is None for s in steps[:-1])
    assert steps[-1] == table.dump()


# --- the file driver ---------------------------------------------------------------------


def test_the_state_path_defaults_beside_the_kv_file(tmp_path):
    assert state_file.state_path_for("", str(tmp_path / "kv.log")) == tmp_path / "kv.log.state"
    # Named after its KV file: two NameServers with their KV files in one directory.
    assert state_file.state_path_for("", str(tmp_path / "b.kv")) == tmp_path / "b.kv.state"
    assert state_file.state_path_for(str(tmp_path / "s"), None) == tmp_path / "s"
    assert state_file.state_path_for("", None) is None


def test_an_unusable_state_path_is_refused_in_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    for path, words in [(tmp_path, "is a directory"),
                        (tmp_path / "file" / "state.dump", "is a file, not a directory")]:
        with pytest.raises(ConfigError, match=words) as exc:
            state_file.check_writable(path)
        assert "\n" not in str(exc.value) and "--state-path" in str(exc.value)


def test_a_path_that_is_no_regular_file_is_refused(tmp_path):
    # Before: /dev/null passed, read as an empty (damaged) dump, and the first write renamed
    # a regular file over the device (as root); a FIFO blocked the start on its read.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        with pytest.raises(ConfigError, match="is not a regular file") as exc:
            state_file.check_writable(path)
        assert "\n" not in str(exc.value) and "--state-path" in str(exc.value)


def test_a_directory_that_takes_no_new_files_is_refused(tmp_path):
    # /proc takes no new files, for root too (a directory without write permission would
    # not stop root, which CI runs as).
    with pytest.raises(ConfigError, match="does not take new files") as exc:
        state_file.check_writable(Path("/proc/state.dump"))
    assert "\n" not in str(exc.value) and "--state-path" in str(exc.value)


def test_load_ignores_a_corrupt_file_in_one_log_line_and_refuses_a_newer_one(tmp_path, caplog):
    path = tmp_path / "state.dump"
    assert state_file.load(path) is None  # none yet
    data = good_dump()
    path.write_bytes(data[:-10])
    with caplog.at_level(logging.ERROR, logger="zns"):
        assert state_file.load(path) is None
    [line] = [r.getMessage() for r in records_here(caplog)]
    assert "ignored, starting with no routes" in line and "\n" not in line
    path.write_bytes(warm.MAGIC + (warm.FORMAT + 1).to_bytes(2, "big") + data[len(warm.MAGIC) + 2:])
    with pytest.raises(ConfigError, match="newer zns") as exc:
        state_file.load(path)
    assert "\n" not in str(exc.value)


def test_a_file_that_is_no_dump_stops_the_start_and_is_left_as_it_was(tmp_path):
    # Before: a file of something else at --state-path (the KV log given by mistake) was
    # logged as a damaged dump and replaced by the first dump: the KV log's acknowledged
    # writes went with it.
    path = tmp_path / "kv.log"
    kv = KvStore(str(path))
    kv.put("ns", "k", "v")
    kv.close()
    for content in (path.read_bytes(), b"{}", b"hello, not a dump at all"):
        path.write_bytes(content)
        with pytest.raises(ConfigError, match="is not a zns state dump") as exc:
            state_file.load(path)
        assert "\n" not in str(exc.value) and "--state-path" in str(exc.value)
        assert path.read_bytes() == content
    for cut in (b"", warm.MAGIC[:4]):  # a dump cut short is a damaged dump: ignored
        path.write_bytes(cut)
        assert state_file.load(path) is None


def test_a_state_path_that_is_the_kv_files_is_refused(tmp_path):
    # Each dump renamed over the KV log would have cut its acknowledged writes off.
    kv = tmp_path / "kv.log"
    kv.write_bytes(b"")
    (tmp_path / "link").symlink_to(kv)
    for state, kv_path in [(str(kv), str(kv)), (f"{tmp_path}/./kv.log", str(kv)),
                           (str(tmp_path / "link"), str(kv))]:
        with pytest.raises(ConfigError, match="is the KV file") as exc:
            state_file.state_path_for(state, kv_path)
        assert "\n" not in str(exc.value) and "--state-path" in str(exc.value)
    # A symlink loop is no KV file: refused later, in one line (`load`: cannot be read).
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    assert state_file.state_path_for(str(tmp_path / "loop1"), str(kv)) == tmp_path / "loop1"


def test_write_file_replaces_the_file_whole_and_makes_missing_directories(tmp_path):
    path = tmp_path / "new" / "state.dump"
    state_file.check_writable(path)
    state_file.write_file(path, b"one")
    state_file.write_file(path, b"two")
    assert path.read_bytes() == b"two" and sorted(p.name for p in path.parent.iterdir()) == [
        "state.dump"]
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_failed_write_leaves_no_partial_copy_behind(tmp_path, monkeypatch):
    # Before: the temporary file of a write that failed (ENOSPC at the fsync) stayed, holding
    # the disk space it had taken: the space a KV put needs on a full disk.
    path = tmp_path / "state.dump"
    state_file.write_file(path, b"old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        state_file.write_file(path, b"new" * 100_000)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.dump"]
    assert path.read_bytes() == b"old"


@pytest.mark.parametrize("held", ["the temporary file", "the directory"])
def test_a_process_forked_while_a_dump_is_written_holds_none_of_its_descriptors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: str) -> None:
    # The state process forks a replacement worker whenever one dies, while its thread may
    # be writing a dump. Before: the worker kept its copy of the temporary file's
    # descriptor for its whole life, a deleted file once the next dump replaced it, whose
    # disk space (a whole dump) stayed taken; and so of the directory's, fsynced last.
    path = tmp_path / "dumps" / "state.dump"
    fsyncs, inside, go = [], threading.Event(), threading.Event()
    fsync = os.fsync

    def paused(fd: int) -> None:  # the thread waits, its descriptor open, while the test forks
        fsyncs.append(fd)
        if len(fsyncs) == (1 if held == "the temporary file" else 2):
            inside.set()
            go.wait(30)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", paused)
    writer = threading.Thread(target=state_file.write_file, args=(path, b"dump" * 100_000))
    writer.start()
    try:
        assert inside.wait(30)
        readable, writable = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: which of its descriptors lead to the dump's directory
            try:
                os.close(readable)
                found = []
                for name in os.listdir("/proc/self/fd"):
                    try:
                        target = os.readlink(f"/proc/self/fd/{name}")
                    except OSError:  # the descriptor listdir used, closed since
                        continue
                    if target.startswith(str(path.parent)):
                        found.append(target)
                os.write(writable, repr(found).encode())
            finally:
                os._exit(0)
        os.close(writable)
        with os.fdopen(readable) as child:
            found = child.read()
        os.waitpid(pid, 0)
    finally:
        go.set()
        writer.join(30)
    assert found == "[]"
    assert path.read_bytes() == b"dump" * 100_000


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def writer_for(service: NameService, path: Path, write: Any = state_file.write_file,
               clock: Clock | None = None, step_work: int = 2_000) -> state_file.StateWriter:
    woken = threading.Event()
    writer = state_file.StateWriter(path, service, wake=woken.set, clock=clock or Clock(),
                                    wall_ms=lambda: 0, write=write, step_work=step_work)
    writer.woken = woken  # type: ignore[attr-defined]
    return writer


def drive(writer: state_file.StateWriter, now: int = 0, until: int = 10**9) -> None:
    """Run the writer as the loop does until it has nothing due, waiting for its thread."""
    for _ in range(10_000):
        due = writer.next_deadline(now)
        if due is None and writer.writing:
            writer.woken.wait(10)  # type: ignore[attr-defined]
            writer.woken.clear()  # type: ignore[attr-defined]
            continue
        if due is None or due > now:
            return
        writer.run({}, now, until)
    raise AssertionError("the writer never settled")


def test_the_writer_dumps_after_a_change_and_the_dump_restores(tmp_path):
    service, kv = random_service(6)
    path = tmp_path / "state.dump"
    writer = writer_for(service, path)
    assert writer.next_deadline(0) is None  # nothing changed since it was made
    zns1_ok(service, "register_broker", 2000, id=1, **register_fields("late", 0, "10.7.0.1:1"))
    drive(writer)
    assert writer.written == 1
    restored = new_service(kv)
    warm.restore(restored, state_file.load(path), 0)
    assert restored.table.dump() == service.table.dump()


def test_a_dump_made_in_steps_starts_over_when_the_table_changes_between_them(tmp_path):
    service, _ = random_service(7)
    clock = Clock()
    writer = writer_for(service, tmp_path / "state.dump", clock=clock, step_work=20)
    zns1_ok(service, "register_broker", 2000, id=1, **register_fields("late", 0, "10.7.0.1:1"))
    clock.now = 5  # past `until` after the first step: one step per run
    writer.run({}, 0, until=1)
    assert writer.reading and not writer.writing  # a dump under way
    zns1_ok(service, "register_broker", 2001, id=1, **register_fields("later", 0, "10.7.0.2:1"))
    drive(writer)
    assert writer.written == 1
    assert warm.decode_dump(writer.path.read_bytes()).table == service.table.dump()


def test_a_steady_stream_of_changes_cannot_keep_the_dump_from_being_written(tmp_path):
    # Before: each change between two steps started the reading over, without bound, so
    # changes as frequent as a dump's steps (a large table, a busy cluster) kept every dump
    # from ending: nothing reached the file, and a crash lost everything since the start.
    service, _ = random_service(7)
    clock = Clock()
    clock.now = 5  # past `until` after each step: one step per run, as under load
    writer = writer_for(service, tmp_path / "state.dump", clock=clock, step_work=20)
    for i in range(40):
        zns1_ok(service, "register_broker", 2000 + i, id=1,
                **register_fields(f"late-{i}", 0, f"10.7.1.{i}:1"))
        writer.run({}, 0, until=1)
        if writer.writing:
            break
    assert writer.writing and i == MAX_DUMP_RESTARTS + 1  # the steps, then one pass
    drive(writer)
    assert writer.written == 1
    assert warm.decode_dump(writer.path.read_bytes()).table == service.table.dump()


def test_a_failed_write_is_logged_and_tried_again_after_the_interval(tmp_path, caplog):
    service, _ = random_service(8, steps=100)
    calls = []

    def full_disk(path: Path, data: bytes) -> None:
        calls.append(len(data))
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        state_file.write_file(path, data)

    writer = writer_for(service, tmp_path / "state.dump", write=full_disk)
    zns1_ok(service, "register_broker", 2000, id=1, **register_fields("late", 0, "10.7.0.1:1"))
    with caplog.at_level(logging.ERROR, logger="zns"):
        drive(writer, now=0)
    [line] = [r.getMessage() for r in records_here(caplog)]
    assert "No space left on device" in line and (writer.written, writer.failed) == (0, 1)
    assert writer.next_deadline(0) == writer.schedule.interval_ms
    drive(writer, now=writer.schedule.interval_ms)
    assert writer.written == 1 and len(calls) == 2
    assert writer.failed == 1  # counted once: /metrics' zns_state_dump_failures_total


def test_a_failed_write_at_stop_is_counted_too(tmp_path):
    service, _ = random_service(8, steps=100)

    def full_disk(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    writer = writer_for(service, tmp_path / "state.dump", write=full_disk)
    zns1_ok(service, "register_broker", 2000, id=1, **register_fields("late", 0, "10.7.0.1:1"))
    writer.write_now()
    assert (writer.written, writer.failed) == (0, 1)


def test_a_bug_in_the_writer_thread_reaches_the_loop_as_itself(tmp_path):
    service, _ = random_service(9, steps=50)

    def buggy(path: Path, data: bytes) -> None:
        raise KeyError("a bug")

    writer = writer_for(service, tmp_path / "state.dump", write=buggy)
    zns1_ok(service, "register_broker", 2000, id=1, **register_fields("late", 0, "10.7.0.1:1"))
    with pytest.raises(KeyError, match="a bug"):
        drive(writer)
    assert not writer.writing  # not left waiting on a dead thread


def test_write_now_writes_the_table_as_it_is_unless_the_file_holds_it(tmp_path):
    service, _ = random_service(10, steps=80)
    writer = writer_for(service, tmp_path / "state.dump")
    writer.write_now()
    assert writer.written == 0 and not writer.path.exists()  # nothing changed since made
    zns1_ok(service, "register_broker", 2000, id=1, **register_fields("late", 0, "10.7.0.1:1"))
    writer.write_now()
    writer.write_now()
    assert writer.written == 1
    assert warm.decode_dump(writer.path.read_bytes()).table == service.table.dump()
    assert isinstance(warm.decode_dump(writer.path.read_bytes()).table, TableState)


def test_emptying_a_namespace_alone_is_a_change_the_writer_dumps(tmp_path):
    # Before: the writer counted the table's changes only, so an emptied namespace waited
    # for the next route change to reach the file (and a clean stop did not write it).
    service, kv = random_service(13, steps=50)
    writer = writer_for(service, tmp_path / "state.dump")
    empty_over_remoting(service, "ns")
    assert writer.next_deadline(0) == 0
    drive(writer)
    assert writer.written == 1
    assert warm.decode_dump(writer.path.read_bytes()).emptied == ["ns"]
    empty_over_remoting(service, "other")
    writer.write_now()
    assert writer.written == 2
    assert warm.decode_dump(writer.path.read_bytes()).emptied == ["ns", "other"]

"""Limits against memory exhaustion: each refusal is a bad_request naming the limit."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import observable, register_fields, zns1, zns1_ok
from zns.core import schema
from zns.drivers.kv_file import KvStore
from zns.core.limits import Limits
from zns.core.service import NameService

SMALL = Limits(max_topics_per_request=3, max_brokers=2, max_topics=4, max_kv_entries=2,
               max_kv_namespaces=2)


@pytest.fixture
def service(tmp_path) -> NameService:
    return NameService(KvStore(tmp_path / "kv.json"), epoch="e" * 16, started_at_ms=0,
                       limits=SMALL)


call, ok = zns1, zns1_ok


def state(service: NameService) -> bytes:
    return observable(service, ("n1", "n2", "n3"))


def refused(reply: Any, limit: str) -> bool:
    return (isinstance(reply, schema.Error) and reply.code == "bad_request"
            and f"limit {limit} " in reply.message and f"--{limit.replace('_', '-')}" in
            reply.message)


def topics(*names: str) -> dict[str, dict]:
    return {name: {} for name in names}


def test_topics_per_request(service):
    before = state(service)
    reply = call(service, "register_broker", **register_fields(topics=topics("A", "B", "C", "D")))
    assert refused(reply, "max_topics_per_request")
    assert refused(call(service, "get_routes", topics=["A", "B", "C", "D"]),
                   "max_topics_per_request")
    assert state(service) == before
    ok(service, "register_broker", **register_fields(topics=topics("A", "B", "C")))


def test_brokers_names_and_addresses(service):
    for i in range(2):
        ok(service, "register_broker", **register_fields(f"b{i}", addr=f"10.0.0.{i}:1"))
    before = state(service)
    assert refused(call(service, "register_broker", **register_fields("b2", addr="10.0.0.0:1")),
                   "max_brokers")  # a new name
    assert refused(call(service, "register_broker", **register_fields("b0", addr="10.0.0.9:1",
                                                                      broker_id=1)),
                   "max_brokers")  # a new address
    assert state(service) == before
    # Re-registering what is held is never refused.
    ok(service, "register_broker", **register_fields("b1", addr="10.0.0.1:1"))


def test_topics_in_total(service):
    call(service, "register_broker", **register_fields(topics=topics("A", "B", "C")))
    before = state(service)
    reply = call(service, "register_broker",
                 **register_fields("b2", addr="10.0.0.2:1", topics=topics("A", "D", "E")))
    assert refused(reply, "max_topics")
    assert state(service) == before
    queues = [dict(broker_name="broker-a", read_queues=1, write_queues=1, perm=6, sys_flag=0)]
    ok(service, "register_topic", topic="D", queues=queues)  # the 4th topic fits
    assert refused(call(service, "register_topic", topic="E", queues=queues), "max_topics")
    ok(service, "register_broker",  # known topics only: fits
       **register_fields("b2", addr="10.0.0.2:1", topics=topics("A", "D")))


def test_queue_entries_in_total(tmp_path):
    service = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                          limits=Limits(max_queues=5))
    ok(service, "register_broker", **register_fields(topics=topics("A", "B", "C")))
    before = state(service)
    reply = call(service, "register_broker",
                 **register_fields("b2", addr="10.0.0.2:1", topics=topics("A", "B", "C")))
    assert refused(reply, "max_queues")  # 3 + 3 > 5
    assert state(service) == before
    # A broker replacing its own topics is counted net: 3 - 3 + 3 fits.
    ok(service, "register_broker", **register_fields(topics=topics("A", "B", "D"),
                                                      data_version={"counter": 1}))
    ok(service, "register_broker",
       **register_fields("b2", addr="10.0.0.2:1", topics=topics("A", "B")))
    assert service.table.queue_count() == 5
    queues = [dict(broker_name=n, read_queues=1, write_queues=1, perm=6, sys_flag=0)
              for n in ("broker-a", "b2")]
    assert refused(call(service, "register_topic", topic="D", queues=queues), "max_queues")
    ok(service, "unregister_broker", **{k: v for k, v in register_fields(
        "b2", addr="10.0.0.2:1").items() if k != "topics"})
    assert service.table.queue_count() == 3


def test_kv_entries_and_namespaces(service):
    ok(service, "kv_put", namespace="n1", key="k1", value="v")
    ok(service, "kv_put", namespace="n1", key="k2", value="v")
    before = state(service)
    assert refused(call(service, "kv_put", namespace="n1", key="k3", value="v"), "max_kv_entries")
    assert state(service) == before
    ok(service, "kv_put", namespace="n1", key="k2", value="new")
    ok(service, "kv_put", namespace="n2", key="k", value="v")
    assert refused(call(service, "kv_put", namespace="n3", key="k", value="v"),
                   "max_kv_namespaces")
    assert service.kv.list("n3") == {} and service.kv.list("n1")["k2"] == "new"
    assert call(service, "kv_delete", namespace="n1", key="k1").removed
    ok(service, "kv_put", namespace="n1", key="k3", value="v")


def test_limits_come_from_the_command_line(process_server):
    from helpers import Peer

    srv = process_server("--max-kv-entries", "1")
    peer = Peer(srv.router)
    try:
        peer.ok("kv_put", namespace="n", key="a", value="1")
        reply = peer.call("kv_put", namespace="n", key="b", value="1")
        assert refused(reply, "max_kv_entries"), reply
    finally:
        peer.close()


def test_every_address_past_the_first_counts_in_every_route_of_its_broker():
    # One broker name with many addresses is listed whole in each of its routes: 3 topics
    # x 4 addresses is 12 entries of route state, not 3, and --max-queues must see that.
    service = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                          limits=Limits(max_queues=10))
    ok(service, "register_broker", **register_fields(topics=topics("A", "B", "C")))
    for broker_id in (1, 2):
        ok(service, "register_broker", **register_fields(
            broker_id=broker_id, addr=f"10.0.0.1:{10911 + broker_id}", topics=topics("A", "B", "C")))
    assert service.table.queue_weight() == 9
    before = state(service)
    reply = call(service, "register_broker", **register_fields(
        broker_id=3, addr="10.0.0.1:10914", topics=topics("A", "B", "C")))
    assert refused(reply, "max_queues")  # 9 + 3 > 10
    assert state(service) == before
    # Re-registering an address already held is not a new entry.
    ok(service, "register_broker", **register_fields(broker_id=2, addr="10.0.0.1:10913",
                                                      topics=topics("A", "B", "C")))


def _message(reply: Any) -> str:
    assert isinstance(reply, schema.Error) and reply.code == "bad_request", reply
    return reply.message


def _said(limit: str, value: int, detail: str) -> str:
    option = "--" + limit.replace("_", "-")
    return f"limit {limit} ({value}) reached: {detail}; the server's {option} sets it"


def test_each_refusal_says_which_limit_its_value_what_and_the_option():
    # The message is what an operator acts on: the limit, its value, what would have
    # grown, and the option that raises it — exactly, for every limit.
    s = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0, limits=Limits(
        max_topics_per_request=3, max_brokers=1, max_topics=3, max_queues=4, max_kv_entries=1,
        max_kv_namespaces=1, max_kv_bytes=40))
    assert _message(call(s, "register_broker", **register_fields(
        topics=topics("A", "B", "C", "D")))) == _said(
        "max_topics_per_request", 3, "register_broker lists 4 topics")
    assert _message(call(s, "get_routes", topics=["A", "B", "C", "D"])) == _said(
        "max_topics_per_request", 3, "get_routes asks for 4 topics")
    ok(s, "register_broker", **register_fields(topics=topics("A")))
    assert _message(call(s, "register_broker", **register_fields(
        "b2", addr="10.0.0.2:1", topics=topics("A")))) == _said(
        "max_brokers", 1, "broker name 'b2' would be new")
    assert _message(call(s, "register_broker", **register_fields(
        broker_id=1, addr="10.0.0.2:1", topics=topics("A")))) == _said(
        "max_brokers", 1, "broker address 10.0.0.2:1 would be new")
    # Topics: 1 held + 2 new = 3 fits exactly (A, B, C); one more would be new.
    ok(s, "register_broker", **register_fields(topics=topics("A", "B", "C"),
                                               data_version={"counter": 1}))
    assert s.table.topic_count() == 3
    assert _message(call(s, "register_broker", **register_fields(
        topics=topics("A", "B", "D"), data_version={"counter": 2}))) == _said(
        "max_topics", 3, "1 topics would be new")
    queues = [dict(broker_name="broker-a", read_queues=1, write_queues=1, perm=6, sys_flag=0)]
    assert _message(call(s, "register_topic", topic="E", queues=queues)) == _said(
        "max_topics", 3, "topic 'E' would be new")
    assert _message(call(s, "register_broker", **register_fields(
        topics=topics("A", "B", "C"), filter_servers=["10.0.0.9:1"],
        data_version={"counter": 3}))) == _said(
        "max_queues", 4, "3 more queue entries (topic x broker name, each filter server and "
        "each address past the first of the broker counted as one more)")
    ok(s, "kv_put", namespace="n", key="k", value="v")
    assert _message(call(s, "kv_put", namespace="n", key="k2", value="v")) == _said(
        "max_kv_entries", 1, "namespace 'n' is full (per namespace)")
    assert _message(call(s, "kv_put", namespace="n2", key="k", value="v")) == _said(
        "max_kv_namespaces", 1, "namespace 'n2' would be new")
    assert _message(call(s, "kv_put", namespace="n", key="k", value="v" * 40)) == _said(
        "max_kv_bytes", 40, "39 more bytes of KV entries (namespaces, keys and values)")


@pytest.mark.parametrize("how", ["slave", "same data_version", "incremental"])
def test_a_registration_that_keeps_the_held_topics_counts_them_against_max_queues(how):
    # A registration whose topic list is not applied (a slave's, or the master's with an
    # unchanged data_version) still adds its filter servers and address to every route
    # of the name: the held topics count, not the empty list it sends.
    s = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                    limits=Limits(max_queues=10))
    held = topics(*(f"T{i}" for i in range(10)))
    ok(s, "register_broker", **register_fields(topics=held, data_version={"counter": 1}))
    assert s.table.queue_weight() == 10
    before = state(s)
    fields = register_fields(topics={}, filter_servers=["10.0.0.9:1"],
                             data_version={"counter": 1})
    if how == "slave":
        fields.update(broker_id=1, broker_addr="10.0.0.2:10911")
    elif how == "incremental":
        fields.update(incremental=True, data_version={"counter": 2})
    assert refused(call(s, "register_broker", **fields), "max_queues")
    assert state(s) == before and s.table.queue_weight() == 10
    # Without filter servers the slave's address still puts one more entry in each route.
    if how == "slave":
        fields.update(filter_servers=[])
        assert refused(call(s, "register_broker", **fields), "max_queues")
    # A re-registration that changes nothing it weighs is never refused at the limit.
    ok(s, "register_broker", **register_fields(topics=held, data_version={"counter": 3}))
    assert s.table.queue_weight() == 10


def test_long_names_weigh_by_their_bytes_against_max_queues():
    # 255-character names put ~1.3 KB in every route entry, ten times a typical broker's:
    # each started 128 bytes of cluster, name (twice: QueueData and BrokerData), zone and
    # addresses weighs one more entry, so --max-queues still bounds what routes hold.
    s = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                    limits=Limits(max_queues=100))
    long = dict(cluster="c" * 255, broker_name="b" * 255, zone="z" * 255,
                addr="a" * 60 + "." + "d" * 60 + ":10911")
    per_entry = 1 + (255 + 2 * 255 + 255 + 128) // 128
    assert per_entry == 9
    ok(s, "register_broker", **register_fields(topics=topics(*(f"T{i}" for i in range(11))),
                                               **long))
    assert s.table.queue_weight() == 11 * per_entry
    before = state(s)
    assert refused(call(s, "register_broker", **register_fields(
        topics=topics(*(f"T{i}" for i in range(12))), data_version={"counter": 1}, **long)),
        "max_queues")
    assert state(s) == before
    # The same broker with short names fits many more topics.
    s2 = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                     limits=Limits(max_queues=100))
    ok(s2, "register_broker", **register_fields(topics=topics(*(f"T{i}" for i in range(100)))))
    assert s2.table.queue_weight() == 100


def test_a_periodic_registration_with_filter_servers_at_the_limit_is_accepted():
    # What the registration weighs is computed as it will be held: the address's filter
    # servers replace the ones it listed, they are not counted twice.
    s = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                    limits=Limits(max_queues=9))
    fields = register_fields(topics=topics("A", "B", "C"),
                             filter_servers=["10.0.0.8:1", "10.0.0.9:1"])
    ok(s, "register_broker", **fields)
    assert s.table.queue_weight() == 9  # 3 topics x (1 + 2 filter servers): exactly full
    ok(s, "register_broker", **fields)
    ok(s, "register_broker", **{**fields, "data_version": {"counter": 1}})
    assert refused(call(s, "register_broker", **{
        **fields, "filter_servers": ["10.0.0.7:1", "10.0.0.8:1", "10.0.0.9:1"]}), "max_queues")


def test_register_topic_counts_filter_servers_against_max_queues():
    s = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                    limits=Limits(max_queues=4))
    ok(s, "register_broker", **register_fields(topics=topics("A"), filter_servers=["10.0.0.9:1"]))
    assert s.table.queue_weight() == 2  # one entry, one filter server
    queues = [dict(broker_name="broker-a", read_queues=1, write_queues=1, perm=6, sys_flag=0)]
    ok(s, "register_topic", topic="B", queues=queues)  # 2 + 1 x (1 + 1) = 4: fits exactly
    assert _message(call(s, "register_topic", topic="C", queues=queues)) == _said(
        "max_queues", 4, "2 more queue entries (topic x broker name, each filter server and "
        "each address past the first of the broker counted as one more)")


def test_a_kv_put_that_does_not_grow_the_total_is_never_refused():
    s = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                    limits=Limits(max_kv_bytes=10))
    ok(s, "kv_put", namespace="n", key="k", value="12345678")  # 1 + 1 + 8 = 10: exactly full
    ok(s, "kv_put", namespace="n", key="k", value="87654321")  # same size: not growing
    ok(s, "kv_put", namespace="n", key="k", value="1")  # shrinking
    ok(s, "kv_put", namespace="n", key="k", value="12345678")  # back to exactly full


def _fresh(max_queues: int = 1_000_000) -> NameService:
    return NameService(KvStore(None), epoch="e" * 16, started_at_ms=0,
                       limits=Limits(max_queues=max_queues))


_FILTERS = ["10.0.0.8:1", "10.0.0.9:1"]
_QUEUE = dict(read_queues=1, write_queues=1, perm=6, sys_flag=0)
# (what is held before, the request weighed): each grows the table in a different way.
_GROWTH = {
    "incremental registration adds to the held topics": (
        [("register_broker", register_fields(topics=topics("T0", "T1", "T2"),
                                             data_version={"counter": 1}))],
        ("register_broker", register_fields(topics=topics("N0", "N1"), incremental=True,
                                            data_version={"counter": 2}))),
    "same data_version restores the listed topics the name lacks": (
        [("register_broker", register_fields(topics=topics("T0", "T1", "T2"),
                                             data_version={"counter": 1})),
         ("delete_topic", dict(topic="T1"))],
        ("register_broker", register_fields(topics=topics("T0", "T1", "N0"),
                                            data_version={"counter": 1}))),
    "filter servers on an address another name lists": (
        [("register_broker", register_fields(topics=topics(*(f"T{i}" for i in range(10))))),
         ("register_broker", register_fields(broker_name="broker-b", topics=topics("U0")))],
        ("register_broker", register_fields(broker_name="broker-b", topics=topics("U0"),
                                            filter_servers=_FILTERS,
                                            data_version={"counter": 1}))),
    "a topic on two names with filter servers": (
        [("register_broker", register_fields(topics=topics("A"), filter_servers=_FILTERS[:1])),
         ("register_broker", register_fields(broker_name="broker-b", addr="10.0.0.2:10911",
                                             topics=topics("B"), filter_servers=_FILTERS))],
        ("register_topic", dict(topic="C", queues=[dict(broker_name="broker-a", **_QUEUE),
                                                    dict(broker_name="broker-b", **_QUEUE)]))),
}


@pytest.mark.parametrize("case", list(_GROWTH))
def test_max_queues_refuses_exactly_what_would_weigh_more_than_the_limit(case):
    # The weight a request is checked with is the weight the table has once it is applied:
    # one unit less of room refuses it (changing nothing), exactly enough accepts it.
    setup, (op, fields) = _GROWTH[case]
    measure = _fresh()
    for setup_op, setup_fields in setup:
        ok(measure, setup_op, **setup_fields)
    before = measure.table.queue_weight()
    ok(measure, op, **fields)
    after = measure.table.queue_weight()
    assert after > before
    tight = _fresh(after - 1)
    for setup_op, setup_fields in setup:
        ok(tight, setup_op, **setup_fields)
    held = state(tight)
    reply = call(tight, op, **fields)
    assert refused(reply, "max_queues")
    assert f": {after - before} more queue entries" in reply.message
    assert state(tight) == held
    full = _fresh(after)
    for setup_op, setup_fields in setup:
        ok(full, setup_op, **setup_fields)
    ok(full, op, **fields)
    assert full.table.queue_weight() == after
    # Sent again at exactly full, it adds nothing and is accepted.
    ok(full, op, **fields)
    assert full.table.queue_weight() == after


def test_a_table_over_a_lowered_limit_still_takes_what_does_not_grow_it():
    # A restart with a smaller --max-queues than the fleet needs: the brokers already held
    # keep re-registering; only growth is refused.
    s = _fresh()
    held = topics(*(f"T{i}" for i in range(10)))
    ok(s, "register_broker", **register_fields(topics=held))
    s.limits = Limits(max_queues=5, max_topics=5)
    ok(s, "register_broker", **register_fields(topics=held, data_version={"counter": 1}))
    queues = [dict(broker_name="broker-a", **_QUEUE)]
    ok(s, "register_topic", topic="T3", queues=queues)  # held already: not a new topic
    assert refused(call(s, "register_topic", topic="New", queues=queues), "max_topics")


def test_kv_bytes_over_a_lowered_limit_refuse_growth_of_one_byte_only():
    s = _fresh()
    ok(s, "kv_put", namespace="n", key="k", value="12345678")  # 10 bytes
    s.limits = Limits(max_kv_bytes=5)
    ok(s, "kv_put", namespace="n", key="k", value="87654321")  # same size: not growing
    s.limits = Limits(max_kv_bytes=10)
    assert refused(call(s, "kv_put", namespace="n", key="k", value="123456789"), "max_kv_bytes")


def test_the_limit_checks_take_names_the_table_does_not_hold_yet():
    s = _fresh()
    # An incremental registration of a name never seen: every topic it lists is new.
    ok(s, "register_broker", **register_fields(topics=topics("A", "B"), incremental=True))
    assert s.table.queue_weight() == 2
    # register_topic naming an unknown broker name is the table's refusal, not a crash.
    reply = call(s, "register_topic", topic="C",
                 queues=[dict(broker_name="nobody", **_QUEUE)])
    assert isinstance(reply, schema.Error) and reply.code == "bad_request"
    assert reply.message.startswith("unknown broker name(s) nobody")

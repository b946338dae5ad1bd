"""The audit trail (docs/operations.md): who changed what, before and after.

The state machine's Outcome carries the change (decided in the core); the service's one
boundary turns it into an INFO line naming who sent it, with the fields on the record for
the JSON format. Over both protocols: ZNS/1 (`respond`) and remoting (`RemotingService`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
import pytest

from test_remoting_service import register_cmd, req
from zns.core.remoting.handler import Connection, RemotingService
from zns.core.remoting.constants import RequestCode as R
from zns.core.schema import (
    AddWritePerm,
    DeleteTopic,
    Heartbeat,
    KvDelete,
    KvPut,
    RegisterBroker,
    WipeWritePerm,
    encode,
)
from zns.core.service import NameService
from zns.core.state import Change, StateMachine, Write
from zns.drivers.kv_file import KvStore
from zns.drivers.logs import JsonFormatter, RepeatFilter

pytestmark = pytest.mark.timeout(60)

EPOCH = "0123456789abcdef"
A1, A2 = "10.0.0.1:10911", "10.0.0.2:10911"


def registration(addr: str = A1, *, topics: dict[str, Any] | None = None,
                 state: int = 0) -> RegisterBroker:
    return msgspec.convert({
        "op": "register_broker", "id": 1, "cluster": "c1", "broker_name": "broker-a",
        "broker_id": 0, "broker_addr": addr,
        "topics": {"TopicA": {"perm": 6}, "TopicB": {"perm": 4}} if topics is None else topics,
        "data_version": {"state": state, "counter": 1}}, RegisterBroker)


def machine() -> StateMachine:
    state = StateMachine(KvStore(None), epoch=EPOCH)
    state.apply(Write(request=registration(), now=0))
    return state


def change(state: StateMachine, request: Any) -> Change | None:
    return state.apply(Write(request=request, now=1)).change


# --- the core: what the Outcome carries ------------------------------------------------

def test_perm_writes_carry_the_writable_topic_counts_before_and_after() -> None:
    state = machine()  # TopicA writable (6), TopicB read-only (4)
    assert change(state, WipeWritePerm(id=1, broker_name="broker-a")) == Change(
        what="wipe_write_perm", target="broker-a", before=1, after=0)
    assert change(state, AddWritePerm(id=1, broker_name="broker-a")) == Change(
        what="add_write_perm", target="broker-a", before=0, after=2)
    # An admin write that changes nothing is still one (an unknown name: 0 -> 0).
    assert change(state, WipeWritePerm(id=1, broker_name="nobody")) == Change(
        what="wipe_write_perm", target="nobody", before=0, after=0)


def test_delete_topic_carries_the_broker_names_holding_it_before_and_after() -> None:
    state = machine()
    assert change(state, DeleteTopic(id=1, topic="TopicA", cluster="c1")) == Change(
        what="delete_topic", target="TopicA in c1", before=1, after=0)
    assert change(state, DeleteTopic(id=1, topic="TopicA")) == Change(
        what="delete_topic", target="TopicA", before=0, after=0)


def test_kv_writes_carry_the_value_before_and_after() -> None:
    state = machine()
    put = KvPut(id=1, namespace="ns", key="k", value="v1")
    assert change(state, put) == Change(what="kv_put", target="ns/k", before=None, after="v1")
    put = KvPut(id=1, namespace="ns", key="k", value="v2")
    assert change(state, put) == Change(what="kv_put", target="ns/k", before="v1", after="v2")
    assert change(state, KvDelete(id=1, namespace="ns", key="k")) == Change(
        what="kv_delete", target="ns/k", before="v2", after=None)


def test_only_a_displacing_registration_carries_a_change() -> None:
    state = machine()
    # The same broker re-registering (changed topics or not) and its heartbeats: no change.
    assert change(state, registration()) is None
    assert change(state, registration(topics={"TopicC": {}}, state=1)) is None
    heartbeat = Heartbeat(id=1, cluster="c1", broker_name="broker-a", broker_id=0,
                          broker_addr=A1)
    assert change(state, heartbeat) is None
    # Another address takes id 0 of broker-a: the one it displaced is the value before.
    assert change(state, registration(A2, state=2)) == Change(
        what="register_broker", target="c1/broker-a id 0",
        before="c1/broker-a id 0 at 10.0.0.1:10911", after=A2)


def test_a_registration_that_displaces_two_addresses_lists_both_before() -> None:
    # broker-a id 1 at A1 in c2 and id 0 at A2 in c1; A1 registers as id 0 in c1: it leaves
    # c2 (§4 step 2) and takes id 0 from A2 (step 3).
    state = StateMachine(KvStore(None), epoch=EPOCH)
    state.apply(Write(request=registration(A2), now=0))
    state.apply(Write(request=msgspec.structs.replace(registration(A1), cluster="c2",
                                                      broker_id=1), now=0))
    assert change(state, registration(A1, state=1)) == Change(
        what="register_broker", target="c1/broker-a id 0",
        before="c2/broker-a id 1 at 10.0.0.1:10911, c1/broker-a id 0 at 10.0.0.2:10911",
        after=A1)


# --- the boundary: one line, who, the fields ---------------------------------------------

def audit_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, "audit")]


def zns1(service: NameService, request: dict[str, Any], *, key: str | None = None,
         address: str = "tcp://192.0.2.7:40000") -> dict[str, Any]:
    reply = service.respond(encode({"id": 5, **request}), 0, key, address).reply
    decoded = msgspec.msgpack.decode(reply)
    assert "code" not in decoded, decoded
    return decoded


def address_of(peer: Any) -> str:
    if peer == "never":
        raise AssertionError("asked who sent a request that has no audit line")
    return str(peer)


@pytest.fixture
def service() -> NameService:
    svc = NameService(KvStore(None), epoch=EPOCH, started_at_ms=0,
                      key_name={"ADMINKEY": "ops-alice"}.get, address_of=address_of)
    svc.write(registration(), 0)
    return svc


ZNS1_WRITES = [
    ({"op": "wipe_write_perm", "broker_name": "broker-a"},
     {"op": "wipe_write_perm", "target": "broker-a", "before": 1, "after": 0}),
    ({"op": "add_write_perm", "broker_name": "broker-a"},
     {"op": "add_write_perm", "target": "broker-a", "before": 1, "after": 2}),
    ({"op": "delete_topic", "topic": "TopicA"},
     {"op": "delete_topic", "target": "TopicA", "before": 1, "after": 0}),
    ({"op": "kv_put", "namespace": "ns", "key": "k", "value": "v"},
     {"op": "kv_put", "target": "ns/k", "before": None, "after": "v"}),
    ({"op": "kv_delete", "namespace": "ns", "key": "k"},
     {"op": "kv_delete", "target": "ns/k", "before": None, "after": None}),
    ({"op": "register_broker", "cluster": "c1", "broker_name": "broker-a", "broker_id": 0,
      "broker_addr": A2, "data_version": {"state": 1}},
     {"op": "register_broker", "target": "c1/broker-a id 0",
      "before": "c1/broker-a id 0 at 10.0.0.1:10911", "after": A2}),
]


@pytest.mark.parametrize(("request_map", "fields"), ZNS1_WRITES,
                         ids=[w[0]["op"] for w in ZNS1_WRITES])
def test_a_zns1_admin_write_logs_one_line_naming_the_peer_address(
        service: NameService, caplog: pytest.LogCaptureFixture, request_map: dict[str, Any],
        fields: dict[str, Any]) -> None:
    with caplog.at_level(logging.INFO, logger="zns"):
        zns1(service, request_map)
    [record] = audit_records(caplog)
    assert record.levelno == logging.INFO
    assert record.audit == {**fields, "by": "tcp://192.0.2.7:40000"}  # type: ignore[attr-defined]
    assert record.getMessage().startswith(f"audit: {fields['op']} ")
    assert "by 'tcp://192.0.2.7:40000'" in record.getMessage()


def test_a_zns1_write_names_the_curve_key_by_its_name_else_by_key_and_address(
        service: NameService, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="zns"):
        zns1(service, {"op": "kv_put", "namespace": "ns", "key": "k", "value": "1"},
             key="ADMINKEY")
        zns1(service, {"op": "kv_put", "namespace": "ns", "key": "k", "value": "2"},
             key="UNLISTED")
    named, unnamed = audit_records(caplog)
    assert named.audit["by"] == "key ops-alice"  # type: ignore[attr-defined]
    assert unnamed.audit["by"] == "key UNLISTED at tcp://192.0.2.7:40000"  # type: ignore[attr-defined]
    assert unnamed.audit["before"] == "1"  # type: ignore[attr-defined]


def test_reads_and_ordinary_broker_writes_log_no_audit_line_and_never_ask_who(
        service: NameService, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="zns"):
        for request in ({"op": "get_route", "topic": "TopicA"}, {"op": "kv_list", "namespace": "x"},
                        {"op": "register_broker", "cluster": "c1", "broker_name": "broker-a",
                         "broker_id": 0, "broker_addr": A1},
                        {"op": "heartbeat", "cluster": "c1", "broker_name": "broker-a",
                         "broker_addr": A1}):
            service.respond(encode({"id": 5, **request}), 0, None, "never")
    assert audit_records(caplog) == []


def test_a_long_kv_value_is_cut_in_the_line_and_the_fields(
        service: NameService, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="zns"):
        zns1(service, {"op": "kv_put", "namespace": "ns", "key": "k", "value": "x" * 60_000})
    [record] = audit_records(caplog)
    assert len(record.getMessage()) < 600
    assert "(60000 in all)" in record.getMessage()
    assert record.audit["after"] == "x" * 200  # type: ignore[attr-defined]


REMOTING_WRITES = [
    (req(R.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}),
     {"op": "wipe_write_perm", "target": "broker-a", "before": 1, "after": 0}),
    (req(R.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}),
     {"op": "add_write_perm", "target": "broker-a", "before": 1, "after": 2}),
    (req(R.DELETE_TOPIC_IN_NAMESRV, {"topic": "TopicA"}),
     {"op": "delete_topic", "target": "TopicA", "before": 1, "after": 0}),
    (req(R.PUT_KV_CONFIG, {"namespace": "ns", "key": "k", "value": "v"}),
     {"op": "kv_put", "target": "ns/k", "before": None, "after": "v"}),
    (req(R.DELETE_KV_CONFIG, {"namespace": "ns", "key": "k"}),
     {"op": "kv_delete", "target": "ns/k", "before": None, "after": None}),
    (register_cmd(0, A2, {"TopicA": {}}, name="broker-a", cluster="c1", state=1),
     {"op": "register_broker", "target": "c1/broker-a id 0",
      "before": "c1/broker-a id 0 at 10.0.0.1:10911", "after": A2}),
]


@pytest.mark.parametrize(("command", "fields"), REMOTING_WRITES,
                         ids=[f[1]["op"] for f in REMOTING_WRITES])
def test_a_remoting_admin_write_logs_one_line_naming_the_source_address(
        service: NameService, caplog: pytest.LogCaptureFixture, command: Any,
        fields: dict[str, Any]) -> None:
    remoting = RemotingService(service, brokers=None, readers=None)
    with caplog.at_level(logging.INFO, logger="zns"):
        reply, _ = remoting.handle(command, Connection(3, "127.0.0.1"), 0)
    assert reply is not None and reply.code == 0, reply
    [record] = audit_records(caplog)
    assert record.audit == {**fields, "by": "127.0.0.1"}  # type: ignore[attr-defined]


def test_a_remoting_re_registration_logs_no_audit_line(
        service: NameService, caplog: pytest.LogCaptureFixture) -> None:
    remoting = RemotingService(service, brokers=None, readers=None)
    with caplog.at_level(logging.INFO, logger="zns"):
        for _ in range(3):
            reply, _ = remoting.handle(register_cmd(0, A1, name="broker-a", cluster="c1"),
                                       Connection(3, "127.0.0.1"), 0)
            assert reply is not None and reply.code == 0
    assert audit_records(caplog) == []


# --- the log formats and the bound --------------------------------------------------------

def audit_record(created: float = 0.0) -> logging.LogRecord:
    record = logging.LogRecord("zns", logging.INFO, __file__, 1,
                               "audit: %s %s by %s: %s -> %s",
                               ("kv_put", "'ns/k'", "'127.0.0.1'", "none", "'v'"), None)
    record.audit = {"op": "kv_put", "target": "ns/k", "by": "127.0.0.1", "before": None,
                    "after": "v"}
    record.created = created
    return record


def test_the_json_format_has_the_audit_fields() -> None:
    line = json.loads(JsonFormatter().format(audit_record()))
    assert line["message"] == "audit: kv_put 'ns/k' by '127.0.0.1': none -> 'v'"
    assert {k: line[k] for k in ("op", "target", "by", "before", "after")} == {
        "op": "kv_put", "target": "ns/k", "by": "127.0.0.1", "before": None, "after": "v"}


def test_the_repeat_filter_bounds_audit_lines() -> None:
    repeat = RepeatFilter(window_s=10, burst=20)
    passed = sum(repeat.filter(audit_record(created=1.0)) for _ in range(1000))
    assert passed == 20

"""zns.drivers.worker.ReplicaService.load: a worker serves the state machine its fork copied
when the first state transfer is at the seq it was forked at, and the dump otherwise."""

from __future__ import annotations

from pathlib import Path

from helpers import register_fields, zns1_ok
from zns.core.service import NameService
from zns.drivers.kv_file import KvStore
from zns.drivers.worker import Forked, ReplicaService


def primary(tmp_path: Path) -> NameService:
    service = NameService(KvStore(str(tmp_path / "kv.log")), epoch="e1", started_at_ms=0)
    zns1_ok(service, "register_broker", **register_fields(topics={"T": {}}))
    zns1_ok(service, "kv_put", namespace="ns", key="k", value="v")
    return service


def test_the_forked_machine_is_served_without_decoding_the_dump(tmp_path: Path) -> None:
    service = primary(tmp_path)
    replica = ReplicaService(1, forked=Forked(7, service.state), started_at_ms=0)
    replica.load(7, b"not a dump: never decoded")
    assert replica.state is service.state and replica.epoch == "e1"
    assert zns1_ok(replica, "get_route", topic="T").route.brokers[0].broker_name == "broker-a"
    # Its KV is its own, in memory: the state process's file is not the worker's to write.
    assert zns1_ok(replica, "kv_get", namespace="ns", key="k").value == "v"
    assert replica.state.kv is not service.kv and replica.state.kv.list("ns") == {"k": "v"}


def test_a_transfer_at_another_seq_is_loaded_from_its_dump(tmp_path: Path) -> None:
    service = primary(tmp_path)
    dump = service.state.dump()
    forked = NameService(KvStore(None), epoch="old", started_at_ms=0)
    replica = ReplicaService(1, forked=Forked(7, forked.state), started_at_ms=0)
    replica.load(8, dump)
    assert replica.state is not forked.state and replica.epoch == "e1"
    assert zns1_ok(replica, "get_route", topic="T").route.brokers[0].broker_name == "broker-a"
    # Only the first transfer can be the fork's: a later one is always its dump.
    replica.load(7, dump)
    assert replica.state is not forked.state

"""What keeps the memory of `zns serve --workers N` down (bench/workers.py, workers_memory):
the pages forked workers share with the state process stay shared (gc.freeze at each fork,
and a state that makes no reference cycles, which a frozen object could never free), the
state process encodes no event but those it ships with their command, and no process
imports asyncio and ssl unless CURVE is on."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from helpers import register_fields, zns1_events, zns1_ok
from zns.core.replication import MAX_SHIPPED_EVENTS, Primary
from zns.core.service import NameService
from zns.drivers.heap import HeapTrim
from zns.drivers.kv_file import KvStore
from zns.drivers.replication_link import PrimaryLink, fork_worker
from zns.drivers.state_process import PrimaryService


def test_a_fork_freezes_what_is_alive_in_both_processes() -> None:
    """After the fork neither process's collector writes to the objects alive at it: they
    are in the permanent generation, in the worker and in the state process."""
    gc.unfreeze()
    alive = [{"n": n} for n in range(1_000)]  # containers the collector tracks
    link = PrimaryLink(Primary(now=0), dump=lambda: b"", execute=lambda w, r: (None, b""))

    def main(sock: object, written: object) -> int:
        return 0 if gc.get_freeze_count() >= len(alive) else 3

    try:
        pid, _ = fork_worker(link, main, 0)
        assert gc.get_freeze_count() >= len(alive)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the worker's objects were not frozen"
    finally:
        link.close()
        gc.unfreeze()


def churn(service: NameService) -> None:
    """Registrations, re-registrations that change and that do not, unregistrations,
    expiry, KV writes: every kind of change the state sees."""
    for rnd in range(3):
        for b in range(60):
            topics = {f"T{b // 2 * 5 + t}": {"read_queue_nums": 4 + rnd % 2} for t in range(5)}
            zns1_ok(service, "register_broker", now=1000 * rnd + b, **register_fields(
                broker_name=f"b{b}", addr=f"10.0.0.{b}:10911", topics=topics,
                heartbeat_timeout_ms=10_000 + 1000 * (b % 3)))
        for b in range(0, 60, 7):
            zns1_ok(service, "unregister_broker", cluster="c1", broker_name=f"b{b}",
                    broker_id=0, broker_addr=f"10.0.0.{b}:10911")
        zns1_ok(service, "kv_put", namespace="ns", key=f"k{rnd}", value="v")
        zns1_ok(service, "kv_delete", namespace="ns", key=f"k{rnd}")
    for now in range(10_000, 40_000, 500):
        service.expire(now)
    assert service.table.broker_count() == 0


def test_the_state_makes_no_reference_cycles() -> None:
    """A frozen object is never freed as part of a cycle: what the state drops must go by
    its reference count alone, or every fork would leak what it froze."""
    service = NameService(KvStore(None), epoch="e", started_at_ms=0)
    gc.collect()
    gc.disable()
    try:
        churn(service)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_the_state_process_encodes_only_the_events_it_ships() -> None:
    """Its events are counted (and trim the heap); it makes frames of a step's events only
    when they are few enough to travel with the command (MAX_SHIPPED_EVENTS: each worker
    publishes them as they come), never of a large registration's (each worker's replica
    makes its own), and answers no read."""
    service = PrimaryService(KvStore(None), epoch="e", started_at_ms=0)
    service.heap = HeapTrim(None, 0)
    many = {f"T{i}": {} for i in range(MAX_SHIPPED_EVENTS)}  # and the broker's: one too many
    _, events = zns1_events(service, "register_broker", **register_fields(topics=many))
    assert events == []
    assert service.published["route"] == MAX_SHIPPED_EVENTS and service.published["broker"] == 1
    _, events = zns1_events(service, "register_broker", **register_fields(
        broker_name="broker-b", addr="10.0.0.2:10911", topics={"U1": {}, "U2": {}}))
    assert [channel for channel, _ in events] == [b"broker/c1/broker-b\0", b"route/U1\0",
                                                  b"route/U2\0"]
    zns1_ok(service, "unregister_broker", cluster="c1", broker_name="broker-a", broker_id=0,
            broker_addr="10.0.0.1:10911")
    assert service.removals == {"unregistered": 1}
    assert service.heap.pending == 2 * (MAX_SHIPPED_EVENTS + 1) + 3
    assert len(service.encoded) == 0


def test_serving_imports_no_asyncio_and_no_ssl() -> None:
    """zmq.auth.thread (CURVE's ZAP handler) and zmq.utils.monitor import asyncio, and with
    it ssl: some megabytes in every process, for nothing without CURVE."""
    code = ("import sys, zns.cli.serve, zns.drivers.state_process, zns.drivers.worker, "
            "zns.drivers.remoting_listener, zns.drivers.metrics; "
            "print(sorted(m for m in ('asyncio', 'ssl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"

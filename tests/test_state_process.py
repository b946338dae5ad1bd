"""zns.drivers.state_process and zns.drivers.worker without processes: what a forwarded
command does to the state process's service and what it replicates, and what a worker
forwards."""

from __future__ import annotations

import msgspec

from helpers import register_fields, zns1_ok
from zns.core.schema import RegisterBroker
from zns.core.state import AnyCommand, Renew, Suspect, Write, decode_command
from zns.drivers.kv_file import KvStore
from zns.drivers.state_process import PrimaryService, execute
from zns.drivers.worker import ReplicaService, WriteAnswer

ADDR = "10.0.0.1:10911"


class RecordingLink:
    """A PrimaryLink that keeps what it was asked to replicate."""

    def __init__(self) -> None:
        self.replicated: list[AnyCommand] = []
        self.shipped: list[list[bytes] | None] = []  # the events sent with each

    def append(self, command: bytes, now: int, events: list[bytes] | None = None) -> int:
        self.replicated.append(decode_command(command))
        self.shipped.append(events)
        return len(self.replicated)

    def flush(self, now: int) -> None:
        pass


def test_a_hint_every_worker_forwards_changes_the_state_and_is_replicated_once() -> None:
    service = PrimaryService(KvStore(None), epoch="e", started_at_ms=0, version="test")
    link = RecordingLink()
    service.link = link  # type: ignore[assignment]
    zns1_ok(service, "register_broker", now=1000,
            **register_fields(addr=ADDR, heartbeat_timeout_ms=12_000))
    assert len(link.replicated) == 1  # the registration
    deadline = service.next_deadline()
    hint = msgspec.msgpack.encode(Suspect(cluster="c1", addr=ADDR, grace_ms=1000, now=0))

    answers = [msgspec.msgpack.decode(execute(service, hint, now)[1], type=WriteAnswer)
               for now in (2000, 2001)]  # worker 1's copy, then worker 2's

    assert [answer.outcome.shortened for answer in answers if answer.outcome] == [True, False]
    assert [type(c) for c in link.replicated[1:]] == [Suspect]
    suspect = link.replicated[1]
    assert isinstance(suspect, Suspect) and suspect.now == 2000  # the state process's clock
    # A quarter of the 12 s timeout after the hint, sooner than the broker's own deadline.
    assert service.next_deadline() == 2000 + 3000 < (deadline or 0)


def test_a_hint_about_an_address_not_held_changes_nothing_and_is_not_replicated() -> None:
    service = PrimaryService(KvStore(None), epoch="e", started_at_ms=0, version="test")
    link = RecordingLink()
    service.link = link  # type: ignore[assignment]
    hint = msgspec.msgpack.encode(Suspect(cluster="c1", addr=ADDR, grace_ms=1000, now=0))
    answer = msgspec.msgpack.decode(execute(service, hint, 2000)[1], type=WriteAnswer)
    assert answer.error is None and answer.outcome is not None
    assert not answer.outcome.shortened
    assert link.replicated == []


def test_a_worker_forwards_no_hint_about_an_address_its_replica_does_not_hold() -> None:
    service = ReplicaService(1, started_at_ms=0, version="test")  # no link: nothing to forward
    for n in range(100):  # a peer flooding hints about brokers nobody registered here
        assert not service.suspect("c1", f"10.0.0.{n}:10911", 1000, 2000)


def test_an_unchanged_re_registration_is_replicated_as_its_renewal() -> None:
    service = PrimaryService(KvStore(None), epoch="e", started_at_ms=0, version="test")
    link = RecordingLink()
    service.link = link  # type: ignore[assignment]
    request = msgspec.convert({"id": 1, **register_fields(
        addr=ADDR, topics={f"T{i}": {} for i in range(100)})}, RegisterBroker)
    forwarded = msgspec.msgpack.encode(Write(request=request, now=0, connection=7))
    answers = [msgspec.msgpack.decode(execute(service, forwarded, now)[1], type=WriteAnswer)
               for now in (1000, 31_000, 61_000)]
    assert [type(c) for c in link.replicated] == [Write, Renew, Renew]
    # The registration's events (the broker's and 100 routes') travel with it; a renewal
    # makes none.
    first = link.shipped[0]
    assert first is not None and len(first) == 2 * 101 and link.shipped[1:] == [[], []]
    renewal = link.replicated[2]
    assert isinstance(renewal, Renew) and (renewal.now, renewal.connection) == (61_000, 7)
    assert len(msgspec.msgpack.encode(renewal)) < 200 < len(forwarded)
    # The worker's answer carries the reply, not the renewal (replicated already).
    assert all(a.outcome is not None and a.outcome.renewal is None for a in answers)
    assert answers[1].reply == answers[2].reply


def test_closed_connections_that_registered_nothing_are_not_replicated() -> None:
    # Every worker turn in which remoting connections closed forwards them as one
    # CloseConnections. Those of a client fleet reading routes tie no broker: closing them
    # changes nothing, and was still replicated, applied again by every worker (one command
    # per turn with a close, for every client that came and went). Now only a close that
    # unties a broker is.
    from zns.core.state import CloseConnections

    service = PrimaryService(KvStore(None), epoch="e", started_at_ms=0, version="test")
    link = RecordingLink()
    service.link = link  # type: ignore[assignment]
    request = msgspec.convert({"id": 1, **register_fields(addr=ADDR)}, RegisterBroker)
    execute(service, msgspec.msgpack.encode(Write(request=request, now=0, connection=7)), 1000)
    assert [type(c) for c in link.replicated] == [Write]
    for closed in ([8], [9, 10], []):  # readers' connections
        answer = msgspec.msgpack.decode(
            execute(service, msgspec.msgpack.encode(CloseConnections(connections=closed)),
                    2000)[1], type=WriteAnswer)
        assert answer.error is None
    assert [type(c) for c in link.replicated] == [Write]
    # The registering connection's close removes its broker: replicated.
    execute(service, msgspec.msgpack.encode(CloseConnections(connections=[11, 7])), 3000)
    assert [type(c) for c in link.replicated] == [Write, CloseConnections]
    assert service.table.liveness("c1", ADDR) is None


def test_a_worker_forwards_no_hint_while_the_state_process_reads_nothing() -> None:
    # A worker's writes keep what waits for the state process to read it under
    # max_queued_bytes (zns.core.forwarding); a peer's hints were sent whatever waited, so
    # a peer flooding hints about a held broker at a stalled state process could grow the
    # worker's channel up to its 512 MiB, where it ends and the worker stops.
    from zns.core.service import NameService

    class Link:
        pending = 0

        def __init__(self) -> None:
            self.forwarded: list[bytes] = []

        def forward(self, body: bytes) -> int:
            self.forwarded.append(body)
            return len(self.forwarded)

    service = ReplicaService(1, started_at_ms=0, version="test")
    request = msgspec.convert({"id": 1, **register_fields(addr=ADDR)}, RegisterBroker)
    NameService.apply(service, Write(request=request, now=0))  # as replicated to it
    link = Link()
    service.link = link  # type: ignore[assignment]
    service.suspect("c1", ADDR, 1000, 2000)
    assert len(link.forwarded) == 1
    link.pending = service.forwarded.max_queued_bytes  # the state process reads nothing
    for _ in range(100):
        service.suspect("c1", ADDR, 1000, 2000)
    assert len(link.forwarded) == 1

"""zns.core.figures and what feeds it, without processes: a worker's line in `status`, the
replication lag in ms, the figures' round trip, and their size against a peer's junk."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import msgspec

from zns.drivers.kv_file import KvStore
from zns.core import schema
from zns.core.figures import (
    MAX_FOLLOWER_NAME_BYTES, Overview, StateFigures, WorkerFigures, decode_figures,
    decode_overview, encode, follower_status, with_followers, worker_status,
)
from zns.core.followers import MAX_FOLLOWERS
from zns.core.latency import LatencyHistogram
from zns.core.replication import Ack, Primary, Replica
from zns.core.service import NameService
from zns.drivers.metrics import own_figures
from zns.drivers.replication_link import PrimaryLink, ReplicaLink


def test_a_worker_is_down_starting_or_loaded_and_its_lag_is_what_it_has_not_applied():
    down = worker_status(2, 0, loaded=False, applied=None, seq=9, oldest_unapplied_at=None,
                         now=100)
    assert (down.state, down.pid, down.lag_commands, down.lag_ms) == ("down", 0, 0, 0)
    starting = worker_status(1, 41, loaded=False, applied=9, seq=9, oldest_unapplied_at=None,
                             now=100)
    assert starting.state == "starting"  # in the fence, not serving yet
    behind = worker_status(1, 41, loaded=True, applied=6, seq=9, oldest_unapplied_at=70,
                           now=100)
    assert (behind.state, behind.applied, behind.lag_commands, behind.lag_ms) == (
        "loaded", 6, 3, 30)


def test_a_followers_line_says_who_it_is_since_when_and_how_far_behind_its_gateway():
    behind = follower_status("eu-1", "K" * 40, 1_000, applied=6, seq=9, oldest_unapplied_at=70,
                             now=5_000)
    assert behind == schema.FollowerStatus(name="eu-1", key="K" * 40, admitted_ms=4_000,
                                           applied=6, lag_commands=3, lag_ms=4_930)
    level = follower_status("key K", None, 5_000, applied=9, seq=9, oldest_unapplied_at=None,
                            now=5_000)
    assert (level.key, level.admitted_ms, level.lag_commands, level.lag_ms) == ("", 0, 0, 0)
    # A name is cut to its bound, never inside a character.
    long = follower_status("é" * 100, None, 0, applied=0, seq=0, oldest_unapplied_at=None,
                           now=0)
    assert long.name == "é" * (MAX_FOLLOWER_NAME_BYTES // 2)
    odd = follower_status("a" + "é" * 100, None, 0, applied=0, seq=0, oldest_unapplied_at=None,
                          now=0)
    assert odd.name == "a" + "é" * (MAX_FOLLOWER_NAME_BYTES // 2 - 1)


def test_a_followers_name_shows_on_one_line_and_encodes_whatever_its_key_file_is_called():
    # A key file's name is the operator's: a control character would break `zns status`'s
    # one line per follower, and a name not UTF-8 (os.listdir's surrogates) made the
    # gateway's lines and the worker's report fail to encode, every turn.
    for name, shown in [("eu\n1\x1b[2J", "eu?1?[2J"), ("caf\udce9", "caf?"),
                        ("\x7f\x85ok", "??ok")]:
        line = follower_status(name, None, 0, applied=0, seq=0, oldest_unapplied_at=None,
                               now=0)
        assert line.name == shown
        assert decode_figures(encode(WorkerFigures(worker=1, pid=1, feeds=[line]))).feeds == [
            line]


def test_each_worker_lists_the_followers_of_its_last_report():
    fed = follower_status("eu-1", "K" * 40, 0, applied=9, seq=9, oldest_unapplied_at=None,
                          now=10)
    workers = [worker_status(w, 40 + w, loaded=True, applied=9, seq=9, oldest_unapplied_at=None,
                             now=10) for w in (1, 2, 3)]
    reports = [WorkerFigures(worker=1, pid=41, followers=1, feeds=[fed]),
               WorkerFigures(worker=2, pid=42)]
    assert [w.followers for w in with_followers(workers, reports)] == [[fed], [], []]
    assert workers[0].followers is msgspec.UNSET  # the state process's view has none


def test_the_primary_says_when_the_oldest_command_a_worker_has_not_applied_was_appended():
    primary = Primary(now=0)
    worker = primary.join(0)
    primary.dumped(worker, 0, b"state")  # its state transfer (SendState) carried out
    primary.actions()
    assert primary.unapplied_since(worker) is None  # nothing to apply
    primary.append(b"a", 100)
    primary.append(b"b", 250)
    assert primary.unapplied_since(worker) == 100
    primary.on_message(worker, Ack(1), 300)
    assert primary.unapplied_since(worker) == 250
    primary.on_message(worker, Ack(2), 310)
    assert primary.unapplied_since(worker) is None
    assert primary.unapplied_since(worker + 1) is None  # no such worker


def test_figures_and_the_overview_survive_the_channel():
    figures = WorkerFigures(worker=2, pid=7, requests=[("get_route", "ok", 3)],
                            request_seconds=[("zns1:get_route", [1] * 13, 0.5)],
                            published={"hb": 4}, rss_bytes=1 << 20, cpu_seconds=0.25)
    assert decode_figures(encode(figures)) == figures
    status = worker_status(2, 7, loaded=True, applied=5, seq=5, oldest_unapplied_at=None,
                           now=0)
    overview = Overview(state=StateFigures(pid=1, seq=5, fence=5, ready=True, ready_why="ready",
                                           workers=[status]), reports=[figures])
    assert decode_overview(encode(overview)) == overview
    # `status` carries the same WorkerStatus on the ZNS/1 wire.
    reply = schema.StatusReply(id=1, epoch="e", revision=1, version="v", uptime_ms=0,
                               brokers=0, topics=0, pub_endpoint="", workers=[status])
    assert schema.decode_reply(schema.encode(reply)).workers == [status]


def test_a_peer_s_junk_does_not_grow_a_worker_s_report():
    # Every label of a report comes from a fixed set: junk ops, remoting codes nobody
    # answers and many distinct latency labels add no row past those sets.
    service = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0)
    times = LatencyHistogram()
    server = SimpleNamespace(
        service=service, request_times=times, remoting=None, dropped_replies=0, worker=1,
        timers=SimpleNamespace(stalls=0), subscribers=SimpleNamespace(
            budget=SimpleNamespace(cut=0)), replica=None, following=None)
    for n in range(2000):
        service.respond(msgspec.msgpack.encode({"op": f"junk{n}", "id": n}), 0)
        service.respond(msgspec.msgpack.encode({"op": "get_route", "id": n, "topic": n}), 0)
        service.remoting_counts[-1, 0] += 1  # what the handler counts for an unknown code
        times.observe(f"zns1:junk{n}", 0.001)
    figures = own_figures(server)  # type: ignore[arg-type]
    assert sorted(figures.requests) == [("get_route", "bad_request", 2000),
                                        ("unknown", "unknown_op", 2000)]
    assert len(figures.request_seconds) == 65  # 64 labels, then "other"
    assert len(encode(figures)) < 8 * 1024


def test_a_report_with_every_label_filled_is_under_24_kib():
    # docs/operations.md's bound: every op with every error code (and ok), every remoting
    # code with every response code, 64 latency labels and "other", every count large, and
    # as many followers as a worker feeds, each with the longest name of two-byte characters.
    from zns.core.errors import BY_CODE
    from zns.core.remoting import NAMESERVER_REQUEST_CODES
    from zns.core.remoting.constants import ResponseCode

    ops = [c.__struct_config__.tag for c in schema.AnyRequest.__args__] + ["unknown"]
    figures = WorkerFigures(
        worker=64, pid=4_000_000, requests=[(op, code, 10**12) for op in ops
                                            for code in [*BY_CODE, "ok"]],
        remoting_requests=[(code, int(response), 10**12) for code in
                           [*NAMESERVER_REQUEST_CODES, -1] for response in ResponseCode],
        request_seconds=[(f"remoting:{'X' * 30}{n}", [10**12] * 13, 1e9) for n in range(65)],
        published={"route": 10**12, "broker": 10**12, "hb": 10**12}, rss_bytes=2**40,
        cpu_seconds=1e9, followers=MAX_FOLLOWERS, feeds=[
            follower_status("é" * MAX_FOLLOWER_NAME_BYTES, "K" * 40, -2**62, applied=2**62,
                            seq=2**63 - 1, oldest_unapplied_at=-2**62, now=2**62)
        ] * MAX_FOLLOWERS)
    assert len(encode(figures)) < 24 * 1024


def test_the_state_processs_own_figures_with_64_workers_are_under_7_kib():
    # docs/operations.md: the whole a worker receives is the reports and these.
    from zns.core.schema import WorkerStatus

    big = 2**62
    workers = [WorkerStatus(worker=w, pid=4_000_000, state="starting", applied=big,
                            lag_commands=big, lag_ms=big) for w in range(1, 65)]
    reasons = ("unregistered", "expired", "peer_expired", "disconnected", "displaced",
               "not_confirmed")
    state = StateFigures(pid=4_000_000, seq=big, fence=big, ready=False, ready_why="x" * 200,
                         stalls=big, removals={r: big for r in reasons},
                         kv_write_counts=[big] * 20, kv_write_seconds=1e12,
                         worker_restarts=big, transfers=big, workers_dropped=big,
                         dumps_written=big, dump_failures=big, workers=workers, rss_bytes=big, cpu_seconds=1e12)
    assert len(encode(Overview(state=state))) < 7 * 1024


def test_figures_pass_the_links_beside_the_replication_and_leave_it_alone():
    reported: list[tuple[int, bytes]] = []
    wholes: list[bytes] = []
    ours, theirs = socket.socketpair()
    primary = PrimaryLink(Primary(now=0), dump=lambda: b"dump", execute=lambda w, r: (None, b""),
                          reported=lambda worker, body: reported.append((worker, body)))
    worker = primary.add(ours, 0)
    replica = ReplicaLink(theirs, Replica(), apply=lambda seq, c, produce: [], load=lambda seq, d: None,
                          publish=lambda seq, e: None, whole=wholes.append)
    primary.flush(0)
    replica.wait(5000)
    replica.run()  # the state transfer
    replica.report(b"my counts")
    primary.wait(5000)
    primary.run(1)
    assert reported == [(worker, b"my counts")]
    assert primary.primary.workers == [worker]  # a report is no protocol breach
    primary.broadcast(b"the whole", 2)
    primary.flush(2)
    replica.wait(5000)
    replica.run()
    assert wholes == [b"the whole"] and replica.replica.loaded
    primary.close()
    replica.channel.close()


def test_a_worker_reports_what_its_replica_dropped_and_asked_for():
    # /metrics' zns_worker_events_dropped and zns_worker_resyncs: events lost past the bound
    # of those held for the fence leave subscribers a gap, which an operator must see.
    service = NameService(KvStore(None), epoch="e" * 16, started_at_ms=0)
    server = SimpleNamespace(
        service=service, request_times=LatencyHistogram(), remoting=None, dropped_replies=0,
        worker=1, timers=SimpleNamespace(stalls=0),
        subscribers=SimpleNamespace(budget=SimpleNamespace(cut=0)),
        replica=SimpleNamespace(dropped_events=3, resyncs=2), following=lambda: fed)
    fed = [follower_status(name, None, 0, applied=1, seq=1, oldest_unapplied_at=None, now=0)
           for name in ("a", "b")]
    figures = own_figures(server)  # type: ignore[arg-type]
    assert (figures.events_dropped, figures.resyncs, figures.followers) == (3, 2, 2)
    assert figures.feeds == fed
    assert decode_figures(encode(figures)) == figures
    server.replica = None  # one process: no replica, nothing dropped there
    alone = own_figures(server)  # type: ignore[arg-type]
    assert (alone.events_dropped, alone.resyncs) == (0, 0)

"""What `/metrics` and `status` show of the whole under `zns serve --workers N`.

A scrape, or a `status` request, reaches one worker (the kernel picks it), yet
must show every process. So each process's figures travel as plain data over
the replication channels: every worker sends a `WorkerFigures` of its own
counts to the state process once a second; the state process keeps the last
one of each live worker and, once a second, sends every worker an `Overview`:
its own figures, each worker's state in the replication (`WorkerStatus`), and
those last reports. A worker answers from its own live counts for itself and
from the last `Overview` for the rest, so another process's figure is at most
two report periods old (plus how late a loaded loop runs its timer).

These are msgpack-encoded msgspec Structs of ints and short strings; their
size is bounded by the label sets they carry (request ops and error codes,
remoting request and response codes, at most `latency.MAX_LABELS` latency
labels), not by any peer. Sans-I/O: data and pure functions only.
"""

from __future__ import annotations

import unicodedata

import msgspec

from zns.core.schema import FollowerStatus, WorkerStatus

REPORT_INTERVAL_MS = 1000  # each worker's report, and the state process's overview
MAX_FOLLOWER_NAME_BYTES = 64  # of a follower's name in a report and in `status`


class WorkerFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's own counts (its `worker` number, 1..N); counters count from its start."""

    worker: int
    pid: int
    requests: list[tuple[str, str, int]] = []  # ZNS/1: (op, outcome, count)
    remoting_requests: list[tuple[int, int, int]] = []  # (request code, response code, count)
    request_seconds: list[tuple[str, list[int], float]] = []  # (label, bucket counts, sum)
    encoded_msgpack_bytes: int = 0
    encoded_json_bytes: int = 0
    published: dict[str, int] = {}  # events by channel kind
    dropped_replies: int = 0
    stalls: int = 0
    remoting_connections: int = 0
    remoting_max_connections: int = 0
    subscribers_cut: int = 0
    # Writes forwarded to the state process (zns.core.forwarding): refused `busy` past the
    # in-flight bound, answered `busy` for want of an answer in time; and the times ZNS/1
    # requests stopped being read, past the bounds of those held (the writes' own and the
    # later requests of their connections).
    writes_refused: int = 0
    writes_timed_out: int = 0
    request_pauses: int = 0
    # Its replica's (zns.core.replication.Replica): events dropped unpublished past the bound
    # of those held for the commit fence, and the states it asked for after a command out of
    # order.
    events_dropped: int = 0
    resyncs: int = 0
    followers: int = 0  # read replicas on other hosts it feeds (zns.drivers.followers)
    # Each of them (at most zns.core.followers.MAX_FOLLOWERS), as its gateway saw it last
    # (`follower_status`). Beside `followers`, not instead: a follower on another host,
    # perhaps of an older version, decodes the overview its gateway passes on.
    feeds: list[FollowerStatus] = []
    rss_bytes: int = 0
    cpu_seconds: float = 0.0


class StateFigures(msgspec.Struct, frozen=True, kw_only=True):
    """The state process's own counts and its view of the workers."""

    pid: int
    seq: int  # the last command applied and replicated
    fence: int  # the lowest seq written to every live worker (the commit fence)
    ready: bool
    ready_why: str
    stalls: int = 0
    removals: dict[str, int] = {}
    kv_write_counts: list[int] = []  # per bucket of kv_file.WRITE_BOUNDS, then +Inf
    kv_write_seconds: float = 0.0
    worker_restarts: int = 0
    transfers: int = 0  # state transfers sent (joins, resyncs, workers past the tail)
    workers_dropped: int = 0  # workers dropped for silence or a protocol violation
    dumps_written: int = 0  # state dumps written (--state-path), and those that failed
    dump_failures: int = 0
    workers: list[WorkerStatus] = []
    rss_bytes: int = 0
    cpu_seconds: float = 0.0
    # `--cpus auto` (zns.core.pairing): the CPU the state process and worker 1 share (-1: not
    # paired), and how often they were let go.
    paired_cpu: int = -1
    pair_releases: int = 0


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    """State process -> every worker: the whole, as of `StateFigures`' making."""

    state: StateFigures
    reports: list[WorkerFigures] = []  # the last of each live worker that reported


_encoder = msgspec.msgpack.Encoder()
_figures = msgspec.msgpack.Decoder(WorkerFigures)
_overview = msgspec.msgpack.Decoder(Overview)


def encode(value: WorkerFigures | Overview) -> bytes:
    return _encoder.encode(value)


def decode_figures(body: bytes) -> WorkerFigures:
    """A worker's report; raises msgspec.DecodeError on anything else."""
    return _figures.decode(body)


def decode_overview(body: bytes) -> Overview:
    """The state process's overview; raises msgspec.DecodeError on anything else."""
    return _overview.decode(body)


def worker_status(worker: int, pid: int, *, loaded: bool, applied: int | None, seq: int,
                  oldest_unapplied_at: int | None, now: int) -> WorkerStatus:
    """A worker's line in `status`: `applied` None means it is not in the fence (yet, or
    any more); `oldest_unapplied_at` is when the first command it has not applied was
    appended (None: it applied everything)."""
    if pid == 0:
        state = "down"
    elif loaded and applied is not None:
        state = "loaded"
    else:
        state = "starting"
    done = applied if applied is not None else 0
    lag_commands, lag_ms = _lag(applied, seq, oldest_unapplied_at, now)
    return WorkerStatus(worker=worker, pid=pid, state=state, applied=done,
                        lag_commands=lag_commands, lag_ms=lag_ms)


def follower_status(name: str, key: str | None, admitted_at: int, *, applied: int | None,
                    seq: int, oldest_unapplied_at: int | None, now: int) -> FollowerStatus:
    """A follower's line under its gateway worker in `status`: admitted at `admitted_at`,
    acknowledged `applied` of the gateway's `seq` (None: not fed, a moment between two
    states); `oldest_unapplied_at`: when the gateway applied the first command it has not
    acknowledged (None: none). Its name (a key file's, the operator's) shows each control
    character, and each byte that is not UTF-8 (a surrogate of os.listdir), as `?`, so that
    it is one line and encodes; then it is cut to MAX_FOLLOWER_NAME_BYTES."""
    lag_commands, lag_ms = _lag(applied, seq, oldest_unapplied_at, now)
    shown = "".join("?" if unicodedata.category(c) in ("Cc", "Cs") else c for c in name)
    cut = shown.encode()[:MAX_FOLLOWER_NAME_BYTES].decode(errors="ignore")
    return FollowerStatus(name=cut, key=key or "", admitted_ms=max(0, now - admitted_at),
                          applied=applied if applied is not None else 0,
                          lag_commands=lag_commands, lag_ms=lag_ms)


def with_followers(workers: list[WorkerStatus], reports: list[WorkerFigures]) -> list[WorkerStatus]:
    """Each worker's line with the followers it feeds, from its last report (none without
    one: it has not reported yet, or it is down)."""
    fed = {report.worker: report.feeds for report in reports}
    return [msgspec.structs.replace(status, followers=list(fed.get(status.worker, ())))
            for status in workers]


def _lag(applied: int | None, seq: int, oldest_unapplied_at: int | None,
         now: int) -> tuple[int, int]:
    """(commands, ms) behind `seq`: 0 commands when `applied` is None (nothing is fed)."""
    commands = max(0, seq - applied) if applied is not None else 0
    return commands, 0 if oldest_unapplied_at is None else max(0, now - oldest_unapplied_at)

"""Warm restarts: the state dump a restarted server serves its routes from. Sans-I/O.

A restarted zns (an upgrade, a crash, `--supervise` after libzmq's abort) used to come
back empty, and clients got TOPIC_NOT_EXIST until every broker's next registration.
The server now writes its route table to a dump (zns.drivers.state_file) and takes it
back at start, before it serves:

- `encode_dump`/`decode_dump`: the file's bytes. A header (magic, format version,
  CRC-32 of the body) and the body: `StateDump` in MessagePack. A body that fails its
  CRC, its schema or `check_state` is `CorruptDump`; a newer format is `NewerDump`;
  bytes that do not even begin as a dump (`begins_as_dump`) are some other file.
  Format 2 added the emptied namespaces; a format-1 dump (written before) is read as
  one with none, so an upgrade is a warm restart too.
- `restore`: the dump into a fresh NameService, as the state machine's `Restore`
  command (its one way in, zns.core.state). Every broker address is alive but not
  yet confirmed, and is removed as `not_confirmed` unless it registers or heartbeats
  within `confirm_within_ms`: its registration period. Remoting connections are gone
  after a restart, so nothing is tied to one; a RocketMQ broker is tied again at its
  next registration (§12), and until then the next dump still counts it as one
  (`dump`'s `restored_remoting`). The namespaces a remoting delete emptied (§15: they
  change GET_KVLIST_BY_NAMESPACE's reply) are remembered again, oldest first, at most
  `max_kv_namespaces` of them, the latest.
- The epoch is new, and revisions start again at 1: the dump does not say which
  events the old process published after it was written, nor which of them clients
  saw, so no client may take the new history for a continuation of the old one.
  A client sees the new epoch and pulls again, exactly as after a cold restart (§7).
- `DumpSchedule`: when the driver writes (debounced: at most one write per
  `interval_ms`, and never two at once).

The KV store is not in the dump: it is durable on its own (zns.drivers.kv_file), and
the order configurations restored are the KV store's. Which of its namespaces a remoting
delete emptied is not in the KV file (an empty namespace holds no entry): it is in the dump.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection

import msgspec
from msgspec import Struct

from zns.core.errors import ZnsError
from zns.core.service import NameService
from zns.core.state import Restore
from zns.core.table_state import TableState

MAGIC = b"ZNS-STATE\n"
FORMAT = 2  # the dump format this zns writes and the newest it reads (1: no `emptied`)
HEADER_BYTES = len(MAGIC) + 2 + 4  # magic, format (u16), CRC-32 of the body (u32)

# RocketMQ's broker registers with every NameServer each registerNameServerPeriod
# (default 30 s; the broker clamps it to 10-60 s). A registration in flight when the old
# process stopped is not retried before the next period, and the next one opens a new
# connection first (the broker's connectTimeoutMillis, 3 s by default) on a broker that
# may itself be busy: REMOTING_CONFIRM_MARGIN_MS covers that, three times over.
ROCKETMQ_REGISTER_PERIOD_MS = 30_000
REMOTING_CONFIRM_MARGIN_MS = 10_000

# Writes at most once per this, a change is in the file at most this long (plus the
# write itself) after it is made.
DEFAULT_DUMP_INTERVAL_MS = 1_000

_decoder = msgspec.msgpack.Decoder()


class CorruptDump(ZnsError, ValueError):
    """The dump cannot be used (truncated, altered, or not a dump): the server starts empty."""


class NewerDump(ZnsError, ValueError):
    """The dump was written by a newer zns, in a format this one does not read."""


class StateDump(Struct, array_like=True, frozen=True):
    written_ms: int  # the wall clock when it was made (for the log line at start)
    table: TableState
    remoting: list[tuple[str, str]]  # (cluster, addr): registered over a remoting connection
    # The namespaces a remoting delete emptied, oldest first (StateMachine.emptied_namespaces);
    # absent from a format-1 dump, which decodes with none.
    emptied: list[str] = []


_dump_decoder = msgspec.msgpack.Decoder(StateDump)


def dump(service: NameService, written_ms: int, table: TableState | None = None,
         restored_remoting: Collection[tuple[str, str]] = ()) -> StateDump:
    """The service's state: `table` (its table's, made in steps by the caller while nothing
    changed) or, when None, the table's now, in one pass; the emptied namespaces as they
    are now. `restored_remoting`: the `remoting` of the dump this service was restored
    from. An address of it not heard since is tied to no connection yet and is still a
    RocketMQ broker's: it stays in `remoting`, or a second restart would give it its own
    timeout (120 s for a RocketMQ broker by default) instead of the registration period."""
    if table is None:
        table = service.table.dump()
    remoting = [(a.cluster, a.addr) for a in table.addresses
                if any(service.tied_connection(a.cluster, a.addr, name) is not None
                       for name in a.names)
                or ((a.cluster, a.addr) in restored_remoting
                    and _unconfirmed(service, a.cluster, a.addr))]
    return StateDump(written_ms=written_ms, table=table, remoting=remoting,
                     emptied=service.state.emptied_namespaces())


def _unconfirmed(service: NameService, cluster: str, addr: str) -> bool:
    live = service.table.liveness(cluster, addr)
    return live is not None and live.confirm_by is not None


def encode_dump(state: StateDump) -> bytes:
    body = msgspec.msgpack.encode(state)
    return MAGIC + FORMAT.to_bytes(2, "big") + zlib.crc32(body).to_bytes(4, "big") + body


def begins_as_dump(data: bytes) -> bool:
    """Whether `data` begins as a dump this or any zns wrote: with the magic, or with a
    part of it (a file cut short). Anything else is some other file, which a start
    must not take for a damaged dump and replace."""
    return data[:len(MAGIC)] == MAGIC[:len(data)]


def decode_dump(data: bytes) -> StateDump:
    """The dump in `data`; CorruptDump or NewerDump (one line each) when it cannot be used."""
    if len(data) < HEADER_BYTES or not data.startswith(MAGIC):
        raise CorruptDump(f"not a zns state dump ({len(data)} bytes, no header)")
    version = int.from_bytes(data[len(MAGIC):len(MAGIC) + 2], "big")
    if version > FORMAT:
        raise NewerDump(f"written by a newer zns (state format {version}; this zns reads "
                        f"format {FORMAT} and older)")
    crc = int.from_bytes(data[len(MAGIC) + 2:HEADER_BYTES], "big")
    body = memoryview(data)[HEADER_BYTES:]
    if zlib.crc32(body) != crc:
        raise CorruptDump(f"its checksum does not match ({len(body)} bytes of body: "
                          "truncated or altered)")
    try:
        return _dump_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise CorruptDump(f"it does not decode: {exc}") from None


def confirm_within_ms(timeout_ms: int, over_remoting: bool) -> int:
    """How long a restored address may stay unheard: a RocketMQ broker's registration
    period plus a margin (never longer than its own timeout); a ZNS/1 broker's own
    heartbeat timeout."""
    if over_remoting:
        return min(timeout_ms, ROCKETMQ_REGISTER_PERIOD_MS + REMOTING_CONFIRM_MARGIN_MS)
    return timeout_ms


def restore(service: NameService, state: StateDump, now: int) -> None:
    """Take the dump into a service that holds no broker yet. CorruptDump (and nothing
    changed) when the dump does not hold together."""
    remoting = set(state.remoting)
    windows = [confirm_within_ms(a.timeout_ms, (a.cluster, a.addr) in remoting)
               for a in state.table.addresses]
    try:
        service.apply(Restore(table=state.table, confirm_within_ms=windows, now=now,
                              emptied=state.emptied))
    except ValueError as exc:
        raise CorruptDump(f"it does not hold together: {exc}") from None


class DumpSchedule:
    """When to write the next dump: after a change, at most once per `interval_ms`,
    never while a write is under way. The driver reports `started`/`finished`."""

    def __init__(self, interval_ms: int = DEFAULT_DUMP_INTERVAL_MS, written: int = 0) -> None:
        """`written`: the state machine's `changes` count the file already holds."""
        self.interval_ms = interval_ms
        self.written = written  # the change count of the last dump made
        self._writing = False
        self._last_start: int | None = None
        self._pending = written

    def next_deadline(self, changes: int, now: int) -> int | None:
        """When a dump is due (None: nothing to write, or a write is under way)."""
        if self._writing or changes == self.written:
            return None
        if self._last_start is None:
            return now
        return max(now, self._last_start + self.interval_ms)

    def started(self, changes: int, now: int) -> None:
        """A dump of the state at change count `changes` (StateMachine.changes) is being written."""
        self._writing = True
        self._last_start = now
        self._pending = changes

    def finished(self, ok: bool) -> None:
        """The write ended; when it failed, the same changes are due again next interval."""
        self._writing = False
        if ok:
            self.written = self._pending

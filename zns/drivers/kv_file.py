"""The KV store of §6: namespaces of string keys and values, durable in an append-only log.

Why a log: rewriting the whole file on every write made a put cost the size of
the whole store (320 ms with 2,000 values of 64 KiB), and the server loop
answers nobody meanwhile. Here a put or delete appends one record and fsyncs
before it returns, so it costs its own size.

File format (`path`, by default `~/.zns/kv.log`; an existing `~/.zns/kv.json`, the
default name of earlier versions, is used when `kv.log` is not there)::

    b"ZNS KV log 1\\n"                                   the header, once
    b"\\xffKV1" | length u32 LE | crc u32 LE | payload   one record per write

`payload` is the msgpack array `[namespace, key, value]`, `value` nil for a
delete; `crc` is the CRC-32 of the length bytes and the payload. Replaying the
records in order gives the store. A file that starts with `{` is the JSON
format of earlier versions (`{namespace: {key: value}}`): it is read, and
converted to a log at start (the JSON file is kept as `<path>.bak`).

Only the last record can be torn by a crash, and only while it was not yet
acknowledged: a record that fails its check with no valid record after it is
cut at start (logged). A bad record with a valid one after it means the file
is damaged, not torn: that is a `KvFileError`, and the file is left alone.

Compaction keeps the log within about twice the live size without one request
paying for the whole store. When the log passes max(2 x live records,
`compact_min_bytes`), the next write creates `<path>.next` and from then on
every write goes there: it appends a slice of the live entries (at least
twice its own record and `step_bytes`, in whole entries) followed by its own
record, with one fsync. `<path>.next` is a continuation of the log: replaying
`path` then `<path>.next` gives the store at every moment, because each
copied entry is its current value and later writes come after it. When every
entry has been copied, `<path>.next` holds the whole store: the old log is
kept as `<path>.bak` (a hard link) and `<path>.next` is renamed over `path`,
then the directory is fsynced. The write that creates `<path>.next` also
fsyncs the directory before it is acknowledged, so the new name is durable.
A compaction starts only when its whole copy fits in the free disk space;
until then writes go on appending to the log.

The decisions (when to compact, what a slice holds, when a full disk refuses a
put) are `zns.core.kv_log`'s; this module reads and writes the files.

At start, a leftover `<path>.next` (a crash mid-compaction) is replayed after
`path`, and the copy is carried on where it stopped: only the entries whose
latest record is not in `<path>.next` yet are copied, as running would have,
so a start needs no more space than the compaction it finishes. A log over its
bound at start is compacted the same way, when its copy fits. Nobody is
waiting at start, so the whole copy is made then; if an append fails (a disk
filled by something else), it is cut again, a WARNING says so, and the server
starts with the compaction still running: later writes carry it on, as they
would have.

A put is refused (`internal`, saying why) while the file system holding the
log has less free space than writing every live record once more needs, so a
compaction that started, running or at the next start, can always finish.

A write that cannot be made durable (write or fsync fails) is cut from the
file again and raises OSError; nothing changes in memory. If even the cut
fails, the store refuses every later write until the server restarts.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from zns.core.config import DEFAULT_KV_PATH
from zns.core.errors import Internal, KvFileError
from zns.core.kv import entry_bytes
from zns.core.latency import Histogram
from zns.core.kv_log import (
    COMPACT_MIN_BYTES,
    HEAD,
    MAGIC,
    MARKER,
    MAX_PAYLOAD,
    STEP_BYTES,
    CompactionCopy,
    KvLogPolicy,
    encode_record,
)
from zns.drivers import file_lock
from zns.drivers.io_errors import map_exceptions

log = logging.getLogger("zns")

_FileFormat = dict[str, dict[str, str]]

DEFAULT_PATH = DEFAULT_KV_PATH  # `zns serve --kv-path`'s default (zns.core.config)
LEGACY_DEFAULT_PATH = "~/.zns/kv.json"  # the default of earlier versions (a log all the same)

# The record format and the compaction's sizes are the core's (zns.core.kv_log); named here too
# because tools and tests read files through this module.
__all__ = ["COMPACT_MIN_BYTES", "DEFAULT_PATH", "MAGIC", "MARKER", "MAX_PAYLOAD", "STEP_BYTES",
           "KvStore", "WRITE_BOUNDS", "encode_record", "read_kv_file"]
REWRITE_CHUNK_BYTES = 1 << 20  # what a start writes per append (a conversion, the rest of a copy)
# A write the file system refused (a failed fsync, a full disk) is the server's own
# `internal` error: the request that asked for it is answered so and changes nothing.
NOT_DURABLE = map_exceptions([(OSError, None, Internal)], "the KV store could not be written durably: ")

_Record = tuple[str, str, "str | None"]
_decode_payload = msgspec.msgpack.Decoder(tuple[str, str, str | None]).decode


# The buckets of `KvStore.write_times`, in seconds: how long durable appends (write and
# fsync) took, from a fast SSD's to a loaded disk's.
WRITE_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def read_kv_file(path: str | os.PathLike[str]) -> _FileFormat:
    """The entries a restart would read from `path` (the log, or the earlier JSON format),
    then `<path>.next` when a compaction was running, without changing either file.

    A torn last record is ignored, as at start; a damaged file is a KvFileError.
    For tools and tests: the server reads its file through `KvStore`.
    """
    data: _FileFormat = {}
    path = Path(path)
    _replay_file(path, data, continuation=False)
    nxt = _sibling(path, ".next")
    if nxt.exists():
        _replay_file(nxt, data, continuation=True)
    return data


def free_disk_bytes(directory: Path) -> int:
    """Bytes an unprivileged user may still write on the file system holding `directory`."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


class KvStore:
    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
        step_bytes: int = STEP_BYTES,
        free_bytes: Callable[[Path], int] = free_disk_bytes,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`path` None keeps the store in memory only (for tests and tools). `free_bytes`
        says how much the file system of a directory has free (the space rule's input);
        `clock` times each durable append (`write_times`).

        KvFileError at once when `path` cannot hold the store (its directory is a
        file or not writable), not at the first write."""
        # The real file (file_lock.real_file): a symlink given stays one, its target written.
        self.path = file_lock.real_file(_default_or_legacy(Path(path))) \
            if path is not None else None
        self.policy = KvLogPolicy(compact_min_bytes, step_bytes)
        self._free_bytes = free_bytes
        self._clock = clock
        self._data: _FileFormat = {}
        self._bytes = 0  # UTF-8 bytes of the live entries (`entry_bytes`)
        self._live = 0  # bytes the live entries take as records: what compaction writes
        self._fd: int | None = None  # the log being appended to (None: not created yet)
        self._size = 0  # its length
        self._compaction: CompactionCopy | None = None
        self._old_fd: int | None = None  # the log being compacted, while `_compaction` runs
        self._broken = ""  # why writes are refused, after a write that could not be undone
        self._put_off = False  # a compaction is due but does not fit (said once)
        self.write_times = Histogram(WRITE_BOUNDS)  # durable appends' seconds, for metrics
        # One store per file (zns.drivers.file_lock): taken before the file is read, or at the
        # first write when its directory does not exist yet.
        self._lock: file_lock.FileLock | None = None
        if self.path is not None:
            try:
                self._open()
            except BaseException:
                self.close()
                raise

    # --- reads ------------------------------------------------------------

    def get(self, namespace: str, key: str) -> str | None:
        return self._data.get(namespace, {}).get(key)

    def list(self, namespace: str) -> dict[str, str]:
        return dict(self._data.get(namespace, {}))

    def namespaces(self) -> tuple[str, ...]:
        return tuple(self._data)

    def count(self, namespace: str | None = None) -> int:
        """Entries in `namespace`, or with None the number of namespaces."""
        return len(self._data) if namespace is None else len(self._data.get(namespace, {}))

    def total_bytes(self) -> int:
        """UTF-8 bytes of every live namespace, key and value (what `--max-kv-bytes` bounds)."""
        return self._bytes

    def file_bytes(self) -> int:
        """Bytes in the log files now (`path`, plus `<path>.next` while compacting)."""
        old = self._compaction.old_size if self._compaction is not None else 0
        return self._size + old

    @property
    def log_bytes(self) -> int:
        """The length of the log being appended to (`<path>.next` while compacting)."""
        return self._size

    @property
    def live_record_bytes(self) -> int:
        """Bytes the live entries take as records: what a compaction copies."""
        return self._live

    @property
    def compaction(self) -> CompactionCopy | None:
        """The running compaction's copy, or None."""
        return self._compaction

    # --- writes -------------------------------------------------------------

    def put(self, namespace: str, key: str, value: str) -> bool:
        """Store durably; False when the value was already there (nothing written)."""
        entries = self._data.get(namespace)
        old = entries.get(key) if entries is not None else None
        if old == value:
            return False
        record = encode_record(namespace, key, value)
        with NOT_DURABLE:
            self._check_space(record)
            self._append(record)
        if entries is None:
            entries = self._data[namespace] = {}
        entries[key] = value
        self._account(namespace, key, old, -1)
        self._account(namespace, key, value, +1, len(record))
        self._after_write()
        return True

    def delete(self, namespace: str, key: str) -> bool:
        """Remove durably; False when there was nothing to remove (nothing written)."""
        entries = self._data.get(namespace)
        if not entries or key not in entries:
            return False
        with NOT_DURABLE:
            self._append(encode_record(namespace, key, None))
        old = entries.pop(key)
        if not entries:
            del self._data[namespace]
        self._account(namespace, key, old, -1)
        self._after_write()
        return True

    def disown(self) -> None:
        """In a process forked from the one that writes the file (a worker): close this
        copy's descriptors, which would keep the log (and, after a compaction, the log it
        replaced) open for as long as that process lives, and refuse any write through
        this copy, which would be a second writer. Reads go on from memory."""
        self.close()
        self._broken = "a forked copy of the KV store: only the process that forked it writes"

    def close(self) -> None:
        for fd in (self._fd, self._old_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._old_fd = None
        self._compaction = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- internals: accounting ------------------------------------------------

    def _account(self, namespace: str, key: str, value: str | None, sign: int,
                 record_size: int = 0) -> None:
        if value is None:
            return
        self._bytes += sign * entry_bytes(namespace, key, value)
        self._live += sign * (record_size or len(encode_record(namespace, key, value)))

    def _room_to_compact(self, record_bytes: int) -> bool:
        """Does the whole copy of a compaction fit now? Said once when it does not."""
        assert self.path is not None
        room = self.policy.room_to_compact(self._free_bytes(self.path.parent), self._live,
                                           record_bytes)
        if not room and not self._put_off:
            log.warning("KV log %s is due for compaction, but its %d bytes of live entries do "
                        "not fit in the free disk space: put off until they do", self.path,
                        self._live)
        self._put_off = not room
        return room

    def _check_space(self, record: bytes) -> None:
        """The space rule (zns.core.kv_log): refuse a put that would leave too little room
        to compact. Raises Internal; nothing is written."""
        if self.path is None:
            return
        existing = existing_ancestor(self.path)
        refusal = self.policy.put_refusal(self._free_bytes(existing), self._live, len(record))
        if refusal is not None:
            raise Internal(refusal)

    # --- internals: the durable append ----------------------------------------

    def _append(self, record: bytes) -> None:
        """Make `record` durable, with the next compaction slice; raises OSError, undone."""
        if self.path is None:  # an in-memory store: nothing to make durable
            return
        started = self._clock()
        self._append_durably(record)
        self.write_times.observe(self._clock() - started)

    def _append_durably(self, record: bytes) -> None:
        if self._broken:
            raise OSError(self._broken)
        if self._fd is None:
            self._create(record)
            return
        if self._compaction is None and self.policy.over_bound(self._size, self._live):
            if self._room_to_compact(len(record)):
                self._start_compaction(record)
                return
        if self._compaction is not None:
            budget = self.policy.slice_bytes(len(record))
            chunk, cursor = self._compaction.take(self._data, budget)
            self._write_synced(self._fd, chunk + record)
            self._compaction.advance(cursor)
        else:
            self._write_synced(self._fd, record)

    def _write_synced(self, fd: int, data: bytes) -> None:
        """Append `data` to `fd` and fsync; on failure cut it again and raise."""
        before = self._size
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            self._cut(fd, before, exc)
            raise
        self._size = before + len(data)

    def _cut(self, fd: int, size: int, cause: OSError) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            self._broken = (f"the KV file could not be cut back after a failed write ({cause}; "
                            f"{exc}); restart the server to read what is on disk")
            log.error("%s", self._broken)

    def _create(self, record: bytes) -> None:
        """The first write: the log appears complete (temporary file, fsync, rename)."""
        assert self.path is not None
        path = self.path
        created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        for directory in reversed(created):  # a new directory is durable once its parent is
            _fsync_dir(directory.parent)
        if self._lock is None:  # its directory was made just now: the lock could not be before
            try:
                self._lock = file_lock.hold(path, "--kv-path")
            except KvFileError as exc:
                raise OSError(str(exc)) from None
        tmp = _sibling(path, ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            _write_all(fd, MAGIC + record)
            os.fsync(fd)
            os.replace(tmp, path)
        except OSError:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        try:
            _fsync_dir(path.parent)
        except OSError:  # not durable: take it back, as if never written
            os.close(fd)
            _unlink_quietly(path)
            raise
        self._fd = fd
        self._size = len(MAGIC) + len(record)

    def _start_compaction(self, record: bytes) -> None:
        """Create `<path>.next` with the first slice and `record`; durable with its name."""
        assert self.path is not None and self._fd is not None
        nxt = _sibling(self.path, ".next")
        compaction = CompactionCopy(list(self._data), self._size)
        chunk, cursor = compaction.take(self._data, self.policy.slice_bytes(len(record)))
        data = MAGIC + chunk + record
        fd = os.open(nxt, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
            _fsync_dir(self.path.parent)  # the record is in .next: its name must be durable
        except OSError:
            os.close(fd)
            try:
                os.unlink(nxt)
            except OSError as exc:  # a stray .next would be replayed at start: stop writing
                self._broken = (f"could not remove {nxt} after a failed write ({exc}); restart "
                                f"the server to read what is on disk")
                log.error("%s", self._broken)
            raise
        compaction.advance(cursor)
        self._compaction, self._old_fd = compaction, self._fd
        self._fd = fd
        self._size = len(data)
        log.info("compacting the KV log %s (%d bytes, %d live) into %s",
                 self.path, compaction.old_size, self._live, nxt)

    def _after_write(self) -> None:
        """Finish a compaction whose copy is complete: `.next` becomes `path`."""
        compaction = self._compaction
        if compaction is None or not compaction.done:
            return
        assert self.path is not None and self._old_fd is not None
        path, nxt = self.path, _sibling(self.path, ".next")
        try:
            _keep_backup(path)
            os.replace(nxt, path)  # .next and the records in it are already fsynced
        except OSError as exc:  # nothing is lost: the next write tries again
            log.error("could not finish compacting the KV log %s: %s", path, exc)
            return
        os.close(self._old_fd)
        self._compaction = self._old_fd = None
        try:
            _fsync_dir(path.parent)
        except OSError as exc:  # both names on disk replay to the same store
            log.error("could not fsync the directory of %s after compacting: %s", path, exc)
        log.info("compacted the KV log %s: %d bytes (was %d)", path, self._size,
                 compaction.old_size)

    # --- internals: start ----------------------------------------------------

    def _open(self) -> None:
        assert self.path is not None
        path, nxt = self.path, _sibling(self.path, ".next")
        backup = _sibling(path, ".bak")
        _check_writable(path)
        if path.parent.is_dir():
            self._lock = file_lock.hold(path, "--kv-path")
        _unlink_quietly(_sibling(path, ".tmp"))  # a first write or conversion cut short: never read
        if not path.exists():
            if backup.exists() or nxt.exists():
                other = backup if backup.exists() else nxt
                raise KvFileError(
                    f"KV file {path} is missing but {other} exists; rename it into place to "
                    f"keep its entries, or delete it to start empty"
                )
            return
        legacy, end = _replay_file(path, self._data, continuation=False)
        copied: set[tuple[str, str]] = set()
        next_end = _replay_file(nxt, self._data, continuation=True, touched=copied)[1] \
            if nxt.exists() else None
        for namespace, entries in self._data.items():
            for key, value in entries.items():
                self._account(namespace, key, value, +1)
        if legacy:
            self._convert()
            return
        _cut_torn_tail(path, end)
        if next_end == 0:  # created, then the crash before its first record: nothing in it
            try:
                nxt.unlink()
                _fsync_dir(path.parent)
            except OSError as exc:
                raise KvFileError(f"cannot remove the empty {nxt}: {exc}") from exc
            next_end = None
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._size = end
        if next_end is not None:  # a compaction a crash interrupted: carry on from there
            _cut_torn_tail(nxt, next_end)
            self._compaction = CompactionCopy(list(self._data), end, skip=copied)
            self._old_fd, self._fd = self._fd, os.open(nxt, os.O_WRONLY | os.O_APPEND)
            self._size = next_end
            log.info("KV file %s: carrying on the compaction into %s that a crash interrupted",
                     path, nxt)
        elif self.policy.over_bound(end, self._live) and self._room_to_compact(0):
            try:
                self._start_compaction(b"")
            except OSError as exc:  # nothing changed: the old log serves as it is
                log.warning("KV file %s is over its bound but could not be compacted at start "
                            "(%s); a later write tries again", path, exc)
                return
        self._finish_compaction_at_start()

    def _finish_compaction_at_start(self) -> None:
        """Copy the rest now, while nobody waits; on a full disk leave it to later writes."""
        compaction = self._compaction
        while compaction is not None and not compaction.done:
            assert self._fd is not None
            chunk, cursor = compaction.take(self._data, REWRITE_CHUNK_BYTES)
            try:
                self._write_synced(self._fd, chunk)
            except OSError as exc:  # cut again by _write_synced; .next replays as before
                log.warning("KV file %s: could not finish compacting at start (%s); the "
                            "compaction goes on with later writes", self.path, exc)
                return
            compaction.advance(cursor)
        self._after_write()

    def _convert(self) -> None:
        """Write the store read from the JSON format as a fresh log (at start, once)."""
        assert self.path is not None
        path, nxt, tmp = self.path, _sibling(self.path, ".next"), _sibling(self.path, ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        copy = CompactionCopy(list(self._data), 0)
        size = 0
        try:
            _write_all(fd, MAGIC)
            size = len(MAGIC)
            while not copy.done:
                chunk, cursor = copy.take(self._data, REWRITE_CHUNK_BYTES)
                _write_all(fd, chunk)
                size += len(chunk)
                copy.advance(cursor)
            os.fsync(fd)
            _keep_backup(path)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
            if nxt.exists():  # replayed into `path` now; must not be replayed again
                os.unlink(nxt)
                _fsync_dir(path.parent)
        except OSError as exc:
            os.close(fd)
            _unlink_quietly(tmp)
            raise KvFileError(f"cannot rewrite KV file {path}: {exc}") from exc
        self._fd, self._size = fd, size
        log.info("KV file %s converted from the JSON format (kept as .bak): %d entries, %d bytes",
                 path,
                 sum(len(e) for e in self._data.values()), size)


# --- reading a file -------------------------------------------------------------


def _replay_file(path: Path, data: _FileFormat, *, continuation: bool,
                 touched: set[tuple[str, str]] | None = None) -> tuple[bool, int]:
    """Apply the file's records to `data`: (was it the JSON format, end of the valid records).
    `touched` collects the (namespace, key) of every record read."""
    backup = _sibling(path, ".bak")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise KvFileError(f"cannot read KV file {path}: {exc}") from exc
    if not continuation and raw[:1] == b"{":
        data.update(_decode_json(path, raw, backup))
        return True, len(raw)
    if not raw.startswith(MAGIC):
        if continuation and MAGIC.startswith(raw):  # created, header torn: nothing acknowledged
            return False, 0
        hint = f"; an earlier version is {backup}" if backup.exists() else ""
        raise KvFileError(
            f"KV file {path} is corrupt (neither a zns KV log nor the JSON format){hint}. "
            f"zns will not start over it: repair it, restore the backup, or move it away to "
            f"start empty"
        )
    pos = len(MAGIC)
    while pos < len(raw):
        parsed = _parse_at(raw, pos)
        if parsed is None:
            if _valid_record_after(raw, pos):
                hint = f"; an earlier version is {backup}" if backup.exists() else ""
                raise KvFileError(
                    f"KV file {path} is corrupt (a damaged record at offset {pos} with valid "
                    f"records after it){hint}. zns will not start over it: restore the backup, "
                    f"or cut the file at offset {pos} to keep the entries before it"
                )
            return False, pos  # the torn tail: a write that was never acknowledged
        pos, (namespace, key, value) = parsed
        if touched is not None:
            touched.add((namespace, key))
        if value is None:
            entries = data.get(namespace)
            if entries is not None:
                entries.pop(key, None)
                if not entries:
                    del data[namespace]
        else:
            data.setdefault(namespace, {})[key] = value
    return False, pos


def _parse_at(raw: bytes, pos: int) -> tuple[int, _Record] | None:
    """The record at `pos` and the offset after it, or None when it is not a whole, valid one."""
    if len(raw) - pos < HEAD.size:
        return None
    marker, length, crc = HEAD.unpack_from(raw, pos)
    end = pos + HEAD.size + length
    if marker != MARKER or not 0 < length <= MAX_PAYLOAD or end > len(raw):
        return None
    payload = raw[pos + HEAD.size:end]
    if zlib.crc32(payload, zlib.crc32(raw[pos + 4:pos + 8])) != crc:
        return None
    try:
        return end, _decode_payload(payload)
    except msgspec.DecodeError:  # checksum right, content wrong: not a record we wrote
        return None


def _valid_record_after(raw: bytes, pos: int) -> bool:
    """Is there a valid record anywhere after `pos`? Then `pos` is damage, not a torn tail."""
    at = raw.find(MARKER, pos + 1)
    while at != -1:
        if _parse_at(raw, at) is not None:
            return True
        at = raw.find(MARKER, at + 1)
    return False


def _decode_json(path: Path, raw: bytes, backup: Path) -> _FileFormat:
    try:
        return msgspec.json.decode(raw, type=_FileFormat)
    except msgspec.DecodeError as exc:
        hint = f"; the previous version is {backup}" if backup.exists() else ""
        raise KvFileError(
            f"KV file {path} is corrupt ({exc}){hint}. zns will not start over it: "
            f"repair it, restore the backup, or move it away to start empty"
        ) from exc


# --- small file helpers -----------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _keep_backup(path: Path) -> None:
    """`path` stays where it is while `<path>.bak` becomes another name for it (a hard link)."""
    if not path.exists():
        return
    bak_tmp = _sibling(path, ".bak.tmp")
    bak_tmp.unlink(missing_ok=True)
    os.link(path, bak_tmp)
    os.replace(bak_tmp, _sibling(path, ".bak"))


def _cut_torn_tail(path: Path, end: int) -> None:
    """Cut what follows the valid records at `end`: a write that was never acknowledged."""
    size = path.stat().st_size
    if end < size:
        log.warning("KV file %s: cut a torn last record (%d bytes at offset %d): a write "
                    "that was never acknowledged", path, size - end, end)
        _truncate(path, end)


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _default_or_legacy(path: Path) -> Path:
    """The default path, or the old default's file when only that one exists."""
    path = path.expanduser()
    legacy = Path(LEGACY_DEFAULT_PATH).expanduser()
    if path == Path(DEFAULT_PATH).expanduser() and not path.exists() and legacy.exists():
        log.info("KV file: using %s (the default name of earlier versions; %s is the new one)",
                 legacy, path.name)
        return legacy
    return path


def _check_writable(path: Path) -> None:
    """Refuse at start a path the first write would fail on: the KV file, and the temporary
    and compaction files beside it, are created in its directory."""
    if path.is_dir():
        raise KvFileError(f"KV file {path} is a directory; give a file path (--kv-path)")
    existing = existing_ancestor(path)
    if not existing.is_dir():
        raise KvFileError(f"KV file {path} cannot be created: {existing} is a file, not a "
                          f"directory (--kv-path)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise KvFileError(f"KV file {path} cannot be created: directory {existing} is not "
                          f"writable (--kv-path)")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise KvFileError(f"KV file {path} is not readable and writable (--kv-path)")
    # access() answers yes to root everywhere, and to anyone on /proc or /sys: create a file
    # there once, so a directory that cannot hold one is refused now, not at the first put.
    probe = existing / f".{path.name}.probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise KvFileError(f"KV file {path} cannot be created: no file can be created in "
                          f"{existing} ({exc.strerror}) (--kv-path)") from None
    if existing != path.parent:
        log.warning("KV file %s: directory %s does not exist; the first KV write creates it",
                    path, path.parent)


def existing_ancestor(path: Path) -> Path:
    """The nearest of `path`'s directory and the directories above it that exists (it may be
    a file: the caller checks): where creating `path`, and the directories missing, starts."""
    return next(d for d in (path.parent, *path.parent.parents) if d.exists())


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

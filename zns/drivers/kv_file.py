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
At start, a leftover `<path>.next` (a crash mid-compaction) is replayed after
`path`, and the result is written afresh (temporary file, fsync, rename,
directory fsync).

A write that cannot be made durable (write or fsync fails) is cut from the
file again and raises OSError; nothing changes in memory. If even the cut
fails, the store refuses every later write until the server restarts.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec

from zns.core.config import DEFAULT_KV_PATH
from zns.core.errors import Internal, KvFileError
from zns.core.kv import entry_bytes
from zns.drivers.io_errors import map_exceptions

log = logging.getLogger("zns")

_FileFormat = dict[str, dict[str, str]]

DEFAULT_PATH = DEFAULT_KV_PATH  # `zns serve --kv-path`'s default (zns.core.config)
LEGACY_DEFAULT_PATH = "~/.zns/kv.json"  # the default of earlier versions (a log all the same)

MAGIC = b"ZNS KV log 1\n"
MARKER = b"\xffKV1"  # 0xff never occurs in UTF-8, so rarely inside a record
_HEAD = struct.Struct("<4sII")  # marker, payload length, crc
MAX_PAYLOAD = 1 << 20  # far above the largest entry (§3: names <= 255 chars, values <= 64 KiB)
COMPACT_MIN_BYTES = 4 << 20
STEP_BYTES = 256 << 10
# A write the file system refused (a failed fsync, a full disk) is the server's own
# `internal` error: the request that asked for it is answered so and changes nothing.
NOT_DURABLE = map_exceptions([(OSError, None, Internal)], "the KV store could not be written durably: ")

_Record = tuple[str, str, "str | None"]
_encode_payload = msgspec.msgpack.Encoder().encode
_decode_payload = msgspec.msgpack.Decoder(tuple[str, str, str | None]).decode


class WriteTimes:
    """How many durable appends (write and fsync) took how long: a histogram of plain ints.

    Kept here rather than in a metrics library so the store works without one; a
    scrape in another thread reads the ints (a stale read is one write behind).
    """

    BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BOUNDS) + 1)  # per bucket, the last one past every bound
        self.total_seconds = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.BOUNDS, seconds)] += 1
        self.total_seconds += seconds


def encode_record(namespace: str, key: str, value: str | None) -> bytes:
    """One log record: header and payload (a None value is a delete)."""
    payload = _encode_payload((namespace, key, value))
    length = struct.pack("<I", len(payload))
    return MARKER + length + struct.pack("<I", zlib.crc32(payload, zlib.crc32(length))) + payload


def read_kv_file(path: str | os.PathLike[str]) -> _FileFormat:
    """The entries a file holds (log or earlier JSON format), without changing it.

    A torn last record is ignored, as at start; a damaged file is a KvFileError.
    For tools and tests: the server reads its file through `KvStore`.
    """
    data: _FileFormat = {}
    _replay_file(Path(path), data, continuation=False)
    return data


class KvStore:
    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
        step_bytes: int = STEP_BYTES,
    ) -> None:
        """`path` None keeps the store in memory only (for tests and tools).

        KvFileError at once when `path` cannot hold the store (its directory is a
        file or not writable), not at the first write."""
        self.path = _default_or_legacy(Path(path)) if path is not None else None
        self.compact_min_bytes = compact_min_bytes
        self.step_bytes = step_bytes
        self._data: _FileFormat = {}
        self._bytes = 0  # UTF-8 bytes of the live entries (`entry_bytes`)
        self._live = 0  # bytes the live entries take as records: what compaction writes
        self._fd: int | None = None  # the log being appended to (None: not created yet)
        self._size = 0  # its length
        self._compaction: _Compaction | None = None
        self._broken = ""  # why writes are refused, after a write that could not be undone
        self.write_times = WriteTimes()  # durable appends and their seconds, for metrics
        if self.path is not None:
            self._open()

    # --- reads ------------------------------------------------------------

    def get(self, namespace: str, key: str) -> str | None:
        return self._data.get(namespace, {}).get(key)

    def list(self, namespace: str) -> dict[str, str]:
        return dict(self._data.get(namespace, {}))

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

    # --- writes -------------------------------------------------------------

    def put(self, namespace: str, key: str, value: str) -> bool:
        """Store durably; False when the value was already there (nothing written)."""
        entries = self._data.get(namespace)
        old = entries.get(key) if entries is not None else None
        if old == value:
            return False
        record = encode_record(namespace, key, value)
        with NOT_DURABLE:
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

    def close(self) -> None:
        for fd in (self._fd, self._compaction.old_fd if self._compaction else None):
            if fd is not None:
                os.close(fd)
        self._fd = None
        self._compaction = None

    # --- internals: accounting ------------------------------------------------

    def _account(self, namespace: str, key: str, value: str | None, sign: int,
                 record_size: int = 0) -> None:
        if value is None:
            return
        self._bytes += sign * entry_bytes(namespace, key, value)
        self._live += sign * (record_size or len(encode_record(namespace, key, value)))

    # --- internals: the durable append ----------------------------------------

    def _append(self, record: bytes) -> None:
        """Make `record` durable, with the next compaction slice; raises OSError, undone."""
        if self.path is None:  # an in-memory store: nothing to make durable
            return
        started = time.perf_counter()
        self._append_durably(record)
        self.write_times.add(time.perf_counter() - started)

    def _append_durably(self, record: bytes) -> None:
        if self._broken:
            raise OSError(self._broken)
        if self._fd is None:
            self._create(record)
            return
        if self._compaction is None and self._size > max(2 * self._live, self.compact_min_bytes):
            self._start_compaction(record)
            return
        if self._compaction is not None:
            chunk, cursor = self._compaction.take(self._data, max(2 * len(record), self.step_bytes))
            self._write_synced(self._fd, chunk + record)
            self._compaction.cursor = cursor
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
        compaction = _Compaction(list(self._data), self._fd, self._size)
        chunk, cursor = compaction.take(self._data, max(2 * len(record), self.step_bytes))
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
        compaction.cursor = cursor
        self._compaction = compaction
        self._fd = fd
        self._size = len(data)
        log.info("compacting the KV log %s (%d bytes, %d live) into %s",
                 self.path, compaction.old_size, self._live, nxt)

    def _after_write(self) -> None:
        """Finish a compaction whose copy is complete: `.next` becomes `path`."""
        compaction = self._compaction
        if compaction is None or not compaction.done:
            return
        assert self.path is not None
        path, nxt = self.path, _sibling(self.path, ".next")
        try:
            _keep_backup(path)
            os.replace(nxt, path)  # .next and the records in it are already fsynced
        except OSError as exc:  # nothing is lost: the next write tries again
            log.error("could not finish compacting the KV log %s: %s", path, exc)
            return
        os.close(compaction.old_fd)
        self._compaction = None
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
        if not path.exists():
            if backup.exists() or nxt.exists():
                other = backup if backup.exists() else nxt
                raise KvFileError(
                    f"KV file {path} is missing but {other} exists; rename it into place to "
                    f"keep its entries, or delete it to start empty"
                )
            return
        legacy, end = _replay_file(path, self._data, continuation=False)
        rewrite = legacy
        if nxt.exists():
            _replay_file(nxt, self._data, continuation=True)
            rewrite = True
        for namespace, entries in self._data.items():
            for key, value in entries.items():
                self._account(namespace, key, value, +1)
        size = path.stat().st_size
        if not rewrite and end < size:
            log.warning("KV file %s: cut a torn last record (%d bytes at offset %d): a write "
                        "that was never acknowledged", path, size - end, end)
            _truncate(path, end)
        if rewrite or end > max(2 * self._live, self.compact_min_bytes):
            self._rewrite(legacy)
        else:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._size = end

    def _rewrite(self, legacy: bool) -> None:
        """Write the whole store as a fresh log (start only: nobody is waiting yet)."""
        assert self.path is not None
        path, nxt, tmp = self.path, _sibling(self.path, ".next"), _sibling(self.path, ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        size = 0
        try:
            for chunk in _chunks(_live_records(self._data)):
                _write_all(fd, chunk)
                size += len(chunk)
            os.fsync(fd)
            _keep_backup(path)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
            if nxt.exists():  # replayed into `path` now; must not be replayed again
                os.unlink(nxt)
                _fsync_dir(path.parent)
        except OSError as exc:
            os.close(fd)
            raise KvFileError(f"cannot rewrite KV file {path}: {exc}") from exc
        self._fd, self._size = fd, size
        what = "converted from the JSON format (kept as .bak)" if legacy else "rewritten"
        log.info("KV file %s %s: %d entries, %d bytes", path, what,
                 sum(len(e) for e in self._data.values()), size)


class _Compaction:
    """Where the copy of the live entries into `<path>.next` stands."""

    def __init__(self, namespaces: list[str], old_fd: int, old_size: int) -> None:
        self.namespaces = namespaces  # as at the start; keys are listed per namespace
        self.old_fd = old_fd
        self.old_size = old_size
        # (namespace index, that namespace's keys when reached, key index)
        self.cursor: tuple[int, list[str], int] = (0, [], 0)

    @property
    def done(self) -> bool:
        return self.cursor[0] >= len(self.namespaces)

    def take(self, data: _FileFormat, budget: int) -> tuple[bytes, tuple[int, list[str], int]]:
        """Records of the next live entries (whole ones, about `budget` bytes) and the
        cursor after them; the cursor moves only once they are durable."""
        ns_index, keys, key_index = self.cursor
        out: list[bytes] = []
        size = 0
        while ns_index < len(self.namespaces) and size < budget:
            namespace = self.namespaces[ns_index]
            entries = data.get(namespace, {})
            if key_index == 0 and not keys:
                keys = list(entries)
            while key_index < len(keys) and size < budget:
                value = entries.get(keys[key_index])
                key_index += 1
                if value is not None:  # gone since: its delete is in this file already
                    record = encode_record(namespace, keys[key_index - 1], value)
                    out.append(record)
                    size += len(record)
            if key_index >= len(keys):
                ns_index, keys, key_index = ns_index + 1, [], 0
        return b"".join(out), (ns_index, keys, key_index)


# --- reading a file -------------------------------------------------------------


def _replay_file(path: Path, data: _FileFormat, *, continuation: bool) -> tuple[bool, int]:
    """Apply the file's records to `data`: (was it the JSON format, end of the valid records)."""
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
    if len(raw) - pos < _HEAD.size:
        return None
    marker, length, crc = _HEAD.unpack_from(raw, pos)
    end = pos + _HEAD.size + length
    if marker != MARKER or not 0 < length <= MAX_PAYLOAD or end > len(raw):
        return None
    payload = raw[pos + _HEAD.size:end]
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


def _live_records(data: _FileFormat) -> Iterator[bytes]:
    yield MAGIC
    for namespace, entries in data.items():
        for key, value in entries.items():
            yield encode_record(namespace, key, value)


def _chunks(parts: Iterator[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    buf: list[bytes] = []
    held = 0
    for part in parts:
        buf.append(part)
        held += len(part)
        if held >= size:
            yield b"".join(buf)
            buf, held = [], 0
    if buf:
        yield b"".join(buf)


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
    existing = next(d for d in (path.parent, *path.parent.parents) if d.exists())
    if not existing.is_dir():
        raise KvFileError(f"KV file {path} cannot be created: {existing} is a file, not a "
                          f"directory (--kv-path)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise KvFileError(f"KV file {path} cannot be created: directory {existing} is not "
                          f"writable (--kv-path)")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise KvFileError(f"KV file {path} is not readable and writable (--kv-path)")


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

"""The KV log's decisions (§6): its record format, when it is compacted, what each write
copies, and when a full disk refuses a put. No file in sight: `zns.drivers.kv_file`
reads and writes the files and does what this module says.

The log is append-only; compaction copies the live entries into a new file a slice at
a time, each slice carried by a write (`CompactionCopy`), so no request pays for the
whole store. When to start one and how big a slice is are `KvLogPolicy`'s answers; the
policy needs no clock: every decision follows from sizes, so the store asks at each
write and never between writes.

The space rule: a compaction, and a start after a crash in the middle of one, writes at
most the live records once more. A compaction starts only when that much is free
(`KvLogPolicy.room_to_compact`; until then writes go on appending to the log), and a
put is refused while the file system has less free space than that plus twice the
put's own record (`KvLogPolicy.put_refusal`), so a compaction that started can always
finish, running or at the next start; a delete is never refused by this rule (it is
how an operator makes room).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import msgspec

Store = dict[str, dict[str, str]]

MAGIC = b"ZNS KV log 1\n"
MARKER = b"\xffKV1"  # 0xff never occurs in UTF-8, so rarely inside a record
HEAD = struct.Struct("<4sII")  # marker, payload length, crc
MAX_PAYLOAD = 1 << 20  # far above the largest entry (§3: names <= 255 chars, values <= 64 KiB)
COMPACT_MIN_BYTES = 4 << 20
STEP_BYTES = 256 << 10

_encode_payload = msgspec.msgpack.Encoder().encode


def encode_record(namespace: str, key: str, value: str | None) -> bytes:
    """One log record: header and payload (a None value is a delete)."""
    payload = _encode_payload((namespace, key, value))
    length = struct.pack("<I", len(payload))
    return MARKER + length + struct.pack("<I", zlib.crc32(payload, zlib.crc32(length))) + payload


def live_records(data: Store) -> Iterator[bytes]:
    """The record of every live entry, in the store's order."""
    for namespace, entries in data.items():
        for key, value in entries.items():
            yield encode_record(namespace, key, value)


def compacted_bytes(data: Store) -> int:
    """The length of a log holding exactly `data`: the header and one record per entry."""
    return len(MAGIC) + sum(len(record) for record in live_records(data))


class KvLogPolicy:
    """When the log is compacted, how much each write copies, and when a put is refused
    for space. Pure arithmetic over sizes in bytes."""

    def __init__(self, compact_min_bytes: int = COMPACT_MIN_BYTES,
                 step_bytes: int = STEP_BYTES) -> None:
        self.compact_min_bytes = compact_min_bytes
        self.step_bytes = step_bytes

    def over_bound(self, log_bytes: int, live_bytes: int) -> bool:
        """Is a log of `log_bytes` holding `live_bytes` of live records due for compaction?
        Over twice its live records, and over the minimum (small logs are left alone)."""
        return log_bytes > max(2 * live_bytes, self.compact_min_bytes)

    def room_to_compact(self, free_bytes: int, live_bytes: int, record_bytes: int) -> bool:
        """May a compaction start now, with a write of `record_bytes`? Only when the whole
        copy fits in what is free (a new log's header, every live record, the write), so a
        compaction that starts can finish; until then the write goes to the log as before."""
        return free_bytes >= len(MAGIC) + live_bytes + record_bytes

    def slice_bytes(self, record_bytes: int) -> int:
        """How much a write of `record_bytes` copies ahead of its own record while a
        compaction runs (whole entries, so a little more): at least twice the write, so
        the copy outpaces the writes, and at least a step, so it ends."""
        return max(2 * record_bytes, self.step_bytes)

    def put_refusal(self, free_bytes: int, live_bytes: int, record_bytes: int) -> str | None:
        """Why a put of `record_bytes` must be refused with `free_bytes` free on the log's
        file system and `live_bytes` of live records, or None to go ahead.

        After the put there must still be room to write every live record once more (a
        compaction's copy, or the one a start after a crash finishes), the put included."""
        needed = self.space_needed(live_bytes, record_bytes)
        if free_bytes >= needed:
            return None
        return (f"the KV store's disk is too full for a put: {free_bytes} bytes free, "
                f"{needed} needed to keep room for compacting the {live_bytes} bytes of live "
                f"entries; delete entries or free disk space (deletes are still accepted)")

    def space_needed(self, live_bytes: int, record_bytes: int) -> int:
        """Free bytes a put of `record_bytes` needs (see `put_refusal`): its own append,
        then a new log's header and every live record, the put's own among them (the
        slices a running compaction copies are part of that copy)."""
        return record_bytes + len(MAGIC) + live_bytes + record_bytes


Cursor = tuple[int, list[str], int]  # namespace index, its keys when reached, key index


class CompactionCopy:
    """Where the copy of the live entries into the new log stands.

    `namespaces` are the store's at the start; each namespace's keys are listed when the
    copy reaches it. Entries in `skip` are not copied: their latest record is in the new
    log already (a start resuming a copy a crash interrupted). `old_size` is the length of
    the log being compacted, for the file's accounting.
    """

    def __init__(self, namespaces: list[str], old_size: int,
                 skip: set[tuple[str, str]] | None = None) -> None:
        self.namespaces = namespaces
        self.old_size = old_size
        self.skip = skip or set()
        self.cursor: Cursor = (0, [], 0)

    @property
    def done(self) -> bool:
        return self.cursor[0] >= len(self.namespaces)

    def take(self, data: Store, budget: int) -> tuple[bytes, Cursor]:
        """Records of the next live entries (whole ones, at least `budget` bytes unless the
        copy ends first) and the cursor after them; the caller moves the cursor
        (`advance`) only once they are durable."""
        ns_index, keys, key_index = self.cursor
        out: list[bytes] = []
        size = 0
        while ns_index < len(self.namespaces) and size < budget:
            namespace = self.namespaces[ns_index]
            entries = data.get(namespace, {})
            if key_index == 0 and not keys:
                keys = list(entries)
            while key_index < len(keys) and size < budget:
                key = keys[key_index]
                value = entries.get(key)
                key_index += 1
                # None: gone since, and its delete is in the new log already.
                if value is not None and (namespace, key) not in self.skip:
                    record = encode_record(namespace, key, value)
                    out.append(record)
                    size += len(record)
            if key_index >= len(keys):
                ns_index, keys, key_index = ns_index + 1, [], 0
        return b"".join(out), (ns_index, keys, key_index)

    def advance(self, cursor: Cursor) -> None:
        """The records `take` returned with `cursor` are durable: go past them."""
        self.cursor = cursor

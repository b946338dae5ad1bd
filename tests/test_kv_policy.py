"""The KV log's decisions (zns.core.kv_log) without a file: when a compaction starts, what
each slice copies, and the space rule that keeps a full disk from stopping a restart."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from zns.core.kv_log import (
    MAGIC,
    CompactionCopy,
    KvLogPolicy,
    Store,
    compacted_bytes,
    encode_record,
    live_records,
)


def record(namespace: str, key: str, value: str) -> int:
    return len(encode_record(namespace, key, value))


def test_a_log_is_over_its_bound_past_twice_its_live_records_and_past_the_minimum():
    policy = KvLogPolicy(compact_min_bytes=1_000, step_bytes=100)
    assert not policy.over_bound(1_000, 10)  # the minimum: not over it
    assert policy.over_bound(1_001, 10)
    assert not policy.over_bound(2_000, 1_000) and policy.over_bound(2_001, 1_000)
    assert not policy.over_bound(0, 0)


def test_a_compaction_starts_only_when_its_whole_copy_fits():
    policy = KvLogPolicy()
    assert policy.room_to_compact(len(MAGIC) + 1_000 + 40, 1_000, 40)
    assert not policy.room_to_compact(len(MAGIC) + 1_000 + 39, 1_000, 40)


def test_a_slice_is_twice_the_write_or_a_step_whichever_is_more():
    policy = KvLogPolicy(compact_min_bytes=1, step_bytes=100)
    assert policy.slice_bytes(10) == 100 and policy.slice_bytes(50) == 100
    assert policy.slice_bytes(51) == 102


def test_a_put_is_refused_below_the_room_a_compaction_needs_and_says_so():
    policy = KvLogPolicy()
    needed = 40 + len(MAGIC) + 1_000 + 40  # its append, then a new log of every live record
    assert policy.space_needed(1_000, 40) == needed
    assert policy.put_refusal(needed, 1_000, 40) is None
    assert policy.put_refusal(needed - 1, 1_000, 40) == (
        f"the KV store's disk is too full for a put: {needed - 1} bytes free, {needed} needed "
        f"to keep room for compacting the 1000 bytes of live entries; delete entries or free "
        f"disk space (deletes are still accepted)")


def test_the_copy_takes_whole_entries_up_to_the_budget_and_moves_only_when_told():
    data: Store = {"a": {"k1": "x" * 10, "k2": "y" * 10}, "b": {"k3": "z" * 10}}
    size = record("a", "k1", "x" * 10)
    copy = CompactionCopy(list(data), old_size=500)
    chunk, cursor = copy.take(data, 1)  # one byte's budget: one whole entry
    assert chunk == encode_record("a", "k1", "x" * 10) and copy.cursor == (0, [], 0)
    assert copy.take(data, 1) == (chunk, cursor)  # not advanced: the same slice again
    copy.advance(cursor)
    chunk, cursor = copy.take(data, size + 1)  # more than one entry: the next two
    assert chunk == encode_record("a", "k2", "y" * 10) + encode_record("b", "k3", "z" * 10)
    assert not copy.done
    copy.advance(cursor)
    assert copy.done and copy.take(data, 100) == (b"", cursor)


def test_the_copy_skips_what_is_gone_and_what_the_new_log_has_already():
    data: Store = {"a": {"k1": "1", "k2": "2", "k3": "3"}, "gone": {"k": "v"}}
    copy = CompactionCopy(list(data), old_size=0, skip={("a", "k2")})
    del data["gone"]  # a namespace emptied after the copy started
    data["a"]["k4"] = "4"  # listed when the copy reaches "a": copied too
    chunk, cursor = copy.take(data, 10_000)
    assert chunk == b"".join(encode_record("a", k, v) for k, v in
                             (("k1", "1"), ("k3", "3"), ("k4", "4")))
    copy.advance(cursor)
    assert copy.done


def test_compacted_bytes_are_the_header_and_every_live_record():
    data: Store = {"a": {"k": "v"}, "b": {"k": "w", "j": ""}}
    assert compacted_bytes(data) == len(MAGIC) + sum(len(r) for r in live_records(data))
    assert compacted_bytes({}) == len(MAGIC)


class Disk:
    """The files of the log on a file system of `capacity` bytes, as `zns.drivers.kv_file`
    writes them (the log, `.next` while compacting, `.bak` the log before the last one),
    driven by the policy alone. A write that does not fit is refused (ENOSPC)."""

    def __init__(self, policy: KvLogPolicy, capacity: int) -> None:
        self.policy, self.capacity = policy, capacity
        self.data: Store = {}
        self.live = 0
        self.log = self.next = self.bak = 0
        self.copy: CompactionCopy | None = None

    @property
    def free(self) -> int:
        return self.capacity - self.log - self.next - self.bak

    def still_to_copy(self) -> int:
        """What finishing the running compaction writes (what a start after a crash does)."""
        if self.copy is None:
            return 0
        probe = CompactionCopy(self.copy.namespaces, 0, self.copy.skip)
        probe.cursor = self.copy.cursor
        return len(probe.take(self.data, 1 << 62)[0])

    def write(self, namespace: str, key: str, value: str | None) -> bool:
        rec = len(encode_record(namespace, key, value))
        old = self.data.get(namespace, {}).get(key)
        if value is not None:
            if old == value or self.policy.put_refusal(self.free, self.live, rec) is not None:
                return False
        elif old is None:
            return False
        if self.copy is None and self.policy.over_bound(self.log, self.live) and \
                self.policy.room_to_compact(self.free, self.live, rec):
            self.copy = CompactionCopy(list(self.data), self.log)
            chunk, cursor = self.copy.take(self.data, self.policy.slice_bytes(rec))
            self.next = len(MAGIC) + len(chunk) + rec  # fits: room_to_compact said so
        elif self.copy is not None:
            chunk, cursor = self.copy.take(self.data, self.policy.slice_bytes(rec))
            if len(chunk) + rec > self.free:
                return False
            self.next += len(chunk) + rec
        else:  # no compaction due, or no room for one yet: the log grows
            grows = rec if self.log else len(MAGIC) + rec  # the first write, with the header
            if grows > self.free:
                return False
            self.log += grows
        if self.copy is not None:
            self.copy.advance(cursor)
        if old is not None:
            self.live -= len(encode_record(namespace, key, old))
        if value is None:
            del self.data[namespace][key]
            if not self.data[namespace]:
                del self.data[namespace]
        else:
            self.data.setdefault(namespace, {})[key] = value
            self.live += rec
        if self.copy is not None and self.copy.done:
            self.bak, self.log, self.next, self.copy = self.log, self.next, 0, None
        return True


def run(disk: Disk, ops: list[tuple[str, int, int | None]]) -> tuple[int, int]:
    """Apply `ops` (namespace, key number, value size or None for a delete), checking after
    each that what a start would have to write fits: (compactions finished, puts refused)."""
    finished = refused = 0
    for i, (namespace, key, size) in enumerate(ops):
        compacting = disk.copy is not None
        done = disk.write(namespace, f"k{key}", None if size is None else f"{i}-" + "v" * size)
        refused += size is not None and not done
        finished += compacting and disk.copy is None
        assert disk.still_to_copy() <= disk.free, i  # a start resuming the copy fits
    return finished, refused


writes = st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 30),
                            st.none() | st.integers(0, 400)), min_size=20, max_size=400)


@settings(max_examples=150, deadline=None)
@given(writes, st.integers(2_000, 12_000))
def test_puts_that_pass_the_space_rule_leave_room_to_finish_every_compaction(ops, capacity):
    """Whatever puts and deletes come, and however small the disk: after every write, the
    rest of a running compaction's copy (what a start after a crash writes) fits in the
    space left."""
    run(Disk(KvLogPolicy(compact_min_bytes=1_000, step_bytes=200), capacity), ops)


def test_on_small_disks_compactions_finish_and_puts_are_refused_before_the_disk_fills():
    rnd = random.Random(32)
    finished = refused = 0
    for _ in range(40):
        ops = [(rnd.choice("ab"), rnd.randrange(31),
                None if rnd.random() < 0.2 else rnd.randrange(400)) for _ in range(400)]
        disk = Disk(KvLogPolicy(compact_min_bytes=1_000, step_bytes=200),
                    rnd.randrange(2_000, 40_000))
        counts = run(disk, ops)
        finished, refused = finished + counts[0], refused + counts[1]
    assert finished >= 20 and refused >= 1_000  # both sides of the rule were exercised

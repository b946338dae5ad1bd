"""The KV log (zns.drivers.kv_file) in process: what each write costs and writes, the
order of its fsyncs, torn tails, damage, the JSON format, compaction and failed fsyncs."""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from zns.core.errors import Internal, KvFileError
from zns.drivers import kv_file
from zns.core.kv_log import compacted_bytes
from zns.core.latency import Histogram
from zns.drivers.kv_file import MAGIC, KvStore, encode_record, read_kv_file

Model = dict[str, dict[str, str]]


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def open_files(path: Path) -> list[str]:
    """The files beside `path` this process holds open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            name = fd_path(int(fd))
        except OSError:  # the descriptor listdir itself used, closed since
            continue
        if name.startswith(str(path)) and not name.endswith(".lock"):  # the lock: file_lock's
            names.append(name)
    return names


def kv_files(path: Path) -> list[str]:
    """The files in `path`'s directory, but the lock beside it (zns.drivers.file_lock)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name + ".lock")


def on_disk(path: Path) -> Model:
    """What a restart would read: `path`, then `<path>.next` while a compaction runs."""
    return read_kv_file(path)


def apply(model: Model, ns: str, key: str, value: str | None) -> None:
    if value is None:
        model.get(ns, {}).pop(key, None)
        if ns in model and not model[ns]:
            del model[ns]
    else:
        model.setdefault(ns, {})[key] = value


class Spy:
    """Records the file system calls the store makes, in order, by file name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        real_fsync, real_replace, real_write = os.fsync, os.replace, os.write
        self.fail_fsync: Callable[[str], bool] = lambda name: False

        def fsync(fd: int) -> None:
            name = fd_path(fd)
            if self.fail_fsync(name):
                self.calls.append(("fsync-failed", name))
                raise OSError(errno.EIO, "injected fsync failure")
            real_fsync(fd)
            self.calls.append(("fsync", name))

        def replace(src: object, dst: object) -> None:
            real_replace(src, dst)
            self.calls.append(("replace", f"{src} -> {dst}"))

        def write(fd: int, data: bytes) -> int:
            n = real_write(fd, data)
            self.calls.append(("write", fd_path(fd)))
            self.written += n
            return n

        self.written = 0
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "write", write)

    def mark(self, what: str) -> None:
        self.calls.append((what, ""))

    def since(self, what: str) -> list[tuple[str, str]]:
        index = max(i for i, call in enumerate(self.calls) if call[0] == what)
        return self.calls[index + 1:]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "kv.json"


@pytest.fixture
def stores() -> Iterator[list[KvStore]]:
    opened: list[KvStore] = []
    yield opened
    for store in opened:
        store.close()


def open_store(stores: list[KvStore], path: Path, **kw: int) -> KvStore:
    store = KvStore(path, **kw)
    stores.append(store)
    return store


# --- what a write costs ---------------------------------------------------------------


def test_a_put_writes_its_own_record_only(path, stores, monkeypatch):
    store = open_store(stores, path)
    for i in range(200):
        store.put("ns", f"k{i}", "v" * 10_000)  # 2 MB held
    spy = Spy(monkeypatch)
    assert store.put("ns", "small", "x")
    assert spy.written == len(encode_record("ns", "small", "x"))
    assert [c for c in spy.calls if c[0] == "fsync"] == [("fsync", str(path))]
    assert store.delete("ns", "small")
    assert spy.written == len(encode_record("ns", "small", "x")) + len(
        encode_record("ns", "small", None))
    assert store.put("ns", "small", "x") and not store.put("ns", "small", "x")  # same: no write
    assert read_kv_file(path)["ns"]["small"] == "x"


def test_record_is_fsynced_before_put_and_delete_return(path, stores, monkeypatch):
    store = open_store(stores, path)
    spy = Spy(monkeypatch)
    store.put("ns", "a", "1")  # the first write creates the file: tmp, fsync, rename, dir
    spy.mark("returned")
    tmp = str(path) + ".tmp"
    first = spy.calls[:spy.calls.index(("returned", ""))]
    assert first == [("write", tmp), ("fsync", tmp), ("replace", f"{tmp} -> {path}"),
                     ("fsync", str(path.parent))]
    for op in (lambda: store.put("ns", "b", "2"), lambda: store.delete("ns", "a")):
        op()
        spy.mark("returned")
        assert spy.calls[-3:] == [("write", str(path)), ("fsync", str(path)), ("returned", "")]


# --- torn tails and damage ------------------------------------------------------------


def write_entries(path: Path, stores: list[KvStore]) -> Model:
    store = open_store(stores, path)
    store.put("ns", "a", "1")
    store.put("ns", "b", "2" * 300)
    store.delete("ns", "a")
    store.put("other", "k", "v")
    store.close()
    return {"ns": {"b": "2" * 300}, "other": {"k": "v"}}


@pytest.mark.parametrize("tail", [
    encode_record("ns", "c", "3" * 100)[:-7],  # payload cut short
    encode_record("ns", "c", "3")[:5],  # header cut short
    b"\0" * 50,  # blocks allocated, never written
], ids=["payload", "header", "zeros"])
def test_a_torn_last_record_is_cut_at_start(path, stores, tail, caplog):
    model = write_entries(path, stores)
    good = path.read_bytes()
    path.write_bytes(good + tail)
    with caplog.at_level(logging.WARNING, logger="zns"):
        store = open_store(stores, path)
    assert store.list("ns") == model["ns"] and store.list("other") == model["other"]
    assert path.read_bytes() == good
    assert "torn" in caplog.text and str(path) in caplog.text
    store.put("ns", "d", "4")  # appends after the cut
    assert read_kv_file(path) == {"ns": {"b": "2" * 300, "d": "4"}, "other": {"k": "v"}}


def test_a_damaged_record_with_valid_ones_after_it_is_an_error(path, stores):
    write_entries(path, stores)
    raw = bytearray(path.read_bytes())
    raw[len(MAGIC) + 14] ^= 0x01  # inside the first record's payload
    path.write_bytes(bytes(raw))
    with pytest.raises(KvFileError) as info:
        KvStore(path)
    assert str(path) in str(info.value) and "corrupt" in str(info.value)
    assert f"offset {len(MAGIC)}" in str(info.value)
    assert path.read_bytes() == bytes(raw)  # left alone


def test_a_file_that_is_neither_format_is_an_error(path):
    path.write_bytes(b"ZNS KV lo")
    with pytest.raises(KvFileError, match="corrupt"):
        KvStore(path)
    assert path.read_bytes() == b"ZNS KV lo"


# --- the JSON format of earlier versions ---------------------------------------------------


def test_the_json_format_is_read_and_converted(path, stores):
    old = msgspec.json.encode({"ns": {"k": "v", "ü": "ö" * 10}, "o": {"x": "y"}})
    path.write_bytes(old)
    store = open_store(stores, path)
    assert store.list("ns") == {"k": "v", "ü": "ö" * 10} and store.get("o", "x") == "y"
    assert path.read_bytes().startswith(MAGIC)
    assert path.with_name("kv.json.bak").read_bytes() == old  # kept for a downgrade
    store.put("o", "x", "z")
    store.close()
    again = open_store(stores, path)
    assert again.list("ns") == {"k": "v", "ü": "ö" * 10} and again.get("o", "x") == "z"
    assert again.total_bytes() == (2 + 1 + 1) + (2 + 2 + 20) + (1 + 1 + 1)


# --- compaction -------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_compaction_keeps_every_entry_and_bounds_the_file(path, stores):
    rnd = random.Random(7)
    store = open_store(stores, path, compact_min_bytes=4_000, step_bytes=600)
    model: Model = {}
    compactions = 0
    was_compacting = False
    for i in range(3_000):
        ns = rnd.choice(["a", "b", "c"])
        key = f"k{rnd.randrange(40)}"
        value = None if rnd.random() < 0.25 else f"{i}-" + "v" * rnd.randrange(0, 300)
        if value is None:
            store.delete(ns, key)
        else:
            store.put(ns, key, value)
        apply(model, ns, key, value)
        compacting = store.compaction is not None
        compactions += was_compacting and not compacting
        was_compacting = compacting
        if i % 50 == 0 or compacting:
            assert on_disk(path) == model, i
        assert {ns: store.list(ns) for ns in model} == model
        live = compacted_bytes(model)
        # `path` stays within 2x live (or the minimum) plus what one compaction writes.
        assert store.file_bytes() <= 3 * max(2 * live, 4_000) + 2_000, i
    assert compactions >= 5
    assert path.with_name("kv.json.bak").exists()
    store.close()
    assert {ns: open_store(stores, path).list(ns) for ns in model} == model


def test_compaction_orders_fsync_rename_and_directory_fsync(path, stores, monkeypatch):
    store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=500)
    nxt = str(path) + ".next"
    for j in range(20):  # more than one step's worth of live entries
        store.put("ns", f"other{j}", "w" * 200)
    spy = Spy(monkeypatch)
    for i in range(1_000):
        store.put("ns", "k", f"{i:04}" + "v" * 200)
        if store.compaction is not None:
            break
    # The write that started it: .next fsynced, then its directory, before the reply.
    assert spy.calls[-3:] == [("write", nxt), ("fsync", nxt), ("fsync", str(path.parent))]
    for j in range(1_000):
        if store.compaction is None:
            break
        store.put("ns", "k", f"again{j}")
    index = spy.calls.index(("replace", f"{nxt} -> {path}"))
    # The new file is durable before the rename: its last write is followed by its fsync.
    last_write = max(k for k, c in enumerate(spy.calls[:index]) if c == ("write", nxt))
    assert ("fsync", nxt) in spy.calls[last_write:index]
    assert spy.calls[index + 1] == ("fsync", str(path.parent))  # and its name after it
    backup = str(path) + ".bak"
    assert ("replace", f"{backup}.tmp -> {backup}") in spy.calls[:index]
    # Each write is followed by one fsync of that same file before anything else happens.
    for k, (call, name) in enumerate(spy.calls):
        if call == "write":
            following = next(c for c in spy.calls[k + 1:] if c != ("write", name))
            assert following == ("fsync", name), spy.calls[k:k + 3]


def test_a_crash_mid_compaction_is_recovered_at_start(path, stores):
    store = open_store(stores, path, compact_min_bytes=3_000, step_bytes=300)
    model: Model = {}
    for i in range(200):
        key = f"k{i % 30}"
        store.put("ns", key, f"{i}" + "x" * 100)
        apply(model, "ns", key, f"{i}" + "x" * 100)
        if store.compaction is not None and not store.compaction.done and i > 100:
            break
    assert store.compaction is not None, "the test wants a compaction in progress"
    nxt = path.with_name("kv.json.next")
    nxt.write_bytes(nxt.read_bytes() + encode_record("ns", "torn", "t")[:-2])  # and a torn tail
    stores.remove(store)
    store.close()  # the process dies here: nothing finishes the compaction
    again = open_store(stores, path, compact_min_bytes=3_000, step_bytes=300)
    assert again.list("ns") == model["ns"]
    assert not nxt.exists() and read_kv_file(path) == model


# --- writes that cannot be made durable ----------------------------------------------------


PHASES: dict[str, Callable[[KvStore], bool]] = {
    "append": lambda s: s.count("ns") >= 5,
    "start-compaction": lambda s: s.compaction is None and s.policy.over_bound(
        s.log_bytes, s.live_record_bytes),
    "compaction-step": lambda s: s.compaction is not None and not s.compaction.done,
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_failed_fsync_changes_nothing(path, stores, monkeypatch, phase):
    store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=300)
    model: Model = {}
    for i in range(10_000):
        if PHASES[phase](store):
            break
        key, value = f"k{i % 30}", f"{i}" + "v" * 150
        store.put("ns", key, value)
        apply(model, "ns", key, value)
    assert PHASES[phase](store)
    files = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    spy = Spy(monkeypatch)
    spy.fail_fsync = lambda name: name.startswith(str(path))
    for op in (lambda: store.put("ns", "k1", "new"), lambda: store.put("ns", "fresh", "x"),
               lambda: store.delete("ns", "k0")):
        with pytest.raises(Internal, match="injected"):
            op()
        assert store.list("ns") == model["ns"]
        assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == files
    assert any(c[0] == "fsync-failed" for c in spy.calls)
    spy.fail_fsync = lambda name: False
    assert store.put("ns", "k1", "new") and store.delete("ns", "k0")
    apply(model, "ns", "k1", "new")
    apply(model, "ns", "k0", None)
    assert on_disk(path) == model
    store.close()
    assert open_store(stores, path).list("ns") == model["ns"]


def test_a_write_that_cannot_be_cut_back_stops_every_later_write(path, stores, monkeypatch, caplog):
    store = open_store(stores, path)
    store.put("ns", "a", "1")
    real_write = os.write
    state = {"writes": 0}

    def torn_write(fd: int, data: bytes) -> int:  # half a record lands, then the disk is full
        state["writes"] += 1
        if state["writes"] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "injected: no space left")

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "injected: cannot truncate")

    monkeypatch.setattr(os, "write", torn_write)
    monkeypatch.setattr(os, "ftruncate", no_truncate)
    with caplog.at_level(logging.ERROR, logger="zns"), pytest.raises(Internal, match="no space left"):
        store.put("ns", "b", "2")
    assert [r.getMessage() for r in caplog.records] == [  # the operator is told to restart
        "the KV file could not be cut back after a failed write ([Errno 28] injected: no space "
        "left; [Errno 5] injected: cannot truncate); restart the server to read what is on disk"]
    monkeypatch.undo()  # the disk works again, but the torn half record is still in the file
    for write in (lambda: store.put("ns", "c", "3"), lambda: store.delete("ns", "a")):
        with pytest.raises(Internal, match="restart the server"):
            write()
    assert store.list("ns") == {"a": "1"}
    store.close()
    # Nothing was appended after the torn record, so a restart cuts it and keeps the rest.
    assert open_store(stores, path).list("ns") == {"a": "1"}


def test_deleting_the_last_key_of_a_namespace_removes_the_namespace(path, stores):
    for store in (open_store(stores, path), KvStore(None)):
        store.put("ns", "a", "1")
        store.put("other", "b", "2")
        assert store.count() == 2
        assert store.delete("ns", "a")
        assert store.count() == 1  # what --max-kv-namespaces counts
        assert store.list("ns") == {} and store.count("ns") == 0
    stores[0].close()
    assert open_store(stores, path).count() == 1


def test_read_kv_file_reads_either_format_and_refuses_a_torn_header(path):
    path.write_text('{"ns": {"k": "v"}}')
    assert read_kv_file(path) == {"ns": {"k": "v"}}
    path.write_bytes(MAGIC[:5])  # only `<path>.next` may be created and then torn
    with pytest.raises(KvFileError, match="corrupt"):
        read_kv_file(path)


def test_get_of_an_unknown_namespace_or_key_is_none(stores):
    store = KvStore(None)
    store.put("ns", "k", "v")
    assert store.get("other", "k") is None and store.get("ns", "other") is None
    assert store.list("other") == {}


def test_file_bytes_are_the_bytes_of_the_log_files(path, stores):
    store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=300)
    assert store.file_bytes() == 0  # nothing written yet
    nxt = path.with_name(path.name + ".next")
    compacting = False
    for i in range(200):
        store.put("ns", f"k{i % 10}", f"{i}" + "v" * 100)
        on_disk = path.stat().st_size + (nxt.stat().st_size if nxt.exists() else 0)
        assert store.file_bytes() == on_disk, i
        compacting |= nxt.exists()
    assert compacting  # the sum was checked while a compaction ran, too


def test_write_times_count_each_append_in_its_bucket(path, stores):
    times = Histogram(kv_file.WRITE_BOUNDS)
    assert times.counts == [0] * (len(kv_file.WRITE_BOUNDS) + 1) and times.total_seconds == 0
    for seconds in (0.0001, 0.0005, 0.0007, 2.5, 30.0):
        times.observe(seconds)
    # A bucket counts the values up to its bound (Prometheus' `le`); the last, the rest.
    assert times.counts[:3] == [2, 1, 0] and times.counts[-2:] == [1, 1]
    assert sum(times.counts) == 5 and times.total_seconds == pytest.approx(32.5013)
    store = open_store(stores, path)
    store.put("ns", "a", "1")
    store.put("ns", "a", "1")  # unchanged: nothing written, nothing timed
    store.delete("ns", "a")
    assert sum(store.write_times.counts) == 2 and store.write_times.total_seconds > 0
    memory = KvStore(None)
    memory.put("ns", "a", "1")
    assert sum(memory.write_times.counts) == 0  # nothing made durable, nothing timed


# --- pinned by mutation testing (docs/mutation-scores.md) ------------------------------------


def test_deleting_what_is_not_there_writes_nothing_and_accounting_follows(path, stores):
    store = open_store(stores, path)
    store.put("ns", "a", "1")
    store.put("ns", "bb", "22")
    size = path.stat().st_size
    assert not store.delete("ns", "zz") and not store.delete("other", "a")
    assert path.stat().st_size == size
    assert store.total_bytes() == (2 + 1 + 1) + (2 + 2 + 2)
    assert store.delete("ns", "a")
    assert store.total_bytes() == 2 + 2 + 2
    assert store.live_record_bytes == len(encode_record("ns", "bb", "22"))  # what compaction would copy
    assert store.put("ns", "bb", "333")  # an update counts the new value, not both
    assert store.total_bytes() == 2 + 2 + 3
    assert store.live_record_bytes == len(encode_record("ns", "bb", "333"))


def test_close_mid_compaction_closes_both_files(path, stores):
    store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=100)
    for i in range(1_000):
        store.put("ns", f"k{i % 30}", f"{i}" + "v" * 150)
        if store.compaction is not None and not store.compaction.done:
            break
    assert sorted(open_files(path)) == [str(path), str(path) + ".next"]
    store.close()
    assert open_files(path) == []
    assert store.file_bytes() == store.log_bytes  # no compaction left behind


def test_a_compaction_slice_is_twice_the_write_when_that_is_more_than_a_step(path, stores):
    # step_bytes 1: the slice is bounded by 2 x the write's record, in whole entries.
    store = open_store(stores, path, compact_min_bytes=1, step_bytes=1)
    for key in ("a", "b", "c", "d", "e"):
        store.put("ns", key, "v" * 100)
    for i in range(100):
        if store.compaction is not None:
            break
        store.put("ns", "a", "wx"[i % 2] * 100)  # the same size as every live record
    nxt = path.with_name(path.name + ".next")
    copied = nxt.stat().st_size
    record = len(encode_record("ns", "a", "v" * 100))
    assert copied == len(MAGIC) + 3 * record  # two copied entries, then the write itself


def test_a_rewrite_at_start_is_a_private_whole_file_and_is_counted(path, stores, caplog):
    path.write_text('{"ns": {"k": "v", "k2": "v2"}}')
    with caplog.at_level(logging.INFO, logger="zns"):
        store = open_store(stores, path)
    size = path.stat().st_size
    assert store.file_bytes() == size == compacted_bytes(read_kv_file(path))
    assert (path.stat().st_mode & 0o777) == 0o600
    assert f"KV file {path} converted from the JSON format (kept as .bak): 2 entries, " \
           f"{size} bytes" in caplog.text
    store.put("ns", "k3", "v3")
    assert path.stat().st_size == size + len(encode_record("ns", "k3", "v3"))


def test_a_leftover_temporary_file_is_not_kept_in_a_rewrite(path, stores):
    path.write_text('{"ns": {"k": "v"}}')
    path.with_name(path.name + ".tmp").write_bytes(b"junk" * 10_000)  # a crash's leftover
    store = open_store(stores, path)
    assert path.stat().st_size == len(MAGIC) + len(encode_record("ns", "k", "v"))
    assert not path.with_name(path.name + ".tmp").exists()
    store.put("ns", "k", "w")
    store.close()
    assert read_kv_file(path) == {"ns": {"k": "w"}}


def test_a_leftover_next_file_is_finished_copying_only_what_it_lacks(path, stores, caplog):
    store = open_store(stores, path)
    store.put("ns", "a", "1")
    store.put("ns", "b", "1")
    store.close()
    nxt = path.with_name(path.name + ".next")
    in_next = MAGIC + encode_record("ns", "b", "2")  # b's latest record: not copied again
    nxt.write_bytes(in_next)
    with caplog.at_level(logging.INFO, logger="zns"):
        again = open_store(stores, path)
    assert again.list("ns") == {"a": "1", "b": "2"} and not nxt.exists()
    assert path.read_bytes() == in_next + encode_record("ns", "a", "1")
    assert [r.getMessage() for r in caplog.records] == [
        f"KV file {path}: carrying on the compaction into {nxt} that a crash interrupted",
        f"compacted the KV log {path}: {len(in_next) + len(encode_record('ns', 'a', '1'))} "
        f"bytes (was {len(MAGIC) + 2 * len(encode_record('ns', 'a', '1'))})"]


def test_a_rewrite_that_cannot_be_made_durable_is_a_kv_file_error(path, monkeypatch):
    path.write_text('{"ns": {"k": "v"}}')

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected fsync failure")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(KvFileError, match=f"cannot rewrite KV file {path}: .*injected"):
        KvStore(path)
    assert path.read_text() == '{"ns": {"k": "v"}}'
    assert kv_files(path) == [path.name]  # no .tmp left


@pytest.mark.parametrize("tail", [
    kv_file.MARKER + b"\0" * 20 + kv_file.MARKER + b"\1" * 20,  # two markers, neither a record
    b"\0" * 10 + kv_file.MARKER + b"\xff" * 30,
], ids=["two-markers", "one-marker"])
def test_a_torn_tail_with_false_markers_is_still_torn(path, stores, tail):
    model = write_entries(path, stores)
    good = path.read_bytes()
    path.write_bytes(good + tail)
    assert {ns: open_store(stores, path).list(ns) for ns in model} == model
    assert path.read_bytes() == good


def test_damage_before_false_markers_and_a_valid_record_is_an_error(path, stores):
    write_entries(path, stores)
    raw = path.read_bytes()
    damaged = raw[:len(MAGIC)] + b"\0" * 12 + kv_file.MARKER + b"\0" * 12 + \
        encode_record("ns", "z", "z")
    path.write_bytes(damaged)
    with pytest.raises(KvFileError, match="valid records after it"):
        KvStore(path)


def test_json_with_the_wrong_types_is_corrupt_and_names_the_backup_only_if_there(path):
    path.write_text('{"ns": {"k": 1}}')
    with pytest.raises(KvFileError, match="corrupt") as info:
        KvStore(path)
    assert str(info.value).startswith(f"KV file {path} is corrupt (")
    assert "previous version" not in str(info.value)
    assert str(info.value).split(". zns will not start")[0].endswith(")")  # no hint at all
    path.with_name(path.name + ".bak").write_text("{}")
    with pytest.raises(KvFileError, match="previous version is .*kv.json.bak"):
        KvStore(path)


def test_compaction_start_is_logged_with_its_sizes(path, stores, caplog):
    store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=300)
    with caplog.at_level(logging.INFO, logger="zns"):
        for i in range(1_000):
            store.put("ns", f"k{i % 10}", f"{i}" + "v" * 100)
            if store.compaction is not None:
                break
    nxt = path.with_name(path.name + ".next")
    pattern = rf"compacting the KV log {re.escape(str(path))} \((\d+) bytes, (\d+) live\) into " \
              rf"{re.escape(str(nxt))}"
    found = [re.fullmatch(pattern, r.getMessage()) for r in caplog.records]
    match = next(m for m in found if m)
    assert int(match.group(1)) == store.compaction.old_size
    assert 0 < int(match.group(2)) <= store.live_record_bytes + 200


def test_a_next_file_that_cannot_be_removed_after_a_failed_write_stops_writes(
        path, stores, monkeypatch, caplog):
    store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=300)
    for i in range(1_000):
        if store.log_bytes > max(2 * store.live_record_bytes, 2_000):
            break
        store.put("ns", f"k{i % 10}", f"{i}" + "v" * 100)
    nxt = str(path) + ".next"
    real_fsync, real_unlink = os.fsync, os.unlink

    def fsync(fd: int) -> None:
        if fd_path(fd) == nxt:
            raise OSError(errno.EIO, "injected fsync failure")
        real_fsync(fd)

    def unlink(target: object, *args: object, **kw: object) -> None:
        if str(target) == nxt:
            raise OSError(errno.EACCES, "injected: cannot unlink")
        real_unlink(target, *args, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    with caplog.at_level(logging.ERROR, logger="zns"), pytest.raises(Internal, match="injected"):
        store.put("ns", "new", "x")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"could not remove {nxt} after a failed write (" + errors[0].split(" (", 1)[1]]
    assert "restart the server to read what is on disk" in errors[0]
    monkeypatch.undo()
    with pytest.raises(Internal, match=f"could not remove {re.escape(nxt)}"):
        store.put("ns", "other", "y")


def test_a_rewrite_goes_through_a_temporary_file_and_counts_every_chunk(path, stores, monkeypatch):
    big = {f"k{i}": "v" * 60_000 for i in range(20)}  # 1.2 MB: more than one write chunk
    path.write_bytes(msgspec.json.encode({"ns": big}))
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (replaced.append((str(a), str(b))),
                                                     real_replace(a, b)))
    store = open_store(stores, path)
    assert (str(path) + ".tmp", str(path)) in replaced
    assert store.file_bytes() == path.stat().st_size


def test_a_namespace_emptied_mid_compaction_is_skipped(path, stores):
    store = open_store(stores, path, compact_min_bytes=3_000, step_bytes=1)
    model: Model = {}
    for i in range(20):  # "a" first: the copy reaches "b" after all of these
        store.put("a", f"k{i}", f"{i}" + "w" * 100)
        apply(model, "a", f"k{i}", f"{i}" + "w" * 100)
    for key in range(5):
        store.put("b", f"k{key}", "v" * 50)
        apply(model, "b", f"k{key}", "v" * 50)
    for i in range(1_000):
        store.put("a", f"k{i % 20}", f"{i}" + "w" * 100)
        apply(model, "a", f"k{i % 20}", f"{i}" + "w" * 100)
        if store.compaction is not None:
            break
    assert store.compaction is not None
    for key in range(5):  # "b" goes away before the copy reaches it (one "a" entry a delete)
        store.delete("b", f"k{key}")
        apply(model, "b", f"k{key}", None)
    assert store.compaction.cursor[0] < store.compaction.namespaces.index("b")
    for i in range(1_000):
        if store.compaction is None:
            break
        store.put("a", "k0", f"again{i}")
        apply(model, "a", "k0", f"again{i}")
    assert store.compaction is None and on_disk(path) == model


def test_a_valid_record_between_false_markers_is_still_found(path, stores):
    write_entries(path, stores)
    raw = path.read_bytes()
    damaged = raw[:len(MAGIC)] + b"\0" * 12 + kv_file.MARKER + b"\0" * 12 + \
        encode_record("ns", "z", "z") + kv_file.MARKER + b"\0" * 12
    path.write_bytes(damaged)
    with pytest.raises(KvFileError, match="valid records after it"):
        KvStore(path)


# --- start: which file, what is refused, and what is said -----------------------------------


def test_the_old_default_name_is_used_only_for_the_default_path_when_the_new_one_is_missing(
        tmp_path, stores, monkeypatch, caplog):
    monkeypatch.setenv("HOME", str(tmp_path))
    new, old = tmp_path / ".zns" / "kv.log", tmp_path / ".zns" / "kv.json"
    old.parent.mkdir()
    old.write_bytes(MAGIC + encode_record("ns", "k", "old"))
    with caplog.at_level(logging.INFO, logger="zns"):
        assert open_store(stores, kv_file.DEFAULT_PATH).path == old
    assert [r.getMessage() for r in caplog.records] == [
        f"KV file: using {old} (the default name of earlier versions; kv.log is the new one)"]
    elsewhere = tmp_path / "elsewhere.log"  # a path of one's own: the old default is not read
    assert open_store(stores, elsewhere).path == elsewhere and not elsewhere.exists()
    new.write_bytes(MAGIC + encode_record("ns", "k", "new"))  # once kv.log exists, it wins
    assert open_store(stores, kv_file.DEFAULT_PATH).get("ns", "k") == "new"


def test_a_missing_file_with_a_backup_or_next_file_beside_it_is_refused_by_name(path):
    for leftover in (".bak", ".next"):
        other = path.with_name(path.name + leftover)
        other.write_bytes(MAGIC + encode_record("ns", "k", "v"))
        with pytest.raises(KvFileError) as info:
            KvStore(path)
        assert str(info.value) == (
            f"KV file {path} is missing but {other} exists; rename it into place to keep its "
            f"entries, or delete it to start empty")
        other.unlink()
    assert not path.exists()


def test_paths_that_cannot_hold_the_store_are_refused_with_the_reason(tmp_path, monkeypatch):
    with pytest.raises(KvFileError) as info:
        KvStore(tmp_path)
    assert str(info.value) == f"KV file {tmp_path} is a directory; give a file path (--kv-path)"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(KvFileError) as info:
        KvStore(blocker / "sub" / "kv.log")
    assert str(info.value) == (f"KV file {blocker}/sub/kv.log cannot be created: {blocker} is a "
                               f"file, not a directory (--kv-path)")
    # The tests may run as root, whom access() never refuses: it answers as for another user.
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access

    def access(target: object, mode: int) -> bool:
        if Path(str(target)).name in ("locked", "kv.log") and mode & (os.W_OK | os.R_OK):
            return False
        return real_access(target, mode)

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(KvFileError) as info:
        KvStore(locked / "kv.log")
    assert str(info.value) == (f"KV file {locked}/kv.log cannot be created: directory {locked} "
                               f"is not writable (--kv-path)")
    existing = tmp_path / "kv.log"
    existing.write_bytes(MAGIC)
    with pytest.raises(KvFileError) as info:
        KvStore(existing)
    assert str(info.value) == f"KV file {existing} is not readable and writable (--kv-path)"


def test_unreadable_corrupt_or_damaged_files_are_named_with_the_backup_only_if_there(tmp_path):
    with pytest.raises(KvFileError) as info:
        read_kv_file(tmp_path)
    assert str(info.value).startswith(f"cannot read KV file {tmp_path}: [Errno 21]")
    path = tmp_path / "kv.log"
    damaged = MAGIC + b"\0" * 12 + encode_record("ns", "k", "v")
    for content, what in ((b"junk", "neither a zns KV log nor the JSON format"),
                          (damaged, f"a damaged record at offset {len(MAGIC)} with valid records "
                                    f"after it")):
        path.write_bytes(content)
        backup = path.with_name("kv.log.bak")
        backup.unlink(missing_ok=True)
        with pytest.raises(KvFileError) as info:
            read_kv_file(path)
        assert str(info.value).startswith(f"KV file {path} is corrupt ({what}). zns will not")
        backup.write_bytes(MAGIC)
        with pytest.raises(KvFileError) as info:
            read_kv_file(path)
        assert str(info.value).startswith(
            f"KV file {path} is corrupt ({what}); an earlier version is {backup}. zns will not")


def test_a_next_file_whose_header_is_torn_holds_nothing_and_is_removed(path, stores, caplog):
    model = write_entries(path, stores)
    nxt = path.with_name(path.name + ".next")
    for torn in (MAGIC[:5], b""):  # created by the write that started a compaction, then a crash
        nxt.write_bytes(torn)
        store = open_store(stores, path)
        assert {ns: store.list(ns) for ns in model} == model and not nxt.exists()
        store.close()


def test_a_clean_start_cuts_nothing_and_a_torn_one_says_how_much_and_where(path, stores, caplog):
    write_entries(path, stores)
    good = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="zns"):
        open_store(stores, path).close()
    assert caplog.records == [] and path.read_bytes() == good
    tail = encode_record("ns", "c", "3" * 100)[:-7]
    path.write_bytes(good + tail)
    with caplog.at_level(logging.WARNING, logger="zns"):
        open_store(stores, path)
    assert [r.getMessage() for r in caplog.records] == [
        f"KV file {path}: cut a torn last record ({len(tail)} bytes at offset {len(good)}): a "
        f"write that was never acknowledged"]


def exactly_twice_live() -> list[str]:
    """Two values of one key whose log is exactly twice its live record: the second record
    as long as the header and the first record together."""
    first = len(encode_record("ns", "k", "x"))
    return ["x", next("y" * n for n in range(100)
                      if len(encode_record("ns", "k", "y" * n)) == len(MAGIC) + first)]


@pytest.mark.parametrize("values, rewritten", [
    (["v" * 100], False),  # the file is its one live record: under 2 x live
    (["v" * 100, "w" * 100], True),  # two records for one live entry: over 2 x live
    (exactly_twice_live(), False),  # not over it
], ids=["once", "twice", "exactly-twice-live"])
def test_a_log_over_twice_its_live_records_is_compacted_at_start(path, stores, values, rewritten):
    store = open_store(stores, path)
    for value in values:
        store.put("ns", "k", value)
    store.close()
    size = path.stat().st_size
    live = len(encode_record("ns", "k", values[-1]))
    assert (size > 2 * live) == rewritten
    store = open_store(stores, path, compact_min_bytes=1)
    assert path.with_name(path.name + ".bak").exists() == rewritten
    assert path.stat().st_size == (len(MAGIC) + live if rewritten else size)
    assert store.get("ns", "k") == values[-1]


def test_a_compaction_starts_only_once_the_log_is_over_its_bound(path, stores):
    record = len(encode_record("ns", "k", "v0"))
    store = open_store(stores, path, compact_min_bytes=len(MAGIC) + 5 * record)
    for i in range(6):  # the sixth write finds the log exactly at the bound: not over it
        store.put("ns", "k", f"v{i % 2}")
    assert store.compaction is None and path.stat().st_size == len(MAGIC) + 6 * record
    assert not path.with_name(path.name + ".bak").exists()
    store.put("ns", "k", "v2")  # over it: one live entry, so compacted at once
    assert path.with_name(path.name + ".bak").exists()
    assert path.stat().st_size == len(MAGIC) + 2 * record


def test_every_compaction_slice_is_at_least_twice_the_write_and_at_least_a_step(path, stores):
    record = len(encode_record("ns", "a", "v" * 100))
    nxt = path.with_name(path.name + ".next")

    def start(step_bytes: int) -> KvStore:
        for leftover in (path, nxt, path.with_name(path.name + ".bak")):
            leftover.unlink(missing_ok=True)
        store = open_store(stores, path, compact_min_bytes=1, step_bytes=step_bytes)
        for key in "abcdefg":
            store.put("ns", key, "v" * 100)
        for i in range(100):
            if store.compaction is not None:
                return store
            store.put("ns", "a", "wx"[i % 2] * 100)  # the same size as every live record
        raise AssertionError("no compaction")

    # A step of one byte: twice the write's record, in whole entries (2 copied, then the write).
    store = start(1)
    assert nxt.stat().st_size == len(MAGIC) + 3 * record
    store.put("ns", "a", "y" * 100)  # the next slice of a compaction: the same bound
    assert nxt.stat().st_size == len(MAGIC) + 6 * record
    store.close()
    # A step of one byte more than two records: three whole entries reach it, two do not.
    store = start(2 * record + 1)
    assert nxt.stat().st_size == len(MAGIC) + 4 * record
    store.close()


def test_a_record_of_the_largest_payload_is_read_back(path, stores):
    # The payload: a 3-array (1 byte), "ns" (3), "k" (2), then the value behind a 5-byte header.
    value = "v" * (kv_file.MAX_PAYLOAD - 11)
    assert len(encode_record("ns", "k", value)) - 12 == kv_file.MAX_PAYLOAD
    open_store(stores, path).put("ns", "k", value)
    stores[-1].close()
    assert open_store(stores, path).get("ns", "k") == value


def test_a_record_is_whole_only_with_its_marker_and_every_byte_its_length_names(path):
    good = encode_record("ns", "a", "1")
    payload = msgspec.msgpack.encode(("ns", "k", "v"))
    # Its checksum right, but the marker of another format: not a record of this log.
    other_marker = b"\xffKV2" + encode_record("ns", "k", "v")[4:]
    # The length claims more than is there; the checksum covers only what is there.
    length = (len(payload) + 50).to_bytes(4, "little")
    short = kv_file.MARKER + length + \
        zlib.crc32(payload, zlib.crc32(length)).to_bytes(4, "little") + payload
    for tail in (other_marker, short):
        path.write_bytes(MAGIC + good + tail)
        assert read_kv_file(path) == {"ns": {"a": "1"}}  # a torn tail, ignored


def test_a_delete_of_a_key_the_file_never_held_is_nothing_to_undo(path):
    # A compacted log starts mid-history: a delete can follow the copy that skipped its key.
    path.write_bytes(MAGIC + encode_record("ns", "a", "1") + encode_record("ns", "gone", None))
    assert read_kv_file(path) == {"ns": {"a": "1"}}


def test_the_first_write_creates_missing_directories_and_a_private_file(tmp_path, stores):
    path = tmp_path / "one" / "two" / "kv.log"
    old_umask = os.umask(0)  # so the mode is the one the store asks for, whole
    try:
        store = open_store(stores, path)
        store.put("ns", "k", "v")
    finally:
        os.umask(old_umask)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert read_kv_file(path) == {"ns": {"k": "v"}}


@pytest.mark.parametrize("fails", ["tmp", "directory"])
def test_a_first_write_that_cannot_be_made_durable_leaves_no_file(path, stores, monkeypatch, fails):
    store = open_store(stores, path)
    spy = Spy(monkeypatch)
    spy.fail_fsync = lambda name: name == (str(path) + ".tmp" if fails == "tmp" else
                                           str(path.parent))
    with pytest.raises(Internal, match="injected"):
        store.put("ns", "k", "v")
    assert kv_files(path) == [] and store.get("ns", "k") is None
    spy.fail_fsync = lambda name: False
    assert store.put("ns", "k", "v") and read_kv_file(path) == {"ns": {"k": "v"}}


def test_each_append_is_timed_by_the_clock_around_it(path, stores):
    ticks = iter([100.0, 100.25])
    store = KvStore(path, clock=lambda: next(ticks))
    stores.append(store)
    store.put("ns", "k", "v")
    assert store.write_times.total_seconds == 0.25
    assert store.write_times.counts[kv_file.WRITE_BOUNDS.index(0.25)] == 1


def compacting_store(stores: list[KvStore], path: Path) -> KvStore:
    store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=300)
    for i in range(1_000):
        store.put("ns", f"k{i % 10}", f"{i}" + "v" * 100)
        if store.compaction is not None:
            return store
    raise AssertionError("no compaction")


def finish(store: KvStore) -> int:
    for i in range(1_000):
        if store.compaction is None:
            return i
        store.put("ns", "k0", f"again{i}")
    raise AssertionError("the compaction does not finish")


def test_a_compaction_that_cannot_be_finished_is_logged_and_finished_by_a_later_write(
        path, stores, monkeypatch, caplog):
    store = compacting_store(stores, path)
    old_size = store.compaction.old_size

    def link(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "injected: no link")

    monkeypatch.setattr(os, "link", link)
    with caplog.at_level(logging.INFO, logger="zns"):
        for i in range(1_000):
            store.put("ns", "k1", f"next{i}")
            if store.compaction.done:
                break
    assert store.compaction is not None  # the copy is complete, but `path` is the old log
    assert [r.getMessage() for r in caplog.records] == [
        f"could not finish compacting the KV log {path}: [Errno 1] injected: no link"]
    monkeypatch.undo()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zns"):
        store.put("ns", "k1", "last")
    assert store.compaction is None and not path.with_name(path.name + ".next").exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"compacted the KV log {path}: {store.log_bytes} bytes (was {old_size})"]
    assert read_kv_file(path)["ns"]["k1"] == "last"


def test_a_directory_fsync_that_fails_after_compacting_is_logged_and_loses_nothing(
        path, stores, monkeypatch, caplog):
    store = compacting_store(stores, path)
    old_size = store.compaction.old_size
    spy = Spy(monkeypatch)
    spy.fail_fsync = lambda name: name == str(path.parent)
    with caplog.at_level(logging.INFO, logger="zns"):
        assert finish(store) > 0
    assert [r.getMessage() for r in caplog.records] == [
        f"could not fsync the directory of {path} after compacting: [Errno 5] injected fsync "
        f"failure",
        f"compacted the KV log {path}: {store.log_bytes} bytes (was {old_size})"]
    model = {"ns": {k: store.get("ns", k) for k in store.list("ns")}}
    store.close()
    assert read_kv_file(path) == model


# --- the space rule (zns.core.kv_log), with the free space handed in ----------------------------


class FreeSpace:
    """What the store is told is free on its disk; `asked` counts the questions."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.asked = 0

    def __call__(self, directory: Path) -> int:
        self.asked += 1
        assert directory.is_dir()
        return self.free


def test_a_put_is_refused_for_space_and_a_delete_is_not(path, stores, caplog):
    disk = FreeSpace(1 << 30)
    store = KvStore(path, free_bytes=disk)
    stores.append(store)
    store.put("ns", "a", "x" * 1_000)
    store.put("ns", "b", "y")
    before = path.read_bytes()
    record = len(encode_record("ns", "c", "z" * 100))
    disk.free = store.policy.space_needed(store.live_record_bytes, record) - 1
    with pytest.raises(Internal) as info:
        store.put("ns", "c", "z" * 100)
    assert str(info.value) == store.policy.put_refusal(disk.free, store.live_record_bytes, record)
    assert path.read_bytes() == before and store.get("ns", "c") is None
    assert store.delete("ns", "a")  # how room is made: never refused by the rule
    disk.free += 1
    assert store.put("ns", "c", "z" * 100)  # exactly what it needs: accepted
    assert read_kv_file(path) == {"ns": {"b": "y", "c": "z" * 100}}


def test_the_first_put_asks_about_the_nearest_directory_that_exists(tmp_path, stores):
    disk = FreeSpace(1 << 30)
    store = KvStore(tmp_path / "not" / "yet" / "kv.log", free_bytes=disk)
    stores.append(store)
    assert store.put("ns", "k", "v") and disk.asked == 1


def test_a_compaction_without_room_for_its_copy_is_put_off_and_said_once(path, stores, caplog):
    # A put that passes the put rule leaves room for a copy; deletes are not checked, so a
    # delete can find a compaction due and no room for it.
    disk = FreeSpace(1 << 30)
    store = KvStore(path, compact_min_bytes=1, free_bytes=disk)
    stores.append(store)
    for i in range(10):
        store.put("ns", f"k{i}", "v" * 100)
    record, delete = len(encode_record("ns", "k0", "v" * 100)), len(encode_record("ns", "k0", None))
    disk.free = len(MAGIC) + 2 * record + delete  # a copy fits only while 2 entries are left
    with caplog.at_level(logging.WARNING, logger="zns"):
        for i in range(8):  # the log goes over twice the live records: the delete appends
            size = store.log_bytes
            assert store.delete("ns", f"k{i}") and store.compaction is None
            assert store.log_bytes == size + len(encode_record("ns", f"k{i}", None))
    assert store.policy.over_bound(store.log_bytes, store.live_record_bytes)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and re.fullmatch(
        rf"KV log {re.escape(str(path))} is due for compaction, but its \d+ bytes of live "
        rf"entries do not fit in the free disk space: put off until they do", said[0])
    assert store.delete("ns", "k8")  # now the copy fits: both entries copied, then the delete
    assert store.compaction is None and path.stat().st_size == len(MAGIC) + 2 * record + delete
    assert read_kv_file(path) == {"ns": {"k9": "v" * 100}}


@pytest.mark.parametrize("room", [True, False])
def test_a_start_compacts_an_over_bound_log_only_when_the_copy_fits(path, stores, caplog, room):
    store = open_store(stores, path)
    for i in range(30):
        store.put("ns", "k", f"{i}" + "v" * 100)
    store.close()
    size = path.stat().st_size
    live = len(encode_record("ns", "k", "29" + "v" * 100))
    disk = FreeSpace(len(MAGIC) + live if room else len(MAGIC) + live - 1)
    with caplog.at_level(logging.WARNING, logger="zns"):
        store = KvStore(path, compact_min_bytes=1, free_bytes=disk)
    stores.append(store)
    assert store.get("ns", "k") == "29" + "v" * 100 and store.compaction is None
    assert path.stat().st_size == (len(MAGIC) + live if room else size)
    assert path.with_name(path.name + ".bak").exists() == room
    assert ("put off until they do" in caplog.text) == (not room)


def test_a_start_that_cannot_finish_a_compaction_cuts_back_and_writes_carry_it_on(
        path, stores, monkeypatch, caplog):
    store = compacting_store(stores, path)
    model = {"ns": store.list("ns")}
    stores.remove(store)
    store.close()  # the crash
    nxt = path.with_name(path.name + ".next")
    next_before = nxt.read_bytes()
    spy = Spy(monkeypatch)
    spy.fail_fsync = lambda name: name == str(nxt)  # the disk refuses the rest of the copy
    with caplog.at_level(logging.WARNING, logger="zns"):
        store = open_store(stores, path, compact_min_bytes=2_000, step_bytes=300)
    assert [r.getMessage() for r in caplog.records] == [
        f"KV file {path}: could not finish compacting at start ([Errno 5] injected fsync "
        f"failure); the compaction goes on with later writes"]
    assert nxt.read_bytes() == next_before and store.compaction is not None
    assert {"ns": store.list("ns")} == model == read_kv_file(path)
    spy.fail_fsync = lambda name: False
    assert finish(store) > 0 and not nxt.exists()
    model["ns"]["k0"] = store.get("ns", "k0")
    assert read_kv_file(path) == model

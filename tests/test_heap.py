"""The heap trim: glibc's malloc_trim called at a calm moment once many route events were
made, at most once per interval; harmless where it runs, absent without glibc."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from helpers import ThreadedServer, register_fields, wait_for
from zns.drivers import heap, server as server_module
from zns.drivers.heap import HeapTrim


class FakeTrim:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, pad: int) -> int:
        self.calls.append(pad)
        return 1


def test_trims_after_enough_events_and_at_most_once_per_interval() -> None:
    trim = FakeTrim()
    heap_trim = HeapTrim(trim, now=0, after_events=100, every_ms=10_000)
    heap_trim.events_made(99)
    heap_trim.calm(1)
    assert trim.calls == []  # not enough changed
    heap_trim.events_made(1)
    heap_trim.calm(2)
    assert trim.calls == [0] and heap_trim.pending == 0
    heap_trim.events_made(1_000)
    heap_trim.calm(9_999)
    assert trim.calls == [0]  # too soon after the last
    heap_trim.calm(10_002)
    assert trim.calls == [0, 0] and heap_trim.trims == 2


def test_without_glibc_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert heap.glibc_malloc_trim() is None
    heap_trim = HeapTrim(None, now=0, after_events=1, every_ms=0)
    heap_trim.events_made(10)
    heap_trim.calm(1)
    assert heap_trim.trims == 0


def test_the_real_malloc_trim_is_harmless() -> None:
    trim = heap.glibc_malloc_trim()
    if trim is None:
        pytest.skip("not glibc")
    kept = [bytes(100_000) for _ in range(200)]  # 20 MB of malloc'd blocks, half freed
    del kept[::2]
    assert trim(0) in (0, 1)
    assert sum(map(len, kept)) == 100 * 100_000 and bytes(kept[0]) == bytes(100_000)


@pytest.mark.timeout(60)
@pytest.mark.single_process("patches the server module's heap trim in this process")
def test_the_server_trims_when_calm_after_many_route_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trim = FakeTrim()
    monkeypatch.setattr(server_module, "glibc_malloc_trim", lambda: trim)
    monkeypatch.setattr(server_module, "HeapTrim",
                        functools.partial(HeapTrim, after_events=100, every_ms=0))
    srv = ThreadedServer(tmp_path, heartbeat_interval_s=60)  # few hb events: routes count
    try:
        peer = srv.peer()
        peer.ok("register_broker", **register_fields(topics={f"T{i}": {} for i in range(50)}))
        peer.ok("status")
        assert trim.calls == []  # 50 route events (and at most an hb or two): not yet
        peer.ok("register_broker", **register_fields(
            broker_name="broker-b", addr="10.0.0.2:10911",
            topics={f"U{i}": {} for i in range(60)}))
        wait_for(lambda: trim.calls)
        assert trim.calls == [0]
        assert peer.ok("status").topics == 110  # and the server goes on serving
    finally:
        srv.stop()


# --- pinned by mutation testing (docs/mutation-scores.md) ------------------------------------


def test_deadline_busy_and_log_of_a_trim(caplog) -> None:
    import logging
    import re

    trim = FakeTrim()
    busy = [True]
    heap_trim = HeapTrim(trim, now=0, after_events=100, every_ms=10_000, busy=lambda: busy[0])
    assert heap_trim.next_deadline(5) is None  # no event made
    heap_trim.events_made(100)
    assert heap_trim.next_deadline(5) == 5  # exactly enough, and the first trim is due at once
    heap_trim.run({}, 5, 10)
    assert trim.calls == []  # a request is waiting: not now
    busy[0] = False
    with caplog.at_level(logging.DEBUG, logger="zns"):
        heap_trim.run({}, 6, 11)
    assert trim.calls == [0]
    assert re.fullmatch(r"malloc_trim: memory returned to the OS in \d+\.\d ms",
                        caplog.records[-1].getMessage())
    heap_trim.events_made(100)
    assert heap_trim.next_deadline(7) == 10_006  # the interval after the last trim
    assert HeapTrim(None, now=0, after_events=1).next_deadline(0) is None  # no glibc
    idle = HeapTrim(lambda pad: 0, now=0, after_events=1)
    idle.events_made(1)
    with caplog.at_level(logging.DEBUG, logger="zns"):
        idle.run({}, 1, 6)  # the default: never busy
    assert idle.trims == 1
    assert caplog.records[-1].getMessage().startswith("malloc_trim: nothing to return in ")


def test_glibc_malloc_trim_is_found_by_name_or_not_at_all(monkeypatch) -> None:
    import ctypes
    import ctypes.util
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    trim = heap.glibc_malloc_trim()
    assert trim is not None and trim.argtypes == [ctypes.c_size_t] and trim.restype is ctypes.c_int
    asked: list[str] = []
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: asked.append(name))
    assert heap.glibc_malloc_trim() is not None  # found by its usual file name instead
    assert asked == ["c"]
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert heap.glibc_malloc_trim() is None


def test_a_trim_logs_how_long_it_took_in_milliseconds(monkeypatch, caplog) -> None:
    import logging
    import types

    readings = iter([1.0, 1.25])  # the clock before and after the trim
    monkeypatch.setattr(heap, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    heap_trim = HeapTrim(FakeTrim(), now=0, after_events=1)
    heap_trim.events_made(1)
    with caplog.at_level(logging.DEBUG, logger="zns"):
        heap_trim.calm(1)
    assert caplog.records[-1].getMessage() == "malloc_trim: memory returned to the OS in 250.0 ms"


def test_the_c_library_loaded_is_the_one_find_library_names(monkeypatch) -> None:
    import ctypes.util
    import types

    loaded: list[str | None] = []

    def cdll(name: str | None) -> object:
        loaded.append(name)
        return types.SimpleNamespace(malloc_trim=types.SimpleNamespace())

    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(heap.ctypes, "CDLL", cdll)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "/opt/libc/libc.so.6")
    assert heap.glibc_malloc_trim() is not None
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert heap.glibc_malloc_trim() is not None
    assert loaded == ["/opt/libc/libc.so.6", "libc.so.6"]

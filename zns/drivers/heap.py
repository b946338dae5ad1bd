"""Hands the C heap's free memory back to the OS once much route state was replaced.

CPython allocates its larger objects (encoded routes, big dicts and lists) with the
C library's malloc, and glibc keeps what is freed for reuse rather than returning it:
a server whose routes churned keeps the RSS of its busiest moment (bench/memory.py:
2,000,000 queue data values through a table of 10,000 topics left RSS 104 MiB above
its start with 4 MiB of live objects). glibc's `malloc_trim(0)` gives the free pages
back. `HeapTrim` is a source of the server's loop (`zns.drivers.loop`): it asks to
run once at least TRIM_AFTER_EVENTS events were made since the last trim (every
replaced or removed route is one, whether or not this process publishes it), at most once per TRIM_EVERY_MS, and trims only
when no request is waiting (`busy`): a trim walks the whole heap, so it must not run
per request. Without glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
import time
from collections.abc import Callable

log = logging.getLogger("zns")

TRIM_AFTER_EVENTS = 10_000
TRIM_EVERY_MS = 10_000

Trim = Callable[[int], int]


def glibc_malloc_trim() -> Trim | None:
    """glibc's `malloc_trim`, or None where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrim:
    """Counts the events made; at a calm moment after many, trims the heap (rate-limited)."""

    what = "trimming the heap"

    def __init__(self, trim: Trim | None, now: int, *, after_events: int = TRIM_AFTER_EVENTS,
                 every_ms: int = TRIM_EVERY_MS, busy: Callable[[], bool] = lambda: False) -> None:
        self._trim = trim
        self.busy = busy
        self._after_events, self._every_ms = after_events, every_ms
        self._last = now - every_ms  # the first trim needs only the events
        self.pending = 0  # events made since the last trim
        self.trims = 0

    def events_made(self, events: int) -> None:
        self.pending += events

    # --- the loop's side (a `zns.drivers.loop.Source`) --------------------

    def attach(self, poll: object) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        if self._trim is None or self.pending < self._after_events:
            return None
        return max(now, self._last + self._every_ms)

    def run(self, ready: object, now: int, until: int) -> None:
        if not self.busy():
            self.calm(now)

    def calm(self, now: int) -> None:
        """Nothing is waiting: trim if enough changed and the last trim is old."""
        if (self._trim is None or self.pending < self._after_events
                or now - self._last < self._every_ms):
            return
        started = time.perf_counter()
        released = self._trim(0)
        self._last, self.pending = now, 0
        self.trims += 1
        log.debug("malloc_trim: %s in %.1f ms", "memory returned to the OS" if released
                  else "nothing to return", (time.perf_counter() - started) * 1000)

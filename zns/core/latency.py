"""Durations as histograms of plain ints: request latency per request kind (a bounded
label set), and one `Histogram` for any other duration (the KV file's durable writes).

The drivers time each request they hand to the core (ZNS/1: by op; remoting: by
request code's name) and call `observe`; `/metrics` reads the counts when
Prometheus scrapes (from another thread: a stale read is one observation behind).
The labels are bounded twice: the callers pass only names from a fixed set
(ZNS/1's ops or "unknown", RocketMQ's NameServer codes or "OTHER"), and a label
past MAX_LABELS is counted as "other" whatever it is.

Sans-I/O: the seconds are measured by the caller.
"""

from __future__ import annotations

import bisect

# Upper bounds in seconds: from a cached route read (tens of µs) to a whole-store KV
# write or a 20,000-topic registration (hundreds of ms).
BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
MAX_LABELS = 64


class Histogram:
    """How many durations fell in each bucket (one per bound, then +Inf; not cumulative:
    a bucket counts those up to its bound, Prometheus's `le`, past the one before) and
    their sum."""

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total_seconds = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_seconds += seconds


class LatencyHistogram:
    """A `Histogram` of BOUNDS per label, at most MAX_LABELS of them and "other"."""

    def __init__(self) -> None:
        self.labels: dict[str, Histogram] = {}

    def observe(self, label: str, seconds: float) -> None:
        histogram = self.labels.get(label)
        if histogram is None:
            if len(self.labels) >= MAX_LABELS:
                label = "other"
                histogram = self.labels.get(label)
            if histogram is None:
                histogram = self.labels[label] = Histogram()
        histogram.observe(seconds)


# The age of brokers' last heartbeats, in seconds: RocketMQ brokers heartbeat every 30 s
# and expire after 120 s; ZNS/1 brokers every few seconds.
AGE_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0)


def age_buckets(last_heartbeats: list[int], now: int) -> tuple[list[int], float, float]:
    """(count per AGE_BOUNDS bucket then +Inf, not cumulative; sum of ages; the largest age),
    the ages in seconds at `now` of the heartbeats at `last_heartbeats` (ms)."""
    ages = Histogram(AGE_BOUNDS)
    largest = 0.0
    for last in last_heartbeats:
        age = max(0, now - last) / 1000
        ages.observe(age)
        largest = max(largest, age)
    return ages.counts, ages.total_seconds, largest

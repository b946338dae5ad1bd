"""Request latency as a histogram of plain ints, per request kind (a bounded label set).

The drivers time each request they hand to the core (ZNS/1: by op; remoting: by
request code's name) and call `observe`; `/metrics` reads the counts when
Prometheus scrapes. The labels are bounded twice: the callers pass only names
from a fixed set (ZNS/1's ops or "unknown", RocketMQ's NameServer codes or
"OTHER"), and a label past MAX_LABELS is counted as "other" whatever it is.

Sans-I/O: the seconds are measured by the caller.
"""

from __future__ import annotations

import bisect

# Upper bounds in seconds: from a cached route read (tens of µs) to a whole-store KV
# write or a 20,000-topic registration (hundreds of ms).
BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
MAX_LABELS = 64


class LatencyHistogram:
    """Cumulative-free bucket counts (one per bound, then +Inf) and sums, by label."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.sums: dict[str, float] = {}

    def observe(self, label: str, seconds: float) -> None:
        counts = self.counts.get(label)
        if counts is None:
            if len(self.counts) >= MAX_LABELS:
                label = "other"
                counts = self.counts.get(label)
            if counts is None:
                counts = self.counts[label] = [0] * (len(BOUNDS) + 1)
                self.sums[label] = 0.0
        counts[bisect.bisect_left(BOUNDS, seconds)] += 1
        self.sums[label] += seconds


# The age of brokers' last heartbeats, in seconds: RocketMQ brokers heartbeat every 30 s
# and expire after 120 s; ZNS/1 brokers every few seconds.
AGE_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0)


def age_buckets(last_heartbeats: list[int], now: int) -> tuple[list[int], float, float]:
    """(count per AGE_BOUNDS bucket then +Inf, not cumulative; sum of ages; the largest age),
    the ages in seconds at `now` of the heartbeats at `last_heartbeats` (ms)."""
    counts = [0] * (len(AGE_BOUNDS) + 1)
    total = largest = 0.0
    for last in last_heartbeats:
        age = max(0, now - last) / 1000
        counts[bisect.bisect_left(AGE_BOUNDS, age)] += 1
        total += age
        largest = max(largest, age)
    return counts, total, largest

"""Exponential backoff with jitter: how long to wait before trying a NameServer again.

The random source is injected, so tests are deterministic; times are whatever
unit the caller uses for `base` and `cap`.
"""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter, so many clients do not return in step."""

    def __init__(self, base: float = 0.1, cap: float = 10.0, rng: random.Random | None = None):
        self.base, self.cap = base, cap
        self._rng = rng or random.Random()
        self._failures = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * 2 ** self._failures)
        self._failures = min(self._failures + 1, 32)
        return delay * self._rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self._failures = 0

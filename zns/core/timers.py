"""The server's timers, sans-I/O: `hb` events, expiry and the §8 stall rule.

The driver asks `next_deadline()` when to call back, tells `expect(wake)` when
its poll will return at the latest (the earliest deadline of every source of
its loop), blocks in its poller until then (or until a socket is ready), tells
`woke(now, ran_ms)` when it returns (and how much CPU time the process spent
meanwhile), tells `ran(wall_ms, cpu_ms)` how long each source of its loop
worked, and calls `on_timer(now, wall_ms)`, which returns the
events to publish. Every time is in milliseconds; `now` is monotonic,
`wall_ms` is the wall clock and only ever goes into `hb` events. (Peer links
own their timers: `zns.core.peer_link`.)

The stall rule (§8): a server that was not running (suspended, its clock
jumped) must not evict brokers for that time. Two measurements cover it:

- a wake-up later than planned, less the CPU time the process spent during
  the wait, by more than max(1 s, 2 × the hb interval): the process slept
  through its own timer, so that excess is a stall;
- a serving span whose wall time exceeds the CPU time the process spent in it
  by more than the same threshold: the process was stopped while serving.

Time the process spent running — serving requests, expiring brokers, or any
other of its threads running while the loop thread waited for the GIL — is
never a stall: it is CPU time of the process (the driver measures it, with
every thread counted), and the driver gives timers their turn every few
milliseconds of serving, so a plan is never late because of load.

While a broker could expire, the plan is never more than STALL_PROBE_MS
ahead, so a pause is measured nearly whole; with nothing to expire there is
nothing a stall could wrongly evict, and the loop sleeps until the next `hb`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from zns.core.service import Frames, NameService

log = logging.getLogger("zns")

# While a broker could expire the loop never plans further ahead than this: a stall
# is measured from the planned wake-up, so a short plan measures nearly all of it (a
# broker that heartbeated just before a 3 s SIGSTOP keeps its whole timeout).
STALL_PROBE_MS = 100
MIN_STALL_MS = 1000


class ServerTimers:
    def __init__(
        self,
        service: NameService,
        *,
        heartbeat_interval_ms: int,
        now: int,
    ) -> None:
        self.service = service
        self.interval_ms = max(1, heartbeat_interval_ms)
        self.stall_threshold_ms = max(MIN_STALL_MS, 2 * self.interval_ms)
        self.stalls = 0  # how many stalls were measured (for logs and metrics)
        self._now = now
        self._next_hb = now
        self._planned = now

    def next_deadline(self) -> int:
        """When to call `on_timer` next; the driver blocks no longer than this."""
        now = self._now
        wake = self._next_hb
        deadline = self.service.next_deadline()
        if deadline is not None:
            if deadline + 1 < wake:
                # A broker expires once now > deadline. One already due (a partition expired
                # in slices) is due now, not at its deadline: planning a past wake-up would
                # make the time spent expiring look like a stall and move every deadline.
                wake = max(now, deadline + 1)
            wake = min(wake, now + STALL_PROBE_MS)
        self._planned = wake
        return wake

    def expect(self, wake: int) -> None:
        """The driver's poll returns by `wake` at the latest (another source may want it sooner)."""
        self._planned = min(self._planned, max(self._now, wake))

    def woke(self, now: int, ran_ms: int = 0) -> int:
        """The driver's wait returned at `now`, the process having spent `ran_ms` of CPU
        time since the wait began; returns the stall measured (0: none)."""
        late = now - self._planned - max(0, ran_ms)
        self._now = max(self._now, now)
        self._planned = max(self._planned, now)  # measured once
        return self._stalled(late)

    def ran(self, wall_ms: int, cpu_ms: int) -> int:
        """The driver served for `wall_ms`, of which it ran `cpu_ms`; returns the stall measured."""
        stall = self._stalled(wall_ms - cpu_ms)
        # The stand-still is behind us now, and the timers' own plan moves by it like every
        # deadline: a plan made from the time before it would make the next wake-up late
        # by it again and move every deadline twice. The `hb` is due at once, as after a
        # stall measured in the wait (`woke`): subscribers learn the server is back at the
        # next pass, after its expiry, not up to an interval later.
        if stall:
            self._now += stall
            self._planned += stall
            self._next_hb = self._now
        return stall

    def on_timer(self, now: int, wall_ms: int) -> list[Sequence[Frames]]:
        """Run what is due at `now`: expiries, the `hb` event; returns the events to publish,
        in batches (an expiry's events are encoded as they are sent: `EventFrames`)."""
        self._now = max(self._now, now)
        events: list[Sequence[Frames]] = [self.service.expire(now)]
        if now >= self._next_hb:
            events.append([self.service.heartbeat_event(wall_ms)])
            self._next_hb += self.interval_ms
            if self._next_hb <= now:
                self._next_hb = now + self.interval_ms
        return events

    def _stalled(self, late_ms: int) -> int:
        if late_ms <= self.stall_threshold_ms:
            return 0
        self.stalls += 1
        log.warning("the server stalled for %d ms; moving every deadline by it", late_ms)
        self.service.shift_deadlines(late_ms)
        return late_ms

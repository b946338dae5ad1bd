"""The server's one loop: uniform sources, one poll, one timer, one outbox.

Everything the server does between two polls is done by a *source* (the
ZNS/1 router, the remoting listener, the peer links, the descriptor guard,
the server timers, the heap trim, the outbox): an object that

- registers its sockets in the loop's `PollSet` (`attach`, and later as its
  sockets come and go),
- is run when one of its sockets is ready or its deadline is due, with the
  end of a time slice it must stop at (`run(ready, now, until)`): work left
  over is asked for again through its deadline (`now`), never done past the
  slice; a source may also hand back before its slice ends by returning True
  (the ZNS/1 router after a request that made events), and is run again
  within the same slice once the urgent sources below had their turn,
- says when it next needs to run (`next_deadline(now)`: a time in ms, or
  None for "only when a socket of mine is ready").

The loop itself is the few lines of `Loop.run`: poll until the earliest
deadline of all sources (no fixed-interval wake-up), then run each source
that is ready or due, in a fixed order -- and after each one, the *urgent*
sources (the timers, then the outbox) that have come due meanwhile, so an
expiry waits for at most one source's slice, not for a whole pass of them,
and its events leave at once -- reading the clock again after each, so a
slow source cannot push the next one's `now` into the past. For the §8 stall
rule (`StallMeter.woke`, `StallMeter.ran`) the loop compares wall time with
the *process's* CPU time, so time spent running is never mistaken for a stall
-- neither the loop's own nor that of another thread of the process, which the
loop thread may have waited for (the GIL) without the process ever stopping.
The CPU clock is a system call (several µs on a VM), so it is read once a
pass, before the poll, after the poll only when the wait was longer than a
stall could be, and after a source only once the span since the last reading
is longer than that -- never between a request's reply and its events. A bug in a
source is logged with its traceback and the loop goes on (`NameService.respond`
is the same boundary for requests). This is Tornado's IOLoop (`add_handler`,
`call_at`) and aioquic's `get_timer()`/`handle_timer(now)` in one shape.

Events to publish go into one `Outbox` (itself the last source, and urgent),
sent as soon as the source that made them hands back.

What a push costs between a route-changing request's reply and its event
(bench/results.md, "Changes measured"): reading the next request first costs
a failing read (a system call) when none waits, hence the router's hand-back;
the loop's own steps in between are a clock read and the due checks of the
timers and the outbox, a few µs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import zmq

from zns.core.service import Frames

log = logging.getLogger("zns")

# How long one source may work before the next gets its turn (§8: hb and expiry
# stay on time whatever the load).
SLICE_MS = 5

Ready = Mapping[Any, int]  # what the poll returned: socket or fd -> zmq.POLLIN/POLLOUT flags
Poll = Callable[[float | None], Sequence[tuple[Any, int]]]


class Source(Protocol):
    """One thing the loop serves (see the module docstring)."""

    what: str  # "serving requests": how a bug in it is logged

    def attach(self, poll: PollSet) -> None: ...

    def run(self, ready: Ready, now: int, until: int) -> bool | None: ...

    def next_deadline(self, now: int) -> int | None: ...


class StallMeter(Protocol):
    """The §8 stall rule's two measurements (`zns.core.timers.ServerTimers`)."""

    stall_threshold_ms: int  # a stand-still no longer than this is not one

    def expect(self, wake: int) -> None: ...

    def woke(self, now: int, ran_ms: int = 0) -> int: ...

    def ran(self, wall_ms: int, cpu_ms: int) -> int: ...


class PollSet:
    """The loop's one `zmq.Poller`, and which source owns each registered socket.

    Sources register few, long-lived sockets here: pyzmq's `Poller.unregister`
    costs O(registered) per call and `poll` rebuilds its array each call, so a
    source with many connections (the remoting listener) keeps them in an epoll
    of its own and registers only that.
    """

    def __init__(self, poller: zmq.Poller | None = None) -> None:
        self.poller = poller or zmq.Poller()
        self.owners: dict[Any, Source] = {}

    def register(self, sock: Any, flags: int, owner: Source) -> None:
        """Watch `sock` (a zmq socket, or a plain descriptor as an int) for `flags`."""
        self.poller.register(sock, flags)
        self.owners[sock] = owner

    def unregister(self, sock: Any) -> None:
        if self.owners.pop(sock, None) is not None:
            self.poller.unregister(sock)


class Loop:
    """Runs `sources` until `stopping()`; see the module docstring."""

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        clock: Callable[[], int],
        stall: StallMeter,
        poll: PollSet | None = None,
        cpu_clock: Callable[[], int] | None = None,
        urgent: Sequence[Source] = (),
    ) -> None:
        self.sources = list(sources)
        # Also run between the others whenever due (each is in `sources` too, for its place
        # in a pass): hb and expiry are due at a time, the rest can wait a slice.
        self.urgent = list(urgent)
        self.clock = clock
        self.cpu_clock = cpu_clock or _cpu_ms
        self.stall = stall
        self.poll = poll or PollSet()
        self.wakeups = 0  # polls that returned (tests count them)
        self.last_pass_ms = clock()  # when the last pass completed (/healthz)
        # Where the stall rule last measured: wall and CPU clock (`_run_one`).
        self._wall_mark, self._cpu_mark = self.last_pass_ms, self.cpu_clock()
        for source in self.sources:
            source.attach(self.poll)

    def next_deadline(self, now: int) -> int | None:
        deadlines = [d for s in self.sources if (d := s.next_deadline(now)) is not None]
        return min(deadlines) if deadlines else None

    def run(self, stopping: Callable[[], bool]) -> None:
        now = self.clock()
        while not stopping():
            deadline = self.next_deadline(now)
            if deadline is not None:
                self.stall.expect(deadline)
            # The CPU clock is a system call (µs each on a VM): read here, not between a
            # request's reply and its events (see `_run_one`).
            self._cpu_mark = self.cpu_clock()
            waited_from = now
            ready = dict(self.poll.poller.poll(None if deadline is None else max(0, deadline - now)))
            self.wakeups += 1
            now = self.clock()
            # A wait no longer than a stall cannot hold one: the CPU clock is read again
            # only after a longer one, to tell the process stopped (no CPU time) from the
            # loop thread kept from running by the process's other threads (CPU time).
            ran = 0
            if now - waited_from > self.stall.stall_threshold_ms:
                cpu = self.cpu_clock()
                ran, self._cpu_mark = cpu - self._cpu_mark, cpu
            self.stall.woke(now, ran)
            now = self.run_pass(ready, now)

    def run_pass(self, ready: Ready, now: int) -> int:
        """Run every source that is ready or due, each followed by the urgent sources due by
        then (and run again within its slice while it hands back early); returns the clock
        after the last one."""
        self._wall_mark = now
        woken = {self.poll.owners.get(sock) for sock in ready}
        urgent = self.urgent
        for source in self.sources:
            if source not in woken and not _due(source, now):
                continue
            until = now + SLICE_MS
            while True:
                more, now = self._run_one(source, ready, now, until)
                if source in urgent:
                    break
                for first in urgent:
                    if _due(first, now):
                        now = self._run_one(first, {}, now, now + SLICE_MS)[1]
                if not more or now >= until:
                    break
        self.last_pass_ms = now
        return now

    def _run_one(self, source: Source, ready: Ready, now: int, until: int) -> tuple[bool, int]:
        """Run `source` until `until`; whether it handed back early, and the clock after it."""
        more = False
        try:
            more = bool(source.run(ready, now, until))
        except Exception:
            log.exception("bug while %s; the server carries on", source.what)
        after = self.clock()
        # The §8 stall rule: wall time the process did not run (it stopped while a source
        # worked) is a stall; time it ran, in this thread or another, is never one. Measured over the span since
        # the last measurement (the pass's start), and only once that span is longer than a
        # stall: a shorter one cannot hold one, and the CPU clock is a system call that
        # would otherwise sit between every reply and its events.
        if after - self._wall_mark > self.stall.stall_threshold_ms:
            cpu = self.cpu_clock()
            self.stall.ran(after - self._wall_mark, cpu - self._cpu_mark)
            self._wall_mark, self._cpu_mark = after, cpu
        return more, after


def _due(source: Source, now: int) -> bool:
    deadline = source.next_deadline(now)
    return deadline is not None and deadline <= now


class Outbox:
    """Events to publish, collected from every source; an urgent source, so they are sent
    as soon as the source that made them hands back (after every source, not once a pass)."""

    what = "publishing events"

    def __init__(self, send: Callable[[Frames], None],
                 published: Callable[[int], None] = lambda count: None) -> None:
        self._send = send
        self._published = published
        self._pending: list[Sequence[Frames]] = []

    def put(self, events: Sequence[Frames]) -> None:
        if events:
            self._pending.append(events)

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        return now if self._pending else None

    def run(self, ready: Ready, now: int, until: int) -> None:
        pending, self._pending = self._pending, []
        send = self._send
        for events in pending:
            self._published(len(events))
            for frames in events:
                send(frames)


def _cpu_ms() -> int:
    """CPU time of the whole process, every thread (a stopped process spends none).

    Not the loop thread's own: a loop thread waiting for the GIL while other threads
    of the process run (the metrics server's) is not stopped, and its deadlines must
    not move."""
    return int(time.process_time() * 1000)

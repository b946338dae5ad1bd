"""Writes a worker forwarded to the state process and not answered yet, sans-I/O.

A worker of `zns serve --workers N` answers reads from its replica and
forwards each write to the state process (zns.drivers.worker). It does not
wait for the answer: the request that made the write is parked by the driver
that read it (the ZNS/1 request router, the remoting listener), the loop goes
on serving, and once the answer is here (the state process applied the write
AND this worker's replica applied its command: read-your-writes) the driver
finishes the request from where its write left off (`WriteInFlight.resume`):
the request is decoded once, and the reply is built by exactly the code that
builds it in a single process. What a parked write keeps is only what its
reply needs (its id and op, the remoting command it answers, the sender of an
audit line, a registration's broker names for the line of a refusal), never
its decoded request: a decoded registration takes several
times its bytes.

This object holds what that needs, and decides the two bounds:

- at most `max_in_flight` writes are forwarded and unanswered at once; past
  it a write is refused `busy` (`admit`), having been sent nowhere;
- at most `max_queued_bytes` wait in the worker for the state process to read
  them (what its channel holds unsent); a write that would pass it is refused
  `busy` too, unless nothing waits. The count alone does not bound those bytes:
  a write is encoded for the state process with every field (a registration's
  topics sent as `{}` grow almost tenfold: 1.1 MB for 116 KB of request), and a write
  that timed out no longer counts, though it still waits if the state process is
  stalled;
- a write not answered within `timeout_ms` is answered `busy` (`on_timer`
  makes its answer None); an answer that comes later is dropped.

`WriteInFlight` is how a forwarded write leaves the handler that made it: a
BaseException, so that no boundary's catch-all (which turns a bug into an
`internal` reply) takes it for an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zns.core.errors import Busy

DEFAULT_MAX_IN_FLIGHT = 256
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_MAX_QUEUED_BYTES = 64 * 1024 * 1024


class WriteInFlight(BaseException):
    """The write of the request being handled was forwarded as `token`: park the request,
    and once `ForwardedWrites.ready` holds `token`, call `resume` for what its handler
    returns (its reply), without decoding the request again.

    `resume` starts as what the write returns once answered (or raises); every boundary
    the exception leaves through adds what it does with that (`then`), so the request is
    finished by the same code that finishes a write applied at once."""

    def __init__(self, token: int, answer: Callable[[], Any]) -> None:
        super().__init__(token)
        self.token = token
        self.resume = answer

    def then(self, finish: Callable[[Callable[[], Any]], Any]) -> None:
        """The boundary being left finishes the request as `finish(written)`, `written()`
        being what the code below it returns (or raises) once the write is answered."""
        written = self.resume
        self.resume = lambda: finish(written)


class ForwardedWrites:
    """Forwarded writes by token: in flight (with a deadline) until answered or timed out,
    then ready until the request that made them is resumed."""

    def __init__(self, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES) -> None:
        if max_in_flight < 1 or timeout_ms < 1 or max_queued_bytes < 1:
            raise ValueError("max_in_flight, timeout_ms and max_queued_bytes must be positive")
        self.max_in_flight = max_in_flight
        self.timeout_ms = timeout_ms
        self.max_queued_bytes = max_queued_bytes
        self.timed_out = 0  # writes answered `busy` for want of an answer in time
        self.refused = 0  # writes refused `busy` past max_in_flight or max_queued_bytes
        # Times the ZNS/1 router stopped reading requests: the requests it held (these
        # writes' own and the later requests of their connections) reached its bounds
        # (zns.drivers.request_router counts them here, for /metrics).
        self.request_pauses = 0
        # token -> deadline; insertion order is deadline order (`now` never moves back)
        self._in_flight: dict[int, int] = {}
        self.ready: dict[int, bytes | None] = {}  # token -> answer (None: timed out)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def admit(self, size: int = 0, queued: int = 0) -> None:
        """Raise Busy if one more write would exceed `max_in_flight`, or if its `size`
        bytes (as forwarded) on top of the `queued` bytes the state process has not read yet
        would exceed `max_queued_bytes` (a write alone is admitted whatever its size)."""
        if len(self._in_flight) >= self.max_in_flight:
            self.refused += 1
            raise Busy(f"{self.max_in_flight} writes are already at the state process on this "
                       "worker; retry")
        if queued and queued + size > self.max_queued_bytes:
            self.refused += 1
            raise Busy(f"{queued} bytes of writes wait for the state process to read them on "
                       f"this worker; retry")

    def sent(self, token: int, now: int) -> None:
        """Write `token` was forwarded at `now`."""
        # Never before the last one's: the first in flight is always the first due.
        self._in_flight[token] = max(now + self.timeout_ms, self._last_deadline())

    def answered(self, token: int, answer: bytes) -> None:
        """The answer to `token` is readable here; one not in flight (timed out, or a write
        nobody waits for) is dropped."""
        if self._in_flight.pop(token, None) is not None:
            self.ready[token] = answer

    def on_timer(self, now: int) -> None:
        """Every write whose deadline passed gets the answer None (`busy`)."""
        while self._in_flight:
            token, deadline = next(iter(self._in_flight.items()))
            if deadline > now:
                return
            del self._in_flight[token]
            self.ready[token] = None
            self.timed_out += 1

    def lose_all(self) -> None:
        """Every write in flight gets the answer None (`busy`) now: their answers will never
        come (a follower admitted again: the worker that held them is gone)."""
        for token in self._in_flight:
            self.ready[token] = None
        self.timed_out += len(self._in_flight)
        self._in_flight.clear()

    def next_deadline(self) -> int | None:
        """When `on_timer` must next run (None: no write in flight)."""
        return next(iter(self._in_flight.values()), None)

    def take(self, token: int) -> bytes | None:
        """The answer of ready write `token`, once (None: it timed out: `busy`)."""
        return self.ready.pop(token)

    def done(self, token: int) -> None:
        """The parked request of `token` was finished, or will never be (its connection
        closed): an answer it did not take is dropped."""
        self.ready.pop(token, None)

    def _last_deadline(self) -> int:
        return next(reversed(self._in_flight.values()), 0)

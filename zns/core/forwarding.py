"""Writes a worker forwarded to the state process and not answered yet, sans-I/O.

A worker of `zns serve --workers N` answers reads from its replica and
forwards each write to the state process (zns.drivers.worker). It does not
wait for the answer: the request that made the write is parked by the driver
that read it (the ZNS/1 request router, the remoting listener), the loop goes
on serving, and once the answer is here (the state process applied the write
AND this worker's replica applied its command: read-your-writes) the driver
handles the same request again. This time the write finds its answer ready
(`resume`), and the reply is built by exactly the code that builds it in a
single process.

This object holds what that needs, and decides the two bounds:

- at most `max_in_flight` writes are forwarded and unanswered at once; past
  it a write is refused `busy` (`admit`), having been sent nowhere;
- a write not answered within `timeout_ms` is answered `busy` (`on_timer`
  makes its answer None); an answer that comes later is dropped.

`WriteInFlight` is how a forwarded write leaves the handler that made it: a
BaseException, so that no boundary's catch-all (which turns a bug into an
`internal` reply) takes it for an error.
"""

from __future__ import annotations

from zns.core.errors import Busy

DEFAULT_MAX_IN_FLIGHT = 256
DEFAULT_TIMEOUT_MS = 30_000


class WriteInFlight(BaseException):
    """The write of the request being handled was forwarded as `token`: park the request
    and handle it again once `ForwardedWrites.ready` holds `token`."""

    def __init__(self, token: int) -> None:
        super().__init__(token)
        self.token = token


class ForwardedWrites:
    """Forwarded writes by token: in flight (with a deadline) until answered or timed out,
    then ready until the request that made them is handled again."""

    def __init__(self, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        if max_in_flight < 1 or timeout_ms < 1:
            raise ValueError("max_in_flight and timeout_ms must be positive")
        self.max_in_flight = max_in_flight
        self.timeout_ms = timeout_ms
        self.timed_out = 0  # writes answered `busy` for want of an answer in time
        self.refused = 0  # writes refused `busy` past max_in_flight
        # Times the ZNS/1 router stopped reading requests, past its bounds of requests held
        # behind these writes (zns.drivers.request_router counts them here, for /metrics).
        self.requests_paused = 0
        # token -> deadline; insertion order is deadline order (`now` never moves back)
        self._in_flight: dict[int, int] = {}
        self.ready: dict[int, bytes | None] = {}  # token -> answer (None: timed out)
        self.resuming: int | None = None  # the token whose request is being handled again

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def admit(self) -> None:
        """Raise Busy if one more write would exceed `max_in_flight`."""
        if len(self._in_flight) >= self.max_in_flight:
            self.refused += 1
            raise Busy(f"{self.max_in_flight} writes are already at the state process on this "
                       "worker; retry")

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

    def next_deadline(self) -> int | None:
        """When `on_timer` must next run (None: no write in flight)."""
        return next(iter(self._in_flight.values()), None)

    def resume(self, token: int) -> None:
        """The request of ready write `token` is about to be handled again: its write takes
        the answer (`take`) instead of being forwarded."""
        self.resuming = token

    def take(self) -> bytes | None:
        """The answer of the write being resumed (None: it timed out: `busy`)."""
        token, self.resuming = self.resuming, None
        assert token is not None, "take() outside a resumed request"
        return self.ready.pop(token)

    def done(self, token: int) -> None:
        """The resumed request of `token` was handled: whatever it did not take is dropped
        (a request handled again must never hand its answer to another write)."""
        if self.resuming == token:
            self.resuming = None
        self.ready.pop(token, None)

    def _last_deadline(self) -> int:
        return next(reversed(self._in_flight.values()), 0)

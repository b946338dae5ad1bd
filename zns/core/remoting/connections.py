"""What the remoting listener decides about its connections, as a pure state machine.

The listener (`zns.drivers.remoting_listener`) moves bytes; this object decides,
from what the listener tells it and the `now` it is given, which connection is
admitted, read, answered, cut off or closed, and when it next wants to run
(`next_deadline`). It holds no sockets and reads no clock, so every bound is
tested with an injected `now` (tests/test_remoting_policy.py).

What it keeps per connection is an `Account`: the bytes it holds (a frame being
read, counted at its announced length; requests decoded and not answered;
replies not sent), when it last spoke and when its frame in progress last got
bytes. The bounds:

- connections: at most `max_connections`, at most `max_per_host` from one source
  address, and the last `reserved` slots (1/8) only for addresses holding fewer
  than NEWCOMER_CONNECTIONS: four busy addresses cannot take every slot and
  lock a fifth out;
- bytes: all connections together hold at most `max_buffer_bytes`. Past it,
  connections are closed from the source address that holds the most, and
  within it the one whose bytes have waited longest (the frame that stalled
  first; the larger on a tie), until the rest fit. A host holding no more than
  the budget divided by the number of hosts holding bytes is never the one that
  holds the most, so no address can get another's connection closed, and a
  frame arriving at line rate on it always completes;
- one connection's unsent replies: at `high_water` it is neither answered nor
  read until they drain; past `max_unsent` (one huge reply) it is cut off;
- time: a connection with no traffic for `idle_timeout_ms` is closed, and a
  frame begun must be complete within `frame_deadline_ms` while it is read
  (its clock restarts when a paused read resumes).

Idle and frame deadlines sit in heaps: a pass looks at the earliest only, and an
entry found stale is dropped or pushed back once.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

NEWCOMER_CONNECTIONS = 4  # an address holding fewer may take the reserved slots
RESERVED_SHARE = 8  # 1/8 of the slots are kept for newcomers


@dataclass(eq=False)
class Account:
    """One connection as the policy sees it (the driver keeps a reference)."""

    conn_id: int
    host: str
    last_active: int  # when it last sent or was sent bytes
    held: int = 0  # bytes it counts against max_buffer_bytes
    progress: int = 0  # when what it holds last moved (bytes of its frame read, or sent)
    frame_started: int | None = None  # when its frame in progress began (None: none is)
    reading: bool = True  # the driver reads it (False: paused until replies drain)
    open: bool = True


@dataclass(frozen=True)
class Close:
    """Close `account`'s connection; the driver logs `f"... from {host} {why}"`."""

    account: Account
    why: str
    kind: str  # "idle" (logged as info: routine), "late", "over_budget" or "cut_off"


class ConnectionPolicy:
    """Admission, byte budget, back-pressure and deadlines of the remoting connections."""

    def __init__(self, *, max_connections: int, max_per_host: int, idle_timeout_ms: int,
                 high_water: int, max_unsent: int, max_buffer_bytes: int,
                 frame_deadline_ms: int) -> None:
        self.max_connections = max_connections
        self.max_per_host = max_per_host
        self.idle_timeout_ms = idle_timeout_ms
        self.high_water = high_water
        self.max_unsent = max_unsent
        self.max_buffer_bytes = max_buffer_bytes
        self.frame_deadline_ms = frame_deadline_ms
        self.accounts: dict[int, Account] = {}
        self.per_host: Counter[str] = Counter()
        self.held = 0  # bytes all connections hold
        self.refused = 0  # connections refused at accept
        self.over_budget = 0  # closed to bring `held` under max_buffer_bytes
        self.too_slow = 0  # closed for a frame not complete within the deadline
        self.cut_off = 0  # closed for unsent replies over max_unsent
        self._idle: list[tuple[int, int]] = []  # (deadline, conn id): the earliest first
        self._frames: list[tuple[int, int]] = []  # (frame deadline, conn id)

    @property
    def reserved(self) -> int:
        """Slots kept for addresses holding fewer than NEWCOMER_CONNECTIONS."""
        return self.max_connections // RESERVED_SHARE

    # --- connections come and go -------------------------------------------

    def admit(self, conn_id: int, host: str, now: int) -> Account | str:
        """A connection accepted from `host`: its Account, or why it must be closed at once."""
        open_ = len(self.accounts)
        mine = self.per_host[host]
        why = None
        if open_ >= self.max_connections:
            why = f"{open_} connections already open (--remoting-max-connections)"
        elif mine >= self.max_per_host:
            why = (f"{mine} connections already open from it "
                   "(--remoting-max-connections-per-host)")
        elif mine >= NEWCOMER_CONNECTIONS and self.max_connections - open_ <= self.reserved:
            why = (f"{mine} connections already open from it, and the last {self.reserved} "
                   "of --remoting-max-connections are kept for other addresses")
        if why is not None:
            self.refused += 1
            return why
        account = Account(conn_id, host, last_active=now, progress=now)
        self.accounts[conn_id] = account
        self.per_host[host] += 1
        heapq.heappush(self._idle, (now + self.idle_timeout_ms, conn_id))
        return account

    def closed(self, account: Account) -> bool:
        """The driver closed `account`'s connection; False when it was closed already."""
        if not account.open:
            return False
        account.open = False
        del self.accounts[account.conn_id]
        self.held -= account.held
        account.held = 0
        self.per_host[account.host] -= 1
        if not self.per_host[account.host]:
            del self.per_host[account.host]
        return True

    # --- bytes -------------------------------------------------------------

    def read(self, account: Account, now: int, *, held: int, frame_in_progress: bool,
             ) -> list[Close]:
        """Bytes arrived on `account`; it now holds `held` and may be inside a frame.
        Returns the connections to close to bring all of them within the budget."""
        account.last_active = account.progress = now
        if not frame_in_progress:
            account.frame_started = None
        elif account.frame_started is None:
            account.frame_started = now
            heapq.heappush(self._frames, (now + self.frame_deadline_ms, account.conn_id))
        return self.account(account, held)

    def sent(self, account: Account, now: int, held: int) -> None:
        """Bytes of `account`'s replies left; it now holds `held`."""
        account.last_active = account.progress = now
        self.account(account, held)

    def account(self, account: Account, held: int) -> list[Close]:
        """`account` now holds `held` bytes: the closes that bring everything within budget."""
        self.held += held - account.held
        account.held = held
        return self._shed() if self.held > self.max_buffer_bytes else []

    def may_answer(self, unsent: int) -> bool:
        """May a connection with `unsent` bytes of replies get its next request answered?"""
        return unsent < self.high_water

    def reply_queued(self, account: Account, unsent: int) -> Close | None:
        """A reply joined `account`'s unsent bytes (`unsent` now): cut it off when too many."""
        if unsent <= self.max_unsent:
            return None
        self.cut_off += 1
        return Close(account, f"cut off: {unsent} bytes of replies unread", "cut_off")

    def wants_read(self, account: Account, now: int, *, pending: bool, unsent: int) -> bool:
        """Should `account` be read? Not while it has requests to answer or unsent replies
        at the high-water mark: a pipelining client waits in TCP's buffers, not ours."""
        reading = not pending and unsent < self.high_water
        if reading and not account.reading and account.frame_started is not None:
            # Its frame was not being read: the deadline counts from now again.
            account.frame_started = now
            heapq.heappush(self._frames, (now + self.frame_deadline_ms, account.conn_id))
        account.reading = reading
        return reading

    def _shed(self) -> list[Close]:
        """Over the budget (an attack, not a pass: the walk is paid only then): close from the
        host holding the most, its longest-waiting bytes first, until the rest fit."""
        by_host: dict[str, list[Account]] = {}
        for account in self.accounts.values():
            if account.held:
                by_host.setdefault(account.host, []).append(account)
        totals: list[tuple[int, str]] = []
        for host, accounts in by_host.items():
            # Popped from the end: the oldest progress first, the larger holder on a tie.
            accounts.sort(key=lambda a: (a.progress, -a.held), reverse=True)
            totals.append((-sum(a.held for a in accounts), host))
        heapq.heapify(totals)
        closes: list[Close] = []
        total = self.held
        while total > self.max_buffer_bytes and totals:
            minus_held, host = heapq.heappop(totals)
            account = by_host[host].pop()
            self.over_budget += 1
            closes.append(Close(account, f"closed: it holds {account.held} bytes and all "
                                         f"connections {total}, more than "
                                         f"{self.max_buffer_bytes} (--remoting-max-buffer-bytes)",
                                "over_budget"))
            total -= account.held
            if by_host[host]:
                heapq.heappush(totals, (minus_held + account.held, host))
        return closes

    # --- time --------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest idle or frame deadline (entries may be stale: then a pass does nothing)."""
        deadlines = [heap[0][0] for heap in (self._idle, self._frames) if heap]
        return min(deadlines) if deadlines else None

    def on_timer(self, now: int) -> list[Close]:
        """The connections idle for too long, then those whose frame is late."""
        closes: list[Close] = []
        closing: set[int] = set()
        idle, timeout = self._idle, self.idle_timeout_ms
        while idle and idle[0][0] <= now:
            _, conn_id = heapq.heappop(idle)
            account = self.accounts.get(conn_id)
            if account is None:
                continue  # closed already
            if account.last_active + timeout > now:
                heapq.heappush(idle, (account.last_active + timeout, conn_id))
                continue
            closes.append(Close(account, f"closed: idle for {timeout // 1000} s", "idle"))
            closing.add(conn_id)
        frames = self._frames
        while frames and frames[0][0] <= now:
            _, conn_id = heapq.heappop(frames)
            account = self.accounts.get(conn_id)
            if account is None or account.frame_started is None:
                continue  # closed, or that frame is complete
            if account.frame_started + self.frame_deadline_ms > now:
                continue  # a later frame, or its clock restarted: its own entry is in the heap
            if not account.reading:
                continue  # not being read: its clock restarts when it is
            if conn_id in closing:
                continue  # idle as well: closed once
            self.too_slow += 1
            closes.append(Close(account, f"closed: a frame begun "
                                         f"{(now - account.frame_started) // 1000} s ago is not "
                                         "complete", "late"))
        return closes


__all__ = ["Account", "Close", "ConnectionPolicy", "NEWCOMER_CONNECTIONS", "RESERVED_SHARE"]

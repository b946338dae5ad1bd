"""The liveness schedule (§8, §10): each broker address's deadline, kept in one lazy heap.

One `Liveness` per (cluster, address), whatever broker names list it. Its deadline
is its last heartbeat plus its timeout, moved later by time the server itself was
stalled (stall credit) and earlier by a peer's hint (suspicion). The heap holds at
least one entry per address, never later than its deadline: a heartbeat (a later
deadline) costs no heap work, the entry is moved when it surfaces; only a sooner
deadline is pushed. Sans-I/O: times are handed in.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from zns.core.schema import DataVersion
from zns.core.state_dump import AddressClock
from zns.core.table_state import AddressState

LiveKey = tuple[str, str]  # (cluster, broker_addr): liveness is keyed so (§8)


@dataclass
class Liveness:
    cluster: str
    addr: str
    last_heartbeat: int
    timeout_ms: int
    data_version: DataVersion
    ha_addr: str
    names: set[str] = field(default_factory=set)  # broker names listing this address
    suspect_deadline: int | None = None  # set by a peer hint (§10)
    stall_credit: int = 0  # time the server itself stalled since the last heartbeat (§8)
    scheduled: int | None = None  # deadline of its entry in the deadline heap
    # Restored from a state dump and not heard since (zns.core.warm): removed as
    # `not_confirmed` after this unless it registers or heartbeats first.
    confirm_by: int | None = None

    @property
    def silent_since(self) -> int:
        """The last heartbeat, as far as the server was running to hear one."""
        return self.last_heartbeat + self.stall_credit

    @property
    def own_deadline(self) -> int:
        return self.silent_since + self.timeout_ms

    @property
    def deadline(self) -> int:
        deadline = self.own_deadline
        if self.suspect_deadline is not None and self.suspect_deadline < deadline:
            deadline = self.suspect_deadline
        if self.confirm_by is not None and self.confirm_by < deadline:
            deadline = self.confirm_by
        return deadline

    def heard(self, now: int) -> None:
        """A registration or heartbeat: alive now, any suspicion cleared, confirmed."""
        self.last_heartbeat = now
        self.stall_credit = 0
        self.suspect_deadline = None
        self.confirm_by = None


class LivenessSchedule:
    """Every live broker address and when it expires."""

    def __init__(self) -> None:
        self._live: dict[LiveKey, Liveness] = {}
        self._deadlines: list[tuple[int, LiveKey]] = []  # lazy heap; stale entries skipped

    # --- reading ----------------------------------------------------------

    def get(self, cluster: str, addr: str) -> Liveness | None:
        return self._live.get((cluster, addr))

    def __contains__(self, key: LiveKey) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Liveness]:
        return iter(self._live.values())

    # --- changing -----------------------------------------------------------

    def record(self, cluster: str, addr: str, now: int, timeout_ms: int,
               data_version: DataVersion, ha_addr: str, name: str) -> Liveness:
        """A registration: alive now, with the broker's timeout, DataVersion and HA address."""
        live = self._live.get((cluster, addr))
        if live is None:
            live = self._live[(cluster, addr)] = Liveness(
                cluster, addr, now, timeout_ms, data_version, ha_addr)
        else:
            live.heard(now)
            live.timeout_ms = timeout_ms
            live.data_version = data_version
            live.ha_addr = ha_addr
        live.names.add(name)
        self._schedule(live)
        return live

    def restore(self, cluster: str, addr: str, now: int, timeout_ms: int,
                data_version: DataVersion, ha_addr: str, names: list[str],
                confirm_within_ms: int) -> None:
        """An address from a state dump (zns.core.warm): as if registered at `now`, and
        removed `confirm_within_ms` after it unless it registers or heartbeats first."""
        live = self._live[(cluster, addr)] = Liveness(
            cluster, addr, now, timeout_ms, data_version, ha_addr, set(names),
            confirm_by=now + confirm_within_ms)
        self._schedule(live)

    def heard(self, live: Liveness, now: int) -> None:
        """A heartbeat of a held address."""
        live.heard(now)
        self._schedule(live)

    def remove(self, cluster: str, addr: str) -> None:
        """The address is gone (its heap entry is skipped when it surfaces)."""
        self._live.pop((cluster, addr), None)

    def suspect(self, cluster: str, addr: str, grace_ms: int, now: int) -> bool:
        """A peer saw this broker leave at `now`: shorten its deadline (§10).

        The deadline becomes the later of its last heartbeat + `grace_ms` and
        `now` + a quarter of its own timeout, unless already sooner: a broker
        that still reaches us beats at least four times per timeout, so it
        beats before the suspicion can expire it.
        """
        live = self._live.get((cluster, addr))
        if live is None:
            return False
        deadline = max(live.silent_since + grace_ms, now + live.timeout_ms // 4)
        if deadline >= live.deadline:
            return False
        live.suspect_deadline = deadline
        self._schedule(live)
        return True

    def shift(self, stall_ms: int) -> None:
        """The process itself was stalled: give every broker that time back."""
        for live in self._live.values():
            live.stall_credit += stall_ms
            if live.suspect_deadline is not None:
                live.suspect_deadline += stall_ms
            if live.confirm_by is not None:
                live.confirm_by += stall_ms
        self._rebuild()

    # --- the schedule -------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest deadline; a broker expires once `now` is past it."""
        heap = self._deadlines
        while heap:
            deadline, key = heap[0]
            live = self._live.get(key)
            if live is None or live.scheduled != deadline:
                heapq.heappop(heap)  # gone, or superseded by an earlier entry
            elif live.deadline > deadline:
                # It heartbeated since: move its one entry now rather than on every heartbeat.
                live.scheduled = live.deadline
                heapq.heapreplace(heap, (live.scheduled, key))
            else:
                return deadline
        return None

    def pop_due(self, now: int) -> Liveness | None:
        """The address with the earliest deadline if `now` is past it, off the heap (the
        caller removes it); None when nothing is due."""
        deadline = self.next_deadline()
        if deadline is None or now <= deadline:
            return None
        _, key = heapq.heappop(self._deadlines)
        live = self._live[key]
        live.scheduled = None
        return live

    def _schedule(self, live: Liveness) -> None:
        """Make sure the heap holds this broker's deadline, or an earlier entry for it.

        A later deadline (a heartbeat) needs no heap work: `next_deadline` moves
        the entry when it surfaces. Only a sooner one (a new broker, a hint, a
        shorter timeout) is pushed.
        """
        deadline = live.deadline
        if live.scheduled is not None and live.scheduled <= deadline:
            return
        live.scheduled = deadline
        heapq.heappush(self._deadlines, (deadline, (live.cluster, live.addr)))
        if len(self._deadlines) > 4 * len(self._live) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._deadlines = []
        for key, live in self._live.items():
            live.scheduled = live.deadline
            self._deadlines.append((live.scheduled, key))
        heapq.heapify(self._deadlines)

    def check_invariants(self) -> None:
        """Raise AssertionError if the schedule contradicts itself (tests call it)."""
        entries = set(self._deadlines)
        for key, live in self._live.items():
            assert (live.cluster, live.addr) == key, f"{key} holds {live.cluster}/{live.addr}"
            assert live.names, f"{key} is live for no broker name"
            assert live.scheduled is not None and (live.scheduled, key) in entries, (
                f"{key} has no heap entry")
            assert live.scheduled <= live.deadline, f"{key} is scheduled after its deadline"
        expected = min((live.deadline for live in self._live.values()), default=None)
        assert self.next_deadline() == expected, "next_deadline is not the earliest deadline"

    # --- a replica's state (zns.core.state_dump) ----------------------------

    def clocks(self) -> list[AddressClock]:
        """Every live address's times, in the order it was first recorded (as the table's
        state lists the addresses; the heap is derived)."""
        return [AddressClock(live.last_heartbeat, live.suspect_deadline, live.stall_credit,
                             live.confirm_by)
                for live in self._live.values()]

    def load(self, addresses: list[AddressState], clocks: list[AddressClock]) -> None:
        """Take the table state's addresses with their `clocks` into this empty schedule."""
        for a, c in zip(addresses, clocks, strict=True):
            self._live[(a.cluster, a.addr)] = Liveness(
                a.cluster, a.addr, c.last_heartbeat, a.timeout_ms, a.data_version, a.ha_addr,
                set(a.names), c.suspect_deadline, c.stall_credit, confirm_by=c.confirm_by)
        self._rebuild()

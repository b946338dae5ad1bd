"""Worker supervision, sans-I/O: keep N worker processes alive, never more.

The state process starts N workers, one per *slot*. A worker that dies is
replaced at once; only a worker that dies again within `stable_ms` of its start
waits a backoff (`zns.core.backoff`, doubling from `first_delay_ms` up to
`max_delay_ms`, with jitter) before the next start, so a worker that crashes
at start does not spin. A slot holds at most one worker: a start is asked for
only for an empty slot, so never more than N are alive. The driver forks and
reaps; this object only decides: its inputs (`started`, `exited`, `on_timer`,
`stop`) return nothing, `actions()` hands out `StartWorker`/`StopWorker` in
order, `next_deadline()` says when a delayed start is due.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from zns.core.backoff import Backoff

log = logging.getLogger("zns")

FIRST_DELAY_MS = 100  # the first delay after a quick death
MAX_DELAY_MS = 5_000
# A worker that lived this long is replaced without delay. It is short because a worker
# killed from outside (an aborting peer, an OOM kill) must leave its port unanswered for
# as little as possible: only a worker that dies while it starts (its state load and binds
# take about 0.1 s at 10,000 topics) is one that would die again, and waits.
STABLE_MS = 1_000
# A worker that ended cleanly (exit code 0: it was sent SIGTERM or SIGINT) is replaced only
# after this long. `systemctl stop` signals every process of the unit at once, and the state
# process's own signal may be handled a moment after it reaps a worker that already ended:
# a replacement started in that moment would be started only to be stopped.
CLEAN_EXIT_DELAY_MS = 1_000


@dataclass(frozen=True)
class StartWorker:
    """Start a worker in `slot`, then call `started(slot, pid, now)`."""

    slot: int


@dataclass(frozen=True)
class StopWorker:
    """Stop the worker `pid` (SIGTERM), then wait for its exit."""

    pid: int


WorkerAction = StartWorker | StopWorker


@dataclass
class _Slot:
    backoff: Backoff
    pid: int | None = None
    started_at: int = 0
    start_at: int | None = None  # when the next start is due (None: running, or stopping)
    deaths: int = 0  # quick deaths in a row


class WorkerPool:
    def __init__(
        self,
        desired: int,
        *,
        now: int,
        stable_ms: int = STABLE_MS,
        first_delay_ms: int = FIRST_DELAY_MS,
        max_delay_ms: int = MAX_DELAY_MS,
        rng: random.Random | None = None,
    ) -> None:
        if desired < 1:
            raise ValueError("a pool needs at least one worker")
        self.stable_ms = stable_ms
        self.stopping = False
        self.restarts = 0
        self._slots = [
            _Slot(Backoff(first_delay_ms, max_delay_ms, rng), start_at=now)
            for _ in range(desired)
        ]
        self._actions: list[WorkerAction] = []
        self.on_timer(now)

    # --- inputs ---------------------------------------------------------

    def started(self, slot: int, pid: int, now: int) -> None:
        """The driver started the worker `pid` in `slot`."""
        s = self._slots[slot]
        s.pid, s.started_at, s.start_at = pid, now, None
        if self.stopping:
            self._actions.append(StopWorker(pid))

    def exited(self, pid: int, now: int, clean: bool = False) -> None:
        """The worker `pid` is gone: its slot is refilled, at once unless it keeps dying or
        it ended `clean`ly (exit code 0, stopped by a signal sent to it: after
        CLEAN_EXIT_DELAY_MS, in case the whole is being stopped)."""
        for index, s in enumerate(self._slots):
            if s.pid != pid:
                continue
            s.pid = None
            if self.stopping:
                return
            self.restarts += 1
            lived = now - s.started_at
            if lived >= self.stable_ms:
                s.backoff.reset()
                s.deaths = 0
                s.start_at = now
            else:
                s.deaths += 1
                s.start_at = now if s.deaths == 1 else now + int(s.backoff.next_delay())
            if clean:
                s.start_at = max(s.start_at, now + CLEAN_EXIT_DELAY_MS)
            # Workers are named 1..N in every log line (the drivers' too); slots count from 0.
            log.warning("worker %d (pid %d) exited after %d ms; the next starts in %d ms",
                        index + 1, pid, lived, s.start_at - now)
            self.on_timer(now)
            return

    def start_failed(self, slot: int, now: int) -> None:
        """The driver could not start a worker in `slot` (fork failed): as a quick death."""
        s = self._slots[slot]
        if self.stopping or s.pid is not None:
            return
        s.deaths += 1
        s.start_at = now + int(s.backoff.next_delay())
        log.warning("worker %d could not start; trying again in %d ms", slot + 1, s.start_at - now)

    def on_timer(self, now: int) -> None:
        if self.stopping:
            return
        for index, s in enumerate(self._slots):
            if s.start_at is not None and s.start_at <= now:
                s.start_at = None
                self._actions.append(StartWorker(index))

    def stop(self) -> None:
        """Stop every worker and start no more."""
        self.stopping = True
        for s in self._slots:
            s.start_at = None
            if s.pid is not None:
                self._actions.append(StopWorker(s.pid))

    # --- outputs --------------------------------------------------------

    @property
    def alive(self) -> list[int]:
        return [s.pid for s in self._slots if s.pid is not None]

    def actions(self) -> list[WorkerAction]:
        actions, self._actions = self._actions, []
        return actions

    def next_deadline(self) -> int | None:
        due = [s.start_at for s in self._slots if s.start_at is not None]
        return min(due) if due else None

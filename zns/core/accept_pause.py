"""When new connections stop for lack of file descriptors, and when they start again.

The descriptor guard (`zns.drivers.descriptors`) reads the sockets' monitors,
attaches and detaches the drop filters and forks the child that sheds what
waits; what it does when is decided here. Accept failing for lack of
descriptors stops new connections (once: a second failure while stopped only
sheds again); while stopped, once every RETRY_MS the guard sheds what got into
an accept queue and counts the process's descriptors, and HEADROOM of them
free lets new connections in again. Times are integer milliseconds, passed in.
"""

from __future__ import annotations

RETRY_MS = 1000  # how often a paused guard checks for free descriptors
HEADROOM = 64  # descriptors that must be free before new connections are let in again


class AcceptPause:
    """The guard's state: stopped or not, since when, and when it next looks."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # the open-file limit in force
        self.exhausted = 0  # times new connections were stopped for lack of descriptors
        self.paused_since: int | None = None
        self._retry_at = 0

    def next_deadline(self, now: int) -> int | None:
        """When `due` next says to look; None while new connections are let in."""
        return None if self.paused_since is None else max(now, self._retry_at)

    def out_of_descriptors(self, now: int) -> bool:
        """Accept failed for lack of descriptors. True when this stops new connections
        (the filters go on, said once); either way what waits is shed now and the next
        look is RETRY_MS later."""
        starting = self.paused_since is None
        if starting:
            self.exhausted += 1
            self.paused_since = now
        self._retry_at = now + RETRY_MS
        return starting

    def due(self, now: int) -> bool:
        """While stopped, True once every RETRY_MS: shed what waits, then count the
        descriptors and hand the count to `free_again`."""
        if self.paused_since is None or now < self._retry_at:
            return False
        self._retry_at = now + RETRY_MS
        return True

    def free_again(self, open_descriptors: int, now: int) -> int | None:
        """With HEADROOM descriptors free under the limit, new connections are let in
        again: returns for how many ms they were stopped. None while still short."""
        if self.paused_since is None or open_descriptors + HEADROOM > self.limit:
            return None
        stopped = now - self.paused_since
        self.paused_since = None
        return stopped

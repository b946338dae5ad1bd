"""Readiness (`/readyz`): are this NameServer's routes warm enough to take traffic?

A NameServer that has just started knows no broker until each registers again
(every 30 s for a RocketMQ broker): a client that asks it in that window gets
"no route" for topics that exist. During a rolling restart the operator waits
for this rule before restarting the next NameServer.

The rule: ready once every broker address expected (those of the restored state
dump, zns.core.warm) is settled — it has registered or heartbeated again, or it
was removed for not doing so — or once `grace_ms` has passed since the start,
whichever comes first; with nothing expected, ready at once. Once ready it stays ready: a broker that leaves
later is the route table's business, not a reason to take the NameServer out
of a load balancer.

Sans-I/O: it is given `now` and a membership test; it reads no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from zns.core.liveness import LiveKey


class Readiness:
    """Not ready until every expected broker address is back or the grace has passed."""

    def __init__(self, expected: Iterable[LiveKey], started_ms: int, grace_ms: int) -> None:
        self.expected = frozenset(expected)
        self.ready_at_ms = started_ms + grace_ms
        self._ready = not self.expected

    def check(self, now: int, registered: Callable[[str, str], bool]) -> tuple[bool, str]:
        """(ready, why): `registered(cluster, addr)` says whether an expected address is
        settled now (heard since the restart, or gone)."""
        if self._ready:
            return True, "ready"
        missing = sum(1 for cluster, addr in self.expected if not registered(cluster, addr))
        if missing == 0:
            self._ready = True
            return True, ("ready: every broker known before the restart has registered again "
                          "or is gone")
        if now >= self.ready_at_ms:
            self._ready = True
            return True, (f"ready: the grace passed with {missing} of {len(self.expected)} "
                          "brokers known before the restart not registered again")
        return False, (f"warming: {missing} of {len(self.expected)} brokers known before the "
                       f"restart have not registered again nor gone (ready in at most "
                       f"{(self.ready_at_ms - now) / 1000:.1f} s)")

"""What the events port's subscriptions cost, per connection and in all, and who is over.

libzmq keeps every subscription a subscriber sends in a trie before the
application sees it, at about 49 bytes per byte of a distinct subscription
(measured: 2,000 distinct subscriptions of 1,000 bytes, +98 MiB), and it has no
bound on their number: one SUB sending 10,000 such subscriptions cost 466 MiB.
The server therefore counts what each connection subscribed to, and a
connection whose subscriptions cost more than its budget, or the largest
holders while all of them cost more than the total, are disconnected (which
frees their part of the trie). A zns client that follows many topics
subscribes to the route prefix instead (`zns.core.client_session`), so it stays
far inside the budget.

A connection is known by a number the driver gives it (its descriptor) and
is forgotten when it is cut or closes.
"""

from __future__ import annotations

# The trie's cost of one subscription, charged as it is received: per byte, and per entry.
COST_PER_BYTE = 48
COST_PER_SUBSCRIPTION = 64
DEFAULT_PEER_BUDGET = 16 * 1024 * 1024
DEFAULT_TOTAL_BUDGET = 256 * 1024 * 1024


def subscription_cost(channel: bytes) -> int:
    """What holding `channel` costs the trie (an upper estimate: shared prefixes cost less)."""
    return COST_PER_BYTE * len(channel) + COST_PER_SUBSCRIPTION


class SubscriptionBudget:
    """Per-connection sets of subscriptions and their cost; says which connections to cut."""

    def __init__(self, per_peer: int = DEFAULT_PEER_BUDGET,
                 total: int = DEFAULT_TOTAL_BUDGET) -> None:
        self.per_peer = per_peer
        self.total = total
        self.held = 0  # the cost of every subscription held, all connections together
        self.cut = 0  # connections cut for being over a budget, since start
        self._channels: dict[int, set[bytes]] = {}
        self._cost: dict[int, int] = {}

    def cost(self, peer: int) -> int:
        return self._cost.get(peer, 0)

    def subscribed(self, peer: int, channel: bytes) -> list[int]:
        """`peer` subscribed to `channel`: the connections to cut now (each is forgotten)."""
        channels = self._channels.setdefault(peer, set())
        if channel in channels:
            return []  # libzmq holds a connection's subscription once
        channels.add(channel)
        cost = subscription_cost(channel)
        self._cost[peer] = self._cost.get(peer, 0) + cost
        self.held += cost
        if self._cost[peer] > self.per_peer:
            return self._cut([peer])
        over: list[int] = []
        if self.held > self.total:
            # The largest holders go first, until the rest fit.
            for holder in sorted(self._cost, key=self._cost.__getitem__, reverse=True):
                over.append(holder)
                if self.held - sum(self._cost[p] for p in over) <= self.total:
                    break
        return self._cut(over)

    def unsubscribed(self, peer: int, channel: bytes) -> None:
        channels = self._channels.get(peer)
        if channels is None or channel not in channels:
            return
        channels.discard(channel)
        cost = subscription_cost(channel)
        self._cost[peer] -= cost
        self.held -= cost

    def closed(self, peer: int) -> None:
        """`peer`'s connection closed (or its number was given to a new one): forget it."""
        self.held -= self._cost.pop(peer, 0)
        self._channels.pop(peer, None)

    def _cut(self, peers: list[int]) -> list[int]:
        for peer in peers:
            self.closed(peer)
        self.cut += len(peers)
        return peers

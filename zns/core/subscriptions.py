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

from zns.core.schema import BROKER_PREFIX, HB_CHANNEL, ROUTE_PREFIX

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

    def peers(self) -> list[int]:
        """The connections holding subscriptions, in the order they were first counted."""
        return list(self._cost)

    def channels(self, peer: int) -> frozenset[bytes]:
        """What `peer` is counted as subscribed to."""
        return frozenset(self._channels.get(peer, ()))

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


# --- events queued for subscribers that do not read ---------------------------------------

DEFAULT_QUEUED_EVENT_BYTES = 256 * 1024 * 1024
# What one queued event costs a subscriber's queue besides its bytes: libzmq holds each of
# its two frames in a 64-byte message (a body is shared by every queue it is in; a frame
# of 33 bytes or less is copied into the message). Measured: 100 subscribers reading
# nothing grew the server by 440 MiB over 40,000 events of about 100 bytes.
EVENT_OVERHEAD_BYTES = 2 * 64
# How often the driver looks at the subscribers' connections: after this many bytes of
# events (as charged) were published since the last look (nothing queues while nothing is
# published). A subscriber is first charged at its second look: until then it may hold
# twice this much.
LOOK_EVERY_BYTES = 1024 * 1024


class QueuedEvents:
    """What the events socket holds for subscribers that do not read, in all, and who to cut.

    libzmq gives no per-subscriber queue size, so it is estimated from what the kernel
    says of each connection, at each look (`looked`): a connection whose peer
    acknowledged nothing since the last look while bytes waited in its kernel send queue
    is *behind*, and is charged with every event published since, its bytes and
    EVENT_OVERHEAD_BYTES (an upper estimate: a subscriber is sent only the channels it
    subscribed to, and a body is shared), up to what libzmq holds at most for one
    subscriber (`hwm` events of the average charge so far: the socket drops past its
    mark). A connection that acknowledged anything, or has nothing
    waiting, owes nothing. When the charges of all connections exceed `total`, the
    largest are cut until the rest fit: those at their mark first.
    """

    def __init__(self, total: int = DEFAULT_QUEUED_EVENT_BYTES, hwm: int = 200_000) -> None:
        self.total = total
        self.hwm = hwm
        self.cut = 0  # connections cut for it, since start
        self.held = 0  # the estimate of all charges at the last look
        self._events = 0  # published since start: for the average size
        self._bytes = 0
        self._since_look = 0  # bytes published since the last look
        self._acked: dict[int, int] = {}  # connection -> bytes its peer acknowledged
        self._behind: dict[int, int] = {}  # connection -> the bytes it is charged with

    def published(self, nbytes: int) -> bool:
        """An event of `nbytes` (its frames together) was published; whether a look is due."""
        charge = nbytes + EVENT_OVERHEAD_BYTES
        self._events += 1
        self._bytes += charge
        self._since_look += charge
        return self._since_look >= LOOK_EVERY_BYTES

    def looked(self, connections: dict[int, tuple[int, int]]) -> list[int]:
        """Every connection now as (bytes its peer acknowledged, bytes in its kernel send
        queue); the connections to cut (each is forgotten)."""
        since, self._since_look = self._since_look, 0
        mark = self.hwm * (self._bytes // max(1, self._events))
        acked, behind = {}, {}
        for conn, (acknowledged, waiting) in connections.items():
            acked[conn] = acknowledged
            before = self._acked.get(conn)
            if waiting and before is not None and acknowledged <= before:
                behind[conn] = min(mark, self._behind.get(conn, 0) + since)
        self._acked, self._behind = acked, behind
        self.held = sum(behind.values())
        over: list[int] = []
        for conn in sorted(behind, key=behind.__getitem__, reverse=True):
            if self.held <= self.total:
                break
            over.append(conn)
            self.held -= behind.pop(conn)
            del self._acked[conn]
        self.cut += len(over)
        return over


# --- what a relay subscribes to upstream -----------------------------------------------------

# What a relay's subscriptions may cost the NameServer it relays (charged as the NameServer
# charges them): half its per-connection budget, so the relay is never the one it cuts.
RELAY_UPSTREAM_BUDGET = DEFAULT_PEER_BUDGET // 2
# The channel families a relay falls back to (§7): past its budget a subscription is carried
# by the family it belongs to, or by everything (b"") when it belongs to none.
FAMILIES = (ROUTE_PREFIX, BROKER_PREFIX, HB_CHANNEL)


class Forwarding:
    """The subscriptions a relay holds upstream for all its subscribers, within a budget.

    Every distinct channel its subscribers hold is subscribed upstream once, while
    the cost of them all stays within `budget`; past it, the channel's family
    (`FAMILIES`, or b"" for everything) is subscribed instead and the channels it
    covers are unsubscribed, so the upstream trie holds one short prefix where it
    would have held thousands of channels. The relay's own socket still sends each
    subscriber only what it subscribed to. A family is unsubscribed when no subscriber
    holds a channel in it any more.

    Each input returns the messages to send upstream (b"\\x01" + channel to subscribe,
    b"\\x00" + channel to unsubscribe), in order.
    """

    def __init__(self, budget: int = RELAY_UPSTREAM_BUDGET) -> None:
        self.budget = budget
        self.cost = 0  # of the channels subscribed upstream
        self.upstream: set[bytes] = set()  # channels and families subscribed upstream
        self._held: dict[int, set[bytes]] = {}  # subscriber -> its channels
        self._count: dict[bytes, int] = {}  # channel -> subscribers holding it
        self._families: dict[bytes, int] = {}  # family fallen back to -> its channels held

    def subscribed(self, peer: int, channel: bytes) -> list[bytes]:
        held = self._held.setdefault(peer, set())
        if channel in held:
            return []
        held.add(channel)
        self._count[channel] = self._count.get(channel, 0) + 1
        if self._count[channel] > 1:
            return []
        covered = [family for family in self._families if channel.startswith(family)]
        for family in covered:
            self._families[family] += 1
        if covered:
            return []
        cost = subscription_cost(channel)
        if self.cost + cost <= self.budget:
            self.cost += cost
            self.upstream.add(channel)
            return [b"\x01" + channel]
        return self._fall_back(next((f for f in FAMILIES if channel.startswith(f)), b""))

    def unsubscribed(self, peer: int, channel: bytes) -> list[bytes]:
        held = self._held.get(peer)
        if held is None or channel not in held:
            return []
        held.discard(channel)
        return self._release(channel)

    def closed(self, peer: int) -> list[bytes]:
        """`peer`'s connection closed (or its number was given to a new one): forget it."""
        messages: list[bytes] = []
        for channel in self._held.pop(peer, ()):
            messages += self._release(channel)
        return messages

    def resubscribe(self) -> list[bytes]:
        """What a fresh upstream connection is to be sent: everything held upstream."""
        return [b"\x01" + channel for channel in sorted(self.upstream)]

    def _fall_back(self, family: bytes) -> list[bytes]:
        messages = []
        if family in self.upstream:  # held as a channel until now: a family is not charged
            self.cost -= subscription_cost(family)
        else:
            self.upstream.add(family)
            messages.append(b"\x01" + family)
        self._families[family] = sum(1 for channel in self._count if channel.startswith(family))
        for channel in sorted(c for c in self.upstream if c.startswith(family) and c != family
                              and c not in self._families):
            self.upstream.discard(channel)
            self.cost -= subscription_cost(channel)
            messages.append(b"\x00" + channel)
        return messages

    def _release(self, channel: bytes) -> list[bytes]:
        left = self._count[channel] - 1
        if left:
            self._count[channel] = left
            return []
        del self._count[channel]
        messages = []
        if channel in self.upstream and channel not in self._families:
            self.upstream.discard(channel)
            self.cost -= subscription_cost(channel)
            messages.append(b"\x00" + channel)
        for family in [f for f in self._families if channel.startswith(f)]:
            self._families[family] -= 1
            if not self._families[family]:
                del self._families[family]
                if family in self.upstream:
                    self.upstream.discard(family)
                    messages.append(b"\x00" + family)
        return messages

"""The weight ledger: what the routes carry, counted in queue entries (--max-queues, §13).

A route lists, for each broker name with queue data in the topic, one QueueData and
one BrokerData: every address of the name, the filter servers of each, and its
names. So one route entry of a name weighs one, plus one per address past the
first, per filter server of its addresses, and per full NAME_BYTES_PER_WEIGHT of
its names' bytes (`entry_weight`, the one formula). The table's weight is the sum
over names of (topics of the name) x (entry weight of the name); the ledger keeps
it incrementally, and `zns.core.limits` asks the route table what it would be after
a request (RouteTable.queue_weight_after), computed with the same formula.
Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

LiveKey = tuple[str, str]  # (cluster, broker address)

# A broker name's names and addresses are in every route of the name (in its QueueData
# and BrokerData): each full NAME_BYTES_PER_WEIGHT of their UTF-8 bytes weighs one more
# queue entry per topic, so 255-character names cannot make an entry hold ten times what
# --max-queues assumes (see `name_weight`).
NAME_BYTES_PER_WEIGHT = 128


def name_weight(cluster: str, name: str, zone: str, addrs: Iterable[str]) -> int:
    """The extra queue entries one route entry of this broker name weighs for its names.

    The broker name is in the QueueData and the BrokerData of every route of the name,
    the cluster, zone and addresses in the BrokerData. Short names weigh nothing extra
    (a route entry of a typical broker is about 150 bytes encoded); the longest the wire
    allows (255 characters, up to 4 bytes each) weigh 33 entries more with one address.
    """
    size = len(cluster.encode()) + 2 * len(name.encode()) + len(zone.encode())
    size += sum(len(addr) for addr in addrs)  # addresses are ASCII (§3)
    return size // NAME_BYTES_PER_WEIGHT


def entry_weight(cluster: str, name: str, zone: str, addr_cluster: Mapping[str, str],
                 servers: Callable[[LiveKey], int]) -> int:
    """What one route entry of a broker name weighs: one, plus its addresses past the
    first, its names (`name_weight`) and the filter servers (`servers((cluster, addr))`)
    of each of its addresses (`addr_cluster`: address -> its cluster)."""
    weight = len(addr_cluster) + name_weight(cluster, name, zone, addr_cluster)
    return weight + sum(servers((c, addr)) for addr, c in addr_cluster.items())


class WeightLedger:
    """Queue entries held and what they weigh, kept as entries come and go."""

    __slots__ = ("count", "weight", "extra")

    def __init__(self) -> None:
        self.count = 0  # QueueData held, all topics: what memory grows with
        self.weight = 0  # sum over names of topics x entry weight
        # Broker name -> its entry weight beyond one (absent: none): the names whose
        # routes list filter servers, several addresses or long names.
        self.extra: dict[str, int] = {}

    def entry(self, name: str) -> int:
        """What one route entry of this name weighs now (one for a name not held)."""
        return 1 + self.extra.get(name, 0)

    def of_name(self, name: str, topics: int) -> int:
        """The share of the weight of a name with this many topics."""
        return topics * self.entry(name)

    def added(self, name: str) -> None:
        """The name got queue data in one more topic."""
        self.count += 1
        self.weight += self.entry(name)

    def removed(self, name: str) -> None:
        self.count -= 1
        self.weight -= self.entry(name)

    def reweigh(self, name: str, entry: int, topics: int) -> None:
        """The name's entry weight is now `entry` (`entry_weight`); it has `topics` topics."""
        extra = entry - 1
        old = self.extra.get(name, 0)
        if extra != old:
            self.weight += topics * (extra - old)
            if extra:
                self.extra[name] = extra
            else:
                del self.extra[name]

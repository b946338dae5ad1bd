"""The iteration order of Java's HashMap, HashSet and ConcurrentHashMap, from their keys.

The Java NameServer writes its tables with fastjson in their iteration order, and
mqadmin and the Dashboard print what comes first (``brokerDatas.get(0)``, the first
cluster of a topic). That order is a function of the keys' hash codes, the table's
capacity and, within one bucket, the order the keys went in -- all of which zns
knows -- so the remoting bodies are written in exactly the order a 5.3.3 NameServer
(on JDK 8 to 21) writes them:

- `hashmap_order`: ``java.util.HashMap``/``HashSet`` with String or Long keys.
  Buckets in index order, each bucket in insertion order; a resize splits buckets
  without reordering them, so the order is a stable sort of the insertion order by
  bucket index at the final capacity. ``initial`` gives a table built with a
  capacity (``new HashSet<>(collection)`` sizes itself for the collection).
- `chm_order`: ``java.util.concurrent.ConcurrentHashMap`` (RouteInfoManager's tables,
  ``ConcurrentHashMap.newKeySet()`` of TopicList). The same buckets, but a resize
  (at 3/4 full, counted after the insert) moves the nodes in front of a bucket's
  last run of same-side nodes in reverse: simulated node by node.

Not modelled (documented in docs/protocol.md §15): a bucket turned into a tree (8
colliding keys in a table of 64 buckets or more) or a resize caused by one (8
colliding keys in a smaller table); capacity left by keys removed since (a map
never shrinks) -- orders are computed from the keys present, in their insertion
order, as if they were all that was ever inserted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only a type here: the orders need nothing of the schema at run time
    from zns.core.schema import TopicRoute

from .fastjson import java_string_hash

_MAX_CACHED = 1 << 17
_spread_cache: dict[str, int] = {}


def spread(key: str | int) -> int:
    """``HashMap.hash``/``ConcurrentHashMap.spread`` of a String or Long key (31 bits kept:
    no table here reaches 2**31 buckets, so the sign bit never matters)."""
    if isinstance(key, int):
        v = key & 0xFFFFFFFFFFFFFFFF
        h = (v ^ (v >> 32)) & 0xFFFFFFFF  # Long.hashCode
        return (h ^ (h >> 16)) & 0x7FFFFFFF
    cached = _spread_cache.get(key)
    if cached is not None:
        return cached
    raw = java_string_hash(key)
    h = (raw ^ (raw >> 16)) & 0x7FFFFFFF
    if len(_spread_cache) >= _MAX_CACHED:
        _spread_cache.clear()
    _spread_cache[key] = h
    return h


def table_size_for(n: int) -> int:
    """``HashMap.tableSizeFor``: the power of two at least `n` (1 at least)."""
    size = 1
    while size < n:
        size <<= 1
    return size


def hashmap_capacity(count: int, initial: int = 16) -> int:
    """A HashMap's table after `count` inserts: doubled whenever size exceeds 3/4 of it."""
    capacity = initial
    while count > capacity * 3 // 4:
        capacity <<= 1
    return capacity


def hashset_copy_capacity(count: int) -> int:
    """The table of ``new HashSet<>(collection)`` or ``new HashMap<>(map)`` of `count` keys."""
    return table_size_for(max(int(count / 0.75) + 1, 16))


def hashmap_order(keys: Iterable[str | int], initial: int = 16) -> list:
    """The iteration order of a HashMap/HashSet the `keys` went into in this order."""
    keys = list(keys)
    mask = hashmap_capacity(len(keys), initial) - 1
    return sorted(keys, key=lambda k: spread(k) & mask)  # sorted() is stable


def hashset_copy_order(keys: Sequence[str | int]) -> list:
    """``new HashSet<>(c)`` / ``new HashMap<>(m)`` of keys iterated in this order."""
    return hashmap_order(keys, hashset_copy_capacity(len(keys)))


def chm_order(keys: Iterable[str], table: int = 16) -> list[str]:
    """The iteration order of a ConcurrentHashMap (or its key set) of `table` buckets that
    the distinct `keys` were put into in this order (a repeated key is left where it is).

    Simulated resize by resize over indices into the distinct keys; a bucket of one key
    (most of them) is that index itself, no list, and moves whole. Several times cheaper
    than node by node, which matters: GET_ALL_TOPIC_LIST over 5,000 topics rebuilds this
    after every change of the table, and it is one unit of the loop's work.
    """
    distinct = list(dict.fromkeys(keys))
    hashes = [spread(key) for key in distinct]
    total = len(distinct)
    n = table
    bins: list[_Bucket] = [None] * n
    done = 0
    while True:
        threshold = n - (n >> 2)  # addCount: resized once the count reaches sizeCtl
        stop = min(total, threshold)
        mask = n - 1
        for j in range(done, stop):
            b = hashes[j] & mask
            slot = bins[b]
            if slot is None:
                bins[b] = j
            elif isinstance(slot, int):
                bins[b] = [slot, j]
            else:
                slot.append(j)
        done = stop
        if done < threshold:
            break
        bins = _transfer(bins, n, hashes)
        n <<= 1
    out: list[str] = []
    for slot in bins:
        if slot is None:
            continue
        if isinstance(slot, int):
            out.append(distinct[slot])
        else:
            out.extend(distinct[j] for j in slot)
    return out


_Bucket = int | list[int] | None  # no key, one key's index, or several in bucket order


def _transfer(bins: list[_Bucket], n: int, hashes: list[int]) -> list[_Bucket]:
    """ConcurrentHashMap.transfer of a table of `n` buckets into 2n (one thread): a bucket's
    last run of nodes bound for the same side moves as it is; each node in front of it is
    pushed in front of its side's list (the reverse of their order)."""
    out: list[_Bucket] = [None] * (2 * n)
    for i, slot in enumerate(bins):
        if slot is None:
            continue
        if isinstance(slot, int):
            out[i + n if hashes[slot] & n else i] = slot
            continue
        run_bit = hashes[slot[-1]] & n
        last_run = len(slot) - 1
        while last_run and hashes[slot[last_run - 1]] & n == run_bit:
            last_run -= 1
        front = slot[last_run - 1::-1] if last_run else []
        low = [j for j in front if not hashes[j] & n]
        high = [j for j in front if hashes[j] & n]
        if run_bit:
            high += slot[last_run:]
        else:
            low += slot[last_run:]
        out[i] = (low[0] if len(low) == 1 else low) if low else None
        out[i + n] = (high[0] if len(high) == 1 else high) if high else None
    return out


# RouteInfoManager's tables: new ConcurrentHashMap<>(1024 / 128 / 32) -> 2048 / 256 / 64 buckets.
TOPIC_TABLE = 2048
BROKER_TABLE = 256
CLUSTER_TABLE = 64


def route_in_java_order(route: TopicRoute, names_inserted: Sequence[str]) -> TopicRoute:
    """A TopicRoute (zns.core.schema) with its lists and filter-server map in the order the
    Java NameServer's pickupTopicRouteData builds them; `names_inserted`: the topic's broker
    names in the order their queue data went in (RouteTable.topic_queue_table).

    queueDatas: the values of the topic's HashMap of broker name -> QueueData. brokerDatas:
    a HashSet copied from that map's keys. filterServerTable: a HashMap filled broker by
    broker, address by address (ascending broker ids: a BrokerData's map of ids). A route
    filtered to a zone keeps this order (Java filters the encoded route).
    """
    import msgspec

    full = hashmap_order(names_inserted)
    queues_by_name = {q.broker_name: q for q in route.queues}
    brokers_by_name = {b.broker_name: b for b in route.brokers}
    queues = [queues_by_name[n] for n in full if n in queues_by_name]
    brokers = [brokers_by_name[n] for n in hashset_copy_order(full) if n in brokers_by_name]
    filter_servers = route.filter_servers
    if filter_servers:
        addrs = [addr for b in brokers for _, addr in sorted(b.addrs.items())]
        filter_servers = {a: filter_servers[a] for a in hashmap_order(addrs) if a in filter_servers}
    return msgspec.structs.replace(route, queues=queues, brokers=brokers, filter_servers=filter_servers)

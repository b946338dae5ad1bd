"""The route table's records as plain values: the one encoding of them, in both dumps.

`RouteTable.dump` (or `dump_in_steps`, between the loop's passes) gives it. A warm
restart's dump is it alone (zns.core.warm; `RouteTable.restore` takes it, through the
state machine's `Restore`); a replica's dump (zns.core.state_dump,
`RouteTable.exact_dump`/`from_exact_dump`) is it and what a restart drops.

Everything the table decides from, and nothing it derives: broker names with their
addresses, ids and clusters, zones, each address's timeout, DataVersion, HA address
and filter servers, each topic's queue data, the order configurations -- each in
the order the table holds it, because the remoting bodies reproduce Java's hash
table iteration from insertion orders (zns.core.remoting.javaorder). Routes,
revisions, the weight ledger and the cached BrokerData are rebuilt from these.

Not here (a replica's dump adds them; a warm restart drops them): when each address
was last heard, suspicions and stall credit (a monotonic time of another process
means nothing after a restart: a restored address is given a confirmation period
instead, see `RouteTable.restore`), the revisions and the epoch (a restored table
starts a new history: zns.core.warm says why).

The structs are array-like and the queue data interned (most topics of a broker
share one configuration), so a dump is small: bench/results.md has the figures.
Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Sized

from msgspec import Struct

from zns.core.schema import DataVersion

# (broker name, read queues, write queues, perm, sys flag): one distinct QueueData.
QueueValue = tuple[str, int, int, int, int]


class AddressState(Struct, array_like=True, frozen=True):
    """One live (cluster, address), with what its last registration said."""

    cluster: str
    addr: str
    timeout_ms: int
    data_version: DataVersion
    ha_addr: str
    names: list[str]  # the broker names listing it, sorted
    filter_servers: list[str]


class BrokerState(Struct, array_like=True, frozen=True):
    """One broker name: BrokerData.cluster, zone and (id, address, address's cluster)
    in the order the ids were taken."""

    name: str
    cluster: str
    zone: str
    addrs: list[tuple[int, str, str]]


class TableState(Struct, array_like=True, frozen=True):
    """The whole table; every list in the table's own order."""

    clusters: list[tuple[str, list[str]]]  # cluster -> its broker names, as they joined
    brokers: list[BrokerState]  # in the order the names were first registered
    addresses: list[AddressState]  # in the order they were first registered
    queue_values: list[QueueValue]  # the distinct queue data, each once
    topics: list[tuple[str, list[int]]]  # topic -> indexes into queue_values, names in order
    order_conf: list[tuple[str, str]]  # topic -> its ORDER_TOPIC_CONFIG value


def check_state(state: TableState) -> None:
    """Raise ValueError unless the state holds together as a table's records do: every
    name, address, cluster and queue value it refers to is in it, once, and none is
    left over. `RouteTable.restore` calls it before it changes anything."""
    brokers = {b.name: b for b in state.brokers}
    _once(brokers, state.brokers, "broker name")
    members: dict[str, set[str]] = {}
    for cluster, names in state.clusters:
        _require(names and len(set(names)) == len(names) and cluster not in members,
                 f"cluster {cluster!r} is empty or listed twice")
        members[cluster] = set(names)
        _require(members[cluster] <= brokers.keys(),
                 f"cluster {cluster!r} lists a broker name not held")
    listed: set[tuple[str, str, str]] = set()
    for b in state.brokers:
        ids = [i for i, _, _ in b.addrs]
        addrs = [a for _, a, _ in b.addrs]
        _require(b.addrs and len(set(ids)) == len(ids) and len(set(addrs)) == len(addrs),
                 f"broker {b.name!r} has no address, or one id or address twice")
        clusters = {c for _, _, c in b.addrs}
        _require(b.cluster in clusters, f"broker {b.name!r}: its cluster has none of its addresses")
        _require({c for c, names in members.items() if b.name in names} == clusters,
                 f"broker {b.name!r}: the clusters listing it are not its addresses' clusters")
        listed.update((c, a, b.name) for _, a, c in b.addrs)
    addresses = {(a.cluster, a.addr) for a in state.addresses}
    _once(addresses, state.addresses, "address")
    _require(listed == {(a.cluster, a.addr, n) for a in state.addresses for n in a.names},
             "the addresses and the brokers listing them differ")
    _require(all(v[0] in brokers for v in state.queue_values),
             "queue data of a broker name not held")
    topics = {t for t, _ in state.topics}
    _once(topics, state.topics, "topic")
    count = len(state.queue_values)
    for topic, numbers in state.topics:
        names = [state.queue_values[n][0] for n in numbers if 0 <= n < count]
        _require(names and len(names) == len(numbers) and len(set(names)) == len(names),
                 f"topic {topic!r}: no queue data, an unknown one, or one broker twice")
    _once(dict(state.order_conf), state.order_conf, "order configuration")


def _once(unique: Sized, items: Sized, what: str) -> None:
    _require(len(unique) == len(items), f"a {what} is listed twice")


def _require(condition: object, problem: str) -> None:
    if not condition:
        raise ValueError(problem)

"""The state machine's whole state as plain values: what `StateMachine.dump` writes and
`StateMachine.load` reads (zns.core.state).

Exact, for a replica: everything the state machine decides from, so that a machine
loaded from a dump answers every later command as the dumped one does -- the same
replies, events, revisions and dumps. Each list keeps the order its table holds,
because the remoting bodies reproduce Java's hash table iteration from insertion
orders (zns.core.remoting.javaorder). Routes, the weight ledger, the interned queue
data, the topic index and the cached BrokerData are derived, so they are rebuilt,
not written. Times are the monotonic milliseconds of the process that dumped: a
dump is loaded by a replica of the same run, on the same clock.

Sans-I/O; array-like structs, so a dump is small.
"""

from __future__ import annotations

from msgspec import Struct

from zns.core.schema import DataVersion, QueueData


class AddressDump(Struct, array_like=True, frozen=True):
    """One live (cluster, address): zns.core.liveness.Liveness without its heap entry."""

    cluster: str
    addr: str
    last_heartbeat: int
    timeout_ms: int
    data_version: DataVersion
    ha_addr: str
    names: list[str]  # the broker names listing it, sorted
    suspect_deadline: int | None
    stall_credit: int
    confirm_by: int | None  # restored by a warm restart and not heard since (zns.core.warm)


class BrokerDump(Struct, array_like=True, frozen=True):
    """One broker name: BrokerData.cluster, its zone, and (id, address, the address's
    cluster) in the order the ids were taken."""

    name: str
    cluster: str
    zone: str
    addrs: list[tuple[int, str, str]]


class TableDump(Struct, array_like=True, frozen=True):
    """The route table (zns.core.routes.RouteTable), each list in the table's own order."""

    epoch: str
    revision: int
    clusters: list[tuple[str, list[str]]]  # cluster -> its broker names, as they joined
    brokers: list[BrokerDump]  # as the names were first registered
    addresses: list[AddressDump]  # as they were first registered
    filter_servers: list[tuple[str, str, list[str]]]  # (cluster, address, its servers)
    queues: list[tuple[str, list[QueueData]]]  # topic -> its queue data, names as they came
    order_conf: list[tuple[str, str]]  # topic -> its ORDER_TOPIC_CONFIG value
    topic_revisions: list[tuple[str, int]]  # topics with a route: their last change
    removed_revisions: list[tuple[str, int]]  # recently removed topics, oldest first


class StateDump(Struct, array_like=True, frozen=True):
    """The state machine: the route table, the remoting ties, the KV entries and the
    namespaces a remoting delete emptied."""

    table: TableDump
    ties: list[tuple[int, str, str, str]]  # (connection, cluster, address, name), as tied
    kv: list[tuple[str, list[tuple[str, str]]]]  # namespace -> its entries, as stored
    emptied: list[str]  # oldest first

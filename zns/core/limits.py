"""Limits against memory exhaustion, checked in one place before a request is applied.

The wire bounds of §3 cap each field; these cap how much state requests may
pile up. Each refusal is a `bad_request` that names the limit and the option
that raises it, and (like every refusal) applies nothing. The checks are
conservative: a registration's new topics are counted before its removals.
Sans-I/O: it reads the route table and the KV store, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from zns.core.errors import BadRequest
from zns.core.kv import KvBackend, entry_bytes
from zns.core.routes import RouteTable
from zns.core.schema import AnyRequest, GetRoutes, KvPut, RegisterBroker, RegisterTopic


# The requests that can grow the server's state; `Limits.check` looks at nothing else.
LIMITED_REQUESTS = frozenset({RegisterBroker, RegisterTopic, GetRoutes, KvPut})


@dataclass(frozen=True)
class Limits:
    # Topics one register_broker may list (also topics one get_routes may ask for).
    max_topics_per_request: int = 20_000
    # Broker names, and broker addresses, the server holds (each counted separately).
    max_brokers: int = 10_000
    # Distinct topics with queue data.
    max_topics: int = 200_000
    # QueueData held (one per topic per broker name): what memory grows with (~0.8 KiB each in
    # bench/soak.py). Every route of a broker name carries the filter servers of its addresses,
    # so each of those counts as one more entry per topic (a 255-character filter server costs
    # less than a queue entry): 20,000 topics x 1,024 filter servers would be 20 M entries,
    # several GiB of encoded routes, and is refused.
    max_queues: int = 1_000_000
    # KV entries in one namespace, and KV namespaces.
    max_kv_entries: int = 10_000
    max_kv_namespaces: int = 1_000
    # UTF-8 bytes of every KV namespace, key and value held (each entry counted whole).
    max_kv_bytes: int = 64 << 20

    def check(self, request: AnyRequest, table: RouteTable, kv: KvBackend) -> None:
        """Raise BadRequest when applying `request` could exceed a limit."""
        match request:
            case RegisterBroker(topics=topics, broker_name=name, cluster=cluster,
                                broker_addr=addr):
                self._per_request(len(topics), "register_broker lists")
                if not table.has_broker(name) and table.broker_count() >= self.max_brokers:
                    _refuse("max_brokers", self.max_brokers, f"broker name {name!r} would be new")
                if (not table.has_address(cluster, addr)
                        and table.address_count() >= self.max_brokers):
                    _refuse("max_brokers", self.max_brokers, f"broker address {addr} would be new")
                # What the routes weigh once it is applied, by the table's one formula.
                weight, after = table.queue_weight(), table.queue_weight_after(request)
                if after > weight and after > self.max_queues:
                    _refuse("max_queues", self.max_queues, f"{after - weight} {ENTRIES_COUNTED}")
                count = table.topic_count()
                if count + len(topics) > self.max_topics:
                    new = sum(1 for topic in topics if not table.has_topic(topic))
                    if new and count + new > self.max_topics:
                        _refuse("max_topics", self.max_topics, f"{new} topics would be new")
            case RegisterTopic(topic=topic, queues=queues):
                if not table.has_topic(topic) and table.topic_count() >= self.max_topics:
                    _refuse("max_topics", self.max_topics, f"topic {topic!r} would be new")
                weight, after = table.queue_weight(), table.queue_weight_after_topic(topic, queues)
                if after > weight and after > self.max_queues:
                    _refuse("max_queues", self.max_queues, f"{after - weight} {ENTRIES_COUNTED}")
            case GetRoutes(topics=topics):
                self._per_request(len(topics), "get_routes asks for")
            case KvPut(namespace=ns, key=key, value=value):
                old = kv.get(ns, key)
                grows = entry_bytes(ns, key, value) - (
                    0 if old is None else entry_bytes(ns, key, old))
                if grows > 0 and kv.total_bytes() + grows > self.max_kv_bytes:
                    _refuse("max_kv_bytes", self.max_kv_bytes,
                            f"{grows} more bytes of KV entries (namespaces, keys and values)")
                if old is not None:
                    return
                if kv.count(ns) >= self.max_kv_entries:
                    _refuse("max_kv_entries", self.max_kv_entries,
                            f"namespace {ns!r} is full (per namespace)")
                if kv.count(ns) == 0 and kv.count() >= self.max_kv_namespaces:
                    _refuse("max_kv_namespaces", self.max_kv_namespaces,
                            f"namespace {ns!r} would be new")

    def _per_request(self, count: int, what: str) -> None:
        if count > self.max_topics_per_request:
            _refuse("max_topics_per_request", self.max_topics_per_request,
                    f"{what} {count} topics")


# How a max_queues refusal counts what the request would add.
ENTRIES_COUNTED = ("more queue entries (topic x broker name, each filter server and each address "
                   "past the first of the broker counted as one more)")


def _refuse(limit: str, value: int, detail: str) -> None:
    option = "--" + limit.replace("_", "-")
    raise BadRequest(f"limit {limit} ({value}) reached: {detail}; the server's {option} sets it")

"""Producer and consumer views of a route, as RocketMQ's client builds them.

- `write_queues(route)`: what a producer may send to (topicRouteData2TopicPublishInfo):
  the queues of brokers that have a master (id 0) and WRITE perm, or, for an
  ordered topic, the queues its `order_conf` lists.
- `read_queues(route)`: what a consumer reads (topicRouteData2TopicSubscribeInfo):
  the read queues of every broker with READ perm.
- `QueueSelector.select_queue`: round-robin that skips the broker that just
  failed, with optional latency fault avoidance (MQFaultStrategy): a slow or
  failed broker is left alone for a while; when every broker is left alone,
  the least bad one is used (LatencyFaultTolerance.pickOneAtLeast).

Times are integer milliseconds handed in as `now`. Nothing here locks: a
driver that calls a selector from several threads serialises the calls.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from zns.core.errors import NoWritableQueue
from zns.core.schema import MASTER_ID, PERM_READ, PERM_WRITE, TopicRoute

# MQFaultStrategy: a send that took at least LATENCY_MAX_MS[i] isolates the
# broker for NOT_AVAILABLE_MS[i].
LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
FAILED_SEND_LATENCY_MS = 30000  # a failed send counts as this slow (RocketMQ's isolation)


class MessageQueue(NamedTuple):
    topic: str
    broker_name: str
    queue_id: int


def write_queues(route: TopicRoute) -> list[MessageQueue]:
    """The queues a producer may send to."""
    if route.order_conf:
        # "brokerA:4;brokerB:8": ordered topics use exactly these queues.
        queues: list[MessageQueue] = []
        for item in route.order_conf.split(";"):
            name, _, count = item.strip().partition(":")
            if name and count.isdigit():
                queues.extend(MessageQueue(route.topic, name, i) for i in range(int(count)))
        return queues
    with_master = {b.broker_name for b in route.brokers if MASTER_ID in b.addrs}
    return [
        MessageQueue(route.topic, q.broker_name, i)
        for q in route.queues
        if q.perm & PERM_WRITE and q.broker_name in with_master
        for i in range(q.write_queues)
    ]


def read_queues(route: TopicRoute) -> list[MessageQueue]:
    """The queues a consumer reads."""
    return [
        MessageQueue(route.topic, q.broker_name, i)
        for q in route.queues
        if q.perm & PERM_READ
        for i in range(q.read_queues)
    ]


def not_available_ms(latency_ms: float) -> int:
    """How long a broker is avoided after a send that took `latency_ms`."""
    for limit, duration in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_MS)):
        if latency_ms >= limit:
            return duration
    return 0


class _Fault(NamedTuple):
    latency_ms: int  # the send's latency (FAILED_SEND_LATENCY_MS for a failed send)
    until: int  # avoided until this `now`


class LatencyFaults:
    """RocketMQ's LatencyFaultTolerance: which brokers to avoid until when.

    A failed send is remembered as FAILED_SEND_LATENCY_MS slow, so a broker
    that failed ranks behind one that was merely slow.
    """

    def __init__(self) -> None:
        self._faults: dict[str, _Fault] = {}

    def report(self, broker_name: str, latency_ms: float, now: int, failed: bool = False) -> None:
        latency = FAILED_SEND_LATENCY_MS if failed else round(latency_ms)
        self._faults[broker_name] = _Fault(latency, now + not_available_ms(latency))

    def is_available(self, broker_name: str, now: int) -> bool:
        fault = self._faults.get(broker_name)
        return fault is None or now >= fault.until

    def least_bad(self, broker_names: list[str], now: int, turn: int) -> str:
        """pickOneAtLeast among `broker_names`: available first, then the lowest
        latency, then the earliest release; `turn` rotates through the better half."""
        def rank(name: str) -> tuple[bool, int, int]:
            fault = self._faults.get(name, _Fault(0, 0))
            return (not self.is_available(name, now), fault.latency_ms, fault.until)

        ranked = sorted(broker_names, key=rank)
        half = len(ranked) // 2
        return ranked[0] if half <= 0 else ranked[turn % half]


class QueueSelector:
    """Round-robin queue choice per topic, optionally avoiding slow or failed brokers."""

    def __init__(self, fault_tolerance: bool = False) -> None:
        self.faults = LatencyFaults() if fault_tolerance else None
        self._counters: dict[str, itertools.count[int]] = {}
        self._least_bad_turns = itertools.count()

    def select_queue(
        self, topic: str, queues: list[MessageQueue], now: int, avoid_broker: str | None = None
    ) -> MessageQueue:
        """The next queue of `topic` after the last one chosen, not on `avoid_broker`
        (the broker a send just failed on) unless nothing else is left."""
        if not queues:
            raise NoWritableQueue(f"topic {topic!r} has no writable queue")
        start = next(self._counters.setdefault(topic, itertools.count()))
        order = [queues[(start + i) % len(queues)] for i in range(len(queues))]
        candidates = [q for q in order if q.broker_name != avoid_broker] or order
        if self.faults is not None:
            for queue in candidates:
                if self.faults.is_available(queue.broker_name, now):
                    return queue
            names = list(dict.fromkeys(q.broker_name for q in candidates))
            broker = self.faults.least_bad(names, now, next(self._least_bad_turns))
            return next(q for q in candidates if q.broker_name == broker)
        return candidates[0]

    def report(self, broker_name: str, latency_ms: float, now: int, failed: bool = False) -> None:
        """A send to `broker_name` took `latency_ms` (or failed): feeds fault avoidance."""
        if self.faults is not None:
            self.faults.report(broker_name, latency_ms, now, failed)

"""Producer and consumer views of a route, as RocketMQ's client builds them.

- `write_queues(route)`: what a producer may send to (topicRouteData2TopicPublishInfo):
  the queues of brokers that have a master (id 0) and WRITE perm, or, for an
  ordered topic, the queues its `order_conf` lists.
- `read_queues(route)`: what a consumer reads (topicRouteData2TopicSubscribeInfo):
  the read queues of every broker with READ perm.
- `QueueSelector.select_queue`: round-robin that skips the broker that just
  failed, with optional latency fault avoidance (MQFaultStrategy): a slow or
  failed broker is left alone for a while. The clock is injected.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
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
    if route.order_conf:
        # "brokerA:4;brokerB:8": ordered topics use exactly these queues.
        queues = []
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


class LatencyFaults:
    """RocketMQ's LatencyFaultTolerance: which brokers to avoid until when."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # seconds
        self._until: dict[str, float] = {}

    def report(self, broker_name: str, latency_ms: float, failed: bool = False) -> None:
        duration = not_available_ms(FAILED_SEND_LATENCY_MS if failed else latency_ms)
        self._until[broker_name] = self._clock() + duration / 1000

    def is_available(self, broker_name: str) -> bool:
        until = self._until.get(broker_name)
        return until is None or self._clock() >= until


class QueueSelector:
    """Round-robin queue choice per topic, thread-safe."""

    def __init__(
        self, fault_tolerance: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.faults = LatencyFaults(clock) if fault_tolerance else None
        self._counters: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def select_queue(
        self, topic: str, queues: list[MessageQueue], avoid_broker: str | None = None
    ) -> MessageQueue:
        if not queues:
            raise NoWritableQueue(f"topic {topic!r} has no writable queue")
        with self._lock:
            start = next(self._counters.setdefault(topic, itertools.count()))
        order = [queues[(start + i) % len(queues)] for i in range(len(queues))]
        if self.faults is not None:
            for queue in order:
                if queue.broker_name != avoid_broker and self.faults.is_available(queue.broker_name):
                    return queue
        for queue in order:
            if queue.broker_name != avoid_broker:
                return queue
        return order[0]  # every queue is on the broker to avoid: use it anyway

    def report(self, broker_name: str, latency_ms: float, failed: bool = False) -> None:
        if self.faults is not None:
            self.faults.report(broker_name, latency_ms, failed)

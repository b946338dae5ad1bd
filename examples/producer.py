"""A producer's side of zns: pick a queue for each message, fail over between brokers.

    ZNS_ADDR="tcp://127.0.0.1:9876" python examples/producer.py Orders

There is no message broker here, so `send` is simulated: broker-b "fails"
now and then, and the producer retries on another broker, as RocketMQ's
producer does.
"""

import random
import sys
import time

from zns import RouteClient

topic = sys.argv[1] if len(sys.argv) > 1 else "Orders"


def send(queue, message):
    """Stand-in for a broker call: returns its latency, raises on failure."""
    if queue.broker_name.endswith("b") and random.random() < 0.3:
        raise ConnectionError(f"{queue.broker_name} did not answer")
    return random.uniform(1, 20)


# The route is pulled once, then kept current by pushed events (no 30 s polling lag).
# fault_tolerance=True: a slow or failed broker is avoided for a while (MQFaultStrategy).
with RouteClient(fault_tolerance=True) as client:
    for n in range(10):
        failed_broker = None
        for attempt in range(3):  # RocketMQ's retryTimesWhenSendFailed = 2
            queue = client.select_queue(topic, avoid_broker=failed_broker)
            try:
                latency = send(queue, f"message {n}")
            except ConnectionError as exc:
                print(f"message {n}: {exc}; retrying elsewhere")
                client.report_latency(queue.broker_name, 0, failed=True)
                failed_broker = queue.broker_name
                continue
            client.report_latency(queue.broker_name, latency)
            print(f"message {n} -> {queue.broker_name} queue {queue.queue_id}")
            break
        time.sleep(0.2)

"""Watch routes change as they happen.

    ZNS_ADDR="tcp://127.0.0.1:9876" python examples/watcher.py Orders Payments
"""

import sys
import threading

from zns import RouteClient


def show(topic, route):
    # Called from the client's thread: once with the current route, then on every change.
    if route is None:
        print(f"{topic}: no route")
    else:
        queues = ", ".join(f"{q.broker_name}({q.write_queues} write queues)" for q in route.queues)
        print(f"{topic}: {queues}")


with RouteClient() as client:
    for topic in sys.argv[1:] or ["Orders"]:
        client.watch(topic, show)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass

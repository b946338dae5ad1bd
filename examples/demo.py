"""`make demo`: a NameServer, two brokers in two clusters, a watcher; one broker stops.

Everything runs in this process on loopback ephemeral ports, and the script
exits by itself (within 60 s even if something hangs).
"""

import os
import sys
import tempfile
import threading
import time

from zns import BrokerAgent, RouteClient
from zns.drivers.server import Server, ServerConfig

WATCHDOG_S = 60
threading.Timer(WATCHDOG_S, lambda: (print("demo: timed out", flush=True), os._exit(1))).start()


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def main() -> int:
    kv_dir = tempfile.TemporaryDirectory()
    server = Server(ServerConfig(router="tcp://127.0.0.1:*", pub="tcp://127.0.0.1:*",
                                 kv_path=os.path.join(kv_dir.name, "kv.json")))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    ns = server.router_endpoint
    say(f"NameServer serving on {ns}, events on {server.pub_endpoint}")

    agents = [
        BrokerAgent(ns, cluster=cluster, broker_name=name, broker_addr=addr,
                    topics={"Orders": {"read_queues": 4, "write_queues": 4}})
        for cluster, name, addr in (("east", "broker-a", "127.0.0.1:10911"),
                                    ("west", "broker-b", "127.0.0.1:10921"))
    ]
    say("brokers broker-a (cluster east) and broker-b (cluster west) registering")

    changes: list[tuple[float, object]] = []
    arrived = threading.Condition()

    def on_change(topic, route):
        now = time.monotonic()
        names = [q.broker_name for q in route.queues] if route else []
        say(f"watcher: {topic} is served by {', '.join(names) or 'nobody'}")
        with arrived:
            changes.append((now, route))
            arrived.notify_all()

    client = RouteClient(ns)
    try:
        client.watch("Orders", on_change)
        with arrived:
            if not arrived.wait_for(
                lambda: changes and changes[-1][1] and len(changes[-1][1].queues) == 2, 10):
                say("FAILED: the watcher never saw both brokers")
                return 1
        picks = [client.select_queue("Orders") for _ in range(4)]
        say("producer picks: " + ", ".join(f"{q.broker_name}#{q.queue_id}" for q in picks))

        say("stopping broker-b (it unregisters from the NameServer)")
        stopped_at = time.monotonic()
        agents[1].close()
        with arrived:
            ok = arrived.wait_for(lambda: changes[-1][1] and len(changes[-1][1].queues) == 1, 5)
        if not ok:
            say("FAILED: no pushed route change within 5 s")
            return 1
        say(f"the pushed route change reached the watcher {1000 * (changes[-1][0] - stopped_at):.0f} ms "
            f"after broker-b stopped (RocketMQ clients poll every 30 s)")
        say("producer picks now: " + ", ".join(
            f"{q.broker_name}#{q.queue_id}" for q in (client.select_queue("Orders") for _ in range(3))))
        return 0
    finally:
        client.close()
        agents[0].close()
        server.stop()
        serving.join(10)  # it writes its state dump into kv_dir as it stops
        kv_dir.cleanup()


if __name__ == "__main__":
    code = main()
    say("demo done" if code == 0 else "demo failed")
    os._exit(code)  # also ends the watchdog timer

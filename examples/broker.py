"""A broker's side of zns: keep this broker registered with every NameServer.

    ZNS_ADDR="tcp://127.0.0.1:9876" python examples/broker.py broker-a 127.0.0.1:10911

A real broker would serve messages here; this one only registers, heartbeats,
adds a topic after a while, and unregisters on Ctrl-C.
"""

import signal
import sys
import threading

from zns import BrokerAgent

name, addr = (sys.argv[1:3] + ["broker-a", "127.0.0.1:10911"][len(sys.argv[1:3]):])

# Registers at once with every NameServer in ZNS_ADDR, then heartbeats every second;
# a NameServer that restarts learns the broker again within one heartbeat.
agent = BrokerAgent(
    cluster="DefaultCluster",
    broker_name=name,
    broker_addr=addr,
    topics={"Orders": {"read_queues": 4, "write_queues": 4}},
    heartbeat_timeout_ms=10_000,  # NameServers drop it 10 s after its last heartbeat
)
print(f"{name} registering at {addr}; Ctrl-C to stop")

stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
signal.signal(signal.SIGTERM, lambda *_: stop.set())

# Topic changes bump the DataVersion and reach every NameServer at once.
if not stop.wait(5):
    agent.add_topic("Payments", {"read_queues": 2, "write_queues": 2})
    print("added topic Payments")
stop.wait()

print("unregistered:", agent.close())  # bounded: a dead NameServer cannot hold it up

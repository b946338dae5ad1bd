"""Peer hints at work (docs/protocol.md §10): three NameServers, one broker falls silent.

Starts three `zns serve` processes that take hints from each other, registers
one broker with all three — with a 1 s heartbeat timeout on A, 20 s on B and
C — and lets it fall silent. A expires it after 1 s; B and C take A's event as
a hint and drop it a quarter of its timeout later (the suspicion's deadline is the
later of its last heartbeat there plus the grace and the hint plus a quarter of
the timeout, §10), instead of 20 s after its last heartbeat. Then a second broker
that keeps heartbeating B and C stays there although A expired it. Exits by itself.

Run with `make demo-peers`.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

from zns.drivers.requests import call
from zns.core.schema import (
    BROKER_PREFIX,
    BrokerEvent,
    GetClusterInfo,
    Heartbeat,
    RegisterBroker,
    Status,
    TopicConfig,
    decode_event,
)

GRACE = 2.0
TIMEOUT_MS = {"A": 1000, "B": 20_000, "C": 20_000}  # B and C drop it 1 + 20/4 s in
SILENT = ("broker-a", "10.0.0.1:10911")
BEATING = ("broker-b", "10.0.0.2:10911")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(workdir: Path) -> tuple[dict[str, str], dict[str, subprocess.Popen]]:
    routers = {name: f"tcp://127.0.0.1:{free_port()}" for name in "ABC"}
    pubs = {name: f"tcp://127.0.0.1:{free_port()}" for name in "ABC"}
    procs = {}
    for name in "ABC":
        peers = [arg for other in "ABC" if other != name for arg in ("--peer", routers[other])]
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--router", routers[name],
             "--pub", pubs[name], "--kv-path", str(workdir / f"{name}.kv.log"),
             "--heartbeat-interval", "0.2", "--peer-grace", str(GRACE), *peers],
            stdout=subprocess.DEVNULL, stderr=open(workdir / f"{name}.log", "w"),
        )
    return routers, procs


def wait_linked(routers: dict[str, str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if all(all(call(r, Status(), timeout=1).peers.values()) for r in routers.values()):
                return
        except Exception:
            pass  # not serving yet
        if time.monotonic() > deadline:
            raise SystemExit("the NameServers did not link up; see their logs")
        time.sleep(0.1)


def register(router: str, broker: tuple[str, str], timeout_ms: int) -> None:
    name, addr = broker
    call(router, RegisterBroker(cluster="demo", broker_name=name, broker_id=0, broker_addr=addr,
                                topics={"DemoTopic": TopicConfig()},
                                heartbeat_timeout_ms=timeout_ms))


def live(router: str) -> set[str]:
    return {b.broker_addr for b in call(router, GetClusterInfo()).live}


def main() -> None:
    ctx = zmq.Context.instance()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        routers, procs = start_servers(workdir)
        try:
            wait_linked(routers)
            print("three NameServers, each taking hints from the other two "
                  f"(--peer-grace {GRACE:g}):")
            for name, router in routers.items():
                print(f"  {name}  {router}")
            subs = {}
            for name, router in routers.items():
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.connect(call(router, Status()).pub_endpoint)
                sub.setsockopt(zmq.SUBSCRIBE, BROKER_PREFIX)
                subs[sub] = name
            time.sleep(0.3)  # let the subscriptions reach the publishers

            print(f"\n{SILENT[0]} at {SILENT[1]} registers with A (heartbeat timeout 1 s) and "
                  "with B and C (20 s), then falls silent:")
            start = time.monotonic()
            for name, router in routers.items():
                register(router, SILENT, TIMEOUT_MS[name])
            watch_removals(subs, start, SILENT[1], expected=3, timeout=15)
            gone = [name for name, r in routers.items() if SILENT[1] not in live(r)]
            print(f"  gone from {', '.join(gone)} after {time.monotonic() - start:.1f} s "
                  "— without hints B and C would have kept it for 20 s")

            print(f"\n{BEATING[0]} at {BEATING[1]} registers the same way but keeps "
                  "heartbeating B and C:")
            for name, router in routers.items():
                register(router, BEATING, TIMEOUT_MS[name])
            stop = threading.Event()
            beats = threading.Thread(target=heartbeat, args=(routers, stop), daemon=True)
            beats.start()
            start = time.monotonic()
            watch_removals(subs, start, BEATING[1], expected=1, timeout=15)
            time.sleep(GRACE + 1)  # longer than the grace: a wrongly kept suspicion would show
            stop.set()
            beats.join()
            where = [name for name, r in routers.items() if BEATING[1] in live(r)]
            print(f"  {GRACE + 1:g} s later it is still live on {', '.join(where)}: "
                  "each heartbeat cleared the suspicion")

            print("\nwhat B logged about its peers:")
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(10)
            for line in (workdir / "B.log").read_text().splitlines():
                if "peer" in line:
                    print("  " + line.split(" zns: ", 1)[-1])
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def heartbeat(routers: dict[str, str], stop: threading.Event) -> None:
    name, addr = BEATING
    while not stop.is_set():
        for server in ("B", "C"):
            call(routers[server], Heartbeat(cluster="demo", broker_name=name, broker_id=0,
                                            broker_addr=addr))
        stop.wait(0.3)


def watch_removals(subs: dict, start: float, addr: str, expected: int, timeout: float) -> None:
    poller = zmq.Poller()
    for sub in subs:
        poller.register(sub, zmq.POLLIN)
    seen = 0
    deadline = time.monotonic() + timeout
    while seen < expected and time.monotonic() < deadline:
        for sub, _ in poller.poll(100):
            _, body = sub.recv_multipart()
            event = decode_event(body)
            if isinstance(event, BrokerEvent) and event.broker_addr == addr \
                    and event.change == "removed":
                seen += 1
                print(f"  [{time.monotonic() - start:4.1f} s] {subs[sub]}: {event.broker_name} "
                      f"{event.broker_addr} removed ({event.reason})")
    if seen < expected:
        raise SystemExit(f"only {seen} of {expected} removals arrived within {timeout:g} s")


if __name__ == "__main__":
    main()

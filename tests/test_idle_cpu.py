"""Every long-running component idles at (nearly) no CPU after each of its wake-up paths.

A loop that forgets to consume a wake-up (a socketpair byte never read, a timer in the
past) spins: nothing else fails, the process only burns a core. So each test drives
every way the component can be woken — a request, an event, a signal, a change asked
from another thread — and then measures the CPU time of the whole process (from
/proc, all threads) over two idle seconds. Budget: 2 % of a core, which covers a
NameServer's own `hb` every second; a spinning loop costs 10-100 % even on a loaded
machine. Measured from /proc, so Linux only (as is CI).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Peer, ProcessServer, register_fields, wait_for
from test_remoting_listener import Client, cluster_info
from zns.core import schema
from zns.drivers.async_client import AsyncRouteClient
from zns.drivers.broker_agent import BrokerAgent
from zns.drivers.route_client import RouteClient

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")

IDLE_SECONDS = 2.0  # with the waker never drained: 23-98 % over 2 s at load 12 (budget 2 %)
BUDGET = 0.02  # of one core
TICK = 1 / os.sysconf("SC_CLK_TCK")  # /proc's resolution


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, every thread included."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces: skip past it
    return (int(fields[11]) + int(fields[12])) * TICK


def idle_share(pid: int, seconds: float = IDLE_SECONDS) -> float:
    """The share of one core process `pid` used over `seconds` of doing nothing asked."""
    time.sleep(0.3)  # let the last wake-up's own work finish
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before - TICK) / (time.monotonic() - start)


def assert_idle(pid: int, what: str) -> None:
    share = idle_share(pid)
    assert share <= BUDGET, f"{what} used {share:.1%} of a core while idle (budget {BUDGET:.0%})"


@pytest.fixture
def ns(process_server) -> Iterator[tuple[ProcessServer, Peer]]:
    srv = process_server()
    peer = Peer(srv.router, srv.pub)
    peer.ok("register_broker", **register_fields(topics={"Orders": {}}))
    yield srv, peer
    peer.close()


def change_route(peer: Peer, version: int) -> None:
    """A new data version with another queue count: a route event for Orders."""
    peer.ok("register_broker", **register_fields(
        topics={"Orders": {"read_queues": version, "write_queues": version}},
        data_version={"counter": version, "timestamp": version}))


def test_server_idles_after_requests_events_remoting_metrics_and_sighup(process_server):
    srv = process_server("--remoting", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
    log = wait_for(lambda: "/metrics" in srv.output() and "remoting listener on" in srv.output()
                   and srv.output())
    remoting = re.search(r"remoting listener on (?:tcp://)?(\S+)", log).group(1)
    metrics = re.search(r"metrics on (http://\S+/metrics)", log).group(1)
    peer = Peer(srv.router, srv.pub)
    try:
        peer.subscribe(b"hb\0")
        peer.wait_subscribed()
        peer.ok("register_broker", **register_fields())  # a broker: an expiry deadline
        peer.ok("status")
        client = Client(remoting)
        assert client.call(cluster_info()).code == 0
        client.close()
        with urllib.request.urlopen(metrics, timeout=10) as reply:
            assert reply.status == 200
        srv.proc.send_signal(signal.SIGHUP)  # the systemd unit's reload: a signal wake-up
        wait_for(lambda: "SIGHUP" in srv.output())
        peer.ok("status")
        assert_idle(srv.proc.pid, "zns serve")
    finally:
        peer.close()


def test_route_client_idles_after_route_watch_events_and_unwatch(ns):
    srv, peer = ns
    seen: list[object] = []
    with RouteClient([srv.router], timeout=10) as client:
        client.route("Orders")
        unwatch = client.watch("Orders", lambda topic, route: seen.append(route))
        change_route(peer, 2)  # an event through the SUB socket
        wait_for(lambda: any(r is not None and r.queues[0].read_queues == 2 for r in seen))
        unwatch()
        client.route("Orders")
        assert_idle(os.getpid(), "RouteClient")


def test_async_route_client_idles_after_route_and_watch(ns):
    srv, peer = ns

    async def scenario() -> float:
        async with AsyncRouteClient([srv.router], timeout=10) as client:
            await client.route("Orders")
            updates = client.watch("Orders")
            await anext(updates)
            change_route(peer, 3)
            async with asyncio.timeout(10):
                async for route in updates:
                    if route is not None and route.queues[0].read_queues == 3:
                        break
            await updates.aclose()
            await client.route("Orders")
            # Measured with the event loop running: a spinning task would run here.
            await asyncio.sleep(0.3)
            before, start = cpu_seconds(os.getpid()), time.monotonic()
            await asyncio.sleep(IDLE_SECONDS)
            return (cpu_seconds(os.getpid()) - before - TICK) / (time.monotonic() - start)

    share = asyncio.run(scenario())
    assert share <= BUDGET, f"AsyncRouteClient used {share:.1%} of a core while idle"


def test_broker_agent_idles_after_topics_change(ns):
    srv, peer = ns
    agent = BrokerAgent([srv.router], cluster="c1", broker_name="broker-b",
                        broker_addr="10.0.0.2:10911", topics={"Orders": {}},
                        heartbeat_interval=1.0)
    try:
        wait_for(agent.registered_everywhere)
        agent.add_topic("Payments")
        wait_for(lambda: not isinstance(peer.call("get_route", topic="Payments"), schema.Error))
        agent.remove_topic("Payments")
        wait_for(lambda: isinstance(peer.call("get_route", topic="Payments"), schema.Error))
        assert_idle(os.getpid(), "BrokerAgent")
    finally:
        agent.close()


def zns_command(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"cmd-{time.monotonic_ns()}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    proc = subprocess.Popen([sys.executable, "-m", "zns", *args], stdout=out.open("w"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, out


@pytest.fixture
def commands(tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[subprocess.Popen, Path]:
        proc, out = zns_command(tmp_path, *args)
        started.append(proc)
        return proc, out

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(15)


def test_zns_watch_idles_after_the_start_and_events(ns, commands):
    srv, peer = ns
    proc, out = commands("watch", "--ns", srv.router)
    wait_for(lambda: "watching" in out.read_text(), timeout=30)
    versions = iter(range(4, 1000))

    def changed_and_seen() -> bool:  # its subscription is live some time after "watching"
        change_route(peer, next(versions))
        return "Orders" in out.read_text()

    wait_for(changed_and_seen, timeout=30, interval=0.5)
    assert proc.poll() is None, out.read_text()
    assert_idle(proc.pid, "zns watch")


def test_zns_relay_idles_after_relaying(ns, commands):
    srv, peer = ns
    proc, out = commands("relay", "--from", srv.router, "--bind", "tcp://127.0.0.1:*")
    line = wait_for(lambda: re.search(r"relayed on (\S+)", out.read_text()), timeout=30)
    downstream = Peer(srv.router, line.group(1))
    try:
        downstream.subscribe(b"hb\0")
        downstream.wait_subscribed()
        assert proc.poll() is None, out.read_text()
        assert_idle(proc.pid, "zns relay")
    finally:
        downstream.close()


def test_zns_broker_idles_once_registered(ns, commands):
    srv, peer = ns
    proc, out = commands("broker", "--ns", srv.router, "--cluster", "c1", "--name", "broker-c",
                         "--addr", "10.0.0.3:10911", "--topic", "Orders")
    wait_for(lambda: "registered with" in out.read_text(), timeout=30)
    assert proc.poll() is None, out.read_text()
    assert_idle(proc.pid, "zns broker")

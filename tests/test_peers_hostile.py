"""A hostile `--peer` (§10) against a real server: it must not freeze the loop.

The peer is a process of its own (its flood must not share this process's GIL with what
measures the server): it answers `status` with its events endpoint, then publishes as fast
as it can, on the channels a peer link subscribes to, events of 1 MiB and of 60 KiB and
`hb`s with a fresh epoch each (`sizes`), or those `hb`s alone (`epochs`). The server
meanwhile keeps a broker that heartbeats every 0.5 s, sends its own `hb` on time, grows
its memory by a bounded amount, and logs a bounded number of lines.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from helpers import Peer, register_fields
from zns.core import schema

HOSTILE_PEER = r"""
import sys, zmq
from zns.core import schema
ctx = zmq.Context.instance()
router, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
router.bind("tcp://127.0.0.1:*")
pub.bind("tcp://127.0.0.1:*")
pub.setsockopt(zmq.SNDHWM, 100)
print(router.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
huge = [schema.BROKER_PREFIX, b"x" * (1 << 20)]
large = [schema.BROKER_PREFIX, b"x" * (60 << 10)]
sizes = sys.argv[1] == "sizes"
n = 0
while True:
    if router.poll(0):
        identity, body = router.recv_multipart()
        request = schema.decode_request(body)
        router.send_multipart([identity, schema.encode(schema.StatusReply(
            id=request.id, epoch="e0", revision=0, version="0", uptime_ms=0, brokers=0,
            topics=0, pub_endpoint=pub.getsockopt_string(zmq.LAST_ENDPOINT)))])
    n += 1
    try:
        if sizes:
            pub.send_multipart(huge if n % 3 == 0 else large, zmq.NOBLOCK)
        hb = schema.HbEvent(epoch=f"e{n}", revision=0, time_ms=0)
        pub.send_multipart([schema.HB_CHANNEL, schema.encode(hb)], zmq.NOBLOCK)
    except zmq.Again:
        pass
"""

ATTACK_S = 8.0
INTERVAL_S = 1.0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attack", ["sizes", "epochs"])
def test_a_flooding_peer_costs_a_slice_not_the_loop(process_server, attack):
    hostile = subprocess.Popen([sys.executable, "-c", HOSTILE_PEER, attack],
                               stdout=subprocess.PIPE, text=True)
    watcher: Peer | None = None
    try:
        assert hostile.stdout is not None
        endpoint = hostile.stdout.readline().strip()
        assert endpoint.startswith("tcp://"), endpoint
        srv = process_server("--peer", endpoint, "--heartbeat-interval", str(INTERVAL_S))
        watcher = Peer(srv.router, srv.pub)
        watcher.subscribe(schema.BROKER_PREFIX, schema.HB_CHANNEL)
        watcher.wait_subscribed()
        before = rss_mib(srv.proc.pid)
        broker = register_fields(heartbeat_timeout_ms=3000)
        watcher.ok("register_broker", **broker)
        hbs: list[float] = []
        removed: list[schema.BrokerEvent] = []
        peak = before
        started = next_beat = time.monotonic()
        while time.monotonic() - started < ATTACK_S:
            if time.monotonic() >= next_beat:
                watcher.ok("heartbeat", **{k: broker[k] for k in
                                           ("cluster", "broker_name", "broker_id", "broker_addr")})
                next_beat += 0.5
                peak = max(peak, rss_mib(srv.proc.pid))
            assert watcher.sub is not None
            while watcher.sub.poll(50):
                channel, body = watcher.sub.recv_multipart()
                event = schema.decode_event(body)
                if channel == schema.HB_CHANNEL:
                    hbs.append(time.monotonic())
                elif isinstance(event, schema.BrokerEvent) and event.change == "removed":
                    removed.append(event)
        assert removed == [], f"a live broker expired: {removed}"
        gaps = [b - a for a, b in zip(hbs, hbs[1:])]
        assert len(hbs) >= ATTACK_S / INTERVAL_S - 2 and max(gaps) <= 1.5 * INTERVAL_S, gaps
        assert peak - before < 128, f"RSS {before:.0f} -> {peak:.0f} MiB"
        assert [b.broker_name for b in watcher.ok("get_cluster_info").live] == ["broker-a"]
        # A fresh epoch on every hb: the restart lines (two templates) are folded, 20 of each
        # per 10 s at most, and a summary line of each per window.
        restarts = srv.output().count("restarted (epoch")
        assert restarts <= 2 * 2 * 20, restarts
    finally:
        if watcher is not None:
            watcher.close()
        hostile.kill()
        hostile.wait(10)

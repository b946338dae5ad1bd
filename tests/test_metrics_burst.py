"""A burst at the metrics port moves no deadline (issue 32 item 6).

Before the metrics server was bounded, 1,000-3,000 half-finished requests completed at once
started a thread each; the loop thread then waited for the GIL, the stall rule read that wait
as the process not running, and moved every deadline: a silent 3 s broker expired at 5.97 s.
Now the HTTP server serves at most 16 connections (the kernel queues 16 more and drops the
rest), and the stall rule counts only time in which the process did not run. This drives the
same burst at a real `zns serve` and checks the two budgets: the broker expires at most 0.5 s
late, and the `hb` events (timed by the server's own clock) keep within 1.5 intervals.
"""

from __future__ import annotations

import re
import resource
import socket
import time
from pathlib import Path

import pytest

from helpers import Peer, ProcessServer, wait_for
from zns.core import schema

CROWD = 3000
HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: zns\r\n"
HB_INTERVAL_S = 0.5
BROKER_TIMEOUT_MS = 3000
LATE_BUDGET_S = 0.5
# What the test process adds between the server's decision and its own clock reading: the
# event's way to this process's SUB and this thread's turn on a loaded machine.
DELIVERY_S = 0.5
ATTEMPTS = 3


def raise_open_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def metrics_port(server: ProcessServer) -> int:
    line = wait_for(lambda: re.search(r"metrics on http://[^:]+:(\d+)/metrics", server.output()))
    return int(line.group(1))


def one_burst(tmp_path: Path) -> tuple[float, float, float, str]:
    """(seconds from asking for the registration, and from its reply, to the broker's removal
    arriving; the longest gap between two `hb` events by the server's clock; the server's log)."""
    server = ProcessServer(tmp_path, "--metrics", "127.0.0.1:0",
                           "--heartbeat-interval", str(HB_INTERVAL_S))
    peer = Peer(server.router, server.pub)
    crowd: list[socket.socket] = []
    try:
        port = metrics_port(server)
        peer.subscribe(schema.HB_CHANNEL, b"broker/")
        peer.wait_subscribed()
        for _ in range(CROWD):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            crowd.append(sock)
        time.sleep(0.5)  # let the handshakes the kernel takes complete
        for sock in crowd:
            try:
                sock.send(HALF_REQUEST)
            except OSError:  # not connected: the kernel dropped its SYN (the bound at work)
                pass
        asked = time.monotonic()
        peer.ok("register_broker", cluster="c1", broker_name="silent", broker_id=0,
                broker_addr="10.0.0.9:10911", topics={"T": {}}, heartbeat_timeout_ms=BROKER_TIMEOUT_MS)
        registered = time.monotonic()
        time.sleep(1.0)
        for sock in crowd:  # every half request completed at once
            try:
                sock.send(b"\r\n")
            except OSError:
                pass
        hb_times: list[int] = []
        removed_at = None
        deadline = registered + BROKER_TIMEOUT_MS / 1000 + 10
        while removed_at is None and time.monotonic() < deadline:
            channel, event = peer.next_event(timeout=deadline - time.monotonic())
            if channel == schema.HB_CHANNEL:
                hb_times.append(event.time_ms)
            elif event.change == "removed":
                removed_at = time.monotonic()
        assert removed_at is not None, "the silent broker was never removed"
        # Over about four intervals: fewer than three gaps is itself hb events gone missing.
        gaps = [b - a for a, b in zip(hb_times, hb_times[1:])]
        longest = max(gaps) / 1000 if len(gaps) >= 3 else float("inf")
        return removed_at - asked, removed_at - registered, longest, server.output()
    finally:
        for sock in crowd:
            sock.close()
        peer.close()
        server.stop()


@pytest.mark.timeout(150)
def test_a_burst_of_metrics_requests_completed_at_once_moves_no_deadline(tmp_path: Path):
    raise_open_files(CROWD + 512)
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < CROWD + 512:
        pytest.fail(f"the open-file limit cannot hold {CROWD} connections")
    tries = []
    for attempt in range(ATTEMPTS):
        (tmp_path / f"try{attempt}").mkdir()
        since_asked, took, gap, log = one_burst(tmp_path / f"try{attempt}")
        stalled = "stalled for" in log
        tries.append(f"removed after {took:.2f} s, longest hb gap {gap:.2f} s, stall logged: {stalled}")
        if not stalled:  # a stall by the rule (the machine kept the process from running)
            break        # moves deadlines by design: only a run without one shows the budget
    else:
        pytest.fail("the machine kept the server from running in every attempt: " + "; ".join(tries))
    assert since_asked >= BROKER_TIMEOUT_MS / 1000, tries  # never early
    assert took <= BROKER_TIMEOUT_MS / 1000 + LATE_BUDGET_S + DELIVERY_S, tries
    assert gap <= 1.5 * HB_INTERVAL_S, tries

"""zns.core.readiness: /readyz's rule, with an injected clock and route table."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SplitServer, register_fields, wait_for
from zns.core.readiness import Readiness

A, B = ("c1", "10.0.0.1:10911"), ("c1", "10.0.0.2:10911")


def test_nothing_expected_is_ready_at_once():
    assert Readiness((), started_ms=0, grace_ms=60_000).check(0, lambda c, a: False)[0]


def test_ready_once_every_expected_broker_is_back_and_stays_ready():
    live: set[tuple[str, str]] = set()
    readiness = Readiness([A, B], started_ms=1_000, grace_ms=60_000)
    ready, why = readiness.check(2_000, lambda c, a: (c, a) in live)
    assert not ready
    assert why == ("warming: 2 of 2 brokers known before the restart have not registered "
                   "again nor gone (ready in at most 59.0 s)")
    live.add(A)
    assert readiness.check(3_000, lambda c, a: (c, a) in live)[1].startswith("warming: 1 of 2")
    live.add(B)
    assert readiness.check(4_000, lambda c, a: (c, a) in live) == (
        True, "ready: every broker known before the restart has registered again or is gone")
    live.clear()  # a broker leaving later does not take the NameServer out again
    assert readiness.check(5_000, lambda c, a: (c, a) in live)[0]


def test_the_grace_makes_it_ready_without_the_missing_brokers():
    readiness = Readiness([A, B], started_ms=1_000, grace_ms=60_000)
    assert not readiness.check(60_999, lambda c, a: (c, a) == A)[0]
    assert readiness.check(61_000, lambda c, a: (c, a) == A) == (
        True, "ready: the grace passed with 1 of 2 brokers known before the restart not "
              "registered again")


@pytest.mark.timeout(120)
def test_after_a_warm_restart_readyz_waits_for_the_restored_brokers(tmp_path: Path):
    # The dump of a cleanly stopped server restores two brokers; /readyz is 503 until each
    # has registered again (broker-b) or been removed as not_confirmed (broker-a, silent).
    pytest.importorskip("prometheus_client")
    from test_metrics import get

    first = SplitServer(tmp_path)
    peer = first.peer()
    for name, addr, timeout in (("broker-a", "10.0.0.1:10911", 2_000),
                                ("broker-b", "10.0.0.2:10911", 120_000)):
        peer.ok("register_broker", heartbeat_timeout_ms=timeout,
                **register_fields(name, 0, addr, topics={f"T-{name}": {}}))
    first.stop()
    again = SplitServer(tmp_path, metrics="127.0.0.1:0")
    url = f"http://127.0.0.1:{again.metrics_port}/readyz"
    try:
        # A worker serving before the state process's first figures reached it says so
        # (`starting: ...`, 503 too): under load it answered the first ask that way.
        status, why = wait_for(lambda: (got := get(url))[1].startswith("warming") and got)
        assert (status, why.split(" (")[0]) == (503, "warming: 2 of 2 brokers known before the "
                                                     "restart have not registered again nor gone")
        again.peer().ok("register_broker", heartbeat_timeout_ms=120_000,
                        **register_fields("broker-b", 0, "10.0.0.2:10911",
                                          topics={"T-broker-b": {}}))
        # The state process sends its readiness to the workers once a second.
        wait_for(lambda: get(url)[1].startswith("warming: 1 of 2"))
        wait_for(lambda: get(url) == (200, "ready: every broker known before the restart has "
                                           "registered again or is gone\n"))
    finally:
        again.stop()

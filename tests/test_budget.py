"""The byte budget of large replies: what a peer that never reads can make the server hold."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from zns.core import schema
from zns.core.budget import HEAVY_BYTES, ReplyBudget

from helpers import Peer, register_fields, wait_for

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


def test_small_replies_are_never_metered():
    budget = ReplyBudget(burst=MiB, rate=0, total_burst=MiB, total_rate=0)
    assert all(budget.allow(b"p", HEAVY_BYTES - 1, now=0) for _ in range(10_000))
    assert budget.refused == 0


def test_a_peer_gets_its_burst_then_its_rate():
    budget = ReplyBudget(burst=10 * MiB, rate=MiB, total_burst=100 * MiB, total_rate=100 * MiB)
    assert [budget.allow(b"p", 4 * MiB, now=0) for _ in range(3)] == [True, True, False]
    assert not budget.allow(b"p", 4 * MiB, now=1000)  # 2 + 1 MiB: not yet
    assert budget.allow(b"p", 4 * MiB, now=2000)  # 2 + 2 MiB
    assert budget.refused == 2
    assert budget.allow(b"other", 4 * MiB, now=2000)  # each peer has its own bucket


def test_all_peers_together_share_the_total_bucket():
    budget = ReplyBudget(burst=10 * MiB, rate=MiB, total_burst=12 * MiB, total_rate=MiB)
    assert budget.allow(b"a", 8 * MiB, now=0)
    assert not budget.allow(b"b", 8 * MiB, now=0)  # b's own bucket is full; the total is not
    assert budget.allow(b"b", 4 * MiB, now=0)


def test_the_burst_never_grows_past_itself():
    budget = ReplyBudget(burst=4 * MiB, rate=MiB, total_burst=100 * MiB, total_rate=100 * MiB)
    assert budget.allow(b"p", 4 * MiB, now=0)
    assert budget.allow(b"p", 4 * MiB, now=3_600_000)  # an hour later: one burst, not 3600 MiB
    assert not budget.allow(b"p", 4 * MiB, now=3_600_000)


def test_peers_are_bounded_and_full_buckets_forgotten_first():
    budget = ReplyBudget(burst=MiB, rate=MiB, max_peers=100)
    for i in range(1000):
        budget.allow(str(i).encode(), HEAVY_BYTES, now=i * 10)
    assert len(budget._peers) <= 100


@pytest.mark.single_process("reads the reply budget's burst, rate and refusals, which no endpoint shows")
def test_a_peer_that_asks_for_snapshots_and_never_reads_is_bounded(make_server, tmp_path: Path):
    srv = make_server()
    admin = srv.peer()
    topics = {f"Topic{i:05d}": {} for i in range(8000)}
    admin.ok("register_broker", **register_fields(topics=topics))
    snapshot = admin.call("snapshot")
    size = len(schema.encode(snapshot))
    assert size > HEAVY_BYTES
    budget = srv.server.reply_budget
    hog = zmq.Context.instance().socket(zmq.DEALER)
    hog.setsockopt(zmq.LINGER, 0)
    hog.setsockopt(zmq.RCVHWM, 1)
    hog.setsockopt(zmq.RCVBUF, 4096)
    hog.connect(srv.router)
    try:
        for i in range(200):  # the review's 200 snapshots: ~2 GB held without a budget
            hog.send(schema.encode({"op": "snapshot", "id": i}))
        wait_for(lambda: budget.refused > 0, timeout=30)
        allowed = 200 - budget.refused
        # What was queued for it: at most one burst and what the rate added meanwhile.
        assert allowed * size <= budget.burst + budget.rate * 30 + size
        # Other peers are still served, large replies included.
        assert admin.ok("status").epoch
    finally:
        hog.close(0)


@pytest.mark.single_process("reads the reply budget's refusals, which no endpoint shows")
def test_a_peer_that_reads_is_not_refused(make_server):
    srv = make_server()
    admin = srv.peer()
    admin.ok("register_broker", **register_fields(
        topics={f"Topic{i:05d}": {} for i in range(2000)}))
    for _ in range(20):
        reply = admin.call("snapshot")
        assert not isinstance(reply, schema.Error), reply
    assert srv.server.reply_budget.refused == 0


def test_a_reply_of_exactly_the_heavy_size_is_metered():
    budget = ReplyBudget(burst=HEAVY_BYTES, rate=0, total_burst=10 * MiB, total_rate=0)
    assert budget.allow(b"p", HEAVY_BYTES, now=0)
    assert not budget.allow(b"p", HEAVY_BYTES, now=0)
    assert budget.allow(b"p", HEAVY_BYTES - 1, now=0)  # one byte less: not metered


def test_refill_counts_only_the_time_since_the_last_charge():
    budget = ReplyBudget(burst=8 * MiB, rate=MiB, total_burst=100 * MiB, total_rate=100 * MiB)
    assert budget.allow(b"p", 8 * MiB, now=10_000)  # first seen at 10 s: a full burst
    assert not budget.allow(b"p", 2 * MiB, now=11_000)  # 1 s later: 1 MiB back, not 11
    assert budget.allow(b"p", 2 * MiB, now=12_000)


def test_with_every_peer_in_debt_the_oldest_half_is_forgotten():
    budget = ReplyBudget(burst=MiB, rate=0, total_burst=1 << 40, total_rate=0, max_peers=10)
    for i in range(10):
        assert budget.allow(f"p{i}".encode(), MiB, now=i)
    assert budget.allow(b"new", MiB, now=20)
    assert sorted(budget._peers) == sorted([f"p{i}".encode() for i in range(5, 10)] + [b"new"])


def test_peers_whose_bucket_refilled_are_forgotten_before_any_in_debt():
    budget = ReplyBudget(burst=MiB, rate=HEAVY_BYTES, total_burst=1 << 40, total_rate=0,
                         max_peers=2)
    assert budget.allow(b"debtor", MiB, now=0)  # 16 s to refill
    assert budget.allow(b"light", HEAVY_BYTES, now=1)  # full again 1 s later
    assert budget.allow(b"newcomer", HEAVY_BYTES, now=2_500)
    assert sorted(budget._peers) == [b"debtor", b"newcomer"]


def test_by_default_a_hundred_thousand_peers_are_kept():
    budget = ReplyBudget(burst=MiB, rate=0, total_burst=1 << 40, total_rate=0, heavy_bytes=1)
    for i in range(100_000):
        assert budget.allow(i.to_bytes(4, "big"), MiB, now=0)  # each one now in debt
    assert not budget.allow((0).to_bytes(4, "big"), MiB, now=0)  # still remembered
    assert budget.allow(b"one more", MiB, now=0)  # the bound: the oldest half forgotten
    assert budget.allow((0).to_bytes(4, "big"), MiB, now=0)  # a fresh burst
    assert not budget.allow((99_999).to_bytes(4, "big"), MiB, now=0)


def test_the_total_bucket_refills_from_time_zero():
    budget = ReplyBudget(burst=MiB, rate=MiB, total_burst=1000, total_rate=1000, heavy_bytes=1)
    assert budget.allow(b"a", 1000, now=0)  # the total drained
    assert not budget.allow(b"b", 1, now=0)
    assert budget.allow(b"b", 1, now=1)  # 1 ms at 1000 B/s: one byte back
    assert not budget.allow(b"b", 1, now=1)

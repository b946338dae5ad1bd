"""Producer/consumer views and queue selection (RocketMQ's client rules), no sockets."""

import pytest
from hypothesis import given, strategies as st

from zns.core.errors import NoWritableQueue

from zns.core.queues import (
    LATENCY_MAX_MS,
    NOT_AVAILABLE_MS,
    LatencyFaults,
    MessageQueue,
    QueueSelector,
    not_available_ms,
    read_queues,
    write_queues,
)
from zns.core.schema import BrokerData, QueueData, TopicRoute


def make_route(order_conf: str = "") -> TopicRoute:
    return TopicRoute(
        topic="T",
        queues=[
            QueueData(broker_name="a", read_queues=2, write_queues=3, perm=6, sys_flag=0),
            QueueData(broker_name="b", read_queues=1, write_queues=1, perm=4, sys_flag=0),  # read only
            QueueData(broker_name="c", read_queues=1, write_queues=2, perm=6, sys_flag=0),  # no master
        ],
        brokers=[
            BrokerData(cluster="x", broker_name="a", addrs={0: "h:1"}),
            BrokerData(cluster="x", broker_name="b", addrs={0: "h:2"}),
            BrokerData(cluster="x", broker_name="c", addrs={1: "h:3"}),
        ],
        filter_servers={},
        order_conf=order_conf,
    )


def test_write_queues_need_write_perm_and_a_master():
    assert write_queues(make_route()) == [MessageQueue("T", "a", i) for i in range(3)]


def test_read_queues_of_every_readable_broker():
    assert read_queues(make_route()) == [
        MessageQueue("T", "a", 0), MessageQueue("T", "a", 1), MessageQueue("T", "b", 0),
        MessageQueue("T", "c", 0),
    ]


def test_ordered_topic_uses_order_conf():
    queues = write_queues(make_route("b:2;c:1"))
    assert queues == [MessageQueue("T", "b", 0), MessageQueue("T", "b", 1), MessageQueue("T", "c", 0)]


def test_round_robin_and_avoid_broker():
    sel = QueueSelector()
    queues = [MessageQueue("T", "a", 0), MessageQueue("T", "b", 0), MessageQueue("T", "a", 1)]
    assert [sel.select_queue("T", queues, 0) for _ in range(4)] == queues + queues[:1]
    picks = [sel.select_queue("T", queues, 0, avoid_broker="a") for _ in range(5)]
    assert {q.broker_name for q in picks} == {"b"}
    only_a = [MessageQueue("T", "a", 0)]
    assert sel.select_queue("T", only_a, 0, avoid_broker="a") == only_a[0]  # nothing else


def test_latency_thresholds_match_mqfaultstrategy():
    assert [not_available_ms(ms) for ms in (0, 49, 50, 99, 100, 549)] == [0] * 6
    assert [not_available_ms(ms) for ms in LATENCY_MAX_MS] == list(NOT_AVAILABLE_MS)
    assert not_available_ms(1799) == 2000
    assert not_available_ms(10**6) == 30000


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=2, max_size=20))
def test_isolation_never_shrinks_with_latency(latencies):
    durations = [not_available_ms(x) for x in sorted(latencies)]
    assert durations == sorted(durations)


def test_fault_avoidance_isolates_then_releases():
    now = 100_000
    sel = QueueSelector(fault_tolerance=True)
    queues = [MessageQueue("T", "a", 0), MessageQueue("T", "b", 0)]
    sel.report("a", 600, now)  # >= 550 ms: avoid for 2 s
    assert {sel.select_queue("T", queues, now).broker_name for _ in range(4)} == {"b"}
    now += 2_000
    assert {sel.select_queue("T", queues, now).broker_name for _ in range(4)} == {"a", "b"}
    sel.report("b", 0, now, failed=True)  # a failed send: 30 s
    faults: LatencyFaults = sel.faults
    assert not faults.is_available("b", now)
    now += 29_900
    assert not faults.is_available("b", now)
    now += 200
    assert faults.is_available("b", now)


def test_fault_avoidance_still_honours_avoid_broker():
    sel = QueueSelector(fault_tolerance=True)
    queues = [MessageQueue("T", "a", 0), MessageQueue("T", "b", 0), MessageQueue("T", "a", 1)]
    picks = [sel.select_queue("T", queues, 0, avoid_broker="a") for _ in range(6)]
    assert {q.broker_name for q in picks} == {"b"}
    sel.report("b", 600, 0)  # b isolated too: still not the broker a send just failed on
    picks = [sel.select_queue("T", queues, 0, avoid_broker="a") for _ in range(6)]
    assert {q.broker_name for q in picks} == {"b"}


def test_all_brokers_isolated_picks_the_least_bad_one():
    """pickOneAtLeast: rank the isolated brokers (lowest latency first, then the earliest
    release) and take turns among the better half; one of two: always the best."""
    sel = QueueSelector(fault_tolerance=True)
    queues = [MessageQueue("T", n, i) for n in "abcd" for i in range(2)]
    sel.report("a", 0, 0, failed=True)  # 30 s, the worst
    sel.report("b", 600, 0)  # 2 s
    sel.report("c", 4_000, 0)  # 6 s
    picks = [sel.select_queue("T", queues[:6], 10) for _ in range(6)]
    assert {q.broker_name for q in picks} == {"b"}  # half of 3 is 1: the best only
    assert {q.queue_id for q in picks} == {0, 1}  # and still round-robin over its queues
    sel.report("d", 3_000, 0)  # 6 s, below c's latency
    picks = [sel.select_queue("T", queues, 10) for _ in range(8)]
    assert {q.broker_name for q in picks} == {"b", "d"}  # turns among the better half
    assert sel.select_queue("T", queues, 2_000).broker_name == "b"  # b is available again


# --- found by mutation testing (tools/mutate.py) ---------------------------------------------

def test_a_write_only_queue_is_not_read():
    route = make_route()
    route.queues.append(QueueData(broker_name="d", read_queues=4, write_queues=4, perm=2, sys_flag=0))
    assert "d" not in {q.broker_name for q in read_queues(route)}


def test_malformed_order_conf_entries_are_skipped():
    queues = write_queues(make_route(order_conf=":3; a:1;x:1:2;b:;c:two"))
    assert queues == [MessageQueue("T", "a", 0)]


def test_least_bad_prefers_available_then_unknown_ties_keep_their_order():
    faults = LatencyFaults()
    faults.report("isolated", 600, now=0)  # avoided until 2000
    faults.report("recovered", 3000, now=-100_000)  # slow once, long released
    faults.report("fast", 0, now=0)  # known, latency 0, never avoided
    # An available broker ranks before an avoided one, however slow it was.
    assert faults.least_bad(["isolated", "recovered"], now=0, turn=0) == "recovered"
    # A broker never reported ranks as latency 0, released at 0: tied with "fast".
    assert faults.least_bad(["unknown", "fast"], now=0, turn=0) == "unknown"
    assert faults.least_bad(["fast", "unknown"], now=0, turn=0) == "fast"


def test_a_report_is_a_success_unless_told_failed():
    faults = LatencyFaults()
    faults.report("a", 10, now=0)
    assert faults.is_available("a", now=0)
    selector = QueueSelector(fault_tolerance=True)
    selector.report("a", 10, now=0)
    assert selector.faults is not None and selector.faults.is_available("a", now=0)


def test_fault_avoidance_is_off_by_default():
    selector = QueueSelector()
    assert selector.faults is None
    queues = [MessageQueue("T", "a", 0), MessageQueue("T", "b", 0)]
    selector.report("a", 0, now=0, failed=True)
    assert [selector.select_queue("T", queues, now=0) for _ in range(2)] == queues


def test_avoiding_a_broker_takes_the_next_queue_in_round_robin_order():
    selector = QueueSelector()
    queues = [MessageQueue("T", "a", 0), MessageQueue("T", "b", 0), MessageQueue("T", "c", 0)]
    assert selector.select_queue("T", queues, now=0, avoid_broker="a") == queues[1]


def test_each_topic_has_its_own_round_robin():
    selector = QueueSelector()
    t1 = [MessageQueue("T1", "a", 0), MessageQueue("T1", "a", 1)]
    t2 = [MessageQueue("T2", "a", 0), MessageQueue("T2", "a", 1)]
    assert selector.select_queue("T1", t1, now=0) == t1[0]
    assert selector.select_queue("T2", t2, now=0) == t2[0]
    assert selector.select_queue("T1", t1, now=0) == t1[1]


def test_no_queue_says_which_topic():
    with pytest.raises(NoWritableQueue, match="topic 'T' has no writable queue"):
        QueueSelector().select_queue("T", [], now=0)

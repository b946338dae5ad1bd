"""The iteration orders of Java's HashMap, HashSet and ConcurrentHashMap (zns.core.remoting.javaorder).

The fixed vectors were printed by OpenJDK 17 (tests/interop/java/JavaOrder.java); with a
JDK on PATH, `test_orders_match_a_jvm` also compares a few hundred random key sets,
sizes and table capacities (including ConcurrentHashMap resizes, where nodes are
reordered) against a real JVM.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from zns.core.remoting.javaorder import (
    BROKER_TABLE,
    CLUSTER_TABLE,
    TOPIC_TABLE,
    chm_order,
    hashmap_capacity,
    hashmap_order,
    hashset_copy_order,
    route_in_java_order,
    spread,
    table_size_for,
)

pytestmark = pytest.mark.timeout(120)
JAVA_SOURCE = Path(__file__).resolve().parent / "interop" / "java" / "JavaOrder.java"


def test_fixed_vectors_printed_by_a_jvm():
    topics = ["TopicTest", "TBW102", "SELF_TEST_TOPIC", "DefaultCluster", "broker-a",
              "RMQ_SYS_TRACE_TOPIC", "%RETRY%cg1"]
    assert chm_order(topics, TOPIC_TABLE) == [
        "TopicTest", "SELF_TEST_TOPIC", "%RETRY%cg1", "DefaultCluster", "broker-a",
        "RMQ_SYS_TRACE_TOPIC", "TBW102"]
    # 20 keys into a fresh ConcurrentHashMap key set: resized at 12, nodes reordered.
    assert chm_order([f"t{i}" for i in range(20)]) == (
        "t4 t5 t6 t7 t8 t9 t10 t12 t11 t14 t13 t16 t15 t18 t17 t0 t1 t19 t2 t3".split())
    assert hashmap_order(["broker-a", "broker-b", "broker-c", "broker-d"]) == [
        "broker-d", "broker-b", "broker-c", "broker-a"]
    # new HashSet<>(12 keys) sizes itself to 32 buckets, not 16.
    names = [f"broker-{c}" for c in "abcdefghijkl"]
    assert hashset_copy_order(names) == (
        "broker-j broker-k broker-h broker-i broker-f broker-g broker-d broker-e broker-l "
        "broker-b broker-c broker-a").split()
    assert chm_order(["broker-a", "broker-b", "broker-c"], BROKER_TABLE) == ["broker-b", "broker-c", "broker-a"]
    assert chm_order(["DefaultCluster", "c1", "c2"], CLUSTER_TABLE) == ["c1", "DefaultCluster", "c2"]


def test_five_thousand_topics_through_two_tables_as_a_jvm_orders_them():
    # GET_ALL_TOPIC_LIST: topicQueueTable (1,024 -> 2,048 buckets, resized twice), then
    # a fresh key set (16 buckets, resized nine times). Printed by OpenJDK 17's
    # JavaOrder.java (chm 1024, then chmkeyset of its output); the digest of the whole order.
    topics = [f"FloodTopic{i:05d}" for i in range(5000)]
    order = chm_order(chm_order(topics, TOPIC_TABLE))
    assert order[:5] == ["FloodTopic03377", "FloodTopic02046", "FloodTopic02045",
                         "FloodTopic03376", "FloodTopic02044"]
    assert hashlib.sha256(" ".join(order).encode()).hexdigest()[:16] == "1d27dc16fe63eac0"


def test_long_keys_and_repeats():
    assert hashmap_order([0, 1, 16, 17]) == [0, 16, 1, 17]  # Long.hashCode: bucket id & 15
    assert hashmap_order([2, 1, 0]) == [0, 1, 2]
    assert spread(-1) == 0  # Long.hashCode(-1) = (int)(-1 ^ (-1 >>> 32)) = 0
    assert chm_order(["a", "b", "a"]) == chm_order(["a", "b"])  # a repeated put moves nothing


def _jvm() -> Path | None:
    return None if shutil.which("java") is None or shutil.which("javac") is None else JAVA_SOURCE


@pytest.mark.interop
def test_orders_match_a_jvm(tmp_path: Path):
    if _jvm() is None:
        pytest.skip("no JDK/Maven: java or javac not found on PATH")
    subprocess.run(["javac", "-d", str(tmp_path), str(JAVA_SOURCE)], check=True, timeout=120)
    rng = random.Random(19)
    cases = []
    for _ in range(300):
        n = rng.choice([1, 2, 5, 11, 12, 13, 25, 48, 49, 100, 193, 400, 1536, 1600])
        prefix = rng.choice(["T", "s3xT", "%RETRY%g", "broker-", "c", "\u00e9t"])
        keys = list(dict.fromkeys(f"{prefix}{rng.randrange(10**6)}" for _ in range(n)))
        kind = rng.choice(["chm", "chmkeyset", "hm", "hscopy"])
        initial = rng.choice([1024, 128, 32]) if kind == "chm" else 16
        cases.append((kind, initial, keys))
    text = "".join(f"{k} {i} {' '.join(keys)}\n" for k, i, keys in cases)
    out = subprocess.run(["java", "-Dfile.encoding=UTF-8", "-cp", str(tmp_path), "JavaOrder"], input=text,
                         capture_output=True, text=True, encoding="utf-8", timeout=120, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == len(cases)
    tables = {1024: TOPIC_TABLE, 128: BROKER_TABLE, 32: CLUSTER_TABLE}
    for (kind, initial, keys), line in zip(cases, lines):
        ours = {"chm": lambda: chm_order(keys, tables[initial]), "chmkeyset": lambda: chm_order(keys),
                "hm": lambda: hashmap_order(keys), "hscopy": lambda: hashset_copy_order(keys)}[kind]()
        assert ours == line.split(" "), (kind, initial, len(keys))


# --- found by mutation testing (tools/mutate.py) ---------------------------------------------


def test_table_sizes_and_capacities_as_java_computes_them():
    assert [table_size_for(n) for n in (0, 1, 2, 3, 16, 17)] == [1, 1, 2, 4, 16, 32]
    assert [hashmap_capacity(n) for n in (0, 12, 13, 24, 25)] == [16, 16, 32, 32, 64]
    assert hashmap_capacity(3, initial=4) == 4 and hashmap_capacity(4, initial=4) == 8


def test_a_routes_filter_servers_take_the_order_of_a_hashmap_filled_broker_by_broker():
    from zns.core.schema import BrokerData, QueueData, TopicRoute

    addrs = ["10.0.0.1:10911", "10.0.0.2:10911"]
    assert hashmap_order(addrs) == addrs  # so the route's own order below is not Java's
    route = TopicRoute(
        topic="T", queues=[QueueData("broker-a", 4, 4, 6, 0)],
        brokers=[BrokerData(cluster="c", broker_name="broker-a", addrs={0: addrs[0], 1: addrs[1]})],
        filter_servers={addrs[1]: ["10.0.0.2:30000"], addrs[0]: ["10.0.0.1:30000"]}, order_conf="")
    ordered = route_in_java_order(route, ["broker-a"])
    assert list(ordered.filter_servers) == addrs
    assert ordered.filter_servers == route.filter_servers


def test_spread_of_strings_and_longs_computed_then_cached():
    from zns.core.remoting import javaorder

    javaorder._spread_cache.clear()  # computed here, not read from what earlier tests cached
    strings = ("TopicTest", "broker-a", "a")  # String.hashCode 0x8e987641, 0x1636eb6d, 0x61
    assert [spread(k) for k in strings] == [0x0E98F8D9, 0x1636FD5B, 0x61]
    assert [spread(k) for k in strings] == [0x0E98F8D9, 0x1636FD5B, 0x61]  # from the cache
    # Long.hashCode folds the high half in; then h ^ (h >>> 16), 31 bits kept.
    assert [spread(k) for k in (0x12345678, 1 << 32, 0xFFFF0000)] == [0x1234444C, 1, 0x7FFFFFFF]

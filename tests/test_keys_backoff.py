"""The CURVE key policy's refusals, word for word, and the backoff's defaults (no sockets)."""

from __future__ import annotations

import random

import pytest

from zns.core import schema
from zns.core.backoff import Backoff
from zns.core.errors import NoPermission
from zns.core.keys import KeyPolicy

POLICY = KeyPolicy(brokers={"B": None, "BA": frozenset({"b", "a"})}, admins=frozenset({"A"}),
                   clients=frozenset({"C"}), clients_any=False)


def request(op: str, **fields: object) -> schema.AnyRequest:
    return schema.decode_request(schema.encode({"op": op, **fields}))


REGISTER = dict(cluster="c", broker_name="x", broker_id=0, broker_addr="h:1")


@pytest.mark.parametrize("key, req, message", [
    (None, request("status"), "status needs an authenticated CURVE key"),
    ("A", request("heartbeat", **REGISTER),
     "heartbeat is a broker op and this key is not a broker key"),
    ("BA", request("register_broker", **REGISTER),
     "this broker key may act only for a, b, not 'x'"),
    ("B", request("kv_put", namespace="n", key="k", value="v"),
     "kv_put is an admin op and this key is not an admin key"),
    ("gone", request("get_route", topic="T"), "get_route: this key is no longer listed"),
])
def test_each_refusal_says_why(key, req, message):
    with pytest.raises(NoPermission) as err:
        POLICY.check(key, req)
    assert str(err.value) == message


def test_the_backoff_starts_at_100_ms_doubles_and_stops_at_10_s():
    rng = random.Random(7)
    backoff = Backoff(rng=rng)
    mirror = random.Random(7)
    expected = [min(10.0, 0.1 * 2 ** i) * mirror.uniform(0.5, 1.0) for i in range(12)]
    assert [backoff.next_delay() for _ in range(12)] == expected
    backoff.reset()
    assert backoff.next_delay() == 0.1 * mirror.uniform(0.5, 1.0)


def test_without_an_injected_source_the_backoff_still_jitters():
    delays = {Backoff().next_delay() for _ in range(20)}
    assert len(delays) > 1 and all(0.05 <= d <= 0.1 for d in delays)


def test_without_a_cap_the_exponent_stops_at_32_doublings():
    # The exponent is bounded so an endless run of failures never overflows a float.
    rng, mirror = random.Random(3), random.Random(3)
    backoff = Backoff(base=1.0, cap=float("inf"), rng=rng)
    delays = [backoff.next_delay() for _ in range(36)]
    assert delays == [2.0 ** min(i, 32) * mirror.uniform(0.5, 1.0) for i in range(36)]

"""RouteCache (zns.core.route_cache) rule by rule: defaults, lookups, pulls, events, timers.

The model-based property test and the scenario tests live in tests/test_client.py; these
pin down the single rules exactly. Socket-free; `now` is handed in.
"""

from __future__ import annotations

import logging

from zns.core.route_cache import RouteCache
from zns.core.schema import BrokerData, BrokerEvent, HbEvent, QueueData, RouteEvent, TopicRoute

E1, E2 = "1" * 16, "2" * 16


def route(n: int, topic: str = "A", zone: str = "") -> TopicRoute:
    return TopicRoute(topic=topic, queues=[QueueData(broker_name="b", read_queues=n, write_queues=1,
                                                     perm=6, sys_flag=0)],
                      brokers=[BrokerData(cluster="c", broker_name="b", addrs={0: "h:1"}, zone=zone)],
                      filter_servers={})


def event(revision: int, prev: int, topic: str = "A", epoch: str = E1,
          new: TopicRoute | None = ...) -> RouteEvent:
    return RouteEvent(epoch=epoch, revision=revision, prev=prev, topic=topic,
                      route=route(revision, topic) if new is ... else new)


def hb(epoch: str = E1) -> HbEvent:
    return HbEvent(epoch=epoch, revision=0, time_ms=0)


def pulled(topics: dict[str, int], epoch: str = E1, now: int = 0, **kw) -> RouteCache:
    """A cache whose topics were pulled once (revision n, route(n)); not yet proven."""
    cache = RouteCache(**kw)
    for topic in topics:
        cache.track(topic)
    assert cache.take_stale() == list(topics)
    cache.apply_pull(epoch, {t: route(n, t) for t, n in topics.items()}, dict(topics), now)
    return cache


def proven(topics: dict[str, int], epoch: str = E1, now: int = 0, **kw) -> RouteCache:
    """As `pulled`, then an `hb` proved the subscriptions and the confirming pull came back."""
    cache = pulled(topics, epoch, now, **kw)
    cache.apply_event(hb(epoch))
    assert cache.take_stale() == list(topics)
    cache.apply_pull(epoch, {t: route(n, t) for t, n in topics.items()}, dict(topics), now)
    assert cache.take_stale() == []
    return cache


def test_lookups_of_unknown_tracked_and_pulled_topics():
    cache = RouteCache()
    assert not cache.known("A") and cache.view("A") is None and cache.revision("A") == -1
    assert not cache.is_current("A")
    assert cache.track("A") and not cache.track("A")
    assert not cache.known("A") and cache.view("A") is None and cache.revision("A") == -1
    cache.take_stale()
    cache.apply_pull(E1, {"A": route(3)}, {"A": 3}, 0)
    assert cache.known("A") and cache.view("A") == route(3) and cache.revision("A") == 3
    assert cache.is_current("A")


def test_tracking_a_kept_topic_keeps_what_it_holds():
    cache = pulled({"A": 3})
    assert not cache.track("A")
    assert cache.view("A") == route(3) and cache.revision("A") == 3 and cache.is_current("A")
    assert cache.take_stale() == []


def test_the_default_cache_has_no_zone_and_pulls_every_30_seconds():
    cache = pulled({"A": 1}, now=1_000)
    zoned = route(1, zone="z9")
    cache.apply_event(event(2, 1, new=zoned))
    assert cache.view("A") == zoned  # no zone: every broker is seen
    assert cache.next_deadline() == 31_000


def test_a_pull_answer_sets_the_periodic_pull_once():
    cache = pulled({"A": 1}, now=1_000, pull_period_ms=500)
    cache.track("B")
    cache.take_stale()
    cache.apply_pull(E1, {}, {"B": 0}, 1_200)
    assert cache.next_deadline() == 1_500  # a later answer does not postpone it
    cache.on_timer(1_499)
    assert cache.take_stale() == [] and cache.next_deadline() == 1_500
    cache.on_timer(1_500)
    assert cache.next_deadline() == 2_000
    assert cache.take_stale() == ["A", "B"]


def test_the_periodic_timer_does_nothing_before_the_first_pull_answer():
    cache = RouteCache(pull_period_ms=500)
    cache.track("A")
    assert cache.next_deadline() is None
    cache.on_timer(10**9)
    assert cache.next_deadline() is None


def test_the_periodic_pull_leaves_a_pull_in_flight_alone():
    cache = pulled({"A": 1, "B": 1}, pull_period_ms=500)
    cache.apply_event(event(3, 2, topic="B"))  # a gap: B is pulled
    assert cache.take_stale() == ["B"]
    cache.on_timer(500)
    assert cache.take_stale() == ["A"]  # B is still in flight, not asked twice
    cache.apply_pull(E1, {"B": route(3, "B")}, {"B": 3}, 600)
    assert cache.is_current("B") and cache.take_stale() == []


def test_a_pull_answer_for_a_topic_not_in_flight_is_ignored():
    cache = pulled({"A": 1, "B": 1})
    cache.apply_event(event(3, 2))  # A is stale now, B current
    assert cache.apply_pull(E1, {"A": route(9), "B": route(9, "B")}, {"A": 9, "B": 9}, 0) == []
    assert cache.revision("A") == 1 and cache.revision("B") == 1
    assert cache.view("B") == route(1, "B")
    assert cache.apply_pull(E1, {"C": route(1, "C")}, {"C": 1}, 0) == []  # never tracked
    assert cache.topics() == ["A", "B"]


def test_a_pulled_topic_without_a_route_is_known_as_none():
    cache = pulled({"A": 2})
    cache.apply_event(event(4, 3))  # gap
    cache.take_stale()
    assert cache.apply_pull(E1, {}, {"A": 5}, 0) == [("A", None)]
    assert cache.known("A") and cache.view("A") is None and cache.revision("A") == 5


def test_a_first_answer_is_a_change_even_without_a_route_and_a_same_answer_is_not():
    cache = RouteCache()
    cache.track("A")
    cache.take_stale()
    assert cache.apply_pull(E1, {}, {"A": 0}, 0) == [("A", None)]
    cache.apply_event(hb())
    cache.take_stale()
    assert cache.apply_pull(E1, {}, {"A": 0}, 0) == []


def test_events_buffered_during_a_pull_apply_in_revision_order_after_it():
    cache = pulled({"A": 1})
    cache.apply_event(event(3, 2))  # gap
    cache.take_stale()
    assert cache.apply_event(event(5, 4)) == []  # buffered while the pull is in flight
    assert cache.apply_event(event(4, 3)) == []
    assert cache.view("A") == route(1)
    assert cache.apply_pull(E1, {"A": route(3)}, {"A": 3}, 0) == [("A", route(5))]
    assert cache.revision("A") == 5 and cache.is_current("A") and cache.take_stale() == []


def test_buffered_events_of_another_epoch_are_dropped_when_the_pull_answers():
    cache = pulled({"A": 1})
    cache.apply_event(event(3, 2))
    cache.take_stale()
    cache.apply_event(hb(E2))  # a new epoch: the cache waits for the pull to say which
    cache.apply_event(event(2, 1, epoch=E2))  # buffered (the pull is still in flight)
    cache.apply_pull(E1, {"A": route(1)}, {"A": 1}, 0)  # answered by the old server
    assert cache.revision("A") == 1 and cache.view("A") == route(1)


def test_an_event_gap_is_logged_and_pulled(caplog):
    cache = pulled({"A": 1})
    with caplog.at_level(logging.DEBUG, logger="zns.client"):
        assert cache.apply_event(event(4, 3)) == []
    assert caplog.messages == ["gap on A: event prev 3, have 1: pulling again"]
    assert cache.revision("A") == 1 and cache.take_stale() == ["A"]


def test_an_event_at_the_held_revision_with_another_prev_is_not_a_gap():
    cache = pulled({"A": 2})
    assert cache.apply_event(event(2, 0)) == []
    assert cache.is_current("A") and cache.take_stale() == []
    assert cache.apply_event(event(3, 2)) == [("A", route(3))]


def test_broker_events_and_events_of_untracked_topics_change_nothing():
    cache = pulled({"A": 1})
    broker = BrokerEvent(epoch=E1, revision=2, cluster="c", broker_name="b", broker_id=0,
                         broker_addr="h:1", change="removed")
    assert cache.apply_event(broker) == []
    assert cache.apply_event(event(2, 1, topic="Z")) == []
    assert cache.is_current("A") and cache.take_stale() == [] and cache.topics() == ["A"]


def test_an_event_for_a_stale_topic_waits_for_the_pull():
    cache = pulled({"A": 1})
    cache.apply_event(event(3, 2))  # gap: stale, not yet taken
    assert cache.apply_event(event(4, 3)) == []
    assert cache.revision("A") == 1 and cache.view("A") == route(1)


def test_a_route_event_of_a_new_epoch_loses_the_proof_and_an_hb_keeps_it(caplog):
    by_hb = proven({"A": 1})
    with caplog.at_level(logging.INFO, logger="zns.client"):
        assert by_hb.apply_event(hb(E2)) == []
    assert caplog.messages == [f"event from a new NameServer epoch {E2}: pulling every topic again"]
    assert by_hb.epoch is None and by_hb.take_stale() == ["A"]
    by_hb.apply_pull(E2, {"A": route(1)}, {"A": 1}, 0)
    by_hb.apply_event(hb(E2))
    assert by_hb.take_stale() == []  # that hb came through the subscription: still proven

    by_route = proven({"A": 1})
    assert by_route.apply_event(event(1, 0, epoch=E2)) == []
    assert by_route.epoch is None and by_route.take_stale() == ["A"]
    by_route.apply_pull(E2, {"A": route(1)}, {"A": 1}, 0)
    by_route.apply_event(hb(E2))
    assert by_route.take_stale() == ["A"]  # not proven through the new publisher yet


def test_a_new_epoch_in_a_pull_answer_repulls_the_rest_and_loses_the_proof(caplog):
    cache = proven({"A": 1, "B": 1, "C": 1})
    cache.apply_event(event(3, 2))  # A: gap
    cache.apply_event(event(3, 2, topic="B"))  # B: gap
    assert cache.take_stale() == ["A", "B"]
    with caplog.at_level(logging.INFO, logger="zns.client"):
        cache.apply_pull(E2, {"A": route(1)}, {"A": 1}, 0)  # B is still in flight
    assert caplog.messages == [f"NameServer epoch changed ({E1} -> {E2}): pulling every topic again"]
    assert cache.epoch == E2 and cache.is_current("A")
    assert cache.take_stale() == ["C"]  # B is asked again only once its pull answers
    cache.apply_pull(E2, {"B": route(1, "B")}, {"B": 1}, 0)
    assert cache.take_stale() == ["B"]
    cache.apply_pull(E2, {"B": route(1, "B")}, {"B": 1}, 0)
    cache.apply_pull(E2, {"C": route(1, "C")}, {"C": 1}, 0)
    assert cache.take_stale() == []
    cache.apply_event(hb(E2))  # the first hb of the new publisher proves every topic
    assert cache.take_stale() == ["A", "B", "C"]


def test_the_first_pull_answer_sets_the_epoch_without_a_restart(caplog):
    cache = RouteCache()
    cache.track("A")
    cache.track("B")
    cache.take_stale()
    with caplog.at_level(logging.INFO, logger="zns.client"):
        cache.apply_pull(E1, {}, {"A": 0}, 0)
    assert cache.epoch == E1 and "epoch changed" not in caplog.text
    assert cache.take_stale() == []  # B is still in flight


def test_an_hb_proves_each_topic_once():
    cache = proven({"A": 1})
    cache.apply_event(hb())
    assert cache.take_stale() == []


def test_reset_repulls_everything_and_forgets_proof_pull_again_and_buffers():
    cache = proven({"A": 1, "B": 1})
    cache.apply_event(event(3, 2))  # A: gap
    assert cache.take_stale() == ["A"]
    cache.on_timer(10**9)
    assert cache.take_stale() == ["B"]
    cache.apply_event(hb(E2))  # both in flight: both to be asked again after their answers
    cache.apply_event(event(4, 3))  # buffered for A
    cache.reset()
    assert cache.epoch is None
    assert cache.view("A") == route(1) and cache.known("A")  # still readable meanwhile
    assert cache.take_stale() == ["A", "B"]
    cache.apply_pull(E1, {"A": route(3)}, {"A": 3}, 0)
    assert cache.revision("A") == 3  # the buffered event was dropped
    cache.apply_pull(E1, {"B": route(1, "B")}, {"B": 1}, 0)
    assert cache.take_stale() == []  # no pull-again left over from before the reset
    cache.apply_event(hb())
    assert cache.take_stale() == ["A", "B"]  # the new connection is proven only now


def test_subscription_lost_repulls_after_the_next_hb():
    cache = proven({"A": 1})
    cache.subscription_lost()
    assert cache.take_stale() == []
    cache.apply_event(hb())
    assert cache.take_stale() == ["A"]


def test_an_hb_proves_a_topic_tracked_after_the_others_were_proven():
    cache = proven({"A": 1})
    cache.track("B")
    assert cache.take_stale() == ["B"]
    cache.apply_event(hb())  # B's first hb arrives while its pull is in flight
    cache.apply_pull(E1, {}, {"B": 0}, 0)
    assert cache.take_stale() == ["B"]  # confirmed by a second pull
    assert cache.is_current("A")


def test_a_pull_answer_skips_the_topics_not_in_flight_and_applies_the_others():
    cache = pulled({"A": 1, "B": 1})
    cache.apply_event(event(3, 2, topic="B"))  # B: gap
    assert cache.take_stale() == ["B"]
    changes = cache.apply_pull(E1, {"A": route(9), "B": route(3, "B")}, {"A": 9, "B": 3}, 0)
    assert changes == [("B", route(3, "B"))]
    assert cache.revision("A") == 1 and cache.revision("B") == 3


def test_a_new_epoch_in_a_pull_answer_repulls_a_current_topic_it_also_names():
    cache = pulled({"A": 1, "B": 1})
    cache.apply_event(event(3, 2))  # A: gap
    assert cache.take_stale() == ["A"]
    cache.apply_pull(E2, {"A": route(1), "B": route(1, "B")}, {"A": 1, "B": 1}, 0)
    assert cache.is_current("A") and not cache.is_current("B")
    assert cache.take_stale() == ["B"]  # B's revision is of the dead epoch


def test_an_event_that_follows_on_a_stale_topic_waits_for_the_pull_too():
    cache = pulled({"A": 1}, pull_period_ms=500)
    cache.on_timer(500)  # the periodic pull makes A stale
    assert cache.apply_event(event(2, 1)) == []
    assert cache.revision("A") == 1 and cache.view("A") == route(1)
    assert cache.take_stale() == ["A"]


def test_a_pull_by_revision_keeps_what_is_unchanged_and_takes_what_changed():
    cache = proven({"A": 3, "B": 4})
    cache.on_timer(10**9)  # the periodic pull makes both stale
    assert cache.take_stale() == ["A", "B"]
    changes = cache.apply_pull(E1, {"B": route(7, "B")}, {"A": 3, "B": 7}, 10**9,
                               unchanged=["A"])
    assert changes == [("B", route(7, "B"))]
    assert cache.view("A") == route(3, "A") and cache.revision("A") == 3
    assert cache.is_current("A") and cache.is_current("B")
    # "unchanged" at another revision than the one held cannot be trusted: pulled again.
    cache.on_timer(2 * 10**9)
    assert cache.take_stale() == ["A", "B"]
    cache.apply_pull(E1, {}, {"A": 5, "B": 7}, 2 * 10**9, unchanged=["A", "B"])
    assert cache.take_stale() == ["A"] and cache.view("A") == route(3, "A")

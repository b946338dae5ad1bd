"""The client's route cache (PROTOCOL §7): which pushed events to apply, and
when a topic must be pulled again.

The rules, each with the reason it exists:

- Subscribe first, then pull: an event published after the pull is then
  either received or detectably missing.
- Apply an event only when its `prev` is the revision held; an event at or
  below the held revision is already in the cache (ignored, no pull); any
  other `prev` is a gap: pull the topic again.
- A subscription takes effect at the publisher some time after it is made,
  and only an `hb` received through it proves it did. A pull answered before
  that proof may have missed a change, so it is repeated once after it
  (`proven`, `pull_again`). A new NameServer epoch is a new publisher: the
  proof is gone with it.
- A new epoch, seen in a reply or an event, makes every topic stale:
  revisions of a dead epoch compare with nothing.
- A periodic pull repairs the last event of a burst lost at a high-water
  mark (nothing later shows the gap).

Times are integer milliseconds of a monotonic clock, handed in as `now`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from msgspec import Raw

from zns.core.routes import filter_zone
from zns.core.schema import BrokerEvent, HbEvent, RouteEvent, TopicRoute, decoded_route

log = logging.getLogger("zns.client")

Change = tuple[str, TopicRoute | None]  # a topic and its route as this client now sees it

STALE, PULLING, CURRENT = "stale", "pulling", "current"


@dataclass
class _Entry:
    revision: int = -1  # the topic's revision at the NameServer; -1: never pulled
    view: TopicRoute | None = None  # the route as this client sees it (zone-filtered)
    state: str = STALE
    buffered: list[RouteEvent] = field(default_factory=list)  # arrived while pulling
    # True once an `hb` arrived after the subscription: every later event reaches us.
    proven: bool = False
    pull_again: bool = False  # proven while a pull was in flight: confirm with a new pull

    @property
    def known(self) -> bool:
        return self.revision >= 0


class RouteCache:
    """The routes of the followed topics, kept right by pulls and pushed events (§7).

    `take_stale` hands the driver what to pull; `apply_pull` and
    `apply_event` feed answers and events back and return the changes a
    watcher should see.
    """

    def __init__(self, zone: str = "", pull_period_ms: int = 30_000) -> None:
        self.zone = zone
        self.pull_period_ms = pull_period_ms
        self.epoch: str | None = None
        self._entries: dict[str, _Entry] = {}
        self._next_periodic_pull: int | None = None

    # --- what the client asks -------------------------------------------

    def track(self, topic: str) -> bool:
        """Start keeping `topic`; True when it is new (subscribe to it, then pull)."""
        if topic in self._entries:
            return False
        self._entries[topic] = _Entry()
        return True

    def forget(self, topic: str) -> bool:
        """Stop keeping `topic`; True when it was kept (unsubscribe from it).

        A pull in flight for it is answered into nothing (`apply_pull` skips
        topics it does not keep).
        """
        return self._entries.pop(topic, None) is not None

    def topics(self) -> list[str]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def known(self, topic: str) -> bool:
        """Pulled at least once: `view` is an answer (None: the topic has no route)."""
        entry = self._entries.get(topic)
        return entry is not None and entry.known

    def view(self, topic: str) -> TopicRoute | None:
        entry = self._entries.get(topic)
        return entry.view if entry is not None else None

    def is_current(self, topic: str) -> bool:
        """Known and not waiting for a pull: its view is the route at `revision`."""
        entry = self._entries.get(topic)
        return entry is not None and entry.state == CURRENT

    def revision(self, topic: str) -> int:
        entry = self._entries.get(topic)
        return entry.revision if entry is not None else -1

    # --- pulls ------------------------------------------------------------

    def take_stale(self) -> list[str]:
        """Topics to pull now; they count as in flight until `apply_pull` or `reset`."""
        topics = [t for t, e in self._entries.items() if e.state == STALE]
        for topic in topics:
            self._entries[topic].state = PULLING
        return topics

    def apply_pull(
        self, epoch: str, routes: Mapping[str, TopicRoute | Raw], revisions: dict[str, int],
        now: int, unchanged: Collection[str] = (),
    ) -> list[Change]:
        """A `get_routes` answer: the pulled topics are now exactly as the NameServer said
        (those `unchanged` are still at the revision this cache held and sent)."""
        if self.epoch != epoch:
            if self.epoch is not None:
                # The reply is the first sign of a restarted NameServer: what the other
                # topics hold is from a dead epoch, and no `hb` has yet come through
                # the new publisher to prove the subscriptions.
                log.info("NameServer epoch changed (%s -> %s): pulling every topic again",
                         self.epoch, epoch)
                self._lose_proof()
                self._mark_all_stale(but=[t for t in revisions if self._pulling(t)])
            self.epoch = epoch
        changes: list[Change] = []
        unchanged = set(unchanged)
        for topic, revision in revisions.items():
            entry = self._entries.get(topic)
            if entry is None or entry.state != PULLING:
                continue
            was_known = entry.known
            old_view = entry.view
            if topic in unchanged and entry.revision != revision:
                entry.state = STALE  # not the revision sent: a bug elsewhere; pull it in full
                continue
            if topic not in unchanged:
                self._set_route(entry, routes.get(topic))
            entry.revision = revision
            entry.state = CURRENT
            buffered, entry.buffered = entry.buffered, []
            for event in sorted(buffered, key=lambda e: e.revision):
                self._apply_route_event(entry, event)
            if entry.pull_again:
                entry.pull_again = False
                entry.state = STALE
            if not was_known or entry.view != old_view:
                changes.append((topic, entry.view))
        if self._next_periodic_pull is None:
            self._next_periodic_pull = now + self.pull_period_ms
        return changes

    def reset(self) -> None:
        """The followed NameServer changed: pull everything again from the next one.

        Routes stay readable meanwhile (as RocketMQ serves its last known routes).
        """
        self.epoch = None
        for entry in self._entries.values():
            entry.state = STALE
            entry.buffered.clear()
            entry.proven = False
            entry.pull_again = False

    # --- events -------------------------------------------------------------

    def apply_event(self, event: RouteEvent | BrokerEvent | HbEvent) -> list[Change]:
        """A pushed event: the changes it makes visible (none while a pull decides)."""
        if self.epoch is not None and event.epoch != self.epoch:
            log.info("event from a new NameServer epoch %s: pulling every topic again", event.epoch)
            self.epoch = None  # the next pull's reply sets it
            self._mark_all_stale()
            if not isinstance(event, HbEvent):
                self._lose_proof()  # an `hb` came through every subscription; this, maybe one
            return []
        if isinstance(event, HbEvent):
            self._prove_subscriptions()
            return []
        if not isinstance(event, RouteEvent):
            return []
        entry = self._entries.get(event.topic)
        if entry is None:
            return []
        if entry.state == PULLING:
            entry.buffered.append(event)
            return []
        if entry.state == STALE or self.epoch is None:
            return []  # a pull is about to be sent; it will include this change
        old_view = entry.view
        self._apply_route_event(entry, event)
        return [(event.topic, entry.view)] if entry.view != old_view else []

    # --- timers -------------------------------------------------------------

    def next_deadline(self) -> int | None:
        return self._next_periodic_pull

    def on_timer(self, now: int) -> None:
        """The periodic pull (§7's safety net for events dropped at a high-water mark)."""
        if self._next_periodic_pull is not None and now >= self._next_periodic_pull:
            self._next_periodic_pull = now + self.pull_period_ms
            for entry in self._entries.values():
                if entry.state == CURRENT:
                    entry.state = STALE

    # --- internals ------------------------------------------------------------

    def _apply_route_event(self, entry: _Entry, event: RouteEvent) -> None:
        if event.epoch != self.epoch or event.revision <= entry.revision:
            return  # already held (or from another epoch): nothing to do, nothing to pull
        if event.prev != entry.revision:
            log.debug("gap on %s: event prev %d, have %d: pulling again",
                      event.topic, event.prev, entry.revision)
            entry.state = STALE
            return
        entry.revision = event.revision
        self._set_route(entry, event.route)

    def _set_route(self, entry: _Entry, received: TopicRoute | Raw | None) -> None:
        route = decoded_route(received)
        entry.view = filter_zone(route, self.zone) if route is not None and self.zone else route

    def _prove_subscriptions(self) -> None:
        for entry in self._entries.values():
            if entry.proven:
                continue
            entry.proven = True
            if entry.state == CURRENT:
                entry.state = STALE
            elif entry.state == PULLING:
                entry.pull_again = True

    def subscription_lost(self) -> None:
        """The events connection dropped (and will reconnect by itself): what was published
        meanwhile is lost, and no later event need show it. The next `hb` proves the new
        connection and every topic is pulled again then."""
        self._lose_proof()

    def _lose_proof(self) -> None:
        for entry in self._entries.values():
            entry.proven = False

    def _pulling(self, topic: str) -> bool:
        entry = self._entries.get(topic)
        return entry is not None and entry.state == PULLING

    def _mark_all_stale(self, but: list[str] | None = None) -> None:
        """Every topic (except `but`) is pulled again: now, or, when a pull of it is
        in flight, once that is answered (that answer may predate the change that
        made everything stale, and a second pull must not race it)."""
        for topic, entry in self._entries.items():
            if but and topic in but:
                continue
            if entry.state == PULLING:
                entry.pull_again = True
            else:
                entry.state = STALE
            entry.buffered.clear()

"""End-to-end smoke: one request of each kind over real sockets, and one event."""

from zns.core import schema
from helpers import register_fields


def test_register_then_route_and_event(server):
    peer = server.peer()
    peer.subscribe(b"route/TopicA\0", schema.HB_CHANNEL)
    peer.wait_subscribed()
    peer.ok("register_broker", **register_fields())
    _, event = peer.next_event(lambda ch, ev: ch == b"route/TopicA\0")
    reply = peer.ok("get_route", topic="TopicA")
    assert reply.route == event.route
    assert reply.revision == event.revision == 1
    assert event.prev == 0


def test_status_reports_pub_endpoint(server):
    reply = server.peer().ok("status")
    assert reply.pub_endpoint == server.pub
    assert len(reply.epoch) == 16

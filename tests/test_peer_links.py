"""The peer links' socket side (zns.drivers.peers.PeerLinks) in process, with a fake peer.

The decisions are PeerLink's (tests/test_peers_core.py); here the driver is run as the
loop runs it, `now` passed in by the test, against a peer made of a ROUTER (answering
`status`) and a PUB (its events), so no backoff or silence is waited for in real time.
Each step waits for a socket with a deadline (`pump`), never a fixed sleep.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import zmq

from zns.core import schema
from zns.core.errors import EndpointError
from zns.core.peer_link import RETRY_MAX_MS, RETRY_MIN_MS
from zns.drivers.loop import PollSet
from zns.drivers.peers import CLOCK_EVERY, PEER_MAX_MESSAGE_BYTES, PEER_RCVHWM, PeerLinks

pytestmark = pytest.mark.timeout(60)

ADDR = "10.0.0.1:10911"


class FakePeer:
    """A NameServer as far as a peer link can tell: answers `status`, publishes events."""

    def __init__(self, ctx: zmq.Context, pub_endpoint: str | None = None) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.pub = ctx.socket(zmq.XPUB)  # XPUB: the test sees when the link has subscribed
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.pub_endpoint = pub_endpoint or self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.epoch = "epoch-1"

    def answer(self, timeout: float = 20) -> schema.Status:
        """Answer the next `status` (waiting for it); returns the request."""
        assert self.router.poll(int(timeout * 1000)), "no status request came"
        identity, body = self.router.recv_multipart()
        request = schema.decode_request(body)
        assert isinstance(request, schema.Status)
        self.router.send_multipart([identity, schema.encode(schema.StatusReply(
            id=request.id, epoch=self.epoch, revision=0, version="0", uptime_ms=0, brokers=0,
            topics=0, pub_endpoint=self.pub_endpoint))])
        return request

    def pending(self) -> int:
        """`status` requests waiting unanswered (read and dropped)."""
        count = 0
        while self.router.poll(0):
            self.router.recv_multipart()
            count += 1
        return count

    def wait_subscribed(self, timeout: float = 20) -> set[bytes]:
        """Until the link's SUB has sent both its subscriptions; returns them."""
        topics: set[bytes] = set()
        deadline = time.monotonic() + timeout
        while len(topics) < 2:
            assert time.monotonic() < deadline, f"subscribed to {topics} only"
            if self.pub.poll(50):
                message = self.pub.recv()
                if message[:1] == b"\x01":
                    topics.add(message[1:])
        return topics

    def publish(self, event: schema.HbEvent | schema.BrokerEvent) -> None:
        self.pub.send_multipart([schema.event_channel(event), schema.encode(event)])

    def hb(self) -> schema.HbEvent:
        return schema.HbEvent(epoch=self.epoch, revision=0, time_ms=0)

    def removed(self, reason: str = "expired") -> schema.BrokerEvent:
        return schema.BrokerEvent(epoch=self.epoch, revision=0, cluster="c1", broker_name="b",
                                  broker_id=0, broker_addr=ADDR, change="removed", reason=reason)

    def close(self) -> None:
        self.router.close(0)
        self.pub.close(0)


@pytest.fixture
def peer(ctx: zmq.Context) -> Iterator[FakePeer]:
    fake = FakePeer(ctx)
    yield fake
    fake.close()


class Harness:
    """PeerLinks in a PollSet of its own, run the way the loop runs a source."""

    def __init__(self, ctx: zmq.Context, endpoints: list[str], **kw: int) -> None:
        self.suspected: list[tuple[str, str, int]] = []
        self.shorten = True
        self.connected: dict[str, bool] = {}
        self.clock = 0  # the loop's clock as the links read it (a slice's end: `until`)
        self.links = PeerLinks(endpoints, now=0, suspect=self._suspect, clock=lambda: self.clock,
                               connected=self.connected, context=ctx, **kw)
        self.poll = PollSet()
        self.links.attach(self.poll)

    def _suspect(self, cluster: str, addr: str, now: int) -> bool:
        self.suspected.append((cluster, addr, now))
        return self.shorten

    def run(self, now: int) -> None:
        """One pass with nothing ready: the timers only."""
        self.links.run({}, now, now + 5)

    def pump(self, now: int, done, timeout: float = 20) -> None:
        """Run passes at `now` with whatever the sockets have, until `done()`."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "condition not met"
            ready = dict(self.poll.poller.poll(50))
            if ready:
                assert set(ready) <= set(self.poll.owners), "a socket not registered"
                self.links.run(ready, now, now + 5)

    def sockets(self) -> list[zmq.Socket]:
        return list(self.poll.owners)


def link_up(h: Harness, peer: FakePeer, now: int = 0) -> None:
    """Ask, answer, subscribe, one hb: the link is connected."""
    h.run(now)
    peer.answer()
    h.pump(now, lambda: h.links.links[peer.endpoint].pub is not None)
    peer.wait_subscribed()
    peer.publish(peer.hb())
    h.pump(now, lambda: h.connected[peer.endpoint])


def test_a_link_asks_subscribes_and_applies_a_hint(ctx, peer, caplog):
    caplog.set_level(logging.INFO, logger="zns")
    h = Harness(ctx, [peer.endpoint])
    assert h.connected == {peer.endpoint: False}
    assert h.links.next_deadline(0) == 0  # the first status is due at once
    assert h.links.next_deadline(50) == 50  # and one overdue is due now, not in the past
    h.run(0)
    assert len(h.sockets()) == 1  # the DEALER, registered in the loop's poll set
    peer.answer()
    h.pump(0, lambda: h.links.links[peer.endpoint].pub == peer.pub_endpoint)
    # The silence clock starts with the subscription, before any hb.
    assert h.links.next_deadline(0) == h.links.links[peer.endpoint].silence_ms + 1
    # Answered: the DEALER is gone from the poll set, the SUB took its place.
    assert len(h.sockets()) == 1 and h.sockets()[0].type == zmq.SUB
    assert peer.wait_subscribed() == {schema.BROKER_PREFIX, schema.HB_CHANNEL}
    assert h.connected[peer.endpoint] is False  # subscribed, but no hb yet
    peer.publish(peer.hb())
    h.pump(0, lambda: h.connected[peer.endpoint])
    assert f"peer {peer.endpoint}: subscribed to its broker events on " \
           f"'{peer.pub_endpoint}'" in [r.getMessage() for r in caplog.records]
    with caplog.at_level(logging.INFO, logger="zns"):
        peer.publish(peer.removed("expired"))
        h.pump(7, lambda: h.suspected)
    assert h.suspected == [("c1", ADDR, 7)]
    assert f"peer hint from {peer.endpoint}: broker c1/b at {ADDR} expired there; " \
           "suspected here" in [r.getMessage() for r in caplog.records]
    h.shorten = False
    with caplog.at_level(logging.DEBUG, logger="zns"):
        peer.publish(peer.removed("unregistered"))
        h.pump(8, lambda: len(h.suspected) == 2)
    assert f"peer hint from {peer.endpoint}: broker c1/b at {ADDR} unregistered there; " \
           "nothing to shorten here" in [r.getMessage() for r in caplog.records]
    peer.publish(peer.removed("displaced"))  # not a hint reason
    peer.publish(peer.hb())
    h.pump(9, lambda: h.links.links[peer.endpoint]._last_heard == 9)
    assert len(h.suspected) == 2


def test_silence_disconnects_and_a_new_status_is_asked(ctx, peer):
    h = Harness(ctx, [peer.endpoint])
    link_up(h, peer)
    link = h.links.links[peer.endpoint]
    silent = link.next_deadline()
    assert silent is not None and h.links.next_deadline(0) == silent
    h.run(silent)  # the timer of the link runs: silence, asking again
    assert h.connected[peer.endpoint] is False
    assert h.links.next_deadline(silent) == silent + RETRY_MIN_MS  # the status asked again
    peer.answer()


def test_an_unanswered_status_is_asked_again_on_a_fresh_socket_with_backoff(ctx, peer):
    h = Harness(ctx, [peer.endpoint])
    h.run(0)
    first = h.sockets()
    assert peer.router.poll(20_000) and peer.pending() == 1
    h.run(RETRY_MIN_MS - 1)  # not due yet: nothing sent
    assert h.sockets() == first
    h.run(RETRY_MIN_MS)
    assert h.sockets() != first and len(h.sockets()) == 1  # the old DEALER closed, unregistered
    assert first[0].closed
    assert peer.router.poll(20_000) and peer.pending() == 1
    assert h.links.next_deadline(RETRY_MIN_MS) == 3 * RETRY_MIN_MS  # the wait doubled


def test_a_bad_events_endpoint_backs_off_and_keeps_no_socket(ctx, caplog):
    peer = FakePeer(ctx, pub_endpoint="tcp://127.0.0.1:not-a-port")
    try:
        h = Harness(ctx, [peer.endpoint])
        now = 0
        asked = []
        link = h.links.links[peer.endpoint]
        for failures in range(1, 7):
            asks = link._request_id
            while link._request_id == asks:  # the timers until the next status is asked
                h.run(now)
                now = link.next_deadline() if link._request_id == asks else now
            asked.append(now)
            peer.answer()
            with caplog.at_level(logging.WARNING, logger="zns"):
                h.pump(now, lambda: link._subscribe_failures == failures)
            assert link.asking and link.pub is None and not h.connected[peer.endpoint]
            assert all(s.type == zmq.DEALER for s in h.sockets())  # no SUB kept
            now = link.next_deadline()
        gaps = [b - a for a, b in zip(asked, asked[1:])]
        assert gaps == [min(RETRY_MIN_MS << n, RETRY_MAX_MS) for n in range(1, 6)]
        assert f"peer {peer.endpoint} named events endpoint 'tcp://127.0.0.1:not-a-port', " \
               "which cannot be connected to ('tcp://127.0.0.1:not-a-port': Invalid argument" \
            in caplog.text  # the error says what it refused (pyzmq may add the address)
        assert "); asking again later" in caplog.text
    finally:
        peer.close()


def test_an_unreadable_reply_or_event_is_logged_and_ignored(ctx, peer, caplog):
    h = Harness(ctx, [peer.endpoint])
    h.run(0)
    assert peer.router.poll(20_000)
    identity, _ = peer.router.recv_multipart()
    with caplog.at_level(logging.WARNING, logger="zns"):
        peer.router.send_multipart([identity, b"\xc1 not msgpack"])
        h.pump(0, lambda: "sent something unreadable" in caplog.text)
    assert h.links.links[peer.endpoint].asking and len(h.sockets()) == 1  # still waiting
    assert f"peer {peer.endpoint} sent something unreadable: MessagePack data is malformed" \
        in caplog.text
    h.run(RETRY_MIN_MS)
    peer.answer()
    h.pump(0, lambda: h.links.links[peer.endpoint].pub is not None)
    peer.wait_subscribed()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zns"):
        peer.pub.send_multipart([schema.HB_CHANNEL, b"\xc1"])
        h.pump(0, lambda: "sent something unreadable" in caplog.text)
    assert not h.connected[peer.endpoint]


def test_a_reply_of_more_than_one_frame_or_another_op_is_not_taken(ctx, peer, caplog):
    h = Harness(ctx, [peer.endpoint])
    h.run(0)
    dealer = h.sockets()[0]
    h.links.run({dealer: zmq.POLLIN}, 0, 5)  # ready, but nothing to read: nothing happens
    assert h.links.links[peer.endpoint].asking and h.sockets() == [dealer]
    assert peer.router.poll(20_000)
    identity, body = peer.router.recv_multipart()
    request = schema.decode_request(body)
    reply = schema.encode(schema.StatusReply(
        id=request.id, epoch="e", revision=0, version="0", uptime_ms=0, brokers=0, topics=0,
        pub_endpoint=peer.pub_endpoint))
    link = h.links.links[peer.endpoint]
    peer.router.send_multipart([identity, b"extra", reply])  # two frames: not a reply
    assert dealer.poll(20_000)  # libzmq hands over a message whole: all of it is there
    h.links.run({dealer: zmq.POLLIN}, 0, 5)
    assert link.asking and link.pub is None
    with caplog.at_level(logging.WARNING, logger="zns"):
        peer.router.send_multipart([identity, schema.encode(schema.GetTopicsReply(
            id=request.id, topics=[]))])  # a reply, but not to `status`
        h.pump(0, lambda: "sent something unreadable" in caplog.text)
    assert link.asking and link.pub is None
    peer.router.send_multipart([identity, reply])
    h.pump(0, lambda: link.pub == peer.pub_endpoint)


def test_an_event_of_one_frame_is_unreadable_and_one_of_three_is_not_taken(ctx, peer, caplog):
    h = Harness(ctx, [peer.endpoint])
    link_up(h, peer)
    sub = h.sockets()[0]
    assert sub.type == zmq.SUB
    removed = peer.removed()
    # Each message is waited for on the SUB, then handed to one pass: nothing races it.
    peer.pub.send_multipart([schema.event_channel(removed), b"extra", schema.encode(removed)])
    assert sub.poll(20_000)
    h.links.run({sub: zmq.POLLIN}, 5, 10)
    assert h.suspected == []  # three frames: read and dropped
    with caplog.at_level(logging.WARNING, logger="zns"):
        peer.pub.send(schema.HB_CHANNEL)  # one frame: no body to read
        assert sub.poll(20_000)
        h.links.run({sub: zmq.POLLIN}, 6, 10)
    assert f"peer {peer.endpoint} sent something unreadable" in caplog.text
    peer.publish(removed)
    h.pump(7, lambda: h.suspected)
    assert h.suspected == [("c1", ADDR, 7)]


def test_a_restarted_peer_naming_a_bad_events_endpoint_leaves_no_sub(ctx, peer, caplog):
    h = Harness(ctx, [peer.endpoint])
    link_up(h, peer)
    link = h.links.links[peer.endpoint]
    (old_sub,) = h.sockets()
    peer.epoch, peer.pub_endpoint = "epoch-2", "tcp://127.0.0.1:not-a-port"
    peer.publish(peer.hb())  # a new epoch: the link asks for the endpoints again
    h.pump(1, lambda: link.asking)
    h.run(1)
    peer.answer()
    with caplog.at_level(logging.WARNING, logger="zns"):
        h.pump(1, lambda: link._subscribe_failures == 1)
    # The SUB to the old endpoint is closed with the failure, not kept on the side.
    assert old_sub.closed and all(s.type == zmq.DEALER for s in h.sockets())
    assert "which cannot be connected to ('tcp://127.0.0.1:not-a-port': Invalid argument" \
        in caplog.text


def test_links_without_a_poll_set_open_and_close_their_sockets_all_the_same(ctx, peer):
    links = PeerLinks([peer.endpoint], now=0, suspect=lambda c, a, n: False, connected={},
                      context=ctx, clock=lambda: 0)  # never attached to a loop
    links.run({}, 0, 5)
    assert peer.router.poll(20_000) and peer.pending() == 1
    links.run({}, RETRY_MIN_MS, RETRY_MIN_MS + 5)  # unanswered: asked again, a fresh DEALER
    assert peer.router.poll(20_000) and peer.pending() == 1
    links.close()


def test_a_message_over_the_bound_is_dropped(ctx, peer):
    h = Harness(ctx, [peer.endpoint], max_message_bytes=4096)
    h.run(0)
    assert h.sockets()[0].getsockopt(zmq.MAXMSGSIZE) == 4096  # the DEALER
    link_up(h, peer)
    assert h.sockets()[0].getsockopt(zmq.MAXMSGSIZE) == 4096  # the SUB
    # Each frame within libzmq's per-frame bound, the whole message over the driver's.
    other = schema.encode(schema.BrokerEvent(
        epoch=peer.epoch, revision=0, cluster="c1", broker_name="b", broker_id=0,
        broker_addr="10.9.9.9:1", change="removed", reason="expired"))
    too_big = [schema.BROKER_PREFIX + b"x" * 4000, other]  # 4,000 + ~140 bytes > 4,096
    peer.pub.send_multipart(too_big)
    peer.publish(peer.removed())
    h.pump(5, lambda: h.suspected)
    assert h.suspected == [("c1", ADDR, 5)]
    peer.pub.send_multipart(too_big)
    peer.publish(peer.hb())
    link = h.links.links[peer.endpoint]
    h.pump(6, lambda: link._last_heard == 6)
    assert len(h.suspected) == 1 and link.connected


def test_close_closes_every_socket_and_unregisters_it(ctx, peer):
    h = Harness(ctx, [peer.endpoint])
    link_up(h, peer)
    h.run(h.links.links[peer.endpoint].next_deadline())  # silence: a DEALER as well as the SUB
    sockets = h.sockets()
    assert len(sockets) == 2
    h.links.close()
    assert h.sockets() == [] and all(s.closed for s in sockets)


def test_no_peers_no_deadline_and_no_sockets(ctx):
    h = Harness(ctx, [])
    assert h.links.links == {} and h.connected == {}
    assert h.links.next_deadline(5) is None
    h.run(5)
    assert h.sockets() == []


def test_peers_are_endpoints_once_each_and_a_bad_one_is_refused(ctx, caplog):
    with caplog.at_level(logging.INFO, logger="zns"):
        h = Harness(ctx, ["127.0.0.1:9876", "tcp://127.0.0.1:9876", "127.0.0.1:9877"])
    assert list(h.links.links) == ["tcp://127.0.0.1:9876", "tcp://127.0.0.1:9877"]
    assert "taking hints from peers tcp://127.0.0.1:9876, tcp://127.0.0.1:9877" \
        in [r.getMessage() for r in caplog.records]
    with pytest.raises(EndpointError, match=r"--peer tcp://-:5: Invalid argument"):
        PeerLinks(["127.0.0.1:5", "tcp://-:5"], now=0, suspect=lambda c, a, n: False,
                  connected={}, context=ctx, clock=lambda: 0)


def test_peer_sockets_take_messages_of_64_kib_at_most_and_queue_1000_at_most(ctx, peer):
    # A hostile peer sent 1 MiB and 8 MiB events, 10,000 of them read in one go: gigabytes.
    h = Harness(ctx, [peer.endpoint])
    h.run(0)
    (dealer,) = h.sockets()
    assert dealer.getsockopt(zmq.MAXMSGSIZE) == PEER_MAX_MESSAGE_BYTES == 64 * 1024
    link_up(h, peer)
    (sub,) = h.sockets()
    assert sub.getsockopt(zmq.MAXMSGSIZE) == 64 * 1024
    assert sub.getsockopt(zmq.RCVHWM) == PEER_RCVHWM == 1000


def test_a_flood_of_events_is_read_within_the_slice_and_the_rest_in_the_next_run(ctx):
    # inproc: a message published is in the link's queue when `send` returns, so the test
    # knows exactly what waits.
    peer = FakePeer(ctx, pub_endpoint=f"inproc://peer-events-{id(ctx)}")
    peer.pub.bind(peer.pub_endpoint)
    try:
        h = Harness(ctx, [peer.endpoint])
        link_up(h, peer)
        (sub,) = h.sockets()
        for _ in range(100):
            peer.publish(peer.removed())
        h.clock = 10  # past the slice's end (5) from the first reading on
        h.links.run({sub: zmq.POLLIN}, 0, 5)
        assert len(h.suspected) == CLOCK_EVERY - 1  # read until the clock was first read
        assert h.links.next_deadline(0) == 0  # the rest is asked for at once
        h.clock = 0
        h.links.run({}, 1, 6)  # not ready in the poll: read all the same
        assert len(h.suspected) == 100
        assert h.links.next_deadline(1) == h.links.links[peer.endpoint].next_deadline()
    finally:
        peer.close()

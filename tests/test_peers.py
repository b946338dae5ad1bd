"""Peer hints (§10) between real NameServers on ephemeral ports.

Every wait is a condition with a generous deadline; the only fixed observation
window (a broker that keeps heartbeating stays) is several heartbeats long on
both sides, so a loaded machine makes it pass more slowly, never fail.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import zmq

from helpers import Peer, free_port, register_fields, wait_for
from zns.core import schema
from zns.core.errors import EndpointError
from zns.drivers.peers import PeerLinks

ADDR = "10.0.0.1:10911"
# The timeout the hinted server gives the broker the peer expires. A hint removes it at the
# later of the grace and a quarter of this timeout (§10): 12 s -> 3 s after the hint (about
# 4 s after registering, quiet), and its own expiry, 12 s after it registered, is 8 s later:
# far enough away not to come first under load.
ON_B_TIMEOUT_MS = 12_000
BROKER = dict(cluster="c1", broker_name="broker-a", broker_id=0, broker_addr=ADDR)


def listening(endpoint: str) -> bool:
    """Whether something still listens on this tcp://127.0.0.1:PORT endpoint."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as libzmq binds
        try:
            s.bind(("127.0.0.1", int(endpoint.rpartition(":")[2])))
        except OSError:
            return True
    return False


def wait_linked(peer: Peer, *endpoints: str, timeout: float = 20) -> None:
    """Until `status` reports every endpoint as a connected peer."""
    wait_for(lambda: peer.ok("status").peers == {e: True for e in endpoints}, timeout)


def watch(srv) -> Peer:
    """A subscriber to the broker events of `srv`, subscribed for sure."""
    peer = srv.peer()
    peer.subscribe(schema.BROKER_PREFIX, schema.HB_CHANNEL)
    peer.wait_subscribed()
    return peer


def removal(peer: Peer, addr: str = ADDR, timeout: float = 20) -> schema.BrokerEvent:
    _, event = peer.next_event(
        lambda ch, ev: isinstance(ev, schema.BrokerEvent) and ev.change == "removed"
        and ev.broker_addr == addr, timeout,
    )
    return event


def live_addrs(peer: Peer) -> set[str]:
    return {b.broker_addr for b in peer.ok("get_cluster_info").live}


@pytest.mark.timeout(60)
def test_a_broker_one_server_expires_leaves_the_other_within_the_grace(make_server):
    a = make_server()
    b = make_server(peers=[a.router], peer_grace_s=1.0)
    on_b = watch(b)
    wait_linked(on_b, a.router)
    a.peer().ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=1000))
    on_b.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=ON_B_TIMEOUT_MS))
    registered = time.monotonic()

    event = removal(on_b)
    assert event.reason == "peer_expired"
    # Below B's own timeout: A's 1 s, then a quarter of B's timeout (5 s), and slack for a
    # loaded machine (B's own expiry would say "expired").
    assert time.monotonic() - registered < ON_B_TIMEOUT_MS / 1000
    assert on_b.call("get_route", topic="TopicA").code == "not_found"
    assert ADDR not in live_addrs(on_b)


@pytest.mark.timeout(60)
def test_a_broker_that_keeps_heartbeating_stays_although_a_peer_expired_it(make_server):
    a = make_server()
    b = make_server(peers=[a.router], peer_grace_s=3.0)
    on_a, on_b = watch(a), watch(b)
    wait_linked(on_b, a.router)
    on_a.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=1000))
    on_b.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=12_000))

    stop = threading.Event()
    broker = Peer(b.router)

    def heartbeat_b() -> None:
        while not stop.is_set():
            assert broker.ok("heartbeat", **BROKER).known
            stop.wait(0.2)

    beats = threading.Thread(target=heartbeat_b, daemon=True)
    beats.start()
    try:
        assert removal(on_a).reason == "expired"
        # B got the hint at about this moment; its suspicion would expire the broker
        # 3 s after the hint (the grace; a quarter of its 12 s timeout) unless each
        # heartbeat clears it. Watch for longer.
        until = time.monotonic() + 5
        while time.monotonic() < until:
            assert ADDR in live_addrs(on_b)
            assert beats.is_alive()
            time.sleep(0.2)
        with pytest.raises(AssertionError, match="did not arrive"):
            removal(on_b, timeout=0.5)
    finally:
        stop.set()
        beats.join(5)
        broker.close()


@pytest.mark.timeout(90)
def test_three_servers_in_a_mesh_converge_and_a_live_broker_stays(make_server):
    routers = [f"tcp://127.0.0.1:{free_port()}" for _ in range(3)]
    servers = {
        name: make_server(router=router, peers=[r for r in routers if r != router],
                          peer_grace_s=1.0)
        for name, router in zip("abc", routers)
    }
    on = {name: watch(srv) for name, srv in servers.items()}
    for name, router in zip("abc", routers):
        wait_linked(on[name], *(r for r in routers if r != router))

    alive = "10.0.0.2:10911"
    for name, peer in on.items():
        timeout = 1000 if name == "a" else ON_B_TIMEOUT_MS
        peer.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=timeout))
        peer.ok("register_broker", **register_fields(
            broker_name="broker-b", addr=alive, heartbeat_timeout_ms=timeout))

    stop = threading.Event()
    brokers = [Peer(srv.router) for srv in servers.values()]

    def heartbeat_everywhere() -> None:
        fields = dict(BROKER, broker_name="broker-b", broker_addr=alive)
        while not stop.is_set():
            for broker in brokers:
                assert broker.ok("heartbeat", **fields).known
            stop.wait(0.2)

    beats = threading.Thread(target=heartbeat_everywhere, daemon=True)
    beats.start()
    try:
        assert removal(on["a"]).reason == "expired"
        assert removal(on["b"]).reason == "peer_expired"
        assert removal(on["c"]).reason == "peer_expired"
        for peer in on.values():
            assert ADDR not in live_addrs(peer)
            assert alive in live_addrs(peer)
        assert beats.is_alive()
    finally:
        stop.set()
        beats.join(5)
        for broker in brokers:
            broker.close()


@pytest.mark.timeout(60)
def test_hints_travel_one_hop_only(make_server):
    """A -> B -> C: B acts on A's expiry; C must not act on B's peer_expired."""
    a = make_server()
    b = make_server(peers=[a.router], peer_grace_s=1.0)
    c = make_server(peers=[b.router], peer_grace_s=1.0)
    on_b, on_c = watch(b), watch(c)
    wait_linked(on_b, a.router)
    wait_linked(on_c, b.router)
    a.peer().ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=1000))
    on_b.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=ON_B_TIMEOUT_MS))
    on_c.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=20_000))
    registered = time.monotonic()

    assert removal(on_b).reason == "peer_expired"
    # The broker is silent since it registered, so B's echoed hint would expire it on C a
    # quarter of C's timeout later (5 s): watched for 6.5 s (~12.5 s after registering
    # quiet), before C's own 20 s.
    with pytest.raises(AssertionError, match="did not arrive"):
        removal(on_c, timeout=6.5)
    assert ADDR in live_addrs(on_c)
    assert time.monotonic() - registered < 20  # else C's own expiry could have hidden an echo


@pytest.mark.timeout(60)
def test_a_peer_down_at_start_changes_nothing_and_is_linked_later(make_server):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    started = time.monotonic()
    b = make_server(peers=[endpoint], peer_grace_s=1.0)
    on_b = watch(b)
    assert on_b.ok("status").peers == {endpoint: False}  # serving, without waiting for it
    assert time.monotonic() - started < 10
    on_b.ok("register_broker", **register_fields(broker_name="broker-z", addr="10.0.0.9:1",
                                                 heartbeat_timeout_ms=60_000))
    revision = on_b.ok("status").revision

    a = make_server(router=endpoint)
    wait_linked(on_b, endpoint)
    assert on_b.ok("status").revision == revision  # linking changed nothing
    assert "10.0.0.9:1" in live_addrs(on_b)

    a.peer().ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=1000))
    on_b.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=ON_B_TIMEOUT_MS))
    assert removal(on_b).reason == "peer_expired"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("same_pub_port", [True, False], ids=["same-ports", "new-pub-port"])
def test_a_restarted_peer_changes_nothing_and_is_resubscribed(make_server, same_pub_port):
    router = f"tcp://127.0.0.1:{free_port()}"
    pub = f"tcp://127.0.0.1:{free_port()}" if same_pub_port else "tcp://127.0.0.1:*"
    a = make_server(router=router, pub=pub)
    b = make_server(peers=[router], peer_grace_s=1.0)
    on_b = watch(b)
    wait_linked(on_b, router)
    first_epoch = a.peer().ok("status").epoch
    on_b.ok("register_broker", **register_fields(broker_name="broker-z", addr="10.0.0.9:1",
                                                 heartbeat_timeout_ms=60_000))
    revision = on_b.ok("status").revision

    a.stop()
    # libzmq closes listeners in the background: rebind once the ports are free.
    wait_for(lambda: not listening(router) and (pub.endswith("*") or not listening(pub)))
    a = make_server(router=router, pub=pub)
    assert a.peer().ok("status").epoch != first_epoch
    # B re-learns A (through silence or the new epoch in A's events) and links again. Its
    # link is in its worker, out of sight: a hint shows it, so probe until one arrives. A
    # probe is one broker registered on both, expired on A first; it moves B by 2 revisions.
    probes = 0

    def hint_arrives() -> bool:
        nonlocal probes
        probes += 1
        probe = register_fields(broker_name=f"probe-{probes}", addr=f"10.0.1.{probes}:1")
        a.peer().ok("register_broker", **probe, heartbeat_timeout_ms=1000)
        on_b.ok("register_broker", **probe, heartbeat_timeout_ms=3000)
        return removal(on_b, probe["broker_addr"]).reason == "peer_expired"

    wait_for(hint_arrives, timeout=30)
    wait_linked(on_b, router)
    # The restart changed nothing on B: only the probes did.
    assert on_b.ok("status").revision == revision + 2 * probes
    assert "10.0.0.9:1" in live_addrs(on_b)

    a.peer().ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=1000))
    on_b.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=ON_B_TIMEOUT_MS))
    assert removal(on_b).reason == "peer_expired"  # hints flow again


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["0", "1"])
def test_cli_peer_options_log_the_link_and_each_hint(process_server, workers):
    a = process_server("--heartbeat-interval", "0.2")
    b = process_server("--heartbeat-interval", "0.2", "--peer", a.router, "--peer-grace", "1",
                       "--workers", workers)
    on_b = Peer(b.router, b.pub)
    try:
        wait_linked(on_b, a.router)
        on_a = Peer(a.router)
        on_a.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=1000))
        on_a.close()
        on_b.ok("register_broker", **register_fields(addr=ADDR, heartbeat_timeout_ms=ON_B_TIMEOUT_MS))
        wait_for(lambda: ADDR not in live_addrs(on_b), timeout=20)
        log = b.output()
        assert f"peer {a.router} connected" in log
        if workers == "0":
            assert f"peer hint from {a.router}: broker c1/broker-a at {ADDR} expired there" in log
        else:  # the worker took it (DEBUG); the state process logs the hint that shortened
            assert f"peer hint: broker c1 at {ADDR} suspected here" in log
        assert "(peer_expired)" in log
    finally:
        on_b.close()


@pytest.mark.parametrize("endpoint,error", [
    ("ns1.example", "no port"),
    ("tcp://127.0.0.1:notaport", "port 'notaport' is not a number"),
])
def test_a_bad_peer_endpoint_stops_start_up_with_a_clear_error(endpoint, error):
    with pytest.raises(EndpointError, match=f"--peer.*{error}"):
        PeerLinks([endpoint], now=0, suspect=lambda c, a, n: False, connected={},
                  context=zmq.Context.instance(), clock=lambda: 0)


@pytest.mark.timeout(30)
def test_a_bare_host_port_peer_is_tcp_and_listed_once(make_server):
    a = make_server()
    bare = a.router.removeprefix("tcp://")
    b = make_server(peers=[bare, a.router])
    wait_linked(b.peer(), a.router)


class BadEventsPeer:
    """A peer answering `status` with an events endpoint nobody can connect to; it notes
    when each `status` came."""

    def __init__(self) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.asked_at: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        while not self.stop.is_set():
            if self.sock.poll(20):
                identity, body = self.sock.recv_multipart()
                self.asked_at.append(time.monotonic())
                request = schema.decode_request(body)
                self.sock.send_multipart([identity, schema.encode(schema.StatusReply(
                    id=request.id, epoch="e", revision=0, version="0", uptime_ms=0, brokers=0,
                    topics=0, pub_endpoint="tcp://127.0.0.1:not-a-port"))])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close(0)


@pytest.mark.timeout(60)
def test_a_peer_naming_a_bad_events_endpoint_is_asked_again_with_a_growing_backoff(make_server):
    peer = BadEventsPeer()
    try:
        make_server(peers=[peer.endpoint])
        wait_for(lambda: len(peer.asked_at) >= 6, timeout=40)
        gaps = [b - a for a, b in zip(peer.asked_at, peer.asked_at[1:])]
        # Documented: 0.4, 0.8, 1.6, 3.2 s ... up to 5 s between attempts (not the ~3 s
        # silence of a subscription that never delivers anything, again and again). Two
        # backoffs make them: each unanswered attempt doubles the next wait (and its new
        # DEALER replaces the last, whose late reply is lost), and each bad endpoint
        # answered doubles it from its own count. On a loaded machine the first replies can
        # all come too late: a full run measured 0.4, 0.8, 1.7, then 1.0 s after the first
        # reply that came in time (one bad endpoint: 0.8 s). The longest of five gaps shows
        # the growth either way.
        assert gaps[0] < 2.0, gaps
        assert max(gaps) - gaps[0] >= 1.5, gaps
    finally:
        peer.close()

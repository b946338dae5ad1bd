"""How `Server` wires its sockets and sources, checked on a server that is made and closed
but never run: what each option reaches, what close releases, the control and timer
sources driven by hand with an injected clock. Fast (no loop thread, no waiting), so the
mutation run of zns/drivers/server.py starts with these; tests/test_server.py runs the loop.
"""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth.thread
from zmq.auth.thread import ThreadAuthenticator

from zns.core.config import ServerConfig
from zns.core.errors import EndpointError
from zns.drivers import server as server_module
from zns.drivers.heap import TRIM_AFTER_EVENTS
from zns.drivers.security import read_certificate, write_keypair
from zns.drivers.server import FREED_TRIM_BYTES, MAX_SUBSCRIPTION_BYTES, Server, is_loopback

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self, seconds: float = 100.0) -> None:
        self.seconds = seconds

    def __call__(self) -> float:
        return self.seconds


def config(tmp_path: Path, **overrides: object) -> ServerConfig:
    cfg = ServerConfig(router="tcp://127.0.0.1:*", pub="tcp://127.0.0.1:*",
                       kv_path=str(tmp_path / "kv.log"))
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


@pytest.fixture
def made(tmp_path: Path) -> Iterator[list[Server]]:
    servers: list[Server] = []
    yield servers
    for srv in servers:
        srv.close()


def make(made: list[Server], cfg: ServerConfig, **kw: object) -> Server:
    srv = Server(cfg, **kw)
    made.append(srv)
    return srv


def test_options_reach_the_sockets_and_the_listener(tmp_path, made):
    srv = make(made, config(tmp_path, pub_hwm=123, max_message_bytes=5000, remoting="127.0.0.1:0",
                            remoting_max_connections=7, remoting_max_connections_per_host=3,
                            remoting_max_buffer_bytes=70_000, order_message_enable=True))
    assert srv.pub.getsockopt(zmq.SNDHWM) == 123
    assert srv.pub.getsockopt(zmq.LINGER) == 500
    assert srv.pub.getsockopt(zmq.MAXMSGSIZE) == MAX_SUBSCRIPTION_BYTES + 10
    assert srv.router.getsockopt(zmq.MAXMSGSIZE) == 5000
    listener = srv.remoting
    assert listener is not None
    assert (listener.max_frame_bytes, listener.policy.max_connections, listener.policy.max_per_host,
            listener.policy.max_buffer_bytes) == (5000, 7, 3, 70_000)
    assert listener.descriptors is srv.descriptors and listener.outbox is srv.outbox
    assert listener.service.route_json.order_conf is True
    assert listener.service.service is srv.service
    assert srv.service.remoting_endpoint == listener.endpoint
    assert srv.service.pub_endpoint == srv.pub_endpoint
    assert srv.router_endpoint.startswith("tcp://127.0.0.1:")
    # The loop's sources, in the order each pass runs them.
    names = [type(s).__name__ for s in srv.loop.sources]
    assert names == ["_Control", "DescriptorGuard", "_Timers", "RequestRouter", "_Subscriptions",
                     "RemotingListener", "StateWriter", "PeerLinks", "HeapTrim", "Outbox"]
    assert srv.loop.sources[2].timers is srv.timers
    # The timers and the outbox also run between the others once due.
    assert srv.loop.urgent == [srv.loop.sources[2], srv.outbox]
    # Each source's sockets are watched for reading, and a ready one wakes its own source.
    watched = dict(srv.loop.poll.poller.sockets)
    assert watched[srv.pub] == watched[srv.waker.fd] == zmq.POLLIN
    assert srv.loop.poll.owners[srv.pub] is srv.loop.sources[4]
    assert srv.loop.poll.owners[srv.waker.fd] is srv.loop.sources[0]


def test_the_listener_reads_the_server_clock(tmp_path, made):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path, remoting="127.0.0.1:0"), clock=clock)
    listener = srv.remoting
    assert listener.now == 100_000
    assert srv.requests.clock() == 100_000  # the router's too
    clock.seconds = 100.25
    assert listener.clock is not None and listener.clock() == 100_250  # what ends its slice


def test_namesrv_config_shows_what_is_bound_and_the_networks(tmp_path, made, caplog):
    with caplog.at_level(logging.INFO, logger="zns"):
        srv = make(made, config(tmp_path, remoting="127.0.0.1:0",
                                remoting_brokers=["10.0.0.0/8", "192.168.0.0/16"]))
    props = srv.remoting.service.properties
    assert props["router"] == srv.router_endpoint and props["pub"] == srv.pub_endpoint
    assert props["remoting"] == srv.remoting.endpoint != "127.0.0.1:0"
    assert props["remotingBrokers"] == "10.0.0.0/8,192.168.0.0/16"
    assert props["remotingAdmins"] == "127.0.0.0/8,::1/128"
    assert props["remotingClients"] == "any"
    assert props["curve"] == "false"  # the config's own settings are there too
    assert f"RocketMQ remoting listener on {srv.remoting.endpoint}" in \
        [r.getMessage() for r in caplog.records]
    assert "plain TCP" not in caplog.text  # loopback: no warning


def test_a_remoting_listener_on_every_interface_warns_who_may_do_what(tmp_path, made, caplog):
    with caplog.at_level(logging.WARNING, logger="zns"):
        srv = make(made, config(tmp_path, remoting="0.0.0.0:0"))
    warning = next(r.getMessage() for r in caplog.records if "plain TCP" in r.getMessage())
    assert warning == (f"the RocketMQ remoting listener on {srv.remoting.endpoint} is plain TCP "
                       "(no CURVE): it takes reads from any address (--remoting-clients), broker "
                       "requests from any address (--remoting-brokers), admin requests from "
                       "127.0.0.0/8, ::1/128 (--remoting-admins)")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zns"):
        srv = make(made, config(tmp_path, remoting="0.0.0.0:0", remoting_brokers=["10.0.0.0/8"],
                                remoting_admins=["10.2.0.0/16", "10.3.0.1"],
                                remoting_clients=["10.1.0.0/16"]))
    warning = next(r.getMessage() for r in caplog.records if "plain TCP" in r.getMessage())
    assert "reads from 10.1.0.0/16 (--remoting-clients)" in warning
    assert "broker requests from 10.0.0.0/8 (--remoting-brokers)" in warning
    assert "admin requests from 10.2.0.0/16, 10.3.0.1/32 (--remoting-admins)" in warning
    service = srv.remoting.service
    # The networks in force, as parsed: a bare address is shown as its /32.
    assert (service.properties["remotingAdmins"], service.properties["remotingClients"]) == \
        ("10.2.0.0/16,10.3.0.1/32", "10.1.0.0/16")


@pytest.mark.parametrize("clients", ["any", "listed"])
def test_curve_narrows_the_listener_defaults_and_the_config_shows_it(tmp_path, made, caplog,
                                                                      clients):
    secret = write_keypair(tmp_path / "keys", "server")[1]
    with caplog.at_level(logging.WARNING, logger="zns"):
        srv = make(made, config(tmp_path, remoting="127.0.0.1:0", curve_secret=secret,
                                clients=clients))
    service = srv.remoting.service
    loopback = "127.0.0.0/8,::1/128"
    readers = loopback if clients == "listed" else "any"
    assert (service.properties["remotingBrokers"], service.properties["remotingClients"]) == \
        (loopback, readers)
    assert service.kv_reads_admin
    # CURVE reaches the service (who may do what), the router (the User-Id frame) and the keys.
    assert srv.service.authorize == srv.security.authorize
    assert srv.requests.with_key is True
    narrowed = [r.getMessage() for r in caplog.records if "CURVE is on" in r.getMessage()]
    reads = " and reads (--remoting-clients CIDR)" if clients == "listed" else ""
    assert narrowed == [f"CURVE is on but the remoting listener has no keys: it accepts broker "
                        f"requests (--remoting-brokers CIDR){reads} from loopback only; name the "
                        f"networks to allow more"]


def refused_on_a_taken_port(monkeypatch, settings, match: str) -> Server:
    """Server(settings(port)) with `port` already taken by a listening socket: it must raise
    EndpointError matching `match` (formatted with the port) and close itself once; returns
    the server it closed."""
    closed: list[Server] = []
    real_close = Server.close
    monkeypatch.setattr(Server, "close", lambda self: (closed.append(self), real_close(self)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EndpointError, match=match.format(port=port)):
            Server(settings(port))
    assert len(closed) == 1 and closed[0].router.closed and closed[0].pub.closed
    return closed[0]


def test_a_bad_remoting_endpoint_is_refused_and_leaves_nothing_bound(tmp_path, monkeypatch):
    refused_on_a_taken_port(monkeypatch,
                            lambda port: config(tmp_path, remoting=f"127.0.0.1:{port}"),
                            r"--remoting 127\.0\.0\.1:{port}: ")
    with pytest.raises(EndpointError, match="--remoting 127.0.0.1:0: .*not a network"):
        Server(config(tmp_path, remoting="127.0.0.1:0", remoting_brokers=["nonsense"]))


def test_close_releases_the_sockets_the_listener_and_the_waker(tmp_path):
    srv = Server(config(tmp_path, remoting="127.0.0.1:0"))
    listening = srv.remoting.listening
    waker = srv.waker
    srv.close()
    assert srv.router.closed and srv.pub.closed
    assert listening.fileno() == -1
    assert waker.closed


def test_loop_age_is_read_from_the_injected_clock(tmp_path, made):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path), clock=clock)
    assert srv.last_pass_ms == 100_000 and srv.loop_age_s() == 0
    clock.seconds = 102.5
    assert srv.loop_age_s() == 2.5
    clock.seconds = 99.0  # never negative
    assert srv.loop_age_s() == 0
    srv.loop = None
    assert srv.last_pass_ms == 99_000


def published(monkeypatch: pytest.MonkeyPatch) -> list[list[bytes]]:
    """What the server publishes from now on, as frame lists, caught at the backend's send."""
    sent: list[list[bytes]] = []
    frames: list[bytes] = []

    def send(sock: object, data: bytes, flags: int = 0, *args: object) -> None:
        frames.append(bytes(data))
        if not flags & zmq.SNDMORE:
            sent.append(frames[:])
            frames.clear()

    monkeypatch.setattr(server_module, "backend_send", send)
    return sent


def test_hb_carries_the_wall_clock_in_ms(tmp_path, made, monkeypatch):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path, heartbeat_interval_s=0.5), clock=clock,
               wall_clock=lambda: 1234.5678)
    timers = srv.loop.sources[2]
    assert srv.timers.interval_ms == 500
    assert timers.next_deadline(100_000) == srv.timers.next_deadline()
    timers.run({}, 100_000, 100_005)
    sent = published(monkeypatch)
    srv.outbox.run({}, 100_000, 100_005)
    from zns.core import schema
    hbs = [schema.decode_event(frames[-1]) for frames in sent if frames[0] == schema.HB_CHANNEL]
    assert [hb.time_ms for hb in hbs] == [1234568]


def test_a_key_reload_runs_on_the_loop_and_says_curve_is_off(tmp_path, made, caplog):
    srv = make(made, config(tmp_path))
    control = srv.loop.sources[0]
    assert control.next_deadline(0) is None
    with caplog.at_level(logging.INFO, logger="zns"):
        control.run({}, 0, 5)
        assert "SIGHUP" not in caplog.text  # nothing asked yet
        srv.reload_keys()
        ready = dict(srv.loop.poll.poller.poll(5000))
        assert srv.waker.fd in ready  # the reload woke the loop
        control.run(ready, 0, 5)
    assert [r.getMessage() for r in caplog.records if "SIGHUP" in r.getMessage()] == [
        "SIGHUP: CURVE is off, no keys to reload"]
    assert dict(srv.loop.poll.poller.poll(0)) == {}  # the wake-up was drained
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zns"):
        control.run(ready, 0, 5)
    assert "SIGHUP" not in caplog.text  # once per reload


def test_stop_wakes_the_loop(tmp_path, made):
    srv = make(made, config(tmp_path))
    srv.stop()
    assert srv.waker.fd in dict(srv.loop.poll.poller.poll(5000))
    srv.run()  # stopped before it ran: the loop ends before its first pass, and closes
    assert srv.router.closed


def test_freeing_a_megabyte_of_subscriptions_asks_for_a_heap_trim(tmp_path, made):
    srv = make(made, config(tmp_path))
    before = srv.heap.pending
    srv.subscriptions_freed(FREED_TRIM_BYTES - 1)
    assert srv.heap.pending == before
    srv.subscriptions_freed(FREED_TRIM_BYTES)
    assert srv.heap.pending == before + TRIM_AFTER_EVENTS


@pytest.mark.parametrize("endpoint, loopback", [
    ("tcp://127.0.0.1:1", True), ("tcp://127.9.9.9:1", True), ("tcp://[::1]:1", True),
    ("tcp://localhost:1", True), ("inproc://x", True), ("ipc:///tmp/x", True),
    ("tcp://0.0.0.0:1", False), ("tcp://10.0.0.1:1", False), ("tcp://[::]:1", False),
    ("tcp://128.0.0.1:1", False), ("tcp://my127.host:1", False),
])
def test_is_loopback(endpoint, loopback):
    assert is_loopback(endpoint) is loopback


def test_networks_text():
    assert server_module._networks_text(None) == "any"
    assert server_module._networks_text(()) == ""


def test_run_says_where_it_serves_and_when_it_stopped(tmp_path, caplog):
    import threading

    srv = Server(config(tmp_path))
    with caplog.at_level(logging.INFO, logger="zns"):
        thread = threading.Thread(target=srv.run)
        thread.start()
        srv.stop()
        thread.join(30)
    assert not thread.is_alive()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == (f"zns serving requests on {srv.router_endpoint}, events on "
                           f"{srv.pub_endpoint} (epoch {srv.service.epoch})")
    limit = srv.descriptor_limit
    assert messages[1] == (f"file descriptors: limit {limit}, room for about {limit // 2 - 32} "
                           "clients (a client uses two: requests and events)")
    assert messages[-1] == "zns stopped"
    assert srv.router.closed and srv.pub.closed  # run closes what it served


def test_the_heap_trim_waits_while_requests_wait(tmp_path, made):
    srv = make(made, config(tmp_path))
    assert srv.heap.busy == srv.requests.waiting


def test_a_refused_request_endpoint_leaves_nothing_bound(tmp_path, monkeypatch):
    # The first bind fails: nothing past it was made (no peers, listener, loop nor metrics),
    # and closing what was made must not hide the error.
    srv = refused_on_a_taken_port(
        monkeypatch,
        lambda port: config(tmp_path, router=f"tcp://127.0.0.1:{port}", metrics="127.0.0.1:0"),
        r"cannot bind tcp://127\.0\.0\.1:{port}: ")
    assert srv.peers is None and srv.metrics is None


def test_the_events_socket_tells_the_subscribers_of_each_connection_and_its_end(
        tmp_path, made, monkeypatch):
    from zns.drivers.subscribers import Subscribers

    seen: list[int] = []
    monkeypatch.setattr(Subscribers, "on_monitor_event", lambda self, event, fd: seen.append(event))
    srv = make(made, config(tmp_path))
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)

    def until(event: int) -> None:
        deadline = time.monotonic() + 30
        while event not in seen:
            assert time.monotonic() < deadline, seen
            srv.descriptors.handle(dict(srv.loop.poll.poller.poll(100)), 0)

    sub.connect(srv.pub_endpoint)
    until(zmq.EVENT_ACCEPTED)
    sub.close()
    until(zmq.EVENT_DISCONNECTED)


def test_peers_get_the_configured_endpoints_the_clock_and_the_grace(tmp_path, made):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path, peers=["tcp://127.0.0.1:1"], peer_grace_s=2.5),
               clock=clock)
    assert list(srv.peers.links) == ["tcp://127.0.0.1:1"]
    assert srv.peers.next_deadline(0) == 100_000  # the first ask is due when it was made
    asked: list[tuple] = []
    srv.service.suspect = lambda *args: asked.append(args)  # type: ignore[method-assign]
    srv.peers.suspect("c1", "10.0.0.1:10911", 123)
    assert asked == [("c1", "10.0.0.1:10911", 2500, 123)]


def test_more_options_reach_the_timers_the_peers_and_the_subscriptions(tmp_path, made):
    srv = make(made, config(tmp_path, heartbeat_interval_s=2.0, max_message_bytes=5000,
                            peers=["tcp://127.0.0.1:1"], pub_hwm=77, pub_max_queued_bytes=5001))
    assert srv.timers.interval_ms == 2000
    # A peer's messages have their own bound, whatever a client's requests may be.
    assert srv.peers.max_message_bytes == 64 * 1024 and srv.peers.connected is srv.service.peers
    assert (srv.subscribers.queued.total, srv.subscribers.queued.hwm) == (5001, 77)
    # The subscriptions source reads what the events socket was sent: a SUB's subscription.
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        sub.connect(srv.pub_endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"r.Orders")
        assert srv.pub.poll(30_000)
        srv.loop.sources[4].run({}, 0, 5)
        assert not srv.pub.poll(0)  # read, not left for the next pass
    finally:
        sub.close()


def test_close_forgets_the_metrics_server(tmp_path):
    srv = Server(config(tmp_path, metrics="127.0.0.1:0"))
    assert srv.metrics is not None
    srv.close()
    assert srv.metrics is None


@pytest.mark.timeout(60)
def test_run_in_the_main_thread_takes_sighup_and_sigterm_then_gives_them_back(tmp_path, caplog):
    import os
    import signal
    import threading

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    wakeup_before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_before)
    srv = Server(config(tmp_path))
    problems: list[str] = []

    def ours(sig: int) -> bool:
        handler = signal.getsignal(sig)
        return callable(handler) and handler is not before[sig]

    def send() -> None:
        # A signal is sent only once the server's own handler is in place: the default
        # action of either would end the test process.
        deadline = time.monotonic() + 30
        try:
            while not all(ours(sig) for sig in before):
                if time.monotonic() > deadline:
                    problems.append("the handlers were not installed")
                    return
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGHUP)
            while "SIGHUP: CURVE is off, no keys to reload" not in caplog.text:
                if time.monotonic() > deadline:
                    problems.append("SIGHUP did not reach the loop")
                    return
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            if problems:
                srv.stop()

    sender = threading.Thread(target=send)
    with caplog.at_level(logging.INFO, logger="zns"):
        sender.start()
        srv.run()
    sender.join(30)
    assert problems == []
    assert caplog.records[-1].getMessage() == "zns stopped"
    assert {sig: signal.getsignal(sig) for sig in before} == before
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    assert wakeup == wakeup_before


def test_the_service_heap_subscribers_and_metrics_get_what_they_are_given(tmp_path, made):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path, max_brokers=7, metrics="127.0.0.1:0",
                            heartbeat_interval_s=4.0), clock=clock)
    assert srv.service.limits.max_brokers == 7
    assert srv.service.max_reply_bytes == srv.reply_budget.burst
    assert srv.service.kv.path is not None and srv.service.kv.path.parent == tmp_path
    assert srv.service.authorize is None  # no CURVE
    srv.heap.events_made(TRIM_AFTER_EVENTS)
    assert srv.heap.next_deadline(0) is not None  # glibc's malloc_trim, found: a trim is due
    assert srv.subscribers.budget is not None and srv.subscribers.freed == srv.subscriptions_freed
    assert srv.metrics.stuck_after_s == 8.0
    # /healthz reads this server's loop age, from the clock it was given.
    clock.seconds = 109.0
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as stuck:
        direct.open(f"http://127.0.0.1:{srv.metrics.port}/healthz", timeout=10)
    assert stuck.value.code == 503 and stuck.value.read() == b"stuck: no loop pass for 9.0 s\n"


def test_a_socket_bound_beyond_loopback_without_curve_is_warned_about(tmp_path, made, caplog):
    with caplog.at_level(logging.WARNING, logger="zns"):
        srv = make(made, config(tmp_path, pub="tcp://0.0.0.0:*"))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{srv.pub_endpoint} is bound to a non-loopback address without CURVE: "
                        "anyone who can reach it can register brokers and rewrite routes"]
    # Only the events socket's own port is what its subscribers' connections arrive at.
    assert srv.subscribers.local[1] == int(srv.pub_endpoint.rsplit(":", 1)[1])


def test_the_key_directories_reach_security(tmp_path, made, monkeypatch):
    secret = write_keypair(tmp_path / "keys", "server")[1]
    dirs = [tmp_path / name for name in ("brokers", "admins", "clients")]
    keys = [read_certificate(write_keypair(d, name)[0])[0] for d, name in zip(dirs, ("b", "a", "c"))]
    started: list[ThreadAuthenticator] = []

    class Recorded(ThreadAuthenticator):
        def start(self) -> None:
            started.append(self)
            super().start()

    monkeypatch.setattr(zmq.auth.thread, "ThreadAuthenticator", Recorded)  # imported when CURVE starts
    srv = make(made, config(tmp_path, curve_secret=secret, brokers_keys=str(dirs[0]),
                            admins_keys=str(dirs[1]), clients_keys=str(dirs[2]), clients="listed"))
    policy = srv.security.policy
    assert (set(policy.brokers), policy.admins, policy.clients) == \
        ({keys[0]}, {keys[1]}, {keys[2], srv.security.public_key})  # peers use its own key
    assert not policy.clients_any  # "listed"
    later = read_certificate(write_keypair(dirs[2], "c2")[0])[0]
    srv.security.reload()  # the directories are kept: a reload reads them again
    assert srv.security.policy.clients == {keys[2], later, srv.security.public_key}
    # ZAP answers in the server's own context, the one its sockets were made in.
    (auth,) = started
    assert auth.context is srv.router.context and srv.router.context is not zmq.Context.instance()


def test_events_published_count_toward_the_heap_trim(tmp_path, made, monkeypatch):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path), clock=clock)
    published(monkeypatch)
    before = srv.heap.pending
    srv.loop.sources[2].run({}, 100_000, 100_005)  # the timers: an hb into the outbox
    srv.outbox.run({}, 100_000, 100_005)
    assert srv.heap.pending == before + 1

"""How `Server` wires its sockets and sources, checked on a server that is made and closed
but never run: what each option reaches, what close releases, the control and timer
sources driven by hand with an injected clock. Fast (no loop thread, no waiting), so the
mutation run of zns/drivers/server.py starts with these; tests/test_server.py runs the loop.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zns.core.config import ServerConfig
from zns.core.errors import EndpointError
from zns.drivers import server as server_module
from zns.drivers.heap import TRIM_AFTER_EVENTS
from zns.drivers.security import write_keypair
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
    assert (listener.max_frame_bytes, listener.max_connections, listener.max_per_host,
            listener.max_buffer_bytes) == (5000, 7, 3, 70_000)
    assert listener.descriptors is srv.descriptors and listener.outbox is srv.outbox
    assert listener.service.order_message_enable is True
    assert listener.service.service is srv.service
    assert srv.service.remoting_endpoint == listener.endpoint
    assert srv.service.pub_endpoint == srv.pub_endpoint
    assert srv.router_endpoint.startswith("tcp://127.0.0.1:")
    # The loop's sources, in the order each pass runs them.
    names = [type(s).__name__ for s in srv.loop.sources]
    assert names == ["_Control", "DescriptorGuard", "_Timers", "RequestRouter", "_Subscriptions",
                     "RemotingListener", "PeerLinks", "HeapTrim", "Outbox"]
    assert srv.loop.sources[2].timers is srv.timers


def test_the_listener_reads_the_server_clock(tmp_path, made):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path, remoting="127.0.0.1:0"), clock=clock)
    listener = srv.remoting
    assert listener._now == 100_000
    clock.seconds = 100.25
    assert listener._clock() == 100_250  # what bounds its time slice
    assert listener._over(100_250) and not listener._over(100_251)


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
    narrowed = [r.getMessage() for r in caplog.records if "CURVE is on" in r.getMessage()]
    reads = " and reads (--remoting-clients CIDR)" if clients == "listed" else ""
    assert narrowed == [f"CURVE is on but the remoting listener has no keys: it accepts broker "
                        f"requests (--remoting-brokers CIDR){reads} from loopback only; name the "
                        f"networks to allow more"]


def test_a_bad_remoting_endpoint_is_refused_and_leaves_nothing_bound(tmp_path, monkeypatch):
    closed: list[Server] = []
    real_close = Server.close
    monkeypatch.setattr(Server, "close", lambda self: (closed.append(self), real_close(self)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EndpointError, match=rf"--remoting 127\.0\.0\.1:{port}: "):
            Server(config(tmp_path, remoting=f"127.0.0.1:{port}"))
    assert len(closed) == 1 and closed[0].router.closed and closed[0].pub.closed
    with pytest.raises(EndpointError, match="--remoting 127.0.0.1:0: .*not a network"):
        Server(config(tmp_path, remoting="127.0.0.1:0", remoting_brokers=["nonsense"]))


def test_close_releases_the_sockets_the_listener_and_the_waker(tmp_path):
    srv = Server(config(tmp_path, remoting="127.0.0.1:0"))
    listening = srv.remoting.listening
    waker = srv._waker
    srv.close()
    assert srv.router.closed and srv.pub.closed
    assert listening.fileno() == -1
    assert waker._reader.fileno() == -1


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


def test_hb_carries_the_wall_clock_in_ms(tmp_path, made):
    clock = Clock(100.0)
    srv = make(made, config(tmp_path, heartbeat_interval_s=0.5), clock=clock,
               wall_clock=lambda: 1234.5678)
    timers = srv.loop.sources[2]
    assert srv.timers.interval_ms == 500
    assert timers.next_deadline(100_000) == srv.timers.next_deadline()
    timers.run({}, 100_000, 100_005)
    sent: list[list[bytes]] = []
    srv.outbox._send = sent.append
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
        assert srv._waker.fd in ready  # the reload woke the loop
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
    assert srv._stopping
    assert srv._waker.fd in dict(srv.loop.poll.poller.poll(5000))


def test_freeing_a_megabyte_of_subscriptions_asks_for_a_heap_trim(tmp_path, made):
    srv = make(made, config(tmp_path))
    before = srv.heap.pending
    srv._subscriptions_freed(FREED_TRIM_BYTES - 1)
    assert srv.heap.pending == before
    srv._subscriptions_freed(FREED_TRIM_BYTES)
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

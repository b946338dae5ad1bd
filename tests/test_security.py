"""§9 CURVE: roles per key, broker-name binding, handshake refusal, SIGHUP reload."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner
from zmq.utils.monitor import recv_monitor_message

from helpers import Peer, register_fields, wait_for
from zns.core import schema
from zns.cli import main
from zns.core.errors import NoPermission
from zns.drivers.security import KeyPolicy, curve_client, load_policy, read_certificate, write_keypair


class Keys:
    """Key directories as an operator lays them out, made with `zns keygen`'s helper."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.server_secret = write_keypair(root / "server", "server")[1]
        self.server_public = read_certificate(self.server_secret)[0]
        for role in ("brokers", "admins", "clients"):
            (root / role).mkdir()

    def make(self, role: str | None, name: str, broker_names: str | None = None) -> str:
        """A key pair in `private/`; its public certificate listed under `role` (if any)."""
        public_file, secret_file = write_keypair(self.root / "private", name, broker_names)
        if role is not None:
            (self.root / role / f"{name}.key").write_text(Path(public_file).read_text())
        return secret_file

    def server_options(self, clients: str = "any") -> dict[str, str]:
        return dict(
            curve_secret=self.server_secret, brokers_keys=str(self.root / "brokers"),
            admins_keys=str(self.root / "admins"), clients_keys=str(self.root / "clients"),
            clients=clients,
        )


class CurvePeer(Peer):
    """helpers' raw Peer with CURVE on both sockets (`keypair` None: a fresh key pair)."""

    def __init__(self, router: str, pub: str, server_key: str, keypair: str | None) -> None:
        self.ctx = zmq.Context.instance()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        curve_client(self.dealer, server_key, keypair)
        self.dealer_monitor = self.dealer.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        self.dealer.connect(router)
        self.pub = pub
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        curve_client(self.sub, server_key, keypair)
        self.sub_monitor = self.sub.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        self.sub.connect(pub)
        self._next_id = 1

    def close(self) -> None:
        self.dealer.disable_monitor()
        self.sub.disable_monitor()
        self.dealer_monitor.close(0)
        self.sub_monitor.close(0)
        super().close()


def handshake(monitor: zmq.Socket, timeout: float = 10.0) -> int:
    """The first handshake outcome a socket's monitor reports."""
    assert monitor.poll(int(timeout * 1000)), "no handshake outcome"
    return recv_monitor_message(monitor)["event"]


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")


@pytest.fixture
def peers():
    made: list[CurvePeer] = []
    yield made
    for peer in made:
        peer.close()


def connect(srv, keys: Keys, keypair: str | None, peers: list) -> CurvePeer:
    peer = CurvePeer(srv.router, srv.pub, keys.server_public, keypair)
    peers.append(peer)
    return peer


def code_of(reply) -> str:
    return reply.code if isinstance(reply, schema.Error) else "ok"


# --- the role decision, sans-I/O ----------------------------------------------


def test_policy_matrix():
    decode = schema.decode_request
    register_a = decode(schema.encode({"op": "register_broker", **register_fields("a")}))
    register_b = decode(schema.encode({"op": "register_broker", **register_fields("b")}))
    kv_put = decode(schema.encode({"op": "kv_put", "namespace": "n", "key": "k", "value": "v"}))
    get_route = decode(schema.encode({"op": "get_route", "topic": "T"}))
    policy = KeyPolicy(brokers={"B": None, "BA": frozenset({"a"})}, admins=frozenset({"A"}),
                       clients=frozenset({"C"}), clients_any=False)

    def allowed(key, request) -> bool:
        try:
            policy.check(key, request)
        except NoPermission:
            return False
        return True

    assert [allowed(k, register_a) for k in ("B", "BA", "A", "C", None)] == [1, 1, 0, 0, 0]
    assert [allowed(k, register_b) for k in ("B", "BA")] == [True, False]
    assert [allowed(k, kv_put) for k in ("B", "A", "C")] == [False, True, False]
    assert [allowed(k, get_route) for k in ("B", "BA", "A", "C", "X")] == [1, 1, 1, 1, 0]
    assert [policy.accepts(k) for k in ("B", "A", "C", "X")] == [True, True, True, False]
    anyone = KeyPolicy(policy.brokers, policy.admins, policy.clients, clients_any=True)
    assert anyone.accepts("X")
    anyone.check("X", get_route)
    with pytest.raises(NoPermission):
        anyone.check("X", kv_put)


def test_keygen_writes_metadata_into_the_public_certificate(tmp_path):
    result = CliRunner().invoke(main, ["keygen", str(tmp_path), "b1", "--broker-names", "a, b"])
    assert result.exit_code == 0, result.output
    public, secret, metadata = read_certificate(tmp_path / "b1.key")
    assert secret is None and len(public) == 40
    assert metadata == {"broker_names": "a, b"}
    pair_public, pair_secret, _ = read_certificate(tmp_path / "b1.key_secret")
    assert pair_public == public and pair_secret is not None
    assert (tmp_path / "b1.key_secret").stat().st_mode & 0o077 == 0
    policy = load_policy(str(tmp_path), None, None, "listed")
    assert policy.brokers == {public: frozenset({"a", "b"})}


def test_key_options_without_curve_secret_are_refused(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--brokers-keys", str(tmp_path)])
    assert result.exit_code != 0
    assert "--curve-secret" in result.output


# --- live server ----------------------------------------------------------------


@pytest.mark.timeout(60)
def test_roles_over_curve(make_server, keys, peers):
    broker = keys.make("brokers", "broker")
    bound = keys.make("brokers", "bound-a", broker_names="broker-a")
    admin = keys.make("admins", "admin")
    srv = make_server(**keys.server_options(clients="any"))
    as_broker, as_bound, as_admin, as_anyone = (
        connect(srv, keys, k, peers) for k in (broker, bound, admin, None)
    )

    assert code_of(as_bound.call("register_broker", **register_fields("broker-a"))) == "ok"
    assert code_of(as_bound.call("register_broker", **register_fields(
        "broker-b", addr="10.0.0.2:10911"))) == "no_permission"
    assert code_of(as_broker.call("register_broker", **register_fields(
        "broker-b", addr="10.0.0.2:10911"))) == "ok"
    assert code_of(as_bound.call("heartbeat", **register_fields("broker-b", addr="10.0.0.2:10911",
                                                               topics={}))) == "no_permission"

    kv = dict(namespace="ns", key="k", value="v")
    assert [code_of(p.call("kv_put", **kv)) for p in (as_broker, as_anyone, as_admin)] == [
        "no_permission", "no_permission", "ok"]
    assert code_of(as_admin.call("register_broker", **register_fields("broker-c"))) == (
        "no_permission")
    for peer in (as_broker, as_bound, as_admin, as_anyone):  # §5 for every accepted key
        assert peer.ok("get_route", topic="TopicA").route.brokers
    snapshot = as_anyone.ok("snapshot")
    assert sorted(snapshot.brokers) == ["broker-a", "broker-b"]


@pytest.mark.timeout(60)
def test_events_flow_over_curve(make_server, keys, peers):
    broker_key = keys.make("brokers", "broker")
    srv = make_server(**keys.server_options())
    broker = connect(srv, keys, broker_key, peers)
    watcher = connect(srv, keys, None, peers)
    watcher.subscribe(b"route/", schema.HB_CHANNEL)
    watcher.wait_subscribed()
    broker.ok("register_broker", **register_fields())
    _, event = watcher.next_event(lambda ch, ev: ch == b"route/TopicA\0")
    assert event.route is not None


@pytest.mark.timeout(60)
def test_unknown_key_is_refused_at_the_handshake(make_server, keys, peers):
    listed = keys.make("clients", "listed")
    srv = make_server(**keys.server_options(clients="listed"))
    stranger = connect(srv, keys, None, peers)
    assert handshake(stranger.dealer_monitor) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert handshake(stranger.sub_monitor) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    try:  # with no connection accepted the DEALER has nowhere to queue it
        stranger.dealer.send(schema.encode({"op": "status", "id": 1}), zmq.NOBLOCK)
    except zmq.Again:
        pass
    assert not stranger.dealer.poll(300)  # gets nothing
    friend = connect(srv, keys, listed, peers)
    assert friend.ok("status").epoch
    assert code_of(friend.call("kv_list", namespace="ns")) == "no_permission"


@pytest.mark.timeout(60)
def test_plaintext_peer_gets_nothing_and_curve_off_warns(make_server, keys):
    srv = make_server(**keys.server_options())
    plain = Peer(srv.router)
    try:
        try:
            plain.dealer.send(schema.encode({"op": "status", "id": 1}), zmq.NOBLOCK)
        except zmq.Again:
            pass
        assert not plain.dealer.poll(300)
    finally:
        plain.close()
    # A split server's worker has bound and logged when make_server returns.
    assert "without CURVE" not in make_server(router="tcp://0.0.0.0:*",
                                              **keys.server_options()).output()
    assert "without CURVE" in make_server(router="tcp://0.0.0.0:*").output()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_sighup_reloads_keys_without_dropping_connections(process_server, keys, peers, workers):
    kept = keys.make("admins", "kept")
    removed = keys.make("admins", "removed")
    late = keys.make(None, "late")
    opts = keys.server_options(clients="listed")
    srv = process_server(*[a for k, v in opts.items()
                           for a in (f"--{k.replace('_', '-')}", v)], "--workers", workers)
    as_kept, as_removed = connect(srv, keys, kept, peers), connect(srv, keys, removed, peers)
    assert code_of(as_kept.call("kv_put", namespace="n", key="k", value="1")) == "ok"
    assert code_of(as_removed.call("kv_list", namespace="n")) == "ok"
    as_late = connect(srv, keys, late, peers)
    assert handshake(as_late.dealer_monitor) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert "refused a CURVE handshake from unknown key" in srv.output()

    (keys.root / "admins" / "late.key").write_text((keys.root / "private" / "late.key").read_text())
    (keys.root / "admins" / "removed.key").unlink()
    srv.proc.send_signal(signal.SIGHUP)  # with workers: the state process passes it on
    wait_for(lambda: srv.output().count("reloaded 0 broker, 2 admin") == max(1, int(workers)))

    # Established connections stay up; the policy is the new one for every request.
    assert code_of(as_kept.call("kv_get", namespace="n", key="k")) == "ok"
    removed_reply = as_removed.call("kv_list", namespace="n")
    assert code_of(removed_reply) == "no_permission"
    removed_key = read_certificate(removed)[0]
    wait_for(lambda: f"no_permission for key {removed_key}" in srv.output())
    # New handshakes: the added key gets in, the removed one is refused.
    assert code_of(connect(srv, keys, late, peers).call("kv_list", namespace="n")) == "ok"
    again = connect(srv, keys, removed, peers)
    assert handshake(again.dealer_monitor) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert srv.proc.poll() is None
    assert srv.stop() == 0


# --- the client side: BrokerAgent, RouteClient, tools, peer NameServers ----------------


@pytest.mark.timeout(60)
def test_broker_agent_and_route_client_over_curve(make_server, keys):
    from zns.drivers.broker_agent import BrokerAgent
    from zns.drivers.route_client import RouteClient
    from zns.drivers.security import curve_context

    broker_key = keys.make("brokers", "broker", broker_names="broker-a")
    srv = make_server(**keys.server_options(clients="any"))
    broker_ctx = curve_context(keys.server_public, broker_key)
    client_ctx = curve_context(str(keys.root / "server" / "server.key"))  # a fresh key pair
    agent = BrokerAgent(srv.router, cluster="c1", broker_name="broker-a",
                        broker_addr="10.0.0.1:10911", topics=["TopicA"], context=broker_ctx)
    client = RouteClient(srv.router, heartbeat_interval=0.2, context=client_ctx)
    try:
        wait_for(agent.registered_everywhere)
        assert client.route("TopicA").brokers[0].broker_name == "broker-a"
        seen = []
        client.watch("TopicB", lambda t, r: seen.append(r))
        agent.add_topic("TopicB")  # pushed over the CURVE PUB socket
        wait_for(lambda: seen and seen[-1] is not None)
    finally:
        client.close()
        agent.close(timeout=1)
        broker_ctx.destroy(linger=0)
        client_ctx.destroy(linger=0)


@pytest.mark.timeout(60)
def test_tools_take_the_server_key_and_a_keypair(process_server, keys):
    import os
    import subprocess
    import sys

    admin = keys.make("admins", "admin")
    opts = keys.server_options(clients="any")
    srv = process_server(*[a for k, v in opts.items() for a in (f"--{k.replace('_', '-')}", v)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}

    def zns(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
        # The `zns` entry point (and `python -m zns` serve the same commands).
        return subprocess.run([str(Path(sys.executable).parent / "zns"), *args, "--ns", srv.router,
                               "--timeout", "2"], env={**env, **extra_env},
                              capture_output=True, text=True, timeout=30)

    put = zns("kv", "put", "ns", "k", "v", "--server-key", keys.server_public, "--keypair", admin)
    assert put.returncode == 0, put.stderr
    got = zns("kv", "get", "ns", "k", ZNS_SERVER_KEY=keys.server_public, ZNS_KEYPAIR=admin)
    assert got.returncode == 0 and "v" in got.stdout, got.stderr
    anonymous = zns("kv", "put", "ns", "k", "w", "--server-key", keys.server_public)
    assert anonymous.returncode != 0 and "no_permission" in anonymous.stderr
    assert zns("status", "--server-key", keys.server_public).returncode == 0
    assert zns("status").returncode != 0  # plaintext gets nothing


@pytest.mark.timeout(60)
def test_peer_nameservers_hint_each_other_over_curve(make_server, keys):
    broker_key = keys.make("brokers", "hinted")  # before the servers read the key directories
    first = make_server(**keys.server_options(clients="listed"))
    second = make_server(peers=[first.router], peer_grace_s=1.0,
                         **keys.server_options(clients="listed"))
    peer = CurvePeer(second.router, second.pub, keys.server_public,
                     keys.server_secret)  # the shared server key is a client key too
    on_first = CurvePeer(first.router, first.pub, keys.server_public, broker_key)
    on_second = CurvePeer(second.router, second.pub, keys.server_public, broker_key)
    try:
        wait_for(lambda: peer.ok("status").peers == {first.router: True})
        # A hint must travel over CURVE and act: the broker leaves the first server, and
        # the second removes it as peer_expired, well before its own 4 s timeout.
        fields = register_fields(heartbeat_timeout_ms=4000)
        on_first.ok("register_broker", **fields)
        on_second.ok("register_broker", **fields)
        peer.subscribe(b"broker/")
        time.sleep(0.3)  # the subscription reaches the publisher
        on_first.ok("unregister_broker", **{k: fields[k] for k in
                                             ("cluster", "broker_name", "broker_id",
                                              "broker_addr")})
        _, event = peer.next_event(
            lambda ch, ev: getattr(ev, "change", "") == "removed", timeout=10)
        assert (event.change, event.reason) == ("removed", "peer_expired")
    finally:
        peer.close()
        on_first.close()
        on_second.close()


@pytest.mark.timeout(60)
@pytest.mark.single_process("reads the remoting listener's access lists from its service")
def test_curve_narrows_the_remoting_listener_and_says_so(make_server, keys, caplog):
    # Issue 21 item 6: a keyless remoting connection must not get what ZNS/1 keeps for keys.
    from zns.core.addresses import LOOPBACK

    with caplog.at_level(logging.WARNING, logger="zns"):
        srv = make_server(remoting="127.0.0.1:0", **keys.server_options(clients="listed"))
    service = srv.server.remoting.service
    assert (service.brokers, service.readers, service.admins) == (LOOPBACK, LOOPBACK, LOOPBACK)
    assert service.kv_reads_admin
    assert service.properties["remotingBrokers"] == "127.0.0.0/8,::1/128"
    assert service.properties["remotingClients"] == "127.0.0.0/8,::1/128"
    assert [r.getMessage() for r in caplog.records if "CURVE is on" in r.getMessage()] == [
        "CURVE is on but the remoting listener has no keys: it accepts broker requests "
        "(--remoting-brokers CIDR) and reads (--remoting-clients CIDR) from loopback only; "
        "name the networks to allow more"]
    plain = make_server(remoting="127.0.0.1:0", remoting_brokers=["10.0.0.0/8"])
    assert plain.server.remoting.service.properties["remotingClients"] == "any"
    assert not plain.server.remoting.service.kv_reads_admin

"""zns as the NameServer of the real RocketMQ 5.3.3: brokers, clients and mqadmin unchanged.

`zns serve --remoting` runs as a subprocess; real brokers, the real producer and push
consumer and the stock mqadmin commands are pointed at its remoting address, and what
they see is checked against zns's own view (the `zns` CLI, a ZNS/1 event watcher) and
against RocketMQ's own Java NameServer.

To keep the module short, one broker (`broker-a`) serves scenarios 1, 2, 4, 5 and 6: it
lists three NameServers, `zns-a;zns-b;java` (zns-a and zns-b are peers of each other),
so every registration reaches zns and the Java NameServer with the same data, and the
routes of the two can be compared field by field. It re-registers every 10 s
(`registerNameServerPeriod=10000`) instead of every 30 s. Scenario 3 starts and stops
two brokers of its own.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import rocketmq
from helpers import Peer, ProcessServer, free_port
from rocketmq import Broker, JavaNameServer, Phases, ProcessGroup, unique_topic, wait_until
from zns.core import schema
from zns.core.remoting import FrameDecoder, RemotingCommand, encode_command, loads_lenient
from zns.core.remoting.constants import RequestCode

pytestmark = pytest.mark.interop

REGISTER_PERIOD_MS = 10_000
GET_ALL_TOPIC_CONFIG = 21  # a broker request code: the broker's whole topic table


# ---- helpers -------------------------------------------------------------------------------

class Zns(ProcessServer):
    """`zns serve --remoting 127.0.0.1:0` in a subprocess; the remoting port is read from its log."""

    def __init__(self, workdir: Path, *args: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir, "--remoting", "127.0.0.1:0", *args)
        line = wait_until(lambda: next((ln for ln in self.output().splitlines()
                                        if "RocketMQ remoting listener on" in ln), None), 10,
                          "the remoting listener's log line")
        self.addr = line.rsplit(" ", 1)[1]  # what namesrvAddr and mqadmin -n take

    def cli(self, *args: str, check: bool = True) -> Any:
        """`python -m zns ARGS --ns ROUTER --json`: the parsed JSON (None when it printed none)."""
        cmd = [sys.executable, "-m", "zns", *args, "--ns", self.router, "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if check:
            assert proc.returncode == 0, (cmd, proc.stdout, proc.stderr)
        return json.loads(proc.stdout) if proc.stdout.strip() else None

    def clusters(self) -> dict[str, Any]:
        return self.cli("clusters")

    def route(self, topic: str) -> dict[str, Any] | None:
        return self.cli("route", topic, check=False)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)
        self.log.close()


class Watcher:
    """A ZNS/1 subscriber on `broker/` and `route/` (a Peer's SUB), collecting events in a thread."""

    def __init__(self, zns: Zns) -> None:
        self.peer = Peer(zns.router, zns.pub)
        self.peer.subscribe(b"broker/", b"route/", schema.HB_CHANNEL)
        self.peer.wait_subscribed()
        self.events: list[tuple[float, Any]] = []  # (monotonic arrival, event); no hb
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sub = self.peer.sub
        assert sub is not None
        while not self._stop.is_set():
            if not sub.poll(100):
                continue
            _channel, body = sub.recv_multipart()
            event = schema.decode_event(body)
            if isinstance(event, schema.HbEvent):
                continue
            with self._cond:
                self.events.append((time.monotonic(), event))
                self._cond.notify_all()

    def since(self, t: float = 0.0) -> list[Any]:
        with self._cond:
            return [ev for at, ev in self.events if at >= t]

    def wait_for(self, match: Callable[[Any], bool], timeout: float, what: str, since: float = 0.0) -> tuple[float, Any]:
        """The first event since `since` that matches, with its arrival time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for at, ev in self.events:
                    if at >= since and match(ev):
                        return at, ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no event within {timeout:.0f} s: {what}; got "
                                         f"{[ev for at, ev in self.events if at >= since][-10:]}")
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peer.close()


def broker_event(name: str, change: str, reason: str | None = None) -> Callable[[Any], bool]:
    return lambda ev: (isinstance(ev, schema.BrokerEvent) and ev.broker_name == name and ev.change == change
                       and (reason is None or ev.reason == reason))


def route_event(topic: str) -> Callable[[Any], bool]:
    return lambda ev: isinstance(ev, schema.RouteEvent) and ev.topic == topic


def event_route(ev: schema.RouteEvent) -> schema.TopicRoute | None:
    route = ev.route
    if isinstance(route, msgspec.Raw):
        return msgspec.msgpack.decode(route, type=schema.TopicRoute)
    return route


def remoting_request(addr: str, code: int, ext: dict[str, str] | None = None, *, version: int = 479,
                     timeout: float = 10.0) -> RemotingCommand:
    """One RocketMQ remoting request over a fresh TCP connection (as a client sends it)."""
    host, port = addr.rsplit(":", 1)
    request = RemotingCommand(code=code, version=version, opaque=7, ext_fields=ext)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_command(request))
        decoder = FrameDecoder()
        while True:
            data = sock.recv(1 << 16)
            assert data, f"connection closed before the reply to {code}"
            replies = decoder.feed(data)
            if replies:
                assert replies[0].opaque == 7 and replies[0].is_response
                return replies[0]


def broker_registrations(broker: Broker, addr: str) -> int:
    """How many registrations with NameServer `addr` the broker has completed so far."""
    try:
        text = (broker.log_dir / "broker.log").read_text("utf-8", "replace")
    except FileNotFoundError:
        return 0
    return text.count(f"Registering current broker to name server completed. TargetHost={addr}")


def mqadmin_ok(args: list[str], namesrv: str) -> rocketmq.Result:
    res = rocketmq.mqadmin(args, namesrv)
    assert res.rc == 0 and "Exception" not in res.stdout + res.stderr, res
    return res


# ---- the module's NameServers and broker ---------------------------------------------------------

class Env:
    """Everything the module shares, plus what one test leaves for a later one."""

    def __init__(self, zns_a: Zns, zns_b: Zns, java: JavaNameServer, watcher: Watcher, broker: Broker) -> None:
        self.zns_a, self.zns_b, self.java, self.watcher, self.broker = zns_a, zns_b, java, watcher, broker
        self.notes: dict[str, Any] = {}


@pytest.fixture(scope="module")
def env(rmq_module: ProcessGroup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    phase = Phases("setup")
    root = tmp_path_factory.mktemp("zns-nameservers")
    # zns-a and zns-b are peers (§10 hints). Each must name the other's request endpoint
    # before the other exists, so both routers get a port picked here, and both start at once.
    routers = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    started: list[Zns] = []
    watcher: Watcher | None = None
    java = rmq_module.namesrv(wait=False)  # its JVM boots while the two zns start

    def start(name: str, router: str, peer: str) -> Zns:
        z = Zns(root / name, "--router", router, "--peer", peer)  # the last --router wins
        started.append(z)
        return z

    try:
        zns_a, zns_b = rocketmq.in_parallel(lambda: start("zns-a", routers[0], routers[1]),
                                            lambda: start("zns-b", routers[1], routers[0]))
        assert (zns_a.router, zns_b.router) == tuple(routers), (zns_a.output(), zns_b.output())
        watcher = Watcher(zns_a)
        phase("zns-a, zns-b and the watcher up")
        java.wait_ready()
        phase("Java NameServer up")
        broker = rmq_module.broker(f"{zns_a.addr};{zns_b.addr};{java.addr}", "broker-a",
                                   config={"registerNameServerPeriod": REGISTER_PERIOD_MS})
        phase("broker-a registered with zns-a, zns-b and the Java NameServer")
        yield Env(zns_a, zns_b, java, watcher, broker)
    finally:
        if watcher is not None:
            watcher.close()
        for z in started:
            z.kill()


def broker_topics(broker: Broker) -> dict[str, dict[str, Any]]:
    """The broker's own topic table (GET_ALL_TOPIC_CONFIG, 21, asked of the broker), the truth zns should hold."""
    reply = remoting_request(broker.addr, GET_ALL_TOPIC_CONFIG)
    assert reply.code == 0, reply
    return loads_lenient(reply.body)["topicConfigTable"]


def zns_routes(zns: Zns, topics: list[str]) -> dict[str, schema.TopicRoute]:
    """The routes of `topics` in one ZNS/1 get_routes request; absent topics are left out."""
    peer = Peer(zns.router)
    try:
        reply = peer.ok("get_routes", topics=topics)
    finally:
        peer.close()
    return {name: msgspec.msgpack.decode(r, type=schema.TopicRoute) if isinstance(r, msgspec.Raw) else r
            for name, r in reply.routes.items()}


def queues_of(route: dict[str, Any], broker_name: str) -> dict[str, Any]:
    """The queue entry of `broker_name` in a `zns route --json` answer."""
    return next(q for q in route["route"]["queues"] if q["broker_name"] == broker_name)


# ---- scenario 1: a real broker registers --------------------------------------------------------

@pytest.mark.timeout(240)
def test_1_real_broker_registers(env: Env) -> None:
    phase = Phases("1 register")
    zns, broker = env.zns_a, env.broker
    _, registered = env.watcher.wait_for(broker_event("broker-a", "registered"), 10, "broker-a registered")
    assert (registered.cluster, registered.broker_id, registered.broker_addr) == ("DefaultCluster", 0, broker.addr)

    info = zns.clusters()
    assert info["clusters"] == {"DefaultCluster": ["broker-a"]}, info
    assert info["brokers"]["broker-a"]["addrs"] == {"0": broker.addr}, info
    assert [(b["broker_name"], b["broker_addr"]) for b in info["live"]] == [("broker-a", broker.addr)], info

    topics = broker_topics(broker)
    assert "TBW102" in topics, sorted(topics)
    listed = remoting_request(zns.addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert sorted(json.loads(listed.body)["topicList"]) == sorted(topics)
    cli_route = zns.route("TBW102")  # the CLI once; every topic below over ZNS/1 in one request
    assert cli_route is not None and queues_of(cli_route, "broker-a")["perm"] == topics["TBW102"]["perm"], cli_route
    routes = zns_routes(zns, list(topics))
    assert sorted(routes) == sorted(topics), routes.keys()
    for name, config in topics.items():
        route = routes[name]
        assert [(b.broker_name, b.addrs) for b in route.brokers] == [("broker-a", {0: broker.addr})], route
        assert [(q.broker_name, q.read_queues, q.write_queues, q.perm, q.sys_flag) for q in route.queues] == [
            ("broker-a", config["readQueueNums"], config["writeQueueNums"], config["perm"], config["topicSysFlag"])
        ], (name, route)
    phase(f"zns clusters, {len(topics)} routes and the `registered` event checked")
    env.notes["registered"] = (time.monotonic(), broker_registrations(broker, zns.addr), set(topics))
    phase.total()


# ---- scenario 2: 1,000 messages through an auto-created topic ---------------------------------

@pytest.mark.timeout(240)
def test_2_thousand_messages_to_an_auto_created_topic(env: Env) -> None:
    phase = Phases("2 produce/consume")
    zns = env.zns_a
    topic = unique_topic("zns_auto")
    env.notes["auto_topic"] = topic
    started = time.monotonic()
    sent = rocketmq.produce(zns.addr, topic, 1000)
    assert sent["sent"] == 1000 and sent["failed"] == 0, sent
    assert sent["brokers"] == {"broker-a": 1000}, sent
    phase("1,000 sent (the producer took TBW102's route as the template)")
    got = rocketmq.consume(zns.addr, topic, 1000, timeout=60, run_id=sent["run_id"], group=f"cg_{topic}")
    assert got["unique"] == 1000 and not got["timed_out"], got
    phase("1,000 consumed")

    # The broker registered the new topic on the first send; the watcher saw its route appear.
    _, ev = env.watcher.wait_for(route_event(topic), 5, f"route/{topic}", since=started)
    route = event_route(ev)
    assert route is not None and [q.broker_name for q in route.queues] == ["broker-a"], ev
    assert [b.addrs for b in route.brokers] == [{0: env.broker.addr}], ev
    assert zns_routes(zns, [topic])[topic] == route
    phase.total()


# ---- scenario 6: the same routes as RocketMQ's own NameServer ----------------------------------

ROUTE_FIELDS = ("brokerDatas", "queueDatas", "filterServerTable", "orderTopicConf")


@pytest.mark.timeout(180)
def test_6_same_routes_as_the_java_nameserver(env: Env) -> None:
    """broker-a registered the same topics with zns-a and the Java NameServer (scenarios 1 and 2):
    every route, the topic list and the cluster info must be the same, field by field.

    Nothing is normalised: no field legitimately differs. The bodies are compared parsed, since
    both servers write maps in Java HashMap order and only the order of keys could differ.
    """
    phase = Phases("6 vs Java")
    zns, java = env.zns_a, env.java
    auto = env.notes.get("auto_topic")
    topics = sorted(broker_topics(env.broker))
    assert auto in topics, (auto, topics)

    # What the Java client library makes of each answer (the harness's route mode), both topics.
    ours, theirs = rocketmq.in_parallel(lambda: rocketmq.route(zns.addr, auto), lambda: rocketmq.route(java.addr, auto))
    assert ours["ok"] and theirs["ok"], (ours, theirs)
    for field in ROUTE_FIELDS:
        assert ours[field] == theirs[field], (field, ours[field], theirs[field])
    phase("the client's TopicRouteData of the auto-created topic: equal")

    # The raw bodies of every topic, in both JSON forms (legacy: version < 401, standard: 479).
    for topic in topics:
        for version in (317, 479):
            ours = remoting_request(zns.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, version=version)
            theirs = remoting_request(java.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, version=version)
            assert (ours.code, ours.remark) == (theirs.code, theirs.remark) == (0, None), (topic, ours, theirs)
            assert loads_lenient(ours.body) == loads_lenient(theirs.body), (topic, version, ours.body, theirs.body)
            if version == 479:
                assert json.loads(ours.body) == json.loads(theirs.body)  # strict JSON both
    for code in (RequestCode.GET_BROKER_CLUSTER_INFO, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER):
        ours, theirs = remoting_request(zns.addr, code), remoting_request(java.addr, code)
        assert ours.code == theirs.code == 0
        a, b = loads_lenient(ours.body), loads_lenient(theirs.body)
        if code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            a["topicList"], b["topicList"] = sorted(a["topicList"]), sorted(b["topicList"])
        assert a == b, (code, ours.body, theirs.body)
    missing = [remoting_request(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "no_such_topic_zns"})
               for ns in (zns.addr, java.addr)]
    assert missing[0].code == missing[1].code == 17, missing
    phase(f"raw route bodies of {len(topics)} topics (both JSON forms), cluster info, topic list, code 17: equal")
    phase.total()


# ---- scenario 5: one broker, two zns peers ------------------------------------------------------

@pytest.mark.timeout(120)
def test_5_broker_registers_with_two_zns_peers(env: Env) -> None:
    phase = Phases("5 two zns")
    a, b = env.zns_a, env.zns_b
    assert env.broker.namesrv.split(";")[:2] == [a.addr, b.addr]
    for zns in (a, b):
        info = zns.clusters()
        assert info["brokers"]["broker-a"]["addrs"] == {"0": env.broker.addr}, (zns.addr, info)
        assert [x["broker_addr"] for x in info["live"] if x["broker_name"] == "broker-a"] == [env.broker.addr]
    topics = sorted(broker_topics(env.broker))
    assert zns_routes(a, topics) == zns_routes(b, topics)
    # Each took the other as a peer (§10): both report the link up.
    for zns, other in ((a, b), (b, a)):
        wait_until(lambda: next(iter(zns.cli("status").values())).get("peers") == {other.router: True}, 10,
                   f"{zns.router} reports its peer {other.router} connected")
    phase("broker-a is in both, with the same routes; each knows the other as a peer")
    phase.total()


# ---- scenario 1, continued: periodic re-registrations ----------------------------------------------

@pytest.mark.timeout(120)
def test_1_stays_registered_across_periodic_registrations(env: Env) -> None:
    """broker-a re-registers with every topic every 10 s; zns keeps it and publishes nothing for
    registrations that change nothing. Runs after scenarios 2, 6 and 5 so that their time counts
    towards the two periods it needs."""
    phase = Phases("1 periodic")
    zns, broker = env.zns_a, env.broker
    mark, count, topics = env.notes["registered"]
    # Each topic created since (scenario 2's, its consumer's %RETRY%) cost one registration of its own.
    created = len(set(broker_topics(broker)) - topics)
    wait_until(lambda: broker_registrations(broker, zns.addr) >= count + created + 2,
               3 * REGISTER_PERIOD_MS / 1000, "two periodic registrations of broker-a with zns-a")
    wait_until(lambda: time.monotonic() - mark >= 2 * REGISTER_PERIOD_MS / 1000, 3 * REGISTER_PERIOD_MS / 1000,
               "two registration periods")
    periods = broker_registrations(broker, zns.addr) - count - created
    phase(f"{periods} periodic registrations of broker-a, {time.monotonic() - mark:.0f} s after scenario 1")

    info = zns.clusters()
    assert [x["broker_addr"] for x in info["live"] if x["broker_name"] == "broker-a"] == [broker.addr], info
    events = env.watcher.since(mark)
    # Nothing about broker-a itself; no route event for any topic it had at scenario 1 (only the
    # topic scenario 2 created appeared, once).
    assert [ev for ev in events if isinstance(ev, schema.BrokerEvent) and ev.broker_name == "broker-a"] == []
    route_events = Counter(ev.topic for ev in events if isinstance(ev, schema.RouteEvent))
    assert not topics & set(route_events), route_events
    # Topics created since (scenario 2's and its consumer's %RETRY% topic): one event each, when
    # they first appeared; the periodic registrations that list them again publish nothing.
    assert env.notes["auto_topic"] in route_events and set(route_events.values()) == {1}, route_events
    phase.total()


# ---- scenario 4: mqadmin against zns -------------------------------------------------------------

def cluster_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.startswith("DefaultCluster")]


def namesrv_config(out: str, addr: str) -> dict[str, str]:
    assert f"============{addr}============" in out, out
    return dict((k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in out.splitlines())
                if k.strip() and not k.startswith("====") and _)


@pytest.mark.timeout(240)
def test_4_mqadmin_against_zns(env: Env) -> None:
    phase = Phases("4 mqadmin")
    zns, broker = env.zns_a, env.broker
    auto = env.notes["auto_topic"]
    key = unique_topic("zns_kv")

    def kv_round_trip() -> None:
        res = mqadmin_ok(["updateKvConfig", "-s", "ZNS_INTEROP", "-k", key, "-v", "v1"], zns.addr)
        assert "success" in res.stdout, res
        assert zns.cli("kv", "get", "ZNS_INTEROP", key)["value"] == "v1"
        got = remoting_request(zns.addr, RequestCode.GET_KV_CONFIG, {"namespace": "ZNS_INTEROP", "key": key})
        assert (got.code, got.ext_fields) == (0, {"value": "v1"}), got
        res = mqadmin_ok(["deleteKvConfig", "-s", "ZNS_INTEROP", "-k", key], zns.addr)
        assert "success" in res.stdout, res
        assert zns.cli("kv", "get", "ZNS_INTEROP", key, check=False)["error"] == "not_found"  # rc 1
        got = remoting_request(zns.addr, RequestCode.GET_KV_CONFIG, {"namespace": "ZNS_INTEROP", "key": key})
        assert got.code == 22, got  # QUERY_NOT_FOUND

    def raw_config() -> dict[str, str]:  # GET_NAMESRV_CONFIG over remoting: no JVM start
        reply = remoting_request(zns.addr, RequestCode.GET_NAMESRV_CONFIG)
        assert reply.code == 0, reply
        return dict((k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in
                                                            reply.body.decode().splitlines()) if k.strip() and _)

    # updateNamesrvConfig runs alongside the reads (one JVM start less on the critical path):
    # "nothing changed" is the config read over remoting before the batch and after it.
    config_before = raw_config()
    cluster, topic_list, topic_route, config, _, refused = rocketmq.in_parallel(
        lambda: mqadmin_ok(["clusterList"], zns.addr),
        lambda: mqadmin_ok(["topicList"], zns.addr),
        lambda: mqadmin_ok(["topicRoute", "-t", auto], zns.addr),
        lambda: mqadmin_ok(["getNamesrvConfig"], zns.addr),
        kv_round_trip,
        lambda: rocketmq.mqadmin(["updateNamesrvConfig", "-k", "maxTopics", "-v", "1"], zns.addr),
    )
    assert any(row[1] == "broker-a" and row[2] == "0" and row[3] == broker.addr for row in cluster_rows(cluster.stdout)), cluster
    listed = set(topic_list.stdout.split())
    assert {"TBW102", auto} <= listed, topic_list
    # mqadmin prints the route as fastjson writes it: integer map keys unquoted.
    route = loads_lenient(topic_route.stdout[topic_route.stdout.index("{"):].encode())
    assert [q["brokerName"] for q in route["queueDatas"]] == ["broker-a"], route
    assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": broker.addr}], route
    before = namesrv_config(config.stdout, zns.addr)
    assert before["remoting"] == zns.addr and before["router"] == zns.router, before
    assert before == config_before, (before, config_before)  # mqadmin shows what zns holds
    # updateNamesrvConfig is refused (NO_PERMISSION); mqadmin says so; nothing changed.
    assert "CODE: 16" in refused.stdout + refused.stderr and "refused" in refused.stdout + refused.stderr, refused
    assert "success" not in refused.stdout, refused
    assert raw_config() == config_before
    phase("clusterList, topicList, topicRoute, getNamesrvConfig, update/deleteKvConfig; "
          "updateNamesrvConfig refused, config unchanged")

    # wipeWritePerm / addWritePerm, against zns and the Java NameServer in one mqadmin call: the
    # same counts, the same perms. broker-a's periodic registrations in between change neither:
    # they carry the data version both already hold, so neither applies their topics again
    # (only topics missing from the route would be restored).
    both = f"{zns.addr};{env.java.addr}"

    def perms() -> list[dict[str, int]]:
        out = []
        for ns in (zns.addr, env.java.addr):
            reply = remoting_request(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
            tbw = loads_lenient(reply.body)["queueDatas"][0]["perm"]
            reply = remoting_request(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": auto})
            out.append({"TBW102": tbw, auto: loads_lenient(reply.body)["queueDatas"][0]["perm"]})
        return out

    n_topics = len(broker_topics(broker))
    wiped_at = time.monotonic()
    res = mqadmin_ok(["wipeWritePerm", "-b", "broker-a"], both)
    wiped = perms()
    for ns in (zns.addr, env.java.addr):  # Java counts every topic of the broker, changed or not
        assert f"wipe write perm of broker[broker-a] in name server[{ns}] OK, {n_topics}" in res.stdout, res
    _, ev = env.watcher.wait_for(route_event(auto), 5, "the wipe's route event", since=wiped_at)
    assert [q.perm for q in event_route(ev).queues] == [4], ev  # read only
    res = mqadmin_ok(["addWritePerm", "-b", "broker-a"], both)
    added = perms()
    for ns in (zns.addr, env.java.addr):
        assert f"add write perm of broker[broker-a] in name server[{ns}] OK, {n_topics}" in res.stdout, res
    assert wiped == [{"TBW102": 5, auto: 4}] * 2, wiped
    # ADD_WRITE_PERM sets perm to READ|WRITE (6) exactly, on both: TBW102's INHERIT bit
    # goes until the broker registers a new data version (zns does as Java, §6).
    assert added == [{"TBW102": 6, auto: 6}] * 2, added
    assert queues_of(zns.route(auto), "broker-a")["perm"] == 6
    phase("wipeWritePerm / addWritePerm")
    phase.total()


# ---- scenario 3: SIGKILL and SIGTERM ---------------------------------------------------------------

@pytest.mark.timeout(300)
def test_3_sigkill_one_broker_producer_keeps_sending_sigterm_unregisters(env: Env, rmq: ProcessGroup) -> None:
    phase = Phases("3 kill/term")
    zns, watcher = env.zns_a, env.watcher
    broker_b, broker_c = rmq.brokers(zns.addr, ["broker-b", "broker-c"])
    phase("broker-b and broker-c started and registered")
    topic = unique_topic("zns_failover")
    res = rocketmq.mqadmin(["updateTopic", "-c", "DefaultCluster", "-t", topic, "-r", "4", "-w", "4"], zns.addr)
    assert res.stdout.count("success") == 3, res
    everyone = {"broker-a", "broker-b", "broker-c"}
    wait_until(lambda: {q.broker_name for q in zns_routes(zns, [topic]).get(topic, schema.TopicRoute(
        topic, [], [], {})).queues} == everyone, 10, "the topic's route has all three brokers")
    phase("mqadmin updateTopic on the cluster; zns's route lists all three")

    # Stopped once it has sent enough after the kill; 100 s only bounds it: its waits, 30 s to
    # reach every broker, 10 for the removal and 60 after the kill (the loop ending first cut
    # the last short).
    with rocketmq.ProduceLoop(zns.addr, topic, duration=100, rate=25) as loop:
        loop.wait_until(lambda sends: {s.get("broker") for s in sends if s["ok"]} == everyone,
                        30, "sends reached every broker")
        phase("producer loop reached every broker")
        killed_at = time.monotonic()
        broker_b.kill()  # SIGKILL: no unregistration; zns learns it from the closed connection
        at, ev = watcher.wait_for(broker_event("broker-b", "removed"), 10, "broker-b removed", since=killed_at)
        assert ev.reason == "disconnected" and ev.broker_addr == broker_b.addr, ev
        print(f"  broker-b removed ({ev.reason}) {at - killed_at:.2f} s after SIGKILL")
        loop.wait_until(rocketmq.sent_after(killed_at, {"broker-a", "broker-c"}), 60,
                        f"{rocketmq.SENDS_AFTER_KILL} sends after the kill, to each survivor")
        summary = loop.stop()
    phase("producer loop ended")
    sends = loop.sends()
    after = rocketmq.check_sends_left_the_killed_broker(sends, killed_at, {"broker-a", "broker-c"},
                                                        summary)
    assert {q.broker_name for q in zns_routes(zns, [topic])[topic].queues} == {"broker-a", "broker-c"}

    term_at = time.monotonic()
    broker_c.shutdown()  # SIGTERM: the shutdown hook unregisters
    at, ev = watcher.wait_for(broker_event("broker-c", "removed"), 10, "broker-c removed", since=term_at)
    assert ev.reason == "unregistered" and ev.broker_addr == broker_c.addr, ev
    phase(f"broker-c unregistered after SIGTERM ({at - term_at:.2f} s)")
    info = zns.clusters()
    assert info["clusters"] == {"DefaultCluster": ["broker-a"]}, info
    assert {q.broker_name for q in zns_routes(zns, [topic])[topic].queues} == {"broker-a"}
    print(f"  sends: {len(sends)}, failed: {len(sends) - sum(s['ok'] for s in sends)}, after the kill: {len(after)}")
    phase.total()

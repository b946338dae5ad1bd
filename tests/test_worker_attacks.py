"""Each attack of tests/test_peer_resets.py against one worker of `zns serve --workers N`,
under load (issue 30 item 2; docs/operations.md, *Workers*).

The attacks are the file's own peers, with every connection kept only when it landed on
the attacked worker (the kernel spreads connections over the workers' shared ports). The
request-port attacks need the worker's loop busy while the peers fill their queues: three
registrations of 20,000 topics each, which every replica applies and publishes in its
loop, keep it busy as the file's busy server sleeps. The outcomes accepted are the file's two: the worker keeps serving, or it dies of
libzmq's assertion and nothing else. Either way, while writes and reads go on from other
clients: the state process lives on; no other worker dies; no route is lost on the other
worker or the replacement, over ZNS/1 and remoting; the epoch stays; the revisions go on
without a gap on the other worker's events; a RouteClient whose two connections were on the
dead worker follows the routes again without a new epoch or a switch, and its pull by
revision receives no route that did not change (no watcher is called); a RouteClient of the
other worker pulls nothing and changes nothing.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from helpers import (
    LOADED_DEADLINE, Peer, ProcessServer, register_fields, register_until, wait_for,
)
from test_peer_resets import (
    LIBZMQ_ASSERTION, _pings_past_the_budget, _pipeline, _reset, _reset_after_pings,
)
from test_remoting_listener import Client, register_cmd
from test_workers_serve import peer_on_worker, socket_inodes, sub_on_worker, worker_pid
from zns.core import schema
from zns.core.remoting import RemotingCommand
from zns.drivers.route_client import RouteClient

SEEDS = [f"Seed{i}" for i in range(20)]
MOVING = "Moving"  # changed after the attack: a client that sees it change follows again
ATTEMPTS_S = 20.0  # how long an events-port attack keeps trying while the worker lives


def tcp_connections(server_port: int) -> dict[int, str]:
    """The server sides of connections to `server_port`: client port -> socket inode."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == server_port and fields[9] != "0":
                found[int(fields[2].rsplit(":", 1)[1], 16)] = fields[9]
    return found


def holder(client_port: int, server_port: int, pids: list[int], timeout: float = 5.0) -> int | None:
    """The pid of the worker that accepted the connection from `client_port` (None: none
    did within `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inode = tcp_connections(server_port).get(client_port)
        for pid in pids:
            try:
                if inode is not None and inode in socket_inodes(pid):
                    return pid
            except OSError:
                pass
        time.sleep(0.01)
    return None


def our_ports(server_port: int) -> set[int]:
    """The local ports of this process's connections to `server_port`."""
    ours = socket_inodes(os.getpid())
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == server_port and fields[9] in ours:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def client_on(server: ProcessServer, pid: int, pids: list[int], ctx: zmq.Context) -> RouteClient:
    """A RouteClient following SEEDS whose request and events connections both landed on
    the worker `pid`."""
    router, pub = port_of(server.router), port_of(server.pub)
    for _ in range(100):
        before = our_ports(router) | our_ports(pub)
        # Silent for 3 intervals means gone: 9 s, longer than the attacks' busy windows
        # (a worker applying 60,000 route changes sends no `hb`), so that the death is
        # what the client sees, not a silence the test itself made.
        client = RouteClient(server.router, context=ctx, pull_period=3600, heartbeat_interval=3.0)
        for topic in [*SEEDS, MOVING]:
            client.route(topic)
        wait_for(lambda: client.driver.session.connected and client.driver.session.cache
                 .is_current(MOVING) and len((our_ports(router) | our_ports(pub)) - before) == 2)
        dealer = (our_ports(router) - before).pop()
        sub = (our_ports(pub) - before).pop()
        if holder(dealer, router, pids) == pid and holder(sub, pub, pids) == pid:
            return client
        client.close()
    raise AssertionError(f"no RouteClient landed on worker pid {pid} in 100 tries")


def routes_pulled(client: RouteClient) -> list[str]:
    """Every topic whose route `client` receives in a pull from now on (a topic answered
    `unchanged`, at the revision held, is not one)."""
    cache, received = client.driver.session.cache, []
    apply_pull = cache.apply_pull

    def recorded(epoch: str, routes: Any, *args: Any, **kwargs: Any) -> Any:
        received.extend(routes)
        return apply_pull(epoch, routes, *args, **kwargs)

    cache.apply_pull = recorded  # type: ignore[method-assign]
    return received


def remoting_on(endpoint: str, pid: int, pids: list[int]) -> Client:
    for _ in range(200):
        client = Client(endpoint)
        if holder(client.sock.getsockname()[1], port_of(endpoint), pids) == pid:
            return client
        client.close()
    raise AssertionError(f"no remoting connection landed on worker pid {pid}")


def remoting_route(client: Client, topic: str) -> RemotingCommand:
    return client.call(RemotingCommand(code=105, version=479, ext_fields={"topic": topic}))


# --- the attacks, aimed at one worker ----------------------------------------------------------

Attack = Callable[["Target", int], None]


class Target:
    """What an attack needs: the endpoints, the attacked worker, a writer on it."""

    def __init__(self, server: ProcessServer, victim: int, pids: list[int], writer: Peer) -> None:
        self.server, self.victim, self.writer = server, victim, writer
        self.router, self.pub = server.router, server.pub
        ports = {"router": port_of(server.router), "pub": port_of(server.pub)}
        self.lands = {name: (lambda sock, port=port: holder(sock.getsockname()[1], port, pids)
                             == victim) for name, port in ports.items()}


@contextmanager
def busy(target: Target, attempt: int) -> Iterator[None]:
    """The attacked worker's loop busy, as the file's busy server sleeps in its first
    request: three registrations of 20,000 topics each, sent at once, that every replica
    applies and publishes in its loop (their topic sets alternate, so each changes 40,000
    routes)."""
    while target.writer.dealer.poll(0):  # the answers to the last tries' registrations
        target.writer.dealer.recv()
    for n in range(3):
        prefix = "BusyA" if (attempt * 3 + n) % 2 else "BusyB"
        target.writer.dealer.send(schema.encode({
            "op": "register_broker", "id": attempt, **register_fields(
                broker_name="busy", addr="10.8.0.1:10911",
                topics={f"{prefix}{i}": {} for i in range(20_000)},
                data_version={"counter": attempt * 3 + n})}))
    time.sleep(0.2)
    yield


def requests_attack(ping_every: int | None) -> Attack:
    """tests/test_peer_resets.py's `_attack`: three peers fill their request queues while
    the worker is busy, and reset."""

    def attack(target: Target, attempt: int) -> None:
        with busy(target, attempt):
            peers = [_pipeline(target.router, 2_000, ping_every, target.lands["router"])
                     for _ in range(3)]
            time.sleep(0.5)  # libzmq reads until each queue holds 1,000 and stops reading
            for sock in peers:
                _reset(sock)

    return attack


def events_attack(peer: Callable[..., None]) -> Attack:
    """An events-port peer of the file (the events socket's queue of 2 is full at once: no
    busy loop needed)."""

    def attack(target: Target, attempt: int) -> None:
        peer(target.pub, attempt, target.lands["pub"])

    return attack


ATTACKS = {
    "requests-reset": requests_attack(None),
    "requests-pings": requests_attack(10),
    "events-reset-after-pings": events_attack(_reset_after_pings),
    "events-pings-past-the-budget": events_attack(_pings_past_the_budget),
}


def dead(pidfd: int, wait_s: float = 0.0) -> bool:
    return bool(select.select([pidfd], [], [], wait_s)[0])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers,attack", [
    *((2, name) for name in ATTACKS), (1, "events-reset-after-pings"),
])
def test_an_attacked_worker_dies_alone_and_nothing_else_notices(
        tmp_path: Path, workers: int, attack: str) -> None:
    server = ProcessServer(tmp_path, "--workers", str(workers), "--remoting", "127.0.0.1:0")
    ctx = zmq.Context()
    stop = threading.Event()
    acknowledged: list[str] = []
    failures: list[BaseException] = []
    clients: list[RouteClient] = []
    peers: list[Peer] = []
    remoting: list[Client] = []

    survivor_events: list[Any] = []

    def drain(sub: Peer) -> None:
        """The other worker's route events as they come (a queue at its high-water mark
        would drop some), until the load stops."""
        assert sub.sub is not None
        while not stop.is_set():
            if sub.sub.poll(100):
                channel, body = sub.sub.recv_multipart()
                if channel != schema.HB_CHANNEL:
                    survivor_events.append(schema.decode_event(body))

    def load() -> None:
        """Writes and reads of the seeds until stopped; a failure kept for the test's end."""
        try:
            register_until(stop, server.router, server.pub, acknowledged, "L", reads=SEEDS,
                           pause_s=0.01)  # at most 100 brokers a second: max_brokers is 10,000
        except BaseException as exc:
            failures.append(exc)

    try:
        wait_for(lambda: server.output().count("serving requests on") == workers)
        remoting_endpoint = re.findall(r"RocketMQ remoting on (\S+)", server.output())[0]
        pids = [worker_pid(server, w) for w in range(1, workers + 1)]
        state_pid, victim = server.proc.pid, pids[0]
        seeder = Peer(server.router, server.pub, ctx)
        peers.append(seeder)
        for i, topic in enumerate(SEEDS):
            seeder.ok("register_broker", **register_fields(
                broker_name=f"s{i}", addr=f"10.9.0.{i}:10911", topics={topic: {}}))
        seeder.ok("register_broker", **register_fields(
            broker_name="m", addr="10.9.1.1:10911", topics={MOVING: {"read_queues": 1}}))
        broker = Client(remoting_endpoint)
        remoting.append(broker)
        assert broker.call(register_cmd(topics=("Remote",))).code == 0
        epoch = seeder.ok("status").epoch

        writer = peer_on_worker(server, 1, ctx)
        peers.append(writer)
        victims_client = client_on(server, victim, pids, ctx)
        clients.append(victims_client)
        others_client = survivor_sub = None
        if workers == 2:
            others_client = client_on(server, pids[1], pids, ctx)
            clients.append(others_client)
            survivor_sub = sub_on_worker(server, 2, ctx)
            survivor_sub.subscribe(b"route/L")  # the load's topics, not the busy floods
            peers.append(survivor_sub)
            drainer = threading.Thread(target=drain, args=(survivor_sub,))
        seen_before = {c: (c.driver.session.pulls, c.driver.session.switches,
                           c.driver.session.cache.epoch) for c in clients}
        received = routes_pulled(victims_client)
        changes: list[tuple[str, Any]] = []
        for topic in SEEDS:
            victims_client.watch(topic, lambda t, r: changes.append((t, r)))
        wait_for(lambda: len(changes) == len(SEEDS))  # the first call of each watch
        changes.clear()

        loader = threading.Thread(target=load)
        loader.start()
        if survivor_sub is not None:
            drainer.start()
        wait_for(lambda: len(acknowledged) >= 20)
        target = Target(server, victim, pids, writer)
        pidfd = os.pidfd_open(victim)
        try:
            deadline, attempt = time.monotonic() + ATTEMPTS_S, 0
            while time.monotonic() < deadline and not dead(pidfd):
                attempt += 1
                try:
                    ATTACKS[attack](target, attempt)
                except OSError:  # refused or cut: it may have died meanwhile
                    pass
                dead(pidfd, 1.0)
                if attack.startswith("requests"):
                    break  # as in the file: one try (the queues of a busy loop)
            died = dead(pidfd, 6.0 if attack.startswith("requests") else 0.0)
        finally:
            os.close(pidfd)
        print(f"attempts: {attempt}; " + ("aborted by libzmq's assertion" if died
                                          else "kept serving"))
        if died:
            wait_for(lambda: f"worker 1 (pid {victim}) died" in server.output())
            assert f"worker 1 (pid {victim}) died (signal {signal.SIGABRT.value})" \
                in server.output(), server.output()[-3000:]
            assert LIBZMQ_ASSERTION in server.output()
            wait_for(lambda: worker_pid(server, 1) != victim)
            # Each worker 1, the replacement included, served the state its fork copied
            # (no dump decoded).
            wait_for(lambda: server.output().count("worker 1: loaded the state at seq") == 2)
            assert server.output().count("worker 1: took the state at seq") == 2
        seeder.ok("register_broker", **register_fields(
            broker_name="m", addr="10.9.1.1:10911", topics={MOVING: {"read_queues": 2}},
            data_version={"counter": 2}))
        count = len(acknowledged)
        wait_for(lambda: len(acknowledged) >= count + 20 or failures)
        assert not failures, failures
        stop.set()
        loader.join(30)
        assert not failures, failures

        # The state process lives; only the attacked worker died.
        assert server.proc.poll() is None and server.proc.pid == state_pid
        assert server.output().count(") died (") == (1 if died else 0), server.output()[-3000:]
        live = [worker_pid(server, w) for w in range(1, workers + 1)]
        assert live[1:] == pids[1:]
        # No route lost on any worker, the replacement included; the epoch is the same.
        last = seeder.ok("status").revision
        for worker in range(1, workers + 1):
            peer = peer_on_worker(server, worker, ctx)
            peers.append(peer)
            status = peer.ok("status")
            assert status.epoch == epoch and status.revision >= last
            routes = peer.ok("snapshot").routes
            missing = {*SEEDS, *acknowledged, "Remote"} - set(routes)
            assert not missing, (worker, missing)
            reader = remoting_on(remoting_endpoint, live[worker - 1], live)
            remoting.append(reader)
            for topic in ("Remote", SEEDS[0], acknowledged[-1]):
                assert remoting_route(reader, topic).code == 0, (worker, topic)
        # The other worker's subscriber saw the revisions go on (the busy registrations
        # take revisions too, unsubscribed): every acknowledged write since its first
        # event, in order, no new epoch.
        if survivor_sub is not None:
            drainer.join(30)
            while not survivor_events or survivor_events[-1].topic != acknowledged[-1]:
                channel, event = survivor_sub.next_event()
                if channel != schema.HB_CHANNEL:
                    survivor_events.append(event)
            assert {event.epoch for event in survivor_events} == {epoch}
            revisions = [event.revision for event in survivor_events]
            assert revisions == sorted(set(revisions))
            topics = {event.topic for event in survivor_events}
            first = min(acknowledged.index(t) for t in topics if t in acknowledged)
            assert not set(acknowledged[first:]) - topics, set(acknowledged[first:]) - topics
        # The dead worker's client follows again, in the same epoch, without a switch;
        # no watcher saw a change (the seeds did not change).
        session = victims_client.driver.session
        wait_for(lambda: victims_client.route(MOVING).queues[0].read_queues == 2
                 and all(session.cache.is_current(t) for t in SEEDS))
        assert session.cache.epoch == epoch and session.switches == seen_before[victims_client][1]
        for topic in SEEDS:
            assert victims_client.route(topic).brokers[0].broker_name == f"s{SEEDS.index(topic)}"
        # Its new events connection proven by an `hb`, and the pull that follows, by
        # revision: no seed's route is sent again (they did not change).
        wait_for(lambda: all(e.proven for e in session.cache._entries.values()))
        wait_for(lambda: all(session.cache.is_current(t) for t in SEEDS))
        assert not set(received) & set(SEEDS) and changes == [], received
        assert session.cache.epoch == epoch and session.switches == seen_before[victims_client][1]
        print(f"the dead worker's client: {session.pulls - seen_before[victims_client][0]} "
              f"pulls since the attack, routes received: {sorted(set(received))} "
              f"({len(SEEDS) + 1} topics followed)")
        # The other worker's client pulled nothing and changed nothing.
        if others_client is not None:
            assert (others_client.driver.session.pulls, others_client.driver.session.switches,
                    others_client.driver.session.cache.epoch) == seen_before[others_client]
    finally:
        stop.set()
        for client in clients:
            client.close()
        for peer in peers:
            peer.close()
        for sock in remoting:
            sock.close()
        ctx.destroy(linger=0)
        assert server.stop() == 0

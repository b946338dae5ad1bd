"""zns.drivers.subscribers in process: an XPUB bound as the server binds it, SUBs connecting,
`handle()` called by the test (no server loop): what is counted, who is cut and what the
log and the `freed` callback say."""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
from collections.abc import Callable, Iterator

import pytest
import zmq

from zns.core.subscriptions import SubscriptionBudget, subscription_cost
from zns.drivers import subscribers as subscribers_module
from zns.drivers.descriptors import Listener
from zns.drivers.subscribers import MONITORED, RCVHWM, READ_PER_PASS, Subscribers

from helpers import wait_for

pytestmark = pytest.mark.timeout(60)


class Port:
    """The events port: an XPUB bound through our own listening socket, and its Subscribers."""

    def __init__(self, ctx: zmq.Context, budget: SubscriptionBudget) -> None:
        self.ctx = ctx
        self.xpub = ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.LINGER, 0)
        self.freed: list[int] = []
        self.subscribers = Subscribers(self.xpub, budget, freed=self.freed.append)
        self.listener = Listener(self.xpub, "tcp://127.0.0.1:0")
        self.subscribers.bound(self.listener.listening, self.listener.endpoint)
        self.subs: list[zmq.Socket] = []

    def sub(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.listener.endpoint)
        self.subs.append(sock)
        return sock

    def pump(self, until) -> None:
        """handle() until `until()` holds (subscriptions arrive asynchronously)."""
        def step() -> bool:
            self.subscribers.handle()
            return bool(until())
        wait_for(step, timeout=10)

    def close(self) -> None:
        for sock in self.subs:
            sock.close(0)
        self.listener.close()
        self.xpub.close(0)


@pytest.fixture
def port_of(ctx: zmq.Context) -> Iterator[Callable[[SubscriptionBudget], Port]]:
    """Makes events ports on `ctx`, each closed after the test."""
    made: list[Port] = []

    def make(budget: SubscriptionBudget) -> Port:
        made.append(Port(ctx, budget))
        return made[-1]

    yield make
    for port in made:
        port.close()


def _fd_of(budget: SubscriptionBudget) -> int:
    (fd,) = budget.peers()  # the one connection counted
    return fd


def test_the_xpub_reads_at_most_2_subscriptions_ahead(port_of) -> None:
    port = port_of(SubscriptionBudget())
    assert port.xpub.getsockopt(zmq.RCVHWM) == RCVHWM == 2
    assert MONITORED == zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
    assert READ_PER_PASS == 10_000


def test_a_subscription_is_counted_and_an_unsubscription_uncounted(port_of) -> None:
    budget = SubscriptionBudget()
    port = port_of(budget)
    sub = port.sub()
    sub.subscribe(b"route/T1")
    port.pump(lambda: budget.held)
    fd = _fd_of(budget)
    assert budget.cost(fd) == subscription_cost(b"route/T1")
    sub.subscribe(b"route/T2")
    port.pump(lambda: budget.cost(fd) > subscription_cost(b"route/T1"))
    assert budget.cost(fd) == subscription_cost(b"route/T1") + subscription_cost(b"route/T2")
    sub.unsubscribe(b"route/T1")
    port.pump(lambda: budget.cost(fd) == subscription_cost(b"route/T2"))
    assert port.freed == []


def test_the_xpub_passes_every_subscription_up_even_a_repeat(port_of) -> None:
    # XPUB_VERBOSE: a second subscriber's subscription to the same channel is seen too.
    budget = SubscriptionBudget()
    port = port_of(budget)
    port.sub().subscribe(b"route/T")
    port.pump(lambda: len(budget.peers()) == 1)
    port.sub().subscribe(b"route/T")
    port.pump(lambda: len(budget.peers()) == 2)
    assert budget.held == 2 * subscription_cost(b"route/T")


def test_the_xpub_passes_every_unsubscription_up(port_of) -> None:
    # XPUB_VERBOSER: an unsubscription from a channel another subscriber still holds.
    budget = SubscriptionBudget()
    port = port_of(budget)
    a, b = port.sub(), port.sub()
    a.subscribe(b"route/T")
    b.subscribe(b"route/T")
    port.pump(lambda: budget.held == 2 * subscription_cost(b"route/T"))
    a.unsubscribe(b"route/T")
    port.pump(lambda: budget.held == subscription_cost(b"route/T"))


def test_a_connection_over_its_budget_is_cut_logged_and_its_cost_freed(port_of, caplog) -> None:
    cost = subscription_cost(b"route/T1")
    budget = SubscriptionBudget(per_peer=cost + 10, total=10**9)
    port = port_of(budget)
    sub = port.sub()
    sub.subscribe(b"route/T1")
    port.pump(lambda: budget.held)
    fd = _fd_of(budget)
    sub.subscribe(b"route/T2")  # over: cut
    port.pump(lambda: budget.cut)
    assert port.freed == [cost]  # what it held before the one that went over
    assert fd in port.subscribers.cutting
    (record,) = [r for r in caplog.records if r.name == "zns"]
    assert record.levelno == logging.WARNING
    assert re.fullmatch(r"""events subscriber "\('127\.0\.0\.1', \d+\)" disconnected: its """
                        rf"subscriptions cost more than its budget of {cost + 10} bytes "
                        r"\(1 cut since start\)", record.getMessage())
    assert budget.cost(fd) == 0 and budget.held == 0
    # libzmq reports it closed: the descriptor names nobody any more
    port.subscribers.on_monitor_event(zmq.EVENT_DISCONNECTED, fd)
    assert fd not in port.subscribers.cutting and port.freed == [cost]


def test_over_the_total_the_largest_holder_is_cut_for_its_share(port_of, caplog) -> None:
    small, large = subscription_cost(b"a"), subscription_cost(b"b" * 50)
    budget = SubscriptionBudget(per_peer=10**9, total=large + small)
    port = port_of(budget)
    first = port.sub()
    first.subscribe(b"b" * 50)
    port.pump(lambda: budget.held == large)
    big_fd = _fd_of(budget)
    second = port.sub()
    second.subscribe(b"a")
    port.pump(lambda: budget.held == large + small)
    second.subscribe(b"c")  # over the total: the largest holder (the first) goes
    port.pump(lambda: budget.cut)
    assert big_fd in port.subscribers.cutting
    assert port.freed == [10**9]  # its budget, not what it held
    (record,) = [r for r in caplog.records if r.name == "zns"]
    assert record.getMessage().endswith(
        f" disconnected: its subscriptions cost more than their share of the total budget of "
        f"{large + small} bytes (1 cut since start)")


def test_a_connection_closed_is_forgotten_and_its_cost_freed_one_accepted_keeps_its_count(
        port_of) -> None:
    # The accept may be reported after the connection's first subscriptions were counted:
    # forgetting them then let a subscriber past its budget (seen through a relay).
    budget = SubscriptionBudget()
    port = port_of(budget)
    budget.subscribed(7, b"route/T")
    port.subscribers.cutting.add(7)
    port.subscribers.on_monitor_event(zmq.EVENT_CONNECTED, 7)  # not one of ours: ignored
    assert budget.cost(7) and 7 in port.subscribers.cutting
    port.subscribers.on_monitor_event(zmq.EVENT_ACCEPTED, 7)
    assert budget.cost(7) == subscription_cost(b"route/T") and port.freed == []
    assert 7 not in port.subscribers.cutting and 7 in port.subscribers.connections
    port.subscribers.on_monitor_event(zmq.EVENT_DISCONNECTED, 7)
    assert budget.cost(7) == 0 and port.freed == [subscription_cost(b"route/T")]
    assert 7 not in port.subscribers.connections
    port.subscribers.on_monitor_event(zmq.EVENT_DISCONNECTED, 7)  # nothing held: nothing freed
    assert port.freed == [subscription_cost(b"route/T")]


def test_a_message_that_is_no_subscription_is_not_counted(ctx, port_of) -> None:
    budget = SubscriptionBudget()
    port = port_of(budget)
    xsub = ctx.socket(zmq.XSUB)
    xsub.setsockopt(zmq.LINGER, 0)
    port.subs.append(xsub)
    xsub.connect(port.listener.endpoint)
    xsub.send(b"")            # empty
    xsub.send(b"\x02abc")     # neither subscribe (1) nor unsubscribe (0)
    xsub.send(b"\x01abc")     # a subscription: counted
    port.pump(lambda: budget.held)
    assert budget.held == subscription_cost(b"abc")
    xsub.send(b"\x00abc")
    port.pump(lambda: budget.held == 0)


def test_a_descriptor_not_of_the_events_port_is_never_cut(port_of, caplog) -> None:
    budget = SubscriptionBudget()
    port = port_of(budget)
    other = socket.socket()
    server = socket.socket()
    try:
        server.bind(("127.0.0.1", 0))
        server.listen()
        other.connect(server.getsockname())
        conn, _ = server.accept()
        with conn:
            port.subscribers.cut(conn.fileno(), 5)  # another port's connection: untouched
            assert port.freed == [] and not port.subscribers.cutting
            conn.setblocking(False)
            other.send(b"x")
            wait_for(lambda: _readable(conn), timeout=5)
            assert conn.recv(1) == b"x"
            listening = socket.socket()
            listening.bind(("127.0.0.1", 0))
            port.subscribers.cut(listening.fileno(), 5)  # not connected: no peer name
            listening.close()
        port.subscribers.cut(10**6, 5)  # no such descriptor
        port.subscribers.local = None
        budget.subscribed(3, b"x")
        assert port.freed == [] and not caplog.records
    finally:
        other.close()
        server.close()


def test_an_unbound_port_cuts_nobody(ctx) -> None:
    xpub = ctx.socket(zmq.XPUB)
    try:
        subscribers = Subscribers(xpub, SubscriptionBudget())
        subscribers.bound(None, "inproc://x")
        assert subscribers.local is None
        subscribers.bound(None, "ipc:///tmp/zns-events")
        assert subscribers.local == (socket.AF_UNIX, "/tmp/zns-events")
        a, b = socket.socketpair()
        with a, b:
            subscribers.local = None
            subscribers.cut(a.fileno(), 1)  # a pair of ours, but no port known: kept
            assert not subscribers.cutting
            subscribers.local = (socket.AF_UNIX, "")  # an unnamed unix socket's own "port"
            subscribers.cut(a.fileno(), 1)
            assert subscribers.cutting == {a.fileno()}
            assert b.recv(1) == b""  # shut down
            subscribers.cut(a.fileno(), 1)  # already shut down: ENOTCONN is not an error
    finally:
        xpub.close(0)


def test_the_default_freed_callback_does_nothing(ctx) -> None:
    xpub = ctx.socket(zmq.XPUB)
    try:
        budget = SubscriptionBudget()
        subscribers = Subscribers(xpub, budget)
        budget.subscribed(4, b"x")
        subscribers.on_monitor_event(zmq.EVENT_DISCONNECTED, 4)
        assert budget.cost(4) == 0
    finally:
        xpub.close(0)


def _readable(sock: socket.socket) -> bool:
    import select
    return bool(select.select([sock], [], [], 0)[0])


def test_what_a_connection_being_cut_still_sends_is_not_counted(port_of) -> None:
    budget = SubscriptionBudget()
    port = port_of(budget)
    sub = port.sub()
    sub.subscribe(b"route/T1")
    port.pump(lambda: budget.held)
    fd = _fd_of(budget)
    port.subscribers.cutting.add(fd)  # cut, and libzmq has not yet reported it closed
    sub.subscribe(b"route/T2")
    wait_for(lambda: port.xpub.poll(0), timeout=10)
    port.subscribers.handle()
    assert budget.cost(fd) == subscription_cost(b"route/T1")


def test_a_subscription_whose_connection_has_no_descriptor_is_not_counted(ctx) -> None:
    budget = SubscriptionBudget()
    xpub = ctx.socket(zmq.XPUB)
    sub = ctx.socket(zmq.SUB)
    try:
        subscribers = Subscribers(xpub, budget)
        xpub.bind("inproc://no-descriptor")  # inproc: libzmq names no descriptor (SRCFD fails)
        sub.connect("inproc://no-descriptor")
        sub.subscribe(b"route/T")
        wait_for(lambda: xpub.poll(0), timeout=10)
        subscribers.handle()
        assert budget.held == 0 and budget.peers() == []
        assert xpub.poll(0) == 0  # read, not left waiting
    finally:
        sub.close(0)
        xpub.close(0)


class FakeFrame:
    def __init__(self, data: bytes, fd: int | None) -> None:
        self.bytes = data
        self._fd = fd

    def get(self, option: int) -> int:
        assert option == zmq.SRCFD
        if self._fd is None:
            raise zmq.ZMQError(errno.EINVAL)
        return self._fd


class FakeXPub:
    """Hands `handle()` the frames queued by the test, then zmq.Again."""

    def __init__(self) -> None:
        self.frames: list[FakeFrame] = []
        self.options: dict[int, int] = {}

    def setsockopt(self, option: int, value: int) -> None:
        self.options[option] = value

    def recv(self, flags: int = 0, copy: bool = True) -> FakeFrame:
        assert flags == zmq.NOBLOCK and copy is False
        if not self.frames:
            raise zmq.Again()
        return self.frames.pop(0)


def test_one_pass_reads_every_waiting_message_past_the_ones_it_skips() -> None:
    xpub, budget = FakeXPub(), SubscriptionBudget()
    subscribers = Subscribers(xpub, budget)  # type: ignore[arg-type]
    assert xpub.options == {zmq.XPUB_VERBOSE: 1, zmq.XPUB_VERBOSER: 1, zmq.RCVHWM: 2}
    subscribers.cutting.add(9)
    xpub.frames = [
        FakeFrame(b"", 5),            # empty
        FakeFrame(b"\x02zz", 5),      # not a (un)subscription
        FakeFrame(b"\x01yy", None),   # no descriptor
        FakeFrame(b"\x01xx", 9),      # a connection being cut
        FakeFrame(b"\x01ab", 5),
        FakeFrame(b"\x00ab", 5),      # unsubscribed at once
        FakeFrame(b"\x01cd", 5),
        FakeFrame(b"\x01cd", 0),      # descriptor 0 is a descriptor like any other
    ]
    subscribers.handle()
    assert xpub.frames == []
    assert budget.peers() == [5, 0]
    assert budget.channels(5) == budget.channels(0) == {b"cd"}


def test_one_pass_reads_at_most_10000_messages() -> None:
    xpub, budget = FakeXPub(), SubscriptionBudget()
    subscribers = Subscribers(xpub, budget)  # type: ignore[arg-type]
    xpub.frames = [FakeFrame(b"\x01%d" % i, 5) for i in range(READ_PER_PASS + 3)]
    subscribers.handle()
    assert len(xpub.frames) == 3 and len(budget.channels(5)) == READ_PER_PASS


class _Refusing(socket.socket):
    error = errno.ENOTCONN

    def shutdown(self, how: int) -> None:
        raise OSError(self.error, os.strerror(self.error))


@pytest.mark.parametrize("error, raised", [(errno.ENOTCONN, False), (errno.EBADF, True)])
def test_a_connection_already_gone_when_cut_is_no_error(monkeypatch, error, raised) -> None:
    import types

    _Refusing.error = error
    monkeypatch.setattr(subscribers_module, "socket", types.SimpleNamespace(
        socket=_Refusing, AF_UNIX=socket.AF_UNIX, SHUT_RDWR=socket.SHUT_RDWR))
    subs = Subscribers(FakeXPub(), SubscriptionBudget(per_peer=7))  # type: ignore[arg-type]
    a, b = socket.socketpair()
    with a, b:
        subs.local = (socket.AF_UNIX, "")
        if raised:
            with pytest.raises(OSError):
                subs.cut(a.fileno(), "over")
        else:
            assert subs.cut(a.fileno(), "over") is True  # cut: the caller frees its cost


def test_a_look_skips_descriptors_that_are_not_tcp_connections_or_are_gone(port_of) -> None:
    # The numbers come from the monitor and may be stale by the time of a look: a closed
    # descriptor, a file, a unix socket are skipped, not a bug in the publishing loop.
    from zns.core.subscriptions import LOOK_EVERY_BYTES

    port = port_of(SubscriptionBudget())
    a, b = socket.socketpair()
    with a, b, open(os.devnull) as file:
        for fd in (a.fileno(), file.fileno(), 10**6):
            port.subscribers.on_monitor_event(zmq.EVENT_ACCEPTED, fd)
        for _ in range(3):  # three looks
            for _ in range(LOOK_EVERY_BYTES // 1024):
                port.subscribers.sent(1024)
        assert port.subscribers.queued.cut == 0

"""zns.drivers.descriptors in process: the limit raised, listening sockets of our own, the
guard's monitor reading, pausing, shedding (a real forked child) and resuming, with `now`
passed in. The end-to-end case (a server out of descriptors) is in test_server_hardening.py."""

from __future__ import annotations

import errno
import logging
import os
import resource
import select
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from zns.core.accept_pause import HEADROOM, RETRY_MS
from zns.drivers import descriptors
from zns.drivers.descriptors import (
    MONITOR_EVENTS_PER_PASS,
    OUT_OF_FDS,
    SHED_PER_PASS,
    SHED_WAIT_MS,
    DescriptorGuard,
    Listener,
    listen_tcp,
    raise_descriptor_limit,
)
from zns.drivers.loop import PollSet

from helpers import wait_for

pytestmark = pytest.mark.timeout(60)

# The function itself: the guard below stands in for it in the test process.
_REAL_CLOSE_ALL_BUT = descriptors._close_all_but


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "zns" and r.levelno == logging.WARNING]


# --- raise_descriptor_limit --------------------------------------------------------------


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"limits": (1024, 4096), "set": [], "fail": None}

    def getrlimit(which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return state["limits"]

    def setrlimit(which: int, value: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        if state["fail"] is not None:
            raise state["fail"]
        state["set"].append(value)

    monkeypatch.setattr(descriptors.resource, "getrlimit", getrlimit)
    monkeypatch.setattr(descriptors.resource, "setrlimit", setrlimit)
    return state


def test_the_soft_limit_is_raised_to_the_hard_one(limits) -> None:
    assert raise_descriptor_limit() == 4096
    assert limits["set"] == [(4096, 4096)]


def test_a_limit_already_at_the_hard_one_is_left_alone(limits) -> None:
    limits["limits"] = (4096, 4096)
    assert raise_descriptor_limit() == 4096
    assert limits["set"] == []


def test_an_unlimited_hard_limit_raises_the_soft_one_to_a_million(limits) -> None:
    limits["limits"] = (1024, resource.RLIM_INFINITY)
    assert raise_descriptor_limit() == 1 << 20
    assert limits["set"] == [(1 << 20, resource.RLIM_INFINITY)]
    limits["set"].clear()
    limits["limits"] = ((1 << 20) + 5, resource.RLIM_INFINITY)
    assert raise_descriptor_limit() == (1 << 20) + 5


@pytest.mark.parametrize("error", [ValueError("not allowed"), OSError(errno.EPERM, "not permitted")])
def test_a_limit_that_cannot_be_raised_is_kept_with_a_warning(limits, caplog, error) -> None:
    limits["fail"] = error
    assert raise_descriptor_limit() == 1024
    assert _warnings(caplog) == [f"could not raise the open-file limit from 1024 to 4096: {error}"]


# --- listen_tcp ----------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["*", "", "0.0.0.0"])
def test_a_wildcard_host_listens_on_every_ipv4_address(host: str) -> None:
    with listen_tcp(host, 0) as listening:
        assert listening.family == socket.AF_INET
        assert listening.getsockname()[0] == "0.0.0.0" and listening.getsockname()[1] > 0
        assert listening.getblocking() is False
        assert listening.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert listening.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1


def test_a_named_host_is_resolved_and_an_ipv6_one_taken_as_it_is() -> None:
    with listen_tcp("localhost", 0) as listening:
        assert listening.family == socket.AF_INET and listening.getsockname()[0] == "127.0.0.1"
    with listen_tcp("127.0.0.1", 0) as listening:
        port = listening.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            wait_for(lambda: select.select([listening], [], [], 0)[0], timeout=5)
    if not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    with listen_tcp("[::1]", 0) as listening:
        assert listening.family == socket.AF_INET6 and listening.getsockname()[0] == "::1"
    with listen_tcp("::1", 0) as listening:
        assert listening.family == socket.AF_INET6


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_only_brackets_are_taken_off_a_host(monkeypatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(descriptors.socket, "gethostbyname", lambda host: asked.append(host) or "127.0.0.1")
    with listen_tcp("Xhost", 0):
        pass
    with listen_tcp(" [named] ", 0):
        pass
    assert asked == ["Xhost", " [named] "]


def test_a_port_that_cannot_be_bound_raises_and_leaves_no_descriptor() -> None:
    with listen_tcp("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError):
            listen_tcp("127.0.0.1", port)
        assert len(os.listdir("/proc/self/fd")) == before


# --- Listener --------------------------------------------------------------------------------


def test_a_tcp_endpoint_is_bound_through_a_listening_socket_of_ours(ctx) -> None:
    sock = ctx.socket(zmq.ROUTER)
    listener = Listener(sock, "tcp://127.0.0.1:0")
    try:
        assert listener.listening is not None
        port = listener.listening.getsockname()[1]
        assert listener.endpoint == f"tcp://127.0.0.1:{port}"
        assert sock.getsockopt(zmq.USE_FD) == listener.listening.fileno()
        assert listener.shed == 0 and listener.on_event is None
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(listener.endpoint)
        dealer.send(b"hello")
        assert sock.poll(10_000) and sock.recv_multipart()[1] == b"hello"
        dealer.close(0)
    finally:
        listener.close()
        sock.close(0)


@pytest.mark.parametrize("port", ["*", "0"])
def test_a_wildcard_port_takes_any_free_one(ctx, port: str) -> None:
    sock = ctx.socket(zmq.ROUTER)
    listener = Listener(sock, f"tcp://127.0.0.1:{port}")
    try:
        assert listener.endpoint.startswith("tcp://127.0.0.1:")
        assert int(listener.endpoint.rsplit(":", 1)[1]) > 0
    finally:
        listener.close()
        sock.close(0)


def test_an_ipv6_endpoint_is_shown_in_brackets(ctx) -> None:
    if not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.IPV6, 1)
    listener = Listener(sock, "tcp://[::1]:0")
    try:
        assert listener.endpoint.startswith("tcp://[::1]:")
    finally:
        listener.close()
        sock.close(0)


def test_an_endpoint_that_is_not_tcp_is_bound_as_it_is(ctx, tmp_path) -> None:
    sock = ctx.socket(zmq.ROUTER)
    listener = Listener(sock, f"ipc://{tmp_path}/s")
    try:
        assert listener.listening is None
        assert listener.endpoint == f"ipc://{tmp_path}/s"
    finally:
        listener.close()
        sock.close(0)


class RefusingSocket:
    """A zmq socket whose bind fails (what Listener does with the listening socket then)."""

    def __init__(self) -> None:
        self.options: dict[int, Any] = {}

    def setsockopt(self, option: int, value: Any) -> None:
        self.options[option] = value

    def bind(self, endpoint: str) -> None:
        raise zmq.ZMQError(errno.EADDRINUSE)


def test_a_bind_that_fails_closes_the_listening_socket() -> None:
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(zmq.ZMQError):
        Listener(RefusingSocket(), "tcp://127.0.0.1:0")  # type: ignore[arg-type]
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(zmq.ZMQError):
        Listener(RefusingSocket(), "ipc:///nowhere")  # type: ignore[arg-type]


def test_closing_a_listener_leaves_the_descriptor_to_libzmq(ctx) -> None:
    sock = ctx.socket(zmq.ROUTER)
    listener = Listener(sock, "tcp://127.0.0.1:0")
    fd = listener.listening.fileno()  # type: ignore[union-attr]
    listener.close()
    assert listener.monitor.closed
    assert listener.listening.fileno() == -1  # type: ignore[union-attr]
    os.fstat(fd)  # still open: libzmq closes it with its socket
    listener.close()  # twice: the monitor is already disabled, nothing raised
    sock.close(0)


# --- the guard -------------------------------------------------------------------------------


def monitor_message(event: int, value: int) -> list[bytes]:
    return [struct.pack("=hi", event, value), b"tcp://127.0.0.1:1"]


class Rig:
    """A guard with one listener whose monitor is replaced by a PAIR the test writes to."""

    def __init__(self, ctx: zmq.Context, limit: int = 1 << 20) -> None:
        self.ctx = ctx
        self.guard = DescriptorGuard(limit)
        self.sock = ctx.socket(zmq.ROUTER)
        self.events: list[tuple[int, int]] = []
        self.listener = self.guard.bind(self.sock, "tcp://127.0.0.1:0",
                                        lambda e, v: self.events.append((e, v)), zmq.EVENT_ACCEPTED)
        self.real_monitor = self.listener.monitor
        self.writer = ctx.socket(zmq.PAIR)
        self.monitor = ctx.socket(zmq.PAIR)
        name = f"inproc://monitor-{id(self)}"
        self.monitor.bind(name)
        self.writer.connect(name)
        self.listener.monitor = self.monitor
        self.filters: list[tuple[int, bool]] = []
        self.clients: list[socket.socket] = []

    @property
    def port(self) -> int:
        return self.listener.listening.getsockname()[1]  # type: ignore[union-attr]

    def send(self, event: int, value: int) -> None:
        self.writer.send_multipart(monitor_message(event, value))

    def handle(self, now: int = 1000) -> None:
        wait_for(lambda: self.monitor.poll(0), timeout=5)
        self.guard.handle({self.monitor: zmq.POLLIN}, now)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.listener.monitor = self.real_monitor
        self.guard.close()
        for sock in (self.writer, self.monitor, self.sock):
            sock.close(0)


@pytest.fixture
def rig(ctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    made = Rig(ctx)
    real = descriptors._set_drop_filter

    def recording(sock: socket.socket, on: bool) -> None:
        made.filters.append((sock.fileno(), on))
        real(sock, on)

    monkeypatch.setattr(descriptors, "_set_drop_filter", recording)
    yield made
    made.close()


def test_bind_keeps_the_listener_and_attach_registers_its_monitor(ctx) -> None:
    guard = DescriptorGuard(100)
    sock = ctx.socket(zmq.ROUTER)
    try:
        listener = guard.bind(sock, "tcp://127.0.0.1:0")
        assert guard.listeners == [listener] and guard.limit == 100
        assert guard.pause.exhausted == 0 and guard.pause.paused_since is None and guard.plain == []

        class Poller:
            registered: list[tuple[Any, int]] = []

            def register(self, s: Any, flags: int) -> None:
                self.registered.append((s, flags))

        poll = PollSet(Poller())  # type: ignore[arg-type]
        guard.attach(poll)
        assert Poller.registered == [(listener.monitor, zmq.POLLIN)]
        assert poll.owners == {listener.monitor: guard}
        assert guard.what == "shedding connections"
        assert guard.next_deadline(5) is None
    finally:
        guard.close()
        sock.close(0)
    assert guard.listeners == []


def test_monitor_events_other_than_accept_failed_go_to_the_listeners_callback(rig: Rig) -> None:
    rig.send(zmq.EVENT_ACCEPTED, 17)
    rig.send(zmq.EVENT_DISCONNECTED, 18)
    rig.handle()
    assert rig.events == [(zmq.EVENT_ACCEPTED, 17), (zmq.EVENT_DISCONNECTED, 18)]
    assert rig.guard.pause.paused_since is None


def test_a_monitor_not_ready_is_not_read(rig: Rig) -> None:
    rig.send(zmq.EVENT_ACCEPTED, 17)
    wait_for(lambda: rig.monitor.poll(0), timeout=5)
    rig.guard.handle({}, 1000)
    assert rig.events == []


def test_a_listener_without_a_callback_drops_its_other_events(ctx) -> None:
    guard = DescriptorGuard(100)
    sock = ctx.socket(zmq.ROUTER)
    listener = guard.bind(sock, "tcp://127.0.0.1:0")
    try:
        listener.on_event = None
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(listener.endpoint)
        dealer.send(b"x")
        assert sock.poll(10_000)
        guard.handle({listener.monitor: zmq.POLLIN}, 1000)  # nothing to hand events to: nothing raised
        dealer.close(0)
    finally:
        guard.close()
        sock.close(0)


def test_the_monitor_is_read_1024_events_per_pass(rig: Rig) -> None:
    for i in range(MONITOR_EVENTS_PER_PASS + 5):
        rig.send(zmq.EVENT_ACCEPTED, i)
    wait_for(lambda: rig.monitor.poll(0), timeout=5)
    import time
    deadline = time.monotonic() + 10  # inproc: every message is there once the last one is
    rig.writer.send_multipart(monitor_message(zmq.EVENT_CONNECTED, 99))
    rig.guard.handle({rig.monitor: zmq.POLLIN}, 1000)
    assert len(rig.events) == MONITOR_EVENTS_PER_PASS == 1024
    while len(rig.events) < MONITOR_EVENTS_PER_PASS + 6 and time.monotonic() < deadline:
        rig.guard.handle({rig.monitor: zmq.POLLIN}, 1000)
    assert rig.events[-1] == (zmq.EVENT_CONNECTED, 99)


@pytest.mark.parametrize("code", OUT_OF_FDS)
def test_accept_failing_for_lack_of_descriptors_stops_new_connections(rig: Rig, caplog, code: int) -> None:
    rig.send(zmq.EVENT_ACCEPT_FAILED, code)
    rig.handle(now=5000)
    assert rig.guard.pause.exhausted == 1 and rig.guard.pause.paused_since == 5000
    assert rig.filters == [(rig.listener.listening.fileno(), True)]  # type: ignore[union-attr]
    assert rig.guard.next_deadline(5000) == 5000 + RETRY_MS
    assert rig.guard.next_deadline(9000) == 9000  # late: due now
    assert _warnings(caplog) == [
        "out of file descriptors (limit 1048576): new connections are dropped until some close; "
        "existing ones are served (0 waiting closed). Raise the limit with `ulimit -n`"]
    assert rig.events == []


def test_accept_failing_for_another_reason_changes_nothing(rig: Rig, caplog) -> None:
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.ECONNABORTED)
    rig.handle()
    assert rig.guard.pause.paused_since is None and rig.filters == [] and rig.events == []
    assert _warnings(caplog) == []


def test_one_failure_among_many_events_is_enough(rig: Rig) -> None:
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.ECONNABORTED)
    rig.handle()
    assert rig.guard.pause.exhausted == 1


def test_a_second_failure_while_stopped_sheds_again_without_a_second_warning(rig: Rig, caplog) -> None:
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.handle(now=1000)
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.handle(now=1500)
    assert rig.guard.pause.exhausted == 1 and rig.guard.pause.paused_since == 1000
    assert len(rig.filters) == 1
    assert len(_warnings(caplog)) == 1
    assert rig.guard.next_deadline(1500) == 2500


def _waiting_clients(rig: Rig, count: int) -> None:
    for _ in range(count):
        rig.clients.append(socket.create_connection(("127.0.0.1", rig.port), timeout=5))


@pytest.fixture(autouse=True)
def only_a_child_closes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Closing every descriptor, or os._exit, in the test process itself fails the test; a
    forked child does them for real (and never returns to the tests)."""
    parent, real_exit, real_close_all_but = os.getpid(), os._exit, descriptors._close_all_but

    def exit_(code: int) -> None:
        if os.getpid() == parent:
            raise AssertionError(f"os._exit({code}) in the parent")
        real_exit(code)

    def close_all_but(keep: list[int]) -> None:
        if os.getpid() == parent:
            raise AssertionError("closing every descriptor in the parent")
        real_close_all_but(keep)

    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setattr(descriptors, "_close_all_but", close_all_but)
    try:
        yield
    finally:
        if os.getpid() != parent:
            real_exit(97)


def test_what_waits_in_the_accept_queue_is_closed_by_a_child(rig: Rig, caplog) -> None:
    # libzmq accepts on its own thread; with the filter on and its listening socket taken
    # from it here (plain), the connections made stay in the queue for the child to close.
    plain = listen_tcp("127.0.0.1", 0)
    rig.guard.plain.append(plain)
    try:
        for _ in range(3):
            rig.clients.append(socket.create_connection(plain.getsockname()[:2], timeout=5))
        wait_for(lambda: select.select([plain], [], [], 0)[0], timeout=5)
        assert descriptors.waiting([rig.listener.listening, plain]) == [plain]  # type: ignore[list-item]
        shed = rig.guard.out_of_descriptors(plain, 1000)
        assert shed == 3
        for client in rig.clients:
            client.settimeout(5)
            assert client.recv(1) == b""  # closed by the child
        assert descriptors.waiting([rig.listener.listening, plain]) == []  # type: ignore[list-item]
        assert "(3 waiting closed)" in _warnings(caplog)[0]
        assert sorted(fd for fd, _ in rig.filters) == sorted(
            [rig.listener.listening.fileno(), plain.fileno()])  # type: ignore[union-attr]
    finally:
        plain.close()


def test_a_tick_before_the_retry_time_does_nothing(rig: Rig) -> None:
    rig.guard.tick(1000)  # not paused: nothing
    assert rig.filters == []
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.handle(now=1000)
    rig.guard.tick(1000 + RETRY_MS - 1)
    assert rig.guard.pause.paused_since == 1000 and len(rig.filters) == 1


def test_with_descriptors_free_again_new_connections_are_let_in(rig: Rig, caplog) -> None:
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.handle(now=1000)
    rig.guard.tick(1000 + RETRY_MS)
    assert rig.guard.pause.paused_since is None
    assert rig.filters[-1] == (rig.listener.listening.fileno(), False)  # type: ignore[union-attr]
    assert _warnings(caplog)[-1] == ("file descriptors free again: accepting new connections "
                                     f"(stopped for {RETRY_MS} ms)")
    assert rig.guard.next_deadline(5) is None


def test_without_headroom_the_guard_stays_paused_and_retries_a_second_later(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.guard.pause.limit = 1000
    monkeypatch.setattr(descriptors, "_open_descriptors", lambda: 1000 - HEADROOM + 1)
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.handle(now=1000)
    rig.guard.tick(2000)
    assert rig.guard.pause.paused_since == 1000 and len(rig.filters) == 1
    assert rig.guard.next_deadline(2000) == 3000
    monkeypatch.setattr(descriptors, "_open_descriptors", lambda: 1000 - HEADROOM)  # exactly enough
    rig.guard.tick(3000)
    assert rig.guard.pause.paused_since is None and rig.filters[-1][1] is False


def test_a_tick_sheds_what_got_into_a_queue_before_the_filter(rig: Rig, monkeypatch) -> None:
    shed: list[list[socket.socket]] = []
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.handle(now=1000)
    monkeypatch.setattr(rig.guard.shedder, "shed", lambda listening: shed.append(listening) or 0)
    monkeypatch.setattr(descriptors, "waiting", lambda listening: [])
    monkeypatch.setattr(descriptors, "_open_descriptors", lambda: 1 << 30)
    rig.guard.tick(2000)
    assert shed == []  # nothing waiting: no child forked
    marker = socket.socket()
    monkeypatch.setattr(descriptors, "waiting", lambda listening: [marker])
    rig.guard.tick(3000)
    marker.close()
    assert shed == [[marker]]


def test_run_reads_the_monitors_then_ticks(rig: Rig) -> None:
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    wait_for(lambda: rig.monitor.poll(0), timeout=5)
    rig.guard.run({rig.monitor: zmq.POLLIN}, 1000, 1010)
    assert rig.guard.pause.paused_since == 1000
    rig.guard.run({}, 1000 + RETRY_MS, 1000 + RETRY_MS + 10)
    assert rig.guard.pause.paused_since is None


def test_a_failed_fork_sheds_nothing_with_a_warning(rig: Rig, monkeypatch, caplog) -> None:
    def no_fork() -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(descriptors.os, "fork", no_fork)
    assert rig.guard.shedder.shed([rig.listener.listening]) == 0  # type: ignore[list-item]
    assert _warnings(caplog) == [
        "could not fork to close waiting connections: [Errno 11] Resource temporarily unavailable"]


def test_a_child_that_takes_too_long_is_killed(rig: Rig, monkeypatch, caplog) -> None:
    monkeypatch.setattr(descriptors, "_accept_and_close", lambda listening: __import__("time").sleep(30))
    import time
    started = time.monotonic()
    assert rig.guard.shedder.shed([rig.listener.listening]) == 0  # type: ignore[list-item]
    assert time.monotonic() - started < 20
    assert _warnings(caplog) == [f"a child closing waiting connections took over {SHED_WAIT_MS} ms: killed"]
    assert SHED_WAIT_MS == 500


def test_the_child_keeps_only_the_listening_sockets(monkeypatch) -> None:
    closed: list[tuple[int, int]] = []
    monkeypatch.setattr(descriptors.os, "closerange", lambda low, high: closed.append((low, high)))
    _REAL_CLOSE_ALL_BUT([5, 9])
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert closed == [(0, 5), (6, 9), (10, limit)]
    closed.clear()
    _REAL_CLOSE_ALL_BUT([])
    assert closed == [(0, limit)]


def test_accept_and_close_closes_at_most_4096_per_pass(monkeypatch) -> None:
    class Listening:
        def __init__(self, waiting: int) -> None:
            self.waiting = waiting
            self.accepted = 0

        def accept(self) -> tuple[Any, Any]:
            if self.waiting == 0:
                raise BlockingIOError
            self.waiting -= 1
            self.accepted += 1

            class Conn:
                closed = False

                def close(self) -> None:
                    Conn.closed = True

            return Conn(), None

    a, b = Listening(3), Listening(SHED_PER_PASS)
    assert descriptors._accept_and_close([a, b]) == SHED_PER_PASS  # type: ignore[list-item]
    assert a.accepted == 3 and b.accepted == SHED_PER_PASS - 3
    assert SHED_PER_PASS == 4096
    assert descriptors._accept_and_close([Listening(2)]) == 2  # type: ignore[list-item]


def test_the_drop_filter_stops_new_connections_and_comes_off_again(caplog) -> None:
    listening = listen_tcp("127.0.0.1", 0)
    client = socket.socket()
    try:
        descriptors._set_drop_filter(listening, True)
        client.setblocking(False)
        assert client.connect_ex(listening.getsockname()) in (errno.EINPROGRESS, 0)
        assert select.select([listening], [], [], 0.3)[0] == []  # the SYN was dropped
        descriptors._set_drop_filter(listening, False)
        late = socket.create_connection(listening.getsockname(), timeout=5)
        late.close()
        assert _warnings(caplog) == []
    finally:
        client.close()
        listening.close()


@pytest.mark.parametrize("on, verb", [(True, "attach"), (False, "detach")])
def test_a_filter_that_cannot_be_set_is_a_warning(caplog, on: bool, verb: str) -> None:
    sock = socket.socket()
    sock.close()
    descriptors._set_drop_filter(sock, on)
    assert _warnings(caplog) == [
        f"could not {verb} the drop filter on a listening socket: [Errno 9] Bad file descriptor"]


def test_open_descriptors_counts_this_process_and_assumes_full_without_proc(monkeypatch) -> None:
    assert descriptors._open_descriptors() == len(os.listdir("/proc/self/fd"))

    def no_proc(path: str) -> list[str]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(descriptors.os, "listdir", no_proc)
    assert descriptors._open_descriptors() == 1 << 30


def test_closing_the_guard_closes_its_listeners_and_its_page(ctx) -> None:
    guard = DescriptorGuard(100)
    sock = ctx.socket(zmq.ROUTER)
    listener = guard.bind(sock, "tcp://127.0.0.1:0")
    guard.close()
    assert listener.monitor.closed and guard.listeners == [] and guard.shedder.closed
    sock.close(0)


def test_a_fixed_port_is_the_one_bound(ctx) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sock = ctx.socket(zmq.ROUTER)
    listener = Listener(sock, f"tcp://127.0.0.1:{port}")
    try:
        assert listener.endpoint == f"tcp://127.0.0.1:{port}"
    finally:
        listener.close()
        sock.close(0)


def test_the_events_asked_for_reach_the_callback_from_the_real_monitor(ctx) -> None:
    guard = DescriptorGuard(100)
    sock = ctx.socket(zmq.ROUTER)
    events: list[tuple[int, int]] = []
    listener = guard.bind(sock, "tcp://127.0.0.1:0", lambda e, v: events.append((e, v)),
                          zmq.EVENT_ACCEPTED)
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(listener.endpoint)
        dealer.send(b"x")
        assert sock.poll(10_000)
        wait_for(lambda: (guard.handle({listener.monitor: zmq.POLLIN}, 1000), events)[1], timeout=10)
        assert events[0][0] == zmq.EVENT_ACCEPTED and events[0][1] > 2
    finally:
        dealer.close(0)
        guard.close()
        sock.close(0)


def test_only_the_ready_monitors_are_read_each_of_them(ctx, rig: Rig) -> None:
    other = ctx.socket(zmq.ROUTER)
    got: list[tuple[int, int]] = []
    second = rig.guard.bind(other, "tcp://127.0.0.1:0", lambda e, v: got.append((e, v)))
    writer, monitor = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    monitor.bind("inproc://second-monitor")
    writer.connect("inproc://second-monitor")
    real = second.monitor
    second.monitor = monitor
    try:
        writer.send_multipart(monitor_message(zmq.EVENT_ACCEPTED, 5))
        wait_for(lambda: monitor.poll(0), timeout=5)
        rig.guard.handle({monitor: zmq.POLLIN}, 1000)  # the first listener's is not ready
        assert got == [(zmq.EVENT_ACCEPTED, 5)] and rig.events == []
    finally:
        second.monitor = real
        writer.close(0)
        monitor.close(0)


def test_what_each_listener_shed_adds_up_and_so_do_exhaustions(rig: Rig, monkeypatch) -> None:
    monkeypatch.setattr(rig.guard.shedder, "shed", lambda listening: 3)
    for now in (1000, 1100):
        rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
        rig.handle(now=now)
    assert rig.listener.shed == 6
    rig.guard.tick(1100 + RETRY_MS)  # free again
    rig.send(zmq.EVENT_ACCEPT_FAILED, errno.EMFILE)
    rig.handle(now=5000)
    assert rig.guard.pause.exhausted == 2


def test_the_other_listening_sockets_with_connections_waiting_are_shed_too(rig: Rig) -> None:
    plain = listen_tcp("127.0.0.1", 0)
    rig.guard.plain.append(plain)
    try:
        for _ in range(2):
            rig.clients.append(socket.create_connection(plain.getsockname()[:2], timeout=5))
        wait_for(lambda: select.select([plain], [], [], 0)[0], timeout=5)
        # accept failed on the ROUTER's socket; the plain one's queue is emptied as well
        assert rig.guard.out_of_descriptors(rig.listener.listening, 1000) == 2  # type: ignore[arg-type]
    finally:
        plain.close()


def test_a_killed_shedding_child_is_reaped(rig: Rig, monkeypatch) -> None:
    forked: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(descriptors.os, "fork", fork)
    monkeypatch.setattr(descriptors, "_accept_and_close", lambda listening: __import__("time").sleep(30))
    rig.guard.shedder.shed([rig.listener.listening])  # type: ignore[list-item]
    (pid,) = forked
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left

"""zns.drivers.sockets in process: address lists, the socket factory's options, recv_all's
bounds and the Waker. No server: a PAIR/ROUTER bound on an ephemeral port or inproc."""

from __future__ import annotations

import socket

import pytest
import zmq

from zns.core.schema import DEFAULT_ROUTER
from zns.drivers import sockets
from zns.drivers.sockets import (
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    KEEPALIVE_PROBES,
    Waker,
    open_socket,
    parse_addresses,
    recv_all,
    set_keepalive,
)

from helpers import wait_for

pytestmark = pytest.mark.timeout(60)


# --- parse_addresses -----------------------------------------------------------------------


def test_no_spec_means_the_environment_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZNS_ADDR", raising=False)
    assert parse_addresses(None) == [DEFAULT_ROUTER]
    assert parse_addresses("") == [DEFAULT_ROUTER]
    assert parse_addresses("   ") == [DEFAULT_ROUTER]
    monkeypatch.setenv("ZNS_ADDR", "  ")
    assert parse_addresses(None) == [DEFAULT_ROUTER]
    monkeypatch.setenv("ZNS_ADDR", " h1:1;tcp://h2:2 ")
    assert parse_addresses(None) == ["tcp://h1:1", "tcp://h2:2"]
    assert parse_addresses(" ") == ["tcp://h1:1", "tcp://h2:2"]


def test_a_spec_given_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZNS_ADDR", "h1:1")
    assert parse_addresses("h3:3") == ["tcp://h3:3"]
    assert parse_addresses(["h4:4", "tcp://h5:5"]) == ["tcp://h4:4", "tcp://h5:5"]
    assert sockets.ENV_VAR == "ZNS_ADDR"


# --- open_socket and set_keepalive --------------------------------------------------------


@pytest.fixture
def ctx() -> zmq.Context:
    context = zmq.Context()
    yield context
    context.term()


def test_a_dealer_gets_linger_0_keepalive_and_no_message_bound_by_default(ctx: zmq.Context) -> None:
    sock = open_socket(ctx, zmq.DEALER, "tcp://127.0.0.1:1")
    try:
        assert sock.type == zmq.DEALER
        assert sock.getsockopt(zmq.LINGER) == 0
        assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1
        assert sock.getsockopt(zmq.TCP_KEEPALIVE_IDLE) == KEEPALIVE_IDLE_S == 30
        assert sock.getsockopt(zmq.TCP_KEEPALIVE_INTVL) == KEEPALIVE_INTERVAL_S == 10
        assert sock.getsockopt(zmq.TCP_KEEPALIVE_CNT) == KEEPALIVE_PROBES == 3
        assert sock.getsockopt(zmq.MAXMSGSIZE) == -1
        assert sock.getsockopt(zmq.RCVHWM) == 1000  # only a SUB gets the large marks
        assert sock.getsockopt(zmq.SNDHWM) == 1000
        assert sock.getsockopt(zmq.LAST_ENDPOINT) == b"tcp://127.0.0.1:1"
    finally:
        sock.close()


def test_a_sub_holds_large_bursts_both_ways_and_a_bound_reaches_the_socket(ctx: zmq.Context) -> None:
    sock = open_socket(ctx, zmq.SUB, "tcp://127.0.0.1:1", max_message_bytes=4096)
    try:
        assert sock.getsockopt(zmq.RCVHWM) == 100_000
        assert sock.getsockopt(zmq.SNDHWM) == 100_000
        assert sock.getsockopt(zmq.MAXMSGSIZE) == 4096
        assert sock.getsockopt(zmq.LINGER) == 0
    finally:
        sock.close()


def test_a_bad_endpoint_raises_and_leaves_no_socket(ctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[zmq.Socket] = []
    real = ctx.socket

    def socket(kind: int) -> zmq.Socket:
        made.append(real(kind))
        return made[-1]

    monkeypatch.setattr(ctx, "socket", socket)
    with pytest.raises(zmq.ZMQError):
        open_socket(ctx, zmq.DEALER, "nonsense://x")
    assert len(made) == 1 and made[0].closed


def test_set_keepalive_on_any_socket(ctx: zmq.Context) -> None:
    sock = ctx.socket(zmq.ROUTER)
    try:
        set_keepalive(sock)
        assert [sock.getsockopt(o) for o in (zmq.TCP_KEEPALIVE, zmq.TCP_KEEPALIVE_IDLE,
                                             zmq.TCP_KEEPALIVE_INTVL, zmq.TCP_KEEPALIVE_CNT)] == [1, 30, 10, 3]
    finally:
        sock.close(0)


# --- recv_all ------------------------------------------------------------------------------


@pytest.fixture
def pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    for sock in (a, b):
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    a.bind("inproc://recv-all")
    b.connect("inproc://recv-all")
    yield a, b
    a.close(0)
    b.close(0)


def _settle(sock: zmq.Socket, count: int) -> None:
    """inproc delivers at once, but wait until `count` messages are readable anyway."""
    wait_for(lambda: sock.poll(0) != 0 or count == 0, timeout=5)


def test_recv_all_reads_what_waits_up_to_its_limit(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    a, b = pair
    assert recv_all(b) == []
    for i in range(5):
        a.send_multipart([b"m%d" % i, b"x"])
    _settle(b, 5)
    assert recv_all(b, limit=3) == [[b"m0", b"x"], [b"m1", b"x"], [b"m2", b"x"]]
    assert recv_all(b) == [[b"m3", b"x"], [b"m4", b"x"]]
    assert recv_all(b) == []


def test_recv_all_reads_10000_by_default(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    a, b = pair
    for _ in range(10_001):
        a.send(b"")
    _settle(b, 1)
    assert len(recv_all(b)) == 10_000
    assert recv_all(b) == [[b""]]


def test_recv_all_drops_a_message_of_too_many_frames_and_keeps_the_next(
        pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    a, b = pair
    a.send_multipart([b"f"] * 35)
    a.send_multipart([b"g"] * 34)
    a.send_multipart([b"h"] * 3)
    a.send_multipart([b"i"] * 4)
    _settle(b, 4)
    assert recv_all(b) == [[b"g"] * 34, [b"h"] * 3, [b"i"] * 4]
    a.send_multipart([b"h"] * 4)
    a.send_multipart([b"j"] * 3)
    _settle(b, 2)
    assert recv_all(b, max_frames=3) == [[b"j"] * 3]


def test_recv_all_drops_a_message_over_max_bytes_in_all(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    a, b = pair
    a.send_multipart([b"ab", b"cd"])      # 4 bytes: kept at max_bytes=4
    a.send_multipart([b"ab", b"cde"])     # 5: dropped
    a.send(b"abcde")                      # 5 in one frame: dropped
    a.send(b"abcd")                       # 4 in one frame: kept
    a.send_multipart([b"abcde", b""])     # over in its first frame: dropped
    a.send_multipart([b"a", b"b", b"c"])  # kept
    _settle(b, 6)
    assert recv_all(b, max_bytes=4) == [[b"ab", b"cd"], [b"abcd"], [b"a", b"b", b"c"]]


# --- Waker ---------------------------------------------------------------------------------


def test_a_waker_wakes_a_poller_and_is_drained_once_woken() -> None:
    waker = Waker()
    poller = zmq.Poller()
    poller.register(waker.fd, zmq.POLLIN)
    try:
        assert dict(poller.poll(0)) == {}
        assert waker.drain_if_woken([]) is False
        for _ in range(5000):  # more than one recv(4096) reads: all drained
            waker.wake()
        ready = dict(poller.poll(1000))
        assert waker.fd in ready
        assert waker.drain_if_woken([123]) is False  # another descriptor: not read
        assert waker.fd in dict(poller.poll(0))
        assert waker.drain_if_woken(ready) is True
        assert dict(poller.poll(0)) == {}
        assert waker.fileno() != waker.fd and waker.fileno() > 0
    finally:
        waker.close()
    waker.wake()  # after close: nothing raised
    assert waker.drain_if_woken([waker.fd]) is True


def test_a_waker_wakes_many_times_without_blocking() -> None:
    waker = Waker()
    with socket.fromfd(waker.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as writer:  # a dup
        writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024)  # of the writing end
    poller = zmq.Poller()
    poller.register(waker.fd, zmq.POLLIN)
    try:
        for _ in range(20_000):  # far more than the small buffer holds: never blocks
            waker.wake()
        assert waker.drain_if_woken([waker.fd]) is True
        assert dict(poller.poll(0)) == {}
    finally:
        waker.close()

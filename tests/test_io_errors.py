"""The drivers' I/O boundary (zns/drivers/io_errors.py): each mapping, with real sockets where
the library error is cheap to provoke, and what passes through unchanged."""

from __future__ import annotations

import errno
import socket

import pytest
import zmq

from zns.core.errors import (
    ConfigError, ConnectionLost, EndpointError, KeyFileError, UsageError, ZnsError,
)
from zns.drivers.io_errors import (
    REMOTING_PEER, ZNS1_PEER, configured, map_exceptions, peer_named,
)

pytestmark = pytest.mark.timeout(30)


def test_a_listed_exception_leaves_as_its_zns_error_with_the_message_and_the_cause() -> None:
    cause = OSError(errno.EADDRINUSE, "Address already in use")
    with pytest.raises(EndpointError) as caught:
        with configured("cannot bind tcp://*:1: "):
            raise cause
    assert str(caught.value) == "cannot bind tcp://*:1: [Errno 98] Address already in use"
    assert caught.value.__cause__ is cause


@pytest.mark.parametrize("raised", [
    zmq.ZMQError(errno.EINVAL), OSError(errno.EACCES, "Permission denied"), ValueError("bad"),
])
def test_configured_maps_whatever_binding_or_reading_raises_to_the_configuration(
        raised: Exception) -> None:
    with pytest.raises(EndpointError):
        with configured("x: "):
            raise raised
    with pytest.raises(KeyFileError):
        with configured("x: ", KeyFileError):
            raise raised


def test_configured_is_the_operators_fault_not_the_peers() -> None:
    with pytest.raises(ConfigError) as caught:
        with configured("--metrics 1.2.3.4:1: cannot listen: ", ConfigError):
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    assert not isinstance(caught.value, ConnectionLost)


@pytest.mark.parametrize("mapping", [configured("x: "), peer_named("x: "), ZNS1_PEER, REMOTING_PEER])
@pytest.mark.parametrize("raised", [
    zmq.Again(), BlockingIOError(errno.EAGAIN, "busy"), InterruptedError(errno.EINTR, "signal"),
])
def test_would_block_is_flow_control_and_passes_every_mapping(
        mapping: map_exceptions, raised: Exception) -> None:
    with pytest.raises(type(raised)) as caught:
        with mapping:
            raise raised
    assert caught.value is raised


@pytest.mark.parametrize("mapping", [configured("x: "), peer_named("x: "), ZNS1_PEER, REMOTING_PEER])
def test_an_error_of_the_tree_passes_unchanged(mapping: map_exceptions) -> None:
    # A UsageError is also a ValueError: the caller's misuse must not become the operator's.
    misuse = UsageError("bad topic")
    with pytest.raises(UsageError) as caught:
        with mapping:
            raise misuse
    assert caught.value is misuse


@pytest.mark.parametrize("mapping", [configured("x: "), peer_named("x: "), ZNS1_PEER, REMOTING_PEER])
def test_a_bug_passes_unchanged(mapping: map_exceptions) -> None:
    bug = TypeError("not a buffer")
    with pytest.raises(TypeError) as caught:
        with mapping:
            raise bug
    assert caught.value is bug


@pytest.mark.parametrize("raised", [
    zmq.ZMQError(errno.EHOSTUNREACH), zmq.ZMQError(errno.ENOTSOCK), zmq.Again(),
    UsageError("bad topic"), TypeError("not a buffer"),
])
def test_maps_says_what_a_with_does(raised: Exception) -> None:
    # The reply path asks `maps` once a send raised, instead of a `with` around every send.
    try:
        with ZNS1_PEER:
            raise raised
    except Exception as left:
        assert ZNS1_PEER.maps(raised) is (left is not raised)


def test_nothing_raised_is_nothing_mapped() -> None:
    with ZNS1_PEER, REMOTING_PEER, configured("x: "):
        pass


def test_zns1_peer_maps_a_reply_to_a_peer_that_is_gone() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    try:
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.bind("inproc://io-errors-router")
        with pytest.raises(ConnectionLost) as caught:
            with ZNS1_PEER:
                router.send_multipart([b"nobody", b"reply"], zmq.DONTWAIT)
        assert isinstance(caught.value.__cause__, zmq.ZMQError)
        assert caught.value.__cause__.errno == errno.EHOSTUNREACH
    finally:
        router.close(0)
        ctx.term()


def test_zns1_peer_leaves_zns_misusing_a_socket_as_the_bug_it_is() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.close()
    try:
        with pytest.raises(zmq.ZMQError) as caught:
            with ZNS1_PEER:
                router.send(b"x", zmq.DONTWAIT)
        assert caught.value.errno == errno.ENOTSOCK
    finally:
        ctx.term()


def test_peer_named_maps_an_endpoint_a_peer_named_that_cannot_be_connected_to() -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        with pytest.raises(ConnectionLost) as caught:
            with peer_named("'tcp://nowhere': "):
                sub.connect("tcp://nowhere")
        assert str(caught.value).startswith("'tcp://nowhere': ")
        assert isinstance(caught.value.__cause__, zmq.ZMQError)
    finally:
        sub.close(0)
        ctx.term()


def test_remoting_peer_maps_a_connection_the_peer_reset() -> None:
    ours, theirs = socket.socketpair()
    try:
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        theirs.close()
        with pytest.raises(ConnectionLost) as caught:
            with REMOTING_PEER:
                for _ in range(3):  # the first send may still be accepted by the kernel
                    ours.send(b"x" * 65536)
        assert isinstance(caught.value.__cause__, OSError)
        assert isinstance(caught.value, ZnsError)
    finally:
        ours.close()


def test_remoting_peer_lets_an_empty_socket_say_it_would_block() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        with pytest.raises(BlockingIOError):
            with REMOTING_PEER:
                ours.recv(1)
    finally:
        ours.close()
        theirs.close()


def test_the_zmq_errno_filter_maps_only_the_listed_errnos() -> None:
    only_reset = map_exceptions([(zmq.ZMQError, frozenset({errno.ECONNRESET}), ConnectionLost)])
    with pytest.raises(ConnectionLost):
        with only_reset:
            raise zmq.ZMQError(errno.ECONNRESET)
    with pytest.raises(zmq.ZMQError):
        with only_reset:
            raise zmq.ZMQError(zmq.EFSM)


def test_an_errno_filter_leaves_an_exception_without_an_errno_unchanged() -> None:
    by_errno = map_exceptions([(ValueError, frozenset({errno.ECONNRESET}), ConnectionLost)])
    with pytest.raises(ValueError, match="no errno here"):
        with by_errno:
            raise ValueError("no errno here")


def test_a_mapping_without_what_keeps_the_message_as_it_was() -> None:
    with pytest.raises(ConnectionLost) as caught:
        with map_exceptions([(OSError, None, ConnectionLost)]):
            raise OSError(errno.EPIPE, "Broken pipe")
    assert str(caught.value) == "[Errno 32] Broken pipe"
    with pytest.raises(ConnectionLost) as caught:
        with REMOTING_PEER:
            raise OSError(errno.EPIPE, "Broken pipe")
    assert str(caught.value) == "[Errno 32] Broken pipe"

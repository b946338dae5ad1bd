"""A connection to a ZNS/1 port that never becomes a ZeroMQ peer is said out loud: a RocketMQ
client at the request port (issue 34 item 1), a ZeroMQ client without the server's CURVE key
(issue 34 item 5). The rule (zns.core.handshakes) with an injected clock; then a real server."""

from __future__ import annotations

import json
import logging
import socket
import struct
from pathlib import Path

import pytest
import zmq

from helpers import SplitServer, records_here, wait_for
from zns.core.handshakes import WARN_EVERY_MS, HandshakeWatch
from zns.drivers.security import write_keypair


def rocketmq_request(code: int = 106) -> bytes:
    """One RocketMQ remoting frame (what mqadmin sends first: GET_BROKER_CLUSTER_INFO)."""
    header = json.dumps({"code": code, "language": "JAVA", "version": 0, "opaque": 1,
                         "flag": 0, "extFields": {}}).encode()
    return struct.pack(">II", 4 + len(header), len(header)) + header


def test_a_connection_closed_before_its_handshake_is_warned_once_per_source():
    watch = HandshakeWatch("tcp://0.0.0.0:9876", curve=False)
    watch.accepted(14, "10.0.0.5:40001")
    warning = watch.disconnected(1_000, 14)
    assert warning is not None
    assert warning.startswith("a connection from 10.0.0.5:40001 to the ZNS/1 port "
                              "tcp://0.0.0.0:9876 closed before completing the ZeroMQ handshake")
    assert "--remoting HOST:PORT" in warning
    for fd in range(20, 30):  # the same host again within the minute: folded
        watch.accepted(fd, f"10.0.0.5:{fd}")
        assert watch.disconnected(2_000, fd) is None
    watch.accepted(31, "10.0.0.6:1")  # another host: its own warning
    assert watch.disconnected(2_000, 31) is not None
    watch.accepted(32, "10.0.0.5:2")
    later = watch.disconnected(1_000 + WARN_EVERY_MS, 32)
    assert later is not None and later.endswith("(10 more from there in the last 60 s)")


def test_a_handshake_that_succeeds_clears_the_waiting_and_a_failure_names_curve():
    watch = HandshakeWatch("tcp://0.0.0.0:9876", curve=True)
    watch.accepted(14, None)
    watch.succeeded()  # a ZeroMQ client: never blamed
    assert watch.disconnected(1_000, 14) is None
    watch.accepted(15, "127.0.0.1:5000")
    failed = watch.failed(1_000, "mechanism")
    assert failed == (
        "a ZeroMQ client from 127.0.0.1:5000 failed the handshake on tcp://0.0.0.0:9876: its "
        "security mechanism differs from the server's; this server uses CURVE: the client needs "
        "the server's public key (zns --server-key, a client's server_key=) and, with key "
        "directories, a key listed there")
    assert watch.disconnected(1_000, 15) is None  # its disconnect is not a second warning
    plain = HandshakeWatch("tcp://0.0.0.0:9876", curve=False)
    assert "must not set a server key" in (plain.failed(0, "mechanism") or "")
    assert "from" not in (plain.failed(WARN_EVERY_MS, "other") or "from")  # no source known


@pytest.mark.timeout(60)
def test_rocketmq_bytes_at_the_request_port_are_warned_about_naming_remoting(tmp_path: Path):
    srv = SplitServer(tmp_path)
    try:
        host, port = srv.router.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(rocketmq_request())
            try:  # libzmq sends its greeting, then closes (or resets) the connection
                while sock.recv(100):
                    pass
            except ConnectionResetError:
                pass
        found = wait_for(lambda: [line for line in srv.output().splitlines()
                                  if "closed before completing the ZeroMQ handshake" in line])
        assert len(found) == 1 and "--remoting HOST:PORT" in found[0]
        assert srv.router in found[0]
        # A ZeroMQ client at the same port is no such connection.
        srv.peer().ok("status")
        assert len([line for line in srv.output().splitlines() if "handshake" in line]) == 1
    finally:
        srv.stop()


@pytest.mark.timeout(60)
def test_a_client_without_the_curve_key_is_warned_about(tmp_path: Path):
    secret = write_keypair(tmp_path / "server", "server")[1]
    srv = SplitServer(tmp_path, curve_secret=str(secret))
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)  # no CURVE: what `zns status` without --server-key is
    try:
        dealer.connect(srv.router)
        dealer.send(b"x")
        found = wait_for(lambda: [line for line in srv.output().splitlines()
                                  if "failed the handshake" in line])
        assert "this server uses CURVE" in found[0]
    finally:
        dealer.close(0)
        srv.stop()

"""A peer must not end the server: libzmq 4.3.5's `Assertion failed: !_io_error`.

libzmq stops reading a connection whose inbound queue is at its high-water mark
(1,000 messages on the request ROUTER, 2 on the events XPUB), keeping the bytes
it already read after the last queued message. If the connection then fails (the
peer resets it, the kernel times it out, or the server shuts it down), libzmq
only notes the error. Anything that writes to that connection before the queue
drains aborts the process (SIGABRT): a ZMTP heartbeat timer of ours (so the
server sets none), or a ZMTP PING the peer itself sent, which libzmq answers as
soon as the drained queue lets it decode the kept bytes. That second case no
socket option prevents (docs/operations.md, *A peer can abort the server*). What
zns does instead is start a new server (`--supervise`): the last test provokes the
abort and shows the new server serving, and fails once the bundled libzmq no longer
aborts. The attacks before it provoke the abort only most of the time (how the
peer's bytes and the reset fall against libzmq's reads is the kernel's timing), so
they accept exactly two outcomes: the server still serving, or dead of libzmq's
assertion and nothing else.

The server runs in a subprocess (an abort must not take pytest with it). The
peers speak ZMTP 3.0 over plain sockets, so they can send PINGs and reset
(SO_LINGER 0) exactly when the queues are full.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import zmq

from zns.core import schema

from helpers import LOADED_DEADLINE, free_port, wait_for

BUSY_SERVER = """
import sys, time
from zns.core.service import NameService
from zns.drivers.server import Server, ServerConfig

busy = [float(sys.argv[1])]
respond = NameService.respond

def busy_once(self, body, now, *args, **kwargs):
    if busy[0]:
        seconds, busy[0] = busy[0], 0.0
        time.sleep(seconds)
    return respond(self, body, now, *args, **kwargs)

NameService.respond = busy_once
server = Server(ServerConfig(router="tcp://127.0.0.1:0", pub="tcp://127.0.0.1:0", kv_path=None))
print(server.router_endpoint, server.pub_endpoint, flush=True)
server.run()
"""


def _command(body: bytes) -> bytes:
    return bytes([0x04, len(body)]) + body


def _message(body: bytes) -> bytes:
    return bytes([0x00, len(body)]) + body


GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32
READY = _command(b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"DEALER")
PING = _command(b"\x04PING" + struct.pack(">H", 0))


SUB_READY = _command(b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", 3) + b"SUB")


def _subscription(topic: bytes) -> bytes:
    """ZMTP 3.0's subscription: a message whose first byte is 1 (long form past 255 bytes)."""
    body = b"\x01" + topic
    return _message(body) if len(body) < 256 else b"\x02" + struct.pack(">Q", len(body)) + body


def _busy_server(seconds: float) -> tuple[subprocess.Popen[str], str, str]:
    """A server whose first request sleeps `seconds`; its request and events endpoints."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_SERVER, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    router, pub = proc.stdout.readline().split()
    return proc, router, pub


# Which connections an attack may use: all (None), or those for which this is true (the
# workers' attacks, tests/test_worker_attacks.py, keep those that landed on one worker).
Lands = Callable[[socket.socket], bool] | None


def _connect(endpoint: str, ready: bytes, lands: Lands = None) -> socket.socket:
    """A plain TCP socket that completed the ZMTP 3.0 handshake as the socket type of `ready`."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    while lands is not None and not lands(sock):
        sock.close()
        sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(GREETING)
    greeting = b""
    while len(greeting) < len(GREETING):
        greeting += sock.recv(len(GREETING) - len(greeting))
    sock.sendall(ready)
    return sock


def _pipeline(endpoint: str, requests: int, ping_every: int | None = None,
              lands: Lands = None) -> socket.socket:
    """A ZMTP peer that queues `requests` status requests (and, if asked, PING commands)."""
    sock = _connect(endpoint, READY, lands)
    status = _message(schema.encode({"op": "status", "id": 2}))
    if ping_every is None:
        sock.sendall(status * requests)
    else:
        sock.sendall((status * ping_every + PING) * (requests // ping_every))
    return sock


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _status(ctx: zmq.Context, endpoint: str) -> bool:
    """A `status` on a new connection is answered within 5 s."""
    return isinstance(_ask(ctx, endpoint, "status", timeout_ms=5000), schema.StatusReply)


def _attack(busy_s: float, wait_s: float, ping_every: int | None) -> subprocess.Popen[str]:
    """Three peers fill their queues while the server is busy, reset, and we wait."""
    proc, endpoint, _ = _busy_server(busy_s)
    ctx = zmq.Context()
    first = ctx.socket(zmq.DEALER)
    first.setsockopt(zmq.LINGER, 0)
    try:
        first.connect(endpoint)
        first.send(schema.encode({"op": "status", "id": 1}))  # the loop sleeps on it
        time.sleep(0.2)
        peers = [_pipeline(endpoint, 2_000, ping_every) for _ in range(3)]
        time.sleep(0.5)  # libzmq reads until each queue holds 1,000 and stops reading
        for sock in peers:
            _reset(sock)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            assert _status(ctx, endpoint), "the server is alive but does not answer"
    finally:
        first.close()
        ctx.term()
    return proc


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.terminate()
    try:
        code = proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(15)
    return code, proc.stderr.read()


@pytest.mark.timeout(60)
def test_peers_resetting_with_full_queues_do_not_abort_a_busy_server():
    # With a 5 s ZMTP heartbeat on the ROUTER this aborted ~5 s after the resets,
    # while the loop was still busy: the busy time covers one heartbeat interval.
    proc = _attack(busy_s=7.0, wait_s=9.0, ping_every=None)
    code, stderr = _stop(proc)
    assert "Assertion failed" not in stderr
    assert code == 0, stderr[-2000:]


# What the abort is, exactly: libzmq 4.3.5 (and master): stream_engine_base.cpp's restart_input
# decodes a PING kept behind a full queue after the connection failed; zmtp_engine.cpp's
# process_heartbeat_message calls out_event, which asserts !_io_error.
LIBZMQ_ASSERTION = "Assertion failed: !_io_error"


def _serving_or_dead_of_libzmqs_assertion(code: int, stderr: str) -> None:
    """The two outcomes of the attacks below: stopped cleanly by us after it kept serving
    (`code` 0), or aborted by libzmq's assertion (SIGABRT); any other end fails."""
    if code == -signal.SIGABRT:
        assert LIBZMQ_ASSERTION in stderr, stderr[-2000:]
        print("aborted by libzmq's assertion")
    else:
        assert code == 0, stderr[-2000:]
        print("kept serving")


@pytest.mark.timeout(60)
def test_a_peer_that_queues_its_own_pings_and_resets_ends_a_busy_server_only_by_libzmqs_abort():
    proc = _attack(busy_s=1.0, wait_s=6.0, ping_every=10)
    _serving_or_dead_of_libzmqs_assertion(*_stop(proc))


def _subscribe_pinging(endpoint: str, subscriptions: int, topic_bytes: int, tag: bytes,
                       lands: Lands = None) -> socket.socket:
    """A ZMTP SUB that sends `subscriptions` subscriptions, each followed by a PING."""
    sock = _connect(endpoint, SUB_READY, lands)
    sock.settimeout(2)
    pad = b"x" * max(0, topic_bytes - 16)
    try:
        for start in range(0, subscriptions, 100):
            sock.sendall(b"".join(_subscription(b"%s-%08d" % (tag, i) + pad) + PING
                                  for i in range(start, min(start + 100, subscriptions))))
    except OSError:  # the server cut the connection (or died)
        pass
    return sock


def _reset_after_pings(pub: str, attempt: int, lands: Lands = None) -> None:
    # The events socket queues 2 subscriptions per connection (subscribers.RCVHWM): the
    # queue is full as soon as a burst comes, busy loop or not. Measured: an abort 0.2 s
    # after the first reset, or after up to 13 tries at a load average of 41-51.
    _reset(_subscribe_pinging(pub, 1_000, 16, b"T%d" % attempt, lands))


def _pings_past_the_budget(pub: str, attempt: int, lands: Lands = None) -> None:
    # No reset: the server itself shuts the connection down when its subscriptions cost
    # more than their budget (zns.drivers.subscribers), which is the same failure.
    _subscribe_pinging(pub, 20_000, 1_000, b"B%d" % attempt, lands).close()


# How long the events-port attacks keep trying while the server lives.
ATTEMPTS_S = 8.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attack", [_reset_after_pings, _pings_past_the_budget])
def test_a_subscriber_that_pings_ends_the_server_only_by_libzmqs_abort(
        attack: Callable[[str, int], None]) -> None:
    proc, router, pub = _busy_server(0.0)
    deadline, attempt = time.monotonic() + ATTEMPTS_S, 0
    while time.monotonic() < deadline and proc.poll() is None:
        attempt += 1
        try:
            attack(pub, attempt)
        except OSError:  # refused: it died since the check
            pass
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        ctx = zmq.Context()
        try:
            assert _status(ctx, router), "the server is alive but does not answer"
        finally:
            ctx.destroy(linger=0)
    _serving_or_dead_of_libzmqs_assertion(*_stop(proc))


def _ask(ctx: zmq.Context, endpoint: str, op: str, timeout_ms: int = 2000,
         **fields: object) -> object:
    """The decoded reply to one request on a new connection, or None when none comes within
    `timeout_ms`."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send(schema.encode({"op": op, "id": 1, **fields}))
        return schema.decode_reply(dealer.recv()) if dealer.poll(timeout_ms) else None
    finally:
        dealer.close()


@pytest.mark.timeout(180)
def test_a_supervised_server_serves_again_soon_after_the_abort(tmp_path):
    """The containment: the process dies, `--supervise` starts a new one on the same ports."""
    router, pub = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    log_path = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--router", router, "--pub", pub,
             "--kv-path", str(tmp_path / "kv.log"), "--supervise", "--workers", "0"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    ctx = zmq.Context()
    try:
        first = wait_for(lambda: _ask(ctx, router, "status"))
        put = _ask(ctx, router, "kv_put", namespace="NS", key="k", value="kept")
        assert isinstance(put, schema.KvPutReply), put
        attempt = 0

        def aborted() -> bool:
            nonlocal attempt
            if "died of SIGABRT" not in log_path.read_text():
                attempt += 1
                attack = (_reset_after_pings, _pings_past_the_budget)[attempt % 2]
                try:
                    attack(pub, attempt)
                except OSError:  # refused: it is down, the log says so in a moment
                    pass
            return "died of SIGABRT" in log_path.read_text()

        # When this fails to provoke the abort, check first whether the bundled libzmq
        # still aborts (then this test's attack needs more tries) or no longer does (then
        # remove `--supervise`'s reason in docs/operations.md and this test).
        wait_for(aborted, timeout=2 * LOADED_DEADLINE, interval=0.5)
        died = time.monotonic()
        second = wait_for(lambda: _ask(ctx, router, "status"))
        back_s = time.monotonic() - died
        assert isinstance(second, schema.StatusReply) and second.epoch != first.epoch
        kept = _ask(ctx, router, "kv_get", namespace="NS", key="k")
        assert isinstance(kept, schema.KvGetReply) and kept.value == "kept", kept
        print(f"serving again {back_s:.2f} s after the abort was logged")
    finally:
        ctx.destroy(linger=0)
        proc.terminate()
        code = proc.wait(30)
    assert code == 0, log_path.read_text()[-2000:]
    assert LIBZMQ_ASSERTION in log_path.read_text()

"""The limit zns is judged against: a bare pyzmq ROUTER that echoes each request.

It runs in its own process and has the very loop shape of `zns.drivers.server.Server`
(blocking `zmq.Poller`, then a NOBLOCK drain of up to MAX_BATCH requests, replies
sent with DONTWAIT, the same socket options), minus everything zns does with a
body. So the ratio zns/echo is the share of a Python ROUTER server's ceiling
that zns keeps.

    python -m bench.echo_server [ENDPOINT [frames|multipart]]

`frames` (the default, and the reference) makes the socket calls zns.drivers.server
makes: recv(copy=False) frame by frame with Frame.more, plain sends.
`multipart` is the idiomatic recv_multipart/send_multipart echo, which asks the
socket for RCVMORE after every frame and costs ~3 µs more per request; it is
measured beside the reference to show that difference.
"""

from __future__ import annotations

import errno
import sys

import zmq

from zns.drivers.server import DEFAULT_MAX_MESSAGE_BYTES

MAX_BATCH = 2048  # requests drained per wake-up


def serve(endpoint: str, io: str = "frames") -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    router.setsockopt(zmq.MAXMSGSIZE, DEFAULT_MAX_MESSAGE_BYTES)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    # The same line shape as zns's, so one parser reads both.
    print(f"echo serving requests on {router.getsockopt_string(zmq.LAST_ENDPOINT)}, "
          "events on -", flush=True)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    echo_batch = _echo_frames if io == "frames" else _echo_multipart
    while True:  # until SIGTERM
        if poller.poll(1000):  # zns wakes at least once a second too (hb)
            echo_batch(router)


def _echo_multipart(router: zmq.Socket) -> None:
    """What zns.drivers.server does today: recv_multipart / send_multipart."""
    for _ in range(MAX_BATCH):
        try:
            frames = router.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            router.send_multipart(frames, zmq.DONTWAIT)
        except zmq.ZMQError as exc:
            if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN):
                raise


# Plain ints: pyzmq's IntFlag arithmetic and its getsockopt(RCVMORE) per frame (~1.7 µs
# each) are most of what recv_multipart/send_multipart cost on small messages.
_NOBLOCK, _DONTWAIT = int(zmq.NOBLOCK), int(zmq.DONTWAIT)
_MORE = int(zmq.SNDMORE | zmq.DONTWAIT)
_send = zmq.backend.Socket.send  # what zns.drivers.server calls: no Python-level wrapper


def _echo_frames(router: zmq.Socket) -> None:
    """The socket calls zns.drivers.server makes: copy=False frames, Frame.more, int flags, backend send."""
    recv = router.recv
    for _ in range(MAX_BATCH):
        try:
            frame = recv(_NOBLOCK, copy=False)
        except zmq.Again:
            return
        envelope = []
        while frame.more:
            envelope.append(frame)
            frame = recv(_NOBLOCK, copy=False)
        body = frame.bytes
        try:
            for part in envelope:
                _send(router, part, _MORE, False)
            _send(router, body, _DONTWAIT)
        except zmq.ZMQError as exc:
            if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN):
                raise


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:*",
          sys.argv[2] if len(sys.argv) > 2 else "frames")

"""The limit zns is judged against: a bare pyzmq ROUTER that echoes each request.

It runs in its own process and has the very loop shape of `zns.server.Server`
(blocking `zmq.Poller`, then a NOBLOCK drain of up to MAX_BATCH requests, replies
sent with DONTWAIT, the same socket options), minus everything zns does with a
body. So the ratio zns/echo is the share of a Python ROUTER server's ceiling
that zns keeps.

    python -m bench.echo_server [ENDPOINT]
"""

from __future__ import annotations

import errno
import sys

import zmq

from zns.server import DEFAULT_MAX_MESSAGE_BYTES, MAX_BATCH


def serve(endpoint: str) -> None:
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
    while True:  # until SIGTERM
        if not poller.poll(1000):  # zns wakes at least once a second too (hb)
            continue
        for _ in range(MAX_BATCH):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                router.send_multipart(frames, zmq.DONTWAIT)
            except zmq.ZMQError as exc:
                if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN):
                    raise


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:*")

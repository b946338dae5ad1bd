"""One-shot requests to NameServers (the tools, examples and tests): send, wait, return.

Each call opens its own DEALER(s) and closes them before returning; the
`error` reply of a NameServer comes back as the ErrorReply it names.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

import zmq

from zns.core.errors import NameServerUnavailable, from_reply
from zns.core.schema import Error, Request, decode_reply, encode, request_op
from zns.drivers.sockets import open_socket


def call(
    endpoint: str, request: Request, timeout: float = 3.0, context: zmq.Context | None = None
) -> Any:
    """Send one request to one NameServer and return its reply.

    Raises the ErrorReply of an `error` reply, or NameServerUnavailable on timeout.
    """
    ctx = context or zmq.Context.instance()
    sock = open_socket(ctx, zmq.DEALER, endpoint)
    try:
        sock.send(encode(request))
        if not sock.poll(int(timeout * 1000)):
            raise NameServerUnavailable(f"no NameServer answered at {endpoint} within {timeout:g} s")
        reply = decode_reply(sock.recv(), request_op(request))
    finally:
        sock.close(0)
    if isinstance(reply, Error):
        raise from_reply(reply)
    return reply


def call_any(
    endpoints: Iterable[str], request: Request, timeout: float = 3.0,
    context: zmq.Context | None = None,
) -> tuple[str, Any]:
    """Ask every NameServer at once; the first answer wins: (its endpoint, its reply)."""
    ctx = context or zmq.Context.instance()
    endpoints = list(endpoints)
    socks = {open_socket(ctx, zmq.DEALER, ep): ep for ep in endpoints}
    try:
        poller = zmq.Poller()
        for sock in socks:
            sock.send(encode(request))
            poller.register(sock, zmq.POLLIN)
        ready = poller.poll(int(timeout * 1000))
        if not ready:
            raise NameServerUnavailable(
                f"no NameServer answered within {timeout:g} s (tried {', '.join(endpoints)})"
            )
        sock = ready[0][0]
        reply = decode_reply(sock.recv(), request_op(request))
        endpoint = socks[sock]
    finally:
        for sock in socks:
            sock.close(0)
    if isinstance(reply, Error):
        raise from_reply(reply)
    return endpoint, reply


def call_all(
    endpoints: Iterable[str], request: Request, timeout: float = 3.0,
    context: zmq.Context | None = None,
) -> dict[str, Any]:
    """Send to every NameServer at once (as RocketMQ's admin writes do), wait up to `timeout`.

    Returns {endpoint: reply, or the ErrorReply / NameServerUnavailable it came to}.
    """
    ctx = context or zmq.Context.instance()
    endpoints = list(endpoints)
    socks = {open_socket(ctx, zmq.DEALER, ep): ep for ep in endpoints}
    results: dict[str, Any] = {}
    try:
        poller = zmq.Poller()
        for sock in socks:
            sock.send(encode(request))
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while len(results) < len(socks):
            left = deadline - time.monotonic()
            ready = poller.poll(math.ceil(left * 1000)) if left > 0 else []
            if not ready:
                break
            for sock, _ in ready:
                reply = decode_reply(sock.recv(), request_op(request))
                results[socks[sock]] = from_reply(reply) if isinstance(reply, Error) else reply
                poller.unregister(sock)
    finally:
        for sock in socks:
            sock.close(0)
    for endpoint in endpoints:
        results.setdefault(endpoint, NameServerUnavailable(
            f"no answer from {endpoint} within {timeout:g} s"))
    return {endpoint: results[endpoint] for endpoint in endpoints}

"""Where and how to reach NameServers: address lists (§10), the one socket factory,
and the small socket helpers every zns event loop shares.

`ZNS_ADDR="tcp://h1:9876;tcp://h2:9876"` lists NameServers; a bare
`host:port` means `tcp://host:port`. Every socket a zns client, broker agent
or tool opens to a NameServer is made by `open_socket`, so transport options
(CURVE keys, say) are added in that one place.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

import zmq

from zns.core.addresses import parse_addresses as core_parse_addresses
from zns.core.schema import DEFAULT_ROUTER

ENV_VAR = "ZNS_ADDR"


def parse_addresses(spec: str | Iterable[str] | None) -> list[str]:
    """The NameServers of `spec`; None or an empty spec means `$ZNS_ADDR`, else the local default."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        spec = os.environ.get(ENV_VAR, "").strip() or DEFAULT_ROUTER
    return core_parse_addresses(spec)


def open_socket(
    ctx: zmq.Context, kind: int, endpoint: str, *, max_message_bytes: int | None = None,
    receive_hwm: int | None = None,
) -> zmq.Socket:
    """A connected DEALER or SUB with the options every zns peer wants.

    LINGER is finite so closing a socket to a dead NameServer never hangs.
    No ZMTP heartbeat (see `set_keepalive`): the sessions notice a dead or
    frozen NameServer themselves (request timeouts, `hb` silence) and open new
    sockets; TCP keepalive frees a connection whose host vanished.
    `max_message_bytes` makes libzmq refuse larger frames from the other side
    (the server sets it on the sockets it opens to its peers), `receive_hwm` how
    many messages a SUB queues at most (the peer links' own mark). A bad endpoint
    raises zmq.ZMQError and leaves no socket behind (the peer links map it with
    `zns.drivers.io_errors.peer_named`: an endpoint a peer named is its fault). CURVE client keys are not set here: they
    come from the context (`zns.drivers.security.apply_client_keys`).
    """
    sock = ctx.socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        set_keepalive(sock)
        if max_message_bytes is not None:
            sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if kind == zmq.SUB:
            # Route events are small; hold a large burst so few are dropped (gaps re-pull).
            sock.setsockopt(zmq.RCVHWM, 100_000 if receive_hwm is None else receive_hwm)
            # A SUB drops subscriptions past its send mark (1,000 by default), silently:
            # a client subscribing to many topics at once would miss some.
            sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(endpoint)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


# TCP keepalive: an idle connection whose host vanished is closed after about
# 30 + 3 x 10 s (the kernel's default waits two hours before the first probe).
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 3


# A peer that reads nothing for this long is disconnected and its unread messages freed.
TCP_TIMEOUT_MS = 10_000


def close_dead_peers(sock: zmq.Socket) -> None:
    """Let the kernel close the connections of `sock` whose peer reads nothing (TCP_MAXRT:
    its data unacknowledged for TCP_TIMEOUT_MS) or whose host vanished while idle
    (`set_keepalive`): no ZMTP heartbeat, which can abort libzmq 4.3.5."""
    sock.setsockopt(zmq.TCP_MAXRT, TCP_TIMEOUT_MS)
    set_keepalive(sock)


def set_keepalive(sock: zmq.Socket) -> None:
    """Let the kernel, not ZMTP heartbeats, close connections to vanished hosts.

    libzmq 4.3.5 aborts the process (`Assertion failed: !_io_error`) when a ZMTP
    heartbeat timer fires on a connection whose peer reset while its inbound queue
    was full; keepalive probes are sent by the kernel and cannot reach that code.
    """
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)


def recv_all(
    sock: zmq.Socket, limit: int = 10_000, *, max_frames: int = 34, max_bytes: int | None = None,
) -> list[list[bytes]]:
    """The messages waiting on `sock` (at most `limit`, so one peer cannot starve a loop).

    A message of more than `max_frames` frames or `max_bytes` bytes in all is read
    and discarded (libzmq hands over a message only once it is whole, so it is
    already in memory; what is bounded here is what this process copies of it).
    """
    messages = []
    recv = sock.recv
    for _ in range(limit):
        try:
            frame = recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break
        frames, size = [frame.bytes], len(frame)
        while frame.more:
            frame = recv(copy=False)
            size += len(frame)
            if frames and (len(frames) >= max_frames
                           or (max_bytes is not None and size > max_bytes)):
                frames = []  # too big: keep reading to the end of it, keep nothing
            if frames:
                frames.append(frame.bytes)
        if frames and (max_bytes is None or size <= max_bytes):
            messages.append(frames)
    return messages


class Waker:
    """Wakes a poller loop from another thread or a signal handler.

    Register `fd` in the zmq.Poller and call `drain_if_woken(ready)` with what the
    poll returned. It is the file descriptor, not the socket object, because
    `zmq.Poller.poll` reports a non-ZeroMQ socket by its descriptor whatever object
    was registered: a check for the object never matches, the byte is never read,
    and every later poll returns at once (a loop that spins a core). `wake()` never
    blocks (a wake-up already pending is enough) and is safe after `close()`.
    """

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self.fd = self._reader.fileno()

    def wake(self) -> None:
        try:
            self._writer.send(b"\0")
        except OSError:  # BlockingIOError: one is pending; otherwise: closed
            pass

    def fileno(self) -> int:
        """The writing end, for `signal.set_wakeup_fd`."""
        return self._writer.fileno()

    def drain_if_woken(self, ready: Collection[Any]) -> bool:
        """Read every pending wake-up if `fd` is among the `ready` ones; say whether it was."""
        if self.fd not in ready:
            return False
        try:
            while self._reader.recv(4096):
                pass
        except OSError:
            pass
        return True

    @property
    def closed(self) -> bool:
        return self._reader.fileno() == -1

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


def handle_signals(handlers: dict[int, Callable[[], None]],
                   waker: Waker) -> tuple[Callable[[], None], Callable[[], None]]:
    """Install `handlers` and make `waker` the signal wake-up descriptor (a signal then wakes
    the loop's poll); returns the two undos: the wake-up descriptor's (before the waker
    closes) and the handlers'. Off the main thread (an embedded server) nothing is installed:
    Python takes signals there only."""
    if threading.current_thread() is not threading.main_thread():
        return (lambda: None), (lambda: None)
    previous = {sig: signal.getsignal(sig) for sig in handlers}
    for sig, handler in handlers.items():
        signal.signal(sig, lambda *_, handler=handler: handler())
    old_fd = signal.set_wakeup_fd(waker.fileno())
    # One that came while it was blocked until now (a forked worker's SIGHUP:
    # zns.drivers.replication_link.fork_worker) is handled here, not lost.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(handlers))

    def restore_wakeup() -> None:
        signal.set_wakeup_fd(old_fd)

    def restore_handlers() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore_wakeup, restore_handlers

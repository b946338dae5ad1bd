"""The events socket's subscribers, the socket side: their subscriptions counted, and the
events queued for those that do not read estimated; the costliest cut
(`zns.core.subscriptions` decides who).

The events socket is an XPUB that passes every subscribe and unsubscribe up
(`XPUB_VERBOSE`, `XPUB_VERBOSER`). An XPUB cannot name the connection a
message came from, but libzmq attaches the connection's descriptor to it
(`SRCFD`), and the socket's monitor reports each connection's descriptor when
it is accepted and when it closes; that number is the connection's name here.
A connection to cut is shut down at the TCP level through its descriptor
(`shutdown`, never `close`: libzmq owns it), after checking that the
descriptor is a connection of the events port, and libzmq then drops the
connection and its subscriptions.

What libzmq queues for a subscriber is not observable either; what the kernel
says of each connection is (`TCP_INFO`'s bytes acknowledged, the send queue's
length: two system calls per connection), and the driver reports it to
`QueuedEvents` every LOOK_EVERY_BYTES of events published.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import struct
import termios
from collections.abc import Callable

import zmq

from zns.core.subscriptions import QueuedEvents, SubscriptionBudget
from zns.core.text import quote

log = logging.getLogger("zns")

# Subscriptions read per pass of the loop (the rest wait in libzmq for the next pass).
READ_PER_PASS = 10_000
# libzmq adds a subscription to its trie when it moves it from the connection's queue
# to the socket, which happens whenever the loop touches the socket, as long as the
# queue refills: with room for 100 queued, one burst of 2,000 subscriptions of 1,000
# bytes was all in the trie (+94 MiB) before the loop had counted 340 of them; with 2,
# +16 MiB when it cut the connection (its budget). Subscriptions are small and rare:
# a client's burst waits in its own queue (zns's SUBs hold 100,000) and TCP's.
RCVHWM = 2
MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
# Linux's struct tcp_info: tcpi_bytes_acked (u64, since 4.1) and the size read.
TCP_INFO_BYTES_ACKED = 120
TCP_INFO_SIZE = 128


class Subscribers:
    """Reads the XPUB's (un)subscriptions each pass and cuts connections over budget."""

    def __init__(self, xpub: zmq.Socket, budget: SubscriptionBudget,
                 freed: Callable[[int], None] = lambda cost: None,
                 queued: QueuedEvents | None = None,
                 passed: Callable[[int, bytes], None] = lambda peer, message: None) -> None:
        self.xpub = xpub
        self.budget = budget
        self.queued = queued or QueuedEvents()
        self.freed = freed
        self._passed = passed  # each (un)subscription counted, as libzmq handed it over
        self.connections: set[int] = set()  # descriptors accepted and not reported closed
        # (family, port or path) of the port, once `bound`: only its connections are cut.
        self.local: tuple[int, object] | None = None
        # Descriptors cut and not yet reported closed: what they still send is not counted.
        self.cutting: set[int] = set()
        xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
        xpub.setsockopt(zmq.RCVHWM, RCVHWM)

    def bound(self, listening: socket.socket | None, endpoint: str) -> None:
        """Where the port listens: a descriptor is cut only if it is a connection of it."""
        if listening is not None:
            self.local = (listening.family, listening.getsockname()[1])
        elif endpoint.startswith("ipc://"):
            self.local = (socket.AF_UNIX, endpoint.removeprefix("ipc://"))

    def handle(self) -> None:
        """Count the subscriptions waiting; cut the connections that went over a budget."""
        recv = self.xpub.recv
        for _ in range(READ_PER_PASS):
            try:
                frame = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            data = frame.bytes
            try:
                peer = frame.get(zmq.SRCFD)
            except zmq.ZMQError:
                peer = -1
            if not data or data[0] > 1 or peer in self.cutting:
                continue  # not a subscription, or one left by a connection cut or gone
            if peer < 0:  # no descriptor (inproc, or libzmq's own unsubscription): not counted
                self._passed(-1, data)
                continue
            if data[0] == 0:
                self.budget.unsubscribed(peer, data[1:])
                self._passed(peer, data)
                continue
            before = self.budget.cost(peer)
            cuts = self.budget.subscribed(peer, data[1:])
            for cut in cuts:
                cost = before if cut == peer else None
                if self.cut(cut, "its subscriptions cost more than " + (
                        f"its budget of {self.budget.per_peer} bytes" if cost is not None else
                        f"their share of the total budget of {self.budget.total} bytes")):
                    self.freed(self.budget.per_peer if cost is None else cost)
            if peer not in cuts:
                self._passed(peer, data)

    def sent(self, nbytes: int) -> None:
        """An event of `nbytes` was published; every LOOK_EVERY_BYTES, cut the subscribers
        that read nothing while all of them hold too much."""
        if not self.queued.published(nbytes):
            return
        progress = {}
        for fd in self.connections - self.cutting:
            if (seen := _tcp_progress(fd)) is not None:
                progress[fd] = seen
        for fd in self.queued.looked(progress):
            self.cut(fd, "it read none of the events queued for it while all subscribers "
                          f"held more than {self.queued.total} bytes of them")

    def on_monitor_event(self, event: int, fd: int) -> None:
        """A connection was accepted, or closed: then the descriptor names nobody we counted.

        An accept forgets nothing: the monitor may report it after the connection's first
        subscriptions were read (another pipe), and forgetting them then would let a
        subscriber hold more than its budget. A closed connection is reported before its
        number can be accepted again."""
        if event == zmq.EVENT_ACCEPTED:
            self.connections.add(fd)
            self.cutting.discard(fd)
        elif event == zmq.EVENT_DISCONNECTED:
            self.connections.discard(fd)
            self.cutting.discard(fd)
            cost = self.budget.cost(fd)
            self.budget.closed(fd)
            if cost:
                self.freed(cost)

    def cut(self, fd: int, why: str) -> bool:
        """Shut the connection `fd` down, if it is one of the port's; whether it was."""
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return False  # already closed
        with sock:
            try:
                family, local = sock.family, sock.getsockname()
                peer = sock.getpeername()
            except OSError:
                return False
            port = local if family == socket.AF_UNIX else local[1]
            if self.local is None or (family, port) != self.local:
                return False  # the descriptor was reused by something else: not ours to cut
            self.cutting.add(fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    raise
        log.warning("events subscriber %s disconnected: %s (%d cut since start)",
                    quote(str(peer)), why, self.budget.cut + self.queued.cut)
        return True


def _tcp_progress(fd: int) -> tuple[int, int] | None:
    """(bytes the peer acknowledged, bytes waiting in the kernel's send queue) of the TCP
    connection `fd`; None for one that is not TCP (ipc) or is gone."""
    try:
        sock = socket.socket(fileno=fd)  # no copy: libzmq owns the descriptor (detached below)
    except OSError:
        return None  # closed meanwhile, or the number now names something else
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_SIZE)
        waiting = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return None
    finally:
        sock.detach()
    if len(info) < TCP_INFO_SIZE:
        return None
    return struct.unpack_from("Q", info, TCP_INFO_BYTES_ACKED)[0], struct.unpack("i", waiting)[0]

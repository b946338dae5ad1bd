"""The events socket's subscribers, the socket side: their subscriptions counted, the
costliest cut (`zns.core.subscriptions` decides who).

The events socket is an XPUB that passes every subscribe and unsubscribe up
(`XPUB_VERBOSE`, `XPUB_VERBOSER`). An XPUB cannot name the connection a
message came from, but libzmq attaches the connection's descriptor to it
(`SRCFD`), and the socket's monitor reports each connection's descriptor when
it is accepted and when it closes; that number is the connection's name here.
A connection to cut is shut down at the TCP level through its descriptor
(`shutdown`, never `close`: libzmq owns it), after checking that the
descriptor is a connection of the events port, and libzmq then drops the
connection and its subscriptions.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable

import zmq

from zns.core.subscriptions import SubscriptionBudget
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


class Subscribers:
    """Reads the XPUB's (un)subscriptions each pass and cuts connections over budget."""

    def __init__(self, xpub: zmq.Socket, budget: SubscriptionBudget,
                 freed: Callable[[int], None] = lambda cost: None) -> None:
        self.xpub = xpub
        self.budget = budget
        self._freed = freed
        self._local: tuple[int, object] | None = None  # (family, port or path) of the port
        # Descriptors cut and not yet reported closed: what they still send is not counted.
        self._cut_fds: set[int] = set()
        xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
        xpub.setsockopt(zmq.RCVHWM, RCVHWM)

    def bound(self, listening: socket.socket | None, endpoint: str) -> None:
        """Where the port listens: a descriptor is cut only if it is a connection of it."""
        if listening is not None:
            self._local = (listening.family, listening.getsockname()[1])
        elif endpoint.startswith("ipc://"):
            self._local = (socket.AF_UNIX, endpoint.removeprefix("ipc://"))

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
            if not data or data[0] > 1 or peer < 0 or peer in self._cut_fds:
                continue  # not a subscription, or one left by a connection cut or gone
            if data[0] == 0:
                self.budget.unsubscribed(peer, data[1:])
                continue
            before = self.budget.cost(peer)
            for cut in self.budget.subscribed(peer, data[1:]):
                self._cut(cut, before if cut == peer else None)

    def on_monitor_event(self, event: int, fd: int) -> None:
        """A connection was accepted or closed: the descriptor names nobody we counted."""
        if event in (zmq.EVENT_ACCEPTED, zmq.EVENT_DISCONNECTED):
            self._cut_fds.discard(fd)
            cost = self.budget.cost(fd)
            self.budget.closed(fd)
            if cost:
                self._freed(cost)

    def _cut(self, fd: int, cost: int | None) -> None:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return  # already closed
        with sock:
            try:
                family, local = sock.family, sock.getsockname()
                peer = sock.getpeername()
            except OSError:
                return
            port = local if family == socket.AF_UNIX else local[1]
            if self._local is None or (family, port) != self._local:
                return  # the descriptor was reused by something else: not ours to cut
            self._cut_fds.add(fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    raise
        log.warning("events subscriber %s disconnected: its subscriptions cost more than "
                    "%s (%d cut since start)", quote(str(peer)),
                    "its budget of %d bytes" % self.budget.per_peer if cost is not None
                    else "their share of the total budget of %d bytes" % self.budget.total,
                    self.budget.cut)
        self._freed(self.budget.per_peer if cost is None else cost)

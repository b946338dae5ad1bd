"""File descriptors: raise the limit, and shed connections instead of spinning when it is reached.

libzmq accepts TCP connections on its own I/O thread. When the process is out
of descriptors, `accept` fails with EMFILE and the listening socket stays
readable, so libzmq retries at once, for ever: a CPU spinning at 100 % while
no new client gets in. zns therefore hands libzmq listening sockets it made
itself (`ZMQ_USE_FD`) and watches each zmq socket's monitor for
`ACCEPT_FAILED`. On that event it first stops new connections before they
reach any accept queue: a one-instruction socket filter that drops every
packet is attached to each listening socket, so the kernel drops incoming
SYNs and clients retry at TCP's own pace (1 s, 2 s, 4 s ...). Then it empties
the accept queues, which needs a free descriptor per `accept`.

That last step is not done in this process. Any descriptor freed here is taken
by libzmq's spinning `accept` before our own `accept` can use it (a race it
wins most of the time), and once every slot is taken nothing is left to shed
with: the queue stays full and libzmq spins for ever. So a forked child does
it. A child has its own copy of the descriptor table: it closes its copies of
everything but the listening sockets (the parent's connections are untouched,
the parent still holds them), accepts and closes what waits, writes the count
into a shared anonymous page and exits. It calls nothing that takes a lock
another thread could hold, and the parent waits for it at most
SHED_WAIT_MS before killing it.

Once a second the guard counts the process's descriptors; with enough free
again it takes the filters off. Existing connections are never touched; the
log says when new connections stop and start again.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import resource
import select
import signal
import socket
import struct
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import zmq

from zns.core.accept_pause import AcceptPause
from zns.core.addresses import url_host
from zns.drivers.loop import PollSet, Ready

log = logging.getLogger("zns")

# Linux SO_ATTACH_FILTER / SO_DETACH_FILTER and the classic BPF program `ret #0`
# (accept 0 bytes of every packet: drop it).
SO_ATTACH_FILTER, SO_DETACH_FILTER = 26, 27
_DROP_ALL = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))
_DROP_ALL_PROG = struct.pack("HxxxxxxQ", 1, ctypes.addressof(_DROP_ALL))
MONITOR_EVENTS_PER_PASS = 1024
SHED_PER_PASS = 4096  # connections one shedding child closes, at most (SOMAXCONN's default)
SHED_WAIT_MS = 500  # how long the loop waits for a shedding child before killing it


def raise_descriptor_limit() -> int:
    """Raise the soft limit of open files to the hard one; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


class Listener:
    """One zmq socket bound through a listening TCP socket of ours, and its monitor."""

    def __init__(self, sock: zmq.Socket, endpoint: str,
                 on_event: Callable[[int, int], None] | None = None, events: int = 0,
                 *, reuse_port: bool = False) -> None:
        self.sock = sock
        # Other monitor events (event, value) go here: a socket has one monitor only.
        self.on_event = on_event
        self.listening: socket.socket | None = None
        tcp = tcp_host_port(endpoint)
        if tcp is not None:
            self.listening = listen_tcp(*tcp, reuse_port=reuse_port)
            sock.setsockopt(zmq.USE_FD, self.listening.fileno())
            host, port = self.listening.getsockname()[:2]
            shown = url_host(host)
            endpoint = f"tcp://{shown}:{port}"
        try:
            sock.bind(endpoint)
        except BaseException:
            if self.listening is not None:
                self.listening.close()
            raise
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPT_FAILED | events)
        self.shed = 0  # connections closed for lack of descriptors

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(linger=0)
        if self.listening is not None:
            # libzmq owns the descriptor once bound (it closes it with the zmq socket):
            # let go of it without closing, or both would close it.
            self.listening.detach()


class DescriptorGuard:
    """Stops new connections and sheds waiting ones when accept runs out of descriptors;
    what it does when is `pause`'s (zns.core.accept_pause)."""

    def __init__(self, limit: int) -> None:
        self.pause = AcceptPause(limit)
        self.listeners: list[Listener] = []
        self.plain: list[socket.socket] = []  # listening sockets accepted from by zns itself
        self.shedder = Shedder()

    @property
    def limit(self) -> int:
        """The open-file limit in force."""
        return self.pause.limit

    def bind(self, sock: zmq.Socket, endpoint: str,
             on_event: Callable[[int, int], None] | None = None, events: int = 0,
             *, reuse_port: bool = False) -> Listener:
        """Bind `sock` to `endpoint` (OSError or zmq.ZMQError when it cannot be).

        `events` more monitor events of `sock` are handed to `on_event(event, value)`.
        `reuse_port`: SO_REUSEPORT, so that the workers of one state process listen on
        one port together (the kernel spreads new connections over them).
        """
        listener = Listener(sock, endpoint, on_event, events, reuse_port=reuse_port)
        self.listeners.append(listener)
        return listener

    # --- the loop's side (a `zns.drivers.loop.Source`) --------------------

    what = "shedding connections"

    def attach(self, poll: PollSet) -> None:
        for listener in self.listeners:
            poll.register(listener.monitor, zmq.POLLIN, self)

    def next_deadline(self, now: int) -> int | None:
        return self.pause.next_deadline(now)

    def run(self, ready: Ready, now: int, until: int) -> None:
        self.handle(ready, now)
        self.tick(now)

    def handle(self, ready: Ready, now: int) -> None:
        """Read the monitors that are ready; stop new connections where accept ran out."""
        for listener in self.listeners:
            if listener.monitor not in ready:
                continue
            out_of_descriptors = False
            for event in monitor_events(listener.monitor, MONITOR_EVENTS_PER_PASS):
                if event["event"] == zmq.EVENT_ACCEPT_FAILED:
                    out_of_descriptors = out_of_descriptors or event["value"] in OUT_OF_FDS
                elif listener.on_event is not None:
                    listener.on_event(event["event"], event["value"])
            if out_of_descriptors and listener.listening is not None:
                listener.shed += self.out_of_descriptors(listener.listening, now)

    def out_of_descriptors(self, listening: socket.socket, now: int) -> int:
        """Accept failed on `listening` for lack of descriptors: stop new connections on
        every listening socket, then close what waits on them. Returns how many."""
        starting = self.pause.out_of_descriptors(now)
        if starting:
            for sock in self._listening():
                _set_drop_filter(sock, True)
        others = [s for s in waiting(self._listening()) if s is not listening]
        shed = self.shedder.shed([listening, *others])
        if starting:
            log.warning("out of file descriptors (limit %d): new connections are dropped until "
                        "some close; existing ones are served (%d waiting closed). Raise the "
                        "limit with `ulimit -n`", self.limit, shed)
        return shed

    def tick(self, now: int) -> None:
        """While paused, once a second: shed what waits, and let new connections in again
        when descriptors are free."""
        if not self.pause.due(now):
            return
        queued = waiting(self._listening())
        if queued:  # anything that got into a queue before the filter
            self.shedder.shed(queued)
        stopped = self.pause.free_again(_open_descriptors(), now)
        if stopped is None:
            return
        for sock in self._listening():
            _set_drop_filter(sock, False)
        log.warning("file descriptors free again: accepting new connections (stopped for %d ms)",
                    stopped)

    def _listening(self) -> list[socket.socket]:
        return [l.listening for l in self.listeners if l.listening is not None] + self.plain

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()
        self.listeners.clear()
        self.shedder.close()


_MONITOR_EVENT = struct.Struct("=hi")


def parse_monitor_message(frames: list[bytes]) -> dict[str, Any]:
    """A socket monitor's message, as pyzmq's zmq.utils.monitor parses it: the event (16
    bits) and its value (32 bits, native order), then the endpoint. Not imported from there:
    that module imports zmq.asyncio, and with it asyncio and ssl, some megabytes in every
    process of a server that uses neither."""
    if len(frames) != 2 or len(frames[0]) != _MONITOR_EVENT.size:
        raise RuntimeError(f"a socket monitor sent {frames!r}, not an event")
    event, value = _MONITOR_EVENT.unpack(frames[0])
    return {"event": zmq.Event(event), "value": value, "endpoint": frames[1]}


def monitor_events(monitor: zmq.Socket, most: int | None = None) -> Iterator[Mapping[str, Any]]:
    """The events waiting on a socket monitor, parsed, read one at a time without blocking
    (at most `most` of them; None: until none waits)."""
    count = 0
    while most is None or count < most:
        try:
            yield parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return
        count += 1


def waiting(listening: list[socket.socket]) -> list[socket.socket]:
    """Those of `listening` with connections waiting in their accept queues."""
    poller = select.poll()  # unlike epoll, poll needs no descriptor of its own
    sockets = {sock.fileno(): sock for sock in listening}
    for fd in sockets:
        poller.register(fd, select.POLLIN)
    return [sockets[fd] for fd, _ in poller.poll(0)]


class Shedder:
    """Accepts and closes what waits on listening sockets, in a forked child (see the
    module's docstring for why)."""

    def __init__(self) -> None:
        # Where the child writes how many it closed: an anonymous shared page needs no
        # descriptor, so it is made now and used when none is free.
        self._count = mmap.mmap(-1, 8)

    @property
    def closed(self) -> bool:
        return self._count.closed

    def close(self) -> None:
        self._count.close()

    def shed(self, listening: list[socket.socket]) -> int:
        """Accept every connection waiting on `listening` and close it, in a forked child.
        Returns how many were closed."""
        keep = sorted({sock.fileno() for sock in listening})
        self._count[:] = bytes(8)
        with warnings.catch_warnings():  # Python 3.12+ warns of fork with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                pid = os.fork()
            except OSError as exc:
                log.warning("could not fork to close waiting connections: %s", exc)
                return 0
        if pid == 0:  # the child: only this thread runs here
            try:
                _close_all_but(keep)
                self._count[:] = struct.pack("Q", _accept_and_close(listening))
            finally:
                os._exit(0)
        deadline = time.monotonic() + SHED_WAIT_MS / 1000
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                log.warning("a child closing waiting connections took over %d ms: killed",
                            SHED_WAIT_MS)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.001)
        return struct.unpack("Q", self._count[:])[0]


def _close_all_but(keep: list[int]) -> None:
    low = 0
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _accept_and_close(listening: list[socket.socket]) -> int:
    closed = 0
    for sock in listening:
        while closed < SHED_PER_PASS:
            try:
                conn, _ = sock.accept()
            except OSError:  # BlockingIOError once the queue is empty
                break
            conn.close()
            closed += 1
    return closed


OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _set_drop_filter(sock: socket.socket, on: bool) -> None:
    try:
        if on:
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, _DROP_ALL_PROG)
        else:
            sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
    except OSError as exc:
        log.warning("could not %s the drop filter on a listening socket: %s",
                    "attach" if on else "detach", exc)


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # out of descriptors ourselves, or no /proc: assume still full
        return 1 << 30


def tcp_host_port(endpoint: str) -> tuple[str, int] | None:
    """The host and port a `tcp://HOST:PORT` endpoint binds (port `*` or 0: 0, any free
    one); None for another scheme. ValueError for a port that is not a number."""
    scheme, _, address = endpoint.partition("://")
    if scheme != "tcp":
        return None
    host, _, port = address.rpartition(":")
    return host, 0 if port in ("*", "0") else int(port)


def tcp_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    """The family and address `listen_tcp` binds for host:port."""
    host = host.strip("[]")
    if host in ("*", "", "0.0.0.0"):
        return socket.AF_INET, ("0.0.0.0", port)
    if ":" in host:
        return socket.AF_INET6, (host, port)
    return socket.AF_INET, (socket.gethostbyname(host), port)


def listen_tcp(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A non-blocking listening TCP socket on host:port (`*`, empty or 0.0.0.0: every IPv4
    address; port 0: any free one); with SO_REUSEPORT if `reuse_port`. OSError when it
    cannot be bound."""
    family, address = tcp_address(host, port)
    listening = socket.socket(family, socket.SOCK_STREAM)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listening.bind(address)
        listening.listen(socket.SOMAXCONN)
        listening.setblocking(False)
    except BaseException:
        listening.close()
        raise
    return listening

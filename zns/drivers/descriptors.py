"""File descriptors: raise the limit, and shed connections instead of spinning when it is reached.

libzmq accepts TCP connections on its own I/O thread. When the process is out
of descriptors, `accept` fails with EMFILE and the listening socket stays
readable, so libzmq retries at once, for ever: a CPU spinning at 100 % while
no new client gets in. zns therefore hands libzmq listening sockets it made
itself (`ZMQ_USE_FD`) and watches each zmq socket's monitor for
`ACCEPT_FAILED`. On that event it frees a reserve descriptor it keeps open
for this purpose, accepts the waiting connections on that same listening
socket and closes them at once (the peer sees a closed connection and
retries later), then takes the reserve back. Existing connections are never
touched; the log says, at most once per interval, that new connections are
being refused for lack of descriptors.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("zns")


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

    def __init__(self, sock: zmq.Socket, endpoint: str) -> None:
        self.sock = sock
        self.listening: socket.socket | None = None
        scheme, _, address = endpoint.partition("://")
        if scheme == "tcp":
            host, _, port = address.rpartition(":")
            self.listening = _listen(host, 0 if port in ("*", "0") else int(port))
            sock.setsockopt(zmq.USE_FD, self.listening.fileno())
            host, port = self.listening.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            endpoint = f"tcp://{shown}:{port}"
        try:
            sock.bind(endpoint)
        except BaseException:
            if self.listening is not None:
                self.listening.close()
            raise
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPT_FAILED)
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
    """Keeps a reserve descriptor and sheds waiting connections when accept runs out."""

    def __init__(self) -> None:
        self._reserve: int | None = _open_reserve()
        self.listeners: list[Listener] = []
        self.exhausted = 0  # ACCEPT_FAILED events for lack of descriptors

    def bind(self, sock: zmq.Socket, endpoint: str) -> Listener:
        """Bind `sock` to `endpoint` (OSError or zmq.ZMQError when it cannot be)."""
        listener = Listener(sock, endpoint)
        self.listeners.append(listener)
        return listener

    def handle(self, ready: dict) -> None:
        """Read the monitors that are ready; shed connections where accept failed for descriptors."""
        for listener in self.listeners:
            if listener.monitor not in ready:
                continue
            out_of_descriptors = False
            while True:
                try:
                    event = parse_monitor_message(listener.monitor.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if event["event"] == zmq.EVENT_ACCEPT_FAILED and event["value"] in (
                        errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    out_of_descriptors = True
            if out_of_descriptors and listener.listening is not None:
                self.exhausted += 1
                shed = self._shed(listener.listening)
                listener.shed += shed
                log.warning("out of file descriptors: closed %d new connection(s) to %s at once "
                            "(existing ones are served; raise the open-file limit, `ulimit -n`)",
                            shed, listener.endpoint)

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()
        self.listeners.clear()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def _shed(self, listening: socket.socket) -> int:
        """Accept every waiting connection on `listening` and close it (using the reserve)."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        shed = 0
        try:
            while shed < 10_000:
                try:
                    conn, _ = listening.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE):
                        break  # another thread took the reserve; the next event retries
                    raise
                conn.close()
                shed += 1
        finally:
            self._reserve = _open_reserve()
        return shed


def _listen(host: str, port: int) -> socket.socket:
    host = host.strip("[]")
    if host in ("*", "", "0.0.0.0"):
        family, address = socket.AF_INET, ("0.0.0.0", port)
    elif ":" in host:
        family, address = socket.AF_INET6, (host, port)
    else:
        family, address = socket.AF_INET, (socket.gethostbyname(host), port)
    listening = socket.socket(family, socket.SOCK_STREAM)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(socket.SOMAXCONN)
        listening.setblocking(False)
    except BaseException:
        listening.close()
        raise
    return listening


def _open_reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None

"""Port locks: what keeps two zns from serving one TCP port, beside what the kernel refuses.

A port's lock (`lock_port`) is an abstract Unix socket: a name with no file, which the
kernel drops with the last descriptor of its socket (however the process ends), and which
is per network namespace, as TCP ports are. The state process of `--workers N` holds one
for each port it reserves (zns.drivers.state_process, `reserve_port`), and a single
process (`--workers 0`, zns.drivers.server) for each port it listens on (`hold_lock`):
the kernel lets a listener bind beside a socket that does not listen (the state process's
reservation), so without it a single process started while none of a state process's
workers listens would take the port from them. Such names are Linux's: elsewhere ports
are not locked, and the state process says so at start.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from zns.core.errors import EndpointError

PORT_LOCKS = sys.platform.startswith("linux")
PORT_LOCK_PREFIX = "\0zns:tcp:"
LOCK_HELD = "another zns holds the port, none of its workers listening on it now"
# A port (or its lock) in use at start is tried again until this long after the first try
# (`retried`).
PORT_FREED_WAIT_S = 2.0
T = TypeVar("T")


class PortLocked(OSError):
    """EADDRINUSE: the lock `name` (`lock_port`) is held by another socket (of process
    `holder`, when known: `lock_holder`)."""

    def __init__(self, name: str, holder: int | None = None) -> None:
        held = LOCK_HELD if holder is None else f"{LOCK_HELD}: pid {holder}"
        super().__init__(errno.EADDRINUSE, f"{os.strerror(errno.EADDRINUSE)} ({held})")
        self.name = name


def lock_name(family: int, host: str, port: int) -> str:
    """The lock's name of a TCP address as the kernel names it (`127.0.0.1:9876`,
    `[::1]:9876`), from `host` as getsockname gives it or as zns.drivers.descriptors'
    `tcp_address` resolves it: an IPv6 address written another way is made the kernel's."""
    if family == socket.AF_INET6:
        address, percent, scope = host.partition("%")
        try:
            address = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6,
                                                                          address))
        except OSError:
            pass  # not an address: the bind will say so
        return f"[{address}{percent}{scope}]:{port}"
    return f"{host}:{port}"


def lock_port(name: str) -> tuple[socket.socket | None, str]:
    """The lock of the TCP address `name` (`127.0.0.1:9876`, `[::1]:9876`), held until its
    socket is closed: the abstract Unix socket PORT_LOCK_PREFIX + `name`, bound and never
    listening. PortLocked when another socket holds it. (None, why) where ports cannot be
    locked (not Linux, or Unix sockets refused to this process)."""
    if not PORT_LOCKS:
        return None, "abstract Unix socket names are Linux's"
    try:
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        return None, f"no Unix socket: {exc.strerror}"
    try:
        lock.bind(PORT_LOCK_PREFIX + name)
    except OSError as exc:
        lock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortLocked(name) from None
        return None, f"cannot bind the lock of {name}: {exc.strerror}"
    return lock, ""


def lock_holder(name: str, pids: list[str] | None = None) -> int | None:
    """The pid of a process holding the lock `name`, as `ss -xp` finds it: the lock's inode
    in /proc/net/unix, then a descriptor of that socket under /proc/PID/fd (of `pids` only,
    when given). None when none is found (a process of another user, whose descriptors this
    one may not read). Asked when a start is refused: it reads every process's descriptors."""
    shown = "@" + (PORT_LOCK_PREFIX + name)[1:]  # an abstract name's NUL shows as "@"
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
            inodes = {fields[6] for line in table
                      if len(fields := line.split()) >= 8 and fields[7] == shown}
    except OSError:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc") if pids is None else pids):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in targets
                   for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
        except OSError:
            continue  # gone, or another user's
    return None


def retried(attempt: Callable[[], T], refused: str, own: Callable[[PortLocked], bool]) -> T:
    """`attempt()` (a bind, or a lock's), tried again while a port or a lock is in use
    (EADDRINUSE) until PORT_FREED_WAIT_S after the first try: a zns just killed (its
    workers, as they read the end of its channel) leaves them at once. EndpointError
    `refused: why` when still in use then, a lock's holder named; at once for a lock that
    `own` says is this process's (another endpoint of this zns on the same address: the
    kernel would refuse its listen at once too)."""
    give_up = time.monotonic() + PORT_FREED_WAIT_S
    while True:
        try:
            return attempt()
        except OSError as exc:
            if isinstance(exc, PortLocked) and own(exc):
                exc = OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
            elif exc.errno == errno.EADDRINUSE and time.monotonic() < give_up:
                time.sleep(0.05)
                continue
            elif isinstance(exc, PortLocked):
                exc = PortLocked(exc.name, lock_holder(exc.name))  # named once, refused
            raise EndpointError(f"{refused}: {exc}") from exc


def hold_lock(name: str, refused: str) -> socket.socket | None:
    """`lock_port(name)` for a single process (`--workers 0`), `retried` as the state
    process's reservations are, a lock of another server of this process refused at once;
    None where ports cannot be locked (the kernel still refuses a second listener, which is
    all a single process needs)."""
    own = str(os.getpid())
    return retried(lambda: lock_port(name)[0], refused,
                   own=lambda exc: lock_holder(exc.name, [own]) is not None)

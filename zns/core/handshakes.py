"""Connections to a ZNS/1 port that never become ZeroMQ peers, said out loud.

The commonest mistake of an operator coming from RocketMQ is to point a broker,
a client or mqadmin at a ZNS/1 port (9876 is both RocketMQ's and zns's default).
libzmq closes such a connection without a word to the application: its socket
monitor reports the connection accepted and then disconnected, with no handshake
in between. A ZeroMQ client whose security does not match (no CURVE key against
a CURVE server, the wrong server key) is reported as a failed handshake. This
rule turns those reports into one warning per source, naming the fix.

The monitor's handshake events carry no connection, so a handshake is matched
to a connection only when exactly one is waiting; any successful handshake
clears every waiting connection. So a connection is blamed only when it
certainly closed before its handshake completed (a port probe that connects and
closes is such a connection too), and under a burst of good clients a bad one
can go unnamed: never the reverse. The source is the peer's address when the
driver could still read it, else the port.

Sans-I/O: fed monitor events and `now`, returns the warning to log (or None).
"""

from __future__ import annotations

# A source warned about is warned about again at most once per WARN_EVERY_MS, with the
# count of connections held back meanwhile; at most MAX_SOURCES are remembered.
WARN_EVERY_MS = 60_000
MAX_SOURCES = 1024
MAX_WAITING = 4096  # connections accepted and not yet handshaken, remembered at most

# What a failed handshake means, by the kind the driver names (from libzmq's codes).
FAILURES = {
    "mechanism": "its security mechanism differs from the server's",
    "cryptographic": "its CURVE handshake did not decrypt (the wrong server public key?)",
    "auth": "its CURVE key is not allowed here",
    "other": "the ZeroMQ handshake failed",
}


class HandshakeWatch:
    """Monitor events of one ZNS/1 listening socket in; warnings about bad peers out."""

    def __init__(self, port: str, *, curve: bool) -> None:
        self.port = port  # the bound endpoint, set once known
        self.curve = curve
        self._waiting: dict[int, str | None] = {}  # fd -> source, accepted, no handshake yet
        self._warned: dict[str, list[int]] = {}  # source -> [last warned at, held back since]

    def accepted(self, fd: int, source: str | None) -> None:
        if len(self._waiting) >= MAX_WAITING:
            self._waiting.clear()  # only warnings are lost, never a wrong one
        self._waiting[fd] = source

    def succeeded(self) -> None:
        self._waiting.clear()

    def failed(self, now: int, kind: str) -> str | None:
        source = next(iter(self._waiting.values())) if len(self._waiting) == 1 else None
        self._waiting.clear()  # its disconnect follows: not blamed twice
        if self.curve:
            fix = ("this server uses CURVE: the client needs the server's public key (zns "
                   "--server-key, a client's server_key=) and, with key directories, a key "
                   "listed there")
        else:
            fix = "this server does not use CURVE: the client must not set a server key"
        return self._warn(now, source, f"a ZeroMQ client{_from(source)} failed the handshake "
                          f"on {self.port}: {FAILURES.get(kind, FAILURES['other'])}; {fix}")

    def disconnected(self, now: int, fd: int) -> str | None:
        if fd not in self._waiting:
            return None
        source = self._waiting.pop(fd)
        return self._warn(
            now, source, f"a connection{_from(source)} to the ZNS/1 port {self.port} closed "
            "before completing the ZeroMQ handshake: not a ZeroMQ client? RocketMQ brokers, "
            "clients and mqadmin speak RocketMQ's remoting protocol, which zns serves only on "
            "the port given to --remoting HOST:PORT")

    def _warn(self, now: int, source: str | None, text: str) -> str | None:
        key = _host(source) if source else self.port
        seen = self._warned.get(key)
        if seen is not None and now - seen[0] < WARN_EVERY_MS:
            seen[1] += 1
            return None
        if seen is None and len(self._warned) >= MAX_SOURCES:
            del self._warned[next(iter(self._warned))]  # the longest remembered
        held = seen[1] if seen is not None else 0
        self._warned.pop(key, None)
        self._warned[key] = [now, 0]
        if held:
            text += f" ({held} more from there in the last {(now - seen[0]) // 1000} s)"  # type: ignore[index]
        return text


def _from(source: str | None) -> str:
    return f" from {source}" if source else ""


def _host(source: str) -> str:
    """The host of `source` (HOST:PORT or [V6]:PORT): one warning per machine, not per port."""
    return source.rpartition(":")[0] or source

"""Library I/O errors become errors of zns's tree at the driver boundary, in this one place.

In the style of httpcore's `map_exceptions`: a driver wraps each call into zmq,
`socket` or the file system that can fail for a reason outside zns in one of the
mappings below, and what leaves the `with` is an error of `zns.core.errors` that
says who is at fault:

- **the operator** (an endpoint or file named in the configuration that cannot
  be bound or read): a `ConfigError` subclass, via `configured(...)`; `zns serve`
  stops with one line;
- **the peer or the network** (a connection reset, a reply to a peer that is
  gone, an endpoint a peer named that cannot be connected to): `ConnectionLost`,
  via `ZNS1_PEER`, `REMOTING_PEER` or `peer_named(...)`; the driver drops that
  connection (or that reply) and carries on;
- **the server itself** (a KV write the file system refused): `Internal`, via
  `zns.drivers.kv_file.NOT_DURABLE`; the request is answered `internal`;
- **zns's own bug**: anything not listed (zmq's ENOTSOCK or EFSM, a closed socket
  used again, a TypeError) passes through unchanged, so the loop logs its
  traceback as the bug it is.

"Would block" (zmq.Again, BlockingIOError, InterruptedError) is flow control, not
a fault: every mapping lets it through for the caller to test where it happens.
Not mapped either: the best-effort calls about the process's own environment (raising
the descriptor limit, forking to shed connections, /proc, a socket filter, the waker),
where the driver logs a warning and carries on at the call: no one above handles them.
The mappings are objects, not generator context managers, so entering one costs
what an attribute lookup costs; the reply path of every request, hotter still, asks
`ZNS1_PEER.maps` only once it caught a zmq error.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from types import TracebackType

import zmq

from zns.core.errors import ConfigError, ConnectionLost, EndpointError, ZnsError

WOULD_BLOCK: tuple[type[BaseException], ...] = (zmq.Again, BlockingIOError, InterruptedError)
# Passed through unchanged: flow control, and errors already of zns's tree (a UsageError
# is also a ValueError; it stays the caller's).
_PASSING = (*WOULD_BLOCK, ZnsError)

# What libzmq says of a peer on a send or a connect it made itself: the peer is gone
# (a ROUTER_MANDATORY reply to an identity that disconnected) or cannot be reached.
ZMQ_PEER_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ECONNRESET,
                             errno.ENETUNREACH})


class map_exceptions:  # noqa: N801 - used as `with map_exceptions(...)`, like contextlib's
    """`with` this: an exception of a listed kind leaves as its zns error, chained.

    `mapping` pairs a library exception (and, for a zmq.ZMQError, optionally the
    errnos it applies to) with the zns error it becomes; the first match wins.
    `what` prefixes the zns error's message (say what was being done and to what).
    """

    __slots__ = ("_mapping", "_what")

    def __init__(self, mapping: Iterable[tuple[type[BaseException], frozenset[int] | None,
                                               type[ZnsError]]],
                 what: str = "") -> None:
        self._mapping = tuple(mapping)
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            return
        target = self._target(exc)
        if target is not None:
            raise target(f"{self._what}{exc}") from exc

    def maps(self, exc: BaseException) -> bool:
        """Whether `exc` would leave a `with` of this mapping as a zns error: for a hot path
        that asks only once it caught one (the reply path: a `with` costs ~0.15 µs a reply)."""
        return self._target(exc) is not None

    def _target(self, exc: BaseException) -> type[ZnsError] | None:
        """The zns error `exc` becomes; None: it leaves unchanged."""
        if isinstance(exc, _PASSING):
            return None
        for source, errnos, target in self._mapping:
            if isinstance(exc, source) and (errnos is None or getattr(exc, "errno", None) in errnos):
                return target
        return None


def configured(what: str, error: type[ConfigError] = EndpointError) -> map_exceptions:
    """Binding, listening on or reading what the operator configured (`what` names it,
    e.g. "cannot bind tcp://*:9876: "): any failure is the configuration's, `error`."""
    return map_exceptions([(zmq.ZMQError, None, error), (OSError, None, error),
                           (ValueError, None, error)], what)


def peer_named(what: str) -> map_exceptions:
    """Connecting to an endpoint a peer named (a peer NameServer's events endpoint):
    whatever libzmq refuses is the peer's, `ConnectionLost`."""
    return map_exceptions([(zmq.ZMQError, None, ConnectionLost)], what)


# A send to (or a read from) a ZNS/1 peer over zmq: the peer is gone or unreachable.
ZNS1_PEER = map_exceptions([(zmq.ZMQError, ZMQ_PEER_ERRNOS, ConnectionLost)])

# A read from or a write to a remoting connection (a plain TCP socket): whatever the
# kernel refuses (reset, broken pipe, timed out) ends that connection.
REMOTING_PEER = map_exceptions([(OSError, None, ConnectionLost)])


__all__ = ["REMOTING_PEER", "WOULD_BLOCK", "ZNS1_PEER", "ZMQ_PEER_ERRNOS", "configured",
           "map_exceptions", "peer_named"]

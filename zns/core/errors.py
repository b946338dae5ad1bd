"""Every error zns raises on purpose, in one tree that says who is at fault.

```
ZnsError                      base: catch this to catch everything below
├── ErrorReply                the wire's `error` reply (ZNS/1 §2): one class per code
│   ├── BadRequest            the PEER sent something malformed or out of bounds
│   ├── UnknownOp             the PEER asked for an op this server does not have
│   ├── NotFound              the topic, broker or KV entry asked for does not exist
│   ├── NoPermission          the PEER's key (CURVE, §9) or network (remoting) may not do this op
│   ├── Conflict              another live address holds the broker id (§4)
│   ├── Busy                  the SERVER sheds load; retry later
│   └── Internal              a BUG in zns; logged with a traceback, the server carries on
├── UsageError                the CALLER (your code, your command line) misused the API;
│                             nothing was sent to any NameServer
├── NameServerUnavailable     no NameServer answered in time (network, or all down)
├── NoWritableQueue           a route has no queue a producer may write to
├── BackgroundFailure         a client's or broker agent's own thread (or task) failed: a BUG or
│                             a broken environment; the original exception is its __cause__
├── ConnectionLost            a connection to or from a PEER failed (reset, gone, an endpoint
│                             it named that cannot be connected to): that connection is dropped
├── RemotingError             the PEER's RocketMQ remoting input is wrong (§12)
│   ├── RemotingFrameError    the stream cannot be framed: the connection is closed
│   └── RemotingBodyError     one request cannot be used: SYSTEM_ERROR, the connection stays
└── ConfigError               the server or a tool cannot start as configured
    ├── InvalidSetting        a setting (option, variable, config key) does not fit its field
    ├── KvFileError           the KV file exists but cannot be used
    ├── KeyFileError          a CURVE key file or directory cannot be used
    └── EndpointError         an endpoint cannot be bound or is malformed (`--peer`, ...)
```

Where each is raised:

- `ErrorReply` subclasses are raised by the core (`zns.core`) while handling
  a request; `NameService.respond` is the one place they become `error`
  replies (`ErrorReply.reply`). A client raises the same class when it
  receives that reply (`from_reply`), so `except NotFound` means the same on
  both sides. A request refused with any of them changed nothing.
- `UsageError` is raised by the client library and the broker agent before
  anything is sent (an invalid topic name passed to `RouteClient.route`, a
  broker registration that ZNS/1 would refuse): fix the calling code. It is
  also a `ValueError`.
- `NameServerUnavailable` (also a `TimeoutError`): check the address list and
  the network; clients keep retrying the next NameServer on their own.
- `BackgroundFailure` is raised by every call into a `RouteClient`,
  `AsyncRouteClient` or `BrokerAgent` after its background thread or task
  died of an unexpected exception (never a timeout in its place); the
  message names the original exception, which is chained as `__cause__`.
- `ConnectionLost` is raised by the drivers' I/O boundary (`zns.drivers.io_errors`, the
  one place where zmq's, the socket module's and the file system's errors become this
  tree's) when a peer's connection fails; the driver that catches it drops that
  connection or reply and carries on. A failure there that is neither the peer's nor the
  configuration's is left as the library raised it: a bug.
- `RemotingError`s are raised by the remoting codec (`zns.core.remoting`)
  about bytes a RocketMQ peer sent; `RemotingService.handle` (frame errors:
  the listener) is where they become SYSTEM_ERROR replies or a closed
  connection. `NoPermission` there is the NO_PERMISSION response code.
- `ConfigError`s stop `zns serve` before it serves anything, with a message
  that names the file or option and says how to recover; the command prints
  it and exits non-zero.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from zns.core.schema import Error

__all__ = [
    "BY_CODE", "BackgroundFailure", "BadRequest", "Busy", "ConfigError", "Conflict",
    "ConnectionLost",
    "EndpointError", "ErrorReply", "Internal", "InvalidSetting", "KeyFileError", "KvFileError",
    "NameServerUnavailable", "NoPermission", "NoWritableQueue", "NotFound", "RemotingBodyError",
    "RemotingError", "RemotingFrameError", "UnknownOp", "UsageError", "ZnsError", "from_reply",
]


class ZnsError(Exception):
    """Base of every error zns raises on purpose."""


class ErrorReply(ZnsError):
    """A ZNS/1 error code: raised by the core on refusal, or by a client for an `error` reply."""

    code = "internal"

    def reply(self, request_id: int) -> Error:
        return Error(id=request_id, code=self.code, message=str(self))


class BadRequest(ErrorReply):
    """The peer sent something malformed or out of bounds; nothing was applied. Fix the sender."""

    code = "bad_request"


class UnknownOp(ErrorReply):
    """The peer named an op this server does not implement; nothing was applied."""

    code = "unknown_op"


class NotFound(ErrorReply):
    """The topic, broker or KV entry does not exist.

    For a topic it carries the revision at which the topic last changed (0:
    never known), so a client can watch a topic before it exists (§5).
    """

    code = "not_found"

    def __init__(self, message: str, revision: int | None = None) -> None:
        super().__init__(message)
        self.revision = revision

    def reply(self, request_id: int) -> Error:
        revision = UNSET if self.revision is None else self.revision
        return Error(id=request_id, code=self.code, message=str(self), revision=revision)


class NoPermission(ErrorReply):
    """The authenticated peer may not do this op (§9); list its key in the right directory."""

    code = "no_permission"


class Conflict(ErrorReply):
    """Another live address holds this broker id with a newer state version (§4)."""

    code = "conflict"


class Busy(ErrorReply):
    """The server sheds load (for example a peer's unread replies are over their bound)."""

    code = "busy"


class Internal(ErrorReply):
    """A bug in zns, or a KV write that could not be made durable; logged, the server carries on."""

    code = "internal"


class UsageError(ZnsError, ValueError):
    """The caller misused the API (a bad argument or option); nothing was sent."""


class NameServerUnavailable(ZnsError, TimeoutError):
    """No NameServer in the list answered in time."""


class NoWritableQueue(ZnsError, LookupError):
    """The topic's route has no queue with WRITE permission (every broker wiped or gone)."""


class BackgroundFailure(ZnsError, RuntimeError):
    """A client's or broker agent's background thread or task died of an unexpected exception.

    Raised by every later call into that client or agent; `__cause__` is the
    original exception. Not an outage: a bug, or a broken environment.
    """

    @classmethod
    def of(cls, what: str, exc: BaseException) -> BackgroundFailure:
        failure = cls(f"{what} failed: {type(exc).__name__}: {exc}")
        failure.__cause__ = exc
        return failure


class ConnectionLost(ZnsError):
    """A connection to or from a peer failed: reset, gone, or an endpoint the peer named
    cannot be connected to. `__cause__` is the library's error. Not the caller's misuse
    and not a bug: the driver drops that connection and carries on."""


class RemotingError(ZnsError):
    """Base of every error the remoting codec raises about peer input."""


class RemotingFrameError(RemotingError):
    """The stream cannot be framed or a header cannot be decoded.

    Raised by `FrameDecoder.feed`, `decode_frame` and the header decoders.
    The caller must close the connection (after logging ``str(err)``):
    nothing that follows on that stream can be trusted. `commands` holds the
    well-formed commands decoded from the same chunk before the bad frame, so
    a caller that wants Java's behaviour can still carry them out first.
    """

    def __init__(self, message: str, commands: list[Any] | None = None) -> None:
        super().__init__(message)
        self.commands: list[Any] = commands if commands is not None else []


class RemotingBodyError(RemotingError):
    """A well-framed request whose body or ext fields cannot be used.

    Raised by the body decoders, `loads_lenient`, the ext-field helpers and
    `check_body_crc32`. The caller answers the request with SYSTEM_ERROR (1)
    and ``str(err)`` as remark (never for a one-way request), applies
    nothing, and keeps the connection open.
    """


class ConfigError(ZnsError):
    """zns cannot start as configured; the message names the file or option to fix."""


class InvalidSetting(ConfigError):
    """A setting does not fit its field (zns.core.config); `name` is the field's (its TOML key),
    which the command line turns into the option, variable or file key it came from."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}" if name else problem)
        self.name = name
        self.problem = problem


class KvFileError(ConfigError):
    """The KV file exists but cannot be used; the message says how to recover."""


class KeyFileError(ConfigError):
    """A CURVE certificate, key directory or key option cannot be used."""


class EndpointError(ConfigError):
    """An endpoint cannot be bound (in use, bad address) or is malformed (a bad `--peer`)."""


BY_CODE: dict[str, type[ErrorReply]] = {
    cls.code: cls for cls in (BadRequest, UnknownOp, NotFound, NoPermission, Conflict, Busy, Internal)
}


def from_reply(error: Error) -> ErrorReply:
    """The exception a client raises for an `error` reply (an unknown code: ErrorReply)."""
    cls = BY_CODE.get(error.code, ErrorReply)
    if cls is NotFound:
        return NotFound(error.message, None if error.revision is UNSET else error.revision)
    exc = cls(error.message)
    exc.code = error.code
    return exc

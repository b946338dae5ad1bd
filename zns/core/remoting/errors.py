"""The two ways remoting input can be wrong, and who deals with each.

Every problem the codec finds in bytes from the network is a `RemotingError`,
split by what the connection can still do afterwards:

* `RemotingFrameError` -- the byte stream itself is broken (unreadable or
  oversized length, impossible header length, unknown serialize type, a
  header that does not decode). Frame boundaries can no longer be trusted,
  so the listener logs it and closes the connection, as the Java server does.
* `RemotingBodyError` -- the frame was fine but what it carries is not (a
  body that is not JSON, a broken zlib stream, a CRC mismatch, a missing or
  mistyped ext field). The listener answers the request with SYSTEM_ERROR (1)
  and ``str(err)`` as the remark; the connection stays open.

Messages quote at most a few dozen characters of peer input (`zns.core.text.quote`),
so a hostile peer cannot make the server log or echo megabytes.
"""

from __future__ import annotations

from typing import Any

# How much of a peer's text a frame or body error quotes (`zns.core.text.quote`).
QUOTE_CHARS = 64


class RemotingError(Exception):
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

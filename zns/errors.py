"""One small error hierarchy; each class is one ZNS/1 error code (§2).

The core raises these; the server turns them into `error` replies in one place
(`zns.schema.Error` via `ZnsError.reply`). The class says who is at fault:
the peer (BadRequest, UnknownOp, NotFound, NoPermission, Conflict), load (Busy),
or zns itself (Internal).
"""

from __future__ import annotations

from msgspec import UNSET

from zns.schema import Error


class ZnsError(Exception):
    code = "internal"

    def reply(self, request_id: int) -> Error:
        return Error(id=request_id, code=self.code, message=str(self))


class BadRequest(ZnsError):
    """The peer sent something malformed or out of bounds; nothing was applied."""

    code = "bad_request"


class UnknownOp(ZnsError):
    code = "unknown_op"


class NotFound(ZnsError):
    code = "not_found"

    def __init__(self, message: str, revision: int | None = None) -> None:
        super().__init__(message)
        self.revision = revision

    def reply(self, request_id: int) -> Error:
        revision = UNSET if self.revision is None else self.revision
        return Error(id=request_id, code=self.code, message=str(self), revision=revision)


class NoPermission(ZnsError):
    code = "no_permission"


class Conflict(ZnsError):
    code = "conflict"


class Busy(ZnsError):
    code = "busy"


class Internal(ZnsError):
    """A bug in zns: logged with its traceback; the server keeps serving."""

    code = "internal"


BY_CODE: dict[str, type[ZnsError]] = {
    cls.code: cls for cls in (BadRequest, UnknownOp, NotFound, NoPermission, Conflict, Busy, Internal)
}


def from_reply(error: Error) -> ZnsError:
    """The exception a client raises for an `error` reply."""
    cls = BY_CODE.get(error.code, ZnsError)
    if cls is NotFound:
        return NotFound(error.message, None if error.revision is UNSET else error.revision)
    exc = cls(error.message)
    exc.code = error.code
    return exc

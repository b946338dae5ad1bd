"""Reading ext fields the way Java's ``decodeCommandCustomHeader`` does, but strictly.

Java copies each ext value into the header class's field of the same name
with ``Integer.parseInt``, ``Long.parseLong`` or ``Boolean.parseBoolean`` and
answers SYSTEM_ERROR when a ``@CFNotNull`` field is missing. These helpers do
the same parsing; where Java would silently leave a malformed number at its
default, they raise `RemotingBodyError` naming the field, so the peer learns
what was wrong. Ext fields nobody asks for are ignored (RPC hooks add their
own: signatures, namespaces, zone hints).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from zns.core.text import quote

from zns.core.errors import RemotingBodyError

# Java's parseInt/parseLong: an optional sign, then ASCII digits; nothing else
# (no spaces, no underscores, no "0x").
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)

ExtFields = Mapping[str, str] | None


def require(ext: ExtFields, name: str) -> str:
    """The value of a required field; a missing one is a body error worded as Java's."""
    value = None if ext is None else ext.get(name)
    if value is None:
        raise RemotingBodyError(f"the custom field <{name}> is null")
    return value


def optional(ext: ExtFields, name: str, default: str | None = None) -> str | None:
    """The value of an optional field, or `default` when it is absent."""
    value = None if ext is None else ext.get(name)
    return default if value is None else value


def _parse_integer(ext: ExtFields, name: str, required: bool, default: int | None, bits: int) -> int | None:
    value = require(ext, name) if required else optional(ext, name)
    if value is None:
        return default
    if len(value) > 24 or _JAVA_INTEGER.match(value) is None:
        raise RemotingBodyError(f"the custom field <{name}> is not an integer: {quote(value, 24)}")
    number = int(value)
    if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
        raise RemotingBodyError(f"the custom field <{name}> is out of range for a {bits}-bit integer: {value}")
    return number


def parse_int(ext: ExtFields, name: str, *, required: bool = True, default: int | None = None) -> int | None:
    """``Integer.parseInt`` of a field: 32-bit signed; a body error naming the field otherwise.

    Absent and not `required`: `default`.
    """
    return _parse_integer(ext, name, required, default, 32)


def parse_long(ext: ExtFields, name: str, *, required: bool = True, default: int | None = None) -> int | None:
    """``Long.parseLong`` of a field: 64-bit signed; a body error naming the field otherwise."""
    return _parse_integer(ext, name, required, default, 64)


def parse_bool(ext: ExtFields, name: str, *, required: bool = False, default: bool = False) -> bool:
    """``Boolean.parseBoolean`` of a field: only "true", in any case, is true.

    Anything else ("yes", "1", "") is false, as in Java -- never an error.
    """
    value = require(ext, name) if required else optional(ext, name)
    if value is None:
        return default
    return value.lower() == "true"


__all__ = ["require", "optional", "parse_int", "parse_long", "parse_bool", "ExtFields"]

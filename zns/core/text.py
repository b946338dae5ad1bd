"""Text that came from the network, made safe to put in a log line or an error message.

A peer decides what its strings contain: a megabyte epoch, a newline that
forges a second log line, terminal escapes. `quote` shows such a value as a
Python literal (so control characters are escaped and the line stays one
line) and cuts it to a bound, saying how much was left out.
"""

from __future__ import annotations

QUOTE_LIMIT = 120


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, at most about `limit` characters, one line whatever it holds."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value[: limit + 1])
    elif isinstance(value, str) and len(value) > limit:
        cut = len(value) - limit
        return repr(value[:limit]) + f"...(+{cut} chars)"
    text = repr(value)
    if len(text) > limit:
        return text[:limit] + f"...(+{len(text) - limit} chars)"
    return text

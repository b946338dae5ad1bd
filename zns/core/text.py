"""Text that came from the network, made safe to put in a log line or an error message.

A peer decides what its strings contain: a megabyte epoch, a newline that
forges a second log line, terminal escapes. `quote` shows such a value as a
Python literal (so control characters are escaped and the line stays one
line) and cuts it to a bound, saying how much was left out.
"""

from __future__ import annotations

QUOTE_LIMIT = 120


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value` as a one-line Python literal; past `limit`, cut, with its length noted.

    Text and bytes longer than `limit` show their first `limit` characters (bytes)
    as a literal, then ``... (N in all)``: only that much of a megabyte is ever
    rendered. Anything else shows the first `limit` characters of its ``repr``.
    """
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        total = len(value)
        head = value[:limit]
        literal = repr(head if isinstance(head, (str, bytes)) else bytes(head))
    else:
        literal = repr(value)
        total = len(literal)
        literal = literal[:limit]
    return literal if total <= limit else f"{literal}... ({total} in all)"

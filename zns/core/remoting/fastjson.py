"""fastjson 1.2.83's JSON dialect, as far as RocketMQ's NameServer traffic needs it.

Java RocketMQ writes every JSON header and body with alibaba fastjson, which
differs from RFC 8259 output in ways peers notice:

* **Legacy form** (fastjson's defaults, what `RemotingSerializable.encode`
  writes): bean fields sorted by name, nulls omitted, map keys that are
  numbers written *unquoted* (``{0:"h:p"}``, not valid JSON), strings escaped
  only for ``"``, ``\\``, C0 controls, U+007F-U+009F and U+2028/U+2029.
* **Standard form** (``BrowserCompatible`` + ``MapSortField``, what the
  NameServer sends to clients of version >= 4.9.4): every key quoted, map
  keys sorted, and strings escaped much more: ``/`` as ``\\/`` and every char
  >= U+007F as ``\\uXXXX`` with UPPERCASE hex, one escape per UTF-16 unit.

`escape_legacy` / `escape_standard` reproduce the two string escapings
byte for byte; the body and header emitters build on them. msgspec writes
neither dialect (it never escapes ``/`` or non-ASCII and always quotes keys),
which is why the emitters are hand-written and small.

Reading goes the other way: `loads_lenient` accepts what fastjson accepts
that matters here -- unquoted integer map keys -- and nothing else.

`java_hashmap_order` gives the iteration order of a freshly built
`java.util.HashMap<String, ?>`, the order Java writes a command's ext fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, TypeVar

import msgspec

from zns.core.errors import RemotingBodyError

T = TypeVar("T")

# --- string escaping -----------------------------------------------------------

_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}

# Characters fastjson's default writer escapes (SerializeWriter with no extra
# features): C0 controls, quote, backslash, U+007F-U+009F, U+2028, U+2029.
LEGACY_SPECIAL = re.compile('[\x00-\x1f"\\\\\x7f-\x9f\u2028\u2029]')
# Characters the BrowserCompatible writer escapes: the above plus "/" and
# everything from U+007F up.
STANDARD_SPECIAL = re.compile('[\x00-\x1f"/\\\\\x7f-\U0010ffff]')


def _legacy_sub(m: re.Match[str]) -> str:
    ch = m.group()
    short = _SHORT_ESCAPES.get(ch)
    return short if short is not None else f"\\u{ord(ch):04X}"


def _standard_sub(m: re.Match[str]) -> str:
    ch = m.group()
    if ch == "/":
        return "\\/"
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    cp = ord(ch)
    if cp > 0xFFFF:  # Java strings are UTF-16: one escape per surrogate
        cp -= 0x10000
        return f"\\u{0xD800 + (cp >> 10):04X}\\u{0xDC00 + (cp & 0x3FF):04X}"
    return f"\\u{cp:04X}"


def escape_legacy(s: str) -> str:
    """`s` as a quoted JSON string the way fastjson writes it by default.

    Non-ASCII text stays raw (it is UTF-8 encoded with the rest of the
    document); only the characters fastjson treats as special are escaped.
    """
    if LEGACY_SPECIAL.search(s) is None:  # the common case: plain names and addresses
        return f'"{s}"'
    return '"' + LEGACY_SPECIAL.sub(_legacy_sub, s) + '"'


def escape_standard(s: str) -> str:
    """`s` as a quoted JSON string the way fastjson's BrowserCompatible writer does.

    Pure ASCII output: ``/`` becomes ``\\/`` and every char >= U+007F a
    ``\\uXXXX`` escape with uppercase hex (``bé/x`` -> ``b\\u00E9\\/x``).
    """
    if STANDARD_SPECIAL.search(s) is None:
        return f'"{s}"'
    return '"' + STANDARD_SPECIAL.sub(_standard_sub, s) + '"'


def to_utf8(text: str) -> bytes:
    """Encode like Java's ``String.getBytes(UTF_8)``: a lone surrogate becomes ``?``."""
    return text.encode("utf-8", "replace")


# --- Java HashMap iteration order ---------------------------------------------


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()`` as an unsigned 32-bit number (over UTF-16 units)."""
    h = 0
    if s.isascii():
        for b in s.encode("ascii"):
            h = (31 * h + b) & 0xFFFFFFFF
        return h
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h


@lru_cache(maxsize=4096)
def _spread(key: str) -> int:
    # HashMap.hash(): the high half folded into the low half.
    h = java_string_hash(key)
    return h ^ (h >> 16)


def java_hashmap_order(keys: Iterable[str]) -> list[str]:
    """The order a new ``HashMap<String, ?>`` iterates `keys` inserted in the given order.

    Java's default HashMap starts with 16 buckets and doubles whenever it
    holds more than 3/4 of its capacity; iteration walks the buckets in
    index order and each bucket in insertion order (resizing keeps that
    relative order). This is exactly the order RocketMQ writes the ext
    fields of a command it builds (``makeCustomHeaderToNet`` fills a fresh
    map). Not modelled: a bucket turning into a tree, which takes 8
    colliding keys in a table of at least 64 buckets.
    """
    keys = list(keys)
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2
    mask = capacity - 1
    return sorted(keys, key=lambda k: _spread(k) & mask)  # sorted() is stable


# --- lenient reading ------------------------------------------------------------

# Each match runs from where the last one ended to the next unquoted integer key
# (a "{" or "," then digits then ":"), stepping over whole string literals, so the
# Python work is per key, not per string: a body of 400,000 strings and a handful
# of static-topic keys costs one pass in C. Matches are anchored (`match` at the
# end of the previous one) and every quantifier is possessive, so a tail without
# keys, or an unterminated string, is scanned once and the pass stays linear.
_UNTIL_KEY = re.compile(
    rb'(?:[^"{,]++|"[^"\\]*+(?:\\.[^"\\]*+)*+"|[{,](?![ \t\r\n]*+-?[0-9]++[ \t\r\n]*+:))*+'
    rb'[{,][ \t\r\n]*+(-?[0-9]++)(?=[ \t\r\n]*+:)',
    re.DOTALL,
)
# Real bodies have a few unquoted keys (a static topic's queue ids); each costs about
# a microsecond of Python, so their number is bounded.
MAX_UNQUOTED_KEYS = 65_536


def quote_integer_keys(data: bytes | bytearray | memoryview, max_keys: int | None = None) -> bytes:
    """`data` with every unquoted integer object key quoted (``{0:1}`` -> ``{"0":1}``).

    Only keys outside string literals are touched; linear in ``len(data)``.
    More than `max_keys` such keys is a `RemotingBodyError`.
    """
    data = bytes(data)
    parts: list[bytes] = []
    pos = keys = 0
    match = _UNTIL_KEY.match
    while (m := match(data, pos)) is not None:
        keys += 1
        if max_keys is not None and keys > max_keys:
            raise RemotingBodyError(f"more than {max_keys} unquoted integer map keys")
        parts += (data[pos:m.start(1)], b'"', m.group(1), b'"')
        pos = m.end()
    if not parts:
        return data
    parts.append(data[pos:])
    return b"".join(parts)


def _short_reason(exc: Exception) -> str:
    # msgspec's messages name a path and a byte offset, never peer data; cap anyway.
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."


def count_values(data: bytes | bytearray | memoryview) -> int:
    """An upper bound on the JSON values (objects, arrays, strings, numbers) in `data`.

    Every value past the first of an object or array follows a comma, every
    object or array opens with a bracket, every string takes two quotes: so
    decoding `data` cannot build more values than this. A bracket, comma or quote
    inside a string only over-counts. Counting bytes costs milliseconds for a
    16 MiB body, which decoding it in full into objects could cost seconds.
    """
    raw = bytes(data) if not isinstance(data, bytes) else data
    return (raw.count(b",") + raw.count(b"{") + raw.count(b"[") + raw.count(b'"') // 2 + 1)


def check_values(data: bytes | bytearray | memoryview, max_values: int, what: str, why: str) -> None:
    """Refuse `data` (a body error naming `what` and `why`) if it may hold more than `max_values` values."""
    values = count_values(data)
    if values > max_values:
        raise RemotingBodyError(f"{what} holds up to {values} JSON values, more than the "
                                f"{max_values} {why}; refused before decoding")



# Any as the default of a type[T] is not a type mypy accepts; the result is then Any.
def loads_lenient(data: bytes | bytearray | memoryview, type: type[T] = Any, *, what: str = "body") -> T:  # type: ignore[assignment]
    """Decode fastjson JSON into `type`, accepting unquoted integer map keys.

    Standard JSON is decoded by msgspec directly (the fast path: what 5.x
    brokers send). Only if that fails as malformed JSON is the input
    rewritten by `quote_integer_keys` -- which is what a legacy-form
    ``brokerAddrs`` or a static topic's ``currIdMap`` needs -- and decoded
    once more. A value of the wrong type is not retried.

    Raises `RemotingBodyError` (naming `what`) for malformed JSON, a wrong
    type, or nesting deeper than the interpreter's recursion limit allows
    msgspec to go (never a `RecursionError`).
    """
    try:
        return msgspec.json.decode(data, type=type)
    except msgspec.ValidationError as exc:
        raise RemotingBodyError(f"{what}: {_short_reason(exc)}") from None
    except msgspec.DecodeError as exc:
        first = exc
    except RecursionError:
        raise RemotingBodyError(f"{what}: JSON nested too deeply") from None
    try:
        fixed = quote_integer_keys(data, MAX_UNQUOTED_KEYS)
    except RemotingBodyError as exc:
        raise RemotingBodyError(f"{what}: {exc}; refused") from None
    if len(fixed) == len(data):  # nothing was rewritten: the first error stands
        raise RemotingBodyError(f"{what}: {_short_reason(first)}") from None
    try:
        return msgspec.json.decode(fixed, type=type)
    except RecursionError:
        raise RemotingBodyError(f"{what}: JSON nested too deeply") from None
    except msgspec.DecodeError as exc:
        raise RemotingBodyError(f"{what}: {_short_reason(exc)}") from None


__all__ = [
    "escape_legacy",
    "escape_standard",
    "to_utf8",
    "java_string_hash",
    "java_hashmap_order",
    "quote_integer_keys",
    "count_values",
    "check_values",
    "loads_lenient",
]

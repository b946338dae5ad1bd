"""Address lists, the events endpoint a client connects to, and quoting network text."""

from __future__ import annotations

import pytest

from zns.core.addresses import parse_addresses, resolve_pub_endpoint
from zns.core.errors import UsageError
from zns.core.text import QUOTE_LIMIT, quote


def test_an_address_list_in_every_accepted_spelling():
    assert parse_addresses("a:1;tcp://b:2, c:3  d:4\tipc:///tmp/x") == [
        "tcp://a:1", "tcp://b:2", "tcp://c:3", "tcp://d:4", "ipc:///tmp/x"]
    assert parse_addresses(["a:1;b:2", "a:1", "TCP://e:5"]) == [
        "tcp://a:1", "tcp://b:2", "TCP://e:5"]  # in order, without repeats
    assert parse_addresses(";;a:1;;") == ["tcp://a:1"]


def test_a_bad_address_list_is_the_callers_error():
    with pytest.raises(UsageError, match=r"NameServer address 'host': has no port \(expected "
                                         r"host:port\)"):
        parse_addresses("a:1;host")
    with pytest.raises(UsageError, match=r"NameServer address 'tcp://h': has no port"):
        parse_addresses("tcp://h")
    with pytest.raises(UsageError, match=r"^no NameServer address in ' ; ,'$"):
        parse_addresses(" ; ,")
    with pytest.raises(UsageError, match=r"^no NameServer address in \[\]$"):
        parse_addresses([])


@pytest.mark.parametrize("pub, request_endpoint, expected", [
    ("tcp://*:9877", "tcp://ns1:9876", "tcp://ns1:9877"),
    ("tcp://0.0.0.0:9877", "tcp://10.0.0.5:9876", "tcp://10.0.0.5:9877"),
    ("tcp://[::]:9877", "tcp://[::1]:9876", "tcp://[::1]:9877"),
    ("tcp://:9877", "tcp://ns1:9876", "tcp://ns1:9877"),
    ("tcp://pubhost:9877", "tcp://ns1:9876", "tcp://pubhost:9877"),  # not a wildcard
    ("ipc:///tmp/pub", "tcp://ns1:9876", "ipc:///tmp/pub"),  # not tcp: as given
    ("tcp://[::1:5555", "tcp://ns1:9876", "tcp://[::1:5555"),  # unparsable: as given
    ("tcp://*:9877", "tcp://[::1:9876", "tcp://*:9877"),
])
def test_the_events_endpoint_takes_the_request_host_for_a_wildcard(pub, request_endpoint,
                                                                   expected):
    assert resolve_pub_endpoint(pub, request_endpoint) == expected


def test_quote_shows_a_literal_cut_to_its_limit():
    assert quote("ok") == "'ok'"
    assert quote(b"\x00a") == "b'\\x00a'"
    assert quote(bytearray(b"xy")) == "b'xy'"
    assert quote(memoryview(b"xyz"), limit=2) == "b'xy'... (3 in all)"
    assert quote(5) == "5"
    text = "a" * (QUOTE_LIMIT + 10)
    assert quote(text) == repr("a" * QUOTE_LIMIT) + f"... ({QUOTE_LIMIT + 10} in all)"
    exact = "b" * QUOTE_LIMIT
    assert quote(exact) == repr(exact)  # exactly the limit: nothing cut
    over = "b" * (QUOTE_LIMIT + 1)
    assert quote(over) == repr(exact) + f"... ({QUOTE_LIMIT + 1} in all)"
    assert quote(["x" * 200], limit=20) == repr(["x" * 200])[:20] + "... (204 in all)"
    assert quote(["x" * 16], limit=20) == repr(["x" * 16])  # a repr of exactly 20
    # Bytes: only `limit` of them are rendered at all (a megabyte is never repr'd whole),
    # and the length noted is the value's, not its literal's.
    assert quote(b"a" * 50, limit=10) == "b'aaaaaaaaaa'... (50 in all)"
    assert quote(b"a" * (1 << 20), limit=3) == "b'aaa'... (1048576 in all)"
    assert quote(b"\x00\x01\x02\x03\x04\x05", limit=2) == "b'\\x00\\x01'... (6 in all)"
    assert "\n" not in quote("line\nforged") and quote("line\nforged") == "'line\\nforged'"
    assert quote("é" * 3, limit=2) == "'éé'... (3 in all)"  # characters, not bytes
    assert quote("abcde'", 4) == "'abcd'... (6 in all)"  # the quote style of the part shown

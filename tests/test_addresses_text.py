"""Address lists, the events endpoint a client connects to, and quoting network text."""

from __future__ import annotations

import pytest

from zns.core.addresses import parse_addresses, parse_host_port, resolve_pub_endpoint, url_host
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


def test_url_host_brackets_an_ipv6_address_and_nothing_else():
    assert [url_host(h) for h in ("::1", "fe80::1%eth0", "127.0.0.1", "ns1", "*")] == [
        "[::1]", "[fe80::1%eth0]", "127.0.0.1", "ns1", "*"]


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


def test_a_port_is_a_number_in_range_and_star_or_0_only_where_one_binds():
    from zns.core.addresses import _check_port

    assert _check_port("*", bind=True) == 0
    assert _check_port("0", bind=True) == 0
    assert _check_port("65535", bind=True) == _check_port("65535", bind=False) == 65535
    assert _check_port("1", bind=False) == 1
    with pytest.raises(UsageError, match=r"^port '\*' is not a number from 1 to 65535$"):
        _check_port("*", bind=False)
    with pytest.raises(UsageError, match=r"^port '0' is not a number from 1 to 65535$"):
        _check_port("0", bind=False)
    with pytest.raises(UsageError, match=r"^port '65536' is not a number from 0 to 65535$"):
        _check_port("65536", bind=True)
    with pytest.raises(UsageError, match=r"^port 'x' is not a number from 0 to 65535$"):
        _check_port("x", bind=True)
    with pytest.raises(UsageError, match=r"^port '-1' is not a number from 1 to 65535$"):
        _check_port("-1", bind=False)


def test_check_endpoint_connects_by_default_and_says_what_is_wrong():
    from zns.core.addresses import check_endpoint

    with pytest.raises(UsageError, match=r"^'h:0': port '0' is not a number from 1 to 65535$"):
        check_endpoint("h:0")  # to connect to: no port 0 (binding takes it)
    assert check_endpoint("h:0", bind=True) == "tcp://h:0"
    with pytest.raises(UsageError, match=r"^'tcp://h:\*': port '\*' is not a number from 1 to "):
        check_endpoint("tcp://h:*")
    with pytest.raises(UsageError, match=r"^'http://h:1': zns speaks tcp:// \(or ipc://, "
                                         r"inproc://\), not http://$"):
        check_endpoint("http://h:1")
    with pytest.raises(UsageError, match=r"^'ipc://': has nothing after the scheme$"):
        check_endpoint("ipc://")
    with pytest.raises(UsageError, match=r"^'tcp://:1': '' is not a host name or IP address$"):
        check_endpoint("tcp://:1")
    with pytest.raises(UsageError, match=r"^'tcp://a b:1': 'a b' is not a host name or IP "):
        check_endpoint("tcp://a b:1")
    # Only the first `://` ends the scheme; a path may hold another.
    assert check_endpoint("ipc:///tmp/a://b") == "ipc:///tmp/a://b"
    assert check_endpoint("  tcp://[::1]:5  ") == "tcp://[::1]:5"  # the port after the last ':'


def test_parse_host_port_binds_by_default_and_strips_only_the_brackets():
    assert parse_host_port("h:0") == ("h", 0)
    assert parse_host_port("*:*") == ("0.0.0.0", 0)
    assert parse_host_port("h:*") == ("h", 0)
    with pytest.raises(UsageError, match=r"^'h:0': port '0' is not a number from 1 to 65535$"):
        parse_host_port("h:0", bind=False)
    assert parse_host_port("XhostX:7") == ("XhostX", 7)
    assert parse_host_port(" tcp://[fe80::1%eth0]:7/ ") == ("fe80::1%eth0", 7)
    assert parse_host_port("TCP://h:7//") == ("h", 7)
    with pytest.raises(UsageError, match=r"^'h:7X': port '7X' is not a number from 0 to 65535$"):
        parse_host_port("h:7X")  # only slashes are stripped from the end
    assert parse_host_port("[::]:7") == ("::", 7)  # only `*` stands for every interface
    with pytest.raises(UsageError, match=r"^'udp://h:1': expected HOST:PORT or tcp://HOST:PORT, "
                                         r"not udp://$"):
        parse_host_port("udp://h:1")
    with pytest.raises(UsageError, match=r"^'tcp://h:1': expected HOST:PORT or http://HOST:PORT "
                                         r"or https://HOST:PORT, not tcp://$"):
        parse_host_port("tcp://h:1", schemes=("http", "https"))
    with pytest.raises(UsageError, match=r"^'h': has no port \(expected host:port\)$"):
        parse_host_port("h")
    # The scheme ends at the first `://`: the rest is the address, refused for what it is.
    with pytest.raises(UsageError, match=r"^'tcp://h://1': port '//1' is not a number"):
        parse_host_port("tcp://h://1")
    with pytest.raises(UsageError, match=r"^'h:1:2': 'h:1' is not a host name or IP address$"):
        parse_host_port("h:1:2")

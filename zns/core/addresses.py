"""Endpoints and addresses as text: NameServer address lists (§10), one ZeroMQ endpoint
to bind or connect, a `HOST:PORT` to listen on (remoting, metrics), the events
endpoint a client connects to (§5), and the networks (CIDRs) the remoting
listener's `--remoting-brokers/-admins/-clients` name (§12).

Plain string work, shared by the clients, the broker agent, the tools, the peer
links and the command line (zns.cli.params turns these into option types), so
every endpoint is checked by the same rules and refused with the same words.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from zns.core.errors import UsageError
from zns.core.text import quote

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"),
                                 ipaddress.ip_network("::1/128"))

WILDCARD_HOSTS = {"*", "0.0.0.0", "::", "[::]", ""}
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# The transports zns's sockets speak (ZeroMQ has others, none of them for a NameServer).
ZMQ_SCHEMES = ("tcp", "ipc", "inproc")
# A host name, an IPv4 address, an interface name or `*`; or an IPv6 address in brackets.
_HOST = re.compile(r"^(?:[A-Za-z0-9_.*%-]+|\[[0-9A-Fa-f:.%A-Za-z_-]+\])$")
_MAX_PORT = 65535


def url_host(host: str) -> str:
    """`host` as it is written before `:port` in an endpoint or URL: an IPv6 address
    (it has colons of its own) in brackets, anything else as it is."""
    return f"[{host}]" if ":" in host else host


def _check_port(port: str, *, bind: bool) -> int:
    """The port of a TCP address; `*` and 0 (any free port) only where one binds."""
    if bind and port == "*":
        return 0
    if not port.isdigit() or not (0 if bind else 1) <= int(port) <= _MAX_PORT:
        lowest = 0 if bind else 1
        raise UsageError(f"port {port!r} is not a number from {lowest} to {_MAX_PORT}")
    return int(port)


def _split_host_port(text: str, *, bind: bool) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        raise UsageError("has no port (expected host:port)")
    if not host or not _HOST.match(host):
        raise UsageError(f"{host!r} is not a host name or IP address")
    return host.strip("[]"), _check_port(port, bind=bind)


def check_endpoint(spec: str, *, bind: bool = False) -> str:
    """One ZeroMQ endpoint to connect to (or `bind` on): `tcp://HOST:PORT` (a bare
    `HOST:PORT` means tcp), `ipc://PATH` or `inproc://NAME`, as it is to be used.

    Raises UsageError saying what is wrong: a scheme zns does not speak
    (`http://`), a missing or out-of-range port, a host that is not one
    (`tcp//h:1`). Binding also takes port `*` or 0 (any free port).
    """
    text = spec.strip()
    endpoint = text if _SCHEME.match(text) else f"tcp://{text}"
    scheme, _, rest = endpoint.partition("://")
    try:
        if scheme.lower() not in ZMQ_SCHEMES:
            raise UsageError(f"zns speaks tcp:// (or ipc://, inproc://), not {scheme}://")
        if not rest:
            raise UsageError("has nothing after the scheme")
        if scheme.lower() == "tcp":
            _split_host_port(rest, bind=bind)
    except UsageError as exc:
        raise UsageError(f"{spec!r}: {exc}") from None
    return endpoint


def parse_host_port(spec: str, *, schemes: tuple[str, ...] = ("tcp",),
                    bind: bool = True) -> tuple[str, int]:
    """`HOST:PORT` (or `SCHEME://HOST:PORT` for one of `schemes`; IPv6 as `[::1]:PORT`) as
    (host, port): a TCP listener's address (`--remoting`, `--metrics`) or, with
    `bind=False`, an address to reach (a broker's). UsageError saying what is wrong."""
    text = spec.strip()
    try:
        if _SCHEME.match(text):
            scheme, _, text = text.partition("://")
            if scheme.lower() not in schemes:
                allowed = "".join(f" or {s}://HOST:PORT" for s in schemes)
                raise UsageError(f"expected HOST:PORT{allowed}, not {scheme}://")
        host, port = _split_host_port(text.rstrip("/"), bind=bind)
    except UsageError as exc:
        raise UsageError(f"{spec!r}: {exc}") from None
    return ("0.0.0.0" if host == "*" else host), port


def parse_addresses(spec: str | Iterable[str]) -> list[str]:
    """`"a:1;tcp://b:2"` (or a list of such strings) as endpoints, in order, without repeats."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    endpoints: list[str] = []
    for part in parts:
        for item in re.split(r"[;,\s]+", part):
            if not item:
                continue
            try:
                endpoint = check_endpoint(item)
            except UsageError as exc:
                raise UsageError(f"NameServer address {exc}") from None
            if endpoint not in endpoints:
                endpoints.append(endpoint)
    if not endpoints:
        raise UsageError(f"no NameServer address in {spec!r}")
    return endpoints


def resolve_pub_endpoint(pub_endpoint: str, request_endpoint: str) -> str:
    """The endpoint to connect a SUB to (§5): a wildcard host becomes the request host."""
    try:
        pub = urlsplit(pub_endpoint)
    except ValueError:  # e.g. "tcp://[::1:5555": connecting to it fails, as it should
        return pub_endpoint
    if pub.scheme != "tcp":
        return pub_endpoint
    host, _, port = pub.netloc.rpartition(":")
    if host not in WILDCARD_HOSTS:
        return pub_endpoint
    try:
        request_host = urlsplit(request_endpoint).netloc.rpartition(":")[0]
    except ValueError:
        return pub_endpoint
    return f"tcp://{request_host}:{port}"


def parse_networks(specs: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or bare addresses) of --remoting-brokers / --remoting-admins; ValueError names a bad one."""
    networks = []
    for spec in specs:
        try:
            networks.append(ipaddress.ip_network(spec.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{quote(spec)} is not a network (CIDR like 10.0.0.0/8): {exc}") from None
    return tuple(networks)


def in_networks(host: str, networks: tuple[Network, ...]) -> bool:
    """Whether the address `host` (an IPv4-mapped IPv6 address as its IPv4 one; a zone
    suffix ignored) is in one of `networks`; False for a host that is not an address."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)

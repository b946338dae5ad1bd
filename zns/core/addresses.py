"""NameServer address lists (§10) and the events endpoint a client connects to (§5).

Plain string work, shared by the clients, the broker agent, the tools and
the peer links.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from zns.core.errors import UsageError

WILDCARD_HOSTS = {"*", "0.0.0.0", "::", "[::]", ""}
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def parse_addresses(spec: str | Iterable[str]) -> list[str]:
    """`"a:1;tcp://b:2"` (or a list of such strings) as endpoints, in order, without repeats."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    endpoints: list[str] = []
    for part in parts:
        for item in re.split(r"[;,\s]+", part):
            if not item:
                continue
            endpoint = item if _SCHEME.match(item) else f"tcp://{item}"
            if endpoint.startswith("tcp://") and ":" not in endpoint[len("tcp://"):]:
                raise UsageError(f"NameServer address {item!r} has no port (expected host:port)")
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

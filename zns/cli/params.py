"""Option types for every endpoint and address a `zns` command takes.

Each checks its value where click parses it (command line, environment or
`--config` file) with the rules of zns.core.addresses, so a bad one stops the
command with one line naming the option and what is wrong (exit 2, usage) —
never a traceback from a socket later, nor a wait for a timeout.
"""

from __future__ import annotations

from typing import Any

import click

from zns.core.addresses import check_endpoint, parse_addresses, parse_host_port
from zns.core.errors import UsageError


class Endpoint(click.ParamType):
    """One ZeroMQ endpoint (a bare HOST:PORT means tcp); `bind`: port `*` or 0 allowed too."""

    name = "endpoint"

    def __init__(self, *, bind: bool = False) -> None:
        self.bind = bind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_endpoint(str(value), bind=self.bind)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


class NameServers(click.ParamType):
    """A NameServer list, `tcp://h1:9876;h2:9876` (or a list of such, from a config file)."""

    name = "addrs"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> list[str]:
        try:
            return parse_addresses(value if isinstance(value, (list, tuple)) else str(value))
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


class HostPort(click.ParamType):
    """`HOST:PORT`, or `SCHEME://HOST:PORT` for one of `schemes`; the value is kept as given.

    `bind`: an address to listen on (port 0: any free one); otherwise one to reach.
    """

    name = "host:port"

    def __init__(self, *, schemes: tuple[str, ...] = ("tcp",), bind: bool = True) -> None:
        self.schemes = schemes
        self.bind = bind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            parse_host_port(str(value), schemes=self.schemes, bind=self.bind)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)
        return str(value)

"""Option types for the endpoints and addresses the operator commands take (the options of
`zns serve`, `zns relay` and `zns broker` are checked by zns.core.config).

Each checks its value where click parses it (command line or environment) with the rules of zns.core.addresses, so a bad one stops the
command with one line naming the option and what is wrong (exit 2, usage) —
never a traceback from a socket later, nor a wait for a timeout.
"""

from __future__ import annotations

from typing import Any

import click

from zns.core.addresses import check_endpoint, parse_addresses
from zns.core.errors import UsageError


class Endpoint(click.ParamType):
    """One ZeroMQ endpoint to connect to (a bare HOST:PORT means tcp)."""

    name = "endpoint"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_endpoint(str(value))
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


class NameServers(click.ParamType):
    """A NameServer list, `tcp://h1:9876;h2:9876`."""

    name = "addrs"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> list[str]:
        try:
            return parse_addresses(str(value))
        except UsageError as exc:
            self.fail(str(exc), param, ctx)

"""The `zns` command group: `serve`, `keygen` and the operator commands.

The commands are defined in their own modules and only added here, so no
command module imports the group back (no import cycle).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from zns import __version__
from zns.cli import relay, serve, tools, watch


class _Group(click.Group):
    """With `--json` anywhere on the command line, a usage error is JSON on stdout too."""

    def main(self, args: Sequence[str] | None = None, *pos: Any, **kwargs: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if "--json" not in argv or kwargs.get("standalone_mode") is False:
            return super().main(args, *pos, **kwargs)
        kwargs["standalone_mode"] = False
        try:
            code = super().main(argv, *pos, **kwargs)
        except click.ClickException as exc:
            kind = "usage" if isinstance(exc, click.UsageError) else "failed"
            click.echo(json.dumps({"error": kind, "message": exc.format_message()}))
            sys.exit(exc.exit_code)
        except click.Abort:
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="zns")
def main() -> None:
    """zns: a NameServer for message-bus clusters over ZeroMQ (ZNS/1)."""


for command in (serve.serve, serve.keygen, *tools.COMMANDS, watch.watch, relay.relay):
    main.add_command(command)

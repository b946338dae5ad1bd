"""The `zns` command group: `serve`, `keygen` and the operator commands.

The commands are defined in their own modules and only added here, so no
command module imports the group back (no import cycle).
"""

from __future__ import annotations

import click

from zns import __version__
from zns.cli import relay, serve, tools, watch


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="zns")
def main() -> None:
    """zns: a NameServer for message-bus clusters over ZeroMQ (ZNS/1)."""


for command in (serve.serve, serve.keygen, *tools.COMMANDS, watch.watch, relay.relay):
    main.add_command(command)

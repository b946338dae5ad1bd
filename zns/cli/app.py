"""The `zns` command group: `serve`, `keygen` and the operator commands.

The commands are defined in their own modules and only named here, so no
command module imports the group back (no import cycle). A command's module is
imported when that command runs (or shows its help): `zns --help` and
`zns status` never load the server, the remoting listener or asyncio, so the
command line starts in a fraction of a second. `COMMANDS` holds each command's
one-line help for `zns --help`; tests/test_cli_serve.py checks it against the
commands' own.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from zns import __version__

# name: (module, attribute, the one line `zns --help` shows)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": ("zns.cli.serve", "serve", "Run a NameServer until SIGTERM or Ctrl-C."),
    "keygen": ("zns.cli.serve", "keygen",
               "Write a CURVE key pair: DIRECTORY/NAME.key (public) and NAME.key_secret."),
    "status": ("zns.cli.tools", "status", "Show the state of every NameServer in the list."),
    "route": ("zns.cli.tools", "route", "Show the route of TOPIC: its brokers and queues."),
    "clusters": ("zns.cli.tools", "clusters",
                 "Show clusters, their brokers and each address's liveness."),
    "topics": ("zns.cli.tools", "topics", "List topics."),
    "kv": ("zns.cli.tools", "kv", "Read and write the NameServers' KV store."),
    "wipe-write-perm": ("zns.cli.tools", "wipe_write_perm",
                        "Stop producers writing to BROKER (on every NameServer), e.g. before "
                        "maintenance."),
    "add-write-perm": ("zns.cli.tools", "add_write_perm",
                       "Let producers write to BROKER again (on every NameServer)."),
    "delete-topic": ("zns.cli.tools", "delete_topic", "Delete TOPIC from every NameServer."),
    "broker": ("zns.cli.tools", "broker",
               "Run a broker agent (no message store): registers until Ctrl-C or SIGTERM, then "
               "unregisters."),
    "watch": ("zns.cli.watch", "watch",
              "Print route and broker changes as they happen, one line each (all topics by "
              "default)."),
    "relay": ("zns.cli.relay", "relay",
              "Relay a NameServer's events (ZeroMQ XSUB/XPUB) until SIGTERM or Ctrl-C."),
}


class _Group(click.Group):
    """Commands loaded on use; a usage error is one line on stderr (with `--json` anywhere on
    the command line, JSON on stdout)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[name]
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args: Sequence[str] | None = None, *pos: Any, **kwargs: Any) -> Any:
        if kwargs.get("standalone_mode") is False:
            return super().main(args, *pos, **kwargs)
        argv = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in argv
        kwargs["standalone_mode"] = False
        try:
            code = super().main(argv, *pos, **kwargs)
        except click.ClickException as exc:
            if as_json:
                kind = "usage" if isinstance(exc, click.UsageError) else "failed"
                click.echo(json.dumps({"error": kind, "message": exc.format_message()}))
            elif isinstance(exc, click.UsageError):
                click.echo(usage_line(exc), err=True)
            else:
                exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def usage_line(exc: click.UsageError) -> str:
    """A usage error in one line: what is wrong, then where the usage is."""
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return f"Error: {exc.format_message()}{where}"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="zns")
def main() -> None:
    """zns: a NameServer for message-bus clusters over ZeroMQ (ZNS/1)."""


"""The command line starts quickly: `zns --help` loads no command module, and an operator
command's help loads no server, remoting or metrics code (a subprocess, so nothing any other
test imported counts)."""

from __future__ import annotations

import json
import subprocess
import sys

import click

from zns.cli.app import COMMANDS, main

SERVER_SIDE = ("zns.drivers.server", "zns.drivers.remoting_listener", "zns.core.remoting",
               "zns.drivers.metrics", "zns.drivers.event_relay", "zns.drivers.kv_file")
PROBE = """
import json, sys
from zns.cli import main
sys.argv = ["zns", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("zns"))))
"""


def loaded_by(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=60)
    return json.loads(proc.stdout.splitlines()[-1])


def test_help_loads_no_command_and_an_operator_command_no_server_code():
    assert loaded_by("--help") == ["zns", "zns.cli", "zns.cli.app"]
    for command in ("status", "watch", "broker"):
        modules = loaded_by(command, "--help")
        assert not [m for m in modules if m.startswith(SERVER_SIDE)], (command, modules)


def test_the_listed_one_line_helps_are_the_commands_own():
    for name, (_module, _attribute, short_help) in COMMANDS.items():
        command = main.get_command(click.Context(main), name)
        assert command is not None and command.name == name
        assert short_help == (command.help or "").split("\n\n")[0].replace("\n", " "), name


def test_every_command_and_subcommand_has_help_text():
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None and command.help, name
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                assert sub.help, f"{name} {sub.name}"

"""The `zns` group (zns.cli.app) and the option types of the operator commands (zns.cli.params):
the command list of `zns --help`, commands loaded by name, `--json` turning every error into
JSON on stdout, and a bad endpoint refused where click parses it. In process (CliRunner)."""

from __future__ import annotations

import json
import sys

import click
import pytest
from click.testing import CliRunner

import zns.cli.app as app
from zns.cli import main

DEAD = "tcp://127.0.0.1:1"


# Commands for the group to load by name (monkeypatched into COMMANDS below).
@click.command()
@click.option("--json", "as_json", is_flag=True)
def broken(as_json: bool) -> None:
    """Fail as a command does when it cannot go on."""
    raise click.ClickException("it broke")


@click.command()
@click.option("--json", "as_json", is_flag=True)
def interrupted(as_json: bool) -> None:
    """Stop as on Ctrl-C."""
    raise KeyboardInterrupt


@pytest.fixture
def extra_commands(monkeypatch):
    monkeypatch.setitem(app.COMMANDS, "broken", (__name__, "broken", "Fail."))
    monkeypatch.setitem(app.COMMANDS, "interrupted", (__name__, "interrupted", "Stop."))


def test_help_lists_every_command_in_order_with_its_one_line():
    result = CliRunner().invoke(main, ["--help"], terminal_width=400)
    assert result.exit_code == 0
    text = result.output
    listed = text[text.index("\nCommands:\n") + len("\nCommands:\n"):].splitlines()
    width = max(map(len, app.COMMANDS))
    assert listed == [f"  {name.ljust(width)}  {app.COMMANDS[name][2]}"
                      for name in sorted(app.COMMANDS)]
    assert listed[0].split()[0] == "add-write-perm" and listed[-1].split()[0] == "wipe-write-perm"


def test_a_command_is_loaded_by_its_name_and_an_unknown_one_is_a_usage_error():
    result = CliRunner().invoke(main, ["kv", "--help"])
    assert result.exit_code == 0 and "Read and write the NameServers' KV store." in result.output
    result = CliRunner().invoke(main, ["nosuch"])
    assert result.exit_code == 2 and "No such command 'nosuch'" in result.stderr


def test_a_usage_error_is_one_line_naming_the_commands_help_by_its_program_name():
    # Issue 34 item 5: click's usage errors were three lines (usage, hint, blank) and then the
    # error; the README promises one.
    result = CliRunner().invoke(main, ["route"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: Missing argument 'TOPIC'. (see 'main route --help')"]


def test_json_errors_say_usage_or_failed_and_keep_the_exit_status(extra_commands):
    result = CliRunner().invoke(main, ["route", "--json"])
    assert (result.exit_code, json.loads(result.stdout)) == (
        2, {"error": "usage", "message": "Missing argument 'TOPIC'."})
    result = CliRunner().invoke(main, ["broken", "--json"])
    assert (result.exit_code, json.loads(result.stdout)) == (
        1, {"error": "failed", "message": "it broke"})
    result = CliRunner().invoke(main, ["broken"])  # without --json: click's own words
    assert (result.exit_code, result.stderr) == (1, "Error: it broke\n")
    result = CliRunner().invoke(main, ["interrupted", "--json"])
    assert result.exit_code == 1


def test_json_help_shows_the_program_name_given(capsys):
    for args in (["route", "--help", "--json"], ["route", "--help"]):
        with pytest.raises(SystemExit) as ended:
            main.main(args, "zns-x")
        assert ended.value.code == 0
        assert capsys.readouterr().out.startswith("Usage: zns-x route [OPTIONS] TOPIC")


def test_the_command_line_is_read_from_sys_argv_when_not_given(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["zns", "route", "--json"])
    with pytest.raises(SystemExit) as ended:
        main.main()
    assert ended.value.code == 2
    assert json.loads(capsys.readouterr().out) == {"error": "usage",
                                                   "message": "Missing argument 'TOPIC'."}


def test_a_caller_that_handles_errors_itself_gets_them_even_with_json():
    with pytest.raises(click.UsageError):
        main.main(["route", "--json"], standalone_mode=False)
    with pytest.raises(click.UsageError):
        main.main(["route"], standalone_mode=False)


# --- zns.cli.params ----------------------------------------------------------------------------


def test_a_bad_events_endpoint_names_the_option_under_the_commands_usage():
    result = CliRunner().invoke(main, ["watch", "--events", "tcp://h:0", "--ns", DEAD])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: Invalid value for '--events': 'tcp://h:0': port '0' is not a number from 1 to "
        "65535 (see 'main watch --help')"]


def test_a_bad_nameserver_list_names_the_option_under_the_commands_usage():
    result = CliRunner().invoke(main, ["topics", "--ns", "tcp://h:1;nowhere"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: Invalid value for '--ns': NameServer address 'nowhere': has no port "
        "(expected host:port) (see 'main topics --help')"]


def test_the_option_types_give_the_checked_values():
    from zns.cli.params import Endpoint, NameServers

    assert Endpoint().convert("h:1", None, None) == "tcp://h:1"
    assert NameServers().convert("h:1; tcp://h:2", None, None) == ["tcp://h:1", "tcp://h:2"]
    with pytest.raises(click.BadParameter, match="port '0'"):
        Endpoint().convert("h:0", None, None)
    with pytest.raises(click.BadParameter, match="'nowhere': has no port"):
        NameServers().convert("nowhere", None, None)

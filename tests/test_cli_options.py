"""What `config_options` (zns.cli.options) shows and reads beyond the values themselves: each
option's help line (metavar, help text, default), the `--config FILE` option and its variable,
the `--no-` form of a flag, and the wording of a refused setting or config key. In process
(click's CliRunner), so mutation testing of zns/cli/options.py sees every call."""

from __future__ import annotations

from typing import Any

import click
import msgspec
import pytest
from click.testing import CliRunner

from zns.cli.options import _invalid, config_options
from zns.core.config import BrokerConfig, RelayConfig, ServerConfig, Setting, settings
from zns.core.errors import InvalidSetting

CONFIGS = [ServerConfig, RelayConfig, BrokerConfig]
CONFIG_HELP = ("--config FILE",
               "TOML file with any of these options as keys (name = value; kv_path or kv-path).")


def command_for(config: type[msgspec.Struct], seen: list[Any]) -> click.Command:
    @click.command()
    @config_options(config)
    def command(loaded: Any) -> None:
        seen.append(loaded)

    return command


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("ZNS_"):
            monkeypatch.delenv(name)


def expected_help(setting: Setting) -> tuple[str, str]:
    """The help line an operator reads for `setting`, as (options, text)."""
    if setting.is_flag:
        shown = setting.option[2:] if setting.default else f"no-{setting.option[2:]}"
        return (f"{setting.option} / --no-{setting.option[2:]}",
                f"{setting.help}  [default: {shown}]")
    if setting.choices:
        metavar = "[" + "|".join(setting.choices) + "]"
    else:
        metavar = setting.metavar or setting.kind
    default = setting.default
    if default in (msgspec.NODEFAULT, None, [], ""):
        return f"{setting.option} {metavar}", setting.help
    text = ", ".join(default) if isinstance(default, list) else str(default)
    return f"{setting.option} {metavar}", f"{setting.help}  [default: {text}]"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_option_has_its_metavar_help_and_default_on_its_help_line(config):
    command = command_for(config, [])
    ctx = click.Context(command)
    shown = [param.get_help_record(ctx) for param in command.params]
    assert shown == [CONFIG_HELP] + [expected_help(s) for s in settings(config)]
    # The cases the rule above covers, spelled out once.
    if config is ServerConfig:
        assert ("--clients [any|listed]",
                "With CURVE: may any key read routes, or only listed ones?  [default: any]") in shown
        assert shown[1] == ("--router ENDPOINT",
                            "Endpoint of the request (ROUTER) socket.  [default: tcp://127.0.0.1:9876]")
        assert any(options == "--max-kv-entries N" and text.endswith("[default: 10000]")
                   for options, text in shown)
        assert any(options == "--order-message-enable / --no-order-message-enable"
                   and text.endswith("[default: no-order-message-enable]") for options, text in shown)
        assert any(options == "--remoting-admins CIDR" and text.endswith(
            "[default: 127.0.0.0/8, ::1/128]") for options, text in shown)
        assert ("--peer ENDPOINT", "Request endpoint of another NameServer to take hints from "
                "(repeatable).") in shown  # an empty default is not shown
    if config is BrokerConfig:
        assert ("--cluster TEXT", "The broker's cluster.") in shown
        assert ("--zone TEXT", "The broker's zone.") in shown


def test_a_flag_is_turned_off_by_its_no_form(clean_env):
    seen: list[ServerConfig] = []
    command = command_for(ServerConfig, seen)
    env = {"ZNS_ORDER_MESSAGE_ENABLE": "true"}
    assert CliRunner().invoke(command, [], env=env).exit_code == 0
    assert CliRunner().invoke(command, ["--no-order-message-enable"], env=env).exit_code == 0
    assert [c.order_message_enable for c in seen] == [True, False]


@pytest.mark.parametrize("config, variable, key, value", [
    (ServerConfig, "ZNS_CONFIG", "max_topics", 77),
    (RelayConfig, "ZNS_RELAY_CONFIG", "timeout", 7.5),
    (BrokerConfig, "ZNS_BROKER_CONFIG", "zone", "z9"),
])
def test_the_config_file_can_come_from_the_commands_own_variable(config, variable, key, value,
                                                                 tmp_path, clean_env):
    conf = tmp_path / "zns.toml"
    required = {RelayConfig: 'from = "tcp://127.0.0.1:1"\nbind = "tcp://127.0.0.1:2"\n',
                BrokerConfig: 'cluster = "c"\nname = "b"\naddr = "127.0.0.1:1"\n'}.get(config, "")
    conf.write_text(required + f"{key} = {value!r}\n".replace("'", '"'))
    seen: list[Any] = []
    result = CliRunner().invoke(command_for(config, seen), [], env={variable: str(conf)})
    assert result.exit_code == 0, result.output
    by_name = {s.name: s for s in settings(config)}
    assert getattr(seen[0], by_name[key].attr) == value
    # Another command's variable is not read.
    other = "ZNS_RELAY_CONFIG" if variable == "ZNS_CONFIG" else "ZNS_CONFIG"
    seen.clear()
    result = CliRunner().invoke(command_for(config, seen), [], env={other: str(conf)})
    if config is ServerConfig:
        assert result.exit_code == 0 and seen[0].max_topics == ServerConfig().max_topics
    else:
        assert result.exit_code == 2  # its required settings were only in the file


class Plain(msgspec.Struct, kw_only=True):
    """A configuration without an ENV_PREFIX: its variables start with ZNS_."""

    size: int = 1


def test_a_configuration_without_a_prefix_reads_zns_config(tmp_path, clean_env):
    conf = tmp_path / "plain.toml"
    conf.write_text("size = 5\n")
    seen: list[Plain] = []
    result = CliRunner().invoke(command_for(Plain, seen), [], env={"ZNS_CONFIG": str(conf)})
    assert result.exit_code == 0, result.output
    assert seen == [Plain(size=5)]


def test_a_directory_as_config_file_is_refused_by_the_option(tmp_path, clean_env):
    result = CliRunner().invoke(command_for(ServerConfig, []), ["--config", str(tmp_path)])
    assert result.exit_code == 2
    assert f"Invalid value for '--config': File '{tmp_path}' is a directory." in result.output


def test_an_unknown_key_is_suggested_its_field_spelled_with_underscores(tmp_path, clean_env):
    conf = tmp_path / "zns.toml"
    # Compared with dashes, `peer-gr` is closest to `peer`; with underscores, to `peer_grace`.
    conf.write_text("peer-gr = 5\n")
    result = CliRunner().invoke(command_for(ServerConfig, []), ["--config", str(conf)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {conf}: unknown key 'peer-gr' (did you mean 'peer_grace'?)")
    conf.write_text("kv-p = 1\n")  # `kv_p` is close to `kv_path`; `kv-p`, or anything else, is not
    result = CliRunner().invoke(command_for(ServerConfig, []), ["--config", str(conf)])
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {conf}: unknown key 'kv-p' (did you mean 'kv_path'?)")
    conf.write_text("zzzz = 1\n")  # nothing like it: no suggestion, nothing after the key
    result = CliRunner().invoke(command_for(ServerConfig, []), ["--config", str(conf)])
    assert result.output.strip().splitlines()[-1] == f"Error: {conf}: unknown key 'zzzz'"


def test_a_refusal_names_the_option_and_only_a_source_other_than_the_command_line():
    fields = settings(ServerConfig)
    # A problem of no one field (msgspec's own words) is shown as it is.
    assert _invalid(InvalidSetting("", "Expected `object`, got `int`"), fields, {}) == \
        "Expected `object`, got `int`"
    # A field with no recorded source (at its default) is named by its option alone.
    assert _invalid(InvalidSetting("clients", "needs curve_secret"), fields, {}) == \
        "Invalid value for '--clients': needs curve_secret"
    assert _invalid(InvalidSetting("clients", "no"), fields, {"clients": "ZNS_CLIENTS"}) == \
        "Invalid value for '--clients' (from ZNS_CLIENTS): no"
    assert _invalid(InvalidSetting("clients", "no"), fields, {"clients": "--clients"}) == \
        "Invalid value for '--clients': no"

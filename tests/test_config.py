"""One typed configuration per command (zns.core.config): every field reaches the command by
its option, its environment variable and its config-file key, in that order of precedence;
a value that does not fit is one line naming where it came from; the README's option tables
and GET_NAMESRV_CONFIG follow the same definition."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import msgspec
import pytest
from click.testing import CliRunner

from zns.cli.options import config_options
from zns.core.config import (
    BrokerConfig, RelayConfig, ServerConfig, Setting, load, parse_cpus, settings,
)
from zns.core.errors import InvalidSetting

CONFIGS = [ServerConfig, RelayConfig, BrokerConfig]
ROOT = Path(__file__).resolve().parent.parent
# What a command needs whatever field is being tested.
REQUIRED: dict[type, dict[str, Any]] = {
    ServerConfig: {},
    RelayConfig: {"from": "tcp://127.0.0.1:1", "bind": "tcp://127.0.0.1:2"},
    BrokerConfig: {"cluster": "c", "broker_name": "b", "broker_addr": "127.0.0.1:10911"},
}
NEEDS_CURVE = {"clients", "brokers_keys", "admins_keys", "clients_keys"}
# The settings that are refused without others, and those others (followers: zns.drivers.followers).
_FOLLOW = {"follow": "tcp://127.0.0.1:9", "follow_server_key": "/keys/server.key",
           "follow_keypair": "/keys/follower.key_secret"}
NEEDS = {
    "followers": {"curve_secret": "/keys/server.key_secret", "followers_keys": "/keys/f"},
    "followers_keys": {"curve_secret": "/keys/server.key_secret",
                       "followers": "tcp://127.0.0.1:9"},
    **{name: _FOLLOW for name in _FOLLOW},
    "follow_writes": {**_FOLLOW, "curve_secret": "/keys/server.key_secret"},
}
# What NEEDS gives are refused without the setting that needs them: their default is not
# loaded with them (test_settings_that_need_others_are_refused_without_them).
NEEDED = {(ServerConfig, other) for needs in NEEDS.values() for other in needs}


def command_for(config: type[msgspec.Struct], seen: list[Any]) -> click.Command:
    @click.command()
    @config_options(config)
    def command(loaded: Any) -> None:
        seen.append(loaded)

    return command


def sample(setting: Setting, i: int) -> Any:
    """The i-th (0, 1, 2) valid value of `setting`, each different from the one before it and
    from the default."""
    if setting.is_flag:
        return i % 2 == 0
    if setting.choices:
        others = [c for c in setting.choices if c != setting.default]
        return (others + [setting.default])[i % (len(others) + 1)]
    if setting.kind == "N":
        return setting.default + i + 1
    if setting.kind == "NUMBER":
        return setting.default + (i + 1) / 4
    if setting.check == "networks":
        text = f"10.{i + 1}.0.0/16"
    elif setting.check == "cpus":
        text = f"{i},{i + 2}-{i + 3}"
    elif setting.check in ("bind", "connect"):  # as checked: with its scheme
        text = f"tcp://127.0.0.1:{1000 + i}"
    else:
        text = f"127.0.0.1:{1000 + i}"
    return [text] if setting.is_list else text


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return " ".join(value) if isinstance(value, list) else str(value)


def cli_args(setting: Setting, value: Any) -> list[str]:
    if setting.is_flag:
        return [setting.option if value else f"--no-{setting.option[2:]}"]
    values = value if isinstance(value, list) else [value]
    return [arg for v in values for arg in (setting.option, str(v))]


def base_for(config: type, setting: Setting) -> list[str]:
    given = {k: v for k, v in REQUIRED[config].items() if k != setting.name}
    if setting.name in NEEDS_CURVE:
        given["curve_secret"] = "/keys/server.key_secret"
    if config is ServerConfig:
        given.update({k: v for k, v in NEEDS.get(setting.name, {}).items() if k != setting.name})
    by_name = {s.name: s for s in settings(config)}
    return [arg for name, value in given.items() for arg in cli_args(by_name[name], value)]


def every_field() -> list[tuple[type, Setting]]:
    return [(config, s) for config in CONFIGS for s in settings(config)]


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("ZNS_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("config, setting", every_field(),
                         ids=[f"{c.__name__}.{s.name}" for c, s in every_field()])
def test_every_field_by_option_env_and_file_in_that_order(config, setting, tmp_path, clean_env):
    in_file, in_env, on_line = (sample(setting, i) for i in range(3))
    conf = tmp_path / "zns.toml"
    conf.write_text(f"{setting.name} = {json.dumps(in_file)}\n")
    env = {setting.env: as_text(in_env)}
    base = base_for(config, setting)

    def loaded(args: list[str], env: dict[str, str]) -> Any:
        seen: list[Any] = []
        result = CliRunner().invoke(command_for(config, seen), base + args, env=env)
        assert result.exit_code == 0, result.output
        return getattr(seen[0], setting.attr)

    file_args = ["--config", str(conf)]
    assert loaded(file_args + cli_args(setting, on_line), env) == on_line
    assert loaded(file_args, env) == in_env
    assert loaded(file_args, {}) == in_file
    if setting.default is not msgspec.NODEFAULT and (config, setting.name) not in NEEDED:
        assert loaded([], {}) == setting.default
    # The option's own spelling is a key too (`peer`, `kv-path`).
    conf.write_text(f"{setting.option[2:]} = {json.dumps(in_file)}\n")
    assert loaded(file_args, {}) == in_file


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_settings_that_need_others_are_refused_without_them(name):
    needs = NEEDS[name]
    given = {**needs, name: sample(next(s for s in settings(ServerConfig) if s.name == name), 0)}
    load(ServerConfig, given)  # with all it needs: taken
    for missing in needs:
        with pytest.raises(InvalidSetting):
            load(ServerConfig, {k: v for k, v in given.items() if k != missing})


def run(config: type, args: list[str], env: dict[str, str] | None = None):
    seen: list[Any] = []
    result = CliRunner().invoke(command_for(config, seen), args, env=env or {})
    return result, seen


def one_line_usage_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("route", ["option", "env", "file"])
def test_a_bad_value_is_one_line_naming_where_it_came_from(route, tmp_path, clean_env):
    conf = tmp_path / "zns.toml"
    if route == "option":
        result, seen = run(ServerConfig, ["--heartbeat-interval", "0.001"])
        where = "--heartbeat-interval"
    elif route == "env":
        result, seen = run(ServerConfig, [], {"ZNS_HEARTBEAT_INTERVAL": "0.001"})
        where = "ZNS_HEARTBEAT_INTERVAL"
    else:
        conf.write_text("heartbeat-interval = 0.001\n")
        result, seen = run(ServerConfig, ["--config", str(conf)])
        where = f"{conf}: heartbeat-interval"
    line = one_line_usage_error(result)
    source = "" if where.startswith("--") else f" (from {where})"
    assert line.startswith(f"Error: Invalid value for '--heartbeat-interval'{source}: ")
    assert ">= 0.01" in line and "0.001" in line
    assert seen == []


@pytest.mark.parametrize("args, needle", [
    (["--max-queues", "many"], "Expected `int`, got `str`: 'many'"),
    (["--max-topics-per-request", "70000"], "Expected `int` <= 65536"),
    (["--peer-grace", "0.5"], "Expected `float` >= 1.0"),
    (["--clients", "some"], "Invalid enum value 'some'"),
    (["--brokers-keys", "/k"], "needs curve_secret (--curve-secret)"),
    (["--remoting-admins", "10.0.0.0/33"], "'10.0.0.0/33' is not a network"),
    (["--remoting-clients", "10.0.0.0/33"], "'10.0.0.0/33' is not a network"),
    (["--log-level", "loud"], "Invalid enum value 'loud'"),
    (["--router", "http://h:1"], "not http://"),
    (["--peer", "tcp//h:1"], "is not a host"),
    (["--remoting", "127.0.0.1:99999"], "port '99999'"),
    (["--metrics", "tcp://127.0.0.1:9"], "not tcp://"),
    (["--cpus", "0;1"], "'0;1' is not a CPU number or a range of them"),
    (["--cpus", "0,3-1"], "'3-1': a range goes from low to high"),
    (["--cpus", "0,"], "'' is not a CPU number"),
    (["--cpus", "9000"], "CPU 9000: CPUs are numbered 0 to 8191 at most"),
    (["--cpus", "often"], "'often' is none of auto, off or a CPU list (0,2-3)"),
])
def test_server_checks_name_the_option(args, needle, clean_env):
    line = one_line_usage_error(run(ServerConfig, args)[0])
    assert line.startswith(f"Error: Invalid value for '{args[0]}': ") and needle in line, line


def test_relay_and_broker_name_what_is_missing_or_wrong(clean_env):
    line = one_line_usage_error(run(RelayConfig, ["--bind", "tcp://127.0.0.1:1"])[0])
    assert line == "Error: Missing option '--from' (or ZNS_RELAY_FROM, or the config key from)"
    args = ["--cluster", "c", "--name", "b", "--addr", "h:1", "--topic", "T:x"]
    line = one_line_usage_error(run(BrokerConfig, args)[0])
    assert "'--topic': 'T:x': expected NAME[:READ[:WRITE[:PERM]]]" in line
    line = one_line_usage_error(run(BrokerConfig, args[:-1] + ["T:70000"])[0])
    assert "'--topic': 'T:70000'" in line and "<= 65535" in line


def test_unknown_or_unreadable_config_file_is_one_line(tmp_path, clean_env):
    conf = tmp_path / "zns.toml"
    conf.write_text('kv_pth = "/x"\n')
    line = one_line_usage_error(run(ServerConfig, ["--config", str(conf)])[0])
    assert line == f"Error: {conf}: unknown key 'kv_pth' (did you mean 'kv_path'?)"
    conf.write_text("config = 'other.toml'\n")  # the file cannot name another file
    assert "unknown key 'config'" in one_line_usage_error(
        run(ServerConfig, ["--config", str(conf)])[0])
    line = one_line_usage_error(run(ServerConfig, ["--config", str(tmp_path / "none.toml")])[0])
    assert line.startswith(f"Error: cannot read {tmp_path / 'none.toml'}")


def test_a_list_from_the_environment_is_split_on_spaces_and_from_a_file_a_string_is_one(
        tmp_path, clean_env):
    _, [config] = run(ServerConfig, [], {"ZNS_PEER": "tcp://a:1 tcp://b:2"})
    assert config.peers == ["tcp://a:1", "tcp://b:2"]
    conf = tmp_path / "zns.toml"
    conf.write_text('peer = "tcp://a:1"\n')
    _, [config] = run(ServerConfig, ["--config", str(conf)])
    assert config.peers == ["tcp://a:1"]


def test_choices_in_any_case(clean_env):
    _, [config] = run(ServerConfig, ["--log-level", "debug"], {"ZNS_LOG_FORMAT": "JSON"})
    assert (config.log_level, config.log_format) == ("DEBUG", "json")


def test_load_names_the_field_without_a_command_line():
    with pytest.raises(InvalidSetting) as caught:
        load(ServerConfig, {"pub_hwm": 0})
    assert (caught.value.name, str(caught.value)) == (
        "pub_hwm", "pub_hwm: Expected `int` >= 1, got 0")
    with pytest.raises(InvalidSetting, match="nope: unknown setting"):
        load(ServerConfig, {"nope": 1})
    assert load(ServerConfig, {"peer_grace": "2.5"}).peer_grace_s == 2.5


def test_workers_are_0_to_64():
    # docs/operations.md, Workers: N from 1 to 64 (0: one process).
    assert load(ServerConfig, {"workers": 64}).workers == 64
    assert load(ServerConfig, {"workers": 0}).workers == 0
    with pytest.raises(InvalidSetting, match="workers: Expected `int` <= 64, got 65"):
        load(ServerConfig, {"workers": 65})
    with pytest.raises(InvalidSetting, match="workers: Expected `int` >= 0"):
        load(ServerConfig, {"workers": -1})


@pytest.mark.parametrize("field", ["kv_path", "state_path", "curve_secret", "brokers_keys",
                                   "admins_keys", "clients_keys", "followers_keys",
                                   "follow_keypair"])
def test_a_path_with_a_nul_character_is_one_line_naming_its_setting(field):
    # Before: accepted, then a ValueError traceback from the os module at start (a TOML
    # --config can hold "\u0000"; a command line or an environment variable cannot).
    with pytest.raises(InvalidSetting) as caught:
        load(ServerConfig, {field: "/tmp/a\0b"})
    assert str(caught.value) == f"{field}: a path cannot hold a NUL character"


def test_namesrv_config_shows_every_field_but_paths_and_keys():
    config = ServerConfig(peers=["tcp://a:1", "tcp://b:2"], curve_secret="/s",
                          brokers_keys="/b")
    shown = config.properties()
    hidden = {"kvPath", "statePath", "curveSecret", "brokersKeys", "adminsKeys", "clientsKeys",
              "followersKeys", "followServerKey", "followKeypair"}
    assert set(shown) == {s.camel_name for s in settings(ServerConfig)} - hidden | {"curve"}
    assert shown["heartbeatInterval"] == "1.0" and shown["maxQueues"] == "1000000"
    assert shown["peers"] == "tcp://a:1,tcp://b:2" and shown["curve"] == "true"
    assert shown["remoting"] == "" and shown["remotingAdmins"] == "127.0.0.0/8,::1/128"
    assert "/s" not in shown.values() and "/b" not in shown.values()


def test_limits_come_from_the_same_fields():
    config = ServerConfig(max_queues=7, max_kv_bytes=9)
    assert (config.limits.max_queues, config.limits.max_kv_bytes) == (7, 9)
    assert config.limits.max_topics == ServerConfig().max_topics


# --- the documentation follows the definition ----------------------------------------------


def table_rows(path: Path, heading: str) -> list[list[str]]:
    """The rows of the first table after `heading`, as cells."""
    text = path.read_text()
    start = text.index(heading)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # after the header and its rule


def documented_default(cell: str) -> Any:
    """A table's default as a value (None: not a plain value, e.g. 'see *Operations*')."""
    cell = cell.strip("`").replace(",", "")
    if match := re.fullmatch(r"(\d+) MiB", cell):
        return int(match[1]) << 20
    if match := re.fullmatch(r"(\d+)( \(.*\))?", cell):
        return int(match[1])
    if re.fullmatch(r"\d+\.\d+", cell):
        return float(cell)
    if cell.startswith(("tcp://", "~/")) or cell in ("INFO", "text"):
        return cell
    return None


@pytest.mark.parametrize("doc, heading", [
    ("README.md", "## `zns serve`"), ("docs/operations.md", "## Limits"),
])
def test_option_tables_match_the_definition(doc, heading):
    fields = {s.option: s for s in settings(ServerConfig)}
    listed: set[str] = set()
    for row in table_rows(ROOT / doc, heading):
        options = re.findall(r"`(--[a-z-]+)", row[0])
        assert options, row
        listed.update(options)
        for option in options:
            assert option in fields or option in ("--config", "--namesrv-config"), (
                f"{doc}: {option} is no option")
        if len(options) == 1 and options[0] in fields:
            default = documented_default(row[1])
            if default is not None:
                assert fields[options[0]].default == default, (doc, row)
    if doc == "README.md":  # the full table: every option of `zns serve`
        files = {"--config", "--namesrv-config"}
        assert listed == set(fields) | files, set(fields) ^ (listed - files)


def test_cpus_name_each_process_its_cpu_in_the_order_given():
    """--cpus: the state process (or the one process) and worker 1 on the first CPU, each
    later worker on the next, round again past the last; a CPU given twice counts once."""
    assert parse_cpus("3,0-1, 1,7") == [3, 0, 1, 7]
    config = ServerConfig(cpus="3,0-1,1", workers=4)
    assert [config.cpu_of(w) for w in range(6)] == [3, 3, 0, 1, 3, 0]
    assert ServerConfig().cpu_of(0) is None and ServerConfig(cpus="").cpu_of(1) is None


@pytest.mark.parametrize("text", ["99999999999", "10000", "0-12345", "9" * 5000])
def test_a_cpu_number_past_the_highest_is_refused_as_such(text: str) -> None:
    """Not as 'not a CPU number' (it is one), nor in Python's words about long integers."""
    with pytest.raises(ValueError, match=r"^CPU [0-9]+(\.\.\.)?: CPUs are numbered 0 to "
                                         r"8191 at most$") as refused:
        parse_cpus(text)
    assert len(str(refused.value)) < 100


def test_a_range_with_a_stride_takes_every_nth_cpu_as_taskset_does() -> None:
    assert parse_cpus("0-7:2") == [0, 2, 4, 6]
    assert parse_cpus("1-8:3,0") == [1, 4, 7, 0]
    assert parse_cpus("2-3:99999999999999") == [2]  # past the last: the first alone
    for text in ("0-7:0", "0-7:", "3:2"):
        with pytest.raises(ValueError, match=re.escape(repr(text))):
            parse_cpus(text)


def test_only_ascii_digits_name_a_cpu() -> None:
    with pytest.raises(ValueError, match="is not a CPU number"):
        parse_cpus("\u0663")  # ARABIC-INDIC DIGIT THREE: int() takes it, taskset does not

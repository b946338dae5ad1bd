"""A command's options, environment variables and `--config` TOML keys, derived from its
configuration Struct (zns.core.config): one field, one setting, in all three places.

`config_options(ServerConfig)` adds one click option per field (the help text,
metavar and default are the field's) and hands the command one validated
`ServerConfig`. The command line wins over the environment, which wins over the
file, which wins over the field's default. click reads the command line and the
environment as text; the file is read here; `zns.core.config.load` parses and
checks them all once. A setting that does not fit is one line naming where it
came from: `Invalid value for '--peer-grace' (from ZNS_PEER_GRACE): ...` (or from
`zns.toml: peer_grace`; nothing more for the command line), exit 2.
"""

from __future__ import annotations

import difflib
import functools
import tomllib
from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec
from click.core import ParameterSource

from zns.core.config import REQUIRED, Setting, load, settings
from zns.core.errors import InvalidSetting
from zns.core.namesrv_properties import KEYS, parse_properties, translate

C = TypeVar("C", bound=msgspec.Struct)
FILE_OPTION = "config_file"
NAMESRV_OPTION = "namesrv_config_file"


class SettingError(click.ClickException):
    """A setting that does not fit: one line (no usage text), exit 2 as for any usage error."""

    exit_code = 2


def config_options(config: type[C], *, config_file: bool = True, namesrv_file: bool = False
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command `f(config, **rest)`: an option per field of `config` (and `--config
    FILE` when `config_file`, `--namesrv-config FILE` when `namesrv_file`); `f` gets the
    validated `config` and the command's other options."""
    fields = settings(config)
    file_env = getattr(config, "ENV_PREFIX", "ZNS_") + "CONFIG"

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            ctx = click.get_current_context()
            path = kwargs.pop(FILE_OPTION, None)
            from_file = _read_toml(path, fields) if path else {}
            java_path = kwargs.pop(NAMESRV_OPTION, None)
            if java_path:  # the TOML file's keys win over the Java file's
                from_file = {**_read_namesrv_properties(java_path), **from_file}
            given: dict[str, Any] = {}
            origin: dict[str, str] = {}
            for setting in fields:
                value = kwargs.pop(setting.attr)
                source = ctx.get_parameter_source(setting.attr)
                if source is ParameterSource.COMMANDLINE:
                    origin[setting.name] = setting.option
                elif source is ParameterSource.ENVIRONMENT:
                    origin[setting.name] = setting.env
                elif setting.name in from_file:
                    value, origin[setting.name] = from_file[setting.name]
                else:
                    continue  # the field's own default
                given[setting.name] = list(value) if isinstance(value, tuple) else value
            try:
                loaded = load(config, given)
            except InvalidSetting as exc:
                raise SettingError(_invalid(exc, fields, origin)) from None
            return command(loaded, **kwargs)

        decorated: Callable[..., Any] = wrapper
        for setting in reversed(fields):
            decorated = _option(setting)(decorated)
        if config_file:
            decorated = click.option(
                "--config", FILE_OPTION, type=click.Path(dir_okay=False), envvar=file_env,
                help="TOML file with any of these options as keys (name = value; "
                     "kv_path or kv-path).",
            )(decorated)
        if namesrv_file:
            decorated = click.option(
                "--namesrv-config", NAMESRV_OPTION, type=click.Path(dir_okay=False),
                envvar=file_env.replace("CONFIG", "NAMESRV_CONFIG"),
                help="The Java NameServer's properties file (mqnamesrv -c FILE): implies "
                     "--rocketmq; listenPort, bindAddress, kvConfigPath and orderMessageEnable "
                     "are served, every other key is named as ignored or refused.",
            )(decorated)
        return decorated

    return decorate


def _invalid(exc: InvalidSetting, fields: list[Setting], origin: dict[str, str]) -> str:
    """click's words for a bad value, naming the option, and where it came from if not the
    command line: "Invalid value for '--peer-grace' (from ZNS_PEER_GRACE): ..."."""
    setting = next((s for s in fields if s.name == exc.name), None)
    if setting is None:
        return exc.problem
    if exc.problem == REQUIRED:
        return f"Missing option '{setting.option}' (or {setting.env}, or the config key {setting.name})"
    where = origin.get(exc.name, setting.option)
    source = "" if where == setting.option else f" (from {where})"
    problem = exc.problem
    if setting.choices and problem.startswith("Invalid enum value"):
        problem += f"; one of {', '.join(setting.choices)} (any case)"
    return f"Invalid value for '{setting.option}'{source}: {problem}"


def _option(setting: Setting) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The field's click option: text in, parsed by `load` (click's own default is only shown)."""
    metavar = setting.metavar or setting.kind
    if setting.choices:
        metavar = "[" + "|".join(setting.choices) + "]"
    if setting.is_flag:  # --name / --no-name
        flags = f"{setting.option}/--no-{setting.option[2:]}"
        return click.option(flags, setting.attr, envvar=setting.env, help=setting.help,
                            default=setting.default, show_default=True)
    default = setting.default
    if default is msgspec.NODEFAULT:
        default = None
    return click.option(
        setting.option, setting.attr, type=click.STRING, envvar=setting.env, metavar=metavar,
        help=setting.help, multiple=setting.is_list,
        default=tuple(default) if setting.is_list else default,
        show_default=default not in (None, [], ""),
    )


def _read_toml(path: str, fields: list[Setting]) -> dict[str, tuple[Any, str]]:
    """(value, origin) by field name; a key may be spelled as the field (`peers`, `kv_path`) or
    its option (`peer`, `kv-path`). An unreadable file or an unknown key: one line, exit 2."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise SettingError(f"cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        hint = ""
        if _looks_like_namesrv_properties(path):
            hint = (" (it looks like the Java NameServer's properties file: give it with "
                    "--namesrv-config)")
        raise SettingError(f"cannot read {path}: {exc}{hint}") from None
    spelled: dict[str, Setting] = {}
    for each in fields:
        spelled[each.name] = spelled[each.option[2:].replace("-", "_")] = each
    found = {}
    for key, value in data.items():
        setting = spelled.get(key.replace("-", "_"))
        if setting is None:
            close = difflib.get_close_matches(key.replace("-", "_"), spelled, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SettingError(f"{path}: unknown key {key!r}{hint}")
        if setting.is_list and isinstance(value, str):
            value = [value]  # `peer = "tcp://..."`: one
        found[setting.name] = (value, f"{path}: {key}")
    return found


def _read_namesrv_properties(path: str) -> dict[str, tuple[Any, str]]:
    """(value, origin) by field name from the Java NameServer's properties file; a line on
    stderr for each key not served as such; a key refused: one line, exit 2."""
    try:
        with open(path, encoding="latin-1") as f:  # Java's Properties.load reads ISO-8859-1
            properties = parse_properties(f.read())
    except OSError as exc:
        raise SettingError(f"cannot read {path}: {exc}") from None
    try:
        found = translate(properties, warn=lambda line: click.echo(f"{path}: {line}", err=True))
    except InvalidSetting as exc:
        raise SettingError(f"{path}: {exc.problem}") from None
    origin = {"remoting": "listenPort", "kv_path": "kvConfigPath",
              "order_message_enable": "orderMessageEnable", "rocketmq": "listenPort"}
    return {name: (value, f"{path}: {origin[name]}") for name, value in found.items()}


def _looks_like_namesrv_properties(path: str) -> bool:
    """A file that is not TOML but whose keys are NamesrvConfig/NettyServerConfig keys."""
    try:
        with open(path, encoding="latin-1") as f:
            keys = parse_properties(f.read())
    except OSError:
        return False
    return bool(keys) and any(key in KEYS for key in keys)

"""`--config FILE`: a TOML file whose keys become a command's defaults.

The command line wins over the environment, which wins over the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any

import click


def log_format_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--log-format text|json` (env ZNS_LOG_FORMAT): plain lines or one JSON object per line."""
    return click.option(
        "--log-format", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
        envvar="ZNS_LOG_FORMAT", show_default=True,
        help="text: plain lines; json: one JSON object per line (time, level, logger, message, "
             "exception).")(command)


def load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> str | None:
    """Feed the TOML file to click as defaults, below the command line and environment."""
    if not path:
        return path
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}") from exc
    # A key is an option's name as typed (`name`, `addr`, `topic`, `kv-path`) or as the
    # command calls it (`broker_name`, `topics`, `kv_path`); `peers` is `peer`, listed.
    known: dict[str, str] = {}
    for param in ctx.command.params:
        if param.name is None or param.name == "config":
            continue
        known[param.name] = param.name
        for opt in param.opts:
            known[opt.lstrip("-").replace("-", "_")] = param.name
    if "peer" in known:
        known["peers"] = "peer"
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        name = known.get(key.replace("-", "_"))
        if name is None:
            raise click.BadParameter(f"{path}: unknown key {key!r} (known: "
                                     f"{', '.join(sorted(known))})")
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path

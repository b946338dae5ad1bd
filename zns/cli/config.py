"""`--config FILE`: a TOML file whose keys become a command's defaults.

The command line wins over the environment, which wins over the file.
"""

from __future__ import annotations

import tomllib
from typing import Any

import click


def load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> str | None:
    """Feed the TOML file to click as defaults, below the command line and environment."""
    if not path:
        return path
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}") from exc
    known = {p.name for p in ctx.command.params}
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == "peers":
            name = "peer"
        if name not in known or name == "config":
            raise click.BadParameter(f"{path}: unknown key {key!r}")
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path

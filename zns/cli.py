"""The `zns` command. `zns serve` runs a NameServer; other commands talk to one.

Every option of `zns serve` can also come from an environment variable
`ZNS_<OPTION>` or from the TOML file given by `--config`; the command line
wins over the environment, which wins over the file.
"""

from __future__ import annotations

import logging
import sys
import tomllib
from typing import Any

import click

from zns import __version__
from zns.kv import KvFileError
from zns.server import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PUB,
    DEFAULT_PUB_HWM,
    DEFAULT_ROUTER,
    Server,
    ServerConfig,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="zns")
def main() -> None:
    """zns: a NameServer for message-bus clusters over ZeroMQ (ZNS/1)."""


def _load_config_file(ctx: click.Context, _param: click.Parameter, path: str | None) -> str | None:
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


@main.command()
@click.option("--config", type=click.Path(dir_okay=False), envvar="ZNS_CONFIG", is_eager=True,
              expose_value=False, callback=_load_config_file,
              help="TOML file with any of these options as keys (e.g. kv_path = \"...\").")
@click.option("--router", default=DEFAULT_ROUTER, envvar="ZNS_ROUTER", show_default=True,
              help="Endpoint of the request (ROUTER) socket.")
@click.option("--pub", default=DEFAULT_PUB, envvar="ZNS_PUB", show_default=True,
              help="Endpoint of the event (PUB) socket.")
@click.option("--kv-path", default="~/.zns/kv.json", envvar="ZNS_KV_PATH", show_default=True,
              help="File that holds the KV store.")
@click.option("--heartbeat-interval", type=click.FloatRange(min=0.01), default=1.0,
              envvar="ZNS_HEARTBEAT_INTERVAL", show_default=True,
              help="Seconds between `hb` events.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_MESSAGE_BYTES,
              envvar="ZNS_MAX_MESSAGE_BYTES", show_default=True,
              help="Larger requests are refused by the socket (the peer is disconnected).")
@click.option("--pub-hwm", type=click.IntRange(min=1), default=DEFAULT_PUB_HWM,
              envvar="ZNS_PUB_HWM", show_default=True,
              help="Events queued per subscriber before the PUB socket drops (never 0).")
@click.option("--peer", multiple=True, envvar="ZNS_PEER",
              help="Request endpoint of another NameServer to take hints from (repeatable).")
@click.option("--peer-grace", type=click.FloatRange(min=0), default=3.0, envvar="ZNS_PEER_GRACE",
              show_default=True, help="Seconds a broker a peer saw leave has left here.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
              case_sensitive=False), default="INFO", envvar="ZNS_LOG_LEVEL", show_default=True)
def serve(
    router: str, pub: str, kv_path: str, heartbeat_interval: float, max_message_bytes: int,
    pub_hwm: int, peer: tuple[str, ...], peer_grace: float, log_level: str,
) -> None:
    """Run a NameServer until SIGTERM or Ctrl-C."""
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = ServerConfig(
        router=router, pub=pub, kv_path=kv_path, heartbeat_interval=heartbeat_interval,
        max_message_bytes=max_message_bytes, pub_hwm=pub_hwm, peers=list(peer),
        peer_grace=peer_grace,
    )
    try:
        server = Server(config)
    except (KvFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    server.run()


from zns import tools  # noqa: E402,F401  (registers the operator commands on `main`)

if __name__ == "__main__":
    main()

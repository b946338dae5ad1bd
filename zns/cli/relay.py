"""`zns relay`: relay one NameServer's events to many subscribers (zns.drivers.event_relay)."""

from __future__ import annotations

import signal
import threading

import click

from zns.cli.options import config_options
from zns.core.config import RelayConfig
from zns.core.errors import EndpointError, NameServerUnavailable, UsageError
from zns.drivers.logs import configure_logging
from zns.drivers.event_relay import Relay


@click.command()
@config_options(RelayConfig)
def relay(config: RelayConfig) -> None:
    """Relay a NameServer's events (ZeroMQ XSUB/XPUB) until SIGTERM or Ctrl-C.

    Every option also reads ZNS_RELAY_<OPTION> (ZNS_RELAY_FROM, ZNS_RELAY_BIND; the log options
    ZNS_LOG_LEVEL and ZNS_LOG_FORMAT) and the --config file's keys.
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    _relay(config, stop)


def _relay(config: RelayConfig, stop: threading.Event) -> None:
    """Relay until `stop` is set (the command sets it on SIGTERM or Ctrl-C)."""
    configure_logging(config.log_level, config.log_format)
    try:
        running = Relay(config.upstream, config.bind, timeout=config.timeout_s)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    except EndpointError as exc:  # a busy port: exit 1, as `zns serve` does
        raise click.ClickException(str(exc)) from None
    except NameServerUnavailable as exc:
        click.echo(f"zns: {exc}", err=True)
        raise SystemExit(3) from None
    while not stop.wait(1.0):
        pass
    running.close()
    click.echo("zns relay stopped", err=True)

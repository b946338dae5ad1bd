"""`zns relay`: relay one NameServer's events to many subscribers (zns.drivers.event_relay)."""

from __future__ import annotations

import signal
import threading

import click

from zns.cli.config import log_format_option
from zns.cli.params import Endpoint
from zns.core.errors import EndpointError, NameServerUnavailable, UsageError
from zns.drivers.logs import configure_logging
from zns.drivers.event_relay import Relay


@click.command()
@click.option("--from", "upstream", type=Endpoint(), required=True, envvar="ZNS_RELAY_FROM", metavar="ENDPOINT",
              help="The NameServer's REQUEST endpoint; its events endpoint is asked with status.")
@click.option("--bind", type=Endpoint(bind=True), required=True, envvar="ZNS_RELAY_BIND", metavar="ENDPOINT",
              help="Where subscribers connect (clients: events=, zns watch --events).")
@click.option("--timeout", type=click.FloatRange(min=0.01), default=3.0, show_default=True,
              help="Seconds to wait for the NameServer's status at start.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
              case_sensitive=False), default="INFO", envvar="ZNS_LOG_LEVEL", show_default=True)
@log_format_option
def relay(upstream: str, bind: str, timeout: float, log_level: str, log_format: str) -> None:
    """Relay a NameServer's events (ZeroMQ XSUB/XPUB) until SIGTERM or Ctrl-C."""
    configure_logging(log_level, log_format)
    try:
        running = Relay(upstream, bind, timeout=timeout)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    except EndpointError as exc:  # a busy port: exit 1, as `zns serve` does
        raise click.ClickException(str(exc)) from None
    except NameServerUnavailable as exc:
        click.echo(f"zns: {exc}", err=True)
        raise SystemExit(3) from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    running.close()
    click.echo("zns relay stopped", err=True)

"""`zns serve` (run a NameServer) and `zns keygen` (make a CURVE key pair).

Every option of `zns serve` is a field of `zns.core.config.ServerConfig`, and can
also come from an environment variable `ZNS_<OPTION>` or from the TOML file given
by `--config`; the command line wins over the environment, which wins over the file.
"""

from __future__ import annotations

import logging
import signal

import click

from zns.cli.options import config_options
from zns.core.config import ServerConfig, parse_cpus
from zns.core.errors import ConfigError
from zns.drivers import cpus
from zns.drivers.logs import configure_logging
from zns.drivers.security import write_keypair
from zns.drivers.server import Server
from zns.drivers.state_process import StateProcess
from zns.drivers.supervisor import supervise
from zns.drivers.worker import follow_main

log = logging.getLogger("zns")


@click.command()
@config_options(ServerConfig, namesrv_file=True)
def serve(config: ServerConfig) -> None:
    """Run a NameServer until SIGTERM or Ctrl-C.

    Every option also reads the environment variable ZNS_<OPTION> (ZNS_KV_PATH, ...) and the
    --config file's key <option> (kv_path = "..."): command line, then environment, then file.
    """
    configure_logging(config.log_level, config.log_format)
    if config.cpu_of(0) is not None:  # a list, checked once, here: a server or worker
        try:  # started later pins what it can (cpus.pin)
            cpus.check(parse_cpus(config.cpus))
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
    if config.supervise and config.workers:
        log.info("--supervise with --workers: the state process starts a new worker when one "
                 "dies (only workers speak ZMTP); nothing restarts the state process itself "
                 "(systemd does)")
    elif config.supervise:
        raise SystemExit(supervise(lambda: _serve_once(config)))
    _serve(config)


def _serve(config: ServerConfig) -> None:
    # A SIGHUP (`systemctl reload`) while the server starts (keys read, a state restored)
    # waits for the server's handler, which unblocks it (zns.drivers.sockets.handle_signals),
    # instead of ending the process by SIGHUP's default action.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        try:
            # Before the server starts a thread, or the state process a worker (they inherit it).
            if (cpu := config.cpu_of(0)) is not None:
                cpus.pin(cpu, "the state process" if config.workers else "the server")
            if config.follow:  # one process: the worker of a state process on another host
                raise SystemExit(follow_main(config))
            server = StateProcess(config) if config.workers else Server(config)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
        if config.kv_path:  # `make run` keeps ~/.zns/kv.log from one experiment to the next
            log.info("KV store in %s, kept across restarts (--kv-path for another)",
                     config.kv_path)
        server.run()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _serve_once(config: ServerConfig) -> int:
    """`_serve` in a supervised child: the exit code click would give."""
    try:
        _serve(config)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return 0


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("name")
@click.option("--broker-names", metavar="A,B",
              help="Bind this broker key to these broker names (certificate metadata).")
def keygen(directory: str, name: str, broker_names: str | None) -> None:
    """Write a CURVE key pair: DIRECTORY/NAME.key (public) and NAME.key_secret."""
    public_file, secret_file = write_keypair(directory, name, broker_names)
    click.echo(f"public key: {public_file}\nsecret key: {secret_file} (keep it private)")

"""`zns serve` (run a NameServer) and `zns keygen` (make a CURVE key pair).

Every option of `zns serve` can also come from an environment variable
`ZNS_<OPTION>` or from the TOML file given by `--config`; the command line
wins over the environment, which wins over the file.
"""

from __future__ import annotations

import click

from zns.cli.config import load_config_file, log_format_option
from zns.cli.params import Endpoint, HostPort
from zns.core.limits import Limits
from zns.core.schema import DEFAULT_PUB, DEFAULT_ROUTER, MAX_TOPICS_PER_REQUEST
from zns.core.errors import ConfigError
from zns.drivers.kv_file import DEFAULT_PATH as DEFAULT_KV_PATH
from zns.drivers.logs import configure_logging
from zns.drivers.security import write_keypair
from zns.core.remoting.handler import parse_networks
from zns.drivers.remoting_listener import DEFAULT_MAX_CONNECTIONS
from zns.drivers.server import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PUB_HWM,
    Server,
    ServerConfig,
)


@click.command()
@click.option("--config", type=click.Path(dir_okay=False), envvar="ZNS_CONFIG", is_eager=True,
              expose_value=False, callback=load_config_file,
              help="TOML file with any of these options as keys (e.g. kv_path = \"...\").")
@click.option("--router", type=Endpoint(bind=True), default=DEFAULT_ROUTER, envvar="ZNS_ROUTER",
              show_default=True,
              help="Endpoint of the request (ROUTER) socket.")
@click.option("--pub", type=Endpoint(bind=True), default=DEFAULT_PUB, envvar="ZNS_PUB",
              show_default=True,
              help="Endpoint of the event (PUB) socket.")
@click.option("--kv-path", default=DEFAULT_KV_PATH, envvar="ZNS_KV_PATH", show_default=True,
              help="File that holds the KV store (an append-only log; an existing "
                   "~/.zns/kv.json, the old default name, is used when the default is absent).")
@click.option("--heartbeat-interval", type=click.FloatRange(min=0.01), default=1.0,
              envvar="ZNS_HEARTBEAT_INTERVAL", show_default=True,
              help="Seconds between `hb` events.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_MESSAGE_BYTES,
              envvar="ZNS_MAX_MESSAGE_BYTES", show_default=True,
              help="Larger requests are refused by the socket (the peer is disconnected).")
@click.option("--pub-hwm", type=click.IntRange(min=1), default=DEFAULT_PUB_HWM,
              envvar="ZNS_PUB_HWM", show_default=True,
              help="Events queued per subscriber before the PUB socket drops (never 0).")
@click.option("--peer", type=Endpoint(), multiple=True, envvar="ZNS_PEER",
              help="Request endpoint of another NameServer to take hints from (repeatable).")
@click.option("--peer-grace", type=click.FloatRange(min=1), default=3.0, envvar="ZNS_PEER_GRACE",
              show_default=True, help="Seconds a broker a peer saw leave has left here.")
@click.option("--max-topics-per-request", type=click.IntRange(1, MAX_TOPICS_PER_REQUEST),
              default=Limits.max_topics_per_request, envvar="ZNS_MAX_TOPICS_PER_REQUEST",
              show_default=True, help="Topics one register_broker (or get_routes) may list.")
@click.option("--max-brokers", type=click.IntRange(min=1), default=Limits.max_brokers,
              envvar="ZNS_MAX_BROKERS", show_default=True,
              help="Broker names, and broker addresses, held at most (each).")
@click.option("--max-topics", type=click.IntRange(min=1), default=Limits.max_topics,
              envvar="ZNS_MAX_TOPICS", show_default=True, help="Topics held at most.")
@click.option("--max-queues", type=click.IntRange(min=1), default=Limits.max_queues,
              envvar="ZNS_MAX_QUEUES", show_default=True,
              help="Queue entries (topic x broker name) held at most, each weighted by the filter "
                   "servers, extra addresses and name bytes its routes carry; memory grows with them.")
@click.option("--max-kv-entries", type=click.IntRange(min=1), default=Limits.max_kv_entries,
              envvar="ZNS_MAX_KV_ENTRIES", show_default=True, help="KV entries per namespace.")
@click.option("--max-kv-namespaces", type=click.IntRange(min=1),
              default=Limits.max_kv_namespaces, envvar="ZNS_MAX_KV_NAMESPACES",
              show_default=True, help="KV namespaces held at most.")
@click.option("--max-kv-bytes", type=click.IntRange(min=1), default=Limits.max_kv_bytes,
              envvar="ZNS_MAX_KV_BYTES", show_default=True,
              help="UTF-8 bytes of all KV namespaces, keys and values held at most.")
@click.option("--curve-secret", type=click.Path(dir_okay=False), envvar="ZNS_CURVE_SECRET",
              help="The server's NAME.key_secret (from `zns keygen`): turns CURVE on for both "
                   "sockets.")
@click.option("--brokers-keys", type=click.Path(file_okay=False), envvar="ZNS_BROKERS_KEYS",
              help="Directory of *.key public keys that may do broker ops.")
@click.option("--admins-keys", type=click.Path(file_okay=False), envvar="ZNS_ADMINS_KEYS",
              help="Directory of *.key public keys that may do admin ops.")
@click.option("--clients-keys", type=click.Path(file_okay=False), envvar="ZNS_CLIENTS_KEYS",
              help="Directory of *.key public keys that may read routes (with --clients listed).")
@click.option("--clients", type=click.Choice(["any", "listed"]), default="any",
              envvar="ZNS_CLIENTS", show_default=True,
              help="With CURVE: may any key read routes, or only listed ones?")
@click.option("--remoting", type=HostPort(schemes=("tcp",)), metavar="HOST:PORT",
              envvar="ZNS_REMOTING",
              help="Also serve RocketMQ's remoting protocol here (HOST:PORT or tcp://HOST:PORT), "
                   "so RocketMQ brokers, clients and mqadmin can use this NameServer. Off by "
                   "default; plain TCP.")
@click.option("--remoting-brokers", metavar="CIDR", multiple=True, envvar="ZNS_REMOTING_BROKERS",
              help="Networks whose remoting connections may register brokers (repeatable; "
                   "default: any, or loopback only under CURVE).")
@click.option("--remoting-admins", metavar="CIDR", multiple=True, envvar="ZNS_REMOTING_ADMINS",
              help="Networks whose remoting connections may do admin writes (repeatable; "
                   "default: loopback only).")
@click.option("--remoting-clients", metavar="CIDR", multiple=True, envvar="ZNS_REMOTING_CLIENTS",
              help="Networks whose remoting connections may read routes and cluster data "
                   "(repeatable; default: any, or loopback only under CURVE with --clients listed).")
@click.option("--remoting-max-connections", type=click.IntRange(min=1),
              default=DEFAULT_MAX_CONNECTIONS, envvar="ZNS_REMOTING_MAX_CONNECTIONS",
              show_default=True, help="Remoting connections open at once; more are refused.")
@click.option("--order-message-enable/--no-order-message-enable", default=False,
              envvar="ZNS_ORDER_MESSAGE_ENABLE", show_default=True,
              help="Remoting routes carry an ordered topic's orderTopicConf (its ORDER_TOPIC_CONFIG "
                   "KV entry), as RocketMQ's orderMessageEnable. Off by default, as in RocketMQ: "
                   "producers given it write to its queues whatever their perm.")
@click.option("--metrics", type=HostPort(schemes=("http",)), metavar="HOST:PORT",
              envvar="ZNS_METRICS",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (e.g. "
                   "127.0.0.1:9878) and liveness at "
                   "/healthz (needs prometheus_client: pip install prometheus_client). Off by "
                   "default; plain HTTP.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
              case_sensitive=False), default="INFO", envvar="ZNS_LOG_LEVEL", show_default=True)
@log_format_option
def serve(
    router: str, pub: str, kv_path: str, heartbeat_interval: float, max_message_bytes: int,
    pub_hwm: int, peer: tuple[str, ...], peer_grace: float, max_topics_per_request: int,
    max_brokers: int, max_topics: int, max_queues: int, max_kv_entries: int,
    max_kv_namespaces: int, max_kv_bytes: int,
    curve_secret: str | None,
    brokers_keys: str | None, admins_keys: str | None, clients_keys: str | None, clients: str,
    remoting: str | None, remoting_brokers: tuple[str, ...], remoting_admins: tuple[str, ...],
    remoting_clients: tuple[str, ...],
    remoting_max_connections: int, order_message_enable: bool, metrics: str | None, log_level: str, log_format: str,
) -> None:
    """Run a NameServer until SIGTERM or Ctrl-C."""
    configure_logging(log_level, log_format)
    config = ServerConfig(
        router=router, pub=pub, kv_path=kv_path, heartbeat_interval=heartbeat_interval,
        max_message_bytes=max_message_bytes, pub_hwm=pub_hwm, peers=list(peer),
        peer_grace=peer_grace, curve_secret=curve_secret, brokers_keys=brokers_keys,
        admins_keys=admins_keys, clients_keys=clients_keys, clients=clients,
        limits=Limits(max_topics_per_request=max_topics_per_request, max_brokers=max_brokers,
                      max_topics=max_topics, max_queues=max_queues, max_kv_entries=max_kv_entries,
                      max_kv_namespaces=max_kv_namespaces, max_kv_bytes=max_kv_bytes),
        remoting=remoting or None, remoting_brokers=list(remoting_brokers),
        remoting_clients=list(remoting_clients),
        remoting_max_connections=remoting_max_connections,
        order_message_enable=order_message_enable, metrics=metrics or None,
    )
    if remoting_admins:
        config.remoting_admins = list(remoting_admins)
    for option, specs in (("--remoting-brokers", remoting_brokers),
                          ("--remoting-admins", remoting_admins),
                          ("--remoting-clients", remoting_clients)):
        try:
            parse_networks(specs)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=option) from exc
    if not curve_secret and (brokers_keys or admins_keys or clients_keys or clients != "any"):
        raise click.UsageError("key options need --curve-secret (CURVE is off without it)")
    try:
        server = Server(config)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    server.run()


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("name")
@click.option("--broker-names", metavar="A,B",
              help="Bind this broker key to these broker names (certificate metadata).")
def keygen(directory: str, name: str, broker_names: str | None) -> None:
    """Write a CURVE key pair: DIRECTORY/NAME.key (public) and NAME.key_secret."""
    public_file, secret_file = write_keypair(directory, name, broker_names)
    click.echo(f"public key: {public_file}\nsecret key: {secret_file} (keep it private)")

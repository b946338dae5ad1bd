"""The operator commands of `zns`: status, route, clusters, topics, kv, perms, broker
(`zns watch` is in zns.cli.watch).

Every command takes `--ns` (or `ZNS_ADDR`), `--timeout` and `--json`. Reads
ask every NameServer at once and show the first answer; writes go to every
NameServer (as RocketMQ's mqadmin does) and report each one. Exit status: 0
when done, 1 when a NameServer answered with an error or a name given matched
nothing there (an unknown broker, cluster, topic or zone), 2 for a bad option,
3 when a NameServer did not answer within `--timeout`.
"""

from __future__ import annotations

import functools
import json
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click
import msgspec
import zmq

from zns.drivers.sockets import parse_addresses
from zns.drivers.broker_agent import BrokerAgent
from zns.cli.options import config_options
from zns.cli.params import NameServers
from zns.core.config import BrokerConfig
from zns.drivers.logs import configure_logging
from zns.core.errors import (
    BY_CODE,
    BackgroundFailure,
    ErrorReply,
    KeyFileError,
    NameServerUnavailable,
    NotFound,
    UsageError,
    ZnsError,
)
from zns.drivers.requests import call, call_all, call_any
from zns.drivers.security import apply_client_keys, client_keys
from zns.core.schema import (
    MAX_KV_VALUE_BYTES,
    AddWritePerm,
    DeleteTopic,
    GetClusterInfo,
    GetClusterInfoReply,
    GetRoute,
    GetTopics,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    UNSET,
    Request,
    Status,
    StatusReply,
    TopicRoute,
    WipeWritePerm,
)

EXIT_ERROR_REPLY = 1
EXIT_FAILED = 1  # the command itself failed (a client's or agent's thread died)
EXIT_UNREACHABLE = 3


JSON_META = "zns.json"  # click context meta: --json was given
CURVE_META = "zns.curve"  # click context meta: --server-key was given


def unreachable(endpoints: Iterable[str], timeout: float) -> str:
    """The one wording for NameServers that did not answer, with what to check about CURVE: a
    CURVE server gives a client without its key (or with another) no answer at all."""
    ctx = click.get_current_context(silent=True)
    curve = ctx is not None and ctx.meta.get(CURVE_META)
    hint = "is --server-key its public key?" if curve else "a CURVE server needs --server-key"
    return f"no answer from {', '.join(endpoints)} within {timeout:g} s ({hint})"


@dataclass
class Target:
    endpoints: list[str]
    timeout: float
    as_json: bool


def ns_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--ns, --timeout and --json, handed to the command as one `target`."""

    @click.option("--ns", "ns", type=NameServers(), envvar="ZNS_ADDR", metavar="ADDRS",
                  help="NameServers, e.g. 'tcp://h1:9876;h2:9876' (default $ZNS_ADDR, "
                       "else tcp://127.0.0.1:9876).")
    @click.option("--timeout", type=click.FloatRange(min=0.01), default=3.0, show_default=True,
                  help="Seconds to wait for a NameServer.")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
    @click.option("--server-key", envvar="ZNS_SERVER_KEY", metavar="KEY|FILE",
                  help="The NameServers' CURVE public key (z85 or its .key file): turns CURVE on.")
    @click.option("--keypair", envvar="ZNS_KEYPAIR", type=click.Path(dir_okay=False),
                  help="Own CURVE NAME.key_secret (default: a fresh one, a plain client).")
    @functools.wraps(command)
    def wrapper(ns: list[str] | None, timeout: float, as_json: bool, server_key: str | None,
                keypair: str | None, **kwargs: Any) -> Any:
        return command(make_target(ns, timeout, as_json, server_key, keypair), **kwargs)

    return wrapper


def make_target(ns: list[str] | str | None, timeout: float, as_json: bool,
                server_key: str | None, keypair: str | None) -> Target:
    """The NameServers to ask (`ns` already checked; None: the default); CURVE on for every
    socket of this process when `server_key`."""
    endpoints = parse_addresses(ns) if isinstance(ns, str) else ns or parse_addresses(None)
    if server_key:  # every socket this command makes comes from the default context
        try:
            apply_client_keys(zmq.Context.instance(), client_keys(server_key, keypair))
        except KeyFileError as exc:
            raise click.BadParameter(str(exc), param_hint="--server-key") from None
    ctx = click.get_current_context()
    ctx.meta[JSON_META] = as_json  # errors come as JSON too
    ctx.meta[CURVE_META] = bool(server_key)
    return Target(_resolvable(endpoints), timeout, as_json)


def _resolvable(endpoints: list[str]) -> list[str]:
    """The endpoints whose host name resolves: one that does not is said at once (libzmq would
    only wait for the timeout); none resolving ends the command (exit 3)."""
    found, unresolved = [], []
    for endpoint in endpoints:
        scheme, _, address = endpoint.partition("://")
        host = address.rpartition(":")[0].strip("[]")
        if scheme != "tcp" or host in ("", "*"):
            found.append(endpoint)
            continue
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as exc:
            unresolved.append(f"{endpoint}: the name {host!r} does not resolve ({exc})")
            continue
        found.append(endpoint)
    if not found:
        fail("; ".join(unresolved), EXIT_UNREACHABLE, "unreachable")
    for line in unresolved:
        click.echo(f"zns: {line}; asking the others", err=True)
    return found


# --- talking to NameServers ------------------------------------------------------


def ask(target: Target, request: Request) -> tuple[str, Any]:
    """(endpoint, reply) of the first NameServer to answer; exits plainly when none does."""
    try:
        return call_any(target.endpoints, request, target.timeout)
    except NameServerUnavailable:
        fail(unreachable(target.endpoints, target.timeout), EXIT_UNREACHABLE, "unreachable")
    except ErrorReply as exc:
        fail(str(exc), EXIT_ERROR_REPLY, exc.code)


def tell_all(target: Target, request: Request, describe: Callable[[Any], str],
             matched_nothing: Callable[[str, Any], str | None] | None = None) -> None:
    """Send a write to every NameServer; one line (or JSON entry) each; exit non-zero on any failure.

    `matched_nothing(endpoint, reply)`: why a reply that changed nothing named something that
    NameServer does not have (a typo), or None; such an answer is reported as `not_found`.
    """
    results = call_all(target.endpoints, request, target.timeout)
    worst = 0
    out: dict[str, Any] = {}
    for endpoint, result in results.items():
        if matched_nothing is not None and not isinstance(result, Exception):
            why = matched_nothing(endpoint, result)
            if why is not None:
                result = NotFound(why)
        if isinstance(result, Exception):
            worst = max(worst, _exit_code(result))
            out[endpoint] = _error_json(endpoint, result, target.timeout)
            if not target.as_json:
                click.echo(_error_line(endpoint, result, target.timeout), err=True)
        else:
            out[endpoint] = _builtins(result)
            if not target.as_json:
                click.echo(f"{endpoint}: {describe(result)}")
    if target.as_json:
        _print_json(out)
    if worst:
        sys.exit(worst)


def fail(message: str, code: int, error: str = "failed") -> NoReturn:
    """End the command: `zns: ...` on stderr, or with --json `{"error", "message"}` on stdout.

    `error`: a wire error code (the NameServer's answer), `unreachable` or `failed`.
    """
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(JSON_META):
        click.echo(json.dumps({"error": error, "message": message}))
    elif error in BY_CODE:
        click.echo(f"zns: error {error}: {message}", err=True)
    else:
        click.echo(f"zns: {message}", err=True)
    sys.exit(code)


def _exit_code(error: Exception) -> int:
    return EXIT_ERROR_REPLY if isinstance(error, ErrorReply) else EXIT_UNREACHABLE


def _error_json(endpoint: str, error: Exception, timeout: float) -> dict[str, str]:
    """One NameServer's failure, in the shape every per-NameServer answer uses."""
    if isinstance(error, ErrorReply):
        return {"error": error.code, "message": str(error)}
    return {"error": "unreachable", "message": unreachable([endpoint], timeout)}


def _error_line(endpoint: str, error: Exception, timeout: float) -> str:
    if isinstance(error, ErrorReply):
        return f"zns: {endpoint}: error {error.code}: {error}"
    return f"zns: {unreachable([endpoint], timeout)}"


# --- names that match nothing ------------------------------------------------------
# The wire answers a write naming an unknown broker or cluster with "0 changed" or
# "removed: false" (as RocketMQ does); a person who mistyped a name is told so instead.


def _cluster_info(target: Target, endpoint: str) -> GetClusterInfoReply | None:
    try:
        reply: GetClusterInfoReply = call(endpoint, GetClusterInfo(), target.timeout)
        return reply
    except ZnsError:
        return None  # cannot tell: report the write's own answer


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def _unknown_broker(target: Target, broker: str) -> Callable[[str, Any], str | None]:
    def check(endpoint: str, reply: Any) -> str | None:
        info = None if reply.changed else _cluster_info(target, endpoint)
        if info is None or broker in info.brokers:
            return None
        return f"no broker named {broker!r} (brokers: {_names(info.brokers)})"

    return check


def _unknown_cluster(cluster: str, info: GetClusterInfoReply | None) -> str | None:
    if not cluster or info is None or cluster in info.clusters:
        return None
    return f"no cluster named {cluster!r} (clusters: {_names(info.clusters)})"


# --- output -----------------------------------------------------------------------


def _builtins(value: Any) -> Any:
    """A reply as JSON: its fields, without the envelope (`op`, `id`)."""
    data = msgspec.to_builtins(value)
    if isinstance(data, dict):
        data.pop("id", None)
        data.pop("op", None)
    return data


def _print_json(value: Any) -> None:
    click.echo(json.dumps(_builtins(value), indent=2, sort_keys=False))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; a short row leaves its last columns empty."""
    rows = [[str(c) for c in row] + [""] * (len(headers) - len(row)) for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def perm_text(perm: int) -> str:
    return "".join(flag if perm & bit else "-" for flag, bit in (("r", 4), ("w", 2), ("x", 1)))


def route_table(route: TopicRoute) -> str:
    brokers = table(
        ["cluster", "broker", "id", "address", "zone"],
        [[b.cluster, b.broker_name, i, a, b.zone or "-"] for b in route.brokers
         for i, a in sorted(b.addrs.items())],
    )
    queues = table(
        ["broker", "read", "write", "perm", "sys_flag"],
        [[q.broker_name, q.read_queues, q.write_queues, f"{q.perm} ({perm_text(q.perm)})",
          q.sys_flag] for q in route.queues],
    )
    text = f"{brokers}\n\n{queues}"
    if route.order_conf:
        text += f"\n\norder_conf: {route.order_conf}"
    return text


# --- commands ---------------------------------------------------------------------
# A command's body is a plain function (`_status` for `status`): mutation testing
# (tools/mutate.py, mutmut) leaves decorated functions alone, so the click command only
# names its options and hands them on.


@click.command()
@ns_options
def status(target: Target) -> None:
    """Show the state of every NameServer in the list."""
    _status(target)


def _status(target: Target) -> None:
    results = call_all(target.endpoints, Status(), target.timeout)
    if target.as_json:
        _print_json({ep: _error_json(ep, r, target.timeout) if isinstance(r, Exception)
                     else _builtins(r) for ep, r in results.items()})
    else:
        rows = []
        for ep, r in results.items():
            if isinstance(r, ErrorReply):
                rows.append([ep, f"error {r.code}"])
            elif isinstance(r, Exception):
                rows.append([ep, "unreachable"])
            else:
                peers = ", ".join(f"{p} {'up' if up else 'down'}" for p, up in r.peers.items())
                rows.append([ep, r.epoch, r.revision, r.version, f"{r.uptime_ms / 1000:.0f}s",
                             r.brokers, r.topics, r.pub_endpoint, r.remoting or "-",
                             peers or "-"])
        click.echo(table(["nameserver", "epoch", "revision", "version", "uptime", "brokers",
                          "topics", "events", "remoting", "peers"], rows))
        # Under `zns serve --workers N`: every worker, as its state process saw them.
        workers = [[ep, w.worker, w.pid or "-", w.state, w.applied, w.lag_commands, w.lag_ms]
                   for ep, r in results.items() if isinstance(r, StatusReply)
                   and r.workers is not UNSET for w in r.workers]
        if workers:
            click.echo("\n" + table(["nameserver", "worker", "pid", "state", "applied",
                                     "lag", "lag_ms"], workers))
        # Under `--followers`: the followers each worker feeds, as it last reported them.
        fed = [[ep, w.worker, f.name, f.applied, f.lag_commands, f.lag_ms,
                f"{f.admitted_ms / 1000:.0f}s"]
               for ep, r in results.items() if isinstance(r, StatusReply)
               and r.workers is not UNSET for w in r.workers if w.followers is not UNSET
               for f in w.followers]
        if fed:
            click.echo("\n" + table(["nameserver", "worker", "follower", "applied", "lag",
                                     "lag_ms", "admitted"], fed))
        # A follower (`zns serve --follow`): the NameServer it follows, and its silence.
        followers = [[ep, r.follows, r.silent_ms] for ep, r in results.items()
                     if isinstance(r, StatusReply) and r.follows is not UNSET]
        if followers:
            click.echo("\n" + table(["nameserver", "follows", "silent_ms"], followers))
    worst = 0
    for ep, r in results.items():
        if isinstance(r, Exception):
            if not target.as_json:
                click.echo(_error_line(ep, r, target.timeout), err=True)
            # An answer that is an error (say no_permission) is 1; no answer at all is 3.
            worst = max(worst, _exit_code(r))
    if worst:
        sys.exit(worst)


@click.command()
@click.argument("topic")
@click.option("--zone", default="", help="Show only what a client of this zone sees.")
@ns_options
def route(target: Target, topic: str, zone: str) -> None:
    """Show the route of TOPIC: its brokers and queues."""
    _route(target, topic, zone)


def _route(target: Target, topic: str, zone: str) -> None:
    endpoint, reply = ask(target, GetRoute(topic=topic, zone=zone))
    if zone and not reply.route.brokers:
        try:
            whole = call(endpoint, GetRoute(topic=topic), target.timeout).route
            zones = _names({b.zone or "(none)" for b in whole.brokers})
        except ZnsError:
            zones = "unknown"
        fail(f"no broker of {topic!r} is in zone {zone!r} (its brokers' zones: {zones})",
             EXIT_ERROR_REPLY, "not_found")
    if target.as_json:
        _print_json(reply)
    else:
        click.echo(f"topic {topic} (revision {reply.revision}, epoch {reply.epoch})\n")
        click.echo(route_table(reply.route))


@click.command()
@ns_options
def clusters(target: Target) -> None:
    """Show clusters, their brokers and each address's liveness."""
    _clusters(target)


def _clusters(target: Target) -> None:
    _, reply = ask(target, GetClusterInfo())
    if target.as_json:
        _print_json(reply)
        return
    live = {(l.broker_name, l.broker_addr): l for l in reply.live}
    rows = []
    for cluster, names in reply.clusters.items():
        for name in names:
            data = reply.brokers[name]
            for broker_id, addr in sorted(data.addrs.items()):
                l = live.get((name, addr))
                seen = f"{l.last_heartbeat_ms / 1000:.1f}s ago" if l else "-"
                timeout = f"{l.timeout_ms / 1000:g}s" if l else "-"
                rows.append([cluster, name, broker_id, addr, data.zone or "-", seen, timeout])
    click.echo(table(["cluster", "broker", "id", "address", "zone", "last heartbeat",
                      "timeout"], rows))


@click.command()
@click.option("--cluster", default="", help="Only topics with queues on this cluster.")
@ns_options
def topics(target: Target, cluster: str) -> None:
    """List topics."""
    _topics(target, cluster)


def _topics(target: Target, cluster: str) -> None:
    endpoint, reply = ask(target, GetTopics(cluster=cluster))
    if not reply.topics and (why := _unknown_cluster(cluster, _cluster_info(target, endpoint))):
        fail(why, EXIT_ERROR_REPLY, "not_found")
    if target.as_json:
        _print_json(reply)
    elif not reply.topics:
        click.echo(f"no topics{' in cluster ' + cluster if cluster else ''}", err=True)
    else:
        for topic in reply.topics:
            click.echo(topic)


@click.group()
def kv() -> None:
    """Read and write the NameServers' KV store."""


@kv.command("get")
@click.argument("namespace")
@click.argument("key")
@ns_options
def kv_get(target: Target, namespace: str, key: str) -> None:
    """Print the value of KEY in NAMESPACE (exit 1 when there is none)."""
    _, reply = ask(target, KvGet(namespace=namespace, key=key))
    if target.as_json:
        _print_json(reply)
    else:
        click.echo(reply.value)


@kv.command("list")
@click.argument("namespace")
@ns_options
def kv_list(target: Target, namespace: str) -> None:
    """List the keys and values of NAMESPACE."""
    _, reply = ask(target, KvList(namespace=namespace))
    if target.as_json:
        _print_json(reply)
    else:
        click.echo(table(["key", "value"], sorted(reply.entries.items())))


@kv.command("put")
@click.argument("namespace")
@click.argument("key")
@click.argument("value")
@ns_options
def kv_put(target: Target, namespace: str, key: str, value: str) -> None:
    """Store VALUE on every NameServer."""
    try:
        request = KvPut(namespace=namespace, key=key, value=value)
    except ValueError:  # over the protocol's size: a usage error, not a traceback
        raise click.BadParameter(f"{len(value.encode())} UTF-8 bytes, over the "
                                 f"{MAX_KV_VALUE_BYTES} a KV value may have",
                                 param_hint="VALUE") from None
    tell_all(target, request, lambda r: "stored")


@kv.command("delete")
@click.argument("namespace")
@click.argument("key")
@ns_options
def kv_delete(target: Target, namespace: str, key: str) -> None:
    """Delete KEY on every NameServer."""
    tell_all(target, KvDelete(namespace=namespace, key=key),
             lambda r: "deleted" if r.removed else "not there")


@click.command("wipe-write-perm")
@click.argument("broker")
@ns_options
def wipe_write_perm(target: Target, broker: str) -> None:
    """Stop producers writing to BROKER (on every NameServer), e.g. before maintenance."""
    tell_all(target, WipeWritePerm(broker_name=broker), lambda r: f"{r.changed} queue data changed",
             _unknown_broker(target, broker))


@click.command("add-write-perm")
@click.argument("broker")
@ns_options
def add_write_perm(target: Target, broker: str) -> None:
    """Let producers write to BROKER again (on every NameServer)."""
    tell_all(target, AddWritePerm(broker_name=broker), lambda r: f"{r.changed} queue data changed",
             _unknown_broker(target, broker))


@click.command("delete-topic")
@click.argument("topic")
@click.option("--cluster", default="", help="Only remove the queues of this cluster's brokers.")
@ns_options
def delete_topic(target: Target, topic: str, cluster: str) -> None:
    """Delete TOPIC from every NameServer."""
    _delete_topic(target, topic, cluster)


def _delete_topic(target: Target, topic: str, cluster: str) -> None:
    def matched_nothing(endpoint: str, reply: Any) -> str | None:
        if reply.removed:
            return None
        info = _cluster_info(target, endpoint) if cluster else None
        if why := _unknown_cluster(cluster, info):
            return why
        if cluster:
            return f"topic {topic!r} has no queues on cluster {cluster!r} (or does not exist)"
        return f"no topic named {topic!r}"

    tell_all(target, DeleteTopic(topic=topic, cluster=cluster), lambda r: "deleted",
             matched_nothing)


@click.command()
@config_options(BrokerConfig)
# Taken as by every operator command: errors then come as JSON; the agent prints no tables.
@click.option("--json", "as_json", is_flag=True, hidden=True)
def broker(config: BrokerConfig, as_json: bool) -> None:
    """Run a broker agent (no message store): registers until Ctrl-C or SIGTERM, then unregisters.

    Every option also reads ZNS_BROKER_<OPTION> (--ns: ZNS_ADDR, --server-key: ZNS_SERVER_KEY,
    --keypair: ZNS_KEYPAIR) and the --config file's keys (cluster, name, addr, topic, ...).
    """
    _broker(config, as_json)


def _broker(config: BrokerConfig, as_json: bool) -> None:
    configure_logging(config.log_level, config.log_format)
    target = make_target(config.ns, config.timeout_s, as_json, config.server_key, config.keypair)
    cluster, broker_name, broker_addr = config.cluster, config.broker_name, config.broker_addr
    broker_id = config.broker_id
    stop = threading.Event()  # before the agent starts: a SIGTERM once it registers unregisters
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent = BrokerAgent(
            target.endpoints, cluster=cluster, broker_name=broker_name, broker_addr=broker_addr,
            broker_id=broker_id, ha_addr=config.ha_addr, zone=config.zone,
            topics=config.topic_configs(), register_period=config.register_period_s,
            heartbeat_interval=config.heartbeat_interval_s,
            heartbeat_timeout_ms=round(config.heartbeat_timeout_s * 1000),
            request_timeout=target.timeout,
        )
    except (ErrorReply, UsageError) as exc:  # a bad address or topic: a usage message, no trace
        raise click.UsageError(str(exc)) from None
    announced = False
    try:
        while not stop.wait(0.1):
            if not announced and agent.registered_everywhere():
                announced = True
                click.echo(f"broker {cluster}/{broker_name} id {broker_id} at {broker_addr} "
                           f"registered with {len(target.endpoints)} NameServer(s)", err=True)
            if agent.failure is not None:
                break
        done = agent.close()
    except BackgroundFailure:  # the agent logged it (one line): stop, never idle on
        sys.exit(EXIT_FAILED)
    click.echo(f"broker {broker_name} unregistered from "
               f"{sum(done.values())}/{len(done)} NameServer(s)", err=True)

# Added to the `zns` group by zns.cli.app.
COMMANDS = [status, route, clusters, topics, kv, wipe_write_perm, add_write_perm, delete_topic,
            broker]

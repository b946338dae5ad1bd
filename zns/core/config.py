"""The settings of `zns serve`, `zns relay` and `zns broker`, each defined once, as a typed Struct.

A field is one setting: its type and bounds, its default, its help text
(`msgspec.Meta(description=...)`) and, in `Meta.extra`, how it is spelled where
that is not the rule. Everything else is derived from it by `zns.cli.options`:

- the TOML key is the field's name (`heartbeat_interval`; `heartbeat-interval` too),
- the option is `--heartbeat-interval`, the environment variable the command's
  `ENV_PREFIX` + `HEARTBEAT_INTERVAL`,
- GET_NAMESRV_CONFIG shows `heartbeatInterval` (`ServerConfig.properties`).

The attribute names carry their units (`heartbeat_interval_s`); the names an
operator types keep theirs (`name=`). The three sources are merged into one
mapping and validated once, by `load`: the type and bounds by msgspec, endpoints
and networks by the field's `check` (zns.core.addresses, the one parser), what
relates two fields by `__post_init__`. A value that does not fit raises
`InvalidSetting`, which names the field, so the command line can say which
option, variable or key to fix.

Sans-I/O: no files, no environment; `zns.cli.options` reads those.
"""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
from msgspec import Meta, field
from msgspec import inspect as msgspec_inspect

from zns.core.addresses import check_endpoint, parse_addresses, parse_host_port, parse_networks
from zns.core.errors import InvalidSetting
from zns.core.limits import Limits
from zns.core.peer_link import MIN_PEER_GRACE_MS
from zns.core.schema import DEFAULT_PUB, DEFAULT_ROUTER, MAX_TOPICS_PER_REQUEST, TopicConfig
from zns.core.subscriptions import DEFAULT_QUEUED_EVENT_BYTES

__all__ = ["BrokerConfig", "Logging", "RelayConfig", "ServerConfig", "Setting", "load",
           "settings"]

# The KV store's file (zns.drivers.kv_file reads an older default's file when it is absent).
DEFAULT_KV_PATH = "~/.zns/kv.log"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# One large broker's registration publishes one event per topic; the mark must
# hold that burst for a subscriber that is a little behind (never 0: unbounded).
DEFAULT_PUB_HWM = 200_000
DEFAULT_REMOTING_MAX_CONNECTIONS = 4096
DEFAULT_REMOTING_MAX_PER_HOST = 1024
# What all remoting connections hold together (frames being read, requests waiting,
# unsent replies): with overheads and decoding's copies the listener stays within 512 MiB.
DEFAULT_REMOTING_MAX_BUFFER_BYTES = 256 << 20

# `--rocketmq`: the Java NameServer's port and address for RocketMQ's protocol; ZNS/1 beside it.
ROCKETMQ_REMOTING = "0.0.0.0:9876"
ROCKETMQ_ROUTER = "tcp://127.0.0.1:9886"
ROCKETMQ_PUB = "tcp://127.0.0.1:9887"

REQUIRED = "required, and not given"
NEEDS_CURVE = "needs curve_secret (--curve-secret): CURVE is off without it"

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
Count = Annotated[int, Meta(ge=1)]


def _doc(text: str, **extra: Any) -> Meta:
    """A field's help text; `extra`: metavar, option (its name on the command line when not the
    field's), env (the variable's full name when not derived), shown (False: not in
    GET_NAMESRV_CONFIG, e.g. file paths), check (one of CHECKS, for each value)."""
    return Meta(description=text, extra=extra)


def _listen(schemes: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        parse_host_port(value, schemes=schemes)
        return value
    return check


def _address(value: str) -> str:
    parse_host_port(value, schemes=(), bind=False)
    return value


def _nameservers(value: str) -> str:
    parse_addresses(value)
    return value


def _network(value: str) -> str:
    parse_networks([value])
    return value


# The highest CPU number `--cpus` takes: Linux's own limit (NR_CPUS) is at most 8192.
MAX_CPU = 8191
# "2", "2-5" or "0-6:2" (a stride). [0-9], not \d: \d takes any script's digits.
_CPU_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


def parse_cpus(text: str) -> list[int]:
    """A CPU list as `taskset -c` and cpusets write it ("0", "0,2", "2-5,7", and "0-6:2" for
    every second CPU of 0-6): the CPUs in the order given, each once (the order says which
    process goes where: `ServerConfig.cpu_of`); ValueError for anything else."""
    cpus: list[int] = []
    for part in text.split(","):
        match = _CPU_RANGE.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"{part.strip()!r} is not a CPU number or a range of them "
                             f"(0,2-3, or 0-6:2 for every second)")
        first, last = (_cpu_number(digits) for digits in (match[1], match[2] or match[1]))
        if first > last:
            raise ValueError(f"{part.strip()!r}: a range goes from low to high")
        stride = 1
        if match[3] is not None:  # any stride past the last CPU takes the first alone
            stride = int(match[3]) if len(match[3].lstrip("0")) <= 5 else MAX_CPU + 1
            if stride == 0:
                raise ValueError(f"{part.strip()!r}: a stride is 1 or more")
        cpus += [cpu for cpu in range(first, last + 1, stride) if cpu not in cpus]
    return cpus


def _cpu_number(digits: str) -> int:
    """A CPU number of the list, within 0..MAX_CPU (ValueError, saying so, past it)."""
    # Its length first: Python refuses int() of thousands of digits, in its own words.
    if len(digits.lstrip("0")) > len(str(MAX_CPU)) or int(digits) > MAX_CPU:
        shown = digits if len(digits) <= 20 else f"{digits[:20]}..."
        raise ValueError(f"CPU {shown}: CPUs are numbered 0 to {MAX_CPU} at most")
    return int(digits)


CPUS_AUTO, CPUS_OFF = "auto", "off"  # `--cpus` as a word: zns.core.pairing; the kernel's choice


def _cpus(value: str) -> str:
    text = value.strip()
    if text.lower() in (CPUS_AUTO, CPUS_OFF):  # as --log-level takes its words
        return text.lower()
    if text.isalpha():  # a word that is neither: say what the words are
        raise ValueError(f"{text[:20]!r} is none of {CPUS_AUTO}, {CPUS_OFF} or a CPU list "
                         f"(0,2-3)")
    parse_cpus(value)
    return value


def _path(value: str) -> str:
    # No file system takes one, and the os functions raise a ValueError of their own (a
    # traceback at start) instead of saying which setting holds it.
    if "\0" in value:
        raise ValueError("a path cannot hold a NUL character")
    return value


# What a string value must be, by the `check` a field names (zns.core.addresses, the one parser
# of endpoints and addresses): each returns the value as it is to be used, or raises ValueError.
CHECKS: dict[str, Callable[[str], str]] = {
    "bind": lambda value: check_endpoint(value, bind=True),  # a ZeroMQ endpoint to bind
    "connect": check_endpoint,  # a ZeroMQ endpoint to connect to
    "listen": _listen(("tcp",)),  # a TCP HOST:PORT to listen on
    "http_listen": _listen(("http",)),
    "address": _address,  # a HOST:PORT others reach (a broker's)
    "nameservers": _nameservers,  # a NameServer list, 'h1:9876;h2:9876'
    "networks": _network,  # a CIDR or an address
    "cpus": _cpus,  # a CPU list, '0,2-3', or auto or off
    "path": _path,  # a file or directory
}


class Logging(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What every long-running command logs, and how (the same variables for every command);
    the base of every command's configuration: it runs each field's `check`."""

    log_level: Annotated[LogLevel, _doc(
        "How much to log (any case).", env="ZNS_LOG_LEVEL")] = "INFO"
    log_format: Annotated[Literal["text", "json"], _doc(
        "text: plain lines; json: one JSON object per line (time, level, logger, message, "
        "exception).", env="ZNS_LOG_FORMAT")] = "text"

    def __post_init__(self) -> None:
        for setting in settings(type(self)):
            if setting.check is None:
                continue
            check = CHECKS[setting.check]
            value = getattr(self, setting.attr)
            try:
                if isinstance(value, list):
                    setattr(self, setting.attr, [check(item) for item in value])
                elif value:  # None or "": not set
                    setattr(self, setting.attr, check(value))
            except ValueError as exc:
                raise InvalidSetting(setting.name, str(exc)) from None


MAX_WORKERS = 64


class ServerConfig(Logging, kw_only=True, forbid_unknown_fields=True):
    """`zns serve`: a NameServer's sockets, peers, limits, keys and listeners."""

    ENV_PREFIX: ClassVar[str] = "ZNS_"

    router: Annotated[str, _doc("Endpoint of the request (ROUTER) socket.",
                                metavar="ENDPOINT", check="bind")] = DEFAULT_ROUTER
    pub: Annotated[str, _doc("Endpoint of the event (PUB) socket.",
                             metavar="ENDPOINT", check="bind")] = DEFAULT_PUB
    # None: the KV store is held in memory only (tests, benchmarks).
    kv_path: Annotated[str | None, _doc(
        "File that holds the KV store (an append-only log; an existing ~/.zns/kv.json, the old "
        "default name, is used when the default is absent).", metavar="PATH",
        shown=False, check="path")] = DEFAULT_KV_PATH
    state_path: Annotated[str, _doc(
        "File the route table is dumped to after changes and at stop, and restored from at "
        "start (default: the KV file's path with .state appended; none when the KV store is in "
        "memory).",
        metavar="PATH", shown=False, check="path")] = ""
    heartbeat_interval_s: Annotated[float, Meta(ge=0.01), _doc(
        "Seconds between `hb` events.", metavar="SECONDS")] = field(
        default=1.0, name="heartbeat_interval")
    max_message_bytes: Annotated[Count, _doc(
        "Larger requests are refused by the socket (the peer is disconnected).")] = (
        DEFAULT_MAX_MESSAGE_BYTES)
    pub_hwm: Annotated[Count, _doc(
        "Events queued per subscriber before the PUB socket drops (never 0).")] = DEFAULT_PUB_HWM
    pub_max_queued_bytes: Annotated[Count, _doc(
        "Bytes of events queued for subscribers that do not read, all together; past it the "
        "ones furthest behind are disconnected.")] = DEFAULT_QUEUED_EVENT_BYTES
    peers: Annotated[list[str], _doc(
        "Request endpoint of another NameServer to take hints from (repeatable).",
        metavar="ENDPOINT", option="peer", check="connect")] = field(default_factory=list)
    peer_grace_s: Annotated[float, Meta(ge=MIN_PEER_GRACE_MS / 1000), _doc(
        "Seconds a broker a peer saw leave has left here.", metavar="SECONDS")] = field(
        default=3.0, name="peer_grace")
    max_topics_per_request: Annotated[int, Meta(ge=1, le=MAX_TOPICS_PER_REQUEST), _doc(
        "Topics one register_broker (or get_routes) may list.")] = Limits.max_topics_per_request
    max_brokers: Annotated[Count, _doc(
        "Broker names, and broker addresses, held at most (each).")] = Limits.max_brokers
    max_topics: Annotated[Count, _doc("Topics held at most.")] = Limits.max_topics
    max_queues: Annotated[Count, _doc(
        "Queue entries (topic x broker name) held at most, each weighted by the filter servers, "
        "extra addresses and name bytes its routes carry; memory grows with them.")] = (
        Limits.max_queues)
    max_kv_entries: Annotated[Count, _doc("KV entries per namespace.")] = Limits.max_kv_entries
    max_kv_namespaces: Annotated[Count, _doc(
        "KV namespaces held at most.")] = Limits.max_kv_namespaces
    max_kv_bytes: Annotated[Count, _doc(
        "UTF-8 bytes of all KV namespaces, keys and values held at most.")] = Limits.max_kv_bytes
    # §9 CURVE: on when curve_secret is set.
    curve_secret: Annotated[str | None, _doc(
        "The server's NAME.key_secret (from `zns keygen`): turns CURVE on for both sockets.",
        metavar="FILE", shown=False, check="path")] = None
    brokers_keys: Annotated[str | None, _doc(
        "Directory of *.key public keys that may do broker ops.",
        metavar="DIR", shown=False, check="path")] = None
    admins_keys: Annotated[str | None, _doc(
        "Directory of *.key public keys that may do admin ops.",
        metavar="DIR", shown=False, check="path")] = None
    clients_keys: Annotated[str | None, _doc(
        "Directory of *.key public keys that may read routes (with --clients listed).",
        metavar="DIR", shown=False, check="path")] = None
    clients: Annotated[Literal["any", "listed"], _doc(
        "With CURVE: may any key read routes, or only listed ones?")] = "any"
    # §12 RocketMQ remoting listener: on when set.
    remoting: Annotated[str | None, _doc(
        "Also serve RocketMQ's remoting protocol here (HOST:PORT or tcp://HOST:PORT), so "
        "RocketMQ brokers, clients and mqadmin can use this NameServer. Off by default; plain "
        "TCP.", metavar="HOST:PORT", check="listen")] = None
    remoting_brokers: Annotated[list[str], _doc(
        "Networks whose remoting connections may register brokers (repeatable; default: any, "
        "or loopback only under CURVE).", metavar="CIDR", check="networks")] = field(
        default_factory=list)
    remoting_admins: Annotated[list[str], _doc(
        "Networks whose remoting connections may do admin writes (repeatable; default: "
        "loopback only).", metavar="CIDR", check="networks")] = field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"])
    remoting_clients: Annotated[list[str], _doc(
        "Networks whose remoting connections may read routes and cluster data (repeatable; "
        "default: any, or loopback only under CURVE with --clients listed).", metavar="CIDR",
        check="networks")] = field(default_factory=list)
    remoting_max_connections: Annotated[Count, _doc(
        "Remoting connections open at once; more are refused, and the last eighth only go to "
        "addresses holding fewer than 4. Lowered at start to what the open-file limit leaves "
        "for ZNS/1 clients (logged).")] = (
        DEFAULT_REMOTING_MAX_CONNECTIONS)
    remoting_max_connections_per_host: Annotated[Count, _doc(
        "Remoting connections open at once from one source address; more are refused.")] = (
        DEFAULT_REMOTING_MAX_PER_HOST)
    remoting_max_buffer_bytes: Annotated[int, Meta(ge=1 << 20), _doc(
        "Bytes all remoting connections may hold together (frames being read, requests "
        "waiting, unsent replies); past it connections of the address holding the most are "
        "closed, those whose bytes have waited longest first.")] = (
        DEFAULT_REMOTING_MAX_BUFFER_BYTES)
    order_message_enable: Annotated[bool, _doc(
        "Remoting routes carry an ordered topic's orderTopicConf (its ORDER_TOPIC_CONFIG KV "
        "entry), as RocketMQ's orderMessageEnable. Off by default, as in RocketMQ: producers "
        "given it write to its queues whatever their perm.")] = False
    metrics: Annotated[str | None, _doc(
        "Serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9878), liveness "
        "at /healthz and readiness at /readyz (needs prometheus_client: pip install "
        "prometheus_client). Off by default; plain HTTP.", metavar="HOST:PORT", check="http_listen")] = None
    ready_grace_s: Annotated[float, Meta(ge=0), _doc(
        "Seconds after start at most before /readyz says ready while brokers known before a "
        "restart have not registered again (two of RocketMQ's 30 s registration periods).",
        metavar="SECONDS")] = field(default=60.0, name="ready_grace")
    rocketmq: Annotated[bool, _doc(
        "RocketMQ mode, for a NameServer that replaces the Java one: RocketMQ's remoting "
        f"protocol on {ROCKETMQ_REMOTING} (unless --remoting is given) and ZNS/1 beside it on "
        f"{ROCKETMQ_ROUTER} and {ROCKETMQ_PUB} (unless --router, --pub are given).")] = False
    supervise: Annotated[bool, _doc(
        "Run the server in a child process and start a new one when it dies of a signal: "
        "libzmq 4.3.5 can be made to abort it (docs/operations.md). Needs fixed ports. With "
        "--workers it adds nothing (logged): the state process already starts a new worker "
        "when one dies, and only workers speak ZMTP.")] = False
    workers: Annotated[int, Meta(ge=0, le=MAX_WORKERS), _doc(
        "Serve ZNS/1 from this many worker processes (0: one process, as before). With 1 or "
        "more, this process becomes the state process: it holds the routes, the KV store and "
        "the expiry, opens no port, and keeps this many workers alive; each worker binds the "
        "request and events ports (SO_REUSEPORT) and answers from a replica "
        "(docs/operations.md, Workers).", metavar="N")] = 1
    cpus: Annotated[str, _doc(
        "Where the processes run. auto (the default): the state process and worker 1 share "
        "one CPU while their work is light and the machine quiet, so that a forwarded "
        "write's hand-offs stay on it, and run where the kernel puts them otherwise "
        "(docs/operations.md, Pinning processes to CPUs). off: where the kernel puts them. "
        "A CPU list (as taskset -c writes it: 0,2-3): each process pinned for good, the state process and worker 1 to "
        "the first, worker 2 to the second, and so on (round again past the last); one "
        "process (--workers 0) to the first. Every thread of a process runs where it does.",
        metavar="auto|off|LIST", check="cpus")] = CPUS_AUTO
    # Read replicas on other hosts (docs/operations.md, Followers).
    followers: Annotated[str | None, _doc(
        "Endpoint (tcp://HOST:PORT) on which each worker feeds read replicas on other hosts "
        "(`zns serve --follow`), with CURVE only: needs --curve-secret and --followers-keys.",
        metavar="ENDPOINT", check="bind")] = None
    followers_keys: Annotated[str | None, _doc(
        "Directory of *.key public keys of the followers that may connect to --followers.",
        metavar="DIR", shown=False, check="path")] = None
    follow: Annotated[str | None, _doc(
        "Serve as a read replica of the NameServer whose --followers endpoint this is: one "
        "process, answering reads from its replica and forwarding writes there; it holds no "
        "state file. Needs --follow-server-key and --follow-keypair.",
        metavar="ENDPOINT", check="connect")] = None
    follow_server_key: Annotated[str | None, _doc(
        "With --follow: that NameServer's CURVE public key (z85, or its .key file).",
        metavar="KEY", shown=False)] = None
    follow_keypair: Annotated[str | None, _doc(
        "With --follow: this follower's NAME.key_secret (from `zns keygen`), whose public key "
        "is in that NameServer's --followers-keys.", metavar="FILE", shown=False,
        check="path")] = None
    follow_writes: Annotated[bool, _doc(
        "With --follow: pass writes (registrations, KV, admin ops) on to that NameServer, "
        "authorized here by this follower's own CURVE settings, which must therefore be that "
        "NameServer's (needs --curve-secret). Without it a follower takes no write "
        "(no_permission), as a Redis replica is read-only.")] = False

    def __post_init__(self) -> None:
        if self.rocketmq:  # before the checks: the values they check are these
            self.remoting = self.remoting or ROCKETMQ_REMOTING
            self.router = ROCKETMQ_ROUTER if self.router == DEFAULT_ROUTER else self.router
            self.pub = ROCKETMQ_PUB if self.pub == DEFAULT_PUB else self.pub
        super().__post_init__()
        if self.curve_secret is None:
            for name in ("brokers_keys", "admins_keys", "clients_keys"):
                if getattr(self, name) is not None:
                    raise InvalidSetting(name, NEEDS_CURVE)
            if self.clients != "any":
                raise InvalidSetting("clients", NEEDS_CURVE)
        if self.workers:
            for name in ("router", "pub"):
                if not getattr(self, name).startswith("tcp://"):
                    raise InvalidSetting(name, "workers share their ports, which must be tcp:// "
                                         "(--workers 0: one process, which also serves ipc:// and inproc://)")
        if self.followers is not None:
            if self.curve_secret is None:
                raise InvalidSetting("followers", NEEDS_CURVE)
            if self.followers_keys is None:
                raise InvalidSetting("followers", "needs followers_keys (--followers-keys): "
                                     "the keys of the followers that may connect")
            if not self.workers:
                raise InvalidSetting("followers", "workers feed the followers: needs "
                                     "--workers 1 or more")
            if not self.followers.startswith("tcp://"):
                raise InvalidSetting("followers", "must be tcp://HOST:PORT")
        elif self.followers_keys is not None:
            raise InvalidSetting("followers_keys", "needs followers (--followers)")
        if self.follow is not None:
            for name in ("follow_server_key", "follow_keypair"):
                if getattr(self, name) is None:
                    raise InvalidSetting("follow", f"needs {name} (--{name.replace('_', '-')})")
            for name in ("followers", "supervise"):
                if getattr(self, name):
                    raise InvalidSetting(name, "a follower (--follow) is one process that "
                                         "follows another NameServer")
            if self.follow_writes and self.curve_secret is None:
                raise InvalidSetting("follow_writes", "a follower that takes writes checks "
                                     "their keys as the NameServer would: " + NEEDS_CURVE)
            if self.workers > 1:
                raise InvalidSetting("workers", "a follower (--follow) is one process: a "
                                     "client's connections must all reach the one replica "
                                     "(docs/operations.md, Followers)")
        else:
            for name in ("follow_server_key", "follow_keypair", "follow_writes"):
                if getattr(self, name) not in (None, False):
                    raise InvalidSetting(name, "needs follow (--follow)")
        if self.supervise and not self.workers and self._any_port():
            raise InvalidSetting("supervise", "a new server must bind the same ports: the port "
                                 f"of {', '.join(self._any_port())} must not be * or 0")

    def _any_port(self) -> list[str]:
        """The listeners bound to any free port (the next server would get another)."""
        found = [name for name in ("router", "pub")
                 if getattr(self, name).startswith("tcp://")
                 and getattr(self, name).rsplit(":", 1)[1] in ("*", "0")]
        listeners = (("remoting", self.remoting, ("tcp",)), ("metrics", self.metrics, ("http",)))
        found += [name for name, value, schemes in listeners
                  if value and parse_host_port(value, schemes=schemes)[1] == 0]
        return found

    def cpu_of(self, worker: int) -> int | None:
        """The CPU `--cpus` gives worker `worker` (1..N; 0: the state process, or the one
        process of --workers 0); None without a CPU list. The state process shares worker
        1's: a write that worker forwards is handed over and back on one core."""
        if self.cpus in ("", CPUS_AUTO, CPUS_OFF):
            return None
        cpus = parse_cpus(self.cpus)
        return cpus[max(worker - 1, 0) % len(cpus)]

    @property
    def pairs(self) -> bool:
        """Whether the state process pairs worker 1 with itself on one CPU while light
        (`--cpus auto` with workers: zns.core.pairing)."""
        return self.cpus == CPUS_AUTO and self.workers > 0

    @property
    def limits(self) -> Limits:
        return Limits(**{name: getattr(self, name) for name in Limits.__dataclass_fields__})

    def properties(self) -> dict[str, str]:
        """The settings as GET_NAMESRV_CONFIG shows them: no file paths, no keys; camelCase."""
        shown: dict[str, str] = {}
        for setting in settings(type(self)):
            if setting.shown:
                shown[setting.camel_name] = _property(getattr(self, setting.attr))
        shown["curve"] = _property(self.curve_secret is not None)
        return shown


class RelayConfig(Logging, kw_only=True, forbid_unknown_fields=True):
    """`zns relay`: one NameServer's events to many subscribers."""

    ENV_PREFIX: ClassVar[str] = "ZNS_RELAY_"

    upstream: Annotated[str, _doc(
        "The NameServer's REQUEST endpoint; its events endpoint is asked with status.",
        metavar="ENDPOINT", check="connect")] = field(name="from")
    bind: Annotated[str, _doc(
        "Where subscribers connect (clients: events=, zns watch --events).", metavar="ENDPOINT",
        check="bind")]
    timeout_s: Annotated[float, Meta(ge=0.01), _doc(
        "Seconds to wait for the NameServer's status at start.", metavar="SECONDS")] = field(
        default=3.0, name="timeout")


class BrokerConfig(Logging, kw_only=True, forbid_unknown_fields=True):
    """`zns broker`: a broker agent (no message store) and the NameServers it registers with."""

    ENV_PREFIX: ClassVar[str] = "ZNS_BROKER_"

    cluster: Annotated[str, _doc("The broker's cluster.")]
    broker_name: Annotated[str, _doc("Broker name.", option="name")]
    broker_addr: Annotated[str, _doc("Broker address host:port.", option="addr",
                                     metavar="HOST:PORT", check="address")]
    broker_id: Annotated[int, Meta(ge=0), _doc(
        "0 for the master, another number for a slave.", option="id")] = 0
    ha_addr: Annotated[str, _doc(
        "The broker's HA address host:port (a slave's master connects there).",
        metavar="HOST:PORT", check="address")] = ""
    zone: Annotated[str, _doc("The broker's zone.")] = ""
    topics: Annotated[list[str], _doc(
        "NAME[:READ[:WRITE[:PERM]]], repeatable (e.g. Orders:8).", option="topic",
        metavar="SPEC")] = field(default_factory=list)
    heartbeat_interval_s: Annotated[float, Meta(ge=0.01), _doc(
        "Seconds between heartbeats.", metavar="SECONDS")] = field(
        default=1.0, name="heartbeat_interval")
    heartbeat_timeout_s: Annotated[float, Meta(ge=1, le=3600), _doc(
        "Seconds of silence after which a NameServer drops it.", metavar="SECONDS")] = field(
        default=10.0, name="heartbeat_timeout")
    register_period_s: Annotated[float, _doc(
        "Seconds between full registrations (clamped to 10-60).", metavar="SECONDS")] = field(
        default=30.0, name="register_period")
    # The NameServers, as every operator command takes them (zns.cli.tools).
    ns: Annotated[str | None, _doc(
        "NameServers, e.g. 'tcp://h1:9876;h2:9876' (default $ZNS_ADDR, else "
        "tcp://127.0.0.1:9876).", metavar="ADDRS", env="ZNS_ADDR", check="nameservers")] = None
    timeout_s: Annotated[float, Meta(ge=0.01), _doc(
        "Seconds to wait for a NameServer.", metavar="SECONDS")] = field(
        default=3.0, name="timeout")
    server_key: Annotated[str | None, _doc(
        "The NameServers' CURVE public key (z85 or its .key file): turns CURVE on.",
        metavar="KEY|FILE", env="ZNS_SERVER_KEY")] = None
    keypair: Annotated[str | None, _doc(
        "Own CURVE NAME.key_secret (default: a fresh one, a plain client).",
        metavar="FILE", env="ZNS_KEYPAIR", check="path")] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.topic_configs()

    def topic_configs(self) -> dict[str, TopicConfig]:
        """The topics by name, each spec `NAME`, `NAME:QUEUES`, `NAME:READ:WRITE` or
        `NAME:READ:WRITE:PERM`."""
        return dict(_topic(spec) for spec in self.topics)


def _topic(spec: str) -> tuple[str, TopicConfig]:
    name, *numbers = spec.split(":")
    expected = f"{spec!r}: expected NAME[:READ[:WRITE[:PERM]]]"
    try:
        values = [int(n) for n in numbers]
    except ValueError:
        raise InvalidSetting("topics", expected) from None
    if len(values) > 3:
        raise InvalidSetting("topics", expected)
    fields: dict[str, int] = {}
    if values:
        fields["read_queues"] = fields["write_queues"] = values[0]
    if len(values) > 1:
        fields["write_queues"] = values[1]
    if len(values) > 2:
        fields["perm"] = values[2]
    try:
        return name, msgspec.convert(fields, TopicConfig)
    except msgspec.ValidationError as exc:
        raise InvalidSetting("topics", f"{spec!r}: {exc}") from None


class Setting(msgspec.Struct, frozen=True):
    """One field of a configuration, as the adapters see it."""

    attr: str  # the Struct's attribute (with its unit)
    name: str  # the operator's name: TOML key, and the option and variable derived from it
    option: str  # --option
    env: str  # ENV_VAR
    help: str
    metavar: str | None
    type: msgspec_inspect.Type  # without its Metadata wrapper
    default: Any  # msgspec.NODEFAULT: required
    shown: bool
    check: str | None  # a key of CHECKS
    choices: tuple[str, ...]  # a Literal's values, in their order; () for any other type

    @property
    def is_list(self) -> bool:
        return isinstance(self.type, msgspec_inspect.ListType)

    @property
    def is_flag(self) -> bool:
        return isinstance(self.type, msgspec_inspect.BoolType)

    @property
    def kind(self) -> str:
        """What the command line's help calls a value of this type when there is no metavar."""
        if isinstance(self.type, msgspec_inspect.IntType):
            return "N"
        if isinstance(self.type, msgspec_inspect.FloatType):
            return "NUMBER"
        return "TEXT"

    @property
    def camel_name(self) -> str:
        first, *rest = self.name.split("_")
        return first + "".join(word.capitalize() for word in rest)


@functools.cache
def settings(config: type[msgspec.Struct]) -> list[Setting]:
    """The fields of `config` in their order, with every spelling derived."""
    info = msgspec_inspect.type_info(config)
    assert isinstance(info, msgspec_inspect.StructType)
    prefix: str = getattr(config, "ENV_PREFIX", "ZNS_")
    hints = typing.get_type_hints(config, include_extras=True)
    found = []
    for f in info.fields:
        kind, extra, description = f.type, {}, ""
        if isinstance(kind, msgspec_inspect.Metadata):
            extra = kind.extra or {}
            description = (kind.extra_json_schema or {}).get("description", "")
            kind = kind.type
        if isinstance(kind, msgspec_inspect.UnionType):  # `X | None`: None is only a default
            kind = next(t for t in kind.types if not isinstance(t, msgspec_inspect.NoneType))
        option_name = extra.get("option", f.encode_name)
        if f.default_factory is not msgspec.NODEFAULT:
            default = f.default_factory()
        else:
            default = f.default
        found.append(Setting(
            attr=f.name, name=f.encode_name, option="--" + option_name.replace("_", "-"),
            env=extra.get("env", prefix + option_name.upper()), help=description,
            metavar=extra.get("metavar"), type=kind, default=default,
            shown=extra.get("shown", True), check=extra.get("check"), choices=_literal_values(hints[f.name]),
        ))
    # The shared logging fields after the command's own (msgspec puts a base's fields first).
    own = [s for s in found if s.attr not in Logging.__struct_fields__]
    return own + [s for s in found if s.attr in Logging.__struct_fields__]


def _literal_values(hint: Any) -> tuple[str, ...]:
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) is Literal:
        return tuple(str(value) for value in typing.get_args(hint))
    return ()


C = TypeVar("C", bound=msgspec.Struct)


def load(config: type[C], given: Mapping[str, Any]) -> C:
    """`config` from values by field name (strings are parsed: they came from a command line
    or the environment); InvalidSetting names the field that does not fit."""
    by_name = {s.name: s for s in settings(config)}
    for key in given:
        if key not in by_name:
            raise InvalidSetting(key, "unknown setting")
    values = {key: _normal(by_name[key], value) for key, value in given.items()}
    try:
        return msgspec.convert(values, config, strict=False)
    except msgspec.ValidationError as exc:
        raise _naming_the_field(str(exc), values) from None


def _normal(setting: Setting, value: Any) -> Any:
    """A Literal's value in any case as the Literal spells it (`--log-level debug`)."""
    if setting.choices and isinstance(value, str):
        for choice in setting.choices:
            if choice.casefold() == value.casefold():
                return choice
    return value


_AT_FIELD = re.compile(r"(?P<message>.*) - at `\$\.(?P<name>\w+)(?P<rest>[^`]*)`$")
_MISSING = re.compile(r"Object missing required field `(?P<name>\w+)`")


def _naming_the_field(message: str, values: Mapping[str, Any]) -> InvalidSetting:
    if match := _AT_FIELD.match(message):
        name = match["name"]
        got = values.get(name)
        if match["rest"] and isinstance(got, list):  # `$.peers[1]`: the item at fault
            index = int(match["rest"].strip("[]"))
            got = got[index] if index < len(got) else got
        problem = match["message"]
        return InvalidSetting(name, f"{problem}: {got!r}" if " got " in problem
                              else f"{problem}, got {got!r}")
    if match := _MISSING.match(message):
        return InvalidSetting(match["name"], REQUIRED)
    return InvalidSetting("", message)


def _property(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return "" if value is None else str(value)

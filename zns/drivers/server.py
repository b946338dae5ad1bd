"""The server: wiring, start and stop. One ROUTER for requests, one XPUB for events, one loop.

`Server` binds the sockets and makes the sources of the one loop
(`zns.drivers.loop`): the ZNS/1 router (`request_router`), the events
socket's subscriptions (`subscribers`), the remoting listener, the peer
links, the descriptor guard, the server timers (`hb`, expiry, the §8 stall
rule: `zns.core.timers.ServerTimers`), the heap trim and the outbox that
publishes every source's events. Everything it decides is decided by the
core; what runs when is decided by the loop.
"""

from __future__ import annotations

import logging
import secrets
import signal
import socket
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import zmq

from zns import __version__
from zns.core.config import (  # DEFAULT_*: re-exported for the relay and the benchmarks
    DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PUB_HWM, ServerConfig,
)
from zns.drivers.kv_file import KvStore
from zns.drivers import state_file
from zns.drivers.peers import PeerLinks
from zns.drivers.security import Security
from zns.drivers.descriptors import (
    DescriptorGuard, raise_descriptor_limit, tcp_address, tcp_host_port,
)
from zns.drivers.io_errors import configured
from zns.drivers.heap import TRIM_AFTER_EVENTS, HeapTrim, glibc_malloc_trim
from zns.drivers.subscribers import MONITORED as SUBSCRIBER_EVENTS, Subscribers
from zns.core.figures import Overview
from zns.core.handshakes import HandshakeWatch
from zns.core.latency import LatencyHistogram
from zns.core.readiness import Readiness
from zns.core.replication import Replica
from zns.core.schema import FollowerStatus
from zns.core.subscriptions import QueuedEvents, SubscriptionBudget
from zns.drivers.logs import install_repeat_filter
from zns.drivers.handshakes import HANDSHAKE_EVENTS, HandshakeLog
from zns.drivers.metrics import MetricsServer
from zns.drivers.port_lock import hold_lock, lock_name
from zns.drivers.request_times import timed_remoting, timed_service
from zns.drivers.loop import Loop, Outbox, PollSet, Ready, Source
from zns.drivers.remoting_listener import RemotingListener
from zns.drivers.request_router import (
    MAX_ENVELOPE_FRAMES,
    RequestRouter,
    peer_address,
)
from zns.core.addresses import parse_host_port
from zns.core.errors import UsageError
from zns.core.remoting.handler import RemotingService, describe_access, remoting_access
from zns.drivers.sockets import TCP_TIMEOUT_MS, Waker, handle_signals, set_keepalive
from zns.core.budget import ReplyBudget
from zns.core.service import Frames, NameService
from zns.core.timers import ServerTimers

log = logging.getLogger("zns")

# §1: the events socket refuses subscriptions longer than this (a subscription
# message is one flag byte and the channel prefix).
MAX_SUBSCRIPTION_BYTES = 1024
SUBSCRIBE_COMMAND_BYTES = 10
# A connection whose subscriptions freed this much when it closed makes the heap worth trimming.
FREED_TRIM_BYTES = 1024 * 1024
__all__ = ["MAX_ENVELOPE_FRAMES", "TCP_TIMEOUT_MS", "Server", "ServerConfig"]
# Plain ints and the backend's send, as the request router's (pyzmq's `send_multipart`
# checks every frame's type and goes through the Python-level `send` for each).
_DONTWAIT, _SNDMORE_DONTWAIT = int(zmq.DONTWAIT), int(zmq.SNDMORE | zmq.DONTWAIT)
backend_send = zmq.backend.Socket.send


def _networks_text(networks: tuple | None) -> str:
    return "any" if networks is None else ",".join(map(str, networks))


def new_epoch() -> str:
    return secrets.token_hex(8)


class Server:
    """Binds both sockets when made; `run()` serves until `stop()` or a signal."""

    worker = 0  # a worker's number under --workers N (zns.drivers.worker), for /metrics
    overview: Overview | None = None  # the whole's figures, a worker's (zns.core.figures)
    replica: Replica | None = None  # a worker's replica (its counts go to /metrics)
    # A follower's (zns.drivers.followers): ms since it last heard from its NameServer.
    silent: Callable[[], int] | None = None
    # A worker's with --followers: the followers it feeds (zns.drivers.followers.Gateway.shown).
    following: Callable[[], list[FollowerStatus]] | None = None

    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        context: zmq.Context | None = None,
        service: NameService | None = None,
        reuse_port: bool = False,
        extra_sources: Sequence[Source] = (),
        first_connection_id: int = 1,
    ) -> None:
        """`service`, `reuse_port` and `extra_sources`: a worker's (zns.drivers.worker): its
        replica's service instead of a new one (no KV file, no state dump restored), the
        ports bound with SO_REUSEPORT beside the other workers', and its replication
        channel as one more source of the loop."""
        self.config = config
        self._reuse_port = reuse_port
        self._first_connection_id = first_connection_id
        extra = list(extra_sources)
        self._clock = clock
        self._wall_clock = wall_clock
        self.security: Security | None = None
        self._own_ctx: zmq.Context | None = None
        if config.curve_secret:
            self.security = Security(config.curve_secret, config.brokers_keys,
                                     config.admins_keys, config.clients_keys, config.clients,
                                     config.followers_keys)
            # ZAP binds one fixed inproc endpoint per context: a server of its own.
            context = context or zmq.Context()
            self._own_ctx = context
            self.security.start(context)
        self._ctx = context or zmq.Context.instance()
        self._stopping = False
        self._reload_keys = False
        self.waker = Waker()
        # The locks of the ports this server listens on alone (zns.drivers.port_lock): a
        # worker's (`reuse_port`) are its state process's.
        self._locks: list[socket.socket] = []
        self.reply_budget = ReplyBudget()
        self.heap = HeapTrim(glibc_malloc_trim(), self._now())
        self.descriptor_limit = raise_descriptor_limit()
        self.descriptors = DescriptorGuard(self.descriptor_limit)
        install_repeat_filter(log)
        # The KV store this server opened (and closes: its file's lock goes with it), if any.
        self._kv: KvStore | None = None
        if service is None:
            self._kv = KvStore(config.kv_path)
            self.service = NameService(
                self._kv, epoch=new_epoch(), started_at_ms=self._now(), version=__version__,
                authorize=self.security.authorize if self.security else None,
                limits=config.limits, max_reply_bytes=self.reply_budget.burst,
                key_name=self.security.key_name if self.security else None,
                address_of=peer_address,
            )
        else:  # a worker's: what this server knows of its peers too
            self.service = service
            service.authorize = self.security.authorize if self.security else None
            service.max_reply_bytes = self.reply_budget.burst
            service.key_name = self.security.key_name if self.security else None
            service.address_of = peer_address
        self.state: state_file.StateWriter | None = None
        # A RocketMQ client or a mismatched ZeroMQ client at the request port: one warning.
        self.handshakes = HandshakeLog(
            HandshakeWatch(config.router, curve=self.security is not None), self._now)
        # /readyz: no broker is expected unless a state dump is restored (_restore_state).
        self.readiness = Readiness((), self._now(), round(config.ready_grace_s * 1000))
        self.router = self._ctx.socket(zmq.ROUTER)
        # An XPUB, not a PUB: it hands every subscription to the loop, which counts what
        # each connection holds (zns.drivers.subscribers); it publishes as a PUB does.
        self.pub = self._ctx.socket(zmq.XPUB)
        self.subscribers = Subscribers(
            self.pub, SubscriptionBudget(), freed=self.subscriptions_freed,
            queued=QueuedEvents(config.pub_max_queued_bytes, hwm=config.pub_hwm))
        self.outbox = Outbox(self._send_event, self.heap.events_made)
        self.request_times = LatencyHistogram()  # zns_request_seconds
        # Requests are timed (both protocols) only when /metrics can show it: the wrappers'
        # clock reads and histogram cost about 1 µs a request, an eighth of a get_route.
        self._timed = bool(config.metrics)
        self.requests = RequestRouter(
            self.router,
            timed_service(self.service, self.request_times) if self._timed else self.service,
            self.outbox,
            clock=self._now,
            max_message_bytes=config.max_message_bytes, reply_budget=self.reply_budget,
            with_key=self.security is not None,
        )
        self.heap.busy = self.requests.waiting
        self.peers: PeerLinks | None = None
        self.remoting: RemotingListener | None = None
        self.metrics: MetricsServer | None = None
        self.loop: Loop | None = None
        try:
            if service is None:
                self.state = self._restore_state(config)  # before anything is served
            self._configure_sockets()
            self.router_endpoint = self._bind(self.router, config.router,
                                              self.handshakes.on_event, HANDSHAKE_EVENTS)
            self.handshakes.watch.port = self.router_endpoint
            self.pub_endpoint = self._bind(self.pub, config.pub, self.subscribers.on_monitor_event,
                                           SUBSCRIBER_EVENTS)
            if self.security is not None:
                self.security.peer_client(self._ctx)  # sockets made from here on: peer links
            grace_ms = round(config.peer_grace_s * 1000)
            self.peers = PeerLinks(
                config.peers, now=self._now(), context=self._ctx, connected=self.service.peers,
                clock=self._now,
                suspect=lambda cluster, addr, now: self.service.suspect(
                    cluster, addr, grace_ms, now),
            )
            if config.remoting:
                self.remoting = self._listen_remoting(config, config.remoting)
            self.timers = ServerTimers(
                self.service, heartbeat_interval_ms=round(config.heartbeat_interval_s * 1000),
                now=self._now(),
            )
            # The order the loop runs them in each pass: the timers first (hb and expiry
            # are due at a time; requests can wait a slice), the outbox last. Both are also
            # urgent: run after any other source once due, so an expiry waits one slice at
            # most, not a pass, and events leave as soon as they are made.
            timers = _Timers(self.timers, self.outbox, self._wall_ms)
            sources: list[Source] = [_Control(self), self.descriptors, timers,
                                     self.requests, _Subscriptions(self.pub, self.subscribers)]
            if self.remoting is not None:
                sources.append(self.remoting)
            if self.state is not None:
                sources.append(self.state)
            sources += [*extra, self.peers, self.heap, self.outbox]
            self.loop = Loop(sources, clock=self._now, stall=self.timers, poll=PollSet(),
                             urgent=[timers, self.outbox])
            if config.metrics:
                refused = f"--metrics {config.metrics}: cannot listen"
                port = self._lock_fixed(config.metrics, refused, ("http",))
                self.metrics = MetricsServer(self, config.metrics,
                                             heartbeat_interval=config.heartbeat_interval_s,
                                             descriptors=self.descriptors,
                                             reuse_port=self._reuse_port)
                if port == 0:
                    self._lock_chosen(self.metrics.listening, refused)
        except BaseException:
            self.close()  # a refused start (port in use, bad --peer) leaves nothing bound
            raise
        self.service.pub_endpoint = self.pub_endpoint

    @property
    def dropped_replies(self) -> int:
        return self.requests.dropped_replies

    @property
    def dropped_requests(self) -> int:
        return self.requests.dropped_requests

    @property
    def last_pass_ms(self) -> int:
        """When the loop last completed a pass (/healthz)."""
        return self.loop.last_pass_ms if self.loop is not None else self._now()

    # --- life cycle -----------------------------------------------------

    def run(self) -> None:
        """Serve until `stop()` or SIGTERM/SIGINT (when run in the main thread)."""
        restore_wakeup, restore_handlers = self._install_signal_handlers()
        log.info("zns serving requests on %s, events on %s (epoch %s)",
                 self.router_endpoint, self.pub_endpoint, self.service.epoch)
        log.info("file descriptors: limit %d, room for about %d clients (a client uses two: "
                 "requests and events)", self.descriptor_limit, self.descriptor_limit // 2 - 32)
        assert self.loop is not None  # None only if __init__ failed
        try:
            self.loop.run(lambda: self._stopping)
        finally:
            # The wake-up descriptor goes before the waker closes; our stop handlers stay
            # until the end, so a second stop signal while closing (Ctrl-C reaches the
            # server and `--supervise`, which then sends SIGTERM) is the same stop, not a
            # previous handler ending the process half closed, without its last line.
            restore_wakeup()
            try:
                try:
                    if self.state is not None:
                        self.state.write_now()
                finally:
                    self.close()
                log.info("zns stopped")
            finally:
                restore_handlers()

    def stop(self) -> None:
        """Thread-safe and signal-safe: the loop ends at its next wake-up."""
        self._stopping = True
        self.wake()

    def reload_keys(self) -> None:
        """Thread-safe and signal-safe (SIGHUP): re-read the CURVE key directories."""
        self._reload_keys = True
        self.wake()

    def wake(self) -> None:
        self.waker.wake()

    def ready(self) -> tuple[bool, str]:
        """/readyz (thread-safe: lookups in the route table's dicts)."""
        return self.readiness.check(self._now(), self._settled)

    def _settled(self, cluster: str, addr: str) -> bool:
        """A broker address restored from the state dump has registered or heartbeated since
        (confirmed), or is gone (it did not, and was removed as not_confirmed)."""
        live = self.service.table.liveness(cluster, addr)
        return live is None or live.confirm_by is None

    def now_ms(self) -> int:
        """The server's clock (thread-safe)."""
        return self._now()

    def loop_age_s(self) -> float:
        """Seconds since the loop last completed a pass (thread-safe: one int read)."""
        return max(0, self._now() - self.last_pass_ms) / 1000

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self.descriptors.close()
        if self.remoting is not None:
            self.remoting.close()
        self.router.close(linger=500)
        self.pub.close(linger=500)
        if self.peers is not None:
            self.peers.close()
        self.waker.close()
        if self._kv is not None:
            self._kv.close()
        if self.state is not None:
            self.state.close()  # its dump's lock: written (run's write_now) before
        if self.security is not None:
            self.security.stop()
        if self._own_ctx is not None:
            self._own_ctx.destroy(linger=0)
        for lock in self._locks:  # last: the ports are closed (or closing, libzmq's)
            lock.close()
        self._locks.clear()

    # --- wiring ---------------------------------------------------------

    def _listen_remoting(self, config: ServerConfig, endpoint: str) -> RemotingListener:
        port = self._lock_fixed(endpoint, f"--remoting {config.remoting}", ("tcp",))
        with configured(f"--remoting {config.remoting}: "):
            access, narrowed = remoting_access(
                config.remoting_brokers, config.remoting_admins, config.remoting_clients,
                curve=self.security is not None, clients_listed=config.clients == "listed")
            service = RemotingService(
                self.service, **access, properties=config.properties(),
                order_message_enable=config.order_message_enable,
                keyless=self.security.check_keyless if self.security is not None else None,
            )
            listener = RemotingListener(
                endpoint, timed_remoting(service, self.request_times) if self._timed else service,
                now=self._now(), descriptors=self.descriptors,
                outbox=self.outbox, clock=self._now,
                max_frame_bytes=config.max_message_bytes,
                max_connections=config.remoting_max_connections,
                max_per_host=config.remoting_max_connections_per_host,
                max_buffer_bytes=config.remoting_max_buffer_bytes,
                reuse_port=self._reuse_port, first_connection_id=self._first_connection_id,
            )
        if port == 0:
            try:
                self._lock_chosen(listener.listening, f"--remoting {config.remoting}")
            except BaseException:
                listener.close()  # not yet this server's to close
                raise
        # GET_NAMESRV_CONFIG shows where the server listens, as the Java NameServer shows its
        # bound listenPort: the endpoints bound, not the configured `*` or port 0; and the
        # networks in force, CURVE's narrowing included.
        service.properties.update(
            router=self.router_endpoint, pub=self.pub_endpoint, remoting=listener.endpoint,
            remotingBrokers=_networks_text(service.brokers),
            remotingAdmins=_networks_text(service.admins),
            remotingClients=_networks_text(service.readers))
        if narrowed:
            log.warning("%s", narrowed)
        if not is_loopback(f"tcp://{listener.endpoint}"):
            log.warning("the RocketMQ remoting listener on %s is plain TCP (no CURVE): it takes "
                        "%s", listener.endpoint,
                        describe_access(service.brokers, service.admins, service.readers))
        log.info("RocketMQ remoting listener on %s", listener.endpoint)
        self.service.remoting_endpoint = listener.endpoint
        return listener

    def _restore_state(self, config: ServerConfig) -> state_file.StateWriter | None:
        """Load the state dump, if any, into the fresh service; the writer of the next ones."""
        path = state_file.state_path_for(config.state_path, config.kv_path)
        if path is None:
            return None
        writer, dump = state_file.restored_writer(path, self.service, now=self._now(),
                                                  wall_ms=self._wall_ms, wake=self.wake,
                                                  clock=self._now)
        if dump is not None:
            # /readyz waits for each restored address to register again (or go).
            self.readiness = Readiness(
                [(a.cluster, a.addr) for a in dump.table.addresses], self._now(),
                round(config.ready_grace_s * 1000))
        return writer

    def subscriptions_freed(self, cost: int) -> None:
        # Freed trie nodes stay in glibc's heap; a large release is worth a trim.
        if cost >= FREED_TRIM_BYTES:
            self.heap.events_made(TRIM_AFTER_EVENTS)

    def _reload(self) -> None:
        if self.security is not None:
            self.security.reload()  # checked at new handshakes; connections stay up
        else:
            log.info("SIGHUP: CURVE is off, no keys to reload")

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _wall_ms(self) -> int:
        return round(self._wall_clock() * 1000)

    def _send_event(self, frames: Frames) -> None:
        channel, body = frames
        backend_send(self.pub, channel, _SNDMORE_DONTWAIT)
        backend_send(self.pub, body, _DONTWAIT)
        self.subscribers.sent(len(channel) + len(body))

    # --- sockets --------------------------------------------------------

    def _configure_sockets(self) -> None:
        router, pub = self.router, self.pub
        RequestRouter.configure(router, self.config.max_message_bytes)
        if self.security is not None:
            self.security.apply(router)
            self.security.apply(pub)
        pub.setsockopt(zmq.SNDHWM, self.config.pub_hwm)
        pub.setsockopt(zmq.LINGER, 500)
        set_keepalive(pub)
        # What a PUB socket reads are subscriptions: libzmq disconnects a subscriber whose
        # (un)subscription is longer than §1 allows before it is stored or buffered. The
        # frame carries the channel after ZMTP 3.1's command name (b"\x09SUBSCRIBE", 10
        # bytes; ZMTP 3.0 peers use 1 flag byte instead).
        pub.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION_BYTES + SUBSCRIBE_COMMAND_BYTES)

    def _bind(self, sock: zmq.Socket, endpoint: str,
              on_event: Callable[[int, int], None] | None = None, events: int = 0) -> str:
        refused = f"cannot bind {endpoint}"
        port = self._lock_fixed(endpoint, refused)
        with configured(f"{refused}: "):
            listener = self.descriptors.bind(sock, endpoint, on_event, events,
                                             reuse_port=self._reuse_port)
        if port == 0 and listener.listening is not None:
            self._lock_chosen(listener.listening, refused)
        bound = listener.endpoint
        if sock is self.pub:
            self.subscribers.bound(listener.listening, bound)
        if self.security is None and not is_loopback(bound):
            log.warning(
                "%s is bound to a non-loopback address without CURVE: anyone who can reach "
                "it can register brokers and rewrite routes", bound,
            )
        return bound

    def _lock_fixed(self, spec: str, refused: str, schemes: tuple[str, ...] = ()) -> int | None:
        """Before binding the TCP port of `spec` alone (`--workers 0`): its lock
        (zns.drivers.port_lock), held until `close`, so that this server is refused (as
        `refused`) while another zns's state process holds the port with none of its
        workers listening, instead of taking it from them (the kernel lets a listener bind
        beside a socket that does not listen). `spec`: a ZNS/1 endpoint (`tcp://HOST:PORT`),
        or HOST:PORT (or SCHEME://HOST:PORT for one of `schemes`). Returns the port: 0 (`*`)
        is locked once bound (`_lock_chosen`); None for a worker's, and for a `spec` the
        bind refuses or does not bind on TCP (it says what is wrong with it)."""
        if self._reuse_port:
            return None
        try:
            if schemes:
                host, port = parse_host_port(spec, schemes=schemes)
            elif (tcp := tcp_host_port(spec)) is not None:
                host, port = tcp
            else:
                return None
        except (UsageError, ValueError):
            return None
        if port:
            with configured(f"{refused}: "):  # a name that does not resolve: as the bind
                family, (address, port) = tcp_address(host, port)
            self._hold(lock_name(family, address, port), refused)
        return port

    def _lock_chosen(self, listening: socket.socket, refused: str) -> None:
        """The lock of a port of `*` or 0, once the kernel has chosen it: held by another
        zns only if it reserved that very port meanwhile, and refused then as a fixed port."""
        host, port = listening.getsockname()[:2]
        self._hold(lock_name(listening.family, host, port), refused)

    def _hold(self, name: str, refused: str) -> None:
        lock = hold_lock(name, refused)
        if lock is not None:
            self._locks.append(lock)

    def _install_signal_handlers(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """Stop on SIGTERM/SIGINT, reload keys on SIGHUP; returns the two undos: the
        wake-up descriptor's (before the waker closes) and the handlers'."""
        return handle_signals({signal.SIGTERM: self.stop, signal.SIGINT: self.stop,
                               signal.SIGHUP: self.reload_keys}, self.waker)


def is_loopback(endpoint: str) -> bool:
    """True for inproc/ipc and tcp endpoints on 127.0.0.0/8, ::1 or localhost."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp":
        return True
    host = (parts.hostname or "").strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


class _Control:
    """The loop's source for other threads and signals: the waker, and key reloads (SIGHUP)."""

    what = "reloading keys"

    def __init__(self, server: Server) -> None:
        self._server = server

    def attach(self, poll: PollSet) -> None:
        poll.register(self._server.waker.fd, zmq.POLLIN, self)

    def next_deadline(self, now: int) -> int | None:
        return None

    def run(self, ready: Ready, now: int, until: int) -> None:
        server = self._server
        server.waker.drain_if_woken(ready)
        if server._reload_keys:
            server._reload_keys = False
            server._reload()


class _Timers:
    """The server timers as a source: `hb` events and expiry into the outbox."""

    what = "running timers"

    def __init__(self, timers: ServerTimers, outbox: Outbox, wall_ms: Callable[[], int]) -> None:
        self.timers, self._outbox, self._wall_ms = timers, outbox, wall_ms

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        return self.timers.next_deadline()

    def run(self, ready: Ready, now: int, until: int) -> None:
        for events in self.timers.on_timer(now, self._wall_ms()):
            self._outbox.put(events)


class _Subscriptions:
    """The events socket's (un)subscriptions as a source (`zns.drivers.subscribers`)."""

    what = "counting subscriptions"

    def __init__(self, xpub: zmq.Socket, subscribers: Subscribers) -> None:
        self._xpub, self._subscribers = xpub, subscribers

    def attach(self, poll: PollSet) -> None:
        poll.register(self._xpub, zmq.POLLIN, self)

    def next_deadline(self, now: int) -> int | None:
        return None

    def run(self, ready: Ready, now: int, until: int) -> None:
        self._subscribers.handle()

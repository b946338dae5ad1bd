"""The socket loop: one ROUTER for requests, one PUB for events, one zmq.Poller.

Thin on purpose: it reads frames, hands the body to `NameService.respond`,
sends the reply back with the envelope unchanged, publishes the events, and
arms the one timer `zns.core.timers.ServerTimers` asks for (`hb` events,
expiry, peers, the §8 stall rule). Everything it decides is decided by the core.
"""

from __future__ import annotations

import errno
import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import zmq

from zns.core.config import (  # DEFAULT_*: re-exported for the relay and the benchmarks
    DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PUB_HWM, ServerConfig,
)
from zns.core.errors import EndpointError
from zns.drivers.kv_file import KvStore
from zns.drivers.peers import PeerLinks
from zns.drivers.security import Security
from zns.drivers.descriptors import DescriptorGuard, raise_descriptor_limit
from zns.drivers.heap import TRIM_AFTER_EVENTS, HeapTrim, glibc_malloc_trim
from zns.drivers.subscribers import MONITORED as SUBSCRIBER_EVENTS, Subscribers
from zns.core.subscriptions import SubscriptionBudget
from zns.drivers.logs import install_repeat_filter
from zns.drivers.metrics import MetricsServer
from zns.drivers.remoting_listener import RemotingListener
from zns.core.remoting.handler import RemotingService, describe_access, remoting_access
from zns.drivers.sockets import Waker, set_keepalive
from zns.core.budget import ReplyBudget
from zns.core.service import Frames, NameService
from zns.core.timers import ServerTimers

log = logging.getLogger("zns")

# Serving gives the timers their turn after this long (§8: hb and expiry stay on
# time whatever the load); the clock is read every CLOCK_EVERY requests.
SLICE_MS = 5
CLOCK_EVERY = 16
# §1: a request has at most this many envelope frames, and all its frames together
# at most max_message_bytes; anything else is dropped unanswered (and logged).
MAX_ENVELOPE_FRAMES = 32
# §1: the events socket refuses subscriptions longer than this (a subscription
# message is one flag byte and the channel prefix).
MAX_SUBSCRIPTION_BYTES = 1024
SUBSCRIBE_COMMAND_BYTES = 10
# A connection whose subscriptions freed this much when it closed makes the heap worth trimming.
FREED_TRIM_BYTES = 1024 * 1024
# A peer that reads nothing for this long is disconnected and its unread replies freed.
TCP_TIMEOUT_MS = 10_000
# Plain ints, and the backend's send: pyzmq's IntFlag arithmetic and its Python-level
# `send` wrapper each cost a noticeable share of a small request.
_NOBLOCK, _DONTWAIT = int(zmq.NOBLOCK), int(zmq.DONTWAIT)
_SNDMORE_DONTWAIT = int(zmq.SNDMORE | zmq.DONTWAIT)
_send = zmq.backend.Socket.send


def _networks_text(networks: tuple | None) -> str:
    return "any" if networks is None else ",".join(map(str, networks))


def new_epoch() -> str:
    return secrets.token_hex(8)


class Server:
    """Binds both sockets when made; `run()` serves until `stop()` or a signal."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        context: zmq.Context | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self.security: Security | None = None
        self._own_ctx: zmq.Context | None = None
        if config.curve_secret:
            self.security = Security(config.curve_secret, config.brokers_keys,
                                     config.admins_keys, config.clients_keys, config.clients)
            # ZAP binds one fixed inproc endpoint per context: a server of its own.
            context = context or zmq.Context()
            self._own_ctx = context
            self.security.start(context)
        self._ctx = context or zmq.Context.instance()
        self._stopping = False
        self._reload_keys = False
        self._waker = Waker()
        self.dropped_replies = 0
        self.dropped_requests = 0  # over §1's envelope or total-size bound
        self._draining = False  # in the middle of dropping an oversized message
        self.reply_budget = ReplyBudget()
        self.heap = HeapTrim(glibc_malloc_trim(), self._now())
        self.descriptor_limit = raise_descriptor_limit()
        self.descriptors = DescriptorGuard(self.descriptor_limit)
        install_repeat_filter(log)
        self.service = NameService(
            KvStore(config.kv_path), epoch=new_epoch(), started_at_ms=self._now(),
            authorize=self.security.authorize if self.security else None, limits=config.limits,
            max_reply_bytes=self.reply_budget.burst,
        )
        self.router = self._ctx.socket(zmq.ROUTER)
        # An XPUB, not a PUB: it hands every subscription to the loop, which counts what
        # each connection holds (zns.drivers.subscribers); it publishes as a PUB does.
        self.pub = self._ctx.socket(zmq.XPUB)
        self.subscribers = Subscribers(self.pub, SubscriptionBudget(), freed=self._subscriptions_freed)
        self.peers: PeerLinks | None = None
        self.metrics: MetricsServer | None = None
        self.last_pass_ms = self._now()  # when the loop last completed a pass (/healthz)
        try:
            self._configure_sockets()
            self.router_endpoint = self._bind(self.router, config.router)
            self.pub_endpoint = self._bind(self.pub, config.pub, self.subscribers.on_monitor_event,
                                           SUBSCRIBER_EVENTS)
            if self.security is not None:
                self.security.peer_client(self._ctx)  # sockets made from here on: peer links
            grace_ms = round(config.peer_grace_s * 1000)
            self.peers = PeerLinks(
                config.peers, now=self._now(), context=self._ctx, connected=self.service.peers,
                max_message_bytes=config.max_message_bytes,
                suspect=lambda cluster, addr, now: self.service.suspect(
                    cluster, addr, grace_ms, now),
            )
            self.remoting: RemotingListener | None = None
            if config.remoting:
                self.remoting = self._listen_remoting(config, config.remoting)
            self.timers = ServerTimers(
                self.service, heartbeat_interval_ms=round(config.heartbeat_interval_s * 1000),
                now=self._now(), peers=self.peers.links,
            )
            if config.metrics:
                self.metrics = MetricsServer(self, config.metrics,
                                             heartbeat_interval=config.heartbeat_interval_s)
        except BaseException:
            self.close()  # a refused start (port in use, bad --peer) leaves nothing bound
            raise
        self.service.pub_endpoint = self.pub_endpoint

    # --- life cycle -----------------------------------------------------

    def run(self) -> None:
        """Serve until `stop()` or SIGTERM/SIGINT (when run in the main thread)."""
        restore = self._install_signal_handlers()
        log.info("zns serving requests on %s, events on %s (epoch %s)",
                 self.router_endpoint, self.pub_endpoint, self.service.epoch)
        log.info("file descriptors: limit %d, room for about %d clients (a client uses two: "
                 "requests and events)", self.descriptor_limit, self.descriptor_limit // 2 - 32)
        try:
            self._loop()
        finally:
            restore()
            self.close()
            log.info("zns stopped")

    def stop(self) -> None:
        """Thread-safe and signal-safe: the loop ends at its next wake-up."""
        self._stopping = True
        self.wake()

    def reload_keys(self) -> None:
        """Thread-safe and signal-safe (SIGHUP): re-read the CURVE key directories."""
        self._reload_keys = True
        self.wake()

    def wake(self) -> None:
        self._waker.wake()

    def loop_age_s(self) -> float:
        """Seconds since the loop last completed a pass (thread-safe: one int read)."""
        return max(0, self._now() - self.last_pass_ms) / 1000

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self.descriptors.close()
        remoting = getattr(self, "remoting", None)  # unset when the start failed before it
        if remoting is not None:
            remoting.close()
        self.router.close(linger=500)
        self.pub.close(linger=500)
        if self.peers is not None:
            self.peers.close()
        self._waker.close()
        if self.security is not None:
            self.security.stop()
        if self._own_ctx is not None:
            self._own_ctx.destroy(linger=0)

    # --- the loop -------------------------------------------------------

    def _loop(self) -> None:
        timers = self.timers
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pub, zmq.POLLIN)  # subscriptions
        poller.register(self._waker.fd, zmq.POLLIN)
        for listener in self.descriptors.listeners:
            poller.register(listener.monitor, zmq.POLLIN)
        monitors = {listener.monitor for listener in self.descriptors.listeners}
        remoting = self.remoting
        if remoting is not None:
            remoting.attach(poller)
        assert self.peers is not None  # None only while __init__ runs
        peers = self.peers if self.peers.links else None  # none: nothing to ask each pass
        self.peers.attach(poller)
        now = self._now()
        while not self._stopping:
            ready = dict(poller.poll(max(0, timers.next_wake() - now)))
            now = self._now()
            timers.woke(now)
            self._waker.drain_if_woken(ready)
            if monitors.intersection(ready):
                _guarded("shedding connections", self.descriptors.handle, ready, now)
            self.descriptors.tick(now)
            if self._reload_keys:
                self._reload_keys = False
                _guarded("reloading keys", self._reload)
            if self.router in ready or self._draining:
                cpu_before = _cpu_ms()
                _guarded("serving requests", self._serve_slice, now)
                after = self._now()
                # A stall can also land while serving (a broker's heartbeat reply wakes
                # whoever then suspends us): wall time the loop did not run.
                timers.ran(after - now, _cpu_ms() - cpu_before)
                now = after
            if self.pub in ready:
                _guarded("counting subscriptions", self.subscribers.handle)
            if remoting is not None:
                _guarded("serving remoting", self._serve_remoting, ready, now)
            if peers:
                _guarded("reading peers", peers.handle, ready, now)
            _guarded("running timers", self._run_timers, now)
            if self.router not in ready and not self._draining:
                _guarded("trimming the heap", self.heap.calm, now)
            self.last_pass_ms = now

    def _serve_remoting(self, ready: dict, now: int) -> None:
        assert self.remoting is not None
        events = self.remoting.handle(ready, now)
        events.extend(self.remoting.on_timer(now))
        if events:
            self._publish(events)

    def _listen_remoting(self, config: ServerConfig, endpoint: str) -> RemotingListener:
        try:
            access, narrowed = remoting_access(
                config.remoting_brokers, config.remoting_admins, config.remoting_clients,
                curve=self.security is not None, clients_listed=config.clients == "listed")
            service = RemotingService(
                self.service, **access, properties=config.properties(),
                order_message_enable=config.order_message_enable,
            )
            listener = RemotingListener(
                endpoint, service, now=self._now(), descriptors=self.descriptors,
                max_frame_bytes=config.max_message_bytes,
                max_connections=config.remoting_max_connections,
            )
        except (OSError, ValueError) as exc:
            raise EndpointError(f"--remoting {config.remoting}: {exc}") from exc
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

    def _subscriptions_freed(self, cost: int) -> None:
        # Freed trie nodes stay in glibc's heap; a large release is worth a trim.
        if cost >= FREED_TRIM_BYTES:
            self.heap.published(TRIM_AFTER_EVENTS)

    def _run_timers(self, now: int) -> None:
        work = self.timers.on_timer(now, round(self._wall_clock() * 1000))
        # Publish first: a failing peer action must not swallow expiry events.
        if work.events:
            self._publish(work.events)
        assert self.peers is not None  # None only while __init__ runs
        for link, actions in work.peer_actions:
            _guarded("acting for a peer link", self.peers.carry_out, link, actions, now)

    def _reload(self) -> None:
        if self.security is not None:
            self.security.reload()  # checked at new handshakes; connections stay up
        else:
            log.info("SIGHUP: CURVE is off, no keys to reload")

    def _serve_slice(self, now: int) -> None:
        """Answer waiting requests for at most SLICE_MS, then give the timers their turn.

        Frame by frame with `copy=False`: `recv_multipart` asks the socket for
        RCVMORE after every frame, which costs more than the whole request
        handling; `Frame.more` reads it from the message. The body frame also
        carries the ZAP User-Id (the peer's CURVE key) when CURVE is on. The
        clock is read every CLOCK_EVERY requests: reading it costs more than a
        small request.
        """
        router, respond = self.router, self.service.respond
        recv = router.recv
        with_key = self.security is not None
        clock = self._clock
        until = clock() + SLICE_MS / 1000
        max_bytes = self.config.max_message_bytes
        budget = self.reply_budget
        heavy = budget.heavy_bytes
        if self._draining and not self._drain(until):
            return
        served = 0
        while True:
            try:
                frame = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            envelope = []
            # The first frame is the routing id the ROUTER itself prepends: the bounds
            # count what the peer sent (a DEALER's request is just its body).
            size = 0
            while frame.more:  # the rest of a message is there once its first frame is
                envelope.append(frame)
                if len(envelope) > MAX_ENVELOPE_FRAMES + 1 or size > max_bytes:
                    self._drop_oversized(len(envelope) - 1, size)
                    if not self._drain(until):
                        return
                    envelope = []
                    break
                frame = recv(copy=False)
                size += len(frame)
            if size > max_bytes and envelope:
                self._drop_oversized(len(envelope) - 1, size)
                envelope = []
            if envelope:  # a ROUTER always prepends the routing id: else nothing to answer
                response = respond(frame.bytes, now, frame.get("User-Id") if with_key else None)
                reply = response.reply
                if len(reply) >= heavy and not budget.allow(envelope[0].bytes, len(reply), now):
                    reply = self.service.busy_reply(response.request_id)
                try:
                    for part in envelope:
                        _send(router, part, _SNDMORE_DONTWAIT, False)
                    _send(router, reply, _DONTWAIT)
                except zmq.ZMQError as exc:
                    # Vanished peer (EHOSTUNREACH) or one at its high-water mark (EAGAIN):
                    # the loop must never block on one peer.
                    if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN):
                        raise
                    self.dropped_replies += 1
                if response.events:
                    self._publish(response.events)
            served += 1
            if served % CLOCK_EVERY == 0:
                if clock() >= until:
                    return
                now = self._now()

    def _drop_oversized(self, frames: int, size: int) -> None:
        self.dropped_requests += 1
        log.warning("dropped a request unanswered: more than %d envelope frames or %d bytes "
                    "(§1 bounds; at least %d frames, %d bytes)", MAX_ENVELOPE_FRAMES,
                    self.config.max_message_bytes, frames, size)

    def _drain(self, until: float) -> bool:
        """Read and discard the rest of the current message; False if the slice ran out first."""
        recv, clock = self.router.recv, self._clock
        self._draining = True
        count = 0
        while True:
            frame = recv(copy=False)
            if not frame.more:
                self._draining = False
                return True
            count += 1
            if count % 1024 == 0 and clock() >= until:
                return False

    def _publish(self, events: Sequence[Frames]) -> None:
        self.heap.published(len(events))
        send = self.pub.send_multipart
        for frames in events:
            send(frames, zmq.DONTWAIT)

    def _now(self) -> int:
        return int(self._clock() * 1000)

    # --- sockets --------------------------------------------------------

    def _configure_sockets(self) -> None:
        router, pub = self.router, self.pub
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        router.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        router.setsockopt(zmq.LINGER, 500)
        # No ZMTP heartbeat (HEARTBEAT_IVL) on any server socket: in libzmq 4.3.5 a peer
        # that resets while its inbound queue is full leaves an engine that the heartbeat
        # timer then writes to, and libzmq aborts the process (tests/test_peer_resets.py).
        # The kernel closes dead connections instead: TCP_MAXRT a peer that reads nothing
        # (its unacknowledged data), keepalive one whose host vanished while idle.
        router.setsockopt(zmq.TCP_MAXRT, TCP_TIMEOUT_MS)
        set_keepalive(router)
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
        try:
            listener = self.descriptors.bind(sock, endpoint, on_event, events)
        except (zmq.ZMQError, OSError, ValueError) as exc:
            raise EndpointError(f"cannot bind {endpoint}: {exc}") from exc
        bound = listener.endpoint
        if sock is self.pub:
            self.subscribers.bound(listener.listening, bound)
        if self.security is None and not is_loopback(bound):
            log.warning(
                "%s is bound to a non-loopback address without CURVE: anyone who can reach "
                "it can register brokers and rewrite routes", bound,
            )
        return bound

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig)
                    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        signal.signal(signal.SIGHUP, lambda *_: self.reload_keys())
        old_fd = signal.set_wakeup_fd(self._waker.fileno())

        def restore() -> None:
            signal.set_wakeup_fd(old_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


def is_loopback(endpoint: str) -> bool:
    """True for inproc/ipc and tcp endpoints on 127.0.0.0/8, ::1 or localhost."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp":
        return True
    host = (parts.hostname or "").strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _guarded(what: str, step: Callable[..., object], *args: object) -> None:
    """Run one step of the loop; a bug in it is logged with its traceback, and the loop goes on.

    `NameService.respond` is the boundary for requests; this is the same boundary
    for everything else the loop does (peer links, timers, key reloads, sockets).
    """
    try:
        step(*args)
    except Exception:
        log.exception("bug while %s; the server carries on", what)


def _cpu_ms() -> int:
    """CPU time of this thread: what the loop spent running (a stopped process spends none)."""
    return int(time.thread_time() * 1000)

"""An events relay: one NameServer's events to many subscribers, XSUB -> XPUB.

Many subscribers cost the NameServer one connection and one copy of each event
per subscriber; a relay takes that fan-out elsewhere. Events and `hb` come down
byte for byte; subscriptions travel upstream. It keeps no route state, so a
relay that restarts is, to a client, a silence like any other: `hb` stops, or
events come with a `prev` gap, and the client pulls again (§7).

What its subscribers can make it hold, and send upstream, is bounded as on the
NameServer's own events port (`zns.drivers.subscribers`, the same code): each
subscriber's subscriptions are counted and the costliest cut
(`SubscriptionBudget`), and subscribers that read nothing hold
`--pub-max-queued-bytes`'s default together (`QueuedEvents`). What goes
upstream is decided by `zns.core.subscriptions.Forwarding`: each distinct
channel once, within half the NameServer's per-connection budget, then the
channel's family instead, so the NameServer never cuts the relay for its
subscribers' sake. Should the NameServer cut it anyway, the relay waits
(`Backoff`: 0.05-0.1 s, doubling up to 5-10 s, reset once an event comes)
before it connects and subscribes again.

The upstream is given as the NameServer's REQUEST endpoint: its events endpoint
is learnt from `status`, a wildcard host replaced by the request host, as
clients do.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq

from zns.core.addresses import resolve_pub_endpoint
from zns.core.backoff import Backoff
from zns.core.schema import Status
from zns.core.subscriptions import (
    DEFAULT_QUEUED_EVENT_BYTES,
    Forwarding,
    QueuedEvents,
    SubscriptionBudget,
)
from zns.drivers.descriptors import Listener, monitor_events
from zns.drivers.io_errors import configured
from zns.drivers.requests import call_any
from zns.drivers.server import DEFAULT_PUB_HWM, MAX_SUBSCRIPTION_BYTES, SUBSCRIBE_COMMAND_BYTES
from zns.drivers.sockets import parse_addresses
from zns.drivers.subscribers import MONITORED, Subscribers

log = logging.getLogger("zns.relay")

# Events forwarded per turn before the subscriptions and the monitors get theirs.
EVENTS_PER_TURN = 1000


class Relay:
    """Relays the events of the NameServer at `upstream` to subscribers connecting to `bind`.

    Asks `status` (raises NameServerUnavailable when nobody answers within
    `timeout`), binds, and forwards in a thread of its own until `close()`.
    """

    def __init__(self, upstream: str, bind: str, *, timeout: float = 3.0,
                 hwm: int = DEFAULT_PUB_HWM, context: zmq.Context | None = None,
                 forwarding: Forwarding | None = None,
                 max_queued_bytes: int = DEFAULT_QUEUED_EVENT_BYTES) -> None:
        self._ctx = ctx = context or zmq.Context.instance()
        [self.upstream] = parse_addresses(upstream)[:1]
        endpoint, reply = call_any([self.upstream], Status(), timeout)
        self.upstream_pub = resolve_pub_endpoint(reply.pub_endpoint, endpoint)
        self._hwm = hwm
        self.forwarding = forwarding or Forwarding()
        self.upstream_cuts = 0  # times the NameServer closed the relay's connection
        self._backoff = Backoff(base=0.1, cap=10.0)
        self._xsub: zmq.Socket | None = None
        self._xsub_monitor: zmq.Socket | None = None
        self._xpub = ctx.socket(zmq.XPUB)
        self._control = ctx.socket(zmq.PAIR)
        self._steer = ctx.socket(zmq.PAIR)
        self._listener: Listener | None = None
        for sock in (self._xpub, self._control, self._steer):
            sock.setsockopt(zmq.LINGER, 0)
        try:
            # The same bounds the NameServer's PUB keeps: a subscriber that is behind
            # loses events at the mark (and repairs by pulling), the relay never grows.
            self._xpub.setsockopt(zmq.SNDHWM, hwm)
            self._xpub.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION_BYTES + SUBSCRIBE_COMMAND_BYTES)
            self.subscribers = Subscribers(self._xpub, SubscriptionBudget(),
                                           queued=QueuedEvents(max_queued_bytes, hwm=hwm),
                                           passed=self._passed)
            with configured(f"cannot bind {bind}: "):
                self._listener = Listener(self._xpub, bind, events=MONITORED)
            self.endpoint = self._listener.endpoint
            self.subscribers.bound(self._listener.listening, self.endpoint)
            self._connect_upstream()
            control = f"inproc://zns-relay-{id(self)}"
            self._control.bind(control)
            self._steer.connect(control)
        except BaseException:
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._run, name="zns-relay", daemon=True)
        self._thread.start()
        log.info("zns relay: events of %s (NameServer %s) relayed on %s", self.upstream_pub,
                 self.upstream, self.endpoint)

    # --- the relay's thread ----------------------------------------------

    def _run(self) -> None:
        reconnect_at: float | None = None
        try:
            while True:
                poller = zmq.Poller()
                for sock in (self._control, self._xpub, self._xsub, self._xsub_monitor,
                             self._listener.monitor if self._listener else None):
                    if sock is not None:
                        poller.register(sock, zmq.POLLIN)
                wait = None if reconnect_at is None else max(0, reconnect_at - time.monotonic())
                ready = dict(poller.poll(None if wait is None else int(wait * 1000) + 1))
                if self._control in ready:
                    return  # TERMINATE
                if self._xsub is not None and self._xsub in ready:
                    self._forward_events(self._xsub)
                # Accepts first: a connection's subscriptions come after its accept, and
                # an accept read after them would forget them (the number may be reused).
                if self._listener is not None and self._listener.monitor in ready:
                    self._on_subscriber_monitor(self._listener.monitor)
                if self._xpub in ready:
                    self.subscribers.handle()
                if self._xsub_monitor is not None and self._xsub_monitor in ready:
                    if self._upstream_closed(self._xsub_monitor):
                        delay = self._backoff.next_delay()
                        log.warning("zns relay: the NameServer closed the events connection "
                                    "(%d times since start); subscribing again in %.1f s",
                                    self.upstream_cuts + 1, delay)
                        self.upstream_cuts += 1
                        self._close_upstream()
                        reconnect_at = time.monotonic() + delay
                if reconnect_at is not None and time.monotonic() >= reconnect_at:
                    reconnect_at = None
                    self._connect_upstream()
        except zmq.ContextTerminated:
            pass
        finally:
            self._close_upstream()
            if self._listener is not None:
                self._listener.close()
            for sock in (self._xpub, self._control):
                sock.close(0)

    def _forward_events(self, xsub: zmq.Socket) -> None:
        send, sent = self._xpub.send_multipart, self.subscribers.sent
        for _ in range(EVENTS_PER_TURN):
            try:
                frames = xsub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._backoff.reset()  # the upstream delivers: a later cut starts afresh
            send(frames, copy=False)
            sent(sum(len(frame) for frame in frames))

    def _passed(self, peer: int, message: bytes) -> None:
        """A subscriber's (un)subscription, counted: what it changes upstream is sent."""
        channel = message[1:]
        if message[0] == 1:
            self._send_upstream(self.forwarding.subscribed(peer, channel))
        else:
            self._send_upstream(self.forwarding.unsubscribed(peer, channel))

    def _on_subscriber_monitor(self, monitor: zmq.Socket) -> None:
        for event in monitor_events(monitor):
            fd = int(event["value"])
            self.subscribers.on_monitor_event(event["event"], fd)
            # Only a close forgets a subscriber's channels: its accept may be reported after
            # its first subscriptions, and must not unsubscribe them upstream.
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._send_upstream(self.forwarding.closed(fd))

    def _send_upstream(self, messages: list[bytes]) -> None:
        if self._xsub is None:
            return  # sent with everything else on reconnecting (`Forwarding.resubscribe`)
        for message in messages:
            self._xsub.send(message)

    def _upstream_closed(self, monitor: zmq.Socket) -> bool:
        # Every waiting event is read, whichever says so: the monitor is drained.
        events = [event["event"] for event in monitor_events(monitor)]
        return zmq.EVENT_DISCONNECTED in events

    def _connect_upstream(self) -> None:
        xsub = self._ctx.socket(zmq.XSUB)
        xsub.setsockopt(zmq.LINGER, 0)
        xsub.setsockopt(zmq.RCVHWM, self._hwm)
        self._xsub_monitor = xsub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        xsub.connect(self.upstream_pub)
        self._xsub = xsub
        self._send_upstream(self.forwarding.resubscribe())

    def _close_upstream(self) -> None:
        if self._xsub is not None:
            try:
                self._xsub.disable_monitor()
            except zmq.ZMQError:
                pass
            self._xsub.close(0)
            self._xsub = None
        if self._xsub_monitor is not None:
            self._xsub_monitor.close(0)
            self._xsub_monitor = None

    # --- the caller's side -----------------------------------------------

    def close(self) -> None:
        """Stop forwarding and close (subscribers see silence; they re-pull when it lasts)."""
        if self._thread.is_alive():
            self._steer.send(b"TERMINATE")
            self._thread.join(5)
        self._steer.close(0)

    def _close_sockets(self) -> None:
        self._close_upstream()
        if self._listener is not None:
            self._listener.close()
        for sock in (self._xpub, self._control, self._steer):
            sock.close(0)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""An events relay: ZeroMQ's own XSUB/XPUB proxy in front of one NameServer's PUB.

Many subscribers cost the NameServer one connection and one copy of each event
per subscriber; a relay takes that fan-out elsewhere. It is `zmq.proxy`, not a
broker of our own: subscriptions travel upstream (XPUB -> XSUB -> the
NameServer's PUB), events and `hb` come down byte for byte. It keeps no state,
so a relay that restarts is, to a client, a silence like any other: `hb` stops,
or events come with a `prev` gap, and the client pulls again (§7).

The upstream is given as the NameServer's REQUEST endpoint: its events endpoint
is learnt from `status`, a wildcard host replaced by the request host, as
clients do.
"""

from __future__ import annotations

import logging
import threading

import zmq

from zns.core.addresses import resolve_pub_endpoint
from zns.core.schema import Status
from zns.drivers.io_errors import configured
from zns.drivers.requests import call_any
from zns.drivers.server import DEFAULT_PUB_HWM, MAX_SUBSCRIPTION_BYTES, SUBSCRIBE_COMMAND_BYTES
from zns.drivers.sockets import parse_addresses

log = logging.getLogger("zns.relay")


class Relay:
    """Relays the events of the NameServer at `upstream` to subscribers connecting to `bind`.

    Asks `status` (raises NameServerUnavailable when nobody answers within
    `timeout`), binds, and forwards in a thread of its own until `close()`.
    """

    def __init__(self, upstream: str, bind: str, *, timeout: float = 3.0,
                 hwm: int = DEFAULT_PUB_HWM, context: zmq.Context | None = None) -> None:
        ctx = context or zmq.Context.instance()
        [self.upstream] = parse_addresses(upstream)[:1]
        endpoint, reply = call_any([self.upstream], Status(), timeout)
        self.upstream_pub = resolve_pub_endpoint(reply.pub_endpoint, endpoint)
        self._xsub = ctx.socket(zmq.XSUB)
        self._xpub = ctx.socket(zmq.XPUB)
        self._control = ctx.socket(zmq.PAIR)
        self._steer = ctx.socket(zmq.PAIR)
        for sock in (self._xsub, self._xpub, self._control, self._steer):
            sock.setsockopt(zmq.LINGER, 0)
        try:
            # The same bounds the NameServer's PUB keeps: a subscriber that is behind
            # loses events at the mark (and repairs by pulling), the relay never grows.
            self._xpub.setsockopt(zmq.SNDHWM, hwm)
            self._xpub.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION_BYTES + SUBSCRIBE_COMMAND_BYTES)
            self._xsub.setsockopt(zmq.RCVHWM, hwm)
            self._xsub.connect(self.upstream_pub)
            with configured(f"cannot bind {bind}: "):
                self._xpub.bind(bind)
            self.endpoint = self._xpub.getsockopt_string(zmq.LAST_ENDPOINT)
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

    def _run(self) -> None:
        try:
            zmq.proxy_steerable(self._xsub, self._xpub, None, self._control)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in (self._xsub, self._xpub, self._control):
                sock.close(0)

    def close(self) -> None:
        """Stop forwarding and close (subscribers see silence; they re-pull when it lasts)."""
        if self._thread.is_alive():
            self._steer.send(b"TERMINATE")
            self._thread.join(5)
        self._steer.close(0)

    def _close_sockets(self) -> None:
        for sock in (self._xsub, self._xpub, self._control, self._steer):
            sock.close(0)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The ZNS/1 request socket's monitor events into zns.core.handshakes' warnings."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

import zmq

from zns.core.addresses import url_host
from zns.core.handshakes import HandshakeWatch

log = logging.getLogger("zns")

HANDSHAKE_EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)

_PROTOCOL_KINDS: dict[int, str] = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): "mechanism",
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): "cryptographic",
}


class HandshakeLog:
    """`on_event(event, value)` for DescriptorGuard.bind: logs what the watch warns of."""

    def __init__(self, watch: HandshakeWatch, clock: Callable[[], int]) -> None:
        self.watch = watch
        self._clock = clock

    def on_event(self, event: int, value: int) -> None:
        warning = None
        if event == zmq.EVENT_ACCEPTED:
            self.watch.accepted(value, _peer(value))
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.watch.succeeded()
        elif event == zmq.EVENT_DISCONNECTED:
            warning = self.watch.disconnected(self._clock(), value)
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            warning = self.watch.failed(self._clock(), "auth")
        elif event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            warning = self.watch.failed(self._clock(), _PROTOCOL_KINDS.get(value, "other"))
        if warning:  # each source's text is its own template: the repeat filter folds per source
            log.warning(warning)


def _peer(fd: int) -> str | None:
    """The peer of the connection libzmq accepted on `fd`, if it is still open (the monitor
    reports it after the fact: it may have closed already)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: ours to close
            host, port = sock.getpeername()[:2]
    except OSError:
        return None
    return f"{url_host(host)}:{port}"

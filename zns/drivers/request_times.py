"""Timing what the core answers, for `zns_request_seconds` (zns.core.latency).

Each wrapper stands where the service it wraps stands (the request router and
the remoting listener are handed it instead) and adds two clock reads per
request; everything else is the wrapped object's.
"""

from __future__ import annotations

import time
from typing import Any, cast

from zns.core.latency import LatencyHistogram
from zns.core.remoting.constants import NAMESERVER_REQUEST_CODES, RequestCode
from zns.core.remoting.handler import RemotingService
from zns.core.service import NameService

_CODE_NAMES = {int(code): code.name for code in RequestCode if int(code) in NAMESERVER_REQUEST_CODES}


class TimedService:
    """A NameService whose `respond` (ZNS/1) is timed, by op."""

    def __init__(self, service: Any, times: LatencyHistogram) -> None:
        self._service = service
        self._times = times

    def respond(self, body: bytes, now: int, peer_key: str | None = None,
                peer: Any = None) -> Any:
        started = time.perf_counter()
        response = self._service.respond(body, now, peer_key, peer)
        self._times.observe(f"zns1:{response.op}", time.perf_counter() - started)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)


class TimedRemoting:
    """A RemotingService whose `handle` is timed, by request code's name."""

    def __init__(self, service: Any, times: LatencyHistogram) -> None:
        self._service = service
        self._times = times

    def handle(self, command: Any, conn: Any, now: int) -> Any:
        started = time.perf_counter()
        answer = self._service.handle(command, conn, now)
        self._times.observe(f"remoting:{_CODE_NAMES.get(command.code, 'OTHER')}",
                            time.perf_counter() - started)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)


def timed_service(service: NameService, times: LatencyHistogram) -> NameService:
    """`service`, its ZNS/1 answers timed into `times`."""
    return cast(NameService, TimedService(service, times))


def timed_remoting(service: RemotingService, times: LatencyHistogram) -> RemotingService:
    """`service`, its remoting answers timed into `times`."""
    return cast(RemotingService, TimedRemoting(service, times))

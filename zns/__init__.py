"""zns: a NameServer for message-bus clusters over ZeroMQ (wire contract ZNS/1).

`import zns` is cheap: the clients and the broker agent (which load pyzmq and
start threads or asyncio) are imported on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the driver module that defines it (loaded lazily).
_LAZY = {
    "AsyncRouteClient": "zns.drivers.async_client",
    "BrokerAgent": "zns.drivers.broker_agent",
    "RouteClient": "zns.drivers.route_client",
}

__all__ = ["AsyncRouteClient", "BrokerAgent", "RouteClient", "__version__", "errors"]

if TYPE_CHECKING:
    from zns import errors
    from zns.drivers.async_client import AsyncRouteClient
    from zns.drivers.broker_agent import BrokerAgent
    from zns.drivers.route_client import RouteClient


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name == "errors":
        value = importlib.import_module("zns.errors")
    else:
        raise AttributeError(f"module 'zns' has no attribute {name!r}")
    globals()[name] = value
    return value

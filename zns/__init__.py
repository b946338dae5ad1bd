"""zns: a NameServer for message-bus clusters over ZeroMQ (wire contract ZNS/1)."""

__version__ = "0.1.0"

# After __version__: these modules import it.
from zns.async_client import AsyncRouteClient  # noqa: E402
from zns.broker import BrokerAgent  # noqa: E402
from zns.client import RouteClient  # noqa: E402

__all__ = ["AsyncRouteClient", "BrokerAgent", "RouteClient", "__version__"]

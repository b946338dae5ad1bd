"""zns: a NameServer for message-bus clusters over ZeroMQ (wire contract ZNS/1)."""

__version__ = "0.1.0"

"""Who may do what under CURVE (§9): the key policy, as a pure decision.

The driver (`zns.drivers.security`) reads certificate directories into a
`KeyPolicy` and runs ZAP; `NameService` asks `KeyPolicy.check` about each
request before anything is applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from zns.core.errors import NoPermission
from zns.core.schema import (
    ADMIN_OPS, BROKER_OPS, AddWritePerm, AnyRequest, Heartbeat, RegisterBroker, RegisterTopic,
    UnregisterBroker, WipeWritePerm, request_op,
)

BROKER_NAMES = "broker_names"  # certificate metadata binding a broker key to names


@dataclass(frozen=True)
class KeyPolicy:
    """Who may connect and what each key may do (§9)."""

    brokers: dict[str, frozenset[str] | None]  # key -> broker names it is bound to (None: any)
    admins: frozenset[str]
    clients: frozenset[str]
    clients_any: bool

    def accepts(self, key: str) -> bool:
        """The handshake decision: an unknown key gets nothing at all."""
        return self.clients_any or key in self.brokers or key in self.admins or key in self.clients

    def check(self, key: str | None, request: AnyRequest) -> None:
        """Raise NoPermission unless `key` may send `request`."""
        op = request_op(request)
        if key is None:
            raise NoPermission(f"{op} needs an authenticated CURVE key")
        if op in BROKER_OPS:
            if key not in self.brokers:
                raise NoPermission(f"{op} is a broker op and this key is not a broker key")
            names = self.brokers[key]
            broker_ops = (RegisterBroker, Heartbeat, UnregisterBroker)  # what BROKER_OPS name
            if (names is not None and isinstance(request, broker_ops)
                    and request.broker_name not in names):
                raise NoPermission(
                    f"this broker key may act only for {', '.join(sorted(names))}, "
                    f"not {request.broker_name!r}"
                )
        elif op in ADMIN_OPS:
            if key not in self.admins:
                raise NoPermission(f"{op} is an admin op and this key is not an admin key")
        elif not self.accepts(key):  # a key removed by a reload, on a connection made before
            raise NoPermission(f"{op}: this key is no longer listed")

    @cached_property
    def bound_names(self) -> frozenset[str]:
        """Every broker name some broker key is bound to."""
        return frozenset(name for names in self.brokers.values() if names for name in names)

    def check_keyless(self, request: AnyRequest) -> None:
        """Raise NoPermission when `request`, which came with no key at all (a RocketMQ
        remoting connection), changes a broker name bound to a key: such a name changes
        only through its key, whatever network the request came from."""
        bound = sorted(broker_names_written(request) & self.bound_names)
        if bound:
            raise NoPermission(
                f"{request_op(request)} for {bound[0]!r} without a CURVE key: that broker "
                f"name is bound to a broker key and changes only through it")


def broker_names_written(request: AnyRequest) -> frozenset[str]:
    """The broker names whose registration, routes or permissions `request` changes."""
    if isinstance(request, (RegisterBroker, Heartbeat, UnregisterBroker, WipeWritePerm,
                            AddWritePerm)):
        return frozenset((request.broker_name,))
    if isinstance(request, RegisterTopic):
        return frozenset(queue.broker_name for queue in request.queues)
    return frozenset()

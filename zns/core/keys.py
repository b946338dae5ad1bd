"""Who may do what under CURVE (§9): the key policy, as a pure decision.

The driver (`zns.drivers.security`) reads certificate directories into a
`KeyPolicy` and runs ZAP; `NameService` asks `KeyPolicy.check` about each
request before anything is applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from zns.core.errors import NoPermission
from zns.core.schema import (
    ADMIN_OPS, BROKER_OPS, AnyRequest, Heartbeat, RegisterBroker, UnregisterBroker, request_op,
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

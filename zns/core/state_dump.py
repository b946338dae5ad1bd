"""The state machine's whole state as plain values: what `StateMachine.dump` writes and
`StateMachine.load` reads (zns.core.state).

Exact, for a replica: everything the state machine decides from, so that a machine
loaded from a dump answers every later command as the dumped one does -- the same
replies, events, revisions and dumps. The route table's records are the one encoding
of them a warm restart's dump holds too (zns.core.table_state: each list in the order
the table holds it, the queue data interned); a replica's dump adds what a restart
drops: the epoch, the revisions and each address's times. Times are the monotonic
milliseconds of the process that dumped: a dump is loaded by a replica of the same
run, on the same clock.

A state transfer encodes its long lists a step at a time (`EncodedList`), so that
no one step of the state process's loop encodes the whole dump.

Sans-I/O; array-like structs, so a dump is small.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from zns.core.table_state import TableState


class AddressClock(Struct, array_like=True, frozen=True):
    """One address's times: zns.core.liveness.Liveness's, without its heap entry."""

    last_heartbeat: int
    suspect_deadline: int | None
    stall_credit: int
    confirm_by: int | None  # restored by a warm restart and not heard since (zns.core.warm)


class TableDump(Struct, array_like=True, frozen=True):
    """The route table (zns.core.routes.RouteTable) exactly: its records as a warm dump
    holds them, and what a replica needs besides."""

    state: TableState
    epoch: str
    revision: int
    clocks: list[AddressClock]  # one for each of state.addresses, in that order
    topic_revisions: list[tuple[str, int]]  # topics with a route: their last change
    removed_revisions: list[tuple[str, int]]  # recently removed topics, oldest first


class StateDump(Struct, array_like=True, frozen=True):
    """The state machine: the route table, the remoting ties, the KV entries and the
    namespaces a remoting delete emptied."""

    table: TableDump
    ties: list[tuple[int, str, str, str]]  # (connection, cluster, address, name), as tied
    kv: list[tuple[str, list[tuple[str, str]]]]  # namespace -> its entries, as stored
    emptied: list[str]  # oldest first


_encoder = msgspec.msgpack.Encoder()


def array_header(length: int) -> bytes:
    """The MessagePack header of an array of `length` items, as msgspec writes it (the
    shortest form)."""
    if length < 16:
        return bytes((0x90 | length,))
    if length < 1 << 16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


class EncodedList:
    """A list encoded a few items at a time: `raw()`, placed where the list goes in a
    struct, makes msgspec write the same bytes as for the list itself."""

    def __init__(self) -> None:
        self._items = bytearray()  # the items' encodings, in order
        self._count = 0

    def extend(self, items: list[Any]) -> None:
        if items:
            encoded = _encoder.encode(items)
            self._items += memoryview(encoded)[len(array_header(len(items))):]
            self._count += len(items)

    def raw(self) -> Any:  # a msgspec.Raw, in place of the list (msgspec writes it as it is)
        return msgspec.Raw(array_header(self._count) + self._items)

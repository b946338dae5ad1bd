"""What the core needs of the KV store (§6): a small interface, no file in sight.

The durable implementation is `zns.drivers.kv_file.KvStore`; `NameService`
and `Limits` only see this protocol, so they can be driven by an in-memory
store in tests and never touch a file themselves.
"""

from __future__ import annotations

from typing import Protocol


def entry_bytes(namespace: str, key: str, value: str) -> int:
    """What one entry counts against `Limits.max_kv_bytes`: its UTF-8 bytes."""
    return len(namespace.encode()) + len(key.encode()) + len(value.encode())


class KvBackend(Protocol):
    def get(self, namespace: str, key: str) -> str | None:
        """The value, or None."""

    def list(self, namespace: str) -> dict[str, str]:
        """A copy of the namespace's entries ({} when none)."""

    def namespaces(self) -> tuple[str, ...]:
        """The namespaces holding entries, in the order they were created."""

    def count(self, namespace: str | None = None) -> int:
        """Entries in `namespace`, or with None the number of namespaces."""

    def total_bytes(self) -> int:
        """The sum of `entry_bytes` over every entry held."""

    def put(self, namespace: str, key: str, value: str) -> bool:
        """Store durably before returning; False when the value was already there.

        Raises `Internal` (the file system's error chained) when the write cannot be made
        durable, and then changes nothing.
        """

    def delete(self, namespace: str, key: str) -> bool:
        """Remove durably before returning; False when there was nothing to remove.

        Raises `Internal` (the file system's error chained) when the removal cannot be made
        durable, and then changes nothing.
        """

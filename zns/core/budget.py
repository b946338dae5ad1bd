"""How many bytes of large replies a peer may be sent: a bound on what a peer that never reads holds.

libzmq queues a reply for its peer whether or not the peer reads; its
high-water mark counts messages, not bytes, so 200 `snapshot` replies of
10 MB each sit in memory for a peer that asks and never reads. The server
therefore meters large replies (at least `heavy_bytes`) with two token
buckets — one per peer (routing id), one for all peers together — that
refill at a steady rate up to a burst. A large reply that finds its bucket
short is replaced by a small `busy` error. Small replies are bounded by the
socket's high-water mark instead (messages × `heavy_bytes`).

With the TCP retransmission timeout the server sets on its request socket (a
peer that reads nothing for that long is disconnected, and its queue freed),
what one peer that never reads can make the server hold is at most

    burst + rate × timeout   of large replies, plus   hwm × heavy_bytes   of small ones,

and all peers together at most `total_burst + total_rate × timeout` of large
replies. Times are integer milliseconds, as everywhere in the core.
"""

from __future__ import annotations

from dataclasses import dataclass

HEAVY_BYTES = 64 << 10


@dataclass
class _Bucket:
    tokens: float
    at: int


class ReplyBudget:
    def __init__(
        self,
        *,
        burst: int = 64 << 20,
        rate: int = 16 << 20,
        total_burst: int = 256 << 20,
        total_rate: int = 64 << 20,
        heavy_bytes: int = HEAVY_BYTES,
        max_peers: int = 100_000,
    ) -> None:
        """`rate` and `total_rate` in bytes per second; `burst`s in bytes."""
        self.burst, self.rate = burst, rate
        self.heavy_bytes = heavy_bytes
        self.max_peers = max_peers
        self._total = _Bucket(float(total_burst), 0)
        self._total_burst, self._total_rate = total_burst, total_rate
        self._peers: dict[bytes, _Bucket] = {}
        self.refused = 0  # large replies replaced by `busy`

    def allow(self, peer: bytes, size: int, now: int) -> bool:
        """May a reply of `size` bytes go to `peer` now? Charges it when it may."""
        if size < self.heavy_bytes:
            return True
        bucket = self._peers.get(peer)
        if bucket is None:
            if len(self._peers) >= self.max_peers:
                self._forget_full(now)
            bucket = self._peers[peer] = _Bucket(float(self.burst), now)
        _refill(bucket, now, self.rate, self.burst)
        _refill(self._total, now, self._total_rate, self._total_burst)
        if bucket.tokens < size or self._total.tokens < size:
            self.refused += 1
            return False
        bucket.tokens -= size
        self._total.tokens -= size
        return True

    def _forget_full(self, now: int) -> None:
        """Drop peers whose bucket has refilled: they owe nothing, a new entry is the same."""
        for peer, bucket in list(self._peers.items()):
            _refill(bucket, now, self.rate, self.burst)
            if bucket.tokens >= self.burst:
                del self._peers[peer]
        if len(self._peers) >= self.max_peers:  # all in debt: forget the oldest
            for peer in list(self._peers)[: len(self._peers) // 2]:
                del self._peers[peer]


def _refill(bucket: _Bucket, now: int, rate: int, burst: int) -> None:
    if now > bucket.at:
        bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * rate / 1000)
        bucket.at = now

"""Benchmark: what one GET_ROUTEINFO_BY_TOPIC of every topic leaves the server holding
(issue 21 item 10), in-process, in each JSON form and in both.

    python -m bench.route_cache [--topics N] [--rounds N]

Registers N topics (default 100,000, in registrations of 20,000 by one broker name
each), then reads every route once over a RemotingService and measures, with
tracemalloc, the memory still held once the reads are done (the replies are freed).
Prints the median of the rounds (min-max) in MiB.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tracemalloc

from zns.core.remoting import RemotingCommand
from zns.core.remoting.handler import Connection, RemotingService
from zns.core.schema import decode_request, encode
from zns.core.service import NameService
from zns.drivers.kv_file import KvStore

PER_REGISTRATION = 20_000
LOCAL = Connection(1, "127.0.0.1")
LEGACY, STANDARD = 317, 479  # request versions: legacy JSON below 4.9.4, standard from it


def loaded_service(topics: int) -> tuple[NameService, RemotingService, list[str]]:
    service = NameService(KvStore(None), epoch="0123456789abcdef", started_at_ms=0)
    names = [f"TopicNumber{i:07d}" for i in range(topics)]
    for start in range(0, topics, PER_REGISTRATION):
        part = names[start:start + PER_REGISTRATION]
        request = decode_request(encode({
            "op": "register_broker", "id": 1, "cluster": "DefaultCluster",
            "broker_name": f"broker-{start // PER_REGISTRATION}", "broker_id": 0,
            "broker_addr": f"10.0.{start // PER_REGISTRATION}.1:10911",
            "topics": {t: {"read_queues": 8, "write_queues": 8} for t in part}}))
        service.execute(request, 0)
    return service, RemotingService(service), names


def held_after_reads(topics: int, versions: tuple[int, ...]) -> float:
    """MiB held after one read of every topic in each of `versions`' forms."""
    service, remoting, names = loaded_service(topics)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for version in versions:
        for topic in names:
            reply, _ = remoting.handle(
                RemotingCommand(code=105, version=version, ext_fields={"topic": topic}), LOCAL, 0)
            assert reply is not None and reply.code == 0
            del reply
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for label, versions in (("legacy form only", (LEGACY,)), ("standard form only", (STANDARD,)),
                            ("both forms", (LEGACY, STANDARD))):
        values = [held_after_reads(args.topics, versions) for _ in range(args.rounds)]
        print(f"{args.topics:,} topics, one read each, {label}: held "
              f"{statistics.median(values):.1f} MiB ({min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()

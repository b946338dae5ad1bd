"""What a new worker's state transfer costs the state process's loop, at 1,000 brokers and
10,000 topics (issue 30; docs/operations.md, *Workers*).

In process: the state process's side (`PrimaryLink`) and a worker's side (`ReplicaLink`)
over one socketpair, run in turn in this thread. Only the state process's calls are
timed (CPU time: the machine is shared): the one that admits the worker (it dumps the
state and queues what it sends first), then each pass that reads the worker's
acknowledgements and sends more. Printed: the steps, the largest, their sum, and the
most the channel held queued at the end of a step; and apart, the largest step that ran
no full collection of CPython's garbage collector (one walks the whole heap, about
35 ms at 100,000 topics, in whichever step or request allocates past its threshold:
the process's cost, not the dump's). Not part of `make bench`: a manual
measurement, recorded in docs/operations.md.

    .venv/bin/python -m bench.state_transfer [--rounds 5] [--per-topic 2] [--topics 10000]
"""

from __future__ import annotations

import argparse
import gc
import socket
import statistics
import time

from bench import warm_state
from zns.core.limits import Limits
from zns.core.replication import Primary, Replica
from zns.core.service import NameService
from zns.drivers.kv_file import KvStore
from zns.drivers.replication_link import PrimaryLink, ReplicaLink


FULL_COLLECTIONS = [0]  # full (generation 2) collections of the garbage collector so far


def _count_full_collections(phase: str, info: dict[str, int]) -> None:
    if phase == "stop" and info["generation"] == 2:
        FULL_COLLECTIONS[0] += 1


def one_transfer(service: NameService) -> tuple[list[float], list[float], int, int]:
    """The state process's steps (ms of CPU) for one worker's transfer, those of them that
    ran no full collection, the most its channel held queued after a step, and the dump's
    size."""
    link = PrimaryLink(Primary(now=0), dump=service.state.dump,
                       execute=lambda worker, request: (None, b""),
                       dump_in_steps=service.state.dump_in_steps)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    loaded: list[int] = []
    replica = ReplicaLink(theirs, Replica(), apply=lambda seq, command: [],
                          load=lambda seq, dump: loaded.append(len(dump)),
                          publish=lambda seq, events: None)
    steps, clean, most = [], [], 0

    def timed(began: float, collections: int) -> None:
        steps.append((time.thread_time() - began) * 1000)
        if FULL_COLLECTIONS[0] == collections:
            clean.append(steps[-1])

    collections, began = FULL_COLLECTIONS[0], time.thread_time()
    worker = link.add(ours, 0)
    link.flush(0)
    timed(began, collections)
    channel = link.channels[worker]
    most = channel.pending
    while not loaded:  # (the loop runs the link again at once while it dumps)
        replica.run()
        collections, began = FULL_COLLECTIONS[0], time.thread_time()
        link.run(0)
        timed(began, collections)
        most = max(most, channel.pending)
    link.close()
    replica.channel.close()
    return steps, clean, most, loaded[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-topic", type=int, default=2, help="brokers holding each topic")
    parser.add_argument("--topics", type=int, default=warm_state.TOPICS)
    args = parser.parse_args()
    warm_state.TOPICS = args.topics
    service = NameService(KvStore(None), epoch="e", started_at_ms=0,
                          limits=Limits(max_topics_per_request=65_536))
    for request in warm_state.registrations(args.per_topic):
        service.execute(request, 1000)
    gc.callbacks.append(_count_full_collections)
    largest, largest_clean, total, held = [], [], [], []
    for _ in range(args.rounds):
        steps, clean, most, size = one_transfer(service)
        largest.append(max(steps))
        largest_clean.append(max(clean))
        total.append(sum(steps))
        held.append(most)
    print(f"dump {size / 1024:.0f} KiB, {len(steps)} steps; largest step median "
          f"{statistics.median(largest):.1f} ms (max {max(largest):.1f}); without a full "
          f"collection median {statistics.median(largest_clean):.1f} ms (max "
          f"{max(largest_clean):.1f}); all steps median {statistics.median(total):.1f} ms; "
          f"most queued in the channel after a step {max(held) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()

"""What the state dump costs at 1,000 brokers and 10,000 topics (issue 30 items 6 and 7;
docs/operations.md, *Restarts keep the routes*).

In process, for two shapes of the table (each topic on 2 brokers, as bench/scale.py
builds it, and on 10): the dump's size; the loop's share of making it (steps of
DUMP_STEP_WORK queue entries: their number, median and largest); the writer thread's
share (encode, write, fsync, rename); and what a start pays to read it back (decode,
check, restore); a worker replica's state transfer of the same table (its size, dump and
load). Then with real processes: `zns serve` holding the 10-broker shape is
killed with SIGKILL and started again on the same files, and the time from the new
process's start to its first `get_route` answer is taken, and its own `restored` line.
Not part of `make bench`: a manual measurement, recorded in bench/results.md.

    .venv/bin/python -m bench.warm_state [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from zns.core import schema, warm
from zns.core.schema import DataVersion, RegisterBroker, TopicConfig
from zns.core.service import NameService
from zns.core.state import StateMachine
from zns.drivers import state_file
from zns.drivers.kv_file import KvStore

BROKERS, TOPICS = 1_000, 10_000


def registrations(per_topic: int) -> list[RegisterBroker]:
    hosted: list[dict[str, TopicConfig]] = [{} for _ in range(BROKERS)]
    for i in range(TOPICS):
        for k in range(per_topic):
            hosted[(i + k) % BROKERS][f"S{i}"] = TopicConfig(8, 8, 6, 0)
    return [RegisterBroker(id=1, cluster=f"c{b % 10}", broker_name=f"broker-{b}", broker_id=0,
                           broker_addr=f"10.0.{b // 250}.{b % 250}:10911", topics=hosted[b],
                           data_version=DataVersion(1, 2, 3)) for b in range(BROKERS)]


def in_process(per_topic: int, rounds: int, tmp: Path) -> None:
    service = NameService(KvStore(None), epoch="e", started_at_ms=0)
    for req in registrations(per_topic):
        service.execute(req, 1000)
    steps: list[float] = []
    loop_ms, thread_ms, start_ms, size = [], [], [], 0
    for _ in range(rounds):
        began = time.thread_time()  # CPU time: the machine is shared, wall time shows its load
        for state in service.table.dump_in_steps():
            now = time.thread_time()
            steps.append((now - began) * 1000)
            began = now
        assert state is not None
        dump = warm.dump(service, 0, state)
        loop_ms.append(sum(steps[-(len(steps) // rounds or 1):]))
        began = time.perf_counter()
        data = warm.encode_dump(dump)
        state_file.write_file(tmp / "state.dump", data)
        thread_ms.append((time.perf_counter() - began) * 1000)
        size = len(data)
        began = time.perf_counter()
        fresh = NameService(KvStore(None), epoch="f", started_at_ms=0)
        warm.restore(fresh, state_file.load(tmp / "state.dump"), 0)
        start_ms.append((time.perf_counter() - began) * 1000)
    per_round = len(steps) // rounds
    print(f"| {per_topic} brokers a topic ({per_topic * TOPICS:,} queue entries) | "
          f"{size / 1024:,.0f} KiB | {per_round} steps of CPU median {statistics.median(steps):.2f} ms, "
          f"largest {max(steps):.2f} ms; {statistics.median(loop_ms):.1f} ms in all | "
          f"{statistics.median(thread_ms):.1f} ms | {statistics.median(start_ms):.0f} ms |")


def replica(per_topic: int, rounds: int) -> None:
    """A worker replica's state transfer of the same table (zns.core.state_dump): its size,
    and the CPU time of `StateMachine.dump` and `StateMachine.load`."""
    service = NameService(KvStore(None), epoch="e", started_at_ms=0)
    for req in registrations(per_topic):
        service.execute(req, 1000)
    dump_ms, load_ms, data = [], [], b""
    for _ in range(rounds):
        began = time.thread_time()
        data = service.state.dump()
        dumped = time.thread_time()
        StateMachine.load(data, KvStore(None))
        dump_ms.append((dumped - began) * 1000)
        load_ms.append((time.thread_time() - dumped) * 1000)
    print(f"| {per_topic} brokers a topic | {len(data) / 1024:,.0f} KiB | "
          f"{statistics.median(dump_ms):.1f} ms | {statistics.median(load_ms):.0f} ms |")


def restart(rounds: int, tmp: Path) -> None:
    from zns.drivers.request_router import TCP_TIMEOUT_MS  # noqa: F401  (loads the server side)

    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    ctx = zmq.Context()
    router = f"ipc://{tmp}/r"
    args = [sys.executable, "-m", "zns", "serve", "--router", router, "--pub", f"ipc://{tmp}/p",
            "--kv-path", str(tmp / "kv.log"), "--workers", "0"]  # ipc://: one process

    def ask(op: str, **fields: object) -> object:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(router)
        try:
            dealer.send(schema.encode({"op": op, "id": 1, **fields}))
            while not dealer.poll(50):
                pass
            return schema.decode_reply(dealer.recv())
        finally:
            dealer.close()

    log = open(tmp / "serve.log", "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    for req in registrations(10):
        ask("register_broker", **{f: getattr(req, f) for f in req.__struct_fields__ if f != "id"})
    while not state_file.load(tmp / "state.dump") or len(
            state_file.load(tmp / "state.dump").table.brokers) < BROKERS:
        time.sleep(0.1)
    answers, cold = [], []
    for _ in range(rounds):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        began = time.monotonic()
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        reply = ask("get_route", topic="S1")
        answers.append(time.monotonic() - began)
        assert isinstance(reply, schema.GetRouteReply), reply
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    os.unlink(tmp / "state.dump")
    for _ in range(rounds):
        began = time.monotonic()
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        ask("status")
        cold.append(time.monotonic() - began)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    log.close()
    restored = [line for line in (tmp / "serve.log").read_text().splitlines() if "restored" in line]
    print(f"\nSIGKILL, then a new `zns serve` on the same files ({rounds} runs): its first "
          f"get_route answered {min(answers):.2f}-{max(answers):.2f} s "
          f"(median {statistics.median(answers):.2f} s) after the exec; with no dump its first "
          f"`status` {min(cold):.2f}-{max(cold):.2f} s (median {statistics.median(cold):.2f} s)."
          f"\n{restored[-1] if restored else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zns-warm-"))
    print(f"| {BROKERS:,} brokers, {TOPICS:,} topics | dump | the loop's steps | "
          "the writer thread | read at start |")
    print("|---|---|---|---|---|")
    for per_topic in (2, 10):
        in_process(per_topic, args.rounds, tmp)
    print("\n| a replica's state transfer | dump | StateMachine.dump (CPU) | .load (CPU) |")
    print("|---|---|---|---|")
    for per_topic in (2, 10):
        replica(per_topic, args.rounds)
    (tmp / "restart").mkdir()
    restart(args.rounds, tmp / "restart")


if __name__ == "__main__":
    main()

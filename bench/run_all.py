"""Run every benchmark, print the table, write bench/results.md and bench/results.json.

    python -m bench.run_all [--quick] [--rounds N] [--out DIR] [NAME ...]
"""

from __future__ import annotations

from bench import (
    agent, expiry, flood, kv, memory, ops, partition, push_latency, registration, remoting,
    remoting_load, replication, scale, throughput,
)
from bench.report import BENCH_DIR, BenchFn, cli

BENCHMARKS: dict[str, BenchFn] = {
    "throughput": throughput.run,
    "registration": registration.run,
    "push_latency": push_latency.run,
    "expiry": expiry.run,
    "scale": scale.run,
    "kv": kv.run,
    "partition": partition.run,
    "flood": flood.run,
    "ops": ops.run,
    "remoting": remoting.run,
    "remoting_load": remoting_load.run,
    "replication": replication.run,
    "memory": memory.run,
    "agent": agent.run,
}

if __name__ == "__main__":
    raise SystemExit(cli(BENCHMARKS, default_out=BENCH_DIR))

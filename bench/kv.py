"""Benchmark 6: KV put latency with a small and a large store, and what a reader waits meanwhile.

    python -m bench.kv [--quick] [--rounds N] [--out DIR]
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import zmq

from bench.harness import (
    REPLY_TIMEOUT_S, BenchError, Session, broker_addr, percentile, register_request, request,
    start_zns,
)
from bench.report import BenchResult, Figure, RunConfig, cli

TOPIC = "KvBenchTopic"
VALUE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Params:
    stores: tuple[int, ...]  # values of VALUE_BYTES already held
    puts: tuple[int, ...]  # puts measured with each store size


# 2,500 puts over 2,000 values: the log passes twice the live size, so a whole compaction
# (start, every step, the rename) happens inside the measured window.
FULL = Params(stores=(10, 2000), puts=(500, 2500))
QUICK = Params(stores=(5, 40), puts=(20, 60))

METHOD = """
Before the server starts, its KV file is written holding N values of {kib} KiB
(namespace `bench`, keys `k0`..), in the JSON format every version reads. A
sender then overwrites those keys in turn with new {kib} KiB values, one
`kv_put` at a time, and times each round trip (the reply comes after the fsync).
Meanwhile a reader process keeps one `get_route` in flight without pause;
its worst round trip is how long a reader waited behind KV writes. With N =
2,000 the sender makes more puts than there are values, so the log grows past
twice the live size and a compaction runs inside the window. The server runs
with `--max-kv-bytes` raised to hold the store.
"""


def run(config: RunConfig) -> BenchResult:
    p = QUICK if config.quick else FULL
    figures = []
    for n, puts in zip(p.stores, p.puts):
        put_rounds: dict[str, list[float]] = {"p50": [], "p99": [], "max": []}
        wait_rounds: list[float] = []
        for r in range(config.rounds):
            put_lat, get_lat = _one_round(config, n, puts, r)
            for label, q in (("p50", 50), ("p99", 99), ("max", 100)):
                put_rounds[label].append(percentile(put_lat, q) * 1e3)
            wait_rounds.append(max(get_lat) * 1e3)
        for label, rounds in put_rounds.items():
            figures.append(Figure(f"kv_put {label}, {n} values held", "ms", rounds,
                                  note=f"{puts} puts of {VALUE_BYTES // 1024} KiB"))
        figures.append(Figure(f"get_route worst wait, {n} values held", "ms", wait_rounds,
                              note="one get_route in flight during the puts"))
        config.log(f"{n} values: put p50 {figures[-4].value:.2f} ms, p99 "
                   f"{figures[-3].value:.2f} ms, max {figures[-2].value:.1f} ms; "
                   f"get_route worst {figures[-1].value:.1f} ms")
    method = METHOD.format(kib=VALUE_BYTES // 1024)
    return BenchResult("kv", "KV put latency", method, figures)


def _one_round(config: RunConfig, n: int, puts: int, r: int) -> tuple[list[float], list[float]]:
    workdir = config.workdir / f"kv-{n}-{r}"
    workdir.mkdir(parents=True, exist_ok=True)
    value = "v" * VALUE_BYTES
    store = {"bench": {f"k{i}": value for i in range(n)}}
    (workdir / "kv.json").write_bytes(msgspec.json.encode(store))
    max_bytes = str(4 * n * (VALUE_BYTES + 64) + (1 << 20))
    with start_zns(workdir, "--max-kv-bytes", max_bytes) as zns, Session(zns.router) as session:
        session.pipeline([register_request("broker-0", broker_addr(0), [TOPIC])])
        put_lat: list[float] = []
        failure: list[BaseException] = []

        def sender() -> None:
            try:
                for i in range(puts):
                    body = request("kv_put", namespace="bench", key=f"k{i % n}",
                                   value=f"{i:08}" + value[8:])
                    started = time.monotonic()
                    session.call_raw(body)
                    put_lat.append(time.monotonic() - started)
            except BaseException as exc:  # reported below, in the main thread
                failure.append(exc)

        reader = Reader(zns.router, request("get_route", topic=TOPIC))
        thread = threading.Thread(target=sender)
        thread.start()
        thread.join()
        get_lat = reader.stop()
        if failure:
            raise BenchError(f"a put failed: {failure[0]}")
        if len(put_lat) != puts:
            raise BenchError(f"{len(put_lat)} of {puts} puts answered")
        last = session.call("kv_get", namespace="bench", key=f"k{(puts - 1) % n}")
        if not last.value.startswith(f"{puts - 1:08}"):
            raise BenchError("the last put is not what the server holds")
    return put_lat, get_lat


class Reader:
    """A process that keeps one request in flight until stopped; its round trips."""

    def __init__(self, endpoint: str, body: bytes) -> None:
        mp = multiprocessing.get_context("spawn")
        self._stop = mp.Event()
        self._conn, child = mp.Pipe()
        self._proc = mp.Process(target=_reader_main, args=(endpoint, body, self._stop, child),
                                daemon=True)
        self._proc.start()
        if not self._conn.poll(30) or self._conn.recv() != "ready":
            raise BenchError("the reader process did not start")

    def stop(self) -> list[float]:
        self._stop.set()
        if not self._conn.poll(30):
            raise BenchError("the reader process did not report")
        latencies = self._conn.recv()
        self._proc.join(10)
        if isinstance(latencies, str):
            raise BenchError(latencies)
        return latencies


def _reader_main(endpoint: str, body: bytes, stop: Any, conn: Connection) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(REPLY_TIMEOUT_S * 1000))
    sock.connect(endpoint)
    sock.send(body)
    sock.recv()  # connected and answered once before the window opens
    conn.send("ready")
    latencies = []
    try:
        while not stop.is_set():
            started = time.monotonic()
            sock.send(body)
            sock.recv()
            latencies.append(time.monotonic() - started)
    except zmq.Again:
        conn.send(f"no reply within {REPLY_TIMEOUT_S} s")
        return
    finally:
        sock.close(0)
    conn.send(latencies)


if __name__ == "__main__":
    raise SystemExit(cli({"kv": run}))

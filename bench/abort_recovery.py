"""How soon zns serves again after a peer made libzmq abort it: `zns serve --supervise`
(issue 21 item 1; docs/operations.md, *A peer can abort the server*), or a worker of
`zns serve --workers 1` (issue 30 item 2; docs/operations.md, *Workers*).

One supervised server on fixed loopback ports holds a KV entry. Each run waits past the
supervisor's STABLE_S (so every restart waits its first delay), then aborts the server the
way tests/test_peer_resets.py does (a SUB sending subscriptions each followed by a ZMTP PING,
then a reset), and times the first `status` answer carrying a new epoch, then reads the KV
entry back. Not part of `make bench`: a manual measurement, recorded in bench/results.md.

    .venv/bin/python -m bench.abort_recovery [--runs 5]

With `--workers`: one worker holding 1,000 brokers and 10,000 topics (bench/warm_state.py's
table) is killed `--deaths` times, alternately by SIGKILL and by the same abort (or only
by `--cause`), each
`--gap` seconds after its replacement answered. Each death is the moment the worker's
pidfd turns readable; it is answered again when a new DEALER's `status` is answered
(only one worker: the replacement). p50/p99/max of death -> answer, per cause.

    .venv/bin/python -m bench.abort_recovery --workers [--deaths 40] [--gap 1.5]
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from bench.harness import ask, free_port, request
from zns.core import schema
from zns.drivers.supervisor import STABLE_S

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from test_peer_resets import _reset, _subscribe_pinging  # noqa: E402  (the attack itself)

DIED = "died of SIGABRT"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", action="store_true",
                        help="kill and abort the worker of `zns serve --workers 1` instead")
    parser.add_argument("--deaths", type=int, default=40)
    parser.add_argument("--gap", type=float, default=1.5)
    parser.add_argument("--cause", choices=["both", "SIGKILL", "SIGABRT"], default="both")
    args = parser.parse_args()
    if args.workers:
        workers(args.deaths, args.gap, args.cause)
        return
    tmp = Path(tempfile.mkdtemp(prefix="zns-abort-"))
    router, pub = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    log_path = tmp / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--router", router, "--pub", pub,
             "--kv-path", str(tmp / "kv.log"), "--supervise", "--workers", "0"],
            stdout=log, stderr=subprocess.STDOUT, env=env)

    def status() -> schema.StatusReply:
        while True:
            reply = ask(router, request("status", id=1), 2000)
            if isinstance(reply, schema.StatusReply):
                return reply

    def deaths() -> int:
        return log_path.read_text().count(DIED)

    try:
        epoch = status().epoch
        print(f"first start: serving {time.monotonic() - started:.2f} s after the command")
        put = ask(router, request("kv_put", id=1, namespace="NS", key="k", value="kept"), 2000)
        assert isinstance(put, schema.KvPutReply), put
        back: list[float] = []
        for run in range(args.runs):
            time.sleep(STABLE_S + 1)
            before, tries = deaths(), 0
            while deaths() == before:
                tries += 1
                reset_at = time.monotonic()
                try:
                    _reset(_subscribe_pinging(pub, 1_000, 16, b"R%d-%d" % (run, tries)))
                except OSError:
                    pass
                end = time.monotonic() + 2
                while deaths() == before and time.monotonic() < end:
                    time.sleep(0.01)
            reply = status()
            while reply.epoch == epoch:
                reply = status()
            back.append(time.monotonic() - reset_at)
            epoch = reply.epoch
            kept = ask(router, request("kv_get", id=1, namespace="NS", key="k"), 2000)
            assert isinstance(kept, schema.KvGetReply) and kept.value == "kept", kept
            print(f"run {run + 1}: aborted at try {tries}, serving again (KV kept) "
                  f"{back[-1]:.3f} s after the reset")
        print(f"serving again after the reset: median {statistics.median(back):.3f} s, "
              f"min {min(back):.3f} s, max {max(back):.3f} s over {len(back)} runs")
    finally:
        proc.terminate()
        code = proc.wait(30)
    print(f"supervisor exit {code}; log: {log_path}")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def fill(ctx: zmq.Context, router: str) -> None:
    """bench/warm_state.py's 1,000 brokers and 10,000 topics (each on 2 brokers)."""
    import msgspec

    from bench.warm_state import registrations

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(router)
    try:
        for request in registrations(2):  # not expired during the run: 1 h
            dealer.send(schema.encode(msgspec.structs.replace(
                request, heartbeat_timeout_ms=3_600_000)))
            reply = schema.decode_reply(dealer.recv())
            assert not isinstance(reply, schema.Error), reply
    finally:
        dealer.close()


def workers(deaths: int, gap: float, causes: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="zns-abort-workers-"))
    router, pub = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    log_path = tmp / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--router", router, "--pub", pub,
             "--kv-path", str(tmp / "kv.log"), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    ctx = zmq.Context()

    def worker_pid() -> int:
        return int(re.findall(r"loaded the state at seq \d+ \(pid (\d+)\)",
                              log_path.read_text())[-1])

    back: dict[str, list[float]] = {"SIGKILL": [], "SIGABRT": []}
    try:
        while ask(router, request("status", id=1), 1000) is None:
            pass
        fill(ctx, router)
        print("holding 1,000 brokers and 10,000 topics")
        for death in range(deaths):
            time.sleep(gap)
            pid = worker_pid()
            cause = ("SIGKILL", "SIGABRT")[death % 2] if causes == "both" else causes
            pidfd = os.pidfd_open(pid)
            try:
                if cause == "SIGKILL":
                    os.kill(pid, signal.SIGKILL)
                    select.select([pidfd], [], [])
                else:
                    tries = 0
                    while not select.select([pidfd], [], [], 0)[0]:
                        tries += 1
                        try:
                            _reset(_subscribe_pinging(pub, 1_000, 16, b"W%d-%d" % (death, tries)))
                        except OSError:
                            pass
                        select.select([pidfd], [], [], 0.5)
                died = time.monotonic()
            finally:
                os.close(pidfd)
            while ask(router, request("status", id=1), 100) is None:
                pass
            back[cause].append(time.monotonic() - died)
            print(f"death {death + 1} ({cause}, pid {pid}): answering again "
                  f"{back[cause][-1]:.3f} s after it")
        everything = back["SIGKILL"] + back["SIGABRT"]
        for cause, values in [*back.items(), ("all", everything)]:
            if values:
                print(f"{cause}: death -> answer p50 {percentile(values, 50):.3f} s, "
                      f"p99 {percentile(values, 99):.3f} s, max {max(values):.3f} s "
                      f"over {len(values)} deaths")
        aborts = log_path.read_text().count("Assertion failed: !_io_error")
        print(f"libzmq's assertion in the log: {aborts} times")
    finally:
        ctx.destroy(linger=0)
        proc.terminate()
        code = proc.wait(30)
    print(f"state process exit {code}; log: {log_path}")


if __name__ == "__main__":
    main()

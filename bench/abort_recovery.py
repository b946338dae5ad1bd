"""How soon `zns serve --supervise` serves again after a peer made libzmq abort it (issue 21
item 1; docs/operations.md, *A peer can abort the server*).

One supervised server on fixed loopback ports holds a KV entry. Each run waits past the
supervisor's STABLE_S (so every restart waits its first delay), then aborts the server the
way tests/test_peer_resets.py does (a SUB sending subscriptions each followed by a ZMTP PING,
then a reset), and times the first `status` answer carrying a new epoch, then reads the KV
entry back. Not part of `make bench`: a manual measurement, recorded in bench/results.md.

    .venv/bin/python -m bench.abort_recovery [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from zns.core import schema
from zns.drivers.supervisor import STABLE_S

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from test_peer_resets import _ask, _free_port, _reset, _subscribe_pinging  # noqa: E402

DIED = "died of SIGABRT"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zns-abort-"))
    router, pub = (f"tcp://127.0.0.1:{_free_port()}" for _ in range(2))
    log_path = tmp / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--router", router, "--pub", pub,
             "--kv-path", str(tmp / "kv.log"), "--supervise"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    ctx = zmq.Context()

    def status() -> schema.StatusReply:
        while True:
            reply = _ask(ctx, router, "status")
            if isinstance(reply, schema.StatusReply):
                return reply

    def deaths() -> int:
        return log_path.read_text().count(DIED)

    try:
        epoch = status().epoch
        print(f"first start: serving {time.monotonic() - started:.2f} s after the command")
        put = _ask(ctx, router, "kv_put", namespace="NS", key="k", value="kept")
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
            kept = _ask(ctx, router, "kv_get", namespace="NS", key="k")
            assert isinstance(kept, schema.KvGetReply) and kept.value == "kept", kept
            print(f"run {run + 1}: aborted at try {tries}, serving again (KV kept) "
                  f"{back[-1]:.3f} s after the reset")
        print(f"serving again after the reset: median {statistics.median(back):.3f} s, "
              f"min {min(back):.3f} s, max {max(back):.3f} s over {len(back)} runs")
    finally:
        ctx.destroy(linger=0)
        proc.terminate()
        code = proc.wait(30)
    print(f"supervisor exit {code}; log: {log_path}")


if __name__ == "__main__":
    main()

"""A long differential run: generated request sequences into the Java NameServer and zns at once.

    .venv/bin/python -m bench.differential --steps 100000            # 5.3.3, seeds from 1
    .venv/bin/python -m bench.differential --steps 5000 --seed 7 --version 5.5.0

Starts one Java NameServer (the oracle, from the jar cache tools/rocketmq/fetch.py
fills) and one `zns serve --remoting`, drives them with tests/interop/differential.py
and prints every difference found (at most one per sequence: a sequence stops at its
first) with the seed that reproduces it, the steps, reads and time. Exit status 1
when any difference was found.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "interop"))

import differential  # noqa: E402
import rocketmq  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000, help="random steps in all (default 100000)")
    parser.add_argument("--per-sequence", type=int, default=200, help="steps per sequence (fresh names each)")
    parser.add_argument("--seed", type=int, default=1, help="the first sequence's seed (then +1, +2, ...)")
    parser.add_argument("--version", default=rocketmq.DEFAULT_VERSION, choices=rocketmq.VERSIONS,
                        help="the Java NameServer's RocketMQ version (the oracle)")
    parser.add_argument("--explore", action="store_true",
                        help="also generate the differences docs/protocol.md §15 keeps (to find them again)")
    parser.add_argument("--no-expiry", action="store_true",
                        help="no expiry steps (5.x: a 1 s heartbeat timeout, then a wait for both to drop it)")
    parser.add_argument("--max-differences", type=int, default=20, help="stop after this many")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="zns-differential-"))
    rocketmq.set_scratch_dir(work / "oneshot")
    group = rocketmq.ProcessGroup(work / "java")
    zns = differential.ZnsProcess(work / "zns")
    procs = [zns]
    try:
        java = group.namesrv(version=args.version, config=differential.JAVA_CONFIG)

        def restart() -> tuple[str, str]:
            nonlocal java, zns
            java.kill()
            zns.stop()
            java = group.namesrv(version=args.version, config=differential.JAVA_CONFIG)
            zns = differential.ZnsProcess(work / f"zns{len(procs)}")
            procs.append(zns)
            return java.addr, zns.addr

        diff = differential.Differential(
            java.addr, zns.addr, java_version=rocketmq.version_ordinal(args.version),
            v4=args.version.startswith("4."),
            restart=restart, explore=args.explore, expiry=not args.no_expiry)
        stats = differential.RunStats()
        started = time.monotonic()
        seed = args.seed
        last_print = started
        try:
            while stats.steps < args.steps and len(stats.differences) < args.max_differences:
                found = diff.run_sequence(seed, min(args.per_sequence, args.steps - stats.steps), stats)
                if found is not None:
                    print(f"DIFFERENCE {found}\n", flush=True)
                seed += 1
                if time.monotonic() - last_print > 30:
                    last_print = time.monotonic()
                    print(f"  {stats.steps} steps, {stats.sequences} sequences, {stats.reads} reads, "
                          f"{len(stats.differences)} differences, {last_print - started:.0f} s", flush=True)
        finally:
            diff.close()
        took = time.monotonic() - started
        print(f"RocketMQ {args.version}: {stats.steps} steps in {stats.sequences} sequences (seeds "
              f"{args.seed}..{seed - 1}), {stats.reads} reads compared, {stats.settle_waits} asynchronous "
              f"steps, {len(stats.differences)} differences, {diff.restarts} restarts, {took:.0f} s "
              f"({stats.steps / max(took, 1e-9):.0f} steps/s)")
        print("step kinds written: " + ", ".join(f"{k} {n}" for k, n in sorted(stats.made.items())))
        return 1 if stats.differences else 0
    finally:
        for p in procs:
            p.stop()
        group.close()


if __name__ == "__main__":
    sys.exit(main())

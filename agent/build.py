#!/usr/bin/env python3
"""Build zns-agent.jar once per version of its sources, into a cache outside git.

    python3 agent/build.py            # build when needed; print the jar's path
    python3 agent/build.py --check    # exit 0 when the jar of these sources is built

The cache is ``$ZNS_AGENT_CACHE`` or ``~/.cache/zns/agent``: ``m2/`` is Maven's local
repository (``~/.m2`` is left alone) and ``<hash>/zns-agent.jar`` the jar of the sources
whose hash (``agent/pom.xml`` and every file under ``agent/src``) is ``<hash>``. A second
run with unchanged sources costs a hash. Only the standard library is used, so the
Makefile can run this before the virtualenv exists. Needs ``mvn`` and a JDK (8 or later;
the jar's classes are Java 8 bytecode).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

AGENT = Path(__file__).resolve().parent
JAR_NAME = "zns-agent.jar"


class BuildError(RuntimeError):
    """Maven could not build the jar (no Maven, no network for a first build, a compile error)."""


def cache_dir() -> Path:
    env = os.environ.get("ZNS_AGENT_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".cache" / "zns" / "agent"


def source_digest() -> str:
    """A hash of everything that makes the jar: the pom and every source file, by path."""
    h = hashlib.sha256()
    files = [AGENT / "pom.xml", *sorted(p for p in (AGENT / "src").rglob("*") if p.is_file())]
    for path in files:
        h.update(str(path.relative_to(AGENT)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def jar_path(cache: Path | None = None) -> Path:
    """Where the jar of the current sources is (or will be)."""
    return (cache or cache_dir()) / source_digest() / JAR_NAME


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One build at a time per cache (make and pytest may race on a fresh machine)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure(cache: Path | None = None, log=lambda msg: print(msg, file=sys.stderr)) -> Path:
    """Build the jar when the current sources have none; return its path."""
    cache = cache or cache_dir()
    jar = jar_path(cache)
    if jar.is_file():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BuildError("mvn not found on PATH")
    with _locked(cache):
        if jar.is_file():  # built by whoever held the lock
            return jar
        started = time.monotonic()
        build_dir = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
        try:
            cmd = [mvn, "-B", "-q", "-f", str(AGENT / "pom.xml"), f"-Dmaven.repo.local={cache / 'm2'}",
                   f"-Dzns.build.dir={build_dir}", "package"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            built = build_dir / JAR_NAME
            if proc.returncode != 0 or not built.is_file():
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
                raise BuildError(f"mvn package failed (exit {proc.returncode}):\n{tail}")
            jar.parent.mkdir(parents=True, exist_ok=True)
            staged = jar.with_suffix(".partial")
            shutil.copyfile(built, staged)
            staged.rename(jar)
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
        log(f"zns-agent: built {jar} in {time.monotonic() - started:.1f} s")
    return jar


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report whether the jar is built")
    args = parser.parse_args(argv)
    if args.check:
        jar = jar_path()
        print(jar if jar.is_file() else f"not built: {jar}")
        return 0 if jar.is_file() else 1
    try:
        print(ensure())
    except (BuildError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"zns-agent: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

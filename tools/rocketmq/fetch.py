#!/usr/bin/env python3
"""Fetch the Apache RocketMQ jars (4.9.7, 5.3.3, 5.5.0) once, into a cache outside git.

    python3 tools/rocketmq/fetch.py                    # every version: fetch what is missing
    python3 tools/rocketmq/fetch.py --version 5.3.3    # one version only
    python3 tools/rocketmq/fetch.py --check            # exit 0 when the cache is complete, 1 otherwise

Each version has its own folder, ``$ZNS_ROCKETMQ_CACHE/rocketmq-<version>`` (default
``~/.cache/zns/rocketmq-<version>``); it holds one classpath folder per process kind
(``namesrv/``, ``broker/``, ``client/``, ``tools/``), a Maven local repository of its own
(``m2/``) and a stamp file per kind. Every RocketMQ
jar ships its own ``rmq.<kind>.logback.xml`` and the first one found on the classpath
wins, so the kinds must not share a folder.

A kind whose stamp matches ``pom.xml`` and the version is not fetched again: a second run costs a hash
of the pom. Only the standard library is used, so the Makefile can run this before the
virtualenv exists.
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
import time
from collections.abc import Iterator
from pathlib import Path

VERSIONS = ("4.9.7", "5.3.3", "5.5.0")  # the interop matrix; 4.9.7 is the newest 4.x on Maven Central
VERSION = "5.3.3"  # the default: the version zns's remoting listener follows
KINDS = ("namesrv", "broker", "client", "tools")
POM = Path(__file__).resolve().with_name("pom.xml")


class FetchError(RuntimeError):
    """Maven could not bring the jars (no network, no Maven, a broken cache)."""


def cache_dir(version: str = VERSION) -> Path:
    env = os.environ.get("ZNS_ROCKETMQ_CACHE")
    root = Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "zns"
    return root / f"rocketmq-{version}"


def _version_of(cache: Path) -> str:
    return cache.name.removeprefix("rocketmq-")


def _pom_digest(version: str = VERSION) -> str:
    # The default version's stamp is the pom's hash alone, as before there were versions:
    # a cache fetched by an older checkout stays valid (and is not fetched again under it).
    extra = b"" if version == VERSION else version.encode()
    return hashlib.sha256(POM.read_bytes() + extra).hexdigest()[:16]


def _stamp(cache: Path, kind: str) -> Path:
    return cache / f".{kind}.stamp"


def kind_ready(kind: str, cache: Path | None = None) -> bool:
    cache = cache or cache_dir()
    stamp = _stamp(cache, kind)
    return (stamp.is_file() and stamp.read_text().strip() == _pom_digest(_version_of(cache))
            and (cache / kind).is_dir())


def all_ready(cache: Path | None = None) -> bool:
    return all(kind_ready(kind, cache) for kind in KINDS)


def classpath(kind: str, cache: Path | None = None) -> str:
    """The ``-cp`` value for one process kind (a folder wildcard, expanded by the JVM)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    return str((cache or cache_dir()) / kind / "*")


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One fetch at a time per cache (make and pytest may race on a fresh machine)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fetch_kind(kind: str, cache: Path, mvn: str) -> int:
    """Fetch one kind's classpath folder; returns how many jars it holds."""
    version = _version_of(cache)
    staging = cache / f".{kind}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        mvn, "-B", "-q", "-f", str(POM), "-P", kind, f"-Drocketmq.version={version}",
        f"-Dmaven.repo.local={cache / 'm2'}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not any(staging.glob(f"rocketmq-*-{version}.jar")):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        shutil.rmtree(staging, ignore_errors=True)
        raise FetchError(f"mvn failed for {kind} (exit {proc.returncode}):\n{tail}")
    final = cache / kind
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    _stamp(cache, kind).write_text(_pom_digest(version) + "\n")
    return len(list(final.iterdir()))


def ensure(cache: Path | None = None, log=None) -> Path:
    """Fetch every kind that is missing or stale (one line on stderr); return the cache folder.

    `log` is accepted for older callers and unused."""
    cache = cache or cache_dir()
    if all_ready(cache):
        return cache
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError("mvn not found on PATH")
    with _locked(cache):
        missing = [kind for kind in KINDS if not kind_ready(kind, cache)]
        if not missing:  # another process fetched them while this one waited
            return cache
        # One line: what is being done now, and (at its end) how long it took.
        print(f"rocketmq {_version_of(cache)}: fetching the {', '.join(missing)} jars with Maven "
              f"into {cache} (once; a few hundred MB, minutes on a slow network) ...", end=" ", file=sys.stderr, flush=True)
        started = time.monotonic()
        jars = 0
        try:
            for kind in missing:
                jars += _fetch_kind(kind, cache, mvn)
        except BaseException:
            print(f"failed after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            raise
        print(f"done in {time.monotonic() - started:.0f} s ({jars} jars)", file=sys.stderr, flush=True)
    return cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report whether the cache is complete")
    parser.add_argument("--version", action="append", choices=VERSIONS,
                        help="a RocketMQ version (repeatable; default: all of them)")
    args = parser.parse_args(argv)
    versions = args.version or list(VERSIONS)
    if args.check:
        missing = [v for v in versions if not all_ready(cache_dir(v))]
        for v in versions:
            print(cache_dir(v) if v not in missing else f"incomplete: {cache_dir(v)}")
        return 1 if missing else 0
    try:
        for v in versions:
            print(ensure(cache_dir(v)))
    except (FetchError, subprocess.TimeoutExpired) as exc:
        print(f"rocketmq jars: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""zns-agent's reading of the events stream (protocol §7), without RocketMQ.

The agent's command line (`java -jar zns-agent.jar NAMESRV --follow S TOPIC...`) runs the
same Follower, Recipe and MessagePack reader as the attached agent, with a target that
prints a JSON line per refresh instead of asking a RocketMQ client to pull. Here it is
pointed (agent argument `events=`) at a PUB socket this test owns, so every event —
duplicates, gaps, an epoch change, garbage, a silence — is exactly the one the test sends.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

import rocketmq
import zns_agent

pytestmark = pytest.mark.interop

HB_MS = 200


@pytest.fixture(scope="module")
def jar() -> Path:
    with rocketmq.unavailable_skips():
        return zns_agent.agent_jar()


class Publisher:
    """A PUB socket standing in for zns's events socket."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.epoch = "e1e1e1e1e1e1e1e1"
        self.revision = 5
        self.beating = True
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def send(self, channel: bytes, body: bytes) -> None:
        with self._lock:
            self.pub.send_multipart([channel, body])

    def route(self, topic: str, revision: int, prev: int) -> None:
        self.send(f"route/{topic}\0".encode(), msgspec.msgpack.encode(
            {"op": "route", "epoch": self.epoch, "revision": revision, "prev": prev, "topic": topic,
             "route": {"topic": topic, "queues": [], "brokers": [], "filter_servers": {}, "order_conf": ""}}))

    def _beat(self) -> None:
        while not self._stop.wait(HB_MS / 1000):
            if self.beating:
                self.send(b"hb\0", msgspec.msgpack.encode(
                    {"op": "hb", "epoch": self.epoch, "revision": self.revision, "time_ms": int(time.time() * 1000)}))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close(0)
        self.ctx.term()


class Cli:
    def __init__(self, jar: Path, endpoint: str, seconds: float, *topics: str) -> None:
        args = f"events={endpoint},heartbeatMs={HB_MS},minBackoffMs=100,maxBackoffMs=200"
        self.proc = subprocess.Popen(
            ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-jar", str(jar), "127.0.0.1:1",
             "--follow", str(seconds), *topics, "--args", args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        self.log: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines, True), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.log, False), daemon=True).start()

    def _read(self, stream: Any, into: list[Any], as_json: bool) -> None:
        for raw in stream:
            item = json.loads(raw) if as_json and raw.startswith("{") else raw.strip()
            with self._cond:
                into.append(item)
                self._cond.notify_all()

    def wait(self, check: Any, what: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = check()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"not within {timeout} s: {what}\nout: {self.lines}\nlog: {self.log}")
                self._cond.wait(min(left, 0.2))

    def refreshes(self) -> list[tuple[list[str], str]]:
        with self._cond:
            return [(ln["refresh"], ln["why"]) for ln in self.lines if "refresh" in ln]

    def refresh_count(self, n: int, what: str) -> list[tuple[list[str], str]]:
        return self.wait(lambda: self.refreshes() if len(self.refreshes()) >= n else None, what)

    def finish(self) -> dict[str, Any]:
        self.proc.wait(60)
        return next(ln for ln in self.lines if ln.get("summary"))


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    p = Publisher()
    yield p
    p.close()


def test_recipe_refreshes_each_change_once_and_repairs_gaps_epochs_and_silence(jar: Path, publisher: Publisher) -> None:
    cli = Cli(jar, publisher.endpoint, 12, "Orders", "Payments")
    try:
        assert cli.wait(lambda: cli.lines and cli.lines[0], "the probe line")["events"] == publisher.endpoint
        # step 2: at the first hb, the subscription is in force: both topics pulled once
        assert cli.refresh_count(1, "the first refresh")[0] == (["Orders", "Payments"], "subscribed")
        cli.wait(lambda: any("following zns events at " + publisher.endpoint in ln for ln in cli.log),
                 "the following line (stderr: read apart from stdout)")

        publisher.route("Orders", 6, 5)          # the next change of Orders
        got = cli.refresh_count(2, "Orders")
        assert got[1][0] == ["Orders"] and got[1][1] == "route@e1e1e1e1e1e1e1e1/6 Orders", got
        # Events read in one go are refreshed in one go: each of these would add Orders to
        # the next refresh (or make a refresh of its own) if it were acted on.
        publisher.route("Orders", 6, 5)          # the same change again: already acted on
        publisher.route("Orders", 4, 3)          # older than what was acted on
        publisher.route("Shipping", 7, 0)        # not a held topic (not even subscribed)
        publisher.send(b"route/Orders\0", b"\xc1 not messagepack")
        publisher.send(b"route/Orders\0", msgspec.msgpack.encode({"op": "route", "topic": "Orders"}))
        publisher.send(b"route/Orders\0", msgspec.msgpack.encode({"op": "newop", "epoch": publisher.epoch,
                                                                   "revision": 99}))
        publisher.route("Payments", 9, 2)        # a gap (prev is not the last seen): pull
        got = cli.refresh_count(3, "Payments")
        assert got[2][0] == ["Payments"], got

        publisher.epoch = "e2e2e2e2e2e2e2e2"     # a new server: every held topic again
        got = cli.refresh_count(4, "the epoch change")
        assert got[3] == (["Orders", "Payments"], "epoch e2e2e2e2e2e2e2e2"), got
        publisher.route("Orders", 6, 0)          # revision 6 of the new epoch is news
        assert cli.refresh_count(5, "Orders in the new epoch")[4][0] == ["Orders"]

        publisher.beating = False                # silence: the stream is given up ...
        cli.wait(lambda: any("stopped following" in ln for ln in cli.log), "the give-up line")
        publisher.beating = True                 # ... and followed again when it is back
        cli.wait(lambda: sum("following zns events" in ln and "stopped" not in ln for ln in cli.log) >= 2,
                 "following again")
        got = cli.refresh_count(6, "the pull after following again")
        assert got[5] == (["Orders", "Payments"], "subscribed"), got
        summary = cli.finish()
        assert len(cli.refreshes()) == 6, cli.refreshes()
        assert summary["following"] is True, summary
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()
            cli.proc.wait(10)
    cli.wait(lambda: sum("zns-agent:" in ln for ln in cli.log) >= 3, "three log lines", timeout=10)
    agent_lines = [ln for ln in cli.log if "zns-agent:" in ln]
    assert len(agent_lines) == 3, agent_lines  # following, stopped following, following


def test_bad_agent_arguments_are_refused_with_a_reason(jar: Path) -> None:
    proc = subprocess.run(["java", "-jar", str(jar), "127.0.0.1:1", "--args", "maxBackoffMs=soon"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "maxBackoffMs must be a whole number of milliseconds" in proc.stderr, proc

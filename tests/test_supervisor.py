"""`zns serve --supervise` (zns.drivers.supervisor): a new server after a death by signal, never
after an exit. The live case (libzmq's abort, the same ports, the KV kept) is in
tests/test_peer_resets.py."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from zns.core.config import ServerConfig, load
from zns.core.errors import InvalidSetting
from zns.drivers import supervisor

def _child(tmp_path: Path, deaths: int, code: int) -> tuple[Callable[[], int], Path]:
    """A server that dies of SIGABRT while it has run fewer than `deaths` + 1 times, then
    returns `code`; each run is a line in the file."""
    runs = tmp_path / "runs"

    def serve() -> int:
        with open(runs, "a") as f:
            f.write("run\n")
        if runs.read_text().count("run") <= deaths:
            os.abort()
        return code

    return serve, runs


@pytest.mark.timeout(60)
def test_a_child_that_dies_of_a_signal_is_started_again_with_growing_delays(tmp_path, caplog):
    serve, runs = _child(tmp_path, deaths=3, code=0)
    slept: list[float] = []
    with caplog.at_level(logging.ERROR, logger="zns"):
        assert supervisor.supervise(serve, wait=lambda s, stopping: slept.append(s)) == 0
    assert runs.read_text().count("run") == 4
    deaths = [r.getMessage() for r in caplog.records if "died of SIGABRT" in r.getMessage()]
    assert len(deaths) == 3
    # Quick deaths wait twice as long each time: 0.1, 0.2, 0.4 s.
    assert [m.split("starts in ")[1].split(" s")[0] for m in deaths] == ["0.1", "0.2", "0.4"]
    assert slept == [0.1, 0.2, 0.4]


@pytest.mark.timeout(60)
def test_an_exit_ends_the_supervisor_with_its_code(tmp_path):
    serve, runs = _child(tmp_path, deaths=0, code=3)
    assert supervisor.supervise(serve, wait=lambda s, stopping: None) == 3
    assert runs.read_text().count("run") == 1  # never started again: it would fail again


def test_supervise_needs_fixed_ports():
    base = {"router": "tcp://127.0.0.1:9876", "pub": "tcp://127.0.0.1:9877", "supervise": True}
    assert load(ServerConfig, base).supervise
    for field, value in [("router", "tcp://127.0.0.1:*"), ("pub", "tcp://127.0.0.1:0"),
                         ("remoting", "127.0.0.1:0"), ("metrics", "127.0.0.1:0")]:
        with pytest.raises(InvalidSetting, match=f"the port of {field} must not be"):
            load(ServerConfig, {**base, field: value})
    assert not load(ServerConfig, {**base, "router": "tcp://127.0.0.1:*",
                                   "supervise": False}).supervise


@pytest.mark.timeout(120)
def test_a_supervised_server_that_cannot_start_ends_with_its_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
        result = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--supervise", "--router",
             f"tcp://127.0.0.1:{port}", "--pub", "tcp://127.0.0.1:1", "--kv-path",
             str(tmp_path / "kv.log")],
            capture_output=True, text=True, env=env, timeout=100)
    assert result.returncode == 1, result.stderr
    assert "Error: cannot bind" in result.stderr and "died of" not in result.stderr

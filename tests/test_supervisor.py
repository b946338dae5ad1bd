"""`zns serve --supervise` (zns.drivers.supervisor): a new server after a death by signal, never
after an exit. The live case (libzmq's abort, the same ports, the KV kept) is in
tests/test_peer_resets.py."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from zns.core.config import ServerConfig, load
from zns.core.errors import InvalidSetting
from zns.drivers import supervisor

from helpers import wait_for

def _child(tmp_path: Path, deaths: int, code: int) -> tuple[Callable[[], int], Path]:
    """A server that dies of SIGABRT while it has run fewer than `deaths` + 1 times, then
    returns `code`; each run is a line in the file."""
    runs = tmp_path / "runs"

    def serve() -> int:
        with open(runs, "a") as f:
            f.write("run\n")
        if runs.read_text().count("run") <= deaths:
            faulthandler.disable()  # pytest's, inherited by the fork: no traceback on stderr
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


@pytest.mark.timeout(60)
def test_a_stop_that_reaches_a_child_after_its_server_stopped_is_an_exit(tmp_path):
    # Ctrl-C: the server stops on its SIGINT and restores the handlers it found; the
    # supervisor's SIGTERM can come after that. It must end the child with 0, not kill it
    # (a death by a signal is followed by a new server).
    runs = tmp_path / "runs"

    def serve() -> int:
        with open(runs, "a") as f:
            f.write("run\n")
        if runs.read_text().count("run") == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        return 5

    assert supervisor.supervise(serve, wait=lambda s, stopping: None) == 0
    assert runs.read_text().count("run") == 1


def test_supervise_needs_fixed_ports():
    base = {"router": "tcp://127.0.0.1:9876", "pub": "tcp://127.0.0.1:9877", "supervise": True,
            "workers": 0}  # one process: with workers, the state process holds the ports
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


@pytest.mark.timeout(120)
def test_ctrl_c_stops_a_supervised_server_cleanly(tmp_path):
    """Ctrl-C signals the whole process group: the server stops on its SIGINT, the
    supervisor on its own once the server has, both cleanly."""
    ports = []
    for _ in range(2):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            ports.append(free.getsockname()[1])
    log_path = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--supervise", "--router",
             f"tcp://127.0.0.1:{ports[0]}", "--pub", f"tcp://127.0.0.1:{ports[1]}",
             "--kv-path", str(tmp_path / "kv.log")],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for(lambda: "serving requests" in log_path.read_text(), timeout=60)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "zns stopped" in log_path.read_text() and "died of" not in log_path.read_text()


@pytest.mark.timeout(60)
def test_a_second_stop_signal_while_the_server_closes_is_the_same_stop(caplog):
    """Ctrl-C under `--supervise`: the server's SIGINT stops its loop, then the supervisor's
    SIGTERM arrives while it closes. That must not reach the handler the server found at its
    start (in the supervised child: end at once), or the server ends half closed and without
    its `zns stopped` line."""
    from zns.drivers.server import Server

    class EndedAtOnce(Exception):
        pass

    def found_at_start(signum: int, frame: object) -> None:
        raise EndedAtOnce

    before = signal.signal(signal.SIGTERM, found_at_start)
    try:
        server = Server(ServerConfig(router="tcp://127.0.0.1:0", pub="tcp://127.0.0.1:0",
                                     kv_path=None))
        close = server.close

        def close_while_signalled() -> None:
            signal.raise_signal(signal.SIGTERM)
            close()

        server.close = close_while_signalled  # type: ignore[method-assign]
        server.stop()
        with caplog.at_level(logging.INFO, logger="zns"):
            server.run()
        assert caplog.messages[-1] == "zns stopped"
        assert signal.getsignal(signal.SIGTERM) is found_at_start
    finally:
        signal.signal(signal.SIGTERM, before)

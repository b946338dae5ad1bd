"""`zns serve --supervise` (zns.drivers.supervisor): a new server after a death by signal, never
after an exit. The live case (libzmq's abort, the same ports, the KV kept) is in
tests/test_peer_resets.py."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from zns.core.config import ServerConfig, load
from zns.core.errors import InvalidSetting
from zns.drivers import supervisor

# Dies of SIGABRT while the file has fewer than `deaths` lines, then exits with `code`.
CHILD = """
import os, sys
path, deaths, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "a") as f:
    f.write("run\\n")
if open(path).read().count("run") <= deaths:
    os.abort()
sys.exit(code)
"""


def _child(tmp_path: Path, deaths: int, code: int) -> tuple[list[str], Path]:
    runs = tmp_path / "runs"
    return [sys.executable, "-c", CHILD, str(runs), str(deaths), str(code)], runs


@pytest.mark.timeout(60)
def test_a_child_that_dies_of_a_signal_is_started_again_with_growing_delays(tmp_path, caplog):
    command, runs = _child(tmp_path, deaths=3, code=0)
    slept: list[float] = []
    with caplog.at_level(logging.ERROR, logger="zns"):
        assert supervisor.supervise(command, wait=lambda s, stopping: slept.append(s)) == 0
    assert runs.read_text().count("run") == 4
    deaths = [r.getMessage() for r in caplog.records if "died of SIGABRT" in r.getMessage()]
    assert len(deaths) == 3
    # Quick deaths wait twice as long each time: 0.1, 0.2, 0.4 s.
    assert [m.split("starts in ")[1].split(" s")[0] for m in deaths] == ["0.1", "0.2", "0.4"]
    assert slept == [0.1, 0.2, 0.4]


@pytest.mark.timeout(60)
def test_an_exit_ends_the_supervisor_with_its_code(tmp_path):
    command, runs = _child(tmp_path, deaths=0, code=3)
    assert supervisor.supervise(command, wait=lambda s, stopping: None) == 3
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

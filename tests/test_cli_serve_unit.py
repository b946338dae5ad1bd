"""`zns serve`'s work (zns.cli.serve._serve, _serve_once) in process, with a fake Server."""

from __future__ import annotations

import click
import pytest

import zns.cli.serve
from zns.cli.serve import _serve, _serve_once
from zns.core.config import ServerConfig
from zns.core.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


class FakeServer:
    ran: list[ServerConfig] = []
    fail: Exception | None = None

    def __init__(self, config: ServerConfig) -> None:
        if FakeServer.fail is not None:
            raise FakeServer.fail
        self.config = config

    def run(self) -> None:
        FakeServer.ran.append(self.config)


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    FakeServer.ran, FakeServer.fail = [], None
    monkeypatch.setattr(zns.cli.serve, "Server", FakeServer)
    monkeypatch.setattr(zns.cli.serve, "StateProcess", FakeServer)  # --workers 1 or more
    return FakeServer.ran


def test_serve_makes_and_runs_a_server_of_the_configuration(servers) -> None:
    config = ServerConfig()
    _serve(config)
    assert servers == [config]


def test_a_configuration_the_server_refuses_is_an_error_exit_1(servers) -> None:
    cause = ConfigError("--peer names this server")
    FakeServer.fail = cause
    with pytest.raises(click.ClickException) as caught:
        _serve(ServerConfig())
    assert caught.value.message == "--peer names this server"
    assert caught.value.exit_code == 1 and caught.value.__cause__ is cause


def test_a_supervised_child_returns_0_after_its_server_ran(servers) -> None:
    config = ServerConfig()
    assert _serve_once(config) == 0
    assert servers == [config]


def test_a_supervised_child_shows_the_error_and_returns_its_code(servers, capsys) -> None:
    FakeServer.fail = ConfigError("bad key file")
    assert _serve_once(ServerConfig()) == 1
    assert capsys.readouterr().err == "Error: bad key file\n"


RELOAD_WHILE_STARTING = """
import os, signal, sys, time
import zns.cli.serve
from zns.core.config import ServerConfig
from zns.drivers.sockets import Waker, handle_signals

class Starting:
    def __init__(self, config):
        os.kill(os.getpid(), signal.SIGHUP)  # `systemctl reload` while zns starts

    def run(self):
        reloaded = []
        handle_signals({signal.SIGHUP: lambda: reloaded.append(1)}, Waker())
        deadline = time.monotonic() + 10
        while not reloaded and time.monotonic() < deadline:
            time.sleep(0.01)  # Python runs the handler between two bytecodes
        sys.exit(0 if reloaded else 3)

zns.cli.serve.Server = zns.cli.serve.StateProcess = Starting
zns.cli.serve._serve(ServerConfig())
"""


def test_a_sighup_while_the_server_starts_waits_for_its_handler() -> None:
    # In a process of its own: without the fix, the SIGHUP ends the process that gets it.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", RELOAD_WHILE_STARTING], timeout=20,
                          capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])

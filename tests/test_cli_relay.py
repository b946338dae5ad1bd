"""`zns relay`'s work (zns.cli.relay._relay) in process: a fake Relay, `stop` set by the test."""

from __future__ import annotations

import threading
from typing import Any

import click
import pytest

import zns.cli.relay
from zns.cli.relay import _relay
from zns.core.config import RelayConfig
from zns.core.errors import EndpointError, NameServerUnavailable, UsageError

pytestmark = pytest.mark.timeout(30)


class FakeRelay:
    made: list[FakeRelay] = []
    fail: Exception | None = None

    def __init__(self, upstream: str, bind: str, *, timeout: float) -> None:
        if FakeRelay.fail is not None:
            raise FakeRelay.fail
        self.args = (upstream, bind, timeout)
        self.closed = 0
        FakeRelay.made.append(self)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def relays(monkeypatch: pytest.MonkeyPatch) -> list[FakeRelay]:
    FakeRelay.made, FakeRelay.fail = [], None
    monkeypatch.setattr(zns.cli.relay, "Relay", FakeRelay)
    logged: list[tuple[Any, ...]] = []
    monkeypatch.setattr(zns.cli.relay, "configure_logging", lambda *args: logged.append(args))
    FakeRelay.logged = logged  # type: ignore[attr-defined]
    return FakeRelay.made


CONFIG = RelayConfig(upstream="tcp://ns:9876", bind="tcp://*:9900", timeout_s=0.5,
                     log_level="debug", log_format="json")


def test_relay_starts_with_the_configuration_and_closes_when_stopped(relays, capsys) -> None:
    stop = threading.Event()
    stop.set()
    _relay(CONFIG, stop)
    (made,) = relays
    assert made.args == ("tcp://ns:9876", "tcp://*:9900", 0.5)
    assert made.closed == 1
    assert FakeRelay.logged == [("debug", "json")]  # type: ignore[attr-defined]
    assert capsys.readouterr().err == "zns relay stopped\n"


def test_relay_runs_until_stopped(relays, capsys) -> None:
    stop = threading.Event()
    waits: list[float | None] = []
    real_wait = stop.wait

    def wait(timeout: float | None = None) -> bool:
        waits.append(timeout)
        if len(waits) == 3:
            stop.set()
        return real_wait(0)

    stop.wait = wait  # type: ignore[method-assign]
    _relay(CONFIG, stop)
    assert waits == [1.0, 1.0, 1.0]
    assert relays[0].closed == 1


def test_a_refused_configuration_is_a_usage_error(relays) -> None:
    FakeRelay.fail = UsageError("the events endpoint is the bind endpoint")
    with pytest.raises(click.UsageError) as caught:
        _relay(CONFIG, threading.Event())
    assert caught.value.message == "the events endpoint is the bind endpoint"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_busy_port_is_an_error_exit_1(relays) -> None:
    FakeRelay.fail = EndpointError("cannot bind tcp://*:9900: in use")
    with pytest.raises(click.ClickException) as caught:
        _relay(CONFIG, threading.Event())
    assert not isinstance(caught.value, click.UsageError)
    assert caught.value.message == "cannot bind tcp://*:9900: in use"
    assert caught.value.exit_code == 1
    assert caught.value.__suppress_context__


def test_no_nameserver_is_exit_3_with_one_line(relays, capsys) -> None:
    FakeRelay.fail = NameServerUnavailable("no NameServer answered")
    with pytest.raises(SystemExit) as caught:
        _relay(CONFIG, threading.Event())
    assert caught.value.code == 3
    assert caught.value.__suppress_context__
    assert capsys.readouterr().err == "zns: no NameServer answered\n"

"""zns.drivers.supervisor's decisions with the fork and the clock faked: restarts, delays, stops,
SIGHUP, exit codes and the log line; then `pause`, `send_signal`, `_exit_now` and `_fork` itself (a
real fork whose child exits with what `serve` gave). tests/test_supervisor.py runs real
children that abort; tests/test_peer_resets.py the live case."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from zns.drivers import supervisor

pytestmark = pytest.mark.timeout(60)


def _killed(signum: int) -> int:
    """A wait status: the child died of `signum`."""
    return signum


def _exited(code: int) -> int:
    return code << 8


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Children:
    """Stands in for _fork, os.waitpid and send_signal: child `i` lives `lives[i]` s and ends with
    `statuses[i]`; `during[i]` runs while the supervisor waits for it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, statuses: list[int],
                 lives: list[float] | None = None) -> None:
        self.statuses = statuses
        self.lives = lives or [0.0] * len(statuses)
        self.clock = FakeTime()
        self.forked: list[int] = []
        self.sent: list[tuple[int, int]] = []
        self.during: dict[int, Callable[[], None]] = {}
        self.on_fork: dict[int, Callable[[], None]] = {}
        monkeypatch.setattr(supervisor, "time", self.clock)
        monkeypatch.setattr(supervisor, "_fork", self.fork)
        monkeypatch.setattr(supervisor, "send_signal", lambda pid, sig: self.sent.append((pid, sig)))
        monkeypatch.setattr(supervisor.os, "waitpid", self.waitpid)

    def fork(self, serve: Callable[[], int], handlers: dict[Any, Any]) -> int:
        index = len(self.forked)
        if index in self.on_fork:
            self.on_fork[index]()
        self.forked.append(5000 + index)
        return self.forked[-1]

    def waitpid(self, pid: int, options: int) -> tuple[int, int]:
        index = self.forked.index(pid)
        assert options == 0
        if index in self.during:
            self.during[index]()
        self.clock.now += self.lives[index]
        return pid, self.statuses[index]


def _handler(sig: int) -> Callable[[int, Any], None]:
    handler = signal.getsignal(sig)
    assert callable(handler)
    return handler  # type: ignore[return-value]


@pytest.fixture
def restored() -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in supervisor.SIGNALS}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _supervise(waits: list[tuple[float, bool]] | None = None,
               during_wait: Callable[[], None] | None = None) -> int:
    def wait(seconds: float, stopping: Callable[[], bool]) -> None:
        before = stopping()
        if during_wait is not None:
            during_wait()
        if waits is not None:
            waits.append((seconds, before))
            waits.append((seconds, stopping()))

    return supervisor.supervise(lambda: 0, wait=wait)


def test_quick_deaths_double_the_delay_up_to_2_s_and_each_is_logged(monkeypatch, caplog, restored) -> None:
    children = Children(monkeypatch, [_killed(signal.SIGABRT)] * 7 + [_exited(0)], lives=[1.0] * 8)
    waits: list[tuple[float, bool]] = []
    with caplog.at_level(logging.ERROR, logger="zns"):
        assert _supervise(waits) == 0
    assert [w for w, _ in waits[::2]] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert all(not stopping for _, stopping in waits)
    messages = [r.getMessage() for r in caplog.records if r.name == "zns"]
    assert messages[0] == ("the server (pid 5000) died of SIGABRT after 1.0 s: a new one starts in "
                           "0.1 s (restart 1; docs/operations.md, A peer can abort the server)")
    assert [m.split("(restart ")[1].split(";")[0] for m in messages] == [str(n) for n in range(1, 8)]
    assert children.sent == []
    assert signal.getsignal(signal.SIGTERM) is not None


def test_a_server_that_lived_10_s_starts_the_delays_over(monkeypatch, restored) -> None:
    Children(monkeypatch, [_killed(signal.SIGSEGV)] * 4 + [_exited(0)], lives=[0.0, 0.0, 10.0, 9.9, 0.0])
    waits: list[tuple[float, bool]] = []
    assert _supervise(waits) == 0
    assert [w for w, _ in waits[::2]] == [0.1, 0.2, 0.1, 0.2]


def test_an_exit_ends_the_supervisor_with_its_code_at_once(monkeypatch, restored) -> None:
    children = Children(monkeypatch, [_exited(3)])
    assert _supervise() == 3
    assert children.forked == [5000]


def test_a_stop_while_the_server_runs_is_sent_on_and_ends_with_its_code(monkeypatch, restored) -> None:
    children = Children(monkeypatch, [_killed(signal.SIGTERM)])
    children.during[0] = lambda: _handler(signal.SIGTERM)(signal.SIGTERM, None)
    assert _supervise() == 128 + signal.SIGTERM
    assert children.sent == [(5000, signal.SIGTERM)]
    assert children.forked == [5000]  # a death while stopping: no new server


def test_ctrl_c_is_sent_on_as_sigterm(monkeypatch, restored) -> None:
    children = Children(monkeypatch, [_killed(signal.SIGINT)])
    children.during[0] = lambda: _handler(signal.SIGINT)(signal.SIGINT, None)
    assert _supervise() == 128 + signal.SIGINT
    assert children.sent == [(5000, signal.SIGTERM)]


def test_a_stop_while_stopping_that_ends_in_an_exit_keeps_the_exit_code(monkeypatch, restored) -> None:
    children = Children(monkeypatch, [_exited(0)])
    children.during[0] = lambda: _handler(signal.SIGTERM)(signal.SIGTERM, None)
    assert _supervise() == 0


def test_a_stop_before_the_child_is_known_is_sent_once_it_is(monkeypatch, restored) -> None:
    children = Children(monkeypatch, [_killed(signal.SIGTERM)])
    children.on_fork[0] = lambda: _handler(signal.SIGTERM)(signal.SIGTERM, None)
    assert _supervise() == 128 + signal.SIGTERM
    assert children.sent == [(5000, signal.SIGTERM)]  # not to pid 0 before, once after


def test_sighup_is_passed_to_the_running_server_only(monkeypatch, restored) -> None:
    children = Children(monkeypatch, [_killed(signal.SIGABRT), _exited(0)])
    children.during[0] = lambda: _handler(signal.SIGHUP)(signal.SIGHUP, None)
    waits: list[tuple[float, bool]] = []
    assert _supervise(waits, during_wait=lambda: _handler(signal.SIGHUP)(signal.SIGHUP, None)) == 0
    assert children.sent == [(5000, signal.SIGHUP)]  # none between two servers


def test_a_stop_between_two_servers_ends_with_0_and_starts_no_other(monkeypatch, restored) -> None:
    children = Children(monkeypatch, [_killed(signal.SIGABRT), _exited(0)])
    waits: list[tuple[float, bool]] = []
    assert _supervise(waits, during_wait=lambda: _handler(signal.SIGTERM)(signal.SIGTERM, None)) == 0
    assert waits == [(0.1, False), (0.1, True)]  # the wait sees the stop
    assert children.forked == [5000] and children.sent == []


def test_the_handlers_found_are_put_back(monkeypatch, restored) -> None:
    marker = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGHUP, marker)
    Children(monkeypatch, [_exited(0)])
    _supervise()
    assert signal.getsignal(signal.SIGHUP) is marker


def test_the_default_wait_is_pause() -> None:
    import inspect

    assert inspect.signature(supervisor.supervise).parameters["wait"].default is supervisor.pause


# --- pause -----------------------------------------------------------------------------------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    fake.now = 0.0
    monkeypatch.setattr(supervisor, "time", fake)
    return fake


def test_pause_sleeps_in_steps_of_50_ms_at_most(clock: FakeTime) -> None:
    supervisor.pause(0.125, lambda: False)
    assert [round(s, 6) for s in clock.slept] == [0.05, 0.05, 0.025]
    assert clock.now == pytest.approx(0.125)


def test_pause_ends_at_once_when_stopping(clock: FakeTime) -> None:
    calls: list[int] = []

    def stopping() -> bool:
        calls.append(1)
        return len(calls) > 2

    supervisor.pause(10, stopping)
    assert len(clock.slept) == 2


def test_pause_of_nothing_does_not_sleep(clock: FakeTime) -> None:
    supervisor.pause(0, lambda: False)
    assert clock.slept == []


def test_pause_never_sleeps_past_its_end(clock: FakeTime, monkeypatch) -> None:
    # The clock jumps past the end between the check and the sleep: the sleep is 0.
    readings = iter([0.0, 0.0, 5.0, 5.0])
    monkeypatch.setattr(clock, "monotonic", lambda: next(readings))
    supervisor.pause(1.0, lambda: False)
    assert clock.slept == [0.0]


# --- send_signal, _exit_now, _name -------------------------------------------------------------------


def test_send_signals_a_process_and_ignores_one_that_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        supervisor.send_signal(child.pid, signal.SIGUSR1)
        assert child.wait(20) == -signal.SIGUSR1
    finally:
        child.kill()
        child.wait()
    supervisor.send_signal(child.pid, signal.SIGTERM)  # reaped: ProcessLookupError, ignored


def test_exit_now_is_a_clean_exit() -> None:
    with pytest.raises(SystemExit) as caught:
        supervisor._exit_now(signal.SIGTERM, None)
    assert caught.value.code == 0


def test_a_signal_is_named_and_an_unknown_one_numbered() -> None:
    assert supervisor._name(6) == "SIGABRT"
    assert supervisor._name(99) == "signal 99"


# --- _fork (a real child) -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def exit_only_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """os._exit in the test process itself is a failure, not an exit (a child exits for real)."""
    parent, real_exit = os.getpid(), os._exit

    def guarded(code: int) -> None:
        if os.getpid() == parent:
            raise AssertionError(f"os._exit({code}) in the parent")
        real_exit(code)

    monkeypatch.setattr(os, "_exit", guarded)


def test_a_fork_that_fails_raises_with_the_signals_unblocked(monkeypatch) -> None:
    def no_fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(supervisor.os, "fork", no_fork)
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
        supervisor._fork(lambda: 0, {})
    assert not set(supervisor.SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _fork_and_wait(serve: Callable[[], int]) -> int:
    parent = os.getpid()
    try:
        pid = supervisor._fork(serve, {})
    except BaseException:
        if os.getpid() != parent:  # a child that did not exit: never let it run the tests
            os._exit(99)
        raise
    if os.getpid() != parent:
        os._exit(98)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert not set(supervisor.SIGNALS) & mask  # the parent takes signals again at once
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _quiet(serve: Callable[[], int]) -> Callable[[], int]:
    def run() -> int:
        import faulthandler

        faulthandler.disable()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # the child's traceback is not the test's output
        return serve()

    return run


def test_a_child_exits_with_what_serve_returns() -> None:
    assert _fork_and_wait(_quiet(lambda: 5)) == 5


def test_a_child_whose_serve_exits_uses_its_code_or_1() -> None:
    def exits(code: Any) -> Callable[[], int]:
        def serve() -> int:
            raise SystemExit(code)
        return serve

    assert _fork_and_wait(_quiet(exits(7))) == 7
    assert _fork_and_wait(_quiet(exits("a message"))) == 1


def test_a_child_whose_serve_raises_exits_with_1() -> None:
    def serve() -> int:
        raise RuntimeError("a bug")

    assert _fork_and_wait(_quiet(serve)) == 1


def test_a_stop_reaching_a_child_before_its_server_has_handlers_ends_it_with_0() -> None:
    def serve() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        return 4  # not reached: the stop ends it at once

    assert _fork_and_wait(_quiet(serve)) == 0

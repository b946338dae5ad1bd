"""A client's or broker agent's background thread (or task) that dies reaches the caller:
the next call raises `BackgroundFailure` chained to the original exception, at once —
never a hang, never a timeout, never `NameServerUnavailable` for a bug."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio

from zns.core.errors import BackgroundFailure
from zns.drivers.async_client import AsyncRouteClient
from zns.drivers.broker_agent import BrokerAgent
from zns.drivers.route_client import RouteClient

NOWHERE = "tcp://127.0.0.1:1"  # never contacted: the first socket the thread opens fails


class Boom(RuntimeError):
    pass


class BrokenContext(zmq.Context):
    def socket(self, *args, **kwargs):  # type: ignore[override]
        raise Boom("no sockets today")


class BrokenAsyncContext(zmq.asyncio.Context):
    def socket(self, *args, **kwargs):  # type: ignore[override]
        raise Boom("no sockets today")


def assert_is_the_failure(info: pytest.ExceptionInfo[BackgroundFailure]) -> None:
    assert isinstance(info.value.__cause__, Boom)
    assert "Boom: no sockets today" in str(info.value)


def test_route_client_thread_failure_is_raised_by_the_next_calls() -> None:
    ctx = BrokenContext()
    client = RouteClient(NOWHERE, context=ctx, timeout=60)
    try:
        started = time.monotonic()
        with pytest.raises(BackgroundFailure) as info:
            client.route("Orders")  # waits for the route: woken by the failure, not the timeout
        assert time.monotonic() - started < 30
        assert_is_the_failure(info)
        assert isinstance(client.failure, Boom)
        for call in (lambda: client.watch("Orders", lambda *_: None), lambda: client.forget("x"),
                     lambda: client.select_queue("Orders")):
            with pytest.raises(BackgroundFailure):
                call()
    finally:
        client.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_route_client_thread_dying_while_route_waits_wakes_the_wait() -> None:
    """The thread dies only once route() has tracked its topic (past route()'s own check of
    the failure): the wait itself must end on the failure, not on its 30 s timeout."""
    import threading

    made, armed = threading.Event(), threading.Event()

    def clock() -> float:
        if threading.current_thread().name == "zns-route-client":
            if armed.is_set():
                raise Boom("the clock broke")
        elif made.is_set():  # route() tracking its topic, which then wakes the thread
            armed.set()
        return time.monotonic()

    client = RouteClient(NOWHERE, timeout=30, clock=clock)
    made.set()
    try:
        started = time.monotonic()
        with pytest.raises(BackgroundFailure) as info:
            client.route("Orders")
        assert time.monotonic() - started < 15
        assert isinstance(info.value.__cause__, Boom) and "the clock broke" in str(info.value)
    finally:
        client.close()


def test_async_client_task_failure_is_raised_by_route_and_watch() -> None:
    async def main() -> None:
        ctx = BrokenAsyncContext()
        async with AsyncRouteClient(NOWHERE, context=ctx, timeout=60) as client:
            started = time.monotonic()
            with pytest.raises(BackgroundFailure) as info:
                await client.route("Orders")
            assert time.monotonic() - started < 30
            assert_is_the_failure(info)
            with pytest.raises(BackgroundFailure):
                async for _ in client.watch("Orders"):
                    pass
        ctx.term()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_async_watch_in_progress_ends_with_the_failure() -> None:
    broken = [False]

    def clock() -> float:
        if broken[0]:
            raise Boom("no sockets today")
        return time.monotonic()

    async def main() -> None:
        async with AsyncRouteClient(NOWHERE, timeout=60, clock=clock) as client:
            async def follow() -> None:
                async for _ in client.watch("Orders"):
                    pass

            watching = asyncio.create_task(follow())
            await asyncio.sleep(0.05)

            broken[0] = True  # the task's next turn reads the clock
            client.forget("Unwatched")  # which wakes it
            with pytest.raises(BackgroundFailure) as info:
                await asyncio.wait_for(watching, 30)
            assert_is_the_failure(info)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_broker_agent_thread_failure_is_raised_by_every_later_call() -> None:
    ctx = BrokenContext()
    agent = BrokerAgent(NOWHERE, cluster="c", broker_name="b", broker_addr="127.0.0.1:10911",
                        context=ctx)
    deadline = time.monotonic() + 30
    while agent.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(agent.failure, Boom)
    for call in (agent.status, agent.registered_everywhere, lambda: agent.add_topic("T"),
                 agent.close):
        with pytest.raises(BackgroundFailure) as info:
            call()
        assert_is_the_failure(info)
        assert str(info.value).startswith("the BrokerAgent's background thread failed: ")
    ctx.term()


@pytest.mark.timeout(60)
def test_broker_agent_wait_registered_is_woken_by_the_failure() -> None:
    # An hour's timeout: only the failure can end the wait (the test's own timeout fails it).
    ctx = BrokenContext()
    agent = BrokerAgent(NOWHERE, cluster="c", broker_name="b", broker_addr="127.0.0.1:10911",
                        context=ctx)
    with pytest.raises(BackgroundFailure) as info:
        agent.wait_registered(timeout=3600)
    assert_is_the_failure(info)
    ctx.term()


# --- the commands built on them: exit non-zero with one line ---------------------------------


def test_zns_watch_exits_with_one_line_when_its_client_thread_dies(server, monkeypatch) -> None:
    from click.testing import CliRunner

    import zns.drivers.client_base
    from zns.cli import main

    def broken_open_socket(*_args, **_kwargs):
        raise Boom("no sockets today")

    monkeypatch.setattr(zns.drivers.client_base, "open_socket", broken_open_socket)
    result = CliRunner().invoke(main, ["watch", "Orders", "--ns", server.router, "--timeout", "2"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    errors = [line for line in result.stderr.splitlines() if not line.startswith("watching ")]
    assert len(errors) == 1 and errors[0].startswith("zns: ")
    assert errors[0].endswith("failed: Boom: no sockets today")


def test_zns_broker_exits_with_one_line_when_its_agent_thread_dies(monkeypatch, caplog) -> None:
    from click.testing import CliRunner

    import zns.drivers.broker_agent
    from zns.cli import main

    def broken_open_socket(*_args, **_kwargs):
        raise Boom("no sockets today")

    monkeypatch.setattr(zns.drivers.broker_agent, "open_socket", broken_open_socket)
    result = CliRunner().invoke(main, ["broker", "--ns", NOWHERE, "--cluster", "c", "--name", "b",
                                       "--addr", "127.0.0.1:10911"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    assert result.stderr == ""  # the one line is the agent's log line
    failures = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(failures) == 1 and "Boom: no sockets today" in failures[0].getMessage()

"""AsyncRouteClient: the same session as RouteClient, driven by asyncio, on real servers."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from helpers import LOADED_DEADLINE, register_fields
from zns.drivers.async_client import AsyncRouteClient, wait_readable
from zns.core.errors import NameServerUnavailable, NotFound


def client_tasks() -> list[asyncio.Task]:
    """The running clients' tasks (each is named)."""
    return [t for t in asyncio.all_tasks() if t.get_name() == "zns-async-route-client"]


def client_for(*endpoints: str, **kw) -> AsyncRouteClient:
    kw.setdefault("heartbeat_interval", 0.2)
    kw.setdefault("request_timeout", 1.0)
    return AsyncRouteClient(list(endpoints), **kw)


@pytest.mark.timeout(30)
def test_route_and_watch_follow_pushes(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())

    async def scenario():
        async with client_for(server.router) as client:
            assert (await client.route("TopicA")).queues[0].read_queues == 16
            with pytest.raises(NotFound):
                await client.route("Later")
            seen = []

            async def watch():
                async for route in client.watch("Later"):
                    seen.append(route)
                    if route is not None:
                        return route

            task = asyncio.create_task(watch())
            while not seen:
                await asyncio.sleep(0.01)
            peer.ok("register_broker", **register_fields(
                topics={"TopicA": {}, "Later": {"read_queues": 2}}, data_version={"counter": 1}))
            route = await asyncio.wait_for(task, 10)
            assert seen[0] is None
            assert route == peer.ok("get_route", topic="Later").route == await client.route("Later")
            assert (await client.select_queue("Later")).broker_name == "broker-a"

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_follows_the_other_nameserver_when_one_dies(make_server):
    servers = [make_server(), make_server()]
    for srv in servers:
        srv.peer().ok("register_broker", **register_fields())

    async def scenario():
        async with client_for(*(s.router for s in servers)) as client:
            await client.route("TopicA")
            followed = next(s for s in servers if s.router == client.session.endpoint)
            other = next(s for s in servers if s is not followed)
            # Stopped in a thread: stopping blocks (joins the server's thread), and the
            # client's loop must keep running meanwhile.
            await asyncio.to_thread(followed.stop)
            await asyncio.to_thread(other.peer().ok, "register_broker", **register_fields(
                topics={"TopicA": {"read_queues": 9}}, data_version={"counter": 1}))
            async with asyncio.timeout(LOADED_DEADLINE):  # silence, switch, pull: under load
                while (await client.route("TopicA")).queues[0].read_queues != 9:
                    await asyncio.sleep(0.02)
            assert client.session.endpoint == other.router

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_no_nameserver_answers():
    async def scenario():
        async with client_for("tcp://127.0.0.1:1", timeout=0.5) as client:
            with pytest.raises(NameServerUnavailable):
                await client.route("TopicA")

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_slow_watcher_gets_the_latest_route_and_forget_ends_it(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields())

    async def scenario():
        async with client_for(server.router) as client:
            watching = client.watch("TopicA")
            assert (await anext(watching)).queues[0].read_queues == 16
            for counter in range(1, 21):  # 20 changes while the watcher does not read
                peer.ok("register_broker", **register_fields(
                    topics={"TopicA": {"read_queues": counter}},
                    data_version={"counter": counter}))
            revision = peer.ok("get_route", topic="TopicA").revision
            async with asyncio.timeout(10):
                while client.session.cache.revision("TopicA") != revision:
                    await asyncio.sleep(0.02)
            # One route buffered, not twenty: the next one is the latest.
            assert (await anext(watching)).queues[0].read_queues == 20
            client.forget("TopicA")
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(watching), 5)
            assert "TopicA" not in client.session.cache.topics()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_queues_selection_per_topic_and_a_watch_that_starts_with_the_known_route(server):
    from zns.core.queues import read_queues, write_queues

    peer = server.peer()
    topics = {"TopicA": {"write_queues": 2, "read_queues": 3}, "TopicB": {"write_queues": 2}}
    peer.ok("register_broker", **register_fields(topics=topics))
    peer.ok("register_broker", **register_fields(broker_name="broker-b", addr="10.0.0.2:10911",
                                                 topics=topics))

    async def scenario():
        async with client_for(server.router) as client:
            route_a = await client.route("TopicA")
            assert await client.read_queues("TopicA") == read_queues(route_a)
            assert await client.write_queues("TopicA") == write_queues(route_a)
            # a send that failed on broker-a: the next queues are on broker-b only
            for _ in range(3):
                assert (await client.select_queue("TopicA", avoid_broker="broker-a")).broker_name == "broker-b"
            # each topic has its own round-robin: TopicB starts at its first queue
            route_b = await client.route("TopicB")
            assert await client.select_queue("TopicB") == write_queues(route_b)[0]
            client.forget("TopicB")  # a topic nobody watched: nothing to end
            async with contextlib.aclosing(client.watch("TopicA")) as routes:
                async for route in routes:
                    assert route == route_a  # the route already known, first
                    break
            assert client.watching("TopicA") == 0  # an ended watch leaves no buffer behind

    asyncio.run(scenario())


def test_the_defaults_of_an_async_client():
    async def scenario():
        client = AsyncRouteClient("tcp://127.0.0.1:1")
        session = client.session
        assert client.timeout == 5.0
        assert session.request_timeout_ms == 3000 and session.heartbeat_interval_ms == 1000
        assert session.cache.pull_period_ms == 30_000
        assert client.selector.faults is None  # no latency fault avoidance unless asked
        await client.close()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_routes_own_timeout_wins_over_the_clients():
    async def scenario():
        client = client_for("tcp://127.0.0.1:1", timeout=30)  # nobody listens there
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(NameServerUnavailable):
                await client.route("T", timeout=0.2)
            assert asyncio.get_running_loop().time() - started < 20
        finally:
            await client.close()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_wait_ends_at_its_deadline_and_a_silent_socket_is_not_ready():
    import zmq
    import zmq.asyncio

    from zns.core.client_session import FollowServer

    async def scenario():
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)  # a NameServer that never answers
        router.bind("inproc://silent-ns")
        client = AsyncRouteClient("inproc://silent-ns", context=ctx)
        try:
            sockets = client.driver.sockets
            sockets.carry_out(FollowServer(endpoint="inproc://silent-ns"))
            sockets.send(b"a request never answered")
            ready = await asyncio.wait_for(
                wait_readable(sockets.readable(), asyncio.Event(), client.driver.wait_ms(client.driver.now() + 100)), 20)
            assert ready == set()  # the DEALER can send, but has nothing to read
        finally:
            await client.close()
            router.close(0)
            ctx.term()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_the_task_is_named_ended_by_close_and_close_twice_is_fine():
    async def scenario():
        client = client_for("tcp://127.0.0.1:1")
        await client.start()
        (task,) = client_tasks()
        assert task.get_name() == "zns-async-route-client"
        await client.start()  # started once
        assert client_tasks() == [task]
        await client.close()
        assert task.done() and client_tasks() == []
        await client.close()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_an_unanswered_request_is_timed_out_and_asked_again_without_any_traffic():
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)  # a NameServer that reads requests and never answers
    port = router.bind_to_random_port("tcp://127.0.0.1")

    async def scenario():
        client = client_for(f"tcp://127.0.0.1:{port}", request_timeout=0.2)
        try:
            with pytest.raises(NameServerUnavailable):
                await client.route("T", timeout=5)
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
        asked = 0
        while router.poll(0):
            router.recv_multipart()
            asked += 1
        assert asked >= 2  # the session's timers ran: the request was sent again
    finally:
        router.close(0)
        ctx.term()


def test_the_options_of_an_async_client_reach_its_session():
    async def scenario():
        client = AsyncRouteClient("tcp://127.0.0.1:1", zone="z1", fault_tolerance=True,
                                  events="relay:5", timeout=2, request_timeout=0.5,
                                  heartbeat_interval=0.25, pull_period=9)
        session = client.session
        assert session.cache.zone == "z1" and session.events == "tcp://relay:5"
        assert client.selector.faults is not None
        assert client.timeout == 2 and session.request_timeout_ms == 500
        assert session.heartbeat_interval_ms == 250 and session.cache.pull_period_ms == 9000
        await client.close()

    asyncio.run(scenario())

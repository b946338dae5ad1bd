"""zns.drivers.requests against fake NameServers (ROUTERs answering from a thread), in
process: what each call sends, returns and raises, and that it leaves no socket open."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import zmq

from zns.core.errors import BadRequest, NameServerUnavailable, NotFound
from zns.core.schema import Error, GetTopics, GetTopicsReply, decode_request, encode
from zns.drivers import requests
from zns.drivers.requests import call, call_all, call_any

from helpers import wait_for

pytestmark = pytest.mark.timeout(60)

Answer = Callable[[Any], Any]  # request -> reply to send (None: stay silent)


class FakeNameServer:
    """A ROUTER that answers each request with `answer(request)` from its own thread."""

    def __init__(self, ctx: zmq.Context, endpoint: str, answer: Answer, delay_s: float = 0.0) -> None:
        self.endpoint = endpoint
        self.answer = answer
        self.delay_s = delay_s
        self.received: list[Any] = []
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(20):
                continue
            peer, body = self._sock.recv_multipart()
            request = decode_request(body)
            self.received.append(request)
            reply = self.answer(request)
            if reply is None:
                continue
            if self.delay_s:
                time.sleep(self.delay_s)
            self._sock.send_multipart([peer, reply if isinstance(reply, bytes) else encode(reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)


@pytest.fixture
def servers(ctx: zmq.Context) -> Iterator[Callable[..., FakeNameServer]]:
    made: list[FakeNameServer] = []
    count = iter(range(1000))

    def make(answer: Answer, delay_s: float = 0.0) -> FakeNameServer:
        made.append(FakeNameServer(ctx, f"inproc://fake-ns-{next(count)}", answer, delay_s))
        return made[-1]

    yield make
    for server in made:
        server.close()


def topics(*names: str) -> Answer:
    return lambda request: GetTopicsReply(id=request.id, topics=list(names))


def silent(request: Any) -> None:
    return None


@pytest.fixture
def sockets_made(monkeypatch: pytest.MonkeyPatch) -> list[zmq.Socket]:
    """Every socket the calls open (each must be closed when the call returns)."""
    made: list[zmq.Socket] = []
    real = requests.open_socket

    def recording(*args: Any, **kwargs: Any) -> zmq.Socket:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(requests, "open_socket", recording)
    return made


def test_call_sends_the_request_and_returns_the_reply(ctx, servers, sockets_made) -> None:
    ns = servers(topics("a", "b"))
    reply = call(ns.endpoint, GetTopics(id=7, cluster="c1"), context=ctx)
    assert reply == GetTopicsReply(id=7, topics=["a", "b"])
    assert ns.received == [GetTopics(id=7, cluster="c1")]
    assert len(sockets_made) == 1 and sockets_made[0].closed
    assert sockets_made[0].type == zmq.DEALER


def test_call_raises_the_error_a_nameserver_answers(ctx, servers, sockets_made) -> None:
    ns = servers(lambda request: Error(id=request.id, code="not_found", message="no topic T", revision=4))
    with pytest.raises(NotFound, match="no topic T") as caught:
        call(ns.endpoint, GetTopics(), context=ctx)
    assert caught.value.revision == 4
    assert sockets_made[0].closed


def test_call_times_out_with_the_endpoint_and_the_timeout_named(ctx, servers, sockets_made) -> None:
    ns = servers(silent)
    started = time.monotonic()
    with pytest.raises(NameServerUnavailable) as caught:
        call(ns.endpoint, GetTopics(), timeout=0.25, context=ctx)
    assert time.monotonic() - started >= 0.24
    assert str(caught.value) == f"no NameServer answered at {ns.endpoint} within 0.25 s"
    assert sockets_made[0].closed


def test_call_waits_as_long_as_its_timeout(ctx, servers) -> None:
    ns = servers(topics("late"), delay_s=0.3)
    assert call(ns.endpoint, GetTopics(), timeout=30, context=ctx).topics == ["late"]


def test_call_refuses_a_reply_of_another_op(ctx, servers, sockets_made) -> None:
    ns = servers(lambda request: encode({"op": "kv_put", "id": request.id}))
    with pytest.raises(msgspec.DecodeError):
        call(ns.endpoint, GetTopics(), context=ctx)
    assert sockets_made[0].closed


def test_call_uses_the_process_context_by_default(servers) -> None:
    ns = servers(topics())
    with pytest.raises(NameServerUnavailable):  # inproc of another context: nobody there
        call(ns.endpoint, GetTopics(), timeout=0.1)


def test_call_any_returns_the_first_answer_and_its_endpoint(ctx, servers, sockets_made) -> None:
    slow = servers(silent)
    answer = topics("x")

    def once_both_are_asked(request: Any) -> Any:
        # The first answer closes the other sockets at once (linger 0): on a loaded machine the
        # slow server's request could still be queued then. Answering only once it arrived
        # pins that both were asked, without a race.
        wait_for(lambda: slow.received)
        return answer(request)

    fast = servers(once_both_are_asked)
    endpoint, reply = call_any([slow.endpoint, fast.endpoint], GetTopics(id=3), timeout=30,
                               context=ctx)
    assert (endpoint, reply) == (fast.endpoint, GetTopicsReply(id=3, topics=["x"]))
    assert slow.received == [GetTopics(id=3)] and fast.received == [GetTopics(id=3)]
    assert len(sockets_made) == 2 and all(s.closed for s in sockets_made)


def test_call_any_raises_an_error_answer(ctx, servers, sockets_made) -> None:
    ns = servers(lambda request: Error(id=request.id, code="bad_request", message="no"))
    with pytest.raises(BadRequest, match="no"):
        call_any(iter([ns.endpoint]), GetTopics(), context=ctx)
    assert sockets_made[0].closed


def test_call_any_times_out_naming_every_endpoint_tried(ctx, servers, sockets_made) -> None:
    a, b = servers(silent), servers(silent)
    with pytest.raises(NameServerUnavailable) as caught:
        call_any(iter([a.endpoint, b.endpoint]), GetTopics(), timeout=0.2, context=ctx)
    assert str(caught.value) == f"no NameServer answered within 0.2 s (tried {a.endpoint}, {b.endpoint})"
    assert all(s.closed for s in sockets_made)


def test_call_any_waits_as_long_as_its_timeout_and_uses_the_process_context(ctx, servers) -> None:
    ns = servers(topics("late"), delay_s=0.3)
    assert call_any([ns.endpoint], GetTopics(), timeout=30, context=ctx)[1].topics == ["late"]
    with pytest.raises(NameServerUnavailable):
        call_any([ns.endpoint], GetTopics(), timeout=0.1)


def test_call_all_returns_each_endpoints_reply_error_or_timeout_in_order(ctx, servers, sockets_made) -> None:
    quiet = servers(silent)
    ok = servers(topics("t"))
    refusing = servers(lambda request: Error(id=request.id, code="bad_request", message="refused"))
    order = [quiet.endpoint, ok.endpoint, refusing.endpoint]
    results = call_all(iter(order), GetTopics(id=9), timeout=0.5, context=ctx)
    assert list(results) == order
    assert results[ok.endpoint] == GetTopicsReply(id=9, topics=["t"])
    assert isinstance(results[refusing.endpoint], BadRequest)
    assert str(results[refusing.endpoint]) == "refused"
    assert isinstance(results[quiet.endpoint], NameServerUnavailable)
    assert str(results[quiet.endpoint]) == f"no answer from {quiet.endpoint} within 0.5 s"
    assert len(sockets_made) == 3 and all(s.closed for s in sockets_made)
    assert all(r == [GetTopics(id=9)] for r in (quiet.received, ok.received, refusing.received))


def test_call_all_returns_as_soon_as_everyone_answered(ctx, servers) -> None:
    a, b = servers(topics("a")), servers(topics("b"), delay_s=0.2)
    started = time.monotonic()
    results = call_all([a.endpoint, b.endpoint], GetTopics(), timeout=10, context=ctx)
    assert time.monotonic() - started < 9
    assert [r.topics for r in results.values()] == [["a"], ["b"]]


def test_call_all_with_no_time_left_asks_nobody_more(ctx, servers) -> None:
    ns = servers(topics("a"), delay_s=0.3)
    results = call_all([ns.endpoint], GetTopics(), timeout=0, context=ctx)
    assert isinstance(results[ns.endpoint], NameServerUnavailable)
    assert str(results[ns.endpoint]) == f"no answer from {ns.endpoint} within 0 s"


def test_call_all_uses_the_process_context_by_default(servers) -> None:
    ns = servers(topics("a"))
    results = call_all([ns.endpoint], GetTopics(), timeout=0.1)
    assert isinstance(results[ns.endpoint], NameServerUnavailable)


def _another_op(request: Any) -> bytes:
    return encode({"op": "kv_put", "id": request.id})


def test_call_any_and_call_all_refuse_a_reply_of_another_op(ctx, servers) -> None:
    ns = servers(_another_op)
    with pytest.raises(msgspec.DecodeError):
        call_any([ns.endpoint], GetTopics(), context=ctx)
    with pytest.raises(msgspec.DecodeError):
        call_all([ns.endpoint], GetTopics(), context=ctx)


@pytest.mark.parametrize("which", ["call", "call_any", "call_all"])
def test_the_default_timeout_is_3_seconds(servers, which, monkeypatch) -> None:
    ns = servers(silent)
    waited: list[int] = []
    real_poll = zmq.Socket.poll
    # Only this thread's waits: the patch is process-wide, and other threads poll too (the
    # fake server's, and any a test before this one in the same worker left running).
    me = threading.current_thread()

    # The wait is cut short (the timeout asked for is recorded, then 50 ms waited).
    def poll(self: zmq.Socket, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        if threading.current_thread() is me:
            waited.append(timeout)  # type: ignore[arg-type]
        return real_poll(self, 50 if threading.current_thread() is me else timeout, flags)

    real_poller_poll = zmq.Poller.poll

    def poller_poll(self: zmq.Poller, timeout: int | None = None) -> list:
        if threading.current_thread() is me:
            waited.append(timeout)  # type: ignore[arg-type]
        return real_poller_poll(self, 50 if threading.current_thread() is me else timeout)

    monkeypatch.setattr(zmq.Socket, "poll", poll)
    monkeypatch.setattr(zmq.Poller, "poll", poller_poll)
    if which == "call":
        with pytest.raises(NameServerUnavailable, match="within 3 s"):
            call(ns.endpoint, GetTopics())
    elif which == "call_any":
        with pytest.raises(NameServerUnavailable, match="within 3 s"):
            call_any([ns.endpoint], GetTopics())
    else:
        clock = iter([100.0, 100.0, 200.0])
        monkeypatch.setattr(requests, "time", type("T", (), {"monotonic": staticmethod(lambda: next(clock))}))
        results = call_all([ns.endpoint], GetTopics())
        assert str(results[ns.endpoint]) == f"no answer from {ns.endpoint} within 3 s"
    assert waited[0] == 3000


def test_call_all_with_the_time_exactly_up_asks_nobody_more(ctx, servers, monkeypatch) -> None:
    ns = servers(topics("a"))
    real = time.monotonic
    readings = iter([50.0, 50.5])

    def monotonic() -> float:
        value = next(readings)
        if value == 50.5:  # the reply is there by now: only the deadline keeps it out
            wait_for(lambda: ns.received, timeout=10)
            time.sleep(0.2)
        return value

    monkeypatch.setattr(requests, "time", type("T", (), {"monotonic": staticmethod(monotonic)}))
    results = call_all([ns.endpoint], GetTopics(), timeout=0.5, context=ctx)
    assert isinstance(results[ns.endpoint], NameServerUnavailable)
    assert real() > 0

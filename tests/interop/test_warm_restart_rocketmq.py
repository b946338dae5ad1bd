"""A restart of zns under a real RocketMQ 5.3.3 broker and client: with its state dump the
restarted zns answers the route at once; without it (the cold restart every zns did
before `--state-path`) clients get TOPIC_NOT_EXIST until the broker's next registration
(issue 30 items 6 and 7; the figures printed are in bench/results.md).

One zns on fixed ports (a restarted one must be where the broker and client look), one
broker registering every 10 s (the shortest period RocketMQ allows; bench/results.md's
figures were measured with the default 30 s, which only lengthens the cold restart's
wait). Each restart is a SIGKILL right after a completed registration, so the next one is
a whole period away; from the new process's start, GET_ROUTEINFO_BY_TOPIC is asked every
50 ms over a fresh connection, as a client does, and the real Java client asks once. The
broker confirming itself after the warm restart is read from /readyz, which is ready only
once every restored broker registered again (or was removed, which the log would say).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import rocketmq
from rocketmq import Broker, Phases, unique_topic, wait_until
from test_zns_nameserver import Zns, broker_registrations, free_port, remoting_request
from zns.core import warm
from zns.core.remoting.constants import RequestCode, ResponseCode

pytestmark = [pytest.mark.interop, pytest.mark.timeout(600)]

TOPIC_NOT_EXIST = ResponseCode.TOPIC_NOT_EXIST
REGISTER_PERIOD_MS = 10_000  # the shortest RocketMQ allows (BrokerController clamps to 10-60 s)


def readyz(zns: Zns) -> int | None:
    """The restarted zns's /readyz status code (None: not answering yet)."""
    found = re.search(r"metrics on (http://\S+)/metrics", zns.output())
    if found is None:
        return None
    try:
        with urllib.request.urlopen(found.group(1) + "/readyz", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:  # 503 while restored brokers are unconfirmed
        return refused.code
    except OSError:
        return None


def route_code(addr: str, topic: str) -> int | None:
    """GET_ROUTEINFO_BY_TOPIC's response code; None while nothing answers on `addr`."""
    try:
        return remoting_request(addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic},
                                timeout=2).code
    except OSError:
        return None


def restart_and_time(zns: Zns, broker: Broker, topic: str, args: list[str],
                     workdir: Path) -> tuple[Zns, float, float | None, dict, int | None]:
    """SIGKILL `zns` right after a registration, start it again with `args`; (the new zns,
    seconds from its start to its first route answer, to its first TOPIC_NOT_EXIST (None:
    none), what the Java client got, /readyz's code at the first route answer)."""
    seen = broker_registrations(broker, zns.addr)
    wait_until(lambda: broker_registrations(broker, zns.addr) > seen, 3 * REGISTER_PERIOD_MS / 1000,
               "a periodic registration of the broker")
    zns.kill()
    started = time.monotonic()
    again = Zns(workdir, *args)
    client: dict = {}
    asking = threading.Thread(target=lambda: client.update(rocketmq.route(again.addr, topic)),
                              daemon=True)
    asking.start()  # the real client, at once: its JVM takes a few seconds to ask
    first_not_exist = None
    while True:
        code = route_code(again.addr, topic)
        if code == TOPIC_NOT_EXIST and first_not_exist is None:
            first_not_exist = time.monotonic() - started
        if code == ResponseCode.SUCCESS:
            answered = time.monotonic() - started
            ready_then = readyz(again)  # before the broker's next registration, a period away
            break
        assert time.monotonic() - started < 60, f"no route 60 s after the restart (last {code})"
        time.sleep(0.05)
    asking.join(120)
    return again, answered, first_not_exist, client, ready_then


def test_a_warm_restart_answers_routes_at_once_and_a_cold_one_after_the_next_registration(
        rmq: rocketmq.ProcessGroup, tmp_path: Path) -> None:
    phase = Phases("warm restart")
    router, remoting = f"tcp://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    # /readyz's grace is longer than the test: ready means the broker registered again.
    fixed = ["--router", router, "--remoting", remoting, "--metrics", "127.0.0.1:0",
             "--ready-grace", "600"]
    zns = Zns(tmp_path / "zns", *fixed)
    try:
        broker = rmq.broker(zns.addr, "broker-w",
                            config={"registerNameServerPeriod": REGISTER_PERIOD_MS})
        topic = unique_topic("Warm")
        assert rocketmq.produce(zns.addr, topic, 1)["sent"] == 1  # auto-created by the broker
        wait_until(lambda: route_code(zns.addr, topic) == ResponseCode.SUCCESS, 30, "the route")
        dump = tmp_path / "zns" / "kv.json.state"
        wait_until(lambda: dump.exists() and any(
            t == topic for t, _ in warm.decode_dump(dump.read_bytes()).table.topics), 10,
            "the topic in the state dump")
        phase("zns, the broker and the topic up")

        zns, warm_s, warm_not_exist, client, ready_then = restart_and_time(zns, broker, topic, fixed,
                                                               tmp_path / "zns")
        print(f"  warm restart: first route answer {warm_s:.2f} s after the start, "
              f"TOPIC_NOT_EXIST {'never' if warm_not_exist is None else 'seen'}; "
              f"Java client: ok={client.get('ok')}")
        assert warm_not_exist is None and client.get("ok") is not False, client
        # The broker confirms itself at its next registration, long before its 40 s window
        # ends: /readyz turns ready then, and no broker was removed as not_confirmed.
        assert ready_then == 503  # the restored broker had not registered again yet
        wait_until(lambda: readyz(zns) == 200, 3 * REGISTER_PERIOD_MS / 1000,
                   "/readyz after the broker's registration")
        assert "(not_confirmed)" not in zns.output()
        assert route_code(zns.addr, topic) == ResponseCode.SUCCESS
        phase("warm restart measured, the broker confirmed")

        cold_args = [*fixed, "--state-path", str(tmp_path / "cold" / "state.dump")]
        zns, cold_s, cold_not_exist, client, _ = restart_and_time(zns, broker, topic, cold_args,
                                                               tmp_path / "zns-cold")
        print(f"  cold restart: TOPIC_NOT_EXIST from {cold_not_exist:.2f} s, first route answer "
              f"{cold_s:.2f} s after the start (the broker's next registration); Java client: "
              f"code {client.get('code')}")
        assert cold_not_exist is not None and cold_s > warm_s
        assert client.get("code") == TOPIC_NOT_EXIST, client
        phase("cold restart measured")
    finally:
        zns.kill()

"""What the operator commands print (zns.cli.tools), exactly: tables, perm bits, JSON shapes,
which stream each line goes to, and the exit status — against NameServers faked in process
(`FakeNameServers` stands in for zns.drivers.requests), so every case is fast and each answer
(a reply, an error reply, no answer) is chosen by the test."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click
import msgspec
import pytest
import zmq
from click.testing import CliRunner

import zns.cli.tools as tools
from zns.cli import main
from zns.core.errors import NameServerUnavailable, NoPermission, NotFound, ZnsError
from zns.core.schema import (
    FollowerStatus, WorkerStatus,
    AddWritePermReply,
    DeleteTopic,
    BrokerData,
    DeleteTopicReply,
    GetClusterInfo,
    GetClusterInfoReply,
    GetRoute,
    GetRouteReply,
    GetTopicsReply,
    KvDeleteReply,
    KvPutReply,
    LiveBroker,
    QueueData,
    Request,
    StatusReply,
    TopicRoute,
    WipeWritePermReply,
)

A, B, C, D = "tcp://a:1", "tcp://b:2", "tcp://c:3", "tcp://d:4"
Answer = Callable[[Request], Any]


@pytest.fixture(autouse=True)
def fake_names_resolve(monkeypatch):
    """a, b, c, d are names only the fake NameServers below answer to: they resolve here (the
    check of names that do not is tested on its own, in test_cli_tools.py)."""
    monkeypatch.setattr(tools, "_resolvable", lambda endpoints: endpoints)


class FakeNameServers:
    """NameServers by endpoint: each a function from a request to its reply, or to the exception
    the request functions raise (an ErrorReply, NameServerUnavailable)."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.asked: list[tuple[str, str, float]] = []  # (endpoint, op, timeout)
        self.requests: list[Request] = []

    def _one(self, endpoint: str, request: Request, timeout: float) -> Any:
        self.asked.append((endpoint, type(request).__name__, timeout))
        self.requests.append(request)
        answer = self.answers.get(endpoint, lambda _: NameServerUnavailable("silent"))(request)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def call(self, endpoint: str, request: Request, timeout: float = 3.0) -> Any:
        return self._one(endpoint, request, timeout)

    def call_any(self, endpoints: list[str], request: Request, timeout: float = 3.0
                 ) -> tuple[str, Any]:
        for endpoint in endpoints:
            try:
                return endpoint, self._one(endpoint, request, timeout)
            except NameServerUnavailable:
                continue
        raise NameServerUnavailable("none answered")

    def call_all(self, endpoints: list[str], request: Request, timeout: float = 3.0
                 ) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for endpoint in endpoints:
            try:
                results[endpoint] = self._one(endpoint, request, timeout)
            except (ZnsError, TimeoutError) as exc:
                results[endpoint] = exc
        return results


@pytest.fixture
def fake(monkeypatch) -> FakeNameServers:
    servers = FakeNameServers()
    for name in ("call", "call_any", "call_all"):
        monkeypatch.setattr(tools, name, getattr(servers, name))
    monkeypatch.delenv("ZNS_ADDR", raising=False)
    return servers


def zns(*args: str, ns: str = A, timeout: str = "2") -> Any:
    return CliRunner().invoke(main, [*args, "--ns", ns, "--timeout", timeout])


def status_reply(**fields: Any) -> StatusReply:
    base: dict[str, Any] = dict(epoch="e1", revision=7, version="1.2", uptime_ms=3_600_000,
                                brokers=2, topics=3, pub_endpoint="tcp://a:9")
    return StatusReply(**{**base, **fields})


def cluster_info(*brokers: str) -> GetClusterInfoReply:
    return GetClusterInfoReply(
        brokers={b: BrokerData(cluster="c1", broker_name=b, addrs={0: "h:1"}) for b in brokers},
        clusters={"c1": list(brokers)} if brokers else {}, live=[])


# --- formatting helpers ---------------------------------------------------------------------


def test_perm_text_shows_each_bit_in_its_place():
    assert [tools.perm_text(p) for p in range(8)] == [
        "---", "--x", "-w-", "-wx", "r--", "r-x", "rw-", "rwx"]


def test_a_table_pads_each_column_to_its_widest_cell_and_fills_short_rows():
    text = tools.table(["name", "n", "zone"], [["alpha", 1, "z"], ["b", 22222], []])
    assert text.split("\n") == [
        "NAME   N      ZONE",
        "alpha  1      z",
        "b      22222",
        "",
    ]
    assert tools.table(["a", "b"], []) == "A  B"
    # A cell wider than its header widens the column; the last column is never padded.
    assert tools.table(["x", "y"], [["1", "long value"]]) == "X  Y\n1  long value"


def test_the_route_table_lists_addresses_by_id_queues_with_perm_bits_and_order_conf():
    route = TopicRoute(
        topic="T",
        queues=[QueueData(broker_name="b1", read_queues=8, write_queues=4, perm=6, sys_flag=0),
                QueueData(broker_name="b2", read_queues=2, write_queues=2, perm=4, sys_flag=1)],
        brokers=[BrokerData(cluster="c1", broker_name="b1", addrs={1: "h:2", 0: "h:1"},
                            zone="z1"),
                 BrokerData(cluster="c2", broker_name="b2", addrs={0: "10.0.0.2:10911"})],
        filter_servers={})
    assert tools.route_table(route).splitlines() == [
        "CLUSTER  BROKER  ID  ADDRESS         ZONE",
        "c1       b1      0   h:1             z1",
        "c1       b1      1   h:2             z1",
        "c2       b2      0   10.0.0.2:10911  -",
        "",
        "BROKER  READ  WRITE  PERM     SYS_FLAG",
        "b1      8     4      6 (rw-)  0",
        "b2      2     2      4 (r--)  1",
    ]
    route.order_conf = "b1:4;b2:2"
    assert tools.route_table(route).endswith("1\n\norder_conf: b1:4;b2:2")


def test_json_is_the_replys_fields_in_their_order_indented_without_the_envelope(capsys):
    tools._print_json(status_reply(id=5))
    out = capsys.readouterr().out
    assert out == json.dumps({
        "epoch": "e1", "revision": 7, "version": "1.2", "uptime_ms": 3_600_000, "brokers": 2,
        "topics": 3, "pub_endpoint": "tcp://a:9", "peers": {}, "remoting": ""}, indent=2) + "\n"
    assert tools._builtins([1, 2]) == [1, 2]  # not a reply: as it is


def test_the_words_for_no_answer_and_for_an_error_reply():
    assert tools.unreachable([A, B], 0.5) == f"no answer from {A}, {B} within 0.5 s (a CURVE server needs --server-key)"
    assert tools.unreachable([A], 3.0) == f"no answer from {A} within 3 s (a CURVE server needs --server-key)"
    gone = NameServerUnavailable("x")
    refused = NoPermission("not yours")
    assert tools._error_json(A, refused, 2) == {"error": "no_permission", "message": "not yours"}
    assert tools._error_json(A, gone, 2) == {"error": "unreachable",
                                             "message": f"no answer from {A} within 2 s (a CURVE server needs --server-key)"}
    assert tools._error_line(A, refused, 2) == f"zns: {A}: error no_permission: not yours"
    assert tools._error_line(A, gone, 0.25) == f"zns: no answer from {A} within 0.25 s (a CURVE server needs --server-key)"
    assert (tools._exit_code(refused), tools._exit_code(gone)) == (1, 3)


def test_fail_outside_a_command_says_it_on_stderr(capsys, monkeypatch):
    # No click context at all (a runner such as mutmut may itself be a click command).
    monkeypatch.setattr(click.globals._local, "stack", [], raising=False)
    with pytest.raises(SystemExit) as ended:
        tools.fail("it broke", 4)
    assert ended.value.code == 4
    assert capsys.readouterr() == ("", "zns: it broke\n")
    with pytest.raises(SystemExit):
        tools.fail("no such thing", 1, "not_found")
    assert capsys.readouterr() == ("", "zns: error not_found: no such thing\n")


def test_fail_with_json_says_failed_unless_told_what(capsys):
    with click.Context(click.Command("x")) as ctx:
        ctx.meta[tools.JSON_META] = True
        with pytest.raises(SystemExit) as ended:
            tools.fail("it broke", 1)
        assert ended.value.code == 1
        assert json.loads(capsys.readouterr().out) == {"error": "failed", "message": "it broke"}


# --- the target: NameServers, CURVE, --json -----------------------------------------------------


def test_the_target_takes_a_list_a_text_or_nothing(monkeypatch):
    monkeypatch.delenv("ZNS_ADDR", raising=False)
    with click.Context(click.Command("x")) as ctx:
        assert tools.make_target([A, B], 1.5, True, None, None) == tools.Target([A, B], 1.5, True)
        assert ctx.meta[tools.JSON_META] is True
        assert tools.make_target("a:1;b:2", 2, False, None, None).endpoints == [A, B]
        assert ctx.meta[tools.JSON_META] is False
        assert tools.make_target(None, 2, False, None, None).endpoints == ["tcp://127.0.0.1:9876"]
        monkeypatch.setenv("ZNS_ADDR", C)
        assert tools.make_target(None, 2, False, None, None).endpoints == [C]


def test_a_server_key_turns_curve_on_for_the_commands_sockets(monkeypatch, tmp_path):
    applied: list[tuple[Any, Any]] = []
    monkeypatch.setattr(tools, "client_keys", lambda key, pair: ("keys", key, pair))
    monkeypatch.setattr(tools, "apply_client_keys", lambda ctx, keys: applied.append((ctx, keys)))
    with click.Context(click.Command("x")):
        tools.make_target([A], 2, False, "SERVERKEY", "own.key_secret")
    assert applied == [(zmq.Context.instance(), ("keys", "SERVERKEY", "own.key_secret"))]


def test_a_bad_server_key_is_a_usage_error_naming_the_option(tmp_path):
    result = CliRunner().invoke(main, ["status", "--ns", A, "--server-key",
                                       str(tmp_path / "none.key")])
    assert result.exit_code == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: Invalid value for --server-key: server key ") and "none.key" in error


# --- reads: status, route, topics ------------------------------------------------------------


def test_status_shows_every_nameserver_and_exits_with_the_worst(fake):
    fake.answers[A] = lambda r: status_reply(peers={B: True, C: False}, remoting="0.0.0.0:9876")
    fake.answers[B] = lambda r: NoPermission("no")
    fake.answers[D] = lambda r: status_reply()  # no remoting listener, no peers
    out = zns("status", ns=f"{A};{B};{C};{D}", timeout="0.5")
    assert out.exit_code == 3
    assert out.stdout.splitlines() == [
        "NAMESERVER  EPOCH                REVISION  VERSION  UPTIME  BROKERS  TOPICS  EVENTS"
        "     REMOTING      PEERS",
        f"{A}   e1                   7         1.2      3600s   2        3       tcp://a:9"
        f"  0.0.0.0:9876  {B} up, {C} down",
        f"{B}   error no_permission",
        f"{C}   unreachable",
        f"{D}   e1                   7         1.2      3600s   2        3       tcp://a:9"
        f"  -             -",
    ]
    assert out.stderr.splitlines() == [f"zns: {B}: error no_permission: no",
                                       f"zns: no answer from {C} within 0.5 s (a CURVE server needs --server-key)"]
    assert {timeout for *_, timeout in fake.asked} == {0.5}
    # An error reply and no unreachable one: 1. All answered: 0.
    assert zns("status", ns=f"{A};{B}").exit_code == 1
    assert zns("status", ns=A).exit_code == 0


def test_status_lists_the_workers_of_a_nameserver_that_has_them(fake):
    workers = [WorkerStatus(worker=1, pid=41, state="loaded", applied=90, lag_commands=0,
                            lag_ms=0),
               WorkerStatus(worker=2, pid=0, state="down", applied=0, lag_commands=0, lag_ms=0),
               WorkerStatus(worker=3, pid=43, state="loaded", applied=88, lag_commands=2,
                            lag_ms=15)]
    fake.answers[A] = lambda r: status_reply(worker=1, workers=workers)
    fake.answers[B] = lambda r: status_reply()  # one process: no workers table
    out = zns("status", ns=f"{A};{B}")
    assert out.exit_code == 0
    assert out.stdout.splitlines()[4:] == [
        "NAMESERVER  WORKER  PID  STATE   APPLIED  LAG  LAG_MS",
        f"{A}   1       41   loaded  90       0    0",
        f"{A}   2       -    down    0        0    0",
        f"{A}   3       43   loaded  88       2    15",
    ]
    assert "WORKER" not in zns("status", ns=B).stdout


def test_status_lists_the_followers_each_worker_feeds(fake):
    fed = [FollowerStatus(name="eu-1", key="k" * 40, admitted_ms=61_400, applied=88,
                          lag_commands=2, lag_ms=15),
           FollowerStatus(name="eu-2", key="j" * 40, admitted_ms=900, applied=90,
                          lag_commands=0, lag_ms=0)]
    workers = [WorkerStatus(worker=1, pid=41, state="loaded", applied=90, lag_commands=0,
                            lag_ms=0, followers=fed),
               WorkerStatus(worker=2, pid=42, state="loaded", applied=90, lag_commands=0,
                            lag_ms=0, followers=[])]
    fake.answers[A] = lambda r: status_reply(worker=1, workers=workers)
    out = zns("status", ns=A)
    assert out.exit_code == 0
    assert out.stdout.splitlines()[7:] == [
        "NAMESERVER  WORKER  FOLLOWER  APPLIED  LAG  LAG_MS  ADMITTED",
        f"{A}   1       eu-1      88       2    15      61s",
        f"{A}   1       eu-2      90       0    0       1s",
    ]
    answer = json.loads(zns("status", "--json", ns=A).stdout)[A]["workers"]
    assert answer[0]["followers"][0] == {"name": "eu-1", "key": "k" * 40, "admitted_ms": 61_400,
                                         "applied": 88, "lag_commands": 2, "lag_ms": 15}
    assert answer[1]["followers"] == []
    # Without --followers there is no such field, and no table.
    fake.answers[A] = lambda r: status_reply(worker=1, workers=[
        msgspec.structs.replace(workers[0], followers=msgspec.UNSET)])
    out = zns("status", ns=A)
    assert "FOLLOWER" not in out.stdout
    assert "followers" not in json.loads(zns("status", "--json", ns=A).stdout)[A]["workers"][0]


def test_status_as_json_is_one_entry_per_nameserver(fake):
    fake.answers[A] = lambda r: status_reply()
    fake.answers[B] = lambda r: NoPermission("no")
    out = zns("status", "--json", ns=f"{A};{B};{C}")
    assert (out.exit_code, out.stderr) == (3, "")
    answer = json.loads(out.stdout)
    assert answer[A]["uptime_ms"] == 3_600_000 and "op" not in answer[A] and "id" not in answer[A]
    assert answer[B] == {"error": "no_permission", "message": "no"}
    assert answer[C] == {"error": "unreachable", "message": f"no answer from {C} within 2 s (a CURVE server needs --server-key)"}


def route_reply() -> GetRouteReply:
    return GetRouteReply(revision=4, epoch="e1", route=TopicRoute(
        topic="T", queues=[QueueData(broker_name="b1", read_queues=4, write_queues=4, perm=6,
                                     sys_flag=0)],
        brokers=[BrokerData(cluster="c1", broker_name="b1", addrs={0: "h:1"}, zone="z1")],
        filter_servers={}))


def test_route_asks_the_first_nameserver_that_answers_and_prints_the_table(fake):
    fake.answers[B] = lambda r: route_reply()
    out = zns("route", "T", ns=f"{A};{B}")
    assert out.exit_code == 0, out.output
    assert out.stdout == f"topic T (revision 4, epoch e1)\n\n{tools.route_table(route_reply().route)}\n"
    assert fake.asked == [(A, "GetRoute", 2.0), (B, "GetRoute", 2.0)]


def test_a_command_that_ends_in_an_error_says_it_once_in_text_or_json(fake):
    fake.answers[A] = lambda r: NotFound("no route for topic 'T'")
    out = zns("route", "T")
    assert (out.exit_code, out.stdout) == (1, "")
    assert out.stderr == "zns: error not_found: no route for topic 'T'\n"
    out = zns("route", "T", "--json")
    assert (out.exit_code, out.stderr) == (1, "")
    assert json.loads(out.stdout) == {"error": "not_found", "message": "no route for topic 'T'"}
    out = zns("route", "T", ns=B, timeout="0.3")
    assert (out.exit_code, out.stdout) == (3, "")
    assert out.stderr == f"zns: no answer from {B} within 0.3 s (a CURVE server needs --server-key)\n"
    out = zns("route", "T", "--json", ns=B, timeout="0.3")
    assert json.loads(out.stdout) == {"error": "unreachable",
                                      "message": f"no answer from {B} within 0.3 s (a CURVE server needs --server-key)"}


def test_route_zone_names_the_zones_there_are(fake):
    whole_fails = {"value": False}

    def answer(request: Request) -> Any:
        assert isinstance(request, GetRoute)
        if request.topic != "T":
            return NotFound(f"no route for topic {request.topic!r}")
        reply = route_reply()
        reply.route.brokers.append(BrokerData(cluster="c1", broker_name="b2", addrs={0: "h:2"}))
        if request.zone:
            reply.route.brokers, reply.route.queues = [], []
        elif whole_fails["value"]:
            return NameServerUnavailable("gone")
        return reply

    fake.answers[A] = answer
    out = zns("route", "T", "--zone", "z2")
    assert (out.exit_code, out.stdout) == (1, "")
    assert out.stderr == "zns: error not_found: no broker of 'T' is in zone 'z2' (its brokers' " \
                         "zones: (none), z1)\n"
    assert fake.asked == [(A, "GetRoute", 2.0)] * 2
    assert [r.zone for r in fake.requests] == ["z2", ""]
    whole_fails["value"] = True
    out = zns("route", "T", "--zone", "z2", "--json")
    assert (out.exit_code, json.loads(out.stdout)) == (1, {
        "error": "not_found", "message": "no broker of 'T' is in zone 'z2' (its brokers' zones: "
                                         "unknown)"})


def test_route_as_json_and_a_route_without_brokers(fake):
    fake.answers[A] = lambda r: route_reply()
    out = zns("route", "T", "--json")
    assert (out.exit_code, out.stderr) == (0, "")
    assert out.stdout == json.dumps(json.loads(json.dumps(tools._builtins(route_reply()))),
                                    indent=2) + "\n"
    empty = route_reply()
    empty.route.brokers = []
    fake.answers[A] = lambda r: empty
    out = zns("route", "T")  # no zone asked for: nothing to explain
    assert out.exit_code == 0 and out.stdout.startswith("topic T (revision 4, epoch e1)\n")


def test_topics_asks_for_the_cluster_given_and_checks_it_only_when_nothing_came(fake):
    fake.answers[A] = lambda r: (cluster_info("b1") if isinstance(r, GetClusterInfo) else
                                 GetTopicsReply(topics=["T1"] if r.cluster else ["T1", "T2"]))
    out = zns("topics", "--cluster", "c1")
    assert (out.exit_code, out.stdout) == (0, "T1\n")
    assert [op for _, op, _ in fake.asked] == ["GetTopics"]
    assert zns("topics").stdout == "T1\nT2\n"


def test_topics_of_an_unknown_cluster_names_the_clusters_there_are(fake):
    fake.answers[A] = lambda r: (GetTopicsReply(topics=[]) if not isinstance(r, GetClusterInfo)
                                 else cluster_info("b1"))
    out = zns("topics", "--cluster", "nope")
    assert out.exit_code == 1
    assert out.stderr == "zns: error not_found: no cluster named 'nope' (clusters: c1)\n"
    fake.answers[A] = lambda r: (GetTopicsReply(topics=[]) if not isinstance(r, GetClusterInfo)
                                 else cluster_info())
    assert zns("topics", "--cluster", "nope").stderr.endswith("(clusters: none)\n")
    # A known cluster without topics, or no cluster asked for: no topics, no error.
    fake.answers[A] = lambda r: (GetTopicsReply(topics=[]) if not isinstance(r, GetClusterInfo)
                                 else cluster_info("b1"))
    assert (zns("topics", "--cluster", "c1").exit_code, zns("topics").exit_code) == (0, 0)
    # None is said on stderr (stdout stays a list, empty), not silence (issue 34 item 5).
    out = zns("topics")
    assert (out.stdout, out.stderr) == ("", "no topics\n")
    # The cluster list cannot be read: the (empty) answer stands.
    fake.answers[A] = lambda r: (GetTopicsReply(topics=[]) if not isinstance(r, GetClusterInfo)
                                 else NoPermission("no"))
    out = zns("topics", "--cluster", "nope")
    assert (out.exit_code, out.stdout, out.stderr) == (0, "", "no topics in cluster nope\n")


def test_clusters_shows_each_address_with_its_last_heartbeat(fake):
    info = cluster_info("b1")
    info.live = [LiveBroker(cluster="c1", broker_addr="h:1", broker_name="b1", broker_id=0,
                            last_heartbeat_ms=1050, timeout_ms=10_000,
                            data_version={"timestamp": 0, "counter": 0})]
    info.brokers["b1"].addrs[1] = "h:2"
    fake.answers[A] = lambda r: info
    out = zns("clusters")
    assert out.stdout.splitlines() == [
        "CLUSTER  BROKER  ID  ADDRESS  ZONE  LAST HEARTBEAT  TIMEOUT",
        "c1       b1      0   h:1      -     1.1s ago        10s",
        "c1       b1      1   h:2      -     -               -",
    ]
    out = zns("clusters", "--json")
    assert (out.exit_code, out.stderr) == (0, "")
    answer = json.loads(out.stdout)
    assert answer["clusters"] == {"c1": ["b1"]} and answer["live"][0]["last_heartbeat_ms"] == 1050
    assert "op" not in answer


# --- writes: one line per NameServer ----------------------------------------------------------


def test_a_write_reports_each_nameserver_on_its_stream_and_exits_with_the_worst(fake):
    fake.answers[A] = lambda r: WipeWritePermReply(changed=2)
    fake.answers[B] = lambda r: NoPermission("admins only")
    out = zns("wipe-write-perm", "b1", ns=f"{A};{B};{C}", timeout="0.5")
    assert out.exit_code == 3
    assert out.stdout == f"{A}: 2 queue data changed\n"
    assert out.stderr.splitlines() == [f"zns: {B}: error no_permission: admins only",
                                       f"zns: no answer from {C} within 0.5 s (a CURVE server needs --server-key)"]
    assert {timeout for *_, timeout in fake.asked} == {0.5}
    assert zns("wipe-write-perm", "b1", ns=f"{A};{B}").exit_code == 1
    assert zns("wipe-write-perm", "b1", ns=A).exit_code == 0


def test_a_write_as_json_is_one_entry_per_nameserver_and_nothing_on_stderr(fake):
    fake.answers[A] = lambda r: AddWritePermReply(changed=3)
    fake.answers[B] = lambda r: NoPermission("admins only")
    out = zns("add-write-perm", "b1", "--json", ns=f"{A};{B};{C}")
    assert (out.exit_code, out.stderr) == (3, "")
    assert json.loads(out.stdout) == {
        A: {"changed": 3},
        B: {"error": "no_permission", "message": "admins only"},
        C: {"error": "unreachable", "message": f"no answer from {C} within 2 s (a CURVE server needs --server-key)"},
    }


def test_a_broker_no_nameserver_knows_is_not_found_and_a_known_one_is_not(fake):
    fake.answers[A] = lambda r: (cluster_info("b1", "b2") if isinstance(r, GetClusterInfo)
                                 else WipeWritePermReply(changed=0))
    out = zns("wipe-write-perm", "nobroker")
    assert (out.exit_code, out.stdout) == (1, "")
    assert out.stderr == (f"zns: {A}: error not_found: no broker named 'nobroker' "
                          f"(brokers: b1, b2)\n")
    out = zns("wipe-write-perm", "b2")  # known, nothing to change: no error
    assert (out.exit_code, out.stdout) == (0, f"{A}: 0 queue data changed\n")
    fake.answers[A] = lambda r: (cluster_info() if isinstance(r, GetClusterInfo)
                                 else AddWritePermReply(changed=0))
    assert "(brokers: none)" in zns("add-write-perm", "x").stderr
    assert [(op, timeout) for _, op, timeout in fake.asked if op == "GetClusterInfo"] == [
        ("GetClusterInfo", 2.0)] * 3  # with the command's --timeout
    # The cluster list cannot be read: the write's own answer is reported.
    fake.answers[A] = lambda r: (NoPermission("no") if isinstance(r, GetClusterInfo)
                                 else AddWritePermReply(changed=0))
    out = zns("add-write-perm", "x")
    assert (out.exit_code, out.stdout) == (0, f"{A}: 0 queue data changed\n")
    # Something changed: the broker exists, nobody asks.
    fake.asked.clear()
    fake.answers[A] = lambda r: (cluster_info() if isinstance(r, GetClusterInfo)
                                 else AddWritePermReply(changed=1))
    out = zns("add-write-perm", "x")
    assert (out.exit_code, out.stdout) == (0, f"{A}: 1 queue data changed\n")
    assert [op for _, op, _ in fake.asked] == ["AddWritePerm"]


def test_delete_topic_names_what_matched_nothing(fake):
    removed = {"value": False}
    fake.answers[A] = lambda r: (cluster_info("b1") if isinstance(r, GetClusterInfo)
                                 else DeleteTopicReply(removed=removed["value"]))
    out = zns("delete-topic", "T", "--cluster", "c9")
    assert out.stderr == f"zns: {A}: error not_found: no cluster named 'c9' (clusters: c1)\n"
    out = zns("delete-topic", "T", "--cluster", "c1")
    assert out.stderr == (f"zns: {A}: error not_found: topic 'T' has no queues on cluster 'c1' "
                          f"(or does not exist)\n")
    fake.asked.clear()
    out = zns("delete-topic", "T")
    assert out.stderr == f"zns: {A}: error not_found: no topic named 'T'\n"
    assert [op for _, op, _ in fake.asked] == ["DeleteTopic"]  # no cluster: nothing to check
    removed["value"] = True
    fake.requests.clear()
    out = zns("delete-topic", "T", "--cluster", "c1")
    assert (out.exit_code, out.stdout) == (0, f"{A}: deleted\n")
    assert fake.requests == [DeleteTopic(topic="T", cluster="c1")]


def test_kv_writes_say_what_they_did(fake):
    fake.answers[A] = lambda r: KvPutReply()
    assert zns("kv", "put", "ns", "k", "v").stdout == f"{A}: stored\n"
    fake.answers[A] = lambda r: KvDeleteReply(removed=False)
    assert zns("kv", "delete", "ns", "k").stdout == f"{A}: not there\n"
    fake.answers[A] = lambda r: KvDeleteReply(removed=True)
    assert zns("kv", "delete", "ns", "k").stdout == f"{A}: deleted\n"


# --- zns broker, in process ---------------------------------------------------------------------


def run_broker(monkeypatch: Any, agent: type, args: list[str]) -> Any:
    """`zns broker ARGS` in process, with `agent` as its BrokerAgent. The command installs
    SIGTERM and SIGINT handlers (a test stops it with SIGTERM); they are put back after."""
    import signal

    monkeypatch.setattr(tools, "BrokerAgent", agent)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return CliRunner().invoke(main, ["broker", *args])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@pytest.mark.timeout(60)
def test_broker_registers_as_configured_says_so_and_unregisters_on_sigterm(server, monkeypatch):
    import os
    import signal

    from zns.drivers.broker_agent import BrokerAgent

    peer = server.peer()
    seen: list[Any] = []
    made: list[dict[str, Any]] = []

    class Agent(BrokerAgent):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs)
            super().__init__(*args, **kwargs)

        def registered_everywhere(self) -> bool:
            done = super().registered_everywhere()
            if done:  # what the NameServer holds now; then stop as an operator would
                seen.append((peer.ok("get_cluster_info"), peer.ok("get_route", topic="Orders")))
                os.kill(os.getpid(), signal.SIGTERM)
            return done

    result = run_broker(monkeypatch, Agent, [
        "--ns", server.router, "--cluster", "c9", "--name", "bk-9",
        "--addr", "127.0.0.1:10999", "--id", "1", "--zone", "z9", "--topic", "Orders:4:2",
        "--ha-addr", "127.0.0.1:10912", "--heartbeat-timeout", "20", "--heartbeat-interval",
        "0.5", "--register-period", "15", "--timeout", "5"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "broker c9/bk-9 id 1 at 127.0.0.1:10999 registered with 1 NameServer(s)",
        "broker bk-9 unregistered from 1/1 NameServer(s)"]
    [kwargs] = made
    assert kwargs == dict(
        cluster="c9", broker_name="bk-9", broker_addr="127.0.0.1:10999", broker_id=1,
        ha_addr="127.0.0.1:10912", zone="z9", topics=kwargs["topics"], register_period=15.0,
        heartbeat_interval=0.5, heartbeat_timeout_ms=20_000, request_timeout=5.0)
    [(info, route)] = seen
    assert info.clusters == {"c9": ["bk-9"]} and info.brokers["bk-9"].zone == "z9"
    assert info.brokers["bk-9"].addrs == {1: "127.0.0.1:10999"}
    assert [(l.broker_id, l.timeout_ms) for l in info.live] == [(1, 20_000)]
    [queue_data] = route.route.queues
    assert (queue_data.read_queues, queue_data.write_queues) == (4, 2)
    assert peer.ok("get_cluster_info").brokers == {}


def test_broker_hands_its_log_and_nameserver_options_on(monkeypatch):
    handed: list[tuple[str, Any]] = []

    def make_target(*args: Any) -> None:
        handed.append(("target", args))
        raise click.UsageError("enough")

    monkeypatch.setattr(tools, "configure_logging", lambda *args: handed.append(("log", args)))
    monkeypatch.setattr(tools, "make_target", make_target)
    result = CliRunner().invoke(main, [
        "broker", "--ns", "h:1", "--timeout", "4", "--server-key", "KEY", "--keypair", "own.key",
        "--log-level", "debug", "--log-format", "json", "--json",
        "--cluster", "c", "--name", "b", "--addr", "h:2"])
    assert result.exit_code == 2
    assert handed == [("log", ("DEBUG", "json")), ("target", ("h:1", 4.0, True, "KEY", "own.key"))]


@pytest.mark.timeout(60)
def test_broker_announces_its_registration_once(server, monkeypatch):
    import os
    import signal

    from zns.drivers.broker_agent import BrokerAgent

    class Agent(BrokerAgent):
        """Stops the command a few turns of its loop after it is registered."""

        turns_registered = 0

        @property
        def failure(self) -> BaseException | None:
            if super().registered_everywhere():
                self.turns_registered += 1
                if self.turns_registered == 3:
                    os.kill(os.getpid(), signal.SIGTERM)
            return super().failure

    result = run_broker(monkeypatch, Agent, [
        "--ns", server.router, "--cluster", "c", "--name", "b",
        "--addr", "127.0.0.1:10998", "--timeout", "5"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "broker c/b id 0 at 127.0.0.1:10998 registered with 1 NameServer(s)",
        "broker b unregistered from 1/1 NameServer(s)"]


@pytest.mark.timeout(60)
def test_broker_looks_at_its_agent_several_times_a_second_until_stopped(server, monkeypatch):
    import os
    import signal
    import time

    from zns.drivers.broker_agent import BrokerAgent

    looks: list[float] = []

    class Agent(BrokerAgent):
        """Stopped as an operator would (SIGTERM) at the sixth look at it once registered."""

        @property
        def failure(self) -> BaseException | None:
            if super().registered_everywhere():
                looks.append(time.monotonic())
                if len(looks) == 6:
                    os.kill(os.getpid(), signal.SIGTERM)
            return super().failure

    result = run_broker(monkeypatch, Agent, [
        "--ns", server.router, "--cluster", "c", "--name", "b",
        "--addr", "127.0.0.1:10997", "--timeout", "5"])
    assert result.exit_code == 0, result.output
    assert len(looks) == 6  # a healthy agent: the command went on until it was stopped
    # It looks every 0.1 s, so a dead agent ends it at once: the shortest of five gaps is far
    # under a second even when a loaded machine delays some of them.
    assert min(later - earlier for earlier, later in zip(looks, looks[1:])) < 0.9, looks
    assert result.stderr.splitlines()[-1] == "broker b unregistered from 1/1 NameServer(s)"


@pytest.mark.timeout(60)
def test_broker_whose_agent_dies_after_it_registered_stops_failed(server, monkeypatch):
    from zns.drivers.broker_agent import BrokerAgent

    class Agent(BrokerAgent):
        """Its thread fails (for real) once the command has seen it registered: after the
        announcement only the failure tells the command."""

        dying = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, clock=self.clock, **kwargs)

        def registered_everywhere(self) -> bool:
            done = super().registered_everywhere()
            if done:
                self.dying = True  # its next turn (a heartbeat, a second away) reads the clock
            return done

        def clock(self) -> float:
            if self.dying:
                raise RuntimeError("Boom")
            return time.monotonic()

    result = run_broker(monkeypatch, Agent, [
        "--ns", server.router, "--cluster", "c", "--name", "b",
        "--addr", "127.0.0.1:10996", "--timeout", "5"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    notes = result.stderr.splitlines()
    assert notes[0] == "broker c/b id 0 at 127.0.0.1:10996 registered with 1 NameServer(s)"
    assert not any("unregistered" in note for note in notes), notes


def test_broker_refused_by_its_agent_is_a_usage_error_in_the_agents_words():
    result = CliRunner().invoke(main, ["broker", "--cluster", "c", "--name", "bad/name",
                                       "--addr", "127.0.0.1:1", "--ns", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: Expected a name: 1-255 characters, no control characters, no '/' - at "
        "`$.broker_name` (see 'main broker --help')"]

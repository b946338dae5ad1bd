"""The operator commands against a live NameServer (click's CliRunner), and `zns broker`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import click.testing
import pytest
from click.testing import CliRunner

from helpers import register_fields, wait_for
from zns.cli import main
from zns.core.schema import Error

DEAD = "tcp://127.0.0.1:1"


def run(*args: str, ns: str) -> click.testing.Result:
    return CliRunner().invoke(main, [*args, "--ns", ns, "--timeout", "2"], catch_exceptions=False)


@pytest.fixture
def loaded(server):
    peer = server.peer()
    peer.ok("register_broker", **register_fields(topics={"TopicA": {}, "TopicB": {}}, zone="z1"))
    peer.ok("register_broker", **register_fields(broker_name="broker-b", addr="10.0.0.2:10911",
                                                 cluster="c2", topics={"TopicB": {}}))
    return server


def test_status_route_clusters_topics(loaded):
    ns = loaded.router
    out = run("status", ns=ns)
    assert out.exit_code == 0 and ns in out.output and loaded.pub in out.output
    out = run("route", "TopicB", ns=ns)
    assert out.exit_code == 0 and "broker-a" in out.output and "broker-b" in out.output
    route = json.loads(run("route", "TopicB", "--json", ns=ns).output)["route"]
    assert [q["broker_name"] for q in route["queues"]] == ["broker-a", "broker-b"]
    out = run("clusters", ns=ns)
    assert "c2" in out.output and "10.0.0.2:10911" in out.output
    assert json.loads(run("clusters", "--json", ns=ns).output)["clusters"] == {
        "c1": ["broker-a"], "c2": ["broker-b"]}
    assert run("topics", ns=ns).output.split() == ["TopicA", "TopicB"]
    assert json.loads(run("topics", "--cluster", "c2", "--json", ns=ns).output) == {
        "topics": ["TopicB"]}


def test_admin_commands(loaded):
    ns, peer = loaded.router, loaded.peer()
    out = run("wipe-write-perm", "broker-a", ns=ns)
    assert out.exit_code == 0 and "2 queue data changed" in out.output
    assert peer.ok("get_route", topic="TopicA").route.queues[0].perm == 4
    assert run("add-write-perm", "broker-a", ns=ns).exit_code == 0
    assert peer.ok("get_route", topic="TopicA").route.queues[0].perm == 6
    out = run("delete-topic", "TopicB", "--cluster", "c2", "--json", ns=ns)
    assert json.loads(out.output)[ns] == {"removed": True}
    assert [q.broker_name for q in peer.ok("get_route", topic="TopicB").route.queues] == ["broker-a"]


def test_names_that_match_nothing_say_so_and_exit_1(loaded):
    ns = loaded.router
    run_ = lambda *args: CliRunner().invoke(main, [*args, "--ns", ns, "--timeout", "2"])  # noqa: E731
    out = run_("wipe-write-perm", "nobroker")
    assert out.exit_code == 1
    assert "no broker named 'nobroker' (brokers: broker-a, broker-b)" in out.stderr
    assert run_("add-write-perm", "nobroker").exit_code == 1
    out = run_("topics", "--cluster", "Nope")
    assert out.exit_code == 1 and "no cluster named 'Nope' (clusters: c1, c2)" in out.stderr
    out = run_("delete-topic", "TopicA", "--cluster", "Nope")
    assert out.exit_code == 1 and "no cluster named 'Nope'" in out.stderr
    out = run_("delete-topic", "TopicA", "--cluster", "c2")
    assert out.exit_code == 1 and "has no queues on cluster 'c2'" in out.stderr
    out = run_("delete-topic", "NoSuchTopic")
    assert out.exit_code == 1 and "no topic named 'NoSuchTopic'" in out.stderr
    out = run_("route", "TopicA", "--zone", "z2")
    assert out.exit_code == 1
    assert "no broker of 'TopicA' is in zone 'z2' (its brokers' zones: z1)" in out.stderr
    # What matches still works, and an existing broker with nothing to change is no error.
    assert run_("route", "TopicA", "--zone", "z1").exit_code == 0
    assert run_("topics", "--cluster", "c2").output.split() == ["TopicB"]
    assert run_("add-write-perm", "broker-b").exit_code == 0
    assert peer_topics(loaded) == ["TopicA", "TopicB"]  # nothing was deleted


def test_json_is_json_for_errors_too_and_one_shape_per_kind_of_answer(loaded):
    ns = loaded.router

    def as_json(*args: str, ns: str = ns, timeout: str = "2") -> tuple[int, object]:
        out = CliRunner().invoke(main, [*args, "--ns", ns, "--timeout", timeout, "--json"])
        assert out.stderr == "", out.stderr  # everything on stdout, as JSON
        return out.exit_code, json.loads(out.stdout)

    # Reads: the reply's fields, no envelope.
    code, answer = as_json("route", "TopicA")
    assert code == 0 and set(answer) == {"epoch", "revision", "route"}
    assert as_json("topics")[1] == {"topics": ["TopicA", "TopicB"]}
    # Per NameServer (status, writes): {endpoint: fields or error}, errors in one shape.
    code, answer = as_json("status", ns=f"{ns};{DEAD}", timeout="0.5")
    assert code == 3 and "op" not in answer[ns] and answer[ns]["topics"] == 2
    assert answer[DEAD] == {"error": "unreachable",
                            "message": f"no answer from {DEAD} within 0.5 s (a CURVE server needs --server-key)"}
    assert as_json("add-write-perm", "broker-a")[1] == {ns: {"changed": 0}}
    # A command that ends in an error: {"error", "message"}.
    assert as_json("route", "NoSuchTopic") == (1, {"error": "not_found",
                                                   "message": "no route for topic 'NoSuchTopic'"})
    assert as_json("topics", "--cluster", "Nope") == (1, {
        "error": "not_found", "message": "no cluster named 'Nope' (clusters: c1, c2)"})
    assert as_json("clusters", ns=DEAD, timeout="0.2") == (3, {
        "error": "unreachable", "message": f"no answer from {DEAD} within 0.2 s (a CURVE server needs --server-key)"})
    code, answer = as_json("route")  # a usage error
    assert code == 2 and answer == {"error": "usage", "message": "Missing argument 'TOPIC'."}


def test_one_wording_for_an_unreachable_nameserver():
    for args in (["status"], ["route", "T"], ["kv", "put", "n", "k", "v"]):
        out = CliRunner().invoke(main, [*args, "--ns", DEAD, "--timeout", "0.2"])
        assert out.exit_code == 3
        assert out.stderr.strip().splitlines() == [f"zns: no answer from {DEAD} within 0.2 s (a CURVE server needs --server-key)"]


def peer_topics(server) -> list[str]:
    return server.peer().ok("get_topics").topics


def test_kv_commands(server):
    ns = server.router
    assert run("kv", "put", "app", "k", "v 1", ns=ns).exit_code == 0
    assert run("kv", "get", "app", "k", ns=ns).output == "v 1\n"
    assert json.loads(run("kv", "list", "app", "--json", ns=ns).output) == {
        "entries": {"k": "v 1"}}
    assert "deleted" in run("kv", "delete", "app", "k", ns=ns).output
    out = run("kv", "get", "app", "k", ns=ns)
    assert out.exit_code == 1 and "error not_found" in out.stderr


def test_error_reply_prints_code_and_exits_nonzero(server):
    out = run("route", "NoSuchTopic", ns=server.router)
    assert out.exit_code == 1 and "error not_found" in out.stderr
    out = run("route", "bad/topic", ns=server.router)
    assert out.exit_code != 0


@pytest.mark.parametrize("args", [["status"], ["route", "T"], ["clusters"], ["topics"],
                                  ["kv", "put", "a", "b", "c"], ["wipe-write-perm", "x"],
                                  ["watch"]])
def test_no_nameserver_says_so(args):
    out = CliRunner().invoke(main, [*args, "--ns", DEAD, "--timeout", "0.2"])
    assert out.exit_code == 3, out.output
    assert "no answer from" in out.stderr


def test_ns_from_environment_and_partial_failure(server):
    out = CliRunner().invoke(main, ["status", "--timeout", "0.5"],
                             env={"ZNS_ADDR": f"{server.router};{DEAD}"})
    assert out.exit_code == 3 and server.router in out.output and "unreachable" in out.output


@pytest.mark.timeout(30)
def test_watch_prints_events(server):
    peer = server.peer()
    result = {}

    def watch():
        result["out"] = CliRunner().invoke(main, ["watch", "TopicA", "--count", "1", "--ns",
                                                  server.router])

    thread = threading.Thread(target=watch)
    thread.start()
    counter = 0
    while thread.is_alive():  # until the watcher's subscription is in place and it saw one
        counter += 1
        peer.ok("register_broker", **register_fields(
            topics={"TopicA": {"read_queues": counter}}, data_version={"counter": counter}))
        thread.join(0.1)
        assert counter < 100
    out = result["out"]
    assert out.exit_code == 0, out.output
    assert "route TopicA rev" in out.output


@pytest.mark.timeout(60)
def test_broker_command_registers_and_unregisters(server, tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text('cluster = "c9"\nbroker_name = "bk-9"\nbroker_addr = "127.0.0.1:10999"\n'
                      'topics = ["Orders:4", "Pay"]\nheartbeat_interval = 0.2\n')
    env = {**os.environ, "ZNS_ADDR": server.router}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from zns.cli import main; main()", "broker", "--config",
         str(config)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        peer = server.peer()
        route = wait_for(lambda: _route(peer, "Orders"), timeout=20)
        assert route.queues[0].write_queues == 4 and route.brokers[0].cluster == "c9"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0, out
        assert "unregistered from 1/1" in out
        assert peer.ok("get_cluster_info").brokers == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _route(peer, topic):
    reply = peer.call("get_route", topic=topic)
    return None if isinstance(reply, Error) else reply.route


def test_broker_command_reports_a_bad_address_as_a_usage_error():
    out = CliRunner().invoke(main, ["broker", "--cluster", "c", "--name", "b", "--addr", "nope",
                                    "--ns", DEAD])
    assert out.exit_code == 2, out.output
    assert "Invalid value for '--addr'" in out.output and out.exception.__class__ is SystemExit


@pytest.mark.timeout(30)
def test_status_exits_1_on_an_error_reply_and_3_when_nothing_answers(server):
    import zmq

    from zns.core import schema

    ctx = zmq.Context.instance()
    refusing = ctx.socket(zmq.ROUTER)
    refusing.setsockopt(zmq.LINGER, 0)
    port = refusing.bind_to_random_port("tcp://127.0.0.1")

    def answer_with_an_error() -> None:
        if refusing.poll(10_000):
            routing_id, body = refusing.recv_multipart()
            request = schema.decode_request(body)
            refusing.send_multipart([routing_id, schema.encode(
                {"op": "error", "id": request.id, "code": "no_permission", "message": "no"})])

    thread = threading.Thread(target=answer_with_an_error)
    thread.start()
    try:
        result = run("status", ns=f"{server.router};tcp://127.0.0.1:{port}")
        assert result.exit_code == 1, result.output
        assert "error no_permission" in result.output
        assert run("status", ns=DEAD).exit_code == 3
    finally:
        thread.join(15)
        refusing.close(0)


def test_route_shows_perm_bits_and_a_wiped_broker_read_only(loaded):
    ns = loaded.router
    assert "6 (rw-)" in run("route", "TopicA", ns=ns).output
    assert run("wipe-write-perm", "broker-a", ns=ns).exit_code == 0
    out = run("route", "TopicA", ns=ns).output
    assert "4 (r--)" in out and "(rw-)" not in out, out


def test_route_zone_shows_what_a_client_of_that_zone_sees(loaded):
    ns = loaded.router
    everything = run("route", "TopicB", ns=ns).output
    assert "broker-a" in everything and "broker-b" in everything
    zoned = run("route", "TopicB", "--zone", "z1", ns=ns)
    assert zoned.exit_code == 0 and "broker-a" in zoned.output, zoned.output
    assert "broker-b" not in zoned.output, zoned.output


def test_text_status_shows_the_remoting_listener_and_the_peers(make_server):
    srv = make_server(remoting="127.0.0.1:0", peers=[DEAD])
    out = run("status", ns=srv.router)
    assert out.exit_code == 0, out.output
    header, row = out.output.splitlines()[:2]  # then the workers' table
    assert header.split()[-2:] == ["REMOTING", "PEERS"]
    remoting = srv.remoting
    assert remoting.startswith("127.0.0.1:") and remoting in row
    assert row.endswith(f"{DEAD} down")

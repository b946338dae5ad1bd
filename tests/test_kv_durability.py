"""§6 KV over real processes: every acknowledged write survives `kill -9`,
a bad file stops `zns serve` with a clear message and is left alone, a missing
one starts empty, and ORDER_TOPIC_CONFIG entries reach routes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Peer, register_fields
from zns.core import schema
from zns.core.errors import KvFileError
from zns.drivers.kv_file import KvStore, encode_record, read_kv_file

KILL_TIMEOUT = 15


def kill_hard(srv) -> None:
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(KILL_TIMEOUT)


@pytest.mark.timeout(90)
def test_every_acknowledged_write_survives_kill_9(process_server, tmp_path: Path):
    kv_path = tmp_path / "state" / "kv.json"  # the directory does not exist yet
    writes = [
        ("kv_put", dict(namespace="ns", key="a", value="1")),
        ("kv_put", dict(namespace="ns", key="b", value="ü" * 1000)),
        ("kv_put", dict(namespace="ns", key="a", value="2")),
        ("kv_put", dict(namespace="other", key="a", value="x")),
        ("kv_delete", dict(namespace="ns", key="b")),
        ("kv_delete", dict(namespace="other", key="a")),
    ]
    expected: dict[str, dict[str, str]] = {}
    for op, fields in writes:
        srv = process_server(kv_path=kv_path)
        peer = Peer(srv.router)
        try:
            for namespace in ("ns", "other"):  # what the previous process acknowledged
                assert peer.ok("kv_list", namespace=namespace).entries == expected.get(
                    namespace, {})
            peer.ok(op, **fields)
            kill_hard(srv)  # right after the reply: nothing may be lost
        finally:
            peer.close()
        entries = expected.setdefault(fields["namespace"], {})
        if op == "kv_put":
            entries[fields["key"]] = fields["value"]
        else:
            del entries[fields["key"]]
    assert read_kv_file(kv_path) == {ns: e for ns, e in expected.items() if e}


def run_serve(kv_path: Path, timeout: float = 90) -> subprocess.CompletedProcess:  # a loaded machine
    return subprocess.run(
        [sys.executable, "-m", "zns", "serve", "--router", "tcp://127.0.0.1:*",
         "--pub", "tcp://127.0.0.1:*", "--kv-path", str(kv_path)],
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.parametrize("content", [
    b'{"ns": {"k": "v"',
    b'{"ns": {"k": 5}}',
    b'["a list"]',
], ids=["truncated", "wrong-type", "not-a-map"])
def test_corrupt_kv_file_stops_serve_and_is_left_untouched(tmp_path: Path, content: bytes):
    kv_path = tmp_path / "kv.json"
    kv_path.write_bytes(content)
    result = run_serve(kv_path)
    assert result.returncode != 0
    assert str(kv_path) in result.stderr and "corrupt" in result.stderr
    assert "Traceback" not in result.stderr
    assert kv_path.read_bytes() == content
    assert not kv_path.with_name("kv.json.bak").exists()


def test_missing_kv_file_with_a_backup_stops_serve(tmp_path: Path):
    kv_path = tmp_path / "kv.json"
    backup = tmp_path / "kv.json.bak"
    backup.write_text('{"ns": {"k": "v"}}')
    result = run_serve(kv_path)
    assert result.returncode != 0
    assert str(kv_path) in result.stderr and str(backup) in result.stderr
    assert not kv_path.exists() and backup.read_text() == '{"ns": {"k": "v"}}'


def test_missing_kv_file_starts_empty(process_server, tmp_path: Path):
    kv_path = tmp_path / "fresh" / "kv.json"
    srv = process_server(kv_path=kv_path)
    peer = Peer(srv.router)
    try:
        assert peer.ok("kv_list", namespace="ns").entries == {}
        assert peer.call("kv_get", namespace="ns", key="k").code == "not_found"
        assert not kv_path.exists()  # nothing is written until something is stored
        peer.ok("kv_put", namespace="ns", key="k", value="v")
        assert read_kv_file(kv_path) == {"ns": {"k": "v"}}
    finally:
        peer.close()


def is_route(channel: bytes, _event: object) -> bool:
    return channel == schema.route_channel("T")


def test_order_topic_config_appears_in_routes_and_publishes(server):
    peer = server.peer()
    peer.subscribe(schema.route_channel("T"), schema.HB_CHANNEL)
    peer.wait_subscribed()
    peer.ok("register_broker", **register_fields(topics={"T": {"order": True}}))
    _, first = peer.next_event(is_route)
    assert first.route.order_conf == ""

    peer.ok("kv_put", namespace=schema.ORDER_TOPIC_CONFIG, key="T", value="broker-a:4")
    _, event = peer.next_event(is_route)
    assert event.route.order_conf == "broker-a:4" and event.prev == first.revision
    reply = peer.ok("get_route", topic="T")
    assert reply.route.order_conf == "broker-a:4" and reply.revision == event.revision
    assert peer.ok("get_routes", topics=["T"]).routes["T"].order_conf == "broker-a:4"

    peer.ok("kv_delete", namespace=schema.ORDER_TOPIC_CONFIG, key="T")
    _, event = peer.next_event(is_route)
    assert event.route.order_conf == ""
    assert peer.ok("get_route", topic="T").route.order_conf == ""


@pytest.mark.timeout(60)
def test_order_topic_config_is_loaded_at_start(process_server, tmp_path: Path):
    kv_path = tmp_path / "kv.json"
    srv = process_server(kv_path=kv_path)
    peer = Peer(srv.router)
    peer.ok("kv_put", namespace=schema.ORDER_TOPIC_CONFIG, key="T", value="broker-a:8")
    peer.close()
    kill_hard(srv)

    srv = process_server(kv_path=kv_path)
    peer = Peer(srv.router)
    try:
        peer.ok("register_broker", **register_fields(topics={"T": {}}))
        assert peer.ok("get_route", topic="T").route.order_conf == "broker-a:8"
    finally:
        peer.close()


@pytest.mark.timeout(60)
def test_a_torn_last_record_after_kill_9_is_cut_and_the_rest_kept(process_server, tmp_path):
    """A crash in the middle of an unacknowledged write leaves part of its record at the
    end of the log: the next start cuts it (and says so) and keeps every acknowledged write."""
    kv_path = tmp_path / "kv.json"
    srv = process_server(kv_path=kv_path)
    peer = Peer(srv.router)
    for i in range(5):
        peer.ok("kv_put", namespace="ns", key=f"k{i}", value=f"v{i}" * 100)
    peer.ok("kv_delete", namespace="ns", key="k0")
    peer.close()
    kill_hard(srv)
    good = kv_path.read_bytes()
    kv_path.write_bytes(good + encode_record("ns", "k9", "never acknowledged")[:-5])

    srv = process_server(kv_path=kv_path)
    peer = Peer(srv.router)
    try:
        assert peer.ok("kv_list", namespace="ns").entries == {
            f"k{i}": f"v{i}" * 100 for i in range(1, 5)}
        assert kv_path.read_bytes() == good
        peer.ok("kv_put", namespace="ns", key="k9", value="now")
        assert read_kv_file(kv_path)["ns"]["k9"] == "now"
    finally:
        peer.close()
    assert "torn" in srv.output() and str(kv_path) in srv.output()


def test_a_kv_path_that_cannot_hold_the_store_is_refused_at_start(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(KvFileError, match=r"a-file is a file, not a directory \(--kv-path\)"):
        KvStore(blocker / "sub" / "kv.log")
    with pytest.raises(KvFileError, match=r"is a directory"):
        KvStore(tmp_path)
    # The command says so in one line and exits non-zero before serving anything.
    from click.testing import CliRunner

    from zns.cli import main

    result = CliRunner().invoke(main, ["serve", "--router", "tcp://127.0.0.1:*", "--pub",
                                       "tcp://127.0.0.1:*", "--kv-path", str(blocker / "kv.log")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.strip().splitlines() == [
        f"Error: KV file {blocker}/kv.log cannot be created: {blocker} is a file, not a "
        f"directory (--kv-path)"]


def test_the_default_kv_file_is_kv_log_and_the_old_default_name_is_still_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from zns.drivers.kv_file import DEFAULT_PATH

    monkeypatch.setenv("HOME", str(tmp_path))
    assert DEFAULT_PATH == "~/.zns/kv.log"
    old = tmp_path / ".zns" / "kv.json"
    old.parent.mkdir()
    store = KvStore(old)
    store.put("ns", "k", "kept")
    store.close()
    store = KvStore(DEFAULT_PATH)  # only the old name exists: it is the store
    assert store.path == old and store.get("ns", "k") == "kept"
    store.close()
    old.rename(old.with_name("kv.log"))
    store = KvStore(DEFAULT_PATH)
    assert store.path == tmp_path / ".zns" / "kv.log" and store.get("ns", "k") == "kept"
    store.close()

"""`zns serve` as the conformance suite starts it: options, their environment
variables and config file (CLI > env > file), --help and --version, signals,
the non-loopback warning and the log lines per broker."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner

from zns.cli import main as zns_main
from helpers import Peer, register_fields, wait_for
from zns import __version__
from zns.core import schema
from zns.drivers.server import ServerConfig

# --- the command line, in process (fast) ------------------------------------


def test_version():
    result = CliRunner().invoke(zns_main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_help_shows_every_default():
    result = CliRunner().invoke(zns_main, ["serve", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # click wraps long lines
    for option, default in [
        ("--router", "tcp://127.0.0.1:9876"), ("--pub", "tcp://127.0.0.1:9877"),
        ("--kv-path", "~/.zns/kv.log"), ("--heartbeat-interval", "1.0"),
        ("--max-message-bytes", str(16 * 1024 * 1024)), ("--log-level", "INFO"),
    ]:
        assert re.search(re.escape(option) + r" .*?\[default: " + re.escape(default), text), option
    assert "--config" in text


@pytest.fixture
def serve_config(serve_in_process) -> Callable[..., ServerConfig]:
    """Run `zns serve ARGS` with env ENV in process; return the ServerConfig it built."""

    def run(*args: str, env: dict[str, str] | None = None) -> ServerConfig:
        result, config = serve_in_process(*args, env=env)
        assert result.exit_code == 0, result.output
        assert config is not None
        return config

    return run


def test_defaults(serve_config):
    config = serve_config()
    assert (config.router, config.pub, config.kv_path) == (
        "tcp://127.0.0.1:9876", "tcp://127.0.0.1:9877", "~/.zns/kv.log")
    assert (config.heartbeat_interval_s, config.max_message_bytes) == (1.0, 16 * 1024 * 1024)


def test_every_option_from_its_environment_variable(serve_config):
    config = serve_config(env={
        "ZNS_ROUTER": "tcp://127.0.0.1:1111", "ZNS_PUB": "tcp://127.0.0.1:2222",
        "ZNS_KV_PATH": "/tmp/env-kv.json", "ZNS_HEARTBEAT_INTERVAL": "0.5",
        "ZNS_MAX_MESSAGE_BYTES": "4096", "ZNS_LOG_LEVEL": "WARNING",
    })
    assert (config.router, config.pub, config.kv_path) == (
        "tcp://127.0.0.1:1111", "tcp://127.0.0.1:2222", "/tmp/env-kv.json")
    assert (config.heartbeat_interval_s, config.max_message_bytes) == (0.5, 4096)


@pytest.mark.parametrize("kv_key", ["kv_path", "kv-path"])
def test_config_file_with_either_spelling(serve_config, tmp_path: Path, kv_key: str):
    conf = tmp_path / "zns.toml"
    conf.write_text(
        'router = "tcp://127.0.0.1:3333"\npub = "tcp://127.0.0.1:4444"\n'
        f'{kv_key} = "/tmp/file-kv.json"\nheartbeat_interval = 0.25\n'
        'max-message-bytes = 8192\nlog_level = "DEBUG"\n'
    )
    config = serve_config("--config", str(conf))
    assert (config.router, config.pub, config.kv_path) == (
        "tcp://127.0.0.1:3333", "tcp://127.0.0.1:4444", "/tmp/file-kv.json")
    assert (config.heartbeat_interval_s, config.max_message_bytes) == (0.25, 8192)
    # ZNS_CONFIG names the file too.
    assert serve_config(env={"ZNS_CONFIG": str(conf)}).router == "tcp://127.0.0.1:3333"


@pytest.mark.parametrize("key", ["peers", "peer"])
def test_config_file_lists_peers_under_either_name(serve_config, tmp_path: Path, key: str):
    conf = tmp_path / "zns.toml"
    conf.write_text(f'{key} = ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:6666"]\n')
    assert serve_config("--config", str(conf)).peers == [
        "tcp://127.0.0.1:5555", "tcp://127.0.0.1:6666"]


def test_precedence_cli_over_env_over_file(serve_config, tmp_path: Path):
    conf = tmp_path / "zns.toml"
    conf.write_text('router = "tcp://127.0.0.1:1"\nkv_path = "/file"\nheartbeat_interval = 3.0\n')
    env = {"ZNS_ROUTER": "tcp://127.0.0.1:2", "ZNS_KV_PATH": "/env"}
    config = serve_config("--config", str(conf), "--router", "tcp://127.0.0.1:3", env=env)
    assert (config.router, config.kv_path, config.heartbeat_interval_s) == (
        "tcp://127.0.0.1:3", "/env", 3.0)
    config = serve_config("--router", "tcp://127.0.0.1:3", "--config", str(conf), env=env)
    assert config.router == "tcp://127.0.0.1:3"  # the order on the command line does not matter
    assert serve_config("--config", str(conf), env=env).router == "tcp://127.0.0.1:2"
    assert serve_config("--config", str(conf)).router == "tcp://127.0.0.1:1"


@pytest.mark.parametrize("content, needle", [
    ('nonsense_key = 1\n', "nonsense_key"),
    ('router = \n', "cannot read"),
    ('heartbeat_interval = "fast"\n', "fast"),
])
def test_bad_config_file_is_refused_clearly(serve_in_process, tmp_path: Path, content, needle):
    conf = tmp_path / "zns.toml"
    conf.write_text(content)
    result, config = serve_in_process("--config", str(conf))
    assert result.exit_code != 0 and needle in result.output
    assert config is None


# --- real processes -------------------------------------------------------


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    """A short directory for ipc:// endpoints (their paths are limited to ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="zns-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen]]:
    """`zns serve ARGS` with exactly the ZNS_ variables given, output to a file."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
        base = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
        proc = subprocess.Popen([sys.executable, "-m", "zns", "serve", *args],
                                env={**base, **env}, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(15)


def answers(router: str) -> bool:
    """Whether a server answers on `router` (a throwaway socket: no late reply lingers)."""
    probe = Peer(router)
    try:
        probe.send_raw(schema.encode({"op": "status"}))
        return bool(probe.dealer.poll(200))
    finally:
        probe.close()


@pytest.mark.timeout(60)
def test_environment_variables_reach_a_real_server(spawn, ipc_dir: Path, tmp_path: Path):
    router, pub = f"ipc://{ipc_dir}/r", f"ipc://{ipc_dir}/p"
    kv_path = tmp_path / "env" / "kv.json"
    log = tmp_path / "serve.log"
    proc = spawn(env={
        "ZNS_ROUTER": router, "ZNS_PUB": pub, "ZNS_KV_PATH": str(kv_path),
        "ZNS_HEARTBEAT_INTERVAL": "0.1", "ZNS_MAX_MESSAGE_BYTES": "4096",
        "ZNS_LOG_LEVEL": "WARNING", "ZNS_WORKERS": "0",  # ipc:// is one process's
    }, log=log)
    peer = Peer(router, pub)
    try:
        wait_for(lambda: answers(router), timeout=30)
        assert peer.ok("status").pub_endpoint == pub
        peer.ok("kv_put", namespace="ns", key="k", value="v")
        assert kv_path.exists()
        # 0.1 s between hb: five arrive well within the 5 s the default would need.
        peer.subscribe(schema.HB_CHANNEL)
        peer.wait_subscribed()
        started = time.monotonic()
        for _ in range(5):
            peer.next_event()
        assert time.monotonic() - started < 3
        # 4096 bytes at most: a larger request gets nothing.
        peer.send_raw(schema.encode({"op": "kv_put", "id": 5, "namespace": "ns", "key": "big",
                                     "value": "x" * 5000}))
        assert not peer.dealer.poll(500)
        # WARNING: the INFO lines (serving, broker registered) are not logged.
        other = Peer(router)
        other.ok("register_broker", **register_fields())
        other.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        peer.close()
    output = log.read_text()
    assert "serving requests" not in output and "registered" not in output


@pytest.mark.timeout(60)
def test_config_file_reaches_a_real_server(spawn, ipc_dir: Path, tmp_path: Path):
    router = f"ipc://{ipc_dir}/r"
    kv_path = tmp_path / "file" / "kv.json"
    conf = tmp_path / "zns.toml"
    conf.write_text(f'router = "{router}"\npub = "ipc://{ipc_dir}/p"\n'
                    f'kv-path = "{kv_path}"\nlog_level = "DEBUG"\nworkers = 0\n')  # ipc://: one process
    log = tmp_path / "serve.log"
    proc = spawn("--config", str(conf), env={}, log=log)
    peer = Peer(router)
    try:
        wait_for(lambda: answers(router), timeout=30)
        peer.ok("kv_put", namespace="ns", key="k", value="v")
        assert kv_path.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        peer.close()
    assert f"serving requests on {router}" in log.read_text()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_stop_the_server_cleanly(process_server, sig):
    srv = process_server()
    peer = Peer(srv.router)
    peer.ok("kv_put", namespace="ns", key="k", value="v")
    peer.close()
    srv.proc.send_signal(sig)
    assert srv.proc.wait(15) == 0
    output = srv.output()
    assert "zns stopped" in output and "Traceback" not in output


def test_non_loopback_bind_logs_a_warning(process_server):
    srv = process_server("--router", "tcp://0.0.0.0:*")
    assert srv.router.startswith("tcp://0.0.0.0:")
    warnings = [line for line in srv.output().splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "0.0.0.0" in warnings[0] and "CURVE" in warnings[0]


def test_endpoint_in_use_is_a_clear_error(tmp_path: Path):
    holder = zmq.Context.instance().socket(zmq.ROUTER)
    holder.setsockopt(zmq.LINGER, 0)
    holder.bind("tcp://127.0.0.1:*")
    taken = holder.getsockopt_string(zmq.LAST_ENDPOINT)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "zns", "serve", "--router", taken,
             "--pub", "tcp://127.0.0.1:*", "--kv-path", str(tmp_path / "kv.json")],
            capture_output=True, text=True, timeout=30,
            env={k: v for k, v in os.environ.items() if not k.startswith("ZNS_")},
        )
    finally:
        holder.close()
    assert result.returncode != 0
    assert f"cannot bind {taken}" in result.stderr and "Traceback" not in result.stderr


def test_loopback_bind_logs_no_warning(process_server):
    srv = process_server()
    assert srv.stop() == 0
    assert "WARNING" not in srv.output()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_one_log_line_per_broker_change_and_none_per_query(process_server, workers):
    srv = process_server("--heartbeat-interval", "0.2", "--workers", workers)
    peer = Peer(srv.router, srv.pub)
    a, b, c = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"
    try:
        peer.subscribe(b"broker/", schema.HB_CHANNEL)
        peer.wait_subscribed()
        peer.ok("register_broker", **register_fields(addr=a))  # registered a
        for _ in range(20):  # queries and no-change requests: no lines
            peer.ok("register_broker", **register_fields(addr=a))
            peer.ok("heartbeat", cluster="c1", broker_name="broker-a", broker_id=0,
                    broker_addr=a)
            peer.ok("get_route", topic="TopicA")
            peer.ok("get_cluster_info")
            peer.ok("snapshot")
            peer.ok("status")
            peer.call("get_route", topic="Missing")
        peer.ok("register_broker", **register_fields(addr=b, data_version={"state": 1}))
        # ^ registered b, removed a (displaced)
        refused = peer.call("register_broker", **register_fields(addr=c))  # conflicting
        assert refused.code == "conflict"
        peer.ok("unregister_broker", cluster="c1", broker_name="broker-a", broker_id=0,
                broker_addr=b)  # removed b (unregistered)
        peer.ok("register_broker", **register_fields(addr=c, heartbeat_timeout_ms=1000))
        # ^ registered c, then removed c (expired)
        peer.next_event(lambda ch, ev: isinstance(ev, schema.BrokerEvent)
                        and ev.reason == "expired", timeout=15)
        assert srv.stop() == 0
    finally:
        peer.close()
    lines = [line for line in srv.output().splitlines() if " broker " in line]
    expected = [
        f"broker registered c1/broker-a id 0 at {a}",
        f"broker registered c1/broker-a id 0 at {b}",
        f"broker removed c1/broker-a id 0 at {a} (displaced)",
        f"id 0 at {c} refused",
        f"broker removed c1/broker-a id 0 at {b} (unregistered)",
        f"broker registered c1/broker-a id 0 at {c}",
        f"broker removed c1/broker-a id 0 at {c} (expired)",
    ]
    assert len(lines) == len(expected), "\n".join(lines)
    for line in expected:
        assert sum(line in got for got in lines) == 1, (line, lines)


def test_metrics_and_log_format_from_option_env_and_file(serve_config, tmp_path: Path):
    assert serve_config().metrics is None  # off by default
    assert serve_config("--metrics", "127.0.0.1:9100").metrics == "127.0.0.1:9100"
    assert serve_config(env={"ZNS_METRICS": "127.0.0.1:9101"}).metrics == "127.0.0.1:9101"
    conf = tmp_path / "zns.toml"
    conf.write_text('metrics = "127.0.0.1:9102"\nlog_format = "json"\n')
    assert serve_config("--config", str(conf)).metrics == "127.0.0.1:9102"
    result = CliRunner().invoke(zns_main, ["serve", "--log-format", "xml"])
    assert result.exit_code == 2 and "--log-format" in result.output

"""Every endpoint and address option is checked where it is parsed: one line naming the
option and what is wrong, exit 2 (usage) — no traceback, no wait for a timeout."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from zns.cli import main
from zns.core.addresses import check_endpoint, parse_host_port
from zns.core.errors import UsageError

BROKER = ["broker", "--cluster", "c", "--name", "b"]


@pytest.mark.parametrize("args, option, wrong", [
    (["status", "--ns", "http://127.0.0.1:29876"], "--ns", "not http://"),
    (["status", "--ns", "tcp//127.0.0.1:29876"], "--ns", "'tcp//127.0.0.1' is not a host"),
    (["status", "--ns", "udp://127.0.0.1:29876"], "--ns", "not udp://"),
    (["route", "T", "--ns", "127.0.0.1:99999"], "--ns", "port '99999' is not a number"),
    (["kv", "put", "n", "k", "v", "--ns", "h1:1;nowhere"], "--ns", "'nowhere': has no port"),
    (["serve", "--remoting", "127.0.0.1:99999"], "--remoting", "port '99999'"),
    (["serve", "--remoting", "http://127.0.0.1:9876"], "--remoting", "not http://"),
    (["serve", "--router", "http://127.0.0.1:1"], "--router", "not http://"),
    (["serve", "--pub", "tcp://127.0.0.1:70000"], "--pub", "port '70000'"),
    (["serve", "--peer", "tcp//h:1"], "--peer", "is not a host"),
    (["serve", "--metrics", "127.0.0.1:99999"], "--metrics", "port '99999'"),
    (["relay", "--from", "http://h:1", "--bind", "tcp://127.0.0.1:*"], "--from", "not http://"),
    (["relay", "--from", "h:1", "--bind", "udp://h:1"], "--bind", "not udp://"),
    (["watch", "--events", "127.0.0.1:0"], "--events", "port '0'"),
    ([*BROKER, "--addr", "10.0.0.1"], "--addr", "has no port"),
    ([*BROKER, "--addr", "h:1", "--ha-addr", "h:99999"], "--ha-addr", "port '99999'"),
])
def test_a_bad_endpoint_is_a_usage_error_naming_the_option(args, option, wrong):
    result = CliRunner().invoke(main, [*args, "--timeout", "0.2"] if args[0] not in (
        "serve", "broker") else args)
    assert result.exit_code == 2, result.output
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"Error: Invalid value for '{option}'") and wrong in error, error
    assert "Traceback" not in result.output


def test_an_environment_or_config_file_value_is_checked_as_well(tmp_path):
    result = CliRunner().invoke(main, ["status"], env={"ZNS_ADDR": "http://h:1"})
    assert result.exit_code == 2 and "Invalid value for '--ns'" in result.stderr
    conf = tmp_path / "zns.toml"
    conf.write_text('remoting = "0.0.0.0:123456"\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(conf)])
    assert result.exit_code == 2 and "Invalid value for '--remoting'" in result.stderr


def test_the_one_parser_accepts_what_zns_binds_and_connects():
    assert check_endpoint("127.0.0.1:9876") == "tcp://127.0.0.1:9876"
    assert check_endpoint("tcp://*:*", bind=True) == "tcp://*:*"
    assert check_endpoint("tcp://[::1]:0", bind=True) == "tcp://[::1]:0"
    assert check_endpoint("ipc:///tmp/zns") == "ipc:///tmp/zns"
    assert parse_host_port("*:0") == ("0.0.0.0", 0)
    assert parse_host_port("tcp://[::1]:9876") == ("::1", 9876)
    assert parse_host_port("http://127.0.0.1:9878/", schemes=("http",)) == ("127.0.0.1", 9878)
    for spec in ("tcp://h:0", "tcp://h:*", "ipc://", "h:-1"):
        with pytest.raises(UsageError):
            check_endpoint(spec)
    with pytest.raises(UsageError, match="expected HOST:PORT or tcp://HOST:PORT, not udp://"):
        parse_host_port("udp://h:1")


def test_a_busy_port_is_exit_1_for_serve_and_relay_alike(server, tmp_path):
    import zmq

    busy = zmq.Context.instance().socket(zmq.PUB)
    port = busy.bind_to_random_port("tcp://127.0.0.1")
    try:
        taken = f"tcp://127.0.0.1:{port}"
        served = CliRunner().invoke(main, ["serve", "--router", taken, "--pub", "tcp://127.0.0.1:*",
                                           "--kv-path", str(tmp_path / "kv.log")])
        relayed = CliRunner().invoke(main, ["relay", "--from", server.router, "--bind", taken])
        assert served.exit_code == relayed.exit_code == 1, (served.output, relayed.output)
        assert "Address already in use" in served.stderr and "Address already in use" in relayed.stderr
    finally:
        busy.close(0)


def test_a_config_file_takes_the_options_names_as_typed_or_as_the_command_calls_them(tmp_path):
    import click

    from zns.cli.options import config_options
    from zns.core.config import BrokerConfig

    seen: list[BrokerConfig] = []

    @click.command()
    @config_options(BrokerConfig)
    def broker(config: BrokerConfig) -> None:
        seen.append(config)

    conf = tmp_path / "broker.toml"
    conf.write_text('cluster = "c1"\nname = "broker-a"\naddr = "10.0.0.1:10911"\n'
                    'topic = ["Orders:8"]\nheartbeat-timeout = 20\n')
    assert CliRunner().invoke(broker, ["--config", str(conf)]).exit_code == 0
    config = seen.pop()
    assert (config.cluster, config.broker_name, config.broker_addr, config.topics,
            config.heartbeat_timeout_s) == ("c1", "broker-a", "10.0.0.1:10911", ["Orders:8"], 20)
    conf.write_text('cluster = "c"\nbroker_name = "b"\nbroker_addr = "h:1"\ntopics = ["T"]\n')
    assert CliRunner().invoke(broker, ["--config", str(conf)]).exit_code == 0
    assert (seen[0].broker_name, seen[0].topics) == ("b", ["T"])  # the names the command uses
    conf.write_text('nme = "typo"\n')
    result = CliRunner().invoke(broker, ["--config", str(conf)])
    assert result.exit_code == 2
    assert f"{conf}: unknown key 'nme' (did you mean 'name'?)" in result.stderr

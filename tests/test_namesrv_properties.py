"""The Java NameServer's properties file (`zns serve --namesrv-config`) and `--rocketmq`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from zns.cli import main as zns_main
from zns.core.config import ROCKETMQ_PUB, ROCKETMQ_ROUTER, ServerConfig, load
from zns.core.errors import InvalidSetting
from zns.core.namesrv_properties import KEYS, parse_properties, translate


def test_the_properties_format_as_java_reads_it():
    text = ("# comment\n! comment too\n\nlistenPort=9876\nkvConfigPath : /a/kv.json\n"
            "orderMessageEnable true\nconfigBlackList=a;\\\n  b\nempty=\n")
    assert parse_properties(text) == {"listenPort": "9876", "kvConfigPath": "/a/kv.json",
                                      "orderMessageEnable": "true", "configBlackList": "a;b",
                                      "empty": ""}


def test_served_keys_become_settings_and_every_other_key_gets_one_line():
    lines: list[str] = []
    settings = translate({"listenPort": "19876", "bindAddress": "10.0.0.1",
                          "kvConfigPath": "/var/ns/kvConfig.json", "orderMessageEnable": "TRUE",
                          "scanNotActiveBrokerInterval": "5000", "clusterTest": "false",
                          "nettyClientWorkerThreads": "4"}, warn=lines.append)
    assert settings == {"remoting": "10.0.0.1:19876", "kv_path": "/var/ns/zns-kv.log",
                        "order_message_enable": True, "rocketmq": True}
    assert lines == [
        "kvConfigPath: the KV store goes beside it, as DIR/zns-kv.log: zns keeps its own "
        "append-only log and does not read the Java JSON file: /var/ns/zns-kv.log",
        "scanNotActiveBrokerInterval: ignored: zns expires each broker at its own deadline, not "
        "by a periodic scan",
        "clusterTest: ignored: zns has no cluster-test mode (asking another NameServer for "
        "routes it lacks); refused when true",
        "nettyClientWorkerThreads: ignored: not a key of RocketMQ 5.3.3's NamesrvConfig or "
        "NettyServerConfig",
    ]
    # A file without listenPort: RocketMQ's port, every address, as mqnamesrv listens.
    assert translate({}, warn=lines.append) == {"remoting": "0.0.0.0:9876", "rocketmq": True}


@pytest.mark.parametrize("properties, problem", [
    ({"clusterTest": "true"}, "clusterTest=true is refused: zns has no cluster-test mode"),
    ({"enableControllerInNamesrv": "true"}, "enableControllerInNamesrv=true is refused"),
    ({"orderMessageEnable": "yes"}, "orderMessageEnable must be true or false, got 'yes'"),
    ({"listenPort": "98x"}, "listenPort must be a port number, got '98x'"),
])
def test_a_value_zns_would_not_honour_is_refused(properties: dict[str, str], problem: str):
    with pytest.raises(InvalidSetting) as refused:
        translate(properties, warn=lambda line: None)
    assert problem in refused.value.problem


def test_the_readme_table_lists_every_key():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in readme.splitlines()
            if line.startswith("| `") and "|" in line[2:]}
    assert set(KEYS) <= rows, set(KEYS) - rows


def test_rocketmq_mode_moves_zns1_beside_the_remoting_port():
    config = load(ServerConfig, {"rocketmq": "true"})
    assert (config.remoting, config.router, config.pub) == (
        "0.0.0.0:9876", ROCKETMQ_ROUTER, ROCKETMQ_PUB)
    given = load(ServerConfig, {"rocketmq": "true", "remoting": "127.0.0.1:19876",
                                "router": "tcp://127.0.0.1:7000"})
    assert (given.remoting, given.router, given.pub) == (
        "127.0.0.1:19876", "tcp://127.0.0.1:7000", ROCKETMQ_PUB)
    assert load(ServerConfig, {}).remoting is None


def test_a_refused_key_is_one_line_exit_2_and_an_unreadable_file_too(tmp_path: Path):
    refused = tmp_path / "namesrv.properties"
    refused.write_text("clusterTest=true\n")
    result = CliRunner().invoke(zns_main, ["serve", "--namesrv-config", str(refused)])
    assert result.exit_code == 2
    assert result.output == (f"Error: {refused}: clusterTest=true is refused: zns has no "
                             "cluster-test mode (asking another NameServer for routes it "
                             "lacks)\n")
    result = CliRunner().invoke(zns_main, ["serve", "--namesrv-config", str(tmp_path / "no")])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "cannot read" in result.output


def test_the_java_file_given_as_the_toml_config_is_recognised(tmp_path: Path):
    # Issue 34 item 1: `zns serve --config namesrv.properties` said only "Invalid value (at
    # line 2, column 14)".
    java = tmp_path / "namesrv.properties"
    java.write_text("listenPort=9876\nkvConfigPath=/x/kv.json\n")
    result = CliRunner().invoke(zns_main, ["serve", "--config", str(java)])
    assert result.exit_code == 2
    assert result.output.endswith("(it looks like the Java NameServer's properties file: give "
                                  "it with --namesrv-config)\n")
    other = tmp_path / "broken.toml"
    other.write_text("router = \n")
    assert "namesrv" not in CliRunner().invoke(zns_main, ["serve", "--config", str(other)]).output
